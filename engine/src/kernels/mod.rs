//! Kernels: WGSL sources in `shaders/` (one file per op family), specialised per device with a small
//! preprocessor, compiled once per specialisation and cached.
//!
//! Conventions every kernel family follows (so [`crate::Gpu::dispatch`] can bind any of them):
//! - binding 0 is a uniform `Params` whose first 8 u32 are the base element offsets of the tensor
//!   bindings 1..=8 in order (views need not start on a binding boundary), then the family's fields;
//! - bindings 1.. are the tensors, in the order the family passes them;
//! - large grids are 2-D: a workgroup's linear index is `wid.x + wid.y * nwg.x` (see [`grid`]).

mod cache;
mod preprocess;

pub mod activation;
pub mod attention;
pub mod attention_coop;
pub mod attention_row;
pub mod conv;
pub mod conv_coop;
pub mod copy;
pub mod decode_step;
pub mod elementwise;
pub mod embedding;
pub mod geglu;
pub mod grid_sync;
pub mod layout;
pub mod matmul;
pub(crate) mod matmul_splitk;
pub mod matvec;
pub mod norm;
pub mod qkv_rope;
pub mod quant;
pub mod quant_dp4a;
pub mod quant_rows;
pub mod quant_xq;
pub mod rope;
pub mod sample;
pub mod softmax;

/// SMs of the GPU the grid-shape rules were measured on (the H200): the conv split model's waves and
/// the dp4a products' row balance count workgroups against it.
pub const TUNED_SMS: usize = 132;

pub use cache::{Kernel, KernelCache, KernelSpec};
pub use preprocess::preprocess;

/// Embeds a WGSL file from the workspace's `shaders/` folder.
#[macro_export]
macro_rules! shader {
    ($file:literal) => {
        include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../shaders/", $file))
    };
}

/// Splits `groups` workgroups into a 2-D grid within the per-dimension limit.
pub fn grid(groups: u32, max_per_dim: u32) -> [u32; 3] {
    if groups <= max_per_dim {
        [groups.max(1), 1, 1]
    } else {
        let y = groups.div_ceil(max_per_dim);
        [groups.div_ceil(y), y, 1]
    }
}

/// The WGSL type name for a float dtype, and the define that selects f16 code paths.
pub fn float_defines(dtype: crate::DType) -> Vec<(&'static str, String)> {
    vec![
        ("T", dtype.wgsl().to_string()),
        ("F16", u8::from(dtype == crate::DType::F16).to_string()),
    ]
}
