//! Counters that show what the cache did: how often it hit, what it cost in
//! storage traffic and registrations, and that it never copied bytes.

/// A snapshot of the Unifier's counters (monotonic) and gauges (current).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct UnifierStats {
    /// Acquisitions that found their unit cached (or being filled by another).
    pub hits: u64,
    /// Acquisitions that had to allocate a unit.
    pub misses: u64,
    /// Storage reads that filled a unit, and the bytes they returned.
    pub fills: u64,
    pub fill_bytes: u64,
    /// Units filled ahead of their acquisition by [`crate::Unifier::prefetch`]
    /// (counted in `fills` too), and the storage batches they went in.
    pub prefetched: u64,
    pub prefetch_batches: u64,
    /// Of the units prefetched, those read ahead of a sequential reader
    /// ([`crate::Unifier::prefetch_with_ahead`]); their first use is a hit.
    pub read_ahead: u64,
    /// Acquisitions that waited for another's fill of the same unit.
    pub fill_waits: u64,
    /// Acquisitions that waited for a conflicting holder (a writer waiting
    /// for readers, readers waiting for a writer).
    pub conflict_waits: u64,
    /// Units dropped to make room.
    pub evictions: u64,
    /// Dirty ranges written to storage, and their bytes.
    pub writebacks: u64,
    pub writeback_bytes: u64,
    /// Write-backs forced by the `max_dirty_bytes` bound, made synchronously
    /// on the caller's thread (the event loop).
    pub write_behind: u64,
    /// Write-backs made by the background thread (counted in `writebacks`
    /// too), the batches they went in, and writers that waited for one
    /// because they would have passed `max_dirty_bytes`.
    pub background_writebacks: u64,
    pub background_batches: u64,
    pub background_waits: u64,
    /// Bytes copied between buffers. The Unifier itself never copies (storage
    /// reads and writes use unit memory directly; RMA reads and writes it in
    /// place), so this stays 0 unless a serving mode that copies (the
    /// `normal` comparison mode) records its copies with
    /// [`crate::Unifier::record_copy`].
    pub bytes_copied: u64,
    /// Registrations made while serving (one per raw slab, on its first
    /// use; re-carving a slab into another size class registers nothing),
    /// their total time and bytes.
    pub registrations: u64,
    pub registration_ns: u64,
    pub registered_bytes: u64,
    /// Raw slabs deregistered to keep registered memory under
    /// `max_pinned_bytes` (their memory and data stay, parked), and the
    /// time it took.
    pub deregistrations: u64,
    pub deregistration_ns: u64,
    /// The most cache memory registered at once since start, bytes.
    pub pinned_peak: u64,
    /// Registrations made at start (one per ready slab).
    pub startup_registrations: u64,
    pub startup_registration_ns: u64,
    /// Slabs carved into units (raw slabs first used, slabs re-carved).
    pub carves: u64,
    /// Unit slots given up because an abandoned RMA operation still holds
    /// their memory.
    pub retired_units: u64,
    /// Storage calls that failed.
    pub storage_errors: u64,
    /// Acquisitions refused because every candidate unit was in use.
    pub no_space: u64,
    /// Gauges: unit slots holding data, those referenced by a guard, being
    /// filled or waited for, dirty units and their dirty bytes, and unit
    /// slots that exist (carved and not retired).
    pub units_in_use: u64,
    pub units_referenced: u64,
    pub dirty_units: u64,
    pub dirty_bytes: u64,
    pub unit_slots: u64,
    /// Gauge: units holding data, per size class (4, 8, 16, 32, 64 KiB, the
    /// order of [`crate::UNIT_SIZES`]): shows which unit size files' advice
    /// (or the default) gave them.
    pub units_by_class: [u64; 5],
    /// Gauge: units holding data that are under CLOCK replacement (the
    /// others are under LRU).
    pub clock_units: u64,
    /// Gauge: bytes of cache memory registered now (ready slabs from the
    /// start, raw slabs once first used): the memory a NIC would pin.
    pub pinned_bytes: u64,
    /// Gauge: units holding data in parked (deregistered) raw memory.
    pub parked_units: u64,
}
