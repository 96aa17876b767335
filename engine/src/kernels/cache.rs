//! Compiled kernels keyed by (name, entry point, specialisation defines).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::preprocess;
use crate::error::{DriftError, Result};

/// One specialisation of a WGSL kernel.
#[derive(Clone, Debug)]
pub struct KernelSpec {
    /// Name shown by the profiler (family and variant, e.g. `matvec_f16_sg`).
    pub name: String,
    pub source: &'static str,
    pub entry: &'static str,
    pub defines: Vec<(&'static str, String)>,
    /// Compile every `var<storage, read>` as `read_write`. wgpu forbids one buffer bound read-only and
    /// read-write in the same dispatch, which happens whenever inputs and outputs are views of one arena;
    /// [`crate::Gpu::dispatch`] switches to this variant by itself when the tensors share a buffer.
    pub aliased: bool,
    /// Compile without runtime bounds checks and loop bounding, and without zeroing workgroup memory.
    /// Only for kernels whose every index follows from shapes the builder validated and that write
    /// their workgroup memory before reading it; their self-test checks must cover the edges.
    pub trusted: bool,
    /// Keep naga's loop bounding (an iteration guard in every loop) for this kernel. Off by default:
    /// the guard stops drivers from unrolling loops; on the H200 dropping it made conv2d 1.3x faster
    /// and the norms 1.1x, but the matmuls 1.1-1.2x slower, so those keep it.
    pub loop_bounding: bool,
}

impl KernelSpec {
    pub fn new(name: impl Into<String>, source: &'static str, entry: &'static str) -> KernelSpec {
        KernelSpec {
            name: name.into(),
            source,
            entry,
            defines: Vec::new(),
            aliased: false,
            trusted: false,
            loop_bounding: false,
        }
    }

    pub fn define(mut self, key: &'static str, value: impl ToString) -> KernelSpec {
        self.defines.push((key, value.to_string()));
        self
    }

    /// See [`KernelSpec::trusted`].
    pub fn trusted(mut self) -> KernelSpec {
        self.trusted = true;
        self
    }

    /// See [`KernelSpec::loop_bounding`].
    pub fn loop_bounded(mut self) -> KernelSpec {
        self.loop_bounding = true;
        self
    }

    pub fn defines(mut self, defs: Vec<(&'static str, String)>) -> KernelSpec {
        self.defines.extend(defs);
        self
    }

    fn key(&self) -> String {
        let mut d = self.defines.clone();
        d.sort();
        format!(
            "{}:{}:{:?}:{:p}:{}:{}:{}",
            self.name,
            self.entry,
            d,
            self.source.as_ptr(),
            self.aliased,
            self.trusted,
            self.loop_bounding
        )
    }
}

/// A compiled pipeline and its bind group layout.
#[derive(Debug)]
pub struct Kernel {
    pub name: String,
    pub spec: KernelSpec,
    pub pipeline: wgpu::ComputePipeline,
    pub layout: wgpu::BindGroupLayout,
}

#[derive(Default)]
pub struct KernelCache {
    map: Mutex<HashMap<String, Arc<Kernel>>>,
}

impl KernelCache {
    pub fn get(&self, device: &wgpu::Device, spec: &KernelSpec) -> Result<Arc<Kernel>> {
        let key = spec.key();
        if let Some(k) = self.map.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            return Ok(k.clone());
        }
        let kernel = Arc::new(compile(device, spec)?);
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, kernel.clone());
        Ok(kernel)
    }

    pub fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn compile(device: &wgpu::Device, spec: &KernelSpec) -> Result<Kernel> {
    let mut source = preprocess(spec.source, &spec.defines).map_err(|e| match e {
        DriftError::Shader { message, .. } => DriftError::Shader {
            name: spec.name.clone(),
            message,
        },
        other => other,
    })?;
    if spec.aliased {
        source = source.replace("var<storage, read>", "var<storage, read_write>");
    }
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let desc = wgpu::ShaderModuleDescriptor {
        label: Some(&spec.name),
        source: wgpu::ShaderSource::Wgsl(source.into()),
    };
    let module = if spec.trusted {
        // SAFETY: `trusted` kernels index only within ranges their builders validated (see the field).
        unsafe { device.create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked()) }
    } else {
        // Bounds checks stay; naga's loop bounding goes unless the kernel asks for it: it adds an
        // iteration guard to every loop that keeps drivers from unrolling them (private arrays indexed
        // by a loop counter then live in local memory). Every loop in Drift's shaders is bounded by
        // host-validated uniforms. `DRIFT_LOOP_BOUNDING=1` restores it everywhere (A/B timing).
        let mut checks = wgpu::ShaderRuntimeChecks::checked();
        checks.force_loop_bounding =
            spec.loop_bounding || std::env::var_os("DRIFT_LOOP_BOUNDING").is_some_and(|v| v == "1");
        // SAFETY: only Drift's own shaders are compiled here, and their loops terminate (see above).
        unsafe { device.create_shader_module_trusted(desc, checks) }
    };
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(&spec.name),
        layout: None,
        module: &module,
        entry_point: Some(spec.entry),
        compilation_options: wgpu::PipelineCompilationOptions {
            zero_initialize_workgroup_memory: !spec.trusted,
            ..Default::default()
        },
        cache: None,
    });
    if let Some(e) = pollster::block_on(scope.pop()) {
        return Err(DriftError::Shader {
            name: spec.name.clone(),
            message: e.to_string(),
        });
    }
    let layout = pipeline.get_bind_group_layout(0);
    Ok(Kernel {
        name: spec.name.clone(),
        spec: spec.clone(),
        pipeline,
        layout,
    })
}
