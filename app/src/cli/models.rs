//! `drift models list|search|pull|rm|import`: the model manager from the terminal.

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Result, anyhow, bail};
use indicatif::{ProgressBar, ProgressStyle};

use crate::hub::api::{RepoFile, RepoInfo, repo_info};
use crate::hub::catalog::Catalog;
use crate::hub::download::{hf_endpoint, hf_token};
use crate::hub::estimate::{self, DEFAULT_CONTEXT, DeviceMemory};
use crate::hub::kind::human_bytes;
use crate::hub::library::{self, Roots};
use crate::hub::manager::{DownloadManager, JobState, JobStatus, ManagerOptions};
use crate::hub::pull::{PullPlan, catalog_plan, files_plan, parse_spec};
use crate::paths::Paths;
use crate::settings::Settings;

#[derive(clap::Args)]
pub struct ModelsArgs {
    #[command(subcommand)]
    command: ModelsCommand,
}

#[derive(clap::Subcommand)]
enum ModelsCommand {
    /// List the models on disk (models folder, Hugging Face cache, imports) and whether they fit.
    List(ListArgs),
    /// Search the curated catalog by name.
    Search(SearchArgs),
    /// Download a catalog model (by id), a repo's file (REPO:FILE) or a repo (asks which files).
    Pull(PullArgs),
    /// Delete a model from the library.
    Rm(RmArgs),
    /// Add a GGUF file or model folder that lives elsewhere to the library (nothing is copied).
    Import(ImportArgs),
}

#[derive(clap::Args)]
struct ListArgs {
    /// Context length (tokens) for the memory estimate of LLMs.
    #[arg(long, default_value_t = DEFAULT_CONTEXT)]
    context: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct SearchArgs {
    /// Words to look for in ids, names and repos (nothing: the whole catalog).
    text: Vec<String>,
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct PullArgs {
    /// A catalog id (`drift models search`), `org/name` or `org/name:path/in/repo`.
    spec: String,
    /// File(s) of the repo to fetch (repeatable).
    #[arg(long)]
    file: Vec<String>,
    /// Fetch the repo's model folder (configs, tokenizer, safetensors) without asking.
    #[arg(long)]
    folder: bool,
    /// Branch, tag or commit (default: the catalog's pinned one, or main).
    #[arg(long)]
    revision: Option<String>,
    /// Hugging Face token for gated models (default: HF_TOKEN, then the settings).
    #[arg(long)]
    token: Option<String>,
}

#[derive(clap::Args)]
struct RmArgs {
    /// The model's id as `drift models list` shows it (or a unique part of it).
    id: String,
    /// Delete without asking.
    #[arg(long)]
    yes: bool,
}

#[derive(clap::Args)]
struct ImportArgs {
    /// A .gguf file or a model folder.
    path: PathBuf,
}

pub fn run(args: &ModelsArgs) -> Result<()> {
    let paths = Paths::from_env();
    let settings = Settings::load(&paths);
    match &args.command {
        ModelsCommand::List(a) => list(&settings, &paths, a),
        ModelsCommand::Search(a) => search(&settings, &paths, a),
        ModelsCommand::Pull(a) => pull(&settings, &paths, a),
        ModelsCommand::Rm(a) => rm(&settings, &paths, a),
        ModelsCommand::Import(a) => {
            let e = library::import(&Roots::new(&settings, &paths), &a.path)?;
            println!(
                "imported {}: {} {} {} {}",
                e.id,
                e.kind,
                e.format,
                e.quantization,
                human_bytes(e.size_bytes)
            );
            Ok(())
        }
    }
}

fn list(settings: &Settings, paths: &Paths, a: &ListArgs) -> Result<()> {
    let entries = library::list(settings, paths);
    let device = DeviceMemory::detect(None);
    let rows: Vec<_> = entries
        .iter()
        .map(|e| {
            let need = e.need(a.context).map(|n| n.total());
            let fit = need.map_or(estimate::Fit::Unknown, |n| estimate::fit(n, device.bytes));
            (e, need, fit)
        })
        .collect();
    if a.json {
        let v: Vec<_> = rows
            .iter()
            .map(|(e, need, fit)| {
                serde_json::json!({
                    "id": e.id, "name": e.name, "source": e.source.label(),
                    "path": e.path, "kind": e.kind, "format": e.format,
                    "quantization": e.quantization, "size_bytes": e.size_bytes,
                    "need_bytes": need, "fit": fit.label(),
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    if entries.is_empty() {
        println!(
            "No models yet in {} (nor in the Hugging Face cache).\n\
             Find one with `drift models search`, then `drift models pull ID`.",
            settings.models_dir(paths).display()
        );
        return Ok(());
    }
    let dev = device.bytes.map_or("unknown".to_string(), human_bytes);
    println!(
        "device memory: {dev} ({}); estimates at {} tokens",
        device.source, a.context
    );
    println!(
        "{:<48} {:<9} {:<11} {:<8} {:>10} {:>10}  FIT",
        "ID", "KIND", "FORMAT", "QUANT", "SIZE", "NEEDS"
    );
    for (e, need, fit) in rows {
        println!(
            "{:<48} {:<9} {:<11} {:<8} {:>10} {:>10}  {}",
            e.id,
            e.kind.to_string(),
            e.format.to_string(),
            e.quantization,
            human_bytes(e.size_bytes),
            need.map_or("?".into(), human_bytes),
            fit.label()
        );
    }
    Ok(())
}

fn search(settings: &Settings, paths: &Paths, a: &SearchArgs) -> Result<()> {
    let catalog = Catalog::builtin()?;
    let models_dir = settings.models_dir(paths);
    let hits = catalog.search(&a.text.join(" "));
    if a.json {
        let v: Vec<_> = hits
            .iter()
            .map(|e| {
                serde_json::json!({
                    "id": e.id, "name": e.name, "repo": e.repo, "revision": e.revision,
                    "kind": e.kind, "format": e.format, "quantization": e.quantization,
                    "license": e.license, "gated": e.gated, "download_bytes": e.download_size(),
                    "installed": e.is_installed(&models_dir),
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    if hits.is_empty() {
        println!(
            "Nothing in the catalog matches; any Hugging Face repo works too: `drift models pull org/name`."
        );
        return Ok(());
    }
    println!("{:<32} {:<9} {:>10}  NAME", "ID", "QUANT", "SIZE");
    for e in hits {
        let mut notes = Vec::new();
        if e.gated {
            notes.push("gated: needs a token");
        }
        if e.is_installed(&models_dir) {
            notes.push("installed");
        }
        let notes = if notes.is_empty() {
            String::new()
        } else {
            format!(" [{}]", notes.join(", "))
        };
        println!(
            "{:<32} {:<9} {:>10}  {}{notes}",
            e.id,
            e.quantization,
            human_bytes(e.download_size()),
            e.name
        );
    }
    Ok(())
}

/// `--token`, then `HF_TOKEN`, then the settings' token.
fn token(settings: &Settings, explicit: Option<&str>) -> Option<String> {
    hf_token(explicit).or_else(|| hf_token(settings.hf_token.as_deref()))
}

fn pull(settings: &Settings, paths: &Paths, a: &PullArgs) -> Result<()> {
    let catalog = Catalog::builtin()?;
    let endpoint = hf_endpoint();
    let models_dir = settings.models_dir(paths);
    let token = token(settings, a.token.as_deref());
    let plan = if let Some(e) = catalog.get(&a.spec) {
        if e.gated && token.is_none() {
            bail!(
                "{} is gated: accept its license on {endpoint}/{} and then set HF_TOKEN or pass --token",
                e.repo,
                e.repo
            );
        }
        catalog_plan(e, &models_dir, &endpoint, a.revision.as_deref(), token)
    } else {
        let (repo, file) = parse_spec(&a.spec).map_err(|e| {
            let ids: Vec<&str> = catalog
                .search(&a.spec)
                .iter()
                .map(|e| e.id.as_str())
                .collect();
            if ids.is_empty() {
                e
            } else {
                anyhow!("{e}; catalog ids that match: {}", ids.join(", "))
            }
        })?;
        let revision = a.revision.clone().unwrap_or_else(|| "main".into());
        let named: Vec<String> = file.into_iter().chain(a.file.iter().cloned()).collect();
        let files = if named.is_empty() {
            let info = repo_info(&endpoint, &repo, &revision, token.as_deref())?;
            choose_files(&info, a.folder)?
        } else {
            named
                .into_iter()
                .map(|path| RepoFile {
                    path,
                    size: None,
                    sha256: None,
                })
                .collect()
        };
        files_plan(&repo, &revision, &files, &models_dir, &endpoint, token)?
    };
    run_plan(&plan)
}

/// The files to fetch from a repo listing: `--folder`, the only candidate, or the user's pick.
fn choose_files(info: &RepoInfo, folder: bool) -> Result<Vec<RepoFile>> {
    let folder_set = info.folder_set();
    if folder {
        let set =
            folder_set.ok_or_else(|| anyhow!("{} has no safetensors model folder", info.repo))?;
        return Ok(set.into_iter().cloned().collect());
    }
    let mut options: Vec<(String, Vec<RepoFile>)> = info
        .ggufs()
        .into_iter()
        .map(|f| {
            (
                format!("{} ({})", f.path, size_text(f.size)),
                vec![f.clone()],
            )
        })
        .collect();
    if let Some(set) = folder_set {
        let total: u64 = set.iter().filter_map(|f| f.size).sum();
        options.push((
            format!(
                "the model folder: {} files ({})",
                set.len(),
                human_bytes(total)
            ),
            set.into_iter().cloned().collect(),
        ));
    }
    match options.len() {
        0 => bail!(
            "{} has no GGUF file and no safetensors model folder Drift can load",
            info.repo
        ),
        1 => {
            eprintln!("{}: fetching {}", info.repo, options[0].0);
            return Ok(options.remove(0).1);
        }
        _ => {}
    }
    let listing: String = options
        .iter()
        .enumerate()
        .map(|(i, (label, _))| format!("  {}. {label}\n", i + 1))
        .collect();
    if !std::io::stdin().is_terminal() {
        bail!(
            "{} holds several models; choose one with --file NAME (or REPO:FILE), or --folder:\n{listing}",
            info.repo
        );
    }
    eprint!(
        "{} holds several models:\n{listing}which one? [1-{}] ",
        info.repo,
        options.len()
    );
    std::io::stderr().flush()?;
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    let n: usize = line
        .trim()
        .parse()
        .ok()
        .filter(|n| (1..=options.len()).contains(n))
        .ok_or_else(|| anyhow!("no choice made ({:?})", line.trim()))?;
    Ok(options.swap_remove(n - 1).1)
}

fn size_text(size: Option<u64>) -> String {
    size.map_or("size unknown".into(), human_bytes)
}

/// Runs one job with a progress bar (a terminal) or progress lines every 10 % (a pipe, a log).
fn run_plan(plan: &PullPlan) -> Result<()> {
    let manager = DownloadManager::new(ManagerOptions {
        max_concurrent: 1,
        ..Default::default()
    });
    let id = manager.add(plan.job.clone());
    let tty = std::io::stderr().is_terminal();
    let bar = ProgressBar::new(0);
    if tty {
        bar.set_style(
            ProgressStyle::with_template(
                "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            )?
            .progress_chars("=> "),
        );
        bar.set_message(plan.job.label.clone());
    } else {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let mut last_decile = None;
    let status = loop {
        let s = manager
            .wait_for(id, Duration::from_millis(200), |s| s.state.is_settled())
            .ok_or_else(|| anyhow!("the download disappeared"))?;
        bar.set_length(s.total);
        bar.set_position(s.done);
        if !tty && s.total > 0 {
            let decile = s.done * 10 / s.total;
            if last_decile != Some(decile) {
                last_decile = Some(decile);
                eprintln!(
                    "{}: {}% ({} of {})",
                    s.label,
                    decile * 10,
                    human_bytes(s.done),
                    human_bytes(s.total)
                );
            }
        }
        if s.state.is_settled() {
            break s;
        }
    };
    bar.finish_and_clear();
    report(plan, &status)
}

fn report(plan: &PullPlan, s: &JobStatus) -> Result<()> {
    match &s.state {
        JobState::Done => {
            println!(
                "downloaded {} ({}) to {}; sha256 verified for {} of {} files",
                s.label,
                human_bytes(s.done),
                plan.path.display(),
                s.verified,
                s.files
            );
            Ok(())
        }
        JobState::Failed(msg) => bail!("{msg}"),
        JobState::Cancelled => bail!("download cancelled"),
        other => bail!("download stopped ({other:?}); run the same command again to resume"),
    }
}

fn rm(settings: &Settings, paths: &Paths, a: &RmArgs) -> Result<()> {
    let roots = Roots::new(settings, paths);
    let entries = library::list_roots(&roots);
    let e = library::find(&entries, &a.id)?;
    if !a.yes {
        if !std::io::stdin().is_terminal() {
            bail!("not deleting {} without confirmation: pass --yes", e.id);
        }
        eprint!(
            "Delete {} ({}, {}) at {}? [y/N] ",
            e.id,
            human_bytes(e.size_bytes),
            e.source.label(),
            e.path.display()
        );
        std::io::stderr().flush()?;
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line)?;
        if !matches!(line.trim(), "y" | "Y" | "yes") {
            println!("kept {}", e.id);
            return Ok(());
        }
    }
    println!("{}", library::remove(&roots, e)?);
    Ok(())
}
