//! `laya lsp`: the language server on stdio, wired to its engine: the daemon (started with
//! the same settings when none runs), the models in this process (`--in-process`), or a
//! remote server (`--remote-url`).

use std::sync::Arc;

use anyhow::Result;
use laya::{
    config::ServeConfig,
    daemon::{paths, ClientConfig, DaemonEngine, SpawnCommand},
    engine::{
        pool::ModelPool,
        remote::{RemoteConfig, RemoteEngine},
        Cancel, CompletionOutput, CompletionRequest, Engine, EngineError, ModelKey, ModelState, PieceSender,
    },
    lsp::{serve_stdio, EngineSource},
};

use super::this_program;

/// Serve LSP on stdin/stdout until `exit` or the end of input; returns LSP's exit status (0
/// after `shutdown`, else 1). `serve` is the daemon's settings, or why they cannot work.
pub fn run(serve: Result<ServeConfig>, remote: Option<RemoteConfig>, in_process: bool) -> Result<u8> {
    // Resolve the models before the editor connects, so a missing one is a clear error in the
    // editor's log right away (here, not in the daemon's). The server still runs: the editor
    // keeps working, without completions, and shows why. For the daemon only the models named
    // are checked: it resolves `auto` for its machine itself, so this process never touches
    // the GPU.
    let source = match remote {
        Some(cfg) => EngineSource::Ready(Arc::new(RemoteEngine::new(cfg)) as Arc<dyn Engine>),
        None => match serve.and_then(|s| {
            let pool = if in_process {
                Some(s.pool()?.0)
            } else {
                s.check_models()?;
                None
            };
            Ok((pool, s))
        }) {
            Err(why) => {
                let why = format!("{why:#}");
                eprintln!("laya lsp: {why}; serving without completions");
                EngineSource::Deferred(Box::new(move |report| {
                    report(&ModelState::Failed(why.clone()));
                    Arc::new(Unavailable(why)) as Arc<dyn Engine>
                }))
            }
            Ok((Some(pool), _)) => {
                let default = pool.default;
                EngineSource::Deferred(Box::new(move |report| {
                    let report = std::sync::Mutex::new(report);
                    let on_state = Arc::new(move |key: ModelKey, s: &ModelState| {
                        if key.tier == default.tier {
                            (report.lock().unwrap_or_else(|p| p.into_inner()))(s);
                        }
                    });
                    match ModelPool::new(pool, on_state.clone()) {
                        Ok(p) => Arc::new(p) as Arc<dyn Engine>,
                        Err(e) => {
                            on_state(default, &ModelState::Failed(e.to_string()));
                            Arc::new(Unavailable(e.to_string())) as Arc<dyn Engine>
                        }
                    }
                }))
            }
            Ok((None, serve)) => {
                let mut args = vec!["serve".to_owned()];
                args.extend(serve.to_args());
                let config = ClientConfig {
                    runtime_dir: paths::runtime_dir(),
                    spawn: Some(SpawnCommand {
                        program: this_program()?,
                        args,
                    }),
                    client: format!("lsp {}", std::process::id()),
                    start_timeout: std::time::Duration::from_secs(20),
                };
                EngineSource::Deferred(Box::new(move |report| {
                    Arc::new(DaemonEngine::new(config, report)) as Arc<dyn Engine>
                }))
            }
        },
    };
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let ending = rt.block_on(serve_stdio(source));
    // Tokio's stdin is a blocking read on a thread of its own that nothing can cancel: do not
    // wait for it (or for anything else still running) to shut the runtime down.
    rt.shutdown_background();
    Ok(ending.exit_code())
}

/// An engine that only says why there is none.
struct Unavailable(String);

#[async_trait::async_trait]
impl Engine for Unavailable {
    async fn complete(
        &self,
        _: CompletionRequest,
        _: Cancel,
        _: Option<PieceSender>,
    ) -> Result<CompletionOutput, EngineError> {
        Err(EngineError::Unavailable(self.0.clone()))
    }

    fn state(&self) -> ModelState {
        ModelState::Failed(self.0.clone())
    }
}
