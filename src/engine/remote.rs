//! A model served by another program that speaks the OpenAI completions API (vLLM, llama.cpp's
//! server, laya's own daemon): the same [`Engine`] as a local model, for a tier that does not
//! fit on this machine. Requests carry the prompt exactly as built (special tokens as text), so
//! the server must parse special tokens in prompts, as vLLM and llama.cpp do.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, OnceLock,
    },
    time::{Duration, Instant},
};

use serde::Deserialize;
use serde_json::json;

use super::{
    worker::{Engine, ModelState},
    Choice, CompletionOutput, CompletionRequest, EngineError, FinishReason, Timing,
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
    pub fn parse_extra_body(text: &str) -> Result<serde_json::Map<String, serde_json::Value>, String> {
        match serde_json::from_str::<serde_json::Value>(text) {
            Ok(serde_json::Value::Object(m)) => Ok(m),
            Ok(other) => Err(format!(
                "expected a JSON object such as {{\"repeat_penalty\": 1.0}}, got {other}"
            )),
            Err(e) => Err(format!("not JSON: {e}")),
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
        EngineError::Request(format!("remote {}: {msg}", self.config.url))
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

    /// One blocking request.
    pub fn complete_blocking(
        &self,
        req: &CompletionRequest,
        cancel: &AtomicBool,
    ) -> Result<CompletionOutput, EngineError> {
        let start = Instant::now();
        if req.n == 0 {
            return Err(EngineError::Request("n must be at least 1".into()));
        }
        let model = self.model_name()?;
        if cancel.load(Ordering::Relaxed) {
            return Err(EngineError::Request("cancelled".into()));
        }
        // A server cannot start candidates from chosen tokens; greedy ones from the same
        // prompt would all be the same, so branching asks for one.
        let n = if req.branch_first { 1 } else { req.n };
        let mut body = serde_json::Value::Object(self.config.extra_body.clone());
        for (k, v) in [
            ("model", json!(model)),
            // A server cannot constrain its answer: the start ends the prompt instead.
            ("prompt", json!(format!("{}{}", req.prompt, req.start))),
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
        let resp: CompletionsResponse = self
            .request("POST", "/completions")
            .send_json(body)
            .map_err(|e| self.http_error("POST /completions", e))?
            .into_json()
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
                        text: format!("{}{}", req.start, c.text),
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
        cancel: Arc<AtomicBool>,
    ) -> Result<CompletionOutput, EngineError> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.complete_blocking(&req, &cancel))
            .await
            .map_err(|e| EngineError::Request(format!("remote request task failed: {e}")))?
    }

    fn state(&self) -> ModelState {
        ModelState::Ready {
            load_time: Duration::ZERO,
            device: format!("remote {}", self.config.url),
        }
    }

    /// Known once the model list was read (no `--remote-model`) and the server states it.
    fn parameters(&self) -> Option<u64> {
        self.parameters.get().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::SamplingParams;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpListener;

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
                seen.push(format!("{head}{}", String::from_utf8(buf).unwrap()));
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
            model: None,
            prompt: "<|fim_prefix|>def f():<|fim_suffix|><|fim_middle|>".into(),
            max_tokens: 8,
            n: 2,
            sampling: SamplingParams::default(),
            stop: vec!["\n\n".into()],
            branch_first: false,
            start: String::new(),
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
        let out = engine
            .complete_blocking(&request(), &AtomicBool::new(false))
            .unwrap();
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
    fn a_start_ends_the_prompt_and_begins_the_answer() {
        let (url, server) = serve(vec![
            (200, r#"{"object":"list","data":[{"id":"coder"}]}"#.into()),
            (
                200,
                r#"{"choices":[{"index":0,"text":"return a","finish_reason":"stop"}]}"#.into(),
            ),
        ]);
        let engine = RemoteEngine::new(RemoteConfig::new(url));
        let mut req = request();
        req.start = "    ".into();
        let out = engine.complete_blocking(&req, &AtomicBool::new(false)).unwrap();
        assert_eq!(out.choices[0].text, "    return a");
        let seen = server.join().unwrap();
        let body: serde_json::Value =
            serde_json::from_str(seen[1].split("\r\n\r\n").nth(1).unwrap()).unwrap();
        assert_eq!(body["prompt"], format!("{}    ", request().prompt));
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
        let out = engine.complete_blocking(&req, &AtomicBool::new(false)).unwrap();
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
        assert_eq!(engine.parameters(), None, "unknown before the list is read");
        engine
            .complete_blocking(&request(), &AtomicBool::new(false))
            .unwrap();
        assert_eq!(engine.parameters(), Some(494_032_768));
        server.join().unwrap();

        let (url, server) = serve(vec![
            (200, r#"{"data":[{"id":"vllm-model"}]}"#.into()),
            (200, answer.into()),
        ]);
        let engine = RemoteEngine::new(RemoteConfig::new(url));
        engine
            .complete_blocking(&request(), &AtomicBool::new(false))
            .unwrap();
        assert_eq!(engine.parameters(), None);
        server.join().unwrap();
    }

    #[test]
    fn extra_body_must_be_a_json_object() {
        assert!(RemoteConfig::parse_extra_body(r#"{"repeat_penalty": 1.0}"#).is_ok());
        assert!(RemoteConfig::parse_extra_body("[1]")
            .unwrap_err()
            .contains("JSON object"));
        assert!(RemoteConfig::parse_extra_body("{")
            .unwrap_err()
            .contains("not JSON"));
    }

    #[test]
    fn server_errors_become_clear_request_errors() {
        let (url, server) = serve(vec![(500, r#"{"error":"out of memory"}"#.into())]);
        let mut cfg = RemoteConfig::new(url.clone());
        cfg.model = Some("m".into());
        let engine = RemoteEngine::new(cfg);
        let err = engine
            .complete_blocking(&request(), &AtomicBool::new(false))
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
            .complete_blocking(&request(), &AtomicBool::new(false))
            .unwrap_err()
            .to_string();
        assert!(err.contains(&url), "{err}");
    }
}
