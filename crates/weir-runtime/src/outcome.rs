//! Outcomes: the few words every receipt and every metric uses to say how
//! a call ended.
//!
//! Invariant owned here: the set is closed and each outcome has one name,
//! so a receipt's `outcome` and a metric's `outcome` label always agree.

use serde::Serialize;

/// How an event ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The guest answered and the response was delivered in full.
    Ok,
    /// The guest trapped.
    Trap,
    /// An event or session deadline passed.
    Deadline,
    /// The client left before the response was delivered.
    Cancelled,
    /// No lane or queue place was available.
    Capacity,
    /// A transport or memory limit was hit.
    Limit,
}

impl Outcome {
    pub const ALL: &'static [Outcome] = &[
        Outcome::Ok,
        Outcome::Trap,
        Outcome::Deadline,
        Outcome::Cancelled,
        Outcome::Capacity,
        Outcome::Limit,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Trap => "trap",
            Outcome::Deadline => "deadline",
            Outcome::Cancelled => "cancelled",
            Outcome::Capacity => "capacity",
            Outcome::Limit => "limit",
        }
    }
}
