//! The matmul kernels (prefill path): `out = a @ b` or `a @ b^T` (nn.Linear weights), batched, with an
//! optional fused bias, f32 accumulation.
//!
//! Two variants: a portable tiled kernel (`shaders/matmul.wgsl`, 128x128 or 64x64 blocks, 8x8 or 4x4
//! outputs per invocation, f32 inputs or f16 converted on load) and a cooperative-matrix kernel
//! (`shaders/matmul_coop.wgsl`, tensor cores, f16 inputs only) for devices that report 16x16x16
//! f16 x f16 -> f32 matrices.

use crate::error::{DriftError, Result};
use crate::exec::{Cost, Dispatch};
use crate::gpu::{Caps, Gpu};
use crate::kernels::{KernelSpec, grid, matmul_splitk};
use crate::tensor::{DType, Layout, RowShard, Tensor};
use crate::{shader, shape_err};

/// Which kernel computes the product.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MatmulVariant {
    /// Cooperative matrices when the device has them and the inputs are f16, else tiled.
    #[default]
    Auto,
    /// The portable tiled kernel.
    Tiled,
    /// Cooperative matrices (tensor cores); an error where the device lacks them.
    Coop,
}

/// Block size of the tiled variant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MatmulTile {
    /// 128x128 when that still gives enough workgroups to fill the device, else 64x64.
    #[default]
    Auto,
    /// 64x64 blocks, 4x4 outputs per invocation (8 KiB of workgroup memory).
    T64,
    /// 128x128 blocks, 8x8 outputs per invocation (16 KiB of workgroup memory).
    T128,
}

/// Options of [`matmul`]. `Default` is a plain `a @ b` with automatic variant choice.
#[derive(Clone, Copy, Debug, Default)]
pub struct MatmulOptions<'a> {
    /// `b` is `[.., N, K]` (nn.Linear weight layout) instead of `[.., K, N]`.
    pub transpose_b: bool,
    /// `[N]` (f32 or f16) added to every output row.
    pub bias: Option<&'a Tensor>,
    pub variant: MatmulVariant,
    pub tile: MatmulTile,
    /// Build switches of the cooperative kernel (A/B timing on the target GPU).
    pub coop: CoopTuning,
    /// K slices of the cooperative kernel (`kernels::matmul_splitk`): 0 automatic, 1 none, else that
    /// many where K allows.
    pub split_k: usize,
    /// SwiGLU epilogue: `b` stacks gate rows `[0, I)` over up rows `[I, 2I)` and `out` `[.., M, I]`
    /// is `silu(a @ gate^T) * (a @ up^T)`. Cooperative variant only (see [`glu_available`]), with
    /// `transpose_b`, no bias and `I` a multiple of 64.
    pub glu: bool,
}

/// Build switches of the cooperative-matrix kernel. The default is what the model paths use; the
/// others exist so `drift bench kernels --filter coopsweep` can time each choice on the target GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoopTuning {
    /// Compile without bounds checks (every access is guarded by host-validated shapes).
    pub trusted: bool,
    /// Keep naga's loop bounding.
    pub loop_bounding: bool,
    /// Pad workgroup-memory rows so 16-row matrix loads hit distinct banks.
    pub pad: bool,
    /// Fetch the next K step into registers while multiplying this one.
    pub prefetch: bool,
    /// Eight subgroups of 32 x 64 per 128 x 128 block instead of four of 64 x 64 (half the
    /// accumulator registers per invocation).
    pub sg8: bool,
    /// K steps of 64 instead of 32 (with `sg8` only; ignored otherwise).
    pub bk64: bool,
}

/// The default is the fastest build measured on the H200 (`drift bench kernels --filter coopsweep`,
/// BENCHMARKS.md 2026-11-30): eight subgroups, K steps of 64, no register prefetch (registers are what
/// limit this kernel: each of those three cuts them and each made it faster), no loop bounding.
impl Default for CoopTuning {
    fn default() -> Self {
        CoopTuning {
            trusted: false,
            loop_bounding: false,
            pad: true,
            prefetch: false,
            sg8: true,
            bk64: true,
        }
    }
}

/// Floating-point operations of a (batched) matmul, bias excluded: `2 batch M N K`.
pub fn matmul_flops(batch: usize, m: usize, n: usize, k: usize) -> f64 {
    2.0 * batch as f64 * m as f64 * n as f64 * k as f64
}

/// 128x128 blocks of the tiled variant below which 64x64 blocks are used instead. On the H200 (132 SMs)
/// 512x4096x4096 ran at 24 TFLOP/s with 128 large blocks against 20 with 512 small ones, so about
/// one large block per SM is already enough.
const MIN_LARGE_TILES: usize = 96;

/// `out = a @ b` (or `a @ b^T` with `opts.transpose_b`) `+ bias`.
///
/// `a`: `[.., M, K]`; `b`: `[K, N]` / `[N, K]` shared by every batch entry, or with the same leading
/// batch dimensions as `a`; `out`: `[.., M, N]`. `a` and `b` share one float dtype (f32 or f16);
/// `out` is f32 or f16; accumulation is f32.
pub fn matmul(
    gpu: &Gpu,
    a: &Tensor,
    b: &Tensor,
    out: &Tensor,
    opts: &MatmulOptions,
) -> Result<Vec<Dispatch>> {
    let s = check(a, b, out, opts)?;
    let too_big = b.binding(gpu.caps.max_storage_binding).is_err();
    if opts.glu
        && (too_big || choose_variant(&gpu.caps, a.dtype, opts.variant)? != MatmulVariant::Coop)
    {
        return Err(DriftError::Unsupported(
            "the matmul SwiGLU epilogue needs the cooperative variant and a weight in one binding"
                .into(),
        ));
    }
    if too_big && opts.transpose_b && !s.batched_b {
        // A weight bigger than one binding: column blocks of the output, one row shard of b each.
        let w = b.reshape(&[s.n, s.k])?;
        return matmul_shards(
            gpu,
            a,
            &w.row_shards(gpu.caps.max_storage_binding)?,
            out,
            opts,
        );
    }
    let split = split_of(gpu, a, b, Some(out), &s, opts)?;
    if split > 1 {
        let (d, part) = split_partials(gpu, a, b, opts, &s, split)?;
        return Ok(vec![
            d,
            matmul_splitk::sum_slices(gpu, &part, out, opts.bias, split)?,
        ]);
    }
    Ok(vec![build(gpu, a, b, out, opts, &s, 0, s.n, 1)?])
}

/// The split-K half of [`matmul`] for a consumer that sums the slices itself: where `matmul` would
/// split this product (no bias, `a` and N vector-aligned), the dispatch writing the f32 partials and
/// the partials `[slices, M, N]` (a view of the device's shared scratch, valid until the next split
/// product); `None` where it would not.
pub fn matmul_partials(
    gpu: &Gpu,
    a: &Tensor,
    b: &Tensor,
    opts: &MatmulOptions,
) -> Result<Option<(Dispatch, Tensor)>> {
    let n = if opts.transpose_b {
        b.dim(-2)
    } else {
        b.dim(-1)
    };
    let mut shape = a.shape.clone();
    *shape.last_mut().unwrap_or(&mut 0) = n;
    // Shape checks against a stand-in output (the partials take its place).
    let out = Tensor {
        shape,
        dtype: DType::F32,
        ..a.clone()
    };
    let s = check(a, b, &out, opts)?;
    if opts.bias.is_some() {
        return Ok(None);
    }
    match split_of(gpu, a, b, None, &s, opts)? {
        1 => Ok(None),
        split => split_partials(gpu, a, b, opts, &s, split).map(Some),
    }
}

/// Slices of K [`matmul`] cuts this product into (1: none): batch 1, one shared transposed weight in
/// one binding, the cooperative variant, no epilogue but the bias, and vector access for the passes
/// that read the partials (N and a's base, and `out`'s base where a summing pass writes it).
fn split_of(
    gpu: &Gpu,
    a: &Tensor,
    b: &Tensor,
    out: Option<&Tensor>,
    s: &Shape,
    opts: &MatmulOptions,
) -> Result<usize> {
    let max = gpu.caps.max_storage_binding;
    let aligned = |t: &Tensor| -> Result<bool> { Ok(t.binding(max)?.base_elems.is_multiple_of(4)) };
    if opts.glu
        || s.batch != 1
        || s.batched_b
        || !opts.transpose_b
        || b.binding(max).is_err()
        || choose_variant(&gpu.caps, a.dtype, opts.variant)? != MatmulVariant::Coop
        || !s.n.is_multiple_of(4)
        || !aligned(a)?
        || !out.map_or(Ok(true), aligned)?
    {
        return Ok(1);
    }
    Ok(matmul_splitk::slices(opts.split_k, s.m, s.n, s.k))
}

/// The partial products of a `split`-way split (into the shared scratch, sized once for the largest
/// split any product takes).
fn split_partials(
    gpu: &Gpu,
    a: &Tensor,
    b: &Tensor,
    opts: &MatmulOptions,
    s: &Shape,
    split: usize,
) -> Result<(Dispatch, Tensor)> {
    let len = split * s.m * s.n;
    let part = gpu
        .split_k_scratch(len.max(matmul_splitk::MAX_PARTIALS))?
        .view(0, &[split, s.m, s.n])?;
    let no_bias = MatmulOptions {
        bias: None,
        ..*opts
    };
    Ok((build(gpu, a, b, &part, &no_bias, s, 0, s.n, split)?, part))
}

/// `out = a @ W^T + bias` for a weight `W` `[N, K]` given as row shards (each bound separately, for
/// weights bigger than one storage binding): one dispatch per shard, writing its columns of `out`.
/// `opts.transpose_b` is implied.
pub fn matmul_shards(
    gpu: &Gpu,
    a: &Tensor,
    shards: &[RowShard],
    out: &Tensor,
    opts: &MatmulOptions,
) -> Result<Vec<Dispatch>> {
    let k = a.shape.last().copied().unwrap_or(0);
    let mut row = 0;
    for sh in shards {
        if sh.row_start != row || sh.tensor.rank() != 2 || sh.tensor.shape[1] != k {
            return Err(shape_err!(
                "matmul shards must tile a [N, {k}] weight in order; got rows {} of {:?}",
                sh.row_start,
                sh.tensor.shape
            ));
        }
        row += sh.tensor.shape[0];
    }
    let n = row;
    let mut ds = Vec::with_capacity(shards.len());
    let full_opts = MatmulOptions {
        transpose_b: true,
        ..*opts
    };
    for sh in shards {
        // Shape checks against the whole weight, then the shard's own geometry.
        let whole = Tensor {
            shape: vec![n, k],
            ..sh.tensor.clone()
        };
        let s = check(a, &whole, out, &full_opts)?;
        ds.push(build(
            gpu,
            a,
            &sh.tensor,
            out,
            &full_opts,
            &s,
            sh.row_start,
            sh.tensor.shape[0],
            1,
        )?);
    }
    Ok(ds)
}

/// Shapes of a checked matmul.
#[derive(Clone, Copy, Debug)]
struct Shape {
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    batched_b: bool,
}

fn float(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F16)
}

fn check(a: &Tensor, b: &Tensor, out: &Tensor, opts: &MatmulOptions) -> Result<Shape> {
    if a.rank() < 2 || b.rank() < 2 || out.rank() != a.rank() {
        return Err(shape_err!(
            "matmul needs a [.., M, K], b [.., K, N] and out [.., M, N]; got {:?}, {:?}, {:?}",
            a.shape,
            b.shape,
            out.shape
        ));
    }
    if !float(a.dtype) || a.dtype != b.dtype || !float(out.dtype) {
        return Err(shape_err!(
            "matmul: a and b must share f32 or f16 and out be f32 or f16; got {:?}, {:?}, {:?}",
            a.dtype,
            b.dtype,
            out.dtype
        ));
    }
    for (t, what) in [(a, "a"), (b, "b"), (out, "out")] {
        if t.layout != Layout::RowMajor {
            return Err(shape_err!(
                "matmul: {what} must be row-major, is {:?}",
                t.layout
            ));
        }
    }
    let (m, k) = (a.dim(-2), a.dim(-1));
    let (bk, n) = if opts.transpose_b {
        (b.dim(-1), b.dim(-2))
    } else {
        (b.dim(-2), b.dim(-1))
    };
    let lead = &a.shape[..a.rank() - 2];
    let b_lead = &b.shape[..b.rank() - 2];
    let batch: usize = lead.iter().product();
    let batched_b = b_lead.iter().product::<usize>() != 1;
    if bk != k || (batched_b && b_lead != lead) {
        return Err(shape_err!(
            "matmul: a {:?} and b {:?}{} do not match (K {k} vs {bk}; b's batch must equal a's or be absent)",
            a.shape,
            b.shape,
            if opts.transpose_b {
                " (transposed)"
            } else {
                ""
            }
        ));
    }
    let out_n = if opts.glu { n / 2 } else { n };
    if out.shape[..out.rank() - 2] != *lead || out.dim(-2) != m || out.dim(-1) != out_n {
        return Err(shape_err!(
            "matmul: out is {:?}, expected {lead:?} + [{m}, {out_n}]",
            out.shape
        ));
    }
    if opts.glu && (!opts.transpose_b || opts.bias.is_some() || !n.is_multiple_of(128)) {
        return Err(shape_err!(
            "matmul: the SwiGLU epilogue needs a transposed weight of gate and up rows (a multiple of \
             128 in all, got {n}) and no bias"
        ));
    }
    if let Some(bias) = opts.bias
        && (bias.numel() != n || !float(bias.dtype))
    {
        return Err(shape_err!(
            "matmul: bias must be [{n}] f32 or f16, is {:?} {:?}",
            bias.shape,
            bias.dtype
        ));
    }
    Ok(Shape {
        batch,
        m,
        n,
        k,
        batched_b,
    })
}

fn needs_f16(caps: &Caps, dtypes: &[DType]) -> Result<bool> {
    let any = dtypes.contains(&DType::F16);
    if any && !caps.f16 {
        return Err(DriftError::Unsupported(
            "f16 tensors on a device without shader-f16".into(),
        ));
    }
    Ok(any)
}

/// Workgroup memory of the cooperative kernel: A and B tiles (rows of `bk / 4 + 2` vec4<f16>) plus
/// the f32 staging area (16 rows of 64 or 16 columns per subgroup).
fn coop_smem(epi4: bool, subgroups: u32, bk: u32) -> u32 {
    let tiles = 2 * 128 * (bk / 4 + 2) * 8; // transposed B; [K, N] B (bk x 34 vec4) is smaller
    tiles + subgroups * 16 * if epi4 { 64 } else { 16 } * 4
}

/// Whether the cooperative kernel can run here: 16x16 f16 matrices, subgroups of exactly 32 (the
/// kernel is 128 invocations = four subgroups, one per 64x64 quadrant) and the workgroup memory for
/// the small staging area.
pub fn coop_available(caps: &Caps) -> bool {
    caps.coop_16x16_f16_f32
        && caps.subgroup
        && caps.subgroup_min_size == 32
        && caps.subgroup_max_size == 32
        && coop_smem(false, 8, 32) <= caps.max_workgroup_storage
}

/// The variant that will run for these dtypes.
pub fn choose_variant(
    caps: &Caps,
    dtype: DType,
    requested: MatmulVariant,
) -> Result<MatmulVariant> {
    match requested {
        MatmulVariant::Auto if dtype == DType::F16 && coop_available(caps) => {
            Ok(MatmulVariant::Coop)
        }
        MatmulVariant::Auto | MatmulVariant::Tiled => Ok(MatmulVariant::Tiled),
        MatmulVariant::Coop if dtype == DType::F16 && coop_available(caps) => {
            Ok(MatmulVariant::Coop)
        }
        MatmulVariant::Coop => Err(DriftError::Unsupported(format!(
            "cooperative-matrix matmul needs f16 inputs (got {dtype:?}) and a device with 16x16 f16 \
             cooperative matrices, subgroups of 32 and {} bytes of workgroup memory",
            coop_smem(false, 8, 32)
        ))),
    }
}

/// Whether [`matmul`] can apply the SwiGLU epilogue (`MatmulOptions::glu`) to `a @ w^T` for `dtype`
/// operands and a weight `[n, k]` of gate over up rows: the cooperative variant, the weight in one
/// binding, `n % 128 == 0`.
pub fn glu_available(gpu: &Gpu, dtype: DType, n: usize, k: usize) -> bool {
    n.is_multiple_of(128)
        && dtype
            .bytes_for(n * k)
            .is_ok_and(|b| b <= gpu.caps.max_storage_binding)
        && matches!(
            choose_variant(&gpu.caps, dtype, MatmulVariant::Auto),
            Ok(MatmulVariant::Coop)
        )
}

#[allow(clippy::too_many_arguments)]
fn build(
    gpu: &Gpu,
    a: &Tensor,
    b: &Tensor,
    out: &Tensor,
    opts: &MatmulOptions,
    s: &Shape,
    col0: usize,
    n: usize,
    split: usize,
) -> Result<Dispatch> {
    let caps = &gpu.caps;
    let ba = a.binding(caps.max_storage_binding)?.base_elems as usize;
    let bb = b.binding(caps.max_storage_binding)?.base_elems as usize;
    let bo = out.binding(caps.max_storage_binding)?.base_elems as usize;
    let bias_dtype = opts.bias.map(|t| t.dtype);
    let mut dtypes = vec![a.dtype, out.dtype];
    dtypes.extend(bias_dtype);
    let f16 = needs_f16(caps, &dtypes)?;
    let variant = choose_variant(caps, a.dtype, opts.variant)?;

    let Shape { m, k: lda, .. } = *s;
    let n_total = s.n;
    let ldb = if opts.transpose_b { lda } else { n_total };
    // Split K: slice z of K is batch entry z (a and b advance by the slice, out by a whole [M, N]).
    let (batch, k, a_bs, b_bs) = if split > 1 {
        let ks = lda / split;
        (split, ks, ks, ks)
    } else {
        (
            s.batch,
            lda,
            m * lda,
            if s.batched_b { lda * n_total } else { 0 },
        )
    };
    // GLU: the output has half the weight's rows as columns.
    let ldo = if opts.glu { n_total / 2 } else { n_total };
    let out_bs = m * ldo;
    // Vector access needs the contiguous run and every base offset to be multiples of 4 elements.
    let va = lda.is_multiple_of(4) && k.is_multiple_of(4) && ba.is_multiple_of(4);
    let vb =
        ldb.is_multiple_of(4) && bb.is_multiple_of(4) && (opts.transpose_b || n.is_multiple_of(4));
    let vo = n.is_multiple_of(4)
        && ldo.is_multiple_of(4)
        && col0.is_multiple_of(4)
        && bo.is_multiple_of(4);
    let bias_name = match bias_dtype {
        Some(d) => format!("_bias{}", d.wgsl()),
        None => String::new(),
    };
    let tb = bias_dtype.unwrap_or(out.dtype).wgsl();
    // The tiled matmul ran 1.1-1.2x faster on the H200 with naga's loop bounding kept (see KernelSpec);
    // the cooperative one sets it from `CoopTuning`.
    let common = |spec: KernelSpec| {
        spec.loop_bounded()
            .define("TO", out.dtype.wgsl())
            .define("TB", tb)
            .define("F16", u8::from(f16))
            .define("VA", u8::from(va))
            .define("VB", u8::from(vb))
            .define("BIAS", u8::from(opts.bias.is_some()))
    };
    let mut tensors = vec![a, b, out];
    tensors.extend(opts.bias);

    let (spec, block) = if variant == MatmulVariant::Coop {
        let direct = vo && out.dtype == DType::F32 && opts.bias.is_none() && !opts.glu;
        let t = opts.coop;
        let epi4 = !t.sg8 && coop_smem(true, 4, 32) <= caps.max_workgroup_storage;
        let bk64 = t.sg8 && t.bk64 && coop_smem(false, 8, 64) <= caps.max_workgroup_storage;
        let name = format!(
            "matmul_coop_f16{}_{}{bias_name}{}",
            if opts.transpose_b { "_nt" } else { "" },
            out.dtype.wgsl(),
            if opts.glu { "_swiglu" } else { "" }
        );
        let mut spec = common(KernelSpec::new(
            name,
            shader!("matmul_coop.wgsl"),
            "matmul_coop",
        ))
        .define("TRANS_B", u8::from(opts.transpose_b))
        .define("GLU", u8::from(opts.glu))
        .define("VO", u8::from(vo && !direct))
        .define("DIRECT", u8::from(direct))
        .define("EPI4", u8::from(epi4))
        .define("NOPAD", u8::from(!t.pad))
        .define("NOPREFETCH", u8::from(!t.prefetch))
        .define("SG8", u8::from(t.sg8))
        .define("BK64", u8::from(bk64))
        .define("ST8", u8::from(!t.sg8 || bk64));
        spec.loop_bounding = t.loop_bounding;
        if t.trusted {
            spec = spec.trusted();
        }
        (spec, 128)
    } else {
        let count = |blk: usize| batch * m.div_ceil(blk) * n.div_ceil(blk);
        let large = match opts.tile {
            MatmulTile::T128 => true,
            MatmulTile::T64 => false,
            MatmulTile::Auto => count(128) >= MIN_LARGE_TILES,
        } && 16 * 1024 <= caps.max_workgroup_storage;
        let r = if large { 8 } else { 4 };
        // The B layout is a uniform flag: keep it out of the kernel name (part of the cache key) and
        // put it in the dispatch name.
        let name = format!(
            "matmul_{}_{}_{}{bias_name}",
            a.dtype.wgsl(),
            out.dtype.wgsl(),
            16 * r
        );
        let spec = common(KernelSpec::new(name, shader!("matmul.wgsl"), "matmul"))
            .define("T", a.dtype.wgsl())
            .define("R", r)
            .define("R8", u8::from(r == 8))
            .define("VO", u8::from(vo));
        (spec, 16 * r)
    };
    // A candidate for `KernelSpec::trusted` (every global access is guarded by validated bounds), left
    // checked until the H200 measures the difference.
    let kernel = gpu.kernel(&spec)?;
    let (tiles_m, tiles_n) = (m.div_ceil(block), n.div_ceil(block));
    let groups = batch * tiles_m * tiles_n;
    // Element indices are u32 in the kernels (bindings are at most a few GiB).
    let largest = (ba + batch * m * k)
        .max(bb + if s.batched_b { batch } else { 1 } * n * lda)
        .max(bo + batch * m * ldo);
    if groups > u32::MAX as usize || largest > u32::MAX as usize {
        return Err(shape_err!(
            "matmul of {batch}x{m}x{n}x{k} is too large for 32-bit indexing"
        ));
    }
    // The tiled kernel's B-layout flag, then a's row stride (the cooperative kernel's; K unless split),
    // GLU's gate rows and padding to a whole 16-byte row of the uniform.
    let flags = [usize::from(opts.transpose_b), lda, n_total / 2, 0];
    let params: Vec<u32> = [
        m, n, k, tiles_m, tiles_n, groups, a_bs, b_bs, out_bs, ldo, col0, ldb,
    ]
    .iter()
    .chain(&flags)
    .map(|&v| v as u32)
    .collect();
    let in_bytes = a.elem_bytes() as f64;
    let cost = Cost {
        flops: matmul_flops(batch, m, n, k) + opts.bias.map_or(0.0, |_| (batch * m * n) as f64),
        // Each operand is read once from memory (tiles re-read it from cache), the output written once.
        bytes: (batch * m * k) as f64 * in_bytes
            + (if s.batched_b { batch } else { 1 } * n * lda) as f64 * in_bytes
            + (batch * m * ldo) as f64 * out.elem_bytes() as f64
            + opts
                .bias
                .map_or(0.0, |t| (n as u64 * t.elem_bytes()) as f64),
    };
    let mut d = gpu.dispatch(
        &kernel,
        &params,
        &tensors,
        grid(groups as u32, caps.max_workgroups_per_dimension),
        cost,
    )?;
    if variant == MatmulVariant::Tiled {
        d.name = format!("{}{}", d.name, if opts.transpose_b { "_nt" } else { "" });
    }
    Ok(d)
}
