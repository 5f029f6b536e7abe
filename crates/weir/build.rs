//! Links the `weir` binary with packed relative relocations (`DT_RELR`):
//! a position-independent binary carries one relocation per pointer in its
//! read-only data, which the dynamic loader reads in full at every start.
//! Packed, they take a few kilobytes instead of 1.5 MiB, and a serving
//! process keeps that much less resident. glibc reads them since 2.36 and
//! GNU ld writes them since 2.38.

fn main() {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux")
        && std::env::var("CARGO_CFG_TARGET_ENV").as_deref() == Ok("gnu")
    {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}
