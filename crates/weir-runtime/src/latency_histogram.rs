//! The latency histogram every event and turn is recorded into.
//!
//! Invariant owned here: recording a duration is two relaxed atomic adds
//! (its bucket and the sum) — no lock, no float arithmetic — and the
//! exposition's `_count` is its `+Inf` bucket, so the two can never
//! disagree. `prometheus_client`'s own histogram takes a write lock per
//! observation; on the request path both worker threads record into the
//! same app's histograms, so that lock was taken twice per event by
//! threads that contend for it.
//!
//! The buckets are fixed: [`FIRST_BOUND`] doubling [`BOUNDS`] times, then
//! `+Inf`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

/// The first bucket's upper bound: fine enough to see the sub-millisecond
/// p99 Weir aims for.
pub const FIRST_BOUND: Duration = Duration::from_micros(50);

/// How many doubling bounds there are: 50 µs · 2^18 ≈ 13 s, wide enough
/// to see every default deadline.
pub const BOUNDS: usize = 19;

/// A histogram of durations; cheap to clone (clones record into the same
/// buckets).
#[derive(Clone, Debug, Default)]
pub struct LatencyHistogram {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Non-cumulative counts; the last is `+Inf`.
    buckets: [AtomicU64; BOUNDS + 1],
    /// The sum of every recorded duration, in nanoseconds (enough for
    /// 584 years of recorded time).
    sum_nanos: AtomicU64,
}

impl LatencyHistogram {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records one duration.
    pub fn observe(&self, d: Duration) {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.inner.buckets[bucket_of(nanos)].fetch_add(1, Ordering::Relaxed);
        self.inner.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// The upper bound of bucket `i`, in seconds (`f64::MAX` for `+Inf`,
    /// which is how `prometheus_client` spells it).
    fn bound_seconds(i: usize) -> f64 {
        if i == BOUNDS {
            f64::MAX
        } else {
            FIRST_BOUND.as_secs_f64() * (1u64 << i) as f64
        }
    }
}

/// The bucket of a duration of `nanos`: the first whose bound is at least
/// it. With `q` the duration in units of [`FIRST_BOUND`] rounded up, that
/// is the first `i` with `2^i >= q`.
fn bucket_of(nanos: u64) -> usize {
    let unit = FIRST_BOUND.as_nanos() as u64;
    let q = nanos.div_ceil(unit);
    if q <= 1 {
        return 0;
    }
    let i = (u64::BITS - (q - 1).leading_zeros()) as usize;
    i.min(BOUNDS)
}

impl TypedMetric for LatencyHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for LatencyHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let buckets: Vec<(f64, u64)> = self
            .inner
            .buckets
            .iter()
            .enumerate()
            .map(|(i, b)| (Self::bound_seconds(i), b.load(Ordering::Relaxed)))
            .collect();
        let count = buckets.iter().map(|(_, n)| n).sum();
        let sum = self.inner.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The bucket the definition names: the first bound at least `nanos`.
    fn bucket_by_scan(nanos: u64) -> usize {
        (0..BOUNDS)
            .find(|&i| nanos as u128 <= FIRST_BOUND.as_nanos() << i)
            .unwrap_or(BOUNDS)
    }

    #[test]
    fn the_edges_of_each_bucket() {
        let unit = FIRST_BOUND.as_nanos() as u64;
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(unit), 0);
        assert_eq!(bucket_of(unit + 1), 1);
        assert_eq!(bucket_of(2 * unit), 1);
        assert_eq!(bucket_of(2 * unit + 1), 2);
        assert_eq!(bucket_of(unit << (BOUNDS - 1)), BOUNDS - 1);
        assert_eq!(bucket_of((unit << (BOUNDS - 1)) + 1), BOUNDS);
        assert_eq!(bucket_of(u64::MAX), BOUNDS);
    }

    proptest! {
        #[test]
        fn the_bucket_is_the_first_bound_at_least_the_duration(nanos in any::<u64>()) {
            prop_assert_eq!(bucket_of(nanos), bucket_by_scan(nanos));
        }

        #[test]
        fn small_durations_land_where_the_scan_says(nanos in 0u64..30_000_000_000) {
            prop_assert_eq!(bucket_of(nanos), bucket_by_scan(nanos));
        }
    }

    #[test]
    fn the_exposition_counts_every_observation_cumulatively() {
        let h = LatencyHistogram::new();
        h.observe(Duration::from_micros(10));
        h.observe(Duration::from_micros(50));
        h.observe(Duration::from_micros(51));
        h.observe(Duration::from_secs(60));
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("t", "test", h.clone());
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        assert!(out.contains("# TYPE t histogram"), "{out}");
        assert!(out.contains("t_count 4\n"), "{out}");
        assert!(out.contains("t_sum 60.000111\n"), "{out}");
        assert!(out.contains("t_bucket{le=\"0.00005\"} 2\n"), "{out}");
        assert!(out.contains("t_bucket{le=\"0.0001\"} 3\n"), "{out}");
        assert!(out.contains("t_bucket{le=\"13.1072\"} 3\n"), "{out}");
        assert!(out.contains("t_bucket{le=\"+Inf\"} 4\n"), "{out}");
    }
}
