//! The limits of one app: every number that bounds time, space or
//! concurrency, with its default, its allowed range and the reason for both.
//!
//! Invariant owned here: a [`Limits`] value only ever holds in-range values.
//! Every way to change one ([`Limits::set`], [`Limits::apply`]) checks the
//! name and the range first and names both in the error, so a bad setting is
//! refused at start and never discovered at the first request.

use std::fmt;
use std::time::Duration;

/// How a limit is measured, for messages and docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Millis,
    Bytes,
    Count,
}

/// One configurable limit: its flat name, default, range and meaning.
#[derive(Clone, Copy, Debug)]
pub struct LimitSpec {
    pub name: &'static str,
    pub default: u64,
    pub min: u64,
    pub max: u64,
    pub unit: Unit,
    pub meaning: &'static str,
}

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

/// Events that may wait for one actor: an actor runs one turn at a time, so
/// a hot actor's queue is its latency; 128 turns of ~100 µs is ~13 ms of
/// waiting, past which refusing fast (503 `actor_overloaded`) serves
/// callers better than queueing.
pub const DEFAULT_ACTOR_MAX_QUEUED: u64 = 128;

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

/// What one storage call may hand back to a guest (SQL rows, a list, a
/// batch read), by default: far more than a page of results, and a bound
/// on what one call makes the host hold.
pub const DEFAULT_MAX_SQL_RESULT_BYTES: u64 = 16 << 20;

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

/// All limits, in the order the README's table lists them.
pub const SPECS: &[LimitSpec] = &[
    LimitSpec {
        name: "event_limit_ms",
        default: 1000,
        min: 1,
        max: MAX_DURATION_MS,
        unit: Unit::Millis,
        meaning: "Wasm entry to response headers",
    },
    LimitSpec {
        name: "session_limit_ms",
        default: 300_000,
        min: 1,
        max: MAX_DURATION_MS,
        unit: Unit::Millis,
        meaning: "response headers to end of body",
    },
    LimitSpec {
        name: "cancellation_limit_ms",
        default: 1000,
        min: 1,
        max: MAX_DURATION_MS,
        unit: Unit::Millis,
        meaning: "client gone to guest out, else the generation is abandoned",
    },
    LimitSpec {
        name: "body_read_timeout_ms",
        default: 30_000,
        min: 1,
        max: MAX_DURATION_MS,
        unit: Unit::Millis,
        meaning: "reading the request body (holds the lane, not the Wasm deadline)",
    },
    LimitSpec {
        name: "cleanup_timeout_ms",
        default: 250,
        min: 1,
        max: MAX_DURATION_MS,
        unit: Unit::Millis,
        meaning: "one total budget to settle an event's host operations",
    },
    LimitSpec {
        name: "max_operations",
        default: 128,
        min: 1,
        max: MAX_OPERATIONS,
        unit: Unit::Count,
        meaning: "simultaneous host operations per event",
    },
    LimitSpec {
        name: "max_concurrent",
        default: 32,
        min: 1,
        max: MAX_LANES,
        unit: Unit::Count,
        meaning: "lanes per app (events running at once)",
    },
    LimitSpec {
        name: "max_queued",
        default: 32,
        min: 0,
        max: MAX_QUEUED,
        unit: Unit::Count,
        meaning: "waiters when all lanes are busy",
    },
    LimitSpec {
        name: "retirement_admission_limit",
        default: DEFAULT_RETIREMENT_ADMISSION_LIMIT,
        min: 1,
        max: MAX_RETIREMENT_ADMISSION_LIMIT,
        unit: Unit::Count,
        meaning: "events per generation before it is retired",
    },
    LimitSpec {
        name: "max_request_head_bytes",
        default: 16_384,
        min: MIN_HEAD_BYTES,
        max: MAX_HEAD_BYTES,
        unit: Unit::Bytes,
        meaning: "method, URI and header lines, in UTF-8 bytes",
    },
    LimitSpec {
        name: "max_request_body_bytes",
        default: 1 << 20,
        min: 0,
        max: MAX_REQUEST_BODY_BYTES,
        unit: Unit::Bytes,
        meaning: "request body, declared or streamed",
    },
    LimitSpec {
        name: "max_response_body_bytes",
        default: 64 << 20,
        min: 0,
        max: MAX_RESPONSE_BODY_BYTES,
        unit: Unit::Bytes,
        meaning: "response body, declared or streamed",
    },
    LimitSpec {
        name: "max_response_chunk_bytes",
        default: 65_536,
        min: MIN_CHUNK_BYTES,
        max: MAX_CHUNK_BYTES,
        unit: Unit::Bytes,
        meaning: "largest chunk written to the client",
    },
    LimitSpec {
        name: "outbound_connect_timeout_ms",
        default: 10_000,
        min: 1,
        max: MAX_DURATION_MS,
        unit: Unit::Millis,
        meaning: "connecting to an outbound host (a guest may ask for less, not more)",
    },
    LimitSpec {
        name: "outbound_first_byte_timeout_ms",
        default: 30_000,
        min: 1,
        max: MAX_DURATION_MS,
        unit: Unit::Millis,
        meaning: "outbound request sent to first response byte (a guest may ask for less, not more)",
    },
    LimitSpec {
        name: "max_outbound_response_bytes",
        default: 64 << 20,
        min: 0,
        max: MAX_RESPONSE_BODY_BYTES,
        unit: Unit::Bytes,
        meaning: "body of one outbound response read by a guest",
    },
    LimitSpec {
        name: "actor_idle_ms",
        default: 10_000,
        min: 1,
        max: MAX_DURATION_MS,
        unit: Unit::Millis,
        meaning: "an actor with no event in flight and no timer due is hibernated after this long",
    },
    LimitSpec {
        name: "actor_max_queued",
        default: DEFAULT_ACTOR_MAX_QUEUED,
        min: 1,
        max: MAX_QUEUED,
        unit: Unit::Count,
        meaning: "events waiting for one actor's turn; more are refused with actor_overloaded",
    },
    LimitSpec {
        name: "max_live_actors",
        default: 100_000,
        min: 16,
        max: 10_000_000,
        unit: Unit::Count,
        meaning: "actors in memory at once (also bounded by the open-file limit: 2 files each); beyond it the least recently used idle ones hibernate",
    },
    LimitSpec {
        name: "memory_limit_bytes",
        default: 128 << 20,
        min: MIN_MEMORY_BYTES,
        max: MAX_MEMORY_BYTES,
        unit: Unit::Bytes,
        meaning: "linear memory per instance",
    },
    LimitSpec {
        name: "max_total_guest_memory_bytes",
        default: 0,
        min: 0,
        max: MAX_TOTAL_GUEST_MEMORY_BYTES,
        unit: Unit::Bytes,
        meaning: "linear memory of every live instance together (0: half of physical memory, or of the cgroup limit); past it idle actors hibernate, then growth is refused with memory_budget_exceeded",
    },
    LimitSpec {
        name: "sql_threads",
        default: DEFAULT_SQL_THREADS,
        min: 1,
        max: 256,
        unit: Unit::Count,
        meaning: "threads that run guests' SQL and multi-key storage calls (never the async workers)",
    },
    LimitSpec {
        name: "max_sql_result_bytes",
        default: DEFAULT_MAX_SQL_RESULT_BYTES,
        min: 1024,
        max: 1 << 30,
        unit: Unit::Bytes,
        meaning: "what one SQL batch, actor statement, list or batch read hands back to a guest",
    },
    LimitSpec {
        name: "body_idle_timeout_ms",
        default: DEFAULT_BODY_IDLE_TIMEOUT_MS,
        min: 1,
        max: MAX_DURATION_MS,
        unit: Unit::Millis,
        meaning: "a request body that sends nothing for this long is answered 408",
    },
    LimitSpec {
        name: "body_min_rate_bytes_per_s",
        default: DEFAULT_BODY_MIN_RATE_BYTES_PER_S,
        min: 0,
        max: 1 << 30,
        unit: Unit::Count,
        meaning: "after its first body_idle_timeout_ms a request body slower than this on average is answered 408 (0: no minimum)",
    },
    LimitSpec {
        name: "header_read_timeout_ms",
        default: DEFAULT_HEADER_READ_TIMEOUT_MS,
        min: 1,
        max: MAX_DURATION_MS,
        unit: Unit::Millis,
        meaning: "a connection's request head must arrive within this long (also idle between requests)",
    },
    LimitSpec {
        name: "max_connections",
        default: DEFAULT_MAX_CONNECTIONS,
        min: 1,
        max: 1 << 20,
        unit: Unit::Count,
        meaning: "client connections open at once; more are answered 503 connection_limit_exceeded",
    },
];

/// A limit name that Weir does not know, or a value outside its range.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LimitError {
    #[error("unknown limit `{name}` (known limits: {known})")]
    Unknown { name: String, known: String },
    #[error("limit `{name}` must be an integer from {min} to {max}, got `{value}`")]
    OutOfRange {
        name: &'static str,
        value: String,
        min: u64,
        max: u64,
    },
    #[error("`{0}` is not of the form NAME=VALUE")]
    Malformed(String),
}

/// The limits in force for one app. Fields are read on the hot path, so they
/// are plain values rather than a map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    pub event_limit: Duration,
    pub session_limit: Duration,
    pub cancellation_limit: Duration,
    pub body_read_timeout: Duration,
    pub cleanup_timeout: Duration,
    pub max_operations: usize,
    pub max_concurrent: usize,
    pub max_queued: usize,
    pub retirement_admission_limit: u32,
    pub max_request_head_bytes: usize,
    pub max_request_body_bytes: u64,
    pub max_response_body_bytes: u64,
    pub max_response_chunk_bytes: usize,
    pub outbound_connect_timeout: Duration,
    pub outbound_first_byte_timeout: Duration,
    pub max_outbound_response_bytes: u64,
    pub actor_idle: Duration,
    pub actor_max_queued: usize,
    pub max_live_actors: usize,
    pub memory_limit_bytes: u64,
    /// 0 until resolved at start ([`Limits::total_guest_memory`]).
    pub max_total_guest_memory_bytes: u64,
    pub sql_threads: usize,
    pub max_sql_result_bytes: usize,
    pub body_idle_timeout: Duration,
    pub body_min_rate_bytes_per_s: u64,
    pub header_read_timeout: Duration,
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        let mut limits = Limits {
            event_limit: Duration::ZERO,
            session_limit: Duration::ZERO,
            cancellation_limit: Duration::ZERO,
            body_read_timeout: Duration::ZERO,
            cleanup_timeout: Duration::ZERO,
            max_operations: 0,
            max_concurrent: 0,
            max_queued: 0,
            retirement_admission_limit: 0,
            max_request_head_bytes: 0,
            max_request_body_bytes: 0,
            max_response_body_bytes: 0,
            max_response_chunk_bytes: 0,
            outbound_connect_timeout: Duration::ZERO,
            outbound_first_byte_timeout: Duration::ZERO,
            max_outbound_response_bytes: 0,
            actor_idle: Duration::ZERO,
            actor_max_queued: 0,
            max_live_actors: 0,
            memory_limit_bytes: 0,
            max_total_guest_memory_bytes: 0,
            sql_threads: 0,
            max_sql_result_bytes: 0,
            body_idle_timeout: Duration::ZERO,
            body_min_rate_bytes_per_s: 0,
            header_read_timeout: Duration::ZERO,
            max_connections: 0,
        };
        for spec in SPECS {
            limits.store(spec.name, spec.default);
        }
        limits
    }
}

impl Limits {
    /// Sets one limit by its flat name, checking the range.
    pub fn set(&mut self, name: &str, value: &str) -> Result<(), LimitError> {
        let spec = spec(name)?;
        let parsed = parse_value(value)
            .filter(|v| (spec.min..=spec.max).contains(v))
            .ok_or_else(|| LimitError::OutOfRange {
                name: spec.name,
                value: value.to_string(),
                min: spec.min,
                max: spec.max,
            })?;
        self.store(spec.name, parsed);
        Ok(())
    }

    /// The total guest memory budget in bytes: the configured value, or by
    /// default half of what this machine (or its cgroup) has.
    pub fn total_guest_memory(&self) -> u64 {
        if self.max_total_guest_memory_bytes > 0 {
            return self.max_total_guest_memory_bytes;
        }
        physical_memory().map_or(DEFAULT_TOTAL_GUEST_MEMORY_FALLBACK, |m| m / 2)
    }

    /// Applies one `NAME=VALUE` assignment, as given on the command line.
    pub fn apply(&mut self, assignment: &str) -> Result<(), LimitError> {
        let (name, value) = assignment
            .split_once('=')
            .ok_or_else(|| LimitError::Malformed(assignment.to_string()))?;
        self.set(name.trim(), value.trim())
    }

    /// The current value of a limit by name, in the unit of its spec.
    pub fn get(&self, name: &str) -> Option<u64> {
        let ms = |d: Duration| d.as_millis() as u64;
        Some(match name {
            "event_limit_ms" => ms(self.event_limit),
            "session_limit_ms" => ms(self.session_limit),
            "cancellation_limit_ms" => ms(self.cancellation_limit),
            "body_read_timeout_ms" => ms(self.body_read_timeout),
            "cleanup_timeout_ms" => ms(self.cleanup_timeout),
            "max_operations" => self.max_operations as u64,
            "max_concurrent" => self.max_concurrent as u64,
            "max_queued" => self.max_queued as u64,
            "retirement_admission_limit" => self.retirement_admission_limit as u64,
            "max_request_head_bytes" => self.max_request_head_bytes as u64,
            "max_request_body_bytes" => self.max_request_body_bytes,
            "max_response_body_bytes" => self.max_response_body_bytes,
            "max_response_chunk_bytes" => self.max_response_chunk_bytes as u64,
            "outbound_connect_timeout_ms" => ms(self.outbound_connect_timeout),
            "outbound_first_byte_timeout_ms" => ms(self.outbound_first_byte_timeout),
            "max_outbound_response_bytes" => self.max_outbound_response_bytes,
            "actor_idle_ms" => ms(self.actor_idle),
            "actor_max_queued" => self.actor_max_queued as u64,
            "max_live_actors" => self.max_live_actors as u64,
            "memory_limit_bytes" => self.memory_limit_bytes,
            "max_total_guest_memory_bytes" => self.max_total_guest_memory_bytes,
            "sql_threads" => self.sql_threads as u64,
            "max_sql_result_bytes" => self.max_sql_result_bytes as u64,
            "body_idle_timeout_ms" => ms(self.body_idle_timeout),
            "body_min_rate_bytes_per_s" => self.body_min_rate_bytes_per_s,
            "header_read_timeout_ms" => ms(self.header_read_timeout),
            "max_connections" => self.max_connections as u64,
            _ => return None,
        })
    }

    fn store(&mut self, name: &str, v: u64) {
        let ms = Duration::from_millis;
        match name {
            "event_limit_ms" => self.event_limit = ms(v),
            "session_limit_ms" => self.session_limit = ms(v),
            "cancellation_limit_ms" => self.cancellation_limit = ms(v),
            "body_read_timeout_ms" => self.body_read_timeout = ms(v),
            "cleanup_timeout_ms" => self.cleanup_timeout = ms(v),
            "max_operations" => self.max_operations = v as usize,
            "max_concurrent" => self.max_concurrent = v as usize,
            "max_queued" => self.max_queued = v as usize,
            "retirement_admission_limit" => self.retirement_admission_limit = v as u32,
            "max_request_head_bytes" => self.max_request_head_bytes = v as usize,
            "max_request_body_bytes" => self.max_request_body_bytes = v,
            "max_response_body_bytes" => self.max_response_body_bytes = v,
            "max_response_chunk_bytes" => self.max_response_chunk_bytes = v as usize,
            "outbound_connect_timeout_ms" => self.outbound_connect_timeout = ms(v),
            "outbound_first_byte_timeout_ms" => self.outbound_first_byte_timeout = ms(v),
            "max_outbound_response_bytes" => self.max_outbound_response_bytes = v,
            "actor_idle_ms" => self.actor_idle = ms(v),
            "actor_max_queued" => self.actor_max_queued = v as usize,
            "max_live_actors" => self.max_live_actors = v as usize,
            "memory_limit_bytes" => self.memory_limit_bytes = v,
            "max_total_guest_memory_bytes" => self.max_total_guest_memory_bytes = v,
            "sql_threads" => self.sql_threads = v as usize,
            "max_sql_result_bytes" => self.max_sql_result_bytes = v as usize,
            "body_idle_timeout_ms" => self.body_idle_timeout = ms(v),
            "body_min_rate_bytes_per_s" => self.body_min_rate_bytes_per_s = v,
            "header_read_timeout_ms" => self.header_read_timeout = ms(v),
            "max_connections" => self.max_connections = v as usize,
            _ => unreachable!("store is only called with names from SPECS"),
        }
    }
}

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

/// The spec of a limit by name.
pub fn spec(name: &str) -> Result<&'static LimitSpec, LimitError> {
    SPECS
        .iter()
        .find(|s| s.name == name)
        .ok_or_else(|| LimitError::Unknown {
            name: name.to_string(),
            known: SPECS.iter().map(|s| s.name).collect::<Vec<_>>().join(", "),
        })
}

/// Accepts plain integers, with `_` separators allowed for readability
/// (`1_048_576`).
fn parse_value(value: &str) -> Option<u64> {
    let digits: String = value.chars().filter(|c| *c != '_').collect();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Unit::Millis => "ms",
            Unit::Bytes => "bytes",
            Unit::Count => "count",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
