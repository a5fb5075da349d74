//! `laya serve` and `laya lsp` as processes, for the daemon, fault and remote tests: the
//! OpenAI-compatible stub to point tiers at, daemon start-up, HTTP and socket exchanges, and
//! `laya lsp` through `laya::bench::lsp_client::LspProcess`.

use std::{
    io::{BufRead, BufReader, Write},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use axum::{routing::get, routing::post, Json, Router};
use laya::bench::lsp_client::LspProcess;
use serde_json::{json, Value};

use super::laya;

pub const STUB_TEXT: &str = "a + b";

/// The tests' one OpenAI-compatible server (`/v1/models`, `/v1/completions`): it answers
/// every completion with [`STUB_TEXT`] ([`stub`]), another text ([`stub_answering`]) or with
/// what another server answers ([`forwarding`]), after `delay_ms`, and records the prompts in
/// the order it started answering them and each completion's request with its answer.
pub struct Stub {
    pub url: String,
    pub prompts: Arc<Mutex<Vec<String>>>,
    pub exchanges: Arc<Mutex<Vec<(Value, Value)>>>,
    pub delay_ms: Arc<AtomicU64>,
}

pub fn stub() -> Stub {
    start_stub(None, STUB_TEXT)
}

/// A stub that answers every completion with `text` (whatever its stop strings say).
pub fn stub_answering(text: &'static str) -> Stub {
    start_stub(None, text)
}

/// A stub that passes `/v1/models` and `/v1/completions` on to `target` (`http://…/v1`).
pub fn forwarding(target: &str) -> Stub {
    start_stub(Some(target.to_owned()), STUB_TEXT)
}

/// `target`'s answer (JSON) to a GET (`body` `None`) or a POST of `body`; null if none came.
async fn upstream(url: String, body: Option<Value>) -> Value {
    let answer = tokio::task::spawn_blocking(move || {
        let r = match body {
            Some(b) => ureq::post(&url).timeout(Duration::from_secs(60)).send_json(b),
            None => ureq::get(&url).call(),
        };
        r.ok().and_then(|r| r.into_json::<Value>().ok())
    });
    answer.await.ok().flatten().unwrap_or(Value::Null)
}

fn start_stub(target: Option<String>, text: &'static str) -> Stub {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let prompts = Arc::new(Mutex::new(vec![]));
    let exchanges = Arc::new(Mutex::new(vec![]));
    let delay_ms = Arc::new(AtomicU64::new(0));
    let (p, ex, d) = (prompts.clone(), exchanges.clone(), delay_ms.clone());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let models_target = target.clone();
            let app = Router::new()
                .route(
                    "/v1/models",
                    get(move || {
                        let target = models_target.clone();
                        async move {
                            Json(match target {
                                Some(t) => upstream(format!("{t}/models"), None).await,
                                None => json!({ "object": "list", "data": [{ "id": "stub-coder" }] }),
                            })
                        }
                    }),
                )
                .route(
                    "/v1/completions",
                    post(move |Json(body): Json<Value>| {
                        let (p, ex, d, target) = (p.clone(), ex.clone(), d.clone(), target.clone());
                        async move {
                            p.lock()
                                .unwrap()
                                .push(body["prompt"].as_str().unwrap_or("").to_owned());
                            tokio::time::sleep(Duration::from_millis(d.load(Ordering::Relaxed))).await;
                            let answer = match target {
                                Some(t) => upstream(format!("{t}/completions"), Some(body.clone())).await,
                                None => {
                                    let n = body["n"].as_u64().unwrap_or(1);
                                    let choices: Vec<Value> = (0..n)
                                        .map(|i| json!({ "index": i, "text": text, "finish_reason": "stop" }))
                                        .collect();
                                    json!({
                                        "choices": choices,
                                        "usage": { "prompt_tokens": 7, "completion_tokens": 3 },
                                    })
                                }
                            };
                            ex.lock().unwrap().push((body, answer.clone()));
                            Json(answer)
                        }
                    }),
                );
            let l = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(l, app).await.unwrap();
        });
    });
    Stub {
        url,
        prompts,
        exchanges,
        delay_ms,
    }
}

/// A `laya serve` child; killed when dropped.
pub struct Serve {
    pub child: Child,
    pub dir: PathBuf,
    pub http: Option<SocketAddr>,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start `laya serve ARGS` for runtime directory `dir` and wait for its socket (and HTTP
/// address, unless `--no-http`).
pub fn serve_in(dir: &Path, args: &[&str]) -> Serve {
    serve_with(dir, args, |_| {})
}

/// [`serve_in`], with the command adjusted by `setup` first (environment, stderr).
pub fn serve_with(dir: &Path, args: &[&str], setup: impl FnOnce(&mut Command)) -> Serve {
    let mut cmd = laya();
    cmd.arg("serve")
        .args(args)
        .env("LAYA_RUNTIME_DIR", dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    setup(&mut cmd);
    let mut child = cmd.spawn().unwrap();
    let want_http = !args.contains(&"--no-http");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let socket = std::os::unix::net::UnixStream::connect(dir.join("laya.sock")).is_ok();
        let http = laya::daemon::paths::read_http_addr(dir);
        if socket && (http.is_some() || !want_http) {
            return Serve {
                child,
                dir: dir.to_owned(),
                http,
            };
        }
        if let Ok(Some(st)) = child.try_wait() {
            panic!("laya serve exited: {st}");
        }
        assert!(Instant::now() < deadline, "laya serve did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The daemon's runtime directory `dir` is private: the directory 0700, its socket 0600.
pub fn assert_private(dir: &Path) {
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(dir).unwrap().mode() & 0o777, 0o700);
    let sock = std::fs::symlink_metadata(dir.join("laya.sock")).unwrap();
    assert_eq!(sock.mode() & 0o777, 0o600);
    assert_eq!(sock.uid(), rustix::process::getuid().as_raw());
}

/// `laya serve`'s tiers for a stub-backed daemon (the small tier answered by `stub`, no large
/// tier) and its HTTP address (`127.0.0.1:0`: a free loopback port).
pub fn stub_tiers<'a>(stub: &'a Stub, http_addr: &'a str) -> [&'a str; 6] {
    [
        "--small-remote",
        &stub.url,
        "--large",
        "none",
        "--http-addr",
        http_addr,
    ]
}

/// A stub-backed daemon in a fresh runtime directory.
pub fn serve_stub(stub: &Stub, extra: &[&str]) -> (tempfile::TempDir, Serve) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("rt");
    let mut args = stub_tiers(stub, "127.0.0.1:0").to_vec();
    args.extend_from_slice(extra);
    let s = serve_in(&dir, &args);
    (tmp, s)
}

pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
    headers: &[(&str, &str)],
) -> (u16, String) {
    let mut req = ureq::request(method, &format!("http://{addr}{path}")).timeout(Duration::from_secs(20));
    for (k, v) in headers {
        req = req.set(k, v);
    }
    let r = match body {
        Some(b) => req.set("Content-Type", "application/json").send_string(b),
        None => req.call(),
    };
    match r {
        Ok(resp) => (resp.status(), resp.into_string().unwrap()),
        Err(ureq::Error::Status(code, resp)) => (code, resp.into_string().unwrap()),
        Err(e) => panic!("{method} {path}: {e}"),
    }
}

pub fn json_of(s: &str) -> Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("{e}: {s}"))
}

pub fn ok_json(addr: SocketAddr, method: &str, path: &str, body: Option<&str>) -> Value {
    let (code, text) = http(addr, method, path, body, &[]);
    assert_eq!(code, 200, "{method} {path}: {text}");
    json_of(&text)
}

/// One JSON-lines exchange over the daemon's socket.
pub fn socket_request(dir: &Path, line: &str) -> Vec<Value> {
    let mut s = std::os::unix::net::UnixStream::connect(dir.join("laya.sock")).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    writeln!(s, "{line}").unwrap();
    BufReader::new(s).lines().map(|l| json_of(&l.unwrap())).collect()
}

/// `laya serve` processes whose runtime directory is `dir` (Linux: /proc).
pub fn daemons_for(dir: &Path) -> Vec<u32> {
    let want = format!("LAYA_RUNTIME_DIR={}", dir.display());
    let mut pids = vec![];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        if args.get(1) != Some(&&b"serve"[..]) {
            continue;
        }
        let env = std::fs::read(e.path().join("environ")).unwrap_or_default();
        if env.split(|b| *b == 0).any(|v| v == want.as_bytes()) {
            pids.push(pid);
        }
    }
    pids
}

/// Kills whatever daemons the language servers started for `dir`.
pub struct KillDaemons(pub PathBuf);

impl Drop for KillDaemons {
    fn drop(&mut self) {
        for pid in daemons_for(&self.0) {
            kill(pid);
        }
    }
}

pub fn kill(pid: u32) {
    if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
        let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
    }
}

/// Kill `pid` and wait until it is gone and its socket in `dir` refuses connections.
pub fn kill_daemon(dir: &Path, pid: u32) {
    kill(pid);
    let deadline = Instant::now() + Duration::from_secs(10);
    // A dying process loses its command line (so `daemons_for` no longer lists it) before
    // its files close, and its first thread turns zombie while the others still hold the
    // files they share: until the last one ends, its socket accepts a connection, then
    // resets it.
    let socket = dir.join(laya::daemon::paths::SOCKET);
    while daemons_for(dir).contains(&pid)
        || !exited(pid)
        || std::os::unix::net::UnixStream::connect(&socket).is_ok()
    {
        assert!(Instant::now() < deadline, "the daemon did not die");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether process `pid` is gone or a zombie (its files closed).
fn exited(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name in parentheses, which may itself hold any byte.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| matches!(rest.trim_start().chars().next(), Some('Z' | 'X'))),
        Err(_) => true,
    }
}

/// `laya lsp ARGS` for runtime directory `dir`, initialized (no debounce); when `ready`, also
/// waits until it reports its model ready.
pub fn lsp_with(dir: &Path, args: &[&str], ready: bool) -> LspProcess {
    // No answers computed ahead: the tests count the requests that reach the model.
    let settings = json!({ "completion": { "debounceMs": 0, "lookAhead": false } });
    lsp_configured(dir, args, settings, ready.then_some(Duration::from_secs(20)))
}

/// `laya lsp ARGS` for runtime directory `dir`, initialized with laya's `settings`; with
/// `ready`, also waits that long at most until it reports its model ready.
pub fn lsp_configured(dir: &Path, args: &[&str], settings: Value, ready: Option<Duration>) -> LspProcess {
    let mut cmd = laya();
    cmd.arg("lsp")
        .args(args)
        .env("LAYA_RUNTIME_DIR", dir)
        .stderr(Stdio::null());
    let mut p = LspProcess::spawn(cmd).unwrap();
    p.initialize(settings).unwrap();
    // A request made while the model loads waits for it; `ready` starts the test from a
    // loaded model instead.
    if let Some(wait) = ready {
        assert!(p.wait_log(|l| l.contains("model ready"), wait), "{:?}", p.logs);
    }
    p
}

/// `laya lsp` with the stub as its small tier.
pub fn lsp(dir: &Path, stub: &Stub) -> LspProcess {
    lsp_with(dir, &stub_tiers(stub, "127.0.0.1:0"), true)
}

/// Open `name.py` holding `text` and ask for an inline completion at its end.
pub fn complete_in(p: &mut LspProcess, name: &str, text: &str) -> Option<Vec<String>> {
    let uri = format!("file:///t/{name}.py");
    p.open(&uri, "python", text).unwrap();
    let line = text.lines().count() as u32 - 1;
    let col = text.lines().last().unwrap().len() as u32;
    p.inline_completion(&uri, line, col, Duration::from_secs(30))
        .unwrap()
}
