//! A small blocking LSP client driving `laya lsp` over a child's stdin/stdout, for the
//! memory benchmark and the integration tests: Content-Length framing ([`frame`],
//! [`read_frame`], which the tests' byte-level client reads with too), requests with a
//! timeout (waited for at once, or started and answered later), and answers to the server's
//! own requests (progress tokens, configuration).

use std::{
    io::{BufRead, BufReader, Write},
    process::{Child, ChildStdin, Command, Stdio},
    sync::mpsc::{self, Receiver, RecvTimeoutError},
    time::{Duration, Instant},
};

use serde_json::{json, Value};

pub struct LspProcess {
    child: Child,
    /// `None` once closed ([`close_input`](Self::close_input)).
    stdin: Option<ChildStdin>,
    messages: Receiver<Value>,
    next_id: u64,
    /// `window/logMessage` texts seen so far.
    pub logs: Vec<String>,
    /// `window/showMessage` texts seen so far (also in `logs`, prefixed `shown: `).
    pub shown: Vec<String>,
    /// `$/progress` notifications seen so far (their params), and the tokens the server asked
    /// to create (`window/workDoneProgress/create`), each in the order it came.
    pub progress: Vec<Value>,
    pub progress_created: Vec<Value>,
    /// Answers that came for no request being waited for: a second answer to one request,
    /// or a late one to a request that timed out.
    pub stray_answers: usize,
}

/// One frame of the base protocol as it was read: its header block exactly as sent (line ends
/// and the empty line included) and its body.
pub struct Frame {
    pub header: String,
    pub body: Vec<u8>,
}

/// `body` framed as the base protocol asks: a `Content-Length` header, then the body.
pub fn frame(body: &[u8]) -> Vec<u8> {
    [format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes(), body].concat()
}

/// The next frame from `r`: header lines up to an empty one, the `Content-Length` (any case)
/// among them, and that many bytes. `Ok(None)` at the end of the input before a frame; an
/// error for a header block without a length (`InvalidData`) and for input that ends inside
/// a frame (`UnexpectedEof`).
pub fn read_frame(r: &mut impl BufRead) -> std::io::Result<Option<Frame>> {
    let mut header = String::new();
    let mut len = None;
    loop {
        let start = header.len();
        if r.read_line(&mut header)? == 0 {
            if header.is_empty() {
                return Ok(None);
            }
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("the input ended inside the header {header:?}"),
            ));
        }
        let line = header[start..].trim_end();
        if line.is_empty() {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse::<usize>().ok();
        }
    }
    let len = len.ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("no Content-Length in the header {header:?}"),
        )
    })?;
    let mut body = vec![0; len];
    r.read_exact(&mut body)?;
    Ok(Some(Frame { header, body }))
}

/// One framed message from `r` ([`read_frame`]); `None` at the end of the input, on a bad
/// frame or on a body that is not JSON.
pub fn read_message(r: &mut impl BufRead) -> Option<Value> {
    let frame = read_frame(r).ok()??;
    serde_json::from_slice(&frame.body).ok()
}

impl LspProcess {
    /// Start `cmd` (stdin and stdout are taken over; stderr is left as the caller set it).
    pub fn spawn(mut cmd: Command) -> std::io::Result<LspProcess> {
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn()?;
        let stdin = child
            .stdin
            .take()
            .ok_or_else(|| std::io::Error::other("no stdin"))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("no stdout"))?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            while let Some(m) = read_message(&mut r) {
                if tx.send(m).is_err() {
                    break;
                }
            }
        });
        Ok(LspProcess {
            child,
            stdin: Some(stdin),
            messages: rx,
            next_id: 1,
            logs: vec![],
            shown: vec![],
            progress: vec![],
            progress_created: vec![],
            stray_answers: 0,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn send(&mut self, v: &Value) -> Result<(), String> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or("writing to the language server: its input is closed")?;
        stdin
            .write_all(&frame(v.to_string().as_bytes()))
            .and_then(|_| stdin.flush())
            .map_err(|e| format!("writing to the language server: {e}"))
    }

    pub fn notify(&mut self, method: &str, params: Value) -> Result<(), String> {
        self.send(&json!({ "jsonrpc": "2.0", "method": method, "params": params }))
    }

    /// Handle one message from the server that is not the answer being waited for.
    fn other(&mut self, m: Value) -> Result<(), String> {
        match (m.get("method").and_then(Value::as_str), m.get("id")) {
            (Some(method), Some(id)) => {
                if method == "window/workDoneProgress/create" {
                    self.progress_created.push(m["params"]["token"].clone());
                }
                let result = if method == "workspace/configuration" {
                    let n = m["params"]["items"].as_array().map(Vec::len).unwrap_or(1);
                    Value::Array(vec![Value::Null; n])
                } else {
                    Value::Null
                };
                self.send(&json!({ "jsonrpc": "2.0", "id": id, "result": result }))
            }
            (Some("window/logMessage"), None) => {
                if let Some(t) = m["params"]["message"].as_str() {
                    self.logs.push(t.to_owned());
                }
                Ok(())
            }
            (Some("$/progress"), None) => {
                self.progress.push(m["params"].clone());
                Ok(())
            }
            (Some("window/showMessage"), None) => {
                if let Some(t) = m["params"]["message"].as_str() {
                    self.shown.push(t.to_owned());
                    self.logs.push(format!("shown: {t}"));
                }
                Ok(())
            }
            (None, Some(_)) => {
                self.stray_answers += 1;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Send a request without waiting for its answer ([`answer`](Self::answer) reads it);
    /// returns its id.
    pub fn start(&mut self, method: &str, params: Value) -> Result<u64, String> {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }))?;
        Ok(id)
    }

    /// The answer to request `id` as it came (its `result` or its `error`), handling what the
    /// server sends before it.
    pub fn answer(&mut self, id: u64, timeout: Duration) -> Result<Value, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let m = match self.messages.recv_timeout(left) {
                Ok(m) => m,
                Err(RecvTimeoutError::Timeout) => return Err(format!("no answer within {timeout:?}")),
                Err(RecvTimeoutError::Disconnected) => return Err("the language server exited".into()),
            };
            if m.get("method").is_none() && m.get("id") == Some(&json!(id)) {
                return Ok(m);
            }
            self.other(m)?;
        }
    }

    /// The next answer to any request before `until` (its id and the whole message), handling
    /// what else the server sends; `None` when none came by then.
    pub fn next_answer(&mut self, until: Instant) -> Result<Option<(u64, Value)>, String> {
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let m = match self.messages.recv_timeout(left) {
                Ok(m) => m,
                Err(RecvTimeoutError::Timeout) => return Ok(None),
                Err(RecvTimeoutError::Disconnected) => return Err("the language server exited".into()),
            };
            if m.get("method").is_none() {
                if let Some(id) = m.get("id").and_then(Value::as_u64) {
                    return Ok(Some((id, m)));
                }
            }
            self.other(m)?;
        }
    }

    /// Send a request and wait for its result (an error answer is `Err` with its message).
    pub fn request(&mut self, method: &str, params: Value, timeout: Duration) -> Result<Value, String> {
        let id = self.start(method, params)?;
        let m = self.answer(id, timeout).map_err(|e| format!("{method}: {e}"))?;
        if let Some(e) = m.get("error") {
            return Err(e["message"].as_str().unwrap_or("error").to_owned());
        }
        Ok(m.get("result").cloned().unwrap_or(Value::Null))
    }

    /// Close the server's input (what an editor that exits does).
    pub fn close_input(&mut self) {
        self.stdin = None;
    }

    /// The process's exit status, once it has ended.
    pub fn try_wait(&mut self) -> std::io::Result<Option<std::process::ExitStatus>> {
        self.child.try_wait()
    }

    /// Read what the server sends for `wait`, handling it; returns when `until` matches a
    /// log line (true) or the time is up (false).
    pub fn wait_log(&mut self, until: impl Fn(&str) -> bool, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        loop {
            if self.logs.iter().any(|l| until(l)) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.messages.recv_timeout(left) {
                Ok(m) => {
                    if self.other(m).is_err() {
                        return false;
                    }
                }
                Err(_) => return false,
            }
        }
    }

    /// `initialize` with laya's settings, then `initialized`.
    pub fn initialize(&mut self, settings: Value) -> Result<Value, String> {
        let r = self.request(
            "initialize",
            json!({
                "processId": std::process::id(),
                "rootUri": null,
                "capabilities": { "window": { "workDoneProgress": true } },
                "initializationOptions": settings,
            }),
            Duration::from_secs(30),
        )?;
        self.notify("initialized", json!({}))?;
        Ok(r)
    }

    pub fn open(&mut self, uri: &str, language: &str, text: &str) -> Result<(), String> {
        self.notify(
            "textDocument/didOpen",
            json!({ "textDocument": { "uri": uri, "languageId": language, "version": 1, "text": text } }),
        )
    }

    /// Replace a document's whole text (`didChange` without a range).
    pub fn change(&mut self, uri: &str, version: i32, text: &str) -> Result<(), String> {
        self.notify(
            "textDocument/didChange",
            json!({ "textDocument": { "uri": uri, "version": version }, "contentChanges": [{ "text": text }] }),
        )
    }

    /// Inline completion (invoked) at a UTF-16 position: the items' texts. `Ok(None)` when
    /// the server answered null (no engine yet, or it failed: see [`logs`](Self::logs)).
    pub fn inline_completion(
        &mut self,
        uri: &str,
        line: u32,
        character: u32,
        timeout: Duration,
    ) -> Result<Option<Vec<String>>, String> {
        let r = self.request(
            "textDocument/inlineCompletion",
            json!({
                "textDocument": { "uri": uri },
                "position": { "line": line, "character": character },
                "context": { "triggerKind": 1 },
            }),
            timeout,
        )?;
        if r.is_null() {
            return Ok(None);
        }
        let items = r.get("items").unwrap_or(&r);
        Ok(Some(
            items
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|i| {
                            let t = &i["insertText"];
                            t.as_str().or_else(|| t["value"].as_str()).map(str::to_owned)
                        })
                        .collect()
                })
                .unwrap_or_default(),
        ))
    }

    /// `shutdown` and `exit`, then wait for the process (killed after `wait`).
    pub fn shutdown(mut self, wait: Duration) {
        let _ = self.request("shutdown", Value::Null, wait);
        let _ = self.notify("exit", Value::Null);
        let deadline = Instant::now() + wait;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for LspProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}
