//! One app's section of `weir.toml` — `[apps.NAME]`, or the top level of a
//! single-app file — checked into a [`weir_server::AppSpec`].
//!
//! Invariant owned here: every path in a section is relative to the config
//! file, every name and route is checked, and every secret is resolved
//! before anything starts; a mistake is a usage error naming the app and
//! the setting.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use weir_http::routing::RoutePattern;
use weir_runtime::outbound::{HostPattern, OutboundRules};
use weir_server::AppSpec;

use super::UsageError;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ActorSection {
    /// The class's component (.wasm) or guest crate directory.
    pub component: PathBuf,
    /// Exposes the class to clients at `<route>/<name>/<path>`.
    pub route: Option<String>,
    /// The class's secrets, by name: where each value comes from.
    #[serde(default)]
    pub secrets: BTreeMap<String, SecretSource>,
}

/// Where a secret's value comes from: never the config file itself.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretSource {
    /// An environment variable of the `weir serve` process.
    env: Option<String>,
    /// A file (relative to the config file), its content without a
    /// trailing newline.
    file: Option<PathBuf>,
}

impl SecretSource {
    /// The value now; read at every start, so a restart re-resolves it.
    /// `what` names the secret in errors.
    pub(super) fn resolve(&self, what: &str, base: Option<&Path>) -> Result<String, UsageError> {
        match (&self.env, &self.file) {
            (Some(var), None) => std::env::var(var).map_err(|_| {
                UsageError(format!(
                    "{what}: the environment variable {var} is not set (or not UTF-8)"
                ))
            }),
            (None, Some(file)) => {
                let path = relative(base, file);
                let text = std::fs::read_to_string(&path).map_err(|e| {
                    UsageError(format!("{what}: cannot read {}: {e}", path.display()))
                })?;
                Ok(text.strip_suffix('\n').unwrap_or(&text).to_string())
            }
            _ => Err(UsageError(format!(
                "{what}: give exactly one of `env = \"VARIABLE\"` or `file = \"PATH\"`"
            ))),
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct StoresSection {
    #[serde(default)]
    pub stores: Vec<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct DatabasesSection {
    #[serde(default)]
    pub databases: Vec<String>,
}

/// `[apps.NAME]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AppSection {
    /// The app's component (.wasm) or guest crate directory.
    pub component: PathBuf,
    /// Where it is served: `[host]/prefix`, for example `"/"`, `"/api"`,
    /// `"example.com/"`, `"*.example.com/api"`.
    #[serde(default)]
    pub routes: Vec<String>,
    #[serde(default)]
    pub allowed_outbound_hosts: Vec<String>,
    #[serde(default)]
    pub keyvalue: StoresSection,
    #[serde(default)]
    pub sql: DatabasesSection,
    #[serde(default)]
    pub actors: BTreeMap<String, ActorSection>,
    #[serde(default)]
    pub limits: toml::Table,
}

/// A path written in the config file: relative to the file's directory
/// (`base`, as [`config_dir`] names it). Its leading `..` and `.` are
/// folded into `base`, which holds no symbolic link, so the path is shown
/// as the system resolves it (`/srv/app/.weir`, not
/// `/srv/app/conf/../.weir`); a `..` after a name is kept, since that name
/// may be a link.
pub(super) fn relative(base: Option<&Path>, path: &Path) -> PathBuf {
    use std::path::Component;
    let Some(base) = base.filter(|_| path.is_relative()) else {
        return path.to_path_buf();
    };
    let mut joined = base.to_path_buf();
    let mut components = path.components().peekable();
    while let Some(leading) = components.peek() {
        match leading {
            Component::CurDir => {}
            Component::ParentDir if joined.parent().is_some() => {
                joined.pop();
            }
            // The root's parent is the root.
            Component::ParentDir if joined.has_root() => {}
            _ => break,
        }
        components.next();
    }
    joined.extend(components);
    joined
}

/// The directory a config file's paths are relative to, with symbolic
/// links resolved (as it was named, if it cannot be resolved).
pub(super) fn config_dir(file: &Path) -> PathBuf {
    let dir = match file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf())
}

/// A `[limits]` table as `(name, value)` pairs.
pub(super) fn limit_pairs(table: &toml::Table) -> Vec<(String, String)> {
    table
        .iter()
        .map(|(name, value)| {
            let value = match value {
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (name.clone(), value)
        })
        .collect()
}

pub(super) fn outbound(patterns: &[String]) -> Result<OutboundRules, UsageError> {
    let patterns = patterns
        .iter()
        .map(|p| {
            p.parse::<HostPattern>()
                .map_err(|e| UsageError(e.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(OutboundRules::new(patterns))
}

/// What an app's section and, for the single app, the command line give.
pub(super) struct AppParts {
    pub component: PathBuf,
    pub routes: Vec<String>,
    pub outbound: Vec<String>,
    pub kv_stores: Vec<String>,
    pub sql_databases: Vec<String>,
    pub actors: BTreeMap<String, ActorSection>,
    /// `CLASS=PATH` classes from the command line, over the sections.
    pub more_actors: Vec<(String, PathBuf)>,
    /// `CLASS=/PREFIX` routes from the command line, over the sections.
    pub more_routes: Vec<(String, String)>,
    pub limits: Vec<(String, String)>,
}

/// Checks one app's parts into its spec. `name` is `None` for the single
/// app of a file without `[apps]` (named after its component, at `/`).
pub(super) fn app_spec(
    name: Option<&str>,
    parts: AppParts,
    base: Option<&Path>,
) -> Result<AppSpec, UsageError> {
    let mut spec = match name {
        Some(name) => {
            AppSpec::declared(name, &parts.component).map_err(|e| UsageError(e.to_string()))?
        }
        None => AppSpec::single(&parts.component),
    };
    let what = match name {
        Some(name) => format!("app `{name}`: "),
        None => String::new(),
    };
    if name.is_some() {
        if parts.routes.is_empty() {
            return Err(UsageError(format!(
                "{what}give it `routes`, for example routes = [\"/\"]"
            )));
        }
        spec.routes = parts
            .routes
            .iter()
            .map(|r| {
                r.parse::<RoutePattern>()
                    .map_err(|e| UsageError(format!("{what}{e}")))
            })
            .collect::<Result<_, _>>()?;
    }
    if !spec.component.exists() {
        return Err(UsageError(format!(
            "{what}app {} does not exist",
            spec.component.display()
        )));
    }
    spec.outbound = outbound(&parts.outbound)?;
    let sorted = |mut list: Vec<String>| {
        list.sort();
        list.dedup();
        list
    };
    spec.kv_stores = sorted(parts.kv_stores);
    spec.sql_databases = sorted(parts.sql_databases);
    spec.limits = parts.limits;
    let mut routes: BTreeMap<String, String> = parts
        .actors
        .iter()
        .filter_map(|(class, section)| Some((class.clone(), section.route.clone()?)))
        .collect();
    routes.extend(parts.more_routes);
    for (class, section) in &parts.actors {
        for (name, source) in &section.secrets {
            let value =
                source.resolve(&format!("secret `{name}` of actor class `{class}`"), base)?;
            spec.secrets
                .entry(class.clone())
                .or_default()
                .insert(name.clone(), value);
        }
    }
    let mut actors: BTreeMap<String, PathBuf> = parts
        .actors
        .into_iter()
        .map(|(class, section)| (class, relative(base, &section.component)))
        .collect();
    actors.extend(parts.more_actors);
    for (class, path) in &actors {
        weir_actors::ActorAddress::new(class, "x")
            .map_err(|e| UsageError(format!("{what}actor class `{class}`: {e}")))?;
        if !path.exists() {
            return Err(UsageError(format!(
                "{what}actor class `{class}`: {} does not exist",
                path.display()
            )));
        }
    }
    for (class, prefix) in routes {
        if !actors.contains_key(&class) {
            return Err(UsageError(format!(
                "{what}actor route for `{class}`: no such actor class is declared"
            )));
        }
        let valid = prefix.len() > 1
            && prefix.starts_with('/')
            && !prefix.ends_with('/')
            && !prefix.contains(['?', '#']);
        if !valid {
            return Err(UsageError(format!(
                "{what}actor route `{prefix}` for `{class}` must look like /name (a leading slash, no trailing slash, no query)"
            )));
        }
        spec.actor_routes.push((prefix, class));
    }
    spec.actors = actors.into_iter().collect();
    Ok(spec)
}
