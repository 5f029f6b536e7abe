//! The process's async runtime, built one way for `weir serve` and
//! `weir run`: tokio's multi-threaded scheduler, one worker thread per
//! core, the guests' code running on those workers.
//!
//! Owns one invariant: an operator's `TOKIO_WORKER_THREADS` is checked
//! before tokio reads it, so a value that is not a whole number of at
//! least 1 is a usage error naming the variable, not a panic with a
//! backtrace from inside the runtime's builder.

use anyhow::Context;

use crate::config::UsageError;

/// The variable tokio's builder reads for its worker count.
const WORKER_THREADS_VAR: &str = "TOKIO_WORKER_THREADS";

/// What the runtime's threads (its workers and its blocking pool) are
/// called.
const WORKER_THREAD_NAME: &str = "weir-worker";

/// The worker count the operator asked for, if any.
fn worker_threads(value: Option<std::ffi::OsString>) -> Result<Option<usize>, UsageError> {
    let Some(value) = value else { return Ok(None) };
    match value.to_str().and_then(|v| v.trim().parse::<usize>().ok()) {
        Some(n) if n >= 1 => Ok(Some(n)),
        _ => Err(UsageError(format!(
            "{WORKER_THREADS_VAR} must be a whole number of worker threads, at least 1 (got {value:?})"
        ))),
    }
}

pub fn build() -> anyhow::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    // Named, so that `top -H` tells them from the program threads
    // (`weir-program`), the epoch ticker (`weir-epoch`) and the rest.
    builder.enable_all().thread_name(WORKER_THREAD_NAME);
    if let Some(n) = worker_threads(std::env::var_os(WORKER_THREADS_VAR))? {
        builder.worker_threads(n);
    }
    builder.build().context("cannot start the async runtime")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_leaves_one_worker_per_core_to_tokio() {
        assert_eq!(worker_threads(None).unwrap(), None);
    }

    #[test]
    fn a_whole_number_is_the_worker_count() {
        assert_eq!(worker_threads(Some("3".into())).unwrap(), Some(3));
        assert_eq!(worker_threads(Some(" 1 ".into())).unwrap(), Some(1));
    }

    #[test]
    fn zero_empty_and_words_are_usage_errors_naming_the_variable() {
        for bad in ["0", "", "two", "-1", "1.5"] {
            let e = worker_threads(Some(bad.into())).unwrap_err();
            assert!(e.0.contains("TOKIO_WORKER_THREADS"), "{bad}: {}", e.0);
            assert!(e.0.contains(&format!("{bad:?}")), "{bad}: {}", e.0);
        }
    }
}
