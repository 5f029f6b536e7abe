//! The operating system's limits that bound how many actors can be in
//! memory at once: open files (each live actor holds its database and its
//! WAL open) and memory mappings (each live actor's instance maps its
//! linear memory, guard regions and stacks).
//!
//! Invariants owned here: the soft limit on open files is raised to the
//! hard limit once, at start, as servers that hold many files do; the
//! live-actor cap leaves room under both limits for everything else the
//! server holds, whatever the operator configured.

/// File descriptors one live actor holds: its database and its WAL (no
/// shared-memory file: each connection holds its database exclusively).
pub const FDS_PER_LIVE_ACTOR: u64 = 2;

/// File descriptors left for everything else — listeners, client and
/// upstream connections, stores — when the live-actor cap is derived from
/// the process's descriptor limit.
pub const FD_RESERVE: u64 = 1024;

/// Memory mappings one live actor's instance holds, rounded up from the ~7
/// measured (linear memory and its guards, stacks, tables).
pub const MAPS_PER_LIVE_ACTOR: u64 = 8;

/// Memory mappings left for everything else: the worker pool, threads,
/// libraries, the allocator. Past the kernel's map count, every mmap —
/// a thread's stack, a large allocation — fails.
pub const MAP_RESERVE: u64 = 8192;

/// Live actors allowed when an operating-system limit cannot be read.
pub const DEFAULT_MAX_LIVE_ACTORS: usize = 4096;

/// Fewest actors allowed in memory, whatever the open-file limit says.
pub const MIN_LIVE_ACTORS: usize = 16;

/// Actors allowed in memory at once: the smallest of what the operator
/// configured (`max_live_actors` of every class), what the open-file limit
/// leaves room for and what the kernel's map count leaves room for; never
/// below [`MIN_LIVE_ACTORS`]. Raises the open-file limit first.
pub fn live_actor_cap(configured: Option<usize>) -> usize {
    let by_files = raise_open_files()
        .map(|n| (n.saturating_sub(FD_RESERVE) / FDS_PER_LIVE_ACTOR) as usize)
        .unwrap_or(DEFAULT_MAX_LIVE_ACTORS);
    let by_maps = max_map_count()
        .map(|n| (n.saturating_sub(MAP_RESERVE) / MAPS_PER_LIVE_ACTOR) as usize)
        .unwrap_or(DEFAULT_MAX_LIVE_ACTORS);
    by_files
        .min(by_maps)
        .min(configured.unwrap_or(DEFAULT_MAX_LIVE_ACTORS))
        .max(MIN_LIVE_ACTORS)
}

/// Raises the soft limit on open files to the hard limit and returns the
/// limit in force, or `None` where it cannot be read.
pub fn raise_open_files() -> Option<u64> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit and setrlimit read and write only the struct we
        // pass, which lives on this stack frame.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
                return None;
            }
            if limit.rlim_cur < limit.rlim_max {
                let raised = libc::rlimit {
                    rlim_cur: limit.rlim_max,
                    rlim_max: limit.rlim_max,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                    limit = raised;
                }
            }
        }
        Some(limit.rlim_cur)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        None
    }
}

/// The kernel's limit on memory mappings per process, where it can be read.
pub fn max_map_count() -> Option<u64> {
    std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()?
        .trim()
        .parse()
        .ok()
}
