//! The Unifier: the io server's cache, which is also its pool of registered
//! communication buffers.
//!
//! # Why
//! An io server that caches file data in one place and keeps its RDMA
//! buffers in another copies every byte it serves (cache → send buffer), or
//! registers and deregisters memory per request (the Unifier paper measured
//! both: the copy halves cached read bandwidth, registration dominates small
//! requests). The Unifier merges the two, so that:
//!
//! * **one copy of each block**: storage reads land in a unit, the
//!   transport puts to clients straight from that unit, clients' data is
//!   fetched (RMA get) straight into it, and it is written back from it.
//!   The Unifier never copies bytes between buffers (`bytes_copied` stays 0);
//! * **no registration on the hot path**: "ready" memory is registered once,
//!   at start, one registration per slab; optional "raw" memory (heap
//!   buffers) is registered slab by slab the first time each slab is used,
//!   and stays registered unless `max_pinned_bytes` bounds the registered
//!   bytes: then the coldest raw slab whose units are all clean and unused
//!   is deregistered to make room, its buffer and data kept ("parked"), and
//!   registered again when one of its units is used (the paper's on-the-fly
//!   registration of raw buffers, per slab rather than per request);
//! * **sharing instead of copying**: a unit has one owner, the Unifier, and
//!   is lent out with reference counts (the paper's allocate/release).
//!   Readers share it; a writer waits until readers release it and then
//!   modifies it in place. No copy is made to dodge a conflict (write
//!   sharing is rare in parallel I/O, and the wait is one RMA long).
//!
//! # Memory: slabs, size classes, unit slots
//! The cache is `ready_slabs + raw_slabs` slabs of `slab_size` bytes. A slab
//! is carved into unit slots of one size class (4, 8, 16, 32 or 64 KiB) the
//! first time that class needs space; ready slabs are carved into
//! `default_unit` slots at start. A class without a free unit takes a raw
//! slab never carved, else evicts within itself, and only when it has
//! nothing evictable takes a slab from another class: an empty one, else
//! the coldest one whose units can all be evicted. Re-carving registers
//! nothing (the slab stays registered, only its views change: tested from
//! the counters), but it evicts a whole slab of another class's data, which
//! is why a class takes memory from another only as a last resort; it is
//! counted (`carves`). Set `default_unit` to the common unit size so that
//! advice rarely triggers it. (A class therefore keeps the slabs it has
//! until it runs dry; moving slabs by hit rates is left for later.)
//!
//! Each slab is one registration ([`dafne_ucx::Slab`]: one `ucp_mem_map`),
//! and each unit slot is a disjoint view of it ([`dafne_ucx::SubRegion`])
//! held as an `Arc`, so that an RMA operation can keep exactly the memory
//! it touches alive, and filling or writing a unit in place needs `&mut`
//! access to that view only (`Arc::get_mut` on the unit's `Arc`): an RMA
//! in flight on one unit blocks no other unit of its slab. The views are
//! disjoint by construction (the slab hands out each range once and takes
//! it back when the view drops), so a range an abandoned operation still
//! holds is skipped by a re-carve and reclaimed once the operation lets go.
//! Why per slab and not per unit: with `UCP_MEM_MAP_ALLOCATE` on one host
//! every UCX allocation is a SysV segment, and the kernel allows 4096
//! (`ipcs -l`): per-unit registration capped a machine at 256 MiB of 64 KiB
//! units and cost one registration per unit at start (1024 × 64 KiB in
//! ~35 ms here). Per slab, a 512 MiB cache of 16 MiB slabs is 32
//! registrations and 32 segments (tested). Memory keys are never sent,
//! since the server only does RMA from its own side (a key would name the
//! whole slab).
//!
//! # Index and replacement
//! `(object, unit_index) → slot`, where a unit caches bytes
//! `[unit_index * unit_size, +unit_size)` of the object; `unit_size` comes
//! from per-file advice ([`FileAdvice`]) or the default. Each size class
//! has two rings of its units, one per [`Policy`]; a unit is in the ring of
//! its file's policy. Only unreferenced units are evictable (no guard, no
//! fill, no waiter); a dirty victim is written back first.
//!
//! **Mixed policies share one pool** by letting each policy choose *which of
//! its own units* should go, and age decide *which policy* gives one up: LRU
//! nominates its least recently used unreferenced unit, CLOCK sweeps its
//! hand (clearing reference bits) to its first unreferenced unit with a
//! clear bit, and the nominee whose last use (a cache-wide tick) is older
//! is evicted. So a file's advice changes the order in which its own units
//! leave, but no policy can starve the other: a CLOCK file that stops being
//! used loses its units to an active LRU file, and vice versa. There are no
//! per-policy quotas to tune. (A CLOCK nominee that loses keeps the hand on
//! it, bit clear: it is the first candidate next time.)
//!
//! # Allocate/release: readers share, a writer waits
//! Every unit has a FIFO queue of waiting acquisitions, each with its
//! [`std::task::Waker`]. A reader enters when no writer holds or fills the
//! unit and no writer waits ahead of it; a writer enters when nobody holds
//! the unit and it is first in line. So a writer waits for the readers that
//! came before it, and readers that come after a waiting writer wait behind
//! it (the writer cannot starve). Releasing a guard wakes the waiters that
//! may now enter. A unit being filled from storage is held by its filler:
//! concurrent readers of a missing unit queue on it and are let in when the
//! one fill completes (no double fill); if the fill fails, they retry.
//! Waiting is a future; nothing blocks or spins. Dropping a waiting future
//! leaves the queue. As with any lock, a task must not wait for a unit it
//! already holds (e.g. `flush` or `truncate` of an object while holding a
//! write guard on it): that wait never ends.
//!
//! The exclusive holder of a unit (filler or writer) holds the cache's
//! `Arc` itself, which is how it may write the bytes in place; readers hold
//! clones. An RMA operation that is abandoned (its peer died) keeps its
//! clone; the Unifier notices the extra reference when it next needs the
//! unit exclusively or frees it, writes back any dirty bytes, and retires
//! the slot (`retired_units`) instead of reusing memory UCX may still touch.
//! The io server therefore completes and drops each RMA operation before
//! releasing the guard it came from.
//!
//! # Dirty units and write-back
//! A write marks the range it wrote dirty (one covering range per unit).
//! Write-back writes that range from the unit: on eviction, on
//! [`Unifier::flush`] / [`Unifier::flush_all`] (then `sync`), when a
//! request asks for stability ([`WriteGuard::commit_stable`]:
//! write-through), and when a writer would push dirty bytes past
//! `max_dirty_bytes` (bounded write-behind: the oldest dirty units go
//! first). Storage is synchronous: see [`storage`] for why; its syncs
//! are awaited ([`Storage::sync_later`]: a storage may run them on a
//! thread of its own while the loop serves). If the storage
//! offers a background writer ([`Storage::background`]), write-behind
//! starts early, at half the bound, on a thread of its own, and a writer
//! waits (asynchronously) only when the bound itself is reached; see
//! `background.rs` for how a unit being written back is kept unchanged.
//!
//! # Limits
//! * Cache memory: `(ready_slabs + raw_slabs) * slab_size` ≤ 1 TiB; slab ≤ 1 GiB.
//!   Default 8 × 8 MiB = 64 MiB = 1024 units of 64 KiB, 8 registrations.
//!   On one host each ready slab is one SysV segment (4096 per machine by
//!   default), so size slabs to keep `ready_slabs` × io servers well below.
//! * Unit slots ≤ cache / 4 KiB = 2^28 (slot numbers are `u32`).
//! * Units held at once ≤ unit slots; beyond that an acquisition fails with
//!   [`Error::NoSpace`] (the io server answers "retry"). Size the cache for
//!   the requests in flight: credits (64 per connection) × units per request
//!   (a 1 MiB request in 64 KiB units is 16) × connections; the defaults
//!   hold one connection's full window (64 × 16 = 1024 units).
//! * Dirty bytes ≤ `max_dirty_bytes` + (writers in flight − 1) × 64 KiB.
//! * Objects with advice ≤ [`MAX_ADVISED_OBJECTS`].
//! * Registered bytes ≤ `max_pinned_bytes` when set (≥ ready slabs + 2
//!   slabs). A parked unit that cannot be registered because every
//!   registered raw slab has a unit in use is refused with
//!   [`Error::NoSpace`] (the io server retries), as when every unit is held.
//!
//! # Threading
//! Single-threaded: the types are `!Send` (`Rc`, `RefCell`) and live on the
//! io server's event loop. No borrow of the cache's state is held across a
//! storage call or an `await`. The one other thread is the optional
//! background writer: it receives pinned units' memory (`Arc<SubRegion>`) and
//! storage's [`BackgroundStorage`], never the cache's state; completions
//! come back over a channel and are processed on the loop.

mod background;
pub mod config;
pub mod error;
mod ring;
mod state;
mod stats;
pub mod storage;
mod unifier;

#[cfg(test)]
mod tests;

pub use config::{FileAdvice, Policy, UnifierConfig, MAX_ADVISED_OBJECTS, MAX_CACHE_BYTES, MAX_SLAB_SIZE, UNIT_SIZES};
pub use error::{ConfigError, Error, Result};
pub use stats::UnifierStats;
pub use storage::{BackgroundStorage, BackgroundWrite, BatchRead, MemStorage, MemStorageStats, Storage, SyncFuture};
pub use unifier::{spans, ReadGuard, Span, Unifier, WriteGuard};
