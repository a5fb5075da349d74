//! `laya bench typing`'s typist: a line typed back at a person's pace, in real time, with an
//! editor's requests (an automatic `inlineCompletion` after each keystroke, the one before
//! cancelled with `$/cancelRequest` if it has not answered) and an accept (Tab) once the ghost
//! text completes the line and the typist has had time to read it. Per keystroke: whether its
//! request was answered, cancelled or answered too late, the time from the keystroke to the
//! answer, and the server's wait and model time for it (`laya/explain`); per accept: the time
//! to the next answer; per trace: the server's request counts (`laya/requests`).
//!
//! The typist's gaps between keystrokes are log-normal (median [`Typist::median_ms`], spread
//! [`Typist::sigma`]), longer after a space or punctuation (a word's end), drawn from a seed
//! made from the trace's id: the same schedule for every engine and run. The replay talks over
//! a [`Wire`]: the server in this process ([`InProcess`]) or a `laya lsp` process (or any
//! other LSP server) over stdio (`lsp_client::LspProcess`).

use std::{
    collections::{HashMap, VecDeque},
    sync::{mpsc, Arc},
    time::{Duration, Instant},
};

use rand::{rngs::StdRng, Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tower::{Service, ServiceExt};

use crate::{
    bench::{percentile, quality::Case},
    engine::Engine,
    lsp::{build_service, EngineSource, LayaServer},
};

/// How the simulated person types.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Typist {
    /// The median gap between two keystrokes inside a word (170 ms: about 70 words a minute).
    pub median_ms: f64,
    /// The log-normal spread of the gaps.
    pub sigma: f64,
    /// A gap after a space or punctuation is this many times longer.
    pub word_pause: f64,
    /// The time to read a suggestion before accepting it.
    pub reaction_ms: f64,
}

impl Default for Typist {
    fn default() -> Self {
        Typist {
            median_ms: 170.0,
            sigma: 0.45,
            word_pause: 1.8,
            reaction_ms: 250.0,
        }
    }
}

impl Typist {
    /// When each character of `text` is typed, in ms from the first (which is at 0), drawn
    /// from `seed`. Gaps are kept within 30 ms and 2 s.
    pub fn schedule(&self, text: &str, seed: u64) -> Vec<f64> {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut at = 0.0;
        let mut out = vec![];
        let mut prev: Option<char> = None;
        for c in text.chars() {
            if let Some(p) = prev {
                // Box-Muller: one standard normal from two uniforms.
                let (u1, u2): (f64, f64) = (rng.gen_range(f64::EPSILON..1.0), rng.gen());
                let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                let mut gap = self.median_ms * (self.sigma * z).exp();
                if !p.is_alphanumeric() && p != '_' {
                    gap *= self.word_pause;
                }
                at += gap.clamp(30.0, 2000.0);
            }
            out.push(at);
            prev = Some(c);
        }
        out
    }
}

/// A seed from a trace's id (FNV-1a): the same schedule in every run.
pub fn seed_of(id: &str) -> u64 {
    id.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// How the replay reaches the server: notifications, requests started without waiting, and
/// the answers as they come.
pub trait Wire {
    fn notify(&mut self, method: &str, params: Value) -> Result<(), String>;
    /// Send a request; its id.
    fn start(&mut self, method: &str, params: Value) -> Result<u64, String>;
    /// The next answer to a started request before `until` (its id and the whole message),
    /// `None` when none came by then.
    fn next_answer(&mut self, until: Instant) -> Result<Option<(u64, Value)>, String>;
}

impl Wire for super::lsp_client::LspProcess {
    fn notify(&mut self, method: &str, params: Value) -> Result<(), String> {
        super::lsp_client::LspProcess::notify(self, method, params)
    }
    fn start(&mut self, method: &str, params: Value) -> Result<u64, String> {
        super::lsp_client::LspProcess::start(self, method, params)
    }
    fn next_answer(&mut self, until: Instant) -> Result<Option<(u64, Value)>, String> {
        super::lsp_client::LspProcess::next_answer(self, until)
    }
}

/// The LSP server in this process, on `engine`, driven from a blocking caller.
pub struct InProcess {
    rt: Arc<tokio::runtime::Runtime>,
    service: tower_lsp_server::LspService<LayaServer>,
    answers: mpsc::Receiver<(u64, Value)>,
    sender: mpsc::Sender<(u64, Value)>,
    next_id: u64,
}

impl InProcess {
    pub fn new(rt: Arc<tokio::runtime::Runtime>, engine: Arc<dyn Engine>) -> InProcess {
        let _guard = rt.enter();
        let (service, socket) = build_service(EngineSource::Ready(engine));
        rt.spawn(async move {
            use futures::StreamExt;
            socket.for_each(|_| async {}).await
        });
        let (sender, answers) = mpsc::channel();
        InProcess {
            rt,
            service,
            answers,
            sender,
            next_id: 0,
        }
    }

    fn call(
        &mut self,
        method: &str,
        id: Option<u64>,
        params: Value,
    ) -> impl std::future::Future<Output = Value> + Send + 'static {
        let mut b = tower_lsp_server::jsonrpc::Request::build(method.to_owned()).params(params);
        if let Some(id) = id {
            b = b.id(id as i64);
        }
        let request = b.finish();
        let service = &mut self.service;
        let call = self
            .rt
            .block_on(async move { service.ready().await.map(|s| s.call(request)) });
        async move {
            match call {
                Ok(f) => match f.await {
                    Ok(Some(r)) => serde_json::to_value(r).unwrap_or(Value::Null),
                    Ok(None) => Value::Null,
                    Err(e) => json!({ "error": { "message": e.to_string() } }),
                },
                Err(e) => json!({ "error": { "message": e.to_string() } }),
            }
        }
    }
}

impl Wire for InProcess {
    fn notify(&mut self, method: &str, params: Value) -> Result<(), String> {
        let f = self.call(method, None, params);
        self.rt.block_on(f);
        Ok(())
    }

    fn start(&mut self, method: &str, params: Value) -> Result<u64, String> {
        self.next_id += 1;
        let id = self.next_id;
        let f = self.call(method, Some(id), params);
        let tx = self.sender.clone();
        self.rt.spawn(async move {
            let _ = tx.send((id, f.await));
        });
        Ok(id)
    }

    fn next_answer(&mut self, until: Instant) -> Result<Option<(u64, Value)>, String> {
        match self
            .answers
            .recv_timeout(until.saturating_duration_since(Instant::now()))
        {
            Ok(a) => Ok(Some(a)),
            Err(mpsc::RecvTimeoutError::Timeout) => Ok(None),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err("the server is gone".into()),
        }
    }
}

/// `initialize` (UTF-8 positions offered, laya's `completion` settings) and `initialized`.
pub fn initialize(wire: &mut dyn Wire, completion: &Value) -> Result<(), String> {
    let id = wire.start(
        "initialize",
        json!({
            "processId": std::process::id(),
            "capabilities": { "general": { "positionEncodings": ["utf-8", "utf-16"] } },
            "initializationOptions": { "completion": completion },
        }),
    )?;
    let msg = answer(wire, id, Duration::from_secs(60))?.ok_or("no answer to initialize within 60 s")?;
    if msg["result"]["capabilities"]["positionEncoding"] != "utf-8" {
        return Err(format!("the server did not take UTF-8 positions: {msg}"));
    }
    wire.notify("initialized", json!({}))
}

/// The answer to request `id` within `within`, passing over answers to others; `None` when
/// it did not come.
fn answer(wire: &mut dyn Wire, id: u64, within: Duration) -> Result<Option<Value>, String> {
    let deadline = Instant::now() + within;
    while let Some((got, msg)) = wire.next_answer(deadline)? {
        if got == id {
            return Ok(Some(msg));
        }
    }
    Ok(None)
}

/// Open the case's document (its prefix and suffix) as `uri`; the cursor's line and UTF-8
/// column.
fn open(wire: &mut dyn Wire, uri: &str, case: &Case) -> Result<(u32, u32), String> {
    wire.notify(
        "textDocument/didOpen",
        json!({ "textDocument": { "uri": uri, "languageId": case.language, "version": 1,
                "text": format!("{}{}", case.prefix, case.suffix) } }),
    )?;
    let line = case.prefix.matches('\n').count() as u32;
    let col = (case.prefix.len() - case.prefix.rfind('\n').map_or(0, |i| i + 1)) as u32;
    Ok((line, col))
}

/// An explicit request (triggerKind 1, the user's key for a suggestion) at the case's cursor,
/// on the document opened for it as document `n`: the time from the request to its answer,
/// and the first suggestion's text.
pub fn explicit(wire: &mut dyn Wire, case: &Case, n: usize) -> Result<(f64, Option<String>), String> {
    let uri = format!("file:///bench/{n}/{}", case.file_name);
    let (line, col) = open(wire, &uri, case)?;
    let sent = Instant::now();
    let id = wire.start(
        "textDocument/inlineCompletion",
        json!({ "textDocument": { "uri": uri }, "position": { "line": line, "character": col },
                "context": { "triggerKind": 1 } }),
    )?;
    let answer = answer(wire, id, Duration::from_secs(300))?
        .ok_or_else(|| format!("{}: no answer within 300 s", case.id))?;
    let ms = sent.elapsed().as_secs_f64() * 1e3;
    if let Some(e) = answer.get("error") {
        return Err(format!("{}: {e}", case.id));
    }
    wire.notify("textDocument/didClose", json!({ "textDocument": { "uri": uri } }))?;
    Ok((ms, first_item(&answer["result"]).map(|(t, ..)| t)))
}

/// The counts of `laya/requests` in `now` less those in `before` (a server's counts since).
pub fn counts_since(now: &Value, before: &Value) -> Value {
    match now.as_object() {
        Some(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    let d = v
                        .as_u64()
                        .unwrap_or(0)
                        .saturating_sub(before[k].as_u64().unwrap_or(0));
                    (k.clone(), d.into())
                })
                .collect(),
        ),
        None => Value::Null,
    }
}

/// What became of one keystroke's request.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Key {
    /// Characters of the line typed so far.
    pub typed: usize,
    /// When it was typed, ms from the trace's first keystroke.
    pub at_ms: f64,
    /// `shown` (answered before the next keystroke, with a suggestion), `empty` (answered
    /// before it, nothing to show), `cancelled`, `late` (answered after the next keystroke).
    pub outcome: String,
    /// Keystroke to answer (answered ones).
    pub ms: f64,
    /// The server's account (`laya/explain`, answered ones): `model`, `typed-through`, and
    /// for model answers the wait, the engine's time, whether it was computed ahead.
    pub source: String,
    pub wait_ms: f64,
    pub model_ms: f64,
    pub ahead: bool,
}

/// The accept of a trace and the answer after it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Accept {
    pub at_ms: f64,
    /// Accept (the edit sent) to the next answer.
    pub ms: f64,
    /// The next answer had a suggestion; it came from the answer computed ahead.
    pub shown: bool,
    pub ahead: bool,
}

/// One trace typed.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Run {
    pub id: String,
    pub keys: Vec<Key>,
    pub accept: Option<Accept>,
    /// The server's `laya/requests` at the end of the trace (a fresh server per trace).
    pub requests: Value,
}

/// A keystroke of the schedule, for replaying it on another engine: the text around the
/// cursor after it and when it came (`accept`: the suggestion accepted, laya's own).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Step {
    pub at_ms: f64,
    pub prefix: String,
    pub suffix: String,
    #[serde(default)]
    pub accept: bool,
}

struct Pending {
    /// The keystroke's index, or `None` for the accept's request.
    key: Option<usize>,
    version: i32,
    sent: Instant,
}

/// The first item of an inline answer: its text and the UTF-8 columns it replaces.
fn first_item(result: &Value) -> Option<(String, u32, u32)> {
    let items = result.get("items").unwrap_or(result);
    let item = items.as_array()?.first()?;
    let text = item["insertText"]
        .as_str()
        .or_else(|| item["insertText"]["value"].as_str())?;
    let start = item["range"]["start"]["character"].as_u64()? as u32;
    let end = item["range"]["end"]["character"].as_u64()? as u32;
    Some((text.to_owned(), start, end))
}

/// Type `case.expected` back at `typist`'s pace over `wire` (initialized, with UTF-8
/// positions); `steps` hears the schedule for other engines.
pub fn replay(
    wire: &mut dyn Wire,
    case: &Case,
    typist: &Typist,
    steps: &mut Vec<Step>,
) -> Result<Run, String> {
    let uri = format!("file:///bench/{}", case.file_name);
    let (line, col0) = open(wire, &uri, case)?;
    let chars: Vec<char> = case.expected.chars().collect();
    let times = typist.schedule(&case.expected, seed_of(&case.id));
    let line_after = case.suffix.split('\n').next().unwrap_or("");
    let mut run = Run {
        id: case.id.clone(),
        ..Run::default()
    };
    let mut version = 1;
    let mut typed = String::new();
    let mut pending: HashMap<u64, Pending> = HashMap::new();
    // The suggestion showing: its text, the columns it replaces, since when.
    let mut shown: Option<(String, u32, u32, Instant)> = None;
    let mut explains: VecDeque<(usize, u64)> = VecDeque::new();
    let start = Instant::now();
    let mut next = 0;
    let mut accepted: Option<(u64, Instant)> = None;
    let position = |typed: &str| json!({ "line": line, "character": col0 + typed.len() as u32 });
    loop {
        // The typist's next action: the next keystroke, or Tab once the ghost text makes the
        // line and was read; after the accept, only its answer.
        let accept_at = shown.as_ref().and_then(|(text, s, e, since)| {
            let rest = line_after.get((*e - *s) as usize..).unwrap_or("");
            let made = format!("{typed}{text}{rest}");
            (accepted.is_none() && made.split('\n').next() == Some(case.expected.trim_end()))
                .then(|| *since + Duration::from_secs_f64(typist.reaction_ms / 1e3))
        });
        let key_at = (next < chars.len() && accepted.is_none())
            .then(|| start + Duration::from_secs_f64(times[next] / 1e3));
        let until = match (key_at, accept_at) {
            (Some(k), Some(a)) => k.min(a),
            (Some(k), None) => k,
            (None, Some(a)) => a,
            (None, None) if pending.is_empty() => break,
            (None, None) => Instant::now() + Duration::from_secs(120),
        };
        if let Some((id, msg)) = wire.next_answer(until)? {
            let Some(p) = pending.remove(&id) else {
                // An answer to laya/explain or another request of ours.
                explained(&mut run, &mut explains, id, &msg);
                continue;
            };
            let ms = p.sent.elapsed().as_secs_f64() * 1e3;
            let cancelled = msg["error"]["code"].as_i64() == Some(-32800);
            let item = first_item(&msg["result"]);
            match p.key {
                Some(k) => {
                    let key = &mut run.keys[k];
                    key.ms = ms;
                    key.outcome = match (cancelled, p.version == version, &item) {
                        (true, ..) => "cancelled",
                        (false, false, _) => "late",
                        (false, true, Some(_)) => "shown",
                        (false, true, None) => "empty",
                    }
                    .into();
                    if !cancelled && p.version == version {
                        shown = item.map(|(t, s, e)| (t, s, e, Instant::now()));
                        let id = wire.start("laya/explain", json!({ "textDocument": { "uri": uri } }))?;
                        explains.push_back((k, id));
                    }
                }
                None => {
                    run.accept = Some(Accept {
                        at_ms: accepted.map_or(0.0, |(_, at)| (at - start).as_secs_f64() * 1e3),
                        ms,
                        shown: item.is_some(),
                        ahead: false,
                    });
                    let id = wire.start("laya/explain", json!({ "textDocument": { "uri": uri } }))?;
                    explains.push_back((usize::MAX, id));
                }
            }
            continue;
        }
        if pending.is_empty() && key_at.is_none() && accept_at.is_none() {
            break;
        }
        let now = Instant::now();
        // Cancel what the previous keystroke asked, as an editor does.
        for id in pending.iter().filter(|(_, p)| p.key.is_some()).map(|(id, _)| *id) {
            wire.notify("$/cancelRequest", json!({ "id": id }))?;
        }
        version += 1;
        let accept = match (accept_at, key_at) {
            (Some(a), Some(k)) => a <= k,
            (Some(_), None) => true,
            (None, _) => false,
        };
        if accept {
            let Some((text, s, e, _)) = shown.take() else {
                return Err("an accept with no suggestion shown".into());
            };
            let at = |c: u32| json!({ "line": line, "character": c });
            wire.notify(
                "textDocument/didChange",
                json!({ "textDocument": { "uri": uri, "version": version },
                        "contentChanges": [{ "range": { "start": at(s), "end": at(e) }, "text": text }] }),
            )?;
            typed.push_str(&text);
            // The cursor after the accepted text, on a later line when it holds line breaks.
            let after = match text.rfind('\n') {
                Some(i) => json!({ "line": line + text.matches('\n').count() as u32,
                                   "character": text.len() - i - 1 }),
                None => position(&typed),
            };
            let id = wire.start(
                "textDocument/inlineCompletion",
                json!({ "textDocument": { "uri": uri }, "position": after, "context": { "triggerKind": 2 } }),
            )?;
            pending.insert(
                id,
                Pending {
                    key: None,
                    version,
                    sent: now,
                },
            );
            accepted = Some((id, now));
            steps.push(Step {
                at_ms: (now - start).as_secs_f64() * 1e3,
                prefix: format!("{}{typed}", case.prefix),
                suffix: case.suffix.get((e - s) as usize..).unwrap_or("").to_owned(),
                accept: true,
            });
        } else {
            let c = chars[next];
            wire.notify(
                "textDocument/didChange",
                json!({ "textDocument": { "uri": uri, "version": version },
                        "contentChanges": [{ "range": { "start": position(&typed), "end": position(&typed) }, "text": c.to_string() }] }),
            )?;
            typed.push(c);
            // The shown suggestion stays only while it is typed through (the server decides).
            shown = None;
            let id = wire.start(
                "textDocument/inlineCompletion",
                json!({ "textDocument": { "uri": uri }, "position": position(&typed), "context": { "triggerKind": 2 } }),
            )?;
            pending.insert(
                id,
                Pending {
                    key: Some(next),
                    version,
                    sent: now,
                },
            );
            run.keys.push(Key {
                typed: typed.len(),
                at_ms: (now - start).as_secs_f64() * 1e3,
                outcome: "cancelled".into(),
                ..Key::default()
            });
            steps.push(Step {
                at_ms: (now - start).as_secs_f64() * 1e3,
                prefix: format!("{}{typed}", case.prefix),
                suffix: case.suffix.clone(),
                accept: false,
            });
            next += 1;
        }
    }
    // The explanations still on their way, and the server's counts: the server answers them
    // in any order, so wait for all of them.
    let counts = wire.start("laya/requests", Value::Null)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut counted = false;
    while !(counted && explains.is_empty()) {
        let Some((id, msg)) = wire.next_answer(deadline)? else {
            break;
        };
        if id == counts {
            run.requests = msg["result"].clone();
            counted = true;
        }
        explained(&mut run, &mut explains, id, &msg);
    }
    wire.notify("textDocument/didClose", json!({ "textDocument": { "uri": uri } }))?;
    Ok(run)
}

/// The answer `msg` to request `id`, if it is one of the `laya/explain`s sent after an answer:
/// the server's account of that keystroke (`usize::MAX`: of the accept), when it is of the
/// document version that keystroke made (the document opens at 1; keystroke `k` makes `k + 2`).
fn explained(run: &mut Run, explains: &mut VecDeque<(usize, u64)>, id: u64, msg: &Value) {
    let Some(i) = explains.iter().position(|(_, e)| *e == id) else {
        return;
    };
    let (k, _) = explains.remove(i).unwrap_or_default();
    let e = &msg["result"];
    if k == usize::MAX {
        if let Some(a) = run.accept.as_mut() {
            a.ahead = e["ahead"].as_bool().unwrap_or(false);
        }
        return;
    }
    let Some(key) = run.keys.get_mut(k) else { return };
    if e["version"].as_i64() != Some(k as i64 + 2) {
        return;
    }
    key.source = e["source"].as_str().unwrap_or("").to_owned();
    key.wait_ms = e["waitMs"].as_f64().unwrap_or(0.0);
    key.ahead = e["ahead"].as_bool().unwrap_or(false);
    key.model_ms = match key.source.as_str() {
        "model" => e["totalMs"].as_f64().unwrap_or(0.0),
        _ => 0.0,
    };
}

/// What the typist's runs add up to.
#[derive(Debug, Default, Serialize)]
pub struct Summary {
    pub keystrokes: usize,
    /// Keystrokes whose request was answered before the next one with a suggestion, with
    /// nothing, cancelled, answered after it.
    pub shown: usize,
    pub empty: usize,
    pub cancelled: usize,
    pub late: usize,
    /// Keystroke to ghost text over the shown keystrokes, and over those the model answered
    /// (not typed through, not computed ahead).
    pub ghost_p50_ms: f64,
    pub ghost_p90_ms: f64,
    pub ghost_p99_ms: f64,
    pub model_ghost_p50_ms: f64,
    pub model_ghost_p99_ms: f64,
    /// The server's wait and the engine's time, over the keystrokes the model answered.
    pub wait_p50_ms: f64,
    pub wait_p99_ms: f64,
    pub model_p50_ms: f64,
    pub model_p99_ms: f64,
    /// The servers' counts, summed over the traces (`laya/requests`).
    pub requests: u64,
    pub model_calls: u64,
    pub model_cancelled: u64,
    pub waited_out: u64,
    pub typed_through: u64,
    pub from_ahead: u64,
    pub ahead_started: u64,
    /// Accepts, their time to the next answer, and how many of those answers had a
    /// suggestion and came from the answer computed ahead.
    pub accepts: usize,
    pub accept_p50_ms: f64,
    pub accept_p99_ms: f64,
    pub accept_shown: usize,
    pub accept_ahead: usize,
}

pub fn summarize(runs: &[Run]) -> Summary {
    let keys: Vec<&Key> = runs.iter().flat_map(|r| &r.keys).collect();
    let count = |o: &str| keys.iter().filter(|k| k.outcome == o).count();
    let shown: Vec<&&Key> = keys.iter().filter(|k| k.outcome == "shown").collect();
    let ghost: Vec<f64> = shown.iter().map(|k| k.ms).collect();
    let by_model: Vec<&&Key> = keys
        .iter()
        .filter(|k| k.source == "model" && !k.ahead && (k.outcome == "shown" || k.outcome == "empty"))
        .collect();
    let model_ghost: Vec<f64> = shown
        .iter()
        .filter(|k| k.source == "model" && !k.ahead)
        .map(|k| k.ms)
        .collect();
    let waits: Vec<f64> = by_model.iter().map(|k| k.wait_ms).collect();
    let model: Vec<f64> = by_model.iter().map(|k| k.model_ms).collect();
    let accepts: Vec<&Accept> = runs.iter().filter_map(|r| r.accept.as_ref()).collect();
    let accept_ms: Vec<f64> = accepts.iter().map(|a| a.ms).collect();
    let total = |f: &str| {
        runs.iter()
            .map(|r| r.requests[f].as_u64().unwrap_or(0))
            .sum::<u64>()
    };
    Summary {
        keystrokes: keys.len(),
        shown: shown.len(),
        empty: count("empty"),
        cancelled: count("cancelled"),
        late: count("late"),
        ghost_p50_ms: percentile(&ghost, 50.0),
        ghost_p90_ms: percentile(&ghost, 90.0),
        ghost_p99_ms: percentile(&ghost, 99.0),
        model_ghost_p50_ms: percentile(&model_ghost, 50.0),
        model_ghost_p99_ms: percentile(&model_ghost, 99.0),
        wait_p50_ms: percentile(&waits, 50.0),
        wait_p99_ms: percentile(&waits, 99.0),
        model_p50_ms: percentile(&model, 50.0),
        model_p99_ms: percentile(&model, 99.0),
        requests: total("requests"),
        model_calls: total("modelCalls"),
        model_cancelled: total("modelCancelled"),
        waited_out: total("waitedOut"),
        typed_through: total("typedThrough"),
        from_ahead: total("ahead"),
        ahead_started: total("aheadStarted"),
        accepts: accepts.len(),
        accept_p50_ms: percentile(&accept_ms, 50.0),
        accept_p99_ms: percentile(&accept_ms, 99.0),
        accept_shown: accepts.iter().filter(|a| a.shown).count(),
        accept_ahead: accepts.iter().filter(|a| a.ahead).count(),
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let per = |n: u64| n as f64 / self.keystrokes.max(1) as f64;
        writeln!(
            f,
            "typist: {} keystrokes; ghost text at {} ({} empty, {} cancelled, {} late)",
            self.keystrokes, self.shown, self.empty, self.cancelled, self.late
        )?;
        writeln!(
            f,
            "keystroke to ghost text: p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms; model answers only: p50 {:.1} ms, p99 {:.1} ms",
            self.ghost_p50_ms, self.ghost_p90_ms, self.ghost_p99_ms, self.model_ghost_p50_ms, self.model_ghost_p99_ms
        )?;
        writeln!(
            f,
            "of a model answer: wait p50 {:.1} ms, p99 {:.1} ms; model p50 {:.1} ms, p99 {:.1} ms",
            self.wait_p50_ms, self.wait_p99_ms, self.model_p50_ms, self.model_p99_ms
        )?;
        writeln!(
            f,
            "model calls {:.2} a keystroke ({} of {} requests; {:.2} a keystroke cancelled after they started); {} waited out, {} typed through, {} computed ahead (of {} started)",
            per(self.model_calls),
            self.model_calls,
            self.requests,
            per(self.model_cancelled),
            self.waited_out,
            self.typed_through,
            self.from_ahead,
            self.ahead_started
        )?;
        writeln!(
            f,
            "accept to next answer: {} accepts, p50 {:.1} ms, p99 {:.1} ms ({} from the answer computed ahead, {} with a suggestion)",
            self.accepts, self.accept_p50_ms, self.accept_p99_ms, self.accept_ahead, self.accept_shown
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedule_is_the_same_for_a_seed_and_slower_after_a_word() {
        let t = Typist::default();
        let a = t.schedule("return a + b", 7);
        assert_eq!(a, t.schedule("return a + b", 7));
        assert_ne!(a, t.schedule("return a + b", 8));
        assert_eq!(a.len(), 12);
        assert_eq!(a[0], 0.0);
        assert!(a.windows(2).all(|w| w[1] - w[0] >= 30.0 && w[1] - w[0] <= 2000.0));
        // Over many gaps, those after a space are longer by about the word pause.
        let text: String = "ab ".repeat(400);
        let s = t.schedule(&text, 1);
        let gaps: Vec<(char, f64)> = text
            .chars()
            .skip(1)
            .zip(s.windows(2).map(|w| w[1] - w[0]))
            .collect();
        let mean = |after_space: bool| {
            let chars: Vec<char> = text.chars().collect();
            let v: Vec<f64> = gaps
                .iter()
                .enumerate()
                .filter(|(i, _)| (chars[*i] == ' ') == after_space)
                .map(|(_, (_, g))| *g)
                .collect();
            v.iter().sum::<f64>() / v.len() as f64
        };
        let ratio = mean(true) / mean(false);
        assert!((1.5..2.1).contains(&ratio), "{ratio}");
    }
}
