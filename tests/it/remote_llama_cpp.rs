//! A real llama.cpp server (llama-cpp-python's `llama_cpp.server`, the 1.5B GGUF) on
//! loopback as a remote tier: `laya serve --large-remote` passes prompts through unchanged
//! and answers with llama.cpp's own text, and `laya lsp --remote-url` completes from it.
//!
//! Needs the peer venv (`scripts/peer-setup.sh`, or `LAYA_PEER_PYTHON`) and the 1.5B model
//! (`laya models fetch qwen2.5-coder-1.5b`): the tests run with `LAYA_TEST_REAL_MODELS=1`
//! (`scripts/test.sh` sets it and prepares both) and are skipped without it. With it, a
//! missing venv or model fails them, saying which command installs it.

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::Mutex,
    time::{Duration, Instant},
};

use laya::bench::lsp_client::LspProcess;
use serde_json::{json, Value};

use crate::support::{self, daemon::*, laya};

/// The code around the cursor (the answer differs from the stub's, so the two cannot be
/// confused).
const PREFIX: &str = "def mul(x, y):\n    return ";
const SUFFIX: &str = "\n\nprint(mul(3, 4))\n";
const MAX_TOKENS: u64 = 8;

/// The FIM prompt laya builds from [`PREFIX`] and [`SUFFIX`] (tests/daemon.rs pins the format).
fn fim_prompt() -> String {
    format!("<|fim_prefix|>{PREFIX}<|fim_suffix|>{SUFFIX}<|fim_middle|>")
}

/// One llama.cpp server at a time: the machine may have two cores.
static SERIAL: Mutex<()> = Mutex::new(());

/// `python -m llama_cpp.server` on a free loopback port; killed when dropped.
struct LlamaServer {
    child: Child,
    /// `http://127.0.0.1:PORT/v1`
    url: String,
    log: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The peer's Python and the real 1.5B: `None` (the test is skipped) unless
/// `LAYA_TEST_REAL_MODELS=1`.
fn peer_and_model() -> Option<(PathBuf, PathBuf)> {
    let py = support::real::peer_python()?;
    let model = support::real::model("qwen2.5-coder-1.5b")?;
    Some((py, model))
}

impl LlamaServer {
    /// `python -m llama_cpp.server` of the peer `py` on `model`.
    fn start((py, model): &(PathBuf, PathBuf)) -> LlamaServer {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let tmp = tempfile::tempdir().unwrap();
        let log = tmp.path().join("llama-server.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(py)
            .args(["-m", "llama_cpp.server", "--model"])
            .arg(model)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--n_ctx", "2048", "--n_threads", "2", "--n_threads_batch", "2"])
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {} -m llama_cpp.server: {e}", py.display()));
        let mut s = LlamaServer {
            child,
            url: format!("http://127.0.0.1:{port}/v1"),
            log,
            _tmp: tmp,
        };
        let t0 = Instant::now();
        loop {
            let ok = ureq::get(&format!("{}/models", s.url))
                .timeout(Duration::from_secs(2))
                .call()
                .is_ok();
            if ok {
                break;
            }
            if let Ok(Some(st)) = s.child.try_wait() {
                panic!(
                    "llama_cpp.server exited ({st}) before answering:\n{}",
                    s.log_tail()
                );
            }
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "llama_cpp.server did not answer in 120 s:\n{}",
                s.log_tail()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        eprintln!(
            "llama_cpp.server ready on {} after {:.1} s",
            s.url,
            t0.elapsed().as_secs_f64()
        );
        // The first evaluation sets up llama.cpp's buffers; pay for it before laya's 30 s
        // request limit applies.
        s.greedy("x", 1);
        s
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// POST /v1/completions to llama.cpp itself.
    fn complete(&self, body: &Value) -> Value {
        let t0 = Instant::now();
        let r = ureq::post(&format!("{}/completions", self.url))
            .timeout(Duration::from_secs(60))
            .send_json(body.clone());
        let v: Value = match r {
            Ok(resp) => resp.into_json().unwrap(),
            Err(e) => panic!("llama.cpp /completions: {e}\n{}", self.log_tail()),
        };
        eprintln!("direct llama.cpp request: {:.2} s", t0.elapsed().as_secs_f64());
        v
    }

    /// llama.cpp's greedy text for `prompt`.
    fn greedy(&self, prompt: &str, max_tokens: u64) -> String {
        let v = self.complete(&json!({ "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0 }));
        v["choices"][0]["text"]
            .as_str()
            .unwrap_or_else(|| panic!("no text: {v}"))
            .to_owned()
    }
}

#[test]
fn serve_with_a_llama_cpp_large_tier_answers_with_llama_cpps_own_text() {
    let Some(peer) = peer_and_model() else { return };
    let _busy = support::busy_cpu();
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let t0 = Instant::now();
    let llama = LlamaServer::start(&peer);
    let want = llama.greedy(&fim_prompt(), MAX_TOKENS);
    assert!(
        !want.trim().is_empty() && want != STUB_TEXT,
        "llama.cpp itself answered {want:?}"
    );

    // The small tier is the stub, so no local model loads; nothing may go to it.
    let stub = stub();
    let tmp = tempfile::tempdir().unwrap();
    let d = serve_in(
        &tmp.path().join("rt"),
        &[
            "--small-remote",
            &stub.url,
            "--large-remote",
            &llama.url,
            "--http-addr",
            "127.0.0.1:0",
        ],
    );
    let addr = d.http.unwrap();

    // The prompt as given, to the tier the `model` names.
    let body =
        json!({ "model": "large", "prompt": fim_prompt(), "max_tokens": MAX_TOKENS, "temperature": 0.0 });
    let t = Instant::now();
    let (code, text) = http(addr, "POST", "/v1/completions", Some(&body.to_string()), &[]);
    eprintln!("/v1/completions through laya: {:.2} s", t.elapsed().as_secs_f64());
    assert_eq!(code, 200, "{text}\n{}", llama.log_tail());
    let v = json_of(&text);
    assert_eq!(v["served_by"], "large/native", "{v}");
    assert_eq!(v["model"], llama.url.as_str(), "{v}");
    assert_eq!(
        v["choices"][0]["text"],
        want.as_str(),
        "laya changed the prompt or the answer: {v}"
    );
    assert!(
        v["usage"]["prompt_tokens"].as_u64().unwrap() > 0,
        "llama.cpp's usage comes back: {v}"
    );

    // laya's own endpoint builds the same FIM prompt from prefix and suffix, and answers
    // with what an editor is shown: llama.cpp's text, post-processed.
    let body = json!({
        "prefix": PREFIX, "suffix": SUFFIX, "model": { "tier": "large" },
        "max_tokens": MAX_TOKENS, "temperature": 0.0,
    });
    let t = Instant::now();
    let c = ok_json(addr, "POST", "/complete", Some(&body.to_string()));
    eprintln!("/complete through laya: {:.2} s", t.elapsed().as_secs_f64());
    assert_eq!(c["model"], "large/native", "{c}");
    assert_eq!(c["model_name"], llama.url.as_str(), "{c}");
    let text = format!("{PREFIX}{SUFFIX}");
    let shown = laya::completion::postprocess::process(
        &want,
        &laya::completion::postprocess::Surroundings::at(&text, PREFIX.len()),
    )
    .map(|e| e.text)
    .unwrap_or_default();
    assert_eq!(c["text"], shown.as_str(), "llama.cpp's text {want:?}: {c}");

    assert!(
        stub.prompts.lock().unwrap().is_empty(),
        "the small tier was asked"
    );
    let h = ok_json(addr, "GET", "/health", None);
    let large = h["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["tier"] == "large")
        .cloned();
    assert_eq!(
        large.as_ref().map(|m| m["source"].clone()),
        Some(json!("remote")),
        "{h}"
    );
    eprintln!(
        "llama.cpp text {want:?}; test took {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}

#[test]
fn lsp_with_a_llama_cpp_remote_completes_from_its_answer() {
    let Some(peer) = peer_and_model() else { return };
    let _busy = support::busy_cpu();
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let t0 = Instant::now();
    let llama = LlamaServer::start(&peer);
    // Passes the requests on to llama.cpp, recording each with llama.cpp's answer.
    let rec = forwarding(&llama.url);

    let tmp = tempfile::tempdir().unwrap();
    let mut cmd = laya();
    cmd.args(["lsp", "--remote-url", &rec.url])
        .env("LAYA_RUNTIME_DIR", tmp.path().join("rt"))
        .stderr(Stdio::null());
    let t_lsp = Instant::now();
    let mut p = LspProcess::spawn(cmd).unwrap();
    p.initialize(json!({ "completion": { "debounceMs": 0, "maxTokensLine": MAX_TOKENS, "maxTokensBlock": MAX_TOKENS } }))
        .unwrap();
    let text = format!("{PREFIX}{SUFFIX}");
    p.open("file:///t/mul.py", "python", &text).unwrap();
    let items = p
        .inline_completion("file:///t/mul.py", 1, 11, Duration::from_secs(60))
        .unwrap()
        .unwrap_or_else(|| panic!("no completion; logs: {:?}\n{}", p.logs, llama.log_tail()));
    eprintln!(
        "laya lsp: started and completed in {:.2} s",
        t_lsp.elapsed().as_secs_f64()
    );
    let exchanges = rec.exchanges.lock().unwrap().clone();
    assert_eq!(exchanges.len(), 1, "one request to llama.cpp: {exchanges:?}");
    let (sent, answer) = &exchanges[0];
    let prompt = sent["prompt"].as_str().unwrap();
    assert!(
        prompt.contains("<|fim_prefix|>") && prompt.contains(PREFIX) && prompt.ends_with("<|fim_middle|>"),
        "a FIM prompt with the document: {prompt:?}"
    );
    assert!(sent["max_tokens"].as_u64().unwrap() <= MAX_TOKENS, "{sent}");
    let produced = answer["choices"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("llama.cpp answered {answer}"));
    assert!(
        !items.is_empty() && !items[0].trim().is_empty(),
        "an item: {items:?} from {produced:?}"
    );
    assert!(
        produced.contains(items[0].trim()),
        "the item {:?} comes from llama.cpp's text {produced:?}",
        items[0]
    );
    // The same request sent to llama.cpp directly gives the same (greedy) text.
    let direct = llama.complete(sent);
    assert_eq!(direct["choices"][0]["text"].as_str(), Some(produced), "{direct}");
    p.shutdown(Duration::from_secs(5));
    eprintln!(
        "item {:?} from llama.cpp text {produced:?}; test took {:.1} s",
        items[0],
        t0.elapsed().as_secs_f64()
    );
}
