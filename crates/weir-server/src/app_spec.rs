//! One app as the configuration declares it: its name, code, routes,
//! limits, stores, databases, allow-list and actor classes.
//!
//! Invariants owned here:
//! - an app's limits are the server's with the app's own on top, and the
//!   limits that bound the whole process (connections, total guest memory,
//!   storage threads, sockets, the engines' memory reservations) are the
//!   server's alone: an app that sets one is refused, naming it;
//! - an app declared in `[apps.NAME]` keeps its data under
//!   `apps/NAME/` of the data dir, so two apps never share a store, a
//!   database, an actor or a storage slot; the app of `weir serve
//!   app.wasm` keeps the data dir's root, as before apps existed.

use std::path::{Path, PathBuf};

use weir_http::routing::RoutePattern;
use weir_programs::host::Secrets;
use weir_runtime::outbound::OutboundRules;

use crate::ServerLimits;

/// Limits that bound the whole server, not one app.
pub const SERVER_WIDE_LIMITS: &[&str] = &[
    "max_connections",
    "header_read_timeout_ms",
    "max_total_guest_memory_bytes",
    "sql_threads",
    // SQLite's heap is one for the process.
    "max_sql_memory_bytes",
    "max_sql_statement_memory_bytes",
    // One code cache, compiled for every app by the same process kind.
    "compile_memory_limit_bytes",
    // One share of the workers for every app's long computations.
    "long_call_workers",
    // The engines reserve each instance's memory up front at this size.
    "memory_limit_bytes",
    "max_image_bytes",
    "max_sockets",
    "max_sockets_per_actor",
    "max_socket_message_bytes",
    "max_socket_send_queue_bytes",
    "socket_ping_interval_ms",
    "socket_idle_timeout_ms",
    // One lease per node, and one schema.
    "cluster_lease_ms",
    "cluster_schema_patience_ms",
];

/// The data dir's subdirectory of declared apps.
pub const APPS_DIR: &str = "apps";

/// Why an app's declaration was refused.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error(
        "app name `{0}` must be 1 to 63 lowercase letters, digits and `-`, starting with a letter"
    )]
    Name(String),
    #[error("app `{app}`: `{limit}` is a server-wide limit: set it in the top-level [limits]")]
    ServerWide { app: String, limit: &'static str },
    #[error("app `{app}`: {error}")]
    Limit { app: String, error: String },
    #[error("app `{app}` has no routes")]
    NoRoutes { app: String },
    #[error("app `{app}`: actor route `{prefix}` lies under none of the app's routes")]
    ActorRouteOutside { app: String, prefix: String },
}

/// One app of the server, as declared.
#[derive(Clone)]
pub struct AppSpec {
    pub name: String,
    /// Its worker component (a `.wasm` file).
    pub component: PathBuf,
    /// Where it is served.
    pub routes: Vec<RoutePattern>,
    /// `(name, value)` limits of this app, over the server's.
    pub limits: Vec<(String, String)>,
    pub outbound: OutboundRules,
    pub kv_stores: Vec<String>,
    pub sql_databases: Vec<String>,
    /// Actor classes: name and component file.
    pub actors: Vec<(String, PathBuf)>,
    /// Classes exposed to clients directly: (path prefix, class).
    pub actor_routes: Vec<(String, String)>,
    /// Each class's secrets, by name.
    pub secrets: Secrets,
    /// Its data under the server's data dir: `None` for the data dir's
    /// root (the app of `weir serve app.wasm`), else `apps/<name>`.
    pub data_subdir: Option<PathBuf>,
}

impl AppSpec {
    /// The app of `weir serve app.wasm`: named after the file, on every
    /// host at `/`, its data at the data dir's root.
    pub fn single(component: impl Into<PathBuf>) -> AppSpec {
        let component = component.into();
        AppSpec {
            name: crate::shown_name(&component),
            component,
            routes: vec![RoutePattern::root()],
            limits: Vec::new(),
            outbound: OutboundRules::new(Vec::new()),
            kv_stores: Vec::new(),
            sql_databases: Vec::new(),
            actors: Vec::new(),
            actor_routes: Vec::new(),
            secrets: Default::default(),
            data_subdir: None,
        }
    }

    /// An app declared as `[apps.<name>]`, its data under `apps/<name>`.
    pub fn declared(name: &str, component: impl Into<PathBuf>) -> Result<AppSpec, SpecError> {
        check_name(name)?;
        let mut spec = AppSpec::single(component);
        spec.name = name.to_string();
        spec.data_subdir = Some(Path::new(APPS_DIR).join(name));
        Ok(spec)
    }

    /// The app's limits: the server's with the app's own applied.
    pub fn limits(&self, server: &ServerLimits) -> Result<ServerLimits, SpecError> {
        let mut limits = server.clone();
        for (name, value) in &self.limits {
            if let Some(limit) = SERVER_WIDE_LIMITS.iter().find(|l| *l == name) {
                return Err(SpecError::ServerWide {
                    app: self.name.clone(),
                    limit,
                });
            }
            limits.set(name, value).map_err(|e| SpecError::Limit {
                app: self.name.clone(),
                error: e.to_string(),
            })?;
        }
        Ok(limits)
    }

    /// Checks what can be checked without the server: routes, actor
    /// routes, limits.
    pub fn check(&self, server: &ServerLimits) -> Result<(), SpecError> {
        self.limits(server)?;
        if self.routes.is_empty() {
            return Err(SpecError::NoRoutes {
                app: self.name.clone(),
            });
        }
        for (prefix, _) in &self.actor_routes {
            if !self.routes.iter().any(|r| r.covers(prefix)) {
                return Err(SpecError::ActorRouteOutside {
                    app: self.name.clone(),
                    prefix: prefix.clone(),
                });
            }
        }
        Ok(())
    }

    /// Where its data lives.
    pub fn data_dir(&self, server_data_dir: &Path) -> PathBuf {
        match &self.data_subdir {
            Some(sub) => server_data_dir.join(sub),
            None => server_data_dir.to_path_buf(),
        }
    }
}

/// App names are path segments and metric labels: kept plain.
pub fn check_name(name: &str) -> Result<(), SpecError> {
    let ok = (1..=63).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(SpecError::Name(name.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn app_names_are_plain_segments() {
        for good in ["a", "shortener", "rate-limit2"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in ["", "A", "1a", "a/b", "a.b", "a_b", &"x".repeat(64)] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_app_may_not_set_a_server_wide_limit_but_may_set_its_own() {
        let mut spec = AppSpec::declared("a", "a.wasm").unwrap();
        spec.limits = vec![("max_concurrent".into(), "3".into())];
        let limits = spec.limits(&ServerLimits::default()).unwrap();
        assert_eq!(limits.get("max_concurrent"), Some(3));
        spec.limits = vec![("max_connections".into(), "3".into())];
        let refused = spec.limits(&ServerLimits::default()).err().unwrap();
        assert_eq!(
            refused.to_string(),
            "app `a`: `max_connections` is a server-wide limit: set it in the top-level [limits]"
        );
        spec.limits = vec![("bogus".into(), "3".into())];
        assert!(spec.limits(&ServerLimits::default()).is_err());
    }

    #[test]
    fn actor_routes_must_lie_under_the_apps_routes() {
        let mut spec = AppSpec::declared("a", "a.wasm").unwrap();
        spec.routes = vec!["/api".parse().unwrap()];
        spec.actor_routes = vec![("/api/rooms".into(), "room".into())];
        assert!(spec.check(&ServerLimits::default()).is_ok());
        spec.actor_routes = vec![("/rooms".into(), "room".into())];
        assert!(matches!(
            spec.check(&ServerLimits::default()),
            Err(SpecError::ActorRouteOutside { .. })
        ));
    }
}
