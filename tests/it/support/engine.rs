//! The tests' one fake engine: a deterministic stand-in for a model, for the tests of what
//! lies around the engine (the LSP server, its transport, the completion pipeline). It
//! answers from a script, at once or after a delay, or never; it records every prompt.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use laya::engine::{
    Cancel, Choice, CompletionOutput, CompletionRequest, Engine, EngineError, FinishReason, ModelState,
    Timing,
};

type Script = Box<dyn Fn(&str) -> Vec<String> + Send + Sync>;

pub struct FakeEngine {
    /// The candidates for a prompt.
    script: Script,
    /// How long an answer takes; a cancelled request is answered at once.
    delay: Duration,
    /// Never answers, cancelled or not, and reports its model loading.
    stuck: bool,
    parameters: Option<u64>,
    prompts: Mutex<Vec<String>>,
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
            prompts: Mutex::new(vec![]),
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
    ) -> Result<CompletionOutput, EngineError> {
        self.prompts.lock().unwrap().push(req.prompt.clone());
        if self.stuck {
            return futures::future::pending().await;
        }
        if !self.delay.is_zero() {
            tokio::select! {
                _ = cancel.cancelled() => {}
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
        Ok(CompletionOutput {
            served_by: None,
            choices,
            timing: Timing::default(),
        })
    }

    fn state(&self) -> ModelState {
        if self.stuck {
            return ModelState::Loading;
        }
        ModelState::Ready {
            load_time: Duration::ZERO,
            device: "fake".into(),
        }
    }

    fn parameters(&self) -> Option<u64> {
        self.parameters
    }
}
