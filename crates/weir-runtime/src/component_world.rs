//! What a component says it serves, read from its top-level exports
//! without compiling it.
//!
//! Invariant owned here: a component is judged by what it exports before
//! any compiler sees it, so a component Weir cannot serve is refused with a
//! reason its author can act on — a WASI 0.3 `wasi:http/handler` is named
//! as such, instead of surfacing as whatever the compiler trips over first
//! (for a 0.3 component: "`stream` requires the component model async
//! feature"). `weir build` and `weir serve` both judge through [`served`].

/// The interface a WASI 0.2 HTTP component exports, without its version.
pub const INCOMING_HANDLER: &str = "wasi:http/incoming-handler";

/// The interface a WASI 0.3 HTTP component exports, without its version.
pub const HANDLER_03: &str = "wasi:http/handler";

/// The WASI HTTP world this build of Weir serves.
pub const SERVED_WORLD: &str = "wasi:http/proxy@0.2";

/// What a component's exports say it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum World {
    /// Bytes of a core module (version 1), not a component.
    CoreModule,
    /// Exports `wasi:http/incoming-handler@0.2.x`: served.
    Proxy,
    /// Exports the WASI 0.3 `wasi:http/handler` (the full name, version
    /// included), and no 0.2 handler.
    Http03 { export: String },
    /// Neither: the exports it has, in order.
    Other { exports: Vec<String> },
}

impl World {
    /// Why a component of this world cannot be served, in words a guest
    /// author can act on; `None` when it can.
    pub fn refusal(&self) -> Option<String> {
        match self {
            World::Proxy => None,
            World::CoreModule => Some("it is a core module, not a component".into()),
            World::Http03 { export } => Some(format!(
                "it exports {export}, a WASI 0.3 handler; this build of Weir serves WASI 0.2 \
                 components ({SERVED_WORLD}.x, exporting {INCOMING_HANDLER}): build the guest \
                 against WASI 0.2 (for Rust: the wasm32-wasip2 target with wstd, the wasi \
                 crate or spin-sdk 5)"
            )),
            World::Other { exports } => Some(format!(
                "it does not export {INCOMING_HANDLER}; its exports are [{}]",
                exports.join(", ")
            )),
        }
    }
}

/// Reads the world of `bytes` from their top-level component exports.
/// Nothing is validated or compiled: bytes that do not parse are left to
/// the compiler, whose error names the problem.
pub fn served(bytes: &[u8]) -> Result<World, String> {
    if bytes.len() >= 8 && bytes[0..4] == *b"\0asm" && bytes[4..8] == [1, 0, 0, 0] {
        return Ok(World::CoreModule);
    }
    let mut depth = 0usize;
    let mut exports = Vec::new();
    for payload in wasmparser::Parser::new(0).parse_all(bytes) {
        match payload.map_err(|e| e.to_string())? {
            wasmparser::Payload::Version { .. } => depth += 1,
            wasmparser::Payload::End(_) => depth = depth.saturating_sub(1),
            wasmparser::Payload::ComponentExportSection(reader) if depth == 1 => {
                for export in reader {
                    let export = export.map_err(|e| e.to_string())?;
                    exports.push(export.name.name.to_string());
                }
            }
            _ => {}
        }
    }
    Ok(classify(exports))
}

/// The world named by a component's export names.
fn classify(exports: Vec<String>) -> World {
    let serves_02 = |name: &String| {
        let (interface, version) = parts(name);
        interface == INCOMING_HANDLER && version.is_none_or(|v| v.starts_with("0.2"))
    };
    let serves_03 = |name: &&String| {
        let (interface, version) = parts(name);
        interface == HANDLER_03
            || (interface == INCOMING_HANDLER && version.is_some_and(|v| v.starts_with("0.3")))
    };
    if exports.iter().any(serves_02) {
        return World::Proxy;
    }
    if let Some(export) = exports.iter().find(serves_03) {
        return World::Http03 {
            export: export.clone(),
        };
    }
    World::Other { exports }
}

/// An export name's interface and version (`wasi:http/handler@0.3.0`).
fn parts(name: &str) -> (&str, Option<&str>) {
    match name.split_once('@') {
        Some((interface, version)) => (interface, Some(version)),
        None => (name, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_02_handler_is_served_whatever_its_patch_version() {
        for name in [
            "wasi:http/incoming-handler@0.2.0",
            "wasi:http/incoming-handler@0.2.10",
            "wasi:http/incoming-handler@0.2.12",
        ] {
            assert_eq!(classify(names(&[name])), World::Proxy, "{name}");
        }
    }

    #[test]
    fn a_03_handler_is_named_in_the_refusal() {
        let world = classify(names(&["wasi:http/handler@0.3.0"]));
        assert_eq!(
            world,
            World::Http03 {
                export: "wasi:http/handler@0.3.0".into()
            }
        );
        let why = world.refusal().expect("refused");
        assert!(why.contains("wasi:http/handler@0.3.0"), "{why}");
        assert!(why.contains("WASI 0.2"), "{why}");
        // A release candidate of 0.3 is 0.3 as well.
        assert!(matches!(
            classify(names(&["wasi:http/handler@0.3.0-rc-2025-09-16"])),
            World::Http03 { .. }
        ));
    }

    #[test]
    fn both_handlers_are_served_through_02() {
        let world = classify(names(&[
            "wasi:http/handler@0.3.0",
            "wasi:http/incoming-handler@0.2.6",
        ]));
        assert_eq!(world, World::Proxy);
    }

    #[test]
    fn anything_else_lists_its_exports() {
        let world = classify(names(&["wasi:cli/run@0.2.0"]));
        let why = world.refusal().expect("refused");
        assert!(why.contains("[wasi:cli/run@0.2.0]"), "{why}");
    }

    #[test]
    fn core_modules_are_not_components() {
        assert_eq!(served(b"\0asm\x01\0\0\0").unwrap(), World::CoreModule);
    }
}
