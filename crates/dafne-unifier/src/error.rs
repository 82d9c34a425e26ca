//! Errors: a configuration error says what to change; an operating error
//! says which object, offset or limit was involved.

/// A setting of [`crate::UnifierConfig`] that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// Slabs are carved into units of every class; a slab that is not a
    /// whole number of the largest unit would waste its tail.
    #[error(
        "slab_size is {slab_size} bytes; it must be a non-zero multiple of 65536 (64 KiB, the largest unit), \
         e.g. 8388608 (8 MiB)"
    )]
    SlabSize { slab_size: usize },
    /// Carving a slab registers every unit in it; the bound keeps a carve short.
    #[error("slab_size is {slab_size} bytes; at most {max} is allowed: use more slabs instead of larger ones")]
    SlabTooLarge { slab_size: usize, max: usize },
    /// Neither ready nor raw slabs: the cache would have no memory.
    #[error("ready_slabs and raw_slabs are both 0; the cache needs at least one slab (ready_slabs = 1 or more)")]
    NoMemory,
    /// The cache is larger than slot numbers can count.
    #[error(
        "{slabs} slabs of {slab_size} bytes exceed the {max}-byte cache limit; lower ready_slabs/raw_slabs or \
         slab_size"
    )]
    CacheTooLarge { slabs: usize, slab_size: usize, max: u64 },
    /// The default unit must be a size class.
    #[error("default_unit is {unit_size} bytes; it must be one of 4096, 8192, 16384, 32768 or 65536")]
    UnitSize { unit_size: usize },
    /// At least one whole unit must be allowed to be dirty, or no write could complete.
    #[error("max_dirty_bytes is {max_dirty_bytes}; it must be at least {min} (one 64 KiB unit)")]
    DirtyTooSmall { max_dirty_bytes: usize, min: usize },
    /// More dirty bytes than the cache holds is meaningless (and hides a typo).
    #[error(
        "max_dirty_bytes is {max_dirty_bytes} but the cache holds only {cache_bytes} bytes; lower it (a quarter of \
         the cache is a good start)"
    )]
    DirtyTooLarge { max_dirty_bytes: usize, cache_bytes: u64 },
    #[error(
        "max_pinned_bytes = {max_pinned_bytes} is below the memory registered at start ({ready_bytes} bytes of \
         ready slabs) plus two raw slabs if there is raw memory: raise it to at least {min} (--max-pinned-mib), \
         or make more of the cache raw (--raw-percent)"
    )]
    PinnedTooSmall { max_pinned_bytes: u64, ready_bytes: u64, min: u64 },
}

/// An operating error of the Unifier.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration was rejected by [`crate::UnifierConfig::validate`].
    #[error("invalid Unifier configuration: {0}")]
    Config(#[from] ConfigError),
    /// UCX refused to register cache memory (at start, when a slab is
    /// carved, or when a raw unit is first used).
    #[error("registering {bytes} bytes of cache memory failed: {source}")]
    Register {
        bytes: usize,
        #[source]
        source: dafne_ucx::Error,
    },
    /// The storage below the cache failed. The unit involved stays as it was
    /// (a failed fill leaves nothing cached; a failed write-back leaves the
    /// unit dirty).
    #[error("storage {op} of object {object} at offset {offset} failed: {source}")]
    Storage {
        op: &'static str,
        object: u64,
        offset: u64,
        #[source]
        source: std::io::Error,
    },
    /// Every unit that could hold the data is referenced, being filled or
    /// waited for. The io server answers "no buffer, retry" (receiver-side
    /// admission) instead of queueing without bound.
    #[error(
        "no {unit_size}-byte cache unit can be had: {pinned} units are in use; retry after requests complete, or \
         add ready_slabs/raw_slabs"
    )]
    NoSpace { unit_size: usize, pinned: usize },
    /// Advice named a unit size that is not a size class.
    #[error("unit size {unit_size} is not a size class (4096, 8192, 16384, 32768 or 65536)")]
    UnitSize { unit_size: usize },
    /// A write range is empty or does not lie inside the unit.
    #[error("byte range {start}..{end} is not a non-empty range inside a {unit_size}-byte unit")]
    BadRange { start: usize, end: usize, unit_size: usize },
    /// The unit's bytes would lie past 2^64.
    #[error("unit {unit_index} of {unit_size} bytes lies beyond the 2^64-byte object limit")]
    OffsetOverflow { unit_index: u64, unit_size: usize },
    /// The object's unit size cannot change while some of its units are in use.
    #[error("object {object} has cached units in use; its unit size can change only when none is referenced")]
    Busy { object: u64 },
    /// Too many objects carry advice.
    #[error("more than {limit} objects carry advice; clear advice when files are closed")]
    TooManyAdvised { limit: usize },
    /// `bytes_mut` was called while an RMA operation started from this
    /// guard still holds the unit's memory.
    #[error("the unit's memory is lent to an RMA operation that has not completed")]
    MemoryInFlight,
}

/// `Result` with the Unifier's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
