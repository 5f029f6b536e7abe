//! Leaving the cluster: how a node that stops (to be upgraded, say) hands
//! what it owns to the others without failing the calls they send it.
//!
//! Invariants owned here:
//! - a call from another node that arrives once this node leaves does not
//!   run here: it waits until this node's lease is released (at most
//!   [`LEAVE_TIMEOUT`]) and is then answered "not run", so its sender
//!   looks its object up again, finds no owner and takes it over;
//! - the calls from other nodes already running when the node starts
//!   leaving finish first (at most [`LEAVE_TIMEOUT`]), so their commits
//!   ship under the lease they ran under; one still running then is
//!   answered as one that may have run ([`Leaving::given_up`]), before the
//!   lease goes, never left to look "not run" to its sender, which would
//!   send it again;
//! - the internal listener takes connections until every waiting call has
//!   been answered (at most [`ANSWER_TIMEOUT`] after the release): no
//!   sender finds it closed while this node still owns anything, which
//!   would fail the call instead of handing it on; then it lets each
//!   connection go once the answer in flight on it is written
//!   ([`crate::internal::CLOSE_TIMEOUT`]), so a sender whose connection
//!   breaks before an answer, and which finds this node gone from the
//!   cluster, knows its call did not run here and hands it on.

use std::time::Duration;

use tokio::sync::watch;

/// How long a leaving node waits for the calls running on it, and how
/// long a call that arrives meanwhile waits for the release: past a
/// turn's own deadlines, so only a call that hangs reaches it (its commit
/// is then fenced once the lease is released).
pub const LEAVE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the listener stays open after the release for the calls that
/// waited to be answered.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(1);

/// Where a node stands in leaving, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Stage {
    Serving,
    Leaving,
    Released,
    Closed,
}

/// A node's leaving, as the calls from other nodes see it.
pub struct Leaving {
    stage: watch::Sender<Stage>,
    /// Calls from other nodes running here.
    running: watch::Sender<usize>,
    /// Calls from other nodes waiting for the release.
    waiting: watch::Sender<usize>,
    /// Set when the node stops waiting for the calls still running.
    given_up: watch::Sender<bool>,
}

/// One call counted while it lives.
pub struct Counted<'a>(&'a watch::Sender<usize>);

impl<'a> Counted<'a> {
    fn new(counter: &'a watch::Sender<usize>) -> Counted<'a> {
        counter.send_modify(|n| *n += 1);
        Counted(counter)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

impl Default for Leaving {
    fn default() -> Self {
        Leaving {
            stage: watch::Sender::new(Stage::Serving),
            running: watch::Sender::new(0),
            waiting: watch::Sender::new(0),
            given_up: watch::Sender::new(false),
        }
    }
}

impl Leaving {
    /// Admits a call from another node: counted as running while this
    /// node serves; once it leaves, `None`, after the release.
    pub async fn admit(&self) -> Option<Counted<'_>> {
        // Counted before the stage is read: `leave` sets the stage before
        // it waits for the count, so a call it does not wait for saw it.
        let running = Counted::new(&self.running);
        if *self.stage.borrow() == Stage::Serving {
            return Some(running);
        }
        drop(running);
        let _waiting = Counted::new(&self.waiting);
        let mut stage = self.stage.subscribe();
        let _ =
            tokio::time::timeout(LEAVE_TIMEOUT, stage.wait_for(|s| *s >= Stage::Released)).await;
        None
    }

    /// Starts leaving: calls that arrive from now on wait for the
    /// release; those running finish first (at most [`LEAVE_TIMEOUT`]).
    pub async fn leave(&self) {
        self.stage.send_replace(Stage::Leaving);
        let mut running = self.running.subscribe();
        if tokio::time::timeout(LEAVE_TIMEOUT, running.wait_for(|n| *n == 0))
            .await
            .is_err()
        {
            tracing::warn!(
                running = *self.running.borrow(),
                "calls from other nodes still run as this node leaves; they are answered as calls that may have run, and their commits will be refused"
            );
            self.given_up.send_replace(true);
            let _ = tokio::time::timeout(ANSWER_TIMEOUT, running.wait_for(|n| *n == 0)).await;
        }
    }

    /// Resolves once the node stopped waiting for the calls still running
    /// as it leaves: each is then answered as a call that may have run.
    pub async fn given_up(&self) {
        let mut given_up = self.given_up.subscribe();
        let _ = given_up.wait_for(|g| *g).await;
    }

    /// The lease is released: the calls that waited are answered "not
    /// run" (this waits for that, at most [`ANSWER_TIMEOUT`]).
    pub async fn released(&self) {
        self.stage.send_replace(Stage::Released);
        let mut waiting = self.waiting.subscribe();
        let _ = tokio::time::timeout(ANSWER_TIMEOUT, waiting.wait_for(|n| *n == 0)).await;
    }

    /// The listener may close.
    pub fn close(&self) {
        self.stage.send_replace(Stage::Closed);
    }

    /// Resolves once the listener may close.
    pub async fn closed(&self) {
        let mut stage = self.stage.subscribe();
        let _ = stage.wait_for(|s| *s == Stage::Closed).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_call_admitted_before_leaving_runs_and_one_after_waits_for_the_release() {
        let leaving = std::sync::Arc::new(Leaving::default());
        let running = leaving.admit().await;
        assert!(running.is_some());
        // Leaving waits for the running call.
        let left = tokio::spawn({
            let leaving = leaving.clone();
            async move { leaving.leave().await }
        });
        tokio::task::yield_now().await;
        assert!(!left.is_finished());
        // A call that arrives now waits, then is not run.
        let late = tokio::spawn({
            let leaving = leaving.clone();
            async move { leaving.admit().await.is_none() }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!late.is_finished());
        assert_eq!(*leaving.waiting.borrow(), 1);
        drop(running);
        left.await.unwrap();
        assert!(
            !late.is_finished(),
            "it waits for the release, not the drain"
        );
        leaving.released().await;
        assert!(late.await.unwrap());
        assert_eq!(*leaving.waiting.borrow(), 0);
        let closed = tokio::spawn({
            let leaving = leaving.clone();
            async move { leaving.closed().await }
        });
        tokio::task::yield_now().await;
        assert!(!closed.is_finished());
        leaving.close();
        closed.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_that_never_ends_holds_the_leaving_no_longer_than_its_bound() {
        let leaving = Leaving::default();
        let _stuck = leaving.admit().await;
        let started = tokio::time::Instant::now();
        // Given up on at the bound (its sender is then told it may have
        // run), and waited for no longer than an answer takes after it.
        let given_up = async {
            leaving.given_up().await;
            started.elapsed()
        };
        let (given_up, ()) = tokio::join!(given_up, leaving.leave());
        assert_eq!(given_up, LEAVE_TIMEOUT);
        assert_eq!(started.elapsed(), LEAVE_TIMEOUT + ANSWER_TIMEOUT);
    }
}
