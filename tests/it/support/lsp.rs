//! The tests' LSP clients, by the layer they speak to: [`InProcess`] calls the server's
//! `tower::Service` message by message (no framing, no transport); [`Wire`] writes bytes (also
//! malformed ones) to the real transport (`serve_lsp` over in-memory pipes, or a `laya lsp`
//! process) and reads what comes back strictly, with `laya::bench::lsp_client`'s framing.
//! `laya lsp` processes spoken to in well-formed messages use
//! `laya::bench::lsp_client::LspProcess` itself ([`super::daemon`]).

use std::{
    collections::HashMap,
    io::{ErrorKind, Read, Write},
    process::Child,
    sync::Arc,
    time::Duration,
};

use futures::StreamExt;
use laya::{
    bench::lsp_client::{frame, read_frame},
    engine::Engine,
    lsp::{
        build_service,
        transport::{serve_lsp, Ending},
        EngineSource, LayaServer,
    },
};
use serde_json::{json, Value};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    sync::mpsc,
};
use tower::{Service, ServiceExt};
use tower_lsp_server::{jsonrpc::Request, LspService};

use super::{engine::FakeEngine, panics};

// ---------------------------------------------------------------------------------------
// In process.

/// The LSP server as a `tower::Service`, driven message by message as an editor would; on
/// the fake engine unless given another.
pub struct InProcess<E: Engine + 'static = FakeEngine> {
    pub service: LspService<LayaServer>,
    pub engine: Arc<E>,
    next_id: i64,
}

impl<E: Engine + 'static> InProcess<E> {
    /// A server on `engine` (ready), its messages to the client (logs, progress) drained.
    pub fn new(engine: Arc<E>) -> InProcess<E> {
        let (service, socket) = build_service(EngineSource::Ready(engine.clone()));
        tokio::spawn(socket.for_each(|_| async {}));
        InProcess::of(service, engine)
    }

    /// A server the caller built (and whose messages to the client it handles).
    pub fn of(service: LspService<LayaServer>, engine: Arc<E>) -> InProcess<E> {
        InProcess {
            service,
            engine,
            next_id: 1,
        }
    }

    /// `initialize`, offering UTF-8 positions (and UTF-16) or only UTF-16, with laya's
    /// `options` and the workspace `folders` (none when null), then `initialized`; checks the
    /// encoding the server chose and returns its capabilities.
    pub async fn initialize(&mut self, utf8: bool, options: Value, folders: Value) -> Value {
        let encodings = if utf8 {
            json!(["utf-8", "utf-16"])
        } else {
            json!(["utf-16"])
        };
        let mut params = json!({
            "capabilities": { "general": { "positionEncodings": encodings } },
            "initializationOptions": options,
        });
        if !folders.is_null() {
            params["workspaceFolders"] = folders;
        }
        let r = self.request("initialize", params).await;
        let caps = r["result"]["capabilities"].clone();
        assert_eq!(
            caps["positionEncoding"],
            if utf8 { "utf-8" } else { "utf-16" },
            "{r}"
        );
        self.notify("initialized", json!({})).await;
        caps
    }

    /// Sends `method` (a request when it has an `id`); the response as JSON, if any.
    pub async fn call(&mut self, method: &str, id: Option<i64>, params: Value) -> Option<Value> {
        let mut request = Request::build(method.to_owned()).params(params);
        if let Some(id) = id {
            request = request.id(id);
        }
        let service = self.service.ready().await.expect("the service takes requests");
        let response = service
            .call(request.finish())
            .await
            .expect("the service is alive");
        response.map(|r| serde_json::to_value(r).unwrap())
    }

    pub async fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.call(method, Some(id), params).await.expect("a response")
    }

    pub async fn notify(&mut self, method: &str, params: Value) {
        let response = self.call(method, None, params).await;
        assert!(response.is_none(), "notifications get no response");
    }

    /// Open `uri` with `fixture` (which holds one `$0`); returns the cursor's (line, utf-16 col).
    pub async fn open(&mut self, uri: &str, language: &str, fixture: &str) -> (u32, u32) {
        let cursor = fixture.find("$0").expect("$0 in fixture");
        let text = fixture.replace("$0", "");
        let before = &text[..cursor];
        let line = before.matches('\n').count() as u32;
        let col = before[before.rfind('\n').map_or(0, |i| i + 1)..]
            .encode_utf16()
            .count() as u32;
        self.notify(
            "textDocument/didOpen",
            json!({ "textDocument": { "uri": uri, "languageId": language, "version": 1, "text": text } }),
        )
        .await;
        (line, col)
    }

    /// `didChange`: `text` inserted at `(line, character)`.
    pub async fn insert(&mut self, uri: &str, version: i32, (line, character): (u32, u32), text: &str) {
        let at = json!({ "line": line, "character": character });
        self.notify(
            "textDocument/didChange",
            json!({
                "textDocument": { "uri": uri, "version": version },
                "contentChanges": [{ "range": { "start": at, "end": at }, "text": text }],
            }),
        )
        .await;
    }

    /// An automatic inline completion at `(line, character)`.
    pub async fn inline(&mut self, uri: &str, (line, character): (u32, u32)) -> Value {
        self.request(
            "textDocument/inlineCompletion",
            json!({
                "textDocument": { "uri": uri },
                "position": { "line": line, "character": character },
                "context": { "triggerKind": 2 },
            }),
        )
        .await
    }
}

// ---------------------------------------------------------------------------------------
// On the wire.

/// What a [`Wire`] client answers to a request of the server, given its method and id.
pub type ServerAnswers = Box<dyn FnMut(&Value, &Value) -> Value + Send>;

/// An empty result for every request of the server (what an editor without settings gives).
pub fn null_answers() -> ServerAnswers {
    Box::new(|_, id| json!({ "jsonrpc": "2.0", "id": id, "result": null }))
}

/// Bytes to write: one message in the chunks it is written in (`None`: close the input).
type Chunks = Option<Vec<Vec<u8>>>;

/// The reading end of a [`Wire`]: the server's output as it comes, read strictly (every frame's
/// header exactly `Content-Length: N`, every body JSON, the output ending between messages).
struct Reader {
    buf: Vec<u8>,
    answers: mpsc::UnboundedSender<Result<Value, String>>,
    writes: mpsc::UnboundedSender<Chunks>,
    server_answers: ServerAnswers,
}

impl Reader {
    /// Takes `bytes` the server wrote (none: its output ended) and passes on each message that
    /// is now whole; false once there is nothing more to read (the end, or a fault, which is
    /// passed on as an error).
    fn take(&mut self, bytes: &[u8]) -> bool {
        self.buf.extend_from_slice(bytes);
        loop {
            match self.next(bytes.is_empty()) {
                Ok(Some(msg)) => self.route(msg),
                Ok(None) => return !bytes.is_empty(),
                Err(e) => {
                    let _ = self.answers.send(Err(e));
                    return false;
                }
            }
        }
    }

    /// The next whole message in the buffer; at the `end`, what is left must be nothing.
    fn next(&mut self, end: bool) -> Result<Option<Value>, String> {
        let mut rest = &self.buf[..];
        let f = match read_frame(&mut rest) {
            Ok(Some(f)) => f,
            Ok(None) => return Ok(None),
            Err(e) if e.kind() == ErrorKind::UnexpectedEof && !end => return Ok(None),
            Err(e) => return Err(format!("the server's output: {e}")),
        };
        let used = self.buf.len() - rest.len();
        self.buf.drain(..used);
        if f.header != format!("Content-Length: {}\r\n\r\n", f.body.len()) {
            return Err(format!("the server wrote the header {:?}", f.header));
        }
        serde_json::from_slice(&f.body).map(Some).map_err(|e| {
            format!(
                "the server wrote a body that is no JSON ({e}): {:?}",
                String::from_utf8_lossy(&f.body)
            )
        })
    }

    /// A request of the server is answered, a notification dropped, an answer passed on (each
    /// element of an array on its own).
    fn route(&mut self, msg: Value) {
        match (msg.get("method"), msg.get("id")) {
            (Some(method), Some(id)) => {
                let reply = (self.server_answers)(method, id);
                let _ = self.writes.send(Some(vec![frame(reply.to_string().as_bytes())]));
            }
            (Some(_), None) => {}
            (None, _) => match msg {
                Value::Array(each) => each.into_iter().for_each(|m| {
                    let _ = self.answers.send(Ok(m));
                }),
                m => {
                    let _ = self.answers.send(Ok(m));
                }
            },
        }
    }
}

/// The client end of one connection at the byte level: raw bytes out; the server's answers
/// in, each element of an array on its own. The server's requests are answered as they come
/// (by a [`ServerAnswers`]), its notifications dropped.
pub struct Wire {
    writes: mpsc::UnboundedSender<Chunks>,
    answers: mpsc::UnboundedReceiver<Result<Value, String>>,
    next_id: i64,
    /// How long [`next`](Self::next) waits for an answer before it is an error (a hang).
    wait: Duration,
    /// The answers received, by id (as JSON text).
    pub seen: HashMap<String, usize>,
}

impl Wire {
    /// A connection to `serve_lsp(source)` over in-memory pipes (from within a runtime), and
    /// the server's task.
    pub fn in_memory(
        source: EngineSource,
        server_answers: ServerAnswers,
        wait: Duration,
    ) -> (Wire, tokio::task::JoinHandle<Ending>) {
        let (client, server) = tokio::io::duplex(1 << 16);
        let (server_in, server_out) = tokio::io::split(server);
        let server = tokio::spawn(serve_lsp(source, server_in, server_out));
        let (input, mut output) = tokio::io::split(client);
        let (writes, mut to_write) = mpsc::unbounded_channel::<Chunks>();
        tokio::spawn(async move {
            while let Some(Some(chunks)) = to_write.recv().await {
                for (i, c) in chunks.iter().enumerate() {
                    if i > 0 {
                        // The server may read what was written so far before the next chunk.
                        // (Not after the last: a yielded task waits for its worker, which a
                        // test may block.)
                        tokio::task::yield_now().await;
                    }
                    if output.write_all(c).await.is_err() || output.flush().await.is_err() {
                        return;
                    }
                }
            }
            let _ = output.shutdown().await;
        });
        let (wire, mut reader) = Wire::new(writes, server_answers, wait);
        let mut input = input;
        tokio::spawn(async move {
            let mut chunk = vec![0u8; 1 << 16];
            loop {
                let n = input.read(&mut chunk).await.unwrap_or(0);
                if !reader.take(&chunk[..n]) {
                    break;
                }
            }
        });
        (wire, server)
    }

    /// A connection to `child` (a `laya lsp` started with piped stdin and stdout).
    pub fn process(child: &mut Child, server_answers: ServerAnswers, wait: Duration) -> Wire {
        let mut stdin = child.stdin.take().unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let (writes, mut to_write) = mpsc::unbounded_channel::<Chunks>();
        panics::spawn(move || {
            while let Some(Some(chunks)) = to_write.blocking_recv() {
                for c in chunks {
                    if stdin.write_all(&c).and_then(|_| stdin.flush()).is_err() {
                        return;
                    }
                }
            }
            // Dropping stdin closes it: the end of the server's input.
        });
        let (wire, mut reader) = Wire::new(writes, server_answers, wait);
        panics::spawn(move || {
            let mut chunk = vec![0u8; 1 << 16];
            loop {
                let n = stdout.read(&mut chunk).unwrap_or(0);
                if !reader.take(&chunk[..n]) {
                    break;
                }
            }
        });
        wire
    }

    /// A client writing to `writes`, and the reader of the server's output that feeds it.
    fn new(
        writes: mpsc::UnboundedSender<Chunks>,
        server_answers: ServerAnswers,
        wait: Duration,
    ) -> (Wire, Reader) {
        let (answers_tx, answers) = mpsc::unbounded_channel();
        let reader = Reader {
            buf: vec![],
            answers: answers_tx,
            writes: writes.clone(),
            server_answers,
        };
        let wire = Wire {
            writes,
            answers,
            next_id: 1000,
            wait,
            seen: HashMap::new(),
        };
        (wire, reader)
    }

    /// Writes one message in the chunks given (nothing is written between them).
    pub fn chunks(&self, chunks: Vec<Vec<u8>>) {
        let _ = self.writes.send(Some(chunks));
    }

    pub fn raw(&self, bytes: &[u8]) {
        self.chunks(vec![bytes.to_vec()]);
    }

    pub fn send(&self, msg: &Value) {
        self.raw(&frame(msg.to_string().as_bytes()));
    }

    pub fn notify(&self, method: &str, params: Value) {
        self.send(&json!({ "jsonrpc": "2.0", "method": method, "params": params }));
    }

    /// Closes the server's input.
    pub fn close(&self) {
        let _ = self.writes.send(None);
    }

    /// Sends a request and returns its id.
    pub fn start(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = json!(self.next_id);
        self.send(&json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }));
        id
    }

    /// The next answer; `None` once the server's output closed. Nothing is sent while waiting
    /// (a message the server reads only once more bytes arrive would hang here). An error
    /// when none comes within the wait (a hang) or the output breaks the framing.
    pub async fn next(&mut self) -> Result<Option<Value>, String> {
        match tokio::time::timeout(self.wait, self.answers.recv()).await {
            Ok(Some(Ok(msg))) => {
                *self.seen.entry(msg["id"].to_string()).or_default() += 1;
                Ok(Some(msg))
            }
            Ok(Some(Err(e))) => Err(e),
            Ok(None) => Ok(None),
            Err(_) => Err(format!("no answer from the server in {:?}", self.wait)),
        }
    }

    /// The answers up to the one to `id`: (those before it, it).
    pub async fn until(&mut self, id: &Value) -> Result<(Vec<Value>, Value), String> {
        let mut before = vec![];
        loop {
            match self.next().await? {
                Some(m) if m["id"] == *id => return Ok((before, m)),
                Some(m) => before.push(m),
                None => {
                    return Err(format!(
                        "the server closed its output before answering {id}; before: {before:?}"
                    ))
                }
            }
        }
    }

    /// Sends a request and returns its answer, which must be the next one.
    pub async fn request(&mut self, method: &str, params: Value) -> Result<Value, String> {
        let id = self.start(method, params);
        let (before, answer) = self.until(&id).await?;
        if !before.is_empty() {
            return Err(format!("{method}: unexpected answers first: {before:?}"));
        }
        Ok(answer)
    }

    /// Every answer until the server closes its output.
    pub async fn rest(&mut self) -> Result<Vec<Value>, String> {
        let mut rest = vec![];
        while let Some(m) = self.next().await? {
            rest.push(m);
        }
        Ok(rest)
    }
}
