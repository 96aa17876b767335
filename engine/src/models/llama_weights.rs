//! Weights of a Llama-family model on the GPU, from Hugging Face names (safetensors or random) or from
//! a GGUF file, optionally quantised on load. Projections that read the same input are stacked (q/k/v,
//! gate/up) so decode runs one matrix-vector dispatch for each; where the parts have different block
//! types (GGUF K-quant mixes) they stay separate parts of one [`Linear`].

use crate::error::{DriftError, Result};
use crate::formats::gguf::GgufFile;
use crate::gpu::Gpu;
use crate::kernels::qkv_rope::{RopePairs, rope_turns};
use crate::kernels::quant::dequantize;
use crate::memory::Category;
use crate::models::config::LlmConfig;
use crate::reference::quant::quantize;
use crate::tensor::{DType, Layout, Tensor};

/// A weight matrix `[n, k]` as row blocks stacked in order (usually one), with an optional f32 bias.
pub struct Linear {
    pub parts: Vec<Tensor>,
    pub bias: Option<Tensor>,
    pub n: usize,
    pub k: usize,
}

impl Linear {
    pub fn is_float(&self) -> bool {
        self.parts.iter().all(|p| !p.dtype.is_quantized())
    }

    pub fn bytes(&self) -> u64 {
        self.parts.iter().map(Tensor::byte_len).sum()
    }
}

pub struct LayerWeights {
    pub attn_norm: Tensor,
    /// q, k and v projections: `[(hq + 2 hkv) d, hidden]`.
    pub qkv: Linear,
    pub wo: Linear,
    pub ffn_norm: Tensor,
    /// gate and up: `[2 intermediate, hidden]`.
    pub gate_up: Linear,
    pub down: Linear,
}

pub struct LlamaWeights {
    /// The embedding table for the gather (f16/f32; a quantised table is dequantised once for it).
    pub embed: Tensor,
    pub layers: Vec<LayerWeights>,
    pub norm: Tensor,
    /// The LM head (the quantised table itself when tied).
    pub lm_head: Linear,
    /// f32 `[rot/2, 2]` rope frequencies as turns per position (hi, lo), llama3 scaling folded in.
    pub rope_turns: Tensor,
    pub pairs: RopePairs,
    /// The dtype prefill activations use (f16 where the device has it).
    pub dtype: DType,
}

/// A source of weights by Hugging Face tensor name, as f32 values (RAM holds one tensor at a time).
pub trait WeightSource {
    fn get(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)>;
    fn has(&self, name: &str) -> bool;
}

/// How to store the big matrices when loading from f32/f16/bf16 values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantScheme {
    /// f16 (f32 on devices without f16).
    None,
    Q8_0,
    Q4_0,
    /// ML Drift's mixed scheme: 8-bit attention, 4-bit feed-forward and embeddings/LM head.
    Mixed84,
}

impl QuantScheme {
    pub fn parse(s: &str) -> Result<QuantScheme> {
        Ok(match s {
            "none" | "f16" => QuantScheme::None,
            "q8_0" => QuantScheme::Q8_0,
            "q4_0" => QuantScheme::Q4_0,
            "mixed-8-4" => QuantScheme::Mixed84,
            other => {
                return Err(DriftError::Other(format!(
                    "unknown --quant {other}: q8_0, q4_0, mixed-8-4"
                )));
            }
        })
    }

    fn for_role(self, attention: bool, float: DType) -> DType {
        match (self, attention) {
            (QuantScheme::None, _) => float,
            (QuantScheme::Q8_0, _) | (QuantScheme::Mixed84, true) => DType::Q8_0,
            (QuantScheme::Q4_0, _) | (QuantScheme::Mixed84, false) => DType::Q4_0,
        }
    }
}

fn float_dtype(gpu: &Gpu) -> DType {
    if gpu.caps.f16 { DType::F16 } else { DType::F32 }
}

/// Uploads f32 values as `dtype` (float or a block type quantised on the CPU).
fn upload(gpu: &Gpu, name: &str, shape: &[usize], values: &[f32], dtype: DType) -> Result<Tensor> {
    if dtype.is_quantized() {
        let bytes = quantize(dtype, values)?;
        gpu.tensor_from_bytes(
            name,
            shape,
            dtype,
            Layout::Blocks,
            &bytes,
            Category::Weights,
        )
    } else {
        gpu.tensor_from_f32(name, shape, dtype, values, Category::Weights)
    }
}

impl LlamaWeights {
    /// From Hugging Face names (safetensors folders, random benchmark weights).
    pub fn load(
        gpu: &Gpu,
        cfg: &LlmConfig,
        src: &dyn WeightSource,
        quant: QuantScheme,
    ) -> Result<LlamaWeights> {
        let fd = float_dtype(gpu);
        let (hq, hkv, d, h, inter) = (
            cfg.n_heads,
            cfg.n_kv_heads,
            cfg.head_dim,
            cfg.hidden,
            cfg.intermediate,
        );
        let get = |name: &str, want: &[usize]| -> Result<Vec<f32>> {
            let (shape, v) = src.get(name)?;
            if shape != want {
                return Err(DriftError::Other(format!(
                    "{name} has shape {shape:?}, config implies {want:?}"
                )));
            }
            Ok(v)
        };
        let vector = |name: &str, n: usize| -> Result<Tensor> {
            upload(gpu, name, &[n], &get(name, &[n])?, DType::F32)
        };
        let linear = |names: &[(&str, usize)],
                      k: usize,
                      attention: bool,
                      bias: Option<&[(&str, usize)]>|
         -> Result<Linear> {
            let mut v = Vec::new();
            for (name, rows) in names {
                v.extend(get(name, &[*rows, k])?);
            }
            let n = names.iter().map(|(_, r)| r).sum();
            let bias = match bias {
                Some(bs) => {
                    let mut b = Vec::new();
                    for (name, rows) in bs {
                        b.extend(get(name, &[*rows])?);
                    }
                    Some(upload(gpu, "bias", &[n], &b, DType::F32)?)
                }
                None => None,
            };
            Ok(Linear {
                parts: vec![upload(
                    gpu,
                    names[0].0,
                    &[n, k],
                    &v,
                    quant.for_role(attention, fd),
                )?],
                bias,
                n,
                k,
            })
        };
        let embed_v = get("model.embed_tokens.weight", &[cfg.vocab, h])?;
        let embed = upload(gpu, "embed", &[cfg.vocab, h], &embed_v, fd)?;
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for l in 0..cfg.n_layers {
            let p = |s: &str| format!("model.layers.{l}.{s}");
            let (q, k, v) = (
                p("self_attn.q_proj.weight"),
                p("self_attn.k_proj.weight"),
                p("self_attn.v_proj.weight"),
            );
            let (bq, bk, bv) = (
                p("self_attn.q_proj.bias"),
                p("self_attn.k_proj.bias"),
                p("self_attn.v_proj.bias"),
            );
            let qkv_bias = [
                (bq.as_str(), hq * d),
                (bk.as_str(), hkv * d),
                (bv.as_str(), hkv * d),
            ];
            let (g, u) = (p("mlp.gate_proj.weight"), p("mlp.up_proj.weight"));
            layers.push(LayerWeights {
                attn_norm: vector(&p("input_layernorm.weight"), h)?,
                qkv: linear(
                    &[(&q, hq * d), (&k, hkv * d), (&v, hkv * d)],
                    h,
                    true,
                    cfg.qkv_bias.then_some(&qkv_bias[..]),
                )?,
                wo: linear(&[(&p("self_attn.o_proj.weight"), h)], hq * d, true, None)?,
                ffn_norm: vector(&p("post_attention_layernorm.weight"), h)?,
                gate_up: linear(&[(&g, inter), (&u, inter)], h, false, None)?,
                down: linear(&[(&p("mlp.down_proj.weight"), h)], inter, false, None)?,
            });
        }
        let head_dtype = quant.for_role(false, fd);
        let lm_head = if !cfg.tie_embeddings && src.has("lm_head.weight") {
            linear(&[("lm_head.weight", cfg.vocab)], h, false, None)?
        } else if head_dtype == fd {
            Linear {
                parts: vec![embed.clone()],
                bias: None,
                n: cfg.vocab,
                k: h,
            }
        } else {
            Linear {
                parts: vec![upload(
                    gpu,
                    "lm_head",
                    &[cfg.vocab, h],
                    &embed_v,
                    head_dtype,
                )?],
                bias: None,
                n: cfg.vocab,
                k: h,
            }
        };
        let turns = rope_turns(cfg.rope_theta, d, cfg.rope_freq_factors().as_deref());
        Ok(LlamaWeights {
            rope_turns: upload(gpu, "rope turns", &[d / 2, 2], &turns, DType::F32)?,
            norm: vector("model.norm.weight", h)?,
            embed,
            layers,
            lm_head,
            pairs: RopePairs::HalfSplit,
            dtype: fd,
        })
    }

    /// From a GGUF file: quantised blocks are uploaded as they are.
    pub fn load_gguf(gpu: &Gpu, cfg: &LlmConfig, f: &GgufFile) -> Result<LlamaWeights> {
        let fd = float_dtype(gpu);
        let tensor = |name: &str| -> Result<Tensor> {
            let (dtype, shape, bytes) = f.tensor_data(name)?;
            match dtype {
                DType::F32 | DType::F16 | DType::BF16 => {
                    let (shape, v) = f.tensor_f32(name)?;
                    let target = if shape.len() == 1 { DType::F32 } else { fd };
                    upload(gpu, name, &shape, &v, target)
                }
                q => {
                    gpu.tensor_from_bytes(name, shape, q, Layout::Blocks, bytes, Category::Weights)
                }
            }
        };
        // Stacks parts of one block type into one tensor (rows are contiguous runs of blocks).
        let linear = |names: &[String], bias: Option<Vec<String>>| -> Result<Linear> {
            let infos: Vec<(DType, Vec<usize>, &[u8])> = names
                .iter()
                .map(|n| f.tensor_data(n).map(|(d, s, b)| (d, s.to_vec(), b)))
                .collect::<Result<_>>()?;
            let k = infos[0].1[1];
            if infos.iter().any(|(_, s, _)| s.len() != 2 || s[1] != k) {
                return Err(DriftError::Other(format!(
                    "{names:?}: projections disagree on their input width"
                )));
            }
            let n = infos.iter().map(|(_, s, _)| s[0]).sum();
            let same = infos.iter().all(|(d, _, _)| *d == infos[0].0) && infos[0].0.is_quantized();
            let parts = if same && names.len() > 1 {
                let bytes: Vec<u8> = infos
                    .iter()
                    .flat_map(|(_, _, b)| b.iter().copied())
                    .collect();
                vec![gpu.tensor_from_bytes(
                    &names[0],
                    &[n, k],
                    infos[0].0,
                    Layout::Blocks,
                    &bytes,
                    Category::Weights,
                )?]
            } else {
                names.iter().map(|nm| tensor(nm)).collect::<Result<_>>()?
            };
            let bias = match bias {
                Some(bs) => {
                    let mut v = Vec::new();
                    for b in &bs {
                        v.extend(f.tensor_f32(b)?.1);
                    }
                    Some(upload(gpu, "bias", &[n], &v, DType::F32)?)
                }
                None => None,
            };
            Ok(Linear { parts, bias, n, k })
        };
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for l in 0..cfg.n_layers {
            let b = |s: &str| format!("blk.{l}.{s}");
            layers.push(LayerWeights {
                attn_norm: tensor(&b("attn_norm.weight"))?,
                qkv: linear(
                    &[b("attn_q.weight"), b("attn_k.weight"), b("attn_v.weight")],
                    cfg.qkv_bias
                        .then(|| vec![b("attn_q.bias"), b("attn_k.bias"), b("attn_v.bias")]),
                )?,
                wo: linear(&[b("attn_output.weight")], None)?,
                ffn_norm: tensor(&b("ffn_norm.weight"))?,
                gate_up: linear(&[b("ffn_gate.weight"), b("ffn_up.weight")], None)?,
                down: linear(&[b("ffn_down.weight")], None)?,
            });
        }
        let table = tensor("token_embd.weight")?;
        let lm_head = if f.has_tensor("output.weight") {
            linear(&["output.weight".to_string()], None)?
        } else {
            Linear {
                parts: vec![table.clone()],
                bias: None,
                n: cfg.vocab,
                k: cfg.hidden,
            }
        };
        // The gather reads float rows: a quantised table is dequantised once for it.
        let embed = if table.dtype.is_quantized() {
            let e = gpu.tensor(
                "embed (dequantised)",
                &[cfg.vocab, cfg.hidden],
                fd,
                Category::Weights,
            )?;
            let mut p = crate::exec::Program::new();
            for shard in table.row_shards(gpu.caps.max_storage_binding)? {
                let rows = shard.tensor.shape[0];
                p.push(dequantize(
                    gpu,
                    &shard.tensor,
                    &e.rows(shard.row_start, shard.row_start + rows)?,
                )?);
            }
            p.run(gpu)?;
            e
        } else {
            table
        };
        let factors = f.rope_freq_factors()?;
        let turns = rope_turns(cfg.rope_theta, cfg.head_dim, factors.as_deref());
        Ok(LlamaWeights {
            rope_turns: upload(
                gpu,
                "rope turns",
                &[cfg.head_dim / 2, 2],
                &turns,
                DType::F32,
            )?,
            norm: tensor("output_norm.weight")?,
            embed,
            layers,
            lm_head,
            pairs: f.rope_pairs()?,
            dtype: fd,
        })
    }
}
