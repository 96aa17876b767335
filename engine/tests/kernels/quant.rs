//! Quantized weights: the self-test checks on random blocks, the CPU reference and quantisers against
//! gguf-py (fixtures from tests/fixtures/make_quant_fixtures.py: gguf-py quantised random data, rows of
//! the real SmolLM2 GGUF file, random K-quant blocks), and the GPU kernels on those fixtures.

use std::path::PathBuf;

use crate::common::{gpu, run_checks};
use drift_engine::DType;
use drift_engine::reference::quant as r;
use drift_engine::selftest::quant::{self, Fixture};
use drift_engine::selftest::quant_xq;

#[test]
fn quant_matches_reference() {
    run_checks(quant::checks);
}

/// x quantized by its producer gives the consumer what its own pre-pass would.
#[test]
fn producer_quantized_x_matches_the_pre_pass() {
    run_checks(quant_xq::checks);
}

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/quant")
}

fn read_f32(path: PathBuf) -> Vec<f32> {
    let b = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn dtype_of(name: &str) -> DType {
    match name {
        "Q8_0" => DType::Q8_0,
        "Q4_0" => DType::Q4_0,
        "Q4_1" => DType::Q4_1,
        "Q5_0" => DType::Q5_0,
        "Q5_1" => DType::Q5_1,
        "Q4_K" => DType::Q4K,
        "Q5_K" => DType::Q5K,
        "Q6_K" => DType::Q6K,
        other => panic!("unknown fixture type {other}"),
    }
}

/// Every fixture, with `src` (the f32 data gguf-py quantised) where the manifest has it.
fn fixtures() -> Vec<(Fixture, Option<Vec<f32>>)> {
    let dir = fixture_dir();
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).expect("manifest.json"))
            .unwrap();
    manifest
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let name = e["name"].as_str().unwrap().to_string();
            let shape: Vec<usize> = e["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as usize)
                .collect();
            let bytes = std::fs::read(dir.join(format!("{name}.q"))).unwrap();
            let values = read_f32(dir.join(format!("{name}.f32")));
            let src = e
                .get("src")
                .map(|_| read_f32(dir.join(format!("{name}.src.f32"))));
            let f = Fixture {
                dtype: dtype_of(e["type"].as_str().unwrap()),
                n: shape[0],
                k: shape[1],
                name,
                bytes,
                values,
            };
            assert_eq!(
                f.bytes.len() as u64,
                f.dtype.bytes_for(f.n * f.k).unwrap(),
                "{}",
                f.name
            );
            assert_eq!(f.values.len(), f.n * f.k, "{}", f.name);
            (f, src)
        })
        .collect()
}

/// The integer-dot-product kernel's specialisations lavapipe does not select (Llama 3 8B's K = 14336
/// needs more workgroup memory than lavapipe has, f16 activations with every fusion) compile to
/// SPIR-V, and integer dot products are emitted as OpSDot (4450) where the capability is declared.
#[test]
fn quant_dp4a_specialisations_compile() {
    use crate::spirv::{combos, paired_defines, to_spirv};
    let src = drift_engine::kernels::quant_dp4a::SOURCE;
    let mut n = 0;
    for block in ["Q4_0", "Q4_1", "Q8_0"] {
        for tx in ["f16", "f32"] {
            for (norm, swiglu, res) in [("0", "0", "0"), ("1", "0", "0"), ("0", "1", "1")] {
                for mut d in combos(
                    &[
                        (block, "1"),
                        ("TX", tx),
                        ("TO", "f32"),
                        ("TB", "f32"),
                        ("F16", "1"),
                        ("R", "2"),
                        ("RG", "2"),
                        ("MAXB", "448"),
                        ("NORM", norm),
                        ("SWIGLU", swiglu),
                        ("RES", res),
                        ("NORM_B", "4"),
                        ("TG", "f32"),
                        ("RES_B", "4"),
                        ("TR", "f32"),
                        ("GV4", "1"),
                        ("BU", "2"),
                        ("DBG", "0"),
                    ],
                    &["ALIGNED", "XV4", "PF", "XQ4", "KSPLIT", "KWS"],
                ) {
                    d.push(("BIAS", "0".into()));
                    d.push(("KT", k_teams(&d).into()));
                    let kws = d.iter().any(|(k, v)| *k == "KWS" && v == "1");
                    d.push(("KW", if kws { "4" } else { "1" }.into()));
                    d.push(("SCR_B", "5".into()));
                    let words = to_spirv("matvec_quant_dp4a", src, &d);
                    // Walk the instructions after the 5-word header: word count in the high half.
                    let (mut i, mut sdot) = (5, false);
                    while i < words.len() {
                        sdot |= words[i] & 0xFFFF == 4450;
                        i += (words[i] >> 16).max(1) as usize;
                    }
                    assert!(sdot, "no OpSDot in {d:?}");
                    n += 1;
                }
            }
        }
    }
    assert_eq!(n, 3 * 2 * 3 * 64);
    // The paired-row epilogues after the norm prologue: GLU (with bias) and RoPE (f16 caches, both
    // pairings), f16 output.
    for block in ["Q4_0", "Q4_1", "Q8_0"] {
        for glu in [true, false] {
            for mut d in combos(
                &[
                    (block, "1"),
                    ("TX", "f32"),
                    ("TO", "f16"),
                    ("F16", "1"),
                    ("R", "2"),
                    ("RG", "2"),
                    ("MAXB", "448"),
                    ("BU", "1"),
                    ("PF", "0"),
                    ("XQ4", "0"),
                    ("DBG", "0"),
                ],
                &["ALIGNED", "XV4", "INTERLEAVED", "KSPLIT", "KWS"],
            ) {
                d.extend(paired_defines(glu));
                d.push(("KT", k_teams(&d).into()));
                let kws = d.iter().any(|(k, v)| *k == "KWS" && v == "1");
                if kws && !glu {
                    // The RoPE epilogue's 8 bindings leave none for the split's scratch.
                    continue;
                }
                d.push(("KW", if kws { "2" } else { "1" }.into()));
                d.push(("SCR_B", "8".into()));
                to_spirv("matvec_quant_dp4a", src, &d);
                n += 1;
            }
        }
    }
    assert_eq!(n, 3 * 2 * 3 * 64 + 3 * (32 + 16));
    // x quantized by its producer: read (under the norm or not: XQN), written by the residual
    // epilogue (K split or not) or the GLU one, in registers on subgroups of 32 (XQL) or through
    // workgroup memory, with the next norm's weight (XQG) or without.
    let mut m = 0;
    for block in ["Q4_0", "Q4_1", "Q8_0"] {
        for glu in [true, false] {
            for mut d in combos(
                &[
                    (block, "1"),
                    ("TX", "u32"),
                    ("TO", "f32"),
                    ("F16", "1"),
                    ("R", "4"),
                    ("RG", "2"),
                    ("MAXB", "1"),
                    ("BU", "1"),
                    ("PF", "0"),
                    ("XQ4", "0"),
                    ("DBG", "0"),
                    ("XV4", "1"),
                    ("KT", "1"),
                    ("KSPLIT", "0"),
                    ("NORM", "0"),
                    ("SWIGLU", "0"),
                    ("BIAS", "0"),
                    ("ROPE", "0"),
                    ("GLU", if glu { "1" } else { "0" }),
                    ("PAIRS", if glu { "1" } else { "0" }),
                    ("RES", if glu { "0" } else { "1" }),
                    ("RES_B", "4"),
                    ("TR", "f32"),
                    ("XQO", "1"),
                    ("XQO_B", "5"),
                    ("XQW", "1"),
                    ("XQG_B", "6"),
                    ("TQG", "f32"),
                    ("XQ_VALS", "32"),
                    ("SCR_B", "7"),
                ],
                &["ALIGNED", "KWS", "XQ", "XQN", "XQL", "XQG"],
            ) {
                let kws = d.iter().any(|(k, v)| *k == "KWS" && v == "1");
                d.push(("KW", if kws { "2" } else { "1" }.into()));
                to_spirv("matvec_quant_dp4a xq", src, &d);
                m += 1;
            }
        }
    }
    assert_eq!(m, 3 * 2 * 64);
}

/// The dp4a kernel's teams per row group for a define set: 4 where KSPLIT is on, else 1.
fn k_teams(d: &[(&'static str, String)]) -> &'static str {
    if d.iter().any(|(k, v)| *k == "KSPLIT" && v == "1") {
        "4"
    } else {
        "1"
    }
}

#[test]
fn quant_reference_is_bit_identical_to_gguf_py() {
    let all = fixtures();
    let types: std::collections::HashSet<_> = all.iter().map(|(f, _)| f.dtype).collect();
    assert_eq!(types.len(), 8, "a fixture for every block type");
    for (f, _) in &all {
        let got = r::dequantize(f.dtype, &f.bytes);
        let bad = got
            .iter()
            .zip(&f.values)
            .position(|(a, b)| a.to_bits() != b.to_bits() && a != b);
        assert!(
            bad.is_none(),
            "{}: value {} is {} (gguf-py {})",
            f.name,
            bad.unwrap(),
            got[bad.unwrap()],
            f.values[bad.unwrap()]
        );
        println!(
            "ok   {} {:?} [{}, {}]: dequantization bit-identical to gguf-py",
            f.name, f.dtype, f.n, f.k
        );
    }
}

#[test]
fn quant_quantizers_are_bit_identical_to_gguf_py() {
    let mut n = 0;
    for (f, src) in fixtures() {
        let Some(src) = src else { continue };
        let got = r::quantize(f.dtype, &src).unwrap();
        assert_eq!(got.len(), f.bytes.len(), "{}", f.name);
        let bad = got.iter().zip(&f.bytes).position(|(a, b)| a != b);
        assert!(
            bad.is_none(),
            "{}: byte {} is {:#x}, gguf-py {:#x}",
            f.name,
            bad.unwrap(),
            got[bad.unwrap()],
            f.bytes[bad.unwrap()]
        );
        println!(
            "ok   {} {:?}: {} bytes identical to gguf-py's quantize",
            f.name,
            f.dtype,
            got.len()
        );
        n += 1;
    }
    assert_eq!(n, 2, "Q8_0 and Q4_0 quantiser fixtures");
}

#[test]
fn quant_kernels_match_gguf_py_fixtures() {
    run_checks(|gpu, rng| {
        let mut all = Vec::new();
        for (f, _) in fixtures() {
            all.extend(quant::fixture_checks(gpu, rng, &f)?);
        }
        Ok(all)
    });
}

/// Bandwidth of the quantized matvec at LLM sizes (run on the H200:
/// `kernels quant_matvec_bandwidth --ignored --nocapture`; DRIFT_QUANT_BENCH=quick for fewer cases).
#[test]
#[ignore]
fn quant_matvec_bandwidth() {
    use drift_engine::kernels::matvec::{MatvecOptions, matvec};
    use drift_engine::kernels::quant::{QuantTuning, dequantize, matvec_quant_tuned};
    use drift_engine::profiler::Profiler;
    use drift_engine::{Category, Layout, Program};

    let gpu = gpu();
    let time = |ds: &[drift_engine::exec::Dispatch], reps: usize| -> (f64, f64) {
        let mut p = Program::new();
        for _ in 0..reps {
            p.extend(ds.iter().cloned());
        }
        p.run(gpu).unwrap();
        let prof = p.run_profiled(gpu, &mut Profiler::new()).unwrap();
        let mut t: Vec<f64> = prof
            .dispatches
            .chunks(ds.len())
            .map(|c| c.iter().map(|d| d.duration_us).sum())
            .collect();
        t.sort_by(f64::total_cmp);
        let bytes: f64 = ds.iter().map(|d| d.cost.bytes).sum();
        (t[t.len() / 2], bytes / t[t.len() / 2] / 1e3)
    };
    let quick = std::env::var("DRIFT_QUANT_BENCH").is_ok_and(|v| v == "quick");
    let reps = if gpu.info.name.contains("llvmpipe") {
        2
    } else {
        30
    };
    let sizes: &[(usize, usize)] = if gpu.info.name.contains("llvmpipe") {
        &[(256, 1024)]
    } else {
        &[(4096, 14336), (14336, 4096), (4096, 4096)]
    };
    let mut rng = drift_engine::selftest::rng().0;
    for &(n, k) in sizes {
        if gpu.caps.f16 {
            let w = gpu
                .tensor("w", &[n, k], DType::F16, Category::Weights)
                .unwrap();
            let x = gpu
                .tensor("x", &[1, k], DType::F32, Category::Activations)
                .unwrap();
            let o = gpu
                .tensor("o", &[1, n], DType::F32, Category::Activations)
                .unwrap();
            let (us, gbs) = time(
                &matvec(gpu, &w, &x, &o, &MatvecOptions::default()).unwrap(),
                reps,
            );
            println!("f16 matvec       {n:>6}x{k:<6} b1            {us:9.1} us {gbs:8.1} GB/s");
        }
        let types: &[DType] = if quick {
            &[DType::Q4_0, DType::Q8_0]
        } else {
            &drift_engine::kernels::quant::QUANT_TYPES
        };
        for &dtype in types {
            let bytes = quant::random_blocks(&mut rng, dtype, n * k / dtype.block_elems());
            let w = gpu
                .tensor_from_bytes(
                    "w",
                    &[n, k],
                    dtype,
                    Layout::Blocks,
                    &bytes,
                    Category::Weights,
                )
                .unwrap();
            for batch in [1usize, 4] {
                let x = gpu
                    .tensor("x", &[batch, k], DType::F32, Category::Activations)
                    .unwrap();
                let o = gpu
                    .tensor("o", &[batch, n], DType::F32, Category::Activations)
                    .unwrap();
                let tunings: &[(u32, u32, bool)] = if batch == 1 && (dtype == DType::Q4_0 || !quick)
                {
                    &[
                        (1, 1, true),
                        (1, 2, true),
                        (1, 4, true),
                        (2, 1, true),
                        (2, 2, true),
                        (1, 0, false),
                    ]
                } else {
                    &[(1, 0, true)]
                };
                for &(rpt, cps, trusted) in tunings {
                    let t = QuantTuning {
                        rows_per_team: rpt,
                        chunks_per_step: cps,
                        trusted,
                        dp4a: false,
                        row_groups: 0,
                        prefetch: false,
                        k_teams: 0,
                        x_vec4: false,
                        k_workgroups: 1,
                    };
                    let ds =
                        matvec_quant_tuned(gpu, &w, &x, &o, &MatvecOptions::default(), t).unwrap();
                    let (us, gbs) = time(&ds, reps);
                    let chk = if trusted { "" } else { " checked" };
                    println!(
                        "matvec {dtype:<6?}  {n:>6}x{k:<6} b{batch} r{rpt}u{cps}{chk:8} {us:9.1} us {gbs:8.1} GB/s"
                    );
                }
            }
            if !quick && gpu.caps.f16 {
                let o = gpu
                    .tensor("deq", &[n, k], DType::F16, Category::Activations)
                    .unwrap();
                let (us, gbs) = time(&[dequantize(gpu, &w, &o).unwrap()], reps.min(10));
                println!(
                    "dequant {dtype:<6?} {n:>6}x{k:<6} -> f16      {us:9.1} us {gbs:8.1} GB/s"
                );
            }
        }
    }
}
