//! The tests of the real models and of the llama.cpp peer run behind one switch,
//! `LAYA_TEST_REAL_MODELS=1` ([`laya::testing`]; `scripts/test.sh` sets it): without it they
//! are skipped, saying so; with it, a model or venv that is missing fails them.

use std::path::PathBuf;

/// The catalog model `name` (`qwen2.5-coder-0.5b`), for a test of its real outputs: its file
/// with the switch on (a failure naming `laya models fetch NAME` when it is not there whole),
/// `None` with the switch off.
#[track_caller]
pub fn model(name: &str) -> Option<PathBuf> {
    let m = laya::catalog::find(name).unwrap_or_else(|| panic!("no catalog entry {name}"));
    laya::testing::needs(
        m.local_path(),
        laya::fetch::is_present(m),
        &format!("laya models fetch {name}"),
    )
}

/// The llama.cpp peer's Python (`scripts/peer-setup.sh`) with the switch on, `None` with it
/// off.
#[track_caller]
pub fn peer_python() -> Option<PathBuf> {
    laya::testing::peer_python()
}
