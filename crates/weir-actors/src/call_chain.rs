//! The call chain: the actors whose turns wait on a call, outermost first.
//!
//! Invariants owned here:
//! - an actor's call to an actor already in its turn's chain (itself, or
//!   one that called it, directly or through others) is refused at once
//!   with `actor_call_cycle`. Turns are exclusive: such a call would wait
//!   in the queue of a turn that waits for it, until the deadline ended
//!   both with nothing named;
//! - a chain is at most [`MAX_CALL_DEPTH`] actors long: each one holds a
//!   turn (and its instance) until the calls after it answer, so a call
//!   past it is refused with `actor_call_depth_exceeded`;
//! - the chain rides with the call inside the host (a request extension),
//!   never in anything a guest writes or reads, so a guest can neither
//!   forge nor strip it. A call from a worker, a client or a timer starts
//!   a chain of its own.
//!
//! A call handed to another node of a cluster carries its chain in the
//! envelope, so a cycle through several nodes is refused as one through
//! one.

use std::sync::{Arc, Mutex};

use crate::address::ActorAddress;
use crate::bindings::ActorIdentity;
use crate::error_code::ActorErrorCode;

/// Most actors one chain of calls may pass through. Each waiting actor
/// holds a turn and an instance; sixteen hops is far past any design that
/// is not a recursion through made-up names (Cloudflare's platform refuses
/// a Worker's subrequests past the same depth).
pub const MAX_CALL_DEPTH: usize = 16;

/// The actors a call comes through, outermost first: the callers whose
/// turns wait on it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CallChain(Arc<[(String, String)]>);

impl CallChain {
    /// The chain of a call that `caller` makes to `target`, or why it may
    /// not be made.
    pub fn through(
        caller: &ActorIdentity,
        target: &ActorAddress,
    ) -> Result<CallChain, ActorErrorCode> {
        let held = caller.chain();
        let mut actors: Vec<(String, String)> = held.0.to_vec();
        actors.push((caller.class.clone(), caller.name.clone()));
        if actors
            .iter()
            .any(|(class, name)| *class == target.class && *name == target.name)
        {
            return Err(ActorErrorCode::CallCycle);
        }
        if actors.len() >= MAX_CALL_DEPTH {
            return Err(ActorErrorCode::CallDepthExceeded);
        }
        Ok(CallChain(actors.into()))
    }

    /// The actors of the chain, outermost first, as (class, name): what a
    /// layer carries to another node with the call.
    pub fn actors(&self) -> &[(String, String)] {
        &self.0
    }

    /// A chain carried with a call from another node of the cluster, as it
    /// was there (the nodes trust each other's envelopes).
    pub fn carried(actors: Vec<(String, String)>) -> CallChain {
        CallChain(actors.into())
    }

    /// How many actors wait on the call.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The chain of the turn an actor's generation runs now, shared by the
/// generation's identity (read when it calls out) and its turns (set as
/// each begins).
#[derive(Clone, Debug, Default)]
pub struct TurnChain(Arc<Mutex<CallChain>>);

impl TurnChain {
    /// Starts a turn: a request's chain, or a new one.
    pub fn begin(&self, chain: CallChain) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = chain;
    }

    pub fn get(&self) -> CallChain {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn actor(class: &str, name: &str, turn: &TurnChain) -> ActorIdentity {
        ActorIdentity {
            class: class.into(),
            name: name.into(),
            incarnation: 1,
            turn_chain: turn.clone(),
        }
    }

    fn address(class: &str, name: &str) -> ActorAddress {
        ActorAddress::from_host(&format!("{name}.{class}.actor.internal")).unwrap()
    }

    #[test]
    fn a_call_back_into_the_chain_is_a_cycle_and_a_long_chain_ends() {
        let turn = TurnChain::default();
        let a = actor("room", "a", &turn);
        assert_eq!(
            CallChain::through(&a, &address("room", "a")),
            Err(ActorErrorCode::CallCycle)
        );
        // Same name, other class: another actor.
        let to_b = CallChain::through(&a, &address("room", "b")).unwrap();
        assert!(CallChain::through(&a, &address("lobby", "a")).is_ok());
        // b's turn runs with a's chain: a call back to a is a cycle.
        let b_turn = TurnChain::default();
        b_turn.begin(to_b);
        let b = actor("room", "b", &b_turn);
        for target in ["a", "b"] {
            assert_eq!(
                CallChain::through(&b, &address("room", target)),
                Err(ActorErrorCode::CallCycle),
                "{target}"
            );
        }
        assert_eq!(
            CallChain::through(&b, &address("room", "c")).map(|c| c.len()),
            Ok(2)
        );
        // A chain of distinct actors stops at the depth.
        let mut chain = CallChain::default();
        for i in 0.. {
            let turn = TurnChain::default();
            turn.begin(chain.clone());
            let caller = actor("room", &format!("n{i}"), &turn);
            match CallChain::through(&caller, &address("room", &format!("n{}", i + 1))) {
                Ok(next) => chain = next,
                Err(code) => {
                    assert_eq!(code, ActorErrorCode::CallDepthExceeded);
                    assert_eq!(chain.len(), MAX_CALL_DEPTH - 1);
                    break;
                }
            }
        }
    }
}
