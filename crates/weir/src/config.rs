//! `weir.toml` and the command line, merged into one checked configuration.
//!
//! Invariant owned here: every setting is checked before anything starts:
//! an unknown key, an unknown limit name or an out-of-range value is a
//! usage error (exit 2) naming the setting, never a surprise at runtime.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use weir_build::BuildRequest;
use weir_runtime::outbound::{HostPattern, OutboundRules};
use weir_server::ServerLimits;
use weir_store::Durability;

/// A mistake in how Weir was invoked or configured; exits with code 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct File {
    app: Option<PathBuf>,
    listen: Option<SocketAddr>,
    admin: Option<SocketAddr>,
    #[serde(default)]
    receipt_headers: bool,
    #[serde(default)]
    allowed_outbound_hosts: Vec<String>,
    data_dir: Option<PathBuf>,
    #[serde(default)]
    keyvalue: KeyValueSection,
    #[serde(default)]
    sql: SqlSection,
    #[serde(default)]
    actors: std::collections::BTreeMap<String, ActorSection>,
    #[serde(default)]
    limits: toml::Table,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ActorSection {
    /// The class's component (.wasm) or guest crate directory.
    component: PathBuf,
    /// Exposes the class to clients at `<route>/<name>/<path>`.
    route: Option<String>,
    /// The class's secrets, by name: where each value comes from.
    #[serde(default)]
    secrets: std::collections::BTreeMap<String, SecretSource>,
}

/// Where a secret's value comes from: never the config file itself.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SecretSource {
    /// An environment variable of the `weir serve` process.
    env: Option<String>,
    /// A file (relative to the config file), its content without a
    /// trailing newline.
    file: Option<PathBuf>,
}

impl SecretSource {
    /// The value now; read at every start, so a restart re-resolves it.
    fn resolve(&self, class: &str, name: &str, base: Option<&Path>) -> Result<String, UsageError> {
        let what = format!("secret `{name}` of actor class `{class}`");
        match (&self.env, &self.file) {
            (Some(var), None) => std::env::var(var).map_err(|_| {
                UsageError(format!(
                    "{what}: the environment variable {var} is not set (or not UTF-8)"
                ))
            }),
            (None, Some(file)) => {
                let path = match base {
                    Some(base) if file.is_relative() => base.join(file),
                    _ => file.clone(),
                };
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
struct KeyValueSection {
    #[serde(default)]
    stores: Vec<String>,
    #[serde(default)]
    durability: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct SqlSection {
    #[serde(default)]
    databases: Vec<String>,
}

/// Where Weir keeps data unless told otherwise.
pub const DEFAULT_DATA_DIR: &str = ".weir";

/// The configuration `weir serve` runs with.
pub struct Config {
    pub app: PathBuf,
    pub listen: Option<SocketAddr>,
    pub admin: Option<SocketAddr>,
    pub receipt_headers: bool,
    pub limits: ServerLimits,
    pub outbound: OutboundRules,
    pub data_dir: PathBuf,
    pub kv_stores: Vec<String>,
    pub sql_databases: Vec<String>,
    pub durability: Durability,
    /// Actor classes: name and component (or crate directory), by name.
    pub actors: Vec<(String, PathBuf)>,
    /// Classes exposed to clients directly: (path prefix, class).
    pub actor_routes: Vec<(String, String)>,
    /// Each class's secrets, resolved: class, then name, to value.
    pub secrets: weir_programs::host::Secrets,
}

/// What the command line adds to the config file.
#[derive(Default)]
pub struct Overrides<'a> {
    pub limits: &'a [String],
    pub allow_outbound: &'a [String],
    pub data_dir: Option<&'a Path>,
    pub kv_stores: &'a [String],
    pub sql_databases: &'a [String],
    pub durability: Option<&'a str>,
    /// `CLASS=PATH` actor classes.
    pub actors: &'a [String],
    /// `CLASS=/PREFIX` routes.
    pub actor_routes: &'a [String],
}

impl Config {
    /// Reads the config file (if any), then applies the command line.
    pub fn resolve(
        file: Option<&Path>,
        app: Option<&Path>,
        overrides: Overrides<'_>,
    ) -> Result<Config, UsageError> {
        let assignments = overrides.limits;
        let allow_outbound = overrides.allow_outbound;
        let (parsed, base) = match file {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    UsageError(format!("cannot read config {}: {e}", path.display()))
                })?;
                let parsed: File = toml::from_str(&text).map_err(|e| {
                    UsageError(format!("config {}: {}", path.display(), e.message()))
                })?;
                (parsed, path.parent().map(Path::to_path_buf))
            }
            None => (File::default(), None),
        };
        let mut limits = ServerLimits::default();
        for (name, value) in &parsed.limits {
            let value = match value {
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            limits
                .set(name, &value)
                .map_err(|e| UsageError(format!("config: {e}")))?;
        }
        for assignment in assignments {
            limits
                .apply(assignment)
                .map_err(|e| UsageError(e.to_string()))?;
        }
        let app = match (app, parsed.app) {
            (Some(app), _) => app.to_path_buf(),
            // A path in the config file is relative to the file.
            (None, Some(app)) => match &base {
                Some(base) if app.is_relative() => base.join(app),
                _ => app,
            },
            (None, None) => {
                return Err(UsageError(
                    "no app given: pass a .wasm component or a guest crate directory, or set `app` in --config".into(),
                ));
            }
        };
        if !app.exists() {
            return Err(UsageError(format!("app {} does not exist", app.display())));
        }
        let patterns = parsed
            .allowed_outbound_hosts
            .iter()
            .chain(allow_outbound)
            .map(|p| {
                p.parse::<HostPattern>()
                    .map_err(|e| UsageError(e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let durability = match overrides
            .durability
            .or(parsed.keyvalue.durability.as_deref())
            .unwrap_or("process")
        {
            "process" => Durability::Process,
            "fsync" => Durability::Fsync,
            other => {
                return Err(UsageError(format!(
                    "durability must be \"process\" or \"fsync\", got \"{other}\""
                )));
            }
        };
        let data_dir = match (overrides.data_dir, parsed.data_dir) {
            (Some(dir), _) => dir.to_path_buf(),
            (None, Some(dir)) => match &base {
                Some(base) if dir.is_relative() => base.join(dir),
                _ => dir,
            },
            (None, None) => PathBuf::from(DEFAULT_DATA_DIR),
        };
        let mut kv_stores = parsed.keyvalue.stores.clone();
        kv_stores.extend(overrides.kv_stores.iter().cloned());
        kv_stores.sort();
        kv_stores.dedup();
        let mut sql_databases = parsed.sql.databases.clone();
        sql_databases.extend(overrides.sql_databases.iter().cloned());
        sql_databases.sort();
        sql_databases.dedup();
        let mut routes: std::collections::BTreeMap<String, String> = parsed
            .actors
            .iter()
            .filter_map(|(class, section)| Some((class.clone(), section.route.clone()?)))
            .collect();
        for assignment in overrides.actor_routes {
            let (class, prefix) = assignment.split_once('=').ok_or_else(|| {
                UsageError(format!(
                    "--actor-route `{assignment}` is not of the form CLASS=/PREFIX"
                ))
            })?;
            routes.insert(class.trim().to_string(), prefix.trim().to_string());
        }
        let mut secrets = weir_programs::host::Secrets::new();
        for (class, section) in &parsed.actors {
            for (name, source) in &section.secrets {
                let value = source.resolve(class, name, base.as_deref())?;
                secrets
                    .entry(class.clone())
                    .or_default()
                    .insert(name.clone(), value);
            }
        }
        let mut actors: std::collections::BTreeMap<String, PathBuf> = parsed
            .actors
            .into_iter()
            .map(|(class, section)| {
                let path = match &base {
                    Some(base) if section.component.is_relative() => base.join(&section.component),
                    _ => section.component,
                };
                (class, path)
            })
            .collect();
        for assignment in overrides.actors {
            let (class, path) = assignment.split_once('=').ok_or_else(|| {
                UsageError(format!(
                    "--actor `{assignment}` is not of the form CLASS=PATH"
                ))
            })?;
            actors.insert(class.trim().to_string(), PathBuf::from(path.trim()));
        }
        for (class, path) in &actors {
            weir_actors::ActorAddress::new(class, "x")
                .map_err(|e| UsageError(format!("actor class `{class}`: {e}")))?;
            if !path.exists() {
                return Err(UsageError(format!(
                    "actor class `{class}`: {} does not exist",
                    path.display()
                )));
            }
        }
        let mut actor_routes = Vec::new();
        for (class, prefix) in routes {
            if !actors.contains_key(&class) {
                return Err(UsageError(format!(
                    "actor route for `{class}`: no such actor class is declared"
                )));
            }
            let valid = prefix.len() > 1
                && prefix.starts_with('/')
                && !prefix.ends_with('/')
                && !prefix.contains(['?', '#']);
            if !valid {
                return Err(UsageError(format!(
                    "actor route `{prefix}` for `{class}` must look like /name (a leading slash, no trailing slash, no query)"
                )));
            }
            actor_routes.push((prefix, class));
        }
        Ok(Config {
            secrets,
            actor_routes,
            actors: actors.into_iter().collect(),
            sql_databases,
            data_dir,
            kv_stores,
            durability,
            outbound: OutboundRules::new(patterns),
            app,
            listen: parsed.listen,
            admin: parsed.admin,
            receipt_headers: parsed.receipt_headers,
            limits,
        })
    }
}

/// The component to serve: the path itself, or the result of building the
/// guest crate in that directory.
pub fn prepare_app(app: &Path) -> anyhow::Result<PathBuf> {
    if !app.is_dir() {
        return Ok(app.to_path_buf());
    }
    let manifest = weir_build::manifest_in(app);
    if !manifest.is_file() {
        return Err(UsageError(format!(
            "{} is a directory without a Cargo.toml",
            app.display()
        ))
        .into());
    }
    let out_dir = app.join("target").join("weir");
    eprintln!("weir: building {}", app.display());
    Ok(weir_build::build(&BuildRequest {
        manifest,
        package: None,
        out_dir,
        features: Vec::new(),
    })?)
}

#[cfg(test)]
mod secrets {
    use super::*;

    fn resolve(section: &str) -> Result<Config, UsageError> {
        static CASE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let case = CASE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("weir-secrets-{}-{case}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("app.wasm"), b"").unwrap();
        std::fs::write(dir.join("key.txt"), "from-a-file\n").unwrap();
        let file = dir.join("weir.toml");
        std::fs::write(
            &file,
            format!("[actors.c]\ncomponent = \"app.wasm\"\n\n[actors.c.secrets]\n{section}\n"),
        )
        .unwrap();
        let app = dir.join("app.wasm");
        let resolved = Config::resolve(Some(&file), Some(&app), Overrides::default());
        let _ = std::fs::remove_dir_all(&dir);
        resolved
    }

    #[test]
    fn a_secret_comes_from_weirs_environment_or_a_file_beside_the_config() {
        let config = resolve("path = { env = \"PATH\" }\nkey = { file = \"key.txt\" }").unwrap();
        let class = &config.secrets["c"];
        assert_eq!(class["path"], std::env::var("PATH").unwrap());
        assert_eq!(class["key"], "from-a-file", "without its trailing newline");
    }

    #[test]
    fn a_secret_that_cannot_be_resolved_is_a_usage_error_naming_it() {
        let unset = resolve("k = { env = \"WEIR_NO_SUCH_VARIABLE\" }")
            .err()
            .unwrap();
        assert_eq!(
            unset.0,
            "secret `k` of actor class `c`: the environment variable WEIR_NO_SUCH_VARIABLE is not set (or not UTF-8)"
        );
        let missing = resolve("k = { file = \"nope.txt\" }").err().unwrap();
        assert!(
            missing
                .0
                .starts_with("secret `k` of actor class `c`: cannot read "),
            "{}",
            missing.0
        );
        let both = resolve("k = { env = \"PATH\", file = \"key.txt\" }")
            .err()
            .unwrap();
        assert!(
            both.0
                .ends_with("give exactly one of `env = \"VARIABLE\"` or `file = \"PATH\"`"),
            "{}",
            both.0
        );
        let literal = resolve("k = \"in-the-file\"").err().unwrap();
        assert!(
            literal.0.contains("config"),
            "a literal value is refused: {}",
            literal.0
        );
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    /// A `weir.toml` line an operator might write, right or wrong, or noise.
    fn line() -> impl Strategy<Value = String> {
        let key = proptest::sample::select(vec![
            "app",
            "listen",
            "admin",
            "receipt_headers",
            "data_dir",
            "allowed_outbound_hosts",
            "bogus",
            "[limits]",
            "[keyvalue]",
            "[sql]",
            "[actors.c]",
            "[actors.Bad_Name]",
            "[actors.c.secrets]",
            "token",
            "stores",
            "durability",
            "databases",
            "component",
            "route",
            "max_concurrent",
            "event_limit_ms",
            "memory_limit_bytes",
            "max_total_guest_memory_bytes",
            "actor_max_queued",
            "actor_idle_ms",
        ]);
        let value = proptest::sample::select(vec![
            "1",
            "0",
            "-1",
            "99999999999999999999",
            "\"x\"",
            "\"/\"",
            "[\"a\", \"b\"]",
            "true",
            "\"127.0.0.1:0\"",
            "\"http://*:*\"",
            "\"fsync\"",
            "{ a = 1 }",
            "{ env = \"PATH\" }",
            "{ env = \"WEIR_NO_SUCH_VARIABLE\" }",
            "{ file = \"missing.txt\" }",
            "1.5",
            "\"\"",
        ]);
        prop_oneof![
            (key, value).prop_map(|(k, v)| if k.starts_with('[') {
                k.to_string()
            } else {
                format!("{k} = {v}")
            }),
            ".{0,30}",
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Any config file is a configuration or one usage error; never a
        /// panic.
        #[test]
        fn any_config_file_is_accepted_or_refused(lines in proptest::collection::vec(line(), 0..12)) {
            static CASE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            let case = CASE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let dir = std::env::temp_dir().join(format!("weir-config-prop-{}-{case}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let file = dir.join("weir.toml");
            std::fs::write(&file, lines.join("\n")).unwrap();
            let app = dir.join("app.wasm");
            std::fs::write(&app, b"").unwrap();
            let resolved = Config::resolve(Some(&file), Some(&app), Overrides::default());
            if let Ok(config) = resolved {
                for spec in ServerLimits::specs() {
                    let v = config.limits.get(spec.name).unwrap();
                    prop_assert!((spec.min..=spec.max).contains(&v));
                }
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}
