//! The Stable Diffusion worker thread: owns the open pipeline (on the app's shared GPU device) so the UI
//! never blocks. A job makes `batch` images, each while holding the GPU queue (chat replies wait their
//! turn, and the other way round); every step streams a preview; every image is saved to the images
//! folder with its parameters. With profiling on, one UNet step is profiled after the job.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use drift_engine::Gpu;
use drift_engine::diffusion::display::DisplayTexture;
use drift_engine::diffusion::image::{Parameters, RgbImage, load_png, save_png};
use drift_engine::diffusion::pipeline::{ImageRequest, SdPipeline, StageTimes};
use drift_engine::diffusion::schedulers::SchedulerKind;
use eframe::egui;

use super::gpu_queue::GpuQueue;
use super::perf_log::{ProfiledRun, SharedPerfLog};

/// What to make: the model, the size and the request, `batch` times with seeds `seed, seed + 1, ...`.
#[derive(Clone, Debug)]
pub struct ImageJob {
    pub model: PathBuf,
    pub width: usize,
    pub height: usize,
    pub prompt: String,
    pub negative: String,
    pub steps: usize,
    pub cfg: f32,
    pub seed: u64,
    pub scheduler: SchedulerKind,
    /// img2img: a PNG (resized to the output size when it differs) and the strength (0..=1).
    pub init: Option<(PathBuf, f32)>,
    pub batch: usize,
    /// Profile one UNet step after the job (into the performance log).
    pub profile: bool,
    /// Also pack each image into a GPU texture for display (the UI draws with the same device).
    pub gpu_texture: bool,
}

/// One finished image.
pub struct FinishedImage {
    pub rgb: RgbImage,
    pub parameters: Parameters,
    pub scheduler: SchedulerKind,
    pub times: StageTimes,
    /// Where it was auto-saved, or why it could not be.
    pub saved: Result<PathBuf, String>,
    /// The image as a GPU texture, when the job asked for one.
    pub texture: Option<DisplayTexture>,
    pub warnings: Vec<String>,
}

pub enum Event {
    /// The pipeline is being (re)loaded.
    Loading,
    /// Image `image` (1-based) of `images` holds the GPU and runs.
    Started {
        image: usize,
        images: usize,
    },
    /// A step finished; `preview` is the cheap latent preview.
    Step {
        step: usize,
        steps: usize,
        preview: RgbImage,
    },
    Image(Box<FinishedImage>),
    Error(String),
    /// The job ended (all images made, cancelled or failed).
    Done,
}

pub struct SdWorker {
    jobs: Sender<ImageJob>,
    pub events: Receiver<Event>,
    /// Set to stop the job in progress (after the current step).
    pub cancel: Arc<AtomicBool>,
}

/// Where the worker writes and what it shares with the rest of the app.
pub struct WorkerContext {
    pub gpu: Arc<Gpu>,
    pub queue: GpuQueue,
    pub perf: SharedPerfLog,
    pub images_dir: PathBuf,
    pub egui_ctx: egui::Context,
}

/// The open pipeline and what it was opened for.
struct Loaded {
    model: PathBuf,
    width: usize,
    height: usize,
    pipe: SdPipeline,
}

impl SdWorker {
    pub fn spawn(cx: WorkerContext) -> SdWorker {
        let (jobs, rx) = channel::<ImageJob>();
        let (tx, events) = channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let stop = cancel.clone();
        std::thread::Builder::new()
            .name("drift-sd".into())
            .spawn(move || {
                let send = |e: Event| {
                    let _ = tx.send(e);
                    cx.egui_ctx.request_repaint();
                };
                let mut loaded: Option<Loaded> = None;
                for job in rx {
                    stop.store(false, Ordering::Relaxed);
                    if let Err(e) = run_job(&cx, &job, &mut loaded, &stop, &send) {
                        send(Event::Error(e));
                    }
                    send(Event::Done);
                }
            })
            .expect("spawning a thread");
        SdWorker {
            jobs,
            events,
            cancel,
        }
    }

    pub fn send(&self, job: ImageJob) {
        let _ = self.jobs.send(job);
    }
}

fn run_job(
    cx: &WorkerContext,
    job: &ImageJob,
    loaded: &mut Option<Loaded>,
    stop: &AtomicBool,
    send: &dyn Fn(Event),
) -> Result<(), String> {
    if job.batch == 0 || job.steps == 0 {
        return Err("steps and batch count must be at least 1".into());
    }
    let init = match &job.init {
        Some((path, strength)) => {
            if !(0.0..=1.0).contains(strength) {
                return Err(format!("img2img strength {strength} is not within 0..=1"));
            }
            let img = load_png(path).map_err(|e| format!("init image: {e}"))?;
            Some((resize_bilinear(&img, job.width, job.height), *strength))
        }
        None => None,
    };
    let mut made = 0;
    for i in 0..job.batch {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let _turn = cx.queue.acquire();
        let same = loaded.as_ref().is_some_and(|l| {
            l.model == job.model && (l.width, l.height) == (job.width, job.height)
        });
        if !same {
            send(Event::Loading);
            *loaded = None; // free the old pipeline's GPU memory first
            let pipe = SdPipeline::open(&cx.gpu, &job.model, job.width, job.height)
                .map_err(|e| format!("could not open {}: {e}", job.model.display()))?;
            *loaded = Some(Loaded {
                model: job.model.clone(),
                width: job.width,
                height: job.height,
                pipe,
            });
        }
        let pipe = &mut loaded.as_mut().expect("opened above").pipe;
        send(Event::Started {
            image: i + 1,
            images: job.batch,
        });
        let started = Instant::now();
        let req = ImageRequest {
            prompt: job.prompt.clone(),
            negative: job.negative.clone(),
            steps: job.steps,
            cfg: job.cfg,
            seed: job.seed.wrapping_add(i as u64),
            scheduler: job.scheduler,
            init: init.clone(),
            latents: None,
        };
        let result = pipe.generate(&cx.gpu, &req, &mut |step, steps, preview| {
            send(Event::Step {
                step,
                steps,
                preview: preview.clone(),
            });
            !stop.load(Ordering::Relaxed)
        });
        let r = match result {
            Ok(r) => r,
            Err(_) if stop.load(Ordering::Relaxed) => break,
            Err(e) => return Err(e.to_string()),
        };
        let texture = if job.gpu_texture {
            Some(pipe.decoded_texture(&cx.gpu).map_err(|e| e.to_string())?)
        } else {
            None
        };
        let seconds = started.elapsed().as_secs_f64();
        lock(&cx.perf).image_seconds.push(seconds);
        let saved = save_to(&cx.images_dir, &r.image, &r.parameters);
        made += 1;
        send(Event::Image(Box::new(FinishedImage {
            rgb: r.image,
            parameters: r.parameters,
            scheduler: job.scheduler,
            times: r.times,
            saved,
            texture,
            warnings: r.warnings,
        })));
    }
    if job.profile && made > 0 {
        let _turn = cx.queue.acquire();
        if let Some(l) = loaded.as_mut() {
            let profile = l
                .pipe
                .profile_unet_step(&cx.gpu)
                .map_err(|e| format!("profiling the UNet: {e}"))?;
            lock(&cx.perf).last_run = Some(ProfiledRun {
                label: format!("UNet step ({}x{}, batch 2)", l.width, l.height),
                profile,
            });
        }
    }
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Saves under `dir` as `drift-<unix seconds>-<seed>[-n].png` with the A1111 `parameters` chunk.
pub fn save_to(dir: &Path, img: &RgbImage, params: &Parameters) -> Result<PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let stem = format!("drift-{secs}-{}", params.seed);
    let mut path = dir.join(format!("{stem}.png"));
    let mut n = 2;
    while path.exists() {
        path = dir.join(format!("{stem}-{n}.png"));
        n += 1;
    }
    save_png(&path, img, Some(params)).map_err(|e| e.to_string())?;
    Ok(path)
}

/// Bilinear resize (pixel centres aligned), for an img2img picture of another size than the output.
pub fn resize_bilinear(img: &RgbImage, width: usize, height: usize) -> RgbImage {
    if (img.width, img.height) == (width, height) {
        return img.clone();
    }
    if img.width == 0 || img.height == 0 {
        return RgbImage {
            width,
            height,
            pixels: vec![0; 3 * width * height],
        };
    }
    let src = |x: usize, y: usize, c: usize| img.pixels[3 * (y * img.width + x) + c] as f32;
    let coord = |i: usize, out: usize, inp: usize| {
        let f = ((i as f32 + 0.5) * inp as f32 / out as f32 - 0.5).clamp(0.0, (inp - 1) as f32);
        let i0 = f.floor() as usize;
        (i0, (i0 + 1).min(inp - 1), f - i0 as f32)
    };
    let mut pixels = Vec::with_capacity(3 * width * height);
    for y in 0..height {
        let (y0, y1, fy) = coord(y, height, img.height);
        for x in 0..width {
            let (x0, x1, fx) = coord(x, width, img.width);
            for c in 0..3 {
                let top = src(x0, y0, c) * (1.0 - fx) + src(x1, y0, c) * fx;
                let bottom = src(x0, y1, c) * (1.0 - fx) + src(x1, y1, c) * fx;
                pixels.push((top * (1.0 - fy) + bottom * fy).round() as u8);
            }
        }
    }
    RgbImage {
        width,
        height,
        pixels,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(width: usize, height: usize, f: impl Fn(usize, usize, usize) -> u8) -> RgbImage {
        let mut pixels = Vec::new();
        for y in 0..height {
            for x in 0..width {
                pixels.extend((0..3).map(|c| f(x, y, c)));
            }
        }
        RgbImage {
            width,
            height,
            pixels,
        }
    }

    #[test]
    fn resize_keeps_flat_colours_and_linear_ramps() {
        let flat = image(5, 3, |_, _, c| [10, 200, 77][c]);
        let r = resize_bilinear(&flat, 16, 9);
        assert_eq!((r.width, r.height, r.pixels.len()), (16, 9, 16 * 9 * 3));
        assert!(r.pixels.chunks(3).all(|p| p == [10, 200, 77]));
        // Halving a horizontal ramp 0,10,20,...: each output pixel is the mean of two neighbours.
        let ramp = image(8, 2, |x, _, _| (10 * x) as u8);
        let half = resize_bilinear(&ramp, 4, 1);
        let reds: Vec<u8> = half.pixels.chunks(3).map(|p| p[0]).collect();
        assert_eq!(reds, [5, 25, 45, 65]);
        // Same size: unchanged.
        assert_eq!(resize_bilinear(&ramp, 8, 2).pixels, ramp.pixels);
    }

    #[test]
    fn saved_names_do_not_collide_and_carry_parameters() {
        let dir = std::env::temp_dir().join(format!("drift-sd-save-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let img = image(2, 2, |x, y, c| (x + 2 * y + c) as u8);
        let p = Parameters {
            prompt: "a fox".into(),
            negative: String::new(),
            steps: 3,
            sampler: "Euler".into(),
            cfg: 5.0,
            seed: 9,
            width: 2,
            height: 2,
            model: "m".into(),
        };
        let a = save_to(&dir, &img, &p).unwrap();
        let b = save_to(&dir, &img, &p).unwrap();
        assert_ne!(a, b);
        for f in [&a, &b] {
            let text = drift_engine::diffusion::image::read_parameters(f)
                .unwrap()
                .unwrap();
            assert!(text.starts_with("a fox\nSteps: 3"), "{text}");
        }
        // A file where the folder should be: an error with the path, not a panic.
        let blocked = dir.join("file");
        std::fs::write(&blocked, b"x").unwrap();
        let e = save_to(&blocked, &img, &p).unwrap_err();
        assert!(e.contains("file"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
