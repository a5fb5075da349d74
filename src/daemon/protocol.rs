//! The socket protocol between `laya lsp` (or any local tool) and `laya serve`.
//!
//! One connection per request, JSON lines. The client writes one [`ClientMessage`] line:
//!
//! ```text
//! {"op":"status"}
//! {"op":"complete","client":"lsp 4242","stream":false,"request":{"prompt":"…","max_tokens":48,…}}
//! ```
//!
//! and reads [`ServerMessage`] lines: for `status` one `{"type":"status",…}`; for `complete`
//! zero or more `{"type":"piece","index":0,"text":"…"}` (only with `"stream":true`), then one
//! `{"type":"done","output":{…}}` or `{"type":"error","error":{"message":…,"kind":…}}`, and
//! the daemon closes the connection. Closing the connection (or its write half) before the
//! answer cancels the request: the daemon reads the connection while the request waits and
//! runs, so it notices at once; queued, the request leaves the queue; running, generation
//! stops before the next prompt chunk or decode step.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::engine::{
    Choice, CompletionOutput, CompletionRequest, EngineError, FinishReason, LineEnd, ModelFacts, ModelKey,
    SamplingParams, Timing, WorkStats,
};

/// Bumped when a message changes incompatibly.
pub const PROTOCOL_VERSION: u32 = 1;

/// Longest request line the daemon reads (a prompt is a few hundred KiB at most).
pub const MAX_LINE_BYTES: usize = 8 << 20;

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ClientMessage {
    /// The daemon's state: its models, their load state, its addresses.
    Status,
    Complete {
        /// Who asks, for fair queueing (requests are taken round-robin across clients).
        /// Default: the connecting process id.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        client: Option<String>,
        /// Send text pieces as they are decoded.
        #[serde(default)]
        stream: bool,
        request: WireRequest,
    },
}

/// [`CompletionRequest`] on the wire.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WireRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelKey>,
    pub prompt: String,
    pub max_tokens: usize,
    #[serde(default = "one")]
    pub n: usize,
    #[serde(default)]
    pub temperature: f32,
    #[serde(default = "one_f32")]
    pub top_p: f32,
    #[serde(default)]
    pub top_k: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    #[serde(default)]
    pub stop: Vec<String>,
    #[serde(default, skip_serializing_if = "LineEnd::is_none")]
    pub lines: LineEnd,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub branch_first: bool,
}

fn one() -> usize {
    1
}

fn one_f32() -> f32 {
    1.0
}

impl From<&CompletionRequest> for WireRequest {
    fn from(r: &CompletionRequest) -> Self {
        WireRequest {
            model: r.model,
            prompt: r.prompt.clone(),
            max_tokens: r.max_tokens,
            n: r.n,
            temperature: r.sampling.temperature,
            top_p: r.sampling.top_p,
            top_k: r.sampling.top_k,
            seed: r.sampling.seed,
            stop: r.stop.clone(),
            lines: r.lines.clone(),
            branch_first: r.branch_first,
        }
    }
}

impl From<WireRequest> for CompletionRequest {
    fn from(w: WireRequest) -> Self {
        CompletionRequest {
            model: w.model,
            n: w.n,
            sampling: SamplingParams {
                temperature: w.temperature,
                top_p: w.top_p,
                top_k: w.top_k,
                seed: w.seed,
            },
            stop: w.stop,
            lines: w.lines,
            branch_first: w.branch_first,
            ..CompletionRequest::new(w.prompt, w.max_tokens)
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ServerMessage {
    Status { status: DaemonStatus },
    Piece { index: usize, text: String },
    Done { output: WireOutput },
    Error { error: WireError },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WireError {
    pub message: String,
    pub kind: ErrorKind,
}

/// What kind of error a request met, by what its sender can do about it: the OpenAI-style
/// error type, on the socket and in HTTP bodies (`"type"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The request cannot run as sent.
    InvalidRequestError,
    /// The queue is full: try again later.
    RateLimitError,
    /// No model can answer it now.
    ModelUnavailable,
    /// It was given up before its answer.
    Cancelled,
    /// A model server elsewhere failed.
    ServerError,
    /// A kind this version does not know (a newer daemon's).
    #[serde(other)]
    Unknown,
}

impl ErrorKind {
    /// The name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidRequestError => "invalid_request_error",
            ErrorKind::RateLimitError => "rate_limit_error",
            ErrorKind::ModelUnavailable => "model_unavailable",
            ErrorKind::Cancelled => "cancelled",
            ErrorKind::ServerError => "server_error",
            ErrorKind::Unknown => "unknown",
        }
    }
}

impl WireError {
    /// The engine error a client of the daemon sees: the kind the daemon gave it
    /// ([`DaemonError::kind`](super::server::DaemonError::kind)), the daemon's message.
    pub fn into_engine_error(self) -> EngineError {
        let message = format!("laya daemon: {}", self.message);
        match self.kind {
            ErrorKind::InvalidRequestError => EngineError::BadRequest(message),
            ErrorKind::ModelUnavailable | ErrorKind::RateLimitError => EngineError::Unavailable(message),
            ErrorKind::Cancelled => EngineError::Cancelled,
            ErrorKind::ServerError | ErrorKind::Unknown => EngineError::Transport(message),
        }
    }
}

/// [`CompletionOutput`] on the wire, plus where the time went before the engine.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WireOutput {
    pub served_by: Option<ModelKey>,
    pub choices: Vec<WireChoice>,
    pub timing: WireTiming,
    /// The serving model's load time (apart from the request's own time).
    #[serde(default)]
    pub load_time_ms: Option<f64>,
    /// The model the request asked for, when another answered because it was still loading.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stand_in_for: Option<ModelKey>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WireChoice {
    pub text: String,
    /// `stop`, `length`, `stop_token` or `cancelled`.
    pub finish_reason: String,
    pub tokens: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprob: Option<f32>,
}

/// [`Timing`] in milliseconds, with the time spent waiting in the daemon's queue.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct WireTiming {
    pub prompt_tokens: usize,
    pub reused_tokens: usize,
    pub prefilled_tokens: usize,
    pub generated_tokens: usize,
    /// Forwards after the prompt's (fewer than the tokens when drafts are accepted).
    #[serde(default)]
    pub decode_forwards: usize,
    pub queue_ms: f64,
    pub prefill_ms: f64,
    pub decode_ms: f64,
    /// Of `decode_ms`: building and queueing the forwards, and waiting for their tokens.
    #[serde(default)]
    pub decode_build_ms: f64,
    #[serde(default)]
    pub decode_wait_ms: f64,
    pub first_token_ms: f64,
    pub total_ms: f64,
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn from_ms(ms: f64) -> Duration {
    Duration::from_secs_f64((ms / 1e3).max(0.0))
}

pub fn finish_reason_name(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::Cancelled => "cancelled",
        FinishReason::StopToken => "stop_token",
    }
}

fn finish_reason_from(s: &str) -> FinishReason {
    match s {
        "length" => FinishReason::Length,
        "cancelled" => FinishReason::Cancelled,
        "stop_token" => FinishReason::StopToken,
        _ => FinishReason::Stop,
    }
}

impl WireTiming {
    pub fn new(t: &Timing, queued: Duration) -> Self {
        WireTiming {
            prompt_tokens: t.prompt_tokens,
            reused_tokens: t.reused_tokens,
            prefilled_tokens: t.prefilled_tokens,
            generated_tokens: t.generated_tokens,
            decode_forwards: t.decode_forwards,
            queue_ms: ms(queued),
            prefill_ms: ms(t.prefill),
            decode_ms: ms(t.decode),
            decode_build_ms: ms(t.decode_build),
            decode_wait_ms: ms(t.decode_wait),
            first_token_ms: ms(t.first_token),
            total_ms: ms(t.total),
        }
    }
}

impl WireOutput {
    pub fn new(out: &CompletionOutput, queued: Duration, load_time: Option<Duration>) -> Self {
        WireOutput {
            served_by: out.served_by,
            choices: out
                .choices
                .iter()
                .map(|c| WireChoice {
                    text: c.text.clone(),
                    finish_reason: finish_reason_name(c.finish_reason).into(),
                    tokens: c.tokens,
                    logprob: c.logprob,
                })
                .collect(),
            timing: WireTiming::new(&out.timing, queued),
            load_time_ms: load_time.map(ms),
            stand_in_for: None,
        }
    }

    /// Back to engine terms; the queue wait counts into the first-token and total times, as
    /// the caller experienced them.
    pub fn into_output(self) -> CompletionOutput {
        let t = &self.timing;
        CompletionOutput {
            served_by: self.served_by,
            choices: self
                .choices
                .into_iter()
                .map(|c| Choice {
                    finish_reason: finish_reason_from(&c.finish_reason),
                    text: c.text,
                    tokens: c.tokens,
                    logprob: c.logprob,
                })
                .collect(),
            timing: Timing {
                prompt_tokens: t.prompt_tokens,
                reused_tokens: t.reused_tokens,
                prefilled_tokens: t.prefilled_tokens,
                generated_tokens: t.generated_tokens,
                decode_forwards: t.decode_forwards,
                prefill: from_ms(t.prefill_ms),
                decode: from_ms(t.decode_ms),
                decode_build: from_ms(t.decode_build_ms),
                decode_wait: from_ms(t.decode_wait_ms),
                first_token: from_ms(t.queue_ms + t.first_token_ms),
                total: from_ms(t.queue_ms + t.total_ms),
            },
        }
    }
}

/// What `status` and `GET /health` report.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DaemonStatus {
    /// `ok` (the default model is ready), `loading`, or `failed`.
    pub status: String,
    pub version: String,
    pub protocol: u32,
    pub pid: u32,
    pub uptime_s: f64,
    pub socket: String,
    /// `127.0.0.1:7723`, when HTTP is served.
    pub http: Option<String>,
    /// The key of requests that name no model (`small/q8`).
    pub default: String,
    pub models: Vec<ModelStatus>,
    /// What the daemon's pool says of the model a request for each key would go to (`small/q8`:
    /// every configured tier at every bit width), before a request goes to it: what `laya lsp`'s
    /// router and prompt budget weigh ([`Engine::facts`](crate::engine::Engine::facts)). Empty
    /// until the pool is made.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub model_facts: std::collections::BTreeMap<String, ModelFacts>,
    pub queue: QueueStatus,
    /// Requests whose client went away before their answer (connection closed, HTTP client
    /// gone, stream dropped): each had its cancel flag set when the daemon noticed.
    #[serde(default)]
    pub abandoned: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ModelStatus {
    /// `small/q8`; for a tier not loaded yet, the tier alone.
    pub id: String,
    pub tier: String,
    /// `q8`…; absent for a tier not loaded yet.
    pub precision: Option<String>,
    /// The model's name (catalog name, file name, or the remote URL).
    pub name: String,
    /// `local` or `remote`.
    pub source: String,
    /// `not_loaded`, `loading`, `ready` or `failed`.
    pub state: String,
    /// Reading (and converting) the weights, on this start; once ready.
    pub load_time_ms: Option<f64>,
    /// From the start of the model's load to ready (the load and the warm-up), on this
    /// start; once ready.
    #[serde(default)]
    pub time_to_ready_ms: Option<f64>,
    /// Whether the weights came from the converted-weights cache on this start; once ready.
    #[serde(default)]
    pub from_cache: Option<bool>,
    /// Parameter count of a loaded model, where known (prompts are shaped by it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<u64>,
    pub device: Option<String>,
    /// What the router weighs before sending this model a request (size, bits, where it runs);
    /// for a tier not loaded yet, read from its file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub facts: Option<ModelFacts>,
    /// Loaded and run at least once (the worker runs a short request after loading; a
    /// remote model is warm once it answered).
    pub warm: bool,
    /// Requests answered.
    pub served: u64,
    pub error: Option<String>,
    /// What a local model's worker has run: busy now, requests ended and cancelled, prompt
    /// chunks and tokens, decode steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work: Option<WorkStats>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct QueueStatus {
    pub running: usize,
    pub waiting: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Precision, Tier};

    #[test]
    fn messages_round_trip_as_one_json_line() {
        let msg = ClientMessage::Complete {
            client: None,
            stream: true,
            request: WireRequest {
                model: Some(ModelKey {
                    tier: Tier::Small,
                    precision: Precision::Q4,
                }),
                prompt: "a\nb".into(),
                max_tokens: 4,
                n: 1,
                temperature: 0.0,
                top_p: 1.0,
                top_k: 0,
                seed: None,
                stop: vec!["\n".into()],
                lines: LineEnd {
                    dedent_below: Some(4),
                    repeats: "return x".into(),
                    max_lines: Some(6),
                },
                branch_first: true,
            },
        };
        let line = serde_json::to_string(&msg).unwrap();
        assert!(!line.contains('\n'));
        assert!(
            line.starts_with(
                r#"{"op":"complete","stream":true,"request":{"model":{"tier":"small","precision":"q4"}"#
            ),
            "{line}"
        );
        let back: ClientMessage = serde_json::from_str(&line).unwrap();
        let ClientMessage::Complete {
            stream: true,
            request,
            ..
        } = back
        else {
            panic!("{back:?}")
        };
        let request = CompletionRequest::from(request);
        assert!(request.branch_first);
        assert_eq!(
            (
                request.lines.dedent_below,
                request.lines.repeats.as_str(),
                request.lines.max_lines
            ),
            (Some(4), "return x", Some(6))
        );
        // Defaults for what a hand-written client leaves out.
        let min: ClientMessage =
            serde_json::from_str(r#"{"op":"complete","request":{"prompt":"x","max_tokens":2}}"#).unwrap();
        let ClientMessage::Complete { request, stream, .. } = min else {
            panic!()
        };
        assert_eq!((request.n, request.top_p, stream), (1, 1.0, false));
        assert!(!request.branch_first);
        // A field this daemon no longer reads (an older client's `start`) is ignored.
        let old: ClientMessage = serde_json::from_str(
            r#"{"op":"complete","request":{"prompt":"x","max_tokens":2,"start":"    "}}"#,
        )
        .unwrap();
        let ClientMessage::Complete { request, .. } = old else {
            panic!()
        };
        assert_eq!((request.prompt.as_str(), request.max_tokens), ("x", 2));
    }

    /// Each kind of daemon error reaches a client as the engine error of the same meaning;
    /// a kind this version does not know is the transport's.
    #[test]
    fn error_kinds_map_to_engine_errors_by_kind() {
        let error = |kind: &str| -> EngineError {
            let line = format!(r#"{{"type":"error","error":{{"message":"m","kind":"{kind}"}}}}"#);
            match serde_json::from_str::<ServerMessage>(&line).unwrap() {
                ServerMessage::Error { error } => error.into_engine_error(),
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(
            error("invalid_request_error"),
            EngineError::BadRequest("laya daemon: m".into())
        );
        assert_eq!(
            error("rate_limit_error"),
            EngineError::Unavailable("laya daemon: m".into())
        );
        assert_eq!(
            error("model_unavailable"),
            EngineError::Unavailable("laya daemon: m".into())
        );
        assert_eq!(error("cancelled"), EngineError::Cancelled);
        assert_eq!(
            error("server_error"),
            EngineError::Transport("laya daemon: m".into())
        );
        assert_eq!(
            error("from_a_newer_daemon"),
            EngineError::Transport("laya daemon: m".into())
        );
        for kind in [
            ErrorKind::InvalidRequestError,
            ErrorKind::RateLimitError,
            ErrorKind::ModelUnavailable,
            ErrorKind::Cancelled,
            ErrorKind::ServerError,
        ] {
            let json = serde_json::to_value(kind).unwrap();
            assert_eq!(json, kind.as_str(), "the wire name is the HTTP body's type");
        }
    }

    #[test]
    fn output_keeps_texts_reasons_and_adds_the_queue_wait() {
        let w = WireOutput {
            served_by: None,
            choices: vec![WireChoice {
                text: "x".into(),
                finish_reason: "length".into(),
                tokens: 3,
                logprob: Some(-1.5),
            }],
            timing: WireTiming {
                queue_ms: 10.0,
                first_token_ms: 5.0,
                total_ms: 20.0,
                ..Default::default()
            },
            load_time_ms: None,
            stand_in_for: None,
        };
        let out = w.into_output();
        assert_eq!(out.choices[0].finish_reason, FinishReason::Length);
        assert_eq!(out.choices[0].logprob, Some(-1.5));
        assert_eq!(out.timing.first_token, Duration::from_millis(15));
        assert_eq!(out.timing.total, Duration::from_millis(30));
    }
}
