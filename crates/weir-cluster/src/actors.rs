//! Actors in cluster mode: the placement the actor host runs with, so that
//! each actor runs on the one node that owns it, opens at its owner row's
//! head, and ships every commit through its fence.
//!
//! Invariant owned here: an actor's object key is
//! `actor/<app>/<class>/<name>`, the same on every node, so every node
//! names the same row for the same actor.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use weir_actors::call_chain::CallChain;
use weir_actors::placement::{BoxFuture, Durable, Opened};
use weir_actors::{
    ActorAddress, Forwarded, Known, Location, OperatorCall, Placement, Relayed, TurnError,
};
use weir_store::Durability;
use weir_store::actor::{ActorDb, PAGE_BYTES};
use weir_store::replica::{LogEntry, Mirror};

use crate::envelope::Target;
use crate::error_code::ClusterErrorCode;
use crate::internal::Forwarder;
use crate::ownership::{Located, Ownership, unavailable};
use crate::replicas::Replicas;
use crate::shipper::{Records, Shipper};

/// The object key of an actor of `app`.
pub fn actor_key(app: &str, actor: &ActorAddress) -> String {
    format!("actor/{app}/{}/{}", actor.class, actor.name)
}

/// The app, class and name an actor's object key names.
pub fn parse_actor_key(key: &str) -> Option<(&str, &str, &str)> {
    let mut parts = key.strip_prefix("actor/")?.splitn(3, '/');
    Some((parts.next()?, parts.next()?, parts.next()?))
}

/// The placement of one app's actors.
pub struct ActorPlacement {
    pub app: String,
    pub ownership: Arc<Ownership>,
    pub records: Arc<Records>,
    pub replicas: Arc<Replicas>,
    pub forwarder: Forwarder,
    pub durability: Durability,
}

/// A shipper as an actor's durable half.
struct ActorDurable(Shipper);

impl Durable for ActorDurable {
    fn ship(&self, log: Vec<LogEntry>, mirror: Mirror) {
        self.0.ship(log, mirror);
    }

    fn settled(&self) -> BoxFuture<'static, Result<(), TurnError>> {
        let settled = self.0.settled();
        Box::pin(async move { settled.await.map_err(TurnError::from) })
    }

    fn on_settled(&self, done: Box<dyn FnOnce(Result<(), TurnError>) + Send>) {
        self.0.on_settled(Box::new(move |result| {
            done(result.map_err(TurnError::from))
        }));
    }

    fn broken(&self) -> Option<TurnError> {
        self.0.broken().map(TurnError::from)
    }

    fn wants_snapshot(&self) -> bool {
        self.0.wants_snapshot()
    }

    fn snapshot(&self, head: u64, ltx: Vec<u8>) {
        self.0.snapshot(head, ltx);
    }
}

/// How long the other nodes are given, together, to drop their copies of
/// a deleted actor before its deletion is answered: a node that takes
/// longer (or is away) drops its copy when it next starts.
pub const DROP_COPIES_TIMEOUT: Duration = Duration::from_secs(5);

impl ActorPlacement {
    /// Asks every other live node to drop the copy it may have kept of a
    /// deleted actor from an earlier ownership, and waits for their
    /// answers, at most [`DROP_COPIES_TIMEOUT`].
    async fn drop_copies_elsewhere(&self, actor: &ActorAddress) {
        let me = self.ownership.lease().held().map(|h| h.session);
        let mut asked = tokio::task::JoinSet::new();
        for node in self.ownership.lease().nodes() {
            if Some(node.session) == me {
                continue;
            }
            let call = self.forward_operator(
                Arc::from(node.address.as_str()),
                actor.clone(),
                OperatorCall::DropCopy,
            );
            asked.spawn(async move { (node.name, matches!(call.await, Forwarded::Answered(_))) });
        }
        let answered = tokio::time::timeout(DROP_COPIES_TIMEOUT, async {
            while let Some(joined) = asked.join_next().await {
                if let Ok((node, false)) = joined {
                    tracing::warn!(actor = %actor, node, "a node did not drop its copy of a deleted actor; it drops it when it starts again");
                }
            }
        })
        .await;
        if answered.is_err() {
            tracing::warn!(actor = %actor, "nodes that did not answer in time drop their copies of a deleted actor when they start again");
        }
    }
}

impl Placement for ActorPlacement {
    fn locate<'a>(
        &'a self,
        actor: &'a ActorAddress,
        refresh: bool,
        forwarded: bool,
    ) -> BoxFuture<'a, Result<Location, TurnError>> {
        Box::pin(async move {
            let key = actor_key(&self.app, actor);
            match self.ownership.locate(&key, refresh, forwarded).await {
                Ok(Located::Here(_)) => Ok(Location::Here),
                Ok(Located::Elsewhere(node)) => Ok(Location::Elsewhere(node)),
                Err(code) => Err(code.into()),
            }
        })
    }

    fn forward(
        &self,
        node: Arc<str>,
        actor: ActorAddress,
        request: http::Request<Bytes>,
    ) -> BoxFuture<'static, Forwarded> {
        let forwarder = self.forwarder.clone();
        // The actors waiting on the call travel with it.
        let chain = request
            .extensions()
            .get::<CallChain>()
            .map(|c| c.actors().to_vec())
            .unwrap_or_default();
        let target = Target::Actor {
            app: self.app.clone(),
            class: actor.class.clone(),
            name: actor.name.clone(),
            chain,
        };
        Box::pin(async move { forwarder.call(&node, &target, request).await })
    }

    fn forward_operator(
        &self,
        node: Arc<str>,
        actor: ActorAddress,
        call: OperatorCall,
    ) -> BoxFuture<'static, Forwarded> {
        let forwarder = self.forwarder.clone();
        let target = Target::Operator {
            app: self.app.clone(),
            class: actor.class,
            name: actor.name,
            call,
        };
        let request = http::Request::new(Bytes::new());
        Box::pin(async move { forwarder.call(&node, &target, request).await })
    }

    fn list<'a>(
        &'a self,
        class: &'a str,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Known>, TurnError>> {
        Box::pin(async move {
            let prefix = format!("actor/{}/{class}/", self.app);
            let listed = self
                .ownership
                .coordinator()
                .list(&prefix, after, limit)
                .await
                .map_err(|e| TurnError::from(unavailable(e)))?;
            Ok(listed
                .into_iter()
                .filter_map(|l| {
                    Some(Known {
                        name: l.key.strip_prefix(&prefix)?.to_string(),
                        next_timer_ms: l.alarm_at,
                        owner: l.owner,
                    })
                })
                .collect())
        })
    }

    fn with_history<'a>(
        &'a self,
        actors: &'a [ActorAddress],
    ) -> BoxFuture<'a, Result<Vec<String>, TurnError>> {
        Box::pin(async move {
            let keys: Vec<String> = actors.iter().map(|a| actor_key(&self.app, a)).collect();
            let found = self
                .ownership
                .coordinator()
                .with_history(&keys)
                .await
                .map_err(|e| TurnError::from(unavailable(e)))?;
            Ok(found
                .iter()
                .filter_map(|key| parse_actor_key(key).map(|(_, _, name)| name.to_string()))
                .collect())
        })
    }

    fn has_history(&self, actor: &ActorAddress) -> bool {
        self.ownership
            .owned(&actor_key(&self.app, actor))
            .is_some_and(|owned| owned.state.head > 0)
    }

    fn forget<'a>(&'a self, actor: &'a ActorAddress) -> BoxFuture<'a, Result<bool, TurnError>> {
        Box::pin(async move {
            let key = actor_key(&self.app, actor);
            let forgotten = self.ownership.forget(&key).await;
            self.records.forget(&key);
            tracing::info!(key, ok = forgotten.is_ok(), "deleted an actor's history");
            let existed = forgotten?;
            self.drop_copies_elsewhere(actor).await;
            Ok(existed)
        })
    }

    fn owns(&self, actor: &ActorAddress) -> bool {
        self.ownership.owned(&actor_key(&self.app, actor)).is_some()
    }

    fn copy_dropped(&self, actor: &ActorAddress) {
        self.records.forget(&actor_key(&self.app, actor));
    }

    fn open<'a>(
        &'a self,
        actor: &'a ActorAddress,
        path: &'a Path,
    ) -> BoxFuture<'a, Result<Opened, TurnError>> {
        Box::pin(async move {
            let key = actor_key(&self.app, actor);
            let owned = self
                .ownership
                .owned(&key)
                .ok_or(ClusterErrorCode::OwnershipLost)?;
            let (start, owned) = self.replicas.prepare(&key, path, PAGE_BYTES, owned).await?;
            let db = ActorDb::open_replica(path, self.durability, start).map_err(|e| {
                tracing::error!(key, error = %e, "cannot open an actor's replica");
                TurnError::from(ClusterErrorCode::StorageUnavailable)
            })?;
            let shipper = Shipper::new(&key, self.ownership.clone(), self.records.clone(), owned);
            Ok((db, Arc::new(ActorDurable(shipper)) as Arc<dyn Durable>))
        })
    }

    fn relay_socket(
        &self,
        node: Arc<str>,
        actor: ActorAddress,
        path: String,
        head: http::Request<()>,
    ) -> BoxFuture<'static, Relayed> {
        let forwarder = self.forwarder.clone();
        let app = self.app.clone();
        Box::pin(async move {
            forwarder
                .relay_socket(&node, &app, &actor, &path, head)
                .await
        })
    }

    fn relayer_leaving(&self, node: Arc<str>) -> BoxFuture<'static, bool> {
        let forwarder = self.forwarder.clone();
        Box::pin(async move { forwarder.relayer_leaving(&node).await })
    }

    fn tenure(&self, actor: &ActorAddress) -> BoxFuture<'static, ()> {
        Box::pin(self.ownership.tenure(&actor_key(&self.app, actor)))
    }

    /// Checked at each renewal's pace: a node whose lease ended is known
    /// gone once a renewal of this node sent after that lists the live
    /// nodes without it, within about a lease and two thirds of its last
    /// renewal (its lease, this node's next renewal, this check's period),
    /// longer if this node's renewals fail meanwhile. Judged only by a
    /// list newer than the relay, and only while this node holds its own
    /// lease: a node without its word from the cluster cannot tell who
    /// left, and one that registered after the list was made is not on it.
    fn owner_gone(&self, node: Arc<str>) -> BoxFuture<'static, ()> {
        let lease = self.ownership.lease().clone();
        let since = tokio::time::Instant::now();
        Box::pin(async move {
            let every = lease.ttl() / 3;
            loop {
                tokio::time::sleep(every).await;
                if lease.lacks_address_since(&node, since) {
                    return;
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_actor_key_names_its_app_class_and_name_and_reads_back() {
        let actor = ActorAddress::new("room", "b.eu").unwrap();
        let key = actor_key("chat", &actor);
        assert_eq!(key, "actor/chat/room/b.eu");
        assert_eq!(parse_actor_key(&key), Some(("chat", "room", "b.eu")));
        assert_eq!(parse_actor_key("kv/chat/x"), None);
    }
}
