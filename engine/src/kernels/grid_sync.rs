//! Grid-wide barriers inside one dispatch (`shaders/grid_sync.wgsl`) and their probe: the cost of a
//! barrier, and whether what one workgroup wrote before it is what another reads after it.
//!
//! A grid barrier only works when every workgroup of the grid is resident at once. Vulkan promises no
//! such thing, so the barrier gives up after a bounded wait (the grid is then marked timed out and
//! every later barrier passes): a grid that cannot be co-resident gives a wrong answer and a flag the
//! host reads, never a hung GPU.

use crate::error::Result;
use crate::exec::{Cost, Dispatch};
use crate::gpu::Gpu;
use crate::kernels::KernelSpec;
use crate::tensor::{DType, Tensor};

/// Words of a grid's sync state: arrivals, exits, the sticky timeout flag (one more pads to 16 bytes).
pub const SYNC_WORDS: usize = 4;

/// The probe's source: the barrier, then the probe kernel.
const PROBE_SOURCE: &str = concat!(
    crate::shader!("grid_sync.wgsl"),
    crate::shader!("grid_sync_probe.wgsl"),
);

/// A probe: `n_wg` workgroups through `n_sync` barriers, each phase reading a value another workgroup
/// wrote in the phase before.
pub struct Probe {
    pub dispatch: Dispatch,
    pub sync: Tensor,
    /// `[n_sync + 1, n_wg]` u32, each row written once.
    pub data: Tensor,
    pub n_wg: u32,
    pub n_sync: u32,
}

impl Probe {
    pub fn new(gpu: &Gpu, n_wg: u32, n_sync: u32) -> Result<Probe> {
        let sync = gpu.arrival_scratch("grid sync", SYNC_WORDS)?;
        let data = gpu.tensor(
            "grid sync probe",
            &[n_sync as usize + 1, n_wg as usize],
            DType::U32,
            crate::memory::Category::Other,
        )?;
        let kernel = gpu.kernel(&KernelSpec::new(
            "grid_sync_probe",
            PROBE_SOURCE,
            "grid_sync_probe",
        ))?;
        let dispatch = gpu.dispatch(
            &kernel,
            &[n_wg, n_sync],
            &[&sync, &data],
            [n_wg, 1, 1],
            Cost {
                flops: 0.0,
                bytes: 8.0 * (n_sync as f64 + 1.0) * n_wg as f64,
            },
        )?;
        Ok(Probe {
            dispatch,
            sync,
            data,
            n_wg,
            n_sync,
        })
    }

    /// What `data` must hold after a run: `data[s][w] = (w + s) % n_wg + s`.
    pub fn expected(&self) -> Vec<u32> {
        let n = self.n_wg;
        (0..=self.n_sync)
            .flat_map(|s| (0..n).map(move |w| (w + s) % n + s))
            .collect()
    }
}

/// Reads a grid's sync state and clears its sticky timeout flag: whether a barrier gave up since
/// the last call.
pub fn take_timeout(gpu: &Gpu, sync: &Tensor) -> Result<bool> {
    let words = gpu.read_bytes(sync)?;
    let flag = u32::from_le_bytes([words[8], words[9], words[10], words[11]]);
    if flag != 0 {
        gpu.write_tensor_bytes(sync, &[0u8; SYNC_WORDS * 4])?;
    }
    Ok(flag != 0)
}
