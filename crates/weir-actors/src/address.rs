//! Actor addresses: a worker reaches actor `name` of class `class` at
//! `http://<name>.<class>.actor.internal/…` through the ordinary outgoing
//! HTTP interface.
//!
//! Invariants owned here: an address parses to exactly one (class, name),
//! and both are safe as path components — a name can never climb out of
//! its class's directory or collide with another actor's file, and every
//! name the grammar accepts fits a file name with all of SQLite's side
//! files. A host is an address only when it is exactly
//! `<name>.<class>.actor.internal`: no port, no user information, no
//! trailing dot.

use std::fmt;

/// The reserved host suffix of actor addresses.
pub const ACTOR_HOST_SUFFIX: &str = ".actor.internal";

/// Longest actor name, in bytes. An actor's database is
/// `<name>.sqlite3`, and SQLite may create `<name>.sqlite3-journal` (16
/// bytes of suffix) beside it; 200 leaves room under the 255-byte file
/// name limit of every common file system, so no accepted name can fail
/// to open (a 240-byte name once fitted its database but not its WAL).
pub const MAX_NAME_BYTES: usize = 200;

/// Longest class name, in bytes: one DNS label.
pub const MAX_CLASS_BYTES: usize = 63;

/// One actor: its class and its name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ActorAddress {
    pub class: String,
    pub name: String,
}

/// Why a host is not an actor address.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AddressError {
    #[error("`{0}` is not an actor address (<name>.<class>{ACTOR_HOST_SUFFIX})")]
    NotAnActor(String),
    #[error("actor class `{0}` must be 1-{MAX_CLASS_BYTES} characters of a-z, 0-9 and `-`")]
    BadClass(String),
    #[error(
        "actor name `{0}` must be 1-{MAX_NAME_BYTES} characters of a-z, 0-9, `-`, `_` and `.`, not starting or ending with `.` and without `..`"
    )]
    BadName(String),
}

fn valid_class(class: &str) -> bool {
    (1..=MAX_CLASS_BYTES).contains(&class.len())
        && class
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

fn valid_name(name: &str) -> bool {
    (1..=MAX_NAME_BYTES).contains(&name.len())
        && name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_' || b == b'.'
        })
        && !name.starts_with('.')
        && !name.ends_with('.')
        && !name.contains("..")
}

impl ActorAddress {
    /// An address from its parts, checked.
    pub fn new(class: &str, name: &str) -> Result<ActorAddress, AddressError> {
        if !valid_class(class) {
            return Err(AddressError::BadClass(class.to_string()));
        }
        if !valid_name(name) {
            return Err(AddressError::BadName(name.to_string()));
        }
        Ok(ActorAddress {
            class: class.to_string(),
            name: name.to_string(),
        })
    }

    /// Parses a request host (case is folded). The class is the label
    /// before the suffix; the name is everything before the class, dots
    /// included. A port, user information or a trailing dot makes it no
    /// address.
    pub fn from_host(host: &str) -> Result<ActorAddress, AddressError> {
        if host.contains([':', '@', '/', '?', '#', '[', ']']) || host.ends_with('.') {
            return Err(AddressError::NotAnActor(host.to_string()));
        }
        let host = host.to_ascii_lowercase();
        let rest = host
            .strip_suffix(ACTOR_HOST_SUFFIX)
            .ok_or_else(|| AddressError::NotAnActor(host.clone()))?;
        let (name, class) = rest
            .rsplit_once('.')
            .ok_or_else(|| AddressError::NotAnActor(host.clone()))?;
        ActorAddress::new(class, name)
    }

    /// True when a host is in the reserved actor domain, valid or not
    /// (with a port or a trailing dot too): such hosts are never sent to
    /// the network.
    pub fn is_actor_host(host: &str) -> bool {
        let host = host.rsplit('@').next().unwrap_or(host);
        let host = host.split(':').next().unwrap_or(host).to_ascii_lowercase();
        host.trim_end_matches('.').ends_with(ACTOR_HOST_SUFFIX)
    }
}

impl fmt::Display for ActorAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}{}", self.name, self.class, ACTOR_HOST_SUFFIX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_parse_to_class_and_name() {
        let a = ActorAddress::from_host("room-42.Chat.actor.internal").unwrap();
        assert_eq!((a.class.as_str(), a.name.as_str()), ("chat", "room-42"));
        let dotted = ActorAddress::from_host("eu.user_7.counter.actor.internal").unwrap();
        assert_eq!(dotted.name, "eu.user_7");
        assert_eq!(dotted.class, "counter");
        assert_eq!(dotted.to_string(), "eu.user_7.counter.actor.internal");
    }

    #[test]
    fn other_hosts_and_unsafe_names_are_refused() {
        assert!(matches!(
            ActorAddress::from_host("example.com"),
            Err(AddressError::NotAnActor(_))
        ));
        assert!(matches!(
            ActorAddress::from_host("counter.actor.internal"),
            Err(AddressError::NotAnActor(_))
        ));
        assert!(matches!(
            ActorAddress::from_host("a..b.counter.actor.internal"),
            Err(AddressError::BadName(_))
        ));
        assert!(matches!(
            ActorAddress::new("counter", "../etc"),
            Err(AddressError::BadName(_))
        ));
        assert!(matches!(
            ActorAddress::new("counter", "a/b"),
            Err(AddressError::BadName(_))
        ));
        assert!(matches!(
            ActorAddress::new("Bad_Class", "a"),
            Err(AddressError::BadClass(_))
        ));
        assert!(ActorAddress::is_actor_host("x.y.actor.internal:8080"));
        assert!(ActorAddress::is_actor_host("x.y.actor.internal."));
        assert!(!ActorAddress::is_actor_host("actor.internal.example.com"));
        for inexact in [
            "a.counter.actor.internal:80",
            "user@a.counter.actor.internal",
            "a.counter.actor.internal.",
            "a/b.counter.actor.internal",
        ] {
            assert!(
                matches!(
                    ActorAddress::from_host(inexact),
                    Err(AddressError::NotAnActor(_))
                ),
                "{inexact}"
            );
        }
    }

    #[test]
    fn every_accepted_name_fits_a_file_name_with_its_side_files() {
        let longest = "a".repeat(MAX_NAME_BYTES);
        assert!(ActorAddress::new("c", &longest).is_ok());
        assert!(longest.len() + ".sqlite3-journal".len() <= 255);
        assert!(ActorAddress::new("c", &"a".repeat(MAX_NAME_BYTES + 1)).is_err());
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    fn name() -> impl Strategy<Value = String> {
        "[a-z0-9_-]([a-z0-9_.-]{0,198}[a-z0-9_-])?"
            .prop_filter("no empty label", |n| !n.contains(".."))
    }

    proptest! {
        #[test]
        fn any_host_parses_to_an_exact_address_or_is_refused(host in ".{0,300}") {
            if let Ok(a) = ActorAddress::from_host(&host) {
                // Exact: printing the address gives back the host (case
                // folded), so nothing was dropped or read past.
                prop_assert_eq!(a.to_string(), host.to_ascii_lowercase());
                prop_assert!(a.name.len() <= MAX_NAME_BYTES);
                prop_assert!(!a.name.contains('/') && !a.name.contains(".."));
                prop_assert!(ActorAddress::is_actor_host(&host));
            }
        }

        #[test]
        fn every_valid_address_round_trips(class in "[a-z0-9-]{1,63}", name in name()) {
            let a = ActorAddress::new(&class, &name).unwrap();
            let back = ActorAddress::from_host(&a.to_string()).unwrap();
            prop_assert_eq!(&back, &a);
            // And its database file name fits with SQLite's side files.
            let file = format!("{name}.sqlite3-journal");
            prop_assert!(file.len() <= 255);
        }

        #[test]
        fn decorations_are_never_an_address(class in "[a-z0-9-]{1,63}", name in name(), port in 0u16..) {
            let host = format!("{name}.{class}{ACTOR_HOST_SUFFIX}");
            for inexact in [format!("{host}:{port}"), format!("u@{host}"), format!("{host}.")] {
                prop_assert!(ActorAddress::from_host(&inexact).is_err(), "{}", inexact);
                prop_assert!(ActorAddress::is_actor_host(&inexact), "{}", inexact);
            }
        }
    }
}
