//! The GPU context: one adapter/device/queue shared by every part of Drift (the UI included).

mod caps;
mod transfer;

use std::sync::{Arc, Mutex};

pub use caps::{Caps, wanted_features, wanted_limits};
use serde::Serialize;
pub use transfer::{decode_f32, encode_f32};

use crate::error::{DriftError, Result};
use crate::kernels::KernelCache;
use crate::memory::{MemoryReport, MemoryTracker};

/// How to pick and open a device when Drift creates its own (the CLI and tests).
#[derive(Clone, Debug, Default)]
pub struct GpuOptions {
    /// Restrict to these backends; `None` means all primary ones.
    pub backends: Option<wgpu::Backends>,
    /// Features to switch off after opening (comma list: `f16,subgroup,timestamps,coop`), for testing the
    /// portable fallbacks on a device that has the fast paths.
    pub disable: Option<String>,
}

impl GpuOptions {
    /// Options from the environment: `DRIFT_BACKEND` (vulkan, metal, dx12, gl) and `DRIFT_DISABLE`.
    pub fn from_env() -> GpuOptions {
        GpuOptions {
            backends: std::env::var("DRIFT_BACKEND")
                .ok()
                .map(|s| wgpu::Backends::from_comma_list(&s)),
            disable: std::env::var("DRIFT_DISABLE").ok(),
        }
    }
}

/// Drift's device context. Cheap to share behind an `Arc`; every method takes `&self`.
pub struct Gpu {
    pub adapter: wgpu::Adapter,
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub caps: Caps,
    memory: Arc<MemoryTracker>,
    kernels: KernelCache,
    /// The last GPU error no error scope caught (validation errors in a dispatch, device loss).
    uncaptured: Arc<Mutex<Option<String>>>,
    /// The f32 partials every split-K matmul writes ([`Gpu::split_k_scratch`]), made on first use.
    split_k: Mutex<Option<crate::tensor::Tensor>>,
}

impl Gpu {
    /// Opens the best adapter (high-performance preference) headless, with every feature Drift can use.
    pub fn new(options: &GpuOptions) -> Result<Gpu> {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
        // Compute needs Vulkan, Metal or DX12; probing GL only adds noise (EGL errors) on headless Linux.
        desc.backends = options.backends.unwrap_or(wgpu::Backends::PRIMARY);
        let instance = wgpu::Instance::new(desc);
        let adapter = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            force_fallback_adapter: false,
            compatible_surface: None,
            apply_limit_buckets: false,
        }))
        .map_err(|e| {
            DriftError::NoAdapter(format!(
                "{e}. Install a Vulkan driver (on Linux without a GPU: apt-get install mesa-vulkan-drivers libvulkan1)"
            ))
        })?;
        let (device, queue) =
            pollster::block_on(adapter.request_device(&device_descriptor(&adapter)))
                .map_err(|e| DriftError::Device(e.to_string()))?;
        let mut gpu = Gpu::adopt(adapter, device, queue);
        if let Some(d) = &options.disable {
            gpu.caps = gpu.caps.without(d);
        }
        Ok(gpu)
    }

    /// Adopts a device a host already opened (eframe's), so UI and inference share one device.
    /// Request it with [`device_descriptor`] to get Drift's features; any subset works.
    pub fn adopt(adapter: wgpu::Adapter, device: wgpu::Device, queue: wgpu::Queue) -> Gpu {
        let caps = Caps::read(&adapter, &device, &queue);
        let info = adapter.get_info();
        let uncaptured = Arc::new(Mutex::new(None));
        let sink = uncaptured.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            log::error!("uncaptured GPU error: {e}");
            *sink.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
        }));
        Gpu {
            kernels: KernelCache::default(),
            memory: Arc::new(MemoryTracker::default()),
            adapter,
            device,
            queue,
            info,
            caps,
            uncaptured,
            split_k: Mutex::new(None),
        }
    }

    /// A shared f32 scratch of at least `len` values for split-K partials (`kernels::matmul_splitk`).
    /// One buffer serves every split product, in every program: they run in queue order, with a barrier
    /// between dispatches that write it, so no two overlap. It only grows (dispatches built on a smaller
    /// one keep that alive).
    pub(crate) fn split_k_scratch(&self, len: usize) -> Result<crate::tensor::Tensor> {
        let mut held = self.split_k.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = held.as_ref()
            && t.numel() >= len
        {
            return Ok(t.clone());
        }
        let t = self.tensor(
            "matmul split-K partials",
            &[len],
            crate::tensor::DType::F32,
            crate::Category::Activations,
        )?;
        *held = Some(t.clone());
        Ok(t)
    }

    pub fn memory(&self) -> &Arc<MemoryTracker> {
        &self.memory
    }

    pub fn memory_report(&self) -> MemoryReport {
        self.memory.report()
    }

    pub fn kernels(&self) -> &KernelCache {
        &self.kernels
    }

    /// Takes the last uncaptured GPU error, if any, as an error.
    pub fn take_error(&self) -> Result<()> {
        match self
            .uncaptured
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            Some(e) => Err(DriftError::Gpu(e)),
            None => Ok(()),
        }
    }

    /// Blocks until all submitted work has finished.
    pub fn wait(&self) -> Result<()> {
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| DriftError::Gpu(e.to_string()))?;
        self.take_error()
    }

    /// A serialisable description for `drift info`.
    pub fn describe(&self) -> DeviceDescription {
        let f = self.device.features();
        let feature = |name: &'static str, flag: wgpu::Features| FeatureState {
            name,
            present: f.contains(flag),
        };
        DeviceDescription {
            name: self.info.name.clone(),
            backend: self.info.backend.to_string(),
            driver: self.info.driver.clone(),
            driver_info: self.info.driver_info.clone(),
            device_type: format!("{:?}", self.info.device_type),
            features: vec![
                feature("SHADER_F16", wgpu::Features::SHADER_F16),
                feature("SUBGROUP", wgpu::Features::SUBGROUP),
                feature("TIMESTAMP_QUERY", wgpu::Features::TIMESTAMP_QUERY),
                feature(
                    "TIMESTAMP_QUERY_INSIDE_PASSES",
                    wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES,
                ),
                feature(
                    "EXPERIMENTAL_COOPERATIVE_MATRIX",
                    wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX,
                ),
            ],
            caps: self.caps.clone(),
        }
    }
}

/// The device descriptor Drift wants on `adapter`: its wanted features that the adapter has, and the
/// adapter's limits. Hosts (eframe) call this from their device-creation hook.
pub fn device_descriptor(adapter: &wgpu::Adapter) -> wgpu::DeviceDescriptor<'static> {
    let features = wanted_features() & adapter.features();
    wgpu::DeviceDescriptor {
        label: Some("drift"),
        required_features: features,
        required_limits: wanted_limits(adapter),
        experimental_features: if features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
        {
            // SAFETY: cooperative-matrix kernels are only selected where the adapter reports the
            // 16x16 f16/f32 configuration, and they are verified against CPU references (`drift selftest`).
            unsafe { wgpu::ExperimentalFeatures::enabled() }
        } else {
            wgpu::ExperimentalFeatures::disabled()
        },
        memory_hints: wgpu::MemoryHints::Performance,
        trace: wgpu::Trace::Off,
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct FeatureState {
    pub name: &'static str,
    pub present: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct DeviceDescription {
    pub name: String,
    pub backend: String,
    pub driver: String,
    pub driver_info: String,
    pub device_type: String,
    pub features: Vec<FeatureState>,
    pub caps: Caps,
}
