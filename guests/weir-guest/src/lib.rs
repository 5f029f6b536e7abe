//! Typed access to Weir's host interfaces for Rust guests — `weir:sql` and
//! `wasi:keyvalue` — so a guest needs no hand-written bindings.
//!
//! ```ignore
//! use weir_guest::sql::{self, stmt};
//! let results = sql::batch("links", &[
//!     stmt("INSERT INTO links (code, url) VALUES (?1, ?2)", ["abc".into(), url.into()]),
//!     stmt("SELECT count(*) FROM links", []),
//! ])?;
//! ```

mod bindings {
    wit_bindgen::generate!({
        path: "../../wit/weir-sql",
        world: "weir:sql/imports",
    });
}

mod kv_bindings {
    wit_bindgen::generate!({
        path: "../../wit/deps/keyvalue",
        world: "wasi:keyvalue/imports",
    });
}

/// `wasi:keyvalue` (0.2.0-draft): stores declared in `weir.toml`
/// (`[keyvalue] stores = [...]`).
pub mod keyvalue {
    pub use crate::kv_bindings::wasi::keyvalue::{atomics, batch, store};
}

/// `weir:sql/batch`: statements run in one transaction against a database
/// declared in `weir.toml` (`[sql] databases = [...]`).
pub mod sql {
    pub use crate::bindings::weir::sql::batch::{
        Error, Statement, StatementError, StatementResult, Value,
    };

    /// Most statements a batch may hold.
    pub const MAX_BATCH_STATEMENTS: usize = 128;
    /// Most parameters a statement may take.
    pub const MAX_STATEMENT_PARAMS: usize = 100;

    /// Runs `statements` in order in one transaction: all take effect or
    /// none does.
    pub fn batch(database: &str, statements: &[Statement]) -> Result<Vec<StatementResult>, Error> {
        crate::bindings::weir::sql::batch::run(database, statements)
    }

    /// A statement with positional parameters.
    pub fn stmt(sql: &str, params: impl IntoIterator<Item = Value>) -> Statement {
        Statement {
            sql: sql.to_string(),
            params: params.into_iter().collect(),
        }
    }

    impl From<i64> for Value {
        fn from(v: i64) -> Self {
            Value::Integer(v)
        }
    }

    impl From<f64> for Value {
        fn from(v: f64) -> Self {
            Value::Real(v)
        }
    }

    impl From<&str> for Value {
        fn from(v: &str) -> Self {
            Value::Text(v.to_string())
        }
    }

    impl From<String> for Value {
        fn from(v: String) -> Self {
            Value::Text(v)
        }
    }

    impl From<Vec<u8>> for Value {
        fn from(v: Vec<u8>) -> Self {
            Value::Blob(v)
        }
    }

    impl<T: Into<Value>> From<Option<T>> for Value {
        fn from(v: Option<T>) -> Self {
            v.map_or(Value::Null, Into::into)
        }
    }

    impl Value {
        pub fn as_i64(&self) -> Option<i64> {
            match self {
                Value::Integer(i) => Some(*i),
                _ => None,
            }
        }

        pub fn as_str(&self) -> Option<&str> {
            match self {
                Value::Text(t) => Some(t),
                _ => None,
            }
        }
    }
}
