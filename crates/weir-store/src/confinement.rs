//! SQL confinement: what a guest's SQL may name and do, and what its
//! connection may write.
//!
//! Invariants owned here, for every connection a guest's SQL reaches
//! (`weir:sql` databases and actor databases):
//! - a guest's statement touches only the database it was given: no
//!   `ATTACH`, `DETACH`, `VACUUM` (its `INTO` writes a file anywhere),
//!   extension loading, pragma that writes or names a file, transaction
//!   control (`BEGIN`, `COMMIT`, `ROLLBACK`, `SAVEPOINT`, `RELEASE`: the
//!   host owns the transaction), temporary schema objects, virtual tables
//!   other than the full-text and R-tree modules, and — where the
//!   database has them — no reserved table, directly or through a trigger
//!   or a view. SQLite itself enforces this when the statement is
//!   prepared (the authorizer, [`Confinement`]), backed by its own
//!   switches ([`harden`]: defensive mode, no attached databases, an
//!   untrusted schema, bounded string and statement lengths);
//! - the same rules hold inside every trigger and view a guest created,
//!   also when they fire inside a statement the host runs itself;
//! - a statement writes no file but its database: what SQLite would spill
//!   to temporary files (sorts, `DISTINCT`, `UNION`, recursive queues,
//!   statement journals) is held in SQLite's heap ([`harden`]), which the
//!   process bounds ([`crate::statement_bounds::bound_sqlite_heap`]); a
//!   temporary file is bounded by nothing but the disk, and one sort under
//!   a streaming response's deadline wrote 2 GB of them in 20 s
//!   (bench/RESULTS.md).
//!
//! How long a statement may run and how much it may hand back is
//! [`crate::statement_bounds`]'s.
//!
//! Every refusal names what was refused.

use std::sync::{Arc, Mutex};

use rusqlite::Connection;
use rusqlite::hooks::{AuthAction, AuthContext, Authorization, TransactionOperation};
use rusqlite::limits::Limit;

/// Longest SQL text of one statement a guest may send: far beyond any
/// real statement, and a bound on what the parser must hold.
pub const MAX_SQL_TEXT_BYTES: i32 = 1 << 20;

/// Virtual-table modules a guest may create: full-text search and R-trees
/// keep their data in ordinary tables of the same database.
pub const ALLOWED_VTABLE_MODULES: &[&str] = &["fts3", "fts4", "fts5", "rtree", "rtree_i32"];

/// Pragmas a guest may run, read-only: schema introspection and checks.
/// A pragma with an argument is allowed only for those that take a table
/// or index name; every other pragma (any that writes a setting or names
/// a file) is refused.
pub const INTROSPECTION_PRAGMAS: &[&str] = &[
    "table_info",
    "table_xinfo",
    "table_list",
    "index_list",
    "index_info",
    "index_xinfo",
    "foreign_key_list",
    "foreign_key_check",
    "integrity_check",
    "quick_check",
];

/// Settings a guest may read (never write) with a bare `PRAGMA name`.
pub const READABLE_PRAGMAS: &[&str] = &[
    "foreign_keys",
    "user_version",
    "schema_version",
    "application_id",
    "page_count",
    "page_size",
    "freelist_count",
    "encoding",
    "data_version",
    "collation_list",
    "compile_options",
];

/// SQL functions a guest may not call.
pub const DENIED_FUNCTIONS: &[&str] = &["load_extension", "fts3_tokenizer"];

/// Switches every guest-facing connection gets when it is opened: SQLite's
/// own defences, under the authorizer's rules.
pub fn harden(conn: &Connection, max_value_bytes: usize) -> rusqlite::Result<()> {
    use rusqlite::config::DbConfig;
    // No writes to the schema table, shadow tables or raw pages, whatever
    // pragma or function is tried.
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_DEFENSIVE, true)?;
    // Functions with side effects never run from inside the schema
    // (views, triggers, defaults, generated columns).
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_TRUSTED_SCHEMA, false)?;
    // No attached database at all: ATTACH and VACUUM INTO (which attaches
    // its target) fail even if the authorizer were bypassed.
    conn.set_limit(Limit::SQLITE_LIMIT_ATTACHED, 0)?;
    let length = i32::try_from(max_value_bytes).unwrap_or(i32::MAX);
    conn.set_limit(Limit::SQLITE_LIMIT_LENGTH, length)?;
    conn.set_limit(Limit::SQLITE_LIMIT_SQL_LENGTH, MAX_SQL_TEXT_BYTES)?;
    // Temporary tables, indices, sorts and statement journals in memory,
    // under the process's heap bound, never in the temp directory.
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    Ok(())
}

/// Whose statement is being prepared now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Author {
    /// Weir's own statement: allowed, except what it reaches through a
    /// guest's trigger or view, which follows the guest's rules.
    Host,
    /// A guest's statement: the guest's rules.
    Guest,
}

/// The authorizer of one connection and the reason of its last refusal.
#[derive(Clone)]
pub struct Confinement {
    state: Arc<Mutex<ConfinementState>>,
}

struct ConfinementState {
    author: Author,
    /// Names starting with this (any case) are the host's tables.
    reserved_prefix: Option<&'static str>,
    refused: Option<String>,
}

impl Confinement {
    /// Installs the authorizer on `conn`. Statements are the host's until
    /// [`Confinement::as_guest`] says otherwise.
    pub fn install(conn: &Connection, reserved_prefix: Option<&'static str>) -> Confinement {
        let confinement = Confinement {
            state: Arc::new(Mutex::new(ConfinementState {
                author: Author::Host,
                reserved_prefix,
                refused: None,
            })),
        };
        let state = confinement.state.clone();
        conn.authorizer(Some(move |ctx: AuthContext<'_>| {
            let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
            let host_level = s.author == Author::Host && ctx.accessor.is_none();
            if host_level {
                return Authorization::Allow;
            }
            match guest_rule(&ctx, s.reserved_prefix) {
                Ok(()) => Authorization::Allow,
                Err(why) => {
                    s.refused = Some(why);
                    Authorization::Deny
                }
            }
        }));
        confinement
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ConfinementState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` with every statement it prepares (or SQLite re-prepares)
    /// judged as the guest's.
    pub fn as_guest<T>(&self, f: impl FnOnce() -> T) -> T {
        {
            let mut s = self.lock();
            s.author = Author::Guest;
            s.refused = None;
        }
        let out = f();
        self.lock().author = Author::Host;
        out
    }

    /// Why the last statement was refused, if the error says it was: the
    /// authorizer's reason, or SQLite's own refusal of `VACUUM` (inside
    /// the host's transaction) and of attaching (the limit is 0).
    pub fn refusal(&self, error: &rusqlite::Error) -> Option<String> {
        let (f, message) = match error {
            rusqlite::Error::SqliteFailure(f, message) => {
                (f, message.as_deref().unwrap_or_default())
            }
            rusqlite::Error::SqlInputError { error, msg, .. } => (error, msg.as_str()),
            _ => return None,
        };
        // A denied function fails with a plain error, not SQLITE_AUTH.
        if f.code == rusqlite::ErrorCode::AuthorizationForStatementDenied
            || message.starts_with("not authorized")
        {
            return Some(
                self.lock()
                    .refused
                    .take()
                    .unwrap_or_else(|| "not authorized".to_string()),
            );
        }
        if message.contains("cannot VACUUM") {
            return Some("VACUUM is not allowed".to_string());
        }
        if message.contains("too many attached databases") {
            return Some("ATTACH is not allowed (VACUUM INTO attaches its target)".to_string());
        }
        None
    }
}

fn reserved(name: &str, prefix: Option<&str>) -> bool {
    prefix.is_some_and(|p| name.len() >= p.len() && name[..p.len()].eq_ignore_ascii_case(p))
}

fn transaction_word(op: TransactionOperation) -> &'static str {
    match op {
        TransactionOperation::Begin => "BEGIN",
        TransactionOperation::Release => "RELEASE",
        TransactionOperation::Rollback => "ROLLBACK",
        _ => "COMMIT",
    }
}

/// The guest's rules: `Err` names what is refused.
pub fn guest_rule(ctx: &AuthContext<'_>, reserved_prefix: Option<&str>) -> Result<(), String> {
    let table = |name: &str| -> Result<(), String> {
        if reserved(name, reserved_prefix) {
            Err(format!("table `{name}` is reserved for Weir"))
        } else {
            Ok(())
        }
    };
    match ctx.action {
        AuthAction::Select | AuthAction::Recursive => Ok(()),
        AuthAction::Read { table_name, .. }
        | AuthAction::Insert { table_name }
        | AuthAction::Update { table_name, .. }
        | AuthAction::Delete { table_name }
        | AuthAction::CreateTable { table_name }
        | AuthAction::DropTable { table_name }
        | AuthAction::CreateIndex { table_name, .. }
        | AuthAction::DropIndex { table_name, .. }
        | AuthAction::CreateTrigger { table_name, .. }
        | AuthAction::DropTrigger { table_name, .. }
        | AuthAction::AlterTable { table_name, .. }
        | AuthAction::Analyze { table_name } => table(table_name),
        AuthAction::CreateView { view_name } | AuthAction::DropView { view_name } => {
            table(view_name)
        }
        AuthAction::Reindex { index_name } => table(index_name),
        AuthAction::CreateTempTable { .. }
        | AuthAction::CreateTempIndex { .. }
        | AuthAction::CreateTempTrigger { .. }
        | AuthAction::CreateTempView { .. }
        | AuthAction::DropTempTable { .. }
        | AuthAction::DropTempIndex { .. }
        | AuthAction::DropTempTrigger { .. }
        | AuthAction::DropTempView { .. } => {
            Err("temporary tables, views, indexes and triggers are not allowed".to_string())
        }
        AuthAction::CreateVtable {
            table_name,
            module_name,
        } => {
            table(table_name)?;
            if ALLOWED_VTABLE_MODULES
                .iter()
                .any(|m| m.eq_ignore_ascii_case(module_name))
            {
                Ok(())
            } else {
                Err(format!(
                    "virtual table module `{module_name}` is not allowed"
                ))
            }
        }
        AuthAction::DropVtable { table_name, .. } => table(table_name),
        AuthAction::Attach { .. } => Err("ATTACH is not allowed".to_string()),
        AuthAction::Detach { .. } => Err("DETACH is not allowed".to_string()),
        AuthAction::Transaction { operation } => Err(format!(
            "{} is not allowed: Weir owns the transaction",
            transaction_word(operation)
        )),
        AuthAction::Savepoint { operation, .. } => Err(format!(
            "{} is not allowed: Weir owns the transaction",
            match operation {
                TransactionOperation::Release => "RELEASE",
                TransactionOperation::Rollback => "ROLLBACK TO",
                _ => "SAVEPOINT",
            }
        )),
        AuthAction::Function { function_name } => {
            if DENIED_FUNCTIONS
                .iter()
                .any(|f| f.eq_ignore_ascii_case(function_name))
            {
                Err(format!("function `{function_name}` is not allowed"))
            } else {
                Ok(())
            }
        }
        AuthAction::Pragma {
            pragma_name,
            pragma_value,
        } => {
            let name = pragma_name.to_ascii_lowercase();
            let introspects = INTROSPECTION_PRAGMAS.contains(&name.as_str());
            let reads = READABLE_PRAGMAS.contains(&name.as_str());
            match pragma_value {
                None if introspects || reads => Ok(()),
                Some(arg) if introspects => table(arg.trim_matches(['\'', '"', '`'])),
                _ => Err(format!("PRAGMA {pragma_name} is not allowed")),
            }
        }
        _ => Err("this statement is not allowed".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hardened_connection_keeps_its_temporary_storage_in_memory_and_a_guest_cannot_move_it() {
        let (conn, c) = conn(None);
        let mode = |conn: &Connection| -> i64 {
            conn.query_row("PRAGMA temp_store", [], |r| r.get(0))
                .unwrap()
        };
        assert_eq!(mode(&conn), 2, "2 is MEMORY");
        for sql in [
            "PRAGMA temp_store = FILE",
            "PRAGMA temp_store = 1",
            "PRAGMA temp_store",
        ] {
            assert!(guest(&conn, &c, sql).is_err(), "{sql}");
        }
        assert_eq!(mode(&conn), 2);
    }

    fn conn(prefix: Option<&'static str>) -> (Connection, Confinement) {
        let conn = Connection::open_in_memory().unwrap();
        harden(&conn, 1 << 20).unwrap();
        let c = Confinement::install(&conn, prefix);
        conn.execute_batch("CREATE TABLE _weir_kv (k, v); CREATE TABLE t (a)")
            .unwrap();
        (conn, c)
    }

    fn guest(conn: &Connection, c: &Confinement, sql: &str) -> Result<(), String> {
        c.as_guest(|| match conn.prepare(sql) {
            Ok(mut stmt) => {
                let mut rows = stmt.raw_query();
                loop {
                    match rows.next() {
                        Ok(Some(_)) => {}
                        Ok(None) => return Ok(()),
                        Err(e) => {
                            return Err(c
                                .refusal(&e)
                                .map(|r| format!("refused: {r}"))
                                .unwrap_or(e.to_string()));
                        }
                    }
                }
            }
            Err(e) => Err(c
                .refusal(&e)
                .map(|r| format!("refused: {r}"))
                .unwrap_or(e.to_string())),
        })
    }

    #[test]
    fn escapes_are_refused_and_named() {
        let (conn, c) = conn(Some("_weir_"));
        for (sql, named) in [
            ("ATTACH DATABASE ':memory:' AS x", "ATTACH"),
            ("DETACH DATABASE main", "DETACH"),
            ("PRAGMA journal_mode = DELETE", "PRAGMA journal_mode"),
            (
                "PRAGMA temp_store_directory = '/tmp'",
                "PRAGMA temp_store_directory",
            ),
            ("BEGIN", "BEGIN"),
            ("COMMIT", "COMMIT"),
            ("SAVEPOINT s", "SAVEPOINT"),
            ("SELECT load_extension('x')", "load_extension"),
            ("CREATE TEMP TABLE x (a)", "temporary"),
            (
                "CREATE TEMP TRIGGER x AFTER INSERT ON t BEGIN SELECT 1; END",
                "temporary",
            ),
            ("CREATE TEMP VIEW v AS SELECT 1", "temporary"),
            ("SELECT * FROM _weir_kv", "_weir_kv"),
            ("CREATE VIRTUAL TABLE d USING dbstat", "dbstat"),
            ("PRAGMA table_info(_weir_kv)", "_weir_kv"),
        ] {
            let err = guest(&conn, &c, sql).unwrap_err();
            assert!(err.starts_with("refused: "), "{sql}: {err}");
            assert!(err.contains(named), "{sql}: {err}");
        }
    }

    #[test]
    fn vacuum_is_refused_inside_the_host_transaction() {
        let (conn, c) = conn(None);
        conn.execute_batch("BEGIN").unwrap();
        let path = weir_scratch::dir("vacuum");
        let err = guest(&conn, &c, &format!("VACUUM INTO '{}'", path.display())).unwrap_err();
        assert!(
            err.contains("refused: VACUUM") || err.contains("refused: ATTACH"),
            "{err}"
        );
        assert!(!path.exists());
        conn.execute_batch("COMMIT").unwrap();
        // Even outside a transaction the target cannot be attached.
        let err = guest(&conn, &c, &format!("VACUUM INTO '{}'", path.display())).unwrap_err();
        assert!(err.starts_with("refused: "), "{err}");
        assert!(!path.exists());
    }

    #[test]
    fn ordinary_sql_and_introspection_run() {
        let (conn, c) = conn(Some("_weir_"));
        for sql in [
            "CREATE TABLE u (id INTEGER PRIMARY KEY, name TEXT)",
            "CREATE INDEX u_name ON u (name)",
            "INSERT INTO u (name) VALUES ('ada')",
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x < 10) SELECT * FROM c",
            "PRAGMA table_info(u)",
            "PRAGMA foreign_keys",
            "PRAGMA user_version",
            "CREATE VIRTUAL TABLE docs USING fts5(body)",
            "CREATE VIEW names AS SELECT name FROM u",
            "SELECT * FROM names",
            "CREATE TRIGGER u_audit AFTER INSERT ON u BEGIN UPDATE u SET name = name; END",
            "DROP TRIGGER u_audit",
        ] {
            guest(&conn, &c, sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
    }

    #[test]
    fn guest_triggers_and_views_follow_the_guest_rules_inside_host_statements() {
        let (conn, c) = conn(Some("_weir_"));
        // A view over a reserved table can be created (SQLite reads its
        // columns without asking), but never read.
        guest(&conn, &c, "CREATE VIEW peek AS SELECT * FROM _weir_kv").unwrap();
        let err = guest(&conn, &c, "SELECT * FROM peek").unwrap_err();
        assert!(err.contains("_weir_kv"), "{err}");
        // A trigger that reaches a reserved table makes every statement
        // that would fire it fail to prepare, the host's included.
        guest(
            &conn,
            &c,
            "CREATE TRIGGER wipe AFTER INSERT ON t BEGIN DELETE FROM _weir_kv; END",
        )
        .unwrap();
        let err = guest(&conn, &c, "INSERT INTO t VALUES (1)").unwrap_err();
        assert!(err.contains("_weir_kv"), "{err}");
        conn.execute("INSERT INTO _weir_kv VALUES ('k', 'v')", [])
            .unwrap();
        let host = conn.execute("INSERT INTO t VALUES (2)", []);
        assert!(
            host.is_err(),
            "the host's own statement fired a guest trigger"
        );
        let kept: i64 = conn
            .query_row("SELECT count(*) FROM _weir_kv", [], |r| r.get(0))
            .unwrap();
        assert_eq!(kept, 1);
    }

    #[test]
    fn values_over_the_length_limit_fail() {
        let (conn, _) = conn(None);
        let err = conn
            .query_row("SELECT zeroblob(2000000)", [], |r| r.get::<_, Vec<u8>>(0))
            .unwrap_err();
        assert!(err.to_string().contains("too big"), "{err}");
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn table() -> impl Strategy<Value = String> {
            prop_oneof![
                Just("_weir_kv".to_string()),
                Just("_WEIR_kv".to_string()),
                Just("t".to_string()),
                Just("sqlite_master".to_string()),
                "[a-z]{1,4}",
            ]
        }

        /// Statements a hostile guest might try, built from the escapes
        /// SQLite offers and the names that matter, plus noise.
        fn statement() -> impl Strategy<Value = String> {
            let dir = "DIR".to_string();
            let pragma = proptest::sample::select(vec![
                "journal_mode",
                "writable_schema",
                "temp_store_directory",
                "foreign_keys",
                "user_version",
                "cache_size",
                "mmap_size",
                "locking_mode",
                "trusted_schema",
                "table_info",
                "integrity_check",
                "query_only",
                "synchronous",
            ]);
            prop_oneof![
                table().prop_map(|t| format!("SELECT * FROM {t}")),
                table().prop_map(|t| format!("INSERT INTO {t} VALUES ('k', 'v')")),
                table().prop_map(|t| format!("DELETE FROM {t}")),
                table().prop_map(|t| format!("DROP TABLE {t}")),
                table().prop_map(|t| format!("CREATE TABLE {t} (k, v)")),
                table().prop_map(|t| format!("CREATE TEMP TABLE {t} (k)")),
                (table(), 0..9u8)
                    .prop_map(|(t, n)| format!("CREATE VIEW v{n} AS SELECT * FROM {t}")),
                (0..9u8).prop_map(|n| format!("SELECT * FROM v{n}")),
                (table(), table(), 0..9u8).prop_map(|(a, b, n)| format!(
                    "CREATE TRIGGER r{n} AFTER INSERT ON {a} BEGIN DELETE FROM {b}; END"
                )),
                (table(), 0..9u8).prop_map(|(a, n)| format!(
                    "CREATE TEMP TRIGGER q{n} AFTER INSERT ON {a} BEGIN SELECT 1; END"
                )),
                (0..9u8).prop_map({
                    let dir = dir.clone();
                    move |n| format!("ATTACH DATABASE '{dir}/a{n}' AS a{n}")
                }),
                (0..9u8).prop_map({
                    let dir = dir.clone();
                    move |n| format!("VACUUM INTO '{dir}/v{n}'")
                }),
                Just("VACUUM".to_string()),
                proptest::sample::select(vec![
                    "BEGIN",
                    "COMMIT",
                    "ROLLBACK",
                    "END",
                    "SAVEPOINT s",
                    "RELEASE s",
                    "ROLLBACK TO s"
                ])
                .prop_map(String::from),
                (pragma, "[a-z0-9_']{0,8}").prop_map(|(p, v)| if v.is_empty() {
                    format!("PRAGMA {p}")
                } else {
                    format!("PRAGMA {p} = {v}")
                }),
                Just(format!("SELECT load_extension('{dir}/lib')")),
                ".{0,40}",
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            /// Whatever a guest runs, inside the host's transaction: Weir's
            /// table keeps its row, no file appears, no database is
            /// attached, and the transaction is still the host's to end.
            #[test]
            fn no_statement_sequence_escapes(statements in proptest::collection::vec(statement(), 1..8)) {
                static CASE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
                let case = CASE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let dir = weir_scratch::dir(&format!("confine-prop-{case}"));
                std::fs::create_dir_all(&dir).unwrap();
                let dir_text = dir.display().to_string();
                let statements: Vec<String> = statements.iter().map(|s| s.replace("DIR", &dir_text)).collect();
                let path = dir.join("db.sqlite3");
                let conn = Connection::open(&path).unwrap();
                conn.pragma_update(None, "journal_mode", "WAL").unwrap();
                harden(&conn, 1 << 20).unwrap();
                let c = Confinement::install(&conn, Some("_weir_"));
                conn.execute_batch("CREATE TABLE _weir_kv (k, v); INSERT INTO _weir_kv VALUES ('kept', 1); CREATE TABLE t (k, v)").unwrap();
                conn.execute_batch("BEGIN").unwrap();
                for sql in &statements {
                    let _ = guest(&conn, &c, sql);
                    prop_assert!(!conn.is_autocommit(), "{sql} ended the host's transaction");
                }
                let attached: Vec<String> = conn
                    .prepare("SELECT name FROM pragma_database_list").unwrap()
                    .query_map([], |r| r.get(0)).unwrap()
                    .collect::<Result<_, _>>().unwrap();
                prop_assert!(attached.iter().all(|d| d == "main" || d == "temp"), "{attached:?}");
                let rows: Vec<(String, i64)> = conn
                    .prepare("SELECT k, v FROM _weir_kv").unwrap()
                    .query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap()
                    .collect::<Result<_, _>>().unwrap();
                prop_assert_eq!(rows, vec![("kept".to_string(), 1)], "{:?}", statements);
                conn.execute_batch("ROLLBACK").unwrap();
                drop(conn);
                let files: Vec<String> = std::fs::read_dir(&dir).unwrap()
                    .map(|e| e.unwrap().file_name().into_string().unwrap())
                    .filter(|f| !f.starts_with("db.sqlite3"))
                    .collect();
                prop_assert!(files.is_empty(), "files appeared: {files:?} after {statements:?}");
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
    }
}
