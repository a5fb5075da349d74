//! The daemon's HTTP API (axum): `POST /complete`, the OpenAI-compatible `POST
//! /v1/completions` (with SSE streaming) and `GET /v1/models`, and `GET /health`. Errors are
//! JSON `{"error": {"message", "type"}}` with a 4xx status for anything the client can fix.
//!
//! `/complete` is laya's own. A plain `prompt` is continued as it is (the model's text as it
//! came, the request's `stop`, `n` and `max_tokens`). A `prefix` and `suffix` get what an
//! editor's invoked request at that cursor gets: the completion pipeline's plan
//! ([`Pipeline::plan_once`], the language named by `path`'s extension: a line or a block,
//! the prompt, stops, candidates) and its post-processing ([`Pipeline::finish_once`]):
//! `choices` are the suggestions an editor would show, best first, each with the bytes after
//! the cursor it replaces (`replace_len`). The request's own fields change that plan only
//! where given: `max_tokens` (the line's and the block's limit, else the editor's within
//! `--max-tokens`), `n` (the candidates), `max_prompt_tokens` (the prompt budget), `stop`
//! (stop strings besides the plan's), the sampling and the model (else the default model,
//! not the router's choice).
//!
//! `/v1/completions` with a `suffix` builds its prompt the same way, from `prompt` and
//! `suffix`; otherwise it is OpenAI's: the client's `stop`, `n` and `max_tokens`, and the
//! model's text as it came (streamed or not), with no post-processing.

use std::{
    collections::VecDeque,
    convert::Infallible,
    net::SocketAddr,
    sync::Arc,
    time::{SystemTime, UNIX_EPOCH},
};

use axum::{
    body::Bytes,
    extract::{rejection::BytesRejection, ConnectInfo, DefaultBodyLimit, Request, State},
    http::{header, HeaderMap, StatusCode},
    middleware::{self, Next},
    response::{
        sse::{Event, KeepAlive, Sse},
        IntoResponse, Response,
    },
    routing::{get, post},
    Json, Router,
};
use serde::{de::DeserializeOwned, Deserialize};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use super::{
    protocol::{finish_reason_name, ms, WireTiming},
    server::{Daemon, DaemonError, Served},
};
use crate::{
    completion::pipeline::{CompletionSettings, Pipeline, Plan, Request as PipelineRequest, Trigger},
    document::{Document, DocumentSnapshot},
    engine::Engine,
    engine::{
        Cancel, CancelOnDrop, CompletionRequest, FinishReason, ModelKey, Precision, SamplingParams, Tier,
    },
    prompt::Budget,
};

/// An error answer: status and OpenAI-style body.
#[derive(Debug)]
pub struct HttpError {
    status: StatusCode,
    kind: &'static str,
    message: String,
}

impl HttpError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        HttpError {
            status,
            kind,
            message: message.into(),
        }
    }

    fn bad(message: impl Into<String>) -> Self {
        HttpError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }
}

impl From<DaemonError> for HttpError {
    fn from(e: DaemonError) -> Self {
        HttpError {
            status: StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            kind: e.kind().as_str(),
            message: e.to_string(),
        }
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(json!({ "error": { "message": self.message, "type": self.kind } })),
        )
            .into_response()
    }
}

/// Serve HTTP on `listener` until the task is dropped.
pub async fn serve(daemon: Arc<Daemon>, listener: tokio::net::TcpListener) {
    let app = router(daemon);
    if let Err(e) = axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await {
        tracing::error!(error = %e, "HTTP server stopped");
    }
}

pub fn router(daemon: Arc<Daemon>) -> Router {
    let limit = daemon.config().limits.max_body_bytes;
    Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/complete", post(complete))
        .route("/v1/completions", post(v1_completions))
        .fallback(|| async { HttpError::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint") })
        .method_not_allowed_fallback(|| async {
            HttpError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "invalid_request_error",
                "method not allowed here",
            )
        })
        .layer(middleware::from_fn_with_state(daemon.clone(), guard))
        .layer(DefaultBodyLimit::max(limit))
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .with_state(daemon)
}

/// Bearer token (when configured) and, on a loopback address, a loopback `Host` (a web page
/// cannot reach the daemon through DNS rebinding).
async fn guard(State(d): State<Arc<Daemon>>, req: Request, next: Next) -> Response {
    let loopback = d.http_addr().is_some_and(|a| a.ip().is_loopback());
    if loopback {
        if let Some(host) = req.headers().get(header::HOST).and_then(|h| h.to_str().ok()) {
            let name = match host.rsplit_once(':') {
                Some((n, port)) if port.chars().all(|c| c.is_ascii_digit()) => n,
                _ => host,
            };
            if !matches!(name, "127.0.0.1" | "localhost" | "[::1]") {
                return HttpError::new(
                    StatusCode::FORBIDDEN,
                    "permission_error",
                    format!("Host `{host}` is not this machine"),
                )
                .into_response();
            }
        }
    }
    if let Some(token) = &d.config().token {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|h| h.to_str().ok())
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim);
        if !given.is_some_and(|g| same_secret(g.as_bytes(), token.as_bytes())) {
            return HttpError::new(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "missing or wrong bearer token (Authorization: Bearer …)",
            )
            .into_response();
        }
    }
    next.run(req).await
}

/// `a == b` in time that depends on the lengths only, not on where they first differ.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() != b.len()) as u8;
    for (x, y) in a.iter().zip(b) {
        diff |= x ^ y;
    }
    std::hint::black_box(diff) == 0
}

/// The body as `T`: 413 over the size limit, 415 for a non-JSON content type, 400 for bad JSON.
fn parse_body<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<T, HttpError> {
    let body = body.map_err(|r| {
        let status = r.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            HttpError::new(
                status,
                "invalid_request_error",
                "the request body is over this server's size limit",
            )
        } else {
            HttpError::new(status, "invalid_request_error", r.body_text())
        }
    })?;
    if let Some(ct) = headers.get(header::CONTENT_TYPE).and_then(|h| h.to_str().ok()) {
        if !ct
            .trim_start()
            .to_ascii_lowercase()
            .starts_with("application/json")
        {
            return Err(HttpError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "invalid_request_error",
                format!("expected Content-Type: application/json, got `{ct}`"),
            ));
        }
    }
    serde_json::from_slice(&body).map_err(|e| HttpError::bad(format!("invalid JSON body: {e}")))
}

/// Fair-queueing identity: `X-Laya-Client` when sent, else the connection.
fn client_of(headers: &HeaderMap, peer: SocketAddr) -> String {
    match headers.get("x-laya-client").and_then(|h| h.to_str().ok()) {
        Some(c) if !c.is_empty() => format!("http {}", c.chars().take(100).collect::<String>()),
        _ => format!("http {peer}"),
    }
}

async fn health(State(d): State<Arc<Daemon>>) -> Json<Value> {
    Json(serde_json::to_value(d.status()).unwrap_or_default())
}

async fn models(State(d): State<Arc<Daemon>>) -> Json<Value> {
    let mut tiers: Vec<Tier> = d.config().pool.tiers.keys().copied().collect();
    tiers.sort_by_key(|t| *t as u8);
    let data: Vec<Value> = tiers
        .into_iter()
        .map(|t| {
            json!({
                "id": d.model_name(t),
                "object": "model",
                "created": 0,
                "owned_by": "laya",
                "tier": t.label(),
            })
        })
        .collect();
    Json(json!({ "object": "list", "data": data }))
}

/// A string or a list of strings.
#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

/// `"small/q4"`, a model name, or `{"tier": "large", "bits": 4}`.
#[derive(Deserialize)]
#[serde(untagged)]
enum ModelField {
    Name(String),
    Spec {
        tier: Option<Tier>,
        bits: Option<u32>,
        precision: Option<String>,
    },
}

#[derive(Deserialize)]
struct CompleteBody {
    /// A plain continuation: the model goes on from this text (no fill-in-the-middle).
    prompt: Option<String>,
    /// Fill-in-the-middle: the text before and after the cursor.
    prefix: Option<String>,
    suffix: Option<String>,
    /// Shown to the model as the file's path (repo-level prompts).
    #[serde(default)]
    path: String,
    max_tokens: Option<usize>,
    max_prompt_tokens: Option<usize>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    n: Option<usize>,
    stop: Option<OneOrMany>,
    seed: Option<u64>,
    model: Option<ModelField>,
}

#[derive(Deserialize)]
struct V1Body {
    model: Option<String>,
    prompt: OneOrMany,
    suffix: Option<String>,
    max_tokens: Option<usize>,
    max_prompt_tokens: Option<usize>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<usize>,
    n: Option<usize>,
    stop: Option<OneOrMany>,
    seed: Option<u64>,
    #[serde(default)]
    stream: bool,
}

fn model_key(d: &Daemon, field: Option<ModelField>) -> Result<ModelKey, HttpError> {
    match field {
        None => Ok(d.config().pool.default),
        Some(ModelField::Name(n)) => Ok(d.model_for_name(Some(&n))?),
        Some(ModelField::Spec {
            tier,
            bits,
            precision,
        }) => {
            let default = d.config().pool.default;
            let precision = match (bits, precision) {
                (Some(b), _) => b
                    .to_string()
                    .parse::<Precision>()
                    .ok()
                    .ok_or_else(|| HttpError::bad(format!("bits must be 4, 6 or 8, got {b}")))?,
                (None, Some(p)) => p.parse::<Precision>().ok().ok_or_else(|| {
                    HttpError::bad(format!("precision must be native, q4, q6 or q8, got `{p}`"))
                })?,
                (None, None) => default.precision,
            };
            Ok(ModelKey {
                tier: tier.unwrap_or(default.tier),
                precision,
            })
        }
    }
}

/// A document of a prefix and suffix with the cursor between them, and the settings an
/// editor's request there is planned with: the editor's defaults, except where the HTTP
/// request gives `max_tokens` (the line's and the block's limit; else the editor's, within
/// the server's `--max-tokens`), `max_prompt_tokens` (the prompt budget, whose default is the
/// editor's) or `n` (the candidates); the budget always leaves room for the answer within the
/// sequence limit.
struct AtCursor {
    pipeline: Pipeline,
    doc: DocumentSnapshot,
    cursor: usize,
    settings: CompletionSettings,
}

/// What an HTTP request says of its cursor and the plan there.
struct CursorFields<'a> {
    prefix: &'a str,
    suffix: &'a str,
    /// Shown to the model as the file's path; its extension names the language.
    path: &'a str,
    max_tokens: Option<usize>,
    max_prompt_tokens: Option<usize>,
    n: Option<usize>,
}

impl AtCursor {
    fn new(d: &Daemon, f: CursorFields) -> Result<AtCursor, HttpError> {
        let editor = CompletionSettings::default();
        let limits = &d.config().limits;
        let (line, block) = match f.max_tokens {
            Some(t) => (t, t),
            None => (
                editor.max_tokens_line.min(limits.max_tokens),
                editor.max_tokens_block.min(limits.max_tokens),
            ),
        };
        let room = limits
            .max_seq_len
            .saturating_sub(line.max(block))
            .saturating_sub(16); // the FIM markers
        let settings = CompletionSettings {
            budget: Budget {
                max_tokens: f.max_prompt_tokens.unwrap_or(editor.budget.max_tokens).min(room),
                ..editor.budget.clone()
            },
            max_tokens_line: line,
            max_tokens_block: block,
            candidates: f.n.unwrap_or(editor.candidates),
            ..editor
        };
        let text = format!("{}{}", f.prefix, f.suffix);
        let pool: Arc<dyn Engine> = d.pool().map_err(DaemonError::Engine)?;
        Ok(AtCursor {
            pipeline: Pipeline::new(pool),
            doc: Document::for_path(&text, f.path).snapshot(f.path),
            cursor: f.prefix.len(),
            settings,
        })
    }

    /// The pipeline's request: an invoked one (the user asked), with nothing else open.
    fn request(&self) -> PipelineRequest<'_> {
        PipelineRequest {
            doc: &self.doc,
            others: &[],
            cursor: self.cursor,
            trigger: Trigger::Invoked,
            settings: &self.settings,
            workspace_root: None,
            workspace: None,
        }
    }

    /// The plan an editor's request here gets ([`Pipeline::plan_once`]), on the model `key`.
    fn plan(&self, key: ModelKey) -> Result<Plan, HttpError> {
        Ok(self
            .pipeline
            .plan_once(&self.request(), Some(key))
            .map_err(DaemonError::Engine)?)
    }
}

/// `/complete`'s engine request for a prefix and suffix: the plan at that cursor on `key`
/// ([`AtCursor`]), with the HTTP request's sampling and its `stop` strings besides the plan's;
/// the cursor and the plan, which its answer is finished with, come along.
fn planned_request(
    d: &Daemon,
    key: ModelKey,
    sampling: SamplingParams,
    stop: Vec<String>,
    fields: CursorFields,
) -> Result<(CompletionRequest, AtCursor, Plan), HttpError> {
    if fields.n == Some(0) {
        return Err(HttpError::bad(format!(
            "n must be between 1 and {}, got 0",
            d.config().limits.max_n
        )));
    }
    let at = AtCursor::new(d, fields)?;
    let plan = at.plan(key)?;
    let mut req = CompletionRequest {
        sampling,
        ..plan.request.clone()
    };
    for s in stop {
        if !req.stop.contains(&s) {
            req.stop.push(s);
        }
    }
    Ok((req, at, plan))
}

/// The FIM prompt of `/v1/completions` with a suffix: the one the plan at that cursor has
/// ([`AtCursor`]), within `max_prompt_tokens` and the sequence limit.
fn fim_prompt(
    d: &Daemon,
    key: ModelKey,
    prefix: &str,
    suffix: &str,
    max_tokens: usize,
    max_prompt_tokens: Option<usize>,
) -> Result<String, HttpError> {
    let at = AtCursor::new(
        d,
        CursorFields {
            prefix,
            suffix,
            path: "",
            max_tokens: Some(max_tokens),
            max_prompt_tokens,
            n: None,
        },
    )?;
    Ok(at.plan(key)?.request.prompt)
}

fn sampling(
    d: &Daemon,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<usize>,
    seed: Option<u64>,
) -> SamplingParams {
    let defaults = &d.config().defaults;
    SamplingParams {
        temperature: temperature.unwrap_or(defaults.temperature),
        top_p: top_p.unwrap_or(defaults.top_p),
        top_k: top_k.unwrap_or(0),
        seed,
    }
}

fn timing_json(served: &Served) -> (Value, Option<f64>) {
    let t = WireTiming::new(&served.output.timing, served.queued);
    (
        serde_json::to_value(t).unwrap_or_default(),
        served.load_time.map(ms),
    )
}

async fn complete(
    State(d): State<Arc<Daemon>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, HttpError> {
    let b: CompleteBody = parse_body(&headers, body)?;
    let key = model_key(&d, b.model)?;
    let sampling = sampling(&d, b.temperature, b.top_p, None, b.seed);
    let stop = b.stop.map(OneOrMany::into_vec).unwrap_or_default();
    // A plain continuation's request, or the cursor and the editor's plan there.
    let (req, planned) = match (b.prompt, b.prefix) {
        (Some(prompt), None) if b.suffix.is_none() => {
            let max_tokens = b
                .max_tokens
                .unwrap_or(d.config().defaults.max_tokens.min(d.config().limits.max_tokens));
            let req = CompletionRequest {
                model: Some(key),
                n: b.n.unwrap_or(1),
                sampling,
                stop,
                ..CompletionRequest::new(prompt, max_tokens)
            };
            (req, None)
        }
        (None, Some(prefix)) => {
            let fields = CursorFields {
                prefix: &prefix,
                suffix: b.suffix.as_deref().unwrap_or(""),
                path: &b.path,
                max_tokens: b.max_tokens,
                max_prompt_tokens: b.max_prompt_tokens,
                n: b.n,
            };
            let (req, at, plan) = planned_request(&d, key, sampling, stop, fields)?;
            (req, Some((at, plan)))
        }
        (Some(_), _) => {
            return Err(HttpError::bad(
                "give either `prompt` (a plain continuation) or `prefix` and `suffix` \
                 (fill-in-the-middle), not both",
            ))
        }
        (None, None) => {
            return Err(HttpError::bad(
                "missing `prompt` (a plain continuation) or `prefix` (fill-in-the-middle, with \
                 an optional `suffix`)",
            ))
        }
    };
    let served = d
        .complete(&client_of(&headers, peer), req, Cancel::new(), None)
        .await?;
    let (timing, load_time_ms) = timing_json(&served);
    let out = &served.output;
    let choices: Vec<Value> = match planned {
        None => out
            .choices
            .iter()
            .map(|c| {
                json!({
                    "text": c.text,
                    "finish_reason": finish_reason_name(c.finish_reason),
                    "tokens": c.tokens,
                })
            })
            .collect(),
        // Ranked and post-processed as an editor's answer is: the suggestions it would show.
        Some((at, plan)) => {
            let c = at.pipeline.finish_once(&at.request(), plan, out.clone());
            c.edits
                .iter()
                .zip(&c.origins)
                .map(|(e, o)| {
                    json!({
                        "text": e.text,
                        "replace_len": e.replace_len,
                        "finish_reason": out.choices.get(o.choice).map(|c| finish_reason_name(c.finish_reason)),
                        "tokens": o.tokens,
                    })
                })
                .collect()
        }
    };
    let key = out.served_by.unwrap_or(d.config().pool.default);
    Ok(Json(json!({
        "text": choices.first().and_then(|c| c["text"].as_str()).unwrap_or(""),
        "choices": choices,
        "model": key.to_string(),
        "model_name": d.model_name(key.tier),
        "stand_in_for": served.stand_in_for.map(|k| k.to_string()),
        "timing": timing,
        "load_time_ms": load_time_ms,
    })))
}

fn openai_finish(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Length => "length",
        _ => "stop",
    }
}

fn completion_id() -> String {
    format!("cmpl-{:016x}", rand::random::<u64>())
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

async fn v1_completions(
    State(d): State<Arc<Daemon>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, HttpError> {
    let b: V1Body = parse_body(&headers, body)?;
    let mut prompts = b.prompt.into_vec();
    if prompts.len() != 1 {
        return Err(HttpError::bad(format!(
            "prompt must be one string (got a list of {}); send one request per prompt",
            prompts.len()
        )));
    }
    let text = prompts.remove(0);
    let max_tokens = b
        .max_tokens
        .unwrap_or(d.config().defaults.max_tokens.min(d.config().limits.max_tokens));
    let key = d.model_for_name(b.model.as_deref())?;
    let prompt = match &b.suffix {
        Some(suffix) => fim_prompt(&d, key, &text, suffix, max_tokens, b.max_prompt_tokens)?,
        None => text,
    };
    let req = CompletionRequest {
        model: Some(key),
        n: b.n.unwrap_or(1),
        sampling: sampling(&d, b.temperature, b.top_p, b.top_k, b.seed),
        stop: b.stop.map(OneOrMany::into_vec).unwrap_or_default(),
        ..CompletionRequest::new(prompt, max_tokens)
    };
    d.validate(&req)?;
    let client = client_of(&headers, peer);
    let id = completion_id();
    let created = unix_now();
    if b.stream {
        return Ok(stream(d, client, req, id, created).into_response());
    }
    let served = d.complete(&client, req, Cancel::new(), None).await?;
    let out = &served.output;
    let model = d.model_name(out.served_by.unwrap_or(key).tier);
    let (timing, load_time_ms) = timing_json(&served);
    let completion_tokens = out.timing.generated_tokens;
    Ok(Json(json!({
        "id": id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": out.choices.iter().enumerate().map(|(i, c)| json!({
            "text": c.text,
            "index": i,
            "logprobs": null,
            "finish_reason": openai_finish(c.finish_reason),
        })).collect::<Vec<_>>(),
        "usage": {
            "prompt_tokens": out.timing.prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": out.timing.prompt_tokens + completion_tokens,
        },
        "timing": timing,
        "load_time_ms": load_time_ms,
        "served_by": out.served_by.map(|k| k.to_string()),
        "stand_in_for": served.stand_in_for.map(|k| k.to_string()),
    }))
    .into_response())
}

/// Stops the request when the stream is dropped (the client went away): cancels it (the
/// guard) and aborts its task.
struct StopOnDrop {
    _cancel: CancelOnDrop,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct StreamState {
    pieces: mpsc::UnboundedReceiver<(usize, String)>,
    done: Option<oneshot::Receiver<Result<Served, DaemonError>>>,
    pending: VecDeque<Event>,
    chunk: Value,
    daemon: Arc<Daemon>,
    _stop: StopOnDrop,
}

impl StreamState {
    fn chunk(&self, choices: Value) -> Event {
        let mut c = self.chunk.clone();
        c["choices"] = choices;
        Event::default().data(c.to_string())
    }
}

/// SSE: `data: {chunk}` per decoded piece, a chunk per choice with its finish reason, one
/// with usage and timing, then `data: [DONE]`.
fn stream(
    d: Arc<Daemon>,
    client: String,
    req: CompletionRequest,
    id: String,
    created: u64,
) -> Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>> {
    let (tx, rx) = mpsc::unbounded_channel();
    let (done_tx, done_rx) = oneshot::channel();
    let cancel = Cancel::new();
    let model = d.model_name(req.model.map(|k| k.tier).unwrap_or(d.config().pool.default.tier));
    let task = {
        let (d, cancel) = (d.clone(), cancel.clone());
        tokio::spawn(async move {
            let r = d.complete(&client, req, cancel, Some(tx)).await;
            let _ = done_tx.send(r);
        })
    };
    let state = StreamState {
        pieces: rx,
        done: Some(done_rx),
        pending: VecDeque::new(),
        chunk: json!({ "id": id, "object": "text_completion", "created": created, "model": model }),
        daemon: d,
        _stop: StopOnDrop {
            _cancel: cancel.guard(),
            task,
        },
    };
    let events = futures_util::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(e) = st.pending.pop_front() {
                return Some((Ok(e), st));
            }
            if let Some((index, text)) = st.pieces.recv().await {
                let e = st.chunk(
                    json!([{ "text": text, "index": index, "logprobs": null, "finish_reason": null }]),
                );
                return Some((Ok(e), st));
            }
            // The sender is gone: the request finished.
            let done = st.done.take()?;
            match done.await {
                Ok(Ok(served)) => {
                    let out = &served.output;
                    for (i, c) in out.choices.iter().enumerate() {
                        let e = st.chunk(json!([{
                            "text": "", "index": i, "logprobs": null,
                            "finish_reason": openai_finish(c.finish_reason),
                        }]));
                        st.pending.push_back(e);
                    }
                    let completion_tokens = out.timing.generated_tokens;
                    let (timing, load_time_ms) = timing_json(&served);
                    let mut last = st.chunk.clone();
                    last["choices"] = json!([]);
                    if let Some(k) = out.served_by {
                        last["model"] = json!(st.daemon.model_name(k.tier));
                        last["served_by"] = json!(k.to_string());
                    }
                    last["usage"] = json!({
                        "prompt_tokens": out.timing.prompt_tokens,
                        "completion_tokens": completion_tokens,
                        "total_tokens": out.timing.prompt_tokens + completion_tokens,
                    });
                    last["timing"] = timing;
                    last["load_time_ms"] = json!(load_time_ms);
                    last["stand_in_for"] = json!(served.stand_in_for.map(|k| k.to_string()));
                    st.pending.push_back(Event::default().data(last.to_string()));
                }
                Ok(Err(e)) => {
                    let body = json!({ "error": { "message": e.to_string(), "type": e.kind().as_str() } });
                    st.pending.push_back(Event::default().data(body.to_string()));
                }
                Err(_) => {
                    let body =
                        json!({ "error": { "message": "the request stopped", "type": "server_error" } });
                    st.pending.push_back(Event::default().data(body.to_string()));
                }
            }
            st.pending.push_back(Event::default().data("[DONE]"));
        }
    });
    Sse::new(events).keep_alive(KeepAlive::default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        daemon::DaemonConfig,
        engine::{
            pool::{PoolConfig, TierSource},
            remote::RemoteConfig,
            runtime::DevicePref,
            LineEnd,
        },
    };

    /// A daemon whose one tier is a server that is never asked.
    fn daemon(dir: &std::path::Path) -> Daemon {
        let key = ModelKey {
            tier: Tier::Small,
            precision: Precision::Native,
        };
        let remote = TierSource::Remote(RemoteConfig::new("http://127.0.0.1:9/v1"));
        Daemon::new(
            DaemonConfig {
                pool: PoolConfig {
                    tiers: [(Tier::Small, remote)].into(),
                    default: key,
                    preload: vec![],
                    device: DevicePref::Cpu,
                    prefix: Default::default(),
                    speculation: Default::default(),
                    use_cache: false,
                    loader: Default::default(),
                },
                names: Default::default(),
                runtime_dir: dir.to_owned(),
                http: None,
                token: None,
                limits: Default::default(),
                defaults: Default::default(),
                warmup: false,
                remote_slots: 1,
            },
            None,
        )
    }

    /// What `/complete` asks the engine for a prefix and suffix is the editor's request at that
    /// cursor: a block's limit, stop and line end (where post-processing would cut it) at the
    /// end of a line, a line's mid-line; the request's own `stop`, `n` and `max_tokens` change
    /// it where given.
    #[test]
    fn a_prefix_and_suffix_ask_the_engine_what_an_editor_asks() {
        let tmp = tempfile::tempdir().unwrap();
        let d = daemon(tmp.path());
        let key = d.config().pool.default;
        let ask = |prefix: &str, suffix: &str, stop: &[&str], n, max_tokens| {
            let fields = CursorFields {
                prefix,
                suffix,
                path: "add.py",
                max_tokens,
                max_prompt_tokens: None,
                n,
            };
            let stop = stop.iter().map(|s| s.to_string()).collect();
            planned_request(&d, key, SamplingParams::default(), stop, fields)
                .map(|(req, ..)| req)
                .map_err(|e| e.message)
        };
        let block = ask(
            "def add(a, b):\n    return ",
            "\n\nprint(add(1, 2))\n",
            &[],
            None,
            None,
        )
        .unwrap();
        assert_eq!(
            (block.max_tokens, &block.stop[..], block.n, block.branch_first),
            (128, &["\n\n\n".to_owned()][..], 1, false)
        );
        assert_eq!(
            block.lines,
            LineEnd {
                dedent_below: Some(4),
                repeats: "print(add(1, 2))".into(),
                max_lines: Some(8),
            }
        );
        assert!(
            block.prompt.starts_with("<|fim_prefix|>def add(a, b):"),
            "{}",
            block.prompt
        );

        let line = ask("x = f(", ")\n", &["\n", ";"], Some(3), Some(16)).unwrap();
        assert_eq!(
            (line.max_tokens, &line.stop[..], line.n, line.branch_first),
            (16, &["\n".to_owned(), ";".to_owned()][..], 3, true)
        );
        assert!(line.lines.is_none());

        let none = ask("x = ", "", &[], Some(0), None).unwrap_err();
        assert!(none.contains("n must be between 1 and 8"), "{none}");
    }
}
