//! The daemon itself: one [`ModelPool`] for every client, a fair queue per model, the unix
//! socket server, and the start-up and shut-down of `laya serve`.

use std::{
    collections::HashMap,
    net::SocketAddr,
    os::unix::fs::PermissionsExt,
    path::PathBuf,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, OnceLock,
    },
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::{UnixListener, UnixStream},
    sync::mpsc,
};

use super::{
    paths,
    protocol::{
        ClientMessage, DaemonStatus, ErrorKind, ModelStatus, QueueStatus, ServerMessage, WireError,
        WireOutput, MAX_LINE_BYTES, PROTOCOL_VERSION,
    },
    queue::{Busy, FairQueue},
};
use crate::engine::{
    pool::{ModelPool, PoolConfig, TierSource},
    Cancel, CompletionOutput, CompletionRequest, Engine, EngineError, ModelKey, ModelState, PieceSender,
    Precision, Tier,
};

/// Bounds on what one request may ask.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Most tokens one request may generate (`--max-tokens`).
    pub max_tokens: usize,
    /// Prompt plus generated tokens (`--max-seq-len`); prompts are measured by the same
    /// bytes-per-token estimate the prompt builder uses.
    pub max_seq_len: usize,
    /// Most candidates per request.
    pub max_n: usize,
    /// Largest HTTP request body.
    pub max_body_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_tokens: 512,
            max_seq_len: 8192,
            max_n: 8,
            max_body_bytes: 1 << 20,
        }
    }
}

/// Sampling for HTTP requests that leave it out.
#[derive(Clone, Debug)]
pub struct Defaults {
    pub max_tokens: usize,
    pub temperature: f32,
    pub top_p: f32,
}

impl Default for Defaults {
    fn default() -> Self {
        Defaults {
            max_tokens: 64,
            temperature: 0.0,
            top_p: 1.0,
        }
    }
}

#[derive(Clone, Debug)]
pub struct DaemonConfig {
    pub pool: PoolConfig,
    /// A name per tier for `/v1/models` and the health report (catalog name, file, URL).
    pub names: HashMap<Tier, String>,
    pub runtime_dir: PathBuf,
    /// Where to serve HTTP; `None`: no HTTP.
    pub http: Option<SocketAddr>,
    /// Bearer token HTTP requests must carry.
    pub token: Option<String>,
    pub limits: Limits,
    pub defaults: Defaults,
    /// Load the default model (and the preloads) at start; otherwise on the first request.
    pub warmup: bool,
    /// Requests run at once on a remote model (a local one runs one at a time).
    pub remote_slots: usize,
}

/// Why the daemon gave no answer: what the engine says (the pool, its models, and the
/// daemon's own checks of a request, which are the engine's kinds of error too), or what only
/// the daemon has, a full queue.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The model's queue is full: try again later.
    #[error("{0}")]
    Busy(String),
}

impl DaemonError {
    /// The OpenAI-style error type.
    pub fn kind(&self) -> ErrorKind {
        match self {
            DaemonError::Busy(_) => ErrorKind::RateLimitError,
            DaemonError::Engine(EngineError::BadRequest(_)) => ErrorKind::InvalidRequestError,
            DaemonError::Engine(EngineError::Unavailable(_)) => ErrorKind::ModelUnavailable,
            DaemonError::Engine(EngineError::Cancelled) => ErrorKind::Cancelled,
            DaemonError::Engine(EngineError::Transport(_)) => ErrorKind::ServerError,
        }
    }

    /// The HTTP status, by the error's kind: 400 for what the client can fix, 429 for a full
    /// queue, 503 for a model that cannot answer, 499 for a request given up, 502 for a model
    /// server elsewhere that failed.
    pub fn http_status(&self) -> u16 {
        match self.kind() {
            ErrorKind::InvalidRequestError => 400,
            ErrorKind::RateLimitError => 429,
            ErrorKind::ModelUnavailable => 503,
            ErrorKind::Cancelled => 499,
            ErrorKind::ServerError => 502,
            // `kind` never gives it: only a client reading a newer daemon meets it.
            ErrorKind::Unknown => 500,
        }
    }

    pub fn wire(&self) -> WireError {
        WireError {
            message: self.to_string(),
            kind: self.kind(),
        }
    }
}

impl From<Busy> for DaemonError {
    fn from(b: Busy) -> Self {
        DaemonError::Busy(b.0)
    }
}

/// A request the daemon's checks refuse: the client's to fix.
fn bad_request(message: String) -> DaemonError {
    DaemonError::Engine(EngineError::BadRequest(message))
}

/// What one request got, with the time it waited in line.
pub struct Served {
    pub output: CompletionOutput,
    pub queued: Duration,
    pub load_time: Option<Duration>,
    /// The model the request asked for, when another answered because it was still loading.
    pub stand_in_for: Option<ModelKey>,
}

impl Served {
    pub fn wire(&self) -> WireOutput {
        WireOutput {
            stand_in_for: self.stand_in_for,
            ..WireOutput::new(&self.output, self.queued, self.load_time)
        }
    }
}

pub struct Daemon {
    config: DaemonConfig,
    pool: OnceLock<Arc<ModelPool>>,
    pool_init: Mutex<()>,
    queue: Arc<FairQueue<ModelKey>>,
    served: Mutex<HashMap<ModelKey, u64>>,
    /// Requests dropped before their answer (their client went away).
    abandoned: AtomicU64,
    started: Instant,
    http_addr: Option<SocketAddr>,
}

/// Cancels the request and counts it abandoned when dropped before
/// [`disarm`](Abandoned::disarm): the future of a request whose client went away is
/// dropped (the socket handler returns, the HTTP server drops the handler, a stream's task
/// is aborted), which stops it wherever it is: in the queue, waiting for its model to load,
/// prefilling or decoding.
struct Abandoned<'a> {
    cancel: Cancel,
    abandoned: &'a AtomicU64,
    armed: bool,
}

impl Abandoned<'_> {
    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for Abandoned<'_> {
    fn drop(&mut self) {
        if self.armed {
            // The flag first: whoever sees the count sees the flag set.
            self.cancel.cancel();
            self.abandoned.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Daemon {
    pub fn new(config: DaemonConfig, http_addr: Option<SocketAddr>) -> Daemon {
        Daemon {
            config,
            pool: OnceLock::new(),
            pool_init: Mutex::new(()),
            queue: Arc::new(FairQueue::default()),
            served: Mutex::new(HashMap::new()),
            abandoned: AtomicU64::new(0),
            started: Instant::now(),
            http_addr,
        }
    }

    pub fn config(&self) -> &DaemonConfig {
        &self.config
    }

    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http_addr
    }

    /// The pool, created (and the default model loading) on first call.
    pub fn pool(&self) -> Result<Arc<ModelPool>, EngineError> {
        if let Some(p) = self.pool.get() {
            return Ok(p.clone());
        }
        let _guard = self.pool_init.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = self.pool.get() {
            return Ok(p.clone());
        }
        let report = Arc::new(|key: ModelKey, state: &ModelState| match state {
            ModelState::Loading => tracing::info!(model = %key, "loading"),
            ModelState::Ready {
                load_time,
                time_to_ready,
                from_cache,
                device,
            } => tracing::info!(
                model = %key,
                device,
                load_ms = load_time.as_millis() as u64,
                ready_ms = time_to_ready.as_millis() as u64,
                from_cache,
                "ready"
            ),
            ModelState::Failed(e) => tracing::error!(model = %key, error = %e, "failed to load"),
        });
        let pool = Arc::new(ModelPool::new(self.config.pool.clone(), report)?);
        let _ = self.pool.set(pool.clone());
        Ok(pool)
    }

    /// The model a name given by an HTTP client means: `small`/`large`, `small/q4`, or a
    /// tier's model name (`qwen2.5-coder-1.5b`), each at the default bit width unless given.
    /// Any other name means the default model (clients such as editors send the name their
    /// user typed); `tier/bits` that does not parse is an error.
    pub fn model_for_name(&self, name: Option<&str>) -> Result<ModelKey, DaemonError> {
        let default = self.config.pool.default;
        let Some(name) = name.map(str::trim).filter(|n| !n.is_empty()) else {
            return Ok(default);
        };
        let tier_of = |s: &str| {
            s.parse::<Tier>().ok().or_else(|| {
                self.config
                    .names
                    .iter()
                    .find(|(_, n)| n.as_str() == s)
                    .map(|(t, _)| *t)
            })
        };
        if let Some((tier, bits)) = name.split_once('/') {
            if let (Some(tier), Ok(precision)) = (tier_of(tier), bits.parse::<Precision>()) {
                return Ok(ModelKey { tier, precision });
            }
            if !name.contains("://") {
                return Err(bad_request(format!(
                    "model `{name}`: expected small|large[/native|q4|q6|q8] or a model name"
                )));
            }
        }
        Ok(match tier_of(name) {
            Some(tier) => ModelKey {
                tier,
                precision: default.precision,
            },
            None => default,
        })
    }

    /// A tier's name for clients.
    pub fn model_name(&self, tier: Tier) -> String {
        self.config
            .names
            .get(&tier)
            .cloned()
            .unwrap_or_else(|| tier.label().to_owned())
    }

    /// Check a request against the limits before it waits for anything.
    pub fn validate(&self, req: &CompletionRequest) -> Result<(), DaemonError> {
        let l = &self.config.limits;
        let bad = |m: String| Err(bad_request(m));
        if req.prompt.is_empty() {
            return bad("the prompt is empty".into());
        }
        if req.max_tokens == 0 {
            return bad("max_tokens must be at least 1".into());
        }
        if req.max_tokens > l.max_tokens {
            return bad(format!(
                "max_tokens {} is over this server's limit of {} (laya serve --max-tokens)",
                req.max_tokens, l.max_tokens
            ));
        }
        if req.n == 0 || req.n > l.max_n {
            return bad(format!("n must be between 1 and {}, got {}", l.max_n, req.n));
        }
        let s = &req.sampling;
        if !(0.0..=2.0).contains(&s.temperature) {
            return bad(format!(
                "temperature must be between 0 and 2, got {}",
                s.temperature
            ));
        }
        if !(s.top_p > 0.0 && s.top_p <= 1.0) {
            return bad(format!("top_p must be in (0, 1], got {}", s.top_p));
        }
        let prompt_tokens = req.prompt.len().div_ceil(crate::prompt::BYTES_PER_TOKEN);
        if prompt_tokens + req.max_tokens > l.max_seq_len {
            return bad(format!(
                "the prompt (about {prompt_tokens} tokens) plus max_tokens {} is over this server's \
                 sequence limit of {} (laya serve --max-seq-len)",
                req.max_tokens, l.max_seq_len
            ));
        }
        Ok(())
    }

    /// Run one request for `client`: validate, wait for the model's turn (round-robin
    /// across clients), generate. Dropping the future, or setting `cancel`, stops it.
    pub async fn complete(
        &self,
        client: &str,
        req: CompletionRequest,
        cancel: Cancel,
        pieces: Option<PieceSender>,
    ) -> Result<Served, DaemonError> {
        self.validate(&req)?;
        let pool = self.pool().map_err(|e| EngineError::Unavailable(e.to_string()))?;
        let want = req.model.unwrap_or(pool.config().default);
        let asked = pool.asked(want);
        // The pool's key: a remote tier is one model whatever the bits asked (one lane, one count).
        let (key, engine) = pool.resolve(want).map_err(|e| bad_request(e.to_string()))?;
        let stand_in_for = (key != asked).then_some(asked);
        if let Some(asked) = stand_in_for {
            tracing::info!(model = %asked, served_by = %key, "the model asked for is still loading: another answers");
        }
        if let ModelState::Failed(e) = engine.state() {
            return Err(EngineError::Unavailable(format!("model {key} failed to load: {e}")).into());
        }
        let mut guard = Abandoned {
            cancel: cancel.clone(),
            abandoned: &self.abandoned,
            armed: true,
        };
        let enqueued = Instant::now();
        let slots = if self.is_remote(key.tier) {
            self.config.remote_slots
        } else {
            1
        };
        let permit = self.queue.acquire(key, slots, client).await;
        let _permit = match permit {
            Ok(p) => p,
            Err(e) => {
                guard.disarm();
                return Err(e.into());
            }
        };
        let queued = enqueued.elapsed();
        if cancel.is_cancelled() {
            guard.disarm();
            return Err(EngineError::Cancelled.into());
        }
        let result = engine.complete(req, cancel.clone(), pieces).await;
        guard.disarm();
        let mut output = result?;
        if cancel.is_cancelled() {
            return Err(EngineError::Cancelled.into());
        }
        output.served_by = Some(key);
        *self
            .served
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key)
            .or_default() += 1;
        let load_time = match engine.state() {
            ModelState::Ready { load_time, .. } => Some(load_time),
            _ => None,
        };
        Ok(Served {
            output,
            queued,
            load_time,
            stand_in_for,
        })
    }

    /// Whether `tier`'s model is served elsewhere (its requests run `--remote-parallel` at
    /// once), as configured.
    fn is_remote(&self, tier: Tier) -> bool {
        matches!(self.config.pool.tiers.get(&tier), Some(TierSource::Remote(_)))
    }

    /// Everything `status` and `/health` report. What each model is (its facts and work) is
    /// the pool's answer, asked through the [`Engine`] seam.
    pub fn status(&self) -> DaemonStatus {
        // Read before the workers' counts: a request counted abandoned here has its cancel
        // flag set, so the counts read below include all a worker ran before it saw the flag.
        let abandoned = self.abandoned.load(Ordering::SeqCst);
        let served = self.served.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let cfg = &self.config.pool;
        let pool = self.pool.get();
        let states = pool.map(|p| p.states()).unwrap_or_default();
        let facts = |key: ModelKey| pool.and_then(|p| p.facts(key));
        let source = |tier: Tier| if self.is_remote(tier) { "remote" } else { "local" };
        let mut models = vec![];
        for (key, state) in &states {
            let remote = self.is_remote(key.tier);
            let n = served.get(key).copied().unwrap_or(0);
            let (state_name, load, ready, device, error) = match state {
                ModelState::Loading => ("loading", None, None, None, None),
                ModelState::Ready {
                    load_time,
                    time_to_ready,
                    from_cache,
                    device,
                } => (
                    "ready",
                    Some(super::protocol::ms(*load_time)),
                    Some((super::protocol::ms(*time_to_ready), *from_cache)),
                    Some(device.clone()),
                    None,
                ),
                ModelState::Failed(e) => ("failed", None, None, None, Some(e.clone())),
            };
            let facts = facts(*key);
            models.push(ModelStatus {
                id: key.to_string(),
                tier: key.tier.label().into(),
                precision: Some(key.precision.label().into()),
                name: self.model_name(key.tier),
                source: source(key.tier).into(),
                state: state_name.into(),
                load_time_ms: load,
                time_to_ready_ms: ready.map(|(ms, _)| ms),
                from_cache: ready.map(|(_, c)| c),
                // The loaded model's count (a model loading or failed has none yet).
                parameters: facts.and_then(|f| f.parameters).filter(|_| state_name == "ready"),
                facts,
                device,
                warm: state_name == "ready" && (!remote || n > 0),
                served: n,
                error,
                work: pool.and_then(|p| p.work(*key)),
            });
        }
        let mut tiers: Vec<Tier> = cfg.tiers.keys().copied().collect();
        tiers.sort_by_key(|t| *t as u8);
        for tier in &tiers {
            if states.iter().any(|(k, _)| k.tier == *tier) {
                continue;
            }
            models.push(ModelStatus {
                id: tier.label().into(),
                tier: tier.label().into(),
                precision: None,
                name: self.model_name(*tier),
                source: source(*tier).into(),
                state: "not_loaded".into(),
                load_time_ms: None,
                time_to_ready_ms: None,
                from_cache: None,
                parameters: None,
                facts: facts(ModelKey {
                    tier: *tier,
                    precision: cfg.default.precision,
                }),
                device: None,
                warm: false,
                served: 0,
                error: None,
                work: None,
            });
        }
        let model_facts = tiers
            .iter()
            .flat_map(|&tier| PRECISIONS.map(|precision| ModelKey { tier, precision }))
            .filter_map(|key| Some((key.to_string(), facts(key)?)))
            .collect();
        let default = pool.map(|p| p.asked(cfg.default));
        let default_state = states.iter().find(|(k, _)| Some(*k) == default);
        let status = match default_state.map(|(_, s)| s) {
            Some(ModelState::Ready { .. }) => "ok",
            Some(ModelState::Failed(_)) => "failed",
            Some(ModelState::Loading) => "loading",
            None => "ok", // nothing loads until the first request (--warmup false)
        };
        let (running, waiting) = self.queue.counts();
        DaemonStatus {
            status: status.into(),
            version: env!("CARGO_PKG_VERSION").into(),
            protocol: PROTOCOL_VERSION,
            pid: std::process::id(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            socket: self.config.runtime_dir.join(paths::SOCKET).display().to_string(),
            http: self.http_addr.map(|a| a.to_string()),
            default: cfg.default.to_string(),
            models,
            model_facts,
            queue: QueueStatus { running, waiting },
            abandoned,
        }
    }
}

/// Every bit width a request may ask a tier's model at.
const PRECISIONS: [Precision; 4] = [Precision::Native, Precision::Q4, Precision::Q6, Precision::Q8];

/// Accept connections until the listener fails for good.
pub async fn serve_socket(daemon: Arc<Daemon>, listener: UnixListener) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(handle_connection(daemon.clone(), stream));
            }
            Err(e) => {
                tracing::warn!(error = %e, "accepting a socket connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn write_message(w: &mut (impl AsyncWriteExt + Unpin), msg: &ServerMessage) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(msg).map_err(std::io::Error::other)?;
    line.push(b'\n');
    w.write_all(&line).await?;
    w.flush().await
}

/// Read one line of at most `max` bytes; `Ok(None)` at end of input.
pub async fn read_line_limited(
    r: &mut (impl tokio::io::AsyncBufRead + Unpin),
    max: usize,
) -> std::io::Result<Option<String>> {
    let mut buf = vec![];
    let n = r.take(max as u64 + 1).read_until(b'\n', &mut buf).await?;
    if n == 0 {
        return Ok(None);
    }
    if buf.last() != Some(&b'\n') && buf.len() > max {
        return Err(std::io::Error::other(format!("line longer than {max} bytes")));
    }
    String::from_utf8(buf)
        .map(|s| Some(s.trim_end_matches(['\r', '\n']).to_owned()))
        .map_err(|_| std::io::Error::other("the line is not UTF-8"))
}

async fn handle_connection(daemon: Arc<Daemon>, stream: UnixStream) {
    let pid = stream.peer_cred().ok().and_then(|c| c.pid());
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::new(rd);
    let error = |message: String| ServerMessage::Error {
        error: WireError {
            message,
            kind: ErrorKind::InvalidRequestError,
        },
    };
    let msg = match read_line_limited(&mut rd, MAX_LINE_BYTES).await {
        Ok(Some(line)) => match serde_json::from_str::<ClientMessage>(&line) {
            Ok(m) => m,
            Err(e) => {
                let _ = write_message(&mut wr, &error(format!("bad request line: {e}"))).await;
                return;
            }
        },
        Ok(None) => return,
        Err(e) => {
            let _ = write_message(&mut wr, &error(e.to_string())).await;
            return;
        }
    };
    let (client, stream_pieces, request) = match msg {
        ClientMessage::Status => {
            let status = daemon.status();
            let _ = write_message(&mut wr, &ServerMessage::Status { status }).await;
            return;
        }
        ClientMessage::Complete {
            client,
            stream,
            request,
        } => (client, stream, request),
    };
    let client = format!(
        "unix {}",
        client.unwrap_or_else(|| pid.map(|p| format!("pid {p}")).unwrap_or_else(|| "?".into()))
    );
    let cancel = Cancel::new();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let work = daemon.complete(
        &client,
        request.into(),
        cancel.clone(),
        stream_pieces.then_some(tx),
    );
    tokio::pin!(work);
    let mut scratch = [0u8; 512];
    let result = loop {
        tokio::select! {
            Some((index, text)) = rx.recv() => {
                if write_message(&mut wr, &ServerMessage::Piece { index, text }).await.is_err() {
                    cancel.cancel();
                    return;
                }
            }
            r = &mut work => break r,
            n = rd.read(&mut scratch) => {
                if matches!(n, Ok(0) | Err(_)) {
                    // The client closed the connection: drop the request (cancels it).
                    tracing::debug!(client, "client went away; cancelling");
                    cancel.cancel();
                    return;
                }
            }
        }
    };
    while let Ok((index, text)) = rx.try_recv() {
        if write_message(&mut wr, &ServerMessage::Piece { index, text })
            .await
            .is_err()
        {
            return;
        }
    }
    let reply = match result {
        Ok(served) => ServerMessage::Done {
            output: served.wire(),
        },
        Err(e) => ServerMessage::Error { error: e.wire() },
    };
    let _ = write_message(&mut wr, &reply).await;
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
    #[error("another laya daemon is running for {dir}{}", pid.map(|p| format!(" (pid {p})")).unwrap_or_default())]
    AlreadyRunning { dir: String, pid: Option<u32> },
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl ServeError {
    /// Exit status of `laya serve`: 3 when another daemon already serves the directory
    /// (`laya lsp` waits for that one's socket instead of failing).
    pub fn exit_code(&self) -> u8 {
        match self {
            ServeError::AlreadyRunning { .. } => 3,
            _ => 1,
        }
    }
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ServeError {
    let what = what.into();
    move |source| ServeError::Io { what, source }
}

/// Files of a running daemon, removed when it stops.
struct Cleanup(Vec<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// `laya serve`: take the runtime directory (one daemon per directory), bind the socket and
/// HTTP, start loading, and serve until SIGINT or SIGTERM.
pub async fn run(config: DaemonConfig) -> Result<(), ServeError> {
    let dir = config.runtime_dir.clone();
    paths::ensure_private_dir(&dir).map_err(io_err(format!("runtime directory {}", dir.display())))?;
    let lock_path = dir.join(paths::LOCK);
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(io_err(lock_path.display().to_string()))?;
    if rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
        return Err(ServeError::AlreadyRunning {
            dir: dir.display().to_string(),
            pid: paths::read_pid(&dir),
        });
    }
    // Holding the lock, no other daemon serves this directory: a socket file left here is
    // stale (a daemon that was killed), and is replaced.
    let socket = dir.join(paths::SOCKET);
    if std::fs::symlink_metadata(&socket).is_ok() {
        tracing::info!(socket = %socket.display(), "removing a stale socket");
        std::fs::remove_file(&socket).map_err(io_err(format!("removing stale {}", socket.display())))?;
    }
    // The pid file first: whoever sees the socket can read who serves it.
    let pid_file = dir.join(paths::PID);
    paths::write_atomic(&pid_file, &format!("{}\n", std::process::id()))
        .map_err(io_err(pid_file.display().to_string()))?;
    let mut cleanup = Cleanup(vec![pid_file]);
    // Created 0600 (umask), not only chmod-ed after: no moment with wider permissions.
    let umask = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o177));
    let bound = UnixListener::bind(&socket);
    rustix::process::umask(umask);
    let listener = bound.map_err(io_err(format!("binding {}", socket.display())))?;
    cleanup.0.push(socket.clone());
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))
        .map_err(io_err(socket.display().to_string()))?;

    let http = match config.http {
        Some(addr) => match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => Some(l),
            Err(e) => {
                eprintln!("laya serve: warning: no HTTP: cannot listen on {addr}: {e}");
                tracing::warn!(%addr, error = %e, "HTTP disabled");
                None
            }
        },
        None => None,
    };
    let http_addr = http.as_ref().and_then(|l| l.local_addr().ok());
    let addr_file = dir.join(paths::HTTP_ADDR);
    match http_addr {
        Some(a) => {
            paths::write_atomic(&addr_file, &format!("{a}\n"))
                .map_err(io_err(addr_file.display().to_string()))?;
            cleanup.0.push(addr_file);
            if !a.ip().is_loopback() && config.token.is_none() {
                eprintln!(
                    "laya serve: warning: HTTP on {a} without a token: anyone who can reach it may use it (--token-env)"
                );
            }
        }
        None => {
            let _ = std::fs::remove_file(&addr_file);
        }
    }

    let warmup = config.warmup;
    let daemon = Arc::new(Daemon::new(config, http_addr));
    if warmup {
        daemon.pool()?;
    }
    eprintln!(
        "laya serve: pid {} · socket {}{}",
        std::process::id(),
        socket.display(),
        http_addr.map(|a| format!(" · http://{a}")).unwrap_or_default()
    );

    let sockets = tokio::spawn(serve_socket(daemon.clone(), listener));
    let web = http.map(|l| tokio::spawn(super::http::serve(daemon.clone(), l)));
    shutdown_signal().await;
    tracing::info!("shutting down");
    sockets.abort();
    if let Some(w) = web {
        w.abort();
    }
    drop(cleanup);
    drop(lock);
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each error's HTTP status and wire kind, by what its sender can do about it.
    #[test]
    fn errors_map_to_a_status_and_a_kind_by_variant() {
        let m = || "m".to_owned();
        for (e, status, kind) in [
            (bad_request(m()), 400, ErrorKind::InvalidRequestError),
            (DaemonError::Busy(m()), 429, ErrorKind::RateLimitError),
            (
                EngineError::Unavailable(m()).into(),
                503,
                ErrorKind::ModelUnavailable,
            ),
            (EngineError::Cancelled.into(), 499, ErrorKind::Cancelled),
            (EngineError::Transport(m()).into(), 502, ErrorKind::ServerError),
        ] {
            let e: DaemonError = e;
            assert_eq!(
                (e.http_status(), e.kind(), e.wire().kind),
                (status, kind, kind),
                "{e:?}"
            );
        }
    }
}
