//! A Llama decode step as one dispatch (`shaders/decode_step.wgsl`): the layers' phases separated by
//! grid-wide barriers ([`crate::kernels::grid_sync`]) instead of ~5 dispatches per layer. This file
//! holds the packed layouts the kernel reads (weights, f32 parameters, KV cache, activations) and
//! builds the dispatch; `models::llama_step` packs a model into them.

use crate::error::Result;
use crate::exec::{Cost, Dispatch};
use crate::gpu::Gpu;
use crate::kernels::KernelSpec;
use crate::kernels::grid_sync::SYNC_WORDS;
use crate::tensor::Tensor;

/// Weight offsets are padded to this many f16 elements (256 bytes, the binding alignment), so every
/// packed weight is also a bindable view for the other kernels.
const W_ALIGN: usize = 128;

/// Most chunks a head's keys are dealt into (`MAXC` in the shader).
const MAX_CHUNKS: usize = 64;

/// The model dimensions the kernel is specialised for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepShape {
    pub hidden: usize,
    pub inter: usize,
    pub hq: usize,
    pub hkv: usize,
    pub d: usize,
    /// Rotary dims (<= d).
    pub rot: usize,
    pub vocab: usize,
    pub layers: usize,
    /// Rotary pairs (2i, 2i + 1) (GGUF llama) instead of (i, i + rot / 2).
    pub interleaved: bool,
    /// q/k/v biases (Qwen2).
    pub bias: bool,
    /// The LM head is the embedding table.
    pub tied: bool,
    pub max_ctx: usize,
    /// KV lengths up to which a head's attention is one workgroup's; past it the keys are dealt over
    /// many teams and merged by a phase of their own.
    pub whole_max: u32,
    /// f16 elements of the weights in the first weight binding (a multiple of [`Self::w_layer`]):
    /// [`Self::w_len`] where one binding holds them all, else the later layers, the LM head and the
    /// embedding table are in a second one.
    pub w_split: usize,
}

impl StepShape {
    pub fn nqkv(&self) -> usize {
        (self.hq + 2 * self.hkv) * self.d
    }

    /// Lanes per key in the attention phase: up to 8, each with a multiple of 4 dims.
    pub fn lanes_per_key(&self) -> usize {
        [8, 4, 2]
            .into_iter()
            .find(|lg| self.d.is_multiple_of(4 * lg))
            .unwrap_or(1)
    }

    /// Whether the kernel's assumptions hold: f16 rows in 8-element loads, head dims in vec4s over at
    /// least 2 lanes, whole GQA groups.
    pub fn supported(&self) -> bool {
        self.hidden.is_multiple_of(8)
            && self.inter.is_multiple_of(8)
            && (self.hq * self.d).is_multiple_of(8)
            && self.d.is_multiple_of(8)
            && self.rot <= self.d
            && self.rot.is_multiple_of(4)
            && self.hkv > 0
            && self.hq.is_multiple_of(self.hkv)
    }

    /// f16 elements of one layer's block: qkv, o, gate_up, down (padded).
    pub fn w_layer(&self) -> usize {
        let (h, i) = (self.hidden, self.inter);
        (self.nqkv() * h + h * self.hq * self.d + 2 * i * h + h * i).next_multiple_of(W_ALIGN)
    }

    /// Element offsets within a layer's block of its qkv, o, gate_up and down weights.
    pub fn w_parts(&self) -> [usize; 4] {
        let (h, i) = (self.hidden, self.inter);
        let o = self.nqkv() * h;
        let gu = o + h * self.hq * self.d;
        [0, o, gu, gu + 2 * i * h]
    }

    pub fn w_head(&self) -> usize {
        self.layers * self.w_layer()
    }

    pub fn w_embed(&self) -> usize {
        if self.tied {
            self.w_head()
        } else {
            self.w_head() + (self.vocab * self.hidden).next_multiple_of(W_ALIGN)
        }
    }

    pub fn w_len(&self) -> usize {
        self.w_embed() + (self.vocab * self.hidden).next_multiple_of(W_ALIGN)
    }

    /// Whether the weights take a second binding.
    pub fn two_weight_bindings(&self) -> bool {
        self.w_split < self.w_len()
    }

    /// Where the second weight binding starts for a binding limit of `max_bytes` (or from layer
    /// `from` where given): the most whole layers that fit the first, the rest in the second; `None`
    /// when the two cannot hold them.
    pub fn weight_split(&self, max_bytes: u64, from: Option<usize>) -> Option<usize> {
        let bytes = |elems: usize| 2 * elems as u64;
        if from.is_none() && bytes(self.w_len()) <= max_bytes {
            return Some(self.w_len());
        }
        let layers = from.unwrap_or((max_bytes / bytes(self.w_layer()).max(1)) as usize);
        if layers == 0 {
            return None;
        }
        let split = layers.min(self.layers) * self.w_layer();
        (bytes(split) <= max_bytes && bytes(self.w_len() - split) <= max_bytes).then_some(split)
    }

    /// f32 elements of one layer's parameters: attn_norm, ffn_norm (and the qkv bias).
    pub fn f_layer(&self) -> usize {
        2 * self.hidden + if self.bias { self.nqkv() } else { 0 }
    }

    pub fn f_norm(&self) -> usize {
        self.layers * self.f_layer()
    }

    pub fn f_turns(&self) -> usize {
        self.f_norm() + self.hidden
    }

    pub fn f_len(&self) -> usize {
        self.f_turns() + self.rot
    }

    /// f16 elements of the KV cache, `[layer][k | v][max_ctx][hkv][d]`, and where layer l's k starts.
    pub fn kv_len(&self) -> usize {
        self.layers * 2 * self.kv_plane()
    }

    pub fn kv_plane(&self) -> usize {
        self.max_ctx * self.hkv * self.d
    }

    /// Words of the sync state and the activations the phases hand on.
    pub fn scratch_words(&self) -> usize {
        let (hq, d) = (self.hq, self.d);
        SYNC_WORDS
            + hq * d
            + 2 * self.hkv * d
            + hq * MAX_CHUNKS * (d + 2)
            + hq * d
            + 2 * self.hidden
            + self.inter
    }

    /// Length of the kernel's f32 workgroup vector.
    fn xs(&self) -> usize {
        self.hidden.max(self.inter).max(self.hq * self.d)
    }

    /// Workgroup memory the kernel declares.
    pub fn shared_bytes(&self) -> usize {
        4 * (self.xs() + 64 + (256 / 8) * (self.d + 2))
    }

    /// Weights a step multiplies (the layers and the LM head; padding included): its cost for the
    /// profiler is 2 flops and 2 bytes (f16) each, the KV cache's bytes left out.
    fn weights(&self) -> f64 {
        (self.w_head() + self.vocab * self.hidden) as f64
    }
}

/// The packed tensors a step reads and writes.
pub struct StepTensors<'a> {
    /// f16 `[w_len]`.
    pub w: &'a Tensor,
    /// f32 `[f_len]`.
    pub f: &'a Tensor,
    /// f16 `[kv_len]`.
    pub kv: &'a Tensor,
    /// u32 `[scratch_words]`, zeroed at creation (the sync words must start at zero).
    pub scratch: &'a Tensor,
    /// f16 `[w_len - w_split]`: the weights past the first binding ([`StepShape::w_split`]).
    pub w2: Option<&'a Tensor>,
    /// u32 `[2]`: (kv_len, pos).
    pub step: &'a Tensor,
    /// u32: the input token id at 0.
    pub ids: &'a Tensor,
    /// f32 `[vocab]`.
    pub logits: &'a Tensor,
}

// decode_step.wgsl first: its `enable f16;` must precede every declaration.
const SOURCE: &str = concat!(
    crate::shader!("decode_step.wgsl"),
    crate::shader!("grid_sync.wgsl"),
    crate::shader!("rope_angle.wgsl"),
);

/// The attention blocks of the shader for `dpv` vec4s of dims per lane, every private value a named
/// variable (drivers put indexed private arrays in memory, which made the phase several times slower).
fn attention_blocks(dpv: usize) -> Vec<(&'static str, String)> {
    let lines = |f: &dyn Fn(usize) -> String| (0..dpv).map(f).collect::<Vec<_>>().join("\n");
    let q = lines(&|t| {
        format!(
            "    let q{t} = act_load4(act_at(A_Q), vec4<u32>(h * D + j * DPL + {}u) + vec4<u32>(0u, 1u, 2u, 3u), HQ * D) * p.scale;\n    var a{t} = vec4<f32>(0.0);",
            4 * t
        )
    });
    // One round: four keys per group, every load issued before any use.
    let mut loads = String::new();
    for r in 0..4 {
        loads += &format!("        let kk{r} = min(k0 + {r}u * stride + g, max(kend, 1u) - 1u);\n");
        for t in 0..dpv {
            loads += &format!(
                "        let k{r}_{t} = kv[kbase + kk{r} * (HKV * D / 4u) + {t}u];\n        let v{r}_{t} = kv[vbase + kk{r} * (HKV * D / 4u) + {t}u];\n"
            );
        }
    }
    let regs: Vec<String> = (0..4)
        .flat_map(|r| (0..dpv).flat_map(move |t| [format!("k{r}_{t}"), format!("v{r}_{t}")]))
        .collect();
    let first_fields = regs
        .iter()
        .map(|n| format!("    {n}: vec4<f16>,"))
        .collect::<Vec<_>>()
        .join("\n");
    let first_args = regs.join(", ");
    let first_unpack = regs
        .iter()
        .map(|n| format!("    let {n} = f.{n};"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut compute = String::new();
    for r in 0..4 {
        let dots: Vec<String> = (0..dpv)
            .map(|t| format!("dot(q{t}, vec4<f32>(k{r}_{t}))"))
            .collect();
        let upd: String = (0..dpv)
            .map(|t| format!("            a{t} = a{t} * al + pk * vec4<f32>(v{r}_{t});\n"))
            .collect();
        compute += &format!(
            "        var s{r} = {};\n        for (var o = 1u; o < LG; o <<= 1u) {{\n            s{r} += subgroupShuffleXor(s{r}, o);\n        }}\n        if k0 + {r}u * stride + g < kend {{\n            let mn = max(m, s{r});\n            let al = exp(m - mn);\n            let pk = exp(s{r} - mn);\n            sum = sum * al + pk;\n{upd}            m = mn;\n        }}\n",
            dots.join(" + ")
        );
    }
    let own_dots: Vec<String> = (0..dpv)
        .map(|t| {
            format!(
                "dot(q{t}, act_load4(act_at(A_K), i + vec4<u32>({}u), HKV * D))",
                4 * t
            )
        })
        .collect();
    let mut own = lines(&|t| {
        format!(
            "        let vk{t} = act_load4(act_at(A_V), i + vec4<u32>({}u), HKV * D);",
            4 * t
        )
    });
    let own_upd = lines(&|t| format!("            a{t} = a{t} * al + pk * vk{t};"));
    own += &format!(
        "\n        var so = {};\n        for (var o = 1u; o < LG; o <<= 1u) {{\n            so += subgroupShuffleXor(so, o);\n        }}\n        if g == 0u {{\n            let mn = max(m, so);\n            let al = exp(m - mn);\n            let pk = exp(so - mn);\n            sum = sum * al + pk;\n{own_upd}\n            m = mn;\n        }}",
        own_dots.join(" + ")
    );
    let merge = lines(&|t| format!("        a{t} = a{t} * al + subgroupShuffleXor(a{t}, o) * be;"));
    let out = lines(&|t| format!("    st.acc[{t}] = a{t};"));
    vec![
        ("ATTN_Q", q),
        ("ATTN_LOADS", loads.trim_end().to_string()),
        ("ATTN_FIRST_FIELDS", first_fields),
        ("ATTN_FIRST_ARGS", first_args),
        ("ATTN_FIRST_UNPACK", first_unpack),
        ("ATTN_COMPUTE", compute.trim_end().to_string()),
        ("ATTN_OWN", own),
        ("ATTN_MERGE", merge),
        ("ATTN_OUT", out),
    ]
}

/// Phases whose work a measurement skips (`DRIFT_DECODE_STEP_SKIP`, a bit mask; see the shader).
fn skip_mask() -> u32 {
    std::env::var("DRIFT_DECODE_STEP_SKIP")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The step dispatch over `n_wg` workgroups (all of which must run concurrently: see
/// [`crate::kernels::grid_sync`]).
pub fn decode_step(
    gpu: &Gpu,
    s: &StepShape,
    t: &StepTensors,
    n_wg: u32,
    eps: f32,
    scale: f32,
) -> Result<Dispatch> {
    let flag = |b: bool| u8::from(b).to_string();
    let spec = KernelSpec::new(
        format!(
            "decode_step_h{}_l{}_d{}{}{}",
            s.hidden,
            s.layers,
            s.d,
            if s.bias { "_bias" } else { "" },
            if s.two_weight_bindings() { "_w2" } else { "" }
        ),
        SOURCE,
        "decode_step",
    )
    .define("H", s.hidden)
    .define("I", s.inter)
    .define("HQ", s.hq)
    .define("HKV", s.hkv)
    .define("D", s.d)
    .define("ROT", s.rot)
    .define("V", s.vocab)
    .define("L", s.layers)
    .define("INTERLEAVED", flag(s.interleaved))
    .define("BIAS", flag(s.bias))
    .define("LG", s.lanes_per_key())
    .define("W_LAYER", s.w_layer())
    .define("W_EMBED", s.w_embed())
    .define("F_LAYER", s.f_layer())
    .define("XS", s.xs())
    .define("SKIP", skip_mask())
    .defines(attention_blocks(s.d / s.lanes_per_key() / 4))
    .define("WHOLE_MAX", s.whole_max)
    .define("W2", u8::from(s.two_weight_bindings()))
    .define("W_SPLIT8", s.w_split / 8);
    let kernel = gpu.kernel(&spec)?;
    let mut tensors = vec![t.w, t.f, t.kv, t.scratch, t.step, t.ids, t.logits];
    if s.two_weight_bindings() {
        tensors.push(t.w2.ok_or_else(|| {
            crate::error::DriftError::Other(
                "decode step: the second weight binding is missing".into(),
            )
        })?);
    }
    gpu.dispatch(
        &kernel,
        &[s.max_ctx as u32, n_wg, eps.to_bits(), scale.to_bits()],
        &tensors,
        [n_wg, 1, 1],
        Cost {
            flops: 2.0 * s.weights(),
            bytes: 2.0 * s.weights(),
        },
    )
}
