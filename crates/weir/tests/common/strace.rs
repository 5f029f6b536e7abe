//! The system calls of a running server, traced with `strace`: how a
//! test sees from outside the order of what a server does where no answer
//! shows it (an fsync before an answer, a commit before a reply).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{Weir, exit_within, wait_for};

/// `strace` attached to a server, following its threads, with file
/// descriptors shown by their paths (`-y`).
pub struct Strace {
    child: Child,
    log: PathBuf,
}

impl Strace {
    /// Attaches to `weir`, tracing `calls` (`strace -e trace=…`), and
    /// returns once the trace has begun (the server's own writes show up
    /// in it; `poke` is called meanwhile to make some).
    pub async fn attach<F, Fut>(weir: &Weir, calls: &str, poke: F) -> Strace
    where
        F: Fn() -> Fut,
        Fut: Future<Output = ()>,
    {
        let log = weir_scratch::dir(&format!("strace-{}", weir.pid()));
        let child = Command::new("strace")
            .args(["-f", "-y", "-qq", "-s", "48", "-e"])
            .arg(format!("trace={calls}"))
            .arg("-o")
            .arg(&log)
            .arg("-p")
            .arg(weir.pid().to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("strace runs (apt-get install strace)");
        wait_for("strace to attach", || async {
            poke().await;
            match std::fs::metadata(&log) {
                Ok(m) if m.len() > 0 => Ok(()),
                _ => Err("nothing traced yet".to_string()),
            }
        })
        .await;
        Strace { child, log }
    }

    /// Detaches, and returns the trace's lines from the attach on.
    pub fn finish(mut self) -> Vec<String> {
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let _ = exit_within(&mut self.child, Duration::from_secs(10));
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }
}
