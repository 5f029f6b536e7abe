//! `weir run` and `weir images push|list|rm|sweep`: programs and the image
//! store of a data dir, used directly (the store is safe to share with a
//! running server: see `weir_programs::image_store`).

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Mutex;

use anyhow::Context;
use weir_programs::image_store::IMAGES_DIR;
use weir_programs::loader::{Loader, ProgramLoadError};
use weir_programs::one_shot::{self, Output, RunEnd, Stdin};
use weir_programs::{Digest, ImageStore, RunLimits, RunSpec};
use weir_runtime::compiled_code::Compiler;
use weir_runtime::memory_budget::MemoryBudget;
use weir_runtime::outbound::{HostPattern, OutboundRules};
use weir_runtime::receipt::ReceiptSink;
use weir_runtime::{WeirEngine, WeirError};
use weir_store::data_dir::{DataDir, DataDirError};

use crate::config::UsageError;
use crate::table::{self, Table};

/// The exit status of a program that could not be made ready (not found,
/// corrupt, not a command): 126, the shell's "cannot execute".
const EXIT_NOT_RUNNABLE: u8 = 126;

#[derive(clap::Args)]
pub struct RunArgs {
    /// A command component (.wasm) or the digest of a stored image
    /// (sha256:…); a file is stored in the image store first.
    program: String,
    /// The program's arguments (after `--`).
    #[arg(last = true)]
    args: Vec<String>,
    /// NAME=VALUE in the program's environment; repeatable. Nothing else
    /// of Weir's environment reaches it.
    #[arg(long = "env", value_name = "NAME=VALUE", action = clap::ArgAction::Append)]
    env: Vec<String>,
    /// NAME=VALUE; repeatable (run_time_limit_ms, max_run_output_bytes,
    /// memory_limit_bytes, …).
    #[arg(long = "limit", value_name = "NAME=VALUE", action = clap::ArgAction::Append)]
    limits: Vec<String>,
    /// Let the program reach scheme://host[:port] over HTTP; repeatable.
    #[arg(long = "allow-outbound", value_name = "PATTERN", action = clap::ArgAction::Append)]
    allow_outbound: Vec<String>,
    /// Where the image store is; default ./.weir.
    #[arg(long, value_name = "DIR", default_value = ".weir")]
    data_dir: PathBuf,
    /// Print the run's receipt (one JSON line) to stderr at the end.
    #[arg(long)]
    receipt: bool,
}

#[derive(clap::Args)]
pub struct ImagesArgs {
    /// The data dir whose image store to use.
    #[arg(long, value_name = "DIR", global = true, default_value = ".weir")]
    data_dir: PathBuf,
    #[command(subcommand)]
    command: ImagesCommand,
}

#[derive(clap::Subcommand)]
enum ImagesCommand {
    /// Store components; prints each one's digest.
    Push { files: Vec<PathBuf> },
    /// Stored images: digest, size, and whether a run or process holds it.
    List {
        /// One JSON document instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Remove images by digest (refused while something holds one).
    Rm { digests: Vec<String> },
    /// Remove every image nothing holds, except those named with --keep.
    Sweep {
        /// A digest to keep; repeatable.
        #[arg(long = "keep", value_name = "DIGEST")]
        keep: Vec<String>,
        /// Say what would be removed, and remove nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

/// Receipt lines to Weir's stderr, after the program's own output.
struct StderrReceipts(Mutex<()>);

impl ReceiptSink for StderrReceipts {
    fn write_line(&self, line: &[u8]) {
        let _held = self.0.lock();
        let _ = std::io::stderr().write_all(line);
    }
}

fn open_store(data_dir: &Path, limits: &RunLimits) -> anyhow::Result<ImageStore> {
    // The data dir is checked as a server checks it: its images and their
    // compiled code are trusted.
    weir_store::data_dir::prepare(data_dir)?;
    Ok(ImageStore::open(
        &data_dir.join(IMAGES_DIR),
        limits.programs.max_image_bytes,
    )?)
}

/// `weir run`: exits with the program's exit code.
pub fn run(args: RunArgs) -> ExitCode {
    match prepare_and_run(args) {
        Ok(code) => code,
        Err(e) => {
            if let Some(usage) = e.downcast_ref::<UsageError>() {
                eprintln!("weir: {usage}");
                return ExitCode::from(crate::EXIT_USAGE);
            }
            if let Some(load) = e.downcast_ref::<ProgramLoadError>() {
                eprintln!("weir: {}: {load}", load_code(load));
                return ExitCode::from(EXIT_NOT_RUNNABLE);
            }
            eprintln!("weir: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn load_code(e: &ProgramLoadError) -> &'static str {
    match e {
        ProgramLoadError::Image(e) => e.code().as_str(),
        ProgramLoadError::Load(weir_runtime::LoadError::NotACommand { .. }) => {
            weir_programs::ProgramErrorCode::NotACommand.as_str()
        }
        ProgramLoadError::Read { .. } => "program_unreadable",
        ProgramLoadError::Load(_) | ProgramLoadError::Pool(_) => "program_refused",
    }
}

fn prepare_and_run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let mut limits = RunLimits::default();
    for assignment in &args.limits {
        limits
            .apply(assignment)
            .map_err(|e| UsageError(e.to_string()))?;
    }
    let env = args
        .env
        .iter()
        .map(|pair| {
            pair.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| UsageError(format!("--env `{pair}` is not of the form NAME=VALUE")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let patterns = args
        .allow_outbound
        .iter()
        .map(|p| {
            p.parse::<HostPattern>()
                .map_err(|e| UsageError(format!("--allow-outbound `{p}`: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let budget = MemoryBudget::new(limits.runtime.total_guest_memory());
    let engine = WeirEngine::for_programs(limits.runtime.memory_limit_bytes, budget)?;
    let images = open_store(&args.data_dir, &limits)?;
    let loader = Loader::new(
        images,
        engine,
        Compiler::InProcess,
        limits.clone(),
        OutboundRules::new(patterns),
        // A run from the command line writes its own stdout and stderr.
        None,
    )?;
    let mut root = loader.root(&args.program)?;
    let name = Path::new(&args.program)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| args.program.clone());
    let program = loader.load(&mut root, &name)?;
    let runtime = crate::async_runtime::build()?;
    let metrics = weir_runtime::metrics::Metrics::new().for_app("run");
    let receipts = StderrReceipts(Mutex::new(()));
    let report = runtime.block_on(one_shot::run(
        &program,
        RunSpec {
            args: args.args,
            env,
            stdin: Stdin::Inherit,
            output: Output::Inherit,
        },
        &limits,
        &metrics,
        args.receipt.then_some(&receipts as &dyn ReceiptSink),
    ));
    // The program may still be blocked reading Weir's stdin on a worker
    // thread: do not wait for it.
    runtime.shutdown_background();
    drop(root);
    if let RunEnd::Failed { error, detail, .. } = &report.end {
        match detail {
            Some(detail) => eprintln!("weir: {error}: {detail}"),
            None => eprintln!("weir: {error}"),
        }
    }
    Ok(ExitCode::from(report.end.exit_code().clamp(0, 255) as u8))
}

/// The store's images as a table (digests whole: the commands take
/// them), and a line of totals.
fn render_images(
    images: &[weir_programs::image_store::ImageInfo],
    journaled: &Journaled,
) -> String {
    let mut t = Table::new(&["DIGEST", "SIZE>", "STATE"]);
    for image in images {
        let state = match journaled.get(&image.digest) {
            _ if image.rooted => "in use".to_string(),
            Some(owner) => format!("journaled by {owner}"),
            None => "-".to_string(),
        };
        t.row(vec![
            image.digest.to_string(),
            table::bytes(image.bytes),
            state,
        ]);
    }
    let in_use = images.iter().filter(|i| i.rooted).count();
    let totals = format!(
        "{}, {}, {in_use} in use",
        table::count(images.len(), "image"),
        table::bytes(images.iter().map(|i| i.bytes).sum())
    );
    if t.is_empty() {
        format!("{totals}\n")
    } else {
        format!("{}{totals}\n", t.render())
    }
}

/// What the launch journals of a stopped server's data dir name (the
/// caller holds its lock); `refused` says what was not done if they
/// cannot be read.
fn journaled_images(data_dir: &Path, refused: &str) -> anyhow::Result<Journaled> {
    let failed = |e: String| {
        if refused.is_empty() {
            anyhow::anyhow!("{e}")
        } else {
            anyhow::anyhow!("{e}; {refused}")
        }
    };
    // The actors of the app a `weir serve app.wasm` served live at the
    // root, and those of each `[apps.NAME]` under `apps/NAME`.
    let mut places = vec![data_dir.to_path_buf()];
    let apps = data_dir.join(weir_server::app_spec::APPS_DIR);
    match std::fs::read_dir(&apps) {
        Ok(entries) => {
            let mut found: Vec<std::path::PathBuf> = entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
                .collect();
            found.sort();
            places.extend(found);
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(failed(format!("cannot list {}: {e}", apps.display()))),
    }
    let mut journaled = Journaled::new();
    for place in places {
        let directory =
            weir_actors::ActorDirectory::new(&place, Default::default()).with_stamps(data_dir);
        for (digest, owner) in
            weir_programs::fenced_work::journaled_images(&directory).map_err(failed)?
        {
            journaled.entry(digest).or_insert(owner);
        }
    }
    Ok(journaled)
}

/// The images launch journals name, each with an owner that names it.
type Journaled = std::collections::BTreeMap<Digest, weir_programs::process_table::Owner>;

/// `weir images …`.
pub fn images(args: ImagesArgs) -> anyhow::Result<()> {
    let limits = RunLimits::default();
    let store = open_store(&args.data_dir, &limits)?;
    let parse = |d: &String| d.parse::<Digest>().map_err(|e| UsageError(e.to_string()));
    match args.command {
        ImagesCommand::Push { files } => {
            if files.is_empty() {
                return Err(UsageError("name at least one component to push".into()).into());
            }
            for file in files {
                let bytes = std::fs::read(&file)
                    .with_context(|| format!("cannot read {}", file.display()))?;
                let (root, new) = store.push(&bytes)?;
                println!(
                    "{}  {}  {}",
                    root.digest(),
                    if new { "stored" } else { "already stored" },
                    file.display()
                );
            }
        }
        ImagesCommand::List { json } => {
            // With no server on the data dir, the images its launch
            // journals name are owed work (a server roots them).
            let journaled = match DataDir::open(&args.data_dir) {
                Ok(_held) => journaled_images(&args.data_dir, "").unwrap_or_else(|e| {
                    eprintln!("weir: which images the launch journals name is not known: {e}");
                    Default::default()
                }),
                Err(DataDirError::InUse { .. }) => Default::default(),
                Err(e) => return Err(e.into()),
            };
            let images = store.list()?;
            if json {
                let journaled: serde_json::Map<String, serde_json::Value> = journaled
                    .iter()
                    .map(|(digest, owner)| (digest.to_string(), owner.to_string().into()))
                    .collect();
                println!(
                    "{}",
                    serde_json::json!({ "images": images, "journaled": journaled })
                );
            } else {
                print!("{}", render_images(&images, &journaled));
            }
        }
        ImagesCommand::Rm { digests } => {
            let digests = digests.iter().map(parse).collect::<Result<Vec<_>, _>>()?;
            // With no server on the data dir, what a crash left in the
            // launch journals is owed work: its images stay, as they stay
            // rooted while a server runs (or recovers) them.
            let journaled = match DataDir::open(&args.data_dir) {
                Ok(held) => Some((
                    held,
                    journaled_images(&args.data_dir, "nothing was removed")?,
                )),
                Err(DataDirError::InUse { .. }) => None,
                Err(e) => return Err(e.into()),
            };
            if let Some((_, journaled)) = &journaled
                && let Some((digest, owner)) = digests
                    .iter()
                    .find_map(|d| journaled.get(d).map(|owner| (d, owner)))
            {
                return Err(anyhow::anyhow!(
                    "image {digest} is in use: the launch journal of actor {owner} names it (the server's next start runs its process again); nothing was removed"
                ));
            }
            for digest in digests {
                if store.remove(&digest)? {
                    println!("{digest}  removed");
                } else {
                    println!("{digest}  not stored");
                }
            }
        }
        ImagesCommand::Sweep { keep, dry_run } => {
            let mut keep = keep.iter().map(parse).collect::<Result<HashSet<_>, _>>()?;
            // Held for the whole sweep: no server starts on this data dir
            // meanwhile, and none runs now (a running one sweeps itself).
            let _held = DataDir::open(&args.data_dir).map_err(|e| match e {
                DataDirError::InUse { .. } => anyhow::anyhow!(
                    "{e}; sweep through its admin address instead (POST /images/sweep{})",
                    if dry_run { "?dry_run=1" } else { "" }
                ),
                other => other.into(),
            })?;
            // Launches a crash left in owners' journals are started again
            // at the next start: their images stay.
            let journaled = journaled_images(&args.data_dir, "nothing was swept")?;
            keep.extend(journaled.keys().copied());
            let report = store.sweep(&keep, dry_run)?;
            let removed = if dry_run {
                "would be removed"
            } else {
                "removed"
            };
            for digest in &report.removed {
                println!("{digest}  {removed}");
            }
            for digest in &report.rooted {
                println!("{digest}  kept (in use)");
            }
            for digest in &report.declared {
                if journaled.contains_key(digest) {
                    println!("{digest}  kept (a launch journal names it)");
                } else {
                    println!("{digest}  kept (--keep)");
                }
            }
            if dry_run {
                eprintln!(
                    "weir: a sweep now would remove {} images and {} unfinished pushes and free {} bytes (nothing was removed)",
                    report.removed.len(),
                    report.partials_removed,
                    report.bytes_freed
                );
            } else {
                eprintln!(
                    "weir: swept {} images and {} unfinished pushes, {} bytes freed",
                    report.removed.len(),
                    report.partials_removed,
                    report.bytes_freed
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_programs::image_store::ImageInfo;

    #[test]
    fn the_images_as_a_table_then_totals() {
        let digest = |b: u8| Digest::of(&[b]);
        let images = [
            ImageInfo {
                digest: digest(1),
                bytes: 73_214,
                rooted: true,
            },
            ImageInfo {
                digest: digest(2),
                bytes: 900,
                rooted: false,
            },
        ];
        let journaled = Journaled::from([(
            digest(2),
            weir_programs::process_table::Owner {
                class: "runner".into(),
                name: "owner".into(),
            },
        )]);
        assert_eq!(
            render_images(&images, &journaled),
            format!(
                "DIGEST{}      SIZE  STATE\n{}  71.5 KiB  in use\n{}     900 B  journaled by runner/owner\n2 images, 72.4 KiB, 1 in use\n",
                " ".repeat(71 - 6),
                digest(1),
                digest(2)
            )
        );
        assert_eq!(
            render_images(&[], &Journaled::new()),
            "0 images, 0 B, 0 in use\n"
        );
    }
}
