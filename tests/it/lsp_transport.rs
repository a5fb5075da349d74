//! The stdio transport of `laya lsp` (`src/lsp/transport.rs`) under malformed input and at
//! its end, through the real transport: `serve_lsp` over in-memory pipes, and the built
//! `laya lsp` process through its stdin and stdout.
//!
//! Every fault (invalid JSON, JSON that is no JSON-RPC message, batches, ids of odd types,
//! `Content-Length` too short, too long, not a number, missing or too large, an unsupported
//! charset, invalid UTF-8, stray bytes) gets the answer JSON-RPC asks for and the next
//! request on the same connection gets its normal answer. `exit` and the end of the input
//! end the connection (and the process) within a second whatever runs: nothing initialized,
//! a completion in flight, a model loading on its own thread or in the handler, a daemon
//! being started.

use std::{
    path::Path,
    process::{Child, Command, ExitStatus, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use laya::{
    bench::lsp_client::frame,
    engine::{Engine, ModelState},
    lsp::{
        transport::{EndReason, Ending, MAX_BODY, MAX_REQUESTS},
        EngineSource,
    },
};
use serde_json::{json, Value};

use crate::support::{
    self,
    engine::FakeEngine,
    lsp::{null_answers, Wire},
};

/// How long `exit` or the end of the input may take to end a connection or a process.
const END_WITHIN: Duration = Duration::from_secs(1);

/// How long an answer may take before the test fails (a hang).
const WAIT: Duration = Duration::from_secs(20);

/// An engine that answers every request at once with one fixed candidate.
fn constant() -> EngineSource {
    EngineSource::Ready(FakeEngine::answering("value").shared())
}

/// A connection to `serve_lsp(source)` over in-memory pipes, and the server's task.
fn in_memory(source: EngineSource) -> (Wire, tokio::task::JoinHandle<Ending>) {
    Wire::in_memory(source, null_answers(), WAIT)
}

/// `initialize` (no debounce) and `initialized`; returns the answers that came before
/// `initialize`'s.
async fn initialize(c: &mut Wire) -> Vec<Value> {
    let id = c.start(
        "initialize",
        json!({ "capabilities": {}, "initializationOptions": { "completion": { "debounceMs": 0 } } }),
    );
    let (before, r) = c.until(&id).await.unwrap();
    assert!(r["result"]["capabilities"].is_object(), "{r}");
    c.notify("initialized", json!({}));
    before
}

// ---------------------------------------------------------------------------------------
// The faults.

/// A fault, the bytes that follow it before the probe, and the answers it must get: (id,
/// error code, or `None` for a result).
struct Fault {
    name: String,
    bytes: Vec<u8>,
    answers: Vec<(Value, Option<i64>)>,
    /// A text the first answer's message must hold.
    says: Option<&'static str>,
}

fn acceptance(id: Value) -> Vec<u8> {
    json!({ "jsonrpc": "2.0", "id": id, "method": "laya/acceptance", "params": null })
        .to_string()
        .into_bytes()
}

fn faults() -> Vec<Fault> {
    let null = Value::Null;
    let mut all = vec![];
    let mut add = |name: &str, bytes: Vec<u8>, answers: Vec<(Value, Option<i64>)>| {
        all.push(Fault {
            name: name.into(),
            bytes,
            answers,
            says: None,
        })
    };
    let body = acceptance(json!(1));
    // Invalid JSON.
    add(
        "invalid JSON {bad}",
        frame(b"{bad}"),
        vec![(null.clone(), Some(-32700))],
    );
    add("an empty body", frame(b""), vec![(null.clone(), Some(-32700))]);
    add(
        "a truncated body",
        frame(&body[..10]),
        vec![(null.clone(), Some(-32700))],
    );
    add(
        "trailing bytes",
        frame(&[&body[..], b"x"].concat()),
        vec![(null.clone(), Some(-32700))],
    );
    let mut bad_utf8 = body.clone();
    bad_utf8.splice(30..30, [0xff, 0xc3, b'(']);
    add(
        "invalid UTF-8",
        frame(&bad_utf8),
        vec![(null.clone(), Some(-32700))],
    );
    // A lone surrogate escape is read as U+FFFD: the request is answered as usual.
    add(
        "a lone surrogate escape",
        frame(br#"{"jsonrpc":"2.0","id":2,"method":"laya/acceptance","params":{"t":"a\ud800b\udc00"}}"#),
        vec![(json!(2), None)],
    );
    // JSON that is no JSON-RPC message.
    add("an empty batch", frame(b"[]"), vec![(null.clone(), Some(-32600))]);
    let batch = [
        b"[".as_slice(),
        &acceptance(json!(3)),
        b",",
        &acceptance(json!(4)),
        b"]",
    ]
    .concat();
    add(
        "a batch",
        frame(&batch),
        vec![(json!(3), Some(-32600)), (json!(4), Some(-32600))],
    );
    for (what, json) in [
        ("null", "null"),
        ("a number", "42"),
        ("a string", "\"text\""),
        ("{}", "{}"),
    ] {
        add(what, frame(json.as_bytes()), vec![(null.clone(), Some(-32600))]);
    }
    add(
        "a method that is a number",
        frame(br#"{"jsonrpc":"2.0","method":42,"id":5}"#),
        vec![(json!(5), Some(-32600))],
    );
    add(
        "jsonrpc 1.0",
        frame(br#"{"jsonrpc":"1.0","method":"laya/acceptance","id":"v"}"#),
        vec![(json!("v"), Some(-32600))],
    );
    add(
        "no method",
        frame(br#"{"jsonrpc":"2.0","id":6}"#),
        vec![(json!(6), Some(-32600))],
    );
    for (id, answer) in [
        ("1.5", json!(1.5)),
        ("true", Value::Null),
        ("{}", Value::Null),
        ("9223372036854775808", json!(9223372036854775808u64)),
    ] {
        let b = format!(r#"{{"jsonrpc":"2.0","method":"laya/acceptance","id":{id}}}"#);
        add(
            &format!("id {id}"),
            frame(b.as_bytes()),
            vec![(answer, Some(-32600))],
        );
    }
    add(
        "a $/ request",
        frame(br#"{"jsonrpc":"2.0","id":7,"method":"$/laya/unknown"}"#),
        vec![(json!(7), Some(-32601))],
    );
    add(
        "a response to nothing",
        frame(br#"{"jsonrpc":"2.0","id":8,"result":1}"#),
        vec![],
    );
    // Framing.
    let short = [
        format!("Content-Length: {}\r\n\r\n", body.len() - 5).as_bytes(),
        &body,
    ]
    .concat();
    add(
        "Content-Length too short",
        short,
        vec![(null.clone(), Some(-32700))],
    );
    // Too long by 40: the next message's start is inside the body and read from there.
    let long = [
        format!("Content-Length: {}\r\n\r\n", body.len() + 40).as_bytes(),
        &body,
    ]
    .concat();
    add(
        "Content-Length too long (the next header inside)",
        long,
        vec![(null.clone(), Some(-32700))],
    );
    // Too long by 5: the next message is lost (here a notification sent for it).
    let guard = frame(
        br#"{"jsonrpc":"2.0","method":"$/laya/guard","params":{"pad":"................................"}}"#,
    );
    let long = [
        format!("Content-Length: {}\r\n\r\n", body.len() + 5).as_bytes(),
        &body,
        &guard,
    ]
    .concat();
    add(
        "Content-Length too long (the next header cut)",
        long,
        vec![(null.clone(), Some(-32700))],
    );
    for v in [
        "abc",
        "-5",
        "",
        "1.5",
        "0x1f",
        "12a",
        "١٢",
        "99999999999999999999999",
    ] {
        let b = [format!("Content-Length: {v}\r\n\r\n").as_bytes(), &body].concat();
        add(
            &format!("Content-Length {v:?}"),
            b,
            vec![(null.clone(), Some(-32700))],
        );
    }
    add(
        "no Content-Length (a bare body)",
        body.clone(),
        vec![(null.clone(), Some(-32700))],
    );
    add(
        "no Content-Length (Content-Type only)",
        [
            b"Content-Type: application/vscode-jsonrpc; charset=utf-8\r\n\r\n".as_slice(),
            &body,
        ]
        .concat(),
        vec![(null.clone(), Some(-32700))],
    );
    add(
        "an unsupported charset",
        [
            format!(
                "Content-Length: {}\r\nContent-Type: application/vscode-jsonrpc; charset=latin1\r\n\r\n",
                body.len()
            )
            .as_bytes(),
            &body,
        ]
        .concat(),
        vec![(null.clone(), Some(-32700))],
    );
    add(
        "stray bytes",
        b"\x00\xffjunk".to_vec(),
        vec![(null.clone(), Some(-32700))],
    );
    add("stray whitespace", b"\r\n \r\n\t".to_vec(), vec![]);
    add(
        "a header line of 9,000 bytes before a request",
        [
            format!("X-Pad: {}\r\n", "a".repeat(9000)).as_bytes(),
            &frame(&acceptance(json!(9))),
        ]
        .concat(),
        vec![(null.clone(), Some(-32700)), (json!(9), None)],
    );
    // Lenient framing: header names in any case, other headers, `\n` line ends.
    add(
        "content-length in lower case, other headers",
        [
            format!(
                "content-length: {}\r\nX-A: 1\r\nContent-Type: application/json; charset=\"UTF-8\"\r\n\r\n",
                body.len()
            )
            .as_bytes(),
            &body,
        ]
        .concat(),
        vec![(json!(1), None)],
    );
    add(
        "\\n line ends",
        [format!("Content-Length: {}\n\n", body.len()).as_bytes(), &body].concat(),
        vec![(json!(1), None)],
    );
    for (len, says) in [(MAX_BODY + 1, "64 MiB"), (1 << 62, "64 MiB")] {
        all.push(Fault {
            name: format!("Content-Length {len}"),
            bytes: [format!("Content-Length: {len}\r\n\r\n").as_bytes(), &body].concat(),
            answers: vec![(Value::Null, Some(-32700))],
            says: Some(says),
        });
    }
    all
}

/// Sends each fault, then a probe; the answers before the probe's must be the fault's, and
/// the probe must get its proper answer. Returns how many faults were sent.
async fn each_fault_then_a_probe(c: &mut Wire) -> usize {
    let faults = faults();
    for f in &faults {
        c.raw(&f.bytes);
        let probe = c.start("laya/acceptance", Value::Null);
        let (before, answer) = c.until(&probe).await.unwrap();
        assert!(
            answer["result"]["shown"].is_u64(),
            "{}: the probe got {answer}",
            f.name
        );
        let mut got: Vec<(Value, Option<i64>)> = before
            .iter()
            .map(|m| (m["id"].clone(), m["error"]["code"].as_i64()))
            .collect();
        let mut want = f.answers.clone();
        let key = |a: &(Value, Option<i64>)| format!("{a:?}");
        got.sort_by_key(key);
        want.sort_by_key(key);
        assert_eq!(got, want, "{}: answers {before:?}", f.name);
        if let Some(says) = f.says {
            let message = before[0]["error"]["message"].as_str().unwrap_or_default();
            assert!(message.contains(says), "{}: {message}", f.name);
        }
    }
    faults.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fault_is_answered_and_the_same_connection_keeps_serving() {
    let _quiet = support::quiet_cpu().await;
    let (mut c, server) = in_memory(constant());
    // Faults before `initialize` too: the server is not confused by them.
    c.raw(&frame(b"{bad}"));
    let before = initialize(&mut c).await;
    assert_eq!(before.len(), 1, "{before:?}");
    assert_eq!(before[0]["error"]["code"], -32700, "{before:?}");
    let uri = "file:///t/a.py";
    c.notify(
        "textDocument/didOpen",
        json!({ "textDocument": { "uri": uri, "languageId": "python", "version": 1, "text": "x = " } }),
    );
    let n = each_fault_then_a_probe(&mut c).await;
    assert!(n > 40, "{n} faults");
    // Completions still work on the document opened before the faults.
    let r = c
        .request(
            "textDocument/inlineCompletion",
            json!({ "textDocument": { "uri": uri }, "position": { "line": 0, "character": 4 }, "context": { "triggerKind": 1 } }),
        )
        .await.unwrap();
    assert_eq!(r["result"][0]["insertText"], "value", "{r}");
    let r = c.request("shutdown", Value::Null).await.unwrap();
    assert!(r.get("error").is_none(), "{r}");
    c.notify("exit", Value::Null);
    let started = Instant::now();
    let ending = tokio::time::timeout(END_WITHIN, server)
        .await
        .expect("exit ends serve")
        .unwrap();
    assert!(started.elapsed() < END_WITHIN);
    assert_eq!(
        ending,
        Ending {
            reason: EndReason::Exit,
            shutdown: true
        }
    );
    assert_eq!(ending.exit_code(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fault_split_across_writes_is_the_same_fault() {
    let (mut c, _server) = in_memory(constant());
    assert_eq!(initialize(&mut c).await, Vec::<Value>::new());
    // Each byte in its own write: the answers do not depend on how the input is cut.
    for f in faults() {
        for b in &f.bytes {
            c.raw(&[*b]);
        }
        let probe = c.start("laya/acceptance", Value::Null);
        let (before, answer) = c.until(&probe).await.unwrap();
        assert!(answer["result"]["shown"].is_u64(), "{}: {answer}", f.name);
        assert_eq!(before.len(), f.answers.len(), "{}: {before:?}", f.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_beyond_the_limit_are_refused_at_once_and_notifications_still_pass() {
    let (mut c, _server) = in_memory(EngineSource::Ready(FakeEngine::stuck().shared()));
    initialize(&mut c).await;
    // One stuck completion per document (a newer one would cancel the older on its document).
    let mut stuck = vec![];
    for i in 0..MAX_REQUESTS {
        let uri = format!("file:///t/{i}.py");
        c.notify(
            "textDocument/didOpen",
            json!({ "textDocument": { "uri": uri, "languageId": "python", "version": 1, "text": "x = " } }),
        );
        stuck.push(c.start(
            "textDocument/inlineCompletion",
            json!({ "textDocument": { "uri": uri }, "position": { "line": 0, "character": 4 }, "context": { "triggerKind": 1 } }),
        ));
    }
    let r = c.request("laya/acceptance", Value::Null).await.unwrap();
    assert_eq!(r["error"]["code"], -32803, "{r}");
    // `$/cancelRequest` is a notification: it passes, and frees a place.
    c.notify("$/cancelRequest", json!({ "id": stuck[0] }));
    let r = c.next().await.unwrap().unwrap();
    assert_eq!(r["id"], stuck[0], "{r}");
    assert_eq!(r["error"]["code"], -32800, "{r}");
    let r = c.request("laya/acceptance", Value::Null).await.unwrap();
    assert!(r["result"]["shown"].is_u64(), "{r}");
}

// ---------------------------------------------------------------------------------------
// The end of a connection.

/// States a connection can be in when `exit` or the end of the input comes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum State {
    /// Nothing sent.
    Fresh,
    Initialized,
    /// `shutdown` answered.
    ShutDown,
    /// An inline completion waits on a model that never answers.
    CompletionInFlight,
    /// The model loads on a thread of its own and never finishes.
    ModelLoadingOnItsThread,
    /// The model factory blocks the thread that runs it (a model loaded in the handler).
    ModelLoadingInTheHandler,
}

const STATES: [State; 6] = [
    State::Fresh,
    State::Initialized,
    State::ShutDown,
    State::CompletionInFlight,
    State::ModelLoadingOnItsThread,
    State::ModelLoadingInTheHandler,
];

/// Opens a document and asks for a completion at its end, without waiting; its id.
fn start_a_completion(c: &mut Wire) -> Value {
    c.notify(
        "textDocument/didOpen",
        json!({ "textDocument": { "uri": "file:///t/a.py", "languageId": "python", "version": 1, "text": "x = " } }),
    );
    c.start(
        "textDocument/inlineCompletion",
        json!({ "textDocument": { "uri": "file:///t/a.py" }, "position": { "line": 0, "character": 4 }, "context": { "triggerKind": 1 } }),
    )
}

/// Ends the connection: `exit`, or the end of the server's input.
fn end(c: &Wire, by_exit: bool) {
    if by_exit {
        c.notify("exit", Value::Null);
    } else {
        c.close();
    }
}

/// Waits until `release` is set (at most 20 s): a model load that does not finish.
fn block_until(release: &AtomicBool) {
    let until = Instant::now() + Duration::from_secs(20);
    while !release.load(Ordering::SeqCst) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_and_the_end_of_input_end_the_connection_within_a_second_in_every_state() {
    let _quiet = support::quiet_cpu().await;
    for state in STATES {
        for by_exit in [true, false] {
            // Ends the model loads of this case (each blocks a thread until then).
            let release = Arc::new(AtomicBool::new(false));
            let case = format!("{state:?}, {}", if by_exit { "exit" } else { "end of input" });
            let source = match state {
                State::CompletionInFlight => EngineSource::Ready(FakeEngine::stuck().shared()),
                State::ModelLoadingOnItsThread => {
                    let release = release.clone();
                    EngineSource::Deferred(Box::new(move |report| {
                        report(&ModelState::Loading);
                        std::thread::Builder::new()
                            .name("model".into())
                            .spawn(move || block_until(&release))
                            .unwrap();
                        FakeEngine::stuck().shared() as Arc<dyn Engine>
                    }))
                }
                State::ModelLoadingInTheHandler => {
                    let release = release.clone();
                    EngineSource::Deferred(Box::new(move |_| {
                        block_until(&release);
                        FakeEngine::stuck().shared() as Arc<dyn Engine>
                    }))
                }
                _ => constant(),
            };
            let (mut c, server) = in_memory(source);
            let mut in_flight = None;
            if state != State::Fresh {
                assert_eq!(initialize(&mut c).await, Vec::<Value>::new());
            }
            match state {
                State::ShutDown => {
                    let r = c.request("shutdown", Value::Null).await.unwrap();
                    assert!(r.get("error").is_none(), "{case}: {r}");
                }
                State::CompletionInFlight => in_flight = Some(start_a_completion(&mut c)),
                _ => {}
            }
            // Let the server get into the state (the request to the model, the load).
            tokio::time::sleep(Duration::from_millis(200)).await;
            let started = Instant::now();
            end(&c, by_exit);
            let ending = match tokio::time::timeout(Duration::from_secs(10), server).await {
                Ok(e) => e.unwrap_or_else(|e| panic!("{case}: serve failed: {e}")),
                Err(_) => panic!("{case}: serve still runs 10 s after the end"),
            };
            let took = started.elapsed();
            assert!(took < END_WITHIN, "{case}: took {took:?}");
            let reason = if by_exit {
                EndReason::Exit
            } else {
                EndReason::EndOfInput
            };
            assert_eq!(
                ending,
                Ending {
                    reason,
                    shutdown: state == State::ShutDown
                },
                "{case}"
            );
            assert_eq!(ending.exit_code(), u8::from(state != State::ShutDown), "{case}");
            // The output closes, and a request in flight got exactly one answer: cancelled.
            let rest = c.rest().await.unwrap();
            if let Some(id) = in_flight {
                let answers: Vec<&Value> = rest.iter().filter(|m| m["id"] == id).collect();
                assert_eq!(answers.len(), 1, "{case}: {rest:?}");
                assert_eq!(answers[0]["error"]["code"], -32800, "{case}: {rest:?}");
            }
            release.store(true, Ordering::SeqCst);
        }
    }
}

// ---------------------------------------------------------------------------------------
// The built process.

fn laya_lsp(args: &[&str], runtime_dir: &Path) -> Child {
    support::laya()
        .arg("lsp")
        .args(args)
        .env("LAYA_RUNTIME_DIR", runtime_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// The process's exit status once it ended; fails when it takes more than [`END_WITHIN`]
/// from `since` (it is killed after 10 s).
fn ended(child: &mut Child, since: Instant, case: &str) -> ExitStatus {
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let took = since.elapsed();
            assert!(took < END_WITHIN, "{case}: laya lsp took {took:?} to end");
            return status;
        }
        if since.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{case}: laya lsp still runs 10 s after the end");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn laya_lsp_answers_every_fault_on_its_stdio_and_keeps_serving() {
    let _quiet = support::quiet_cpu().await;
    let tmp = tempfile::tempdir().unwrap();
    let mut child = laya_lsp(&["--remote-url", "http://127.0.0.1:1"], tmp.path());
    let mut c = Wire::process(&mut child, null_answers(), WAIT);
    c.raw(&frame(b"[]"));
    let before = initialize(&mut c).await;
    assert_eq!(before.len(), 1, "{before:?}");
    assert_eq!(before[0]["error"]["code"], -32600, "{before:?}");
    each_fault_then_a_probe(&mut c).await;
    let r = c.request("shutdown", Value::Null).await.unwrap();
    assert!(r.get("error").is_none(), "{r}");
    c.notify("exit", Value::Null);
    let status = ended(&mut child, Instant::now(), "shutdown, exit");
    assert_eq!(status.code(), Some(0));
}

fn mkfifo(path: &Path) {
    let ok = Command::new("mkfifo").arg(path).status().unwrap().success();
    assert!(ok, "mkfifo {}", path.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn laya_lsp_ends_within_a_second_on_exit_or_the_end_of_its_input_in_every_state() {
    let _quiet = support::quiet_cpu().await;
    let tmp = tempfile::tempdir().unwrap();
    let stub = support::daemon::stub();
    // The stub answers after a minute: a completion stays in flight.
    stub.delay_ms.store(60_000, Ordering::Relaxed);
    // A model file that is a FIFO nobody writes: opening it blocks, the load never ends.
    let fifo = tmp.path().join("model.gguf");
    mkfifo(&fifo);
    let fifo = fifo.display().to_string();
    let remote = ["--remote-url", "http://127.0.0.1:1"];
    let slow = ["--remote-url", stub.url.as_str()];
    let loading = ["--in-process", "--small", &fifo, "--large", "none", "--no-cache"];
    let daemon = ["--small", &fifo, "--large", "none", "--no-http", "--no-cache"];
    let runtime = tmp.path().join("rt");
    let _daemons = support::daemon::KillDaemons(runtime.clone());
    let cases: [(&str, &[&str]); 6] = [
        ("fresh", &remote),
        ("initialized", &remote),
        ("shut down", &remote),
        ("a completion in flight", &slow),
        ("a model loading in process", &loading),
        ("a daemon starting with a model loading", &daemon),
    ];
    for (state, args) in cases {
        for by_exit in [true, false] {
            let case = format!("{state}, {}", if by_exit { "exit" } else { "end of input" });
            let mut child = laya_lsp(args, &runtime);
            let mut c = Wire::process(&mut child, null_answers(), WAIT);
            if state != "fresh" {
                assert_eq!(initialize(&mut c).await, Vec::<Value>::new());
            }
            let mut shutdown = false;
            match state {
                "shut down" => {
                    let r = c.request("shutdown", Value::Null).await.unwrap();
                    assert!(r.get("error").is_none(), "{case}: {r}");
                    shutdown = true;
                }
                "a completion in flight" => {
                    start_a_completion(&mut c);
                }
                _ => {}
            }
            // Let it get there: the request at the stub, the model thread in `open`.
            tokio::time::sleep(Duration::from_millis(500)).await;
            let started = Instant::now();
            end(&c, by_exit);
            let status = tokio::task::block_in_place(|| ended(&mut child, started, &case));
            assert_eq!(status.code(), Some(if shutdown { 0 } else { 1 }), "{case}");
        }
    }
}
