//! Fidelity of Stable Diffusion's UNet and VAE against diffusers (f64 references from
//! tests/fixtures/make_unet_vae_fixtures.py): two tiny random UNets (one SD-1.x shaped, one with
//! channel counts off the usual multiples, a head count per level, two layers per block and linear
//! projections), a tiny VAE (decode and encode), the same weights read from a single-file LDM
//! checkpoint, the GEGLU kernel, and the memory plan of SD 1.5 at 512x512.
//!
//! Tolerances are relative L2 errors per output tensor: 1e-4 in f32 (the GPU's f32 arithmetic and
//! its erf approximation against f64), 3e-2 in f16 (activations rounded to 11 bits through ~40 ops).

use std::path::PathBuf;
use std::sync::OnceLock;

use drift_engine::formats::safetensors::SafetensorsSet;
use drift_engine::kernels::geglu::geglu;
use drift_engine::memory::Category;
use drift_engine::models::sd_weights::SdWeightSource;
use drift_engine::models::unet::{Unet, UnetConfig, sd15_config, unet_memory_plan};
use drift_engine::models::vae::{VaeConfig, VaeNet, decoder_memory_plan, moments_mean};
use drift_engine::{DType, Gpu, GpuOptions, Program};

fn gpu() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| Gpu::new(&GpuOptions::from_env()).expect("a Vulkan device"))
}

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sd")
}

fn reference() -> &'static SafetensorsSet {
    static R: OnceLock<SafetensorsSet> = OnceLock::new();
    R.get_or_init(|| SafetensorsSet::open(&dir().join("reference.safetensors")).unwrap())
}

fn r(name: &str) -> Vec<f32> {
    reference().get(name).unwrap().to_f32().unwrap()
}

fn rel_err(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let (mut num, mut den) = (0f64, 0f64);
    for (&g, &w) in got.iter().zip(want) {
        assert!(g.is_finite(), "non-finite output");
        num += (g as f64 - w as f64).powi(2);
        den += (w as f64).powi(2);
    }
    (num / den.max(1e-30)).sqrt()
}

fn tol(dtype: DType) -> f64 {
    if dtype == DType::F16 { 3e-2 } else { 1e-4 }
}

fn dtypes() -> Vec<DType> {
    let mut v = vec![DType::F32];
    if gpu().caps.f16 {
        v.push(DType::F16);
    }
    v
}

fn unet_config(name: &str) -> UnetConfig {
    UnetConfig::from_json(&std::fs::read_to_string(dir().join(name).join("config.json")).unwrap())
        .unwrap()
}

fn vae_config() -> VaeConfig {
    VaeConfig::from_json(&std::fs::read_to_string(dir().join("vae/config.json")).unwrap()).unwrap()
}

fn run_unet(tag: &str, source: &SdWeightSource, dtype: DType) -> Vec<f32> {
    let cfg = unet_config(&format!("unet_{tag}"));
    let lat_shape = reference()
        .get(&format!("unet_{tag}.latents"))
        .unwrap()
        .shape
        .to_vec();
    let enc_shape = reference()
        .get(&format!("unet_{tag}.encoder"))
        .unwrap()
        .shape
        .to_vec();
    let unet = Unet::new(
        gpu(),
        cfg,
        source,
        lat_shape[0],
        lat_shape[2],
        lat_shape[3],
        enc_shape[1],
        dtype,
    )
    .unwrap();
    gpu().poison(unet.output().unwrap()).unwrap();
    let t = r(&format!("unet_{tag}.timestep"))[0];
    unet.set_encoder_states(gpu(), &r(&format!("unet_{tag}.encoder")))
        .unwrap();
    unet.forward(gpu(), &r(&format!("unet_{tag}.latents")), t)
        .unwrap()
}

fn check_unet_folder(tag: &str) {
    let source = SdWeightSource::diffusers(&dir().join(format!("unet_{tag}")), true).unwrap();
    let want = r(&format!("unet_{tag}.out"));
    for dtype in dtypes() {
        let got = run_unet(tag, &source, dtype);
        let e = rel_err(&got, &want);
        println!("unet_{tag} {dtype:?}: relative error {e:.3e}");
        assert!(
            e < tol(dtype),
            "unet_{tag} {dtype:?}: relative error {e:.3e} over {:.0e}",
            tol(dtype)
        );
    }
}

#[test]
fn unet_a_matches_diffusers() {
    check_unet_folder("a");
}

#[test]
fn unet_b_odd_channels_heads_linear_proj_matches_diffusers() {
    check_unet_folder("b");
}

fn decode(source: &SdWeightSource, dtype: DType) -> Vec<f32> {
    let cfg = vae_config();
    let s = reference().get("vae.latents").unwrap().shape.to_vec();
    let dec = VaeNet::decoder(gpu(), &cfg, source, s[0], s[2], s[3], dtype).unwrap();
    gpu().poison(dec.output().unwrap()).unwrap();
    dec.run(gpu(), &r("vae.latents")).unwrap()
}

fn encode(source: &SdWeightSource, dtype: DType) -> Vec<f32> {
    let cfg = vae_config();
    let s = reference().get("vae.image").unwrap().shape.to_vec();
    let enc = VaeNet::encoder(gpu(), &cfg, source, s[0], s[2], s[3], dtype).unwrap();
    gpu().poison(enc.output().unwrap()).unwrap();
    moments_mean(&enc.run(gpu(), &r("vae.image")).unwrap(), s[0])
}

#[test]
fn vae_decoder_and_encoder_match_diffusers() {
    let source = SdWeightSource::diffusers(&dir().join("vae"), true).unwrap();
    assert!((vae_config().scaling_factor - 0.18215).abs() < 1e-7);
    for dtype in dtypes() {
        let e = rel_err(&decode(&source, dtype), &r("vae.decoded"));
        println!("vae decode {dtype:?}: relative error {e:.3e}");
        assert!(e < tol(dtype), "vae decode {dtype:?}: {e:.3e}");
        let e = rel_err(&encode(&source, dtype), &r("vae.mean"));
        println!("vae encode (mean) {dtype:?}: relative error {e:.3e}");
        assert!(e < tol(dtype), "vae encode {dtype:?}: {e:.3e}");
    }
}

#[test]
fn single_file_ldm_checkpoint_loads_to_the_same_outputs() {
    let path = dir().join("ldm_a.safetensors");
    let folder_unet = SdWeightSource::diffusers(&dir().join("unet_a"), true).unwrap();
    let file_unet = SdWeightSource::single_file(&path, unet_config("unet_a").ldm_part()).unwrap();
    let a = run_unet("a", &folder_unet, DType::F32);
    let b = run_unet("a", &file_unet, DType::F32);
    assert_eq!(a, b, "unet from the single file differs from the folder");
    assert!(rel_err(&b, &r("unet_a.out")) < 1e-4);

    let folder_vae = SdWeightSource::diffusers(&dir().join("vae"), true).unwrap();
    let file_vae = SdWeightSource::single_file(&path, vae_config().ldm_part()).unwrap();
    assert_eq!(
        decode(&folder_vae, DType::F32),
        decode(&file_vae, DType::F32)
    );
    assert_eq!(
        encode(&folder_vae, DType::F32),
        encode(&file_vae, DType::F32)
    );
    assert!(rel_err(&decode(&file_vae, DType::F32), &r("vae.decoded")) < 1e-4);
}

#[test]
fn pickle_checkpoints_are_refused() {
    let e =
        SdWeightSource::single_file(std::path::Path::new("model.ckpt"), vae_config().ldm_part());
    let msg = e.err().expect("a .ckpt must be refused").to_string();
    assert!(
        msg.contains("pickle") && msg.contains("safetensors"),
        "{msg}"
    );
}

/// GEGLU against an f64 CPU reference: odd and vec4 widths, a view at a non-zero element offset.
#[test]
fn geglu_kernel() {
    let gpu = gpu();
    let gelu = |x: f64| 0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2));
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 11) as f64 / (1u64 << 53) as f64 * 6.0 - 3.0
    };
    for dtype in dtypes() {
        for (rows, inner, offset) in [(7, 13, 0), (33, 40, 0), (5, 24, 4), (3, 9, 3)] {
            let vals: Vec<f32> = (0..offset + rows * 2 * inner)
                .map(|_| rnd() as f32)
                .collect();
            let vals: Vec<f32> = drift_engine::gpu::decode_f32(
                &drift_engine::gpu::encode_f32(&vals, dtype).unwrap(),
                dtype,
            )
            .unwrap();
            let all = gpu
                .tensor_from_f32(
                    "geglu x",
                    &[vals.len()],
                    dtype,
                    &vals,
                    Category::Activations,
                )
                .unwrap();
            let x = all.view(offset, &[rows, 2 * inner]).unwrap();
            let out = gpu
                .tensor("geglu out", &[rows, inner], dtype, Category::Activations)
                .unwrap();
            gpu.poison(&out).unwrap();
            let mut p = Program::new();
            p.push(geglu(gpu, &x, &out).unwrap());
            p.run(gpu).unwrap();
            let got = gpu.read_f32(&out).unwrap();
            let mut max = 0f64;
            for t in 0..rows {
                for i in 0..inner {
                    let h = vals[offset + t * 2 * inner + i] as f64;
                    let g = vals[offset + t * 2 * inner + inner + i] as f64;
                    let want = h * gelu(g);
                    let err = (got[t * inner + i] as f64 - want).abs() / (1.0 + want.abs());
                    max = max.max(err);
                }
            }
            let limit = if dtype == DType::F16 { 2e-3 } else { 1e-5 };
            println!("geglu {dtype:?} [{rows}, {inner}] offset {offset}: max error {max:.2e}");
            assert!(
                max < limit,
                "geglu {dtype:?} [{rows}, {inner}] offset {offset}: {max:.2e}"
            );
        }
    }
    // A wrong shape is an error, not a panic.
    let x = gpu
        .tensor("x", &[4, 10], DType::F32, Category::Activations)
        .unwrap();
    let out = gpu
        .tensor("o", &[4, 4], DType::F32, Category::Activations)
        .unwrap();
    assert!(geglu(gpu, &x, &out).is_err());
}

/// erf by its Taylor series: exact to ~1e-15 for the |x| < 2.2 this test feeds it.
fn erf(x: f64) -> f64 {
    let (mut sum, mut term) = (0f64, x);
    for n in 0..80 {
        sum += term / (2 * n + 1) as f64;
        term *= -x * x / (n + 1) as f64;
    }
    2.0 / std::f64::consts::PI.sqrt() * sum
}

/// SD 1.5 at 512x512, batch 2 (CFG), f16: the UNet's and the VAE decoder's activations planned
/// into one arena each by greedy-by-size, against one buffer per intermediate.
#[test]
fn sd15_memory_plan() {
    let u = unet_memory_plan(&sd15_config(), 2, 64, 64, 77, DType::F16).unwrap();
    let v = decoder_memory_plan(&VaeConfig::sd15(), 1, 64, 64, DType::F16).unwrap();
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "SD 1.5 512x512 f16: UNet (batch 2) {} ops, naive {:.1} MiB -> planned {:.1} MiB (largest {:.1} MiB, conv \
         split-K scratch {:.1} MiB); VAE decoder {} ops, naive {:.1} MiB -> planned {:.1} MiB (largest {:.1} MiB)",
        u.ops,
        mib(u.naive_bytes),
        mib(u.planned_bytes),
        mib(u.largest_bytes),
        mib(u.conv_scratch_bytes),
        v.ops,
        mib(v.naive_bytes),
        mib(v.planned_bytes),
        mib(v.largest_bytes)
    );
    assert!(u.planned_bytes * 5 < u.naive_bytes);
    assert!(v.planned_bytes * 3 < v.naive_bytes);
    assert!(u.planned_bytes >= u.largest_bytes);
}
