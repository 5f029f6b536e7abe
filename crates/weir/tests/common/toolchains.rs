//! Guests of the Python and JavaScript toolchains, built the way their
//! users build them (`guests/toolchains.sh`).

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use super::root;

/// How long installing the toolchains and building their guests may take
/// before the test fails instead of hanging: a first install downloads
/// componentize-py and componentize-js (minutes on a slow registry), and
/// each build of a guest takes tens of seconds.
const TOOLCHAINS_WITHIN: Duration = Duration::from_secs(20 * 60);

/// A component from `guests/toolchains.sh`, which installs the toolchains
/// and builds all of them once per test binary.
pub fn toolchain_guest(name: &str) -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    let dir = BUILT.get_or_init(|| {
        let out = super::output_within(
            Command::new("bash").arg(root().join("guests/toolchains.sh")),
            TOOLCHAINS_WITHIN,
        );
        assert!(
            out.status.success(),
            "guests/toolchains.sh failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    });
    let path = dir.join(format!("{name}.wasm"));
    assert!(path.is_file(), "{} exists", path.display());
    path
}
