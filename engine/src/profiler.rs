//! Per-dispatch GPU timing, aggregated per kernel, with Chrome trace export.
//!
//! Three ways to time, best first: timestamps written inside one compute pass around every dispatch
//! (TIMESTAMP_QUERY_INSIDE_PASSES), one pass per dispatch with pass timestamps (TIMESTAMP_QUERY), or CPU
//! wall time of a submit-and-wait per dispatch when the device has no timestamps.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::Serialize;

use crate::error::{DriftError, Result};
use crate::exec::Program;
use crate::gpu::Gpu;
use crate::memory::{Category, GpuBuffer};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum TimingSource {
    GpuInsidePass,
    GpuPerPass,
    Cpu,
}

/// One dispatch of the last run.
#[derive(Clone, Debug, Serialize)]
pub struct DispatchTiming {
    pub name: String,
    pub start_us: f64,
    pub duration_us: f64,
    pub flops: f64,
    pub bytes: f64,
}

/// Aggregate per kernel name.
#[derive(Clone, Debug, Serialize)]
pub struct KernelStats {
    pub name: String,
    pub calls: usize,
    pub total_us: f64,
    pub mean_us: f64,
    pub min_us: f64,
    pub max_us: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Profile {
    pub source: TimingSource,
    pub dispatches: Vec<DispatchTiming>,
    /// Wall time of the whole run on the CPU, submit to completion.
    pub wall_us: f64,
}

impl Profile {
    /// Sum of the dispatch durations (GPU busy time for GPU sources).
    pub fn busy_us(&self) -> f64 {
        self.dispatches.iter().map(|d| d.duration_us).sum()
    }

    /// Per-kernel statistics, slowest total first.
    pub fn by_kernel(&self) -> Vec<KernelStats> {
        let mut m: BTreeMap<&str, KernelStats> = BTreeMap::new();
        for d in &self.dispatches {
            let s = m.entry(&d.name).or_insert_with(|| KernelStats {
                name: d.name.clone(),
                calls: 0,
                total_us: 0.0,
                mean_us: 0.0,
                min_us: f64::INFINITY,
                max_us: 0.0,
            });
            s.calls += 1;
            s.total_us += d.duration_us;
            s.min_us = s.min_us.min(d.duration_us);
            s.max_us = s.max_us.max(d.duration_us);
        }
        let mut v: Vec<KernelStats> = m
            .into_values()
            .map(|mut s| {
                s.mean_us = s.total_us / s.calls as f64;
                s
            })
            .collect();
        v.sort_by(|a, b| b.total_us.total_cmp(&a.total_us));
        v
    }

    /// Chrome trace ("Trace Event Format") JSON: open in chrome://tracing or Perfetto.
    pub fn chrome_trace_json(&self) -> String {
        let events: Vec<serde_json::Value> = self
            .dispatches
            .iter()
            .map(|d| {
                serde_json::json!({
                    "name": d.name, "cat": "gpu", "ph": "X", "pid": 1, "tid": 1,
                    "ts": d.start_us, "dur": d.duration_us,
                    "args": { "flops": d.flops, "bytes": d.bytes },
                })
            })
            .collect();
        serde_json::json!({ "traceEvents": events, "displayTimeUnit": "ns" }).to_string()
    }
}

/// Reusable timestamp resources, grown to the largest program profiled.
#[derive(Default)]
pub struct Profiler {
    queries: Option<(wgpu::QuerySet, u32)>,
    resolve: Option<std::sync::Arc<GpuBuffer>>,
    readback: Option<std::sync::Arc<GpuBuffer>>,
}

impl Profiler {
    pub fn new() -> Profiler {
        Profiler::default()
    }

    pub fn source(gpu: &Gpu) -> TimingSource {
        if gpu.caps.timestamps_inside_passes {
            TimingSource::GpuInsidePass
        } else if gpu.caps.timestamps {
            TimingSource::GpuPerPass
        } else {
            TimingSource::Cpu
        }
    }

    pub fn run(&mut self, gpu: &Gpu, program: &Program) -> Result<Profile> {
        match Profiler::source(gpu) {
            TimingSource::Cpu => run_cpu(gpu, program),
            source => self.run_gpu(gpu, program, source),
        }
    }

    fn ensure(&mut self, gpu: &Gpu, count: u32) -> Result<()> {
        if self.queries.as_ref().is_some_and(|(_, c)| *c >= count) {
            return Ok(());
        }
        let qs = gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("profiler"),
            ty: wgpu::QueryType::Timestamp,
            count,
        });
        let bytes = count as u64 * 8;
        self.resolve = Some(gpu.create_buffer(
            "profiler resolve",
            bytes,
            wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            Category::Staging,
        )?);
        self.readback = Some(gpu.create_buffer(
            "profiler readback",
            bytes,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            Category::Staging,
        )?);
        self.queries = Some((qs, count));
        Ok(())
    }

    fn run_gpu(&mut self, gpu: &Gpu, program: &Program, source: TimingSource) -> Result<Profile> {
        let n = program.len() as u32;
        // wgpu caps a query set at 4096 queries: profile long programs in slices.
        const MAX_Q: u32 = 4096;
        let chunk = MAX_Q / 2;
        self.ensure(gpu, (2 * n).clamp(2, MAX_Q))?;
        let period_us = gpu.caps.timestamp_period_ns as f64 / 1000.0;
        let mut raw: Vec<u64> = Vec::with_capacity(2 * n as usize);
        let wall = Instant::now();
        let (qs, _) = self.queries.as_ref().expect("query set allocated above");
        let resolve = self.resolve.as_ref().expect("allocated above");
        let readback = self.readback.as_ref().expect("allocated above");
        for start in (0..n).step_by(chunk as usize) {
            let end = (start + chunk).min(n);
            let mut enc = gpu.device.create_command_encoder(&Default::default());
            match source {
                TimingSource::GpuInsidePass => {
                    let mut pass = enc.begin_compute_pass(&Default::default());
                    for (q, d) in program.dispatches[start as usize..end as usize]
                        .iter()
                        .enumerate()
                    {
                        pass.write_timestamp(qs, 2 * q as u32);
                        pass.set_pipeline(&d.kernel.pipeline);
                        pass.set_bind_group(0, &d.bind_group, &[]);
                        pass.dispatch_workgroups(d.workgroups[0], d.workgroups[1], d.workgroups[2]);
                        pass.write_timestamp(qs, 2 * q as u32 + 1);
                    }
                }
                _ => {
                    for (q, d) in program.dispatches[start as usize..end as usize]
                        .iter()
                        .enumerate()
                    {
                        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                            label: Some(&d.name),
                            timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                                query_set: qs,
                                beginning_of_pass_write_index: Some(2 * q as u32),
                                end_of_pass_write_index: Some(2 * q as u32 + 1),
                            }),
                        });
                        pass.set_pipeline(&d.kernel.pipeline);
                        pass.set_bind_group(0, &d.bind_group, &[]);
                        pass.dispatch_workgroups(d.workgroups[0], d.workgroups[1], d.workgroups[2]);
                    }
                }
            }
            let count = 2 * (end - start);
            enc.resolve_query_set(qs, 0..count, &resolve.buffer, 0);
            enc.copy_buffer_to_buffer(&resolve.buffer, 0, &readback.buffer, 0, count as u64 * 8);
            gpu.queue.submit([enc.finish()]);
            let (tx, rx) = std::sync::mpsc::channel();
            readback
                .buffer
                .map_async(wgpu::MapMode::Read, ..count as u64 * 8, move |r| {
                    let _ = tx.send(r);
                });
            gpu.wait()?;
            rx.recv()
                .map_err(|e| DriftError::Gpu(e.to_string()))?
                .map_err(|e| DriftError::Gpu(format!("timestamp readback: {e}")))?;
            {
                let view = readback
                    .buffer
                    .get_mapped_range(..count as u64 * 8)
                    .map_err(|e| DriftError::Gpu(format!("timestamp readback: {e:?}")))?;
                raw.extend(bytemuck::cast_slice::<u8, u64>(&view));
            }
            readback.buffer.unmap();
        }
        let wall_us = wall.elapsed().as_secs_f64() * 1e6;
        let t0 = raw.first().copied().unwrap_or(0);
        let dispatches = program
            .dispatches
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let (a, b) = (raw[2 * i], raw[2 * i + 1]);
                DispatchTiming {
                    name: d.name.clone(),
                    start_us: a.saturating_sub(t0) as f64 * period_us,
                    duration_us: b.saturating_sub(a) as f64 * period_us,
                    flops: d.cost.flops,
                    bytes: d.cost.bytes,
                }
            })
            .collect();
        Ok(Profile {
            source,
            dispatches,
            wall_us,
        })
    }
}

fn run_cpu(gpu: &Gpu, program: &Program) -> Result<Profile> {
    let wall = Instant::now();
    let mut dispatches = Vec::with_capacity(program.len());
    for d in &program.dispatches {
        let t = Instant::now();
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(&d.kernel.pipeline);
            pass.set_bind_group(0, &d.bind_group, &[]);
            pass.dispatch_workgroups(d.workgroups[0], d.workgroups[1], d.workgroups[2]);
        }
        gpu.queue.submit([enc.finish()]);
        gpu.wait()?;
        dispatches.push(DispatchTiming {
            name: d.name.clone(),
            start_us: (t - wall).as_secs_f64() * 1e6,
            duration_us: t.elapsed().as_secs_f64() * 1e6,
            flops: d.cost.flops,
            bytes: d.cost.bytes,
        });
    }
    Ok(Profile {
        source: TimingSource::Cpu,
        dispatches,
        wall_us: wall.elapsed().as_secs_f64() * 1e6,
    })
}
