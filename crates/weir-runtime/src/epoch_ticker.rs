//! The thread that advances time for Wasm.
//!
//! Invariant owned here: an engine's epoch advances every [`EPOCH_TICK`]
//! from one thread, whatever the number of requests, and that thread stops
//! (and is joined) when its ticker is dropped.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the engine's epoch advances. A spinning guest is interrupted at
/// the next tick, so this is the granularity of every Wasm deadline; 5 ms
/// keeps deadline overshoot small while the ticker costs nothing measurable.
pub const EPOCH_TICK: Duration = Duration::from_millis(5);

/// A thread that runs `each_tick` every [`EPOCH_TICK`] until it is
/// dropped: the one source of time for Wasm of the engines it ticks.
pub(crate) struct EpochTicker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EpochTicker {
    pub(crate) fn start(mut each_tick: impl FnMut() + Send + 'static) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("weir-epoch".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(EPOCH_TICK);
                        each_tick();
                    }
                })?
        };
        Ok(EpochTicker {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
