//! Circular doubly linked lists of unit slots, linked through a side table
//! indexed by slot number (no allocation per insert, O(1) insert, remove and
//! move, no `unsafe`).
//!
//! One ring serves both policies: LRU reads it as a list from `head`
//! (least recently used) to `head.prev` (most recently used); CLOCK reads it
//! as a circle swept by `hand`, with new units inserted just behind the hand
//! so they are the last the hand reaches.

/// The nil link.
pub(crate) const NIL: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Link {
    prev: u32,
    next: u32,
}

/// One ring: its first node, the CLOCK hand, and its length.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ring {
    pub(crate) head: u32,
    pub(crate) hand: u32,
    pub(crate) len: u32,
}

impl Default for Ring {
    fn default() -> Self {
        Ring { head: NIL, hand: NIL, len: 0 }
    }
}

/// The link table shared by every ring (a slot is in at most one ring).
#[derive(Debug, Default)]
pub(crate) struct Links {
    links: Vec<Link>,
}

impl Links {
    /// Makes room for slot numbers below `n`.
    pub(crate) fn grow(&mut self, n: usize) {
        if self.links.len() < n {
            self.links.resize(n, Link { prev: NIL, next: NIL });
        }
    }

    pub(crate) fn next(&self, s: u32) -> u32 {
        self.links[s as usize].next
    }

    /// Inserts `s` just before `at` (which is in `ring`), or as the only node.
    fn insert_before(&mut self, ring: &mut Ring, at: u32, s: u32) {
        debug_assert_eq!(self.links[s as usize].next, NIL, "slot {s} is already in a ring");
        if ring.head == NIL {
            self.links[s as usize] = Link { prev: s, next: s };
            ring.head = s;
            ring.hand = s;
        } else {
            let prev = self.links[at as usize].prev;
            self.links[s as usize] = Link { prev, next: at };
            self.links[prev as usize].next = s;
            self.links[at as usize].prev = s;
        }
        ring.len += 1;
    }

    /// Appends `s` at the most-recently-used end (just before `head`).
    pub(crate) fn push_back(&mut self, ring: &mut Ring, s: u32) {
        let at = ring.head;
        self.insert_before(ring, at, s);
    }

    /// Inserts `s` just behind the CLOCK hand: the last node it will visit.
    pub(crate) fn insert_behind_hand(&mut self, ring: &mut Ring, s: u32) {
        let at = ring.hand;
        self.insert_before(ring, at, s);
    }

    /// Unlinks `s`; `head` and `hand` move on to its successor.
    pub(crate) fn remove(&mut self, ring: &mut Ring, s: u32) {
        let Link { prev, next } = self.links[s as usize];
        debug_assert_ne!(next, NIL, "slot {s} is not in a ring");
        if ring.len == 1 {
            ring.head = NIL;
            ring.hand = NIL;
        } else {
            self.links[prev as usize].next = next;
            self.links[next as usize].prev = prev;
            if ring.head == s {
                ring.head = next;
            }
            if ring.hand == s {
                ring.hand = next;
            }
        }
        self.links[s as usize] = Link { prev: NIL, next: NIL };
        ring.len -= 1;
    }

    /// Moves `s` to the most-recently-used end (an LRU hit).
    pub(crate) fn move_back(&mut self, ring: &mut Ring, s: u32) {
        if ring.len > 1 {
            self.remove(ring, s);
            self.push_back(ring, s);
        }
    }

    /// The nodes from `head`, in order (tests and diagnostics).
    #[cfg(test)]
    pub(crate) fn collect(&self, ring: &Ring) -> Vec<u32> {
        let mut out = Vec::new();
        let mut s = ring.head;
        for _ in 0..ring.len {
            out.push(s);
            s = self.next(s);
        }
        assert_eq!(s, ring.head, "ring does not close");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_order_and_hand_follow_removals() {
        let mut l = Links::default();
        l.grow(8);
        let mut r = Ring::default();
        for s in 0..4 {
            l.push_back(&mut r, s);
        }
        assert_eq!(l.collect(&r), [0, 1, 2, 3]);
        l.move_back(&mut r, 1);
        assert_eq!(l.collect(&r), [0, 2, 3, 1]);
        r.hand = 2;
        l.insert_behind_hand(&mut r, 5);
        assert_eq!(l.collect(&r), [0, 5, 2, 3, 1]);
        l.remove(&mut r, 2);
        assert_eq!(r.hand, 3);
        l.remove(&mut r, 0);
        assert_eq!(r.head, 5);
        assert_eq!(l.collect(&r), [5, 3, 1]);
        for s in [5, 3, 1] {
            l.remove(&mut r, s);
        }
        assert_eq!((r.head, r.hand, r.len), (NIL, NIL, 0));
        l.push_back(&mut r, 7);
        assert_eq!(l.collect(&r), [7]);
    }
}
