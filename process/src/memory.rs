//! How the services' memory is backed: without transparent huge pages.
//!
//! Both binaries allocate through mimalloc, which hands freed memory back to the kernel and
//! touches fresh pages again as traffic comes and goes. With transparent huge pages every such
//! first touch made the kernel zero a whole 2 MiB page: a quarter of the executor's CPU and a
//! sixth of the scheduler's in the S1 drain, most of it decoding lease batches
//! (docs/performance.md). herald's heaps are small, so huge pages save it nothing. Turning them
//! off for the process covers hosts that grant them on request (`madvise`, which mimalloc
//! makes) and hosts that back every large mapping with them (`always`) alike.

/// Turns transparent huge pages off for the whole process (all its threads, and memory faulted
/// from now on). Call it once logging is set up: where the kernel refuses (a seccomp filter, a
/// kernel older than 3.15) it logs a warning and the process runs as before, only slower.
pub fn turn_off_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    if let Err(e) = nix::sys::prctl::set_thp_disable(true) {
        tracing::warn!(error = %e, "cannot turn transparent huge pages off; running with them");
    }
}
