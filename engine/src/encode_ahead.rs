//! Command buffers of a repeated step, encoded ahead of time on worker threads.
//!
//! A decode step's command buffer does not depend on the token: the step state (position, input id)
//! lives in GPU buffers written just before the submit. So the CPU cost of encoding it (wgpu's
//! validation and barrier tracking, ~2-3 us per dispatch: ~0.9 ms for a 300-dispatch step) need not
//! sit between two submits. Workers encode buffer `i` for `i = t, t + T, t + 2T, ...` into a bounded
//! channel each; the submitting thread takes them in order. With no workers, `next` encodes inline.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, sync_channel};
use std::thread::JoinHandle;

use crate::error::{DriftError, Result};

/// Encodes command buffer number `i` of a sequence.
pub type EncodeFn = dyn Fn(usize) -> wgpu::CommandBuffer + Send + Sync;

/// Buffers each worker keeps ready beyond the one it is encoding.
const DEPTH: usize = 2;

/// Worker threads to use: `DRIFT_ENCODE_THREADS` when set (0 encodes on the submitting thread), else
/// half the cores beside the submitting thread, at most 4 (past that the GPU is the limit).
pub fn encode_threads() -> usize {
    if let Some(n) = std::env::var("DRIFT_ENCODE_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return n;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores.saturating_sub(1) / 2).clamp(1, 4)
}

/// A sequence of command buffers being encoded ahead; dropping it stops and joins the workers.
pub struct EncodeAhead {
    encode: Arc<EncodeFn>,
    workers: Vec<(Receiver<wgpu::CommandBuffer>, JoinHandle<()>)>,
    next: usize,
}

impl EncodeAhead {
    /// Starts `threads` workers encoding `encode(0), encode(1), ...` ahead (none: inline).
    pub fn start(threads: usize, encode: Arc<EncodeFn>) -> Result<EncodeAhead> {
        let mut workers = Vec::with_capacity(threads);
        for t in 0..threads {
            let (tx, rx) = sync_channel(DEPTH);
            let f = encode.clone();
            let handle = std::thread::Builder::new()
                .name(format!("drift-encode-{t}"))
                .spawn(move || {
                    let mut i = t;
                    // Stops when the receiver is dropped.
                    while tx.send(f(i)).is_ok() {
                        i += threads;
                    }
                })
                .map_err(|e| DriftError::Other(format!("starting an encoding thread: {e}")))?;
            workers.push((rx, handle));
        }
        Ok(EncodeAhead {
            encode,
            workers,
            next: 0,
        })
    }

    /// The next command buffer of the sequence.
    pub fn next_buffer(&mut self) -> Result<wgpu::CommandBuffer> {
        let i = self.next;
        self.next += 1;
        if self.workers.is_empty() {
            return Ok((self.encode)(i));
        }
        let n = self.workers.len();
        self.workers[i % n]
            .0
            .recv()
            .map_err(|_| DriftError::Gpu("a command-encoding thread stopped".into()))
    }
}

impl Drop for EncodeAhead {
    fn drop(&mut self) {
        let (receivers, handles): (Vec<_>, Vec<_>) = self.workers.drain(..).unzip();
        // Receivers first: a worker blocked on a full channel then sees its send fail.
        drop(receivers);
        for h in handles {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{Gpu, GpuOptions};

    /// Buffers come back in sequence order whatever the number of workers: buffer i copies the value
    /// i into one slot, which reads back as the submit count after every submit.
    #[test]
    fn buffers_arrive_in_sequence_order() {
        let gpu = Gpu::new(&GpuOptions::from_env()).unwrap();
        // Workers run ahead of the last buffer taken: the source holds more values than are read.
        let (n, values_len) = (10usize, 64usize);
        for threads in [0, 1, 3] {
            let buffer = |label, usage| {
                gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(label),
                    size: 4 * values_len as u64,
                    usage,
                    mapped_at_creation: false,
                })
            };
            let src = buffer(
                "values",
                wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            );
            let dst = buffer(
                "slot",
                wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::MAP_READ,
            );
            let values: Vec<u32> = (0..values_len as u32).map(|i| 1000 + i).collect();
            gpu.queue
                .write_buffer(&src, 0, bytemuck::cast_slice(&values));
            let (device, s, d) = (gpu.device.clone(), src.clone(), dst.clone());
            let encode: Arc<EncodeFn> = Arc::new(move |i| {
                let mut enc = device.create_command_encoder(&Default::default());
                enc.copy_buffer_to_buffer(&s, 4 * i as u64, &d, 0, 4);
                enc.finish()
            });
            let mut ahead = EncodeAhead::start(threads, encode).unwrap();
            for k in 0..n {
                gpu.queue.submit([ahead.next_buffer().unwrap()]);
                dst.map_async(wgpu::MapMode::Read, .., |_| {});
                gpu.wait().unwrap();
                let got: u32 = bytemuck::cast_slice(&dst.get_mapped_range(..4).unwrap())[0];
                dst.unmap();
                assert_eq!(got, 1000 + k as u32, "buffer {k} with {threads} workers");
            }
        }
    }
}
