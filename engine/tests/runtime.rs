//! The runtime pieces under the kernels: device adoption, tensors and views, memory accounting, the
//! arena planner, the kernel cache, programs and the profiler. Runs on lavapipe in CI.

use std::sync::OnceLock;

use drift_engine::kernels::KernelSpec;
use drift_engine::kernels::elementwise::{BinaryOp, binary};
use drift_engine::memory::{Lifetime, plan_greedy_by_size};
use drift_engine::profiler::Profiler;
use drift_engine::selftest;
use drift_engine::{Category, DType, DriftError, Gpu, GpuOptions, Program};
use rand::Rng;

fn gpu() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| Gpu::new(&GpuOptions::from_env()).expect("a Vulkan device"))
}

#[test]
fn planner_never_overlaps_live_tensors_and_never_exceeds_naive() {
    let (mut rng, seed) = selftest::rng();
    for case in 0..300 {
        let n = rng.random_range(1..60);
        let ops = rng.random_range(1..40);
        let tensors: Vec<Lifetime> = (0..n)
            .map(|_| {
                let first = rng.random_range(0..ops);
                Lifetime {
                    first,
                    last: rng.random_range(first..ops),
                    size: rng.random_range(1..100_000),
                }
            })
            .collect();
        let align = [1u64, 4, 256][case % 3];
        let plan = plan_greedy_by_size(&tensors, align);
        assert!(
            plan.arena_bytes <= plan.naive_bytes,
            "seed {seed} case {case}"
        );
        for (i, a) in tensors.iter().enumerate() {
            let oa = plan.offsets[i];
            assert_eq!(oa % align, 0, "seed {seed}: unaligned offset");
            assert!(
                oa + a.size <= plan.arena_bytes,
                "seed {seed}: tensor outside the arena"
            );
            for (j, b) in tensors.iter().enumerate().skip(i + 1) {
                let ob = plan.offsets[j];
                let space = oa < ob + b.size && ob < oa + a.size;
                assert!(
                    !(a.overlaps(b) && space),
                    "seed {seed} case {case}: tensors {i} and {j} collide"
                );
            }
        }
        // Lower bound: at every op, the live tensors must fit.
        let peak_live = (0..ops)
            .map(|t| {
                tensors
                    .iter()
                    .filter(|l| l.first <= t && t <= l.last)
                    .map(|l| l.size)
                    .sum::<u64>()
            })
            .max()
            .unwrap_or(0);
        assert!(
            plan.arena_bytes >= peak_live,
            "seed {seed}: arena below the live peak"
        );
    }
}

#[test]
fn planner_shares_memory_along_a_chain() {
    // A chain of ops where each output is consumed by the next op only: two buffers suffice.
    let tensors: Vec<Lifetime> = (0..10)
        .map(|i| Lifetime {
            first: i,
            last: i + 1,
            size: 1 << 20,
        })
        .collect();
    let plan = plan_greedy_by_size(&tensors, 256);
    assert_eq!(plan.naive_bytes, 10 << 20);
    assert_eq!(plan.arena_bytes, 2 << 20);
}

#[test]
fn memory_report_counts_categories_and_peak() {
    // A private device so other tests' allocations don't interfere.
    let gpu = Gpu::new(&GpuOptions::from_env()).unwrap();
    let before = gpu.memory_report();
    let w = gpu
        .tensor("w", &[1024], DType::F32, Category::Weights)
        .unwrap();
    let kv = gpu
        .tensor("kv", &[2048], DType::F16, Category::KvCache)
        .unwrap();
    let r = gpu.memory_report();
    assert_eq!(
        r.bytes(Category::Weights) - before.bytes(Category::Weights),
        4096
    );
    assert_eq!(
        r.bytes(Category::KvCache) - before.bytes(Category::KvCache),
        4096
    );
    assert_eq!(r.total_bytes - before.total_bytes, 8192);
    drop(w);
    drop(kv);
    let after = gpu.memory_report();
    assert_eq!(after.total_bytes, before.total_bytes);
    assert!(after.peak_total_bytes >= before.total_bytes + 8192);
}

#[test]
fn out_of_memory_is_an_error_not_a_crash() {
    let gpu = gpu();
    let too_big = gpu.caps.max_buffer_size + 4;
    let err = gpu
        .create_buffer(
            "huge",
            too_big,
            wgpu::BufferUsages::STORAGE,
            Category::Weights,
        )
        .unwrap_err();
    assert!(matches!(err, DriftError::OutOfMemory { .. }), "{err}");
    assert!(err.to_string().contains("huge"));
}

#[test]
fn views_at_unaligned_offsets_feed_kernels_without_copies() {
    let gpu = gpu();
    let (mut rng, seed) = selftest::rng();
    // One buffer holding [pad 3][a: 5x7][pad 1][b: 7][out: 5x7]; none of the views start on a binding boundary.
    let total = 3 + 35 + 1 + 7 + 35;
    let vals = selftest::random(&mut rng, total, -1.0, 1.0, DType::F32);
    let all = gpu
        .tensor_from_f32("arena", &[total], DType::F32, &vals, Category::Activations)
        .unwrap();
    let a = all.view(3, &[5, 7]).unwrap();
    let b = all.view(39, &[7]).unwrap();
    let out = all.view(46, &[5, 7]).unwrap();
    gpu.poison(&out).unwrap();
    let mut p = Program::new();
    p.push(binary(gpu, BinaryOp::Add, &a, &b, &out).unwrap());
    p.run(gpu).unwrap();
    let got = gpu.read_f32(&all).unwrap();
    for r in 0..5 {
        for c in 0..7 {
            let want = vals[3 + r * 7 + c] + vals[39 + c];
            assert_eq!(got[46 + r * 7 + c], want, "seed {seed}: out[{r},{c}]");
        }
    }
    // The bytes outside `out` are untouched.
    assert_eq!(got[..46], vals[..46]);
}

#[test]
fn views_and_shards_check_bounds() {
    let gpu = gpu();
    let t = gpu
        .tensor("t", &[10, 6], DType::F16, Category::Activations)
        .unwrap();
    assert!(t.view(55, &[6]).is_err());
    assert!(t.reshape(&[7, 8]).is_err());
    assert_eq!(t.rows(2, 5).unwrap().storage.offset, 2 * 6 * 2);
    // Shards of at most 256 + 3 rows' bytes: each shard fits the binding limit given.
    let shards = t.row_shards(256 + 3 * 12).unwrap();
    assert_eq!(
        shards.iter().map(|s| s.row_start).collect::<Vec<_>>(),
        vec![0, 3, 6, 9]
    );
    assert_eq!(shards.iter().map(|s| s.tensor.shape[0]).sum::<usize>(), 10);
    assert!(t.row_shards(100).is_err());
    // A weight split over several buffers.
    let bytes: Vec<u8> = (0..10 * 6 * 2).map(|i| i as u8).collect();
    let w = gpu
        .weight_rows(
            "w",
            &[10, 6],
            DType::F16,
            drift_engine::Layout::RowMajor,
            &bytes,
            48,
        )
        .unwrap();
    assert_eq!(w.len(), 3);
    assert_eq!(gpu.read_bytes(&w[1].tensor).unwrap(), bytes[48..96]);
}

#[test]
fn shader_errors_are_reported_with_the_kernel_name() {
    let gpu = gpu();
    let spec = KernelSpec::new("broken_kernel", "fn main( {", "main");
    match gpu.kernel(&spec) {
        Err(DriftError::Shader { name, .. }) => assert_eq!(name, "broken_kernel"),
        other => panic!("expected a shader error, got {other:?}"),
    }
}

#[test]
fn kernels_are_compiled_once_per_specialisation() {
    let gpu = Gpu::new(&GpuOptions::from_env()).unwrap();
    let t = |name| {
        gpu.tensor(name, &[8], DType::F32, Category::Activations)
            .unwrap()
    };
    let (a, b, o) = (t("a"), t("b"), t("o"));
    let before = gpu.kernels().len();
    binary(&gpu, BinaryOp::Add, &a, &b, &o).unwrap();
    binary(&gpu, BinaryOp::Add, &b, &a, &o).unwrap();
    assert_eq!(gpu.kernels().len(), before + 1);
    binary(&gpu, BinaryOp::Mul, &a, &b, &o).unwrap();
    assert_eq!(gpu.kernels().len(), before + 2);
    // In place (inputs and output in one buffer) needs the read_write variant: compiled once too.
    binary(&gpu, BinaryOp::Mul, &a, &b, &a).unwrap();
    binary(&gpu, BinaryOp::Mul, &b, &a, &b).unwrap();
    assert_eq!(gpu.kernels().len(), before + 3);
}

#[test]
fn profiler_times_every_dispatch_and_exports_a_trace() {
    let gpu = gpu();
    let x = gpu
        .tensor("x", &[4096], DType::F32, Category::Activations)
        .unwrap();
    gpu.write_tensor_f32(&x, &vec![1.0; 4096]).unwrap();
    let mut p = Program::new();
    for _ in 0..3 {
        p.push(binary(gpu, BinaryOp::Add, &x, &x, &x).unwrap());
        p.push(binary(gpu, BinaryOp::Mul, &x, &x, &x).unwrap());
    }
    let profile = p.run_profiled(gpu, &mut Profiler::new()).unwrap();
    assert_eq!(profile.dispatches.len(), 6);
    let stats = profile.by_kernel();
    assert_eq!(stats.len(), 2);
    assert!(
        stats
            .iter()
            .all(|s| s.calls == 3 && s.min_us <= s.mean_us && s.mean_us <= s.max_us)
    );
    let trace: serde_json::Value = serde_json::from_str(&profile.chrome_trace_json()).unwrap();
    assert_eq!(trace["traceEvents"].as_array().unwrap().len(), 6);
    // The program really ran: x <- (x + x)^2 three times from 1 gives 4, 64, 16384.
    let v = gpu.read_f32(&x).unwrap();
    assert_eq!(v[0], 16384.0);
    // CPU timing fallback gives the same shape of result.
    let cpu = Gpu::new(&GpuOptions {
        disable: Some("timestamps".into()),
        ..GpuOptions::from_env()
    })
    .unwrap();
    let y = cpu
        .tensor("y", &[64], DType::F32, Category::Activations)
        .unwrap();
    let mut q = Program::new();
    q.push(binary(&cpu, BinaryOp::Add, &y, &y, &y).unwrap());
    let prof = q.run_profiled(&cpu, &mut Profiler::new()).unwrap();
    assert_eq!(prof.source, drift_engine::profiler::TimingSource::Cpu);
    assert_eq!(prof.dispatches.len(), 1);
}

#[test]
fn adopting_a_host_device_shares_it() {
    // What eframe does: the host opens adapter and device with Drift's descriptor; the engine adopts them.
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    desc.backends = wgpu::Backends::PRIMARY;
    let instance = wgpu::Instance::new(desc);
    let adapter = pollster::block_on(instance.request_adapter(&Default::default())).unwrap();
    let (device, queue) =
        pollster::block_on(adapter.request_device(&drift_engine::gpu::device_descriptor(&adapter)))
            .unwrap();
    let gpu = Gpu::adopt(adapter, device.clone(), queue);
    assert_eq!(gpu.device, device);
    let a = gpu
        .tensor_from_f32(
            "a",
            &[3],
            DType::F32,
            &[1.0, 2.0, 3.0],
            Category::Activations,
        )
        .unwrap();
    let o = gpu
        .tensor("o", &[3], DType::F32, Category::Activations)
        .unwrap();
    let mut p = Program::new();
    p.push(binary(&gpu, BinaryOp::Mul, &a, &a, &o).unwrap());
    p.run(&gpu).unwrap();
    assert_eq!(gpu.read_f32(&o).unwrap(), vec![1.0, 4.0, 9.0]);
}
