//! `laya bench typing`: replays typing through the whole LSP path. A trace is a real file
//! with one line removed; the line is typed back character by character, each keystroke a
//! `didChange` followed by an `inlineCompletion` request, as an editor sends them.
//!
//! By default a typist types it ([`typist`](super::typist)): in real time, at a person's
//! pace, with the server's own debounce, cancels, and an accept once the ghost text makes the
//! line; in this process or through a `laya lsp` process (`lsp_command`). With `sequential`,
//! each keystroke waits for its answer and the debounce is off: per keystroke the latency,
//! whether the model ran (or the suggestion was typed through), and the prompt tokens reused
//! from the prefix store.

use std::{fmt, path::PathBuf, sync::Arc, time::Instant};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tower::{Service, ServiceExt};
use tower_lsp_server::jsonrpc::Request;

use crate::{
    bench::{
        completion_settings, error_chain, percentile,
        quality::{self, Case},
        Target,
    },
    engine::{runtime::DevicePref, Engine, ModelState, PrefixLimits},
    lsp::{build_service, EngineSource},
};

/// A line of a real file to type back.
#[derive(Clone, Debug)]
pub struct FileTrace {
    pub path: PathBuf,
    /// 1-based.
    pub line: usize,
    /// LSP language id.
    pub language: String,
}

/// Which lines are typed.
#[derive(Clone, Debug)]
pub enum Traces {
    Files(Vec<FileTrace>),
    /// The first `per_language` cases of each language of a quality case file.
    Cases {
        path: PathBuf,
        per_language: usize,
    },
}

pub struct Config {
    pub traces: Traces,
    pub target: Target,
    pub device: DevicePref,
    /// Most tokens per suggestion.
    pub max_tokens: usize,
    /// Prompt budget in tokens.
    pub budget: usize,
    /// Build every prompt afresh: no typing-through, no anchored prompts, no prefix store.
    pub no_reuse: bool,
    /// Write each keystroke's prefix/suffix here, for replaying on another engine.
    pub steps_out: Option<PathBuf>,
    /// Completion settings (JSON, the LSP's `completion` section) over the bench's own.
    pub settings: Option<String>,
    /// Write the keystrokes and the summary here (JSON).
    pub json: Option<PathBuf>,
    /// One keystroke at a time, each waiting for its answer, no debounce (the engine's cost
    /// of a keystroke), instead of the typist.
    pub sequential: bool,
    /// Explicit requests instead of typing: one at each case's cursor, on the document as the
    /// case gives it, timed from the request to its answer.
    pub explicit: bool,
    /// The typist's server: this command's LSP server over stdio (e.g. `laya lsp --small M`,
    /// through the daemon) instead of one in this process on `target`.
    pub lsp_command: Option<Vec<String>>,
}

/// What `laya bench typing` found.
#[derive(Debug)]
pub struct Report {
    /// The typist's traces and their sum (not `sequential`).
    pub typist: Option<(Vec<super::typist::Run>, super::typist::Summary)>,
    /// Explicit requests: each case's id, time to the answer, first suggestion.
    pub explicit: Option<Vec<(String, f64, Option<String>)>>,
    /// The engine (model and bit width, or the remote server).
    pub label: String,
    pub no_reuse: bool,
    /// Each trace's keystrokes.
    pub runs: Vec<Vec<Keystroke>>,
    pub summary: Summary,
}

fn write(path: &std::path::Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))
}

/// Type every trace's line back (after an untimed warm-up trace); `log` hears each trace and
/// keystroke as it is typed.
pub fn run(cfg: &Config, log: impl Fn(&str) + Clone + Send + 'static) -> Result<Report, String> {
    let traces = load_traces(cfg)?;
    if cfg.explicit {
        return run_explicit(cfg, &traces, log);
    }
    if !cfg.sequential {
        return run_typist(cfg, &traces, log);
    }
    run_sequential(cfg, &traces, log)
}

fn load_traces(cfg: &Config) -> Result<Vec<Case>, String> {
    Ok(match &cfg.traces {
        Traces::Files(files) => files
            .iter()
            .map(|f| trace_from_file(&f.path, f.line, &f.language))
            .collect::<Result<Vec<_>, _>>()?,
        Traces::Cases { path, per_language } => {
            let mut seen = std::collections::HashMap::<String, usize>::new();
            let mut traces = vec![];
            for c in quality::load_cases(path).map_err(|e| error_chain(&e))? {
                let n = seen.entry(c.language.clone()).or_default();
                *n += 1;
                if *n <= *per_language {
                    traces.push(c);
                }
            }
            traces
        }
    })
}

/// The bench's own completion settings (the LSP's `completion` section) under `cfg.settings`;
/// `debounce` as `debounceMs` where given.
fn settings_for(cfg: &Config, debounce: Option<u64>) -> Result<Value, String> {
    let mut completion = json!({
        "maxTokensLine": cfg.max_tokens,
        "maxTokensBlock": cfg.max_tokens,
        "budget": { "maxTokens": cfg.budget },
        "typingThrough": !cfg.no_reuse,
        "anchorMaxBytes": if cfg.no_reuse { 0 } else { 512 },
        "lookAhead": !cfg.no_reuse,
    });
    if let Some(ms) = debounce {
        completion["debounceMs"] = ms.into();
    }
    let settings = completion_settings(completion, cfg.settings.as_deref())?;
    serde_json::to_value(settings).map_err(|e| e.to_string())
}

/// The typist's runs: a fresh in-process server a trace, or one LSP process for all of them
/// (the counts of a trace are what its own `laya/requests` added).
fn run_typist(
    cfg: &Config,
    traces: &[Case],
    log: impl Fn(&str) + Clone + Send + 'static,
) -> Result<Report, String> {
    use super::typist::{self, Typist, Wire};
    let typist = Typist::default();
    let completion = settings_for(cfg, None)?;
    let rt = Arc::new(runtime()?);
    let (server, label) = server(cfg, log.clone())?;
    let (mut process, engine) = match server {
        Server::Process(p) => (Some(p), None),
        Server::Engine(e) => (None, Some(e)),
    };
    let mut all_steps = vec![];
    let mut runs = vec![];
    let mut last_counts = Value::Null;
    let mut in_process: Option<typist::InProcess>;
    let warm = warm_up_trace();
    for (i, c) in std::iter::once(&warm).chain(traces.iter()).enumerate() {
        let wire: &mut dyn Wire = match (&mut process, &engine) {
            (Some(p), _) => p,
            (None, Some(engine)) => {
                in_process = Some(typist::InProcess::new(rt.clone(), engine.clone()));
                in_process.as_mut().expect("just made")
            }
            (None, None) => unreachable!("a process or an engine"),
        };
        if i == 0 || cfg.lsp_command.is_none() {
            typist::initialize(wire, &completion)?;
        }
        if i > 0 {
            log(&format!(
                "trace {} ({} keystrokes) on {label}",
                c.id,
                c.expected.chars().count()
            ));
        }
        let mut steps = vec![];
        let mut run = typist::replay(wire, c, &typist, &mut steps)?;
        if cfg.lsp_command.is_some() {
            let now = run.requests.clone();
            run.requests = typist::counts_since(&now, &last_counts);
            last_counts = now;
        }
        if i == 0 {
            log("warm-up trace typed (untimed)");
            continue;
        }
        for k in &run.keys {
            log(&format!(
                "  {:>3} at {:>7.0} ms {:<9} {:>7.1} ms {:<13} wait {:>5.1} ms model {:>6.1} ms{}",
                k.typed,
                k.at_ms,
                k.outcome,
                k.ms,
                k.source,
                k.wait_ms,
                k.model_ms,
                if k.ahead { " (ahead)" } else { "" }
            ));
        }
        if let Some(a) = &run.accept {
            log(&format!(
                "  accept at {:.0} ms: next answer {:.1} ms{}{}",
                a.at_ms,
                a.ms,
                if a.ahead { ", computed ahead" } else { "" },
                if a.shown {
                    ", a suggestion"
                } else {
                    ", nothing to show"
                }
            ));
        }
        all_steps.push(json!({ "id": c.id, "steps": steps }));
        runs.push(run);
    }
    if let Some(p) = process {
        p.shutdown(std::time::Duration::from_secs(5));
    }
    if let Some(p) = &cfg.steps_out {
        write(p, &serde_json::to_string(&all_steps).map_err(|e| e.to_string())?)?;
    }
    if let Some(engine) = &engine {
        if let ModelState::Failed(e) = engine.state() {
            return Err(format!("the model failed to load: {e}"));
        }
    }
    let summary = typist::summarize(&runs);
    if let Some(p) = &cfg.json {
        let v = json!({ "engine": label, "typist": typist, "summary": summary, "runs": runs });
        write(p, &serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?)?;
    }
    Ok(Report {
        typist: Some((runs, summary)),
        explicit: None,
        label,
        no_reuse: cfg.no_reuse,
        runs: vec![],
        summary: Summary::default(),
    })
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
}

/// The server for the typist and explicit runs: one in this process on `cfg.target`, or the
/// LSP process `cfg.lsp_command`; its label.
enum Server {
    Process(super::lsp_client::LspProcess),
    Engine(Arc<dyn Engine>),
}

fn server(cfg: &Config, log: impl Fn(&str) + Clone + Send + 'static) -> Result<(Server, String), String> {
    match &cfg.lsp_command {
        Some(cmd) => {
            let (prog, args) = cmd.split_first().ok_or("an empty --lsp-command")?;
            let mut c = std::process::Command::new(prog);
            c.args(args);
            let p = super::lsp_client::LspProcess::spawn(c).map_err(|e| format!("starting {prog}: {e}"))?;
            Ok((Server::Process(p), cmd.join(" ")))
        }
        None => {
            let (engine, label) = cfg.target.start(cfg.device, log)?;
            Ok((Server::Engine(engine), label))
        }
    }
}

/// Explicit requests, one a case (after an untimed one on the warm-up trace).
fn run_explicit(
    cfg: &Config,
    traces: &[Case],
    log: impl Fn(&str) + Clone + Send + 'static,
) -> Result<Report, String> {
    use super::typist::{self, Wire};
    let rt = Arc::new(runtime()?);
    let (server, label) = server(cfg, log.clone())?;
    let (mut process, mut in_process) = match server {
        Server::Process(p) => (Some(p), None),
        Server::Engine(e) => (None, Some(typist::InProcess::new(rt.clone(), e))),
    };
    let wire: &mut dyn Wire = match (&mut process, &mut in_process) {
        (Some(p), _) => p,
        (None, Some(w)) => w,
        (None, None) => unreachable!("a process or an engine"),
    };
    typist::initialize(wire, &settings_for(cfg, None)?)?;
    typist::explicit(wire, &warm_up_trace(), 0)?;
    let mut rows = vec![];
    for (n, c) in traces.iter().enumerate() {
        let (ms, text) = typist::explicit(wire, c, n + 1)?;
        log(&format!(
            "  {} {ms:>8.1} ms {:?}",
            c.id,
            text.as_deref().unwrap_or("")
        ));
        rows.push((c.id.clone(), ms, text));
    }
    if let Some(p) = process {
        p.shutdown(std::time::Duration::from_secs(5));
    }
    if let Some(p) = &cfg.json {
        let v = json!({ "engine": label, "explicit": rows.iter().map(|(id, ms, text)| json!({ "id": id, "ms": ms, "text": text })).collect::<Vec<_>>() });
        write(p, &serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?)?;
    }
    Ok(Report {
        typist: None,
        explicit: Some(rows),
        label,
        no_reuse: cfg.no_reuse,
        runs: vec![],
        summary: Summary::default(),
    })
}

/// One keystroke at a time, each waiting for its answer, without the debounce.
fn run_sequential(
    cfg: &Config,
    traces: &[Case],
    log: impl Fn(&str) + Clone + Send + 'static,
) -> Result<Report, String> {
    if let Some(p) = &cfg.steps_out {
        let steps: Vec<_> = traces
            .iter()
            .map(|c| json!({ "id": c.id, "steps": steps(c) }))
            .collect();
        write(p, &serde_json::to_string(&steps).map_err(|e| e.to_string())?)?;
    }
    let mut target = cfg.target.clone();
    if let (true, Target::Local { options, .. }) = (cfg.no_reuse, &mut target) {
        options.prefix = PrefixLimits {
            max_entries: 0,
            max_bytes: 0,
        };
    }
    let (engine, label) = target.start(cfg.device, log.clone())?;
    let completion = settings_for(cfg, Some(0))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let start = Instant::now();
    rt.block_on(replay(engine.clone(), &warm_up_trace(), completion.clone()))?;
    log(&format!(
        "warm-up trace (untimed): {:.1} s",
        start.elapsed().as_secs_f64()
    ));
    let mut runs = vec![];
    for c in traces {
        log(&format!(
            "trace {} ({} keystrokes) on {label}",
            c.id,
            c.expected.chars().count()
        ));
        let keys = rt.block_on(replay(engine.clone(), c, completion.clone()))?;
        for k in &keys {
            log(&format!(
                "  {:>3} {:>9.1} ms {:<13} prompt {:>5} reused {:>5} prefilled {:>4} first token {:>7.1} ms",
                k.typed,
                k.ms,
                k.source,
                k.prompt_tokens,
                k.reused_tokens,
                k.prefilled_tokens,
                k.first_token_ms
            ));
        }
        runs.push(keys);
    }
    if let ModelState::Failed(e) = engine.state() {
        return Err(format!("the model failed to load: {e}"));
    }
    let summary = summarize(&runs);
    if let Some(p) = &cfg.json {
        let v = json!({
            "engine": label,
            "summary": summary,
            "traces": traces.iter().map(|c| &c.id).collect::<Vec<_>>(),
            "keystrokes": runs,
        });
        write(p, &serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?)?;
    }
    Ok(Report {
        typist: None,
        explicit: None,
        label,
        no_reuse: cfg.no_reuse,
        runs,
        summary,
    })
}

/// The lines `laya bench typing` prints.
impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(rows) = &self.explicit {
            let ms: Vec<f64> = rows.iter().map(|r| r.1).collect();
            return writeln!(
                f,
                "{}: {} explicit requests; answered p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms; {} with a suggestion",
                self.label,
                rows.len(),
                percentile(&ms, 50.0),
                percentile(&ms, 90.0),
                percentile(&ms, 99.0),
                rows.iter().filter(|r| r.2.is_some()).count()
            );
        }
        if let Some((runs, summary)) = &self.typist {
            writeln!(
                f,
                "{}{}: {} traces",
                self.label,
                if self.no_reuse { " (no reuse)" } else { "" },
                runs.len()
            )?;
            return write!(f, "{summary}");
        }
        let s = &self.summary;
        writeln!(
            f,
            "{}{}: {} keystrokes in {} traces; latency p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms",
            self.label,
            if self.no_reuse { " (no reuse)" } else { "" },
            s.keystrokes,
            self.runs.len(),
            s.p50_ms,
            s.p90_ms,
            s.p99_ms
        )?;
        writeln!(
            f,
            "model calls {} ({} avoided by typing through, {:.0} %); prompt tokens reused {:.1} %",
            s.model_calls,
            s.typed_through,
            100.0 * s.typed_through as f64 / s.keystrokes.max(1) as f64,
            100.0 * s.reused_ratio
        )?;
        writeln!(
            f,
            "cold call: {:.0} prompt tokens, {:.1} ms; warm calls: {:.1} tokens prefilled ({:.2} % of cold), {:.1} ms ({:.1} % of cold)",
            s.cold_prompt_tokens,
            s.cold_ms,
            s.warm_prefill_tokens,
            100.0 * s.warm_prefill_tokens / s.cold_prompt_tokens.max(1.0),
            s.warm_ms,
            100.0 * s.warm_ms / s.cold_ms.max(1e-9)
        )?;
        writeln!(
            f,
            "prompt cost (time to first token): cold {:.1} ms, warm {:.1} ms ({:.1} % of cold)",
            s.cold_first_token_ms,
            s.warm_first_token_ms,
            100.0 * s.warm_first_token_ms / s.cold_first_token_ms.max(1e-9)
        )?;
        writeln!(
            f,
            "suggestion shown at {} of {} keystrokes; it made the expected line at {} ({:.1} %)",
            s.shown,
            s.keystrokes,
            s.exact,
            100.0 * s.exact as f64 / s.keystrokes.max(1) as f64
        )?;
        writeln!(
            f,
            "decode: {} tokens in {} forwards ({:.2} tokens per forward)",
            s.generated_tokens,
            s.forwards,
            s.generated_tokens as f64 / s.forwards.max(1) as f64
        )
    }
}

/// One keystroke's outcome.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Keystroke {
    /// Characters of the line typed so far.
    pub typed: usize,
    pub ms: f64,
    /// `model`, `typed-through`, or `none` (nothing to explain: no request ran).
    pub source: String,
    pub prompt_tokens: usize,
    pub reused_tokens: usize,
    pub prefilled_tokens: usize,
    /// The engine's time to the first token (the prompt's cost: prefill and the first
    /// sample); 0 when the model did not run.
    #[serde(default)]
    pub first_token_ms: f64,
    /// Tokens the model generated, and the forwards that gave them (0 when it did not run).
    #[serde(default)]
    pub generated_tokens: usize,
    #[serde(default)]
    pub forwards: usize,
    /// Whether a suggestion was shown, and whether the line it makes (what is typed, the
    /// suggestion's first line, the rest of the line after its range) is the expected line.
    pub shown: bool,
    pub exact: bool,
}

/// The text around the cursor at each keystroke, for replaying the same trace on another
/// engine (`prefix`/`suffix` of the whole file, as a fresh fill-in-the-middle request sees it).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PeerStep {
    pub prefix: String,
    pub suffix: String,
}

/// A trace from a real file: line `line` (1-based) is removed and typed back; the cursor
/// starts after its indentation.
pub fn trace_from_file(path: &std::path::Path, line: usize, language: &str) -> Result<Case, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let start = text
        .split_inclusive('\n')
        .take(line.saturating_sub(1))
        .map(str::len)
        .sum::<usize>();
    let rest = &text[start..];
    let end = start + rest.find('\n').unwrap_or(rest.len());
    let whole = &text[start..end];
    let indent = whole.len() - whole.trim_start().len();
    let expected = whole[indent..].trim_end().to_owned();
    if line == 0 || start >= text.len() || expected.is_empty() {
        return Err(format!("{}:{line}: no such non-empty line", path.display()));
    }
    Ok(Case {
        id: format!("{}:{line}", path.display()),
        language: language.to_owned(),
        source: path.display().to_string(),
        file_name: path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default(),
        prefix: text[..start + indent].to_owned(),
        suffix: text[end..].to_owned(),
        expected,
        workspace: None,
        path: None,
    })
}

/// A short trace to type before the measured ones, untimed: the first request of a process
/// pays for loading the model and for MLX's kernel compiles, which an editor that has been open
/// a while never sees (the peers get an untimed request too). Its file starts with
/// [`warm_up_source`](crate::engine::warm_up_source), so on a GPU the cold prompt takes the
/// prefill path of the measured traces' cold prompts, not only the one for a few tokens.
pub fn warm_up_trace() -> Case {
    let helpers = crate::engine::warm_up_source();
    Case {
        id: "warm-up".into(),
        language: "python".into(),
        source: String::new(),
        file_name: "warm_up.py".into(),
        prefix: format!("{helpers}def add(a, b):\n    "),
        suffix: "\n\n\nprint(add(1, 2))\n".into(),
        expected: "return a + b".into(),
        workspace: None,
        path: None,
    }
}

/// Keystrokes of a trace: (prefix, suffix) after each character of `case.expected`.
pub fn steps(case: &Case) -> Vec<PeerStep> {
    case.expected
        .char_indices()
        .map(|(i, c)| {
            let typed = &case.expected[..i + c.len_utf8()];
            PeerStep {
                prefix: format!("{}{typed}", case.prefix),
                suffix: case.suffix.clone(),
            }
        })
        .collect()
}

struct Driver {
    service: tower_lsp_server::LspService<crate::lsp::LayaServer>,
    id: i64,
}

impl Driver {
    async fn call(&mut self, method: &str, params: Value, notification: bool) -> Result<Value, String> {
        let mut b = Request::build(method.to_owned()).params(params);
        if !notification {
            self.id += 1;
            b = b.id(self.id);
        }
        let resp = self
            .service
            .ready()
            .await
            .map_err(|e| e.to_string())?
            .call(b.finish())
            .await
            .map_err(|e| e.to_string())?;
        match resp {
            Some(r) => {
                let v = serde_json::to_value(r).map_err(|e| e.to_string())?;
                match v.get("error") {
                    Some(e) => Err(format!("{method}: {e}")),
                    None => Ok(v["result"].clone()),
                }
            }
            None => Ok(Value::Null),
        }
    }
}

/// Type `case.expected` into the file, one request per keystroke. `completion` is the
/// `completion` settings section sent as initializationOptions.
pub async fn replay(
    engine: Arc<dyn Engine>,
    case: &Case,
    completion: Value,
) -> Result<Vec<Keystroke>, String> {
    let (service, socket) = build_service(EngineSource::Ready(engine));
    tokio::spawn(futures_util_drain(socket));
    let mut d = Driver { service, id: 0 };
    d.call(
        "initialize",
        json!({
            "capabilities": { "general": { "positionEncodings": ["utf-8"] } },
            "initializationOptions": { "completion": completion },
        }),
        false,
    )
    .await?;
    d.call("initialized", json!({}), true).await?;
    let uri = format!("file:///bench/{}", case.file_name);
    let text = format!("{}{}", case.prefix, case.suffix);
    d.call(
        "textDocument/didOpen",
        json!({ "textDocument": { "uri": uri, "languageId": case.language, "version": 1, "text": text } }),
        true,
    )
    .await?;
    let line = case.prefix.matches('\n').count() as u32;
    let mut col = (case.prefix.len() - case.prefix.rfind('\n').map_or(0, |i| i + 1)) as u32;
    let mut out = vec![];
    for (version, (i, c)) in case.expected.char_indices().enumerate() {
        let pos = json!({ "line": line, "character": col });
        d.call(
            "textDocument/didChange",
            json!({
                "textDocument": { "uri": uri, "version": version as i32 + 2 },
                "contentChanges": [{ "range": { "start": pos, "end": pos }, "text": c.to_string() }],
            }),
            true,
        )
        .await?;
        col += c.len_utf8() as u32;
        let start = Instant::now();
        let answer = d
            .call(
                "textDocument/inlineCompletion",
                json!({
                    "textDocument": { "uri": uri },
                    "position": { "line": line, "character": col },
                    "context": { "triggerKind": 2 },
                }),
                false,
            )
            .await?;
        let ms = start.elapsed().as_secs_f64() * 1e3;
        let typed = &case.expected[..i + c.len_utf8()];
        let line_after = case.suffix.split('\n').next().unwrap_or("");
        let made = line_made(&answer, typed, line_after);
        let e = d
            .call("laya/explain", json!({ "textDocument": { "uri": uri } }), false)
            .await?;
        let n = |k: &str| e[k].as_u64().unwrap_or(0) as usize;
        out.push(Keystroke {
            typed: i + c.len_utf8(),
            ms,
            source: e["source"].as_str().unwrap_or("none").to_owned(),
            prompt_tokens: n("promptTokens"),
            reused_tokens: n("reusedTokens"),
            prefilled_tokens: n("prefilledTokens"),
            first_token_ms: e["firstTokenMs"].as_f64().unwrap_or(0.0),
            generated_tokens: n("generatedTokens"),
            forwards: n("forwards"),
            shown: made.is_some(),
            exact: made.is_some_and(|l| l.trim_end() == case.expected.trim_end()),
        });
    }
    Ok(out)
}

/// The line the first inline suggestion of `answer` makes, given the text typed on the line
/// and the rest of the line after the cursor (ranges are in UTF-8 columns, as negotiated).
fn line_made(answer: &Value, typed: &str, line_after: &str) -> Option<String> {
    let item = match answer {
        Value::Array(items) => items.first(),
        Value::Object(o) => o.get("items").and_then(|i| i.as_array()).and_then(|i| i.first()),
        _ => None,
    }?;
    let text = match &item["insertText"] {
        Value::String(s) => s.as_str(),
        v => v["value"].as_str()?,
    };
    let (start, end) = (&item["range"]["start"], &item["range"]["end"]);
    let replaced = match (start["character"].as_u64(), end["character"].as_u64()) {
        (Some(s), Some(e)) if start["line"] == end["line"] => e.saturating_sub(s) as usize,
        _ => 0,
    };
    let rest = line_after.get(replaced.min(line_after.len())..).unwrap_or("");
    let line = format!("{typed}{text}{rest}");
    Some(line.split('\n').next().unwrap_or("").to_owned())
}

async fn futures_util_drain(socket: tower_lsp_server::ClientSocket) {
    use futures::StreamExt;
    socket.for_each(|_| async {}).await
}

/// Totals over all keystrokes of a run.
#[derive(Debug, Default, Serialize)]
pub struct Summary {
    pub keystrokes: usize,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub model_calls: usize,
    pub typed_through: usize,
    /// Reused / prompt tokens over the model calls.
    pub reused_ratio: f64,
    /// Mean prefilled tokens of the model calls after the first of each trace.
    pub warm_prefill_tokens: f64,
    /// Mean prompt tokens of the first call of each trace (cold).
    pub cold_prompt_tokens: f64,
    /// Mean latency of the first model call of each trace, and of the later ones.
    pub cold_ms: f64,
    pub warm_ms: f64,
    /// Mean time to the first token of the first model call of each trace, and of the later
    /// ones: what the prompt costs cold and on a keystroke.
    pub cold_first_token_ms: f64,
    pub warm_first_token_ms: f64,
    /// Keystrokes with a suggestion shown, and those whose suggestion makes the expected line.
    pub shown: usize,
    pub exact: usize,
    /// Tokens generated over the model calls, and the forwards that gave them.
    pub generated_tokens: usize,
    pub forwards: usize,
}

pub fn summarize(traces: &[Vec<Keystroke>]) -> Summary {
    let all: Vec<&Keystroke> = traces.iter().flatten().collect();
    let ms: Vec<f64> = all.iter().map(|k| k.ms).collect();
    let calls: Vec<&&Keystroke> = all.iter().filter(|k| k.source == "model").collect();
    let (reused, prompt) = calls
        .iter()
        .fold((0, 0), |(r, p), k| (r + k.reused_tokens, p + k.prompt_tokens));
    let (mut cold, mut warm, mut cold_ms, mut warm_ms) = (vec![], vec![], vec![], vec![]);
    let (mut cold_ft, mut warm_ft) = (vec![], vec![]);
    for t in traces {
        let mut first = true;
        for k in t.iter().filter(|k| k.source == "model") {
            if first {
                cold.push(k.prompt_tokens as f64);
                cold_ms.push(k.ms);
                cold_ft.push(k.first_token_ms);
                first = false;
            } else {
                warm.push(k.prefilled_tokens as f64);
                warm_ms.push(k.ms);
                warm_ft.push(k.first_token_ms);
            }
        }
    }
    let mean = |v: &[f64]| {
        if v.is_empty() {
            0.0
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    };
    Summary {
        keystrokes: all.len(),
        p50_ms: percentile(&ms, 50.0),
        p90_ms: percentile(&ms, 90.0),
        p99_ms: percentile(&ms, 99.0),
        model_calls: calls.len(),
        typed_through: all.iter().filter(|k| k.source == "typed-through").count(),
        reused_ratio: if prompt == 0 {
            0.0
        } else {
            reused as f64 / prompt as f64
        },
        warm_prefill_tokens: mean(&warm),
        cold_prompt_tokens: mean(&cold),
        cold_ms: mean(&cold_ms),
        warm_ms: mean(&warm_ms),
        cold_first_token_ms: mean(&cold_ft),
        warm_first_token_ms: mean(&warm_ft),
        shown: all.iter().filter(|k| k.shown).count(),
        exact: all.iter().filter(|k| k.exact).count(),
        generated_tokens: calls.iter().map(|k| k.generated_tokens).sum(),
        forwards: calls.iter().map(|k| k.forwards).sum(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_type_the_line_one_character_at_a_time() {
        let case = Case {
            id: "t".into(),
            language: "python".into(),
            source: String::new(),
            file_name: "a.py".into(),
            prefix: "def f():\n    ".into(),
            suffix: "\n".into(),
            expected: "é = 1".into(),
            workspace: None,
            path: None,
        };
        let s = steps(&case);
        assert_eq!(s.len(), 5);
        assert_eq!(s[0].prefix, "def f():\n    é");
        assert_eq!(s[4].prefix, "def f():\n    é = 1");
    }

    #[test]
    fn summary_splits_cold_and_warm_calls() {
        let k = |source: &str, prompt, reused, prefilled| Keystroke {
            typed: 1,
            ms: 1.0,
            source: source.into(),
            prompt_tokens: prompt,
            reused_tokens: reused,
            prefilled_tokens: prefilled,
            first_token_ms: prompt as f64 / 10.0,
            generated_tokens: 0,
            forwards: 0,
            shown: source == "model",
            exact: false,
        };
        let s = summarize(&[vec![
            k("model", 100, 0, 100),
            k("typed-through", 0, 0, 0),
            k("model", 102, 99, 3),
        ]]);
        assert_eq!((s.model_calls, s.typed_through, s.keystrokes), (2, 1, 3));
        assert_eq!(s.cold_prompt_tokens, 100.0);
        assert_eq!(s.warm_prefill_tokens, 3.0);
        assert_eq!((s.cold_first_token_ms, s.warm_first_token_ms), (10.0, 10.2));
        assert!((s.reused_ratio - 99.0 / 202.0).abs() < 1e-9);
        assert_eq!((s.shown, s.exact), (2, 0));
    }

    /// Completes the warm-up line: answers the rest of `return a + b` after what the prompt's
    /// last line already has, as a model that knows the line would.
    struct KnowsTheLine;

    #[async_trait::async_trait]
    impl Engine for KnowsTheLine {
        async fn complete(
            &self,
            req: crate::engine::CompletionRequest,
            _cancel: crate::engine::Cancel,
            _pieces: Option<crate::engine::PieceSender>,
        ) -> Result<crate::engine::CompletionOutput, crate::engine::EngineError> {
            // An anchored prompt continues an earlier one: what was typed since then follows
            // `<|fim_middle|>`.
            let prefix = req.prompt.split("<|fim_prefix|>").last().unwrap_or("");
            let line = prefix
                .split("<|fim_suffix|>")
                .next()
                .unwrap_or("")
                .rsplit('\n')
                .next();
            let middle = prefix.split("<|fim_middle|>").nth(1).unwrap_or("");
            let typed = format!("{}{middle}", line.unwrap_or("").trim_start());
            let text = "return a + b"
                .strip_prefix(typed.as_str())
                .unwrap_or("")
                .to_owned();
            Ok(crate::engine::CompletionOutput {
                served_by: None,
                choices: vec![crate::engine::Choice {
                    text,
                    finish_reason: crate::engine::FinishReason::StopToken,
                    tokens: 1,
                    logprob: None,
                }],
                timing: crate::engine::Timing::default(),
            })
        }

        fn state(&self) -> crate::engine::ModelState {
            crate::engine::ModelState::ready_on("fake")
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn replay_types_the_line_and_types_through_the_suggestion() {
        let case = warm_up_trace();
        let settings = json!({ "debounceMs": 0, "typingThrough": true });
        let keys = replay(Arc::new(KnowsTheLine), &case, settings).await.unwrap();
        assert_eq!(keys.len(), case.expected.chars().count());
        let last = keys.len() - 1;
        // The first keystroke asks the model; typing through its suggestion needs no call until
        // the line is complete and nothing of it is left to show.
        assert_eq!(keys[0].source, "model");
        assert!(
            keys[1..last].iter().all(|k| k.source == "typed-through"),
            "{keys:?}"
        );
        assert_eq!(
            (keys[last].source.as_str(), keys[last].shown),
            ("model", false),
            "{keys:?}"
        );
        assert!(keys[..last].iter().all(|k| k.shown && k.exact), "{keys:?}");
        let s = summarize(&[keys]);
        assert_eq!((s.model_calls, s.typed_through), (2, 10));
    }

    /// The typist in real time on a fake that knows the line: the first keystroke's answer
    /// is the model's, any later ones are typed through, the accept comes once a gap is longer
    /// than the time to read, and its answer was computed while the suggestion showed.
    #[test]
    fn the_typist_types_reads_and_accepts() {
        use crate::bench::typist::{self, Typist};
        let rt = Arc::new(
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .unwrap(),
        );
        let mut wire = typist::InProcess::new(rt, Arc::new(KnowsTheLine));
        typist::initialize(&mut wire, &json!({ "typingThrough": true })).unwrap();
        let case = warm_up_trace();
        let mut steps = vec![];
        // A slow typist who reads fast: the gaps leave the fake's answers time under any load.
        let typist = Typist {
            median_ms: 300.0,
            reaction_ms: 120.0,
            ..Typist::default()
        };
        let run = typist::replay(&mut wire, &case, &typist, &mut steps).unwrap();
        let keys = &run.keys;
        assert!(!keys.is_empty() && keys.len() < case.expected.len(), "{keys:?}");
        assert_eq!(
            (keys[0].outcome.as_str(), keys[0].source.as_str()),
            ("shown", "model"),
            "{keys:?}"
        );
        assert!(
            keys[1..]
                .iter()
                .all(|k| k.outcome == "shown" && k.source == "typed-through"),
            "{keys:?}"
        );
        let accept = run.accept.as_ref().expect("an accept");
        assert!(
            accept.ahead && !accept.shown,
            "{accept:?} {} {keys:?}",
            run.requests
        );
        // The schedule holds each keystroke and the accept, with the text after each.
        assert_eq!(steps.len(), keys.len() + 1);
        assert!(steps.last().unwrap().accept);
        assert_eq!(
            steps.last().unwrap().prefix,
            format!("{}{}", case.prefix, case.expected)
        );
        assert_eq!(
            run.requests["requests"],
            keys.len() as u64 + 1,
            "{}",
            run.requests
        );
        assert_eq!(run.requests["ahead"], 1, "{}", run.requests);
        let n = keys.len();
        let s = typist::summarize(&[run]);
        assert_eq!((s.keystrokes, s.shown, s.accepts, s.accept_ahead), (n, n, 1, 1));
    }

    #[test]
    fn the_line_a_suggestion_makes() {
        let arr = json!([{ "insertText": "b + c)", "range": { "start": { "line": 3, "character": 7 }, "end": { "line": 3, "character": 8 } } }]);
        assert_eq!(
            line_made(&arr, "f(a, ", ")  # x").as_deref(),
            Some("f(a, b + c)  # x")
        );
        let list = json!({ "items": [{ "insertText": "1\nmore" }] });
        assert_eq!(line_made(&list, "x = ", "").as_deref(), Some("x = 1"));
        assert_eq!(line_made(&json!([]), "x", ""), None);
        assert_eq!(line_made(&Value::Null, "x", ""), None);
    }
}
