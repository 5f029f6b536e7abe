//! Building a guest crate into a `wasi:http` component, as `weir build` does.
//!
//! Invariant owned here: a build succeeds only with exactly one `.wasm`
//! artifact for the requested package, and only if that artifact is a
//! component exporting `wasi:http/incoming-handler` — what `weir serve`
//! needs — so a build that "succeeds" always yields something servable.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::Deserialize;
use weir_runtime::component_world;

/// The target guests are built for.
pub const GUEST_TARGET: &str = "wasm32-wasip2";

/// The export every servable component has (any 0.2.x version).
pub use weir_runtime::component_world::INCOMING_HANDLER;

/// What to build.
#[derive(Clone, Debug, Default)]
pub struct BuildRequest {
    pub manifest: PathBuf,
    pub package: Option<String>,
    pub out_dir: PathBuf,
    pub features: Vec<String>,
}

/// Why a build failed.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("manifest {0} does not exist")]
    MissingManifest(PathBuf),
    #[error(
        "the {GUEST_TARGET} target is not installed and rustup is not available; install it with `rustup target add {GUEST_TARGET}`"
    )]
    MissingTarget,
    #[error("`rustup target add {GUEST_TARGET}` failed; run it by hand to see why")]
    TargetInstallFailed,
    #[error("cannot run cargo: {0}")]
    Cargo(std::io::Error),
    #[error("cargo build failed (exit status {0})")]
    CargoFailed(String),
    #[error("expected exactly one .wasm artifact{for_package}, found {found}: {names}")]
    Artifacts {
        for_package: String,
        found: usize,
        names: String,
    },
    #[error("{path} is not a component exporting {INCOMING_HANDLER}: {reason}")]
    NotAProxy { path: PathBuf, reason: String },
    #[error("cannot copy {from} to {to}: {cause}")]
    Copy {
        from: PathBuf,
        to: PathBuf,
        cause: std::io::Error,
    },
}

#[derive(Deserialize)]
struct Message {
    reason: String,
    #[serde(default)]
    package_id: String,
    #[serde(default)]
    target: Option<Target>,
    #[serde(default)]
    filenames: Vec<PathBuf>,
}

#[derive(Deserialize)]
struct Target {
    name: String,
    kind: Vec<String>,
}

/// True when rustup reports the guest target as installed.
fn target_installed() -> Option<bool> {
    let out = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    Some(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|l| l.trim() == GUEST_TARGET),
    )
}

/// Makes sure the guest target is installed, installing it through rustup
/// when it is missing (and saying so on stderr).
pub fn ensure_target() -> Result<(), BuildError> {
    match target_installed() {
        Some(true) => Ok(()),
        Some(false) => {
            eprintln!("weir: installing the {GUEST_TARGET} target with rustup");
            let status = Command::new("rustup")
                .args(["target", "add", GUEST_TARGET])
                .status()
                .map_err(|_| BuildError::MissingTarget)?;
            if status.success() {
                Ok(())
            } else {
                Err(BuildError::TargetInstallFailed)
            }
        }
        // No rustup: let cargo try; if the target is missing it says so.
        None => Ok(()),
    }
}

/// The package name cargo's `package_id` refers to.
fn package_of(package_id: &str) -> &str {
    // Forms: "path+file:///x/hello#0.1.0", "path+file:///x/foo#hello@0.1.0",
    // or the older "hello 0.1.0 (path+file:///x)".
    if let Some((_, frag)) = package_id.rsplit_once('#') {
        if let Some((name, _)) = frag.split_once('@') {
            return name;
        }
        if let Some((_, path)) = package_id.split_once("://") {
            let path = path.split('#').next().unwrap_or(path);
            return path.rsplit('/').next().unwrap_or(path);
        }
    }
    package_id.split(' ').next().unwrap_or(package_id)
}

/// Builds the request's package and copies its component to the out dir.
/// Cargo's progress goes to stderr as it happens.
pub fn build(request: &BuildRequest) -> Result<PathBuf, BuildError> {
    if !request.manifest.is_file() {
        return Err(BuildError::MissingManifest(request.manifest.clone()));
    }
    ensure_target()?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--release", "--target", GUEST_TARGET])
        .arg("--message-format=json-render-diagnostics")
        .arg("--manifest-path")
        .arg(&request.manifest);
    if let Some(p) = &request.package {
        cmd.args(["--package", p]);
    }
    if !request.features.is_empty() {
        cmd.args(["--features", &request.features.join(",")]);
    }
    cmd.stdout(Stdio::piped()).stderr(Stdio::inherit());
    let mut child = cmd.spawn().map_err(BuildError::Cargo)?;
    let stdout = child.stdout.take().expect("stdout is piped");
    let mut artifacts = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.map_err(BuildError::Cargo)?;
        let Ok(msg) = serde_json::from_str::<Message>(&line) else {
            continue;
        };
        if msg.reason != "compiler-artifact" {
            continue;
        }
        let Some(target) = &msg.target else { continue };
        if !target.kind.iter().any(|k| k == "cdylib" || k == "bin") {
            continue;
        }
        let package = package_of(&msg.package_id);
        if let Some(wanted) = &request.package
            && package != wanted
            && target.name != wanted.replace('-', "_")
        {
            continue;
        }
        artifacts.extend(
            msg.filenames
                .iter()
                .filter(|f| f.extension().is_some_and(|e| e == "wasm"))
                .cloned(),
        );
    }
    let status = child.wait().map_err(BuildError::Cargo)?;
    if !status.success() {
        return Err(BuildError::CargoFailed(status.to_string()));
    }
    if artifacts.len() != 1 {
        return Err(BuildError::Artifacts {
            for_package: request
                .package
                .as_ref()
                .map(|p| format!(" for package `{p}`"))
                .unwrap_or_default(),
            found: artifacts.len(),
            names: artifacts
                .iter()
                .map(|a| a.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    let artifact = artifacts.remove(0);
    let bytes = std::fs::read(&artifact).map_err(|source| BuildError::Copy {
        from: artifact.clone(),
        to: request.out_dir.clone(),
        cause: source,
    })?;
    check_proxy(&bytes).map_err(|reason| BuildError::NotAProxy {
        path: artifact.clone(),
        reason,
    })?;
    let file_name = artifact.file_name().map(PathBuf::from).unwrap_or_default();
    let to = request.out_dir.join(file_name);
    std::fs::create_dir_all(&request.out_dir)
        .and_then(|_| std::fs::copy(&artifact, &to))
        .map_err(|source| BuildError::Copy {
            from: artifact.clone(),
            to: to.clone(),
            cause: source,
        })?;
    Ok(to)
}

/// Checks that `bytes` are a component Weir serves: one exporting
/// `wasi:http/incoming-handler@0.2`, judged as `weir serve` judges it.
pub fn check_proxy(bytes: &[u8]) -> Result<(), String> {
    let world = component_world::served(bytes)?;
    match world.refusal() {
        None => Ok(()),
        Some(why) => Err(why),
    }
}

/// The manifest of a guest crate directory.
pub fn manifest_in(dir: &Path) -> PathBuf {
    dir.join("Cargo.toml")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_names_from_ids() {
        assert_eq!(package_of("path+file:///x/hello#0.1.0"), "hello");
        assert_eq!(package_of("path+file:///x/foo#hello@0.1.0"), "hello");
        assert_eq!(package_of("hello 0.1.0 (path+file:///x)"), "hello");
    }

    #[test]
    fn core_modules_are_not_proxies() {
        let core = b"\0asm\x01\0\0\0";
        assert!(check_proxy(core).unwrap_err().contains("core module"));
    }
}
