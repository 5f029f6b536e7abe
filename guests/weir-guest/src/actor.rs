//! Durable actors: the actor's own storage (key-value and SQL in one
//! transaction per turn), its named timers and who it is.
//!
//! ```ignore
//! use weir_guest::actor::{storage, timers};
//! let n: u64 = storage::get("n")?.unwrap_or(0) + 1;
//! storage::put("n", &n)?;
//! timers::schedule_in("flush", std::time::Duration::from_secs(5))?;
//!
//! // Timer handlers, by reason; unknown reasons are ignored.
//! weir_guest::alarms! {
//!     "flush" => flush,
//! }
//! fn flush() -> Result<Option<u64>, String> { Ok(None) }
//! ```
pub use crate::actor_bindings::weir::actor::identity::ActorInfo;
pub use crate::actor_bindings::weir::actor::storage::{ListOptions, StatementResult};
pub use crate::actor_bindings::weir::actor::types::{Error, Value};

/// Largest entry (key and value together) storage accepts.
pub const MAX_ENTRY_BYTES: usize = 2 << 20;

/// This actor: class, name, incarnation and pid base.
pub fn me() -> ActorInfo {
    crate::actor_bindings::weir::actor::identity::self_()
}

/// A value kept in actor storage: encoded to bytes and back.
pub trait Stored: Sized {
    fn encode(&self) -> Vec<u8>;
    fn decode(bytes: Vec<u8>) -> Option<Self>;
}

impl Stored for Vec<u8> {
    fn encode(&self) -> Vec<u8> {
        self.clone()
    }
    fn decode(bytes: Vec<u8>) -> Option<Self> {
        Some(bytes)
    }
}

impl Stored for String {
    fn encode(&self) -> Vec<u8> {
        self.as_bytes().to_vec()
    }
    fn decode(bytes: Vec<u8>) -> Option<Self> {
        String::from_utf8(bytes).ok()
    }
}

macro_rules! stored_as_text {
    ($($t:ty),*) => {$(
        impl Stored for $t {
            fn encode(&self) -> Vec<u8> {
                self.to_string().into_bytes()
            }
            fn decode(bytes: Vec<u8>) -> Option<Self> {
                std::str::from_utf8(&bytes).ok()?.parse().ok()
            }
        }
    )*};
}
stored_as_text!(u64, i64, u32, i32, usize, f64, bool);

/// Key-value entries and SQL, in the turn's transaction.
pub mod storage {
    use super::{Error, ListOptions, StatementResult, Stored, Value};
    use crate::actor_bindings::weir::actor::storage as raw;

    /// A stored value, decoded; `None` when absent (or not a `T`).
    pub fn get<T: Stored>(key: &str) -> Result<Option<T>, Error> {
        Ok(raw::get(key)?.and_then(T::decode))
    }

    pub fn get_bytes(key: &str) -> Result<Option<Vec<u8>>, Error> {
        raw::get(key)
    }

    pub fn get_many(keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, Error> {
        raw::get_many(keys)
    }

    pub fn put<T: Stored>(key: &str, value: &T) -> Result<(), Error> {
        raw::put(key, &value.encode())
    }

    /// Every entry, or — if one is too large — none.
    pub fn put_many(entries: &[(String, Vec<u8>)]) -> Result<(), Error> {
        raw::put_many(entries)
    }

    pub fn delete(key: &str) -> Result<bool, Error> {
        raw::delete(key)
    }

    pub fn delete_many(keys: &[String]) -> Result<u32, Error> {
        raw::delete_many(keys)
    }

    /// Entries whose keys start with `prefix`, in key order.
    pub fn list_prefix(prefix: &str) -> Result<Vec<(String, Vec<u8>)>, Error> {
        raw::list(&ListOptions {
            start: None,
            end: None,
            prefix: Some(prefix.to_string()),
            reverse: false,
            limit: None,
        })
    }

    pub fn list(options: &ListOptions) -> Result<Vec<(String, Vec<u8>)>, Error> {
        raw::list(options)
    }

    pub fn delete_all() -> Result<(), Error> {
        raw::delete_all()
    }

    /// One SQL statement in the turn's transaction.
    pub fn exec(sql: &str, params: &[Value]) -> Result<StatementResult, Error> {
        raw::exec(sql, params)
    }

    /// Makes the turn's writes so far durable now.
    pub fn sync() -> Result<(), Error> {
        raw::sync()
    }
}

/// Named timers: the earliest deadline per reason is kept.
pub mod timers {
    use super::Error;
    use crate::actor_bindings::weir::actor::timers as raw;
    pub use raw::Timer;

    /// Milliseconds since the Unix epoch, on the dispatcher's clock.
    pub fn now_ms() -> u64 {
        raw::now_ms()
    }

    /// Schedules `reason` at `at_ms` (ms since the Unix epoch).
    pub fn schedule(reason: &str, at_ms: u64) -> Result<(), Error> {
        raw::schedule(reason, at_ms)
    }

    /// Schedules `reason` `after` from now.
    pub fn schedule_in(reason: &str, after: std::time::Duration) -> Result<(), Error> {
        raw::schedule(reason, now_ms().saturating_add(after.as_millis() as u64))
    }

    pub fn cancel(reason: &str) -> Result<bool, Error> {
        raw::cancel(reason)
    }

    pub fn list() -> Result<Vec<Timer>, Error> {
        raw::list()
    }
}

crate::value_conversions!(Value);

/// Longest actor name (bytes): the host's grammar.
pub const MAX_NAME_BYTES: usize = 200;
/// Longest actor class name (bytes): one DNS label.
pub const MAX_CLASS_BYTES: usize = 63;

/// Checks a class and a name against the host's address grammar, so a
/// name taken from a request (`x.other-class.actor.internal/`, `a@b`)
/// can never turn a call into a call to another actor or class.
pub fn check_address(class: &str, name: &str) -> Result<(), String> {
    let class_ok = (1..=MAX_CLASS_BYTES).contains(&class.len())
        && class
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !class_ok {
        return Err(format!(
            "actor class `{class}` must be 1-{MAX_CLASS_BYTES} characters of a-z, 0-9 and `-`"
        ));
    }
    let name_ok = (1..=MAX_NAME_BYTES).contains(&name.len())
        && name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_' || b == b'.'
        })
        && !name.starts_with('.')
        && !name.ends_with('.')
        && !name.contains("..");
    if !name_ok {
        return Err(format!(
            "actor name `{name}` must be 1-{MAX_NAME_BYTES} characters of a-z, 0-9, `-`, `_` and `.`"
        ));
    }
    Ok(())
}

/// Calls actor `name` of `class`: `method` `path` with `body`; its
/// whole response, or why the call could not be made. The class and
/// name are checked first ([`check_address`]).
pub fn call(
    class: &str,
    name: &str,
    method: &str,
    path: &str,
    body: &[u8],
) -> Result<crate::http::Reply, String> {
    check_address(class, name)?;
    crate::http::send(
        method,
        &format!("{name}.{class}.actor.internal"),
        path,
        body,
    )
}
