//! Links the `weir` binary with packed relative relocations (`DT_RELR`):
//! a position-independent binary carries one relocation per pointer in its
//! read-only data, which the dynamic loader reads in full at every start.
//! Packed, they take a few kilobytes instead of 1.5 MiB, and a serving
//! process keeps that much less resident.
//!
//! glibc reads them since 2.36 (GNU ld writes them since 2.38), and a
//! binary that has them does not start on an older glibc: they are asked
//! for only when building for the machine that builds, and its glibc is
//! new enough.

use std::process::Command;

/// The first glibc that reads packed relative relocations.
const RELR_GLIBC: (u32, u32) = (2, 36);

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let native = std::env::var("TARGET").ok() == std::env::var("HOST").ok();
    let gnu_linux = std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux")
        && std::env::var("CARGO_CFG_TARGET_ENV").as_deref() == Ok("gnu");
    if native && gnu_linux && glibc().is_some_and(|v| v >= RELR_GLIBC) {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}

/// The building machine's glibc version (`getconf GNU_LIBC_VERSION`
/// prints `glibc 2.36`).
fn glibc() -> Option<(u32, u32)> {
    let out = Command::new("getconf")
        .arg("GNU_LIBC_VERSION")
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let version = text.trim().strip_prefix("glibc ")?;
    let mut parts = version.split('.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}
