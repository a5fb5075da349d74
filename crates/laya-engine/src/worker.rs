//! One model on its own thread. MLX state never touches an async executor: requests arrive
//! over a channel and answers go back through oneshot channels. Loading happens on the
//! thread too, so whoever spawns a worker (e.g. `initialize` in the LSP) never waits for it.
//! The load itself is a [`Loader`]: [`LocalModel::load`], or what a test puts in its place
//! (a load it holds until it says so).

use std::{
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc::{self, Receiver, Sender},
        Arc, Mutex,
    },
};

use tokio::sync::oneshot;

use crate::{
    cancel::Cancel,
    generate::Meter,
    load::{EngineLoadError, LoadOptions},
    local::LocalModel,
    runtime::{use_device, DevicePref},
    seam::{
        CompletionOutput, CompletionRequest, Engine, EngineError, FinishReason, ModelFacts, ModelKey,
        ModelState, PieceSender, WorkStats,
    },
};

type LoadFn = dyn Fn(&Path, &LoadOptions) -> Result<LocalModel, EngineLoadError> + Send + Sync;

/// How a worker makes its model of a path: [`LocalModel::load`] by default.
#[derive(Clone)]
pub struct Loader(Arc<LoadFn>);

impl Loader {
    pub fn new(
        load: impl Fn(&Path, &LoadOptions) -> Result<LocalModel, EngineLoadError> + Send + Sync + 'static,
    ) -> Loader {
        Loader(Arc::new(load))
    }

    pub(crate) fn load(&self, path: &Path, opts: &LoadOptions) -> Result<LocalModel, EngineLoadError> {
        (self.0)(path, opts)
    }
}

impl Default for Loader {
    fn default() -> Loader {
        Loader::new(LocalModel::load)
    }
}

impl std::fmt::Debug for Loader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Loader")
    }
}

/// A worker's [`WorkStats`], kept as atomics.
#[derive(Debug, Default)]
struct Work {
    meter: Arc<Meter>,
    busy: AtomicBool,
    requests: AtomicU64,
    cancelled: AtomicU64,
}

impl Work {
    fn stats(&self) -> WorkStats {
        let m = &self.meter;
        WorkStats {
            busy: self.busy.load(Ordering::SeqCst),
            requests: self.requests.load(Ordering::SeqCst),
            cancelled: self.cancelled.load(Ordering::SeqCst),
            prefill_chunks: m.prefill_chunks.load(Ordering::SeqCst),
            prefill_tokens: m.prefill_tokens.load(Ordering::SeqCst),
            decode_steps: m.decode_steps.load(Ordering::SeqCst),
        }
    }

    /// One request ended (or was skipped).
    fn ended(&self, cancelled: bool) {
        self.requests.fetch_add(1, Ordering::SeqCst);
        if cancelled {
            self.cancelled.fetch_add(1, Ordering::SeqCst);
        }
    }
}

struct Job {
    req: CompletionRequest,
    cancel: Cancel,
    pieces: Option<PieceSender>,
    reply: oneshot::Sender<Result<CompletionOutput, EngineError>>,
}

/// Handle to a model thread. Dropping every handle ends the thread after its current job.
pub struct ModelWorker {
    jobs: Mutex<Sender<Job>>,
    state: Arc<Mutex<ModelState>>,
    /// The loaded model's facts, set once it is ready.
    facts: Arc<std::sync::OnceLock<ModelFacts>>,
    work: Arc<Work>,
}

impl ModelWorker {
    /// Start the thread and begin loading `path`; `on_state` hears every state change.
    pub fn spawn(
        path: PathBuf,
        opts: LoadOptions,
        device: DevicePref,
        on_state: impl Fn(&ModelState) + Send + 'static,
    ) -> ModelWorker {
        ModelWorker::spawn_with(path, opts, device, Loader::default(), on_state)
    }

    /// [`ModelWorker::spawn`] with the model made by `loader`.
    pub(crate) fn spawn_with(
        path: PathBuf,
        opts: LoadOptions,
        device: DevicePref,
        loader: Loader,
        on_state: impl Fn(&ModelState) + Send + 'static,
    ) -> ModelWorker {
        let started = std::time::Instant::now();
        let (tx, rx) = mpsc::channel::<Job>();
        let state = Arc::new(Mutex::new(ModelState::Loading));
        let shared = state.clone();
        let facts = Arc::new(std::sync::OnceLock::new());
        let known = facts.clone();
        let work = Arc::new(Work::default());
        let counted = work.clone();
        std::thread::Builder::new()
            .name("laya-model".into())
            .spawn(move || {
                let set = |s: ModelState| {
                    on_state(&s);
                    *shared.lock().unwrap_or_else(|p| p.into_inner()) = s;
                };
                let loaded = use_device(device)
                    .map_err(|e| EngineError::Unavailable(e.to_string()))
                    .and_then(|dev| {
                        loader
                            .load(&path, &opts)
                            .map(|m| (m, dev))
                            .map_err(EngineError::from)
                    });
                let loaded = loaded.and_then(|(model, device)| {
                    let warm = model.warmup()?;
                    tracing::info!(warmup_ms = warm.as_millis() as u64, "model warmed up");
                    Ok((model, device))
                });
                match loaded {
                    Ok((model, device)) => {
                        let _ = known.set(model.facts());
                        set(ModelState::Ready {
                            load_time: model.loaded.load_time,
                            time_to_ready: started.elapsed(),
                            from_cache: model.loaded.from_cache,
                            device,
                        });
                        serve(model, rx, &counted);
                    }
                    Err(e) => {
                        let msg = e.to_string();
                        set(ModelState::Failed(msg.clone()));
                        // Keep answering, so callers get the reason instead of a closed channel.
                        for job in rx {
                            counted.ended(false);
                            let _ = job.reply.send(Err(EngineError::Unavailable(format!(
                                "model failed to load: {msg}"
                            ))));
                        }
                    }
                }
            })
            .expect("spawn the model thread");
        ModelWorker {
            jobs: Mutex::new(tx),
            state,
            facts,
            work,
        }
    }
}

fn serve(model: LocalModel, rx: Receiver<Job>, work: &Work) {
    work.meter.install();
    for job in rx {
        if job.reply.is_closed() || job.cancel.is_cancelled() {
            // The caller stopped waiting while the job was queued (or the model loaded).
            tracing::debug!("generation skipped: cancelled before it started");
            work.ended(true);
            continue;
        }
        work.busy.store(true, Ordering::SeqCst);
        let span = tracing::info_span!("generate", prompt_bytes = job.req.prompt.len());
        let _guard = span.enter();
        let out = match &job.pieces {
            Some(tx) => model.complete_streaming(&job.req, &job.cancel, |i, piece| {
                let _ = tx.send((i, piece.to_owned()));
            }),
            None => model.complete(&job.req, &job.cancel),
        };
        let cancelled = match &out {
            Ok(o) => {
                tracing::debug!(
                    tokens = o.timing.generated_tokens,
                    prefilled = o.timing.prefilled_tokens,
                    finish = ?o.choices.iter().map(|c| c.finish_reason).collect::<Vec<_>>(),
                    "generation ended"
                );
                o.choices
                    .iter()
                    .any(|c| c.finish_reason == FinishReason::Cancelled)
            }
            Err(e) => {
                tracing::debug!(error = %e, "generation failed");
                false
            }
        };
        work.ended(cancelled);
        work.busy.store(false, Ordering::SeqCst);
        let _ = job.reply.send(out);
    }
}

impl ModelWorker {
    async fn submit(
        &self,
        req: CompletionRequest,
        cancel: Cancel,
        pieces: Option<PieceSender>,
    ) -> Result<CompletionOutput, EngineError> {
        let (reply, answer) = oneshot::channel();
        // Cancel the job if this future is dropped (the client gave up or a newer request won).
        let mut guard = cancel.guard();
        self.jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(Job {
                req,
                cancel,
                pieces,
                reply,
            })
            .map_err(|_| EngineError::Unavailable("the model thread has stopped".into()))?;
        let out = answer
            .await
            .map_err(|_| EngineError::Unavailable("the model thread has stopped".into()))?;
        guard.disarm();
        out
    }
}

#[async_trait::async_trait]
impl Engine for ModelWorker {
    async fn complete(
        &self,
        req: CompletionRequest,
        cancel: Cancel,
        pieces: Option<PieceSender>,
    ) -> Result<CompletionOutput, EngineError> {
        self.submit(req, cancel, pieces).await
    }

    fn state(&self) -> ModelState {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The loaded model's, whatever the key (a worker holds one model); `None` until it is
    /// ready.
    fn facts(&self, _model: ModelKey) -> Option<ModelFacts> {
        self.facts.get().copied()
    }

    fn work(&self, _model: ModelKey) -> Option<WorkStats> {
        Some(self.work.stats())
    }
}
