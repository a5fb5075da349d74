//! A model served by another program that speaks the OpenAI completions API (vLLM, llama.cpp's
//! server, laya's own daemon): the same [`Engine`] as a local model, for a tier that does not
//! fit on this machine. Requests carry the prompt exactly as built (special tokens as text), so
//! the server must parse special tokens in prompts, as vLLM and llama.cpp do.
//!
//! A cancelled request closes its connection: the completion is posted over a connection of
//! its own (`post_plain`, `http://` servers), whose reads wait at most `CANCEL_POLL`
//! before the cancel flag is read again, and the engine's future sets the flag when it is
//! dropped. A server sees its client gone and stops generating (llama.cpp's server and vLLM
//! do). An `https://` server is reached through ureq, whose call cannot be interrupted: there
//! the lane is freed at once but the server's request runs on.

use std::{
    io::{Read, Write},
    net::{Shutdown, TcpStream, ToSocketAddrs},
    sync::{Arc, OnceLock},
    time::{Duration, Instant},
};

use serde::Deserialize;
use serde_json::json;

use crate::{
    cancel::Cancel,
    family::Family,
    seam::{
        send_whole, Choice, CompletionOutput, CompletionRequest, Engine, EngineError, FinishReason,
        ModelFacts, ModelKey, ModelState, ParseError, PieceSender, RunsOn, Timing,
    },
};

/// Where the remote server is and how to talk to it.
#[derive(Clone, Debug)]
pub struct RemoteConfig {
    /// Base URL of the API, e.g. `http://127.0.0.1:8080/v1`; `/completions` is appended.
    pub url: String,
    /// The `model` field; when `None`, the first model `GET {url}/models` lists.
    pub model: Option<String>,
    /// Sent as `Authorization: Bearer …` when set.
    pub api_key: Option<String>,
    /// Whole-request limit.
    pub timeout: Duration,
    /// Server-specific fields added to every completions request, e.g.
    /// `{"repeat_penalty": 1.0}` for llama-cpp-python's server, whose default (1.1) is not the
    /// plain greedy sampling the other servers and laya's own engine use. The fields laya sets
    /// itself (model, prompt, sampling, n, stop, stream) take precedence.
    pub extra_body: serde_json::Map<String, serde_json::Value>,
}

impl RemoteConfig {
    pub fn new(url: impl Into<String>) -> Self {
        RemoteConfig {
            url: url.into().trim_end_matches('/').to_owned(),
            model: None,
            api_key: None,
            timeout: Duration::from_secs(30),
            extra_body: serde_json::Map::new(),
        }
    }

    /// Parses `--remote-extra`: a JSON object, or a message saying what is wrong with it.
    pub fn parse_extra_body(text: &str) -> Result<serde_json::Map<String, serde_json::Value>, ParseError> {
        match serde_json::from_str::<serde_json::Value>(text) {
            Ok(serde_json::Value::Object(m)) => Ok(m),
            Ok(other) => Err(ParseError(format!(
                "expected a JSON object such as {{\"repeat_penalty\": 1.0}}, got {other}"
            ))),
            Err(e) => Err(ParseError(format!("not JSON: {e}"))),
        }
    }
}

/// Cheap to clone: clones share the connection pool and the resolved model name.
#[derive(Clone)]
pub struct RemoteEngine {
    config: RemoteConfig,
    agent: ureq::Agent,
    model: Arc<OnceLock<String>>,
    /// The model's parameter count, where `GET /models` states it (llama.cpp's `meta.n_params`).
    parameters: Arc<OnceLock<u64>>,
}

#[derive(Deserialize)]
struct CompletionsResponse {
    choices: Vec<RemoteChoice>,
    #[serde(default)]
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct RemoteChoice {
    #[serde(default)]
    index: usize,
    text: String,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    prompt_tokens: usize,
    #[serde(default)]
    completion_tokens: usize,
}

#[derive(Deserialize)]
struct ModelList {
    data: Vec<ModelEntry>,
}

#[derive(Deserialize)]
struct ModelEntry {
    id: String,
    #[serde(default)]
    meta: Option<ModelMeta>,
}

#[derive(Deserialize)]
struct ModelMeta {
    #[serde(default)]
    n_params: Option<u64>,
}

impl RemoteEngine {
    pub fn new(config: RemoteConfig) -> Self {
        let agent = ureq::AgentBuilder::new()
            .timeout(config.timeout)
            .timeout_connect(Duration::from_secs(5))
            .build();
        let model = Arc::new(OnceLock::new());
        if let Some(m) = &config.model {
            let _ = model.set(m.clone());
        }
        RemoteEngine {
            config,
            agent,
            model,
            parameters: Arc::new(OnceLock::new()),
        }
    }

    fn request(&self, method: &str, path: &str) -> ureq::Request {
        let r = self.agent.request(method, &format!("{}{path}", self.config.url));
        match &self.config.api_key {
            Some(k) => r.set("Authorization", &format!("Bearer {k}")),
            None => r,
        }
    }

    fn model_name(&self) -> Result<String, EngineError> {
        if let Some(m) = self.model.get() {
            return Ok(m.clone());
        }
        let list: ModelList = self
            .request("GET", "/models")
            .call()
            .map_err(|e| self.http_error("GET /models", e))?
            .into_json()
            .map_err(|e| self.error(format!("GET /models: unreadable answer: {e}")))?;
        let first = list
            .data
            .into_iter()
            .next()
            .ok_or_else(|| self.error("GET /models lists no model; pass the model name".into()))?;
        if let Some(n) = first.meta.and_then(|m| m.n_params).filter(|&n| n > 0) {
            let _ = self.parameters.set(n);
        }
        Ok(self.model.get_or_init(|| first.id).clone())
    }

    fn error(&self, msg: String) -> EngineError {
        EngineError::Transport(format!("remote {}: {msg}", self.config.url))
    }

    fn http_error(&self, what: &str, e: ureq::Error) -> EngineError {
        match e {
            ureq::Error::Status(code, resp) => {
                let body = resp.into_string().unwrap_or_default();
                let body: String = body.chars().take(300).collect();
                self.error(format!("{what}: HTTP {code}: {body}"))
            }
            ureq::Error::Transport(t) => self.error(format!("{what}: {t}")),
        }
    }

    /// `POST {url}/completions` with `body`: the status and the answer's body.
    fn post_completions(
        &self,
        body: &serde_json::Value,
        cancel: &Cancel,
    ) -> Result<(u16, String), EngineError> {
        let what = "POST /completions";
        if let Some(target) = PlainUrl::parse(&self.config.url) {
            let mut headers = vec![("Content-Type", "application/json".to_owned())];
            if let Some(k) = &self.config.api_key {
                headers.push(("Authorization", format!("Bearer {k}")));
            }
            let (status, bytes) = post_plain(
                &target,
                "/completions",
                &headers,
                body.to_string().as_bytes(),
                self.config.timeout,
                cancel,
            )
            .map_err(|e| match e {
                PlainError::Cancelled => EngineError::Cancelled,
                PlainError::Other(m) => self.error(format!("{what}: {m}")),
            })?;
            return Ok((status, String::from_utf8_lossy(&bytes).into_owned()));
        }
        match self.request("POST", "/completions").send_json(body.clone()) {
            Ok(r) => {
                let status = r.status();
                let text = r.into_string().map_err(|e| self.error(format!("{what}: {e}")))?;
                Ok((status, text))
            }
            Err(ureq::Error::Status(code, resp)) => Ok((code, resp.into_string().unwrap_or_default())),
            Err(e) => Err(self.http_error(what, e)),
        }
    }

    /// One blocking request; setting `cancel` closes its connection (see the module text).
    pub(crate) fn complete_blocking(
        &self,
        req: &CompletionRequest,
        cancel: &Cancel,
    ) -> Result<CompletionOutput, EngineError> {
        let start = Instant::now();
        if req.n == 0 {
            return Err(EngineError::BadRequest("n must be at least 1".into()));
        }
        let model = self.model_name()?;
        if cancel.is_cancelled() {
            return Err(EngineError::Cancelled);
        }
        // A server cannot start candidates from chosen tokens; greedy ones from the same
        // prompt would all be the same, so branching asks for one.
        let n = if req.branch_first { 1 } else { req.n };
        let mut body = serde_json::Value::Object(self.config.extra_body.clone());
        for (k, v) in [
            ("model", json!(model)),
            ("prompt", json!(req.prompt)),
            ("max_tokens", json!(req.max_tokens)),
            ("temperature", json!(req.sampling.temperature.max(0.0))),
            ("top_p", json!(req.sampling.top_p)),
            ("n", json!(n)),
            ("stream", json!(false)),
        ] {
            body[k] = v;
        }
        if !req.stop.is_empty() {
            body["stop"] = json!(req.stop);
        }
        if req.sampling.top_k > 0 {
            body["top_k"] = json!(req.sampling.top_k);
        }
        if let Some(seed) = req.sampling.seed {
            body["seed"] = json!(seed);
        }
        let (status, text) = self.post_completions(&body, cancel)?;
        if !(200..300).contains(&status) {
            let text: String = text.chars().take(300).collect();
            return Err(self.error(format!("POST /completions: HTTP {status}: {text}")));
        }
        let resp: CompletionsResponse = serde_json::from_str(&text)
            .map_err(|e| self.error(format!("POST /completions: unreadable answer: {e}")))?;
        let mut choices: Vec<(usize, Choice)> = resp
            .choices
            .into_iter()
            .map(|c| {
                let finish_reason = match c.finish_reason.as_deref() {
                    Some("length") => FinishReason::Length,
                    _ => FinishReason::Stop,
                };
                (
                    c.index,
                    Choice {
                        text: c.text,
                        finish_reason,
                        tokens: 0,
                        logprob: None,
                    },
                )
            })
            .collect();
        choices.sort_by_key(|(i, _)| *i);
        let total = start.elapsed();
        let (prompt_tokens, generated_tokens) = resp
            .usage
            .map(|u| (u.prompt_tokens, u.completion_tokens))
            .unwrap_or_default();
        Ok(CompletionOutput {
            served_by: None,
            choices: choices.into_iter().map(|(_, c)| c).collect(),
            timing: Timing {
                prompt_tokens,
                prefilled_tokens: prompt_tokens,
                generated_tokens,
                first_token: total,
                total,
                ..Timing::default()
            },
        })
    }
}

#[async_trait::async_trait]
impl Engine for RemoteEngine {
    async fn complete(
        &self,
        req: CompletionRequest,
        cancel: Cancel,
        pieces: Option<PieceSender>,
    ) -> Result<CompletionOutput, EngineError> {
        // Dropped (the client gave up, a newer request won): the blocking call sees the flag
        // and closes its connection.
        let mut guard = cancel.guard();
        let this = self.clone();
        let out = tokio::task::spawn_blocking(move || this.complete_blocking(&req, &cancel))
            .await
            .map_err(|e| EngineError::Unavailable(format!("remote request task failed: {e}")))?;
        guard.disarm();
        let out = out?;
        send_whole(&out, pieces.as_ref());
        Ok(out)
    }

    fn state(&self) -> ModelState {
        ModelState::ready_on(format!("remote {}", self.config.url))
    }

    /// The bits asked for (the server's own are not stated) and the parameter count, known
    /// once the model list was read (no `--remote-model`) and the server states it; never a
    /// speed estimate (`RunsOn::Remote`), nor a family (the default).
    fn facts(&self, model: ModelKey) -> Option<ModelFacts> {
        Some(ModelFacts {
            parameters: self.parameters.get().copied(),
            active_parameters: None,
            bits: model.precision.bits().map_or(16, |b| b as u32),
            runs_on: RunsOn::Remote,
            family: Family::default(),
        })
    }
}

/// How long a read of a remote answer waits before the cancel flag is read again.
pub(crate) const CANCEL_POLL: Duration = Duration::from_millis(10);

/// An `http://host[:port][/base]` URL, split for [`post_plain`]; `None` for anything else
/// (`https://`, user info), which goes through ureq.
#[derive(Debug, PartialEq)]
struct PlainUrl {
    /// `host:port` as written (the `Host` header).
    authority: String,
    /// Where to connect: the authority, with port 80 when it names none.
    address: String,
    /// The path before the endpoint's (`/v1`), without a trailing slash.
    base: String,
}

impl PlainUrl {
    fn parse(url: &str) -> Option<PlainUrl> {
        let rest = url.strip_prefix("http://")?;
        let (authority, base) = match rest.find(['/', '?', '#']) {
            Some(i) if rest[i..].starts_with('/') && !rest[i..].contains(['?', '#']) => {
                (&rest[..i], rest[i..].trim_end_matches('/'))
            }
            Some(_) => return None,
            None => (rest, ""),
        };
        if authority.is_empty() || authority.contains('@') {
            return None;
        }
        let has_port = authority
            .rsplit_once(':')
            .is_some_and(|(h, p)| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && !h.is_empty());
        let address = if has_port && !authority.ends_with(']') {
            authority.to_owned()
        } else {
            format!("{authority}:80")
        };
        Some(PlainUrl {
            authority: authority.to_owned(),
            address,
            base: base.to_owned(),
        })
    }
}

#[derive(Debug, PartialEq)]
enum PlainError {
    Cancelled,
    Other(String),
}

/// One `POST` over a connection of its own (`Connection: close`): the status and the body
/// (by `Content-Length`, chunked, or to the end). Reads wait at most [`CANCEL_POLL`]; once
/// `cancel` is set the connection is shut down and [`PlainError::Cancelled`] returned.
fn post_plain(
    url: &PlainUrl,
    path: &str,
    headers: &[(&str, String)],
    body: &[u8],
    timeout: Duration,
    cancel: &Cancel,
) -> Result<(u16, Vec<u8>), PlainError> {
    let other = |e: std::io::Error| PlainError::Other(e.to_string());
    let deadline = Instant::now() + timeout;
    let addrs = url.address.to_socket_addrs().map_err(other)?;
    let mut last = None;
    let mut stream = None;
    for a in addrs {
        match TcpStream::connect_timeout(&a, Duration::from_secs(5).min(timeout)) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let mut stream = match (stream, last) {
        (Some(s), _) => s,
        (None, Some(e)) => return Err(other(e)),
        (None, None) => {
            return Err(PlainError::Other(format!(
                "{} resolves to no address",
                url.address
            )))
        }
    };
    let _ = stream.set_nodelay(true);
    stream.set_write_timeout(Some(timeout)).map_err(other)?;
    stream.set_read_timeout(Some(CANCEL_POLL)).map_err(other)?;
    let mut head = format!(
        "POST {}{path} HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\nConnection: close\r\nUser-Agent: laya\r\n",
        url.base,
        url.authority,
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).map_err(other)?;
    stream.write_all(body).map_err(other)?;
    let mut buf = vec![];
    let mut chunk = [0u8; 16 << 10];
    loop {
        if cancel.is_cancelled() {
            let _ = stream.shutdown(Shutdown::Both);
            return Err(PlainError::Cancelled);
        }
        if let Some(answer) = parse_answer(&buf, false)? {
            return Ok(answer);
        }
        if Instant::now() > deadline {
            return Err(PlainError::Other(format!(
                "no answer within {} s",
                timeout.as_secs_f64()
            )));
        }
        match stream.read(&mut chunk) {
            Ok(0) => {
                return parse_answer(&buf, true)?
                    .ok_or_else(|| PlainError::Other("the server closed the connection mid-answer".into()))
            }
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(other(e)),
        }
    }
}

/// The status and body of a whole HTTP/1.1 answer in `buf`; `None` while part of it is still
/// to come (`eof`: nothing more will).
fn parse_answer(buf: &[u8], eof: bool) -> Result<Option<(u16, Vec<u8>)>, PlainError> {
    let bad = |m: &str| PlainError::Other(format!("unreadable answer: {m}"));
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return if eof { Err(bad("no header")) } else { Ok(None) };
    };
    let head = std::str::from_utf8(&buf[..end]).map_err(|_| bad("header not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| bad("no status line"))?;
    if (100..200).contains(&status) {
        // An interim answer (100 Continue): the real one follows it.
        return parse_answer(&buf[end + 4..], eof);
    }
    let (mut length, mut chunked) = (None, false);
    for line in lines {
        if let Some((k, v)) = line.split_once(':') {
            let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
            if k == "content-length" {
                length = Some(v.parse::<usize>().map_err(|_| bad("Content-Length"))?);
            } else if k == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked") {
                chunked = true;
            }
        }
    }
    let body = &buf[end + 4..];
    if chunked {
        return match dechunk(body) {
            Some(b) => Ok(Some((status, b))),
            None if eof => Err(bad("chunked body cut short")),
            None => Ok(None),
        };
    }
    match length {
        Some(n) if body.len() >= n => Ok(Some((status, body[..n].to_vec()))),
        Some(_) if eof => Err(bad("body shorter than its Content-Length")),
        Some(_) => Ok(None),
        None if eof => Ok(Some((status, body.to_vec()))),
        None => Ok(None),
    }
}

/// A whole chunked body decoded; `None` while its last chunk has not come.
fn dechunk(mut b: &[u8]) -> Option<Vec<u8>> {
    let mut out = vec![];
    loop {
        let line_end = b.windows(2).position(|w| w == b"\r\n")?;
        let size = std::str::from_utf8(&b[..line_end]).ok()?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        b = &b[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        if b.len() < size + 2 {
            return None;
        }
        out.extend_from_slice(&b[..size]);
        b = &b[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpListener;

    const KEY: ModelKey = ModelKey {
        tier: crate::seam::Tier::Large,
        precision: crate::seam::Precision::Native,
    };

    /// A one-shot HTTP server that answers each request with the next canned body and returns
    /// the requests it saw.
    fn serve(answers: Vec<(u16, String)>) -> (String, std::thread::JoinHandle<Vec<String>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/v1", listener.local_addr().unwrap());
        let handle = std::thread::spawn(move || {
            let mut seen = vec![];
            for (status, body) in answers {
                let (mut stream, _) = listener.accept().unwrap();
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                seen.push(read_request(&mut reader));
                write!(
                    stream,
                    "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
                .unwrap();
            }
            seen
        });
        (url, handle)
    }

    fn request() -> CompletionRequest {
        CompletionRequest {
            n: 2,
            stop: vec!["\n\n".into()],
            ..CompletionRequest::new("<|fim_prefix|>def f():<|fim_suffix|><|fim_middle|>", 8)
        }
    }

    #[test]
    fn asks_for_the_model_then_completes_in_choice_order() {
        let (url, server) = serve(vec![
            (200, r#"{"object":"list","data":[{"id":"coder"}]}"#.into()),
            (
                200,
                r#"{"choices":[{"index":1,"text":" b","finish_reason":"length"},{"index":0,"text":" a","finish_reason":"stop"}],"usage":{"prompt_tokens":7,"completion_tokens":3}}"#.into(),
            ),
        ]);
        let mut cfg = RemoteConfig::new(url);
        cfg.api_key = Some("sekret".into());
        cfg.extra_body = RemoteConfig::parse_extra_body(r#"{"repeat_penalty": 1.0, "n": 9}"#).unwrap();
        let engine = RemoteEngine::new(cfg);
        let out = engine.complete_blocking(&request(), &Cancel::new()).unwrap();
        let texts: Vec<_> = out.choices.iter().map(|c| c.text.as_str()).collect();
        assert_eq!(texts, [" a", " b"]);
        assert_eq!(out.choices[1].finish_reason, FinishReason::Length);
        assert_eq!((out.timing.prompt_tokens, out.timing.generated_tokens), (7, 3));
        let seen = server.join().unwrap();
        assert!(seen[0].starts_with("GET /v1/models"));
        assert!(seen[1].starts_with("POST /v1/completions"));
        assert!(
            seen[1].contains("authorization: Bearer sekret")
                || seen[1].contains("Authorization: Bearer sekret")
        );
        let body: serde_json::Value =
            serde_json::from_str(seen[1].split("\r\n\r\n").nth(1).unwrap()).unwrap();
        assert_eq!(body["model"], "coder");
        assert_eq!(body["n"], 2);
        assert_eq!(body["stop"], json!(["\n\n"]));
        assert_eq!(body["prompt"], request().prompt);
        // Extra fields travel; laya's own fields win over them.
        assert_eq!(body["repeat_penalty"], 1.0);
    }

    #[test]
    fn branching_asks_a_server_for_one_answer() {
        let (url, server) = serve(vec![
            (200, r#"{"object":"list","data":[{"id":"coder"}]}"#.into()),
            (
                200,
                r#"{"choices":[{"index":0,"text":" a","finish_reason":"stop"}]}"#.into(),
            ),
        ]);
        let engine = RemoteEngine::new(RemoteConfig::new(url));
        let mut req = request();
        req.n = 3;
        req.branch_first = true;
        let out = engine.complete_blocking(&req, &Cancel::new()).unwrap();
        assert_eq!(out.choices.len(), 1);
        assert_eq!(out.choices[0].logprob, None);
        let seen = server.join().unwrap();
        let body: serde_json::Value =
            serde_json::from_str(seen[1].split("\r\n\r\n").nth(1).unwrap()).unwrap();
        assert_eq!(body["n"], 1);
    }

    /// llama.cpp's server states the model's size in its model list; other servers do not.
    #[test]
    fn the_model_size_comes_from_the_model_list_where_stated() {
        let answer = r#"{"choices":[{"index":0,"text":"x","finish_reason":"stop"}]}"#;
        let (url, server) = serve(vec![
            (
                200,
                r#"{"object":"list","data":[{"id":"q","meta":{"n_vocab":151936,"n_params":494032768}}]}"#
                    .into(),
            ),
            (200, answer.into()),
        ]);
        let engine = RemoteEngine::new(RemoteConfig::new(url));
        assert_eq!(
            engine.facts(KEY).and_then(|f| f.parameters),
            None,
            "unknown before the list is read"
        );
        engine.complete_blocking(&request(), &Cancel::new()).unwrap();
        assert_eq!(engine.facts(KEY).and_then(|f| f.parameters), Some(494_032_768));
        server.join().unwrap();

        let (url, server) = serve(vec![
            (200, r#"{"data":[{"id":"vllm-model"}]}"#.into()),
            (200, answer.into()),
        ]);
        let engine = RemoteEngine::new(RemoteConfig::new(url));
        engine.complete_blocking(&request(), &Cancel::new()).unwrap();
        assert_eq!(engine.facts(KEY).and_then(|f| f.parameters), None);
        server.join().unwrap();
    }

    #[test]
    fn plain_urls_are_split_and_others_go_through_ureq() {
        let p = |u: &str| PlainUrl::parse(u).map(|p| (p.authority, p.address, p.base));
        let own = |a: &str, b: &str, c: &str| Some((a.to_owned(), b.to_owned(), c.to_owned()));
        assert_eq!(
            p("http://127.0.0.1:8080/v1"),
            own("127.0.0.1:8080", "127.0.0.1:8080", "/v1")
        );
        assert_eq!(p("http://gpu-box/v1/"), own("gpu-box", "gpu-box:80", "/v1"));
        assert_eq!(p("http://[::1]:9000"), own("[::1]:9000", "[::1]:9000", ""));
        assert_eq!(p("http://[::1]/x"), own("[::1]", "[::1]:80", "/x"));
        for other in [
            "https://api.example/v1",
            "http://user:pw@host/v1",
            "http://host/v1?x=1",
            "http://",
        ] {
            assert_eq!(p(other), None, "{other}");
        }
    }

    #[test]
    fn answers_are_read_by_length_chunked_or_to_the_end() {
        let done = |b: &str, eof| parse_answer(b.as_bytes(), eof).unwrap();
        let body = |b: &str, eof| done(b, eof).map(|(s, b)| (s, String::from_utf8(b).unwrap()));
        assert_eq!(
            body("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi", false),
            Some((200, "hi".into()))
        );
        assert_eq!(
            done("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhi", false),
            None
        );
        assert!(parse_answer(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhi", true).is_err());
        let chunked =
            "HTTP/1.1 500 X\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n";
        assert_eq!(body(chunked, false), Some((500, "abcde".into())));
        assert_eq!(done(&chunked[..chunked.len() - 7], false), None);
        assert_eq!(
            body("HTTP/1.0 200 OK\r\n\r\nall", true),
            Some((200, "all".into()))
        );
        assert_eq!(done("HTTP/1.0 200 OK\r\n\r\nall", false), None);
        assert_eq!(
            body(
                "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 C\r\nContent-Length: 0\r\n\r\n",
                false
            ),
            Some((201, String::new()))
        );
        assert_eq!(done("HTTP/1.1 200", false), None);
    }

    #[test]
    fn a_chunked_answer_completes() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/v1", listener.local_addr().unwrap());
        let server = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            read_request(&mut reader);
            let body = r#"{"choices":[{"index":0,"text":" ok","finish_reason":"stop"}]}"#;
            let (a, b) = body.split_at(10);
            let mut w = stream;
            write!(
                w,
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n",
                a.len(),
                b.len()
            )
            .unwrap();
            // Keep the connection open: the answer is whole without its end.
            std::thread::sleep(Duration::from_millis(500));
        });
        let mut cfg = RemoteConfig::new(url);
        cfg.model = Some("m".into());
        let out = RemoteEngine::new(cfg)
            .complete_blocking(&request(), &Cancel::new())
            .unwrap();
        assert_eq!(out.choices[0].text, " ok");
        server.join().unwrap();
    }

    /// Reads one request (head and `Content-Length` body) from `reader`.
    fn read_request(reader: &mut impl BufRead) -> String {
        let mut head = String::new();
        let mut len = 0;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap();
            }
            head.push_str(&line);
            if line == "\r\n" {
                break;
            }
        }
        let mut buf = vec![0; len];
        reader.read_exact(&mut buf).unwrap();
        head + &String::from_utf8(buf).unwrap()
    }

    /// A server that reads one completion request and never answers; it reports whether the
    /// client closed the connection within 10 s.
    fn silent_server() -> (String, std::thread::JoinHandle<bool>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/v1", listener.local_addr().unwrap());
        let handle = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut reader = BufReader::new(stream);
            read_request(&mut reader);
            let mut rest = [0u8; 64];
            // End of input (or a reset) is the client gone; a timeout is a client that stayed.
            match reader.read(&mut rest) {
                Ok(n) => n == 0,
                Err(e) => !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ),
            }
        });
        (url, handle)
    }

    fn silent_engine(url: String) -> RemoteEngine {
        let mut cfg = RemoteConfig::new(url);
        cfg.model = Some("m".into());
        RemoteEngine::new(cfg)
    }

    #[test]
    fn a_cancelled_request_closes_its_connection_so_the_server_can_stop() {
        let (url, server) = silent_server();
        let engine = silent_engine(url);
        let cancel = Cancel::new();
        let setter = {
            let cancel = cancel.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                cancel.cancel();
            })
        };
        let err = engine.complete_blocking(&request(), &cancel).unwrap_err();
        assert!(err.to_string().contains("cancelled"), "{err}");
        setter.join().unwrap();
        assert!(
            server.join().unwrap(),
            "the server saw its client close the connection"
        );
    }

    #[tokio::test]
    async fn a_dropped_request_closes_its_connection() {
        let (url, server) = silent_server();
        let engine = silent_engine(url);
        let never = Cancel::new();
        let gave_up = tokio::time::timeout(
            Duration::from_millis(200),
            engine.complete(request(), never.clone(), None),
        )
        .await;
        assert!(gave_up.is_err(), "the silent server never answers");
        assert!(never.is_cancelled(), "dropping the future set the flag");
        let seen = tokio::task::spawn_blocking(move || server.join().unwrap())
            .await
            .unwrap();
        assert!(seen, "the server saw its client close the connection");
    }

    #[test]
    fn extra_body_must_be_a_json_object() {
        assert!(RemoteConfig::parse_extra_body(r#"{"repeat_penalty": 1.0}"#).is_ok());
        assert!(RemoteConfig::parse_extra_body("[1]")
            .unwrap_err()
            .0
            .contains("JSON object"));
        assert!(RemoteConfig::parse_extra_body("{")
            .unwrap_err()
            .0
            .contains("not JSON"));
    }

    #[test]
    fn server_errors_become_clear_request_errors() {
        let (url, server) = serve(vec![(500, r#"{"error":"out of memory"}"#.into())]);
        let mut cfg = RemoteConfig::new(url.clone());
        cfg.model = Some("m".into());
        let engine = RemoteEngine::new(cfg);
        let err = engine
            .complete_blocking(&request(), &Cancel::new())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&url) && err.contains("HTTP 500") && err.contains("out of memory"),
            "{err}"
        );
        server.join().unwrap();
        // Nothing listening: a transport error naming the server.
        let engine = RemoteEngine::new(RemoteConfig {
            model: Some("m".into()),
            ..RemoteConfig::new(url.clone())
        });
        let err = engine
            .complete_blocking(&request(), &Cancel::new())
            .unwrap_err()
            .to_string();
        assert!(err.contains(&url), "{err}");
    }
}
