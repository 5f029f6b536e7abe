//! What the event scope costs an event that starts no host operation: the
//! work `run_event` does for every event (create, install, close, abort,
//! check for live operations), timed over many iterations.
//!
//! `cargo run --release -p weir-runtime --example scope_cost`

use std::hint::black_box;
use std::time::Instant;

use weir_runtime::scope::EventScope;

/// Iterations per measurement: enough that timer resolution is noise.
const ITERATIONS: u32 = 2_000_000;

fn main() {
    for round in 1..=3 {
        let started = Instant::now();
        for _ in 0..ITERATIONS {
            let scope = EventScope::new(128);
            let installed = black_box(Some(scope.clone()));
            scope.close();
            scope.abort();
            black_box(scope.live() == 0);
            drop(installed);
        }
        let per_event = started.elapsed().as_nanos() as f64 / ITERATIONS as f64;
        println!("round {round}: {per_event:.0} ns per event without host operations");
    }
}
