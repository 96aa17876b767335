//! What the device can do, read once from the adapter and the features the device was opened with.

use serde::Serialize;

/// The features Drift asks for. Each is optional: kernels pick their variants from [`Caps`].
pub fn wanted_features() -> wgpu::Features {
    wgpu::Features::SHADER_F16
        | wgpu::Features::SUBGROUP
        | wgpu::Features::TIMESTAMP_QUERY
        | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES
        | wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS
        | wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
}

/// Limits Drift asks for: everything the adapter offers. Kernels need the large storage bindings and
/// buffers (2 GiB / 4 GiB on an H200) and the full workgroup memory; asking for the adapter's own values
/// can never fail the device request.
pub fn wanted_limits(adapter: &wgpu::Adapter) -> wgpu::Limits {
    adapter.limits()
}

/// Capabilities of an opened device, as the kernels see them.
#[derive(Clone, Debug, Serialize)]
pub struct Caps {
    pub f16: bool,
    pub subgroup: bool,
    pub subgroup_min_size: u32,
    pub subgroup_max_size: u32,
    pub timestamps: bool,
    pub timestamps_inside_passes: bool,
    pub cooperative_matrix: bool,
    /// 16x16x16 f16 x f16 -> f32 cooperative matrices, the only shape WGSL exposes.
    pub coop_16x16_f16_f32: bool,
    pub max_buffer_size: u64,
    pub max_storage_binding: u64,
    pub max_storage_buffers_per_stage: u32,
    pub max_workgroup_storage: u32,
    pub max_invocations_per_workgroup: u32,
    pub max_workgroups_per_dimension: u32,
    pub timestamp_period_ns: f32,
}

impl Caps {
    pub fn read(adapter: &wgpu::Adapter, device: &wgpu::Device, queue: &wgpu::Queue) -> Caps {
        let f = device.features();
        let l = device.limits();
        let info = adapter.get_info();
        let coop = f.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX);
        let coop_16 = coop
            && adapter.cooperative_matrix_properties().iter().any(|p| {
                p.m_size == 16
                    && p.n_size == 16
                    && p.k_size == 16
                    && p.ab_type == wgpu::CooperativeScalarType::F16
                    && p.cr_type == wgpu::CooperativeScalarType::F32
            });
        let subgroup = f.contains(wgpu::Features::SUBGROUP);
        Caps {
            f16: f.contains(wgpu::Features::SHADER_F16),
            subgroup,
            subgroup_min_size: if subgroup { info.subgroup_min_size } else { 0 },
            subgroup_max_size: if subgroup { info.subgroup_max_size } else { 0 },
            timestamps: f.contains(wgpu::Features::TIMESTAMP_QUERY),
            timestamps_inside_passes: f.contains(
                wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES,
            ),
            cooperative_matrix: coop,
            coop_16x16_f16_f32: coop_16 && f.contains(wgpu::Features::SHADER_F16),
            max_buffer_size: l.max_buffer_size,
            max_storage_binding: l.max_storage_buffer_binding_size,
            max_storage_buffers_per_stage: l.max_storage_buffers_per_shader_stage,
            max_workgroup_storage: l.max_compute_workgroup_storage_size,
            max_invocations_per_workgroup: l.max_compute_invocations_per_workgroup,
            max_workgroups_per_dimension: l.max_compute_workgroups_per_dimension,
            timestamp_period_ns: queue.get_timestamp_period(),
        }
    }

    /// An H200-like device (cooperative 16x16 f16 matrices, subgroups of 32) with
    /// `max_workgroup_storage` bytes of workgroup memory: what host-side tile choices are tested against.
    #[cfg(test)]
    pub fn h200_like(max_workgroup_storage: u32) -> Caps {
        Caps {
            f16: true,
            subgroup: true,
            subgroup_min_size: 32,
            subgroup_max_size: 32,
            timestamps: true,
            timestamps_inside_passes: true,
            cooperative_matrix: true,
            coop_16x16_f16_f32: true,
            max_buffer_size: 1 << 32,
            max_storage_binding: 1 << 31,
            max_storage_buffers_per_stage: 16,
            max_workgroup_storage,
            max_invocations_per_workgroup: 1024,
            max_workgroups_per_dimension: 65535,
            timestamp_period_ns: 1.0,
        }
    }

    /// A copy with optional features switched off, so tests can exercise the portable fallbacks on a
    /// device that has the fast paths (for example `DRIFT_DISABLE=f16,subgroup`).
    pub fn without(&self, names: &str) -> Caps {
        let mut c = self.clone();
        for n in names.split(',').map(str::trim) {
            match n {
                "f16" => {
                    c.f16 = false;
                    c.coop_16x16_f16_f32 = false;
                }
                "subgroup" => c.subgroup = false,
                "timestamps" => {
                    c.timestamps = false;
                    c.timestamps_inside_passes = false;
                }
                "coop" | "cooperative_matrix" => {
                    c.cooperative_matrix = false;
                    c.coop_16x16_f16_f32 = false;
                }
                _ => {}
            }
        }
        c
    }
}
