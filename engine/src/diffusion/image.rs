//! Images out of the diffusion pipeline: VAE output to RGB bytes, the cheap latent preview, and PNG
//! files carrying the generation parameters the way AUTOMATIC1111 writes them (a `parameters` text
//! chunk other tools read back).

use std::path::Path;

use crate::error::{DriftError, Result};

/// An 8-bit RGB image.
#[derive(Clone, Debug)]
pub struct RgbImage {
    pub width: usize,
    pub height: usize,
    pub pixels: Vec<u8>,
}

/// The settings that made an image, in AUTOMATIC1111's `parameters` text.
#[derive(Clone, Debug, PartialEq)]
pub struct Parameters {
    pub prompt: String,
    pub negative: String,
    pub steps: usize,
    pub sampler: String,
    pub cfg: f32,
    pub seed: u64,
    pub width: usize,
    pub height: usize,
    pub model: String,
}

impl Parameters {
    pub fn to_a1111(&self) -> String {
        let mut s = self.prompt.clone();
        if !self.negative.is_empty() {
            s.push_str(&format!("\nNegative prompt: {}", self.negative));
        }
        s.push_str(&format!(
            "\nSteps: {}, Sampler: {}, CFG scale: {}, Seed: {}, Size: {}x{}, Model: {}",
            self.steps, self.sampler, self.cfg, self.seed, self.width, self.height, self.model
        ));
        s
    }
}

/// Decoder output `[3, H, W]` in [-1, 1] (one batch entry) to RGB bytes.
pub fn to_rgb(chw: &[f32], width: usize, height: usize) -> Result<RgbImage> {
    let n = width * height;
    if chw.len() != 3 * n {
        return Err(DriftError::Other(format!(
            "{} values for a {width}x{height} RGB image",
            chw.len()
        )));
    }
    let mut pixels = Vec::with_capacity(3 * n);
    for i in 0..n {
        for c in 0..3 {
            let v = (chw[c * n + i] + 1.0) * 0.5;
            pixels.push((v.clamp(0.0, 1.0) * 255.0).round() as u8);
        }
    }
    Ok(RgbImage {
        width,
        height,
        pixels,
    })
}

/// RGB bytes to `[3, H, W]` in [-1, 1] (img2img input).
pub fn from_rgb(img: &RgbImage) -> Vec<f32> {
    let n = img.width * img.height;
    let mut out = vec![0.0; 3 * n];
    for i in 0..n {
        for c in 0..3 {
            out[c * n + i] = img.pixels[3 * i + c] as f32 / 127.5 - 1.0;
        }
    }
    out
}

/// A preview straight from SD 1.x latents `[4, h, w]` by a fixed linear map (no VAE): each latent
/// channel's contribution to R, G, B. One pixel per latent, so an 8x smaller image.
pub fn latent_preview(latents: &[f32], w: usize, h: usize) -> RgbImage {
    const MAP: [[f32; 3]; 4] = [
        [0.298, 0.207, 0.208],
        [0.187, 0.286, 0.173],
        [-0.158, 0.189, 0.264],
        [-0.184, -0.271, -0.473],
    ];
    let n = w * h;
    let mut pixels = Vec::with_capacity(3 * n);
    for i in 0..n {
        let mut rgb = [0.0f32; 3];
        for (k, weights) in MAP.iter().enumerate() {
            let l = latents.get(k * n + i).copied().unwrap_or(0.0);
            for (acc, w) in rgb.iter_mut().zip(weights) {
                *acc += l * w;
            }
        }
        pixels.extend(rgb.map(|v| (((v + 1.0) * 0.5).clamp(0.0, 1.0) * 255.0) as u8));
    }
    RgbImage {
        width: w,
        height: h,
        pixels,
    }
}

/// Writes a PNG with the `parameters` text chunk, atomically (temp file, then rename).
pub fn save_png(path: &Path, img: &RgbImage, params: Option<&Parameters>) -> Result<()> {
    let io = |e: std::io::Error| DriftError::Other(format!("{}: {e}", path.display()));
    let tmp = path.with_extension("png.part");
    {
        let file = std::fs::File::create(&tmp).map_err(io)?;
        let mut enc = png::Encoder::new(
            std::io::BufWriter::new(file),
            img.width as u32,
            img.height as u32,
        );
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        if let Some(p) = params {
            enc.add_itxt_chunk("parameters".into(), p.to_a1111())
                .map_err(|e| DriftError::Other(e.to_string()))?;
        }
        let mut w = enc
            .write_header()
            .map_err(|e| DriftError::Other(format!("{}: {e}", path.display())))?;
        w.write_image_data(&img.pixels)
            .map_err(|e| DriftError::Other(format!("{}: {e}", path.display())))?;
        w.finish()
            .map_err(|e| DriftError::Other(format!("{}: {e}", path.display())))?;
    }
    std::fs::rename(&tmp, path).map_err(io)?;
    Ok(())
}

/// Reads a PNG as RGB (img2img input; alpha dropped, grey expanded).
pub fn load_png(path: &Path) -> Result<RgbImage> {
    let err = |e: String| DriftError::Other(format!("{}: {e}", path.display()));
    let file = std::fs::File::open(path).map_err(|e| err(e.to_string()))?;
    let mut dec = png::Decoder::new(std::io::BufReader::new(file));
    dec.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let mut reader = dec.read_info().map_err(|e| err(e.to_string()))?;
    let mut buf = vec![
        0;
        reader
            .output_buffer_size()
            .ok_or_else(|| err("image too large".into()))?
    ];
    let info = reader
        .next_frame(&mut buf)
        .map_err(|e| err(e.to_string()))?;
    let (w, h) = (info.width as usize, info.height as usize);
    let ch = info.color_type.samples();
    let mut pixels = Vec::with_capacity(3 * w * h);
    for px in buf[..w * h * ch].chunks(ch) {
        match ch {
            1 | 2 => pixels.extend([px[0]; 3]),
            _ => pixels.extend(&px[..3]),
        }
    }
    Ok(RgbImage {
        width: w,
        height: h,
        pixels,
    })
}

/// The `parameters` text of a PNG written by Drift or AUTOMATIC1111, if any.
pub fn read_parameters(path: &Path) -> Result<Option<String>> {
    let file = std::fs::File::open(path)
        .map_err(|e| DriftError::Other(format!("{}: {e}", path.display())))?;
    let reader = png::Decoder::new(std::io::BufReader::new(file))
        .read_info()
        .map_err(|e| DriftError::Other(format!("{}: {e}", path.display())))?;
    let info = reader.info();
    let itxt = info
        .utf8_text
        .iter()
        .find(|c| c.keyword == "parameters")
        .and_then(|c| c.get_text().ok());
    let text = info
        .uncompressed_latin1_text
        .iter()
        .find(|c| c.keyword == "parameters")
        .map(|c| c.text.clone());
    Ok(itxt.or(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn png_round_trip_keeps_pixels_and_parameters() {
        let img = RgbImage {
            width: 3,
            height: 2,
            pixels: (0..18).map(|i| i * 13).collect(),
        };
        let p = Parameters {
            prompt: "a red fox, (masterpiece:1.2)".into(),
            negative: "blurry".into(),
            steps: 20,
            sampler: "Euler a".into(),
            cfg: 7.5,
            seed: 42,
            width: 3,
            height: 2,
            model: "sd15".into(),
        };
        let path = std::env::temp_dir().join(format!("drift-png-{}.png", std::process::id()));
        save_png(&path, &img, Some(&p)).unwrap();
        let back = load_png(&path).unwrap();
        assert_eq!((back.width, back.height, &back.pixels), (3, 2, &img.pixels));
        let text = read_parameters(&path).unwrap().unwrap();
        assert_eq!(
            text,
            "a red fox, (masterpiece:1.2)\nNegative prompt: blurry\nSteps: 20, Sampler: Euler a, CFG scale: 7.5, Seed: 42, Size: 3x2, Model: sd15"
        );
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn rgb_conversions_invert() {
        let img = RgbImage {
            width: 2,
            height: 1,
            pixels: vec![0, 127, 255, 10, 20, 30],
        };
        let back = to_rgb(&from_rgb(&img), 2, 1).unwrap();
        assert_eq!(back.pixels, img.pixels);
    }
}
