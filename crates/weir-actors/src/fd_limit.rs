//! The process's limit on open files, which bounds how many actors can be
//! in memory at once (each holds its database and WAL open).
//!
//! Invariant owned here: the soft limit is raised to the hard limit once,
//! at start, as servers that hold many files do; the number returned is the
//! limit in force afterwards.

/// Raises the soft limit on open files to the hard limit and returns the
/// limit in force, or `None` where it cannot be read.
pub fn raise() -> Option<u64> {
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
