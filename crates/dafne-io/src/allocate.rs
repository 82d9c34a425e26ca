//! `fallocate` for the io op `Allocate` (`dafne_proto::io`, "Allocate"):
//! which bytes of a chunk file a request reaches, and what it does to the
//! cache and to the file.
//!
//! # Why the server is told its stripe slots
//! A chunk file holds the object's bytes at their file offsets, with holes
//! where other servers' stripe units are (`chunk` module docs). A punch can
//! therefore go over the whole range in one call: the other servers' units
//! are holes here already, so punching them changes nothing. A reserve
//! cannot: reserving the whole range would take blocks under every other
//! server's units too (`stripe_count` times the space asked for). The
//! server does not know the layout, so the request names this server's
//! positions in it ([`StripeSlots`]) and the server reserves only those
//! stripe units ([`own_ranges`]), joining adjacent ones (a server that
//! holds every slot makes one call). The decoder bounds a request to
//! `MAX_ALLOCATE_STRIPES` stripe units, so one request is at most that
//! many calls.
//!
//! # Order against the cache
//! Where the mode zeroes bytes (punch, zero range), the Unifier first
//! drops the cached units inside the range and zeroes the parts of units
//! at its ends ([`dafne_unifier::Unifier::zero_range`]), waiting out the
//! object's write-backs in flight; the file is punched right after, on the
//! same turn of the event loop, as `Truncate` does. So a later read gets
//! zeros (from the cache or the file) and no write-back of older bytes
//! lands after the punch. Like `Truncate` and `Sync`, the `fallocate`
//! calls run on the event loop (a reserve of many stripe units holds it
//! for one call per unit).
//!
//! # Sizes
//! A reserve without `KEEP_SIZE` grows the chunk file to the end of this
//! server's last unit in the range (mode 0 of `fallocate` does that), so a
//! later `Stat` of every server answers the range's end; the client
//! publishes the file's size to meta. Every other mode keeps sizes.

use std::ops::Range;

use dafne_proto::io::StripeSlots;
use dafne_proto::Errno;

/// This server's part of `[offset, offset + len)`: its stripe units of the
/// range (clipped to it), adjacent ones joined, in ascending order. Work
/// is one step per stripe unit the range spans (bounded by the decoder).
pub fn own_ranges(offset: u64, len: u64, stripes: &StripeSlots) -> Vec<Range<u64>> {
    let unit = u64::from(stripes.unit.max(1));
    let end = offset.saturating_add(len);
    let mut out: Vec<Range<u64>> = Vec::new();
    let mut index = offset / unit;
    while index.saturating_mul(unit) < end {
        if stripes.holds(index) {
            let start = (index * unit).max(offset);
            let stop = index.saturating_add(1).saturating_mul(unit).min(end);
            match out.last_mut() {
                Some(last) if last.end == start => last.end = stop,
                _ => out.push(start..stop),
            }
        }
        index += 1;
    }
    out
}

/// The errno a client gets for a failed `fallocate`: the file system's
/// refusal of the mode (`EOPNOTSUPP`, so that `posix_fallocate` falls back
/// to writing), a full device and a too large file as they are, anything
/// else `EIO`.
pub fn errno(what: &'static str) -> impl Fn(std::io::Error) -> Errno {
    move |e| {
        let code = rustix::io::Errno::from_io_error(&e);
        if code == Some(rustix::io::Errno::OPNOTSUPP) {
            return Errno::EOPNOTSUPP;
        }
        tracing::warn!("{what}: {e}");
        match code {
            Some(rustix::io::Errno::NOSPC) => Errno::ENOSPC,
            Some(rustix::io::Errno::FBIG) => Errno::EFBIG,
            _ => Errno::EIO,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::ChunkStore;
    use dafne_proto::io::AllocateMode;
    use dafne_unifier::Storage;
    use std::os::unix::fs::MetadataExt;

    const M: u64 = 1 << 20;

    fn quad(slots: &[u32]) -> StripeSlots {
        StripeSlots { unit: M as u32, count: 4, slots: slots.to_vec() }
    }

    #[test]
    fn a_server_gets_its_own_stripe_units_of_the_range() {
        // 1 MiB units over 4 servers; the range starts half-way into unit 1
        // and ends a byte into unit 9.
        let (off, len) = (M + M / 2, 8 * M - M / 2 + 1);
        assert_eq!(own_ranges(off, len, &quad(&[1])), vec![off..2 * M, 5 * M..6 * M, 9 * M..9 * M + 1]);
        assert_eq!(own_ranges(off, len, &quad(&[0])), vec![4 * M..5 * M, 8 * M..9 * M]);
        assert_eq!(own_ranges(off, len, &quad(&[3])), vec![3 * M..4 * M, 7 * M..8 * M]);
        // Two slots side by side join; every slot is the whole range.
        assert_eq!(own_ranges(off, len, &quad(&[2, 3])), vec![2 * M..4 * M, 6 * M..8 * M]);
        assert_eq!(own_ranges(off, len, &quad(&[0, 1, 2, 3])), vec![off..off + len]);
        assert_eq!(own_ranges(off, len, &StripeSlots::all(4096)), vec![off..off + len]);
        // Inside one unit that is not this server's: nothing.
        assert_eq!(own_ranges(10, 20, &quad(&[1])), Vec::<Range<u64>>::new());
        // Near the largest file size, without overflow.
        let max = dafne_proto::io::MAX_FILE_SIZE;
        let r = own_ranges(max - 10, 10, &StripeSlots { unit: u32::MAX, count: 1, slots: vec![0] });
        assert_eq!(r, vec![max - 10..max]);
    }

    fn blocks(s: &ChunkStore, object: u64) -> u64 {
        s.with_file(object, false, |f| Ok(f.metadata()?.blocks())).unwrap().unwrap_or(0)
    }

    fn read(s: &ChunkStore, object: u64, offset: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0xa5; len];
        let n = s.read_at(object, offset, &mut buf).unwrap();
        buf.truncate(n);
        buf
    }

    #[test]
    fn a_reserve_takes_blocks_under_own_units_only_and_grows_the_file_unless_kept() {
        let d = tempfile::tempdir().unwrap();
        let s = ChunkStore::open(d.path()).unwrap();
        // Slot 1 of 4, range [0, 8 MiB): units 1 and 5 are this server's.
        s.fallocate(1, 0, 8 * M, AllocateMode::Reserve, &quad(&[1])).unwrap();
        assert_eq!(s.size(1).unwrap(), 6 * M, "the file ends with its last own unit");
        // 2 MiB in 512-byte blocks (file systems may add a little).
        let b = blocks(&s, 1);
        assert!((2 * M / 512..3 * M / 512).contains(&b), "{b} blocks for two 1 MiB units");
        assert!(read(&s, 1, 0, 4096).iter().all(|&x| x == 0));
        // KEEP_SIZE: blocks beyond the end, the size stays.
        s.fallocate(1, 8 * M, 4 * M, AllocateMode::ReserveKeepSize, &quad(&[1])).unwrap();
        assert_eq!(s.size(1).unwrap(), 6 * M);
        assert!(blocks(&s, 1) >= b + M / 512);
    }

    #[test]
    fn a_reserve_larger_than_the_free_space_is_refused_before_anything_is_reserved() {
        let d = tempfile::tempdir().unwrap();
        let s = ChunkStore::open(d.path()).unwrap();
        let (_, free, _) = s.capacity().unwrap();
        let all = StripeSlots { unit: M as u32, count: 1, slots: vec![0] };
        let e = s.fallocate(2, 0, free + 64 * M, AllocateMode::Reserve, &all).unwrap_err();
        assert_eq!(errno("fallocate")(e), Errno::ENOSPC);
        assert_eq!(blocks(&s, 2), 0, "nothing reserved");
        let (_, after, _) = s.capacity().unwrap();
        assert!(after + 64 * M > free, "the device's free space is whole ({free} before, {after} after)");
    }

    #[test]
    fn a_punch_frees_the_range_and_keeps_the_rest_and_the_size() {
        let d = tempfile::tempdir().unwrap();
        let s = ChunkStore::open(d.path()).unwrap();
        let data: Vec<u8> = (0..3 * M).map(|i| (i % 251) as u8 + 1).collect();
        s.write_at(2, 0, &data).unwrap();
        let before = blocks(&s, 2);
        // A punch names the server's slot, but goes over the whole range
        // (other servers' units are holes here anyway).
        s.fallocate(2, M / 2, M + 4096 * 3 + 7, AllocateMode::PunchHole, &quad(&[1])).unwrap();
        let end = M / 2 + M + 4096 * 3 + 7;
        assert_eq!(s.size(2).unwrap(), 3 * M);
        assert_eq!(read(&s, 2, 0, (M / 2) as usize), data[..(M / 2) as usize]);
        assert!(read(&s, 2, M / 2, (end - M / 2) as usize).iter().all(|&x| x == 0));
        assert_eq!(read(&s, 2, end, (3 * M - end) as usize), data[end as usize..]);
        assert!(blocks(&s, 2) < before, "no block was freed");
        // A punch of a missing object creates nothing.
        s.fallocate(3, 0, M, AllocateMode::PunchHole, &quad(&[0])).unwrap();
        assert_eq!(s.with_file(3, false, |_| Ok(())).unwrap(), None);
    }

    #[test]
    fn a_zero_range_zeroes_and_reserves_own_units() {
        let d = tempfile::tempdir().unwrap();
        let s = ChunkStore::open(d.path()).unwrap();
        s.write_at(4, 0, &vec![9u8; (2 * M) as usize]).unwrap();
        s.fallocate(4, 100, 3 * M, AllocateMode::ZeroRange, &StripeSlots::all(M as u32)).unwrap();
        assert_eq!(s.size(4).unwrap(), 3 * M + 100);
        assert_eq!(read(&s, 4, 0, 100), vec![9u8; 100]);
        assert!(read(&s, 4, 100, (3 * M) as usize).iter().all(|&x| x == 0));
        assert!(blocks(&s, 4) >= 3 * M / 512, "the zeroed range is reserved");
        s.fallocate(4, 0, 8 * M, AllocateMode::ZeroRangeKeepSize, &StripeSlots::all(M as u32)).unwrap();
        assert_eq!(s.size(4).unwrap(), 3 * M + 100);
        assert!(read(&s, 4, 0, 100).iter().all(|&x| x == 0));
    }

    #[test]
    fn errnos_say_what_a_client_can_act_on() {
        let os = |e: rustix::io::Errno| std::io::Error::from(e);
        assert_eq!(errno("t")(os(rustix::io::Errno::OPNOTSUPP)), Errno::EOPNOTSUPP);
        assert_eq!(errno("t")(os(rustix::io::Errno::NOSPC)), Errno::ENOSPC);
        assert_eq!(errno("t")(os(rustix::io::Errno::FBIG)), Errno::EFBIG);
        assert_eq!(errno("t")(os(rustix::io::Errno::IO)), Errno::EIO);
        assert_eq!(errno("t")(std::io::Error::other("x")), Errno::EIO);
    }
}
