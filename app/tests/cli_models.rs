//! `drift models ...` end to end: the real binary against a real HTTP server on 127.0.0.1 standing
//! in for the Hugging Face hub (`HF_ENDPOINT`): the model API, `resolve` redirects carrying
//! `X-Linked-Etag`, and a CDN. Files land in a temporary `DRIFT_HOME`.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use sha2::{Digest, Sha256};

/// repo -> (path -> bytes)
type Repos = HashMap<String, Vec<(String, Vec<u8>)>>;

const TOKEN: &str = "hf_test_token";

struct Hub {
    base: String,
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fixtures")
}

fn sha(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

fn is_lfs(path: &str) -> bool {
    path.ends_with(".gguf") || path.ends_with(".safetensors")
}

impl Hub {
    fn start() -> Hub {
        let read = |p: &str| std::fs::read(fixtures().join(p)).unwrap();
        let mut repos: Repos = HashMap::new();
        repos.insert(
            "test-org/tiny-gguf".into(),
            vec![
                ("a.gguf".into(), read("gguf/all_types.gguf")),
                ("b.gguf".into(), read("gguf/tok_gpt2.gguf")),
                // The CDN will corrupt this one (see `handle`).
                ("bad.gguf".into(), read("gguf/all_types.gguf")),
                ("README.md".into(), b"# tiny".to_vec()),
            ],
        );
        let llama = [
            "config.json",
            "generation_config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "model.safetensors",
        ];
        repos.insert(
            "test-org/tiny-llama".into(),
            llama
                .iter()
                .map(|f| (f.to_string(), read(&format!("llm/llama-gqa/{f}"))))
                .collect(),
        );
        repos.insert(
            "gated-org/model".into(),
            vec![("m.gguf".into(), read("gguf/all_types.gguf"))],
        );
        let repos = Arc::new(repos);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let repos = repos.clone();
                std::thread::spawn(move || {
                    let _ = handle(stream, &repos);
                });
            }
        });
        Hub { base }
    }
}

fn respond(
    s: &mut TcpStream,
    status: &str,
    headers: &str,
    body: &[u8],
    head: bool,
) -> std::io::Result<()> {
    write!(
        s,
        "HTTP/1.1 {status}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    if !head {
        s.write_all(body)?;
    }
    s.flush()
}

fn handle(mut stream: TcpStream, repos: &Repos) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let head = parts.next() == Some("HEAD");
    let target = parts.next().unwrap_or("/").to_string();
    let mut auth = None;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h == "\r\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':')
            && k.eq_ignore_ascii_case("authorization")
        {
            auth = Some(v.trim().to_string());
        }
    }
    let path = target.split('?').next().unwrap_or("").to_string();
    let authorized = auth.as_deref() == Some(&format!("Bearer {TOKEN}"));
    let gated = |repo: &str| repo.starts_with("gated-org/") && !authorized;

    // The model API: /api/models/{org}/{name}
    if let Some(repo) = path.strip_prefix("/api/models/") {
        let Some(files) = repos.get(repo) else {
            return respond(
                &mut stream,
                "404 Not Found",
                "",
                br#"{"error":"Repository not found"}"#,
                head,
            );
        };
        let siblings: Vec<_> = files
            .iter()
            .map(|(p, b)| {
                if is_lfs(p) {
                    serde_json::json!({"rfilename": p, "size": b.len(),
                        "lfs": {"sha256": sha(b), "size": b.len(), "pointerSize": 134}})
                } else {
                    serde_json::json!({"rfilename": p, "size": b.len()})
                }
            })
            .collect();
        let body = serde_json::json!({"id": repo, "sha": "c0ffee", "gated": repo.starts_with("gated-org/"),
            "siblings": siblings});
        return respond(
            &mut stream,
            "200 OK",
            "Content-Type: application/json\r\n",
            body.to_string().as_bytes(),
            head,
        );
    }
    // The CDN: /cdn/{org}/{name}/{file}
    if let Some(rest) = path.strip_prefix("/cdn/") {
        let mut it = rest.splitn(3, '/');
        let (org, name, file) = (
            it.next().unwrap_or(""),
            it.next().unwrap_or(""),
            it.next().unwrap_or(""),
        );
        let Some((_, bytes)) = repos
            .get(&format!("{org}/{name}"))
            .and_then(|f| f.iter().find(|(p, _)| p == file))
        else {
            return respond(&mut stream, "404 Not Found", "", b"", head);
        };
        let mut body = bytes.clone();
        if file == "bad.gguf" {
            let i = body.len() / 2;
            body[i] ^= 0x40;
        }
        return respond(&mut stream, "200 OK", "", &body, head);
    }
    // resolve: /{org}/{name}/resolve/{rev}/{file}
    let segs: Vec<&str> = path.trim_start_matches('/').splitn(5, '/').collect();
    if let [org, name, "resolve", _rev, file] = segs.as_slice() {
        let repo = format!("{org}/{name}");
        if gated(&repo) {
            return respond(&mut stream, "401 Unauthorized", "", b"", head);
        }
        let Some((_, bytes)) = repos
            .get(&repo)
            .and_then(|f| f.iter().find(|(p, _)| p == file))
        else {
            return respond(
                &mut stream,
                "404 Not Found",
                "X-Error-Code: EntryNotFound\r\n",
                b"",
                head,
            );
        };
        if is_lfs(file) {
            let headers = format!(
                "Location: /cdn/{repo}/{file}\r\nX-Linked-Etag: \"{}\"\r\nX-Linked-Size: {}\r\nX-Repo-Commit: c0ffee\r\n",
                sha(bytes),
                bytes.len()
            );
            return respond(&mut stream, "302 Found", &headers, b"", head);
        }
        return respond(
            &mut stream,
            "200 OK",
            "X-Repo-Commit: c0ffee\r\n",
            bytes,
            head,
        );
    }
    respond(&mut stream, "404 Not Found", "", b"", head)
}

struct Env {
    home: PathBuf,
    hub: Hub,
}

impl Env {
    fn new(name: &str) -> Env {
        let home =
            std::env::temp_dir().join(format!("drift-cli-models-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&home);
        std::fs::create_dir_all(&home).unwrap();
        Env {
            home,
            hub: Hub::start(),
        }
    }

    fn models(&self) -> PathBuf {
        self.home.join("data/models")
    }

    fn drift(&self, args: &[&str]) -> (bool, String, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_drift"))
            .arg("models")
            .args(args)
            .env("DRIFT_HOME", &self.home)
            .env("HF_ENDPOINT", &self.hub.base)
            // An empty hub cache of its own, and no token from the developer's environment.
            .env("HF_HOME", self.home.join("hf"))
            .env_remove("HF_HUB_CACHE")
            .env_remove("HF_TOKEN")
            .output()
            .expect("drift runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn list_ids(&self) -> Vec<(String, String)> {
        let (ok, out, err) = self.drift(&["list", "--json"]);
        assert!(ok, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["id"].as_str().unwrap().to_string(),
                    e["format"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.home);
    }
}

#[test]
fn pull_list_and_rm_a_gguf_file() {
    let env = Env::new("gguf");
    assert!(env.list_ids().is_empty());
    let (ok, out, err) = env.drift(&["pull", "test-org/tiny-gguf:a.gguf"]);
    assert!(ok, "{err}");
    // Progress lines (stderr is not a terminal here) and the verified result.
    assert!(err.contains("100%"), "{err}");
    assert!(out.contains("sha256 verified for 1 of 1 files"), "{out}");
    let got = std::fs::read(env.models().join("test-org/tiny-gguf/a.gguf")).unwrap();
    assert_eq!(
        got,
        std::fs::read(fixtures().join("gguf/all_types.gguf")).unwrap()
    );
    assert_eq!(
        env.list_ids(),
        [("test-org/tiny-gguf/a.gguf".to_string(), "gguf".to_string())]
    );
    let (ok, table, _) = env.drift(&["list"]);
    assert!(
        ok && table.contains("test-org/tiny-gguf/a.gguf") && table.contains("device memory"),
        "{table}"
    );

    // Pulling again finds the verified file and fetches nothing.
    let (ok, out, err) = env.drift(&["pull", "test-org/tiny-gguf", "--file", "a.gguf"]);
    assert!(ok, "{err}");
    assert!(out.contains("downloaded"), "{out}");

    // Deleting needs a confirmation; --yes gives it.
    let (ok, _, err) = env.drift(&["rm", "test-org/tiny-gguf/a.gguf"]);
    assert!(!ok && err.contains("--yes"), "{err}");
    assert!(env.models().join("test-org/tiny-gguf/a.gguf").exists());
    let (ok, out, err) = env.drift(&["rm", "tiny-gguf/a.gguf", "--yes"]);
    assert!(ok, "{err}");
    assert!(out.contains("deleted"), "{out}");
    assert!(
        !env.models().join("test-org").exists(),
        "empty folders are pruned"
    );
    assert!(env.list_ids().is_empty());
}

#[test]
fn a_repo_without_a_file_lists_its_models_and_the_folder_is_pulled() {
    let env = Env::new("repo");
    let (ok, _, err) = env.drift(&["pull", "test-org/tiny-gguf"]);
    assert!(!ok);
    assert!(
        err.contains("a.gguf") && err.contains("b.gguf") && err.contains("--file"),
        "{err}"
    );
    assert!(!err.contains("README"), "{err}");

    let (ok, out, err) = env.drift(&["pull", "test-org/tiny-llama"]);
    assert!(ok, "{err}");
    assert!(out.contains("sha256 verified for 1 of 5 files"), "{out}");
    assert_eq!(
        env.list_ids(),
        [("test-org/tiny-llama".to_string(), "safetensors".to_string())]
    );
    for f in ["config.json", "tokenizer.json", "model.safetensors"] {
        let a = std::fs::read(env.models().join("test-org/tiny-llama").join(f)).unwrap();
        assert_eq!(
            a,
            std::fs::read(fixtures().join("llm/llama-gqa").join(f)).unwrap(),
            "{f}"
        );
    }
}

#[test]
fn errors_are_clear_and_nothing_unverified_is_kept() {
    let env = Env::new("errors");
    let (ok, _, err) = env.drift(&["pull", "test-org/tiny-gguf:missing.gguf"]);
    assert!(!ok && err.contains("not found (HTTP 404)"), "{err}");
    let (ok, _, err) = env.drift(&["pull", "nobody/nothing"]);
    assert!(!ok && err.contains("not found (HTTP 404)"), "{err}");
    let (ok, _, err) = env.drift(&["pull", "no-such-model-id"]);
    assert!(!ok && err.contains("neither a catalog id nor"), "{err}");

    // The CDN corrupts a byte: the hub's X-Linked-Etag catches it.
    let (ok, _, err) = env.drift(&["pull", "test-org/tiny-gguf:bad.gguf"]);
    assert!(!ok && err.contains("sha256 mismatch"), "{err}");
    let dir = env.models().join("test-org/tiny-gguf");
    assert!(!dir.join("bad.gguf").exists() && !dir.join("bad.gguf.part").exists());

    // Gated: a clear message without a token, success with one.
    let (ok, _, err) = env.drift(&["pull", "gated-org/model:m.gguf"]);
    assert!(
        !ok && err.contains("gated model: needs a Hugging Face token"),
        "{err}"
    );
    let (ok, _, err) = env.drift(&["pull", "gated-org/model:m.gguf", "--token", TOKEN]);
    assert!(ok, "{err}");
    // A gated catalog entry is refused before any request without a token.
    let (ok, _, err) = env.drift(&["pull", "llama-3.2-1b-instruct"]);
    assert!(!ok && err.contains("is gated"), "{err}");
}

#[test]
fn search_and_import() {
    let env = Env::new("search");
    let (ok, out, err) = env.drift(&["search", "qwen", "3b"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("qwen2.5-3b-instruct-q4_k_m") && !out.contains("smollm2"),
        "{out}"
    );
    let (ok, out, _) = env.drift(&["search", "--json"]);
    assert!(ok);
    assert!(
        serde_json::from_str::<serde_json::Value>(&out)
            .unwrap()
            .as_array()
            .unwrap()
            .len()
            >= 12
    );

    let loose = env.home.join("loose.gguf");
    std::fs::copy(fixtures().join("gguf/all_types.gguf"), &loose).unwrap();
    let (ok, out, err) = env.drift(&["import", loose.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(out.contains("imported imported:loose.gguf"), "{out}");
    assert_eq!(
        env.list_ids(),
        [("imported:loose.gguf".to_string(), "gguf".to_string())]
    );
    let (ok, _, err) = env.drift(&["import", env.home.join("nope.gguf").to_str().unwrap()]);
    assert!(!ok && err.contains("does not exist"), "{err}");
    // Removing an import forgets it and leaves the file.
    let (ok, _, err) = env.drift(&["rm", "imported:loose.gguf", "--yes"]);
    assert!(ok, "{err}");
    assert!(loose.exists() && env.list_ids().is_empty());
}
