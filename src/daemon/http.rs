//! The daemon's HTTP API (axum): `POST /complete` (laya's own: a plain `prompt` to continue,
//! or a prefix and suffix, whose FIM prompt is the one an editor gets at that cursor: the
//! completion pipeline's plan), the OpenAI-compatible `POST /v1/completions` (with SSE streaming) and
//! `GET /v1/models`, and `GET /health`. Errors are JSON `{"error": {"message", "type"}}`
//! with a 4xx status for anything the client can fix.

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
    completion::pipeline::{CompletionSettings, Pipeline, Request as PipelineRequest, Trigger},
    document::Document,
    engine::Engine,
    engine::{
        Cancel, CancelOnDrop, CompletionRequest, FinishReason, ModelKey, Precision, SamplingParams, Tier,
    },
    prompt::Budget,
};

/// Prompt budget (tokens) for prompts built here from a prefix and suffix, unless the
/// request gives `max_prompt_tokens`; always within the sequence limit.
const DEFAULT_PROMPT_TOKENS: usize = 2048;

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

/// The FIM prompt for a prefix and suffix on the model `key`: the plan an editor's request
/// at that cursor gets ([`Pipeline::plan_once`]: the syntax context of the file, whose
/// language `path`'s extension names, inside the model's budget and in its prompt format),
/// within `max_prompt_tokens` (default [`DEFAULT_PROMPT_TOKENS`]) and the sequence limit.
fn fim_prompt(
    d: &Daemon,
    key: ModelKey,
    prefix: &str,
    suffix: &str,
    path: &str,
    max_tokens: usize,
    max_prompt_tokens: Option<usize>,
) -> Result<String, HttpError> {
    let room = d
        .config()
        .limits
        .max_seq_len
        .saturating_sub(max_tokens)
        .saturating_sub(16); // the FIM markers
    let settings = CompletionSettings {
        budget: Budget {
            max_tokens: max_prompt_tokens.unwrap_or(DEFAULT_PROMPT_TOKENS).min(room),
            ..Budget::default()
        },
        ..CompletionSettings::default()
    };
    let text = format!("{prefix}{suffix}");
    let doc = Document::for_path(&text, path).snapshot(path);
    let pool: Arc<dyn Engine> = d.pool().map_err(DaemonError::Engine)?;
    let plan = Pipeline::new(pool)
        .plan_once(
            &PipelineRequest {
                doc: &doc,
                others: &[],
                cursor: prefix.len(),
                trigger: Trigger::Invoked,
                settings: &settings,
                workspace_root: None,
                workspace: None,
            },
            Some(key),
        )
        .map_err(DaemonError::Engine)?;
    Ok(plan.request.prompt)
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
    let max_tokens = b
        .max_tokens
        .unwrap_or(d.config().defaults.max_tokens.min(d.config().limits.max_tokens));
    let key = model_key(&d, b.model)?;
    let prompt = match (b.prompt, b.prefix) {
        (Some(prompt), None) if b.suffix.is_none() => prompt,
        (None, Some(prefix)) => fim_prompt(
            &d,
            key,
            &prefix,
            b.suffix.as_deref().unwrap_or(""),
            &b.path,
            max_tokens,
            b.max_prompt_tokens,
        )?,
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
    let req = CompletionRequest {
        model: Some(key),
        n: b.n.unwrap_or(1),
        sampling: sampling(&d, b.temperature, b.top_p, None, b.seed),
        stop: b.stop.map(OneOrMany::into_vec).unwrap_or_default(),
        ..CompletionRequest::new(prompt, max_tokens)
    };
    let served = d
        .complete(&client_of(&headers, peer), req, Cancel::new(), None)
        .await?;
    let (timing, load_time_ms) = timing_json(&served);
    let out = &served.output;
    let key = out.served_by.unwrap_or(d.config().pool.default);
    Ok(Json(json!({
        "text": out.choices.first().map(|c| c.text.as_str()).unwrap_or(""),
        "choices": out.choices.iter().map(|c| json!({
            "text": c.text,
            "finish_reason": finish_reason_name(c.finish_reason),
            "tokens": c.tokens,
        })).collect::<Vec<_>>(),
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
        Some(suffix) => fim_prompt(&d, key, &text, suffix, "", max_tokens, b.max_prompt_tokens)?,
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
