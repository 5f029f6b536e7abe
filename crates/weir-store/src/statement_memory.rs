//! Statement memory: what one guest statement may make SQLite allocate.
//!
//! Invariant owned here: while a guest's statement runs (every one runs
//! in one place, the crate's `guest_statement` module), what SQLite
//! allocates on its thread beyond what it frees is bounded by
//! `max_sql_statement_memory_bytes`. An allocation past the bound fails,
//! so that statement alone ends `out of memory`, named
//! ([`StatementOverMemory`]); every other connection goes on allocating.
//!
//! Why: SQLite's heap bound ([`crate::statement_bounds::bound_sqlite_heap`])
//! is one for the process. Without a bound per statement, one tenant's
//! endless sort takes the whole heap and every other tenant's statement
//! that allocates meanwhile fails `out of memory` too.
//!
//! How: Weir wraps SQLite's allocator ([`install`], before SQLite's first
//! use in the process) and, on a thread while a guest statement runs
//! there, counts what SQLite allocates and frees (everywhere else the
//! wrapper only passes calls on). A statement runs on one thread from its
//! first step to its last, so the count's growth is what it made SQLite
//! hold: its sorts,
//! ephemeral tables, recursive queues and in-memory temporary files
//! ([`crate::confinement::harden`] keeps them all in memory), and the
//! pages it read into the connection's cache (bounded on their own).

use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use rusqlite::ffi;

/// What one guest statement may make SQLite hold: 128 MiB, the memory
/// a whole Durable Object may use on the platform the seeds run on. A
/// sort of a million 100-byte rows fits; the default SQL pool's four
/// threads running such statements at once hold at most a quarter of the
/// default heap bound, so a tenant's runaway statement never takes
/// another's memory.
pub const DEFAULT_STATEMENT_BYTES: u64 = 128 << 20;

/// A statement that needed more memory than its bound: the limit, named.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "out of memory: the statement needed more than max_sql_statement_memory_bytes ({limit} bytes)"
)]
pub struct StatementOverMemory {
    pub limit: u64,
}

/// Statements stopped at their bound, in this process.
static OVER_MEMORY: AtomicU64 = AtomicU64::new(0);

/// The bound of each guest statement, in bytes.
static STATEMENT_BYTES: AtomicI64 = AtomicI64::new(DEFAULT_STATEMENT_BYTES as i64);

/// SQLite's own allocator, which the wrapper calls; set before the
/// wrapper is handed to SQLite.
static INNER: OnceLock<Methods> = OnceLock::new();

/// True once the wrapper is in place; false when SQLite was in use before
/// [`install`] (then nothing is counted and statements are unbounded).
static INSTALLED: OnceLock<bool> = OnceLock::new();

/// The methods of SQLite's own allocator the wrapper calls.
struct Methods {
    malloc: unsafe extern "C" fn(c_int) -> *mut c_void,
    free: unsafe extern "C" fn(*mut c_void),
    realloc: unsafe extern "C" fn(*mut c_void, c_int) -> *mut c_void,
    size: unsafe extern "C" fn(*mut c_void) -> c_int,
}

/// The ceiling of a thread that runs no guest statement.
const UNARMED: i64 = i64::MAX;

thread_local! {
    /// Bytes SQLite allocated on this thread while statements ran, less
    /// those it freed meanwhile: only its growth inside one statement is
    /// used (memory freed there that was allocated before counts as
    /// given back).
    static HELD: Cell<i64> = const { Cell::new(0) };
    /// While a guest statement runs on this thread: the count it may not
    /// pass. `i64::MAX` otherwise.
    static CEILING: Cell<i64> = const { Cell::new(UNARMED) };
    /// Set when an allocation was refused at the ceiling, so the
    /// statement's `out of memory` can be told from the process's.
    static REFUSED: Cell<bool> = const { Cell::new(false) };
}

/// Wraps SQLite's allocator, once per process. Must run before SQLite is
/// first used (any connection, or a heap limit): every function here that
/// opens a connection calls it first. True when the wrapper is in place.
pub fn install() -> bool {
    *INSTALLED.get_or_init(|| {
        let mut default = ffi::sqlite3_mem_methods {
            xMalloc: None,
            xFree: None,
            xRealloc: None,
            xSize: None,
            xRoundup: None,
            xInit: None,
            xShutdown: None,
            pAppData: std::ptr::null_mut(),
        };
        // SAFETY: GETMALLOC writes SQLite's current (default) allocator
        // into `default`; it and MALLOC fail with SQLITE_MISUSE, changing
        // nothing, once SQLite is initialized.
        let got = unsafe { ffi::sqlite3_config(ffi::SQLITE_CONFIG_GETMALLOC, &raw mut default) };
        if got != ffi::SQLITE_OK {
            return false;
        }
        let (Some(malloc), Some(free), Some(realloc), Some(size)) = (
            default.xMalloc,
            default.xFree,
            default.xRealloc,
            default.xSize,
        ) else {
            return false;
        };
        // The wrapper finds SQLite's methods here from its first call on.
        INNER.get_or_init(|| Methods {
            malloc,
            free,
            realloc,
            size,
        });
        // Size, rounding, start and end stay SQLite's own, with its own
        // `pAppData` (null for its default allocator).
        let wrapper = ffi::sqlite3_mem_methods {
            xMalloc: Some(counted_malloc),
            xFree: Some(counted_free),
            xRealloc: Some(counted_realloc),
            ..default
        };
        // SAFETY: SQLite copies the methods it is given.
        let set = unsafe { ffi::sqlite3_config(ffi::SQLITE_CONFIG_MALLOC, &raw const wrapper) };
        set == ffi::SQLITE_OK
    })
}

/// True when statements are bounded in this process.
pub fn active() -> bool {
    INSTALLED.get().copied().unwrap_or(false)
}

/// Sets the bound of every guest statement from now on.
pub fn bound_statements(bytes: u64) {
    STATEMENT_BYTES.store(i64::try_from(bytes).unwrap_or(i64::MAX), Ordering::Relaxed);
}

/// Guest statements that failed at their bound since the process began.
pub fn statements_over_memory() -> u64 {
    OVER_MEMORY.load(Ordering::Relaxed)
}

/// The bound of every guest statement, in bytes.
pub fn statement_bytes() -> u64 {
    STATEMENT_BYTES.load(Ordering::Relaxed).max(0) as u64
}

/// A guest statement running on this thread: SQLite's allocations on it
/// are bounded until this is dropped.
pub struct Armed {
    ceiling: i64,
    previous: i64,
}

impl Armed {
    /// Bounds what SQLite may allocate on this thread from now on by the
    /// statement bound.
    pub fn arm() -> Armed {
        let ceiling = HELD
            .get()
            .saturating_add(STATEMENT_BYTES.load(Ordering::Relaxed));
        REFUSED.set(false);
        Armed {
            ceiling,
            previous: CEILING.replace(ceiling),
        }
    }

    /// What the statement's `out of memory` means: its bound, named (and
    /// counted, [`statements_over_memory`]), when an allocation was
    /// refused at it since [`Armed::arm`]; `None` when the process's heap
    /// ran out instead.
    pub fn blame(&self) -> Option<StatementOverMemory> {
        if !REFUSED.get() {
            return None;
        }
        OVER_MEMORY.fetch_add(1, Ordering::Relaxed);
        Some(StatementOverMemory {
            limit: statement_bytes(),
        })
    }
}

impl Drop for Armed {
    fn drop(&mut self) {
        debug_assert_eq!(CEILING.get(), self.ceiling);
        CEILING.set(self.previous);
    }
}

fn inner() -> &'static Methods {
    match INNER.get() {
        Some(inner) => inner,
        // Set before SQLite is given the wrapper.
        None => unreachable!("SQLite called the counting allocator before it was installed"),
    }
}

/// True while a guest statement runs on this thread: only then is
/// anything counted (a statement's bound is on the growth of the count
/// while it runs, so what happens between statements never matters).
fn armed() -> bool {
    CEILING.get() != UNARMED
}

/// True when `more` bytes would take this thread past its ceiling; notes
/// the refusal.
fn refuse(more: i64) -> bool {
    let over = HELD.get().saturating_add(more) > CEILING.get();
    if over {
        REFUSED.set(true);
    }
    over
}

fn size_of(p: *mut c_void) -> i64 {
    // SAFETY: `p` is a live allocation of the inner allocator.
    i64::from(unsafe { (inner().size)(p) })
}

unsafe extern "C" fn counted_malloc(n: c_int) -> *mut c_void {
    if !armed() {
        // SAFETY: the inner allocator's own contract, unchanged.
        return unsafe { (inner().malloc)(n) };
    }
    if refuse(i64::from(n)) {
        return std::ptr::null_mut();
    }
    // SAFETY: as above.
    let p = unsafe { (inner().malloc)(n) };
    if !p.is_null() {
        HELD.set(HELD.get() + size_of(p));
    }
    p
}

unsafe extern "C" fn counted_free(p: *mut c_void) {
    if !p.is_null() && armed() {
        HELD.set(HELD.get() - size_of(p));
    }
    // SAFETY: as above.
    unsafe { (inner().free)(p) }
}

unsafe extern "C" fn counted_realloc(p: *mut c_void, n: c_int) -> *mut c_void {
    if !armed() {
        // SAFETY: as above.
        return unsafe { (inner().realloc)(p, n) };
    }
    let old = if p.is_null() { 0 } else { size_of(p) };
    if refuse(i64::from(n) - old) {
        return std::ptr::null_mut();
    }
    // SAFETY: as above.
    let q = unsafe { (inner().realloc)(p, n) };
    if !q.is_null() {
        HELD.set(HELD.get() - old + size_of(q));
    }
    q
}
