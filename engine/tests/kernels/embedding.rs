use crate::common::run_checks;
use drift_engine::selftest::embedding;

#[test]
fn embedding_matches_reference() {
    run_checks(embedding::checks);
}

/// Kernel timings on the device (run on the H200 with `--ignored --nocapture`).
#[test]
#[ignore]
fn embedding_bench() {
    use crate::common::gpu;
    use crate::norm::{bench, t, t_rand};
    use drift_engine::DType;
    use drift_engine::kernels::embedding::{EmbeddingOptions, embedding};
    let g = gpu();
    let table = t(g, &[128256, 4096], DType::F16);
    for n in [1, 512, 4096] {
        let ids = t_rand(g, &[n], DType::U32, 128256);
        let out = t(g, &[n, 4096], DType::F32);
        bench(
            &format!("embedding 128256x4096 f16 -> [{n}, 4096] f32"),
            20,
            || embedding(g, &table, &ids, &out, &EmbeddingOptions::default()),
        );
        let opts = EmbeddingOptions {
            max_binding: Some(256 << 20),
        };
        bench(
            &format!("embedding ... in 256 MiB shards, [{n}]"),
            20,
            || embedding(g, &table, &ids, &out, &opts),
        );
    }
}
