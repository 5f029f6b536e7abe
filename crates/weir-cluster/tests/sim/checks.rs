//! The invariants a schedule is checked against once it ends, from the
//! model's logs (kept and deleted) and what the clients were told.

use std::collections::{BTreeMap, BTreeSet};

use tokio::time::Instant;

use super::model::Model;

/// A write acknowledged: its id, when it was sent, when acknowledged.
pub type AckedWrite = (u64, Instant, Instant);

/// The client writes' ids in a log, in its order.
fn written(log: &[Vec<u8>]) -> Vec<u64> {
    log.iter()
        .filter(|e| e[0] == b'w')
        .map(|e| u64::from_be_bytes(e[1..9].try_into().unwrap()))
        .collect()
}

/// Checks the model against the acknowledged writes (by object) and the
/// acknowledged deletions (each object's, with when it was sent): what is
/// wrong, the writes acknowledged and the alarms delivered.
///
/// - every log is whole ([`Model::check_logs`]) and holds each write once;
/// - an acknowledged write is in its object's log, or in a log deleted
///   after the write was sent;
/// - no write acknowledged before an acknowledged deletion was sent
///   outlives it;
/// - every object whose log has a write had its alarm delivered.
pub fn check(
    model: &Model,
    acked: &BTreeMap<String, Vec<AckedWrite>>,
    deleted: &[(String, Instant)],
) -> (Vec<String>, u64, u64) {
    let mut wrong = model.check_logs();
    let logs = model.logs();
    let erased = model.erased();
    let mut acked_total = 0;
    let mut finals: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    let keys: BTreeSet<&String> = logs
        .keys()
        .chain(erased.keys())
        .chain(acked.keys())
        .collect();
    for key in keys {
        // Each write once, in the object's log or in one deleted before it.
        let kept = written(logs.get(key).map_or(&[][..], |l| &l[..]));
        let lives: Vec<(Instant, Vec<u64>)> = erased
            .get(key)
            .map(|e| e.iter().map(|(at, log)| (*at, written(log))).collect())
            .unwrap_or_default();
        let every: Vec<u64> = kept
            .iter()
            .chain(lives.iter().flat_map(|(_, ids)| ids))
            .copied()
            .collect();
        if every.iter().copied().collect::<BTreeSet<_>>().len() != every.len() {
            wrong.push(format!("{key}: a write is in the logs twice"));
        }
        let kept: BTreeSet<u64> = kept.into_iter().collect();
        for (id, sent, _) in acked.get(key).map_or(&[][..], |a| &a[..]) {
            acked_total += 1;
            if kept.contains(id) {
                continue;
            }
            match lives.iter().find(|(_, ids)| ids.contains(id)) {
                Some((at, _)) if at >= sent => {}
                Some(_) => wrong.push(format!(
                    "{key}: acknowledged write {id} is in a log deleted before it was sent"
                )),
                None => wrong.push(format!("{key}: acknowledged write {id} is lost")),
            }
        }
        finals.insert(key.clone(), kept);
    }
    // An acknowledged deletion took every write acknowledged before it
    // was sent.
    for (key, sent) in deleted {
        for (id, _, acked_at) in acked.get(key).map_or(&[][..], |a| &a[..]) {
            if acked_at < sent && finals.get(key).is_some_and(|k| k.contains(id)) {
                wrong.push(format!(
                    "{key}: write {id}, acknowledged before a deletion that was acknowledged, \
                     outlived it"
                ));
            }
        }
    }
    let mut delivered = 0;
    for (key, log) in &logs {
        let set = log.iter().any(|e| e[0] == b'w');
        let fired = log.iter().any(|e| e[0] == b'a');
        if set && !fired {
            wrong.push(format!("{key}: its alarm was never delivered"));
        }
        if fired {
            delivered += 1;
        }
    }
    (wrong, acked_total, delivered)
}
