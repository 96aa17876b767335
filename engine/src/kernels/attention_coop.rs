//! The cooperative-matrix prefill variant of [`crate::kernels::attention`] (`shaders/attention_coop.wgsl`):
//! f16 q/k/v on tensor cores, f32 scores and accumulation, lazily rescaled online softmax. Without
//! cooperative matrices the same kernel runs with its matrix operations emulated by plain loops
//! ([`AttentionVariant::CoopEmulated`](crate::kernels::attention::AttentionVariant)), which is how
//! the whole algorithm is tested on devices that lack them.

use crate::error::{DriftError, Result};
use crate::exec::{Cost, Dispatch};
use crate::gpu::{Caps, Gpu};
use crate::kernels::attention::{Dims, env_pair, unrolled};
use crate::kernels::matmul::coop_available;
use crate::kernels::{KernelSpec, grid};
use crate::shader;
use crate::tensor::{DType, Tensor};

/// Tile of the cooperative kernel: `subgroups` subgroups of 32 own 16 query rows each and walk the
/// keys `keys` at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoopTile {
    pub subgroups: usize,
    pub keys: usize,
}

impl CoopTile {
    pub fn query_rows(&self) -> usize {
        16 * self.subgroups
    }

    pub fn threads(&self) -> usize {
        32 * self.subgroups
    }

    /// Workgroup memory the kernel declares for head dim `d` (mirrors the shader's arrays).
    pub fn shared_bytes(&self, d: usize, subgroups: bool) -> usize {
        let (qp, kp_s) = (self.qp(d), self.kp_s(d));
        let vec4h = self.query_rows() * qp + kp_s + self.keys * qp;
        let f32s =
            self.query_rows() * (self.keys + 4) + 1 + if subgroups { 0 } else { self.threads() };
        // The leading vec4<u32> that aligns the tiles (see the shader).
        16 + vec4h * 8 + f32s * 4
    }

    /// Row pitch (vec4<f16>) of the Q, K and V tiles.
    fn qp(&self, d: usize) -> usize {
        padded_dim(d) / 4 + 2
    }

    /// Length (vec4<f16>) of `tiles.kp`, shared by the K tile and the probabilities.
    fn kp_s(&self, d: usize) -> usize {
        (self.keys * self.qp(d)).max(self.query_rows() * (self.keys / 4 + 2))
    }

    fn valid(&self) -> bool {
        [1, 2, 4, 8].contains(&self.subgroups) && [16, 32, 64].contains(&self.keys)
    }
}

/// `d` rounded up to the 16 columns of a matrix tile.
fn padded_dim(d: usize) -> usize {
    d.next_multiple_of(16)
}

/// The largest tile that fits `caps` for head dim `d`: most query rows (K/V reuse), then most keys
/// (fewer barriers per key).
pub fn coop_tile(caps: &Caps, d: usize, subgroups: bool) -> Option<CoopTile> {
    first_fit(caps, d, subgroups, &TILES)
}

/// Tiles of 8 subgroups (128 query rows: each staged K/V tile serves twice the rows): timed by the
/// bench sweep, taken first by non-causal attention (see [`preferred_tile`]).
pub const WIDE_TILES: [(usize, usize); 2] = [(8, 16), (8, 32)];

/// Every tile shape (subgroups, keys) the kernel picks from, largest first.
pub const TILES: [(usize, usize); 7] = [
    (4, 64),
    (4, 32),
    (4, 16),
    (2, 64),
    (2, 32),
    (2, 16),
    (1, 16),
];
const NON_CAUSAL: [(usize, usize); 9] = [
    (8, 32),
    (8, 16),
    (4, 16),
    (4, 32),
    (4, 64),
    (2, 16),
    (2, 32),
    (2, 64),
    (1, 16),
];

/// The tile [`coop`] takes when none is given. Non-causal attention (SD's self- and cross-attention)
/// takes 128 query rows first, then 16 keys per tile: timed on the H200 (`drift bench kernels --filter
/// attncoopsweep`, 2026-12-02), D = 40 at 4096 tokens ran 920 us with 128 x 32 against 1,141 with
/// 64 x 16 and 1,274 with 64 x 64; D = 80 (where 128 x 32 does not fit) 98.6 us with 128 x 16 against
/// 104.5 with 64 x 16; D = 160 fits neither and takes 64 x 16 (42.6 us, against 44.1 with 32 x 32).
/// Causal prefill (LLMs) keeps the largest 4-subgroup tile, with which its figures were measured (1B
/// prefill 42,651 tok/s at D = 64).
fn preferred_tile(caps: &Caps, d: usize, subgroups: bool, causal: bool) -> Option<CoopTile> {
    let order: &[(usize, usize)] = if causal { &TILES } else { &NON_CAUSAL };
    first_fit(caps, d, subgroups, order)
}

fn first_fit(caps: &Caps, d: usize, subgroups: bool, order: &[(usize, usize)]) -> Option<CoopTile> {
    order
        .iter()
        .map(|&(subgroups, keys)| CoopTile { subgroups, keys })
        .find(|t| fits(caps, t, d, subgroups))
}

fn fits(caps: &Caps, t: &CoopTile, d: usize, subgroups: bool) -> bool {
    t.shared_bytes(d, subgroups) <= caps.max_workgroup_storage as usize
        && t.threads() <= caps.max_invocations_per_workgroup as usize
}

/// Whether the real (tensor-core) kernel can run for these tensors: f16 q/k/v, a device with 16x16
/// f16 cooperative matrices and subgroups of 32, and a tile that fits for `d`.
pub fn coop_usable(caps: &Caps, q: &Tensor, k: &Tensor, d: usize) -> bool {
    q.dtype == DType::F16
        && k.dtype == DType::F16
        && coop_available(caps)
        && coop_tile(caps, d, true).is_some()
}

/// Whether subgroup shuffles can do the kernel's pair exchanges: lanes 2i and 2i + 1 of a role
/// order built from subgroups must share a subgroup, and subgroups must be full.
fn pair_shuffles_usable(caps: &Caps, threads: usize) -> bool {
    caps.subgroup
        && caps.subgroup_min_size >= 2
        && caps.subgroup_max_size.is_power_of_two()
        && caps.subgroup_max_size as usize <= threads
}

/// One specialisation of `shaders/attention_coop.wgsl` (everything the host decides).
#[derive(Clone, Debug)]
pub struct CoopConfig {
    pub d: usize,
    pub tile: CoopTile,
    /// Query heads per KV head.
    pub g: usize,
    pub causal: bool,
    /// Real cooperative matrices (else emulated).
    pub coop: bool,
    /// Roles and pair exchanges from subgroups (required by `coop`).
    pub subgroups: bool,
    /// q, k/v read and out written as vec4.
    pub vec_q: bool,
    pub vec_kv: bool,
    pub vec_out: bool,
    pub out_f16: bool,
    /// Bisection switches for the H200 fault (`DRIFT_COOP_ATTENTION_DEBUG`).
    pub debug: CoopDebug,
}

/// Bisection switches (`DRIFT_COOP_ATTENTION_DEBUG=plain_s,plain_pv,no_rescale,lid_role,vt`, and one of
/// `dump_s`, `dump_p`, `dump_o`): parts of the real kernel replaced by plain per-lane code or other
/// forms, or the kernel stopped after a stage, to find which part goes wrong.
#[derive(Clone, Copy, Debug, Default)]
pub struct CoopDebug {
    pub plain_s: bool,
    pub plain_pv: bool,
    pub no_rescale: bool,
    pub lid_role: bool,
    pub vt: bool,
    /// Compiled without runtime bounds checks and workgroup zeroing (bisection only).
    pub unchecked: bool,
    /// Stage probe: the output is the first key tile's scores, probabilities or P V
    /// (`dump_s`, `dump_p`, `dump_o`; see [`crate::selftest::attention::coop_stage_checks`]).
    pub dump: Option<CoopStage>,
}

/// What a stage probe writes (`DUMP_*` in the shader).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoopStage {
    /// Raw scores Q K^T of keys 0 .. min(tile keys, D).
    Scores,
    /// The f16 probabilities exp(scale s - m) of those keys (m: the tile's row max).
    Probabilities,
    /// P V over the tile's keys, not divided by the row sum.
    ProbabilitiesTimesV,
}

impl CoopDebug {
    pub fn from_env() -> CoopDebug {
        let v = std::env::var("DRIFT_COOP_ATTENTION_DEBUG").unwrap_or_default();
        let has = |k: &str| v.split(',').any(|x| x.trim() == k);
        CoopDebug {
            plain_s: has("plain_s"),
            plain_pv: has("plain_pv"),
            no_rescale: has("no_rescale"),
            lid_role: has("lid_role"),
            vt: has("vt"),
            unchecked: has("unchecked"),
            dump: [
                ("dump_s", CoopStage::Scores),
                ("dump_p", CoopStage::Probabilities),
                ("dump_o", CoopStage::ProbabilitiesTimesV),
            ]
            .into_iter()
            .find(|(k, _)| has(k))
            .map(|(_, s)| s),
        }
    }

    fn tag(&self) -> String {
        let mut t = String::new();
        for (on, n) in [
            (self.plain_s, "_ps"),
            (self.plain_pv, "_ppv"),
            (self.no_rescale, "_nr"),
            (self.lid_role, "_lr"),
            (self.vt, "_vt"),
            (self.unchecked, "_uc"),
        ] {
            if on {
                t.push_str(n);
            }
        }
        if let Some(stage) = self.dump {
            t.push_str(&format!("_dump{stage:?}"));
        }
        t
    }
}

impl CoopConfig {
    /// The preprocessor defines, generated blocks included.
    pub fn defines(&self) -> Vec<(&'static str, String)> {
        let flag = |b: bool| if b { "1" } else { "0" }.to_string();
        let t = &self.tile;
        let dp = padded_dim(self.d);
        let loads = (t.keys * dp / 4).div_ceil(t.threads());
        let mut defs = vec![
            ("COOP", flag(self.coop)),
            ("SG", flag(self.subgroups)),
            ("QV", flag(self.vec_q)),
            ("KV", flag(self.vec_kv)),
            ("OV", flag(self.vec_out)),
            ("OT", if self.out_f16 { "f16" } else { "f32" }.into()),
            ("D", self.d.to_string()),
            ("DP", dp.to_string()),
            ("NSG", t.subgroups.to_string()),
            ("BK", t.keys.to_string()),
            ("KPS", t.kp_s(self.d).to_string()),
            ("G", self.g.to_string()),
            ("LOADS", loads.to_string()),
            ("CAUSAL", flag(self.causal)),
            ("LID_ROLE", flag(self.debug.lid_role)),
            ("VT", flag(self.debug.vt)),
            ("DUMP_S", flag(self.debug.dump == Some(CoopStage::Scores))),
            (
                "DUMP_P",
                flag(self.debug.dump == Some(CoopStage::Probabilities)),
            ),
            (
                "DUMP_O",
                flag(self.debug.dump == Some(CoopStage::ProbabilitiesTimesV)),
            ),
            (
                "VS",
                (t.keys * t.qp(self.d))
                    .max(dp * (t.keys / 4 + 2))
                    .to_string(),
            ),
        ];
        defs.extend(bodies(dp / 16, t.keys / 16, self.coop, &self.debug));
        defs
    }

    fn name(&self) -> String {
        format!(
            "attention_{}_d{}_{}x{}_{}{}{}{}",
            if self.coop { "coop" } else { "coop_emulated" },
            self.d,
            self.tile.query_rows(),
            self.tile.keys,
            if self.out_f16 { "h" } else { "f" },
            if self.causal { "_causal" } else { "" },
            if self.subgroups { "_sg" } else { "" },
            self.debug.tag(),
        )
    }
}

/// The generated blocks of the shader over `nd` output accumulators (head dim / 16) and `nk` score
/// accumulators (tile keys / 16); accumulators are named variables so nothing indexes them. With real
/// matrices (`coop`) the accumulators start as `var x = MatC();` and the products call
/// coopMultiplyAdd directly, the forms the cooperative matmul uses on the H200 (no matrix-valued
/// function returns of a zero value, no A/B matrices passed as function parameters).
fn bodies(nd: usize, nk: usize, coop: bool, dbg: &CoopDebug) -> Vec<(&'static str, String)> {
    let mma = if coop { "coopMultiplyAdd" } else { "mma" };
    let decl = (0..nd)
        .map(|i| format!("    var o{i} = MatC();\n"))
        .collect::<String>()
        .trim_end()
        .to_string();
    // S: for each 16-deep slice of the head dim, one Q tile against nk K tiles.
    let mut s = unrolled(nk, |j| format!("var s{j} = MatC();"));
    for kd in 0..nd {
        let mmas: String = (0..nk)
            .map(|j| {
                format!(
                    " s{j} = {mma}(a, load_k_b({}u * QP + {}u), s{j});",
                    16 * j,
                    4 * kd
                )
            })
            .collect();
        s.push_str(&format!(
            "\n        {{ let a = load_q_a(w * 16u * QP + {}u);{mmas} }}",
            4 * kd
        ));
    }
    s.push('\n');
    s.push_str(&unrolled(nk, |j| {
        format!("store_c(s{j}, w * 16u * SP + {}u);", 16 * j)
    }));
    // O += P V: for each 16 keys, one P tile against nd V tiles.
    let pv = unrolled(nk, |kk| {
        let mmas: String = (0..nd)
            .map(|c| {
                format!(
                    " o{c} = {mma}(a, load_v_b({}u * QP + {}u), o{c});",
                    16 * kk,
                    4 * c
                )
            })
            .collect();
        format!("{{ let a = load_p_a(w * 16u * PP + {}u);{mmas} }}", 4 * kk)
    });
    // Round trips through tiles.s, nk accumulators (16 nk <= BK columns) at a time.
    let chunks: Vec<(usize, usize)> = (0..nd)
        .step_by(nk)
        .map(|c0| (c0, nk.min(nd - c0)))
        .collect();
    let stores = |c0: usize, n: usize| -> String {
        (0..n)
            .map(|t| format!(" store_c(o{}, w * 16u * SP + {}u);", c0 + t, 16 * t))
            .collect()
    };
    let rescale = chunks
        .iter()
        .enumerate()
        .map(|(i, &(c0, n))| {
            let loads: String = (0..n)
                .map(|t| format!(" o{} = load_c(w * 16u * SP + {}u);", c0 + t, 16 * t))
                .collect();
            let sep = if i + 1 < chunks.len() {
                " workgroupBarrier();"
            } else {
                ""
            };
            format!(
                "           {} workgroupBarrier(); scale_row(srow, h, {n}u, alpha); workgroupBarrier();{loads}{sep}\n",
                stores(c0, n)
            )
        })
        .collect::<String>()
        .trim_end()
        .to_string();
    let store = chunks
        .iter()
        .enumerate()
        .map(|(i, &(c0, n))| {
            let sep = if i + 1 < chunks.len() {
                " workgroupBarrier();"
            } else {
                ""
            };
            format!(
                "   {} workgroupBarrier(); if live {{ write_row(srow, h, {n}u, {}u, o_row, inv); }}{sep}\n",
                stores(c0, n),
                16 * c0
            )
        })
        .collect::<String>()
        .trim_end()
        .to_string();
    let (mut decl, mut s, mut pv, mut rescale, mut store) = (decl, s, pv, rescale, store);
    if dbg.vt {
        pv = unrolled(nk, |kk| {
            let mmas: String = (0..nd)
                .map(|c| {
                    format!(
                        " o{c} = {mma}(a, load_v_b({}u * PVP + {}u), o{c});",
                        16 * c,
                        4 * kk
                    )
                })
                .collect();
            format!("{{ let a = load_p_a(w * 16u * PP + {}u);{mmas} }}", 4 * kk)
        });
    }
    if dbg.plain_s {
        s = "            for (var kk = h * (BK / 2u); kk < (h + 1u) * (BK / 2u); kk++) { var acc = 0.0; for (var c = 0u; c < DPC; c++) { acc += dot(vec4<f32>(tiles.q[(w * 16u + row_l) * QP + c]), vec4<f32>(tiles.kp[kk * QP + c])); } tiles.s[srow + kk] = acc; }".into();
    }
    if dbg.plain_pv {
        decl = "    var oacc: array<f32, DPH>;".into();
        pv = "            for (var kk = 0u; kk < BK; kk++) { let pk = f32(tiles.kp[prow + kk / 4u][kk % 4u]); for (var j = 0u; j < DPH; j++) { let col = h * DPH + j; oacc[j] += pk * f32(vt_read(kk, col)); } }".into();
        rescale = "            for (var j = 0u; j < DPH; j++) { oacc[j] *= alpha; }".into();
        store = "    if live { for (var j = 0u; j < DPH; j += 4u) { let col = h * DPH + j; if col < D { store_out(o_row + col, vec4<f32>(oacc[j], oacc[j + 1u], oacc[j + 2u], oacc[j + 3u]) * inv); } } }".into();
    }
    if dbg.no_rescale {
        rescale = String::new();
    }
    vec![
        ("DECL_O", decl),
        ("S_BODY", s),
        ("PV_BODY", pv),
        ("RESCALE_BODY", rescale),
        ("STORE_BODY", store),
    ]
}

/// `DRIFT_COOP_ATTENTION_TILE=S,K` (subgroups, keys per tile): one tile for every head dim (timing).
fn tile_from_env() -> Option<CoopTile> {
    let (subgroups, keys) = env_pair("DRIFT_COOP_ATTENTION_TILE")?;
    Some(CoopTile { subgroups, keys })
}

/// Whether a tensor can be read as vec4 (its base element offset in the binding is a multiple of 4).
fn vec4_ok(t: &Tensor) -> bool {
    (t.storage.offset / t.elem_bytes()).is_multiple_of(4)
}

/// The dispatch of the cooperative kernel (`emulated`: matrix operations as plain loops) with the
/// bisection switches `debug`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn coop(
    gpu: &Gpu,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    out: &Tensor,
    step: &Tensor,
    dims: &Dims,
    scale: f32,
    causal: bool,
    emulated: bool,
    tile: Option<CoopTile>,
    debug: CoopDebug,
) -> Result<Dispatch> {
    let caps = &gpu.caps;
    let what = if emulated {
        "emulated cooperative-matrix"
    } else {
        "cooperative-matrix"
    };
    if q.dtype != DType::F16 || k.dtype != DType::F16 {
        return Err(DriftError::Unsupported(format!(
            "{what} attention needs f16 q, k and v (got {:?} q, {:?} k/v)",
            q.dtype, k.dtype
        )));
    }
    if !emulated && !coop_available(caps) {
        return Err(DriftError::Unsupported(
            "cooperative-matrix attention needs a device with 16x16 f16 cooperative matrices and \
             subgroups of 32"
                .into(),
        ));
    }
    let d = dims.d;
    // With real matrices, subgroups are required (and are 32 wide); emulated, they are used where
    // the pair exchange can.
    let sg_wanted = !emulated || caps.subgroup;
    let tile = match tile.or_else(tile_from_env) {
        Some(t) => {
            let sg = sg_wanted && pair_shuffles_usable(caps, t.threads());
            if !t.valid() || !fits(caps, &t, d, sg) {
                return Err(DriftError::Unsupported(format!(
                    "attention: {what} tile {t:?} does not fit this device for head dim {d}"
                )));
            }
            t
        }
        None => preferred_tile(caps, d, sg_wanted, causal)
            .filter(|t| !sg_wanted || pair_shuffles_usable(caps, t.threads()))
            .or_else(|| preferred_tile(caps, d, false, causal))
            .ok_or_else(|| {
                DriftError::Unsupported(format!(
                    "attention: head dim {d} needs more workgroup memory for the {what} kernel \
                     than the device's {} bytes",
                    caps.max_workgroup_storage
                ))
            })?,
    };
    let sg = sg_wanted && pair_shuffles_usable(caps, tile.threads()) && fits(caps, &tile, d, true);
    if !emulated && !sg {
        return Err(DriftError::Unsupported(format!(
            "attention: the cooperative-matrix kernel needs {} invocations in subgroups of 32",
            tile.threads()
        )));
    }
    let config = CoopConfig {
        d,
        tile,
        g: dims.g,
        causal,
        coop: !emulated,
        subgroups: sg,
        vec_q: vec4_ok(q),
        vec_kv: vec4_ok(k) && vec4_ok(v),
        vec_out: vec4_ok(out),
        out_f16: out.dtype == DType::F16,
        debug,
    };
    let spec = KernelSpec::new(
        config.name(),
        shader!("attention_coop.wgsl"),
        "attention_coop",
    )
    .defines(config.defines());
    let spec = if debug.unchecked {
        spec.trusted()
    } else {
        spec
    };
    let kernel = gpu.kernel(&spec)?;
    let rows = dims.rows();
    let heads = dims.b * dims.hkv;
    let tiles = rows.div_ceil(tile.query_rows());
    let groups = heads * tiles;
    let params = [
        rows as u32,
        dims.lq as u32,
        dims.lkv as u32,
        dims.hq as u32,
        dims.hkv as u32,
        tiles as u32,
        groups as u32,
        scale.to_bits(),
    ];
    gpu.dispatch(
        &kernel,
        &params,
        &[q, k, v, step, out],
        grid(groups as u32, caps.max_workgroups_per_dimension),
        Cost {
            flops: 4.0 * (dims.b * dims.hq * d) as f64 * dims.visible_pairs(causal),
            bytes: (q.byte_len() + out.byte_len()) as f64
                + heads as f64
                    * dims.kv_rows_streamed(tile.query_rows(), causal)
                    * (2 * d) as f64
                    * k.elem_bytes() as f64,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_fit_the_h200_and_lavapipe() {
        let smem = |t: (usize, usize), d, sg| {
            CoopTile {
                subgroups: t.0,
                keys: t.1,
            }
            .shared_bytes(d, sg)
        };
        // 48 KiB (H200): SD's D = 40 and D = 64 take 64 x 64 tiles, D = 128 64 x 32, D = 256 32 x 16.
        assert!(smem((4, 64), 40, true) <= 49152);
        assert!(smem((4, 64), 64, true) <= 49152);
        assert!(smem((4, 64), 80, true) > 49152);
        assert!(smem((4, 32), 128, true) <= 49152);
        assert!(smem((4, 16), 160, true) <= 49152);
        assert!(smem((4, 16), 256, true) > 49152);
        assert!(smem((2, 16), 256, true) <= 49152);
        // The 8-subgroup tiles take SD's D = 40 with 16 or 32 keys; D = 80 only with 16.
        assert!(smem((8, 32), 40, true) <= 49152);
        assert!(smem((8, 16), 80, true) <= 49152);
        assert!(smem((8, 32), 80, true) > 49152);
        // 32 KiB (lavapipe), with the workgroup-memory exchange too.
        assert!(smem((8, 16), 32, false) <= 32768);
        assert!(smem((4, 32), 80, false) <= 32768);
        assert!(smem((4, 16), 128, false) <= 32768);
    }

    #[test]
    fn sd_attention_takes_its_measured_tiles() {
        let caps = Caps::h200_like(49152);
        let tile = |d, causal| {
            let t = preferred_tile(&caps, d, true, causal).unwrap();
            (t.subgroups, t.keys)
        };
        // Non-causal: the fastest measured at SD's head dims (see `preferred_tile`).
        assert_eq!(tile(40, false), (8, 32));
        assert_eq!(tile(80, false), (8, 16));
        assert_eq!(tile(160, false), (4, 16));
        // Causal LLM prefill: the largest 4-subgroup tile.
        assert_eq!(tile(64, true), (4, 64));
        assert_eq!(tile(128, true), (4, 32));
    }

    #[test]
    fn generated_blocks_name_every_accumulator() {
        // D = 40 -> 3 output accumulators; 32 keys -> 2 score accumulators, so 2 round-trip chunks.
        let b = bodies(3, 2, false, &CoopDebug::default());
        let get = |k: &str| b.iter().find(|(n, _)| *n == k).unwrap().1.clone();
        assert_eq!(get("DECL_O").matches("MatC()").count(), 3);
        assert_eq!(get("S_BODY").matches(" mma(").count(), 6);
        assert_eq!(get("PV_BODY").matches(" mma(").count(), 6);
        let real = bodies(3, 2, true, &CoopDebug::default());
        let get = |k: &str| real.iter().find(|(n, _)| *n == k).unwrap().1.clone();
        assert_eq!(get("S_BODY").matches("coopMultiplyAdd(").count(), 6);
        assert_eq!(get("PV_BODY").matches(" mma(").count(), 0);
        assert_eq!(get("RESCALE_BODY").matches("load_c(").count(), 3);
        assert_eq!(get("STORE_BODY").matches("write_row(").count(), 2);
        assert!(get("STORE_BODY").contains("write_row(srow, h, 1u, 32u"));
    }
}
