//! The Models tab: the library (what is on disk, with size, format, quantization and whether it fits
//! the device), the curated catalog with Download buttons, "add by repo id", the downloads with
//! progress bars (pause, resume, cancel), Import GGUF, the models folder and the Hugging Face token.
//! Scanning, listing a repo and downloading all run on threads; the UI only polls.

use std::path::PathBuf;
use std::sync::mpsc::{Receiver, TryRecvError, channel};
use std::time::Duration;

use eframe::egui;

use super::AppContext;
use super::serve_panel::ServePanel;
use crate::hub::api::{RepoFile, RepoInfo, repo_info};
use crate::hub::catalog::{Catalog, CatalogEntry};
use crate::hub::download::{hf_endpoint, hf_token};
use crate::hub::estimate::{self, DEFAULT_CONTEXT, DeviceMemory, Fit};
use crate::hub::kind::{ModelKind, human_bytes};
use crate::hub::library::{self, LibraryEntry, Roots};
use crate::hub::manager::{DownloadManager, JobId, JobState, JobStatus, ManagerOptions};
use crate::hub::pull::{PullPlan, catalog_plan, files_plan};

/// Downloads running at once.
const MAX_DOWNLOADS: usize = 2;

enum Picked {
    Import(PathBuf),
    ModelsFolder(PathBuf),
}

pub struct ModelsPanel {
    catalog: Result<Catalog, String>,
    search: String,
    manager: DownloadManager,
    /// Catalog id (or repo label) of each job, to show its state next to the entry.
    jobs: Vec<(String, JobId)>,
    finished_seen: Vec<JobId>,
    library: Vec<LibraryEntry>,
    device: Option<DeviceMemory>,
    context: u64,
    scanning: Option<Receiver<(Vec<LibraryEntry>, DeviceMemory)>>,
    rescan: bool,
    confirm_delete: Option<String>,
    message: Option<String>,
    repo_input: String,
    listing: Option<Receiver<Result<RepoInfo, String>>>,
    repo: Option<RepoInfo>,
    picker: Option<Receiver<Option<Picked>>>,
    token_input: String,
    serve: ServePanel,
}

impl ModelsPanel {
    pub fn new(app: &AppContext) -> ModelsPanel {
        ModelsPanel {
            catalog: Catalog::builtin().map_err(|e| format!("{e:#}")),
            search: String::new(),
            manager: DownloadManager::new(ManagerOptions {
                max_concurrent: MAX_DOWNLOADS,
                ..Default::default()
            }),
            jobs: Vec::new(),
            finished_seen: Vec::new(),
            library: Vec::new(),
            device: None,
            context: DEFAULT_CONTEXT,
            scanning: None,
            rescan: true,
            confirm_delete: None,
            message: None,
            repo_input: String::new(),
            listing: None,
            repo: None,
            picker: None,
            token_input: app.settings.hf_token.clone().unwrap_or_default(),
            serve: ServePanel::new(app),
        }
    }

    /// Where the window's OpenAI-compatible server listens, while it runs.
    pub fn serve_addr(&self) -> Option<std::net::SocketAddr> {
        self.serve.addr()
    }

    pub fn poll(&mut self, app: &mut AppContext) {
        if let Some(addr) = self.serve_addr() {
            app.activity
                .push(format!("serving the OpenAI API on {addr}"));
        }
        if let Some(rx) = &self.scanning {
            match rx.try_recv() {
                Ok((entries, device)) => {
                    self.library = entries;
                    self.device = Some(device);
                    self.scanning = None;
                    // A server left on at exit starts once the library is known.
                    self.serve.sync(app, &self.library);
                }
                Err(TryRecvError::Disconnected) => self.scanning = None,
                Err(TryRecvError::Empty) => {}
            }
        }
        if let Some(rx) = &self.listing {
            match rx.try_recv() {
                Ok(Ok(info)) => {
                    self.repo = Some(info);
                    self.listing = None;
                }
                Ok(Err(e)) => {
                    self.message = Some(e);
                    self.listing = None;
                }
                Err(TryRecvError::Disconnected) => self.listing = None,
                Err(TryRecvError::Empty) => {}
            }
        }
        if let Some(rx) = &self.picker {
            match rx.try_recv() {
                Ok(picked) => {
                    self.picker = None;
                    self.apply_pick(app, picked);
                }
                Err(TryRecvError::Disconnected) => self.picker = None,
                Err(TryRecvError::Empty) => {}
            }
        }
        let statuses = self.manager.statuses();
        for s in &statuses {
            if s.state.is_settled() && !self.finished_seen.contains(&s.id) {
                self.finished_seen.push(s.id);
                if s.state == JobState::Done {
                    self.rescan = true;
                }
            }
        }
        let running = statuses
            .iter()
            .filter(|s| s.state == JobState::Running)
            .count();
        if running > 0 {
            app.activity.push(format!("Models: {running} downloading"));
            app.egui_ctx
                .request_repaint_after(Duration::from_millis(250));
        }
        if self.scanning.is_some() || self.listing.is_some() || self.picker.is_some() {
            app.egui_ctx
                .request_repaint_after(Duration::from_millis(100));
        }
        if self.rescan && self.scanning.is_none() {
            self.rescan = false;
            self.start_scan(app);
        }
    }

    fn start_scan(&mut self, app: &AppContext) {
        let (tx, rx) = channel();
        let (settings, paths, ctx) = (
            app.settings.clone(),
            app.paths.clone(),
            app.egui_ctx.clone(),
        );
        let device_type = app.gpu.describe().device_type;
        let spawned = std::thread::Builder::new()
            .name("drift-library-scan".into())
            .spawn(move || {
                let entries = library::list(&settings, &paths);
                let _ = tx.send((entries, DeviceMemory::detect(Some(&device_type))));
                ctx.request_repaint();
            });
        if spawned.is_ok() {
            self.scanning = Some(rx);
        }
    }

    fn apply_pick(&mut self, app: &mut AppContext, picked: Option<Picked>) {
        match picked {
            Some(Picked::Import(path)) => {
                let roots = Roots::new(&app.settings, &app.paths);
                self.message = Some(match library::import(&roots, &path) {
                    Ok(e) => format!("Imported {}", e.id),
                    Err(e) => format!("Could not import {}: {e:#}", path.display()),
                });
                self.rescan = true;
            }
            Some(Picked::ModelsFolder(path)) => {
                app.settings.models_dir = Some(path);
                app.save_settings();
                self.rescan = true;
            }
            None => {}
        }
    }

    fn browse(&mut self, ctx: &egui::Context, folder: bool) {
        let (tx, rx) = channel();
        let ctx = ctx.clone();
        let spawned = std::thread::Builder::new()
            .name("drift-file-dialog".into())
            .spawn(move || {
                let picked = if folder {
                    rfd::FileDialog::new()
                        .set_title("Choose the models folder")
                        .pick_folder()
                        .map(Picked::ModelsFolder)
                } else {
                    rfd::FileDialog::new()
                        .set_title("Import a GGUF model")
                        .add_filter("GGUF model", &["gguf"])
                        .pick_file()
                        .map(Picked::Import)
                };
                let _ = tx.send(picked);
                ctx.request_repaint();
            });
        if spawned.is_ok() {
            self.picker = Some(rx);
        }
    }

    fn token(&self, app: &AppContext) -> Option<String> {
        hf_token(None).or_else(|| hf_token(app.settings.hf_token.as_deref()))
    }

    fn start_download(&mut self, key: String, plan: PullPlan) {
        let id = self.manager.add(plan.job);
        self.jobs.push((key, id));
    }

    pub fn ui(&mut self, ui: &mut egui::Ui, app: &mut AppContext) {
        self.settings_rows(ui, app);
        if let Some(m) = self.message.clone() {
            ui.horizontal(|ui| {
                ui.label(m);
                if ui.small_button("Dismiss").clicked() {
                    self.message = None;
                }
            });
        }
        ui.separator();
        egui::ScrollArea::vertical()
            .auto_shrink([false, false])
            .show(ui, |ui| {
                self.downloads_section(ui);
                egui::CollapsingHeader::new("Library")
                    .default_open(true)
                    .show(ui, |ui| self.library_section(ui, app));
                egui::CollapsingHeader::new("Catalog")
                    .default_open(true)
                    .show(ui, |ui| self.catalog_section(ui, app));
                egui::CollapsingHeader::new("Add by repo id")
                    .default_open(false)
                    .show(ui, |ui| self.repo_section(ui, app));
                egui::CollapsingHeader::new("Local server")
                    .default_open(app.settings.serve_enabled)
                    .show(ui, |ui| self.serve.ui(ui, app, &self.library));
            });
    }

    fn settings_rows(&mut self, ui: &mut egui::Ui, app: &mut AppContext) {
        ui.horizontal(|ui| {
            let label = ui.label("Models folder");
            let dir = app.settings.models_dir(&app.paths).display().to_string();
            ui.add(egui::Label::new(egui::RichText::new(dir).monospace()))
                .labelled_by(label.id);
            if ui
                .add_enabled(self.picker.is_none(), egui::Button::new("Choose folder…"))
                .clicked()
            {
                self.browse(ui.ctx(), true);
            }
        });
        ui.horizontal(|ui| {
            let label = ui.label("Hugging Face token");
            let edit = ui
                .add(
                    egui::TextEdit::singleline(&mut self.token_input)
                        .password(true)
                        .hint_text("for gated models (HF_TOKEN wins when set)")
                        .desired_width(320.0),
                )
                .labelled_by(label.id);
            if edit.lost_focus() {
                let t = self.token_input.trim();
                let new = (!t.is_empty()).then(|| t.to_string());
                if new != app.settings.hf_token {
                    app.settings.hf_token = new;
                    app.save_settings();
                }
            }
            let label = ui.label("Context for estimates (tokens)");
            ui.add(egui::DragValue::new(&mut self.context).range(256..=131_072))
                .labelled_by(label.id);
        });
    }

    fn fit_text(&self, need: Option<u64>) -> String {
        let Some(need) = need else {
            return "?".into();
        };
        let device = self.device.as_ref().and_then(|d| d.bytes);
        match estimate::fit(need, device) {
            Fit::Unknown => format!("needs {}", human_bytes(need)),
            f => format!("{} ({})", f.label(), human_bytes(need)),
        }
    }

    fn downloads_section(&mut self, ui: &mut egui::Ui) {
        let statuses = self.manager.statuses();
        if statuses.is_empty() {
            return;
        }
        egui::CollapsingHeader::new("Downloads")
            .default_open(true)
            .show(ui, |ui| {
                for s in &statuses {
                    self.download_row(ui, s);
                }
                if statuses
                    .iter()
                    .any(|s| s.state.is_settled() && s.state != JobState::Paused)
                    && ui.button("Clear finished").clicked()
                {
                    self.manager.clear_settled();
                    let live: Vec<JobId> = self.manager.statuses().iter().map(|s| s.id).collect();
                    self.jobs.retain(|(_, id)| live.contains(id));
                }
            });
    }

    fn download_row(&self, ui: &mut egui::Ui, s: &JobStatus) {
        ui.horizontal(|ui| {
            let frac = if s.total > 0 {
                s.done as f32 / s.total as f32
            } else {
                0.0
            };
            let detail = match &s.state {
                JobState::Queued => "queued".to_string(),
                JobState::Running => {
                    let eta = s
                        .eta
                        .map_or(String::new(), |e| format!(", {} s left", e.as_secs()));
                    format!(
                        "{} of {} at {}/s{eta}",
                        human_bytes(s.done),
                        human_bytes(s.total),
                        human_bytes(s.rate as u64)
                    )
                }
                JobState::Paused => format!("paused at {}", human_bytes(s.done)),
                JobState::Done => format!(
                    "done, {} (sha256 verified for {} of {} files)",
                    human_bytes(s.done),
                    s.verified,
                    s.files
                ),
                JobState::Failed(e) => format!("failed: {e}"),
                JobState::Cancelled => "cancelled".into(),
            };
            ui.add(
                egui::ProgressBar::new(frac)
                    .desired_width(260.0)
                    .text(format!("{}: {detail}", s.label)),
            );
            let a11y = |verb: &str| format!("{verb} {}", s.label);
            match &s.state {
                JobState::Queued | JobState::Running => {
                    if labeled_button(ui, "Pause", &a11y("Pause")).clicked() {
                        self.manager.pause(s.id);
                    }
                    if labeled_button(ui, "Cancel", &a11y("Cancel")).clicked() {
                        self.manager.cancel(s.id);
                    }
                }
                JobState::Paused | JobState::Failed(_) => {
                    let verb = if s.state == JobState::Paused {
                        "Resume"
                    } else {
                        "Retry"
                    };
                    if labeled_button(ui, verb, &a11y(verb)).clicked() {
                        self.manager.resume(s.id);
                    }
                    if labeled_button(ui, "Cancel", &a11y("Cancel")).clicked() {
                        self.manager.cancel(s.id);
                    }
                }
                _ => {}
            }
        });
    }

    fn library_section(&mut self, ui: &mut egui::Ui, app: &mut AppContext) {
        ui.horizontal(|ui| {
            if ui.button("Refresh").clicked() {
                self.rescan = true;
            }
            if ui
                .add_enabled(self.picker.is_none(), egui::Button::new("Import GGUF…"))
                .clicked()
            {
                self.browse(ui.ctx(), false);
            }
            if self.scanning.is_some() {
                ui.spinner();
                ui.label("scanning");
            }
            if let Some(d) = &self.device {
                let mem = d.bytes.map_or("unknown".to_string(), human_bytes);
                ui.label(format!("Device memory: {mem} ({})", d.source));
            }
        });
        if self.library.is_empty() && self.scanning.is_none() {
            ui.label("No models yet: download one from the catalog below, or import a GGUF file.");
            return;
        }
        let mut delete = None;
        egui::Grid::new("library")
            .striped(true)
            .num_columns(7)
            .show(ui, |ui| {
                for h in [
                    "Model",
                    "Kind",
                    "Format",
                    "Quantization",
                    "Size",
                    "Memory",
                    "",
                ] {
                    ui.strong(h);
                }
                ui.end_row();
                for e in &self.library {
                    ui.label(&e.name).on_hover_text(format!(
                        "{}\n{} ({})",
                        e.id,
                        e.path.display(),
                        e.source.label()
                    ));
                    ui.label(e.kind.to_string());
                    ui.label(e.format.to_string());
                    ui.label(&e.quantization);
                    ui.label(human_bytes(e.size_bytes));
                    ui.label(self.fit_text(e.need(self.context).map(|n| n.total())));
                    if self.confirm_delete.as_deref() == Some(e.id.as_str()) {
                        ui.horizontal(|ui| {
                            let what = if e.source == library::Source::Imported {
                                "Remove from library"
                            } else {
                                "Yes, delete"
                            };
                            if labeled_button(ui, what, &format!("Confirm delete {}", e.id))
                                .clicked()
                            {
                                delete = Some(e.clone());
                            }
                            if labeled_button(ui, "Keep", &format!("Keep {}", e.id)).clicked() {
                                self.confirm_delete = None;
                            }
                        });
                    } else if labeled_button(ui, "Delete", &format!("Delete {}", e.id)).clicked() {
                        self.confirm_delete = Some(e.id.clone());
                    }
                    ui.end_row();
                }
            });
        if let Some(e) = delete {
            self.confirm_delete = None;
            let roots = Roots::new(&app.settings, &app.paths);
            self.message = Some(match library::remove(&roots, &e) {
                Ok(m) => m,
                Err(err) => format!("Could not delete {}: {err:#}", e.id),
            });
            self.rescan = true;
        }
    }

    /// The job state for a catalog entry, if one was started.
    fn job_for(&self, key: &str) -> Option<JobStatus> {
        self.jobs
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .and_then(|(_, id)| self.manager.status(*id))
    }

    fn catalog_section(&mut self, ui: &mut egui::Ui, app: &mut AppContext) {
        let catalog = match &self.catalog {
            Ok(c) => c.clone(),
            Err(e) => {
                ui.label(format!("The catalog could not be read: {e}"));
                return;
            }
        };
        ui.horizontal(|ui| {
            let label = ui.label("Search catalog");
            ui.add(
                egui::TextEdit::singleline(&mut self.search)
                    .hint_text("qwen, smollm2 gguf, diffusion…"),
            )
            .labelled_by(label.id);
        });
        let models_dir = app.settings.models_dir(&app.paths);
        let mut start: Option<&CatalogEntry> = None;
        egui::Grid::new("catalog")
            .striped(true)
            .num_columns(5)
            .show(ui, |ui| {
                for h in ["Model", "Quantization", "Download", "Memory", ""] {
                    ui.strong(h);
                }
                ui.end_row();
                for e in catalog.search(&self.search) {
                    let mut name = e.name.clone();
                    if e.gated {
                        name.push_str(" (gated: needs a token)");
                    }
                    ui.label(name).on_hover_text(format!(
                        "{} @ {}\nlicense: {}",
                        e.repo, e.revision, e.license
                    ));
                    ui.label(&e.quantization);
                    ui.label(human_bytes(e.download_size()));
                    let need = match (e.kind, &e.llm) {
                        (ModelKind::Llm, Some(s)) => {
                            Some(estimate::llm_need(e.weights_size(), s, self.context).total())
                        }
                        (ModelKind::Diffusion, _) => {
                            Some(estimate::diffusion_need(e.weights_size(), 512, 512).total())
                        }
                        _ => None,
                    };
                    ui.label(self.fit_text(need));
                    let job = self.job_for(&e.id);
                    match job.as_ref().map(|j| &j.state) {
                        Some(JobState::Queued | JobState::Running | JobState::Paused) => {
                            ui.label("downloading (see Downloads)");
                        }
                        _ if e.is_installed(&models_dir) => {
                            ui.label("in library");
                        }
                        _ => {
                            if labeled_button(ui, "Download", &format!("Download {}", e.name))
                                .clicked()
                            {
                                start = Some(e);
                            }
                        }
                    }
                    ui.end_row();
                }
            });
        if let Some(e) = start {
            let token = self.token(app);
            if e.gated && token.is_none() {
                self.message = Some(format!(
                    "{} is gated: accept its license on huggingface.co, then enter a token above",
                    e.repo
                ));
            } else {
                let plan = catalog_plan(e, &models_dir, &hf_endpoint(), None, token);
                self.start_download(e.id.clone(), plan);
            }
        }
    }

    fn repo_section(&mut self, ui: &mut egui::Ui, app: &mut AppContext) {
        ui.horizontal(|ui| {
            let label = ui.label("Repo id");
            ui.add(egui::TextEdit::singleline(&mut self.repo_input).hint_text("org/name"))
                .labelled_by(label.id);
            let repo = self.repo_input.trim().to_string();
            if ui
                .add_enabled(
                    self.listing.is_none() && !repo.is_empty(),
                    egui::Button::new("List files"),
                )
                .clicked()
            {
                let (tx, rx) = channel();
                let (token, ctx) = (self.token(app), ui.ctx().clone());
                let spawned = std::thread::Builder::new()
                    .name("drift-repo-listing".into())
                    .spawn(move || {
                        let r = repo_info(&hf_endpoint(), &repo, "main", token.as_deref())
                            .map_err(|e| format!("{e:#}"));
                        let _ = tx.send(r);
                        ctx.request_repaint();
                    });
                if spawned.is_ok() {
                    self.repo = None;
                    self.listing = Some(rx);
                }
            }
            if self.listing.is_some() {
                ui.spinner();
            }
        });
        let Some(info) = self.repo.clone() else {
            return;
        };
        let mut choice: Option<Vec<RepoFile>> = None;
        for f in info.ggufs() {
            ui.horizontal(|ui| {
                ui.label(format!(
                    "{} ({})",
                    f.path,
                    f.size.map_or("?".into(), human_bytes)
                ));
                if labeled_button(ui, "Download", &format!("Download {}", f.path)).clicked() {
                    choice = Some(vec![f.clone()]);
                }
            });
        }
        if let Some(set) = info.folder_set() {
            ui.horizontal(|ui| {
                let total: u64 = set.iter().filter_map(|f| f.size).sum();
                ui.label(format!(
                    "Model folder: {} files ({})",
                    set.len(),
                    human_bytes(total)
                ));
                if labeled_button(
                    ui,
                    "Download folder",
                    &format!("Download folder {}", info.repo),
                )
                .clicked()
                {
                    choice = Some(set.into_iter().cloned().collect());
                }
            });
        }
        if info.ggufs().is_empty() && info.folder_set().is_none() {
            ui.label("This repo has no GGUF file or safetensors model folder Drift can load.");
        }
        if let Some(files) = choice {
            let models_dir = app.settings.models_dir(&app.paths);
            match files_plan(
                &info.repo,
                "main",
                &files,
                &models_dir,
                &hf_endpoint(),
                self.token(app),
            ) {
                Ok(plan) => {
                    let key = plan.job.label.clone();
                    self.start_download(key, plan);
                }
                Err(e) => self.message = Some(format!("{e:#}")),
            }
        }
    }
}

/// A button whose accessible label says what it acts on ("Delete org/model"), where the visible
/// text alone ("Delete") would be ambiguous in a list.
fn labeled_button(ui: &mut egui::Ui, text: &str, a11y: &str) -> egui::Response {
    let r = ui.button(text);
    let enabled = r.enabled();
    r.widget_info(|| egui::WidgetInfo::labeled(egui::Role::Button, enabled, a11y));
    r
}
