//! The Hugging Face model API, for "add by repo id": a repo's files (with sizes and LFS sha256s) at a
//! revision, from `{endpoint}/api/models/{repo}[/revision/{rev}]?blobs=true`, and which of them make
//! a model Drift can load.

use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use serde::Deserialize;

use super::catalog::{is_safe_relative, is_weights};
use super::download::hf_token;

/// One file of a repo.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoFile {
    pub path: String,
    pub size: Option<u64>,
    /// The LFS object id (sha256) for files stored in LFS.
    pub sha256: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoInfo {
    pub repo: String,
    /// The commit the revision resolved to.
    pub commit: Option<String>,
    /// Downloads need a token and an accepted license.
    pub gated: bool,
    pub files: Vec<RepoFile>,
}

#[derive(Deserialize)]
struct ApiModel {
    #[serde(default)]
    sha: Option<String>,
    #[serde(default)]
    gated: serde_json::Value,
    #[serde(default)]
    siblings: Vec<ApiSibling>,
}

#[derive(Deserialize)]
struct ApiSibling {
    rfilename: String,
    #[serde(default)]
    size: Option<u64>,
    #[serde(default)]
    lfs: Option<ApiLfs>,
}

#[derive(Deserialize)]
struct ApiLfs {
    #[serde(default)]
    sha256: Option<String>,
    #[serde(default)]
    oid: Option<String>,
    #[serde(default)]
    size: Option<u64>,
}

/// The API URL for `repo` at `revision` (branch names with `/` are escaped).
pub fn repo_api_url(endpoint: &str, repo: &str, revision: &str) -> String {
    let base = format!(
        "{}/api/models/{}",
        endpoint.trim_end_matches('/'),
        repo.trim_matches('/')
    );
    if revision == "main" {
        format!("{base}?blobs=true")
    } else {
        format!(
            "{base}/revision/{}?blobs=true",
            revision.replace('/', "%2F")
        )
    }
}

/// Lists `repo`'s files at `revision`. `token`: explicit, else `HF_TOKEN`.
pub fn repo_info(
    endpoint: &str,
    repo: &str,
    revision: &str,
    token: Option<&str>,
) -> Result<RepoInfo> {
    if repo.split('/').filter(|p| !p.is_empty()).count() != 2 {
        bail!("{repo:?} is not a Hugging Face repo id (org/name)");
    }
    let url = repo_api_url(endpoint, repo, revision);
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into();
    let mut req = agent.get(&url);
    let token = hf_token(token);
    if let Some(t) = &token {
        req = req.header("Authorization", format!("Bearer {t}"));
    }
    let mut resp = req
        .call()
        .map_err(|e| anyhow!("could not reach {url}: {e}"))?;
    let status = resp.status().as_u16();
    match status {
        200 => {}
        401 | 403 => bail!(
            "{repo}: access denied (HTTP {status}): the repo does not exist, or it is gated or private \
             and needs a Hugging Face token{}",
            if token.is_some() {
                " (the token given was refused)"
            } else {
                " (set HF_TOKEN or pass --token)"
            }
        ),
        404 => bail!("{repo}: not found (HTTP 404): no such repo or revision {revision:?}"),
        _ => bail!("HTTP {status} from {url}"),
    }
    let body = resp
        .body_mut()
        .read_to_string()
        .with_context(|| format!("reading {url}"))?;
    parse_repo_info(repo, &body)
}

fn parse_repo_info(repo: &str, body: &str) -> Result<RepoInfo> {
    let m: ApiModel =
        serde_json::from_str(body).context("the hub's answer is not the expected JSON")?;
    let files = m
        .siblings
        .into_iter()
        // A path that could escape the models folder is never offered.
        .filter(|s| is_safe_relative(&s.rfilename))
        .map(|s| {
            let lfs = s.lfs.as_ref();
            RepoFile {
                size: lfs.and_then(|l| l.size).or(s.size),
                sha256: lfs
                    .and_then(|l| l.sha256.clone().or_else(|| l.oid.clone()))
                    .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit())),
                path: s.rfilename,
            }
        })
        .collect();
    Ok(RepoInfo {
        repo: repo.to_string(),
        commit: m.sha,
        gated: !matches!(
            m.gated,
            serde_json::Value::Null | serde_json::Value::Bool(false)
        ),
        files,
    })
}

impl RepoInfo {
    pub fn file(&self, path: &str) -> Option<&RepoFile> {
        self.files.iter().find(|f| f.path == path)
    }

    /// Each `.gguf` file is a model by itself.
    pub fn ggufs(&self) -> Vec<&RepoFile> {
        self.files
            .iter()
            .filter(|f| f.path.ends_with(".gguf"))
            .collect()
    }

    /// The files of the repo's loadable folder model, if it is one: a transformers folder (root
    /// configs, tokenizer files and `.safetensors`), or a diffusers pipeline (`model_index.json` and
    /// the components' configs, tokenizers and weights, fp16 variants preferred; the safety checker,
    /// which Drift does not run, left out). Pickles, ONNX and single-file checkpoints never.
    pub fn folder_set(&self) -> Option<Vec<&RepoFile>> {
        let small = |p: &str| {
            [".json", ".txt", ".jinja", ".model"]
                .iter()
                .any(|x| p.ends_with(x))
        };
        if self.file("model_index.json").is_some() {
            let in_component = |p: &str| {
                p.split_once('/').is_some_and(|(dir, _)| {
                    !matches!(dir, "safety_checker" | "feature_extractor")
                        && !p[dir.len() + 1..].contains('/')
                })
            };
            let dir_has_fp16 = |p: &str| {
                let dir = p.split_once('/').map_or("", |d| d.0);
                self.files.iter().any(|f| {
                    f.path.starts_with(&format!("{dir}/")) && f.path.ends_with(".fp16.safetensors")
                })
            };
            let set: Vec<_> = self
                .files
                .iter()
                .filter(|f| {
                    let p = f.path.as_str();
                    p == "model_index.json"
                        || (in_component(p)
                            && (small(p)
                                || (p.ends_with(".safetensors")
                                    && p.ends_with(".fp16.safetensors") == dir_has_fp16(p))))
                })
                .collect();
            return set.iter().any(|f| is_weights(&f.path)).then_some(set);
        }
        let root = |p: &str| !p.contains('/');
        if self.file("config.json").is_some()
            && self
                .files
                .iter()
                .any(|f| root(&f.path) && f.path.ends_with(".safetensors"))
        {
            return Some(
                self.files
                    .iter()
                    .filter(|f| {
                        root(&f.path) && (small(&f.path) || f.path.ends_with(".safetensors"))
                    })
                    .collect(),
            );
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(files: &[(&str, u64)]) -> RepoInfo {
        RepoInfo {
            repo: "a/b".into(),
            commit: None,
            gated: false,
            files: files
                .iter()
                .map(|(p, s)| RepoFile {
                    path: p.to_string(),
                    size: Some(*s),
                    sha256: None,
                })
                .collect(),
        }
    }

    fn paths(set: Option<Vec<&RepoFile>>) -> Vec<String> {
        set.unwrap().iter().map(|f| f.path.clone()).collect()
    }

    #[test]
    fn parses_the_hub_answer() {
        let body = r#"{"id":"Qwen/Qwen2.5-0.5B-Instruct-GGUF","sha":"9217f5db","gated":false,
            "siblings":[{"rfilename":".gitattributes","size":1900},
              {"rfilename":"qwen2.5-0.5b-instruct-q4_k_m.gguf","size":491400032,
               "lfs":{"sha256":"74a4da8c9fdbcd15bd1f6d01d621410d31c6fc00986f5eb687824e7b93d7a9db","size":491400032,"pointerSize":135}},
              {"rfilename":"../evil.gguf","size":1}]}"#;
        let r = parse_repo_info("Qwen/Qwen2.5-0.5B-Instruct-GGUF", body).unwrap();
        assert_eq!(
            (r.commit.as_deref(), r.gated, r.files.len()),
            (Some("9217f5db"), false, 2)
        );
        let g = r.ggufs();
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].size, Some(491_400_032));
        assert_eq!(g[0].sha256.as_deref().unwrap().len(), 64);
        assert!(r.folder_set().is_none());
        let gated = parse_repo_info("m/l", r#"{"gated":"manual","siblings":[]}"#).unwrap();
        assert!(gated.gated);
        assert!(parse_repo_info("m/l", "<html>").is_err());
    }

    #[test]
    fn folder_sets_pick_what_the_engine_loads() {
        let t = info(&[
            ("config.json", 1),
            ("tokenizer.json", 2),
            ("model.safetensors", 3),
            ("pytorch_model.bin", 3),
            ("README.md", 1),
            ("onnx/model.onnx", 3),
        ]);
        assert_eq!(
            paths(t.folder_set()),
            ["config.json", "tokenizer.json", "model.safetensors"]
        );
        let sd = info(&[
            ("model_index.json", 1),
            ("v1-5-pruned-emaonly.safetensors", 9),
            ("unet/config.json", 1),
            ("unet/diffusion_pytorch_model.safetensors", 9),
            ("unet/diffusion_pytorch_model.fp16.safetensors", 5),
            ("vae/diffusion_pytorch_model.safetensors", 4),
            ("tokenizer/merges.txt", 1),
            ("safety_checker/model.fp16.safetensors", 6),
            ("text_encoder/pytorch_model.bin", 2),
        ]);
        assert_eq!(
            paths(sd.folder_set()),
            [
                "model_index.json",
                "unet/config.json",
                "unet/diffusion_pytorch_model.fp16.safetensors",
                "vae/diffusion_pytorch_model.safetensors",
                "tokenizer/merges.txt"
            ]
        );
        assert!(info(&[("a.gguf", 1)]).folder_set().is_none());
    }

    #[test]
    fn api_urls() {
        assert_eq!(
            repo_api_url("http://h/", "a/b", "main"),
            "http://h/api/models/a/b?blobs=true"
        );
        assert_eq!(
            repo_api_url("http://h", "a/b", "refs/pr/1"),
            "http://h/api/models/a/b/revision/refs%2Fpr%2F1?blobs=true"
        );
        assert!(repo_info("http://127.0.0.1:9", "nope", "main", None).is_err());
    }
}
