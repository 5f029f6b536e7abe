//! The versions of each app, and how a deploy replaces one with the next.
//!
//! Invariants owned here:
//! - a deploy is built whole before anything changes: every changed
//!   component compiled and linked, the new worker's first generation
//!   instantiated, the new route table checked. Any failure refuses the
//!   deploy, names why, and leaves every app serving as it was;
//! - one deploy at a time, and a deploy of several apps (a re-read
//!   `weir.toml`) applies to all of them or to none;
//! - from the moment a version's routes are installed it takes every new
//!   request; the version it replaced finishes what it was running or had
//!   queued, on its own code and under its own deadlines, and drops its
//!   generations as its lanes fall idle ([`App::retire`]);
//! - an actor class whose code, limits or allow-list changed is installed
//!   into the app's actor host (its actors take it at their next turn); an
//!   unchanged class is left alone, its actors keep their instances;
//! - the sockets of replaced code (a worker version, a class's old code)
//!   are closed with 1012 once the new routes are in, so their clients
//!   reconnect to the new version;
//! - the previous version's recipe (not its instances) is kept, so a
//!   rollback is a deploy of it.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::{Instant, SystemTime};

use http::StatusCode;
use serde_json::json;
use weir_actors::ActorClass;
use weir_http::ActorRoute;
use weir_http::admin_apps::{DeployRefusal, DeployRequest, Deployer};
use weir_http::routing::{Route, RoutePattern, RouteTable, Router, Served};
use weir_runtime::App;
use weir_runtime::receipt::ReceiptBook;

use crate::app_spec::AppSpec;
use crate::recipe::{MAX_LABEL_BYTES, Recipe, Source, valid_label};
use crate::tenant::{Shared, Tenant};
use crate::{ServerError, ServerLimits};

/// One installed version.
struct Installed {
    /// 1 for the version the app started with, then one more per deploy.
    number: u64,
    recipe: Recipe,
    at: SystemTime,
    /// Its worker, while anything still runs on it.
    app: Weak<App>,
}

/// One app: its lasting parts and its versions.
struct Entry {
    tenant: Arc<Tenant>,
    served: Arc<Served>,
    current: Installed,
    previous: Option<Installed>,
    /// Replaced versions, kept while something still runs on them.
    retired: Vec<(u64, String, Weak<App>)>,
}

/// A change of one app, built and not yet installed.
struct Staged {
    name: String,
    recipe: Recipe,
    served: Arc<Served>,
    classes: Vec<ActorClass>,
    took: std::time::Duration,
}

/// Every app of the server and their versions: the server's [`Deployer`].
pub struct Apps {
    shared: Arc<Shared>,
    router: Arc<Router>,
    entries: tokio::sync::Mutex<BTreeMap<String, Entry>>,
}

fn refusal(status: StatusCode, code: &'static str, message: impl Into<String>) -> DeployRefusal {
    DeployRefusal {
        status,
        code,
        message: message.into(),
    }
}

fn component_refused(e: impl std::fmt::Display) -> DeployRefusal {
    refusal(
        StatusCode::UNPROCESSABLE_ENTITY,
        "component_refused",
        e.to_string(),
    )
}

/// Starts a version's worker: compiled and linked off the async threads,
/// then its first generation instantiated.
async fn start_worker(
    shared: &Arc<Shared>,
    tenant: &Arc<Tenant>,
    recipe: &Recipe,
) -> Result<Arc<App>, ServerError> {
    let code = {
        let (shared, tenant, recipe) = (shared.clone(), tenant.clone(), recipe.clone());
        tokio::task::spawn_blocking(move || {
            tenant.worker_code(&shared, &recipe.worker, &recipe.limits, &recipe.outbound)
        })
        .await
        .map_err(|e| ServerError::Deploy(format!("the compile task failed: {e}")))??
    };
    let name = tenant.name.clone();
    let receipts = ReceiptBook::new(
        name.clone().into(),
        recipe.version().into(),
        shared.metrics.for_app(&name),
        shared.receipts.clone(),
    );
    Ok(App::start(name, code, receipts, &recipe.worker.shown).await?)
}

fn served(tenant: &Tenant, app: Arc<App>, recipe: &Recipe) -> Arc<Served> {
    Arc::new(Served {
        name: tenant.name.as_str().into(),
        app,
        actors: tenant.actors.clone(),
        actor_routes: recipe
            .actor_routes
            .iter()
            .map(|(prefix, class)| ActorRoute {
                prefix: prefix.clone(),
                class: class.clone(),
            })
            .collect(),
    })
}

/// A route table of every app, each with its served version and routes.
fn table<'a>(
    apps: impl Iterator<Item = (&'a Arc<Served>, &'a [RoutePattern])>,
) -> Result<RouteTable, weir_http::routing::RouteOverlap> {
    let mut routes = Vec::new();
    for (served, patterns) in apps {
        for pattern in patterns {
            routes.push(Route {
                pattern: pattern.clone(),
                served: served.clone(),
            });
        }
    }
    RouteTable::new(routes)
}

impl Apps {
    /// Opens every app and starts its first version; refuses overlapping
    /// routes, naming both apps.
    pub(crate) async fn start(
        shared: Arc<Shared>,
        specs: &[AppSpec],
    ) -> Result<Arc<Apps>, ServerError> {
        let mut entries = BTreeMap::new();
        for spec in specs {
            let recipe = Recipe::from_spec(spec, &shared.limits)?;
            let classes: Vec<_> = recipe
                .classes
                .iter()
                .map(|(c, s)| (c.clone(), s.clone()))
                .collect();
            let tenant = Arc::new(Tenant::open(&shared, spec, &recipe.limits, &classes).await?);
            let app = start_worker(&shared, &tenant, &recipe).await?;
            let entry = Entry {
                served: served(&tenant, app.clone(), &recipe),
                tenant,
                current: Installed {
                    number: 1,
                    recipe,
                    at: SystemTime::now(),
                    app: Arc::downgrade(&app),
                },
                previous: None,
                retired: Vec::new(),
            };
            if entries.insert(spec.name.clone(), entry).is_some() {
                return Err(ServerError::Config(format!(
                    "app `{}` is declared twice",
                    spec.name
                )));
            }
        }
        let table = table(
            entries
                .values()
                .map(|e| (&e.served, e.current.recipe.routes.as_slice())),
        )
        .map_err(|e| ServerError::Config(e.to_string()))?;
        // The apps are fixed from now on (adding one needs a restart): each
        // holds its share of the sockets.
        shared.sockets.set_apps(entries.len());
        Ok(Arc::new(Apps {
            shared,
            router: Router::new(table),
            entries: tokio::sync::Mutex::new(entries),
        }))
    }

    pub fn router(&self) -> &Arc<Router> {
        &self.router
    }

    /// Each app's lasting parts, in name order (for the admin endpoints).
    pub(crate) async fn tenants(&self) -> Vec<Arc<Tenant>> {
        let entries = self.entries.lock().await;
        entries.values().map(|e| e.tenant.clone()).collect()
    }

    /// Builds `recipe` as the next version of `entry`, changing nothing.
    async fn stage(&self, entry: &Entry, recipe: Recipe) -> Result<Staged, DeployRefusal> {
        let started = Instant::now();
        let tenant = &entry.tenant;
        // A deploy of a class alone keeps the worker that serves now.
        let app = if entry.current.recipe.worker_same(&recipe) {
            entry.served.app.clone()
        } else {
            start_worker(&self.shared, tenant, &recipe)
                .await
                .map_err(component_refused)?
        };
        let mut classes = Vec::new();
        for class in recipe.classes.keys() {
            if !entry.current.recipe.class_changed(&recipe, class) {
                continue;
            }
            let (shared, tenant, next, class) = (
                self.shared.clone(),
                tenant.clone(),
                recipe.clone(),
                class.clone(),
            );
            let built = tokio::task::spawn_blocking(move || {
                let source = &next.classes[&class];
                shared.class(
                    &tenant.name,
                    &class,
                    source,
                    &next.limits,
                    &next.outbound,
                    &tenant.stores,
                )
            })
            .await
            .map_err(|e| component_refused(format!("the compile task failed: {e}")))?
            .map_err(component_refused)?;
            classes.push(built);
        }
        Ok(Staged {
            name: tenant.name.clone(),
            served: served(tenant, app, &recipe),
            recipe,
            classes,
            took: started.elapsed(),
        })
    }

    /// Installs staged changes, all together: classes first, then the
    /// route table that sends new requests to the new versions.
    fn install(
        &self,
        entries: &mut BTreeMap<String, Entry>,
        staged: Vec<Staged>,
    ) -> Result<serde_json::Value, DeployRefusal> {
        let next =
            table(entries.values().map(
                |e| match staged.iter().find(|s| s.name == e.tenant.name) {
                    Some(s) => (&s.served, s.recipe.routes.as_slice()),
                    None => (&e.served, e.current.recipe.routes.as_slice()),
                },
            ))
            .map_err(|e| refusal(StatusCode::CONFLICT, "config_refused", e.to_string()))?;
        let lanes: usize = entries
            .values()
            .map(|e| match staged.iter().find(|s| s.name == e.tenant.name) {
                Some(s) => s.recipe.limits.runtime.max_concurrent,
                None => e.current.recipe.limits.runtime.max_concurrent,
            })
            .sum();
        let most = self.shared.lane_capacity / crate::VERSIONS_AT_ONCE;
        if lanes > most {
            return Err(refusal(
                StatusCode::CONFLICT,
                "config_refused",
                format!(
                    "every app's max_concurrent together would be {lanes}, over the {most} this server reserved instance slots for at start; raising it needs a restart"
                ),
            ));
        }
        let mut report = Vec::new();
        // Sockets of replaced code, closed once the new routes are in.
        let mut replaced: Vec<(String, String, String)> = Vec::new();
        for s in staged {
            let entry = entries.get_mut(&s.name).expect("staged from an entry");
            if let Some(host) = &entry.tenant.actors {
                let versions = host.class_versions();
                for class in s.classes {
                    if let Some((_, old)) = versions.iter().find(|(name, _)| *name == class.name) {
                        replaced.push((
                            self.shared.class_metrics_name(&s.name, &class.name),
                            old.to_string(),
                            class.version.to_string(),
                        ));
                    }
                    host.install_class(class)
                        .expect("a staged class is one of the host's");
                }
            }
            let number = entry.current.number + 1;
            let installed = Installed {
                number,
                at: SystemTime::now(),
                app: Arc::downgrade(&s.served.app),
                recipe: s.recipe,
            };
            let old = std::mem::replace(&mut entry.current, installed);
            if !Arc::ptr_eq(&entry.served.app, &s.served.app) {
                if let Some(app) = old.app.upgrade() {
                    app.retire();
                }
                replaced.push((
                    s.name.clone(),
                    old.recipe.version(),
                    entry.current.recipe.version(),
                ));
                entry
                    .retired
                    .push((old.number, old.recipe.version(), old.app.clone()));
            }
            entry.served = s.served;
            entry.retired.retain(|(_, _, app)| app.strong_count() > 0);
            tracing::info!(
                app = %s.name,
                version = %entry.current.recipe.version(),
                number,
                ms = s.took.as_millis() as u64,
                "deployed"
            );
            report.push(json!({
                "app": s.name,
                "version": entry.current.recipe.version(),
                "number": number,
                "previous": old.recipe.version(),
                "build_ms": s.took.as_millis() as u64,
            }));
            entry.previous = Some(old);
        }
        self.router.install(next);
        for (app, old, new) in replaced {
            self.shared.sockets.code_replaced(&app, &old, &new);
        }
        Ok(json!({ "deployed": report }))
    }

    /// Applies a whole new configuration: every app's new recipe built
    /// first, then all installed, or nothing if any is refused. What only
    /// a restart can change (the apps, their stores, databases and classes)
    /// is refused, naming it.
    pub async fn reconfigure(
        &self,
        specs: &[AppSpec],
        limits: &ServerLimits,
    ) -> Result<serde_json::Value, DeployRefusal> {
        let config = |m: String| refusal(StatusCode::CONFLICT, "config_refused", m);
        for name in crate::app_spec::SERVER_WIDE_LIMITS {
            if limits.get(name) != self.shared.limits.get(name) {
                return Err(config(format!(
                    "the server-wide limit `{name}` changed: that needs a restart"
                )));
            }
        }
        let mut entries = self.entries.lock().await;
        let now: Vec<&String> = entries.keys().collect();
        let mut next: Vec<&String> = specs.iter().map(|s| &s.name).collect();
        next.sort();
        if now != next {
            return Err(config(format!(
                "the apps are {now:?} and the new configuration declares {next:?}: adding or removing an app needs a restart"
            )));
        }
        let mut staged = Vec::new();
        for spec in specs {
            let entry = &entries[&spec.name];
            let tenant = &entry.tenant;
            let mut classes: Vec<String> = spec.actors.iter().map(|(c, _)| c.clone()).collect();
            classes.sort();
            let mut had = tenant.classes.clone();
            had.sort();
            let fixed = [
                ("kv stores", tenant.kv_stores != spec.kv_stores),
                ("sql databases", tenant.sql_databases != spec.sql_databases),
                ("actor classes", had != classes),
            ];
            if let Some((what, _)) = fixed.iter().find(|(_, changed)| *changed) {
                return Err(config(format!(
                    "app `{}`: its {what} changed: that needs a restart",
                    spec.name
                )));
            }
            let recipe = Recipe::from_spec(spec, limits).map_err(|e| config(e.to_string()))?;
            if entry.current.recipe.same_as(&recipe) {
                continue;
            }
            staged.push(self.stage(entry, recipe).await?);
        }
        self.install(&mut entries, staged)
    }

    fn describe(entry: &Entry) -> serde_json::Value {
        let app = &entry.served.app;
        let counts = app.metrics.counts();
        let load = std::sync::atomic::Ordering::Relaxed;
        let version = |i: &Installed| {
            json!({
                "version": i.recipe.version(),
                "number": i.number,
                "deployed_at": humantime::format_rfc3339_seconds(i.at).to_string(),
            })
        };
        let draining: Vec<_> = entry
            .retired
            .iter()
            .filter_map(|(number, version, app)| {
                let app = app.upgrade()?;
                let busy = app
                    .board
                    .snapshot()
                    .iter()
                    .filter(|l| l.state == weir_runtime::lane::LaneState::Busy)
                    .count();
                Some(json!({
                    "version": version,
                    "number": number,
                    "busy_lanes": busy,
                    "queue_depth": app.admission.queue_depth(),
                }))
            })
            .collect();
        let recipe = &entry.current.recipe;
        let classes: Vec<_> = match &entry.tenant.actors {
            Some(host) => host
                .class_versions()
                .into_iter()
                .map(|(name, version)| json!({ "name": name, "version": &*version }))
                .collect(),
            None => Vec::new(),
        };
        json!({
            "name": entry.tenant.name,
            "version": recipe.version(),
            "number": entry.current.number,
            "deployed_at": humantime::format_rfc3339_seconds(entry.current.at).to_string(),
            "component": recipe.worker.shown,
            "digest": recipe.worker.digest,
            "routes": recipe.routes.iter().map(|r| r.to_string()).collect::<Vec<_>>(),
            "actor_routes": recipe.actor_routes.iter().map(|(p, c)| json!({ "prefix": p, "class": c })).collect::<Vec<_>>(),
            "classes": classes,
            "healthy": app.healthy(),
            "queue_depth": app.admission.queue_depth(),
            "lanes": app.board.snapshot(),
            "generations": {
                "created": counts.created.load(load),
                "retired": counts.retired.load(load),
                "abandoned": counts.abandoned.load(load),
                "instantiation_failed": counts.instantiation_failed.load(load),
            },
            "previous": entry.previous.as_ref().map(version),
            "draining": draining,
        })
    }
}

#[async_trait::async_trait]
impl Deployer for Apps {
    async fn deploy(&self, request: DeployRequest) -> Result<serde_json::Value, DeployRefusal> {
        let mut entries = self.entries.lock().await;
        let Some(entry) = entries.get(&request.app) else {
            return Err(refusal(
                StatusCode::NOT_FOUND,
                "app_unknown",
                format!("no app `{}` is served", request.app),
            ));
        };
        if let Some(label) = &request.label
            && !valid_label(label)
        {
            return Err(refusal(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!(
                    "a version label is 1 to {MAX_LABEL_BYTES} letters, digits and `.` `_` `+` `:` `-`"
                ),
            ));
        }
        let mut recipe = entry.current.recipe.clone();
        let shown = |what: &str| format!("{what} deployed to `{}`", request.app);
        let mut source = Source::new(
            request.component.to_vec(),
            match &request.class {
                Some(class) => shown(&format!("class `{class}`")),
                None => shown("component"),
            },
        );
        source.label = request.label;
        let source = Arc::new(source);
        match &request.class {
            Some(class) => {
                if !recipe.classes.contains_key(class) {
                    return Err(refusal(
                        StatusCode::NOT_FOUND,
                        "class_unknown",
                        format!("app `{}` declares no actor class `{class}`", request.app),
                    ));
                }
                recipe.classes.insert(class.clone(), source);
            }
            None => recipe.worker = source,
        }
        let staged = self.stage(entry, recipe).await?;
        self.install(&mut entries, vec![staged])
    }

    async fn rollback(&self, app: &str) -> Result<serde_json::Value, DeployRefusal> {
        let mut entries = self.entries.lock().await;
        let Some(entry) = entries.get(app) else {
            return Err(refusal(
                StatusCode::NOT_FOUND,
                "app_unknown",
                format!("no app `{app}` is served"),
            ));
        };
        let Some(previous) = &entry.previous else {
            return Err(refusal(
                StatusCode::CONFLICT,
                "no_previous_version",
                format!("app `{app}` has had no other version since the server started"),
            ));
        };
        let staged = self.stage(entry, previous.recipe.clone()).await?;
        self.install(&mut entries, vec![staged])
    }

    fn apps(&self) -> serde_json::Value {
        // Never waits for a deploy in progress: it shows what is served.
        match self.entries.try_lock() {
            Ok(entries) => {
                json!({ "apps": entries.values().map(Apps::describe).collect::<Vec<_>>() })
            }
            Err(_) => {
                let apps: Vec<_> = self
                    .router
                    .table()
                    .apps()
                    .iter()
                    .map(|s| json!({ "name": &*s.name, "version": &**s.app.receipts.version(), "deploying": true }))
                    .collect();
                json!({ "apps": apps })
            }
        }
    }
}
