//! Faults and how laya comes through them: missing, truncated and corrupt weights (in the
//! engine, the daemon and an editor), a daemon killed mid-request, the files a killed daemon
//! leaves behind, a full disk under the converted-weights cache, and clients that vanish
//! mid-stream. Each gives a clear error and recovers; none hangs a client.
//!
//! Models are the tiny GGUF of `support::gguf` (written here; it writes `a` until told to stop)
//! or the stub OpenAI server of `support::daemon`, so the whole file runs in seconds.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use crate::support::{self, daemon::*, gguf, laya};
use laya::{
    daemon::paths::{read_http_addr, read_pid},
    engine::{Cancel, CompletionRequest, LoadOptions, LocalModel, Precision},
};
use serde_json::{json, Value};

const FIM: &str = "<|fim_prefix|>x = <|fim_suffix|>\n<|fim_middle|>";

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// The tiny model cut at half (in the middle of its tensor data), and with its tensor table
/// corrupted (the type field of a tensor's info flipped).
fn broken_models(dir: &Path) -> [(&'static str, PathBuf); 2] {
    let tiny = gguf::tiny_gguf();
    let half = tiny.bytes.len() / 2;
    assert!(half > tiny.data_offset, "the cut falls in the tensor data");
    let mut corrupt = tiny.bytes.clone();
    let info = tiny.info("blk.0.attn_q.weight");
    for b in &mut corrupt[info.end - 12..info.end - 8] {
        *b ^= 0xFF;
    }
    [
        ("truncated", write(dir, "truncated.gguf", &tiny.bytes[..half])),
        ("corrupt", write(dir, "corrupt.gguf", &corrupt)),
    ]
}

fn load_options() -> LoadOptions {
    LoadOptions {
        precision: Precision::Q8,
        group_size: 64,
        use_cache: false,
        progress: false,
        ..Default::default()
    }
}

fn request(max_tokens: usize) -> CompletionRequest {
    CompletionRequest::new(FIM, max_tokens)
}

#[test]
fn truncated_and_corrupt_model_files_are_errors_naming_the_file_never_panics() {
    let (_g, _b) = support::mlx();
    let tmp = tempfile::tempdir().unwrap();
    let tiny = gguf::tiny_gguf();
    // The intact file loads and writes its token: each case below differs from it only by
    // its fault.
    let good = write(tmp.path(), "tiny.gguf", &tiny.bytes);
    let model = LocalModel::load(&good, &load_options()).unwrap();
    let out = model.complete(&request(4), &Cancel::new()).unwrap();
    assert_eq!(out.choices[0].text, gguf::TOKEN_TEXT.repeat(4));
    drop(model);

    let set = |bytes: &mut Vec<u8>, at: usize, v: &[u8]| bytes[at..at + v.len()].copy_from_slice(v);
    let info = |name: &str| tiny.info(name);
    let mut cases: Vec<(&str, Vec<u8>, &str)> = vec![];
    // Cut in the middle of the tensor data: the first tensor past the cut is named.
    cases.push(("cut", tiny.bytes[..tiny.bytes.len() / 2].to_vec(), "tensor"));
    // The tensor table: an unknown type, a dimension past any file, an offset past the end,
    // a renamed tensor (the model then misses a weight), and dimensions swapped (the same
    // number of values in the wrong shape).
    let mut b = tiny.bytes.clone();
    let r = info("blk.0.attn_q.weight");
    set(&mut b, r.end - 12, &0xFFFF_FFFFu32.to_le_bytes());
    cases.push(("type", b, "blk.0.attn_q.weight"));
    let mut b = tiny.bytes.clone();
    let r = info("blk.1.ffn_up.weight");
    let dims_at = r.start + 8 + "blk.1.ffn_up.weight".len() + 4;
    set(&mut b, dims_at, &(u64::MAX / 2).to_le_bytes());
    cases.push(("dims", b, "blk.1.ffn_up.weight"));
    let mut b = tiny.bytes.clone();
    let r = info("output_norm.weight");
    set(&mut b, r.end - 8, &(1u64 << 40).to_le_bytes());
    cases.push(("offset", b, "output_norm.weight"));
    let mut b = tiny.bytes.clone();
    let r = info("blk.1.attn_k.bias");
    set(&mut b, r.start + 8, b"blk.1.attn_x");
    cases.push(("renamed", b, "k_proj"));
    let mut b = tiny.bytes.clone();
    let r = info("blk.0.ffn_gate.weight");
    let dims_at = r.start + 8 + "blk.0.ffn_gate.weight".len() + 4;
    set(&mut b, dims_at, &128u64.to_le_bytes());
    set(&mut b, dims_at + 8, &64u64.to_le_bytes());
    cases.push(("shape", b, "gate_proj"));
    for (what, bytes, names) in &cases {
        let path = write(tmp.path(), &format!("{what}.gguf"), bytes);
        let msg = match LocalModel::load(&path, &load_options()) {
            Ok(_) => panic!("{what}: loaded"),
            Err(e) => e.to_string(),
        };
        eprintln!("{what}: {msg}");
        assert!(
            msg.contains(&format!("{what}.gguf")),
            "{what}: names the file: {msg}"
        );
        assert!(msg.contains(names), "{what}: names {names}: {msg}");
    }

    // Every byte of the header, metadata and tensor table flipped in turn (every 3rd byte of
    // the vocabulary, whose strings are alike): an error naming the file, or a model that
    // loads and answers; never a panic.
    let vocab = {
        let key = b"tokenizer.ggml.tokens";
        let at = tiny.bytes.windows(key.len()).position(|w| w == key).unwrap();
        at..tiny.table.start - 64
    };
    let path = tmp.path().join("flipped.gguf");
    let (mut errors, mut loaded) = (0, 0);
    let started = Instant::now();
    for at in (0..tiny.data_offset).filter(|i| !vocab.contains(i) || i % 3 == 0) {
        let mut b = tiny.bytes.clone();
        b[at] ^= 0xFF;
        std::fs::write(&path, &b).unwrap();
        let result = std::panic::catch_unwind(|| match LocalModel::load(&path, &load_options()) {
            Ok(m) => m
                .complete(&request(2), &Cancel::new())
                .map(|_| ())
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        });
        match result {
            Ok(Ok(())) => loaded += 1,
            Ok(Err(msg)) => {
                errors += 1;
                assert!(
                    msg.contains("flipped.gguf"),
                    "byte {at}: the error names the file: {msg}"
                );
            }
            Err(_) => panic!("byte {at} flipped: the loader panicked"),
        }
    }
    eprintln!(
        "flipped {} bytes one at a time: {errors} errors naming the file, {loaded} loaded and answered, 0 panics ({:.1} s)",
        errors + loaded,
        started.elapsed().as_secs_f64()
    );
    assert!(errors > 0 && loaded > 0);
}

/// `/health` once the default model is no longer loading.
fn settled_health(addr: SocketAddr) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let h = ok_json(addr, "GET", "/health", None);
        if h["status"] != "loading" {
            return h;
        }
        assert!(Instant::now() < deadline, "the model is still loading: {h}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn tiny_serve_args(model: &Path) -> Vec<String> {
    let model = model.display().to_string();
    ["--small", &model, "--large", "none", "--http-addr", "127.0.0.1:0"]
        .map(str::to_owned)
        .to_vec()
}

/// Put `bytes` at `path` the way `laya models fetch` does: a new file renamed over the old.
fn replace(path: &Path, bytes: &[u8]) {
    let part = path.with_extension("part");
    std::fs::write(&part, bytes).unwrap();
    std::fs::rename(&part, path).unwrap();
}

#[test]
fn a_daemon_given_broken_weights_reports_them_answers_errors_and_loads_the_fixed_file() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    // A missing file: `laya serve` does not start, and says which file.
    let missing = tmp.path().join("missing.gguf");
    let out = laya()
        .args(["serve", "--small", &missing.display().to_string(), "--no-http"])
        .env("LAYA_RUNTIME_DIR", tmp.path().join("rt-missing"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(&missing.display().to_string()), "{err}");

    let good = gguf::tiny_gguf().bytes;
    for (what, model) in broken_models(tmp.path()) {
        let file = model.file_name().unwrap().to_string_lossy().into_owned();
        let dir = tmp.path().join(format!("rt-{what}"));
        let args = tiny_serve_args(&model);
        let mut d = serve_with(&dir, &args.iter().map(String::as_str).collect::<Vec<_>>(), |c| {
            c.env("LAYA_CACHE_DIR", &cache).stderr(Stdio::null());
        });
        let addr = d.http.unwrap();
        // The daemon stays up and says what failed.
        let h = settled_health(addr);
        assert_eq!(h["status"], "failed", "{what}: {h}");
        assert_eq!(h["models"][0]["state"], "failed", "{what}: {h}");
        let error = h["models"][0]["error"].as_str().unwrap_or_default();
        assert!(error.contains(&file), "{what}: /health names the file: {h}");
        // A completion gets that error at once (no wait for a model that will not come).
        let body = r#"{"prefix":"x = ","suffix":"\n","max_tokens":4}"#;
        let (code, text) = http(addr, "POST", "/complete", Some(body), &[]);
        let v = json_of(&text);
        assert_eq!(code, 503, "{what}: {text}");
        assert_eq!(v["error"]["type"], "model_unavailable", "{what}: {text}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(&file),
            "{what}: {text}"
        );
        let line = json!({ "op": "complete", "request": { "prompt": FIM, "max_tokens": 4 } }).to_string();
        let answer = socket_request(&dir, &line);
        assert_eq!(answer[0]["type"], "error", "{what}: {answer:?}");
        assert!(
            answer[0]["error"]["message"].as_str().unwrap().contains(&file),
            "{answer:?}"
        );
        assert!(
            d.child.try_wait().unwrap().is_none(),
            "{what}: the daemon is still up"
        );

        // The fix (the file fetched again) needs no restart: the next request loads it.
        replace(&model, &good);
        let c = ok_json(addr, "POST", "/complete", Some(body));
        assert_eq!(c["text"], gguf::TOKEN_TEXT.repeat(4), "{what}: {c}");
        assert_eq!(settled_health(addr)["status"], "ok", "{what}");
        assert_eq!(d.child.id(), ok_json(addr, "GET", "/health", None)["pid"]);
    }
}

#[test]
fn an_editor_keeps_working_without_completions_when_the_weights_are_missing_truncated_or_corrupt() {
    let tmp = tempfile::tempdir().unwrap();
    let [truncated, corrupt] = broken_models(tmp.path());
    let missing = ("missing", tmp.path().join("missing.gguf"));
    for (what, model) in [missing, truncated, corrupt] {
        let file = model.file_name().unwrap().to_string_lossy().into_owned();
        for in_process in [false, true] {
            let case = format!("{what}{}", if in_process { " (in process)" } else { " (daemon)" });
            let dir = tmp.path().join(format!("rt-{what}-{in_process}"));
            let _cleanup = KillDaemons(dir.clone());
            let model = model.display().to_string();
            let mut args = vec!["--small", &model, "--large", "none", "--no-http", "--no-cache"];
            if in_process {
                args.push("--in-process");
            }
            // The server starts (no exit before the handshake), and shows why it cannot complete.
            let mut p = lsp_with(&dir, &args, false);
            assert!(
                p.wait_log(
                    |l| l.starts_with("shown: ") && l.contains(&file),
                    Duration::from_secs(20)
                ),
                "{case}: {:?}",
                p.logs
            );
            assert_eq!(p.shown.len(), 1, "{case}: shown once: {:?}", p.shown);
            // Requests are answered, empty, and the server is still there for the next one.
            for i in 0..2 {
                let got = complete_in(&mut p, &format!("f{i}"), "def f():\n    return ");
                assert_eq!(got, None, "{case}: {:?}", p.logs);
            }
            assert!(
                p.wait_log(
                    |l| l.contains("completion failed") && l.contains(&file),
                    Duration::from_secs(5)
                ),
                "{case}: {:?}",
                p.logs
            );
            p.shutdown(Duration::from_secs(5));
        }
    }
}

#[test]
fn a_daemon_killed_mid_request_answers_the_editor_at_once_and_the_next_request_restarts_it() {
    let stub = stub();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("rt");
    let _cleanup = KillDaemons(dir.clone());
    let mut p = lsp(&dir, &stub);
    let got = complete_in(&mut p, "warm", "def f(a):\n    return ");
    assert_eq!(got, Some(vec![STUB_TEXT.to_owned()]), "{:?}", p.logs);
    let first = read_pid(&dir).expect("the editor started a daemon");
    let addr = read_http_addr(&dir).unwrap();

    // The model now takes a minute: the answers below can only come from the kill.
    stub.delay_ms.store(60_000, Ordering::Relaxed);
    let before = stub.prompts.lock().unwrap().len();
    let web = std::thread::spawn(move || {
        ureq::post(&format!("http://{addr}/v1/completions"))
            .set("Content-Type", "application/json")
            .timeout(Duration::from_secs(30))
            .send_string(r#"{"prompt":"def g(b):\n    return ","max_tokens":8}"#)
            .map(|r| r.status())
            .map_err(|e| match e {
                ureq::Error::Transport(t) => format!("transport: {t}"),
                other => format!("other: {other}"),
            })
    });
    let (prompts, d) = (stub.prompts.clone(), dir.clone());
    let killer = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(20);
        while prompts.lock().unwrap().len() < before + 2 {
            assert!(Instant::now() < deadline, "the requests did not reach the model");
            std::thread::sleep(Duration::from_millis(10));
        }
        kill_daemon(&d, first);
    });
    let got = complete_in(&mut p, "inflight", "def h(c):\n    return ");
    killer.join().unwrap();
    assert_eq!(got, None, "an empty answer, not a wait: {:?}", p.logs);
    // The log notification may come just after the empty answer.
    assert!(
        p.wait_log(
            |l| l.contains("completion failed") && l.contains("daemon"),
            Duration::from_secs(5)
        ),
        "{:?}",
        p.logs
    );
    match web.join().unwrap() {
        Err(t) if t.starts_with("transport: ") => {
            assert!(!t.contains("timed out"), "a connection error, not a timeout: {t}")
        }
        other => panic!("the HTTP client in flight gets a connection error: {other:?}"),
    }

    // The next request starts a new daemon and is answered.
    stub.delay_ms.store(0, Ordering::Relaxed);
    let got = complete_in(&mut p, "after", "def k(d):\n    return ");
    assert_eq!(got, Some(vec![STUB_TEXT.to_owned()]), "{:?}", p.logs);
    let second = read_pid(&dir).unwrap();
    assert_ne!(first, second);
    assert_eq!(daemons_for(&dir), vec![second]);
    assert!(
        p.shown.is_empty(),
        "a daemon that died is logged, not shown: {:?}",
        p.shown
    );
    p.shutdown(Duration::from_secs(5));
}

#[test]
fn the_files_a_killed_daemon_leaves_do_not_stop_the_next_one() {
    let stub = stub();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("rt");
    let args = stub_tiers(&stub, "127.0.0.1:0");
    let old = serve_in(&dir, &args);
    let old_pid = old.child.id();
    drop(old); // SIGKILL: nothing is cleaned up
    for f in ["laya.sock", "laya.pid", "laya.lock", "http.addr"] {
        assert!(
            std::fs::symlink_metadata(dir.join(f)).is_ok(),
            "a killed daemon leaves {f}"
        );
    }
    assert!(std::os::unix::net::UnixStream::connect(dir.join("laya.sock")).is_err());
    assert_eq!(read_pid(&dir), Some(old_pid));
    // A pid file naming a live process that is no daemon (this test) does not matter either.
    std::fs::write(dir.join("laya.pid"), format!("{}\n", std::process::id())).unwrap();

    let new = serve_in(&dir, &args);
    let status = socket_request(&dir, r#"{"op":"status"}"#)[0]["status"].clone();
    assert_eq!(status["pid"], new.child.id());
    assert_eq!(read_pid(&dir), Some(new.child.id()));
    let addr: SocketAddr = status["http"].as_str().unwrap().parse().unwrap();
    assert_eq!(read_http_addr(&dir), Some(addr), "http.addr is the new daemon's");
    assert_eq!(ok_json(addr, "GET", "/health", None)["pid"], new.child.id());
    let line = json!({ "op": "complete", "request": { "prompt": FIM, "max_tokens": 4 } }).to_string();
    let answer = socket_request(&dir, &line);
    assert_eq!(answer[0]["output"]["choices"][0]["text"], STUB_TEXT, "{answer:?}");
}

/// `laya complete FILE:1:5 --model MODEL` with the converted-weights cache under `cache`; with
/// `blocks`, under a file size limit (`ulimit -f`) and SIGXFSZ ignored, so writing past the
/// limit fails with EFBIG as a full disk fails with ENOSPC.
fn complete_under_limit(
    model: &Path,
    cache: &Path,
    src: &Path,
    blocks: Option<u32>,
    extra: &[&str],
) -> (String, String) {
    let limit = blocks
        .map(|b| format!("trap '' XFSZ; ulimit -f {b}; "))
        .unwrap_or_default();
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("{limit}exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_laya"))
        .args([
            "complete",
            &format!("{}:1:5", src.display()),
            "--model",
            &model.display().to_string(),
        ])
        .args(["--max-tokens", "4"])
        .args(extra)
        .env("LAYA_CACHE_DIR", cache)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "laya complete failed: {stderr}");
    (stdout.into_owned(), stderr.into_owned())
}

fn converted_files(cache: &Path) -> Vec<PathBuf> {
    match std::fs::read_dir(cache.join("converted")) {
        Ok(d) => d.flatten().map(|e| e.path()).collect(),
        Err(_) => vec![],
    }
}

#[test]
fn a_full_disk_while_caching_converted_weights_costs_only_the_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let model = write(tmp.path(), "tiny.gguf", &gguf::tiny_gguf().bytes);
    let src = write(tmp.path(), "a.py", b"x = \n");
    let cache = tmp.path().join("cache");
    let (want, _) = complete_under_limit(&model, &cache, &src, None, &["--no-cache"]);
    assert!(want.contains(gguf::TOKEN_TEXT), "{want}");
    assert!(converted_files(&cache).is_empty());

    // 32 blocks: 16 or 32 KiB (dash counts 512-byte blocks, bash 1024-byte ones).
    let (got, err) = complete_under_limit(&model, &cache, &src, Some(32), &[]);
    assert_eq!(got, want, "the converted weights in memory answer: {err}");
    assert!(err.contains("cannot write converted weights"), "a warning: {err}");
    let warning = |err: &str, what: &str| plain(err).lines().find(|l| l.contains(what)).map(str::to_owned);
    eprintln!("file size limit: {:?}", warning(&err, "cannot write"));
    assert_eq!(
        converted_files(&cache),
        Vec::<PathBuf>::new(),
        "no partial file is left"
    );

    // With room, the cache is written (larger than the limit was), then read.
    let (got, err) = complete_under_limit(&model, &cache, &src, None, &[]);
    assert_eq!(got, want);
    assert!(
        !err.contains("cannot write") && !err.contains("(converted cache)"),
        "{err}"
    );
    let files = converted_files(&cache);
    assert_eq!(files.len(), 1, "{files:?}");
    let size = std::fs::metadata(&files[0]).unwrap().len();
    assert!(size > 32 * 1024, "the limit was below the cache's {size} bytes");
    let (got, err) = complete_under_limit(&model, &cache, &src, None, &[]);
    assert_eq!(got, want);
    assert!(err.contains("(converted cache)"), "{err}");

    // A cache file cut short (what a crash of a non-atomic writer leaves) is not trusted: the
    // weights are converted again and the file is written anew.
    let bytes = std::fs::read(&files[0]).unwrap();
    std::fs::write(&files[0], &bytes[..bytes.len() / 2]).unwrap();
    let (got, err) = complete_under_limit(&model, &cache, &src, None, &[]);
    assert_eq!(got, want, "{err}");
    assert!(
        err.contains("ignoring") && !err.contains("(converted cache)"),
        "{err}"
    );
    eprintln!(
        "cache of {size} bytes cut at half: {:?}",
        warning(&err, "ignoring")
    );
    let rewritten = std::fs::metadata(&files[0]).unwrap().len();
    assert!(
        rewritten > size / 2,
        "the cache is written anew: {rewritten} bytes"
    );
    let (got, err) = complete_under_limit(&model, &cache, &src, None, &[]);
    assert_eq!(got, want);
    assert!(err.contains("(converted cache)"), "{err}");
}

/// `text` without ANSI colour sequences (`ESC [ … m`).
fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            chars.by_ref().find(|&c| c == 'm');
        } else {
            out.push(c);
        }
    }
    out
}

/// The lines of `log` that contain `what`, once there are `n` of them.
fn wait_lines(log: &Path, what: &str, n: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = plain(&std::fs::read_to_string(log).unwrap_or_default());
        let lines: Vec<String> = text
            .lines()
            .filter(|l| l.contains(what))
            .map(str::to_owned)
            .collect();
        if lines.len() >= n {
            return lines;
        }
        assert!(
            Instant::now() < deadline,
            "{n} lines with {what:?} expected in: {text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The `tokens=N` of a log line.
fn tokens_of(line: &str) -> usize {
    let at = line
        .find("tokens=")
        .unwrap_or_else(|| panic!("no tokens= in {line}"))
        + "tokens=".len();
    line[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn a_client_that_vanishes_mid_stream_stops_its_generation_and_the_next_one_is_served() {
    const LONG: usize = 8000;
    let tmp = tempfile::tempdir().unwrap();
    let model = write(tmp.path(), "tiny.gguf", &gguf::tiny_gguf().bytes);
    let dir = tmp.path().join("rt");
    let log = tmp.path().join("serve.log");
    let mut args = tiny_serve_args(&model);
    args.extend(["--max-tokens", "8000", "--max-seq-len", "8192"].map(str::to_owned));
    let d = serve_with(&dir, &args.iter().map(String::as_str).collect::<Vec<_>>(), |c| {
        c.env("LAYA_CACHE_DIR", tmp.path().join("cache"))
            .env("LAYA_LOG", "laya::engine::worker=debug")
            .stderr(std::fs::File::create(&log).unwrap());
    });
    let addr = d.http.unwrap();
    assert_eq!(settled_health(addr)["status"], "ok");
    let short = json!({ "prompt": FIM, "max_tokens": 3 }).to_string();

    // HTTP: a stream of up to 8000 tokens, read to its first event, then the connection closed.
    let body = json!({ "prompt": FIM, "max_tokens": LONG, "stream": true }).to_string();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut r = BufReader::new(s);
    let first = loop {
        let mut line = String::new();
        assert!(
            r.read_line(&mut line).unwrap() > 0,
            "the stream ended before its first event"
        );
        if let Some(data) = line.trim_end().strip_prefix("data: ") {
            break json_of(data);
        }
    };
    assert_eq!(first["choices"][0]["text"], gguf::TOKEN_TEXT, "{first}");
    drop(r);
    // Another client is served: the model is free again.
    let c = ok_json(addr, "POST", "/v1/completions", Some(&short));
    assert_eq!(c["choices"][0]["text"], gguf::TOKEN_TEXT.repeat(3), "{c}");
    let ended = wait_lines(&log, "generation ended", 2);
    assert!(
        ended[0].contains("Cancelled"),
        "the vanished client's generation stopped: {ended:?}"
    );
    let stopped_at = tokens_of(&ended[0]);
    assert!(stopped_at < LONG, "{ended:?}");
    assert!(
        ended[1].contains("Length") && tokens_of(&ended[1]) == 3,
        "{ended:?}"
    );

    // The unix socket: a streaming client that reads one piece and leaves.
    let mut u = std::os::unix::net::UnixStream::connect(dir.join("laya.sock")).unwrap();
    u.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let line = json!({ "op": "complete", "stream": true, "client": "gone",
        "request": { "prompt": FIM, "max_tokens": LONG } });
    writeln!(u, "{line}").unwrap();
    let mut first = String::new();
    BufReader::new(u.try_clone().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert_eq!(json_of(&first)["type"], "piece", "{first}");
    drop(u);
    let c = ok_json(addr, "POST", "/v1/completions", Some(&short));
    assert_eq!(c["choices"][0]["text"], gguf::TOKEN_TEXT.repeat(3), "{c}");
    let ended = wait_lines(&log, "generation ended", 4);
    assert!(
        ended[2].contains("Cancelled") && tokens_of(&ended[2]) < LONG,
        "{ended:?}"
    );
    eprintln!(
        "generations of vanished clients stopped after {stopped_at} (HTTP) and {} (socket) of {LONG} tokens",
        tokens_of(&ended[2])
    );
    let h = ok_json(addr, "GET", "/health", None);
    assert_eq!(h["queue"], json!({ "running": 0, "waiting": 0 }), "{h}");
    let mut rest = String::new();
    let _ = std::fs::File::open(&log).and_then(|mut f| f.read_to_string(&mut rest));
    assert!(!rest.contains("panicked"), "{rest}");
}
