//! Stale work never holds a model: a request whose client is gone stops wherever it is (in
//! the queue, prefilling, decoding), within one prompt chunk or decode step of the daemon
//! noticing, and the model serves the next request. The clients leave the ways clients do:
//! a closed socket (streaming or not), an HTTP client that disconnects (streaming or not), an
//! editor's `$/cancelRequest`, a newer request for the same document, and a `laya lsp` that
//! is killed or whose editor closes its input.
//!
//! Real processes (`laya serve`, `laya lsp`) on the tiny GGUF of `support::gguf` (it writes `a`
//! until told to stop), on the CPU. The assertions are on counts the daemon's status reports
//! (`abandoned`, and per model `work`: requests, cancelled, prompt chunks and tokens, decode
//! steps), never on speed: the status read that first shows a request abandoned was made
//! after its cancel flag was set, so the worker may run at most one more chunk or step than
//! that status shows. Made to ignore the flag between chunks or steps, or to miss a client
//! that left, these tests fail (a prompt of 12,000 tokens prefills for seconds on this model;
//! 8,000 tokens decode for seconds).

use std::{
    io::Write,
    net::{SocketAddr, TcpStream},
    os::unix::net::UnixStream,
    path::Path,
    process::Stdio,
    time::{Duration, Instant},
};

use laya::bench::lsp_client::LspProcess;
use serde_json::{json, Value};

use crate::support::{self, daemon::*, gguf};

/// Prompt tokens of a request that is to be left while it prefills (the tiny model's
/// vocabulary is bytes: one token a byte).
const LONG_PROMPT: usize = 12_000;
/// Tokens asked of a request that is to be left while it decodes.
const LONG_DECODE: usize = 8_000;

/// A daemon on the tiny model, on the CPU, with room for long prompts and answers.
fn tiny_daemon(tmp: &Path) -> Serve {
    let model = tmp.join("tiny.gguf");
    std::fs::write(&model, gguf::tiny_gguf().bytes).unwrap();
    let m = model.display().to_string();
    let args = [
        "--small",
        &m,
        "--large",
        "none",
        "--http-addr",
        "127.0.0.1:0",
        "--device",
        "cpu",
        "--max-seq-len",
        "65536",
        "--max-tokens",
        "8000",
    ];
    let d = serve_with(&tmp.join("rt"), &args, |c| {
        c.env("LAYA_CACHE_DIR", tmp.join("cache")).stderr(Stdio::null());
    });
    let addr = d.http.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while ok_json(addr, "GET", "/health", None)["status"] != "ok" {
        assert!(Instant::now() < deadline, "the tiny model did not load");
        std::thread::sleep(Duration::from_millis(20));
    }
    d
}

/// The daemon's counts: requests abandoned by their clients, and the model's work.
#[derive(Clone, Copy, Debug, serde::Deserialize)]
struct Work {
    busy: bool,
    requests: u64,
    cancelled: u64,
    prefill_chunks: u64,
    prefill_tokens: u64,
    decode_steps: u64,
}

#[derive(Clone, Copy, Debug)]
struct Counts {
    abandoned: u64,
    waiting: u64,
    work: Work,
}

fn counts(addr: SocketAddr) -> Counts {
    let h = ok_json(addr, "GET", "/health", None);
    let work = serde_json::from_value(h["models"][0]["work"].clone())
        .unwrap_or_else(|e| panic!("no work counts ({e}) in {h}"));
    Counts {
        abandoned: h["abandoned"].as_u64().unwrap(),
        waiting: h["queue"]["waiting"].as_u64().unwrap(),
        work,
    }
}

/// The first counts that satisfy `until` (polled; 30 s at most: a request that does not
/// stop runs far longer, and fails here).
fn wait_counts(addr: SocketAddr, what: &str, until: impl Fn(&Counts) -> bool) -> Counts {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let c = counts(addr);
        if until(&c) {
            return c;
        }
        assert!(Instant::now() < deadline, "waited 30 s for {what}: {c:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The counts once the model is idle, nothing waits, and `requests` requests have ended.
fn idle(addr: SocketAddr, requests: u64) -> Counts {
    wait_counts(
        addr,
        &format!("{requests} requests ended and the model idle"),
        |c| !c.work.busy && c.work.requests == requests && c.waiting == 0,
    )
}

/// A prompt of `n` tokens that shares no prefix with the other tests' prompts (so the prefix
/// store reuses nothing of them).
fn prompt(tag: &str, n: usize) -> String {
    let head = format!("{tag}\n");
    let body = "b".repeat(n.saturating_sub(head.len()));
    head + &body
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Transport {
    Socket,
    SocketStream,
    Http,
    HttpStream,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Stage {
    Prefill,
    Decode,
}

/// A client that sent a request and reads nothing; dropping it closes its connection.
#[allow(dead_code)] // the connections are only held, then dropped
enum Client {
    Unix(UnixStream),
    Tcp(TcpStream),
}

fn send(t: Transport, dir: &Path, addr: SocketAddr, prompt: &str, max_tokens: usize, who: &str) -> Client {
    match t {
        Transport::Socket | Transport::SocketStream => {
            let mut s = UnixStream::connect(dir.join("laya.sock")).unwrap();
            let line = json!({ "op": "complete", "client": who, "stream": t == Transport::SocketStream,
                "request": { "prompt": prompt, "max_tokens": max_tokens } });
            writeln!(s, "{line}").unwrap();
            Client::Unix(s)
        }
        Transport::Http | Transport::HttpStream => {
            let mut s = TcpStream::connect(addr).unwrap();
            let body =
                json!({ "prompt": prompt, "max_tokens": max_tokens, "stream": t == Transport::HttpStream })
                    .to_string();
            write!(
                s,
                "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nX-Laya-Client: {who}\r\n\
                 Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .unwrap();
            Client::Tcp(s)
        }
    }
}

/// A short request answers `max_tokens` times `a`: the model is free again.
fn served_next(addr: SocketAddr, tag: &str) {
    let body = json!({ "prompt": prompt(tag, 20), "max_tokens": 3 }).to_string();
    let c = ok_json(addr, "POST", "/v1/completions", Some(&body));
    assert_eq!(c["choices"][0]["text"], gguf::TOKEN_TEXT.repeat(3), "{c}");
}

/// The request in flight is under way at `stage`: a few chunks or steps run, and (when
/// prefilling) the prompt not all run and no decode step yet.
fn under_way(addr: SocketAddr, stage: Stage, base: &Work, prompt_tokens: usize) -> Counts {
    let during = wait_counts(addr, &format!("{stage:?} under way"), |c| {
        c.work.busy
            && match stage {
                Stage::Prefill => c.work.prefill_chunks >= base.prefill_chunks + 3,
                Stage::Decode => c.work.decode_steps >= base.decode_steps + 3,
            }
    });
    if stage == Stage::Prefill {
        assert!(
            during.work.prefill_tokens < base.prefill_tokens + prompt_tokens as u64
                && during.work.decode_steps == base.decode_steps,
            "the prefill ended before the client could leave: {during:?}"
        );
    }
    during
}

/// After the client of the one request in flight left at `stage`: the daemon counted it
/// abandoned, the worker ran at most one more chunk (or step) than the status that showed it
/// abandoned, stopped it as cancelled, and serves the next request. Returns what ran after.
fn stopped_within_one_piece(
    addr: SocketAddr,
    stage: Stage,
    base: &Counts,
    prompt_tokens: usize,
    next_tag: &str,
) -> (u64, Counts, Counts) {
    let seen = wait_counts(addr, "the daemon to notice the client left", |c| {
        c.abandoned > base.abandoned
    });
    assert_eq!(seen.abandoned, base.abandoned + 1, "{seen:?}");
    let end = idle(addr, base.work.requests + 1);
    assert_eq!(
        end.work.cancelled,
        base.work.cancelled + 1,
        "stopped as cancelled: {end:?}"
    );
    let (b, s, e) = (&base.work, &seen.work, &end.work);
    let after = match stage {
        Stage::Prefill => {
            assert!(
                e.prefill_chunks <= s.prefill_chunks + 1,
                "{} chunks ran after the status that showed the request abandoned (at most 1)",
                e.prefill_chunks - s.prefill_chunks
            );
            assert!(
                e.prefill_tokens < b.prefill_tokens + prompt_tokens as u64,
                "the whole prompt was run: {e:?}"
            );
            assert_eq!(
                e.decode_steps, b.decode_steps,
                "no decode step after a cancelled prefill"
            );
            e.prefill_chunks - s.prefill_chunks
        }
        Stage::Decode => {
            assert!(
                e.decode_steps <= s.decode_steps + 1,
                "{} steps ran after the status that showed the request abandoned (at most 1)",
                e.decode_steps - s.decode_steps
            );
            assert!(e.decode_steps - b.decode_steps < LONG_DECODE as u64, "{e:?}");
            e.decode_steps - s.decode_steps
        }
    };
    served_next(addr, next_tag);
    (after, seen, end)
}

#[test]
fn a_client_that_leaves_while_its_request_prefills_or_decodes_stops_it_within_one_piece() {
    let _busy = support::busy_cpu();
    let tmp = tempfile::tempdir().unwrap();
    let d = tiny_daemon(tmp.path());
    let addr = d.http.unwrap();
    let transports = [
        Transport::Socket,
        Transport::SocketStream,
        Transport::Http,
        Transport::HttpStream,
    ];
    for (i, &t) in transports.iter().enumerate() {
        for stage in [Stage::Prefill, Stage::Decode] {
            let base = idle(addr, counts(addr).work.requests);
            let tag = format!("case {i} {stage:?}");
            let (text, max_tokens, tokens) = match stage {
                Stage::Prefill => (prompt(&tag, LONG_PROMPT), 4, LONG_PROMPT),
                Stage::Decode => (prompt(&tag, 30), LONG_DECODE, 30),
            };
            let client = send(t, &d.dir, addr, &text, max_tokens, &tag);
            let during = under_way(addr, stage, &base.work, tokens);
            drop(client);
            let (after, seen, end) =
                stopped_within_one_piece(addr, stage, &base, tokens, &format!("after {tag}"));
            let (b, s, e) = (&base.work, &seen.work, &end.work);
            eprintln!(
                "{t:?}, left while {stage:?}: when it left {} chunks/{} tokens/{} steps; \
                 when the daemon showed it abandoned {} chunks/{} steps; in all {} chunks, \
                 {} of {tokens} prompt tokens, {} steps ({after} after)",
                during.work.prefill_chunks - b.prefill_chunks,
                during.work.prefill_tokens - b.prefill_tokens,
                during.work.decode_steps - b.decode_steps,
                s.prefill_chunks - b.prefill_chunks,
                s.decode_steps - b.decode_steps,
                e.prefill_chunks - b.prefill_chunks,
                e.prefill_tokens - b.prefill_tokens,
                e.decode_steps - b.decode_steps,
            );
        }
    }
}

#[test]
fn a_queued_request_whose_client_leaves_never_reaches_the_model() {
    let _busy = support::busy_cpu();
    let tmp = tempfile::tempdir().unwrap();
    let d = tiny_daemon(tmp.path());
    let addr = d.http.unwrap();
    let base = idle(addr, 0);
    // One request decodes; another, from another client, waits behind it.
    let running = send(
        Transport::Socket,
        &d.dir,
        addr,
        &prompt("running", 30),
        LONG_DECODE,
        "one",
    );
    under_way(addr, Stage::Decode, &base.work, 30);
    let queued = send(Transport::Http, &d.dir, addr, &prompt("queued", 30), 3, "two");
    wait_counts(addr, "the second request in line", |c| c.waiting == 1);
    drop(queued);
    let left = wait_counts(addr, "the queued request abandoned", |c| {
        c.abandoned == base.abandoned + 1 && c.waiting == 0
    });
    assert!(left.work.busy, "the first request still runs: {left:?}");
    drop(running);
    let end = wait_counts(addr, "the running request abandoned and stopped", |c| {
        c.abandoned == base.abandoned + 2 && !c.work.busy
    });
    served_next(addr, "after the queue");
    let after = counts(addr);
    assert_eq!(
        after.work.requests,
        base.work.requests + 2,
        "the first request and the one after it ran; the queued one never did: {after:?}"
    );
    assert_eq!(end.work.cancelled, base.work.cancelled + 1, "{end:?}");
}

/// `laya lsp` for the tiny daemon `d` (with its models, which `laya lsp` checks are there
/// before it connects), initialized (no debounce, a prompt budget that holds the whole of
/// [`long_file`], so a prompt has more tokens than the file has bytes), its model ready.
fn editor(d: &Serve) -> LspProcess {
    let settings =
        json!({ "completion": { "debounceMs": 0, "lookAhead": false, "budget": { "maxTokens": 8000 } } });
    let model = d.dir.parent().unwrap().join("tiny.gguf");
    let m = model.display().to_string();
    let args = ["--small", &m, "--large", "none"];
    lsp_configured(&d.dir, &args, settings, Some(Duration::from_secs(30)))
}

/// Open `uri` with `text` (or change it to `text`, from version 2 on) and ask for an inline
/// completion at its end, without waiting for the answer; returns the request's id.
fn complete_at_end(editor: &mut LspProcess, uri: &str, text: &str, version: i32) -> u64 {
    if version == 1 {
        editor.open(uri, "python", text).unwrap();
    } else {
        editor.change(uri, version, text).unwrap();
    }
    let line = text.lines().count() as u32 - 1;
    let col = text.lines().last().unwrap().len() as u32;
    editor
        .start(
            "textDocument/inlineCompletion",
            json!({ "textDocument": { "uri": uri }, "position": { "line": line, "character": col },
                "context": { "triggerKind": 1 } }),
        )
        .unwrap()
}

/// The answer to the editor's request `id` (30 s at most).
fn answer(editor: &mut LspProcess, id: u64) -> Value {
    editor
        .answer(id, Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("an answer from laya lsp within 30 s: {e}"))
}

/// A Python file of 12 KB (12,000 tokens and more for the tiny model: seconds of prefill),
/// different for each `tag`.
fn long_file(tag: &str) -> String {
    let mut text = format!("# {tag}\n");
    for i in 0..400 {
        text.push_str(&format!("value_{i} = \"{}\"\n", "b".repeat(20)));
    }
    text.push_str("result = ");
    text
}

/// How an editor's request is left.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Leave {
    CancelRequest,
    Kill,
    CloseInput,
}

#[test]
fn an_editor_that_cancels_or_goes_away_stops_its_request_in_the_daemon() {
    let _busy = support::busy_cpu();
    let tmp = tempfile::tempdir().unwrap();
    let d = tiny_daemon(tmp.path());
    let addr = d.http.unwrap();
    for (i, leave) in [Leave::CancelRequest, Leave::Kill, Leave::CloseInput]
        .into_iter()
        .enumerate()
    {
        let mut editor = editor(&d);
        let base = idle(addr, counts(addr).work.requests);
        let text = long_file(&format!("{leave:?}"));
        let id = complete_at_end(&mut editor, &format!("file:///t/case{i}.py"), &text, 1);
        under_way(addr, Stage::Prefill, &base.work, text.len());
        match leave {
            Leave::CancelRequest => {
                editor.notify("$/cancelRequest", json!({ "id": id })).unwrap();
                let a = answer(&mut editor, id);
                assert_eq!(a["error"]["code"], -32800, "RequestCancelled: {a}");
            }
            Leave::Kill => drop(editor),
            Leave::CloseInput => {
                // The editor exits: its end of the pipes closes.
                editor.close_input();
                let deadline = Instant::now() + Duration::from_secs(10);
                while editor.try_wait().unwrap().is_none() {
                    assert!(
                        Instant::now() < deadline,
                        "laya lsp still runs 10 s after its input closed"
                    );
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
        let (after, _, end) = stopped_within_one_piece(
            addr,
            Stage::Prefill,
            &base,
            text.len(),
            &format!("after editor {i}"),
        );
        eprintln!(
            "editor {leave:?} while prefilling: {} chunks, {} prompt tokens run ({after} after the daemon showed it abandoned)",
            end.work.prefill_chunks - base.work.prefill_chunks,
            end.work.prefill_tokens - base.work.prefill_tokens,
        );
    }
}

#[test]
fn a_newer_request_for_the_same_document_stops_the_older_one_in_the_daemon() {
    let _busy = support::busy_cpu();
    let tmp = tempfile::tempdir().unwrap();
    let d = tiny_daemon(tmp.path());
    let addr = d.http.unwrap();
    let mut editor = editor(&d);
    let base = idle(addr, counts(addr).work.requests);
    let uri = "file:///t/newer.py";
    let text = long_file("newer");
    let older = complete_at_end(&mut editor, uri, &text, 1);
    under_way(addr, Stage::Prefill, &base.work, text.len());
    let newer = complete_at_end(&mut editor, uri, &format!("{text}1"), 2);
    let a = answer(&mut editor, older);
    assert_eq!(a["error"]["code"], -32800, "the older one: RequestCancelled: {a}");
    let b = answer(&mut editor, newer);
    assert!(b.get("error").is_none(), "the newer one is answered: {b}");
    let end = idle(addr, base.work.requests + 2);
    assert_eq!(end.abandoned, base.abandoned + 1, "{end:?}");
    assert_eq!(end.work.cancelled, base.work.cancelled + 1, "{end:?}");
    eprintln!(
        "older and newer request: {} prompt tokens run for two prompts of {} bytes and more",
        end.work.prefill_tokens - base.work.prefill_tokens,
        text.len()
    );
}
