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
//! Calls run on the event's own thread: SQLite answers a local read or a
//! WAL commit in microseconds, less than a hand-off to another thread costs.
//! With `durability = "fsync"` each write waits for its fsync.

use std::sync::Arc;

use wasmtime::component::{HasData, Linker, Resource, ResourceTable, ResourceTableError};
use weir_store::{KvStore, KvStores, StoreError};

use crate::scope::EventScope;

mod generated {
    wasmtime::component::bindgen!({
        path: "../../wit/deps/keyvalue",
        world: "wasi:keyvalue/imports",
        imports: { default: trappable },
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
}

impl KeyValueView<'_> {
    /// Runs one storage call as an operation of the event's scope.
    fn operation<T>(
        &mut self,
        bucket: &Resource<Bucket>,
        f: impl FnOnce(&KvStore) -> Result<T, StoreError>,
    ) -> Result<T, KvError> {
        let _op = match self.scope {
            Some(scope) => scope
                .register()
                .map_err(|e| KvError::Other(e.to_string()))?,
            None => return Err(KvError::Other("event_scope_closed".into())),
        };
        let store = self.table.get(bucket)?.store.clone();
        Ok(f(&store)?)
    }
}

impl keyvalue::store::Host for KeyValueView<'_> {
    fn open(&mut self, identifier: String) -> Result<Resource<Bucket>, KvError> {
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
    fn get(&mut self, bucket: Resource<Bucket>, key: String) -> Result<Option<Vec<u8>>, KvError> {
        self.operation(&bucket, |s| s.get(&key))
    }

    fn set(
        &mut self,
        bucket: Resource<Bucket>,
        key: String,
        value: Vec<u8>,
    ) -> Result<(), KvError> {
        self.operation(&bucket, |s| s.set(&key, &value))
    }

    fn delete(&mut self, bucket: Resource<Bucket>, key: String) -> Result<(), KvError> {
        self.operation(&bucket, |s| s.delete(&key))
    }

    fn exists(&mut self, bucket: Resource<Bucket>, key: String) -> Result<bool, KvError> {
        self.operation(&bucket, |s| s.exists(&key))
    }

    fn list_keys(
        &mut self,
        bucket: Resource<Bucket>,
        cursor: Option<u64>,
    ) -> Result<keyvalue::store::KeyResponse, KvError> {
        let page = self.operation(&bucket, |s| s.list_keys(cursor))?;
        Ok(keyvalue::store::KeyResponse {
            keys: page.keys,
            cursor: page.cursor,
        })
    }

    fn drop(&mut self, bucket: Resource<Bucket>) -> wasmtime::Result<()> {
        self.table.delete(bucket)?;
        Ok(())
    }
}

impl keyvalue::atomics::Host for KeyValueView<'_> {
    fn increment(
        &mut self,
        bucket: Resource<Bucket>,
        key: String,
        delta: u64,
    ) -> Result<u64, KvError> {
        self.operation(&bucket, |s| s.increment(&key, delta))
    }
}

impl keyvalue::batch::Host for KeyValueView<'_> {
    fn get_many(
        &mut self,
        bucket: Resource<Bucket>,
        keys: Vec<String>,
    ) -> Result<Vec<Option<weir_store::Entry>>, KvError> {
        self.operation(&bucket, |s| s.get_many(&keys))
    }

    fn set_many(
        &mut self,
        bucket: Resource<Bucket>,
        key_values: Vec<(String, Vec<u8>)>,
    ) -> Result<(), KvError> {
        self.operation(&bucket, |s| s.set_many(&key_values))
    }

    fn delete_many(&mut self, bucket: Resource<Bucket>, keys: Vec<String>) -> Result<(), KvError> {
        self.operation(&bucket, |s| s.delete_many(&keys))
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
