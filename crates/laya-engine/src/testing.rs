//! The one switch of laya's tests: `LAYA_TEST_REAL_MODELS=1` runs the tests that need what
//! `cargo test` alone does not have, the real models in the model directory (`laya models
//! fetch`) and the llama.cpp peer (`scripts/peer-setup.sh`'s llama-cpp-python venv).
//! `scripts/test.sh` (and so CI) sets it and prepares both.
//!
//! Without it those tests are skipped: each says so on stderr (past the test harness's
//! capture, so the line shows in a plain `cargo test`) and passes without checking anything.
//! They are the tests of the real models' own outputs (llama.cpp's tokenization and logits,
//! the 1.5B's size in the router's estimate, a real llama.cpp server). What does not depend on
//! the real weights (loading a GGUF, serving a request end to end, the daemon, the CLI, the
//! soak) runs either way, on tiny models the tests write. With the switch on, a model or
//! venv that is missing fails the test that needs it, naming the command that fixes it.
//! Both crates' tests that build MLX graphs take [`mlx`] first: one at a time, on the device
//! `LAYA_DEVICE` names.

use std::{
    io::Write,
    path::PathBuf,
    sync::{Mutex, MutexGuard},
};

use crate::runtime::{use_device, DevicePref};

/// MLX graphs are built from one thread at a time in laya (one worker per model); tests
/// follow the same rule.
static MLX: Mutex<()> = Mutex::new(());

/// Take the MLX lock and select the device named by `LAYA_DEVICE` (default cpu), so the
/// same tests run on the CPU here and on a GPU through `scripts/gpu/cuda-ops.sh`.
pub fn mlx() -> (MutexGuard<'static, ()>, Backend) {
    let guard = MLX.lock().unwrap_or_else(|p| p.into_inner());
    let pref = match std::env::var("LAYA_DEVICE").as_deref() {
        Ok("gpu") => DevicePref::Gpu,
        Ok("auto") => DevicePref::Auto,
        _ => DevicePref::Cpu,
    };
    let desc = use_device(pref).expect("select MLX device");
    let backend = if desc.starts_with("gpu") {
        Backend::Gpu
    } else {
        Backend::Cpu
    };
    (guard, backend)
}

/// The device [`mlx`] selected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Cpu,
    Gpu,
}

/// The environment variable of the switch: `1` on; unset, empty or `0` off.
pub(crate) const REAL_MODELS: &str = "LAYA_TEST_REAL_MODELS";

/// Whether the tests of the real models and the llama.cpp peer run (see the module doc). Any
/// value but `1`, `0` or empty is a mistake and fails the test that asks.
pub(crate) fn real_models() -> bool {
    match std::env::var(REAL_MODELS).as_deref() {
        Ok("1") => true,
        Ok("" | "0") | Err(std::env::VarError::NotPresent) => false,
        Ok(other) => panic!("{REAL_MODELS}={other:?}: set it to 1 (on) or leave it unset (off)"),
        Err(std::env::VarError::NotUnicode(v)) => {
            panic!("{REAL_MODELS}={v:?}: set it to 1 (on) or leave it unset (off)")
        }
    }
}

/// Says on stderr, past the test harness's capture, that the running test is skipped because
/// it needs `what`.
fn skip(what: &str) {
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("a test");
    let _ = writeln!(
        std::io::stderr(),
        "{test}: skipped: it needs {what} ({REAL_MODELS}=1 runs it; scripts/test.sh sets it)"
    );
}

/// For a test that needs the real file `path` (a model: `present` when it is there whole):
/// with the switch on, `path`, or a failure that names `fix` when it is not present; with the
/// switch off, `None`, and the test says it is skipped.
#[track_caller]
pub fn needs(path: PathBuf, present: bool, fix: &str) -> Option<PathBuf> {
    if !real_models() {
        skip(&format!("the real model {}", path.display()));
        return None;
    }
    assert!(
        present,
        "{REAL_MODELS}=1 and {} is missing: run `{fix}` (scripts/test.sh does)",
        path.display()
    );
    Some(path)
}

/// [`needs`] for the model file `file_name` of the model directory
/// ([`crate::paths::model_dir`]), present when it is a file; `fix` is the command that
/// fetches it (`laya models fetch NAME`).
#[track_caller]
#[cfg(test)]
pub(crate) fn real_model(file_name: &str, fix: &str) -> Option<PathBuf> {
    let path = crate::paths::model_dir().join(file_name);
    let present = path.is_file();
    needs(path, present, fix)
}

/// For a test that runs the llama.cpp peer: its Python (`crate::paths::peer_python`) with
/// the switch on, or a failure that says how to make it; `None` with the switch off.
#[track_caller]
pub fn peer_python() -> Option<PathBuf> {
    if !real_models() {
        skip("the llama.cpp peer (scripts/peer-setup.sh)");
        return None;
    }
    match crate::paths::peer_python() {
        Ok(py) => Some(py),
        Err(e) => panic!("{REAL_MODELS}=1 and {e}"),
    }
}
