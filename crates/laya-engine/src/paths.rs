//! Where laya keeps things on disk. One place, so `doctor`, `models` and the engine agree.

use std::path::PathBuf;

/// `$LAYA_CACHE_DIR`, else `${XDG_CACHE_HOME:-~/.cache}/laya`.
pub fn cache_root() -> PathBuf {
    if let Some(p) = std::env::var_os("LAYA_CACHE_DIR").filter(|v| !v.is_empty()) {
        return PathBuf::from(p);
    }
    std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("laya")
}

/// `$LAYA_MODEL_DIR`, else `<cache>/models`. Model files live here by file name.
pub fn model_dir() -> PathBuf {
    std::env::var_os("LAYA_MODEL_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| cache_root().join("models"))
}

/// Converted (re-quantized) weights, keyed by source and settings.
pub(crate) fn converted_dir() -> PathBuf {
    cache_root().join("converted")
}

/// MLX's compiled GPU kernels, `<cache>/kernels/mlx-<version>` (given to MLX as
/// `MLX_PTX_CACHE_DIR`: its own default is under the temporary directory, which a reboot may
/// empty, and then the first model load compiles every kernel again).
pub(crate) fn kernel_dir() -> PathBuf {
    cache_root()
        .join("kernels")
        .join(format!("mlx-{}", mlx_sys::MLX_BUILD_VERSION))
}

/// The Python of the llama.cpp peer (llama-cpp-python and gguf-py), for the tests and
/// benchmarks that compare with llama.cpp: `LAYA_PEER_PYTHON`, else the venv
/// `scripts/peer-setup.sh` makes under the cache; an error naming the fix when it is missing.
pub(crate) fn peer_python() -> Result<PathBuf, NoPeerPython> {
    let py = std::env::var_os("LAYA_PEER_PYTHON")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| cache_root().join("peer-venv/bin/python"));
    if py.is_file() {
        Ok(py)
    } else {
        Err(NoPeerPython(py))
    }
}

/// The llama.cpp peer's Python is not where [`peer_python`] looked.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "no llama-cpp-python at {}: run scripts/peer-setup.sh (it prints the python to put in \
     LAYA_PEER_PYTHON), or scripts/test.sh, which runs it",
    .0.display()
)]
pub(crate) struct NoPeerPython(pub PathBuf);
