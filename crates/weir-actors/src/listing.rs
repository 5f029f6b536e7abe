//! The operators' listing of actors (`GET /actors`, `/actors/CLASS`,
//! `weir actors list`): every actor, live or hibernated, with what it
//! holds now.
//!
//! Invariant owned here: a listing is answered a page at a time
//! ([`LIST_PAGE`] actors, at most [`MAX_LIST_PAGE`]), in address order,
//! each page after the last actor of the one before. How large one answer
//! is, and how many actors' files it looks at, is bounded by the page,
//! whatever the number of actors: a page still reads its class's directory
//! of names (no database is opened), or in cluster mode walks the
//! database's index of keys from where the page starts.

use serde::{Deserialize, Serialize};

use crate::address::ActorAddress;
use crate::host::ActorHost;
use crate::operators::AdminError;

/// Actors one page of a listing holds when the operator names no
/// `limit`: each costs a look at its files on disk (and in cluster mode a
/// row of the cluster's database), so a server with a million actors
/// answers a listing a page at a time, never all of them at once.
pub const LIST_PAGE: usize = 1_000;

/// The most actors one page may hold (`limit`): its answer stays a few
/// megabytes of JSON.
pub const MAX_LIST_PAGE: usize = 10_000;

/// One actor as operators see it.
#[derive(Debug, Serialize, Deserialize)]
pub struct ActorSummary {
    pub class: String,
    pub name: String,
    /// In memory now (instance and database open), or hibernated.
    pub live: bool,
    /// Callers queued for a turn that still want it (a caller that left
    /// stays queued, but is skipped when its turn comes).
    pub waiting: usize,
    /// What its database takes on this server's disk (in cluster mode,
    /// its local copy here: 0 where this node holds none).
    pub storage_bytes: u64,
    /// Earliest timer, ms since the Unix epoch.
    pub next_timer_ms: Option<i64>,
    /// Cluster mode: the node that owns it now, if one does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

/// One page of a listing ([`ActorHost::list`]).
#[derive(Debug)]
pub struct ActorPage {
    pub actors: Vec<ActorSummary>,
    /// The page's last actor, when more follow it: the next page starts
    /// after it.
    pub next: Option<ActorAddress>,
}

impl ActorHost {
    /// What an operator sees of one actor now, from this host alone (in
    /// cluster mode the placement adds its owner and timer).
    pub(crate) fn summary(&self, actor: &ActorAddress) -> ActorSummary {
        let cell = self.lock_cells().get(actor).cloned();
        let waiting = cell.as_ref().map_or(0, |c| {
            let inbox = c.inbox.lock().unwrap_or_else(|p| p.into_inner());
            inbox.calls.iter().filter(|q| !q.reply.is_closed()).count()
        });
        // Live: it has an instance now, or is in a turn (which has one).
        let live = cell.is_some_and(|c| match c.live.try_lock() {
            Ok(live) => live.generation.is_some(),
            Err(_) => true,
        });
        ActorSummary {
            live,
            waiting,
            storage_bytes: self.directory.files_bytes(actor),
            next_timer_ms: self.timers.get(actor),
            class: actor.class.clone(),
            name: actor.name.clone(),
            owner: None,
        }
    }

    /// One page of the actors of a class (every class when `None`), live
    /// or hibernated, in address order: those with a database here, or, in
    /// cluster mode, those with history in the cluster's database,
    /// wherever they run (in the order of the database's collation). The
    /// page starts after `after` and holds at most `limit` actors (1 to
    /// [`MAX_LIST_PAGE`]).
    pub async fn list(
        &self,
        class: Option<&str>,
        after: Option<&ActorAddress>,
        limit: usize,
    ) -> Result<ActorPage, AdminError> {
        let limit = limit.clamp(1, MAX_LIST_PAGE);
        let mut classes: Vec<&String> = match class {
            Some(name) => {
                self.class(name)?;
                vec![self.classes.get_key_value(name).expect("checked above").0]
            }
            None => self.classes.keys().collect(),
        };
        classes.sort();
        // One more than the page: whether another page follows.
        let mut out = Vec::new();
        for class in classes {
            let from = match after {
                Some(a) if class.as_str() < a.class.as_str() => continue,
                Some(a) if *class == a.class => Some(a.name.as_str()),
                _ => None,
            };
            let wanted = limit + 1 - out.len();
            let Some(placement) = &self.placement else {
                let actors = self
                    .directory
                    .list(class)
                    .map_err(|e| AdminError::Storage(e.to_string()))?;
                let start = from.map_or(0, |f| actors.partition_point(|a| a.name.as_str() <= f));
                out.extend(actors[start..].iter().take(wanted).map(|a| self.summary(a)));
                if out.len() > limit {
                    break;
                }
                continue;
            };
            for known in placement.list(class, from, wanted).await? {
                let Ok(actor) = ActorAddress::new(class, &known.name) else {
                    continue;
                };
                let mut summary = self.summary(&actor);
                summary.next_timer_ms = known.next_timer_ms;
                summary.owner = known.owner;
                out.push(summary);
            }
            if out.len() > limit {
                break;
            }
        }
        let next = (out.len() > limit).then(|| {
            out.truncate(limit);
            let last = out.last().expect("a page holds at least one actor");
            ActorAddress {
                class: last.class.clone(),
                name: last.name.clone(),
            }
        });
        Ok(ActorPage { actors: out, next })
    }
}
