//! A key-value call as data: what `wasi:keyvalue` asks of a store, so the
//! same call runs here or, in cluster mode, on the node that owns the store.
//!
//! Invariant owned here: [`KvStore::apply`] is the one way an operation
//! reaches a store's methods, whichever node it came from, so a call runs
//! the same checks and limits wherever it runs.

use crate::statement_bounds::StopCheck;
use crate::{Entry, KeyPage, KvStore, StoreError};

/// One key-value call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvOp {
    Get(String),
    Set(String, Vec<u8>),
    Delete(String),
    Exists(String),
    ListKeys(Option<u64>),
    Increment(String, u64),
    GetMany(Vec<String>),
    SetMany(Vec<Entry>),
    DeleteMany(Vec<String>),
}

/// What a key-value call answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvAnswer {
    Value(Option<Vec<u8>>),
    Done,
    Exists(bool),
    Keys(KeyPage),
    Count(u64),
    Entries(Vec<Option<Entry>>),
}

impl KvOp {
    /// True when the call may write (and so commit).
    pub fn writes(&self) -> bool {
        matches!(
            self,
            KvOp::Set(..)
                | KvOp::Delete(_)
                | KvOp::Increment(..)
                | KvOp::SetMany(_)
                | KvOp::DeleteMany(_)
        )
    }
}

impl KvStore {
    /// Runs one call. A listing stops when `stop` says so; what a batch
    /// read hands back is at most `max_result_bytes`.
    pub fn apply(
        &self,
        op: KvOp,
        stop: Option<StopCheck>,
        max_result_bytes: usize,
    ) -> Result<KvAnswer, StoreError> {
        Ok(match op {
            KvOp::Get(key) => KvAnswer::Value(self.get(&key)?),
            KvOp::Set(key, value) => {
                self.set(&key, &value)?;
                KvAnswer::Done
            }
            KvOp::Delete(key) => {
                self.delete(&key)?;
                KvAnswer::Done
            }
            KvOp::Exists(key) => KvAnswer::Exists(self.exists(&key)?),
            KvOp::ListKeys(cursor) => KvAnswer::Keys(self.list_keys(cursor, stop)?),
            KvOp::Increment(key, delta) => KvAnswer::Count(self.increment(&key, delta)?),
            KvOp::GetMany(keys) => KvAnswer::Entries(self.get_many(&keys, max_result_bytes)?),
            KvOp::SetMany(pairs) => {
                self.set_many(&pairs)?;
                KvAnswer::Done
            }
            KvOp::DeleteMany(keys) => {
                self.delete_many(&keys)?;
                KvAnswer::Done
            }
        })
    }
}
