//! `weir apps list` and `weir deploy`: a running server's apps and their
//! deploys, through its admin address. A guest crate directory is built
//! here first; the server receives the component's bytes, compiles and
//! links them, and answers once the new version serves (or why it was
//! refused, the old version serving on).

use std::path::PathBuf;

use anyhow::Context;
use bytes::Bytes;

use serde_json::Value;

use crate::admin_client::{self, AdminArgs};
use crate::config::{self, UsageError};
use crate::table::{self, Table};

#[derive(clap::Args)]
pub struct AppsArgs {
    #[command(flatten)]
    admin: AdminArgs,
    #[command(subcommand)]
    command: AppsCommand,
}

#[derive(clap::Subcommand)]
enum AppsCommand {
    /// Every app: version, routes, busy lanes, queue, health, classes,
    /// the previous version and versions still finishing their events;
    /// `--json` adds each lane, generation counts and the component.
    List {
        /// The server's JSON answer instead of a table.
        #[arg(long)]
        json: bool,
    },
}

#[derive(clap::Args)]
pub struct DeployArgs {
    #[command(flatten)]
    admin: AdminArgs,
    /// The app to deploy to.
    name: String,
    /// Its new component: a .wasm file or a guest crate directory.
    component: Option<PathBuf>,
    /// Deploy the app's actor class CLASS instead of its worker.
    #[arg(long, value_name = "CLASS")]
    class: Option<String>,
    /// Name the version (letters, digits, `.` `_` `+` `:` `-`); receipts
    /// carry it instead of the component's sha256.
    #[arg(long, value_name = "LABEL")]
    label: Option<String>,
    /// Return the app to its previous version instead.
    #[arg(long, conflicts_with_all = ["component", "class", "label"])]
    rollback: bool,
}

pub fn list(args: AppsArgs) -> anyhow::Result<()> {
    match args.command {
        AppsCommand::List { json: true } => admin_client::call(&args.admin, "GET", "/apps"),
        AppsCommand::List { json: false } => {
            let listed: Value = admin_client::get(&args.admin, "/apps")?;
            print!("{}", render(&listed));
            Ok(())
        }
    }
}

/// `GET /apps` as a table. An app in the middle of a deploy is shown by
/// name and version only (the server does not wait for the deploy).
fn render(listed: &Value) -> String {
    let version = |v: &Value| match (v["version"].as_str(), v["number"].as_u64()) {
        (Some(version), Some(n)) => format!("#{n} {}", table::short_digest(version)),
        (Some(version), None) => table::short_digest(version),
        _ => "-".to_string(),
    };
    let mut t = Table::new(&[
        "APP", "VERSION", "DEPLOYED", "ROUTES", "BUSY>", "QUEUE>", "HEALTH", "CLASSES", "PREVIOUS",
        "DRAINING",
    ]);
    let apps = listed["apps"].as_array().map_or(&[][..], |a| a);
    for app in apps {
        let list = |key: &str, show: &dyn Fn(&Value) -> String| {
            let shown: Vec<String> = app[key]
                .as_array()
                .map_or(&[][..], |a| a)
                .iter()
                .map(show)
                .collect();
            if shown.is_empty() {
                "-".to_string()
            } else {
                shown.join(",")
            }
        };
        let lanes = app["lanes"].as_array();
        let busy = lanes.map(|l| l.iter().filter(|l| l["state"] == "busy").count());
        let deploying = app["deploying"] == true;
        t.row(vec![
            app["name"].as_str().unwrap_or("-").to_string(),
            version(app),
            app["deployed_at"].as_str().unwrap_or("-").to_string(),
            list("routes", &|r| r.as_str().unwrap_or("?").to_string()),
            match (busy, lanes) {
                (Some(busy), Some(lanes)) => format!("{busy}/{}", lanes.len()),
                _ => "-".to_string(),
            },
            app["queue_depth"]
                .as_u64()
                .map_or_else(|| "-".to_string(), |q| q.to_string()),
            match (deploying, app["healthy"].as_bool()) {
                (true, _) => "deploying",
                (_, Some(true)) => "healthy",
                (_, Some(false)) => "unhealthy",
                (_, None) => "-",
            }
            .to_string(),
            list("classes", &|c| {
                format!(
                    "{}@{}",
                    c["name"].as_str().unwrap_or("?"),
                    table::short_digest(c["version"].as_str().unwrap_or("?"))
                )
            }),
            if app["previous"].is_object() {
                version(&app["previous"])
            } else {
                "-".to_string()
            },
            list("draining", &version),
        ]);
    }
    t.render()
}

pub fn deploy(args: DeployArgs) -> anyhow::Result<()> {
    let name = &args.name;
    if args.rollback {
        return admin_client::call(&args.admin, "POST", &format!("/apps/{name}/rollback"));
    }
    let Some(component) = &args.component else {
        return Err(UsageError(format!(
            "give the component to deploy to `{name}` (a .wasm file or a guest crate directory), or --rollback"
        ))
        .into());
    };
    if !component.exists() {
        return Err(UsageError(format!("{} does not exist", component.display())).into());
    }
    let path = config::prepare_app(component)?;
    let bytes = std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut query = Vec::new();
    if let Some(class) = &args.class {
        query.push(format!("class={}", admin_client::encode(class)));
    }
    if let Some(label) = &args.label {
        if !weir_server::recipe::valid_label(label) {
            return Err(UsageError(format!(
                "label `{label}`: use 1 to {} letters, digits and `.` `_` `+` `:` `-`",
                weir_server::recipe::MAX_LABEL_BYTES
            ))
            .into());
        }
        query.push(format!("label={}", admin_client::encode(label)));
    }
    let mut target = format!("/apps/{name}/deploy");
    if !query.is_empty() {
        target = format!("{target}?{}", query.join("&"));
    }
    eprintln!(
        "weir: deploying {} ({} bytes) to `{name}`",
        path.display(),
        bytes.len()
    );
    admin_client::call_with(&args.admin, "POST", &target, Bytes::from(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_row_per_app_with_its_versions_cut_short() {
        let listed = serde_json::json!({"apps": [
            {
                "name": "site", "version": "v3", "number": 4,
                "deployed_at": "2026-12-05T16:16:30Z",
                "routes": ["/", "/api"], "queue_depth": 2, "healthy": true,
                "lanes": [{"state": "busy"}, {"state": "idle"}, {"state": "busy"}],
                "classes": [{"name": "probe", "version": "sha256:c906af605daba4b4c1c482fd"}],
                "previous": {"version": "sha256:416399050ffef63a58e7", "number": 3},
                "draining": [{"version": "v1", "number": 1, "busy_lanes": 1}]
            },
            {"name": "other", "version": "v9", "deploying": true}
        ]});
        assert_eq!(
            render(&listed),
            "APP    VERSION  DEPLOYED              ROUTES  BUSY  QUEUE  HEALTH     CLASSES             PREVIOUS         DRAINING\n\
             site   #4 v3    2026-12-05T16:16:30Z  /,/api   2/3      2  healthy    probe@c906af605dab  #3 416399050ffe  #1 v1\n\
             other  v9       -                     -          -      -  deploying  -                   -                -\n"
        );
    }
}
