//! The limits of programs, declared once like the runtime's
//! (`weir_runtime::limit_table!`) and set from the same `[limits]` table
//! and `--limit NAME=VALUE`. A program's linear memory is bounded by the
//! runtime's `memory_limit_bytes`.

use std::time::Duration;

use weir_runtime::limit_table;
use weir_runtime::limits::MAX_DURATION_MS;

/// Largest image the store takes: the biggest real components we know of
/// (an interpreter with its standard library, componentize-py's ~40 MB) fit
/// four times over, and a push is held in memory while it is verified.
pub const MAX_IMAGE_BYTES: u64 = 1 << 30;

/// Most output a run may be allowed: it is held in memory when a caller
/// captures it.
pub const MAX_RUN_OUTPUT_BYTES: u64 = 1 << 30;

/// What one actor's storage slots may hold on disk together, by default:
/// a process writes its slot through wasi:filesystem, and without a bound
/// one process could fill the disk every tenant's database lives on. A
/// GiB holds the working files of the small servers processes are for;
/// an operator who runs bigger ones raises it.
pub const DEFAULT_MAX_SLOT_BYTES: u64 = 1 << 30;

/// Most bytes a spawn's arguments, environment, secret names and start
/// arguments may take together: 1 MiB. They are journaled in the owner's
/// database and held by the host for the process's life (and by every
/// relaunch), so their bound times `max_processes` is what processes' specs
/// can hold; Linux itself gives a program's arguments and environment 2
/// MiB at most (a quarter of an 8 MiB stack).
pub const MAX_SPAWN_SPEC_BYTES: usize = 1 << 20;

limit_table! {
    /// The limits of the programs a server or `weir run` runs.
    pub struct ProgramLimits {
        run_time_limit: Duration = "run_time_limit_ms" {
            default: 60_000, range: 1, MAX_DURATION_MS, unit: Millis,
            meaning: "a one-shot run, from entry to exit; past it the run is stopped with run_time_limit_exceeded",
        },
        max_run_output_bytes: u64 = "max_run_output_bytes" {
            default: 16 << 20, range: 0, MAX_RUN_OUTPUT_BYTES, unit: Bytes,
            meaning: "stdout and stderr of one run together; a write past it fails and the run ends with run_output_too_large",
        },
        max_processes_per_actor: usize = "max_processes_per_actor" {
            default: 8, range: 1, 1024, unit: Count,
            meaning: "resident processes one actor may hold at once (slots); a spawn past it is refused naming the holders",
        },
        max_processes: usize = "max_processes" {
            default: 64, range: 1, 65_536, unit: Count,
            meaning: "resident processes of the whole server at once; a spawn past it is refused naming the top holders",
        },
        max_image_bytes: u64 = "max_image_bytes" {
            default: 256 << 20, range: 1024, MAX_IMAGE_BYTES, unit: Bytes,
            meaning: "one image (a component) in the image store",
        },
        max_slot_bytes: u64 = "max_slot_bytes" {
            default: DEFAULT_MAX_SLOT_BYTES, range: 4096, 1 << 40, unit: Bytes,
            meaning: "what one actor's storage slots hold on disk together (its durable slots and its processes' ephemeral ones; each file, directory and link counts 4 KiB more than its bytes); a write past it fails with insufficient-space (ENOSPC) and writes nothing",
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_readme_table_says_what_the_code_does() {
        let readme = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"),
        )
        .unwrap();
        let wrong = weir_runtime::limit_table::readme_disagreements(ProgramLimits::SPECS, &readme);
        assert!(wrong.is_empty(), "{wrong:#?}");
    }

    #[test]
    fn names_do_not_collide_with_the_runtimes() {
        for spec in ProgramLimits::SPECS {
            assert!(
                weir_runtime::limits::spec(spec.name).is_err(),
                "{}",
                spec.name
            );
        }
    }
}
