//! Live VRAM for the Performance tab: Drift's own bytes per category sampled a few times a second into
//! the performance log and plotted, against the device's total where the platform reports it (NVIDIA:
//! `nvidia-smi`, polled on a background thread); elsewhere the budget is shown as unknown, not guessed.

use std::sync::mpsc::{Receiver, TryRecvError, channel};
use std::time::{Duration, Instant};

use drift_engine::MemoryReport;
use eframe::egui;
use egui_plot::{HLine, Legend, Line, Plot, PlotPoints};

use super::perf_log::PerfLog;

/// How often the UI samples Drift's memory counters.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(250);
/// How often `nvidia-smi` is asked (it takes tens of milliseconds).
const DEVICE_POLL_EVERY: Duration = Duration::from_secs(2);

/// The device's memory as the driver reports it (all processes).
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceMemory {
    pub name: String,
    pub total_bytes: u64,
    pub used_bytes: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Budget {
    Checking,
    Known(DeviceMemory),
    Unknown,
}

/// Parses `nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader,nounits` (MiB),
/// picking the GPU whose name matches the adapter's (wgpu names it like the driver does), else the first.
pub fn parse_nvidia_smi(text: &str, adapter_name: &str) -> Option<DeviceMemory> {
    let gpus: Vec<DeviceMemory> = text
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split(',').map(str::trim).collect();
            let [name, total, used] = f.as_slice() else {
                return None;
            };
            let mib = |s: &str| s.parse::<u64>().ok().map(|v| v * 1024 * 1024);
            Some(DeviceMemory {
                name: name.to_string(),
                total_bytes: mib(total)?,
                used_bytes: mib(used)?,
            })
        })
        .collect();
    let wanted = adapter_name.to_ascii_lowercase();
    gpus.iter()
        .find(|g| {
            let n = g.name.to_ascii_lowercase();
            !n.is_empty() && (wanted.contains(&n) || n.contains(&wanted))
        })
        .or(gpus.first())
        .cloned()
}

/// Asks `nvidia-smi` every few seconds on a thread; stops when the monitor is dropped or the program is
/// missing (then the budget is unknown).
pub struct DeviceMonitor {
    rx: Receiver<Option<DeviceMemory>>,
    pub budget: Budget,
}

impl DeviceMonitor {
    pub fn spawn(adapter_name: String, ctx: egui::Context) -> DeviceMonitor {
        let (tx, rx) = channel();
        std::thread::Builder::new()
            .name("drift-nvidia-smi".into())
            .spawn(move || {
                loop {
                    let out = std::process::Command::new("nvidia-smi")
                        .args([
                            "--query-gpu=name,memory.total,memory.used",
                            "--format=csv,noheader,nounits",
                        ])
                        .output();
                    let mem = match out {
                        Ok(o) if o.status.success() => {
                            parse_nvidia_smi(&String::from_utf8_lossy(&o.stdout), &adapter_name)
                        }
                        _ => None,
                    };
                    let known = mem.is_some();
                    if tx.send(mem).is_err() || !known {
                        return;
                    }
                    ctx.request_repaint();
                    std::thread::sleep(DEVICE_POLL_EVERY);
                }
            })
            .expect("spawning a thread");
        DeviceMonitor {
            rx,
            budget: Budget::Checking,
        }
    }

    pub fn poll(&mut self) {
        loop {
            match self.rx.try_recv() {
                Ok(Some(m)) => self.budget = Budget::Known(m),
                Ok(None) => self.budget = Budget::Unknown,
                Err(TryRecvError::Empty) => return,
                Err(TryRecvError::Disconnected) => {
                    if self.budget == Budget::Checking {
                        self.budget = Budget::Unknown;
                    }
                    return;
                }
            }
        }
    }
}

/// Samples the counters into the log when `SAMPLE_EVERY` has passed since the last sample.
pub struct Sampler {
    last: Option<Instant>,
}

impl Sampler {
    pub fn new() -> Sampler {
        Sampler { last: None }
    }

    pub fn tick(&mut self, report: &MemoryReport, perf: &mut PerfLog) {
        if self.last.is_none_or(|t| t.elapsed() >= SAMPLE_EVERY) {
            perf.push_vram(report);
            self.last = Some(Instant::now());
        }
    }
}

/// Bytes for people: B, KiB, MiB or GiB.
pub fn fmt_bytes(b: u64) -> String {
    const K: f64 = 1024.0;
    let v = b as f64;
    if v < K {
        format!("{b} B")
    } else if v < K * K {
        format!("{:.1} KiB", v / K)
    } else if v < K * K * K {
        format!("{:.1} MiB", v / (K * K))
    } else {
        format!("{:.2} GiB", v / (K * K * K))
    }
}

/// The category table (now and peak), the device budget line and the plot over time.
pub fn vram_ui(ui: &mut egui::Ui, report: &MemoryReport, budget: &Budget, perf: &PerfLog) {
    egui::Grid::new("vram by category")
        .striped(true)
        .show(ui, |ui| {
            ui.strong("Category");
            ui.strong("Now");
            ui.strong("Peak");
            ui.end_row();
            for c in &report.categories {
                ui.label(c.name);
                ui.label(fmt_bytes(c.bytes));
                ui.label(fmt_bytes(c.peak_bytes));
                ui.end_row();
            }
            ui.strong("Drift total");
            ui.label(fmt_bytes(report.total_bytes));
            ui.label(fmt_bytes(report.peak_total_bytes));
            ui.end_row();
        });
    match budget {
        Budget::Checking => ui.weak("Device memory: checking..."),
        Budget::Unknown => ui.label(
            "Device memory: budget unknown (the platform does not report it; NVIDIA GPUs report \
             it through nvidia-smi)",
        ),
        Budget::Known(m) => ui.label(format!(
            "Device memory ({}): {} used by all processes of {} total; Drift {:.1}%",
            m.name,
            fmt_bytes(m.used_bytes),
            fmt_bytes(m.total_bytes),
            100.0 * report.total_bytes as f64 / m.total_bytes.max(1) as f64
        )),
    };
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    Plot::new("vram over time")
        .height(180.0)
        .legend(Legend::default())
        .x_axis_label("seconds")
        .y_axis_label("MiB")
        .include_y(0.0)
        .allow_scroll(false)
        .show(ui, |plot| {
            let names: Vec<&str> = report.categories.iter().map(|c| c.name).collect();
            for (k, name) in names.iter().enumerate() {
                // Only categories that held something in the window (an all-zero line is noise).
                if perf
                    .vram
                    .iter()
                    .all(|s| s.by_category.get(k).is_none_or(|c| c.1 == 0))
                {
                    continue;
                }
                let points: PlotPoints = perf
                    .vram
                    .iter()
                    .map(|s| [s.seconds, mib(s.by_category.get(k).map_or(0, |c| c.1))])
                    .collect();
                plot.line(Line::new(*name, points));
            }
            let total: PlotPoints = perf
                .vram
                .iter()
                .map(|s| [s.seconds, mib(s.total_bytes)])
                .collect();
            plot.line(Line::new("Drift total", total).width(2.0));
            plot.hline(HLine::new("Drift peak", mib(report.peak_total_bytes)));
            if let Budget::Known(m) = budget {
                plot.hline(HLine::new("device total", mib(m.total_bytes)));
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvidia_smi_output_is_parsed_and_matched_to_the_adapter() {
        let text = "NVIDIA A10, 23028, 512\nNVIDIA H200, 143771, 1024\n";
        let m = parse_nvidia_smi(text, "NVIDIA H200").unwrap();
        assert_eq!(m.name, "NVIDIA H200");
        assert_eq!(m.total_bytes, 143771 * 1024 * 1024);
        assert_eq!(m.used_bytes, 1024 * 1024 * 1024);
        // No name match: the first GPU.
        assert_eq!(
            parse_nvidia_smi(text, "llvmpipe").unwrap().name,
            "NVIDIA A10"
        );
        // Garbage and "[N/A]" fields are skipped, not guessed.
        assert_eq!(parse_nvidia_smi("NVIDIA X, [N/A], [N/A]\n", "x"), None);
        assert_eq!(parse_nvidia_smi("", "x"), None);
    }

    #[test]
    fn bytes_are_formatted_with_binary_units() {
        assert_eq!(fmt_bytes(0), "0 B");
        assert_eq!(fmt_bytes(1023), "1023 B");
        assert_eq!(fmt_bytes(1536), "1.5 KiB");
        assert_eq!(fmt_bytes(5 * 1024 * 1024), "5.0 MiB");
        assert_eq!(fmt_bytes(3 << 30), "3.00 GiB");
    }
}
