//! What one guest statement may make SQLite hold, in a process of its own:
//! the counting allocator must be installed before SQLite's first use,
//! which the unit tests' direct connections would otherwise come first to.

use std::sync::{Arc, Barrier, Mutex};

use weir_store::Durability;
use weir_store::actor::{ActorDb, ActorStoreError};
use weir_store::{statement_bounds, statement_memory};

/// A sort of rows it never stops making: it holds more and more until
/// something stops it.
const ENDLESS_SORT: &str = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) \
                            SELECT x FROM c ORDER BY randomblob(1000)";

/// A sort that needs about 6 MiB (5,000 rows of 1,000 bytes) and ends.
const MODEST_SORT: &str = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x < 5000) \
                           SELECT count(*) FROM (SELECT x FROM c ORDER BY randomblob(1000))";

const STATEMENT_BYTES: u64 = 16 << 20;

/// One test at a time: they measure SQLite's heap, which is the process's.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// SQLite's heap bound for the process, as a server sets it: without the
/// statement bound, an endless sort ends at the heap's (256 MiB), as
/// `out of memory` without a name.
fn bound() {
    let bounded = statement_bounds::bound_sqlite_heap(64 << 20, 256 << 20, STATEMENT_BYTES);
    assert!(bounded, "SQLite was in use first");
}

fn open(name: &str) -> ActorDb {
    let dir = weir_scratch::dir(&format!("statement-memory-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    ActorDb::open(&dir.join("db.sqlite3"), Durability::Process).unwrap()
}

/// What SQLite holds for the whole process now.
fn sqlite_heap() -> i64 {
    // SAFETY: reads a counter.
    unsafe { rusqlite::ffi::sqlite3_memory_used() }
}

#[test]
fn a_statement_past_its_bound_fails_alone_and_names_it() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    bound();
    assert!(statement_memory::active());
    let mut hog = open("hog");
    let mut bystander = open("bystander");
    let before = sqlite_heap();
    match hog.exec(ENDLESS_SORT, &[]) {
        Err(ActorStoreError::OverMemory(over)) => {
            assert_eq!(over.limit, STATEMENT_BYTES);
            let said = ActorStoreError::OverMemory(over).to_string();
            assert!(said.contains("out of memory"), "{said}");
            assert!(said.contains("max_sql_statement_memory_bytes"), "{said}");
        }
        other => panic!("the endless sort ended {other:?}"),
    }
    // Given back when it failed.
    let after = sqlite_heap();
    assert!(
        after - before < 4 << 20,
        "SQLite still holds {} KiB more",
        (after - before) >> 10
    );
    // A statement that needs less than the bound runs, on either.
    for db in [&mut hog, &mut bystander] {
        let sorted = db.exec(MODEST_SORT, &[]).unwrap();
        assert_eq!(sorted.rows[0][0], weir_store::sql::Value::Integer(5000));
    }
}

#[test]
fn statements_on_other_threads_are_bounded_each_by_their_own() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    bound();
    // Three endless sorts at once, each on its thread, while a fourth
    // thread runs modest sorts: each sort is stopped at its own bound,
    // and the modest ones all run, whatever the others hold.
    let start = Arc::new(Barrier::new(4));
    let hogs: Vec<_> = (0..3)
        .map(|i| {
            let start = start.clone();
            std::thread::spawn(move || {
                let mut db = open(&format!("hog-{i}"));
                start.wait();
                (0..3)
                    .map(|_| match db.exec(ENDLESS_SORT, &[]) {
                        Err(ActorStoreError::OverMemory(over)) => over.limit,
                        other => panic!("an endless sort ended {other:?}"),
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut bystander = open("threads-bystander");
    start.wait();
    for _ in 0..20 {
        let sorted = bystander.exec(MODEST_SORT, &[]).unwrap();
        assert_eq!(sorted.rows[0][0], weir_store::sql::Value::Integer(5000));
    }
    for hog in hogs {
        assert_eq!(hog.join().unwrap(), vec![STATEMENT_BYTES; 3]);
    }
}
