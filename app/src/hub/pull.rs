//! What to download for a catalog entry or for chosen files of any repo, and where it goes
//! (`<models dir>/<org>/<name>/<file>`), as a download-manager job. Shared by the CLI and the
//! Models tab.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

use super::api::RepoFile;
use super::catalog::{CatalogEntry, is_safe_relative, repo_dir};
use super::download::{Expected, hf_url};
use super::manager::{FileRequest, JobRequest};

/// A job and the path the library will load once it is done.
#[derive(Clone, Debug)]
pub struct PullPlan {
    pub job: JobRequest,
    pub path: PathBuf,
}

/// `org/name` or `org/name:path/in/repo.gguf`.
pub fn parse_spec(spec: &str) -> Result<(String, Option<String>)> {
    let (repo, file) = match spec.split_once(':') {
        Some((r, f)) => (r, Some(f.to_string())),
        None => (spec, None),
    };
    let repo = repo.trim_matches('/');
    if repo.split('/').count() != 2 || repo.split('/').any(str::is_empty) {
        bail!("{spec:?} is neither a catalog id nor a Hugging Face repo id (org/name[:file])");
    }
    if let Some(f) = &file
        && !is_safe_relative(f)
    {
        bail!("{f:?} is not a file path inside the repo");
    }
    Ok((repo.to_string(), file))
}

/// The catalog entry's files at its pinned revision, or at `revision` (then the catalog's hashes,
/// which belong to the pinned files, are left to the hub).
pub fn catalog_plan(
    entry: &CatalogEntry,
    models_dir: &Path,
    endpoint: &str,
    revision: Option<&str>,
    token: Option<String>,
) -> PullPlan {
    let pinned = revision.is_none_or(|r| r == entry.revision);
    let rev = revision.unwrap_or(&entry.revision);
    let dir = entry.local_dir(models_dir);
    let files = entry
        .files
        .iter()
        .map(|f| FileRequest {
            url: hf_url(endpoint, &entry.repo, rev, &f.path),
            dest: dir.join(&f.path),
            // The catalog's size is binding only together with its hash.
            expected: match (&f.sha256, pinned) {
                (Some(sha), true) => Expected {
                    sha256: Some(sha.clone()),
                    size: f.size,
                },
                _ => Expected::default(),
            },
            size_hint: f.size,
        })
        .collect();
    PullPlan {
        job: JobRequest {
            label: entry.name.clone(),
            files,
            token,
        },
        path: entry.local_path(models_dir),
    }
}

/// Chosen files of `repo` (sizes and hashes as the API listed them, when it did).
pub fn files_plan(
    repo: &str,
    revision: &str,
    files: &[RepoFile],
    models_dir: &Path,
    endpoint: &str,
    token: Option<String>,
) -> Result<PullPlan> {
    if files.is_empty() {
        bail!("no files chosen from {repo}");
    }
    for f in files {
        if !is_safe_relative(&f.path) {
            bail!("{:?} is not a file path inside the repo", f.path);
        }
    }
    let dir = repo_dir(models_dir, repo);
    let reqs = files
        .iter()
        .map(|f| FileRequest {
            url: hf_url(endpoint, repo, revision, &f.path),
            dest: dir.join(&f.path),
            expected: Expected {
                sha256: f.sha256.clone(),
                size: f.sha256.as_ref().and(f.size),
            },
            size_hint: f.size,
        })
        .collect();
    let path = match files {
        [one] if one.path.ends_with(".gguf") => dir.join(&one.path),
        _ => dir,
    };
    let label = match files {
        [one] => format!("{repo}: {}", one.path),
        many => format!("{repo} ({} files)", many.len()),
    };
    Ok(PullPlan {
        job: JobRequest {
            label,
            files: reqs,
            token,
        },
        path,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::catalog::Catalog;

    #[test]
    fn specs_parse() {
        assert_eq!(parse_spec("a/b").unwrap(), ("a/b".into(), None));
        assert_eq!(
            parse_spec("a/b:sub/m.gguf").unwrap(),
            ("a/b".into(), Some("sub/m.gguf".into()))
        );
        assert!(parse_spec("qwen").is_err());
        assert!(parse_spec("a/b:../x").is_err());
        assert!(parse_spec("a//b").is_err());
    }

    #[test]
    fn catalog_plans_pin_hashes_only_at_the_pinned_revision() {
        let c = Catalog::builtin().unwrap();
        let e = c.get("smollm2-135m-instruct").unwrap();
        let p = catalog_plan(e, Path::new("/m"), "http://h", None, None);
        assert_eq!(p.job.files.len(), 6);
        let w = p
            .job
            .files
            .iter()
            .find(|f| f.url.ends_with("model.safetensors"))
            .unwrap();
        assert_eq!(
            w.url,
            format!(
                "http://h/HuggingFaceTB/SmolLM2-135M-Instruct/resolve/{}/model.safetensors",
                e.revision
            )
        );
        assert_eq!(
            w.dest,
            Path::new("/m/HuggingFaceTB/SmolLM2-135M-Instruct/model.safetensors")
        );
        assert_eq!(w.expected.size, Some(269_060_552));
        assert!(w.expected.sha256.is_some());
        let other = catalog_plan(e, Path::new("/m"), "http://h", Some("main"), None);
        assert!(
            other
                .job
                .files
                .iter()
                .all(|f| f.expected == Expected::default())
        );
        assert!(other.job.files[0].url.contains("/resolve/main/"));
    }
}
