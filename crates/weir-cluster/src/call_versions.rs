//! The versions of calls between nodes: which this build speaks, how a
//! call names its version, and how two nodes of different builds agree on
//! one, so that a cluster is upgraded one node at a time.
//!
//! Invariants owned here:
//! - a version only adds targets to the envelope ([`crate::envelope`]);
//!   what an older version can carry is encoded the same way in every
//!   version since, so a call is encoded once, whichever version it is
//!   sent as;
//! - a node serves every version from [`OLDEST_CALL_VERSION`] to
//!   [`CALL_VERSION`], and refuses any other before reading the call,
//!   saying which versions it speaks;
//! - a call is sent as the newest version both nodes speak that can carry
//!   its target; a node that speaks none is not sent the call at all.

use std::collections::HashMap;
use std::sync::Mutex;

use http::HeaderMap;

/// The newest version of the envelope this build speaks. Version 1 carried
/// no call chain; 2 carries it; 3 adds operators' calls (an actor's
/// inspection and deletion, run by its owner).
pub const CALL_VERSION: u32 = 3;

/// The oldest version this build still serves and speaks: the previous
/// one, so nodes one version apart serve each other while a cluster is
/// upgraded node by node. Version 1 is not: its envelope differs.
pub const OLDEST_CALL_VERSION: u32 = 2;

/// What `weir --version` says of the calls between nodes, for an
/// operator to tell which builds can serve one cluster together.
pub const VERSIONS_SPOKEN: &str = "cluster calls: versions 2 to 3";

/// The header of a refusal that names the versions the refusing node
/// speaks, as `OLDEST-NEWEST`. Nodes of version 2 name only theirs, in
/// words.
pub const VERSIONS_HEADER: &str = "x-weir-cluster-versions";

/// What a node of version 2 says when it refuses a call of another
/// version, up to its version's number.
const OLD_REFUSAL: &str = "this node speaks version ";

/// The paths of every version: `CALL_PREFIX` + `v<N>` + `CALL_SUFFIX`.
const CALL_PREFIX: &str = "/weir/cluster/";
const CALL_SUFFIX: &str = "/call";

/// Nodes whose older version is remembered, at most: one entry per node
/// address that refused a call, so far more than a cluster has nodes.
const MAX_REMEMBERED: usize = 1024;

/// The path a call of `version` is posted to.
pub fn call_path(version: u32) -> String {
    format!("{CALL_PREFIX}v{version}{CALL_SUFFIX}")
}

/// The version a call path names, if it is one (as written: a version
/// this build does not know is still named, to be refused by name).
pub fn call_version(path: &str) -> Option<&str> {
    path.strip_prefix(CALL_PREFIX)?
        .strip_suffix(CALL_SUFFIX)?
        .strip_prefix('v')
        .filter(|v| !v.is_empty() && v.len() <= 9 && v.bytes().all(|b| b.is_ascii_digit()))
}

/// Whether this build serves calls of `version`.
pub fn served(version: &str) -> Option<u32> {
    version
        .parse()
        .ok()
        .filter(|v| (OLDEST_CALL_VERSION..=CALL_VERSION).contains(v))
}

/// What this node answers a call of a version it does not speak: the
/// value of [`VERSIONS_HEADER`], and its words.
pub fn refusal(offered: &str) -> (String, String) {
    (
        format!("{OLDEST_CALL_VERSION}-{CALL_VERSION}"),
        format!(
            "a call of version {offered} from a node of another Weir build; this node speaks \
             versions {OLDEST_CALL_VERSION} to {CALL_VERSION}: nodes of a cluster must be at most \
             one version apart"
        ),
    )
}

/// The versions a refusing node speaks, oldest and newest, read from its
/// refusal: the header, or a version 2 node's words.
pub fn spoken_by(headers: &HeaderMap, words: &str) -> Option<(u32, u32)> {
    if let Some(value) = headers.get(VERSIONS_HEADER) {
        let (oldest, newest) = value.to_str().ok()?.split_once('-')?;
        let (oldest, newest) = (oldest.parse().ok()?, newest.parse().ok()?);
        return (oldest <= newest).then_some((oldest, newest));
    }
    let (_, rest) = words.split_once(OLD_REFUSAL)?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let version = digits.parse().ok()?;
    Some((version, version))
}

/// The newest version both this build and a node speaking
/// `oldest..=newest` speak, if any.
pub fn agreed((oldest, newest): (u32, u32)) -> Option<u32> {
    let version = newest.min(CALL_VERSION);
    (version >= oldest.max(OLDEST_CALL_VERSION)).then_some(version)
}

/// The versions other nodes were found to speak, where older than this
/// build's: calls to them are sent as that version from then on, without
/// a refusal each time.
#[derive(Default)]
pub struct Spoken {
    older: Mutex<HashMap<String, u32>>,
}

impl Spoken {
    /// The version to send a call needing at least `needed` to the node
    /// at `node` as: the older version it was found to speak if that can
    /// carry the call, otherwise this build's (the node may have been
    /// upgraded since).
    pub fn to(&self, node: &str, needed: u32) -> u32 {
        let older = self.older.lock().unwrap_or_else(|e| e.into_inner());
        match older.get(node) {
            Some(&v) if v >= needed => v,
            _ => CALL_VERSION,
        }
    }

    /// Remembers that the node at `node` takes calls of `version`.
    pub fn found(&self, node: &str, version: u32) {
        let mut older = self.older.lock().unwrap_or_else(|e| e.into_inner());
        if version >= CALL_VERSION {
            older.remove(node);
            return;
        }
        if older.len() >= MAX_REMEMBERED && !older.contains_key(node) {
            // Addresses of nodes long gone: forgetting costs a refusal.
            older.clear();
        }
        older.insert(node.to_string(), version);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_paths_name_their_version() {
        assert_eq!(
            call_version(&call_path(CALL_VERSION)),
            Some(CALL_VERSION.to_string().as_str())
        );
        assert_eq!(call_version("/weir/cluster/v1/call"), Some("1"));
        assert_eq!(call_version("/weir/cluster/v2/call"), Some("2"));
        for other in [
            "/weir/cluster/v/call",
            "/weir/cluster/vx/call",
            "/weir/cluster/v1/call/",
            "/weir/cluster/call",
            "/weir/cluster/v1234567890/call",
            "/",
        ] {
            assert_eq!(call_version(other), None, "{other}");
        }
        assert_eq!(served("1"), None);
        assert_eq!(served("2"), Some(2));
        assert_eq!(served("3"), Some(3));
        assert_eq!(served("4"), None);
        assert_eq!(served("000000003"), Some(3));
        assert_eq!(
            VERSIONS_SPOKEN,
            format!("cluster calls: versions {OLDEST_CALL_VERSION} to {CALL_VERSION}")
        );
    }

    #[test]
    fn a_refusal_names_the_versions_spoken_and_an_agreement_is_the_newest_shared() {
        let (value, words) = refusal("9");
        let mut headers = HeaderMap::new();
        headers.insert(VERSIONS_HEADER, value.parse().unwrap());
        assert_eq!(
            spoken_by(&headers, &words),
            Some((OLDEST_CALL_VERSION, CALL_VERSION))
        );
        // A version 2 node's words, as it says them.
        let old = "a call of version 3 from a node of another Weir build; this node speaks \
                   version 2: every node of a cluster must run the same build";
        assert_eq!(spoken_by(&HeaderMap::new(), old), Some((2, 2)));
        assert_eq!(spoken_by(&HeaderMap::new(), "malformed envelope"), None);
        for bad in ["3", "a-b", "4-3", ""] {
            let mut headers = HeaderMap::new();
            headers.insert(VERSIONS_HEADER, bad.parse().unwrap());
            assert_eq!(spoken_by(&headers, old), None, "{bad}");
        }
        assert_eq!(agreed((2, 2)), Some(2));
        assert_eq!(agreed((2, 3)), Some(3));
        assert_eq!(agreed((3, 7)), Some(3));
        assert_eq!(agreed((1, 1)), None);
        assert_eq!(agreed((4, 5)), None);
    }

    #[test]
    fn an_older_node_is_sent_its_version_while_it_can_carry_the_call() {
        let spoken = Spoken::default();
        assert_eq!(spoken.to("a:1", 2), CALL_VERSION);
        spoken.found("a:1", 2);
        assert_eq!(spoken.to("a:1", 2), 2);
        assert_eq!(spoken.to("b:1", 2), CALL_VERSION);
        // What version 2 cannot carry is tried as this build's.
        assert_eq!(spoken.to("a:1", 3), CALL_VERSION);
        // Upgraded: forgotten.
        spoken.found("a:1", CALL_VERSION);
        assert_eq!(spoken.to("a:1", 2), CALL_VERSION);
        for n in 0..MAX_REMEMBERED + 1 {
            spoken.found(&format!("n{n}:1"), 2);
        }
        assert!(spoken.older.lock().unwrap().len() <= MAX_REMEMBERED);
    }
}
