//! The SQL pool: the threads that run guests' SQL and every storage call
//! whose cost grows with the data (scans, batches, multi-key calls).
//!
//! Invariant owned here: such work never runs on the async executor's
//! threads. It runs on `sql_threads` threads of its own, so statements
//! that run until their deadline on every one of them still leave every
//! async worker free — other events, calls whose data is not involved
//! and the admin address keep answering. Work queued behind them waits;
//! a call whose event ends meanwhile is skipped by its own stop check.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::oneshot;

/// Why pool work produced no result.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("the SQL pool could not be started: {0}")]
    Start(String),
    #[error("the storage call panicked: {0}")]
    Panicked(String),
}

/// A fixed set of threads for blocking storage work.
pub struct SqlPool {
    pool: rayon::ThreadPool,
    /// Threads running work now: what an operator (and a test) reads to
    /// see that the pool is taken, on `/status`.
    busy: Arc<AtomicUsize>,
}

impl SqlPool {
    /// Starts `threads` threads named `weir-sql-<n>`.
    pub fn new(threads: usize) -> Result<SqlPool, PoolError> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .thread_name(|i| format!("weir-sql-{i}"))
            .build()
            .map_err(|e| PoolError::Start(e.to_string()))?;
        Ok(SqlPool {
            pool,
            busy: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// Runs `work` on a pool thread and waits for it without blocking the
    /// caller's thread. Dropping the future does not stop the work: it
    /// runs to its end (its own stop check ends it early).
    pub async fn run<T, F>(&self, work: F) -> Result<T, PoolError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let busy = self.busy.clone();
        self.pool.spawn(move || {
            busy.fetch_add(1, Ordering::Relaxed);
            let out = std::panic::catch_unwind(AssertUnwindSafe(work));
            busy.fetch_sub(1, Ordering::Relaxed);
            let out = out.map_err(|p| {
                let why = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".to_string());
                PoolError::Panicked(why)
            });
            let _ = tx.send(out);
        });
        rx.await
            .unwrap_or_else(|_| Err(PoolError::Panicked("the pool dropped the call".into())))
    }

    /// Threads in the pool.
    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// Threads running work at this moment.
    pub fn busy(&self) -> usize {
        self.busy.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[tokio::test(flavor = "current_thread")]
    async fn work_runs_off_the_caller_and_panics_are_reported() {
        let pool = SqlPool::new(2).unwrap();
        assert_eq!(pool.threads(), 2);
        let caller = std::thread::current().id();
        let ran_on = pool.run(|| std::thread::current().id()).await.unwrap();
        assert_ne!(ran_on, caller);
        let err = pool.run(|| -> u32 { panic!("boom") }).await.unwrap_err();
        assert!(err.to_string().contains("boom"), "{err}");
        assert_eq!(pool.run(|| 7).await.unwrap(), 7);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_caller_stays_free_while_every_thread_is_busy() {
        let pool = Arc::new(SqlPool::new(1).unwrap());
        let release = Arc::new(AtomicBool::new(false));
        let busy = {
            let (pool, release) = (pool.clone(), release.clone());
            tokio::spawn(async move {
                pool.run(move || {
                    while !release.load(Ordering::SeqCst) {
                        std::thread::yield_now();
                    }
                })
                .await
            })
        };
        // The one async thread still runs other tasks.
        tokio::task::yield_now().await;
        let other = tokio::spawn(async { 1 + 1 }).await.unwrap();
        assert_eq!(other, 2);
        // The pool says its one thread is taken, and free again after.
        while pool.busy() != 1 {
            tokio::task::yield_now().await;
        }
        release.store(true, Ordering::SeqCst);
        busy.await.unwrap().unwrap();
        assert_eq!(pool.busy(), 0);
    }
}
