//! `$/progress` for work the server starts itself (the model loading, the workspace index):
//! a token the client is asked to create, bounded in time, and notifications sent only when
//! it did; nothing at all to a client that did not offer `window.workDoneProgress`.
//!
//! [`ModelProgress`] follows the model's loading: a `begin` when it starts, a `report` when a
//! completion request has to wait for it, an `end` when it is ready or failed, in that order
//! (one task sends them all), with the logs and the error shown to the user that go with them.

use tokio::sync::mpsc;
use tower_lsp_server::{
    lsp_types::{notification::Progress as ProgressNote, request::WorkDoneProgressCreate, *},
    Client,
};

use crate::engine::ModelState;

/// A progress token the client accepted, or not (then reports go nowhere).
#[derive(Clone)]
pub struct Progress {
    client: Client,
    token: NumberOrString,
    accepted: bool,
}

impl Progress {
    /// Ask the client to create `token` when it `supported` progress (its
    /// `window.workDoneProgress` capability); bounded like the configuration request, so that
    /// a client that never answers keeps nothing waiting longer.
    pub async fn create(client: &Client, token: &str, supported: bool) -> Progress {
        let token = NumberOrString::String(token.into());
        let accepted = supported
            && matches!(
                tokio::time::timeout(
                    super::CONFIGURATION_TIMEOUT,
                    client.send_request::<WorkDoneProgressCreate>(WorkDoneProgressCreateParams {
                        token: token.clone()
                    }),
                )
                .await,
                Ok(Ok(()))
            );
        Progress {
            client: client.clone(),
            token,
            accepted,
        }
    }

    pub async fn send(&self, value: WorkDoneProgress) {
        if self.accepted {
            self.client
                .send_notification::<ProgressNote>(ProgressParams {
                    token: self.token.clone(),
                    value: ProgressParamsValue::WorkDone(value),
                })
                .await;
        }
    }
}

/// The progress token of the model's loading.
pub const MODEL_TOKEN: &str = "laya/model";

/// What the model's progress hears.
enum ModelEvent {
    State(ModelState),
    /// A completion request waits for the model to load.
    Waiting,
}

/// The model's loading as the client sees it. Cheap to clone; every clone feeds one task,
/// which sends in the order things happened. Each load (the first, and a daemon started again
/// later) is a progress of its own: a fresh `window/workDoneProgress/create`, then `begin`,
/// `report`s and `end`.
#[derive(Clone)]
pub struct ModelProgress {
    events: mpsc::UnboundedSender<ModelEvent>,
}

impl ModelProgress {
    /// Start the task that reports to `client` (progress only when it `supported` it).
    pub fn start(client: Client, supported: bool) -> ModelProgress {
        let (events, rx) = mpsc::unbounded_channel();
        tokio::spawn(follow(client, supported, rx));
        ModelProgress { events }
    }

    /// The model's state changed (from any thread).
    pub fn state(&self, state: &ModelState) {
        let _ = self.events.send(ModelEvent::State(state.clone()));
    }

    /// A completion request waits for the model to load.
    pub fn waiting(&self) {
        let _ = self.events.send(ModelEvent::Waiting);
    }
}

async fn follow(client: Client, supported: bool, mut events: mpsc::UnboundedReceiver<ModelEvent>) {
    // The progress of the load under way, if one is; and whether it said a request waits.
    let mut open: Option<(Progress, bool)> = None;
    let mut last = ModelState::Loading;
    while let Some(event) = events.recv().await {
        let state = match event {
            ModelEvent::Waiting => {
                if let Some((progress, said @ false)) = &mut open {
                    *said = true;
                    progress
                        .send(WorkDoneProgress::Report(WorkDoneProgressReport {
                            message: Some("a completion waits for the model".into()),
                            ..Default::default()
                        }))
                        .await;
                }
                continue;
            }
            ModelEvent::State(s) => s,
        };
        // A model that fails while loading is shown to the user (the fix is theirs to make);
        // a failure after it was ready (a daemon that died) is only logged, as the next
        // request recovers from it.
        let was_loading = matches!(std::mem::replace(&mut last, state.clone()), ModelState::Loading);
        if state == ModelState::Loading {
            if open.is_none() {
                let progress = Progress::create(&client, MODEL_TOKEN, supported).await;
                progress
                    .send(WorkDoneProgress::Begin(WorkDoneProgressBegin {
                        title: "laya: loading model".into(),
                        ..Default::default()
                    }))
                    .await;
                open = Some((progress, false));
                client.log_message(MessageType::INFO, "laya: loading model").await;
            }
            continue;
        }
        let (message, log) = match &state {
            ModelState::Ready {
                load_time, device, ..
            } => {
                let msg = format!("ready on {device} in {:.1} s", load_time.as_secs_f64());
                (msg.clone(), format!("laya: model {msg}"))
            }
            ModelState::Failed(e) => (
                format!("failed: {e}"),
                if was_loading {
                    format!("laya: no completions: the model failed to load: {e}")
                } else {
                    format!("laya: no completions: {e}")
                },
            ),
            ModelState::Loading => unreachable!("handled above"),
        };
        if let Some((progress, _)) = open.take() {
            progress
                .send(WorkDoneProgress::End(WorkDoneProgressEnd {
                    message: Some(message),
                }))
                .await;
        }
        let failed = matches!(state, ModelState::Failed(_));
        if failed && was_loading {
            client.show_message(MessageType::ERROR, log.clone()).await;
        }
        let level = if failed {
            MessageType::ERROR
        } else {
            MessageType::INFO
        };
        client.log_message(level, log).await;
    }
}
