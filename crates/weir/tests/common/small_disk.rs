//! A disk that fills: a tmpfs of a few MiB mounted for one test, for
//! provoking `ENOSPC` from outside. Mounting needs root (as CI runs);
//! without it the test fails, naming why, rather than skip.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs mounted at a scratch directory of its own, unmounted (lazily,
/// so that a server still holding files in it cannot keep it) when
/// dropped.
pub struct SmallDisk {
    pub path: PathBuf,
}

impl SmallDisk {
    /// Mounts a tmpfs of `bytes` at a fresh scratch directory.
    pub fn mount(name: &str, bytes: u64) -> SmallDisk {
        let path = weir_scratch::dir(&format!("small-disk-{name}"));
        std::fs::create_dir_all(&path).unwrap();
        let out = super::output_within(
            Command::new("mount")
                .args([
                    "-t",
                    "tmpfs",
                    "-o",
                    &format!("size={bytes},mode=0700"),
                    "tmpfs",
                ])
                .arg(&path),
            super::EXITS_WITHIN,
        );
        assert!(
            out.status.success(),
            "this test fills a disk of its own, a tmpfs, and mounting one needs root: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        SmallDisk { path }
    }

    /// Fills what is left of the disk with one file, which [`SmallDisk::free`]
    /// removes.
    pub fn fill(&self) {
        let mut file = std::fs::File::create(self.filler()).unwrap();
        for chunk in [1 << 20, 4096, 512, 1] {
            let bytes = vec![0u8; chunk];
            while file.write_all(&bytes).is_ok() {}
        }
        let _ = file.sync_all();
    }

    /// Removes what [`SmallDisk::fill`] wrote.
    pub fn free(&self) {
        std::fs::remove_file(self.filler()).unwrap();
    }

    fn filler(&self) -> PathBuf {
        self.path.join("filler")
    }

    pub fn join(&self, path: impl AsRef<Path>) -> PathBuf {
        self.path.join(path)
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}
