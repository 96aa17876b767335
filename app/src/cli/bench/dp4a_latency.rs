//! `drift bench kernels --filter dp4alat`: the integer-dot-product products of Llama 3.1 8B (Q4_0)
//! with more of each lane's weight loads in flight (blocks per row per step, BU) and the first
//! step's loads issued before the input's pre-pass (PF); `--filter dp4alat-default` times each
//! product's default layout alone (with `DRIFT_DP4A_DBG` = 1..4, the measurement builds that split
//! its time between loads, arithmetic and pre-pass). On the H200 these products took the same time
//! with their weights in L2 as from DRAM (BENCHMARKS.md, 2026-12-02 fourteenth session): what bounds
//! them is inside the SM, not bandwidth. Four weight copies in turn, as in a model; the figure is per
//! product.

use anyhow::Result;
use drift_engine::kernels::matvec::MatvecOptions;
use drift_engine::kernels::quant::{QuantTuning, matvec_quant_tuned};
use drift_engine::{Category, DType, Dispatch, Gpu, Tensor};

use super::Measurement;
use super::timing::measure;

const COPIES: usize = 4;

/// (rows per team, row groups, workgroups per row set) of one layout.
type Layout = (u32, u32, u32);

pub fn latency_cases(
    gpu: &Gpu,
    reps: usize,
    filter: Option<&str>,
    report: &mut dyn FnMut(Measurement),
) -> Result<()> {
    if !filter.is_some_and(|f| f.contains("dp4alat")) {
        return Ok(());
    }
    // `dp4alat-default`: each product's default layout only, as the model runs it.
    let only_default = filter.is_some_and(|f| f.contains("dp4alat-default"));
    // (label, rows, K, [(rows per team, row groups, workgroups per row set)]): the default first.
    let shapes: [(&str, usize, usize, &[Layout]); 4] = [
        ("o", 4096, 4096, &[(2, 1, 1), (4, 1, 2), (1, 1, 1)]),
        ("qkv", 6144, 4096, &[(2, 1, 1), (1, 1, 1)]),
        ("down", 4096, 14336, &[(4, 1, 2), (2, 1, 2), (2, 1, 4)]),
        ("gate-up", 28672, 4096, &[(4, 2, 1), (4, 1, 1)]),
    ];
    let io = if gpu.caps.f16 { DType::F16 } else { DType::F32 };
    for (label, n, k, layouts) in shapes {
        let ws = (0..COPIES)
            .map(|_| gpu.tensor("w", &[n, k], DType::Q4_0, Category::Weights))
            .collect::<drift_engine::Result<Vec<_>>>()?;
        let x = gpu.tensor("x", &[1, k], io, Category::Activations)?;
        let o = gpu.tensor("o", &[1, n], io, Category::Activations)?;
        let layouts = if only_default { &layouts[..1] } else { layouts };
        let steps: &[(u32, bool)] = if only_default {
            &[(1, false)]
        } else {
            &[
                (1, false),
                (2, false),
                (4, false),
                (1, true),
                (2, true),
                (4, true),
            ]
        };
        for &(r, rg, kw) in layouts {
            for &(bu, pf) in steps {
                let tuning = QuantTuning {
                    rows_per_team: r,
                    row_groups: rg,
                    chunks_per_step: bu,
                    prefetch: pf,
                    k_workgroups: kw,
                    ..QuantTuning::default()
                };
                let ds = over_copies(gpu, &ws, &x, &o, tuning)?;
                let name = format!(
                    "dp4alat {label} {n}x{k} r{r} rg{rg} kw{kw} bu{bu} pf{}",
                    u8::from(pf)
                );
                let m = measure(gpu, &name, &ds, reps, "")?;
                report(Measurement {
                    time_us: m.time_us / COPIES as f64,
                    ..m
                });
            }
        }
    }
    Ok(())
}

/// One product per weight copy, in turn (each weight read once, as in a model's token).
pub fn over_copies(
    gpu: &Gpu,
    ws: &[Tensor],
    x: &Tensor,
    o: &Tensor,
    tuning: QuantTuning,
) -> Result<Vec<Dispatch>> {
    let mut ds = Vec::new();
    for w in ws {
        ds.extend(matvec_quant_tuned(
            gpu,
            w,
            x,
            o,
            &MatvecOptions::default(),
            tuning,
        )?);
    }
    Ok(ds)
}
