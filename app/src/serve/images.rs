//! `POST /v1/images/generations`: Stable Diffusion on the shared GPU, answered with base64 PNGs
//! (`response_format: b64_json`). Drift's own settings come as extra fields: `steps`,
//! `negative_prompt`, `cfg_scale`, `seed` and `scheduler`. Image `i` of `n` uses seed + i.

use std::net::TcpStream;

use base64::Engine;
use drift_engine::diffusion::image::{Parameters, RgbImage};
use drift_engine::diffusion::pipeline::ImageRequest;
use drift_engine::diffusion::schedulers::SchedulerKind;
use serde_json::{Map, Value, json};

use super::api_error::ApiError;
use super::http::{Request, client_gone, write_json};
use super::openai::unix_now;
use super::text_params::{field, json_object, ranged, required, seed};
use super::{Served, Shared};

const MAX_IMAGES: u64 = 8;
const MAX_SIDE: usize = 2048;
const MAX_STEPS: u64 = 150;

struct ImageJob {
    model: Option<String>,
    n: usize,
    width: usize,
    height: usize,
    request: ImageRequest,
}

/// `size` is "WIDTHxHEIGHT" (or "auto" for 512x512); both sides multiples of 8, at most 2048.
fn size(obj: &Map<String, Value>) -> Result<(usize, usize), ApiError> {
    let Some(text) = field::<String>(obj, "size")? else {
        return Ok((512, 512));
    };
    if text == "auto" {
        return Ok((512, 512));
    }
    let bad = || {
        ApiError::bad_param(
            "size",
            format!("'size' must look like 512x512, got '{text}'"),
        )
    };
    let (w, h) = text.split_once(['x', 'X']).ok_or_else(bad)?;
    let (w, h): (usize, usize) = (
        w.trim().parse().map_err(|_| bad())?,
        h.trim().parse().map_err(|_| bad())?,
    );
    if w == 0 || h == 0 || w > MAX_SIDE || h > MAX_SIDE || w % 8 != 0 || h % 8 != 0 {
        return Err(ApiError::bad_param(
            "size",
            format!("'size' sides must be multiples of 8 between 8 and {MAX_SIDE}, got {w}x{h}"),
        ));
    }
    Ok((w, h))
}

fn parse(body: &[u8]) -> Result<ImageJob, ApiError> {
    let obj = json_object(body)?;
    let prompt: String = required(&obj, "prompt")?;
    let n = field::<u64>(&obj, "n")?.unwrap_or(1);
    if !(1..=MAX_IMAGES).contains(&n) {
        return Err(ApiError::bad_param(
            "n",
            format!("'n' must be between 1 and {MAX_IMAGES}"),
        ));
    }
    match field::<String>(&obj, "response_format")?.as_deref() {
        None | Some("b64_json") => {}
        Some(other) => {
            return Err(ApiError::bad_param(
                "response_format",
                format!(
                    "response_format '{other}' is not supported: Drift returns images as b64_json"
                ),
            ));
        }
    }
    if let Some(f) = field::<String>(&obj, "output_format")?
        && f != "png"
    {
        return Err(ApiError::bad_param(
            "output_format",
            "only the 'png' output format is supported",
        ));
    }
    let steps = field::<u64>(&obj, "steps")?.unwrap_or(20);
    if !(1..=MAX_STEPS).contains(&steps) {
        return Err(ApiError::bad_param(
            "steps",
            format!("'steps' must be between 1 and {MAX_STEPS}"),
        ));
    }
    let scheduler = match field::<String>(&obj, "scheduler")? {
        Some(s) => {
            SchedulerKind::parse(&s).map_err(|e| ApiError::bad_param("scheduler", e.to_string()))?
        }
        None => SchedulerKind::EulerAncestral,
    };
    let (width, height) = size(&obj)?;
    Ok(ImageJob {
        model: field(&obj, "model")?,
        n: n as usize,
        width,
        height,
        request: ImageRequest {
            prompt,
            negative: field(&obj, "negative_prompt")?.unwrap_or_default(),
            steps: steps as usize,
            cfg: ranged(&obj, "cfg_scale", 0.0, 30.0)?.unwrap_or(7.5) as f32,
            seed: seed(&obj)?,
            scheduler,
            init: None,
            latents: None,
        },
    })
}

/// The image as a PNG file in memory, with the settings in a `parameters` text chunk (as `drift
/// image` writes them).
fn png_bytes(image: &RgbImage, parameters: &Parameters) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, image.width as u32, image.height as u32);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    enc.add_itxt_chunk("parameters".into(), parameters.to_a1111())
        .map_err(|e| e.to_string())?;
    let mut writer = enc.write_header().map_err(|e| e.to_string())?;
    writer
        .write_image_data(&image.pixels)
        .map_err(|e| e.to_string())?;
    writer.finish().map_err(|e| e.to_string())?;
    Ok(out)
}

pub fn generations(shared: &Shared, req: &Request, conn: &TcpStream) -> Result<Served, ApiError> {
    let job = parse(&req.body)?;
    let entry = shared.registry.image(job.model.as_deref())?;
    let _turn = shared.queue.acquire();
    if client_gone(conn) {
        return Ok(Served::gone("before its turn on the GPU"));
    }
    let mut loaded = shared.registry.loaded();
    let pipe = loaded.image(&shared.gpu, entry, job.width, job.height)?;
    let mut data = Vec::with_capacity(job.n);
    let mut total_ms = 0.0;
    for i in 0..job.n {
        let request = ImageRequest {
            seed: job.request.seed.wrapping_add(i as u64),
            ..job.request.clone()
        };
        let mut hung_up = false;
        let result = pipe.generate(&shared.gpu, &request, &mut |_, _, _| {
            hung_up = client_gone(conn);
            !hung_up
        });
        if hung_up {
            return Ok(Served::gone(&format!(
                "image {} of {} cancelled",
                i + 1,
                job.n
            )));
        }
        let r = result.map_err(|e| ApiError::server(format!("image generation failed: {e}")))?;
        let png = png_bytes(&r.image, &r.parameters)
            .map_err(|e| ApiError::server(format!("PNG encoding: {e}")))?;
        total_ms += r.times.total_ms;
        data.push(json!({
            "b64_json": base64::engine::general_purpose::STANDARD.encode(png),
            "revised_prompt": null,
        }));
    }
    let body = json!({
        "created": unix_now(),
        "data": data,
        "output_format": "png",
        "size": format!("{}x{}", job.width, job.height),
    });
    let _ = write_json(conn, 200, &body);
    Ok(Served::ok(format!(
        "{}: {} image(s) {}x{}, {} steps, {:.0} ms",
        entry.id, job.n, job.width, job.height, job.request.steps, total_ms
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(body: &str) -> ApiError {
        parse(body.as_bytes()).err().expect("refused")
    }

    #[test]
    fn parses_sizes_and_drift_fields() {
        let j = parse(br#"{"prompt":"a cat","size":"24x16","n":2,"steps":3,"negative_prompt":"dog",
            "cfg_scale":5,"seed":7,"scheduler":"euler","response_format":"b64_json","quality":"hd"}"#)
        .ok()
        .unwrap();
        assert_eq!((j.width, j.height, j.n), (24, 16, 2));
        assert_eq!(
            (j.request.steps, j.request.seed, j.request.cfg),
            (3, 7, 5.0)
        );
        assert_eq!(
            (j.request.negative.as_str(), j.request.scheduler),
            ("dog", SchedulerKind::Euler)
        );
        let d = parse(br#"{"prompt":"x"}"#).ok().unwrap();
        assert_eq!((d.width, d.height, d.n, d.request.steps), (512, 512, 1, 20));
    }

    #[test]
    fn bad_fields_are_named() {
        for (body, param) in [
            (r#"{"size":"8x8"}"#, "prompt"),
            (r#"{"prompt":"x","size":"12x8"}"#, "size"),
            (r#"{"prompt":"x","size":"big"}"#, "size"),
            (r#"{"prompt":"x","size":"4096x8"}"#, "size"),
            (r#"{"prompt":"x","n":0}"#, "n"),
            (
                r#"{"prompt":"x","response_format":"url"}"#,
                "response_format",
            ),
            (r#"{"prompt":"x","steps":0}"#, "steps"),
            (r#"{"prompt":"x","scheduler":"plms"}"#, "scheduler"),
            (r#"{"prompt":"x","cfg_scale":-1}"#, "cfg_scale"),
        ] {
            let e = err(body);
            assert_eq!(
                (e.status, e.param.as_deref()),
                (400, Some(param)),
                "{body}: {e:?}"
            );
        }
    }

    #[test]
    fn png_round_trips() {
        let image = RgbImage {
            width: 3,
            height: 2,
            pixels: (0..18).map(|v| v as u8 * 10).collect(),
        };
        let params = Parameters {
            prompt: "p".into(),
            negative: String::new(),
            steps: 1,
            sampler: "Euler".into(),
            cfg: 1.0,
            seed: 0,
            width: 3,
            height: 2,
            model: "m".into(),
        };
        let bytes = png_bytes(&image, &params).unwrap();
        let mut reader = png::Decoder::new(std::io::Cursor::new(bytes))
            .read_info()
            .unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!((info.width, info.height), (3, 2));
        assert_eq!(&buf[..info.buffer_size()], &image.pixels[..]);
    }
}
