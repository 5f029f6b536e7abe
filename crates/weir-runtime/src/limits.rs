//! The limits of one app: every number that bounds time, space or
//! concurrency, with its default, its allowed range and the reason for both.
//!
//! Invariant owned here: every limit of the runtime has a default inside
//! its range and a reason for both (each bound is a named constant), and
//! an app's [`Limits`] only ever holds in-range values: each limit is
//! declared once, in a [`limit_table!`](crate::limit_table!), whose setters
//! check the name and the range first, so a bad setting is refused at
//! start and never discovered at the first request. The layers above
//! declare their tables the same way.

use std::time::Duration;

use crate::limit_table;
use crate::limit_table::{LimitError, LimitSpec, known_names};

/// Longest any timer-like limit may be: 24 hours. Longer values are almost
/// certainly a unit mistake, and bounded values keep `Instant` arithmetic
/// far from overflow.
pub const MAX_DURATION_MS: u64 = 24 * 60 * 60 * 1000;

/// Events one generation serves before it is retired. 64 by default: the
/// upstream measurement shows retained guest allocations growing without
/// bound inside one instance (1.25 MB to 6.8 MB over 558 requests), so an
/// instance must be renewed; 64 keeps instantiation cost under 2% of events.
pub const DEFAULT_RETIREMENT_ADMISSION_LIMIT: u64 = 64;

/// Hard ceiling on events per generation, whatever is configured: beyond 96
/// the retained-allocation growth is no longer bounded by the policy.
pub const MAX_RETIREMENT_ADMISSION_LIMIT: u64 = 96;

/// Lanes are bounded so a misconfiguration cannot reserve unbounded
/// instance slots (each lane can hold one `memory_limit_bytes` instance).
pub const MAX_LANES: u64 = 1024;

/// Waiters are bounded so a burst cannot hold unbounded connections open.
pub const MAX_QUEUED: u64 = 65_536;

/// The total guest memory budget may be set up to 1 PiB: a bound on
/// arithmetic, not on any machine.
pub const MAX_TOTAL_GUEST_MEMORY_BYTES: u64 = 1 << 50;

/// Linear memory per instance is capped at 4 GiB: the wasm32 address space.
pub const MAX_MEMORY_BYTES: u64 = 4 << 30;

/// Smallest memory limit accepted: one 64 KiB Wasm page, enough for no real
/// guest but the least that can be stated.
pub const MIN_MEMORY_BYTES: u64 = 64 << 10;

/// Request heads under 1 KiB cannot carry ordinary browser headers; over
/// 1 MiB is a denial-of-service surface, not a head.
pub const MIN_HEAD_BYTES: u64 = 1024;
pub const MAX_HEAD_BYTES: u64 = 1 << 20;

/// Bodies are buffered before the guest runs; 1 GiB bounds that buffer.
pub const MAX_REQUEST_BODY_BYTES: u64 = 1 << 30;

/// Streamed responses may be large but not unbounded: 64 GiB.
pub const MAX_RESPONSE_BODY_BYTES: u64 = 64 << 30;

/// A chunk handed to the client is at least 1 KiB (smaller chunks only add
/// framing) and at most 16 MiB (larger ones defeat streaming).
pub const MIN_CHUNK_BYTES: u64 = 1024;
pub const MAX_CHUNK_BYTES: u64 = 16 << 20;

/// Simultaneous host operations per event; 4096 is far beyond any guest
/// that is not leaking operations.
pub const MAX_OPERATIONS: u64 = 4096;

/// Threads that run SQLite work for guests, at most: enough to keep a few
/// slow statements from queueing the rest, few enough that runaway
/// statements on every one of them still leave the async workers free.
pub const DEFAULT_SQL_THREADS: u64 = 4;

/// Memory SQLite may hold for the whole process: 2 GiB. Its page caches
/// (freed first past a quarter of this) and
/// what guests' statements hold while they run: results are bounded by
/// `max_sql_result_bytes`, but a sort, a `DISTINCT` or a recursive query
/// keeps its rows in this heap, not in temporary files, until it ends.
/// Past it the allocating statement fails (out of memory) rather than the
/// process growing.
pub const DEFAULT_MAX_SQL_MEMORY_BYTES: u64 = 2 << 30;

/// Resident memory a compiler process may reach: 4 GiB. The largest real
/// components measured here peak far below it (componentize-py's 18 MB
/// Python: 0.46 GB, StarlingMonkey's 13 MB JavaScript: 0.48 GB, on 2 cores;
/// Cranelift compiles a function per core at once, so more cores hold
/// more), while Wasm built to exhaust Cranelift needs little: two
/// functions of 1.4 MB each took 2 GB, and a component may hold functions
/// of 7.6 MB each (bench/RESULTS.md).
pub const DEFAULT_COMPILE_MEMORY_LIMIT_BYTES: u64 = 4 << 30;

/// Least compiler memory that may be set: 64 MiB, twice what the smallest
/// guests here need (the hello guest compiles in 29 MB).
pub const MIN_COMPILE_MEMORY_LIMIT_BYTES: u64 = 64 << 20;

/// What one storage call may hand back to a guest (SQL rows, a list, a
/// batch read), by default: far more than a page of results, and a bound
/// on what one call makes the host hold.
pub const DEFAULT_MAX_SQL_RESULT_BYTES: u64 = 16 << 20;

/// How large one database may grow (a key-value store, a SQL database, an
/// actor's storage), by default: a guest fills its database through its
/// own door, and without a bound one guest could fill the host's disk
/// and fail every other tenant's writes. 512 MiB is far more than a
/// keyed actor keeps, and keeps a cluster-mode snapshot of the whole
/// database (one PostgreSQL value, at most 1 GB) within bounds even when
/// its pages do not compress.
pub const DEFAULT_MAX_DATABASE_BYTES: u64 = 512 << 20;

/// A request body that sends nothing for this long is answered 408: no
/// client on a working network pauses 5 s mid-body, and a silent body
/// holds a lane.
pub const DEFAULT_BODY_IDLE_TIMEOUT_MS: u64 = 5_000;

/// After its first `body_idle_timeout_ms`, a request body must average at
/// least this rate, or it is answered 408: a trickle of a byte every few
/// seconds would otherwise hold a lane for `body_read_timeout_ms`.
pub const DEFAULT_BODY_MIN_RATE_BYTES_PER_S: u64 = 1024;

/// A connection must deliver a complete request head within this long
/// (also between requests on a kept-alive connection).
pub const DEFAULT_HEADER_READ_TIMEOUT_MS: u64 = 10_000;

/// Client connections open at once, at most; past it a new connection is
/// answered 503 `connection_limit_exceeded` and closed.
pub const DEFAULT_MAX_CONNECTIONS: u64 = 4096;

limit_table! {
    /// The limits in force for one app. Fields are read on the hot path, so
    /// they are plain values rather than a map.
    pub struct Limits {
        event_limit: Duration = "event_limit_ms" {
            default: 1000, range: 1, MAX_DURATION_MS, unit: Millis,
            meaning: "Wasm entry to response headers",
        },
        session_limit: Duration = "session_limit_ms" {
            default: 300_000, range: 1, MAX_DURATION_MS, unit: Millis,
            meaning: "response headers to end of body",
        },
        cancellation_limit: Duration = "cancellation_limit_ms" {
            default: 1000, range: 1, MAX_DURATION_MS, unit: Millis,
            meaning: "client gone to guest out, else the generation is abandoned",
        },
        body_read_timeout: Duration = "body_read_timeout_ms" {
            default: 30_000, range: 1, MAX_DURATION_MS, unit: Millis,
            meaning: "reading the request body (holds the lane, not the Wasm deadline)",
        },
        cleanup_timeout: Duration = "cleanup_timeout_ms" {
            default: 250, range: 1, MAX_DURATION_MS, unit: Millis,
            meaning: "one total budget to settle an event's host operations",
        },
        max_operations: usize = "max_operations" {
            default: 128, range: 1, MAX_OPERATIONS, unit: Count,
            meaning: "simultaneous host operations per event",
        },
        max_concurrent: usize = "max_concurrent" {
            default: 32, range: 1, MAX_LANES, unit: Count,
            meaning: "lanes per app (events running at once)",
        },
        max_queued: usize = "max_queued" {
            default: 32, range: 0, MAX_QUEUED, unit: Count,
            meaning: "waiters when all lanes are busy",
        },
        retirement_admission_limit: u32 = "retirement_admission_limit" {
            default: DEFAULT_RETIREMENT_ADMISSION_LIMIT,
            range: 1, MAX_RETIREMENT_ADMISSION_LIMIT, unit: Count,
            meaning: "events per generation before it is retired",
        },
        max_request_head_bytes: usize = "max_request_head_bytes" {
            default: 16_384, range: MIN_HEAD_BYTES, MAX_HEAD_BYTES, unit: Bytes,
            meaning: "method, URI and header lines, in UTF-8 bytes",
        },
        max_request_body_bytes: u64 = "max_request_body_bytes" {
            default: 1 << 20, range: 0, MAX_REQUEST_BODY_BYTES, unit: Bytes,
            meaning: "request body, declared or streamed",
        },
        max_response_body_bytes: u64 = "max_response_body_bytes" {
            default: 64 << 20, range: 0, MAX_RESPONSE_BODY_BYTES, unit: Bytes,
            meaning: "response body, declared or streamed",
        },
        max_response_chunk_bytes: usize = "max_response_chunk_bytes" {
            default: 65_536, range: MIN_CHUNK_BYTES, MAX_CHUNK_BYTES, unit: Bytes,
            meaning: "largest chunk written to the client",
        },
        outbound_connect_timeout: Duration = "outbound_connect_timeout_ms" {
            default: 10_000, range: 1, MAX_DURATION_MS, unit: Millis,
            meaning: "connecting to an outbound host (a guest may ask for less, not more)",
        },
        outbound_first_byte_timeout: Duration = "outbound_first_byte_timeout_ms" {
            default: 30_000, range: 1, MAX_DURATION_MS, unit: Millis,
            meaning: "outbound request sent to first response byte (a guest may ask for less, not more)",
        },
        max_outbound_response_bytes: u64 = "max_outbound_response_bytes" {
            default: 64 << 20, range: 0, MAX_RESPONSE_BODY_BYTES, unit: Bytes,
            meaning: "body of one outbound response read by a guest",
        },
        memory_limit_bytes: u64 = "memory_limit_bytes" {
            default: 128 << 20, range: MIN_MEMORY_BYTES, MAX_MEMORY_BYTES, unit: Bytes,
            meaning: "linear memory per instance, with what its handles hold in the host (headers, unsent bodies, internal responses not yet read)",
        },
        /// 0 until resolved at start ([`Limits::total_guest_memory`]).
        max_total_guest_memory_bytes: u64 = "max_total_guest_memory_bytes" {
            default: 0, range: 0, MAX_TOTAL_GUEST_MEMORY_BYTES, unit: Bytes,
            meaning: "linear memory of every live instance together (0: half of physical memory, or of the cgroup limit); past it idle instances of the layers above are let go, then growth is refused with memory_budget_exceeded",
        },
        sql_threads: usize = "sql_threads" {
            default: DEFAULT_SQL_THREADS, range: 1, 256, unit: Count,
            meaning: "threads that run guests' SQL, lists, multi-key and key-value calls (never the async workers)",
        },
        max_sql_memory_bytes: u64 = "max_sql_memory_bytes" {
            default: DEFAULT_MAX_SQL_MEMORY_BYTES, range: 64 << 20, 1 << 40, unit: Bytes,
            meaning: "memory SQLite holds for the whole process: page caches, and the sorts, temporary tables and recursive queues of running statements (never spilled to temporary files); past a quarter of it caches are freed first, past it the allocating statement fails out of memory",
        },
        max_sql_statement_memory_bytes: u64 = "max_sql_statement_memory_bytes" {
            default: weir_store::statement_memory::DEFAULT_STATEMENT_BYTES, range: 1 << 20, 1 << 40, unit: Bytes,
            meaning: "memory one guest statement may make SQLite hold while it runs (its sorts, temporary tables, recursive queues and the pages it reads); past it that statement alone fails out of memory, naming this limit. sql_threads of them must fit in half of max_sql_memory_bytes",
        },
        compile_memory_limit_bytes: u64 = "compile_memory_limit_bytes" {
            default: DEFAULT_COMPILE_MEMORY_LIMIT_BYTES, range: MIN_COMPILE_MEMORY_LIMIT_BYTES, 1 << 40, unit: Bytes,
            meaning: "resident memory of the process that compiles a component (a deploy, a start, an image push); past it the process is killed and the component refused",
        },
        /// 0 until resolved at start ([`crate::compute_share::slices_per_tick`]).
        long_call_workers: usize = "long_call_workers" {
            default: 0, range: 0, 1024, unit: Count,
            meaning: "request workers that long computations (calls still computing at their third 5 ms epoch tick) may hold at once; the others are left to the calls that answer (0: all workers but one)",
        },
        max_sql_result_bytes: usize = "max_sql_result_bytes" {
            default: DEFAULT_MAX_SQL_RESULT_BYTES, range: 1024, 1 << 30, unit: Bytes,
            meaning: "what one SQL batch, statement, list or batch read hands back to a guest",
        },
        max_database_bytes: u64 = "max_database_bytes" {
            default: DEFAULT_MAX_DATABASE_BYTES, range: 64 << 10, 1 << 40, unit: Bytes,
            meaning: "one database on disk (each key-value store and SQL database, and each one a layer above opens); a write past it fails with database_full and keeps nothing",
        },
        body_idle_timeout: Duration = "body_idle_timeout_ms" {
            default: DEFAULT_BODY_IDLE_TIMEOUT_MS, range: 1, MAX_DURATION_MS, unit: Millis,
            meaning: "a request body that sends nothing for this long is answered 408",
        },
        body_min_rate_bytes_per_s: u64 = "body_min_rate_bytes_per_s" {
            default: DEFAULT_BODY_MIN_RATE_BYTES_PER_S, range: 0, 1 << 30, unit: Count,
            meaning: "after its first body_idle_timeout_ms a request body slower than this on average is answered 408 (0: no minimum)",
        },
        header_read_timeout: Duration = "header_read_timeout_ms" {
            default: DEFAULT_HEADER_READ_TIMEOUT_MS, range: 1, MAX_DURATION_MS, unit: Millis,
            meaning: "a connection's request head must arrive within this long (also idle between requests)",
        },
        max_connections: usize = "max_connections" {
            default: DEFAULT_MAX_CONNECTIONS, range: 1, 1 << 20, unit: Count,
            meaning: "client connections open at once; more are answered 503 connection_limit_exceeded",
        },
    }
}

/// Every limit of the runtime, in the order the README's table lists them.
pub const SPECS: &[LimitSpec] = Limits::SPECS;

impl Limits {
    /// The total guest memory budget in bytes: the configured value, or by
    /// default half of what this machine (or its cgroup) has.
    pub fn total_guest_memory(&self) -> u64 {
        if self.max_total_guest_memory_bytes > 0 {
            return self.max_total_guest_memory_bytes;
        }
        physical_memory().map_or(DEFAULT_TOTAL_GUEST_MEMORY_FALLBACK, |m| m / 2)
    }

    /// Refuses statement bounds that could together take SQLite's heap:
    /// `sql_threads` statements at their bound must fit in
    /// [`SQL_HEAP_SHARE_OF_STATEMENTS`] of `max_sql_memory_bytes`, so that
    /// running statements alone never make another fail out of memory.
    pub fn check_sql_memory(&self) -> Result<(), String> {
        let statements =
            (self.sql_threads as u64).saturating_mul(self.max_sql_statement_memory_bytes);
        let share = self.max_sql_memory_bytes / SQL_HEAP_SHARE_OF_STATEMENTS;
        if statements > share {
            return Err(format!(
                "sql_threads ({}) statements of max_sql_statement_memory_bytes ({} bytes) could hold \
                 {statements} bytes at once, more than 1/{SQL_HEAP_SHARE_OF_STATEMENTS} of \
                 max_sql_memory_bytes ({} bytes): lower one of the first two or raise the third",
                self.sql_threads, self.max_sql_statement_memory_bytes, self.max_sql_memory_bytes
            ));
        }
        Ok(())
    }
}

/// Running guest statements may hold at most this part of SQLite's heap
/// bound (`max_sql_memory_bytes`) together: the rest is for page caches
/// and the host's own statements (commits, timers, key-value calls).
pub const SQL_HEAP_SHARE_OF_STATEMENTS: u64 = 2;

/// The guest memory budget when the machine's memory cannot be read.
pub const DEFAULT_TOTAL_GUEST_MEMORY_FALLBACK: u64 = 4 << 30;

/// Memory this process may use: the machine's (`MemTotal`), or its cgroup's
/// limit when that is lower.
pub fn physical_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let total_kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    let total = total_kib.saturating_mul(1024);
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    Some(cgroup.map_or(total, |c| c.min(total)))
}

/// The spec of a runtime limit by name.
pub fn spec(name: &str) -> Result<&'static LimitSpec, LimitError> {
    SPECS
        .iter()
        .find(|s| s.name == name)
        .ok_or_else(|| LimitError::Unknown {
            name: name.to_string(),
            known: known_names(SPECS),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit_table::readme_disagreements;

    #[test]
    fn defaults_match_the_design() {
        let l = Limits::default();
        assert_eq!(l.event_limit, Duration::from_millis(1000));
        assert_eq!(l.session_limit, Duration::from_millis(300_000));
        assert_eq!(l.cleanup_timeout, Duration::from_millis(250));
        assert_eq!(l.max_operations, 128);
        assert_eq!(l.max_concurrent, 32);
        assert_eq!(l.max_queued, 32);
        assert_eq!(l.retirement_admission_limit, 64);
        assert_eq!(l.max_request_head_bytes, 16_384);
        assert_eq!(l.max_request_body_bytes, 1_048_576);
        assert_eq!(l.max_response_body_bytes, 67_108_864);
        assert_eq!(l.max_response_chunk_bytes, 65_536);
        assert_eq!(l.memory_limit_bytes, 134_217_728);
    }

    #[test]
    fn the_readme_table_says_what_the_code_does() {
        let readme = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"),
        )
        .unwrap();
        let wrong = readme_disagreements(SPECS, &readme);
        assert!(wrong.is_empty(), "{wrong:#?}");
    }

    #[test]
    fn every_spec_round_trips_through_get() {
        let l = Limits::default();
        for spec in SPECS {
            assert_eq!(l.get(spec.name), Some(spec.default), "{}", spec.name);
        }
    }

    #[test]
    fn out_of_range_names_the_limit_and_range() {
        let mut l = Limits::default();
        for bad in ["0", "97", "-1", "x", ""] {
            let err = l.set("retirement_admission_limit", bad).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!(
                    "limit `retirement_admission_limit` must be an integer from 1 to 96, got `{bad}`"
                )
            );
        }
        assert!(l.apply("max_concurrent=0").is_err());
        assert_eq!(l, Limits::default(), "a refused value changes nothing");
    }

    #[test]
    fn unknown_and_malformed_are_refused() {
        let mut l = Limits::default();
        assert!(matches!(
            l.apply("max_bogus=1"),
            Err(LimitError::Unknown { .. })
        ));
        assert!(matches!(
            l.apply("max_concurrent"),
            Err(LimitError::Malformed(_))
        ));
    }

    #[test]
    fn in_range_values_apply() {
        let mut l = Limits::default();
        l.apply("retirement_admission_limit=96").unwrap();
        l.apply("max_request_body_bytes=4_000_000").unwrap();
        assert_eq!(l.retirement_admission_limit, 96);
        assert_eq!(l.max_request_body_bytes, 4_000_000);
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    /// A limit's name, or something that is not one.
    fn name() -> impl Strategy<Value = String> {
        prop_oneof![
            proptest::sample::select(SPECS.iter().map(|s| s.name.to_string()).collect::<Vec<_>>()),
            "[a-z_]{0,30}",
            ".{0,40}",
        ]
    }

    /// A value as an operator might type it, or anything at all.
    fn value() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<u64>().prop_map(|v| v.to_string()),
            "[0-9_]{0,25}",
            "-?[0-9]{1,30}",
            ".{0,40}",
        ]
    }

    proptest! {
        #[test]
        fn setting_a_limit_never_panics_and_only_keeps_in_range_values(name in name(), value in value()) {
            let mut limits = Limits::default();
            match limits.set(&name, &value) {
                Ok(()) => {
                    let spec = spec(&name).unwrap();
                    let got = limits.get(&name).unwrap();
                    prop_assert!((spec.min..=spec.max).contains(&got), "{name}={value} kept {got}");
                    let digits: String = value.chars().filter(|c| *c != '_').collect();
                    prop_assert_eq!(got, digits.parse::<u64>().unwrap());
                }
                Err(_) => prop_assert_eq!(limits, Limits::default(), "a refused value changed nothing"),
            }
        }

        #[test]
        fn assignments_never_panic(assignment in ".{0,60}") {
            let mut limits = Limits::default();
            let _ = limits.apply(&assignment);
            for spec in SPECS {
                let v = limits.get(spec.name).unwrap();
                prop_assert!(v == spec.default || (spec.min..=spec.max).contains(&v));
            }
        }
    }
}
