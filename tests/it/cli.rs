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

/// `laya complete` with the real 0.5B on the CPU: checking n-gram drafts gives the same text
/// as plain greedy decoding, in no more forwards, and the timing line says how many.
#[test]
fn drafts_change_the_forwards_not_the_text() {
    let _busy = crate::support::busy_cpu();
    let m = laya::catalog::find("qwen2.5-coder-0.5b").expect("catalog entry");
    assert!(
        m.is_present(),
        "qwen2.5-coder-0.5b is missing: run `laya models fetch qwen2.5-coder-0.5b` (scripts/test.sh does)"
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("args.py");
    // The line to complete repeats the shape of the lines above it: drafts from the prompt.
    std::fs::write(
        &file,
        "parser.add_argument(\"--input\", type=str, default=None, help=\"input file\")\nparser.add_argument(\"--output\", type=str, default=None, help=\"output file\")\nparser.add_argument(\"--config\", \n",
    )
    .unwrap();
    let mut runs = vec![];
    for speculation in ["off", "on"] {
        let (code, out, err) = run(laya()
            .arg("complete")
            .arg(format!("{}:3:32", file.display()))
            .args([
                "--device",
                "cpu",
                "--max-tokens",
                "12",
                "--speculation",
                speculation,
            ]));
        assert_eq!(code, 0, "{err}");
        let line = err
            .lines()
            .find(|l| l.contains("| decode "))
            .expect("a timing line")
            .to_owned();
        let counts: Vec<usize> = line
            .split("| decode ")
            .nth(1)
            .unwrap()
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .take(2)
            .collect();
        runs.push((out, counts, line));
    }
    let (plain, drafted) = (&runs[0], &runs[1]);
    assert_eq!(plain.0, drafted.0, "the same completion text");
    assert_eq!(
        plain.1[0], drafted.1[0],
        "the same tokens: {} / {}",
        plain.2, drafted.2
    );
    assert_eq!(
        plain.1[0], plain.1[1],
        "one forward a token without drafts: {}",
        plain.2
    );
    assert!(drafted.1[1] < drafted.1[0], "drafts were accepted: {}", drafted.2);
}
