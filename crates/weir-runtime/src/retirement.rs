//! Retirement: how many events one generation of an app serves.
//!
//! Invariants owned here:
//! - a generation serves at most `retirement_admission_limit` events, then
//!   is retired at its next idle boundary;
//! - a generation whose guest returned without a response (or set an error
//!   instead of one) is retired at once: the guest has broken its
//!   instance's state as far as Weir can know, so the next event runs on
//!   fresh memory;
//! - an app whose guest cannot serve a second event on one instance is
//!   found out and served one event per generation from then on: when
//!   [`SECOND_EVENT_FAILURES_TO_FALL_BACK`] generations in a row answer
//!   `invalid_response` on their second event (StarlingMonkey's fetch-event
//!   guests do: "respondWith can't be called twice"), the app falls back,
//!   says so once in the log and shows it in `/status`.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use serde::Serialize;

/// Generations in a row that must fail their second event, after a clean
/// first one, before the app falls back to one event per generation. One
/// is not enough: a guest may fail any single event for its own reasons;
/// two consecutive generations failing exactly their second event is the
/// signature of a guest that cannot be re-entered. Each costs one failed
/// request, so the bound is kept this small.
pub const SECOND_EVENT_FAILURES_TO_FALL_BACK: u32 = 2;

/// Why a generation was retired after an event that ended without a trap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetiredBecause {
    /// It served as many events as the app allows per generation.
    AdmissionLimit,
    /// Its guest returned without a response or set an error instead.
    InvalidResponse,
}

impl RetiredBecause {
    pub fn as_str(self) -> &'static str {
        match self {
            RetiredBecause::AdmissionLimit => "admission_limit",
            RetiredBecause::InvalidResponse => "invalid_response",
        }
    }
}

/// The retirement policy of one app.
pub struct Retirement {
    configured: u32,
    one_per_generation: AtomicBool,
    /// Consecutive second events that answered `invalid_response`.
    second_event_failures: AtomicU32,
}

/// What `/status` shows of an app's retirement.
#[derive(Debug, Serialize)]
pub struct RetirementStatus {
    /// `retirement_admission_limit` as configured.
    pub admission_limit: u32,
    /// Events a generation serves now.
    pub events_per_generation: u32,
    /// True once the app fell back to one event per generation because its
    /// guest could not serve a second one.
    pub fallback: bool,
}

impl Retirement {
    pub fn new(configured: u32) -> Self {
        Retirement {
            configured,
            one_per_generation: AtomicBool::new(false),
            second_event_failures: AtomicU32::new(0),
        }
    }

    /// Events a generation serves now.
    pub fn limit(&self) -> u32 {
        if self.one_per_generation.load(Ordering::Relaxed) {
            1
        } else {
            self.configured
        }
    }

    /// Judges a generation after an event its guest returned from:
    /// `admitted` is how many events it has served (this one included),
    /// `invalid` whether this one answered `invalid_response`. Returns why
    /// it retires, if it does, and whether this event made the app fall
    /// back to one event per generation (true for exactly one event).
    pub fn after_event(&self, admitted: u32, invalid: bool) -> (Option<RetiredBecause>, bool) {
        let mut fell_back = false;
        if admitted == 2 && self.configured > 1 {
            if invalid {
                let failures = self.second_event_failures.fetch_add(1, Ordering::Relaxed) + 1;
                if failures >= SECOND_EVENT_FAILURES_TO_FALL_BACK {
                    fell_back = self
                        .one_per_generation
                        .compare_exchange(false, true, Ordering::Relaxed, Ordering::Relaxed)
                        .is_ok();
                }
            } else {
                self.second_event_failures.store(0, Ordering::Relaxed);
            }
        }
        let why = if invalid {
            Some(RetiredBecause::InvalidResponse)
        } else if admitted >= self.limit() {
            Some(RetiredBecause::AdmissionLimit)
        } else {
            None
        };
        (why, fell_back)
    }

    pub fn status(&self) -> RetirementStatus {
        RetirementStatus {
            admission_limit: self.configured,
            events_per_generation: self.limit(),
            fallback: self.one_per_generation.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generation_retires_at_its_limit() {
        let r = Retirement::new(3);
        assert_eq!(r.after_event(1, false), (None, false));
        assert_eq!(r.after_event(2, false), (None, false));
        assert_eq!(
            r.after_event(3, false),
            (Some(RetiredBecause::AdmissionLimit), false)
        );
    }

    #[test]
    fn an_invalid_response_retires_at_once() {
        let r = Retirement::new(64);
        assert_eq!(
            r.after_event(1, true),
            (Some(RetiredBecause::InvalidResponse), false)
        );
        assert_eq!(
            r.after_event(17, true),
            (Some(RetiredBecause::InvalidResponse), false)
        );
        assert_eq!(r.limit(), 64);
    }

    #[test]
    fn two_failed_second_events_in_a_row_fall_back() {
        let r = Retirement::new(64);
        assert_eq!(r.after_event(1, false), (None, false));
        assert_eq!(
            r.after_event(2, true),
            (Some(RetiredBecause::InvalidResponse), false)
        );
        assert_eq!(r.limit(), 64);
        assert_eq!(r.after_event(1, false), (None, false));
        assert_eq!(
            r.after_event(2, true),
            (Some(RetiredBecause::InvalidResponse), true)
        );
        assert_eq!(r.limit(), 1);
        // From now on every generation retires after its first event, and
        // the fall-back is reported once.
        assert_eq!(
            r.after_event(1, false),
            (Some(RetiredBecause::AdmissionLimit), false)
        );
        assert_eq!(
            r.after_event(2, true),
            (Some(RetiredBecause::InvalidResponse), false)
        );
        let status = r.status();
        assert_eq!(
            (
                status.admission_limit,
                status.events_per_generation,
                status.fallback
            ),
            (64, 1, true)
        );
    }

    #[test]
    fn a_good_second_event_breaks_the_row() {
        let r = Retirement::new(64);
        r.after_event(2, true);
        assert_eq!(r.after_event(2, false), (None, false));
        assert_eq!(
            r.after_event(2, true),
            (Some(RetiredBecause::InvalidResponse), false)
        );
        assert_eq!(r.limit(), 64);
    }

    #[test]
    fn failures_past_the_second_event_are_not_the_signature() {
        let r = Retirement::new(64);
        for _ in 0..5 {
            r.after_event(3, true);
            r.after_event(1, true);
        }
        assert_eq!(r.limit(), 64);
        assert!(!r.status().fallback);
    }
}
