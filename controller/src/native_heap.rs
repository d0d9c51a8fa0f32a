//! glibc's heap, which holds what is not Rust's: RocksDB's memtables, block cache and
//! table readers.
//!
//! Rust's allocations go to mimalloc (see `main.rs`); RocksDB's C++ allocates with glibc's
//! `malloc`. Under the chaos workload a replica's glibc memory grew from 3 to 23 MiB in 14
//! minutes while heaptrack showed the live glibc heap flat at 5–10 MiB (RocksDB's memtables,
//! within the bounds of `docket_raft::rocks_memory`). The difference is glibc keeping what
//! was freed: a memtable's 1 MiB arena blocks start above the mmap threshold, but the first
//! `free` of such a block raises glibc's threshold to its size (the "dynamic" threshold), so
//! later blocks come from the heap, and when a flushed memtable frees them, the holes stay
//! resident among live chunks; each of up to `8 × cores` arenas (one per thread that
//! allocates) keeps its own.
//!
//! [`bound`] fixes the threshold (large blocks are mapped and unmapped, never left in the
//! heap), trims the top of a heap beyond 128 KiB and keeps to two arenas. [`trim_every`]
//! returns the free pages inside the heaps as well (`malloc_trim`, which on glibc ≥ 2.8
//! releases whole free pages anywhere in every arena, not only at the top). Both are glibc's
//! documented knobs: mallopt(3), malloc_trim(3). Replacing glibc's allocator for RocksDB
//! (as TiKV does with jemalloc) would also do; these keep one allocator fewer in the build.

use std::time::Duration;

/// Allocations this large or larger are mapped on their own and unmapped when freed.
pub const MMAP_THRESHOLD_BYTES: i32 = 128 << 10;

/// Free memory at the top of a heap beyond this is returned at once.
pub const TRIM_THRESHOLD_BYTES: i32 = 128 << 10;

/// Arenas glibc may create (its default is eight per core).
pub const ARENA_MAX: i32 = 2;

/// Sets glibc's malloc parameters for this process. Call once at start, before threads that
/// allocate through glibc exist (it changes how arenas are created, not existing ones).
/// Returns the parameters glibc refused (none, on glibc).
pub fn bound() -> Vec<&'static str> {
    let mut refused = Vec::new();
    for (name, param, value) in [
        (
            "M_MMAP_THRESHOLD",
            libc::M_MMAP_THRESHOLD,
            MMAP_THRESHOLD_BYTES,
        ),
        (
            "M_TRIM_THRESHOLD",
            libc::M_TRIM_THRESHOLD,
            TRIM_THRESHOLD_BYTES,
        ),
        ("M_ARENA_MAX", libc::M_ARENA_MAX, ARENA_MAX),
    ] {
        // SAFETY: mallopt only sets malloc's tunables; any value is defined behaviour (it
        // returns 0 for one it refuses).
        if unsafe { libc::mallopt(param, value) } != 1 {
            refused.push(name);
        }
    }
    refused
}

/// Returns the free pages of glibc's heaps to the kernel every `period`, forever (a task for
/// the daemon's runtime; the call runs on the blocking pool: it walks every arena under
/// its lock, a few hundred microseconds at a controller's size).
pub async fn trim_every(period: Duration) {
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    loop {
        ticks.tick().await;
        // SAFETY: malloc_trim(0) only releases free memory; it has no preconditions.
        let _ = tokio::task::spawn_blocking(|| unsafe { libc::malloc_trim(0) }).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glibc_takes_the_bounds() {
        assert!(bound().is_empty(), "glibc refused {:?}", bound());
    }

    #[test]
    fn a_large_block_freed_leaves_nothing_resident() {
        bound();
        // SAFETY: mallinfo2 only reads malloc's statistics.
        let before = unsafe { libc::mallinfo2() };
        // With the threshold fixed, a block above it is its own mapping: freeing it unmaps
        // it, however many were freed before (the dynamic threshold would have moved to
        // their size and served the next ones from the heap, where they stay when freed).
        for _ in 0..8 {
            // SAFETY: a plain malloc/free pair; only the block's own bytes are written.
            unsafe {
                let p = libc::malloc(1 << 20).cast::<u8>();
                assert!(!p.is_null());
                std::ptr::write_bytes(p, 1, 1 << 20);
                libc::free(p.cast());
            }
        }
        // SAFETY: as above.
        let after = unsafe { libc::mallinfo2() };
        assert!(
            after.hblks <= before.hblks,
            "a freed 1 MiB block is still mapped"
        );
        // Unbounded, the heap grows by most of a block (about 900 KiB on glibc 2.36) and
        // keeps it, free but resident.
        assert!(
            after.arena < before.arena + (256 << 10),
            "the heap grew by {} bytes: the 1 MiB blocks came from it",
            after.arena.saturating_sub(before.arena)
        );
    }
}
