//! Offline shader checks: every specialisation of a kernel that lavapipe cannot run (cooperative
//! matrices, other subgroup sizes) is parsed, validated and written as SPIR-V on the CPU.

use drift_engine::kernels::preprocess;

/// Every define combination of a shader: `fixed` as given, each name in `flags` 0 and 1.
pub fn combos(
    fixed: &[(&'static str, &str)],
    flags: &[&'static str],
) -> Vec<Vec<(&'static str, String)>> {
    (0..1u32 << flags.len())
        .map(|bits| {
            let mut d: Vec<(&'static str, String)> =
                fixed.iter().map(|&(k, v)| (k, v.to_string())).collect();
            d.extend(
                flags
                    .iter()
                    .enumerate()
                    .map(|(i, &f)| (f, ((bits >> i) & 1).to_string())),
            );
            d
        })
        .collect()
}

/// Preprocesses, validates with every capability (cooperative matrix, f16, subgroups) and writes
/// SPIR-V 1.6 with the bounds-check policies wgpu uses on Vulkan. The writer step matters: some
/// naga bugs only show there (panics on uncached expressions in cooperative loads).
pub fn to_spirv(name: &str, source: &str, defines: &[(&'static str, String)]) -> Vec<u32> {
    let src = preprocess(source, defines).unwrap_or_else(|e| panic!("{name} {defines:?}: {e}"));
    let module = naga::front::wgsl::parse_str(&src)
        .unwrap_or_else(|e| panic!("{name} {defines:?}: {}", e.emit_to_string(&src)));
    let mut validator = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    );
    let info = validator
        .validate(&module)
        .unwrap_or_else(|e| panic!("{name} {defines:?}: {}", e.emit_to_string(&src)));
    let options = naga::back::spv::Options {
        lang_version: (1, 6),
        bounds_check_policies: naga::proc::BoundsCheckPolicies {
            index: naga::proc::BoundsCheckPolicy::Restrict,
            buffer: naga::proc::BoundsCheckPolicy::Unchecked,
            image_load: naga::proc::BoundsCheckPolicy::Unchecked,
            binding_array: naga::proc::BoundsCheckPolicy::Unchecked,
        },
        ..Default::default()
    };
    let result =
        std::panic::catch_unwind(|| naga::back::spv::write_vec(&module, &info, &options, None));
    match result {
        Ok(Ok(words)) => words,
        Ok(Err(e)) => panic!("{name} {defines:?}: SPIR-V writer: {e}"),
        Err(_) => panic!("{name} {defines:?}: SPIR-V writer panicked"),
    }
}

/// The defines of a paired-row epilogue after the norm prologue (f32 norm weight, f16 caches): GLU with
/// an f32 bias at binding 4 and the norm weight at 5, or RoPE with the norm weight at 4 and the caches,
/// step and turns at 5..8. The pairing style (INTERLEAVED) is left to the caller's flags.
pub fn paired_defines(glu: bool) -> Vec<(&'static str, String)> {
    let b = |v: bool| if v { "1" } else { "0" }.to_string();
    let mut d = vec![
        ("NORM", "1".to_string()),
        ("NORM_B", if glu { "5" } else { "4" }.into()),
        ("TG", "f32".into()),
        ("BIAS", b(glu)),
        ("TB", "f32".into()),
        ("GLU", b(glu)),
        ("ROPE", b(!glu)),
        ("PAIRS", "1".into()),
        ("TC", "f16".into()),
    ];
    for (name, binding) in [("KC_B", 5), ("VC_B", 6), ("STEP_B", 7), ("TURNS_B", 8)] {
        d.push((name, binding.to_string()));
    }
    d
}

/// For kernels whose cooperative loads read workgroup arrays of vec4<f16> (a type only 8-byte
/// aligned): every workgroup variable's size must be a multiple of 16 bytes, so that each array starts
/// on 16 bytes however the driver orders them (from a 16-byte base, each at its natural alignment).
/// NVIDIA's matrix loads drop the low address bits: a tile 8 bytes off is read 4 elements early (see
/// `attention_coop_tiles_start_on_16_bytes`).
pub fn assert_workgroup_sizes_on_16(name: &str, source: &str, defines: &[(&'static str, String)]) {
    let src = preprocess(source, defines).unwrap_or_else(|e| panic!("{name} {defines:?}: {e}"));
    let module = naga::front::wgsl::parse_str(&src)
        .unwrap_or_else(|e| panic!("{name} {defines:?}: {}", e.emit_to_string(&src)));
    let mut layouter = naga::proc::Layouter::default();
    layouter.update(module.to_ctx()).unwrap();
    for (_, g) in module.global_variables.iter() {
        if g.space == naga::AddressSpace::WorkGroup {
            let size = layouter[g.ty].size;
            assert_eq!(
                size % 16,
                0,
                "{name} {defines:?}: {:?} is {size} bytes",
                g.name
            );
        }
    }
}
