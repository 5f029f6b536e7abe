//! `wasi:keyvalue` (0.2.0-draft: store, atomics, batch) for guests, backed
//! by the app's declared SQLite stores.
//!
//! Invariants owned here:
//! - `open` of a store that was not declared fails with `no-such-store`;
//!   it never creates an empty store;
//! - every call is an operation of the event's scope: refused once the
//!   scope is full or closed (a guest that kept a bucket handle past its
//!   event cannot write with it in the next one without a new event scope);
//! - a write that returned `ok` to the guest is committed (see `weir-store`).
//!
//! Calls run on the SQL pool, never on an async worker: a value may be
//! 32 MiB, a page of keys may scan far into a large store, and with
//! `durability = "fsync"` each write waits for its fsync. Every call stops
//! at the event's deadline or abandonment, and a batch read hands back at
//! most `max_sql_result_bytes`.

use std::sync::Arc;

use wasmtime::component::{HasData, Linker, Resource, ResourceTable, ResourceTableError};
use weir_store::{KvStore, KvStores, StoreError};

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

/// A guest's open bucket: one declared store.
pub struct Bucket {
    store: Arc<KvStore>,
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
    pub scope: Option<&'a Arc<EventScope>>,
    pub pool: &'a Arc<SqlPool>,
    pub max_result_bytes: usize,
}

impl KeyValueView<'_> {
    /// Runs one storage call on the SQL pool as an operation of the
    /// event's scope, stopped at the event's deadline or abandonment.
    async fn operation<T: Send + 'static>(
        &mut self,
        bucket: &Resource<Bucket>,
        f: impl FnOnce(&KvStore) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, KvError> {
        let op = match self.scope {
            Some(scope) => scope
                .register()
                .map_err(|e| KvError::Other(e.to_string()))?,
            None => return Err(KvError::Other("event_scope_closed".into())),
        };
        let store = self.table.get(bucket)?.store.clone();
        self.pool
            .run(move || {
                let _op = op;
                f(&store)
            })
            .await
            .map_err(|e| KvError::Other(e.to_string()))?
            .map_err(KvError::from)
    }
}

impl keyvalue::store::Host for KeyValueView<'_> {
    async fn open(&mut self, identifier: String) -> Result<Resource<Bucket>, KvError> {
        let store = self.stores.get(&identifier)?;
        Ok(self.table.push(Bucket { store })?)
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
        self.operation(&bucket, move |s| s.get(&key)).await
    }

    async fn set(
        &mut self,
        bucket: Resource<Bucket>,
        key: String,
        value: Vec<u8>,
    ) -> Result<(), KvError> {
        self.operation(&bucket, move |s| s.set(&key, &value)).await
    }

    async fn delete(&mut self, bucket: Resource<Bucket>, key: String) -> Result<(), KvError> {
        self.operation(&bucket, move |s| s.delete(&key)).await
    }

    async fn exists(&mut self, bucket: Resource<Bucket>, key: String) -> Result<bool, KvError> {
        self.operation(&bucket, move |s| s.exists(&key)).await
    }

    async fn list_keys(
        &mut self,
        bucket: Resource<Bucket>,
        cursor: Option<u64>,
    ) -> Result<keyvalue::store::KeyResponse, KvError> {
        // A page far into a large store scans every key before it: the
        // scan stops at the event's deadline.
        let stop = self.scope.map(|s| s.stop_check());
        let page = self
            .operation(&bucket, move |s| s.list_keys(cursor, stop))
            .await?;
        Ok(keyvalue::store::KeyResponse {
            keys: page.keys,
            cursor: page.cursor,
        })
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
        self.operation(&bucket, move |s| s.increment(&key, delta))
            .await
    }
}

impl keyvalue::batch::Host for KeyValueView<'_> {
    async fn get_many(
        &mut self,
        bucket: Resource<Bucket>,
        keys: Vec<String>,
    ) -> Result<Vec<Option<weir_store::Entry>>, KvError> {
        let max = self.max_result_bytes;
        self.operation(&bucket, move |s| s.get_many(&keys, max))
            .await
    }

    async fn set_many(
        &mut self,
        bucket: Resource<Bucket>,
        key_values: Vec<(String, Vec<u8>)>,
    ) -> Result<(), KvError> {
        self.operation(&bucket, move |s| s.set_many(&key_values))
            .await
    }

    async fn delete_many(
        &mut self,
        bucket: Resource<Bucket>,
        keys: Vec<String>,
    ) -> Result<(), KvError> {
        self.operation(&bucket, move |s| s.delete_many(&keys)).await
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
