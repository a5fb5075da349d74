//! `laya serve` as a subprocess: HTTP endpoints and errors, the private socket, one daemon
//! shared by several `laya lsp` processes (started by the first, restarted after a kill),
//! fair queueing and cancellation. Tiers point at a stub OpenAI-compatible server started
//! here, so these tests are fast and deterministic; the end-to-end test runs a tiny GGUF
//! written here, and the last ones the real 0.5B and 1.5B (with `LAYA_TEST_REAL_MODELS=1`).
//! Two tests come after those: two starts of `laya serve` on a tiny folder converted at load
//! (the second reads the converted cache, as `/health` and `laya doctor` say), the daemon
//! in-process with two tiny models whose loads the test holds (which model answers while the
//! large one loads), and the daemon in-process on a stub beside the LSP server in-process on
//! the same pool (`/complete` answers what an editor is shown at the same cursor).

use std::{
    io::{BufRead, BufReader, Write},
    os::unix::fs::DirBuilderExt,
    path::{Path, PathBuf},
    process::Stdio,
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use serde_json::{json, Value};

use crate::support::{self, daemon::*, laya};

#[test]
fn http_endpoints_answer_in_openai_shapes_with_timing() {
    let stub = stub();
    let (_tmp, d) = serve_stub(&stub, &[]);
    let addr = d.http.unwrap();

    let h = ok_json(addr, "GET", "/health", None);
    assert_eq!(h["status"], "ok", "{h}");
    assert_eq!(h["default"], "small/q8");
    let small = &h["models"][0];
    assert_eq!(
        (small["tier"].as_str(), small["source"].as_str()),
        (Some("small"), Some("remote")),
        "{h}"
    );
    assert_eq!(
        (small["state"].as_str(), small["warm"].as_bool()),
        (Some("ready"), Some(false)),
        "{h}"
    );
    assert_eq!(h["pid"], d.child.id());
    // The pool's answer for every key of a configured tier: a remote tier runs elsewhere
    // whatever the bits asked.
    assert_eq!(h["model_facts"]["small/q4"]["runs_on"], "remote", "{h}");

    let m = ok_json(addr, "GET", "/v1/models", None);
    assert_eq!(m["object"], "list");
    assert_eq!(m["data"][0]["id"], stub.url.as_str());

    // laya's own endpoint builds the FIM prompt from prefix and suffix.
    let c = ok_json(
        addr,
        "POST",
        "/complete",
        Some(
            r#"{"prefix":"def add(a, b):\n    return ","suffix":"\n\nprint(add(1, 2))\n","max_tokens":8,"stop":["\n"]}"#,
        ),
    );
    assert_eq!(c["text"], STUB_TEXT, "{c}");
    assert_eq!(c["choices"][0]["finish_reason"], "stop");
    assert_eq!(c["model"], "small/native");
    for k in [
        "prompt_tokens",
        "reused_tokens",
        "prefilled_tokens",
        "first_token_ms",
        "total_ms",
        "queue_ms",
    ] {
        assert!(c["timing"][k].is_number(), "timing.{k} missing: {c}");
    }
    assert_eq!(c["timing"]["prompt_tokens"], 7);
    assert_eq!(
        stub.prompts.lock().unwrap().last().unwrap(),
        "<|fim_prefix|>def add(a, b):\n    return <|fim_suffix|>\n\nprint(add(1, 2))\n<|fim_middle|>"
    );

    // A plain continuation (what a script that knows no FIM sends): the prompt goes to the
    // model as it is, and the answer is in `choices[0].text`.
    let c = ok_json(
        addr,
        "POST",
        "/complete",
        Some(r#"{"prompt":"def add(a, b):\n    return ","max_tokens":1}"#),
    );
    assert_eq!(c["choices"][0]["text"], STUB_TEXT, "{c}");
    assert_eq!(
        stub.prompts.lock().unwrap().last().unwrap(),
        "def add(a, b):\n    return "
    );

    // What Zed's edit prediction sends, and the fields it needs back.
    let v = ok_json(
        addr,
        "POST",
        "/v1/completions",
        Some(
            r#"{"model":"qwen2.5-coder-1.5b","prompt":"<|fim_prefix|>x = <|fim_suffix|><|fim_middle|>","max_tokens":16,"stop":["\n"],"environment":"zed"}"#,
        ),
    );
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"), "{v}");
    assert_eq!(v["object"], "text_completion");
    assert!(v["created"].as_u64().unwrap() > 1_600_000_000);
    assert!(v["model"].is_string());
    assert_eq!(v["choices"][0]["text"], STUB_TEXT);
    assert_eq!(v["choices"][0]["index"], 0);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["prompt_tokens"], 7);
    assert_eq!(v["usage"]["completion_tokens"], 3);
    assert_eq!(v["usage"]["total_tokens"], 10);
    assert_eq!(
        stub.prompts.lock().unwrap().last().unwrap(),
        "<|fim_prefix|>x = <|fim_suffix|><|fim_middle|>",
        "a prompt without suffix goes as it is"
    );
    // With `suffix`, the FIM prompt is built from prompt + suffix; n candidates come back.
    let v = ok_json(
        addr,
        "POST",
        "/v1/completions",
        Some(r#"{"prompt":"y = ","suffix":"\nprint(y)","max_tokens":4,"n":2,"temperature":0.5}"#),
    );
    assert_eq!(v["choices"].as_array().unwrap().len(), 2);
    assert_eq!(v["choices"][1]["index"], 1);
    assert_eq!(
        stub.prompts.lock().unwrap().last().unwrap(),
        "<|fim_prefix|>y = <|fim_suffix|>\nprint(y)<|fim_middle|>"
    );

    // Streaming: SSE chunks, then usage, then [DONE].
    let resp = ureq::post(&format!("http://{addr}/v1/completions"))
        .set("Content-Type", "application/json")
        .send_string(r#"{"prompt":"z = ","max_tokens":4,"stream":true}"#)
        .unwrap();
    assert_eq!(resp.header("content-type"), Some("text/event-stream"));
    let mut data = vec![];
    for line in BufReader::new(resp.into_reader()).lines() {
        let line = line.unwrap();
        if let Some(d) = line.strip_prefix("data: ") {
            data.push(d.to_owned());
        }
    }
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
    let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| json_of(d)).collect();
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(text, STUB_TEXT);
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "text_completion" && c["id"] == chunks[0]["id"]));
    assert!(chunks.iter().any(|c| c["choices"][0]["finish_reason"] == "stop"));
    let last = chunks.last().unwrap();
    assert_eq!(last["usage"]["prompt_tokens"], 7, "{last}");
    assert!(last["timing"]["total_ms"].is_number(), "{last}");

    let h = ok_json(addr, "GET", "/health", None);
    assert_eq!(h["models"][0]["warm"], true, "warm once it answered: {h}");
    assert_eq!(h["models"][0]["served"], 5, "{h}");
}

#[test]
fn bad_requests_get_clear_4xx_json_errors() {
    let stub = stub();
    let (_tmp, d) = serve_stub(&stub, &["--max-tokens", "32", "--max-body-bytes", "4096"]);
    let addr = d.http.unwrap();
    let err = |method: &str, path: &str, body: Option<&str>, headers: &[(&str, &str)]| {
        let (code, text) = http(addr, method, path, body, headers);
        let v = json_of(&text);
        let msg = v["error"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("no error message: {text}"))
            .to_owned();
        assert!(v["error"]["type"].is_string(), "{text}");
        (code, msg)
    };
    let (code, msg) = err("POST", "/v1/completions", Some("{\"prompt\": "), &[]);
    assert_eq!(code, 400);
    assert!(msg.contains("invalid JSON"), "{msg}");
    let (code, msg) = err("POST", "/complete", Some(r#"{"suffix":"x"}"#), &[]);
    assert_eq!(code, 400);
    assert!(msg.contains("prefix") && msg.contains("prompt"), "{msg}");
    let (code, msg) = err("POST", "/complete", Some(r#"{"prompt":"x","prefix":"y"}"#), &[]);
    assert_eq!(code, 400);
    assert!(msg.contains("not both"), "{msg}");
    let big = format!(r#"{{"prompt":"{}"}}"#, "x".repeat(8000));
    let (code, msg) = err("POST", "/v1/completions", Some(&big), &[]);
    assert_eq!(code, 413);
    assert!(msg.contains("size limit"), "{msg}");
    let (code, msg) = err(
        "POST",
        "/v1/completions",
        Some(r#"{"prompt":"x","max_tokens":33}"#),
        &[],
    );
    assert_eq!(code, 400);
    assert!(
        msg.contains("max_tokens 33") && msg.contains("limit of 32"),
        "{msg}"
    );
    let (code, msg) = err("POST", "/complete", Some(r#"{"prefix":"x","n":0}"#), &[]);
    assert_eq!(code, 400);
    assert!(msg.contains("n must be"), "{msg}");
    let (code, msg) = err(
        "POST",
        "/v1/completions",
        Some(r#"{"prompt":"x","model":"small/q5"}"#),
        &[],
    );
    assert_eq!(code, 400);
    assert!(msg.contains("small/q5"), "{msg}");
    let (code, msg) = err(
        "POST",
        "/complete",
        Some(r#"{"prefix":"x","model":{"tier":"small","bits":5}}"#),
        &[],
    );
    assert_eq!(code, 400);
    assert!(msg.contains("bits"), "{msg}");
    let (code, _) = err("POST", "/v1/completions", Some(r#"{"prompt":""}"#), &[]);
    assert_eq!(code, 400);
    let (code, _) = err("GET", "/nope", None, &[]);
    assert_eq!(code, 404);
    let (code, _) = err("GET", "/v1/completions", None, &[]);
    assert_eq!(code, 405);
    // A form post (what a web page can send without asking) is refused, as is a foreign Host.
    let resp = ureq::post(&format!("http://{addr}/v1/completions"))
        .set("Content-Type", "text/plain")
        .send_string(r#"{"prompt":"x"}"#);
    assert!(matches!(resp, Err(ureq::Error::Status(415, _))));
    let (code, _) = err("GET", "/health", None, &[("Host", "evil.example:7723")]);
    assert_eq!(code, 403);
    assert!(
        stub.prompts.lock().unwrap().is_empty(),
        "no bad request reached the model"
    );
}

#[test]
fn a_configured_token_is_required_over_http() {
    let stub = stub();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("rt");
    let mut child = laya()
        .arg("serve")
        .args(stub_tiers(&stub, "127.0.0.1:0"))
        .args(["--token-env", "LAYA_TEST_TOKEN"])
        .env("LAYA_RUNTIME_DIR", &dir)
        .env("LAYA_TEST_TOKEN", "s3cret")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let addr = loop {
        if let Some(a) = laya::daemon::paths::read_http_addr(&dir) {
            break a;
        }
        assert!(
            Instant::now() < deadline && child.try_wait().unwrap().is_none(),
            "no daemon"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let (code, text) = http(addr, "GET", "/health", None, &[]);
    assert_eq!(code, 401, "{text}");
    assert_eq!(json_of(&text)["error"]["type"], "authentication_error");
    let (code, _) = http(addr, "GET", "/health", None, &[("Authorization", "Bearer wrong")]);
    assert_eq!(code, 401);
    let (code, _) = http(
        addr,
        "GET",
        "/health",
        None,
        &[("Authorization", "Bearer s3cret")],
    );
    assert_eq!(code, 200);
    child.kill().unwrap();
    child.wait().unwrap();
    // Naming a variable that is not set is an error, not an open server.
    let out = laya()
        .args([
            "serve",
            "--small-remote",
            &stub.url,
            "--no-http",
            "--token-env",
            "LAYA_TEST_UNSET",
        ])
        .env("LAYA_RUNTIME_DIR", &dir)
        .env_remove("LAYA_TEST_UNSET")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("LAYA_TEST_UNSET"));
}

#[test]
fn the_socket_is_private_a_stale_one_is_replaced_and_one_daemon_serves_a_directory() {
    let stub = stub();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("rt");
    std::fs::DirBuilder::new().mode(0o755).create(&dir).unwrap();
    // A socket file nobody listens on: what a killed daemon leaves behind.
    drop(std::os::unix::net::UnixListener::bind(dir.join("laya.sock")).unwrap());
    assert!(std::os::unix::net::UnixStream::connect(dir.join("laya.sock")).is_err());

    let d = serve_in(
        &dir,
        &["--small-remote", &stub.url, "--large", "none", "--no-http"],
    );
    assert_private(&dir);
    assert_eq!(laya::daemon::paths::read_pid(&dir), Some(d.child.id()));

    let answer = socket_request(&dir, r#"{"op":"status"}"#);
    assert_eq!(answer[0]["type"], "status");
    assert_eq!(answer[0]["status"]["pid"], d.child.id());
    assert!(answer[0]["status"]["http"].is_null());
    // A completion with streamed pieces, then the output.
    let answer = socket_request(
        &dir,
        r#"{"op":"complete","stream":true,"request":{"prompt":"<|fim_prefix|>q<|fim_suffix|><|fim_middle|>","max_tokens":4}}"#,
    );
    assert_eq!(
        answer[0],
        json!({ "type": "piece", "index": 0, "text": STUB_TEXT })
    );
    assert_eq!(answer[1]["type"], "done");
    assert_eq!(answer[1]["output"]["choices"][0]["text"], STUB_TEXT);
    let answer = socket_request(&dir, r#"{"op":"fly"}"#);
    assert_eq!(answer[0]["type"], "error");
    assert_eq!(answer[0]["error"]["kind"], "invalid_request_error");

    // A second daemon for the same directory steps back (exit status 3).
    let out = laya()
        .args(["serve", "--small-remote", &stub.url, "--no-http"])
        .env("LAYA_RUNTIME_DIR", &dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("another laya daemon is running"));
    // It left the running daemon's socket alone.
    assert_eq!(
        socket_request(&dir, r#"{"op":"status"}"#)[0]["status"]["pid"],
        d.child.id()
    );
    drop(d);
}

#[test]
fn requests_are_taken_round_robin_across_clients_and_a_client_that_leaves_is_dropped() {
    let _quiet = support::quiet_cpu_blocking();
    let stub = stub();
    let (_tmp, d) = serve_stub(&stub, &["--remote-parallel", "1"]);
    let addr = d.http.unwrap();
    stub.delay_ms.store(150, Ordering::Relaxed);
    let send = |client: &'static str, tag: String| {
        std::thread::spawn(move || {
            let body = json!({ "prompt": tag, "max_tokens": 2 }).to_string();
            http(
                addr,
                "POST",
                "/v1/completions",
                Some(&body),
                &[("X-Laya-Client", client)],
            )
            .0
        })
    };
    // Client a queues five requests, then b one, then c one that gives up while waiting.
    let mut waits = vec![];
    for i in 1..=5 {
        waits.push(send("a", format!("a{i}")));
        std::thread::sleep(Duration::from_millis(15));
    }
    waits.push(send("b", "b1".into()));
    std::thread::sleep(Duration::from_millis(15));
    let gone = std::thread::spawn(move || {
        let r = ureq::post(&format!("http://{addr}/v1/completions"))
            .set("Content-Type", "application/json")
            .set("X-Laya-Client", "c")
            .timeout(Duration::from_millis(100))
            .send_string(r#"{"prompt":"c1","max_tokens":2}"#);
        assert!(r.is_err(), "c gives up before its turn");
    });
    // Over the socket too: a request whose connection closes while queued.
    let sock = dir_socket(&d.dir);
    let mut s = std::os::unix::net::UnixStream::connect(sock).unwrap();
    writeln!(
        s,
        r#"{{"op":"complete","client":"d","request":{{"prompt":"d1","max_tokens":2}}}}"#
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(30));
    drop(s);
    gone.join().unwrap();
    for w in waits {
        assert_eq!(w.join().unwrap(), 200);
    }
    let seen = stub.prompts.lock().unwrap().clone();
    assert_eq!(
        seen.len(),
        6,
        "the requests of clients that left never ran: {seen:?}"
    );
    let b = seen.iter().position(|p| p == "b1").unwrap();
    // First come first served would run b1 last (6th); round-robin runs it right after
    // the a request that was waiting when it arrived.
    assert!(b <= 2, "b1 ran at position {b}: {seen:?}");
    let h = ok_json(addr, "GET", "/health", None);
    assert_eq!(h["queue"], json!({ "running": 0, "waiting": 0 }), "{h}");
}

fn dir_socket(dir: &Path) -> PathBuf {
    dir.join("laya.sock")
}

/// HTTP `/complete` with a prefix and suffix sends the model the prompt an editor's request
/// at that cursor sends (one prompt builder): here under a budget that leaves the file's
/// import out of the prefix window, which both bring back as context.
#[test]
fn http_complete_sends_the_prompt_an_editor_sends() {
    let stub = stub();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("rt");
    let _cleanup = KillDaemons(dir.clone());
    let settings = json!({ "completion": { "debounceMs": 0, "budget": { "maxTokens": 64 } } });
    let tiers = stub_tiers(&stub, "127.0.0.1:0");
    let mut p = lsp_configured(&dir, &tiers, settings, Some(Duration::from_secs(20)));
    let filler: String = (0..40).map(|i| format!("LIMIT_{i} = {i}\n")).collect();
    let text = format!("import os\n{filler}\ndef f(path):\n    return os.path.");
    assert_eq!(
        complete_in(&mut p, "f", &text),
        Some(vec![STUB_TEXT.to_owned()]),
        "{:?}",
        p.logs
    );
    let editor = stub.prompts.lock().unwrap().last().cloned().unwrap();
    assert!(
        editor.contains("import os\n") && !editor.contains("LIMIT_0 "),
        "the import as context, the window near the cursor: {editor:?}"
    );

    let status = socket_request(&dir, r#"{"op":"status"}"#);
    let addr: std::net::SocketAddr = status[0]["status"]["http"].as_str().unwrap().parse().unwrap();
    let body = json!({ "prefix": text, "suffix": "", "path": "t/f.py", "max_prompt_tokens": 64 });
    let answer = ok_json(addr, "POST", "/complete", Some(&body.to_string()));
    assert_eq!(answer["text"], STUB_TEXT, "{answer}");
    let http = stub.prompts.lock().unwrap().last().cloned().unwrap();
    assert_eq!(http, editor);
    p.shutdown(Duration::from_secs(5));
}

#[test]
fn lsp_clients_start_and_share_one_daemon_which_is_restarted_after_a_kill() {
    let stub = stub();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("rt");
    let _cleanup = KillDaemons(dir.clone());
    assert!(daemons_for(&dir).is_empty());

    let mut a = lsp(&dir, &stub);
    let mut b = lsp(&dir, &stub);
    let got = complete_in(&mut a, "one", "def add(a, b):\n    return ");
    assert_eq!(got, Some(vec![STUB_TEXT.to_owned()]), "logs: {:?}", a.logs);
    let got = complete_in(&mut b, "two", "def sub(a, b):\n    return ");
    assert_eq!(got, Some(vec![STUB_TEXT.to_owned()]), "logs: {:?}", b.logs);
    let first = laya::daemon::paths::read_pid(&dir).expect("the daemon wrote its pid");
    assert_eq!(daemons_for(&dir), vec![first], "one daemon for both editors");
    assert_eq!(stub.prompts.lock().unwrap().len(), 2);

    // Kill it: the next request starts a new one and is answered.
    kill_daemon(&dir, first);
    let got = complete_in(&mut b, "three", "def mul(a, b):\n    return ");
    assert_eq!(got, Some(vec![STUB_TEXT.to_owned()]), "logs: {:?}", b.logs);
    let second = laya::daemon::paths::read_pid(&dir).unwrap();
    assert_ne!(first, second);
    assert_eq!(daemons_for(&dir), vec![second]);
    let got = complete_in(&mut a, "four", "def div(a, b):\n    return ");
    assert_eq!(got, Some(vec![STUB_TEXT.to_owned()]), "logs: {:?}", a.logs);
    assert!(stub.prompts.lock().unwrap().len() >= 4);
    assert_eq!(daemons_for(&dir), vec![second], "still one daemon");
    a.shutdown(Duration::from_secs(5));
    b.shutdown(Duration::from_secs(5));
}

/// `laya serve` on the CPU with `model` as its small tier (`setup` applied to the command),
/// over HTTP: the model loads and is warm, `/complete` answers with timing (FIM or a plain
/// continuation), the same prompt again reuses the prefix store, a long suffix is cut to a
/// small model's share (the prompt then has `cut_prompt` tokens), and `/v1/completions`
/// streams the same greedy text in pieces. Returns `/health` and the answer to
/// `def add(a, b):\n    return `.
fn end_to_end_over_http(
    model: &str,
    cut_prompt: std::ops::Range<u64>,
    setup: impl FnOnce(&mut std::process::Command),
) -> (Value, String) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("rt");
    let d = serve_with(
        &dir,
        &[
            "--small",
            model,
            "--large",
            "none",
            "--device",
            "cpu",
            "--http-addr",
            "127.0.0.1:0",
        ],
        setup,
    );
    let addr = d.http.unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let h = loop {
        let h = ok_json(addr, "GET", "/health", None);
        if h["status"] != "loading" {
            break h;
        }
        assert!(Instant::now() < deadline, "the model did not load: {h}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(h["status"], "ok", "{h}");
    let model = &h["models"][0];
    assert_eq!(
        (model["id"].as_str(), model["warm"].as_bool()),
        (Some("small/q8"), Some(true)),
        "{h}"
    );
    assert!(model["load_time_ms"].as_f64().unwrap() > 0.0);

    let body = r#"{"prefix":"def add(a, b):\n    return ","suffix":"\n","max_tokens":4}"#;
    let c = ok_json(addr, "POST", "/complete", Some(body));
    let text = c["text"].as_str().unwrap().to_owned();
    let t = &c["timing"];
    assert!(t["prompt_tokens"].as_u64().unwrap() > 5, "{c}");
    assert!(t["first_token_ms"].as_f64().unwrap() > 0.0, "{c}");
    assert!(c["load_time_ms"].as_f64().unwrap() > 0.0, "{c}");
    // The same prompt again: its prefix comes from the store.
    let again = ok_json(addr, "POST", "/complete", Some(body));
    assert_eq!(again["text"], text.as_str());
    assert!(again["timing"]["reused_tokens"].as_u64().unwrap() > 0, "{again}");

    // The seed's call: a plain continuation of one token.
    let c = ok_json(
        addr,
        "POST",
        "/complete",
        Some(r#"{"prompt":"def add(a, b):\n    return a","max_tokens":1}"#),
    );
    assert_eq!(c["choices"][0]["tokens"], 1, "{c}");
    assert!(c["choices"][0]["text"].is_string(), "{c}");
    assert_eq!(c["choices"][0]["text"], c["text"], "{c}");

    // A long suffix is cut to the small model's share (2 % of 2048 tokens: ~120 bytes, four of
    // these lines); the larger models' 6 % would keep twelve lines (~360 bytes).
    let suffix = "\n    total = total + value * 2\n".repeat(40);
    let body =
        json!({ "prefix": "def add(a, b):\n    return ", "suffix": suffix, "max_tokens": 1 }).to_string();
    let c = ok_json(addr, "POST", "/complete", Some(&body));
    let prompt_tokens = c["timing"]["prompt_tokens"].as_u64().unwrap();
    assert!(cut_prompt.contains(&prompt_tokens), "{c}");

    // Streamed through the model worker: the pieces make up the same greedy text as the
    // answer not streamed (the model's text as it came, where `/complete` post-processes).
    let v1 = r#"{"prompt":"def add(a, b):\n    return ","suffix":"\n","max_tokens":4}"#;
    let whole = ok_json(addr, "POST", "/v1/completions", Some(v1))["choices"][0]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(whole.starts_with(&text), "{whole:?} shown as {text:?}");
    let resp = ureq::post(&format!("http://{addr}/v1/completions"))
        .set("Content-Type", "application/json")
        .send_string(r#"{"prompt":"def add(a, b):\n    return ","suffix":"\n","max_tokens":4,"stream":true}"#)
        .unwrap();
    let mut streamed = String::new();
    let mut chunks = 0;
    for line in BufReader::new(resp.into_reader()).lines() {
        let line = line.unwrap();
        let Some(d) = line.strip_prefix("data: ") else {
            continue;
        };
        if d == "[DONE]" {
            break;
        }
        if let Some(t) = json_of(d)["choices"][0]["text"].as_str() {
            if !t.is_empty() {
                chunks += 1;
            }
            streamed.push_str(t);
        }
    }
    assert_eq!(streamed, whole);
    assert!(chunks >= 2, "{chunks} pieces: {streamed:?}");
    drop(d);
    (h, text)
}

/// [`end_to_end_over_http`] on the tiny GGUF of `support::gguf`, which writes `a` after `a`.
#[test]
fn a_tiny_model_end_to_end_over_http() {
    let tmp = tempfile::tempdir().unwrap();
    let model = support::gguf::write_tiny(tmp.path()).unwrap();
    let cache = tmp.path().join("cache");
    // A token a byte: the suffix's ~120 bytes and the prefix's 26 are as many tokens.
    let (h, text) = end_to_end_over_http(&model.display().to_string(), 60..200, |c| {
        c.env("LAYA_CACHE_DIR", &cache);
    });
    assert_eq!(text, "aaaa");
    let parameters = h["models"][0]["parameters"].as_u64().unwrap_or(0);
    assert!(
        (1..laya::prompt::Budget::SMALL_MODEL_PARAMETERS).contains(&parameters),
        "{h}"
    );
    // What `laya lsp` weighs is the pool's answer: the loaded model's size, at each width.
    let facts = &h["model_facts"];
    assert_eq!(facts["small/q8"]["parameters"].as_u64(), Some(parameters), "{h}");
    assert_eq!(
        (
            facts["small/q4"]["bits"].as_u64(),
            facts["small/q8"]["bits"].as_u64()
        ),
        (Some(4), Some(8)),
        "{h}"
    );
    assert!(facts.get("large/q8").is_none(), "no large tier: {h}");
}

/// [`end_to_end_over_http`] on the real 0.5B (`LAYA_TEST_REAL_MODELS=1`): it completes the
/// sum, and its size is read right.
#[test]
fn real_model_end_to_end_over_http() {
    if support::real::model("qwen2.5-coder-0.5b").is_none() {
        return;
    }
    let _busy = support::busy_cpu();
    // Qwen's tokens: the suffix's ~120 bytes are ~40 of them.
    let (h, text) = end_to_end_over_http("qwen2.5-coder-0.5b", 20..80, |_| {});
    assert!(text.contains('a') && text.contains('b'), "{text:?}");
    // Its size, which shapes the LSP instances' prompts (suffix share): 0.49B and, since this
    // GGUF file carries its output matrix apart from the embedding, 0.14B more; under the line.
    let parameters = h["models"][0]["parameters"].as_u64().unwrap_or(0);
    assert!(
        (450_000_000..laya::prompt::Budget::SMALL_MODEL_PARAMETERS).contains(&parameters),
        "{h}"
    );
}

/// A request the user asks for goes by policy to the large tier; on MLX's CPU, where the
/// 1.5B would take minutes for a cold prompt, the router's estimate (from the 1.5B's size,
/// read from its file before it loads, and the device) sends it to the small model instead,
/// and `laya/explain` says which model answered and why.
#[test]
fn an_invoked_request_on_the_cpu_does_not_wait_for_the_large_model() {
    for name in ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"] {
        if support::real::model(name).is_none() {
            return;
        }
    }
    let _busy = support::busy_cpu();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("rt");
    let _cleanup = KillDaemons(dir.clone());
    let mut p = lsp_on_the_cpu(&dir, "qwen2.5-coder-1.5b");
    p.initialize(json!({ "completion": { "debounceMs": 0, "maxTokensLine": 2 } }))
        .unwrap();
    assert!(
        p.wait_log(|l| l.contains("model ready"), Duration::from_secs(300)),
        "{:?}",
        p.logs
    );
    let uri = "file:///t/add.py";
    p.open(uri, "python", "def add(a, b):\n    return a + b\n\n\nx = add(1, ")
        .unwrap();
    let items = p.inline_completion(uri, 4, 11, Duration::from_secs(300)).unwrap();
    assert!(items.is_some(), "{:?}", p.logs);
    let e = p
        .request(
            "laya/explain",
            json!({ "textDocument": { "uri": uri } }),
            Duration::from_secs(30),
        )
        .unwrap();
    let reason = e["route"]["reason"].as_str().unwrap_or_default();
    assert_eq!(e["trigger"], "invoked", "{e}");
    assert_eq!(
        e["route"]["model"],
        json!({ "tier": "small", "precision": "q8" }),
        "{e}"
    );
    assert!(
        reason.contains("invoked policy")
            && reason.contains("large/q6 would take")
            && reason.contains("estimated"),
        "{e}"
    );
    assert_eq!(e["servedBy"], "small/q8", "{e}");
    p.shutdown(Duration::from_secs(10));
}

/// The first request after `initialized` on a cold daemon (none runs: `laya lsp` starts it, and
/// the real 0.5B loads on the CPU) waits for the model, with `$/progress` saying so, and is
/// answered with a completion. A request cancelled meanwhile (`$/cancelRequest`) is answered
/// at once: while the model still loads.
#[test]
fn the_first_request_on_a_cold_daemon_waits_for_the_model_and_is_answered() {
    if support::real::model("qwen2.5-coder-0.5b").is_none() {
        return;
    }
    let _busy = support::busy_cpu();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("rt");
    let _cleanup = KillDaemons(dir.clone());
    let mut p = lsp_on_the_cpu(&dir, "none");
    // Few tokens: the CPU decodes the 0.5B at ~0.6 s a token.
    p.initialize(json!({ "completion": { "debounceMs": 0, "maxTokensLine": 3, "maxTokensBlock": 3 } }))
        .unwrap();
    let uri = "file:///t/add.py";
    p.open(uri, "python", "def add(a, b):\n    return ").unwrap();
    let at = |uri: &str| {
        json!({ "textDocument": { "uri": uri }, "position": { "line": 1, "character": 11 },
            "context": { "triggerKind": 1 } })
    };
    let first = p.start("textDocument/inlineCompletion", at(uri)).unwrap();
    let other = "file:///t/other.py";
    p.open(other, "python", "def add(a, b):\n    return ").unwrap();
    let cancelled = p.start("textDocument/inlineCompletion", at(other)).unwrap();
    p.notify("$/cancelRequest", json!({ "id": cancelled })).unwrap();
    let kinds = |p: &laya::bench::lsp_client::LspProcess| -> Vec<String> {
        p.progress
            .iter()
            .filter(|v| v["token"] == "laya/model")
            .map(|v| v["value"]["kind"].as_str().unwrap_or("?").to_owned())
            .collect()
    };
    let c = p.answer(cancelled, Duration::from_secs(60)).unwrap();
    assert_eq!(c["error"]["code"], -32800, "{c}");
    assert!(
        !kinds(&p).contains(&"end".to_owned()),
        "the cancel was answered only once the model had loaded: {:?}",
        p.progress
    );
    let a = p.answer(first, Duration::from_secs(300)).unwrap();
    let items = a["result"].as_array().cloned().unwrap_or_default();
    let text = items
        .first()
        .and_then(|i| i["insertText"].as_str())
        .unwrap_or_default();
    assert!(!text.trim().is_empty(), "{a}; logs {:?}", p.logs);
    assert_eq!(daemons_for(&dir).len(), 1, "laya lsp started its daemon");
    assert_eq!(kinds(&p), ["begin", "report", "end"], "{:?}", p.progress);
    assert!(p.progress_created.contains(&json!("laya/model")));
    let waiting = p
        .progress
        .iter()
        .find(|v| v["value"]["kind"] == "report")
        .and_then(|v| v["value"]["message"].as_str())
        .unwrap_or_default();
    assert!(waiting.contains("waits for the model"), "{:?}", p.progress);
    p.shutdown(Duration::from_secs(10));
}

/// `laya lsp` on the CPU with the 0.5B as the small tier and `large` (a catalog name or
/// `none`), no HTTP, its daemons' runtime folder `dir`.
fn lsp_on_the_cpu(dir: &std::path::Path, large: &str) -> laya::bench::lsp_client::LspProcess {
    let mut cmd = laya();
    cmd.args([
        "lsp",
        "--small",
        "qwen2.5-coder-0.5b",
        "--large",
        large,
        "--device",
        "cpu",
        "--no-http",
    ])
    .env("LAYA_RUNTIME_DIR", dir)
    .stderr(std::process::Stdio::null());
    laya::bench::lsp_client::LspProcess::spawn(cmd).unwrap()
}

/// A model load a test holds until it opens the gate (or drops it).
#[derive(Clone, Default)]
struct Gate(std::sync::Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>);

impl Gate {
    fn open(&self) {
        *self.0 .0.lock().unwrap() = true;
        self.0 .1.notify_all();
    }

    fn wait(&self) {
        let (open, changed) = &*self.0;
        let mut open = open.lock().unwrap();
        while !*open {
            open = changed.wait(open).unwrap();
        }
    }
}

/// Opens its gates when dropped: a failed test leaves no worker held.
struct OpenOnDrop(Vec<Gate>);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.iter().for_each(Gate::open);
    }
}

/// The models' states by id, as `GET /health` gives them.
fn states(addr: std::net::SocketAddr) -> Vec<(String, String)> {
    states_of(&ok_json(addr, "GET", "/health", None))
}

/// The (model, state) pairs of a `/health` answer.
fn states_of(h: &Value) -> Vec<(String, String)> {
    h["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["id"].as_str().unwrap().to_owned(),
                m["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Polls `/health` until `done` holds of the models' states (a bound on a failure, not a
/// timing: the states come in a few seconds at most).
fn health_until(addr: std::net::SocketAddr, done: impl Fn(&[(String, String)]) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        // The answer returned is the one judged (a second fetch could see a later state).
        let h = ok_json(addr, "GET", "/health", None);
        if done(&states_of(&h)) {
            return h;
        }
        assert!(Instant::now() < deadline, "the models never got there: {h}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `laya serve`'s daemon in-process, with a small and a large tiny model of random weights
/// whose loads the test holds: a request for the large model while both load waits for the
/// small one (not the large one) and is answered by it; while the large one still loads the
/// small one answers at once, and the answer says which model it stood in for; once the large
/// one is ready it answers, and `/health` gives each model's time to ready.
#[test]
fn the_small_model_answers_for_the_large_one_while_it_loads() {
    use laya::engine::{
        pool::{PoolConfig, TierSource},
        synthetic,
        worker::Loader,
        Cancel, CompletionRequest, LoadOptions, LocalModel, ModelKey, Precision, Tier,
    };
    let (_mlx, backend) = support::mlx();
    let tmp = tempfile::tempdir().unwrap();
    let vocab = support::gguf::write_vocab(tmp.path()).unwrap();
    let cfg = synthetic::tiny();
    let folder = |name: &str, seed| {
        let dir = tmp.path().join(name);
        let weights =
            synthetic::random_weights(&cfg, Precision::Native, 64, synthetic::Dtype::Float32, seed).unwrap();
        synthetic::write_folder(&dir, &cfg, &weights, None, &vocab).unwrap();
        dir
    };
    let (small, large) = (folder("small", 11), folder("large", 12));
    const PROMPT: &str = "def add(a, b):\n    return ";
    let opts = LoadOptions {
        precision: Precision::Native,
        use_cache: false,
        ..LoadOptions::default()
    };
    let text_of = |path: &Path| {
        let model = LocalModel::load(path, &opts).unwrap();
        let out = model
            .complete(&CompletionRequest::new(PROMPT, 4), &Cancel::new())
            .unwrap();
        out.choices[0].text.clone()
    };
    let (small_text, large_text) = (text_of(&small), text_of(&large));
    assert!(
        !small_text.is_empty() && small_text != large_text,
        "two models that tell apart: {small_text:?} {large_text:?}"
    );

    let (small_gate, large_gate) = (Gate::default(), Gate::default());
    let _open = OpenOnDrop(vec![small_gate.clone(), large_gate.clone()]);
    let held = [
        (small.clone(), small_gate.clone()),
        (large.clone(), large_gate.clone()),
    ];
    let loader = Loader::new(move |path, opts| {
        if let Some((_, gate)) = held.iter().find(|(p, _)| p == path) {
            gate.wait();
        }
        LocalModel::load(path, opts)
    });
    let key = |tier| ModelKey {
        tier,
        precision: Precision::Native,
    };
    let local = |path: &Path| TierSource::Local {
        path: path.to_owned(),
        group_size: 64,
    };
    let config = laya::daemon::DaemonConfig {
        pool: PoolConfig {
            tiers: [(Tier::Small, local(&small)), (Tier::Large, local(&large))].into(),
            default: key(Tier::Small),
            preload: vec![],
            device: match backend {
                support::Backend::Gpu => laya::engine::runtime::DevicePref::Gpu,
                support::Backend::Cpu => laya::engine::runtime::DevicePref::Cpu,
            },
            prefix: Default::default(),
            speculation: Default::default(),
            use_cache: false,
            loader,
        },
        names: Default::default(),
        runtime_dir: tmp.path().join("rt"),
        http: None,
        token: None,
        limits: Default::default(),
        defaults: Default::default(),
        warmup: true,
        remote_slots: 1,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    let daemon = std::sync::Arc::new(laya::daemon::Daemon::new(config, Some(addr)));
    daemon.pool().unwrap();
    rt.spawn(laya::daemon::http::serve(daemon.clone(), listener));

    let ask_large = move || {
        let body = json!({ "prompt": PROMPT, "max_tokens": 4, "model": "large/native" }).to_string();
        ok_json(addr, "POST", "/complete", Some(&body))
    };
    // Both load: the request for the large model waits for the small one.
    let (tx, waiting) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(ask_large()));
    health_until(addr, |s| {
        s.len() == 2 && s.iter().all(|(_, state)| state == "loading")
    });
    assert!(waiting.try_recv().is_err(), "answered while no model was ready");
    small_gate.open();
    let first = waiting
        .recv_timeout(Duration::from_secs(120))
        .expect("no answer from the small model");
    assert_eq!(
        (&first["text"], &first["model"], &first["stand_in_for"]),
        (&json!(small_text), &json!("small/native"), &json!("large/native")),
        "{first}"
    );
    // The large model still loads: the small one answers, at once.
    assert_eq!(
        states(addr),
        [
            ("small/native".into(), "ready".into()),
            ("large/native".into(), "loading".into())
        ]
    );
    let second = ask_large();
    assert_eq!(
        (&second["text"], &second["stand_in_for"]),
        (&json!(small_text), &json!("large/native")),
        "{second}"
    );
    // Loaded, the large model answers for itself.
    large_gate.open();
    let h = health_until(addr, |s| s.iter().all(|(_, state)| state == "ready"));
    let third = ask_large();
    assert_eq!(
        (&third["text"], &third["model"], &third["stand_in_for"]),
        (&json!(large_text), &json!("large/native"), &Value::Null),
        "{third}"
    );
    for m in h["models"].as_array().unwrap() {
        let (load, ready) = (
            m["load_time_ms"].as_f64().unwrap(),
            m["time_to_ready_ms"].as_f64().unwrap(),
        );
        assert!(ready >= load && load > 0.0, "{m}");
        assert_eq!(m["from_cache"], false, "{m}");
    }
}

/// `laya serve` on a tiny bf16 folder at q8 (converted at load), started twice: `/health`
/// gives the model's time to ready and says the first start converted and the second read the
/// converted cache, and `laya doctor` reads the same from the running daemon; with none
/// running it says so.
#[test]
fn the_second_start_reads_the_converted_cache_and_health_and_doctor_say_so() {
    use laya::engine::{synthetic, Precision};
    let tmp = tempfile::tempdir().unwrap();
    let (dir, cache) = (tmp.path().join("rt"), tmp.path().join("cache"));
    let folder = tmp.path().join("tiny-bf16");
    {
        let (_mlx, _) = support::mlx();
        let vocab = support::gguf::write_vocab(tmp.path()).unwrap();
        let cfg = synthetic::tiny();
        let weights =
            synthetic::random_weights(&cfg, Precision::Native, 64, synthetic::Dtype::Bfloat16, 5).unwrap();
        synthetic::write_folder(&folder, &cfg, &weights, None, &vocab).unwrap();
    }
    let doctor = || {
        let (_, out, err) = support::run(
            laya()
                .arg("doctor")
                .env("LAYA_RUNTIME_DIR", &dir)
                .env("LAYA_MODEL_DIR", tmp.path()),
        );
        let section: Vec<String> = out
            .lines()
            .skip_while(|l| !l.starts_with("  daemon "))
            .take_while(|l| l.starts_with("  daemon ") || l.starts_with("    "))
            .map(str::to_owned)
            .collect();
        assert!(!section.is_empty(), "no daemon section: {out}{err}");
        section
    };
    let folder_arg = folder.display().to_string();
    let start = || {
        let d = serve_with(
            &dir,
            &[
                "--small",
                &folder_arg,
                "--large",
                "none",
                "--device",
                "cpu",
                "--http-addr",
                "127.0.0.1:0",
            ],
            |c| {
                c.env("LAYA_CACHE_DIR", &cache).stderr(Stdio::null());
            },
        );
        let h = health_until(d.http.unwrap(), |s| s.iter().all(|(_, state)| state == "ready"));
        (d, h)
    };
    for (run, from_cache) in [("first", false), ("second", true)] {
        let (d, h) = start();
        let m = &h["models"][0];
        assert_eq!(
            (&m["id"], &m["from_cache"]),
            (&json!("small/q8"), &json!(from_cache)),
            "{run}: {h}"
        );
        let (load, ready) = (
            m["load_time_ms"].as_f64().unwrap(),
            m["time_to_ready_ms"].as_f64().unwrap(),
        );
        assert!(ready >= load && load > 0.0, "{run}: {h}");
        let section = doctor();
        assert!(
            section[0].starts_with(&format!("  daemon        pid {}, up ", d.child.id())),
            "{section:?}"
        );
        let line = section
            .iter()
            .find(|l| l.contains("small/q8"))
            .expect("the model's line");
        assert!(
            line.contains("tiny-bf16") && line.contains(" ready in ") && line.ends_with(" on cpu"),
            "{line}"
        );
        assert_eq!(
            line.contains(", from the converted cache)"),
            from_cache,
            "{run}: {line}"
        );
        drop(d);
    }
    assert_eq!(
        doctor(),
        [format!("  daemon        none runs (in {})", dir.display())]
    );
}

/// HTTP `/complete` with a prefix and suffix answers what an editor's invoked request at that
/// cursor is shown. The daemon runs in-process on a remote tier (a stub whose answer runs past
/// the block into the code after the cursor, which post-processing cuts) and the LSP server
/// in-process on the same pool: the model is asked the same (prompt, stops, limit, n, sampling)
/// by both, and the text HTTP answers is the text the editor shows.
#[test]
fn http_complete_answers_what_an_editor_is_shown_at_the_same_cursor() {
    use laya::engine::{
        pool::{PoolConfig, TierSource},
        remote::RemoteConfig,
        runtime::DevicePref,
        ModelKey, Precision, Tier,
    };
    let stub = stub_answering("a + b\n\nprint(add(1, 2))\n");
    let tmp = tempfile::tempdir().unwrap();
    let small = ModelKey {
        tier: Tier::Small,
        precision: Precision::Native,
    };
    let config = laya::daemon::DaemonConfig {
        pool: PoolConfig {
            tiers: [(Tier::Small, TierSource::Remote(RemoteConfig::new(&stub.url)))].into(),
            default: small,
            preload: vec![],
            device: DevicePref::Cpu,
            prefix: Default::default(),
            speculation: Default::default(),
            use_cache: false,
            loader: Default::default(),
        },
        names: Default::default(),
        runtime_dir: tmp.path().join("rt"),
        http: None,
        token: None,
        limits: Default::default(),
        defaults: Default::default(),
        warmup: false,
        remote_slots: 1,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    let daemon = std::sync::Arc::new(laya::daemon::Daemon::new(config, Some(addr)));
    let pool = daemon.pool().unwrap();
    rt.spawn(laya::daemon::http::serve(daemon.clone(), listener));

    // Invoked at the end of a line: a block, which ends before the code after the cursor.
    const FIXTURE: &str = "def add(a, b):\n    return $0\n\nprint(add(1, 2))\n";
    let cursor = FIXTURE.find("$0").unwrap();
    let text = FIXTURE.replace("$0", "");
    let editor = rt.block_on(async {
        let mut c = support::lsp::InProcess::new(pool);
        c.initialize(
            true,
            json!({ "completion": { "debounceMs": 0, "lookAhead": false } }),
            Value::Null,
        )
        .await;
        let (line, character) = c.open("file:///w/add.py", "python", FIXTURE).await;
        c.request(
            "textDocument/inlineCompletion",
            json!({
                "textDocument": { "uri": "file:///w/add.py" },
                "position": { "line": line, "character": character },
                "context": { "triggerKind": 1 },
            }),
        )
        .await
    });
    let shown = &editor["result"][0]["insertText"];
    assert_eq!(shown, "a + b", "{editor}");

    let body = json!({ "prefix": &text[..cursor], "suffix": &text[cursor..], "path": "add.py" });
    let answer = ok_json(addr, "POST", "/complete", Some(&body.to_string()));
    assert_eq!(&answer["text"], shown, "{answer}");
    assert_eq!(
        (
            &answer["choices"][0]["text"],
            &answer["choices"][0]["replace_len"]
        ),
        (shown, &json!(0)),
        "{answer}"
    );
    assert_eq!(answer["choices"].as_array().map(Vec::len), Some(1), "{answer}");

    let exchanges = stub.exchanges.lock().unwrap();
    let [(from_editor, _), (from_http, _)] = &exchanges[..] else {
        panic!("two requests reached the model: {exchanges:?}");
    };
    assert_eq!(from_http, from_editor);
    assert_eq!(
        (&from_http["stop"], &from_http["max_tokens"], &from_http["n"]),
        (&json!(["\n\n\n"]), &json!(128), &json!(1)),
        "a block's stop and limit: {from_http}"
    );
}
