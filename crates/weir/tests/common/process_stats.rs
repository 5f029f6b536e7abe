//! What `/proc` says about a running server: its memory and its threads'
//! CPU time and number.

/// A `/proc/<pid>/status` figure in KiB: `VmRSS` (now) or `VmHWM` (peak).
pub fn proc_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// The server's resident memory now, in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    proc_kib(pid, "VmRSS:")
}

/// Starts the peak (`VmHWM`) over from the current RSS.
pub fn reset_peak(pid: u32) {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
}

/// CPU time of each of the server's threads called `name` (its `comm`),
/// together, in clock ticks.
pub fn thread_ticks(pid: u32, name: &str) -> u64 {
    let mut ticks = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let dir = task.unwrap().path();
        let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(dir.join("stat")) else {
            continue;
        };
        if comm.trim_end() != name {
            continue;
        }
        // After the command's parenthesised name: state is field 3, utime
        // and stime fields 14 and 15.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .unwrap()
            .1
            .split_whitespace()
            .collect();
        ticks += fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    }
    ticks
}

/// The server's threads now.
pub fn thread_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .count()
}
