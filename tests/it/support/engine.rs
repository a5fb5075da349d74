//! The tests' one fake engine: a deterministic stand-in for a model, for the tests of what
//! lies around the engine (the LSP server, its transport, the completion pipeline). It
//! answers from a script, at once or after a delay, or never, or once its model has
//! "loaded" ([`Load`]); it records every prompt.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use laya::engine::{
    family::Family, send_whole, Cancel, Choice, CompletionOutput, CompletionRequest, Engine, EngineError,
    FinishReason, ModelFacts, ModelKey, ModelState, PieceSender, RunsOn, Timing,
};

type Script = Box<dyn Fn(&str) -> Vec<String> + Send + Sync>;

/// A model load that ends when the test says so: until [`Load::finish`] the engine reports
/// `Loading` and its requests wait (a cancelled one gives up at once); then it reports
/// `Ready`, to itself and to whoever [`Load::report_to`] named.
pub struct Load {
    done: tokio::sync::watch::Sender<bool>,
    report: Mutex<Option<laya::lsp::StateReport>>,
}

impl Load {
    pub fn new() -> Arc<Load> {
        Arc::new(Load {
            done: tokio::sync::watch::Sender::new(false),
            report: Mutex::new(None),
        })
    }

    /// Who hears the state once the load ends (the LSP server's report of a deferred engine).
    pub fn report_to(&self, report: laya::lsp::StateReport) {
        *self.report.lock().unwrap() = Some(report);
    }

    pub fn finish(&self) {
        self.done.send_replace(true);
        if let Some(report) = self.report.lock().unwrap().take() {
            report(&ready());
        }
    }

    fn is_done(&self) -> bool {
        *self.done.borrow()
    }

    async fn wait(&self) {
        let _ = self.done.subscribe().wait_for(|d| *d).await;
    }
}

fn ready() -> ModelState {
    ModelState::ready_on("fake")
}

pub struct FakeEngine {
    /// The candidates for a prompt.
    script: Script,
    /// How long an answer takes; a cancelled request is answered at once.
    delay: Duration,
    /// Never answers, cancelled or not, and reports its model loading.
    stuck: bool,
    parameters: Option<u64>,
    /// The model's load, when it has one to wait for.
    load: Option<Arc<Load>>,
    prompts: Mutex<Vec<String>>,
    /// Requests whose cancel came while they waited out their delay.
    cancelled: AtomicUsize,
}

impl FakeEngine {
    /// Answers every request with the one candidate `text`, at once.
    pub fn answering(text: &str) -> FakeEngine {
        let text = text.to_owned();
        FakeEngine::scripted(move |_| vec![text.clone()])
    }

    /// Answers each request with the candidates `script(prompt)` (none: an empty answer).
    pub fn scripted(script: impl Fn(&str) -> Vec<String> + Send + Sync + 'static) -> FakeEngine {
        FakeEngine {
            script: Box::new(script),
            delay: Duration::ZERO,
            stuck: false,
            parameters: None,
            load: None,
            prompts: Mutex::new(vec![]),
            cancelled: AtomicUsize::new(0),
        }
    }

    /// Never answers and ignores its cancel: a model busy for ever (or still loading).
    pub fn stuck() -> FakeEngine {
        FakeEngine {
            stuck: true,
            ..FakeEngine::scripted(|_| vec![])
        }
    }

    /// Answers after `delay`, or at once when the request is cancelled.
    pub fn delayed(self, delay: Duration) -> FakeEngine {
        FakeEngine { delay, ..self }
    }

    /// Loading until `load` finishes: requests wait for it (or for their cancel).
    pub fn loading(self, load: Arc<Load>) -> FakeEngine {
        FakeEngine {
            load: Some(load),
            ..self
        }
    }

    /// Reports `parameters` as its model's size.
    pub fn with_parameters(self, parameters: Option<u64>) -> FakeEngine {
        FakeEngine { parameters, ..self }
    }

    pub fn shared(self) -> Arc<FakeEngine> {
        Arc::new(self)
    }

    /// The prompts received so far, in order.
    pub fn prompts(&self) -> Vec<String> {
        self.prompts.lock().unwrap().clone()
    }

    /// Requests cancelled while they waited out the engine's delay.
    pub fn cancelled(&self) -> usize {
        self.cancelled.load(Ordering::SeqCst)
    }

    /// Until `n` prompts have come (or ten seconds passed): for work the server starts on its
    /// own, beside the requests.
    pub async fn until_prompts(&self, n: usize) -> Vec<String> {
        let end = tokio::time::Instant::now() + Duration::from_secs(10);
        while self.prompts().len() < n && tokio::time::Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        self.prompts()
    }

    /// The last prompt received.
    pub fn last_prompt(&self) -> String {
        self.prompts().pop().expect("a prompt reached the engine")
    }
}

#[async_trait::async_trait]
impl Engine for FakeEngine {
    async fn complete(
        &self,
        req: CompletionRequest,
        cancel: Cancel,
        pieces: Option<PieceSender>,
    ) -> Result<CompletionOutput, EngineError> {
        if let Some(load) = &self.load {
            tokio::select! {
                _ = cancel.cancelled() => return Err(EngineError::Cancelled),
                _ = load.wait() => {}
            }
        }
        self.prompts.lock().unwrap().push(req.prompt.clone());
        if self.stuck {
            return futures::future::pending().await;
        }
        if !self.delay.is_zero() {
            tokio::select! {
                _ = cancel.cancelled() => {
                    self.cancelled.fetch_add(1, Ordering::SeqCst);
                }
                _ = tokio::time::sleep(self.delay) => {}
            }
        }
        let choices = (self.script)(&req.prompt)
            .into_iter()
            .map(|text| Choice {
                text,
                finish_reason: FinishReason::StopToken,
                tokens: 1,
                logprob: None,
            })
            .collect();
        let out = CompletionOutput {
            served_by: None,
            choices,
            timing: Timing::default(),
        };
        send_whole(&out, pieces.as_ref());
        Ok(out)
    }

    fn state(&self) -> ModelState {
        if self.stuck || self.load.as_ref().is_some_and(|l| !l.is_done()) {
            return ModelState::Loading;
        }
        ready()
    }

    /// With `with_parameters`, that size; stated as a remote model's, so the router has no
    /// speed to estimate (as for a fake without facts).
    fn facts(&self, _model: ModelKey) -> Option<ModelFacts> {
        let parameters = self.parameters?;
        Some(ModelFacts {
            parameters: Some(parameters),
            active_parameters: None,
            bits: 8,
            runs_on: RunsOn::Remote,
            family: Family::default(),
        })
    }
}
