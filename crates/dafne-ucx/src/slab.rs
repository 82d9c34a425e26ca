//! One registration, many disjoint views: [`Slab`] and [`SubRegion`].
//!
//! # Why
//! A cache of RMA buffers (the io server's Unifier) wants many small units
//! that are lent out independently: an RMA operation in flight on one unit
//! must not stop a fill or a write of another. With one [`Region`] per unit
//! that costs one `ucp_mem_map` per unit, and with `UCP_MEM_MAP_ALLOCATE`
//! on one host each UCX allocation is its own SysV segment: the kernel's
//! 4096-segment limit (`ipcs -l`) then caps a machine at 4096 units (256 MiB
//! of 64 KiB units), and start-up pays ~35 µs per unit. A [`Slab`] is one
//! registration of a large region (8–64 MiB); a [`SubRegion`] is a view of
//! a range of it that behaves like a small region of its own: it keeps the
//! registration alive (an `Arc` of the slab), gives `&mut [u8]` to its
//! unique holder, and is the local memory of a put or get
//! ([`crate::Local::View`]) with the slab's memory handle, so no copy and no
//! registration happen per unit.
//!
//! # Why views are disjoint (the safety argument)
//! A view hands out `&mut [u8]` over its range from `&mut self`, which is
//! sound only if no other live view covers any byte of that range. This is
//! guaranteed by construction, not by the caller: the slab keeps the set
//! of ranges it has handed out (`taken`, under a mutex) and
//! [`Slab::view`] refuses any range that overlaps one of them; a view
//! removes its range from the set in `Drop`, and only then may the range be
//! handed out again. A view cannot be cloned. An RMA operation keeps the
//! `Arc<SubRegion>` it was given until UCX reports completion, so a range
//! returns to the slab only when no operation can still touch it. The slab
//! itself never exposes its bytes (no `as_slice` on [`Slab`]).
//!
//! Remote keys: [`Slab::pack_key`] would name the whole slab, so a peer with
//! the key could reach every view. The Unifier never packs keys (its server
//! only does RMA from its own side); a user that sends keys for a view must
//! accept that scope, as with any region.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::{Error, Result};
use crate::memory::Region;

/// One registered region carved into disjoint views. A cheap handle
/// (`Arc`): clones share the slab. `Send + Sync`.
#[derive(Clone)]
pub struct Slab {
    inner: Arc<SlabInner>,
}

pub(crate) struct SlabInner {
    region: Region,
    /// Ranges handed out to live views: start → end (exclusive), disjoint.
    taken: Mutex<BTreeMap<usize, usize>>,
}

impl SlabInner {
    fn taken(&self) -> MutexGuard<'_, BTreeMap<usize, usize>> {
        // The map is updated by single insert/remove calls, so a panic
        // elsewhere while the lock was held cannot leave it inconsistent.
        self.taken.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl std::fmt::Debug for Slab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slab").field("region", &self.inner.region).field("views", &self.views()).finish()
    }
}

impl Slab {
    /// Makes `region` a slab. Its bytes are reachable only through views
    /// from now on. A read-only file mapping is refused (its views could
    /// not be written).
    pub fn new(region: Region) -> Result<Slab> {
        if region.is_read_only() {
            return Err(Error::Invalid { op: "Slab::new", reason: "a read-only mapping cannot be carved".into() });
        }
        Ok(Slab { inner: Arc::new(SlabInner { region, taken: Mutex::new(BTreeMap::new()) }) })
    }

    /// Bytes in the slab.
    pub fn len(&self) -> usize {
        self.inner.region.len()
    }

    pub fn is_empty(&self) -> bool {
        self.inner.region.is_empty()
    }

    /// Address of the slab's first byte.
    pub fn addr(&self) -> u64 {
        self.inner.region.addr()
    }

    /// Views alive now (including those kept by operations in flight).
    pub fn views(&self) -> usize {
        self.inner.taken().len()
    }

    /// Whether `[offset, offset + len)` overlaps no live view.
    pub fn is_free(&self, offset: usize, len: usize) -> bool {
        let end = offset.saturating_add(len);
        !overlaps(&self.inner.taken(), offset, end)
    }

    /// Whether both handles name the same slab.
    pub fn ptr_eq(a: &Slab, b: &Slab) -> bool {
        Arc::ptr_eq(&a.inner, &b.inner)
    }

    /// A key for the whole slab (see the module docs on scope).
    pub fn pack_key(&self) -> Result<Vec<u8>> {
        self.inner.region.pack_key()
    }

    /// The slab's region back (to deregister it while keeping a caller's
    /// buffer: [`Region::into_vec`]), if this is the last handle of the
    /// slab and no view of it is alive (views keep the slab); otherwise
    /// the slab, unchanged.
    pub fn into_region(self) -> std::result::Result<Region, Slab> {
        match Arc::try_unwrap(self.inner) {
            Ok(inner) => Ok(inner.region),
            Err(inner) => Err(Slab { inner }),
        }
    }

    /// Hands out bytes `[offset, offset + len)` as a view, unless any of
    /// them belongs to a live view ([`Error::ViewTaken`]) or the range is
    /// empty or outside the slab ([`Error::Invalid`]).
    pub fn view(&self, offset: usize, len: usize) -> Result<SubRegion> {
        let size = self.len();
        if len == 0 || offset.checked_add(len).is_none_or(|e| e > size) {
            return Err(Error::Invalid {
                op: "Slab::view",
                reason: format!("range {offset}+{len} is empty or outside a slab of {size} bytes"),
            });
        }
        let end = offset + len;
        let mut taken = self.inner.taken();
        if overlaps(&taken, offset, end) {
            return Err(Error::ViewTaken { offset, len });
        }
        taken.insert(offset, end);
        drop(taken);
        Ok(SubRegion { slab: self.inner.clone(), offset, len })
    }
}

/// Whether `[start, end)` overlaps a range of `taken` (disjoint ranges, so
/// only the last one starting before `end` can).
fn overlaps(taken: &BTreeMap<usize, usize>, start: usize, end: usize) -> bool {
    taken.range(..end).next_back().is_some_and(|(_, &e)| e > start)
}

/// A disjoint view of a [`Slab`]: bytes `[offset, offset + len)` of it,
/// held by one owner. Keeps the slab's registration alive; returns its
/// range to the slab when dropped. Use it as RMA memory through
/// [`crate::Local::View`] (as an `Arc<SubRegion>`, which the operation keeps
/// until completion).
pub struct SubRegion {
    slab: Arc<SlabInner>,
    offset: usize,
    len: usize,
}

impl std::fmt::Debug for SubRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubRegion").field("offset", &self.offset).field("len", &self.len).finish()
    }
}

impl SubRegion {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Offset of the view in its slab.
    pub fn slab_offset(&self) -> usize {
        self.offset
    }

    /// Address of the view's first byte, as peers name it in RMA.
    pub fn addr(&self) -> u64 {
        self.slab.region.addr() + self.offset as u64
    }

    /// The slab this view belongs to.
    pub fn slab(&self) -> Slab {
        Slab { inner: self.slab.clone() }
    }

    pub(crate) fn region(&self) -> &Region {
        &self.slab.region
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        // SAFETY: offset + len ≤ the region's length (checked in
        // `Slab::view`), so the pointer stays inside the registered memory.
        unsafe { self.slab.region.ptr().add(self.offset) }
    }

    /// The view's bytes. As for [`Region::as_slice`], a peer with a key to
    /// the slab may change them while a request that exposed it is in
    /// flight.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the range lies inside the slab's region, which this view
        // keeps alive (Arc) and registered. No other live view covers any
        // of these bytes (`Slab::view` refuses overlaps; the range returns
        // only in our Drop), and the slab exposes no slice of its own, so
        // the only Rust references to these bytes come from this view:
        // shared ones from &self here, a unique one from &mut self below.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len) }
    }

    /// Mutable bytes; `&mut self` proves no in-flight local operation holds
    /// the view (operations keep an `Arc<SubRegion>` alive, so `&mut` is
    /// reachable only through `Arc::get_mut` once they are done).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice; &mut self makes this the only reference
        // to the view, hence to its bytes; the slab's memory is writable
        // (read-only mappings are refused by `Slab::new`).
        unsafe { std::slice::from_raw_parts_mut(self.ptr(), self.len) }
    }
}

impl Drop for SubRegion {
    fn drop(&mut self) {
        let removed = self.slab.taken().remove(&self.offset);
        debug_assert_eq!(removed, Some(self.offset + self.len), "a view's range is taken until it drops");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Access, Context, ContextOptions};

    #[test]
    fn views_are_disjoint_and_return_on_drop() {
        let ctx = Context::new(&ContextOptions::default()).unwrap();
        let before = ctx.stats().snapshot();
        let slab = Slab::new(Region::allocate(&ctx, 64 * 1024, Access::Local).unwrap()).unwrap();
        let mut a = slab.view(0, 4096).unwrap();
        let mut b = slab.view(4096, 4096).unwrap();
        assert!(matches!(slab.view(4095, 2), Err(Error::ViewTaken { .. })), "overlap refused");
        assert!(matches!(slab.view(0, 64 * 1024), Err(Error::ViewTaken { .. })));
        assert!(matches!(slab.view(60 * 1024, 8 * 1024), Err(Error::Invalid { .. })), "outside refused");
        assert!(matches!(slab.view(100, 0), Err(Error::Invalid { .. })));
        a.as_mut_slice().fill(1);
        b.as_mut_slice().fill(2);
        assert!(a.as_slice().iter().all(|&x| x == 1) && b.as_slice().iter().all(|&x| x == 2));
        assert_eq!(b.addr(), slab.addr() + 4096);
        assert_eq!(slab.views(), 2);
        drop(a);
        assert!(slab.is_free(0, 4096) && !slab.is_free(4000, 200));
        let a2 = slab.view(0, 4096).unwrap();
        assert_eq!(a2.as_slice()[0], 1, "same memory, handed out again");
        // One registration for the slab however many views it gives.
        let regs = ctx.stats().snapshot().since(&before).registrations;
        assert_eq!(regs, 1);
        // A view keeps the registration alive after the slab handle goes.
        drop(slab);
        assert_eq!(ctx.stats().snapshot().since(&before).deregistrations, 0);
        drop((a2, b));
        assert_eq!(ctx.stats().snapshot().since(&before).deregistrations, 1);
    }

    #[test]
    fn a_slab_without_views_gives_back_its_buffer_with_the_bytes() {
        let ctx = Context::new(&ContextOptions::default()).unwrap();
        let before = ctx.stats().snapshot();
        let slab = Slab::new(Region::register(&ctx, vec![0u8; 64 * 1024], Access::Local).unwrap()).unwrap();
        let mut v = slab.view(4096, 4096).unwrap();
        v.as_mut_slice().fill(7);
        // A live view (or another handle) keeps the slab registered.
        let slab = slab.into_region().map(|_| ()).unwrap_err();
        let other = slab.clone();
        drop(v);
        let slab = slab.into_region().map(|_| ()).unwrap_err();
        drop(other);
        let buf = slab.into_region().unwrap().into_vec().unwrap();
        assert!(buf[4096..8192].iter().all(|&b| b == 7) && buf[..4096].iter().all(|&b| b == 0));
        let d = ctx.stats().snapshot().since(&before);
        assert_eq!((d.registrations, d.deregistrations), (1, 1));
    }

    #[test]
    fn a_view_is_rma_memory_without_a_copy() {
        let ctx = Context::new(&ContextOptions::default()).unwrap();
        let w = crate::Worker::new(&ctx).unwrap();
        let ep = w.connect_address(&w.address().unwrap(), crate::ErrMode::None).unwrap();
        let slab = Slab::new(Region::allocate(&ctx, 64 * 1024, Access::Local).unwrap()).unwrap();
        let mut src = slab.view(8192, 4096).unwrap();
        src.as_mut_slice().iter_mut().enumerate().for_each(|(i, b)| *b = (i % 251) as u8);
        let src = Arc::new(src);
        let dst_view = Arc::new(slab.view(0, 4096).unwrap());
        let mut remote = Region::allocate(&ctx, 4096, Access::RemoteReadWrite).unwrap();
        remote.as_mut_slice().fill(0);
        let rkey = std::rc::Rc::new(ep.unpack_key(&remote.pack_key().unwrap()).unwrap());
        let progress = |ops: &[&crate::Op]| {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while ops.iter().any(|o| o.poll_done().is_none()) {
                assert!(std::time::Instant::now() < deadline, "RMA did not complete");
                w.progress();
            }
            for o in ops {
                o.poll_done().unwrap().unwrap();
            }
        };
        let put =
            ep.put(crate::Local::View { view: src.clone(), offset: 100, len: 1000 }, remote.addr() + 7, &rkey).unwrap();
        let flush = ep.flush().unwrap();
        progress(&[&put, &flush]);
        assert_eq!(&remote.as_slice()[7..1007], &src.as_slice()[100..1100]);
        let get = ep.get(crate::Local::View { view: dst_view.clone(), offset: 0, len: 4096 }, remote.addr(), &rkey);
        let get = get.unwrap();
        progress(&[&get]);
        assert_eq!(dst_view.as_slice(), remote.as_slice());
        // Out-of-view ranges are refused before UCX sees them.
        assert!(ep
            .put(crate::Local::View { view: src.clone(), offset: 4000, len: 200 }, remote.addr(), &rkey)
            .is_err());
        // The operations kept the views: they return once the ops are gone.
        drop((put, get, flush));
        drop((src, dst_view));
        assert_eq!(slab.views(), 0);
    }
}
