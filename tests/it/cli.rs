//! The command line fails with one clear line naming the fix, never a panic.

use crate::support::{laya, run};

#[test]
fn doctor_reports_mlx_and_names_the_fix_for_a_missing_model() {
    let empty = tempfile::tempdir().unwrap();
    let (code, out, _) = run(laya()
        .arg("doctor")
        .env("LAYA_MODEL_DIR", empty.path())
        .env_remove("LAYA_DEVICE"));
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("mlx version   0.32.2 (built against 0.32.2): ok"),
        "{out}"
    );
    assert!(out.contains("libmlx        /"), "{out}");
    assert!(
        out.contains("qwen2.5-coder-0.5b   missing (default): run `laya models fetch qwen2.5-coder-0.5b`"),
        "{out}"
    );
}

#[test]
fn complete_without_the_model_names_the_fetch_command() {
    let empty = tempfile::tempdir().unwrap();
    let file = empty.path().join("a.py");
    std::fs::write(&file, "x = 1\n").unwrap();
    let (code, _, err) = run(laya()
        .arg("complete")
        .arg(format!("{}:1:1", file.display()))
        .env("LAYA_MODEL_DIR", empty.path()));
    assert_eq!(code, 1);
    assert_eq!(
        err.trim(),
        "error: model qwen2.5-coder-0.5b is not downloaded: run `laya models fetch qwen2.5-coder-0.5b`"
    );
}

#[test]
fn bad_locations_are_explained() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("b.py");
    std::fs::write(&file, "one\ntwo\n").unwrap();
    for (loc, want) in [
        ("nocolons".to_owned(), "expected FILE:LINE:COL"),
        (
            format!("{}:9:1", file.display()),
            "line 9 is past the end of the file",
        ),
        (
            format!("{}:1:9", file.display()),
            "column 9 is past the end of line 1",
        ),
        ("/no/such/file.py:1:1".to_owned(), "reading /no/such/file.py"),
    ] {
        let (code, _, err) = run(laya().args(["complete", &loc]));
        assert_eq!(code, 1, "{loc}");
        assert!(err.starts_with("error: ") && err.contains(want), "{loc}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn unknown_model_names_are_listed() {
    let (code, _, err) = run(laya().args(["models", "fetch", "no-such-model"]));
    assert_eq!(code, 1);
    assert!(
        err.contains("unknown model `no-such-model`; known: qwen2.5-coder-0.5b"),
        "{err}"
    );
}
