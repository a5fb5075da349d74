//! The wire of `laya lsp`: LSP base-protocol framing, JSON-RPC validation and dispatch to
//! tower-lsp's `LspService`, owned here so that no client input can stop a connection
//! (tower-lsp's own `Server` stops reading at the first message it cannot decode); tower-lsp
//! is used only for the service behind it and the `ClientSocket` of server→client messages.
//!
//! Four tasks: the reader ([`Framer`], then [`decode`]) answers every fault as JSON-RPC says
//! and resynchronises at the next `Content-Length:`; the dispatcher ([`serve`]) hands messages
//! to the service in the order read; the runner polls every handler in one task, at most
//! [`MAX_REQUESTS`] requests at once; the writer writes whole frames, so answers never
//! interleave inside one.
//!
//! Invariants: a fault is answered and the connection goes on; handlers start in the order
//! read (a `didChange` is applied before the next); `exit` or the end of the input stops
//! reading at once, and [`serve`] returns without waiting for what still runs (requests get
//! [`EXIT_GRACE`] to answer, the output as long again). [`Ending::exit_code`] is LSP's status.
//!
//! Start with [`serve_lsp`], then [`serve`].

use std::{
    collections::VecDeque,
    fmt::Display,
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use futures::{stream::FuturesUnordered, SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    sync::{mpsc, oneshot},
};
use tower::Service;
use tower_lsp_server::{
    jsonrpc::{Error, ErrorCode, Request, Response},
    ClientSocket,
};

use super::{build_service, panic_guard::CatchPanic, EngineSource};

/// The largest body accepted (64 MiB); a larger `Content-Length` is answered as a fault and
/// its body skipped up to the next header.
pub const MAX_BODY: usize = 64 << 20;
/// The longest header block; a longer one is no header (skipped as bytes that are no message).
const MAX_HEADER: usize = 8 << 10;
/// Requests running at once; one more is answered with RequestFailed (-32803) at once.
pub const MAX_REQUESTS: usize = 256;
/// After `exit`: how long running requests get to send their answers, and then how long the
/// output gets to take them.
pub const EXIT_GRACE: Duration = Duration::from_millis(300);
/// What a header block starts from when reading resynchronises (compared in ASCII lower case).
const CONTENT_LENGTH: &[u8] = b"content-length:";
/// JSON-RPC's codes for the faults answered here (LSP's RequestFailed for a full server).
const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const REQUEST_FAILED: i64 = -32803;

/// How a connection ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndReason {
    /// The client sent `exit`.
    Exit,
    /// The input ended (or could not be read).
    EndOfInput,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ending {
    pub reason: EndReason,
    /// A `shutdown` request was answered successfully before the end.
    pub shutdown: bool,
}

impl Ending {
    /// LSP's exit status: 0 when `shutdown` came first, else 1.
    pub fn exit_code(&self) -> u8 {
        if self.shutdown {
            0
        } else {
            1
        }
    }
}

/// laya's LSP service (behind [`CatchPanic`]) on `input`/`output`: what `laya lsp` runs on
/// stdin/stdout, and what the tests run on in-memory pipes.
pub async fn serve_lsp<I, O>(source: EngineSource, input: I, output: O) -> Ending
where
    I: AsyncRead + Unpin + Send + 'static,
    O: AsyncWrite + Unpin + Send + 'static,
{
    let (service, socket) = build_service(source);
    serve(input, output, CatchPanic(service), socket).await
}

// ---------------------------------------------------------------------------------------
// Framing.

/// What the framer read: a body to decode, or a fault to answer (a parse error, id `null`).
#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    Body(Vec<u8>),
    Fault(String),
}

#[derive(Debug)]
enum FrameState {
    /// At a message boundary: whitespace is skipped, then a header block must start.
    Header,
    /// Inside a body of `len` bytes; `refuse`: the fault to answer instead of decoding it.
    Body { len: usize, refuse: Option<String> },
    /// Skipping to the next `Content-Length:`; `quiet` when the fault these bytes belong to
    /// was answered already, else they are answered once as bytes that are no message.
    Skip { quiet: bool, skipped: usize },
}

/// Splits a byte stream into LSP frames, resynchronising after faults. Pure: bytes in
/// ([`Framer::push`]), frames out ([`Framer::next`]).
///
/// Frames are `Content-Length: N` headers (names in any case, lines ending in `\r\n` or `\n`,
/// other headers ignored, a `Content-Type` only checked for a UTF-8 charset) and a body of at
/// most [`MAX_BODY`] bytes. A fault is answered (-32700) and reading resynchronises at the next
/// `Content-Length:`: bytes that are no message are skipped (answered once), a header that is
/// bad or too large is answered and what follows it up to the next header skipped, a body that
/// is not JSON is answered and, when it holds the start of the next message (a `Content-Length`
/// too large), reading goes on from there. A body cut by the end of the input ends with the
/// input.
#[derive(Debug)]
pub struct Framer {
    buf: Vec<u8>,
    /// Bytes of `buf` already consumed.
    pos: usize,
    state: FrameState,
}

impl Default for Framer {
    fn default() -> Self {
        Framer {
            buf: Vec::new(),
            pos: 0,
            state: FrameState::Header,
        }
    }
}

enum Header {
    /// Not complete yet.
    Partial,
    /// These bytes cannot start a header block.
    Junk,
    /// A header block of `len` bytes that cannot frame a body.
    Bad { len: usize, why: String },
    /// A header block of `len` bytes announcing a body of `body` bytes.
    Ok {
        len: usize,
        body: usize,
        refuse: Option<String>,
    },
}

/// HTTP's token characters, of which header names are made.
fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// A header value's characters: printable ASCII and tab.
fn is_value(b: u8) -> bool {
    (0x20..0x7f).contains(&b) || b == b'\t'
}

/// Reads the header block at the start of `buf`.
fn parse_header(buf: &[u8]) -> Header {
    let mut pos = 0;
    let mut length: Option<Result<usize, String>> = None;
    let mut refuse = None;
    loop {
        let Some(nl) = buf[pos..].iter().position(|&b| b == b'\n') else {
            // A partial line must still look like one.
            let line = &buf[pos..];
            let plausible = match line.iter().position(|&b| b == b':') {
                Some(c) => {
                    line[..c].iter().all(|&b| is_token(b))
                        && line[c + 1..].iter().all(|&b| is_value(b) || b == b'\r')
                }
                None => line == b"\r" || line.iter().all(|&b| is_token(b)),
            };
            return if !plausible || buf.len() > MAX_HEADER {
                Header::Junk
            } else {
                Header::Partial
            };
        };
        let line = &buf[pos..pos + nl];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        pos += nl + 1;
        if pos > MAX_HEADER {
            return Header::Junk;
        }
        if line.is_empty() {
            break;
        }
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            return Header::Junk;
        };
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        if name.is_empty() || !name.iter().all(|&b| is_token(b)) || !value.iter().all(|&b| is_value(b)) {
            return Header::Junk;
        }
        // Printable ASCII: the value is text.
        let value = std::str::from_utf8(value).unwrap_or_default().trim();
        if name.eq_ignore_ascii_case(b"content-length") {
            let this = parse_length(value);
            length = match length {
                Some(Ok(n)) if this != Ok(n) => {
                    Some(Err(format!("two Content-Length headers ({n} and {value})")))
                }
                Some(other) => Some(other),
                None => Some(this),
            };
        } else if name.eq_ignore_ascii_case(b"content-type") {
            refuse = unsupported_charset(value);
        }
    }
    match length {
        None => Header::Bad {
            len: pos,
            why: "a header without Content-Length".into(),
        },
        Some(Err(why)) => Header::Bad { len: pos, why },
        Some(Ok(body)) => Header::Ok {
            len: pos,
            body,
            refuse,
        },
    }
}

/// A `Content-Length` value: ASCII digits, at most [`MAX_BODY`].
fn parse_length(value: &str) -> Result<usize, String> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("Content-Length {value:?} is not a number"));
    }
    match value.parse::<usize>() {
        Ok(n) if n <= MAX_BODY => Ok(n),
        _ => Err(format!(
            "Content-Length {value} is over the limit of {} MiB",
            MAX_BODY >> 20
        )),
    }
}

/// Why a `Content-Type` cannot be read (its charset is not UTF-8), if it cannot.
fn unsupported_charset(value: &str) -> Option<String> {
    let charset = value.split(';').skip(1).find_map(|p| {
        let (k, v) = p.split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("charset")
            .then(|| v.trim().trim_matches('"'))
    })?;
    match charset.to_ascii_lowercase().as_str() {
        "utf-8" | "utf8" => None,
        _ => Some(format!("unsupported charset {charset:?} (only UTF-8 is read)")),
    }
}

/// Where `Content-Length:` (in any case) starts in `buf`.
fn find_content_length(buf: &[u8]) -> Option<usize> {
    buf.windows(CONTENT_LENGTH.len())
        .position(|w| w.eq_ignore_ascii_case(CONTENT_LENGTH))
}

impl Framer {
    pub fn push(&mut self, bytes: &[u8]) {
        if self.pos > 0 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Reads on from `bytes` (the part of the last body that starts the next message) before
    /// what is still buffered.
    fn unread(&mut self, bytes: &[u8]) {
        self.buf.splice(self.pos..self.pos, bytes.iter().copied());
    }

    /// After a body that is not JSON: what follows, up to the next header, is the rest of a
    /// broken message (its `Content-Length` was too small), skipped without another answer.
    /// When the body itself holds a header (the length was too large), reading goes on there.
    pub fn after_bad_body(&mut self, body: &[u8]) {
        if let Some(at) = body.get(1..).and_then(find_content_length) {
            self.unread(&body[at + 1..]);
        }
        self.state = FrameState::Skip {
            quiet: true,
            skipped: 0,
        };
    }

    /// The next frame, if the bytes so far hold one. `eof`: no more bytes will come.
    pub fn next(&mut self, eof: bool) -> Option<Frame> {
        loop {
            let rest = &self.buf[self.pos..];
            match &mut self.state {
                FrameState::Header => {
                    let blank = rest
                        .iter()
                        .take_while(|b| matches!(b, b' ' | b'\t' | b'\r' | b'\n'))
                        .count();
                    self.pos += blank;
                    let rest = &self.buf[self.pos..];
                    if rest.is_empty() {
                        return None;
                    }
                    match parse_header(rest) {
                        Header::Partial if eof => {
                            tracing::warn!("the input ended inside a message header");
                            self.pos = self.buf.len();
                            return None;
                        }
                        Header::Partial => return None,
                        Header::Junk => {
                            self.pos += 1;
                            self.state = FrameState::Skip {
                                quiet: false,
                                skipped: 1,
                            };
                        }
                        Header::Bad { len, why } => {
                            self.pos += len;
                            self.state = FrameState::Skip {
                                quiet: true,
                                skipped: 0,
                            };
                            return Some(Frame::Fault(why));
                        }
                        Header::Ok { len, body, refuse } => {
                            self.pos += len;
                            self.state = FrameState::Body { len: body, refuse };
                        }
                    }
                }
                FrameState::Body { len, refuse } => {
                    if rest.len() < *len {
                        if eof {
                            tracing::warn!(
                                "the input ended inside a message ({} of {} bytes)",
                                rest.len(),
                                len
                            );
                            self.pos = self.buf.len();
                            self.state = FrameState::Header;
                        }
                        return None;
                    }
                    let len = *len;
                    let frame = match refuse.take() {
                        Some(why) => Frame::Fault(why),
                        None => Frame::Body(rest[..len].to_vec()),
                    };
                    self.pos += len;
                    self.state = FrameState::Header;
                    return Some(frame);
                }
                FrameState::Skip { quiet, skipped } => {
                    let found = find_content_length(rest);
                    let take = match found {
                        Some(at) => at,
                        None if eof => rest.len(),
                        // A header may have begun at the end: keep what could be its start.
                        None => rest.len().saturating_sub(CONTENT_LENGTH.len() - 1),
                    };
                    *skipped += take;
                    self.pos += take;
                    if found.is_none() && !eof {
                        return None;
                    }
                    let fault = (!*quiet && *skipped > 0)
                        .then(|| format!("skipped {skipped} bytes that are no message"));
                    self.state = FrameState::Header;
                    if let Some(why) = fault {
                        return Some(Frame::Fault(why));
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Decoding.

/// One message read from the client.
#[derive(Debug)]
pub enum Incoming {
    /// A request or notification for the service.
    Request(Request),
    /// A response to one of the server's requests.
    Response(Response),
    /// A fault: the answer to write back as it is.
    Reply(Value),
}

fn error_reply(id: Value, code: i64, message: impl Into<String>) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "error": { "code": code, "message": message.into() } })
}

/// A body's id as JSON-RPC allows it to be echoed: a string or a number, else `null`.
fn readable_id(message: &Value) -> Value {
    match message.get("id") {
        Some(id @ (Value::String(_) | Value::Number(_))) => id.clone(),
        _ => Value::Null,
    }
}

fn invalid(message: &Value, why: &str) -> Incoming {
    Incoming::Reply(error_reply(
        readable_id(message),
        INVALID_REQUEST,
        format!("Invalid Request: {why}"),
    ))
}

/// A body: a message, or the answer to a fault. The second value is set when the body is not
/// JSON (the framer then resynchronises, [`Framer::after_bad_body`]).
///
/// JSON that is no request, notification or response (a batch, `null`, a method that is no
/// string, an id of another type) is answered with -32600 and the request's id when it has a
/// string or number one, else `null`; batches are not supported (`[]` gets one error, each
/// element of another batch one). Lone UTF-16 surrogate escapes (`"\ud800"`, which
/// `JSON.stringify` writes for a broken surrogate pair) are read as U+FFFD, one UTF-16 unit
/// like the original, so positions stay right.
pub fn decode(body: &[u8]) -> (Incoming, bool) {
    let value = match serde_json::from_slice::<Value>(body) {
        Ok(v) => v,
        Err(e) => match repair_lone_surrogates(body).map(|b| serde_json::from_slice::<Value>(&b)) {
            Some(Ok(v)) => v,
            _ => {
                let why = if body.is_empty() {
                    "an empty body".to_owned()
                } else {
                    e.to_string()
                };
                return (
                    Incoming::Reply(error_reply(
                        Value::Null,
                        PARSE_ERROR,
                        format!("Parse error: {why}"),
                    )),
                    true,
                );
            }
        },
    };
    (classify(value), false)
}

/// A JSON value as a JSON-RPC message.
fn classify(value: Value) -> Incoming {
    let obj = match &value {
        Value::Object(o) => o,
        Value::Array(a) if a.is_empty() => return invalid(&value, "an empty batch"),
        Value::Array(a) => {
            let each = a
                .iter()
                .map(|m| {
                    error_reply(
                        readable_id(m),
                        INVALID_REQUEST,
                        "Invalid Request: batches are not supported",
                    )
                })
                .collect();
            return Incoming::Reply(Value::Array(each));
        }
        _ => return invalid(&value, "not an object"),
    };
    let version_ok = obj.get("jsonrpc") == Some(&json!("2.0"));
    if let Some(method) = obj.get("method") {
        if !method.is_string() {
            return invalid(&value, "the method is not a string");
        }
        if !version_ok {
            return invalid(&value, "jsonrpc is not \"2.0\"");
        }
        let id_ok = match obj.get("id") {
            None | Some(Value::Null | Value::String(_)) => true,
            Some(Value::Number(n)) => n.is_i64(),
            Some(_) => false,
        };
        if !id_ok {
            return invalid(&value, "the id is not a string or an integer of 64 bits");
        }
        let id = readable_id(&value);
        return match serde_json::from_value::<Request>(value) {
            Ok(r) => Incoming::Request(r),
            Err(e) => Incoming::Reply(error_reply(id, INVALID_REQUEST, format!("Invalid Request: {e}"))),
        };
    }
    if obj.contains_key("result") || obj.contains_key("error") {
        // Never answered: an answer to an answer could echo between the two ends.
        let id = readable_id(&value);
        return match serde_json::from_value::<Response>(value) {
            Ok(r) => Incoming::Response(r),
            Err(e) => {
                tracing::warn!("dropped a response (id {id}) that cannot be read: {e}");
                Incoming::Reply(Value::Null)
            }
        };
    }
    invalid(&value, "no method, result or error")
}

/// `body` with every lone UTF-16 surrogate escape inside a string replaced by `\ufffd`, or
/// `None` when it has none.
pub fn repair_lone_surrogates(body: &[u8]) -> Option<Vec<u8>> {
    /// The code unit of a `\uXXXX` escape at `at` (which holds the backslash).
    fn unit(b: &[u8], at: usize) -> Option<u16> {
        let hex = b.get(at..at + 6)?;
        if hex[0] != b'\\' || hex[1] != b'u' {
            return None;
        }
        u16::from_str_radix(std::str::from_utf8(&hex[2..]).ok()?, 16).ok()
    }
    let is_high = |u: u16| (0xD800..0xDC00).contains(&u);
    let is_low = |u: u16| (0xDC00..0xE000).contains(&u);
    let mut out = Vec::with_capacity(body.len());
    let (mut i, mut in_string, mut changed) = (0, false, false);
    while i < body.len() {
        let b = body[i];
        if !in_string {
            in_string = b == b'"';
            out.push(b);
            i += 1;
            continue;
        }
        match b {
            b'"' => {
                in_string = false;
                out.push(b);
                i += 1;
            }
            b'\\' => match unit(body, i) {
                Some(u) if is_high(u) && unit(body, i + 6).is_some_and(is_low) => {
                    out.extend_from_slice(&body[i..i + 12]);
                    i += 12;
                }
                Some(u) if is_high(u) || is_low(u) => {
                    out.extend_from_slice(b"\\ufffd");
                    changed = true;
                    i += 6;
                }
                _ => {
                    // Any other escape: the backslash and the character it escapes.
                    out.extend_from_slice(&body[i..(i + 2).min(body.len())]);
                    i += 2;
                }
            },
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    changed.then_some(out)
}

// ---------------------------------------------------------------------------------------
// The connection.

/// Serialized bodies for the writer.
type Output = mpsc::UnboundedSender<Vec<u8>>;

fn send(out: &Output, message: &impl serde::Serialize) {
    match serde_json::to_vec(message) {
        Ok(body) => {
            let _ = out.send(body);
        }
        Err(e) => tracing::error!("a message could not be written: {e}"),
    }
}

/// Reads frames from `input` and sends the messages they hold, answering faults through
/// `out`; ends at the end of the input.
async fn read_messages<I: AsyncRead + Unpin>(mut input: I, messages: mpsc::Sender<Incoming>, out: Output) {
    let mut framer = Framer::default();
    let mut chunk = vec![0u8; 64 << 10];
    let mut eof = false;
    loop {
        while let Some(frame) = framer.next(eof) {
            let incoming = match frame {
                Frame::Fault(why) => {
                    tracing::warn!("client input: {why}");
                    Incoming::Reply(error_reply(
                        Value::Null,
                        PARSE_ERROR,
                        format!("Parse error: {why}"),
                    ))
                }
                Frame::Body(body) => {
                    let (incoming, not_json) = decode(&body);
                    if not_json {
                        framer.after_bad_body(&body);
                    }
                    incoming
                }
            };
            match incoming {
                Incoming::Reply(Value::Null) => {}
                Incoming::Reply(reply) => {
                    tracing::warn!("client input answered with {reply}");
                    send(&out, &reply);
                }
                message => {
                    if messages.send(message).await.is_err() {
                        return;
                    }
                }
            }
        }
        if eof {
            return;
        }
        match input.read(&mut chunk).await {
            Ok(0) => eof = true,
            Ok(n) => framer.push(&chunk[..n]),
            Err(e) => {
                tracing::warn!("reading the client's input failed: {e}");
                eof = true;
            }
        }
    }
}

/// Writes each body as one frame; closes the output when every sender is gone.
async fn write_frames<O: AsyncWrite + Unpin>(
    mut output: O,
    mut bodies: mpsc::UnboundedReceiver<Vec<u8>>,
    mut closing: oneshot::Receiver<()>,
) {
    let mut frames = Vec::new();
    let mut closed = false;
    loop {
        // Once closing, only what is queued still goes out (a handler stuck in its thread may
        // hold a sender for ever).
        let body = if closed {
            bodies.try_recv().ok()
        } else {
            tokio::select! {
                body = bodies.recv() => body,
                _ = &mut closing => {
                    closed = true;
                    bodies.try_recv().ok()
                }
            }
        };
        let Some(body) = body else { break };
        frames.clear();
        let mut next = Some(body);
        // Whatever else is queued goes out in the same write.
        while let Some(body) = next {
            frames.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
            frames.extend_from_slice(&body);
            next = if frames.len() < 1 << 20 {
                bodies.try_recv().ok()
            } else {
                None
            };
        }
        if let Err(e) = async {
            output.write_all(&frames).await?;
            output.flush().await
        }
        .await
        {
            tracing::warn!("writing to the client failed: {e}");
            return;
        }
    }
    let _ = output.shutdown().await;
}

type Handler = Pin<Box<dyn Future<Output = (bool, Option<Response>)> + Send>>;

/// Polls the handlers as they come, all concurrently, and writes their answers. When no more
/// come, ends as soon as no request (a handler with an id) runs.
async fn run_handlers(
    mut handlers: mpsc::UnboundedReceiver<Handler>,
    out: Output,
    requests: Arc<AtomicUsize>,
) {
    let mut running = FuturesUnordered::new();
    let mut open = true;
    loop {
        if !open && requests.load(Ordering::SeqCst) == 0 {
            return;
        }
        tokio::select! {
            h = handlers.recv(), if open => match h {
                Some(h) => running.push(h),
                None => open = false,
            },
            Some((request, response)) = running.next(), if !running.is_empty() => {
                if let Some(r) = response {
                    send(&out, &r);
                }
                if request {
                    requests.fetch_sub(1, Ordering::SeqCst);
                }
            }
        }
    }
}

/// What the dispatcher waits for besides the service: the next message read, or the next
/// message the service sends the client.
enum Event {
    /// `None`: the input ended.
    Read(Option<Incoming>),
    /// `None`: the service will send nothing more.
    ToClient(Option<Request>),
}

/// The next [`Event`], whichever comes first (neither is preferred, so a client that keeps
/// sending cannot hold up the server's own requests, nor the other way round).
async fn next_event(
    messages: &mut mpsc::Receiver<Incoming>,
    to_client: &mut (impl futures::Stream<Item = Request> + Unpin),
    to_client_open: bool,
) -> Event {
    tokio::select! {
        m = messages.recv() => Event::Read(m),
        r = to_client.next(), if to_client_open => Event::ToClient(r),
    }
}

/// Hands one request to `service` (ready: its `poll_ready` answered `Ready(Ok)`) and its
/// handler to the runner; returns `Err` once the runner is gone, else, for `initialize`, what
/// resolves once its answer is out (the dispatcher holds what follows until then).
fn dispatch<S>(
    service: &mut S,
    req: Request,
    handlers: &mpsc::UnboundedSender<Handler>,
    out: &Output,
    requests: &Arc<AtomicUsize>,
    shutdown: &Arc<AtomicBool>,
) -> Result<Option<oneshot::Receiver<()>>, ()>
where
    S: Service<Request, Response = Option<Response>>,
    S::Future: Send + 'static,
    S::Error: Display,
{
    let id = req.id().cloned();
    if id.is_some() && requests.load(Ordering::SeqCst) >= MAX_REQUESTS {
        let mut error = Error::new(ErrorCode::ServerError(REQUEST_FAILED));
        error.message = format!("laya: {MAX_REQUESTS} requests are running; try again").into();
        send(out, &Response::from_error(id.unwrap_or_default(), error));
        return Ok(None);
    }
    let method = req.method().to_owned();
    let answer = service.call(req);
    if id.is_some() {
        requests.fetch_add(1, Ordering::SeqCst);
    }
    let (initialized, initializing) = if method == "initialize" && id.is_some() {
        let (tx, rx) = oneshot::channel();
        (Some(tx), Some(rx))
    } else {
        (None, None)
    };
    let shutdown = shutdown.clone();
    let handler: Handler = Box::pin(async move {
        let response = match answer.await {
            Ok(r) => r,
            Err(e) => {
                tracing::error!("{method}: {e}");
                None
            }
        };
        let response = match (response, &id) {
            // Requests the service drops (`$/` methods it does not know): LSP asks for
            // MethodNotFound.
            (None, Some(id)) => {
                let mut error = Error::method_not_found();
                error.data = Some(Value::String(method.clone()));
                Some(Response::from_error(id.clone(), error))
            }
            (r, _) => r,
        };
        if method == "shutdown" && response.as_ref().is_some_and(Response::is_ok) {
            shutdown.store(true, Ordering::SeqCst);
        }
        // The service is initialized (or is not, when it failed): what waits may go. Dropped
        // unsent (the handler dropped at the end), it says the same.
        if let Some(tx) = initialized {
            let _ = tx.send(());
        }
        (id.is_some(), response)
    });
    handlers.send(handler).map_err(|_| ())?;
    Ok(initializing)
}

/// Serves `service` on `input`/`output` until `exit` or the end of the input.
///
/// The dispatcher hands requests to the service in the order read (a request's handler starts
/// before the next message's; while `initialize` runs, what follows waits for it), client
/// responses to the socket, server→client messages to the writer. It sleeps until one of three
/// things wakes it, preferred in this order: `initialize` answered (a oneshot its handler
/// completes), the service ready for the next waiting request (tower's `poll_ready`, with this
/// task's waker), and a message read or one the service sends the client. No timer: tower-lsp's
/// `LspService` answers `Pending` without arranging a wake-up only while it initializes, and
/// then nothing asks it. The runner polls the handlers' futures concurrently in one task; a
/// request beyond [`MAX_REQUESTS`] is answered -32803 at once, and one the service leaves
/// unanswered (`$/` methods it does not know) gets MethodNotFound, as LSP asks.
///
/// The end: `exit`, or the end of the input (handled as `exit`), stops reading at once; the
/// service cancels what still runs and its requests are answered (RequestCancelled) for up to
/// [`EXIT_GRACE`], the output is flushed for up to [`EXIT_GRACE`] more, and this returns
/// whatever still runs (a notification waiting on the client, a model loading): `laya lsp`
/// then leaves without waiting for it.
pub async fn serve<I, O, S>(input: I, output: O, mut service: S, socket: ClientSocket) -> Ending
where
    I: AsyncRead + Unpin + Send + 'static,
    O: AsyncWrite + Unpin + Send + 'static,
    S: Service<Request, Response = Option<Response>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Display,
{
    let (mut to_client, mut from_client) = socket.split();
    let (out, bodies) = mpsc::unbounded_channel();
    let (close_writer, closing) = oneshot::channel();
    let mut writer = tokio::spawn(write_frames(output, bodies, closing));
    let (messages_tx, mut messages) = mpsc::channel(64);
    let reader = tokio::spawn(read_messages(input, messages_tx, out.clone()));
    let (handlers, handlers_rx) = mpsc::unbounded_channel::<Handler>();
    let requests = Arc::new(AtomicUsize::new(0));
    let mut runner = tokio::spawn(run_handlers(handlers_rx, out.clone(), requests.clone()));
    let shutdown = Arc::new(AtomicBool::new(false));

    // Requests read and not yet handed to the service, in the order read.
    let mut waiting: VecDeque<Request> = VecDeque::new();
    // While `initialize` runs, what follows waits (tower-lsp would answer it "not
    // initialized"): resolves once `initialize` is answered.
    let mut initializing: Option<oneshot::Receiver<()>> = None;
    let mut to_client_open = true;
    let reason = loop {
        // In this order: `initialize`'s end lets what waits go; what waits goes to the service
        // as soon as it is ready (before the next message is read, so `shutdown` then `exit`
        // in one write are both handled); then whatever comes next.
        tokio::select! {
            biased;
            _ = async { initializing.as_mut().expect("initialize runs").await }, if initializing.is_some() => {
                initializing = None;
            }
            ready = futures::future::poll_fn(|cx| service.poll_ready(cx)),
                if initializing.is_none() && !waiting.is_empty() =>
            {
                if let Err(e) = ready {
                    tracing::error!("the language server stopped: {e}");
                    break EndReason::Exit;
                }
                let req = waiting.pop_front().expect("a request waits");
                match dispatch(&mut service, req, &handlers, &out, &requests, &shutdown) {
                    Ok(init) => initializing = init,
                    Err(()) => break EndReason::Exit,
                }
            }
            event = next_event(&mut messages, &mut to_client, to_client_open) => match event {
                Event::Read(None) => break EndReason::EndOfInput,
                Event::Read(Some(Incoming::Request(req))) if req.method() == "exit" => break EndReason::Exit,
                Event::Read(Some(Incoming::Request(req))) => waiting.push_back(req),
                Event::Read(Some(Incoming::Response(res))) => {
                    let _ = from_client.send(res).await;
                }
                Event::Read(Some(Incoming::Reply(reply))) => send(&out, &reply),
                Event::ToClient(Some(req)) => send(&out, &req),
                Event::ToClient(None) => to_client_open = false,
            },
        }
    };

    // The end: the service exits (its running requests are cancelled), reading stops, the
    // answers still coming get a moment, then the output is closed.
    reader.abort();
    // tower-lsp's `exit` takes effect in `call`; its future has nothing more to do.
    drop(service.call(Request::build("exit").finish()));
    drop(handlers);
    if tokio::time::timeout(EXIT_GRACE, &mut runner).await.is_err() {
        runner.abort();
    }
    drop(out);
    let _ = close_writer.send(());
    if tokio::time::timeout(EXIT_GRACE, &mut writer).await.is_err() {
        writer.abort();
    }
    Ending {
        reason,
        shutdown: shutdown.load(Ordering::SeqCst),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(input: &[&[u8]]) -> Vec<Frame> {
        let mut f = Framer::default();
        let mut out = vec![];
        for chunk in input {
            f.push(chunk);
            while let Some(x) = f.next(false) {
                out.push(x);
            }
        }
        while let Some(x) = f.next(true) {
            out.push(x);
        }
        out
    }

    fn body(s: &str) -> Frame {
        Frame::Body(s.as_bytes().to_vec())
    }

    #[test]
    fn frames_split_anywhere_with_headers_in_any_case_and_order() {
        let input = b"Content-Length: 2\r\n\r\n{}content-length: 3\r\nX-A: 1\r\nContent-Type: application/json; charset=\"UTF-8\"\r\n\r\n[1]\r\n\nContent-Length:1\n\n7";
        for cut in 0..input.len() {
            let got = frames(&[&input[..cut], &input[cut..]]);
            assert_eq!(got, vec![body("{}"), body("[1]"), body("7")], "cut at {cut}");
        }
        // One byte at a time.
        let chunks: Vec<&[u8]> = input.chunks(1).collect();
        assert_eq!(frames(&chunks), vec![body("{}"), body("[1]"), body("7")]);
    }

    fn faults(got: &[Frame]) -> Vec<&str> {
        got.iter()
            .filter_map(|f| match f {
                Frame::Fault(w) => Some(w.as_str()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn bad_headers_are_answered_once_and_reading_goes_on_at_the_next_header() {
        let next = "Content-Length: 2\r\n\r\n{}";
        for (bad, fault) in [
            ("Content-Length: abc\r\n\r\n{\"a\":1}", "not a number"),
            ("Content-Length: -5\r\n\r\n{\"a\":1}", "not a number"),
            ("Content-Length: \r\n\r\n{\"a\":1}", "not a number"),
            (
                "Content-Length: 99999999999999999999999\r\n\r\n{}",
                "over the limit",
            ),
            (
                "Content-Length: 67108865\r\n\r\n{\"a\":1}",
                "over the limit of 64 MiB",
            ),
            (
                "Content-Type: application/vscode-jsonrpc\r\n\r\n{\"a\":1}",
                "without Content-Length",
            ),
            (
                "Content-Length: 2\r\nContent-Length: 3\r\n\r\n{\"a\":1}",
                "two Content-Length",
            ),
            (
                "Content-Length: 7\r\nContent-Type: text/x; charset=latin1\r\n\r\n{\"a\":1}",
                "unsupported charset",
            ),
            ("{\"jsonrpc\":\"2.0\"}", "bytes that are no message"),
            ("\u{1}\u{2}garbage\r\n\r\n", "bytes that are no message"),
            (
                "Content-Length: \u{661}\u{662}\r\n\r\n{\"a\":1}",
                "bytes that are no message",
            ),
            (
                "Content-Length: 7\r\nno colon here\r\n\r\n{\"a\":1}",
                "bytes that are no message",
            ),
        ] {
            let input = format!("{bad}{next}");
            let got = frames(&[input.as_bytes()]);
            for cut in 0..input.len() {
                let (a, b) = input.as_bytes().split_at(cut);
                assert_eq!(frames(&[a, b]), got, "{bad:?} cut at {cut}");
            }
            let f = faults(&got);
            assert_eq!(f.len(), 1, "{bad:?}: {got:?}");
            assert!(f[0].contains(fault), "{bad:?}: {got:?}");
            assert_eq!(got.last(), Some(&body("{}")), "{bad:?}: {got:?}");
        }
    }

    #[test]
    fn a_header_block_too_long_is_skipped_and_a_header_inside_it_is_found() {
        let input = format!(
            "X-Pad: {}\r\nContent-Length: 2\r\n\r\n{{}}",
            "a".repeat(MAX_HEADER)
        );
        let got = frames(&[input.as_bytes()]);
        assert_eq!(faults(&got).len(), 1, "{got:?}");
        assert_eq!(got.last(), Some(&body("{}")));
    }

    #[test]
    fn a_body_cut_by_the_end_of_the_input_ends_with_it() {
        assert_eq!(frames(&[b"Content-Length: 10\r\n\r\n{}"]), vec![]);
        assert_eq!(frames(&[b"Content-Len"]), vec![]);
        // Bytes that are no message are answered at the end too.
        assert_eq!(faults(&frames(&[b"\x00\x01"])).len(), 1);
        // Whitespace between messages is no fault.
        assert_eq!(frames(&[b"\r\n \t\n"]), vec![]);
    }

    #[test]
    fn a_body_that_is_not_json_resynchronises_at_the_next_header_inside_or_after_it() {
        // Content-Length too large: the body holds the start of the next message.
        let mut f = Framer::default();
        f.push(b"Content-Length: 30\r\n\r\n{\"a\":1}Content-Length: 2\r\n\r\n{}");
        let Some(Frame::Body(b)) = f.next(false) else {
            panic!()
        };
        assert!(decode(&b).1);
        f.after_bad_body(&b);
        assert_eq!(f.next(false), Some(body("{}")));
        // Too small: the rest of the body is skipped without another fault.
        let mut f = Framer::default();
        f.push(b"Content-Length: 4\r\n\r\n{\"a\":1}Content-Length: 2\r\n\r\n{}");
        let Some(Frame::Body(b)) = f.next(false) else {
            panic!()
        };
        assert!(decode(&b).1);
        f.after_bad_body(&b);
        assert_eq!(f.next(false), Some(body("{}")));
        assert_eq!(f.next(true), None);
    }

    fn reply(body: &str) -> Value {
        match decode(body.as_bytes()) {
            (Incoming::Reply(v), _) => v,
            (other, _) => panic!("{body}: {other:?}"),
        }
    }

    #[test]
    fn json_that_is_no_message_is_an_invalid_request_with_the_id_it_has() {
        for (body, id) in [
            ("null", json!(null)),
            ("42", json!(null)),
            ("{}", json!(null)),
            ("[]", json!(null)),
            (r#"{"method":"x","id":3}"#, json!(3)),
            (r#"{"jsonrpc":"1.0","method":"x","id":"a"}"#, json!("a")),
            (r#"{"jsonrpc":"2.0","method":42,"id":1}"#, json!(1)),
            (r#"{"jsonrpc":"2.0","method":"x","id":1.5}"#, json!(1.5)),
            (r#"{"jsonrpc":"2.0","method":"x","id":true}"#, json!(null)),
            (
                r#"{"jsonrpc":"2.0","method":"x","id":9223372036854775808}"#,
                json!(9223372036854775808u64),
            ),
            (r#"{"jsonrpc":"2.0","id":5}"#, json!(5)),
        ] {
            let r = reply(body);
            assert_eq!(r["error"]["code"], INVALID_REQUEST, "{body}: {r}");
            assert_eq!(r["id"], id, "{body}: {r}");
        }
        let r = reply(r#"[{"jsonrpc":"2.0","method":"x","id":1},7]"#);
        assert_eq!(r[0]["id"], 1, "{r}");
        assert_eq!(r[1]["id"], Value::Null, "{r}");
        assert_eq!(r[1]["error"]["code"], INVALID_REQUEST, "{r}");
        for body in ["", "{", "{bad}", "{\"a\":1}x", "\u{ff}"] {
            let r = reply(body);
            assert_eq!(r["error"]["code"], PARSE_ERROR, "{body:?}: {r}");
            assert_eq!(r["id"], Value::Null);
        }
        // Responses are never answered, not even unreadable ones.
        assert!(matches!(
            decode(br#"{"jsonrpc":"2.0","id":1,"result":2}"#).0,
            Incoming::Response(_)
        ));
        assert!(matches!(
            decode(br#"{"jsonrpc":"2.0","id":{},"result":2}"#).0,
            Incoming::Reply(Value::Null)
        ));
    }

    /// A service that is ready only once the test opens it (waking whoever waits, as tower
    /// asks) and whose `initialize` answers only once the test lets it; it counts how often
    /// it is asked whether it is ready and records the methods called, in order.
    #[derive(Clone, Default)]
    struct Gated {
        open: Arc<AtomicBool>,
        waker: Arc<std::sync::Mutex<Option<std::task::Waker>>>,
        polls: Arc<AtomicUsize>,
        calls: Arc<std::sync::Mutex<Vec<String>>>,
        initialize: Arc<tokio::sync::Notify>,
    }

    impl Gated {
        fn open(&self) {
            self.open.store(true, Ordering::SeqCst);
            if let Some(w) = self.waker.lock().unwrap().take() {
                w.wake();
            }
        }
    }

    impl Service<Request> for Gated {
        type Response = Option<Response>;
        type Error = std::convert::Infallible;
        type Future = Pin<Box<dyn Future<Output = Result<Option<Response>, Self::Error>> + Send>>;

        fn poll_ready(
            &mut self,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), Self::Error>> {
            self.polls.fetch_add(1, Ordering::SeqCst);
            if self.open.load(Ordering::SeqCst) {
                return std::task::Poll::Ready(Ok(()));
            }
            *self.waker.lock().unwrap() = Some(cx.waker().clone());
            std::task::Poll::Pending
        }

        fn call(&mut self, req: Request) -> Self::Future {
            let method = req.method().to_owned();
            self.calls.lock().unwrap().push(method.clone());
            let initialize = self.initialize.clone();
            Box::pin(async move {
                if method == "initialize" {
                    initialize.notified().await;
                }
                Ok(req.id().cloned().map(|id| Response::from_ok(id, json!(method))))
            })
        }
    }

    struct Nothing;

    impl tower_lsp_server::LanguageServer for Nothing {
        async fn initialize(
            &self,
            _: tower_lsp_server::lsp_types::InitializeParams,
        ) -> tower_lsp_server::jsonrpc::Result<tower_lsp_server::lsp_types::InitializeResult> {
            Ok(Default::default())
        }

        async fn shutdown(&self) -> tower_lsp_server::jsonrpc::Result<()> {
            Ok(())
        }
    }

    async fn write_request(to: &mut (impl AsyncWrite + Unpin), id: i64, method: &str) {
        let body = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": {} }).to_string();
        let frame = format!("Content-Length: {}\r\n\r\n{body}", body.len());
        to.write_all(frame.as_bytes()).await.unwrap();
    }

    /// The next message the server writes, or `None` when none comes within `wait`.
    async fn read_message(
        from: &mut (impl AsyncRead + Unpin),
        framer: &mut Framer,
        wait: Duration,
    ) -> Option<Value> {
        let mut chunk = [0u8; 4096];
        tokio::time::timeout(wait, async {
            loop {
                if let Some(Frame::Body(b)) = framer.next(false) {
                    return serde_json::from_slice(&b).unwrap();
                }
                let n = from.read(&mut chunk).await.unwrap();
                assert!(n > 0, "the server closed its output");
                framer.push(&chunk[..n]);
            }
        })
        .await
        .ok()
    }

    /// The dispatcher waits for the service as tower says (woken by it, not asking again on a
    /// timer), and holds what follows `initialize` until `initialize` is answered.
    #[tokio::test]
    async fn requests_wait_for_the_service_to_wake_the_dispatcher_and_for_initialize() {
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let (server_in, server_out) = tokio::io::split(server);
        let (mut from_server, mut to_server) = tokio::io::split(&mut client);
        let gated = Gated::default();
        let (_lsp, socket) = tower_lsp_server::LspService::new(|_| Nothing);
        let served = tokio::spawn(serve(server_in, server_out, gated.clone(), socket));
        let mut framer = Framer::default();
        let quiet = Duration::from_millis(300);

        write_request(&mut to_server, 1, "initialize").await;
        write_request(&mut to_server, 2, "ping").await;
        assert_eq!(read_message(&mut from_server, &mut framer, quiet).await, None);
        // Asked once when `initialize` came and at most once more when `ping` was read: not
        // again and again while it is not ready.
        let polls = gated.polls.load(Ordering::SeqCst);
        assert!((1..=3).contains(&polls), "{polls} polls while closed");
        assert!(gated.calls.lock().unwrap().is_empty());

        gated.open();
        let wait = Duration::from_secs(5);
        // `initialize` is called; `ping` waits for its answer.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(*gated.calls.lock().unwrap(), ["initialize"]);
        assert_eq!(read_message(&mut from_server, &mut framer, quiet).await, None);
        gated.initialize.notify_one();
        let a = read_message(&mut from_server, &mut framer, wait).await.unwrap();
        assert_eq!(
            (a["id"].clone(), a["result"].clone()),
            (json!(1), json!("initialize")),
            "{a}"
        );
        let b = read_message(&mut from_server, &mut framer, wait).await.unwrap();
        assert_eq!(
            (b["id"].clone(), b["result"].clone()),
            (json!(2), json!("ping")),
            "{b}"
        );
        assert_eq!(*gated.calls.lock().unwrap(), ["initialize", "ping"]);

        drop(to_server);
        drop(from_server);
        drop(client);
        let ending = tokio::time::timeout(wait, served).await.unwrap().unwrap();
        assert_eq!(ending.reason, EndReason::EndOfInput);
    }

    #[test]
    fn lone_surrogate_escapes_read_as_replacement_characters() {
        let repaired = |s: &str| repair_lone_surrogates(s.as_bytes()).map(|b| String::from_utf8(b).unwrap());
        assert_eq!(repaired(r#"["a\ud800b"]"#).as_deref(), Some(r#"["a\ufffdb"]"#));
        assert_eq!(
            repaired(r#"["\uDC00\ud83d\ude00\ud83d"]"#).as_deref(),
            Some(r#"["\ufffd\ud83d\ude00\ufffd"]"#)
        );
        // An escaped backslash before `u` is no escape; valid pairs are left alone.
        assert_eq!(repaired(r#"["\\ud800", "\ud83d\ude00"]"#), None);
        let (Incoming::Request(r), false) =
            decode(br#"{"jsonrpc":"2.0","method":"m","params":{"t":"x\ud800y"}}"#)
        else {
            panic!()
        };
        assert_eq!(r.params().unwrap()["t"], "x\u{fffd}y");
    }
}
