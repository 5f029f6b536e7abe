//! What one version of an app is made from: its components' bytes and
//! digests, its limits, allow-list and routes — a recipe that can be built
//! again (a rollback) without keeping the version's instances.
//!
//! Invariant owned here: a version is named by its worker's version (the
//! deploy's label, or the component's `sha256:` digest), and whether two
//! recipes differ — for the worker, for each class — is decided here, once.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use weir_http::routing::RoutePattern;
use weir_runtime::LoadError;
use weir_runtime::outbound::OutboundRules;

use crate::app_spec::AppSpec;
use crate::{ServerError, ServerLimits};

/// One component's bytes, as a version holds them.
pub(crate) struct Source {
    pub bytes: Arc<[u8]>,
    /// `sha256:<hex>` of the bytes.
    pub digest: String,
    /// How logs and errors name it: its path, or what the deploy said.
    pub shown: String,
    /// The operator's name for this version, if the deploy gave one.
    pub label: Option<String>,
}

impl Source {
    pub fn new(bytes: Vec<u8>, shown: String) -> Source {
        let digest = format!("sha256:{:x}", Sha256::digest(&bytes));
        Source {
            bytes: bytes.into(),
            digest,
            shown,
            label: None,
        }
    }

    /// What receipts and `/apps` call it: its label, or its digest.
    pub fn version(&self) -> &str {
        self.label.as_deref().unwrap_or(&self.digest)
    }

    pub fn read(path: &Path) -> Result<Source, LoadError> {
        let shown = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| LoadError::Read {
            path: shown.clone(),
            cause: source,
        })?;
        Ok(Source::new(bytes, shown))
    }
}

/// Everything one version of an app is made from.
#[derive(Clone)]
pub(crate) struct Recipe {
    pub worker: Arc<Source>,
    /// Each class's component, by class name.
    pub classes: BTreeMap<String, Arc<Source>>,
    pub limits: ServerLimits,
    pub outbound: OutboundRules,
    pub routes: Vec<RoutePattern>,
    pub actor_routes: Vec<(String, String)>,
}

impl Recipe {
    /// The recipe a declaration describes, its components read now.
    pub fn from_spec(spec: &AppSpec, server: &ServerLimits) -> Result<Recipe, ServerError> {
        spec.check(server)?;
        let mut classes = BTreeMap::new();
        for (class, path) in &spec.actors {
            let source = Source::read(path).map_err(|source| ServerError::ActorClass {
                class: class.clone(),
                cause: source,
            })?;
            classes.insert(class.clone(), Arc::new(source));
        }
        Ok(Recipe {
            worker: Arc::new(Source::read(&spec.component)?),
            classes,
            limits: spec.limits(server)?,
            outbound: spec.outbound.clone(),
            routes: spec.routes.clone(),
            actor_routes: spec.actor_routes.clone(),
        })
    }

    /// The version receipts and `/apps` name: the worker's.
    pub fn version(&self) -> String {
        self.worker.version().to_string()
    }

    /// What a class's instances depend on besides its code.
    fn settings(&self) -> (Vec<Option<u64>>, String) {
        let limits = ServerLimits::specs()
            .map(|spec| self.limits.get(spec.name))
            .collect();
        (limits, format!("{:?}", self.outbound))
    }

    /// True when `class` must be rebuilt to go from `self` to `next`.
    pub(crate) fn class_changed(&self, next: &Recipe, class: &str) -> bool {
        let named = |r: &Recipe| {
            r.classes
                .get(class)
                .map(|s| (s.digest.clone(), s.version().to_string()))
        };
        named(self) != named(next) || self.settings() != next.settings()
    }

    /// True when the worker of `next` is this one's: same code, same name,
    /// same settings.
    pub(crate) fn worker_same(&self, next: &Recipe) -> bool {
        self.worker.digest == next.worker.digest
            && self.version() == next.version()
            && self.settings() == next.settings()
    }

    /// True when nothing served would change.
    pub(crate) fn same_as(&self, next: &Recipe) -> bool {
        self.worker_same(next)
            && self.classes.keys().all(|c| !self.class_changed(next, c))
            && self.routes == next.routes
            && self.actor_routes == next.actor_routes
    }
}

/// The longest version label a deploy may give: it is written into every
/// receipt of the version.
pub const MAX_LABEL_BYTES: usize = 128;

/// Labels are plain tags (`v2`, `2026-12-01.3`, `build:417`): they travel
/// in a query string unescaped and land in receipts and metrics as is.
pub fn valid_label(label: &str) -> bool {
    (1..=MAX_LABEL_BYTES).contains(&label.len())
        && label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-_+:".contains(&b))
}
