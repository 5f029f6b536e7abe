//! The operating system's limits that bound how many actors can be in
//! memory at once: open files (each live actor holds its database and its
//! WAL open) and memory mappings (each live actor's instance maps its
//! linear memory, guard regions and stacks).
//!
//! Invariant owned here: the soft limit on open files is raised to the hard
//! limit once, at start, as servers that hold many files do; the numbers
//! returned are the limits in force afterwards.

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
