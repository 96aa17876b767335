use crate::common::{gpu, run_checks};
use drift_engine::kernels::attention::{self as kernel, AttentionOptions, AttentionVariant};
use drift_engine::profiler::Profiler;
use drift_engine::selftest::attention;
use drift_engine::{Category, DType, Program};

#[test]
fn attention_matches_reference() {
    run_checks(attention::checks);
}

/// GPU time of the attention kernels at model sizes (not a correctness test; run on a real GPU with
/// `cargo test --release --test kernels attention_timing -- --ignored --nocapture`).
#[test]
#[ignore]
fn attention_timing() {
    let gpu = gpu();
    println!("caps: {:?}", gpu.caps);
    let (f, h) = (DType::F32, DType::F16);
    use AttentionVariant::{Auto, Prefill};
    // (name, [B, Lq, Lkv, Hq, Hkv, D], causal, q/out dtype, kv dtype, variant)
    #[rustfmt::skip]
    let cases = [
        ("SD self 4096 D40", [2, 4096, 4096, 8, 8, 40], false, h, h, Auto),
        ("SD cross 4096x77 D40", [2, 4096, 77, 8, 8, 40], false, h, h, Auto),
        ("SD self 1024 D80", [2, 1024, 1024, 8, 8, 80], false, h, h, Auto),
        ("SD self 256 D160", [2, 256, 256, 8, 8, 160], false, h, h, Auto),
        ("LLM prefill 512 D64", [1, 512, 512, 32, 8, 64], true, f, h, Auto),
        ("LLM prefill 512 D128", [1, 512, 512, 32, 8, 128], true, f, h, Auto),
        ("LLM prefill 4096 D128", [1, 4096, 4096, 32, 8, 128], true, f, h, Auto),
        ("LLM decode 512 D128", [1, 1, 512, 32, 8, 128], true, f, h, Auto),
        ("LLM decode 4096 D128", [1, 1, 4096, 32, 8, 128], true, f, h, Auto),
        ("LLM decode 32768 D128", [1, 1, 32768, 32, 8, 128], true, f, h, Auto),
        ("LLM decode 4096 D64", [1, 1, 4096, 32, 8, 64], true, f, h, Auto),
        ("LLM decode 4096 D128 (prefill)", [1, 1, 4096, 32, 8, 128], true, f, h, Prefill),
        ("MHA decode 4096 D128", [1, 1, 4096, 32, 32, 128], true, f, h, Auto),
    ];
    let filter = std::env::var("DRIFT_ATTN_FILTER").ok();
    let splits: Option<usize> = std::env::var("DRIFT_ATTN_SPLITS")
        .ok()
        .and_then(|s| s.parse().ok());
    // DRIFT_ATTN_TILE=ny,tk
    let prefill_tile = std::env::var("DRIFT_ATTN_TILE").ok().map(|s| {
        let v: Vec<usize> = s.split(',').map(|x| x.parse().unwrap()).collect();
        kernel::PrefillTile { ny: v[0], tk: v[1] }
    });
    for (name, [b, lq, lkv, hq, hkv, d], causal, qt, kvt, variant) in cases {
        if filter.as_deref().is_some_and(|f| !name.contains(f)) {
            continue;
        }
        let act = |shape: &[usize], dt| gpu.tensor(name, shape, dt, Category::Activations).unwrap();
        let q = act(&[b, lq, hq, d], qt);
        let k = act(&[b, lkv, hkv, d], kvt);
        let v = act(&[b, lkv, hkv, d], kvt);
        let o = act(&[b, lq, hq, d], qt);
        for t in [&q, &k, &v] {
            gpu.write_tensor_bytes(t, &vec![0x20; t.byte_len() as usize])
                .unwrap();
        }
        let step = act(&[2], DType::U32);
        let pos0 = if causal { lkv - lq } else { 0 };
        gpu.write_tensor_bytes(&step, bytemuck::cast_slice(&[lkv as u32, pos0 as u32]))
            .unwrap();
        let opts = AttentionOptions {
            causal,
            variant,
            splits,
            prefill_tile,
            ..Default::default()
        };
        let ds = match kernel::attention(gpu, &q, &k, &v, &o, &step, &opts) {
            Ok(ds) => ds,
            Err(e) => {
                println!("{name:34} skipped: {e}");
                continue;
            }
        };
        let reps = 20;
        let mut prog = Program::new();
        for _ in 0..reps {
            prog.extend(ds.iter().cloned());
        }
        prog.run(gpu).unwrap();
        let profile = prog.run_profiled(gpu, &mut Profiler::new()).unwrap();
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let per_kernel: Vec<f64> = (0..ds.len())
            .map(|i| {
                median(
                    profile
                        .dispatches
                        .iter()
                        .skip(i)
                        .step_by(ds.len())
                        .map(|d| d.duration_us)
                        .collect(),
                )
            })
            .collect();
        let us: f64 = per_kernel.iter().sum();
        let flops: f64 = ds.iter().map(|d| d.cost.flops).sum();
        let bytes: f64 = ds.iter().map(|d| d.cost.bytes).sum();
        let kernels: Vec<_> = ds
            .iter()
            .zip(&per_kernel)
            .map(|(d, t)| format!("{} {:?} {t:.1} us", d.name, d.workgroups))
            .collect();
        println!(
            "{name:34} {us:9.1} us {:7.2} TFLOP/s {:7.0} GB/s  [{}]",
            flops / us / 1e6,
            bytes / us / 1e3,
            kernels.join(", ")
        );
    }
}
