//! `weir.toml` and the command line, merged into one checked configuration.
//!
//! Invariant owned here: every setting is checked before anything starts:
//! an unknown key, an unknown limit name or an out-of-range value is a
//! usage error (exit 2) naming the setting, never a surprise at runtime.

mod app_section;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use weir_build::BuildRequest;
use weir_cluster::ClusterConfig;
use weir_server::{AppSpec, ServerLimits};
use weir_store::Durability;

use app_section::{
    ActorSection, AppParts, AppSection, DatabasesSection, SecretSource, app_spec, config_dir,
    limit_pairs, relative,
};

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
    /// The single app's allow-list; with `[apps]`, every app's (each adds
    /// its own).
    #[serde(default)]
    allowed_outbound_hosts: Vec<String>,
    data_dir: Option<PathBuf>,
    #[serde(default)]
    keyvalue: KeyValueSection,
    #[serde(default)]
    sql: DatabasesSection,
    #[serde(default)]
    actors: std::collections::BTreeMap<String, ActorSection>,
    #[serde(default)]
    limits: toml::Table,
    /// Apps by name: a server of several apps.
    #[serde(default)]
    apps: std::collections::BTreeMap<String, AppSection>,
    /// Cluster mode.
    cluster: Option<ClusterSection>,
}

/// `[cluster]`: this node of a cluster.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClusterSection {
    /// The PostgreSQL database every node shares.
    database: Option<String>,
    /// This node's name: unique in the cluster, the same across restarts.
    node: Option<String>,
    /// Where this node listens for the other nodes.
    listen: Option<SocketAddr>,
    /// Where the other nodes reach it, if not its listen address.
    advertise: Option<String>,
    /// The secret every node shares (`{ env = "VAR" }` or `{ file = "PATH" }`).
    secret: Option<SecretSource>,
}

/// The environment variable the cluster secret is read from when the
/// configuration names no source for it.
pub const CLUSTER_SECRET_ENV: &str = "WEIR_CLUSTER_SECRET";

/// Where a node listens for the others unless told otherwise.
pub const DEFAULT_CLUSTER_LISTEN: &str = "127.0.0.1:7070";

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct KeyValueSection {
    #[serde(default)]
    stores: Vec<String>,
    #[serde(default)]
    durability: Option<String>,
}

/// Where Weir keeps data unless told otherwise.
pub const DEFAULT_DATA_DIR: &str = ".weir";

/// The configuration `weir serve` runs with.
pub struct Config {
    /// The apps, their components maybe still guest crate directories
    /// (see [`prepare_app`]).
    pub apps: Vec<AppSpec>,
    pub listen: Option<SocketAddr>,
    pub admin: Option<SocketAddr>,
    pub receipt_headers: bool,
    pub limits: ServerLimits,
    pub data_dir: PathBuf,
    pub durability: Durability,
    /// This node's cluster settings, in cluster mode.
    pub cluster: Option<ClusterConfig>,
}

/// What the command line adds to the config file.
#[derive(Default, Clone, Copy)]
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
    /// `--cluster`, `--node`, `--cluster-listen`, `--cluster-advertise`.
    pub cluster: Option<&'a str>,
    pub node: Option<&'a str>,
    pub cluster_listen: Option<SocketAddr>,
    pub cluster_advertise: Option<&'a str>,
}

/// `NAME=VALUE` pairs of a repeatable flag, each checked.
fn assignments(
    list: &[String],
    flag: &str,
    form: &str,
) -> Result<Vec<(String, String)>, UsageError> {
    list.iter()
        .map(|assignment| {
            let (name, value) = assignment.split_once('=').ok_or_else(|| {
                UsageError(format!("--{flag} `{assignment}` is not of the form {form}"))
            })?;
            Ok((name.trim().to_string(), value.trim().to_string()))
        })
        .collect()
}

impl Config {
    /// Reads the config file (if any), then applies the command line.
    pub fn resolve(
        file: Option<&Path>,
        app: Option<&Path>,
        overrides: Overrides<'_>,
    ) -> Result<Config, UsageError> {
        let (mut parsed, base) = match file {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    UsageError(format!("cannot read config {}: {e}", path.display()))
                })?;
                let parsed: File = toml::from_str(&text).map_err(|e| {
                    UsageError(format!("config {}: {}", path.display(), e.message()))
                })?;
                (parsed, Some(config_dir(path)))
            }
            None => (File::default(), None),
        };
        let base = base.as_deref();
        let mut limits = ServerLimits::default();
        for (name, value) in limit_pairs(&parsed.limits) {
            limits
                .set(&name, &value)
                .map_err(|e| UsageError(format!("config: {e}")))?;
        }
        for assignment in overrides.limits {
            limits
                .apply(assignment)
                .map_err(|e| UsageError(e.to_string()))?;
        }
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
        let data_dir = match (overrides.data_dir, parsed.data_dir.take()) {
            (Some(dir), _) => dir.to_path_buf(),
            (None, Some(dir)) => relative(base, &dir),
            (None, None) => PathBuf::from(DEFAULT_DATA_DIR),
        };
        let mut outbound = parsed.allowed_outbound_hosts.clone();
        outbound.extend(overrides.allow_outbound.iter().cloned());
        let (listen, admin, receipt_headers) =
            (parsed.listen, parsed.admin, parsed.receipt_headers);
        let cluster = cluster(parsed.cluster.take(), overrides, base, file)?;

        let apps = if parsed.apps.is_empty() {
            vec![single_app(parsed, app, base, overrides, outbound)?]
        } else {
            let sections = std::mem::take(&mut parsed.apps);
            declared_apps(sections, &parsed, app, base, overrides, &outbound)?
        };
        let mut routed = std::collections::BTreeMap::new();
        for spec in &apps {
            spec.check(&limits).map_err(|e| UsageError(e.to_string()))?;
            for route in &spec.routes {
                if let Some(first) = routed.insert(route.clone(), &spec.name) {
                    return Err(UsageError(format!(
                        "route `{route}` is declared by both `{first}` and `{}`",
                        spec.name
                    )));
                }
            }
        }
        Ok(Config {
            apps,
            listen,
            admin,
            receipt_headers,
            limits,
            data_dir,
            durability,
            cluster,
        })
    }
}

/// Refuses `file` when users other than its owner may read or write it:
/// it holds a secret (`why`).
fn private_to_owner(file: &Path, why: &str) -> Result<(), UsageError> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(file)
        .map_err(|e| UsageError(format!("cannot read config {}: {e}", file.display())))?;
    let mode = meta.mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(UsageError(format!(
            "config {} {why}, and its mode is {mode:04o}: others may read it; make it 0600",
            file.display()
        )));
    }
    Ok(())
}

/// This node's cluster settings, from `[cluster]` and the command line
/// (which wins); none when neither asks for cluster mode.
fn cluster(
    section: Option<ClusterSection>,
    overrides: Overrides<'_>,
    base: Option<&Path>,
    file: Option<&Path>,
) -> Result<Option<ClusterConfig>, UsageError> {
    let asked = section.is_some()
        || overrides.cluster.is_some()
        || overrides.node.is_some()
        || overrides.cluster_listen.is_some()
        || overrides.cluster_advertise.is_some();
    if !asked {
        return Ok(None);
    }
    let section = section.unwrap_or(ClusterSection {
        database: None,
        node: None,
        listen: None,
        advertise: None,
        secret: None,
    });
    let database = match (overrides.cluster, section.database) {
        (Some(url), _) if weir_cluster::postgres::has_password(url) => {
            return Err(UsageError(
                "--cluster holds a password, which every user of this machine reads (/proc/*/cmdline): give it in PGPASSWORD, in a password file (~/.pgpass or PGPASSFILE, mode 0600), or in [cluster] database of a weir.toml only you can read".into(),
            ));
        }
        (Some(url), _) => url.to_string(),
        (None, Some(url)) => {
            if weir_cluster::postgres::has_password(&url)
                && let Some(file) = file
            {
                private_to_owner(file, "holds the cluster database's password")?;
            }
            url
        }
        (None, None) => {
            return Err(UsageError(
                "cluster mode needs its database: --cluster postgres://… or `database` in [cluster]"
                    .into(),
            ));
        }
    };
    let node = overrides
        .node
        .map(str::to_string)
        .or(section.node)
        .ok_or_else(|| {
            UsageError(
                "cluster mode needs this node's name: --node NAME or `node` in [cluster]".into(),
            )
        })?;
    let listen = match overrides.cluster_listen.or(section.listen) {
        Some(listen) => listen,
        None => DEFAULT_CLUSTER_LISTEN.parse().expect("a valid address"),
    };
    let secret = match &section.secret {
        Some(source) => source.resolve("the cluster secret", base)?,
        None => std::env::var(CLUSTER_SECRET_ENV).map_err(|_| {
            UsageError(format!(
                "cluster mode needs the secret every node shares: set {CLUSTER_SECRET_ENV}, or `secret = {{ env = \"VAR\" }}` or `{{ file = \"PATH\" }}` in [cluster]"
            ))
        })?,
    };
    let config = ClusterConfig {
        database,
        node,
        listen,
        advertise: overrides
            .cluster_advertise
            .map(str::to_string)
            .or(section.advertise),
        secret,
        lease: weir_cluster::config::DEFAULT_LEASE,
        schema_patience: weir_cluster::postgres::SCHEMA_PATIENCE,
    };
    config
        .check()
        .map_err(|e| UsageError(format!("cluster: {e}")))?;
    Ok(Some(config))
}

/// The one app of a file without `[apps]` (or of no file at all).
fn single_app(
    parsed: File,
    app: Option<&Path>,
    base: Option<&Path>,
    overrides: Overrides<'_>,
    outbound: Vec<String>,
) -> Result<AppSpec, UsageError> {
    let component = match (app, &parsed.app) {
        (Some(app), _) => app.to_path_buf(),
        // A path in the config file is relative to the file.
        (None, Some(app)) => relative(base, app),
        (None, None) => {
            return Err(UsageError(
                "no app given: pass a .wasm component or a guest crate directory, or set `app` in --config".into(),
            ));
        }
    };
    let mut kv_stores = parsed.keyvalue.stores;
    kv_stores.extend(overrides.kv_stores.iter().cloned());
    let mut sql_databases = parsed.sql.databases;
    sql_databases.extend(overrides.sql_databases.iter().cloned());
    let actors = parsed.actors;
    app_spec(
        None,
        AppParts {
            component,
            routes: Vec::new(),
            outbound,
            kv_stores,
            sql_databases,
            actors,
            more_actors: assignments(overrides.actors, "actor", "CLASS=PATH")?
                .into_iter()
                .map(|(class, path)| (class, PathBuf::from(path)))
                .collect(),
            more_routes: assignments(overrides.actor_routes, "actor-route", "CLASS=/PREFIX")?,
            limits: Vec::new(),
        },
        base,
    )
}

/// The apps of `[apps.NAME]` sections: what belongs to one app is said in
/// its section, never at the top level or on the command line.
fn declared_apps(
    sections: std::collections::BTreeMap<String, AppSection>,
    parsed: &File,
    app: Option<&Path>,
    base: Option<&Path>,
    overrides: Overrides<'_>,
    outbound: &[String],
) -> Result<Vec<AppSpec>, UsageError> {
    let mixed = [
        ("an app path on the command line", app.is_some()),
        ("`app`", parsed.app.is_some()),
        ("[actors.*]", !parsed.actors.is_empty()),
        ("[keyvalue] stores", !parsed.keyvalue.stores.is_empty()),
        ("[sql] databases", !parsed.sql.databases.is_empty()),
        ("--kv-store", !overrides.kv_stores.is_empty()),
        ("--sql-database", !overrides.sql_databases.is_empty()),
        ("--actor", !overrides.actors.is_empty()),
        ("--actor-route", !overrides.actor_routes.is_empty()),
    ];
    if let Some((what, _)) = mixed.iter().find(|(_, given)| *given) {
        return Err(UsageError(format!(
            "{what} belongs to one app: with [apps.NAME] sections, say it in the app's section"
        )));
    }
    let mut apps = Vec::new();
    for (name, section) in sections {
        let mut allowed = outbound.to_vec();
        allowed.extend(section.allowed_outbound_hosts);
        apps.push(app_spec(
            Some(&name),
            AppParts {
                component: relative(base, &section.component),
                routes: section.routes,
                outbound: allowed,
                kv_stores: section.keyvalue.stores,
                sql_databases: section.sql.databases,
                actors: section.actors,
                more_actors: Vec::new(),
                more_routes: Vec::new(),
                limits: limit_pairs(&section.limits),
            },
            base,
        )?);
    }
    Ok(apps)
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
        let dir = weir_scratch::dir(&format!("secrets-{case}"));
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
        let class = &config.apps[0].secrets["c"];
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
mod paths {
    use super::app_section::relative;
    use super::*;

    #[test]
    fn leading_parents_fold_into_the_config_dir_and_later_ones_stay() {
        let base = Path::new("/srv/app/conf");
        let shown = |p: &str| relative(Some(base), Path::new(p));
        assert_eq!(shown("../../.weir"), Path::new("/srv/.weir"));
        assert_eq!(shown("./../data"), Path::new("/srv/app/data"));
        assert_eq!(shown("app.wasm"), Path::new("/srv/app/conf/app.wasm"));
        assert_eq!(shown("link/../x"), Path::new("/srv/app/conf/link/../x"));
        assert_eq!(
            shown("../../../../x"),
            Path::new("/x"),
            "no further than the root"
        );
        assert_eq!(
            shown("/abs/../x"),
            Path::new("/abs/../x"),
            "absolute: as written"
        );
        assert_eq!(relative(None, Path::new("../x")), Path::new("../x"));
    }

    #[test]
    fn a_config_reached_through_a_link_names_paths_where_the_link_points() {
        let dir = weir_scratch::dir("config-link");
        let real = dir.join("real/conf");
        std::fs::create_dir_all(&real).unwrap();
        std::fs::write(real.join("app.wasm"), b"").unwrap();
        std::fs::write(
            real.join("weir.toml"),
            "app = \"app.wasm\"\ndata_dir = \"../data\"\n",
        )
        .unwrap();
        let link = dir.join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let config =
            Config::resolve(Some(&link.join("weir.toml")), None, Overrides::default()).unwrap();
        let real = std::fs::canonicalize(&real).unwrap();
        assert_eq!(config.data_dir, real.parent().unwrap().join("data"));
        assert_eq!(config.apps[0].component, real.join("app.wasm"));
        let _ = std::fs::remove_dir_all(&dir);
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
            let dir = weir_scratch::dir(&format!("config-prop-{case}"));
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
