//! x quantized by its producer (`shaders/xq_produce.wgsl`): a decode product whose output feeds the
//! next product writes it in the integer-dot-product kernel's input format as well
//! ([`MatvecOptions::xq_out`]), and the next product reads those blocks directly
//! ([`MatvecOptions::xq_in`]) instead of every workgroup quantizing the whole row and waiting at a
//! barrier first. This module checks the shapes both sides need and gives the kernel's defines.

use crate::error::Result;
use crate::kernels::matvec::MatvecOptions;
use crate::shape_err;
use crate::tensor::{DType, Tensor};

/// u32 words per 32-element block: 8 of qh, 8 of ql, d, sum, sum of squares, padding.
pub const XQ_BLOCK_WORDS: usize = 20;

/// Words of an xq buffer for a row of `k` elements (a multiple of 32).
pub fn xq_words(k: usize) -> usize {
    k / 32 * XQ_BLOCK_WORDS
}

/// What one product does with producer-quantized x: read it, write it, or both.
pub(crate) struct XqPlan {
    read: bool,
    /// Values each workgroup quantizes when writing (0: not writing).
    vals: usize,
}

impl XqPlan {
    /// Checks `opts.xq_in` / `opts.xq_out` against the product: the integer-dot-product kernel on one
    /// activation row and one weight shard, teams over whole rows; reading with a norm needs rows whole
    /// in one workgroup (no K split); writing needs the residual or GLU epilogue with each
    /// workgroup's values whole blocks.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        opts: &MatvecOptions,
        dp4a: bool,
        batch: usize,
        shards: usize,
        n: usize,
        k: usize,
        rows_per_group: usize,
        k_teams: u32,
        k_workgroups: u32,
    ) -> Result<XqPlan> {
        let refuse = |why: &str| Err(shape_err!("matvec_quant: producer-quantized x {why}"));
        if !dp4a || batch != 1 || shards != 1 || k_teams != 1 {
            return refuse(
                "needs the integer-dot-product kernel, one activation row, one weight shard and whole rows per team",
            );
        }
        if let Some(t) = opts.xq_in {
            if opts.swiglu {
                return refuse("cannot take the SwiGLU prologue (its producer applies it)");
            }
            if opts.norm.is_some() && k_workgroups > 1 {
                return refuse("with a norm needs each row in one workgroup");
            }
            check_buffer(t, k)?;
        }
        let mut vals = 0;
        if let Some((t, gain)) = opts.xq_out {
            let (out_len, per_wg) = match (opts.residual.is_some(), opts.glu) {
                (true, false) if opts.rope.is_none() => (n, rows_per_group),
                (false, true) => (n / 2, rows_per_group / 2),
                _ => return refuse("is written by the residual or the GLU epilogue alone"),
            };
            if !per_wg.is_multiple_of(32) || !out_len.is_multiple_of(32) {
                return refuse(&format!(
                    "needs whole 32-element blocks per workgroup ({per_wg} values of {out_len})"
                ));
            }
            check_buffer(t, out_len)?;
            if let Some(g) = gain
                && (g.numel() != out_len || !matches!(g.dtype, DType::F32 | DType::F16))
            {
                return refuse(&format!(
                    "gain must be {out_len} f32 or f16 values, is {:?} {:?}",
                    g.shape, g.dtype
                ));
            }
            vals = per_wg;
        }
        Ok(XqPlan {
            read: opts.xq_in.is_some(),
            vals,
        })
    }

    /// The kernel's XQ / XQN / XQO / XQL defines; `binding` is where the xq output goes,
    /// `sg32` whether the kernel's subgroups are 32 lanes, `kw` the workgroups per row set.
    pub fn defines(
        &self,
        opts: &MatvecOptions,
        binding: usize,
        sg32: bool,
        kw: u32,
    ) -> Vec<(&'static str, String)> {
        // Blocks quantized in registers where each value's invocation is its lane: the GLU
        // epilogue's and the split-K last workgroup's (the others keep rows on one lane per team).
        let lanes = sg32 && (opts.glu || kw > 1);
        let mut d = vec![
            ("XQ", u8::from(self.read).to_string()),
            (
                "XQN",
                u8::from(self.read && opts.norm.is_some()).to_string(),
            ),
            ("XQO", u8::from(self.vals > 0).to_string()),
            ("XQL", u8::from(self.vals > 0 && lanes).to_string()),
        ];
        if let Some((_, gain)) = opts.xq_out {
            let writes = std::env::var_os("DRIFT_DP4A_XQ").is_none_or(|v| v != "nowrite");
            d.extend([
                ("XQW", u8::from(writes).to_string()),
                ("XQO_B", binding.to_string()),
                ("XQ_VALS", self.vals.to_string()),
                ("XQG", u8::from(gain.is_some()).to_string()),
            ]);
            if let Some(g) = gain {
                d.extend([
                    ("XQG_B", (binding + 1).to_string()),
                    ("TQG", g.dtype.wgsl().to_string()),
                ]);
            }
        }
        d
    }

    /// The tensors bound after the fusion's: the xq output and its gain.
    pub fn tensors<'a>(&self, opts: &MatvecOptions<'a>) -> Vec<&'a Tensor> {
        match opts.xq_out {
            Some((t, gain)) => std::iter::once(t).chain(gain).collect(),
            None => Vec::new(),
        }
    }

    /// Kernel name suffix.
    pub fn suffix(&self) -> &'static str {
        match (self.read, self.vals > 0) {
            (true, true) => "_xq_xqo",
            (true, false) => "_xq",
            _ => "_xqo",
        }
    }
}

/// An xq buffer for a row of `k` elements: U32, large enough, starting on 16 bytes (read as vec4).
pub(crate) fn check_buffer(t: &Tensor, k: usize) -> Result<()> {
    if t.dtype != DType::U32 || t.numel() < xq_words(k) || !t.storage.offset.is_multiple_of(16) {
        return Err(shape_err!(
            "an xq buffer for {k} elements must be {} U32 words from a 16-byte offset, is {:?} {:?} at byte {}",
            xq_words(k),
            t.shape,
            t.dtype,
            t.storage.offset
        ));
    }
    Ok(())
}
