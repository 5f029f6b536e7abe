//! Compiled code: where the machine code of a component comes from.
//!
//! Invariants owned here:
//! - with a compiler process configured, the serving process never runs the
//!   compiler. Compiling untrusted Wasm is the most memory- and CPU-hungry
//!   thing Weir does with a guest's bytes: in a process of its own, its
//!   peak memory is given back when that process exits, a compiler that
//!   crashes, runs past [`COMPILE_TIME_LIMIT`] or grows past the cache's
//!   memory limit (`compile_memory_limit_bytes`, checked every
//!   [`COMPILER_POLL`]) is killed and its component refused rather than a
//!   dead, stalled or starved server; a compiler outlives neither the
//!   server nor the thread that waits for it (a server killed mid-compile
//!   leaves no compiler running), and the server's idle footprint holds
//!   only the code it runs (an idle `weir serve` of the hello guest: 15 MiB
//!   instead of 26 MiB, see `bench/RESULTS.md`);
//! - an artifact is named by the SHA-256 of the component's bytes and the
//!   engine's compatibility hash, and is written to a temporary file that is
//!   renamed into place: a reader finds a whole artifact for exactly these
//!   bytes and this engine, or none. One that does not load (damaged, or
//!   from another build) is compiled again, once. A process compiles an
//!   artifact once at a time: a second caller waits for the first's;
//! - the cache holds what the current server loaded: [`CodeCache::prune`]
//!   removes every other artifact after start, so it cannot grow with
//!   every version ever served.
//!
//! Artifacts are machine code that is mapped and run without further
//! checks: the cache directory must be writable by the operator only (it
//! lives in the data dir, which guests cannot name).

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::hash::{Hash, Hasher};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use wasmtime::component::Component;

use crate::engine::{EngineKind, WeirEngine};

/// Longest a compiler process may run before its component is refused.
/// Cranelift compiles the guests in this repository in well under a second
/// and a 20 MB component in tens of seconds on 2 cores; a component that
/// takes ten minutes is treated as an attack on the compiler, not as code.
pub const COMPILE_TIME_LIMIT: Duration = Duration::from_secs(600);

/// How often a waiting server looks at its compiler process (its exit,
/// its time and its memory). Cranelift's memory grows by page faults, a few
/// GB/s on a busy machine at most, so a compiler passes its memory limit by
/// tens of MiB at most before it is seen and killed.
pub const COMPILER_POLL: Duration = Duration::from_millis(5);

/// Most bytes of a failed compiler's stderr kept for the error: enough for
/// any compiler message, bounded whatever the process prints.
pub const MAX_COMPILER_MESSAGE_BYTES: usize = 16 << 10;

/// The file name ending of an artifact.
const ARTIFACT_EXTENSION: &str = "cwasm";

/// The compiler process's exit code when it compiled the component but
/// could not write the artifact (a full disk, an unwritable cache): the
/// server's fault, not the component's, and said so.
pub const EXIT_ARTIFACT_NOT_WRITTEN: u8 = 3;

/// Why a component's machine code could not be had.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CompileError {
    /// The component's own doing: the compiler refused it, crashed on it,
    /// ran past [`COMPILE_TIME_LIMIT`] or past the memory limit, or the
    /// engine refused its code.
    #[error("{0}")]
    Refused(String),
    /// The server's: the code was compiled but could not be kept in the
    /// cache, or the compiler could not be run at all. The same component
    /// loads once the cause (often a full disk) is gone.
    #[error("{0}")]
    NotKept(String),
}

/// How a component's machine code is produced when it is not cached.
#[derive(Clone, Debug)]
pub enum Compiler {
    /// In this process (tests, tools, a server without a data dir).
    InProcess,
    /// By running `program args… --engine KIND --out FILE` with the
    /// component on stdin; the program calls [`compile_to`]. `weir`
    /// runs itself with its hidden `compile-artifact` command. The process
    /// is killed when it runs too long or its resident memory passes the
    /// cache's limit.
    Process {
        program: PathBuf,
        args: Vec<OsString>,
    },
}

/// The compiled-code cache of one server.
pub struct CodeCache {
    dir: Option<PathBuf>,
    compiler: Compiler,
    /// Most resident memory a compiler process may reach.
    memory_limit_bytes: u64,
    /// Artifacts this server loaded: what [`CodeCache::prune`] keeps.
    used: Mutex<HashSet<PathBuf>>,
    /// One compile of an artifact at a time: a second caller (two first
    /// runs of one image at once) waits and loads what the first wrote,
    /// rather than run a second compiler of the same bytes beside it.
    compiling: Mutex<HashMap<PathBuf, Arc<Mutex<()>>>>,
}

impl CodeCache {
    /// No cache: every component is compiled in this process, every time.
    pub fn in_process() -> CodeCache {
        CodeCache {
            dir: None,
            compiler: Compiler::InProcess,
            memory_limit_bytes: u64::MAX,
            used: Mutex::new(HashSet::new()),
            compiling: Mutex::new(HashMap::new()),
        }
    }

    /// A cache in `dir` (created if missing), filled by `compiler`, whose
    /// process may reach `memory_limit_bytes` of resident memory (the
    /// `compile_memory_limit_bytes` limit; a compiler in this process is
    /// not bounded).
    pub fn new(
        dir: &Path,
        compiler: Compiler,
        memory_limit_bytes: u64,
    ) -> std::io::Result<CodeCache> {
        std::fs::create_dir_all(dir)?;
        Ok(CodeCache {
            dir: Some(dir.to_path_buf()),
            compiler,
            memory_limit_bytes,
            used: Mutex::new(HashSet::new()),
            compiling: Mutex::new(HashMap::new()),
        })
    }

    /// `bytes` compiled for `engine`: from the cache, or compiled into it.
    pub fn component(&self, engine: &WeirEngine, bytes: &[u8]) -> Result<Component, CompileError> {
        let Some(dir) = &self.dir else {
            return Component::from_binary(engine.engine(), bytes)
                .map_err(|e| CompileError::Refused(format!("{e:#}")));
        };
        let path = dir.join(format!(
            "{}.{ARTIFACT_EXTENSION}",
            artifact_key(engine.engine(), bytes)
        ));
        let gate = self
            .compiling
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(path.clone())
            .or_default()
            .clone();
        let loaded = {
            let _one = gate.lock().unwrap_or_else(|p| p.into_inner());
            self.load_or_compile(engine, bytes, &path)
        };
        let mut compiling = self.compiling.lock().unwrap_or_else(|p| p.into_inner());
        // The last one out takes the gate away.
        if Arc::strong_count(&gate) == 2 {
            compiling.remove(&path);
        }
        loaded
    }

    /// [`CodeCache::component`] under its artifact's gate.
    fn load_or_compile(
        &self,
        engine: &WeirEngine,
        bytes: &[u8],
        path: &Path,
    ) -> Result<Component, CompileError> {
        let path = path.to_path_buf();
        let fresh = !path.exists();
        if fresh {
            self.compile_logged(engine, bytes, &path)?;
        }
        let mut compiled_now = fresh;
        let loaded = match load(engine, &path) {
            Ok(component) => component,
            Err(refused) if fresh => {
                // Compiled just now: the component itself is refused (it
                // does not fit this engine's limits), not the artifact.
                let _ = std::fs::remove_file(&path);
                return Err(CompileError::Refused(refused));
            }
            Err(first) => {
                tracing::warn!(artifact = %path.display(), error = %first, "compiled artifact does not load; compiling again");
                self.compile_logged(engine, bytes, &path)?;
                compiled_now = true;
                load(engine, &path).map_err(CompileError::Refused)?
            }
        };
        if !compiled_now {
            tracing::info!(artifact = %path.display(), "loaded compiled code");
        }
        self.used
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(path);
        Ok(loaded)
    }

    /// Compiles into `path`, and says so with the time it took: the one
    /// slow step of a first start.
    fn compile_logged(
        &self,
        engine: &WeirEngine,
        bytes: &[u8],
        path: &Path,
    ) -> Result<(), CompileError> {
        let started = Instant::now();
        self.compile(engine, bytes, path)?;
        tracing::info!(
            artifact = %path.display(),
            bytes = bytes.len(),
            ms = started.elapsed().as_millis() as u64,
            "compiled"
        );
        Ok(())
    }

    fn compile(&self, engine: &WeirEngine, bytes: &[u8], path: &Path) -> Result<(), CompileError> {
        match &self.compiler {
            Compiler::InProcess => compile_to(engine.engine(), bytes, path),
            Compiler::Process { program, args } => run_compiler(
                program,
                args,
                engine.kind(),
                bytes,
                path,
                self.memory_limit_bytes,
            ),
        }
    }

    /// Removes every artifact this server did not load; returns how many.
    pub fn prune(&self) -> std::io::Result<usize> {
        let Some(dir) = &self.dir else { return Ok(0) };
        let used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        let mut removed = 0;
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if !used.contains(&path) {
                std::fs::remove_file(&path)?;
                removed += 1;
            }
        }
        Ok(removed)
    }
}

fn load(engine: &WeirEngine, path: &Path) -> Result<Component, String> {
    // SAFETY: the artifact was written by `compile_to` for an engine with
    // this engine's compatibility hash (its name says so, and wasmtime
    // checks the header again), in a directory only the operator can write.
    unsafe { Component::deserialize_file(engine.engine(), path) }.map_err(|e| format!("{e:#}"))
}

/// The artifact name of `bytes` for `engine`.
pub fn artifact_key(engine: &wasmtime::Engine, bytes: &[u8]) -> String {
    let content = Sha256::digest(bytes);
    let mut compat = Sha256Hasher(Sha256::new());
    engine.precompile_compatibility_hash().hash(&mut compat);
    let compat = compat.0.finalize();
    format!("{}-{}", hex(&content), hex(&compat[..8]))
}

/// A `Hasher` whose output does not depend on the process: the
/// compatibility hash must name the same engine in every process.
struct Sha256Hasher(Sha256);

impl Hasher for Sha256Hasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    fn finish(&self) -> u64 {
        let digest = self.0.clone().finalize();
        u64::from_le_bytes(digest[..8].try_into().expect("a digest has 8 bytes"))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Compiles `bytes` for `engine` and writes the artifact to `out`, whole or
/// not at all. The compiler process's whole job.
pub fn compile_to(engine: &wasmtime::Engine, bytes: &[u8], out: &Path) -> Result<(), CompileError> {
    let artifact = engine
        .precompile_component(bytes)
        .map_err(|e| CompileError::Refused(format!("{e:#}")))?;
    let partial = partial_path(out);
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::File::create(&partial)?;
        file.write_all(&artifact)?;
        file.sync_all()?;
        std::fs::rename(&partial, out)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&partial);
        CompileError::NotKept(format!("cannot write {}: {e}", out.display()))
    })
}

/// Where [`compile_to`] writes before it renames into `out` (one writer
/// per artifact at a time in a process: [`CodeCache::component`]'s gate).
fn partial_path(out: &Path) -> PathBuf {
    out.with_extension(format!("{ARTIFACT_EXTENSION}.partial"))
}

fn run_compiler(
    program: &Path,
    args: &[OsString],
    kind: EngineKind,
    bytes: &[u8],
    out: &Path,
    memory_limit_bytes: u64,
) -> Result<(), CompileError> {
    let mut command = Command::new(program);
    // The kernel kills the compiler when the thread that started it (and
    // waits for it, below) ends, the server's death included: an orphan
    // would go on for up to COMPILE_TIME_LIMIT with up to its memory limit,
    // beside the compiler of the restarted server.
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: runs in the child between fork and exec, where only
        // async-signal-safe calls are allowed: prctl is one, and it sets
        // only the child's own parent-death signal.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut child = command
        .args(args)
        .arg("--engine")
        .arg(kind.to_arg())
        .arg("--out")
        .arg(out)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            CompileError::NotKept(format!(
                "cannot start the compiler {}: {e}",
                program.display()
            ))
        })?;
    let stderr = child.stderr.take().map(|stderr| {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            let _ = stderr
                .take(MAX_COMPILER_MESSAGE_BYTES as u64)
                .read_to_end(&mut text);
            String::from_utf8_lossy(&text).trim().to_string()
        })
    });
    if let Some(mut stdin) = child.stdin.take() {
        // A compiler that exits early closes the pipe; its status says why.
        let _ = stdin.write_all(bytes);
    }
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => {
                let overrun = if started.elapsed() >= COMPILE_TIME_LIMIT {
                    Some(format!(
                        "compiling took longer than {} s",
                        COMPILE_TIME_LIMIT.as_secs()
                    ))
                } else {
                    resident_anonymous_bytes(child.id())
                        .filter(|&bytes| bytes > memory_limit_bytes)
                        .map(|_| {
                            format!(
                                "compiling needed more than {} MiB of memory (compile_memory_limit_bytes)",
                                memory_limit_bytes >> 20
                            )
                        })
                };
                if let Some(reason) = overrun {
                    let _ = child.kill();
                    let _ = child.wait();
                    let _ = std::fs::remove_file(partial_path(out));
                    let _ = std::fs::remove_file(out);
                    return Err(CompileError::Refused(reason));
                }
                std::thread::sleep(COMPILER_POLL);
            }
            Err(e) => {
                return Err(CompileError::NotKept(format!(
                    "cannot wait for the compiler: {e}"
                )));
            }
        }
    };
    let message = stderr.and_then(|t| t.join().ok()).unwrap_or_default();
    if status.success() {
        return Ok(());
    }
    let _ = std::fs::remove_file(out);
    let message = if message.is_empty() {
        format!("the compiler process failed ({status})")
    } else {
        message
    };
    Err(
        if status.code() == Some(i32::from(EXIT_ARTIFACT_NOT_WRITTEN)) {
            CompileError::NotKept(message)
        } else {
            CompileError::Refused(message)
        },
    )
}

/// The memory process `pid` made for itself and holds in RAM (`RssAnon`
/// of `/proc/PID/status`: the heap, not the executable's shared pages),
/// or `None` where the system does not say (then only time bounds it).
fn resident_anonymous_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_rss_anon(&status)
}

fn parse_rss_anon(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("RssAnon:"))?;
    let kib: u64 = line["RssAnon:".len()..]
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    Some(kib << 10)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::EngineSizing;

    #[test]
    fn a_process_memory_is_read_from_its_status() {
        let status =
            "Name:\tweir\nVmRSS:\t  40000 kB\nRssAnon:\t   12345 kB\nRssFile:\t 27655 kB\n";
        assert_eq!(parse_rss_anon(status), Some(12345 << 10));
        assert_eq!(parse_rss_anon("VmRSS: 1 kB\n"), None);
        assert_eq!(parse_rss_anon("RssAnon: lots\n"), None);
        // This process has a heap, and says so.
        assert!(resident_anonymous_bytes(std::process::id()).is_some_and(|b| b > 0));
    }

    #[test]
    fn engine_kinds_survive_the_command_line() {
        for kind in [
            EngineKind::Pooled(EngineSizing {
                lanes: 32,
                memory_limit_bytes: 128 << 20,
            }),
            EngineKind::OnDemand {
                memory_limit_bytes: 1 << 20,
            },
            EngineKind::Programs {
                memory_limit_bytes: 1 << 20,
            },
        ] {
            assert_eq!(EngineKind::parse(&kind.to_arg()), Some(kind));
        }
        for bad in [
            "",
            "pooled",
            "pooled:1",
            "pooled:1:2:3",
            "on-demand:x",
            "mmap:1",
        ] {
            assert_eq!(EngineKind::parse(bad), None, "{bad}");
        }
    }
}
