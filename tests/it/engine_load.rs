//! Model files that are missing, truncated, corrupt or of the wrong kind give an error that
//! names the file (and the tensor, where one is at fault); nothing panics.

use crate::support;
use std::{io::Write, path::PathBuf};

use laya::engine::{
    load::{LoadOptions, Precision},
    EngineError, LocalModel,
};

fn real_model() -> PathBuf {
    let m = laya::catalog::find("qwen2.5-coder-0.5b").unwrap();
    assert!(
        m.is_present(),
        "run `laya models fetch qwen2.5-coder-0.5b` first (scripts/test.sh does)"
    );
    m.local_path()
}

fn load_err(path: &std::path::Path) -> String {
    let (_g, _b) = support::mlx();
    let opts = LoadOptions {
        precision: Precision::Q8,
        group_size: 64,
        use_cache: false,
        progress: false,
        ..Default::default()
    };
    match LocalModel::load(path, &opts) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => {
            let msg = e.to_string();
            assert!(
                matches!(e, EngineError::Load(_) | EngineError::Tokenizer(_)),
                "{msg}"
            );
            msg
        }
    }
}

fn write_temp(name: &str, bytes: &[u8]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::File::create(&path).unwrap().write_all(bytes).unwrap();
    (dir, path)
}

#[test]
fn missing_file_names_the_fix() {
    let msg = load_err(std::path::Path::new("/nonexistent/model.gguf"));
    assert!(
        msg.contains("/nonexistent/model.gguf") && msg.contains("laya models fetch"),
        "{msg}"
    );
}

#[test]
fn wrong_magic_is_rejected_with_the_file_name() {
    let (_d, path) = write_temp("notgguf.gguf", b"PK\x03\x04 this is a zip, not a model");
    let msg = load_err(&path);
    assert!(
        msg.contains("notgguf.gguf") && msg.contains("not a GGUF"),
        "{msg}"
    );
}

#[test]
fn truncated_model_names_the_file_and_the_tensor() {
    // The header and tensor table of the real file fit in its first 6 MB; cut in the middle
    // of the tensor data, so parsing succeeds and reading a tensor must fail cleanly.
    let bytes = std::fs::read(real_model()).unwrap();
    let (_d, path) = write_temp("truncated.gguf", &bytes[..20_000_000]);
    let msg = load_err(&path);
    assert!(msg.contains("truncated.gguf"), "{msg}");
    assert!(msg.contains("tensor"), "should name the tensor: {msg}");
}

#[test]
fn corrupt_header_is_an_error_not_a_panic() {
    let bytes = std::fs::read(real_model()).unwrap();
    for cut in [3usize, 8, 24, 100, 5_000, 5_947_000] {
        let (_d, path) = write_temp("cut.gguf", &bytes[..cut]);
        let msg = load_err(&path);
        assert!(msg.contains("cut.gguf"), "cut at {cut}: {msg}");
    }
    // A tensor count far beyond the file: must not try to allocate it.
    let mut b = bytes[..6_000_000].to_vec();
    b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    let (_d, path) = write_temp("count.gguf", &b);
    load_err(&path);
}

#[test]
fn folder_without_config_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let msg = load_err(dir.path());
    assert!(msg.contains("config.json"), "{msg}");
}
