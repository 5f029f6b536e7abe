//! The places a listener for peers or operators (the cluster's internal
//! listener, the admin listener) keeps for its connections.
//!
//! Invariant owned here: a connection keeps a place only once it has
//! earned it, by sending a request its listener accepts (one bearing the
//! cluster's secret, or the admin token), and at most `max` connections
//! hold one. Until then a connection is one of at most `max_unproven`: a
//! new one pushes the oldest of them out (it is closed), and one that has
//! sent no request within `first_request` is closed too. So a flood of
//! idle or refused connections, however large, holds no place a peer or
//! an operator who speaks at once needs, and the file descriptors it
//! takes are bounded.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// A listener's connection places.
pub struct ConnectionPlaces {
    earned: Arc<Semaphore>,
    max: usize,
    max_unproven: usize,
    first_request: Duration,
    /// The connections that have not earned a place, oldest first.
    unproven: Mutex<VecDeque<(u64, Arc<Notify>)>>,
    next: AtomicU64,
}

/// One connection's place.
pub struct Place {
    places: Arc<ConnectionPlaces>,
    id: u64,
    /// Told when a newer connection pushes this one out.
    pushed_out: Arc<Notify>,
    spoke: AtomicBool,
    earned: Mutex<Option<OwnedSemaphorePermit>>,
}

impl ConnectionPlaces {
    /// At most `max` connections that earned a place and `max_unproven`
    /// others, each of which must send a request within `first_request`.
    pub fn new(max: usize, max_unproven: usize, first_request: Duration) -> Arc<ConnectionPlaces> {
        Arc::new(ConnectionPlaces {
            earned: Arc::new(Semaphore::new(max)),
            max,
            max_unproven: max_unproven.max(1),
            first_request,
            unproven: Mutex::new(VecDeque::new()),
            next: AtomicU64::new(1),
        })
    }

    fn unproven(&self) -> std::sync::MutexGuard<'_, VecDeque<(u64, Arc<Notify>)>> {
        self.unproven.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place for a connection just accepted, among the unproven: the
    /// oldest of them is pushed out when they are all taken.
    pub fn take(self: &Arc<Self>) -> Arc<Place> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let pushed_out = Arc::new(Notify::new());
        let mut unproven = self.unproven();
        if unproven.len() >= self.max_unproven
            && let Some((_, oldest)) = unproven.pop_front()
        {
            oldest.notify_one();
        }
        unproven.push_back((id, pushed_out.clone()));
        drop(unproven);
        Arc::new(Place {
            places: self.clone(),
            id,
            pushed_out,
            spoke: AtomicBool::new(false),
            earned: Mutex::new(None),
        })
    }

    /// Connections holding an earned place now.
    pub fn earned(&self) -> usize {
        self.max - self.earned.available_permits()
    }

    /// Waits (at most `limit`) until every earned place is given back: a
    /// listener that stops lets its connections finish. False if some
    /// were still held.
    pub async fn drained(&self, limit: Duration) -> bool {
        let all = u32::try_from(self.max).unwrap_or(u32::MAX);
        tokio::time::timeout(limit, self.earned.acquire_many(all))
            .await
            .is_ok()
    }
}

impl Place {
    /// A request arrived on the connection.
    pub fn spoke(&self) {
        self.spoke.store(true, Ordering::Relaxed);
    }

    /// The connection sent a request its listener accepts: it holds a
    /// place of its own from now on, and is never pushed out. False when
    /// every place is held (the listener refuses it).
    pub fn earn(&self) -> bool {
        self.spoke();
        let mut earned = self.earned.lock().unwrap_or_else(|p| p.into_inner());
        if earned.is_some() {
            return true;
        }
        match self.places.earned.clone().try_acquire_owned() {
            Ok(permit) => {
                *earned = Some(permit);
                drop(earned);
                self.leave_unproven();
                true
            }
            Err(_) => false,
        }
    }

    fn leave_unproven(&self) {
        self.places.unproven().retain(|(id, _)| *id != self.id);
    }

    /// Resolves when the connection must close: pushed out by a newer one
    /// before it earned a place, or silent past the first request's time.
    pub async fn ended(&self) {
        tokio::select! {
            _ = self.pushed_out.notified() => {}
            _ = tokio::time::sleep(self.places.first_request) => {
                if !self.spoke.load(Ordering::Relaxed) {
                    return;
                }
                self.pushed_out.notified().await;
            }
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.leave_unproven();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_oldest_unproven_connection_goes_first_and_a_silent_one_goes_in_time() {
        let places = ConnectionPlaces::new(2, 2, Duration::from_secs(2));
        let a = places.take();
        let b = places.take();
        b.spoke();
        // A third pushes the oldest unproven one out.
        let c = places.take();
        tokio::time::timeout(Duration::from_millis(1), a.ended())
            .await
            .expect("a was pushed out");
        // One that earned its place is never pushed out.
        assert!(c.earn());
        let d = places.take();
        let e = places.take();
        tokio::time::timeout(Duration::from_millis(1), b.ended())
            .await
            .expect("b was pushed out, c was not");
        assert!(
            tokio::time::timeout(Duration::from_secs(10), c.ended())
                .await
                .is_err()
        );
        // Silent past its first request's time: ended; one that spoke
        // stays until pushed out.
        e.spoke();
        tokio::time::timeout(Duration::from_secs(3), d.ended())
            .await
            .expect("d was silent");
        assert!(
            tokio::time::timeout(Duration::from_secs(10), e.ended())
                .await
                .is_err()
        );
        // Past `max` earned places, a connection cannot earn one.
        assert!(e.earn());
        let f = places.take();
        assert!(!f.earn(), "both places are held");
        assert_eq!(places.earned(), 2);
        drop(c);
        assert!(f.earn());
    }
}
