//! The runtime's shape, checked from its sources: its modules depend on
//! each other one way only, and it names no layer above it (the layers
//! plug in through `extension`; their names may appear in docs only).

use std::collections::BTreeMap;
use std::path::Path;

/// Each module's code (comments and its unit tests left out).
fn modules() -> BTreeMap<String, String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut modules = BTreeMap::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if name == "lib" || path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let text = text.split("#[cfg(test)]").next().unwrap();
        let code: Vec<&str> = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect();
        modules.insert(name, code.join("\n"));
    }
    modules
}

/// Which modules each module uses (`crate::NAME` in its code).
fn dependencies(modules: &BTreeMap<String, String>) -> BTreeMap<&str, Vec<&str>> {
    modules
        .iter()
        .map(|(name, code)| {
            let deps = modules
                .keys()
                .filter(|other| *other != name)
                .filter(|other| {
                    ["::", ";", "}", ","]
                        .iter()
                        .any(|end| code.contains(&format!("crate::{other}{end}")))
                })
                .map(String::as_str)
                .collect();
            (name.as_str(), deps)
        })
        .collect()
}

#[test]
fn modules_depend_on_each_other_one_way() {
    let modules = modules();
    assert!(modules.len() > 20, "found the sources: {modules:?}");
    let graph = dependencies(&modules);
    assert!(graph["event"].contains(&"invocation"), "{graph:?}");
    // Peel off modules that depend on nothing left; a circle never peels.
    let mut left = graph.clone();
    while !left.is_empty() {
        let free: Vec<&str> = left
            .iter()
            .filter(|(_, deps)| deps.iter().all(|d| !left.contains_key(d)))
            .map(|(name, _)| *name)
            .collect();
        assert!(!free.is_empty(), "modules in a circle: {left:?}");
        for name in free {
            left.remove(name);
        }
    }
}

#[test]
fn the_runtime_names_no_actor_outside_its_docs() {
    for (name, code) in modules() {
        let lower = code.to_lowercase();
        assert!(!lower.contains("actor"), "{name}.rs names an actor in code");
    }
}
