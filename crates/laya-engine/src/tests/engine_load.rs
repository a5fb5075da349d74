//! Model files that are missing, truncated, corrupt or of the wrong kind give an error that
//! names the file (and the tensor, where one is at fault); nothing panics.

use std::{io::Write, path::PathBuf};

use super::{mlx, real_05b};
use crate::{
    load::{EngineLoadError, LoadOptions},
    local::LocalModel,
    seam::Precision,
    synthetic::gguf,
};

/// A model file to break: its bytes, a cut inside its tensor data, cuts inside its header
/// and tensor table, and a length that holds the whole header.
struct Breakable {
    what: &'static str,
    bytes: Vec<u8>,
    in_data: usize,
    in_header: Vec<usize>,
    header: usize,
}

/// The tiny GGUF of `synthetic::gguf` (F32 tensors), and with `LAYA_TEST_REAL_MODELS=1` the
/// real 0.5B too (quantized tensors; its header and tensor table fit in its first 6 MB).
fn breakables() -> Vec<Breakable> {
    let tiny = gguf::tiny_gguf();
    let mut v = vec![Breakable {
        what: "tiny",
        in_data: tiny.data_offset + (tiny.bytes.len() - tiny.data_offset) / 2,
        in_header: vec![3, 8, 24, 100, tiny.table.start + 5, tiny.data_offset - 1],
        header: tiny.data_offset + 64,
        bytes: tiny.bytes,
    }];
    if crate::testing::real_models() {
        let path = real_05b().expect("the switch is on");
        v.push(Breakable {
            what: "qwen2.5-coder-0.5b",
            bytes: std::fs::read(path).unwrap(),
            in_data: 20_000_000,
            in_header: vec![3, 8, 24, 100, 5_000, 5_947_000],
            header: 6_000_000,
        });
    }
    v
}

fn load_err(path: &std::path::Path) -> String {
    let (_g, _b) = mlx();
    let opts = LoadOptions {
        precision: Precision::Q8,
        group_size: 64,
        use_cache: false,
        progress: false,
        ..Default::default()
    };
    match LocalModel::load(path, &opts) {
        Ok(_) => panic!("{} loaded", path.display()),
        // A failed load is a load error (the file, a tensor or the tokenizer), never a
        // request's: `LocalModel::load` returns `EngineLoadError`.
        Err(e) => {
            let e: EngineLoadError = e;
            e.to_string()
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
    // Cut in the middle of the tensor data, so parsing succeeds and reading a tensor must
    // fail cleanly.
    for b in breakables() {
        let (_d, path) = write_temp("truncated.gguf", &b.bytes[..b.in_data]);
        let msg = load_err(&path);
        assert!(msg.contains("truncated.gguf"), "{}: {msg}", b.what);
        assert!(
            msg.contains("tensor"),
            "{}: should name the tensor: {msg}",
            b.what
        );
    }
}

#[test]
fn corrupt_header_is_an_error_not_a_panic() {
    for b in breakables() {
        for &cut in &b.in_header {
            let (_d, path) = write_temp("cut.gguf", &b.bytes[..cut]);
            let msg = load_err(&path);
            assert!(msg.contains("cut.gguf"), "{} cut at {cut}: {msg}", b.what);
        }
        // A tensor count far beyond the file: must not try to allocate it.
        let mut bytes = b.bytes[..b.header].to_vec();
        bytes[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        let (_d, path) = write_temp("count.gguf", &bytes);
        load_err(&path);
    }
}

#[test]
fn folder_without_config_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let msg = load_err(dir.path());
    assert!(msg.contains("config.json"), "{msg}");
}
