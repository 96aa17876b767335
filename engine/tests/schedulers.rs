//! Schedulers against diffusers fixtures (engine/tests/fixtures/make_scheduler_fixtures.py) and
//! Drift's seeded noise (known answers, statistics, reproducibility).
//!
//! Tolerances: timesteps 1e-6 relative (diffusers stores them as f32); sigmas, init_noise_sigma and
//! scale factors 1e-5 relative; alphas_cumprod 1e-6 relative (absolute below 1e-3: zero-terminal-SNR's
//! tail of tiny values is an f32 cancellation in diffusers too); every step's latents and img2img's
//! add_noise within 1e-5 of the tensor's largest magnitude, plus 1e-6 of the input sample's largest
//! magnitude: diffusers steps in f32, Drift in f64, and where the input is far larger than the output
//! (zero-terminal-SNR's first step from sigma 4096) diffusers' own f32 rounding of the input dominates
//! (evaluating its formula in f64 gives Drift's result).

use std::path::PathBuf;

use drift_engine::diffusion::noise::{self, Noise};
use drift_engine::diffusion::schedulers::{Scheduler, SchedulerConfig, SchedulerKind};
use serde_json::Value;

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/schedulers")
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number"))
        .collect()
}

fn floats32(v: &Value) -> Vec<f32> {
    floats(v).into_iter().map(|x| x as f32).collect()
}

fn kind_of(name: &str) -> SchedulerKind {
    match name {
        "euler" => SchedulerKind::Euler,
        "euler_a" => SchedulerKind::EulerAncestral,
        "ddim" => SchedulerKind::Ddim,
        "dpmpp_2m" => SchedulerKind::DpmPp2m,
        "dpmpp_2m_karras" => SchedulerKind::DpmPp2mKarras,
        "lcm" => SchedulerKind::Lcm,
        _ => panic!("unknown scheduler {name}"),
    }
}

/// Largest |a - b| / max(|b|, floor).
fn max_rel(got: &[f64], want: &[f64], floor: f64) -> f64 {
    assert_eq!(got.len(), want.len(), "lengths");
    got.iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs() / w.abs().max(floor))
        .fold(0.0, f64::max)
}

fn max_abs(x: &[f32]) -> f64 {
    x.iter().fold(0.0f64, |m, &w| m.max((w as f64).abs()))
}

/// max |a - b| / max |b|.
fn tensor_err(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len(), "lengths");
    let scale = max_abs(want).max(1e-30);
    got.iter()
        .zip(want)
        .map(|(&g, &w)| (g as f64 - w as f64).abs())
        .fold(0.0, f64::max)
        / scale
}

#[derive(Default)]
struct Worst {
    timesteps: f64,
    sigmas: f64,
    scalars: f64,
    alphas: f64,
    steps: f64,
    /// Worst step error where the input is not much larger than the output.
    steps_plain: f64,
    checked: usize,
}

fn check_fixture(name: &str, worst: &mut Worst) {
    let path = fixture_dir().join(format!("{name}.json"));
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let config = SchedulerConfig::from_json(&doc["config"].to_string()).unwrap();
    let inputs = &doc["inputs"];
    let sample0 = floats32(&inputs["sample0"]);
    let image = floats32(&inputs["image"]);
    let model_outputs: Vec<Vec<f32>> = inputs["model_outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(floats32)
        .collect();
    let noises: Vec<Vec<f32>> = inputs["noises"]
        .as_array()
        .unwrap()
        .iter()
        .map(floats32)
        .collect();
    let want_ac = floats(&doc["alphas_cumprod"]);

    for case in doc["cases"].as_array().unwrap() {
        let kind = kind_of(case["scheduler"].as_str().unwrap());
        let steps = case["steps"].as_u64().unwrap() as usize;
        let strength = case["strength"].as_f64().unwrap();
        let what = format!("{name}/{kind}/{steps} steps/strength {strength}");
        let mut s = Scheduler::new(kind, &config, steps).unwrap_or_else(|e| panic!("{what}: {e}"));

        if matches!(kind, SchedulerKind::Ddim) {
            let e = max_rel(s.alphas_cumprod(), &want_ac, 1e-3);
            assert!(e <= 1e-6, "{what}: alphas_cumprod rel err {e:e}");
            worst.alphas = worst.alphas.max(e);
        }
        let want_t = floats(&case["timesteps"]);
        let e = max_rel(s.timesteps(), &want_t, 1.0);
        assert!(
            e <= 1e-6,
            "{what}: timesteps {:?} vs {want_t:?}",
            s.timesteps()
        );
        worst.timesteps = worst.timesteps.max(e);
        if let Some(sig) = case["sigmas"].as_array() {
            let want: Vec<f64> = sig.iter().map(|x| x.as_f64().unwrap()).collect();
            let e = max_rel(s.sigmas(), &want, 1e-3);
            assert!(
                e <= 1e-5,
                "{what}: sigmas rel err {e:e}: {:?} vs {want:?}",
                s.sigmas()
            );
            worst.sigmas = worst.sigmas.max(e);
        }
        let want_ins = case["init_noise_sigma"].as_f64().unwrap();
        let e = (s.init_noise_sigma() - want_ins).abs() / want_ins;
        assert!(
            e <= 1e-5,
            "{what}: init_noise_sigma {} vs {want_ins}",
            s.init_noise_sigma()
        );
        worst.scalars = worst.scalars.max(e);

        let start = case["start"].as_u64().unwrap() as usize;
        assert_eq!(s.start_step(strength), start, "{what}: start step");
        let initial = floats32(&case["initial"]);
        let got_initial: Vec<f32> = if start == 0 {
            sample0
                .iter()
                .map(|&x| (x as f64 * s.init_noise_sigma()) as f32)
                .collect()
        } else {
            s.add_noise(start, &image, &sample0).unwrap()
        };
        let e = tensor_err(&got_initial, &initial);
        assert!(e <= 1e-5, "{what}: initial latents err {e:e}");
        worst.steps = worst.steps.max(e);

        let scales = floats(&case["scales"]);
        let mut sample = initial;
        for (j, want) in case["outputs"].as_array().unwrap().iter().enumerate() {
            let k = start + j;
            let scale = s.scale_model_input(k) as f64;
            let e = (scale - scales[j]).abs() / scales[j];
            assert!(e <= 1e-5, "{what}: step {k} scale {scale} vs {}", scales[j]);
            worst.scalars = worst.scalars.max(e);
            let noise = s.needs_noise(k).then(|| noises[j].as_slice());
            let got = s.step(k, &model_outputs[j], &sample, noise).unwrap();
            let want = floats32(want);
            let e = tensor_err(&got, &want);
            let tol = 1e-5 + 1e-6 * max_abs(&sample) / max_abs(&want);
            assert!(e <= tol, "{what}: step {k} err {e:e} > {tol:e}");
            worst.steps = worst.steps.max(e);
            if tol < 2e-5 {
                worst.steps_plain = worst.steps_plain.max(e);
            }
            worst.checked += 1;
            sample = want;
        }
    }
}

const FIXTURES: [&str; 6] = [
    "sd15",
    "sd15_leading",
    "v_trailing",
    "linear_linspace",
    "v_trailing_zsnr",
    "karras_sigma_min",
];

#[test]
fn schedulers_match_diffusers() {
    let mut worst = Worst::default();
    for name in FIXTURES {
        check_fixture(name, &mut worst);
    }
    println!(
        "schedulers vs diffusers: {} steps checked; max rel err timesteps {:.2e}, sigmas {:.2e}, \
         init sigma/scales {:.2e}, alphas_cumprod {:.2e}, latents (of max |x|) {:.2e} \
         ({:.2e} where the input is not >10x the output)",
        worst.checked,
        worst.timesteps,
        worst.sigmas,
        worst.scalars,
        worst.alphas,
        worst.steps,
        worst.steps_plain
    );
}

#[test]
fn scheduler_errors_and_kinds() {
    let config = SchedulerConfig::from_json(r#"{"beta_schedule": "scaled_linear"}"#).unwrap();
    for kind in SchedulerKind::ALL {
        assert_eq!(SchedulerKind::parse(kind.name()).unwrap(), kind);
        assert_eq!(SchedulerKind::parse(kind.a1111_name()).unwrap(), kind);
        let mut s = Scheduler::new(kind, &config, 10).unwrap();
        assert_eq!(s.timesteps().len(), 10);
        assert_eq!(s.sigmas().len(), 11);
        assert_eq!(s.start_step(1.0), 0);
        assert_eq!(s.start_step(0.0), 10);
        assert!(s.step(10, &[0.0; 4], &[0.0; 4], Some(&[0.0; 4])).is_err());
        assert!(s.step(0, &[0.0; 3], &[0.0; 4], Some(&[0.0; 4])).is_err());
        if s.needs_noise(0) {
            assert!(s.step(0, &[0.0; 4], &[0.0; 4], None).is_err());
        }
        assert!(Scheduler::new(kind, &config, 0).is_err());
    }
    assert!(SchedulerKind::parse("pndm").is_err());
    let bad = SchedulerConfig::from_json(r#"{"prediction_type": "flow"}"#).unwrap();
    assert!(Scheduler::new(SchedulerKind::Euler, &bad, 20).is_err());
    let bad = SchedulerConfig::from_json(r#"{"beta_schedule": "sigmoid"}"#).unwrap();
    assert!(Scheduler::new(SchedulerKind::Ddim, &bad, 20).is_err());
    // LCM cannot take more steps than its distillation schedule.
    assert!(Scheduler::new(SchedulerKind::Lcm, &config, 51).is_err());
}

/// A full 20-step Euler run from Drift noise on a toy "model" that predicts the noise exactly
/// recovers the clean latents; the same for DDIM and DPM++ 2M Karras.
/// (A check independent of diffusers: it follows from the update rules themselves.)
#[test]
fn exact_noise_prediction_recovers_clean_latents() {
    let config = SchedulerConfig::from_json(
        r#"{"beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear",
            "steps_offset": 1, "set_alpha_to_one": false, "clip_sample": false}"#,
    )
    .unwrap();
    let n = 64;
    let clean: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.37).sin() * 0.8).collect();
    let z = Noise::new(7).latents(n);
    for kind in [
        SchedulerKind::Euler,
        SchedulerKind::Ddim,
        SchedulerKind::DpmPp2mKarras,
    ] {
        let mut s = Scheduler::new(kind, &config, 20).unwrap();
        let mut x = s.add_noise(0, &clean, &z).unwrap();
        for k in 0..s.num_steps() {
            // eps = (x_t - sqrt(a) x0) / sqrt(1 - a) in each scheduler's own parametrisation is the
            // noise itself when x_t = clean + noise at that level, which every step keeps.
            let sigma = s.sigmas()[k];
            let eps: Vec<f32> = match kind {
                SchedulerKind::Euler => x
                    .iter()
                    .zip(&clean)
                    .map(|(&a, &c)| ((a - c) as f64 / sigma) as f32)
                    .collect(),
                _ => {
                    let alpha = 1.0 / (sigma * sigma + 1.0).sqrt();
                    x.iter()
                        .zip(&clean)
                        .map(|(&a, &c)| ((a as f64 - alpha * c as f64) / (sigma * alpha)) as f32)
                        .collect()
                }
            };
            x = s.step(k, &eps, &x, None).unwrap();
        }
        // DDIM without set_alpha_to_one stops at t = 0's noise level, not at sigma 0.
        let want: Vec<f32> = if kind == SchedulerKind::Ddim {
            let a0 = s.alphas_cumprod()[0];
            clean
                .iter()
                .zip(&z)
                .map(|(&c, &n)| (a0.sqrt() * c as f64 + (1.0 - a0).sqrt() * n as f64) as f32)
                .collect()
        } else {
            clean.clone()
        };
        let err = tensor_err(&x, &want);
        println!("{kind}: exact-eps run ends {err:.2e} from the clean latents");
        assert!(err < 1e-3, "{kind}: {err}");
    }
}

#[test]
fn philox_known_answers() {
    // Random123 tests/kat_vectors, the three "philox4x32 10" lines: counter, key, expected.
    let kat: [([u32; 4], [u32; 2], [u32; 4]); 3] = [
        (
            [0; 4],
            [0; 2],
            [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8],
        ),
        (
            [u32::MAX; 4],
            [u32::MAX; 2],
            [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd],
        ),
        (
            [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
            [0xa4093822, 0x299f31d0],
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1],
        ),
    ];
    for (ctr, key, want) in kat {
        assert_eq!(noise::philox4x32_10(ctr, key), want);
    }
}

/// The documented recipe evaluated with the platform's libm (std f64 ln/sin/cos) gives the same
/// f32 values as Drift's own ln/sincos.
#[test]
fn noise_follows_documented_recipe() {
    let seed = 0x0123_4567_89ab_cdefu64;
    let stream = 3u64;
    let n = 1 << 16;
    let got = noise::gaussian_vec(seed, stream, n);
    let mut mismatches = 0;
    let mut max_ulps = 0i64;
    for (i, &g) in got.iter().enumerate() {
        let b = (i / 4) as u64;
        let x = noise::philox4x32_10(
            [
                b as u32,
                (b >> 32) as u32,
                stream as u32,
                (stream >> 32) as u32,
            ],
            [seed as u32, (seed >> 32) as u32],
        );
        let p = (i % 4) & 2;
        let u1 = (x[p] as f64 + 0.5) / 4_294_967_296.0;
        let u2 = (x[p + 1] as f64 + 0.5) / 4_294_967_296.0;
        let r = (-2.0 * u1.ln()).sqrt();
        let theta = 2.0 * std::f64::consts::PI * u2;
        let want = (if i % 2 == 0 {
            r * theta.cos()
        } else {
            r * theta.sin()
        }) as f32;
        if want != g {
            mismatches += 1;
            max_ulps = max_ulps.max((want.to_bits() as i64 - g.to_bits() as i64).abs());
        }
    }
    println!("noise vs libm Box-Muller: {mismatches} of {n} differ (max {max_ulps} ulp)");
    // Only values on an f32 rounding boundary can differ, by one ulp.
    assert!(
        mismatches <= 2 && max_ulps <= 1,
        "{mismatches} mismatches, {max_ulps} ulp"
    );
}

#[test]
fn noise_is_reproducible_and_counter_based() {
    let a = Noise::new(42).latents(4 * 64 * 64);
    let b = Noise::new(42).latents(4 * 64 * 64);
    assert_eq!(a, b);
    // Any slice can be produced on its own, from any offset.
    for (offset, len) in [(0usize, 1usize), (1, 6), (3, 9), (1001, 37), (16383, 1)] {
        let mut part = vec![0.0f32; len];
        noise::fill_gaussian(42, noise::LATENT_STREAM, offset as u64, &mut part);
        assert_eq!(part, a[offset..offset + len], "offset {offset}");
        assert_eq!(noise::gaussian(42, 0, offset as u64), a[offset]);
    }
    // Seeds and streams are independent.
    assert_ne!(Noise::new(43).latents(16), a[..16]);
    assert_ne!(Noise::new(42).step(0, 16), a[..16]);
    assert_ne!(Noise::new(42).step(1, 16), Noise::new(42).step(0, 16));
    assert_eq!(
        Noise::new(42).step(5, 16),
        noise::gaussian_vec(42, noise::step_stream(5), 16)
    );
    // Pinned values: Drift noise v1 must never change silently (bump NOISE_VERSION if it must).
    assert_eq!(noise::NOISE_VERSION, 1);
    let pinned: Vec<u32> = noise::gaussian_vec(0, 0, 6)
        .iter()
        .map(|v| v.to_bits())
        .collect();
    println!(
        "seed 0 stream 0: {:?} = {:x?}",
        noise::gaussian_vec(0, 0, 6),
        pinned
    );
    assert_eq!(pinned, PINNED_SEED0);
}

// 0.9911377, -0.9246626, -0.61760896, -0.4820686, -0.15363823, 0.1808259
const PINNED_SEED0: [u32; 6] = [
    0x3f7dbb33, 0xbf6cb6b0, 0xbf1e1b9f, 0xbef6d1b2, 0xbe1d5357, 0x3e392a6d,
];

#[test]
fn noise_statistics() {
    let n = 1 << 20;
    let z = Noise::new(20261129).latents(n);
    let mean = z.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
    let var = z.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n as f64;
    let kurt = z.iter().map(|&v| (v as f64 - mean).powi(4)).sum::<f64>() / n as f64 / (var * var);
    let tail = z.iter().filter(|v| v.abs() > 3.0).count() as f64 / n as f64;
    // Lag-1 correlation (catches the two halves of a Box-Muller pair being related).
    let lag1 = z.windows(2).map(|w| w[0] as f64 * w[1] as f64).sum::<f64>() / (n - 1) as f64;
    println!(
        "noise: mean {mean:.2e} var {var:.5} kurtosis {kurt:.4} P(|z|>3) {tail:.5} lag1 {lag1:.2e}"
    );
    let se = 1.0 / (n as f64).sqrt();
    assert!(mean.abs() < 5.0 * se, "mean {mean}");
    assert!((var - 1.0).abs() < 5.0 * 2f64.sqrt() * se, "variance {var}");
    assert!((kurt - 3.0).abs() < 0.05, "kurtosis {kurt}");
    assert!((tail - 0.0026998).abs() < 0.0004, "tail {tail}");
    assert!(lag1.abs() < 5.0 * se, "lag-1 correlation {lag1}");
}
