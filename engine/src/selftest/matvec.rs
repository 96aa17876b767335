//! Checks for the matvec kernels.

use super::{Check, Rng};
use crate::error::Result;
use crate::gpu::Gpu;

pub fn checks(_gpu: &Gpu, _rng: &mut Rng) -> Result<Vec<Check>> {
    Ok(Vec::new())
}
