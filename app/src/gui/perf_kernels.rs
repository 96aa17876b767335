//! The last profiled run in the Performance tab: one row per kernel (calls, total, mean, share of GPU
//! time, achieved GB/s and GFLOP/s from each dispatch's cost), sortable by any column, and a timeline
//! with one bar per dispatch, a lane per kernel.

use std::collections::HashMap;

use drift_engine::profiler::Profile;
use eframe::egui;
use egui_plot::{Bar, BarChart, Plot};

/// One kernel's share of a run.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelRow {
    pub name: String,
    pub calls: usize,
    pub total_ms: f64,
    pub mean_us: f64,
    /// Fraction of the run's summed dispatch time.
    pub share: f64,
    /// Bytes moved per second of this kernel's time, when its dispatches declare bytes.
    pub gb_per_s: Option<f64>,
    pub gflop_per_s: Option<f64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Column {
    Kernel,
    Calls,
    TotalMs,
    MeanUs,
    Share,
    GbPerS,
    GflopPerS,
}

impl Column {
    pub const ALL: [Column; 7] = [
        Column::Kernel,
        Column::Calls,
        Column::TotalMs,
        Column::MeanUs,
        Column::Share,
        Column::GbPerS,
        Column::GflopPerS,
    ];

    pub fn title(self) -> &'static str {
        match self {
            Column::Kernel => "Kernel",
            Column::Calls => "Calls",
            Column::TotalMs => "Total ms",
            Column::MeanUs => "Mean µs",
            Column::Share => "Share",
            Column::GbPerS => "GB/s",
            Column::GflopPerS => "GFLOP/s",
        }
    }
}

/// Which column orders the table, and which way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SortOrder {
    pub column: Column,
    pub descending: bool,
}

impl Default for SortOrder {
    fn default() -> SortOrder {
        SortOrder {
            column: Column::TotalMs,
            descending: true,
        }
    }
}

impl SortOrder {
    /// A click on `column`'s header: the same column flips direction, another starts descending
    /// (names ascending).
    pub fn click(&mut self, column: Column) {
        if self.column == column {
            self.descending = !self.descending;
        } else {
            *self = SortOrder {
                column,
                descending: column != Column::Kernel,
            };
        }
    }
}

/// Per-kernel rows of `profile` (aggregated by kernel name), slowest first.
pub fn kernel_rows(profile: &Profile) -> Vec<KernelRow> {
    let busy_us = profile.busy_us();
    let mut cost: HashMap<&str, (f64, f64)> = HashMap::new();
    for d in &profile.dispatches {
        let c = cost.entry(&d.name).or_default();
        c.0 += d.flops;
        c.1 += d.bytes;
    }
    profile
        .by_kernel()
        .into_iter()
        .map(|k| {
            let (flops, bytes) = cost.get(k.name.as_str()).copied().unwrap_or_default();
            // per µs -> per s is 1e6; GB and GFLOP are 1e9: net 1e-3.
            let rate = |v: f64| (v > 0.0 && k.total_us > 0.0).then(|| v / k.total_us * 1e-3);
            KernelRow {
                calls: k.calls,
                total_ms: k.total_us / 1e3,
                mean_us: k.mean_us,
                share: if busy_us > 0.0 {
                    k.total_us / busy_us
                } else {
                    0.0
                },
                gb_per_s: rate(bytes),
                gflop_per_s: rate(flops),
                name: k.name,
            }
        })
        .collect()
}

/// Sorts rows by `order` (missing rates sort below every known rate).
pub fn sort_rows(rows: &mut [KernelRow], order: SortOrder) {
    let key = |r: &KernelRow| -> f64 {
        match order.column {
            Column::Kernel | Column::TotalMs => r.total_ms,
            Column::Calls => r.calls as f64,
            Column::MeanUs => r.mean_us,
            Column::Share => r.share,
            Column::GbPerS => r.gb_per_s.unwrap_or(-1.0),
            Column::GflopPerS => r.gflop_per_s.unwrap_or(-1.0),
        }
    };
    rows.sort_by(|a, b| {
        let o = if order.column == Column::Kernel {
            a.name.cmp(&b.name)
        } else {
            key(a).total_cmp(&key(b))
        };
        if order.descending { o.reverse() } else { o }
    });
}

/// The table with clickable headers.
pub fn kernel_table(ui: &mut egui::Ui, rows: &[KernelRow], order: &mut SortOrder) {
    let rate = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.1}"));
    egui::ScrollArea::vertical()
        .id_salt("kernel table")
        .max_height(260.0)
        .show(ui, |ui| {
            egui::Grid::new("kernels")
                .striped(true)
                .num_columns(Column::ALL.len())
                .show(ui, |ui| {
                    for c in Column::ALL {
                        let arrow = match (order.column == c, order.descending) {
                            (false, _) => "",
                            (true, true) => " v",
                            (true, false) => " ^",
                        };
                        let title = format!("{}{arrow}", c.title());
                        if ui.selectable_label(order.column == c, title).clicked() {
                            order.click(c);
                        }
                    }
                    ui.end_row();
                    for r in rows {
                        ui.label(&r.name);
                        ui.label(r.calls.to_string());
                        ui.label(format!("{:.3}", r.total_ms));
                        ui.label(format!("{:.1}", r.mean_us));
                        ui.label(format!("{:.1}%", 100.0 * r.share));
                        ui.label(rate(r.gb_per_s));
                        ui.label(rate(r.gflop_per_s));
                        ui.end_row();
                    }
                });
        });
}

/// One bar per dispatch on a time axis (µs from the first dispatch); one lane per kernel, slowest on top.
pub fn timeline(ui: &mut egui::Ui, profile: &Profile) {
    let lanes: Vec<String> = profile.by_kernel().into_iter().map(|k| k.name).collect();
    let lane_of: HashMap<&str, usize> = lanes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), i))
        .collect();
    let n = lanes.len();
    let mut charts: Vec<Vec<Bar>> = vec![Vec::new(); n];
    for d in &profile.dispatches {
        let lane = lane_of[d.name.as_str()];
        charts[lane].push(
            Bar::new((n - 1 - lane) as f64, d.duration_us.max(1e-3))
                .base_offset(d.start_us)
                .width(0.8)
                .name(format!(
                    "{}: {:.1} µs at {:.1} µs",
                    d.name, d.duration_us, d.start_us
                )),
        );
    }
    Plot::new("dispatch timeline")
        .height(220.0)
        .x_axis_label("µs")
        .show_axes([true, false])
        .allow_scroll(false)
        .show(ui, |plot| {
            for (lane, bars) in charts.into_iter().enumerate() {
                plot.bar_chart(BarChart::new(lanes[lane].clone(), bars).horizontal());
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;
    use drift_engine::profiler::{DispatchTiming, TimingSource};

    fn d(name: &str, start_us: f64, duration_us: f64, flops: f64, bytes: f64) -> DispatchTiming {
        DispatchTiming {
            name: name.into(),
            start_us,
            duration_us,
            flops,
            bytes,
        }
    }

    fn profile() -> Profile {
        Profile {
            source: TimingSource::Cpu,
            dispatches: vec![
                d("matmul", 0.0, 300.0, 6e6, 1e6),
                d("norm", 300.0, 50.0, 0.0, 2e5),
                d("matmul", 350.0, 100.0, 2e6, 1e6),
                d("copy", 450.0, 50.0, 0.0, 0.0),
            ],
            wall_us: 600.0,
        }
    }

    #[test]
    fn rows_aggregate_per_kernel_with_rates_and_shares() {
        let rows = kernel_rows(&profile());
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0].name, "matmul", "slowest first");
        let mm = &rows[0];
        assert_eq!(mm.calls, 2);
        assert!((mm.total_ms - 0.4).abs() < 1e-12);
        assert!((mm.mean_us - 200.0).abs() < 1e-12);
        assert!((mm.share - 0.8).abs() < 1e-12); // 400 of 500 µs
        // 2e6 bytes in 400 µs = 5 GB/s; 8e6 flops in 400 µs = 20 GFLOP/s.
        assert!((mm.gb_per_s.unwrap() - 5.0).abs() < 1e-9);
        assert!((mm.gflop_per_s.unwrap() - 20.0).abs() < 1e-9);
        let norm = rows.iter().find(|r| r.name == "norm").unwrap();
        assert!((norm.gb_per_s.unwrap() - 4.0).abs() < 1e-9);
        assert_eq!(norm.gflop_per_s, None, "no flops declared: no rate");
        let copy = rows.iter().find(|r| r.name == "copy").unwrap();
        assert_eq!((copy.gb_per_s, copy.gflop_per_s), (None, None));
        let shares: f64 = rows.iter().map(|r| r.share).sum();
        assert!((shares - 1.0).abs() < 1e-12);
    }

    #[test]
    fn header_clicks_sort_each_column_both_ways() {
        let mut rows = kernel_rows(&profile());
        let mut order = SortOrder::default();
        let names = |rows: &[KernelRow]| rows.iter().map(|r| r.name.clone()).collect::<Vec<_>>();
        order.click(Column::Kernel);
        assert_eq!(
            order,
            SortOrder {
                column: Column::Kernel,
                descending: false
            }
        );
        sort_rows(&mut rows, order);
        assert_eq!(names(&rows), ["copy", "matmul", "norm"]);
        order.click(Column::Kernel);
        sort_rows(&mut rows, order);
        assert_eq!(names(&rows), ["norm", "matmul", "copy"]);
        order.click(Column::GflopPerS);
        assert!(order.descending);
        sort_rows(&mut rows, order);
        assert_eq!(rows[0].name, "matmul", "the only kernel with flops first");
        order.click(Column::Calls);
        sort_rows(&mut rows, order);
        assert_eq!(rows[0].calls, 2);
        order.click(Column::Calls);
        sort_rows(&mut rows, order);
        assert_eq!(rows[2].calls, 2);
        order.click(Column::GbPerS);
        sort_rows(&mut rows, order);
        assert_eq!(
            names(&rows),
            ["matmul", "norm", "copy"],
            "unknown rates last"
        );
    }
}
