//! Fuzzing the LSP server where editors meet it: the stdio transport and document edits.
//!
//! `generated_messages_never_break_the_transport` runs the real transport
//! (`laya::lsp::transport::serve_lsp`, what `laya lsp` runs on stdin/stdout) over in-memory
//! pipes and sends it generated messages: well-formed, mutated and random params for every
//! method the server handles and some it does not, odd ids, responses to nothing, framing
//! variants, interleaved with valid `didOpen`/`didChange`/`inlineCompletion` traffic, and
//! framing or decoding faults (invalid JSON, truncated bodies, lying, missing or non-numeric
//! `Content-Length`, invalid UTF-8, batches, ids of odd types, stray bytes). Each fault must
//! get the answers JSON-RPC asks for, and the same connection goes on: more batches and
//! probes follow and must be answered.
//!
//! `random_edits_keep_the_server_text_equal_to_a_model` sends random `didChange`s through the
//! LSP service in both position encodings and compares the server's text with a string model
//! after every one.
//!
//! Both are seeded: `LAYA_FUZZ_SEED` (default [`DEFAULT_SEED`]), and the counts come from
//! `LAYA_FUZZ_MESSAGES` (default 100 000) and `LAYA_FUZZ_EDITS` (default 10 000).

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use laya::{
    bench::lsp_client::frame,
    lsp::{
        transport::{EndReason, Ending},
        EngineSource,
    },
};
use rand::{rngs::StdRng, seq::SliceRandom, Rng, SeedableRng};
use serde_json::{json, Value};

use crate::support::{
    self,
    engine::FakeEngine,
    lsp::{InProcess, Wire},
    panics::no_panics,
};

const DEFAULT_SEED: u64 = 0x1a7a_f022;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// An engine that answers every request at once with one fixed candidate.
fn constant() -> std::sync::Arc<FakeEngine> {
    FakeEngine::answering("value").shared()
}

// ---------------------------------------------------------------------------------------
// The text model: laya's position rules (src/document/position.rs) on a plain `String`.

/// Pieces texts are made of: ASCII, 2-, 3- and 4-byte UTF-8 (surrogate pairs in UTF-16),
/// every line-break style, NUL, a BOM and a Unicode line separator.
const PIECES: &[&str] = &[
    "a",
    "b",
    "x",
    " ",
    "\t",
    "\n",
    "\r\n",
    "\r",
    "é",
    "中",
    "😀",
    "𝄞",
    "\u{0}",
    "\u{feff}",
    "\u{2028}",
    "def f(a):\n    ",
    "return a",
    "}",
    "{",
    "\"",
    "'",
    "#",
    "//",
    "é\r\n😀",
];

fn random_text(rng: &mut StdRng, max_pieces: usize) -> String {
    let n = rng.gen_range(0..=max_pieces);
    (0..n).map(|_| *PIECES.choose(rng).unwrap()).collect()
}

fn units(c: char, utf8: bool) -> usize {
    if utf8 {
        c.len_utf8()
    } else {
        c.len_utf16()
    }
}

/// The byte range of line `line` without its `\n`; lines split at `\n` only (a `\r` is a
/// character of its line). `None` past the last line.
fn line_range(text: &str, line: u64) -> Option<(usize, usize)> {
    let start = match line {
        0 => 0,
        n => text.match_indices('\n').nth(usize::try_from(n - 1).ok()?)?.0 + 1,
    };
    let end = text[start..].find('\n').map_or(text.len(), |i| start + i);
    Some((start, end))
}

/// The byte offset of (line, character): `None` for a line past the end or a position
/// inside a character; a character past the line end means the line end.
fn model_offset(text: &str, line: u64, character: u64, utf8: bool) -> Option<usize> {
    let (start, end) = line_range(text, line)?;
    let mut counted = 0u64;
    for (i, c) in text[start..end].char_indices() {
        if counted == character {
            return Some(start + i);
        }
        counted += units(c, utf8) as u64;
        if counted > character {
            return None;
        }
    }
    Some(end)
}

/// The (line, character) of a byte offset on a character boundary.
fn model_position(text: &str, offset: usize, utf8: bool) -> (u32, u32) {
    let before = &text[..offset];
    let line = before.matches('\n').count();
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let character: usize = text[line_start..offset].chars().map(|c| units(c, utf8)).sum();
    (line as u32, character as u32)
}

fn boundary(text: &str, rng: &mut StdRng) -> usize {
    let mut at = rng.gen_range(0..=text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

fn lsp_range(start: (u64, u64), end: (u64, u64)) -> Value {
    json!({
        "start": { "line": start.0, "character": start.1 },
        "end": { "line": end.0, "character": end.1 },
    })
}

/// One document as the editor sees it.
#[derive(Clone, Debug)]
struct ModelDoc {
    text: String,
    version: i32,
}

/// What a change does to the model, with laya's semantics: `None` when it must be rejected
/// (then the whole `didChange` changes nothing).
fn model_apply(text: &str, change: &Value, utf8: bool) -> Option<String> {
    let new_text = change["text"].as_str()?;
    let Some(range) = change.get("range") else {
        return Some(new_text.to_owned());
    };
    let at = |p: &Value| model_offset(text, p["line"].as_u64()?, p["character"].as_u64()?, utf8);
    let (s, e) = (at(&range["start"])?, at(&range["end"])?);
    (s <= e).then(|| format!("{}{new_text}{}", &text[..s], &text[e..]))
}

/// A random change of `text`: mostly valid, some invalid in each way an editor could get
/// wrong (a line past the end, a position inside a character, a reversed range), some that
/// clamp (a character past the line end) and some full replacements. Returns the change and
/// what kind it is.
fn random_change(text: &str, rng: &mut StdRng, utf8: bool) -> (Value, &'static str) {
    let valid = |rng: &mut StdRng| {
        let (a, b) = (boundary(text, rng), boundary(text, rng));
        let (s, mut e) = (a.min(b), a.max(b));
        if rng.gen_bool(0.5) {
            // Short ranges are the common case in typing.
            e = s + text[s..e].chars().take(3).map(char::len_utf8).sum::<usize>();
        }
        let (sp, ep) = (model_position(text, s, utf8), model_position(text, e, utf8));
        ((sp.0 as u64, sp.1 as u64), (ep.0 as u64, ep.1 as u64))
    };
    let lines = text.matches('\n').count() as u64 + 1;
    let ((start, end), what) = match rng.gen_range(0..100) {
        0..=71 => (valid(rng), "valid"),
        72..=76 => return (json!({ "text": random_text(rng, 40) }), "full text"),
        77..=81 => {
            let (s, _) = valid(rng);
            let past = match rng.gen_range(0..3) {
                0 => u64::from(u32::MAX),
                _ => s.1 + rng.gen_range(1..50),
            };
            (((s.0, past), (s.0, past)), "past the line end")
        }
        82..=86 => {
            let line = match rng.gen_range(0..3) {
                0 => u64::from(u32::MAX),
                _ => lines + rng.gen_range(0..3),
            };
            (((line, 0), (line, rng.gen_range(0..3))), "line past the end")
        }
        87..=94 => {
            // One unit into a character longer than one unit, where the text has one.
            let wide: Vec<usize> = text
                .char_indices()
                .filter(|(_, c)| units(*c, utf8) > 1)
                .map(|(i, _)| i)
                .collect();
            match wide.choose(rng) {
                Some(&i) => {
                    let (l, c) = model_position(text, i, utf8);
                    let inside = (l as u64, c as u64 + 1);
                    let range = if rng.gen_bool(0.5) {
                        (inside, (inside.0, inside.1 + 5))
                    } else {
                        ((l as u64, 0), inside)
                    };
                    (range, "inside a character")
                }
                None => (valid(rng), "valid"),
            }
        }
        _ => match valid(rng) {
            (s, e) if s != e => ((e, s), "reversed"),
            range => (range, "valid"),
        },
    };
    let change = json!({ "range": lsp_range(start, end), "text": random_text(rng, 6) });
    (change, what)
}

// ---------------------------------------------------------------------------------------
// Document edits through the LSP service, checked against the model after every one.

/// The version of the next `didChange`: mostly newer, some stale, some equal, rarely the
/// largest there is (after which nothing is newer until the document is reopened).
fn next_version(current: i32, rng: &mut StdRng) -> (i32, &'static str) {
    match rng.gen_range(0..500) {
        0..=424 => (current.saturating_add(rng.gen_range(1..3)), "newer version"),
        425..=461 => (current.saturating_sub(rng.gen_range(1..5)), "stale version"),
        462..=498 => (current, "equal version"),
        _ => (i32::MAX, "largest version"),
    }
}

#[test]
fn random_edits_keep_the_server_text_equal_to_a_model() {
    no_panics(2, random_edits());
}

async fn random_edits() {
    let seed = env_or("LAYA_FUZZ_SEED", DEFAULT_SEED);
    let total: usize = env_or("LAYA_FUZZ_EDITS", 10_000);
    let mut rng = StdRng::seed_from_u64(seed ^ 0xed17);
    let uris = [
        "file:///work/edits/a.py",
        "file:///work/edits/b.rs",
        "file:///work/edits/c.txt",
    ];
    let languages = ["python", "rust", "plaintext"];
    let mut kinds: HashMap<&'static str, usize> = HashMap::new();
    let (mut changes_sent, mut applied) = (0usize, 0usize);
    let started = Instant::now();
    for (half, utf8) in [false, true].into_iter().enumerate() {
        let mut c = InProcess::new(constant());
        let options = json!({ "completion": { "debounceMs": 0 } });
        c.initialize(utf8, options, Value::Null).await;
        let negotiated = if utf8 { "utf-8" } else { "utf-16" };

        let mut docs: HashMap<&str, ModelDoc> = HashMap::new();
        let edits = total / 2 + if half == 0 { total % 2 } else { 0 };
        for step in 0..edits {
            let k = rng.gen_range(0..uris.len());
            let uri = uris[k];
            if !docs.contains_key(uri) || rng.gen_ratio(1, 150) {
                if docs.contains_key(uri) && rng.gen_bool(0.3) {
                    c.call(
                        "textDocument/didClose",
                        None,
                        json!({ "textDocument": { "uri": uri } }),
                    )
                    .await;
                    docs.remove(uri);
                    *kinds.entry("closed document").or_default() += 1;
                } else {
                    let doc = ModelDoc {
                        text: random_text(&mut rng, 60),
                        version: rng.gen_range(-3..5),
                    };
                    let item = json!({ "uri": uri, "languageId": languages[k], "version": doc.version, "text": doc.text });
                    c.call("textDocument/didOpen", None, json!({ "textDocument": item }))
                        .await;
                    docs.insert(uri, doc);
                }
            }
            let before = docs.get(uri).cloned();
            let current = before.as_ref().map_or(0, |d| d.version);
            let (version, version_kind) = next_version(current, &mut rng);
            *kinds.entry(version_kind).or_default() += 1;
            // Each change's positions refer to the text the previous one left (LSP).
            let mut text = before.as_ref().map(|d| d.text.clone());
            let mut base = text.clone().unwrap_or_default();
            let mut changes = vec![];
            for _ in 0..*[1, 1, 1, 2, 3].choose(&mut rng).unwrap() {
                let (change, what) = if base.len() > 4000 {
                    (json!({ "text": random_text(&mut rng, 10) }), "full text")
                } else {
                    random_change(&base, &mut rng, utf8)
                };
                *kinds.entry(what).or_default() += 1;
                text = text.and_then(|t| model_apply(&t, &change, utf8));
                if let Some(t) = &text {
                    base = t.clone();
                }
                changes.push(change);
            }
            changes_sent += changes.len();
            let params =
                json!({ "textDocument": { "uri": uri, "version": version }, "contentChanges": changes });
            c.call("textDocument/didChange", None, params.clone()).await;
            let expected = match (before, text) {
                (Some(old), Some(new)) if version > old.version => {
                    applied += 1;
                    Some(ModelDoc { text: new, version })
                }
                (old, _) => old,
            };
            if let Some(doc) = &expected {
                docs.insert(uri, doc.clone());
            }
            let server = c.service.inner().document(uri);
            match (&expected, &server) {
                (Some(want), Some(got)) => assert!(
                    *got.text == *want.text && got.version == want.version,
                    "edit {step} ({negotiated}) diverged: {params}\n server v{}: {:?}\n model  v{}: {:?}",
                    got.version,
                    got.text,
                    want.version,
                    want.text
                ),
                (None, None) => {}
                _ => panic!("edit {step}: open in one of server and model only: {params}"),
            }
            // Now and then a completion at a position of the new text: answered, never a panic.
            if step % 16 == 0 {
                if let Some(doc) = &expected {
                    let (line, character) = model_position(&doc.text, boundary(&doc.text, &mut rng), utf8);
                    let p = json!({ "textDocument": { "uri": uri }, "position": { "line": line, "character": character }, "context": { "triggerKind": 2 } });
                    let r = c
                        .call("textDocument/inlineCompletion", Some(step as i64 + 2), p)
                        .await
                        .unwrap();
                    assert!(r.get("result").is_some(), "completion at a valid position: {r}");
                }
            }
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let mut kinds: Vec<_> = kinds.into_iter().collect();
    kinds.sort();
    println!(
        "edit fuzz: seed {seed:#x}, {total} didChange ({changes_sent} changes, {applied} applied), \
         {:.1} s, {:.0} didChange/s; kinds: {kinds:?}",
        secs,
        total as f64 / secs
    );
}

// ---------------------------------------------------------------------------------------
// The transport: a client on the other end of in-memory pipes.

fn to_bytes(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap()
}

/// The client end of one connection to a server on the real transport (over in-memory
/// pipes), and the server's task. The client answers the server's requests
/// (`workspace/configuration`) as an editor would.
struct Connection {
    wire: Wire,
    server: tokio::task::JoinHandle<Ending>,
}

impl Connection {
    fn open(seed: u64) -> Connection {
        let mut rng = StdRng::seed_from_u64(seed);
        let (wire, server) = Wire::in_memory(
            EngineSource::Ready(constant()),
            Box::new(move |method, id| answer_server_request(method, id, &mut rng)),
            // Gives up after 60 s without progress: a hang.
            Duration::from_secs(60),
        );
        Connection { wire, server }
    }

    /// Sends messages, each in one piece.
    fn send(&self, messages: &[Vec<u8>]) {
        for m in messages {
            self.wire.raw(m);
        }
    }

    /// Sends one message in the chunks given.
    fn send_chunked(&self, chunks: &[Vec<u8>]) {
        self.wire.chunks(chunks.to_vec());
    }

    /// Waits for the response to `id` (JSON text), counting every response on the way.
    async fn wait_for(&mut self, id: &str) -> Result<Value, String> {
        Ok(self.responses_until(id).await?.1)
    }

    /// The responses up to the one to `id` (JSON text): (those before it, it).
    async fn responses_until(&mut self, id: &str) -> Result<(Vec<Value>, Value), String> {
        let want: Value = serde_json::from_str(id).map_err(|e| format!("id {id} is not JSON: {e}"))?;
        self.wire.until(&want).await
    }

    /// Waits until every request in `owed` got its responses.
    async fn settle(&mut self, owed: &HashMap<String, usize>) -> Result<(), String> {
        while owed
            .iter()
            .any(|(id, n)| self.wire.seen.get(id).copied().unwrap_or(0) < *n)
        {
            if self.wire.next().await?.is_none() {
                return Err("the server closed the connection with requests unanswered".into());
            }
        }
        Ok(())
    }

    /// Reads the server's output until it closes (after closing the client's output first
    /// when `close_first`) and waits for the server task: an error if it panicked or never
    /// ends. Returns the responses read on the way and how the server ended.
    async fn finish(&mut self, close_first: bool) -> Result<(Vec<Value>, Ending), String> {
        if close_first {
            self.wire.close();
        }
        let rest = self.wire.rest().await?;
        self.wire.close();
        match tokio::time::timeout(Duration::from_secs(60), &mut self.server).await {
            Ok(Ok(ending)) => Ok((rest, ending)),
            Ok(Err(e)) => Err(format!("the server task failed: {e}")),
            Err(_) => Err("the server task did not end after its output closed".into()),
        }
    }
}

/// An editor's answer to a server request: settings (some invalid), nothing, or an error.
fn answer_server_request(method: &Value, id: &Value, rng: &mut StdRng) -> Value {
    if method != "workspace/configuration" || rng.gen_ratio(1, 10) {
        return match rng.gen_bool(0.5) {
            true => json!({ "jsonrpc": "2.0", "id": id, "result": null }),
            false => json!({ "jsonrpc": "2.0", "id": id, "error": { "code": -32603, "message": "no" } }),
        };
    }
    let result = match rng.gen_range(0..5) {
        0 => json!([]),
        1 => json!([null]),
        2 => json!([42]),
        _ => json!([settings(rng)]),
    };
    json!({ "jsonrpc": "2.0", "id": id, "result": result })
}

/// `laya` settings with every field optional and some values at their extremes. The
/// debounce stays at 0–2 ms: the run is about messages, not waiting.
fn settings(rng: &mut StdRng) -> Value {
    let mut completion = serde_json::Map::new();
    let big = |rng: &mut StdRng| match rng.gen_range(0..6) {
        0 => json!(0),
        1 => json!(u64::MAX),
        2 => json!(-1),
        _ => json!(rng.gen_range(1..5000)),
    };
    let share = |rng: &mut StdRng| {
        [
            json!(0.0),
            json!(1.0),
            json!(-1.0),
            json!(2.5),
            json!(1e30),
            json!(0.15),
        ]
        .choose(rng)
        .unwrap()
        .clone()
    };
    let languages = rng.gen_range(0..3);
    let fields: [(&str, Value); 9] = [
        ("debounceMs", json!(rng.gen_range(0..3))),
        ("maxTokensLine", big(rng)),
        ("maxTokensBlock", big(rng)),
        ("candidates", json!(rng.gen_range(0..5))),
        ("temperature", share(rng)),
        (
            "languages",
            json!(["python", "rust", "plaintext", "x"]
                .choose_multiple(rng, languages)
                .collect::<Vec<_>>()),
        ),
        ("typingThrough", json!(rng.gen_bool(0.5))),
        ("anchorMaxBytes", big(rng)),
        (
            "budget",
            json!({ "maxTokens": big(rng), "suffixShare": share(rng), "contextShare": share(rng) }),
        ),
    ];
    completion.insert("debounceMs".into(), json!(0));
    for (k, v) in fields {
        if rng.gen_bool(0.5) {
            completion.insert(k.into(), v);
        }
    }
    json!({ "completion": completion })
}

// ---------------------------------------------------------------------------------------
// The message generator.

/// Documents the generated messages talk about (the tracked document is not among them, so
/// its model stays exact).
const URIS: &[&str] = &[
    "file:///work/fuzz/a.py",
    "file:///work/fuzz/b.rs",
    "file:///work/fuzz/c.txt",
    "untitled:Untitled-1",
    "file:///work/fuzz/%E4%B8%AD.ts",
];
const TRACKED: &str = "file:///work/fuzz/tracked.py";

/// Requests (answered exactly once when they carry an id), advertised or not.
const REQUESTS: &[&str] = &[
    "initialize",
    "textDocument/inlineCompletion",
    "textDocument/completion",
    "workspace/executeCommand",
    "laya/acceptance",
    "laya/explain",
    "textDocument/hover",
    "no/suchMethod",
    "",
];
/// Notifications (an id on one of these is answered with an error).
const NOTIFICATIONS: &[&str] = &[
    "initialized",
    "textDocument/didOpen",
    "textDocument/didChange",
    "textDocument/didClose",
    "textDocument/didSave",
    "workspace/didChangeConfiguration",
    "workspace/didChangeWorkspaceFolders",
    "no/suchNotification",
];
/// `$/` methods: notifications, or requests (with an id) that get MethodNotFound.
const DOLLAR: &[&str] = &["$/cancelRequest", "$/setTrace", "$/laya/unknown"];

/// Field names random objects are made of, so that some land where the server looks.
const KEYS: &[&str] = &[
    "textDocument",
    "uri",
    "position",
    "line",
    "character",
    "range",
    "start",
    "end",
    "text",
    "version",
    "contentChanges",
    "context",
    "triggerKind",
    "languageId",
    "settings",
    "laya",
    "completion",
    "command",
    "arguments",
    "id",
    "kind",
    "value",
    "event",
    "added",
    "removed",
    "capabilities",
    "budget",
    "maxTokens",
    "languages",
    "name",
];

/// One generated message: the bytes (in the chunks they are written in) and the id (JSON
/// text) of the one response it must get, if any.
struct Message {
    chunks: Vec<Vec<u8>>,
    reply: Option<String>,
}

/// A framing or decoding fault: its bytes, its kind, and the answers it must get (the id as
/// JSON text, the error code).
struct Fault {
    bytes: Vec<u8>,
    kind: &'static str,
    answers: Vec<(String, i64)>,
}

/// A notification sent after every fault: a `Content-Length` too large takes the start of
/// what follows into its body, which must be no message that is owed an answer (this one is
/// longer than any excess generated, and nobody answers it).
const GUARD: &[u8] =
    br#"{"jsonrpc":"2.0","method":"$/laya/guard","params":{"pad":"..................................................................................................."}}"#;

/// `bytes` cut at fewer than `cuts` random places (each piece is written on its own).
fn split(rng: &mut StdRng, mut bytes: Vec<u8>, cuts: i32) -> Vec<Vec<u8>> {
    let mut chunks = vec![];
    for _ in 0..rng.gen_range(0..cuts) {
        if bytes.len() > 1 {
            let at = rng.gen_range(1..bytes.len());
            let rest = bytes.split_off(at);
            chunks.push(std::mem::replace(&mut bytes, rest));
        }
    }
    chunks.push(bytes);
    chunks
}

struct Generator {
    rng: StdRng,
    next_id: i64,
    /// Ids sent so far (for duplicates and `$/cancelRequest`).
    ids: Vec<Value>,
}

impl Generator {
    fn uri(&mut self) -> &'static str {
        URIS.choose(&mut self.rng).unwrap()
    }

    fn position(&mut self) -> Value {
        json!({ "line": self.rng.gen_range(0..8), "character": self.rng.gen_range(0..24) })
    }

    fn leaf(&mut self) -> Value {
        let r = &mut self.rng;
        match r.gen_range(0..16) {
            0 => Value::Null,
            1 => json!(r.gen_bool(0.5)),
            2 => json!(*[0i64, -1, 1, i64::MIN, i64::MAX, 1 << 31, 1 << 32]
                .choose(r)
                .unwrap()),
            3 => json!(u64::MAX),
            4 => json!(*[1.5f64, -0.0, 1e300, -2.5].choose(r).unwrap()),
            5 => json!(r.gen_range(0..10)),
            6 => json!(""),
            7 => json!("a".repeat(r.gen_range(0..3000))),
            8 | 9 => json!(*URIS.choose(r).unwrap()),
            _ => json!(random_text(r, 8)),
        }
    }

    fn value(&mut self, depth: u32) -> Value {
        if depth == 0 || self.rng.gen_bool(0.4) {
            return self.leaf();
        }
        let n = self.rng.gen_range(0..5);
        if self.rng.gen_bool(0.3) {
            Value::Array((0..n).map(|_| self.value(depth - 1)).collect())
        } else {
            let mut m = serde_json::Map::new();
            for _ in 0..n {
                let k = KEYS.choose(&mut self.rng).unwrap().to_string();
                let v = self.value(depth - 1);
                m.insert(k, v);
            }
            Value::Object(m)
        }
    }

    /// Well-formed params for `method`.
    fn params(&mut self, method: &str) -> Value {
        let uri = self.uri();
        let doc = json!({ "uri": uri });
        match method {
            "initialize" => json!({ "capabilities": {} }),
            "textDocument/inlineCompletion" => json!({
                "textDocument": doc, "position": self.position(),
                "context": { "triggerKind": self.rng.gen_range(1..3) },
            }),
            "textDocument/completion" | "textDocument/hover" => json!({
                "textDocument": doc, "position": self.position(),
                "context": { "triggerKind": self.rng.gen_range(1..4) },
            }),
            "workspace/executeCommand" => json!({
                "command": if self.rng.gen_bool(0.8) { "laya.accept" } else { "other.command" },
                "arguments": [{ "id": self.rng.gen_range(0..9), "kind": *["full", "word", "line", "x"].choose(&mut self.rng).unwrap() }],
            }),
            "laya/acceptance" => Value::Null,
            "laya/explain" | "textDocument/didClose" | "textDocument/didSave" => {
                json!({ "textDocument": doc })
            }
            "initialized" => json!({}),
            "textDocument/didOpen" => json!({ "textDocument": {
                "uri": uri,
                "languageId": *["python", "rust", "typescript", "plaintext", ""].choose(&mut self.rng).unwrap(),
                "version": self.rng.gen_range(-2..9),
                "text": random_text(&mut self.rng, 80),
            } }),
            "textDocument/didChange" => {
                let changes: Vec<Value> = (0..self.rng.gen_range(0..3))
                    .map(|_| match self.rng.gen_bool(0.9) {
                        true => json!({
                            "range": { "start": self.position(), "end": self.position() },
                            "text": random_text(&mut self.rng, 6),
                        }),
                        false => json!({ "text": random_text(&mut self.rng, 30) }),
                    })
                    .collect();
                json!({ "textDocument": { "uri": uri, "version": self.rng.gen_range(-2..40) }, "contentChanges": changes })
            }
            "workspace/didChangeConfiguration" => match self.rng.gen_range(0..3) {
                0 => json!({ "settings": { "laya": settings(&mut self.rng) } }),
                1 => json!({ "settings": {} }), // the server asks for its section
                _ => json!({ "settings": null }),
            },
            "workspace/didChangeWorkspaceFolders" => json!({ "event": {
                "added": [{ "uri": "file:///work/other", "name": "other" }],
                "removed": [{ "uri": "file:///work/fuzz", "name": "fuzz" }],
            } }),
            "$/cancelRequest" => json!({ "id": self.ids.choose(&mut self.rng).cloned().unwrap_or(json!(1)) }),
            "$/setTrace" => {
                json!({ "value": *["off", "messages", "verbose", "loud"].choose(&mut self.rng).unwrap() })
            }
            _ => self.value(3),
        }
    }

    /// Changes one to three places of `v`: a value replaced (often by one of another type), a
    /// key removed or added, a value wrapped in an array.
    fn mutate(&mut self, v: &mut Value) {
        for _ in 0..self.rng.gen_range(1..4) {
            // A JSON pointer to a random node.
            let mut path = String::new();
            while self.rng.gen_bool(0.6) {
                let step = match v.pointer(&path).unwrap() {
                    Value::Object(m) if !m.is_empty() => {
                        let k = m.keys().nth(self.rng.gen_range(0..m.len())).unwrap();
                        k.replace('~', "~0").replace('/', "~1")
                    }
                    Value::Array(a) if !a.is_empty() => self.rng.gen_range(0..a.len()).to_string(),
                    _ => break,
                };
                path = format!("{path}/{step}");
            }
            let (how, pick) = (self.rng.gen_range(0..4), self.rng.gen::<usize>());
            let key = KEYS.choose(&mut self.rng).unwrap().to_string();
            let replacement = self.value(2);
            match (how, v.pointer_mut(&path).unwrap()) {
                (0, Value::Object(m)) if !m.is_empty() => {
                    let k = m.keys().nth(pick % m.len()).unwrap().clone();
                    m.remove(&k);
                }
                (1, Value::Object(m)) => {
                    m.insert(key, replacement);
                }
                (2, node) => *node = json!([node.take()]),
                (_, node) => *node = replacement,
            }
        }
    }

    /// An id: mostly a fresh number or string, sometimes `null`, negative or a repeat.
    fn id(&mut self) -> Value {
        self.next_id += 1;
        let id = match self.rng.gen_range(0..20) {
            0 => Value::Null,
            1 => json!(-self.next_id),
            2 if !self.ids.is_empty() => self.ids.choose(&mut self.rng).unwrap().clone(),
            3..=6 => json!(format!("r{}", self.next_id)),
            7 => json!(""),
            _ => json!(self.next_id),
        };
        self.ids.push(id.clone());
        id
    }

    /// A decodable message: a request or notification with well-formed, mutated or random
    /// params (or none), a response to nothing, or an empty body.
    fn message(&mut self) -> Message {
        let roll = self.rng.gen_range(0..100);
        if roll < 4 {
            let id = self.id();
            let body = match self.rng.gen_bool(0.5) {
                true => json!({ "jsonrpc": "2.0", "id": id, "result": self.value(2) }),
                false => json!({ "jsonrpc": "2.0", "id": id, "error": { "code": -1, "message": "x" } }),
            };
            return self.framed(to_bytes(&body), None);
        }
        if roll < 6 {
            // An empty body is no JSON: a parse error (id null).
            return self.framed(vec![], Some("null".into()));
        }
        let (method, request) = match self.rng.gen_range(0..10) {
            0..=4 => (*REQUESTS.choose(&mut self.rng).unwrap(), true),
            5..=8 => (*NOTIFICATIONS.choose(&mut self.rng).unwrap(), false),
            _ => (*DOLLAR.choose(&mut self.rng).unwrap(), false),
        };
        let with_id = self.rng.gen_bool(if request { 0.9 } else { 0.1 });
        let mut body = json!({ "jsonrpc": "2.0", "method": method });
        match self.rng.gen_range(0..10) {
            0..=3 => body["params"] = self.params(method),
            4..=7 => {
                let mut p = self.params(method);
                self.mutate(&mut p);
                body["params"] = p;
            }
            8 => body["params"] = self.value(4),
            _ => {}
        }
        if self.rng.gen_ratio(1, 20) {
            body[*["extra", "meta", "trace"].choose(&mut self.rng).unwrap()] = self.value(1);
        }
        // No method: an invalid request (-32600), answered with its id, or `null` without.
        let no_method = self.rng.gen_ratio(1, 30);
        if no_method {
            body.as_object_mut().unwrap().remove("method");
        }
        let reply = with_id
            .then(|| {
                let id = self.id();
                body["id"] = id.clone();
                id.to_string()
            })
            .or_else(|| no_method.then(|| "null".to_owned()));
        // A lone surrogate escape (JSON.stringify's for a broken pair), read as U+FFFD: the
        // message is answered as without it.
        let lone = self.rng.gen_ratio(1, 30);
        if lone {
            body["note"] = json!("a\u{e000}b");
        }
        let mut bytes = to_bytes(&body);
        if lone {
            let at = bytes.windows(3).position(|w| w == "\u{e000}".as_bytes()).unwrap();
            let escape = *[&b"\\ud800"[..], b"\\udfff", b"\\uDBFF"]
                .choose(&mut self.rng)
                .unwrap();
            bytes.splice(at..at + 3, escape.iter().copied());
        }
        self.framed(bytes, reply)
    }

    /// `body` framed, sometimes with other headers (a Content-Type, names in lower case,
    /// unknown ones), `\n` line ends or blank lines before it, written in one to four chunks.
    fn framed(&mut self, body: Vec<u8>, reply: Option<String>) -> Message {
        let n = body.len();
        let header = match self.rng.gen_range(0..14) {
            0 => {
                let ty = *[
                    "application/vscode-jsonrpc; charset=utf-8",
                    "application/vscode-jsonrpc; charset=utf8",
                    "x; charset=utf-8",
                    "application/json",
                    "application/vscode-jsonrpc; charset=\"UTF-8\"",
                ]
                .choose(&mut self.rng)
                .unwrap();
                format!("Content-Type: {ty}\r\nContent-Length: {n}\r\n\r\n")
            }
            1 => format!("content-length: {n}\r\n\r\n"),
            2 => format!("Content-Length: {n}\r\nX-A: 1\r\nX-B: 2\r\n\r\n"),
            3 => format!("Content-Length: {n}\n\n"),
            4 => format!("\r\n\r\nContent-Length:{n}\r\n\r\n"),
            _ => format!("Content-Length: {n}\r\n\r\n"),
        };
        let chunks = split(&mut self.rng, [header.as_bytes(), &body].concat(), 4);
        Message { chunks, reply }
    }

    /// A framing or decoding fault, built around a well-formed request `body` whose id is
    /// `id`, and the answers it must get.
    fn fault(&mut self, body: Vec<u8>, id: &Value) -> Fault {
        let r = &mut self.rng;
        let null = || vec![("null".to_owned(), -32700)];
        let invalid = |id: &str| vec![(id.to_owned(), -32600)];
        // The id an answer echoes: a string or a number, else null.
        let echoed = |id: &Value| match id {
            Value::String(_) | Value::Number(_) => id.to_string(),
            _ => "null".to_owned(),
        };
        let (bytes, kind, answers): (Vec<u8>, &'static str, Vec<(String, i64)>) = match r.gen_range(0..14) {
            0 => {
                let cut = r.gen_range(1..body.len());
                (frame(&body[..cut]), "invalid JSON: truncated body", null())
            }
            1 => {
                let mut b = body.clone();
                match r.gen_range(0..3) {
                    0 => b.insert(1, b','),
                    1 => b.extend_from_slice(b"}x"),
                    _ => b[0] = b'[',
                }
                (frame(&b), "invalid JSON", null())
            }
            2 => {
                let b = *[&b"{bad}"[..], b"tru", b"\"open", b"{\"a\":}"].choose(r).unwrap();
                (frame(b), "invalid JSON: no value", null())
            }
            3 => {
                if r.gen_bool(0.2) {
                    (frame(b"[]"), "empty batch", invalid("null"))
                } else {
                    let b = format!("[{0},{0}]", String::from_utf8(body.clone()).unwrap());
                    (frame(b.as_bytes()), "batch", vec![(echoed(id), -32600); 2])
                }
            }
            4 => {
                let (b, answer) = *[
                    (r#"42"#, "null"),
                    (r#""text""#, "null"),
                    ("null", "null"),
                    ("{}", "null"),
                    (r#"{"method":"x"}"#, "null"),
                    (r#"{"jsonrpc":"1.0","method":"x","id":1}"#, "1"),
                    (r#"{"jsonrpc":"2.0","method":42,"id":1}"#, "1"),
                    (r#"{"jsonrpc":"2.0","id":"no-method"}"#, "\"no-method\""),
                ]
                .choose(r)
                .unwrap();
                (frame(b.as_bytes()), "not a JSON-RPC message", invalid(answer))
            }
            5 => {
                let odd = *[
                    "1.5",
                    "true",
                    "{}",
                    "[]",
                    "1e3",
                    "9223372036854775808",
                    "-9223372036854775809",
                ]
                .choose(r)
                .unwrap();
                let answer = echoed(&serde_json::from_str(odd).unwrap());
                (
                    frame(format!(r#"{{"jsonrpc":"2.0","method":"laya/acceptance","id":{odd}}}"#).as_bytes()),
                    "id of an odd type",
                    invalid(&answer),
                )
            }
            6 => {
                let short = body.len() - r.gen_range(1..body.len());
                let mut b = format!("Content-Length: {short}\r\n\r\n").into_bytes();
                b.extend_from_slice(&body);
                (b, "Content-Length too short", null())
            }
            7 => {
                let long = body.len() + r.gen_range(1..100);
                let mut b = format!("Content-Length: {long}\r\n\r\n").into_bytes();
                b.extend_from_slice(&body);
                (b, "Content-Length too long", null())
            }
            8 => {
                let huge = r.gen_range((64u64 << 20) + 1..1u64 << 62);
                let mut b = format!("Content-Length: {huge}\r\n\r\n").into_bytes();
                b.extend_from_slice(&body);
                (b, "Content-Length over 64 MiB", null())
            }
            9 => {
                let v = *[
                    "abc",
                    "-5",
                    "1.5",
                    "",
                    "12a",
                    "0x1f",
                    "99999999999999999999999",
                    "١٢",
                ]
                .choose(r)
                .unwrap();
                let mut b = format!("Content-Length: {v}\r\n\r\n").into_bytes();
                b.extend_from_slice(&body);
                (b, "Content-Length not a number", null())
            }
            10 => {
                let b = match r.gen_range(0..2) {
                    0 => body.clone(),
                    _ => [
                        b"Content-Type: application/vscode-jsonrpc; charset=utf-8\r\n\r\n".as_slice(),
                        &body,
                    ]
                    .concat(),
                };
                (b, "no Content-Length", null())
            }
            11 => {
                let ty = *[
                    "application/vscode-jsonrpc; charset=latin1",
                    "application/json; charset=utf-16",
                ]
                .choose(r)
                .unwrap();
                let b = [
                    format!("Content-Length: {}\r\nContent-Type: {ty}\r\n\r\n", body.len()).as_bytes(),
                    &body,
                ]
                .concat();
                (b, "unsupported charset", null())
            }
            12 => {
                let mut b = body.clone();
                let at = r.gen_range(1..b.len());
                b.insert(at, *[0xff, 0xc3, 0x80, 0xed].choose(r).unwrap());
                b.insert(at + 1, b'(');
                (frame(&b), "invalid UTF-8", null())
            }
            _ => match r.gen_range(0..3) {
                0 => {
                    let b = [
                        format!("Content-Length: {}\r\nno colon\r\n\r\n", body.len()).as_bytes(),
                        &body,
                    ]
                    .concat();
                    (b, "a header line without a colon", null())
                }
                1 => {
                    let b = [
                        format!("Content-Length: {}\r\nContent-Length: 3\r\n\r\n", body.len()).as_bytes(),
                        &body,
                    ]
                    .concat();
                    (b, "two Content-Lengths", null())
                }
                _ => {
                    // Random bytes, from a byte no header or blank starts with.
                    let mut b: Vec<u8> = (0..r.gen_range(1..200)).map(|_| r.gen()).collect();
                    b[0] = *[0x00, 0x07, 0x7f, 0x80, 0xff, b'{'].choose(r).unwrap();
                    (b, "random bytes", null())
                }
            },
        };
        Fault { bytes, kind, answers }
    }
}

// ---------------------------------------------------------------------------------------
// The transport run.

#[derive(Default)]
struct TransportStats {
    messages: usize,
    connections: usize,
    faults: HashMap<&'static str, usize>,
    fault_codes: HashMap<i64, usize>,
    responses: usize,
    /// How connections ended: shutdown and exit, exit alone, end of input.
    endings: HashMap<&'static str, usize>,
}

/// One connection: initialize, then batches of generated messages each followed by a probe
/// that must get a proper answer; after a quarter of the probes a fault (with [`GUARD`] after
/// it) and another probe: the answers between the fault and that probe's must be the
/// fault's. The connection ends in shutdown and exit, exit alone, or the end of its input,
/// and the server must close its output and return that ending. Every request with an id
/// gets exactly one response. Returns the number of generated messages sent.
async fn run_connection(
    gen: &mut Generator,
    budget: usize,
    stats: &mut TransportStats,
) -> Result<usize, String> {
    // On failure: the last messages, and all of them in a file.
    let tail = |log: &[String]| {
        let path = std::env::temp_dir().join("laya-fuzz-connection.log");
        let _ = std::fs::write(&path, log.join("\n"));
        format!(
            "{}\n(all: {})",
            log[log.len().saturating_sub(20)..].join("\n"),
            path.display()
        )
    };
    let mut conn = Connection::open(gen.rng.gen());
    let mut owed: HashMap<String, usize> = HashMap::new();
    let utf8 = gen.rng.gen_bool(0.5);
    let offered = if utf8 {
        json!(["utf-16", "utf-8"])
    } else {
        json!(["utf-16"])
    };
    let init = json!({ "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "capabilities": { "general": { "positionEncodings": offered } },
        "initializationOptions": { "completion": { "debounceMs": 0 } },
        "workspaceFolders": [{ "uri": "file:///work/fuzz", "name": "fuzz" }],
    } });
    conn.send(&[frame(&to_bytes(&init))]);
    *owed.entry("0".into()).or_default() += 1;
    let r = conn.wait_for("0").await?;
    let encoding = &r["result"]["capabilities"]["positionEncoding"];
    if *encoding != json!(if utf8 { "utf-8" } else { "utf-16" }) {
        return Err(format!("initialize: {r}"));
    }
    let mut tracked = ModelDoc {
        text: random_text(&mut gen.rng, 40),
        version: 1,
    };
    let open = json!({ "textDocument": { "uri": TRACKED, "languageId": "python", "version": 1, "text": tracked.text } });
    conn.send(&[
        frame(br#"{"jsonrpc":"2.0","method":"initialized","params":{}}"#),
        frame(&to_bytes(
            &json!({ "jsonrpc": "2.0", "method": "textDocument/didOpen", "params": open }),
        )),
    ]);

    let mut sent = 0;
    let mut log: Vec<String> = vec![];
    let mut probes = 0;
    while sent < budget {
        let batch = gen.rng.gen_range(1..=40).min(budget - sent);
        for _ in 0..batch {
            let msg = match gen.rng.gen_range(0..100) {
                // Valid traffic on the tracked document: edits (some rejected, as the model
                // knows) and completions at positions of its text.
                0..=14 => {
                    let change = if tracked.text.len() > 3000 {
                        json!({ "text": random_text(&mut gen.rng, 20) })
                    } else {
                        random_change(&tracked.text, &mut gen.rng, utf8).0
                    };
                    tracked.version += 1;
                    if let Some(t) = model_apply(&tracked.text, &change, utf8) {
                        tracked.text = t;
                    }
                    let p = json!({ "textDocument": { "uri": TRACKED, "version": tracked.version }, "contentChanges": [change] });
                    gen.framed(
                        to_bytes(
                            &json!({ "jsonrpc": "2.0", "method": "textDocument/didChange", "params": p }),
                        ),
                        None,
                    )
                }
                15..=22 => {
                    let (line, character) =
                        model_position(&tracked.text, boundary(&tracked.text, &mut gen.rng), utf8);
                    let id = gen.id();
                    let body = json!({ "jsonrpc": "2.0", "id": id, "method": "textDocument/inlineCompletion", "params": {
                        "textDocument": { "uri": TRACKED }, "position": { "line": line, "character": character },
                        "context": { "triggerKind": 2 },
                    } });
                    gen.framed(to_bytes(&body), Some(id.to_string()))
                }
                _ => gen.message(),
            };
            if let Some(id) = &msg.reply {
                *owed.entry(id.clone()).or_default() += 1;
            }
            log.push(
                String::from_utf8_lossy(&msg.chunks.concat())
                    .chars()
                    .take(300)
                    .collect(),
            );
            conn.send_chunked(&msg.chunks);
            sent += 1;
        }
        // The probe: the server still answers, properly.
        probes += 1;
        let id = format!("probe-{probes}");
        let (method, params) = if probes % 2 == 0 {
            ("laya/acceptance", Value::Null)
        } else {
            let (line, character) = model_position(&tracked.text, tracked.text.len(), utf8);
            (
                "textDocument/inlineCompletion",
                json!({
                    "textDocument": { "uri": TRACKED }, "position": { "line": line, "character": character },
                    "context": { "triggerKind": 1 },
                }),
            )
        };
        conn.send(&[frame(&to_bytes(
            &json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }),
        ))]);
        let key = json!(id).to_string();
        *owed.entry(key.clone()).or_default() += 1;
        let r = match conn.wait_for(&key).await {
            Ok(r) => r,
            Err(e) => {
                let mut unanswered: Vec<_> = owed
                    .iter()
                    .filter(|(id, n)| conn.wire.seen.get(*id) != Some(*n))
                    .map(|(id, _)| id)
                    .collect();
                unanswered.sort();
                return Err(format!(
                    "{e}; unanswered: {unanswered:?}\nlast messages:\n{}",
                    tail(&log)
                ));
            }
        };
        let proper = match method {
            "laya/acceptance" => r["result"]["shown"].is_u64(),
            _ => r["result"].is_array() || r["result"].is_null(),
        };
        if !proper {
            return Err(format!("probe {method} got {r}\nlast messages:\n{}", tail(&log)));
        }

        // A fault, once everything sent is answered: the answers that come before the next
        // probe's are the fault's.
        if sent < budget && gen.rng.gen_ratio(1, 4) {
            conn.settle(&owed)
                .await
                .map_err(|e| format!("{e}\nlast messages:\n{}", tail(&log)))?;
            let id = gen.id();
            let body =
                to_bytes(&json!({ "jsonrpc": "2.0", "id": id, "method": "laya/acceptance", "params": null }));
            let fault = gen.fault(body, &id);
            *stats.faults.entry(fault.kind).or_default() += 1;
            log.push(format!(
                "FAULT {}: {}",
                fault.kind,
                String::from_utf8_lossy(&fault.bytes)
                    .chars()
                    .take(300)
                    .collect::<String>()
            ));
            // In one to three pieces, then the guard.
            let mut chunks = split(&mut gen.rng, fault.bytes.clone(), 3);
            chunks.push(frame(GUARD));
            conn.send_chunked(&chunks);
            sent += 1;
            for (id, _) in &fault.answers {
                *owed.entry(id.clone()).or_default() += 1;
            }
            probes += 1;
            let probe = format!("\"probe-{probes}\"");
            conn.send(&[frame(&to_bytes(
                &json!({ "jsonrpc": "2.0", "id": format!("probe-{probes}"), "method": "laya/acceptance", "params": null }),
            ))]);
            *owed.entry(probe.clone()).or_default() += 1;
            let (before, r) = conn
                .responses_until(&probe)
                .await
                .map_err(|e| format!("{e} (after the fault)\nlast messages:\n{}", tail(&log)))?;
            if !r["result"]["shown"].is_u64() {
                return Err(format!(
                    "the probe after a fault got {r}\nlast messages:\n{}",
                    tail(&log)
                ));
            }
            let mut got: Vec<(String, i64)> = before
                .iter()
                .map(|m| (m["id"].to_string(), m["error"]["code"].as_i64().unwrap_or(0)))
                .collect();
            let mut want = fault.answers.clone();
            got.sort();
            want.sort();
            if got != want {
                return Err(format!(
                    "the fault {} got {before:?}, not {want:?}\nlast messages:\n{}",
                    fault.kind,
                    tail(&log)
                ));
            }
            for (_, code) in got {
                *stats.fault_codes.entry(code).or_default() += 1;
            }
        }
    }

    // The end: shutdown and exit, exit alone, or the end of the input.
    let (how, close_first) = match gen.rng.gen_range(0..10) {
        0..=6 => {
            conn.send(&[frame(br#"{"jsonrpc":"2.0","id":"shutdown","method":"shutdown"}"#)]);
            *owed.entry("\"shutdown\"".into()).or_default() += 1;
            conn.wait_for("\"shutdown\"").await?;
            conn.send(&[frame(br#"{"jsonrpc":"2.0","method":"exit"}"#)]);
            ("shutdown and exit", false)
        }
        7 | 8 => {
            conn.send(&[frame(br#"{"jsonrpc":"2.0","method":"exit"}"#)]);
            ("exit", false)
        }
        _ => ("end of input", true),
    };
    let (_rest, ending) = conn
        .finish(close_first)
        .await
        .map_err(|e| format!("{e} (after {how})\nlast messages:\n{}", tail(&log)))?;
    let want = Ending {
        reason: if close_first {
            EndReason::EndOfInput
        } else {
            EndReason::Exit
        },
        shutdown: how == "shutdown and exit",
    };
    if ending != want {
        return Err(format!("after {how} the server returned {ending:?}"));
    }
    *stats.endings.entry(how).or_default() += 1;
    // Exactly one response per request with an id.
    let mut ids: Vec<&String> = owed.keys().chain(conn.wire.seen.keys()).collect();
    ids.sort();
    ids.dedup();
    for id in ids {
        let (want, got) = (
            owed.get(id).copied().unwrap_or(0),
            conn.wire.seen.get(id).copied().unwrap_or(0),
        );
        if want != got {
            return Err(format!(
                "id {id}: {got} responses for {want} requests\nlast messages:\n{}",
                tail(&log)
            ));
        }
    }
    stats.responses += conn.wire.seen.values().sum::<usize>();
    stats.connections += 1;
    Ok(sent)
}

#[test]
fn generated_messages_never_break_the_transport() {
    let _busy = support::busy_cpu();
    no_panics(2, generated_messages());
}

async fn generated_messages() {
    let seed = env_or("LAYA_FUZZ_SEED", DEFAULT_SEED);
    let total: usize = env_or("LAYA_FUZZ_MESSAGES", 100_000);
    let mut gen = Generator {
        rng: StdRng::seed_from_u64(seed),
        next_id: 0,
        ids: vec![],
    };
    let mut stats = TransportStats::default();
    let started = Instant::now();
    while stats.messages < total {
        // Many short connections (each may end in a fault) and some long ones.
        let len = if gen.rng.gen_bool(0.6) {
            gen.rng.gen_range(1..=30)
        } else {
            gen.rng.gen_range(30..=800)
        };
        let budget = len.min(total - stats.messages);
        let connection = stats.connections;
        match run_connection(&mut gen, budget, &mut stats).await {
            Ok(sent) => stats.messages += sent,
            Err(e) => panic!("seed {seed:#x}, connection {connection}: {e}"),
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let mut faults: Vec<_> = stats.faults.iter().collect();
    faults.sort();
    let mut endings: Vec<_> = stats.endings.iter().collect();
    endings.sort();
    println!(
        "transport fuzz: seed {seed:#x}, {} messages over {} connections in {:.1} s ({:.0} messages/s), \
         {} responses; {} faults (each followed by more traffic on its connection): {faults:?}; \
         their answers by error code: {:?}; endings: {endings:?}",
        stats.messages,
        stats.connections,
        secs,
        stats.messages as f64 / secs,
        stats.responses,
        stats.faults.values().sum::<usize>(),
        stats.fault_codes
    );
}
