//! Images for display straight from the GPU: a kernel packs the VAE decoder's output `[3, H, W]` into
//! an RGBA8 texture on the same device, which a UI (egui-wgpu) samples without a CPU round trip.

use std::sync::Arc;

use crate::error::{DriftError, Result};
use crate::gpu::Gpu;
use crate::kernels::{KernelSpec, float_defines};
use crate::memory::{Category, MemoryTracker};
use crate::shader;
use crate::tensor::{DType, Tensor};

/// The texture format the UI samples: egui-wgpu wants gamma-encoded `Rgba8Unorm` for native textures.
pub const DISPLAY_FORMAT: wgpu::TextureFormat = wgpu::TextureFormat::Rgba8Unorm;

/// An RGBA8 texture holding one image, counted in Drift's GPU memory ("other") while it lives.
pub struct DisplayTexture {
    pub texture: wgpu::Texture,
    pub view: wgpu::TextureView,
    pub width: usize,
    pub height: usize,
    memory: Arc<MemoryTracker>,
}

impl DisplayTexture {
    pub fn bytes(&self) -> u64 {
        4 * self.width as u64 * self.height as u64
    }
}

impl Drop for DisplayTexture {
    fn drop(&mut self) {
        self.memory.remove(Category::Other, self.bytes());
    }
}

/// Packs `chw` (`[.., 3, height, width]` with one image, f32 or f16, values in [-1, 1]) into a new
/// texture. The work is submitted, not waited for: later submits on the queue (the UI's) see it done.
pub fn pack_rgba8(gpu: &Gpu, chw: &Tensor, width: usize, height: usize) -> Result<DisplayTexture> {
    if chw.numel() != 3 * width * height || width == 0 || height == 0 {
        return Err(DriftError::Other(format!(
            "display texture: {:?} is not one {width}x{height} RGB image",
            chw.shape
        )));
    }
    if !matches!(chw.dtype, DType::F32 | DType::F16) {
        return Err(DriftError::Other(format!(
            "display texture: {:?} values (f32 or f16 expected)",
            chw.dtype
        )));
    }
    let max = gpu.device.limits().max_texture_dimension_2d as usize;
    if width > max || height > max {
        return Err(DriftError::Other(format!(
            "display texture: {width}x{height} is over the device's {max} pixels per side"
        )));
    }
    let scope = gpu.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
    let texture = gpu.device.create_texture(&wgpu::TextureDescriptor {
        label: Some("drift image"),
        size: wgpu::Extent3d {
            width: width as u32,
            height: height as u32,
            depth_or_array_layers: 1,
        },
        mip_level_count: 1,
        sample_count: 1,
        dimension: wgpu::TextureDimension::D2,
        format: DISPLAY_FORMAT,
        usage: wgpu::TextureUsages::STORAGE_BINDING
            | wgpu::TextureUsages::TEXTURE_BINDING
            | wgpu::TextureUsages::COPY_SRC,
        view_formats: &[],
    });
    if let Some(e) = pollster::block_on(scope.pop()) {
        return Err(DriftError::OutOfMemory {
            what: format!("display texture {width}x{height}: {e}"),
            bytes: 4 * (width * height) as u64,
        });
    }
    let view = texture.create_view(&Default::default());
    let out = DisplayTexture {
        texture,
        view,
        width,
        height,
        memory: gpu.memory().clone(),
    };
    gpu.memory().add(Category::Other, out.bytes());

    let kernel = gpu.kernel(
        &KernelSpec::new("image_pack_rgba8", shader!("image_pack.wgsl"), "pack_rgba8")
            .defines(float_defines(chw.dtype)),
    )?;
    let src = chw.binding(gpu.caps.max_storage_binding)?;
    let mut words = [0u32; 12];
    words[0] = src.base_elems;
    words[8] = width as u32;
    words[9] = height as u32;
    let params = gpu.create_buffer(
        "image_pack params",
        std::mem::size_of_val(&words) as u64,
        wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        Category::Other,
    )?;
    gpu.queue
        .write_buffer(&params.buffer, 0, bytemuck::cast_slice(&words));
    let scope = gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);
    let bind_group = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some("image_pack"),
        layout: &kernel.layout,
        entries: &[
            wgpu::BindGroupEntry {
                binding: 0,
                resource: params.buffer.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 1,
                resource: src.resource,
            },
            wgpu::BindGroupEntry {
                binding: 2,
                resource: wgpu::BindingResource::TextureView(&out.view),
            },
        ],
    });
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    {
        let mut pass = enc.begin_compute_pass(&Default::default());
        pass.set_pipeline(&kernel.pipeline);
        pass.set_bind_group(0, &bind_group, &[]);
        pass.dispatch_workgroups(width.div_ceil(8) as u32, height.div_ceil(8) as u32, 1);
    }
    gpu.queue.submit([enc.finish()]);
    if let Some(e) = pollster::block_on(scope.pop()) {
        return Err(DriftError::Gpu(format!("image_pack: {e}")));
    }
    Ok(out)
}

/// Reads a display texture back as RGBA bytes, row-major (tests and screenshots; display never needs it).
pub fn read_rgba8(gpu: &Gpu, tex: &DisplayTexture) -> Result<Vec<u8>> {
    let row = 4 * tex.width as u64;
    let padded = row.div_ceil(256) * 256;
    let buf = gpu.create_buffer(
        "display readback",
        padded * tex.height as u64,
        wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        Category::Staging,
    )?;
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    enc.copy_texture_to_buffer(
        tex.texture.as_image_copy(),
        wgpu::TexelCopyBufferInfo {
            buffer: &buf.buffer,
            layout: wgpu::TexelCopyBufferLayout {
                offset: 0,
                bytes_per_row: Some(padded as u32),
                rows_per_image: None,
            },
        },
        tex.texture.size(),
    );
    gpu.queue.submit([enc.finish()]);
    let (tx, rx) = std::sync::mpsc::channel();
    buf.buffer.map_async(wgpu::MapMode::Read, .., move |r| {
        let _ = tx.send(r);
    });
    gpu.wait()?;
    rx.recv()
        .map_err(|e| DriftError::Gpu(e.to_string()))?
        .map_err(|e| DriftError::Gpu(format!("display readback: {e}")))?;
    let mut out = Vec::with_capacity((row * tex.height as u64) as usize);
    {
        let view = buf
            .buffer
            .get_mapped_range(..)
            .map_err(|e| DriftError::Gpu(format!("display readback: {e:?}")))?;
        for r in view.chunks(padded as usize) {
            out.extend_from_slice(&r[..row as usize]);
        }
    }
    buf.buffer.unmap();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diffusion::image::to_rgb;
    use crate::gpu::GpuOptions;

    /// Values across [-1.2, 1.2] (clamping both ends), including exact byte boundaries and halves.
    fn test_values(n: usize) -> Vec<f32> {
        let mut v: Vec<f32> = (0..n)
            .map(|i| -1.2 + 2.4 * ((i * 7919) % n) as f32 / n as f32)
            .collect();
        v[0] = -1.0;
        v[1] = 1.0;
        v[2] = 0.0;
        v[3] = 1.0 / 255.0 - 1.0; // half a byte above black: a rounding tie
        v
    }

    #[test]
    fn packed_texture_holds_the_same_bytes_as_to_rgb() {
        let gpu = Gpu::new(&GpuOptions::from_env()).expect("a GPU adapter (lavapipe in CI)");
        let (w, h) = (37, 21); // not multiples of the 8x8 workgroup
        let values = test_values(3 * w * h);
        let mut dtypes = vec![DType::F32];
        if gpu.caps.f16 {
            dtypes.push(DType::F16);
        }
        for dtype in dtypes {
            let t = gpu
                .tensor_from_f32("vae out", &[1, 3, h, w], dtype, &values, Category::Other)
                .unwrap();
            // The reference sees the values as stored (f16 rounding included).
            let want = to_rgb(&gpu.read_f32(&t).unwrap(), w, h).unwrap();
            let before = gpu.memory_report().bytes(Category::Other);
            let tex = pack_rgba8(&gpu, &t, w, h).unwrap();
            assert_eq!(
                gpu.memory_report().bytes(Category::Other),
                before + tex.bytes(),
                "the texture is counted while it lives"
            );
            let got = read_rgba8(&gpu, &tex).unwrap();
            assert_eq!(got.len(), 4 * w * h);
            // Values within an f32 ulp of a rounding tie may land one byte apart (the GPU may fuse the
            // multiply-adds); everything else must match exactly.
            let mut off_by_one = 0;
            for (i, (px, rgb)) in got.chunks(4).zip(want.pixels.chunks(3)).enumerate() {
                for (g, r) in px[..3].iter().zip(rgb) {
                    let d = g.abs_diff(*r);
                    assert!(d <= 1, "{dtype:?} pixel {i}: {px:?} vs {rgb:?}");
                    off_by_one += usize::from(d == 1);
                }
                assert_eq!(px[3], 255);
            }
            assert!(
                off_by_one <= 3 * w * h / 100,
                "{dtype:?}: {off_by_one} channels off by one"
            );
            drop(tex);
            assert_eq!(gpu.memory_report().bytes(Category::Other), before);
        }
    }

    #[test]
    fn wrong_shapes_and_dtypes_are_errors() {
        let gpu = Gpu::new(&GpuOptions::from_env()).expect("a GPU adapter (lavapipe in CI)");
        let t = gpu
            .tensor("x", &[1, 3, 4, 4], DType::F32, Category::Other)
            .unwrap();
        assert!(pack_rgba8(&gpu, &t, 4, 5).is_err());
        assert!(pack_rgba8(&gpu, &t, 0, 0).is_err());
        let u = gpu
            .tensor("u", &[1, 3, 4, 4], DType::U32, Category::Other)
            .unwrap();
        assert!(pack_rgba8(&gpu, &u, 4, 4).is_err());
    }
}
