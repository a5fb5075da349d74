//! [`DaemonEngine`]: the [`Engine`] `laya lsp` uses to reach `laya serve` over the unix
//! socket. When no daemon answers it starts one (a detached `laya serve` with the editor's
//! model flags) and waits for its socket; when the daemon dies, the request that finds it
//! gone starts a new one. Meanwhile requests fail with a clear error and the editor keeps
//! working without completions.

use std::{
    io::{Read, Seek, SeekFrom},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::Stdio,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncWriteExt, BufReader},
    net::UnixStream,
};

use super::{
    paths,
    protocol::{
        ClientMessage, DaemonStatus, ModelStatus, ServerMessage, WireRequest, MAX_LINE_BYTES,
        PROTOCOL_VERSION,
    },
    server::read_line_limited,
};
use crate::engine::{
    Cancel, CompletionOutput, CompletionRequest, Engine, EngineError, ModelFacts, ModelKey, ModelState,
    PieceSender,
};

/// How to start the daemon: the program (this binary) and its arguments (`serve …`).
#[derive(Clone, Debug)]
pub struct SpawnCommand {
    pub program: PathBuf,
    pub args: Vec<String>,
}

#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// The daemon's directory ([`paths::runtime_dir`]).
    pub runtime_dir: PathBuf,
    /// How to start a daemon when none answers; `None`: never start one.
    pub spawn: Option<SpawnCommand>,
    /// This client's name for fair queueing (`lsp 4242`).
    pub client: String,
    /// How long a started daemon may take to open its socket.
    pub start_timeout: Duration,
}

impl ClientConfig {
    pub fn socket(&self) -> PathBuf {
        self.runtime_dir.join(paths::SOCKET)
    }
}

type Report = Box<dyn Fn(&ModelState) + Send>;

struct Inner {
    cfg: ClientConfig,
    state: Mutex<ModelState>,
    /// The daemon's pool's facts of each model key, as it last reported them (for
    /// [`Engine::facts`]).
    facts: Mutex<std::collections::BTreeMap<String, ModelFacts>>,
    report: Mutex<Report>,
    /// Held while a daemon is being started, so concurrent requests start one.
    starting: tokio::sync::Mutex<()>,
    /// A task polls the daemon's state until its default model is ready.
    watching: AtomicBool,
}

/// Cheap to clone; clones share the state.
#[derive(Clone)]
pub struct DaemonEngine {
    inner: Arc<Inner>,
}

/// The daemon could not be reached or answered out of protocol.
fn err(msg: impl Into<String>) -> EngineError {
    EngineError::Transport(msg.into())
}

impl DaemonEngine {
    /// A client of the daemon at `cfg.runtime_dir`; `report` hears every change of the
    /// default model's state. Inside a tokio runtime this also connects (starting the
    /// daemon if needed) and follows the model's loading in the background.
    pub fn new(cfg: ClientConfig, report: impl Fn(&ModelState) + Send + 'static) -> DaemonEngine {
        let engine = DaemonEngine {
            inner: Arc::new(Inner {
                cfg,
                state: Mutex::new(ModelState::Loading),
                facts: Mutex::new(Default::default()),
                report: Mutex::new(Box::new(report)),
                starting: tokio::sync::Mutex::new(()),
                watching: AtomicBool::new(false),
            }),
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            engine.watch();
        }
        engine
    }

    fn set_state(&self, s: ModelState) {
        let mut cur = self.inner.state.lock().unwrap_or_else(|p| p.into_inner());
        if *cur != s {
            *cur = s.clone();
            drop(cur);
            (self.inner.report.lock().unwrap_or_else(|p| p.into_inner()))(&s);
        }
    }

    /// Poll the daemon (starting it if needed) until its default model is ready or failed.
    fn watch(&self) {
        if self.inner.watching.swap(true, Ordering::SeqCst) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            loop {
                match this.status().await {
                    Ok(st) => {
                        if st.version != env!("CARGO_PKG_VERSION") || st.protocol != PROTOCOL_VERSION {
                            tracing::warn!(
                                daemon = st.version,
                                protocol = st.protocol,
                                "the running laya daemon (pid {}) is another version; restart it to use this one",
                                st.pid
                            );
                        }
                        *this.inner.facts.lock().unwrap_or_else(|p| p.into_inner()) = st.model_facts.clone();
                        let s = state_of(&st);
                        let loading = s == ModelState::Loading;
                        this.set_state(s);
                        if !loading {
                            break;
                        }
                    }
                    Err(e) => {
                        this.set_state(ModelState::Failed(e.to_string()));
                        break;
                    }
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            this.inner.watching.store(false, Ordering::SeqCst);
        });
    }

    async fn connect(&self) -> std::io::Result<UnixStream> {
        UnixStream::connect(self.inner.cfg.socket()).await
    }

    /// A connection to the daemon, starting one when none answers.
    async fn connect_or_start(&self) -> Result<UnixStream, EngineError> {
        let first = match self.connect().await {
            Ok(s) => return Ok(s),
            Err(e) => e,
        };
        if self.inner.cfg.spawn.is_none() {
            return Err(err(format!(
                "no laya daemon at {} ({first}); start one with `laya serve`",
                self.inner.cfg.socket().display()
            )));
        }
        let _guard = self.inner.starting.lock().await;
        if let Ok(s) = self.connect().await {
            return Ok(s); // another request started it meanwhile
        }
        self.set_state(ModelState::Loading);
        match self.start_daemon().await {
            Ok(s) => Ok(s),
            Err(e) => {
                self.set_state(ModelState::Failed(e.to_string()));
                Err(e)
            }
        }
    }

    /// Start `laya serve` detached (its own process group, stdio away from the editor's
    /// pipes, stderr to `serve.log`) and wait for its socket.
    async fn start_daemon(&self) -> Result<UnixStream, EngineError> {
        let cfg = &self.inner.cfg;
        let Some(spawn) = &cfg.spawn else {
            return Err(err("no laya daemon is running"));
        };
        let dir = &cfg.runtime_dir;
        paths::ensure_private_dir(dir)
            .map_err(|e| err(format!("runtime directory {}: {e}", dir.display())))?;
        let log_path = dir.join(paths::LOG);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| err(format!("{}: {e}", log_path.display())))?;
        let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
        tracing::info!(program = %spawn.program.display(), args = ?spawn.args, "starting the laya daemon");
        let mut child = std::process::Command::new(&spawn.program)
            .args(&spawn.args)
            .env("LAYA_RUNTIME_DIR", dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .process_group(0)
            .spawn()
            .map_err(|e| err(format!("starting {}: {e}", spawn.program.display())))?;
        let deadline = Instant::now() + cfg.start_timeout;
        let mut exited = None;
        loop {
            if let Ok(s) = self.connect().await {
                if exited.is_none() {
                    // Reap it when it ends, so it never lingers as a zombie of the editor.
                    std::thread::spawn(move || {
                        let _ = child.wait();
                    });
                }
                return Ok(s);
            }
            if exited.is_none() {
                if let Ok(Some(status)) = child.try_wait() {
                    // 3: another daemon holds the directory (started at the same moment);
                    // its socket is about to appear.
                    if status.code() != Some(3) {
                        return Err(err(format!(
                            "laya serve exited ({status}): {}",
                            log_tail(&log_path, log_start)
                        )));
                    }
                    exited = Some(status);
                }
            }
            if Instant::now() > deadline {
                return Err(err(format!(
                    "laya serve did not open {} within {} s; its log ({}): {}",
                    cfg.socket().display(),
                    cfg.start_timeout.as_secs(),
                    log_path.display(),
                    log_tail(&log_path, log_start)
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The daemon's status (starting it if needed).
    pub async fn status(&self) -> Result<DaemonStatus, EngineError> {
        let stream = self.connect_or_start().await?;
        match exchange(stream, &ClientMessage::Status, None).await? {
            ServerMessage::Status { status } => Ok(status),
            other => Err(err(format!("laya daemon: unexpected answer {other:?}"))),
        }
    }

    async fn run(
        &self,
        req: CompletionRequest,
        cancel: Cancel,
        pieces: Option<PieceSender>,
    ) -> Result<CompletionOutput, EngineError> {
        let stream = self.connect_or_start().await?;
        let msg = ClientMessage::Complete {
            client: Some(self.inner.cfg.client.clone()),
            stream: pieces.is_some(),
            request: WireRequest::from(&req),
        };
        let talk = exchange(stream, &msg, pieces.as_ref());
        // Returning early drops the connection, which cancels the request in the daemon.
        let answer = tokio::select! {
            a = talk => a,
            _ = cancel.cancelled() => return Err(EngineError::Cancelled),
        };
        match answer {
            Ok(ServerMessage::Done { output }) => {
                if matches!(self.state(), ModelState::Failed(_) | ModelState::Loading) {
                    self.watch();
                }
                Ok(output.into_output())
            }
            Ok(ServerMessage::Error { error }) => Err(error.into_engine_error()),
            Ok(other) => Err(err(format!("laya daemon: unexpected answer {other:?}"))),
            Err(e) => {
                self.set_state(ModelState::Failed(format!(
                    "{e}; the daemon is started again on the next request"
                )));
                Err(e)
            }
        }
    }
}

/// Send one message and read the answer up to its last line; pieces go to `pieces`.
async fn exchange(
    stream: UnixStream,
    msg: &ClientMessage,
    pieces: Option<&PieceSender>,
) -> Result<ServerMessage, EngineError> {
    let (rd, mut wr) = stream.into_split();
    let mut line = serde_json::to_vec(msg).map_err(|e| err(e.to_string()))?;
    line.push(b'\n');
    wr.write_all(&line)
        .await
        .map_err(|e| err(format!("laya daemon: sending the request: {e}")))?;
    let mut rd = BufReader::new(rd);
    loop {
        let line = match read_line_limited(&mut rd, MAX_LINE_BYTES).await {
            Ok(Some(l)) => l,
            Ok(None) => return Err(err("the laya daemon closed the connection before answering")),
            Err(e) => return Err(err(format!("laya daemon: {e}"))),
        };
        let msg: ServerMessage =
            serde_json::from_str(&line).map_err(|e| err(format!("laya daemon: unreadable answer: {e}")))?;
        match msg {
            ServerMessage::Piece { index, text } => {
                if let Some(tx) = pieces {
                    let _ = tx.send((index, text));
                }
            }
            other => return Ok(other),
        }
    }
}

/// The daemon's default model in its status.
fn default_model(st: &DaemonStatus) -> Option<&ModelStatus> {
    st.models.iter().find(|m| m.id == st.default).or_else(|| {
        let tier = st.default.parse::<ModelKey>().ok()?.tier;
        st.models.iter().find(|m| m.tier == tier.label())
    })
}

/// The state the LSP shows for a daemon: that of its default model.
fn state_of(st: &DaemonStatus) -> ModelState {
    let default = default_model(st);
    match st.status.as_str() {
        "loading" => ModelState::Loading,
        "failed" => ModelState::Failed(
            default
                .and_then(|m| m.error.clone())
                .unwrap_or_else(|| "the daemon's default model failed to load".into()),
        ),
        _ => ModelState::Ready {
            load_time: secs(default.and_then(|m| m.load_time_ms)),
            time_to_ready: secs(default.and_then(|m| m.time_to_ready_ms)),
            from_cache: default.and_then(|m| m.from_cache).unwrap_or(false),
            device: format!(
                "{} (laya serve, pid {})",
                default
                    .and_then(|m| m.device.clone())
                    .unwrap_or_else(|| "loads on first use".into()),
                st.pid
            ),
        },
    }
}

/// Milliseconds a status states as a duration (0 where it states none).
fn secs(ms: Option<f64>) -> Duration {
    Duration::from_secs_f64(ms.unwrap_or(0.0).max(0.0) / 1e3)
}

/// The last line a started daemon wrote to its log.
fn log_tail(path: &Path, from: u64) -> String {
    let mut text = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let _ = f.seek(SeekFrom::Start(from));
        let _ = f.take(64 << 10).read_to_string(&mut text);
    }
    text.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("(nothing)")
        .to_owned()
}

#[async_trait::async_trait]
impl Engine for DaemonEngine {
    async fn complete(
        &self,
        req: CompletionRequest,
        cancel: Cancel,
        pieces: Option<PieceSender>,
    ) -> Result<CompletionOutput, EngineError> {
        self.run(req, cancel, pieces).await
    }

    fn state(&self) -> ModelState {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The daemon's pool's answer for `model`, as its status last said.
    fn facts(&self, model: ModelKey) -> Option<ModelFacts> {
        let facts = self.inner.facts.lock().unwrap_or_else(|p| p.into_inner());
        facts.get(&model.to_string()).copied()
    }
}

/// The status of the daemon at `runtime_dir`, without starting one (blocking; for scripts,
/// benchmarks and tests).
pub fn status_blocking(runtime_dir: &Path, timeout: Duration) -> Result<DaemonStatus, String> {
    let socket = runtime_dir.join(paths::SOCKET);
    let s =
        std::os::unix::net::UnixStream::connect(&socket).map_err(|e| format!("{}: {e}", socket.display()))?;
    status_over(s, timeout)
}

/// [`status_blocking`], with `None` where no daemon runs (no socket, or one nothing listens
/// on: a daemon that was killed).
pub fn status_if_running(runtime_dir: &Path, timeout: Duration) -> Result<Option<DaemonStatus>, String> {
    use std::io::ErrorKind;
    let socket = runtime_dir.join(paths::SOCKET);
    match std::os::unix::net::UnixStream::connect(&socket) {
        Ok(s) => status_over(s, timeout).map(Some),
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::ConnectionRefused) => Ok(None),
        Err(e) => Err(format!("{}: {e}", socket.display())),
    }
}

fn status_over(mut s: std::os::unix::net::UnixStream, timeout: Duration) -> Result<DaemonStatus, String> {
    use std::io::{BufRead, Write};
    s.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    s.write_all(b"{\"op\":\"status\"}\n").map_err(|e| e.to_string())?;
    let mut line = String::new();
    std::io::BufReader::new(s)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    match serde_json::from_str::<ServerMessage>(&line).map_err(|e| format!("{e}: {line}"))? {
        ServerMessage::Status { status } => Ok(status),
        other => Err(format!("unexpected answer {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(models: serde_json::Value) -> DaemonStatus {
        serde_json::from_value(serde_json::json!({
            "status": "ok", "version": "0", "protocol": PROTOCOL_VERSION, "pid": 1, "uptime_s": 1.0,
            "socket": "s", "http": null, "default": "small/q8", "models": models,
            "queue": {"running": 0, "waiting": 0}
        }))
        .unwrap()
    }

    fn model(id: &str, parameters: Option<u64>) -> serde_json::Value {
        let mut m = serde_json::json!({
            "id": id, "tier": id.split('/').next().unwrap(), "precision": "q8", "name": id,
            "source": "local", "state": "ready", "load_time_ms": 5.0, "device": "cpu",
            "warm": true, "served": 0, "error": null
        });
        if let Some(p) = parameters {
            m["parameters"] = p.into();
        }
        m
    }

    /// The LSP shapes its prompts by the daemon's default model's size; a daemon that does
    /// not report one (an older version) leaves it unknown.
    #[test]
    fn the_default_models_size_comes_from_the_status() {
        let st = status(serde_json::json!([
            model("large/q8", Some(32_000_000_000)),
            model("small/q8", Some(494_000_000))
        ]));
        assert_eq!(default_model(&st).and_then(|m| m.parameters), Some(494_000_000));
        let old = status(serde_json::json!([model("small/q8", None)]));
        assert_eq!(default_model(&old).and_then(|m| m.parameters), None);
    }

    /// The router's facts of a model are the pool's answer for its key, as the status says;
    /// a key the status does not list, or a daemon that lists none (an older version), has none.
    #[test]
    fn facts_are_the_pools_answer_for_the_key() {
        use crate::engine::{Precision, RunsOn, Tier};
        let mut st = status(serde_json::json!([model("small/q8", Some(494_000_000))]));
        st.model_facts = serde_json::from_value(serde_json::json!({
            "small/q8": {"parameters": 494_000_000, "bits": 8, "runs_on": "gpu"},
            "large/q6": {"parameters": 1_540_000_000, "bits": 6, "runs_on": "cpu"},
        }))
        .unwrap();
        let engine = DaemonEngine::new(
            ClientConfig {
                runtime_dir: PathBuf::from("/nonexistent"),
                spawn: None,
                client: "test".into(),
                start_timeout: Duration::ZERO,
            },
            |_| {},
        );
        *engine.inner.facts.lock().unwrap() = st.model_facts.clone();
        let key = |tier, precision| ModelKey { tier, precision };
        let f = engine.facts(key(Tier::Small, Precision::Q8)).unwrap();
        assert_eq!(
            (f.parameters, f.bits, f.runs_on),
            (Some(494_000_000), 8, RunsOn::Gpu)
        );
        let f = engine.facts(key(Tier::Large, Precision::Q6)).unwrap();
        assert_eq!(
            (f.parameters, f.bits, f.runs_on),
            (Some(1_540_000_000), 6, RunsOn::Cpu)
        );
        assert_eq!(engine.facts(key(Tier::Small, Precision::Q4)), None);
        let old = status(serde_json::json!([model("small/q8", Some(494_000_000))]));
        assert!(
            old.model_facts.is_empty(),
            "an older daemon's status reads with no facts"
        );
    }
}
