//! `wasi:keyvalue` (0.2.0-draft: store, atomics, batch) for guests, backed
//! by the app's declared SQLite stores.
//!
//! Invariants owned here:
//! - `open` of a store that was not declared fails with `no-such-store`;
//!   it never creates an empty store;
//! - every call is an operation of the event's scope: refused once the
//!   scope is full or closed (a guest that kept a bucket handle past its
//!   event cannot write with it in the next one without a new event scope);
//! - a write that returned `ok` to the guest is committed (see `weir-store`);
//! - a write from an actor's turn is a commit point of the turn: the
//!   turn's writes before it are made durable first
//!   ([`crate::extension::pass_gate`]).
//!
//! Calls run on the SQL pool, never on an async worker: a value may be
//! 32 MiB, a page of keys may scan far into a large store, and with
//! `durability = "fsync"` each write waits for its fsync. Every call stops
//! at the event's deadline or abandonment, and a batch read hands back at
//! most `max_sql_result_bytes`.

use std::sync::Arc;

use wasmtime::component::{HasData, Linker, Resource, ResourceTable, ResourceTableError};
use weir_store::kv_op::{KvAnswer, KvOp};
use weir_store::{KvStore, KvStores, StoreError};

use crate::extension::{StoreCall, StoreRouter};

use crate::scope::EventScope;
use crate::sql_pool::SqlPool;

mod generated {
    wasmtime::component::bindgen!({
        path: "../../wit/deps/keyvalue",
        world: "wasi:keyvalue/imports",
        imports: { default: async | trappable },
        with: {
            "wasi:keyvalue/store.bucket": super::Bucket,
        },
        trappable_error_type: {
            "wasi:keyvalue/store.error" => super::KvError,
        },
    });
}

use generated::wasi::keyvalue;

/// A guest's open bucket: one declared store, open here or (cluster
/// mode) reached through the app's store router.
pub struct Bucket {
    name: String,
    store: Option<Arc<KvStore>>,
}

/// An error on its way to the guest.
pub enum KvError {
    NoSuchStore,
    Other(String),
}

impl From<ResourceTableError> for KvError {
    fn from(err: ResourceTableError) -> Self {
        KvError::Other(err.to_string())
    }
}

impl From<StoreError> for KvError {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::NoSuchStore(_) => KvError::NoSuchStore,
            other => KvError::Other(other.to_string()),
        }
    }
}

/// What the key-value host functions see of a generation.
pub struct KeyValueView<'a> {
    pub table: &'a mut ResourceTable,
    pub stores: &'a KvStores,
    pub router: Option<&'a Arc<dyn StoreRouter>>,
    pub scope: Option<&'a Arc<EventScope>>,
    /// The generation's output gate (an actor's turn), passed before a write.
    pub gate: Option<&'a Arc<dyn crate::extension::OutputGate>>,
    pub pool: &'a Arc<SqlPool>,
    pub max_result_bytes: usize,
}

/// The answer a call should have had, when it had another.
fn unexpected(answer: KvAnswer) -> KvError {
    KvError::Other(format!("internal: an unexpected answer {answer:?}"))
}

impl KeyValueView<'_> {
    /// Runs one call as an operation of the event's scope, stopped at the
    /// event's deadline or abandonment: on the SQL pool when the store is
    /// open here, else where the app's router sends it.
    async fn operation(
        &mut self,
        bucket: &Resource<Bucket>,
        op: KvOp,
    ) -> Result<KvAnswer, KvError> {
        let (registered, call) = match self.scope {
            Some(scope) => (
                scope
                    .register()
                    .map_err(|e| KvError::Other(e.to_string()))?,
                StoreCall {
                    stop: Some(scope.stop_check()),
                    deadline: scope.deadline(),
                    max_result_bytes: self.max_result_bytes,
                },
            ),
            None => return Err(KvError::Other("event_scope_closed".into())),
        };
        // A write waits for the writes its actor's turn made before it.
        if op.writes() {
            crate::extension::pass_gate(self.gate)
                .await
                .map_err(|why| KvError::Other(format!("output_gate_refused: {why}")))?;
        }
        let bucket = self.table.get(bucket)?;
        match (&bucket.store, self.router) {
            (Some(store), _) => {
                let store = store.clone();
                self.pool
                    .run(move || {
                        let _op = registered;
                        store.apply(op, call.stop, call.max_result_bytes)
                    })
                    .await
                    .map_err(|e| KvError::Other(e.to_string()))?
                    .map_err(KvError::from)
            }
            (None, Some(router)) => {
                let answer = router.kv(bucket.name.clone(), op, call).await;
                drop(registered);
                answer.map_err(KvError::from)
            }
            (None, None) => Err(KvError::NoSuchStore),
        }
    }
}

impl keyvalue::store::Host for KeyValueView<'_> {
    async fn open(&mut self, identifier: String) -> Result<Resource<Bucket>, KvError> {
        let store = match self.router {
            Some(router) if router.has_store(&identifier) => None,
            Some(_) => return Err(KvError::NoSuchStore),
            None => Some(self.stores.get(&identifier)?),
        };
        Ok(self.table.push(Bucket {
            name: identifier,
            store,
        })?)
    }

    fn convert_error(&mut self, err: KvError) -> wasmtime::Result<keyvalue::store::Error> {
        Ok(match err {
            KvError::NoSuchStore => keyvalue::store::Error::NoSuchStore,
            KvError::Other(e) => keyvalue::store::Error::Other(e),
        })
    }
}

impl keyvalue::store::HostBucket for KeyValueView<'_> {
    async fn get(
        &mut self,
        bucket: Resource<Bucket>,
        key: String,
    ) -> Result<Option<Vec<u8>>, KvError> {
        match self.operation(&bucket, KvOp::Get(key)).await? {
            KvAnswer::Value(v) => Ok(v),
            other => Err(unexpected(other)),
        }
    }

    async fn set(
        &mut self,
        bucket: Resource<Bucket>,
        key: String,
        value: Vec<u8>,
    ) -> Result<(), KvError> {
        self.operation(&bucket, KvOp::Set(key, value))
            .await
            .map(drop)
    }

    async fn delete(&mut self, bucket: Resource<Bucket>, key: String) -> Result<(), KvError> {
        self.operation(&bucket, KvOp::Delete(key)).await.map(drop)
    }

    async fn exists(&mut self, bucket: Resource<Bucket>, key: String) -> Result<bool, KvError> {
        match self.operation(&bucket, KvOp::Exists(key)).await? {
            KvAnswer::Exists(b) => Ok(b),
            other => Err(unexpected(other)),
        }
    }

    async fn list_keys(
        &mut self,
        bucket: Resource<Bucket>,
        cursor: Option<u64>,
    ) -> Result<keyvalue::store::KeyResponse, KvError> {
        // A page far into a large store scans every key before it: the
        // scan stops at the event's deadline.
        match self.operation(&bucket, KvOp::ListKeys(cursor)).await? {
            KvAnswer::Keys(page) => Ok(keyvalue::store::KeyResponse {
                keys: page.keys,
                cursor: page.cursor,
            }),
            other => Err(unexpected(other)),
        }
    }

    async fn drop(&mut self, bucket: Resource<Bucket>) -> wasmtime::Result<()> {
        self.table.delete(bucket)?;
        Ok(())
    }
}

impl keyvalue::atomics::Host for KeyValueView<'_> {
    async fn increment(
        &mut self,
        bucket: Resource<Bucket>,
        key: String,
        delta: u64,
    ) -> Result<u64, KvError> {
        match self.operation(&bucket, KvOp::Increment(key, delta)).await? {
            KvAnswer::Count(n) => Ok(n),
            other => Err(unexpected(other)),
        }
    }
}

impl keyvalue::batch::Host for KeyValueView<'_> {
    async fn get_many(
        &mut self,
        bucket: Resource<Bucket>,
        keys: Vec<String>,
    ) -> Result<Vec<Option<weir_store::Entry>>, KvError> {
        match self.operation(&bucket, KvOp::GetMany(keys)).await? {
            KvAnswer::Entries(entries) => Ok(entries),
            other => Err(unexpected(other)),
        }
    }

    async fn set_many(
        &mut self,
        bucket: Resource<Bucket>,
        key_values: Vec<(String, Vec<u8>)>,
    ) -> Result<(), KvError> {
        self.operation(&bucket, KvOp::SetMany(key_values))
            .await
            .map(drop)
    }

    async fn delete_many(
        &mut self,
        bucket: Resource<Bucket>,
        keys: Vec<String>,
    ) -> Result<(), KvError> {
        self.operation(&bucket, KvOp::DeleteMany(keys))
            .await
            .map(drop)
    }
}

struct HasKeyValue;

impl HasData for HasKeyValue {
    type Data<'a> = KeyValueView<'a>;
}

/// Adds `wasi:keyvalue` to a linker.
pub fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    view: fn(&mut T) -> KeyValueView<'_>,
) -> wasmtime::Result<()> {
    keyvalue::store::add_to_linker::<_, HasKeyValue>(linker, view)?;
    keyvalue::atomics::add_to_linker::<_, HasKeyValue>(linker, view)?;
    keyvalue::batch::add_to_linker::<_, HasKeyValue>(linker, view)?;
    Ok(())
}
