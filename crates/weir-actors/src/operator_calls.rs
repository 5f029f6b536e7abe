//! Operators' calls about one actor, wherever it runs: what an inspection
//! or a deletion asks, and how the answer comes back. Without a placement
//! they run here. In cluster mode they run on the node that owns the
//! actor, which alone knows what is committed and alone may delete its
//! history; they find it and reach it as a call to the actor does.
//!
//! Invariant owned here: an inspection or a deletion runs where the
//! actor's turns run, between two of them, or nowhere. A node that does
//! not own the actor answers "not run" without running anything, and the
//! call is handed on once more after a fresh look at who owns it, as an
//! actor call is; a call that may have run is never handed on again. The
//! one call that runs elsewhere, a copy's removal after a deletion, runs
//! only on a node that does not own the actor, and never claims it.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::address::ActorAddress;
use crate::error_code::TurnError;
use crate::host::ActorHost;
use crate::operators::{ActorDetail, AdminError};
use crate::placement::{Forwarded, Location};

/// What an operator asks of one actor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OperatorCall {
    /// Its detail; with `keys`, its entries from `start` on.
    Inspect { keys: bool, start: Option<String> },
    /// Its deletion.
    Delete,
    /// After its deletion on its owner: the removal of a local copy that
    /// another node kept from an earlier ownership. It runs on the node
    /// asked, which does not own the actor (one that does keeps its copy:
    /// it is a new actor's).
    DropCopy,
}

/// A refusal as it travels: the status and code the operator is answered
/// with, and what it says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub status: u16,
    pub code: String,
    pub message: String,
}

/// What the node that ran an operator's call answers.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OperatorAnswer {
    Detail(Box<ActorDetail>),
    /// True if the actor existed.
    Deleted(bool),
    /// True if a copy was removed.
    Dropped(bool),
    Failed(Failure),
}

/// Where an answer from another node could not be read: what the operator
/// is told.
fn unreadable(why: impl std::fmt::Display) -> AdminError {
    AdminError::Refused(Failure {
        status: 502,
        code: "owner_unreachable".to_string(),
        message: format!("the actor's owner answered what this node cannot read: {why}"),
    })
}

impl OperatorAnswer {
    /// How a call that ran here ended, as it travels.
    fn of(result: Result<OperatorAnswer, AdminError>) -> Self {
        match result {
            Ok(answer) => answer,
            Err(AdminError::Refused(failure)) => OperatorAnswer::Failed(failure),
            Err(e) => OperatorAnswer::Failed(Failure {
                status: e.status(),
                code: e.code().to_string(),
                message: e.to_string(),
            }),
        }
    }

    /// The answer as it travels to the node that asked.
    pub fn into_response(self) -> http::Response<Bytes> {
        let body = serde_json::to_vec(&self).unwrap_or_else(|e| {
            serde_json::to_vec(&OperatorAnswer::Failed(Failure {
                status: 500,
                code: "storage_failed".to_string(),
                message: format!("an answer that cannot be encoded: {e}"),
            }))
            .expect("a failure encodes")
        });
        let mut response = http::Response::new(Bytes::from(body));
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        response
    }

    /// The answer another node sent; its refusal as the operator's error.
    pub fn from_response(response: http::Response<Bytes>) -> Result<Self, AdminError> {
        if response.status() != http::StatusCode::OK {
            return Err(unreadable(format!("status {}", response.status())));
        }
        match serde_json::from_slice(response.body()).map_err(unreadable)? {
            OperatorAnswer::Failed(failure) => Err(AdminError::Refused(failure)),
            answer => Ok(answer),
        }
    }

    /// What the operator is told when the answer is not the one the call
    /// asks for.
    pub(crate) fn unexpected(&self) -> AdminError {
        unreadable("an answer to another call")
    }
}

impl ActorHost {
    /// Runs an operator's call here, or, in cluster mode, on the node
    /// that owns the actor.
    pub(crate) async fn operate(
        &self,
        actor: ActorAddress,
        call: OperatorCall,
    ) -> Result<OperatorAnswer, AdminError> {
        let Some(placement) = self.placement.clone() else {
            return self.operate_here(&actor, call).await;
        };
        let mut last = TurnError::from(weir_runtime::ErrorCode::HostUnavailable);
        for attempt in 0..2 {
            match placement.locate(&actor, attempt > 0, false).await {
                Ok(Location::Here) => return self.operate_here(&actor, call).await,
                Ok(Location::Elsewhere(node)) => {
                    match placement
                        .forward_operator(node, actor.clone(), call.clone())
                        .await
                    {
                        Forwarded::Answered(response) => {
                            return OperatorAnswer::from_response(response);
                        }
                        Forwarded::Failed(code) => return Err(code.into()),
                        Forwarded::NotRun(code) => last = code,
                    }
                }
                Err(code) => return Err(code.into()),
            }
        }
        Err(last.into())
    }

    /// Runs an operator's call that another node handed here: here, or
    /// not at all (`None`: this node does not own the actor, and nothing
    /// ran).
    pub async fn operate_forwarded(
        &self,
        actor: ActorAddress,
        call: OperatorCall,
    ) -> Option<http::Response<Bytes>> {
        if call == OperatorCall::DropCopy {
            // Runs where it is asked, and never claims the actor.
            let dropped = self.drop_copy(&actor).await.map(OperatorAnswer::Dropped);
            return Some(OperatorAnswer::of(dropped).into_response());
        }
        if let Some(placement) = &self.placement {
            match placement.locate(&actor, false, true).await {
                Ok(Location::Here) => {}
                Ok(Location::Elsewhere(_)) => return None,
                Err(code) => return Some(OperatorAnswer::of(Err(code.into())).into_response()),
            }
        }
        let ran = self.operate_here(&actor, call).await;
        Some(OperatorAnswer::of(ran).into_response())
    }

    /// Runs an operator's call on this node, where the actor's turns run.
    async fn operate_here(
        &self,
        actor: &ActorAddress,
        call: OperatorCall,
    ) -> Result<OperatorAnswer, AdminError> {
        Ok(match call {
            OperatorCall::Inspect { keys, start } => {
                OperatorAnswer::Detail(Box::new(self.inspect_here(actor, keys, start).await?))
            }
            OperatorCall::Delete => OperatorAnswer::Deleted(self.delete_here(actor).await?),
            OperatorCall::DropCopy => OperatorAnswer::Dropped(self.drop_copy(actor).await?),
        })
    }
}
