//! Drift's seeded Gaussian noise ("Drift noise v1"): the initial latents of a generation and the fresh
//! noise that ancestral and consistency schedulers add at each step.
//!
//! The generator is counter-based, so element `i` of any stream depends only on `(seed, stream, i)`:
//! a slice can be produced without producing what comes before it, and the result is the same on every
//! platform, thread count or tensor size. It is specified here completely so that anyone can
//! reproduce Drift's latents in another language:
//!
//! 1. **Bits.** Philox4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy as
//!    1, 2, 3", SC 2011; the Random123 reference, checked against its known-answer vectors) with
//!    key `(seed & 0xffffffff, seed >> 32)` and counter
//!    `(b & 0xffffffff, b >> 32, stream & 0xffffffff, stream >> 32)` for block `b = i / 4`,
//!    giving four 32-bit words `x0, x1, x2, x3`.
//! 2. **Uniforms.** Element `i` uses the pair `(a, c) = (x0, x1)` when `i % 4` is 0 or 1, and
//!    `(x2, x3)` when it is 2 or 3. `u1 = (a + 0.5) / 2^32`, `u2 = (c + 0.5) / 2^32`, both exact in
//!    f64 and strictly inside (0, 1), so the logarithm below is always finite.
//! 3. **Normal.** Box-Muller: `r = sqrt(-2 ln u1)`, `theta = 2 pi u2`; element `i` is `r cos theta`
//!    when `i` is even and `r sin theta` when `i` is odd, evaluated in f64 and rounded to the nearest
//!    f32.
//!
//! Step 3 uses Drift's own `ln`, `sin` and `cos` built from IEEE-754 `+ - * / sqrt` only (no platform
//! libm, no fused multiply-add), accurate to a few units in the last place of f64; the f32 results are
//! therefore bit-identical everywhere, and agree with a correctly rounded evaluation of the formulas
//! above except, conceivably, for a value within ~1e-15 of an f32 rounding boundary.
//!
//! Streams: [`LATENT_STREAM`] (0) holds the initial latents of a text-to-image generation (and the
//! noise of img2img's `add_noise`); the noise a scheduler consumes at step `k` (counted from the
//! start of the full schedule, also for img2img) is stream [`step_stream`]`(k)` = `k + 1`. Latents are
//! laid out as the UNet sees them: batch, channels, height, width, row-major.

/// Version of the specification above; bumped if the output of any `(seed, stream, index)` changes.
pub const NOISE_VERSION: u32 = 1;

/// The stream of the initial latents.
pub const LATENT_STREAM: u64 = 0;

/// The stream a scheduler's noise for step `step` (0-based, in the full schedule) comes from.
pub fn step_stream(step: usize) -> u64 {
    step as u64 + 1
}

/// Philox4x32 with 10 rounds: one 128-bit block of random bits per (counter, key).
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    const M0: u64 = 0xD251_1F53;
    const M1: u64 = 0xCD9E_8D57;
    const W0: u32 = 0x9E37_79B9;
    const W1: u32 = 0xBB67_AE85;
    let [mut c0, mut c1, mut c2, mut c3] = counter;
    let [mut k0, mut k1] = key;
    for round in 0..10 {
        if round > 0 {
            k0 = k0.wrapping_add(W0);
            k1 = k1.wrapping_add(W1);
        }
        let p0 = M0 * c0 as u64;
        let p1 = M1 * c2 as u64;
        let (hi0, lo0) = ((p0 >> 32) as u32, p0 as u32);
        let (hi1, lo1) = ((p1 >> 32) as u32, p1 as u32);
        (c0, c1, c2, c3) = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0);
    }
    [c0, c1, c2, c3]
}

/// Element `index` of stream `stream` for `seed`: a standard normal f32.
pub fn gaussian(seed: u64, stream: u64, index: u64) -> f32 {
    let x = block(seed, stream, index / 4);
    let lane = (index % 4) as usize;
    let (r, s, c) = box_muller(x[lane & 2], x[(lane & 2) + 1]);
    (if lane.is_multiple_of(2) { r * c } else { r * s }) as f32
}

/// Fills `out` with elements `offset..offset + out.len()` of stream `stream` for `seed`.
pub fn fill_gaussian(seed: u64, stream: u64, offset: u64, out: &mut [f32]) {
    let mut i = 0usize;
    while i < out.len() {
        let index = offset + i as u64;
        let lane0 = (index % 4) as usize;
        let x = block(seed, stream, index / 4);
        // One Box-Muller pair gives two elements; evaluate each pair of the block once.
        let mut pair: [Option<(f64, f64, f64)>; 2] = [None, None];
        for lane in lane0..4 {
            if i >= out.len() {
                break;
            }
            let p =
                pair[lane / 2].get_or_insert_with(|| box_muller(x[lane & 2], x[(lane & 2) + 1]));
            out[i] = (if lane.is_multiple_of(2) {
                p.0 * p.2
            } else {
                p.0 * p.1
            }) as f32;
            i += 1;
        }
    }
}

/// `len` elements of stream `stream` for `seed`, from element 0.
pub fn gaussian_vec(seed: u64, stream: u64, len: usize) -> Vec<f32> {
    let mut out = vec![0.0; len];
    fill_gaussian(seed, stream, 0, &mut out);
    out
}

/// A seed with the two streams a generation uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Noise {
    pub seed: u64,
}

impl Noise {
    pub fn new(seed: u64) -> Self {
        Self { seed }
    }

    /// The initial latents (stream [`LATENT_STREAM`]); multiply by the scheduler's
    /// `init_noise_sigma` for text-to-image.
    pub fn latents(&self, len: usize) -> Vec<f32> {
        gaussian_vec(self.seed, LATENT_STREAM, len)
    }

    /// The noise for scheduler step `step` (stream [`step_stream`]`(step)`).
    pub fn step(&self, step: usize, len: usize) -> Vec<f32> {
        gaussian_vec(self.seed, step_stream(step), len)
    }
}

fn block(seed: u64, stream: u64, b: u64) -> [u32; 4] {
    philox4x32_10(
        [
            b as u32,
            (b >> 32) as u32,
            stream as u32,
            (stream >> 32) as u32,
        ],
        [seed as u32, (seed >> 32) as u32],
    )
}

/// `(r, sin theta, cos theta)` for the uniform pair built from the words `a`, `c`.
fn box_muller(a: u32, c: u32) -> (f64, f64, f64) {
    const TWO_POW_M32: f64 = 1.0 / 4_294_967_296.0;
    let u1 = (a as f64 + 0.5) * TWO_POW_M32;
    let u2 = (c as f64 + 0.5) * TWO_POW_M32;
    let r = (-2.0 * ln_unit(u1)).sqrt();
    let (s, co) = sincos_turns(u2);
    (r, s, co)
}

/// Natural logarithm of `u` in (0, 1) (normal f64), from basic operations only.
fn ln_unit(u: f64) -> f64 {
    const LN2: f64 = std::f64::consts::LN_2;
    const SQRT2: f64 = std::f64::consts::SQRT_2;
    let bits = u.to_bits();
    let mut e = ((bits >> 52) & 0x7ff) as i64 - 1023;
    // Mantissa in [1, 2), folded into [sqrt(1/2), sqrt(2)) so the series argument stays small.
    let mut m = f64::from_bits((bits & ((1u64 << 52) - 1)) | (1023u64 << 52));
    if m > SQRT2 {
        m *= 0.5;
        e += 1;
    }
    // ln m = 2 atanh(s) = 2 (s + s^3/3 + s^5/5 + ...), |s| <= 0.1716, s^2 <= 0.0295:
    // twelve terms leave a truncation error below 1e-18.
    let s = (m - 1.0) / (m + 1.0);
    let s2 = s * s;
    let mut poly = 1.0 / 23.0;
    for k in (0..11).rev() {
        poly = poly * s2 + 1.0 / (2 * k + 1) as f64;
    }
    e as f64 * LN2 + 2.0 * s * poly
}

/// `(sin, cos)` of `2 pi t` for `t` in [0, 1), from basic operations only.
fn sincos_turns(t: f64) -> (f64, f64) {
    // Quarter turns: t * 4 = q + f exactly, f in [-1/2, 1/2], so the reduced angle is within pi/4.
    let x = t * 4.0;
    let mut q = x.floor();
    let mut f = x - q;
    if f > 0.5 {
        f -= 1.0;
        q += 1.0;
    }
    let a = f * std::f64::consts::FRAC_PI_2;
    let a2 = a * a;
    // Taylor series to a^17 / a^18: the next terms are below 1e-19 for |a| <= pi/4.
    let mut sin = 0.0;
    let mut cos = 0.0;
    let mut sin_c = 1.0; // a^(2k+1) / (2k+1)! without the a^(2k+1)
    let mut cos_c = 1.0;
    let mut sin_terms = [0.0f64; 9];
    let mut cos_terms = [0.0f64; 10];
    for k in 0..10 {
        if k < 9 {
            sin_terms[k] = sin_c;
            sin_c = -sin_c / ((2 * k + 2) * (2 * k + 3)) as f64;
        }
        cos_terms[k] = cos_c;
        cos_c = -cos_c / ((2 * k + 1) * (2 * k + 2)) as f64;
    }
    for k in (0..10).rev() {
        cos = cos * a2 + cos_terms[k];
        if k < 9 {
            sin = sin * a2 + sin_terms[k];
        }
    }
    let sin = sin * a;
    match (q as i64) & 3 {
        0 => (sin, cos),
        1 => (cos, -sin),
        2 => (-sin, -cos),
        _ => (-cos, sin),
    }
}
