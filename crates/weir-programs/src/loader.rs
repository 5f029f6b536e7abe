//! From a name to a program ready to run: a component file is pushed into
//! the image store, a digest is looked up in it; either way the image is
//! rooted, its bytes are verified, and its code is compiled once per
//! digest (cached beside the images) and linked as a command.
//!
//! Invariant owned here: every program runs from a rooted, verified image.
//! There is no path from a file to a run that skips the digest check, so a
//! run of a digest always runs exactly the bytes that digest names.

use std::path::Path;
use std::sync::Arc;

use wasmtime_wasi::p2::bindings::CommandPre;
use weir_runtime::code::Entry;
use weir_runtime::compiled_code::{CodeCache, Compiler};
use weir_runtime::guest_log::GuestLog;
use weir_runtime::guest_state::GenerationState;
use weir_runtime::outbound::OutboundRules;
use weir_runtime::sql_pool::SqlPool;
use weir_runtime::{AppCode, LoadError, Stores, WeirEngine};

use crate::image_store::{Digest, ImageError, ImageStore, Root};
use crate::one_shot::{Program, RunLimits};

/// Threads for the storage calls of programs. Commands are given no
/// stores today, so one thread only answers their refusals.
const PROGRAM_STORAGE_THREADS: usize = 1;

/// Why a program could not be made ready.
#[derive(Debug, thiserror::Error)]
pub enum ProgramLoadError {
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error("cannot read {path}: {cause}")]
    Read { path: String, cause: std::io::Error },
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("cannot start the programs' storage threads: {0}")]
    Pool(String),
}

/// Makes programs ready: the image store, the engine they run on and
/// their compiled code.
pub struct Loader {
    pub images: ImageStore,
    engine: WeirEngine,
    cache: CodeCache,
    limits: RunLimits,
    outbound: OutboundRules,
    stores: Stores,
}

impl Loader {
    /// A loader over `images`, compiling with `compiler` for `engine`;
    /// resident processes' output goes to `guest_log` (their app's).
    pub fn new(
        images: ImageStore,
        engine: WeirEngine,
        compiler: Compiler,
        limits: RunLimits,
        outbound: OutboundRules,
        guest_log: Option<Arc<GuestLog>>,
    ) -> Result<Loader, ProgramLoadError> {
        let cache = CodeCache::new(
            &images.compiled_dir(),
            compiler,
            limits.runtime.compile_memory_limit_bytes,
        )
        .map_err(|source| ImageError::Io {
            path: images.compiled_dir(),
            cause: source,
        })?;
        let pool = SqlPool::new(PROGRAM_STORAGE_THREADS)
            .map_err(|e| ProgramLoadError::Pool(e.to_string()))?;
        Ok(Loader {
            images,
            engine,
            cache,
            limits,
            outbound,
            stores: Stores {
                kv: Default::default(),
                sql: Default::default(),
                pool: Arc::new(pool),
                routes: Default::default(),
                // A process's filesystem counts against its owner's quota.
                interfaces: vec![Arc::new(crate::slot_filesystem::SlotFilesystem)],
                router: None,
                // Programs compute on threads of their own.
                share: None,
                guest_log,
            },
        })
    }

    pub fn limits(&self) -> &RunLimits {
        &self.limits
    }

    /// Roots what `name` names: a digest in the store, or a component file,
    /// which is pushed first (a file already stored is not written again).
    /// A digest names the store's image; only when the store has none is a
    /// file of that name taken, and then its bytes must hash to it.
    pub fn root(&self, name: &str) -> Result<Root, ProgramLoadError> {
        let named = name.parse::<Digest>().ok();
        if let Some(digest) = named {
            match self.images.root(&digest) {
                Err(ImageError::NotFound(_)) if Path::new(name).exists() => {}
                stored => return Ok(stored?),
            }
        }
        let limit = self.images_limit();
        let read = |source| ProgramLoadError::Read {
            path: name.to_string(),
            cause: source,
        };
        let size = std::fs::metadata(name).map_err(read)?.len();
        if size > limit {
            return Err(ImageError::TooLarge { bytes: size, limit }.into());
        }
        let bytes = std::fs::read(name).map_err(read)?;
        if let Some(digest) = named
            && Digest::of(&bytes) != digest
        {
            return Err(ImageError::Corrupt {
                digest,
                why: format!(
                    "the file {name} holds {} bytes that hash to {}, not to the digest it is named",
                    bytes.len(),
                    Digest::of(&bytes)
                ),
            }
            .into());
        }
        Ok(self.images.push(&bytes)?.0)
    }

    fn images_limit(&self) -> u64 {
        self.limits.programs.max_image_bytes
    }

    /// Compiles the rooted image into the code cache (or finds it there),
    /// without linking it: what a push does, so that the first spawn of an
    /// image only loads its code and does not compile it inside the
    /// spawning turn's deadline.
    pub fn prepare(&self, root: &mut Root) -> Result<(), ProgramLoadError> {
        let bytes = self.images.read(root)?;
        self.cache
            .component(&self.engine, &bytes)
            .map(drop)
            .map_err(|e| LoadError::compiling(&root.digest().to_string(), e).into())
    }

    /// The rooted image as a program called `name`: verified, compiled (or
    /// taken from the cache) and linked as a command.
    pub fn load(&self, root: &mut Root, name: &str) -> Result<Program, ProgramLoadError> {
        Ok(Program {
            name: name.to_string(),
            image: root.digest(),
            code: self.code::<CommandPre<GenerationState>>(root, name)?,
        })
    }

    /// The rooted image's code, verified, compiled (or taken from the
    /// cache) and linked to be entered as `E`.
    pub fn code<E: Entry>(
        &self,
        root: &mut Root,
        name: &str,
    ) -> Result<AppCode<E>, ProgramLoadError> {
        let bytes = self.images.read(root)?;
        Ok(AppCode::<E>::from_bytes(
            &self.engine,
            &self.cache,
            name,
            &bytes,
            self.limits.runtime.clone(),
            self.outbound.clone(),
            self.stores.clone(),
        )?)
    }
}
