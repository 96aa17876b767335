//! Prebuilt dispatch sequences. A model builds its [`Dispatch`]es once at load (pipelines, bind groups,
//! parameter buffers); a step only encodes them into one compute pass and submits once. Per-step values
//! (position, sequence length, token ids) live in small GPU tensors the kernels read, written before
//! the submit.

use std::sync::Arc;
use std::time::Instant;

use crate::error::Result;
use crate::gpu::Gpu;
use crate::kernels::{Kernel, KernelSpec};
use crate::memory::{Category, GpuBuffer};
use crate::profiler::{Profile, Profiler};
use crate::shape_err;
use crate::tensor::Tensor;

/// Work done by one dispatch, for GB/s and GFLOP/s figures.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cost {
    pub flops: f64,
    pub bytes: f64,
}

/// One kernel launch with everything bound. Cloning is cheap (handles are reference counted).
#[derive(Clone, Debug)]
pub struct Dispatch {
    pub name: String,
    pub kernel: Arc<Kernel>,
    pub bind_group: wgpu::BindGroup,
    pub workgroups: [u32; 3],
    pub cost: Cost,
    /// Buffers the bind group refers to, kept alive (and counted) as long as the dispatch.
    _keep: Vec<Arc<GpuBuffer>>,
}

/// Maximum tensor bindings per kernel (the base offsets in the params header).
pub const MAX_TENSORS: usize = 8;

impl Gpu {
    /// Compiles (or fetches from the cache) a kernel specialisation.
    pub fn kernel(&self, spec: &KernelSpec) -> Result<Arc<Kernel>> {
        self.kernels().get(&self.device, spec)
    }

    /// Binds `params` (the family's u32/f32 words, after the 8 base offsets) and `tensors` to `kernel`.
    pub fn dispatch(
        &self,
        kernel: &Arc<Kernel>,
        params: &[u32],
        tensors: &[&Tensor],
        workgroups: [u32; 3],
        cost: Cost,
    ) -> Result<Dispatch> {
        if tensors.len() > MAX_TENSORS {
            return Err(shape_err!(
                "{} binds {} tensors (max {MAX_TENSORS})",
                kernel.name,
                tensors.len()
            ));
        }
        let max = self.caps.max_workgroups_per_dimension;
        if workgroups.iter().any(|&w| w > max) {
            return Err(shape_err!(
                "{}: grid {workgroups:?} is over the device's {max}",
                kernel.name
            ));
        }
        // Views of one buffer (an arena) read and written by one dispatch need the all-read_write variant.
        let shares_buffer = tensors.iter().enumerate().any(|(i, a)| {
            tensors[i + 1..]
                .iter()
                .any(|b| std::sync::Arc::ptr_eq(&a.storage.buffer, &b.storage.buffer))
        });
        let aliased_kernel;
        let kernel = if shares_buffer && !kernel.spec.aliased {
            let mut spec = kernel.spec.clone();
            spec.aliased = true;
            aliased_kernel = self.kernel(&spec)?;
            &aliased_kernel
        } else {
            kernel
        };
        let bindings = tensors
            .iter()
            .map(|t| t.binding(self.caps.max_storage_binding))
            .collect::<Result<Vec<_>>>()?;
        let mut words = [0u32; MAX_TENSORS].to_vec();
        for (w, b) in words.iter_mut().zip(&bindings) {
            *w = b.base_elems;
        }
        words.extend_from_slice(params);
        words.resize(words.len().div_ceil(4) * 4, 0);
        let uniform = self.create_buffer(
            &format!("{} params", kernel.name),
            (words.len() * 4) as u64,
            wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            Category::Other,
        )?;
        self.queue
            .write_buffer(&uniform.buffer, 0, bytemuck::cast_slice(&words));
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: uniform.buffer.as_entire_binding(),
        }];
        for (i, b) in bindings.into_iter().enumerate() {
            entries.push(wgpu::BindGroupEntry {
                binding: i as u32 + 1,
                resource: b.resource,
            });
        }
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let bind_group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(&kernel.name),
            layout: &kernel.layout,
            entries: &entries,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(crate::DriftError::Gpu(format!(
                "binding {}: {e}",
                kernel.name
            )));
        }
        let mut keep = vec![uniform];
        keep.extend(tensors.iter().map(|t| t.storage.buffer.clone()));
        Ok(Dispatch {
            name: kernel.name.clone(),
            kernel: kernel.clone(),
            bind_group,
            workgroups,
            cost,
            _keep: keep,
        })
    }
}

/// An ordered sequence of dispatches, run as one compute pass and one submit.
#[derive(Debug, Default)]
pub struct Program {
    pub dispatches: Vec<Dispatch>,
}

impl Program {
    pub fn new() -> Program {
        Program::default()
    }

    pub fn push(&mut self, d: Dispatch) {
        self.dispatches.push(d);
    }

    pub fn extend(&mut self, ds: impl IntoIterator<Item = Dispatch>) {
        self.dispatches.extend(ds);
    }

    pub fn len(&self) -> usize {
        self.dispatches.len()
    }

    pub fn is_empty(&self) -> bool {
        self.dispatches.is_empty()
    }

    pub fn cost(&self) -> Cost {
        self.dispatches.iter().fold(Cost::default(), |a, d| Cost {
            flops: a.flops + d.cost.flops,
            bytes: a.bytes + d.cost.bytes,
        })
    }

    /// Records every dispatch into `pass` (wgpu orders dependent dispatches inside a pass).
    pub fn encode_into(&self, pass: &mut wgpu::ComputePass<'_>) {
        for d in &self.dispatches {
            pass.set_pipeline(&d.kernel.pipeline);
            pass.set_bind_group(0, &d.bind_group, &[]);
            pass.dispatch_workgroups(d.workgroups[0], d.workgroups[1], d.workgroups[2]);
        }
    }

    /// Encodes the program into a command buffer (one compute pass).
    pub fn encode(&self, gpu: &Gpu) -> wgpu::CommandBuffer {
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            self.encode_into(&mut pass);
        }
        enc.finish()
    }

    /// Submits without waiting.
    pub fn submit(&self, gpu: &Gpu) -> wgpu::SubmissionIndex {
        gpu.queue.submit([self.encode(gpu)])
    }

    /// Submits and waits for completion.
    pub fn run(&self, gpu: &Gpu) -> Result<()> {
        self.submit(gpu);
        gpu.wait()
    }

    /// Runs with per-dispatch timing (GPU timestamps where the device has them, else CPU).
    pub fn run_profiled(&self, gpu: &Gpu, profiler: &mut Profiler) -> Result<Profile> {
        profiler.run(gpu, self)
    }

    /// CPU microseconds to encode (not submit) one dispatch, averaged over `reps` encodings.
    pub fn cpu_us_per_dispatch(&self, gpu: &Gpu, reps: usize) -> f64 {
        let t = Instant::now();
        for _ in 0..reps {
            drop(self.encode(gpu));
        }
        t.elapsed().as_secs_f64() * 1e6 / (reps * self.len().max(1)) as f64
    }
}
