//! A small dataflow graph for the Stable Diffusion networks (UNet, VAE): ops over symbolic tensors and
//! named weights, recorded once per model and resolution. From it:
//! - [`Graph::plan`] gives every intermediate a lifetime (first and last op that touches it) and places
//!   them in one arena with [`plan_greedy_by_size`], without weights or a GPU (`drift bench sd` prints
//!   the naive vs planned bytes from this alone);
//! - [`Graph::build`] allocates that arena once, makes every intermediate a view of it, and builds the
//!   dispatches (conv2d, groupnorm, layernorm, matmul, attention, GEGLU, elementwise, layout) into one
//!   [`Program`].
//!
//! Inputs and outputs get buffers of their own (they live across calls); reshapes are aliases (views
//! of the same bytes) whose uses extend the lifetime of the tensor they alias.

use std::collections::HashMap;
use std::sync::Arc;

use serde::Serialize;

use crate::error::Result;
use crate::exec::Program;
use crate::gpu::Gpu;
use crate::kernels::activation::{UnaryOp, unary};
use crate::kernels::attention::{AttentionOptions, MAX_HEAD_DIM, attention};
use crate::kernels::conv::{Conv2dOptions, Conv2dVariant, conv2d, conv2d_output_size, conv2d_plan};
use crate::kernels::elementwise::{BinaryOp, binary};
use crate::kernels::geglu::geglu;
use crate::kernels::layout::{concat_channels, permute, upsample_nearest2x};
use crate::kernels::matmul::{MatmulOptions, matmul};
use crate::kernels::norm::{GroupNormOptions, groupnorm, layernorm};
use crate::kernels::softmax::{RowVariant, SoftmaxOptions, softmax};
use crate::memory::{ArenaPlan, Category, Lifetime, plan_greedy_by_size};
use crate::shape_err;
use crate::tensor::{BINDING_ALIGN, DType, Layout, Storage, Tensor};

/// A tensor of the graph.
pub type TId = usize;
/// A weight of the graph.
pub type WId = usize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Role {
    /// Written by the caller before a run; its own buffer.
    Input,
    /// Read by the caller after a run; its own buffer.
    Output,
    /// Lives in the arena.
    Intermediate,
}

#[derive(Clone, Debug)]
pub struct TensorDef {
    pub name: String,
    pub shape: Vec<usize>,
    pub role: Role,
    /// Same bytes as this tensor (a reshape).
    pub alias_of: Option<TId>,
}

/// How a weight is stored on the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum WeightKind {
    /// `[O, C, KH, KW]`, uploaded in [`crate::kernels::conv::conv2d_weight_layout`].
    Conv,
    /// nn.Linear `[N, K]`, row-major (a `[N, K, 1, 1]` 1x1 conv in a file is accepted).
    Linear,
    /// A `[C]` vector: biases, norm scales and shifts.
    Vector,
}

#[derive(Clone, Debug)]
pub struct WeightDef {
    /// The diffusers name (`down_blocks.0.resnets.0.conv1.weight`).
    pub name: String,
    pub kind: WeightKind,
    pub shape: Vec<usize>,
}

#[derive(Clone, Debug)]
pub enum Op {
    Conv {
        x: TId,
        w: WId,
        b: Option<WId>,
        out: TId,
        stride: usize,
        pad: usize,
        pad_end: Option<usize>,
        residual: Option<TId>,
    },
    GroupNorm {
        x: TId,
        gamma: WId,
        beta: WId,
        out: TId,
        groups: usize,
        eps: f32,
        silu: bool,
    },
    LayerNorm {
        x: TId,
        gamma: WId,
        beta: WId,
        out: TId,
        eps: f32,
    },
    /// `out = x @ w^T + b`.
    Linear {
        x: TId,
        w: WId,
        b: Option<WId>,
        out: TId,
    },
    /// Flash attention over `[B, L, H, D]` views.
    Attention {
        q: TId,
        k: TId,
        v: TId,
        out: TId,
    },
    /// `out = a @ b` or `a @ b^T` between activations (batched).
    Matmul {
        a: TId,
        b: TId,
        out: TId,
        transpose_b: bool,
    },
    Softmax {
        x: TId,
        out: TId,
        scale: f32,
    },
    Geglu {
        x: TId,
        out: TId,
    },
    Add {
        a: TId,
        b: TId,
        out: TId,
    },
    Unary {
        op: UnaryOp,
        x: TId,
        out: TId,
    },
    Upsample {
        x: TId,
        out: TId,
    },
    Concat {
        a: TId,
        b: TId,
        out: TId,
    },
    Permute {
        x: TId,
        perm: Vec<usize>,
        out: TId,
    },
}

impl Op {
    /// Tensors the op reads and writes.
    fn tensors(&self) -> Vec<TId> {
        match self {
            Op::Conv {
                x, out, residual, ..
            } => {
                let mut v = vec![*x, *out];
                v.extend(residual);
                v
            }
            Op::GroupNorm { x, out, .. }
            | Op::LayerNorm { x, out, .. }
            | Op::Linear { x, out, .. }
            | Op::Softmax { x, out, .. }
            | Op::Geglu { x, out }
            | Op::Unary { x, out, .. }
            | Op::Upsample { x, out }
            | Op::Permute { x, out, .. } => vec![*x, *out],
            Op::Attention { q, k, v, out } => vec![*q, *k, *v, *out],
            Op::Matmul { a, b, out, .. } | Op::Add { a, b, out } | Op::Concat { a, b, out } => {
                vec![*a, *b, *out]
            }
        }
    }
}

/// Naive vs planned activation bytes of a graph.
#[derive(Clone, Debug, Serialize)]
pub struct MemoryPlan {
    /// Intermediates in the arena.
    pub intermediates: usize,
    /// One buffer per intermediate.
    pub naive_bytes: u64,
    /// The greedy-by-size arena.
    pub planned_bytes: u64,
    /// Inputs and outputs (own buffers).
    pub io_bytes: u64,
    /// Split-K partial sums: one f32 scratch shared by every split convolution.
    pub conv_scratch_bytes: u64,
    /// The largest single intermediate.
    pub largest_bytes: u64,
    pub ops: usize,
}

/// Ops, tensors and weights of one network at one resolution and batch.
#[derive(Clone, Debug)]
pub struct Graph {
    pub dtype: DType,
    pub tensors: Vec<TensorDef>,
    pub weights: Vec<WeightDef>,
    pub ops: Vec<Op>,
    weight_index: HashMap<String, WId>,
}

impl Graph {
    pub fn new(dtype: DType) -> Graph {
        Graph {
            dtype,
            tensors: Vec::new(),
            weights: Vec::new(),
            ops: Vec::new(),
            weight_index: HashMap::new(),
        }
    }

    pub fn shape(&self, t: TId) -> &[usize] {
        &self.tensors[t].shape
    }

    fn add_tensor(
        &mut self,
        name: &str,
        shape: &[usize],
        role: Role,
        alias_of: Option<TId>,
    ) -> TId {
        self.tensors.push(TensorDef {
            name: name.to_string(),
            shape: shape.to_vec(),
            role,
            alias_of,
        });
        self.tensors.len() - 1
    }

    pub fn input(&mut self, name: &str, shape: &[usize]) -> TId {
        self.add_tensor(name, shape, Role::Input, None)
    }

    /// A new intermediate.
    pub fn tensor(&mut self, name: &str, shape: &[usize]) -> TId {
        self.add_tensor(name, shape, Role::Intermediate, None)
    }

    /// The same bytes as `t` with another shape.
    pub fn view(&mut self, t: TId, shape: &[usize]) -> Result<TId> {
        let n: usize = shape.iter().product();
        if n != self.shape(t).iter().product::<usize>() {
            return Err(shape_err!(
                "graph: cannot view {:?} as {shape:?}",
                self.shape(t)
            ));
        }
        let root = self.root(t);
        let name = format!("{}.view", self.tensors[t].name);
        Ok(self.add_tensor(&name, shape, Role::Intermediate, Some(root)))
    }

    /// Makes `t` (an intermediate, not a view) an output with its own buffer.
    pub fn mark_output(&mut self, t: TId) -> Result<()> {
        let d = &mut self.tensors[t];
        if d.alias_of.is_some() || d.role != Role::Intermediate {
            return Err(shape_err!("graph: {} cannot become an output", d.name));
        }
        d.role = Role::Output;
        Ok(())
    }

    pub fn root(&self, t: TId) -> TId {
        self.tensors[t].alias_of.unwrap_or(t)
    }

    /// Registers (or finds) a weight by its diffusers name.
    pub fn weight(&mut self, name: &str, kind: WeightKind, shape: &[usize]) -> Result<WId> {
        if let Some(&w) = self.weight_index.get(name) {
            if self.weights[w].shape != shape || self.weights[w].kind != kind {
                return Err(shape_err!("graph: weight {name} used with two shapes"));
            }
            return Ok(w);
        }
        self.weights.push(WeightDef {
            name: name.to_string(),
            kind,
            shape: shape.to_vec(),
        });
        self.weight_index
            .insert(name.to_string(), self.weights.len() - 1);
        Ok(self.weights.len() - 1)
    }

    // ---- op helpers: each makes its output tensor and records the op ----

    /// `conv(x, {prefix}.weight) + {prefix}.bias (+ residual)`, `o` output channels, square kernel `k`.
    #[allow(clippy::too_many_arguments)]
    pub fn conv(
        &mut self,
        prefix: &str,
        x: TId,
        o: usize,
        k: usize,
        stride: usize,
        pad: usize,
        pad_end: Option<usize>,
        residual: Option<TId>,
    ) -> Result<TId> {
        let s = self.shape(x).to_vec();
        if s.len() != 4 {
            return Err(shape_err!("graph: conv {prefix} on {s:?} (want NCHW)"));
        }
        let (ho, wo) = conv2d_output_size((s[2], s[3]), (k, k), stride, pad, pad_end)
            .ok_or_else(|| shape_err!("graph: conv {prefix} does not fit {s:?}"))?;
        let w = self.weight(
            &format!("{prefix}.weight"),
            WeightKind::Conv,
            &[o, s[1], k, k],
        )?;
        let b = self.weight(&format!("{prefix}.bias"), WeightKind::Vector, &[o])?;
        let out = self.tensor(prefix, &[s[0], o, ho, wo]);
        self.ops.push(Op::Conv {
            x,
            w,
            b: Some(b),
            out,
            stride,
            pad,
            pad_end,
            residual,
        });
        Ok(out)
    }

    /// GroupNorm (+ SiLU) with `{prefix}.weight` / `{prefix}.bias`.
    pub fn group_norm(
        &mut self,
        prefix: &str,
        x: TId,
        groups: usize,
        eps: f32,
        silu: bool,
    ) -> Result<TId> {
        let s = self.shape(x).to_vec();
        let gamma = self.weight(&format!("{prefix}.weight"), WeightKind::Vector, &[s[1]])?;
        let beta = self.weight(&format!("{prefix}.bias"), WeightKind::Vector, &[s[1]])?;
        let out = self.tensor(prefix, &s);
        self.ops.push(Op::GroupNorm {
            x,
            gamma,
            beta,
            out,
            groups,
            eps,
            silu,
        });
        Ok(out)
    }

    pub fn layer_norm(&mut self, prefix: &str, x: TId, eps: f32) -> Result<TId> {
        let s = self.shape(x).to_vec();
        let c = *s.last().unwrap_or(&0);
        let gamma = self.weight(&format!("{prefix}.weight"), WeightKind::Vector, &[c])?;
        let beta = self.weight(&format!("{prefix}.bias"), WeightKind::Vector, &[c])?;
        let out = self.tensor(prefix, &s);
        self.ops.push(Op::LayerNorm {
            x,
            gamma,
            beta,
            out,
            eps,
        });
        Ok(out)
    }

    /// nn.Linear `{prefix}` from the last dimension of `x` to `n`.
    pub fn linear(&mut self, prefix: &str, x: TId, n: usize, bias: bool) -> Result<TId> {
        let mut s = self.shape(x).to_vec();
        let k = *s.last().unwrap_or(&0);
        let w = self.weight(&format!("{prefix}.weight"), WeightKind::Linear, &[n, k])?;
        let b = if bias {
            Some(self.weight(&format!("{prefix}.bias"), WeightKind::Vector, &[n])?)
        } else {
            None
        };
        *s.last_mut().unwrap() = n;
        let out = self.tensor(prefix, &s);
        self.ops.push(Op::Linear { x, w, b, out });
        Ok(out)
    }

    /// Multi-head attention of `q` `[B, Lq, C]` over `k`, `v` `[B, Lkv, C]` with `heads` heads; flash
    /// attention where the head size allows, else (one head over more than [`MAX_HEAD_DIM`]: the VAE's
    /// 512-wide single head) scores through matmul + softmax.
    pub fn attention(&mut self, name: &str, q: TId, k: TId, v: TId, heads: usize) -> Result<TId> {
        let qs = self.shape(q).to_vec();
        let ks = self.shape(k).to_vec();
        let (b, lq, c) = (qs[0], qs[1], qs[2]);
        let lkv = ks[1];
        if heads == 0 || !c.is_multiple_of(heads) || ks[2] != c || self.shape(v) != ks.as_slice() {
            return Err(shape_err!(
                "graph: attention {name}: q {qs:?}, k {ks:?}, {heads} heads"
            ));
        }
        let d = c / heads;
        let out = self.tensor(name, &qs);
        if d.is_multiple_of(8) && d <= MAX_HEAD_DIM {
            let q4 = self.view(q, &[b, lq, heads, d])?;
            let k4 = self.view(k, &[b, lkv, heads, d])?;
            let v4 = self.view(v, &[b, lkv, heads, d])?;
            let o4 = self.view(out, &[b, lq, heads, d])?;
            self.ops.push(Op::Attention {
                q: q4,
                k: k4,
                v: v4,
                out: o4,
            });
            return Ok(out);
        }
        if heads != 1 {
            return Err(shape_err!(
                "graph: attention {name}: head dim {d} with {heads} heads is not supported"
            ));
        }
        let scores = self.tensor(&format!("{name}.scores"), &[b, lq, lkv]);
        self.ops.push(Op::Matmul {
            a: q,
            b: k,
            out: scores,
            transpose_b: true,
        });
        self.ops.push(Op::Softmax {
            x: scores,
            out: scores,
            scale: 1.0 / (d as f32).sqrt(),
        });
        self.ops.push(Op::Matmul {
            a: scores,
            b: v,
            out,
            transpose_b: false,
        });
        Ok(out)
    }

    pub fn geglu(&mut self, x: TId) -> Result<TId> {
        let mut s = self.shape(x).to_vec();
        *s.last_mut().unwrap() /= 2;
        let out = self.tensor("geglu", &s);
        self.ops.push(Op::Geglu { x, out });
        Ok(out)
    }

    /// `a + b` (b broadcast); `in_place` writes into `a`.
    pub fn add(&mut self, a: TId, b: TId, in_place: bool) -> TId {
        let out = if in_place {
            a
        } else {
            let s = self.shape(a).to_vec();
            self.tensor("add", &s)
        };
        self.ops.push(Op::Add { a, b, out });
        out
    }

    pub fn unary(&mut self, op: UnaryOp, x: TId) -> TId {
        let s = self.shape(x).to_vec();
        let out = self.tensor(op.name(), &s);
        self.ops.push(Op::Unary { op, x, out });
        out
    }

    pub fn upsample(&mut self, x: TId) -> TId {
        let mut s = self.shape(x).to_vec();
        s[2] *= 2;
        s[3] *= 2;
        let out = self.tensor("upsample", &s);
        self.ops.push(Op::Upsample { x, out });
        out
    }

    pub fn concat(&mut self, a: TId, b: TId) -> TId {
        let mut s = self.shape(a).to_vec();
        s[1] += self.shape(b)[1];
        let out = self.tensor("concat", &s);
        self.ops.push(Op::Concat { a, b, out });
        out
    }

    pub fn permute(&mut self, x: TId, perm: &[usize]) -> TId {
        let s = self.shape(x).to_vec();
        let shape: Vec<usize> = perm.iter().map(|&d| s[d]).collect();
        let out = self.tensor("permute", &shape);
        self.ops.push(Op::Permute {
            x,
            perm: perm.to_vec(),
            out,
        });
        out
    }

    /// `[N, C, H, W]` -> `[N, H*W, C]`.
    pub fn nchw_to_tokens(&mut self, x: TId) -> Result<TId> {
        let s = self.shape(x).to_vec();
        let x3 = self.view(x, &[s[0], s[1], s[2] * s[3]])?;
        Ok(self.permute(x3, &[0, 2, 1]))
    }

    /// `[N, H*W, C]` -> `[N, C, H, W]`.
    pub fn tokens_to_nchw(&mut self, x: TId, h: usize, w: usize) -> Result<TId> {
        let t = self.permute(x, &[0, 2, 1]);
        let s = self.shape(t).to_vec();
        self.view(t, &[s[0], s[1], h, w])
    }

    // ---- planning ----

    fn elem_bytes(&self) -> u64 {
        self.dtype.block_bytes() as u64
    }

    fn bytes_of(&self, t: TId) -> u64 {
        self.tensors[t].shape.iter().product::<usize>() as u64 * self.elem_bytes()
    }

    /// Lifetimes of the arena tensors (roots that are intermediates), in tensor order.
    fn lifetimes(&self) -> Vec<(TId, Lifetime)> {
        let mut span: Vec<Option<(usize, usize)>> = vec![None; self.tensors.len()];
        for (i, op) in self.ops.iter().enumerate() {
            for t in op.tensors() {
                let r = self.root(t);
                span[r] = Some(match span[r] {
                    None => (i, i),
                    Some((a, b)) => (a.min(i), b.max(i)),
                });
            }
        }
        (0..self.tensors.len())
            .filter(|&t| {
                self.tensors[t].alias_of.is_none() && self.tensors[t].role == Role::Intermediate
            })
            .filter_map(|t| {
                span[t].map(|(first, last)| {
                    (
                        t,
                        Lifetime {
                            first,
                            last,
                            size: self.bytes_of(t),
                        },
                    )
                })
            })
            .collect()
    }

    /// The arena plan (offsets in the order of the intermediates that ops use).
    pub fn plan(&self) -> (Vec<TId>, ArenaPlan) {
        let lt = self.lifetimes();
        let plan = plan_greedy_by_size(&lt.iter().map(|x| x.1).collect::<Vec<_>>(), BINDING_ALIGN);
        (lt.into_iter().map(|x| x.0).collect(), plan)
    }

    /// Naive vs planned bytes, computed from the graph alone.
    pub fn memory_plan(&self) -> MemoryPlan {
        let (ids, plan) = self.plan();
        let io_bytes = (0..self.tensors.len())
            .filter(|&t| {
                self.tensors[t].alias_of.is_none() && self.tensors[t].role != Role::Intermediate
            })
            .map(|t| self.bytes_of(t))
            .sum();
        let conv_scratch_bytes = self.split_scratch_values() as u64 * 4;
        MemoryPlan {
            intermediates: ids.len(),
            naive_bytes: plan.naive_bytes,
            planned_bytes: plan.arena_bytes,
            io_bytes,
            conv_scratch_bytes,
            largest_bytes: ids.iter().map(|&t| self.bytes_of(t)).max().unwrap_or(0),
            ops: self.ops.len(),
        }
    }

    // ---- building ----

    /// Allocates the arena and the input/output buffers and builds every dispatch. `weights` holds
    /// the uploaded weights in [`Graph::weights`] order.
    /// f32 values of the one split-K scratch every split convolution of the graph shares (they run in
    /// order, so the largest need is enough).
    fn split_scratch_values(&self) -> usize {
        let mut most = 0;
        for op in &self.ops {
            if let Op::Conv { x, out, w, .. } = op {
                let (xs, os) = (self.shape(*x), self.shape(*out));
                let ws = &self.weights[*w].shape;
                let m = os[0] * os[2] * os[3];
                let k = xs[1] * ws[2] * ws[3];
                // Sized for the portable and the cooperative plans alike (they split differently),
                // so one figure holds whichever kernel the device runs.
                let splits = [Conv2dVariant::Auto, Conv2dVariant::Coop]
                    .map(|v| conv2d_plan(m, os[1], k, v, None).1)
                    .into_iter()
                    .max()
                    .unwrap_or(1);
                if splits > 1 {
                    most = most.max(splits * os.iter().product::<usize>());
                }
            }
        }
        most
    }

    pub fn build(&self, gpu: &Gpu, label: &str, weights: &[Tensor]) -> Result<BuiltGraph> {
        if weights.len() != self.weights.len() {
            return Err(shape_err!(
                "{label}: {} weights given, the graph has {}",
                weights.len(),
                self.weights.len()
            ));
        }
        let (ids, plan) = self.plan();
        let arena = gpu.create_buffer(
            &format!("{label} arena"),
            plan.arena_bytes.max(4),
            wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            Category::Activations,
        )?;
        let mut gts: Vec<Option<Tensor>> = vec![None; self.tensors.len()];
        for (&t, &off) in ids.iter().zip(&plan.offsets) {
            gts[t] = Some(Tensor {
                shape: self.tensors[t].shape.clone(),
                dtype: self.dtype,
                layout: Layout::RowMajor,
                storage: Storage {
                    buffer: arena.clone(),
                    offset: off,
                    len: self.bytes_of(t),
                },
            });
        }
        for (t, d) in self.tensors.iter().enumerate() {
            if d.alias_of.is_none() && d.role != Role::Intermediate {
                gts[t] = Some(gpu.tensor(
                    &format!("{label} {}", d.name),
                    &d.shape,
                    self.dtype,
                    Category::Activations,
                )?);
            }
        }
        for (t, d) in self.tensors.iter().enumerate() {
            if let Some(r) = d.alias_of
                && let Some(rt) = &gts[r]
            {
                gts[t] = Some(rt.reshape(&d.shape)?);
            }
        }
        let get = |t: TId| -> Result<&Tensor> {
            gts[t]
                .as_ref()
                .ok_or_else(|| shape_err!("{label}: tensor {} is never used", self.tensors[t].name))
        };
        let mut steps: HashMap<usize, Tensor> = HashMap::new();
        let mut program = Program::new();
        let split_values = self.split_scratch_values();
        let split_scratch = (split_values > 0)
            .then(|| {
                gpu.tensor(
                    &format!("{label} split-K scratch"),
                    &[split_values],
                    DType::F32,
                    Category::Activations,
                )
            })
            .transpose()?;
        for op in &self.ops {
            match op {
                Op::Conv {
                    x,
                    w,
                    b,
                    out,
                    stride,
                    pad,
                    pad_end,
                    residual,
                } => {
                    let res = match residual {
                        Some(r) => Some(get(*r)?),
                        None => None,
                    };
                    let opts = Conv2dOptions {
                        stride: *stride,
                        padding: *pad,
                        padding_end: *pad_end,
                        residual: res,
                        split_scratch: split_scratch.as_ref(),
                        ..Default::default()
                    };
                    program.extend(conv2d(
                        gpu,
                        get(*x)?,
                        &weights[*w],
                        b.map(|b| &weights[b]),
                        get(*out)?,
                        &opts,
                    )?);
                }
                Op::GroupNorm {
                    x,
                    gamma,
                    beta,
                    out,
                    groups,
                    eps,
                    silu,
                } => {
                    let opts = GroupNormOptions::new(*groups, *eps, *silu);
                    program.extend(groupnorm(
                        gpu,
                        get(*x)?,
                        &weights[*gamma],
                        &weights[*beta],
                        get(*out)?,
                        &opts,
                    )?);
                }
                Op::LayerNorm {
                    x,
                    gamma,
                    beta,
                    out,
                    eps,
                } => {
                    program.push(layernorm(
                        gpu,
                        get(*x)?,
                        Some(&weights[*gamma]),
                        Some(&weights[*beta]),
                        get(*out)?,
                        *eps,
                        RowVariant::Auto,
                    )?);
                }
                Op::Linear { x, w, b, out } => {
                    let opts = MatmulOptions {
                        transpose_b: true,
                        bias: b.map(|b| &weights[b]),
                        ..Default::default()
                    };
                    program.extend(matmul(gpu, get(*x)?, &weights[*w], get(*out)?, &opts)?);
                }
                Op::Attention { q, k, v, out } => {
                    let kt = get(*k)?;
                    let lkv = kt.shape[1];
                    // (kv_len, q_pos0) for a non-causal call over the whole K/V: one per length.
                    if let std::collections::hash_map::Entry::Vacant(e) = steps.entry(lkv) {
                        let s =
                            gpu.tensor("attention step", &[2], DType::U32, Category::Activations)?;
                        gpu.write_tensor_bytes(&s, bytemuck::cast_slice(&[lkv as u32, 0u32]))?;
                        e.insert(s);
                    }
                    // Auto: the cooperative-matrix kernel where the device has it, the prefill one
                    // otherwise (SD's query lengths are never decode-sized).
                    let opts = AttentionOptions::default();
                    program.extend(attention(
                        gpu,
                        get(*q)?,
                        kt,
                        get(*v)?,
                        get(*out)?,
                        &steps[&lkv],
                        &opts,
                    )?);
                }
                Op::Matmul {
                    a,
                    b,
                    out,
                    transpose_b,
                } => {
                    let opts = MatmulOptions {
                        transpose_b: *transpose_b,
                        ..Default::default()
                    };
                    program.extend(matmul(gpu, get(*a)?, get(*b)?, get(*out)?, &opts)?);
                }
                Op::Softmax { x, out, scale } => {
                    let opts = SoftmaxOptions {
                        scale: *scale,
                        ..Default::default()
                    };
                    program.push(softmax(gpu, get(*x)?, get(*out)?, &opts)?);
                }
                Op::Geglu { x, out } => program.push(geglu(gpu, get(*x)?, get(*out)?)?),
                Op::Add { a, b, out } => {
                    program.push(binary(gpu, BinaryOp::Add, get(*a)?, get(*b)?, get(*out)?)?)
                }
                Op::Unary { op, x, out } => program.push(unary(gpu, *op, get(*x)?, get(*out)?)?),
                Op::Upsample { x, out } => {
                    program.push(upsample_nearest2x(gpu, get(*x)?, get(*out)?)?)
                }
                Op::Concat { a, b, out } => {
                    program.extend(concat_channels(gpu, get(*a)?, get(*b)?, get(*out)?)?)
                }
                Op::Permute { x, perm, out } => {
                    program.push(permute(gpu, get(*x)?, perm, get(*out)?)?)
                }
            }
        }
        Ok(BuiltGraph {
            program,
            tensors: gts,
            arena,
            plan,
            _steps: steps.into_values().collect(),
        })
    }
}

/// A graph on the GPU: its program, the arena and every tensor (by [`TId`]).
pub struct BuiltGraph {
    pub program: Program,
    pub tensors: Vec<Option<Tensor>>,
    pub arena: Arc<crate::memory::GpuBuffer>,
    pub plan: ArenaPlan,
    _steps: Vec<Tensor>,
}

impl BuiltGraph {
    pub fn tensor(&self, t: TId) -> Result<&Tensor> {
        self.tensors[t]
            .as_ref()
            .ok_or_else(|| shape_err!("graph tensor {t} has no GPU tensor"))
    }
}
