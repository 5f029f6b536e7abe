//! The stop signal a graceful shutdown gives every open connection.
//!
//! Invariant owned here: every connection open when the server stops, and
//! every one that registers after, is told to stop exactly once; a
//! connection's wait for the signal touches only state of its own.
//!
//! A connection polls its stop signal each time its task is woken, once or
//! more per request. A signal shared by all connections (a `watch`
//! channel) puts one lock, written by every connection on every core, on
//! that path; a one-shot channel per connection, handed out here, keeps
//! the per-request poll to the connection's own memory. Registering and
//! leaving take the shared lock once per connection.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

#[derive(Default)]
struct State {
    stopping: bool,
    next: u64,
    open: HashMap<u64, oneshot::Sender<()>>,
}

/// The connections to tell when the server stops.
#[derive(Default)]
pub struct Stops {
    state: Mutex<State>,
}

/// One connection's place in [`Stops`]; dropping it (when the connection
/// ends) gives the place back.
pub struct StopTicket {
    stops: Arc<Stops>,
    id: u64,
}

/// Resolves when the server stops (or, should [`Stops`] go away first,
/// when it does).
pub type StopSignal = oneshot::Receiver<()>;

impl Stops {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a connection. After [`Stops::stop`], the signal it gets
    /// has already fired.
    pub fn register(self: &Arc<Self>) -> (StopTicket, StopSignal) {
        let (tx, rx) = oneshot::channel();
        let mut state = self.lock();
        let id = state.next;
        state.next += 1;
        if state.stopping {
            let _ = tx.send(());
        } else {
            state.open.insert(id, tx);
        }
        drop(state);
        let ticket = StopTicket {
            stops: self.clone(),
            id,
        };
        (ticket, rx)
    }

    /// Tells every registered connection, and every one that registers
    /// from now on, to stop.
    pub fn stop(&self) {
        let open = {
            let mut state = self.lock();
            state.stopping = true;
            std::mem::take(&mut state.open)
        };
        for (_, tx) in open {
            let _ = tx.send(());
        }
    }

    /// Connections registered and not yet ended, and not yet told.
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.lock().open.len()
    }
}

impl Drop for StopTicket {
    fn drop(&mut self) {
        self.stops.lock().open.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_registered_connection_is_told_once_and_late_ones_at_once() {
        let stops = Arc::new(Stops::default());
        let (a, mut a_rx) = stops.register();
        let (b, mut b_rx) = stops.register();
        let (ended, mut ended_rx) = stops.register();
        drop(ended);
        assert_eq!(stops.waiting(), 2);
        assert!(a_rx.try_recv().is_err(), "no signal before the stop");

        stops.stop();
        assert_eq!(a_rx.try_recv(), Ok(()));
        assert_eq!(b_rx.try_recv(), Ok(()));
        // A connection that ended before the stop is not told (its sender
        // went with its ticket).
        assert_eq!(
            ended_rx.try_recv(),
            Err(oneshot::error::TryRecvError::Closed)
        );
        assert_eq!(stops.waiting(), 0);

        let (late, mut late_rx) = stops.register();
        assert_eq!(late_rx.try_recv(), Ok(()));
        drop((a, b, late));
        assert_eq!(stops.waiting(), 0);
    }
}
