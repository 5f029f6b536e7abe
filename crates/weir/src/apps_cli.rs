//! `weir apps list` and `weir deploy`: a running server's apps and their
//! deploys, through its admin address. A guest crate directory is built
//! here first; the server receives the component's bytes, compiles and
//! links them, and answers once the new version serves (or why it was
//! refused, the old version serving on).

use std::path::PathBuf;

use anyhow::Context;
use bytes::Bytes;

use crate::admin_client::{self, AdminArgs};
use crate::config::{self, UsageError};

#[derive(clap::Args)]
pub struct AppsArgs {
    #[command(flatten)]
    admin: AdminArgs,
    #[command(subcommand)]
    command: AppsCommand,
}

#[derive(clap::Subcommand)]
enum AppsCommand {
    /// Every app: version, routes, classes, lanes, queue, generations, the
    /// previous version and versions still finishing their events.
    List,
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
        AppsCommand::List => admin_client::call(&args.admin, "GET", "/apps"),
    }
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
        query.push(format!("class={class}"));
    }
    if let Some(label) = &args.label {
        if !weir_server::recipe::valid_label(label) {
            return Err(UsageError(format!(
                "label `{label}`: use 1 to {} letters, digits and `.` `_` `+` `:` `-`",
                weir_server::recipe::MAX_LABEL_BYTES
            ))
            .into());
        }
        query.push(format!("label={label}"));
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
