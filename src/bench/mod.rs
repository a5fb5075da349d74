//! `laya bench …`: benchmarks that print numbers. Speed and quality claims are checked here,
//! not in tests.
//!
//! Each bench `x` is `x::run(&x::Config, …) -> Result<x::Report, String>`; the report's
//! `Display` is what `laya bench x` prints on stdout, and progress goes to the `log` callback
//! (stderr). This file holds what they share: [`Target`] (a local model on its worker thread,
//! or a remote server), the `--settings` overlay ([`completion_settings`]) and [`percentile`].
//!
//! The benches: `engine` (the engine's measurements, beside llama.cpp), `load` (time to ready,
//! converting and then reading the converted cache), `quality` (masked-line cases through the
//! whole pipeline), `typing` (a line typed back keystroke by keystroke), `workspace` (the
//! index's build and retrieval), `soak` (many clients against one daemon), `memory` (the
//! daemon's memory with several editors). `lsp_client` is a blocking LSP client over a
//! child's stdio, which the tests that drive `laya lsp` use too; `memory`'s `BenchDaemon`, a
//! daemon in a private scratch directory, serves the soak too.

use std::sync::Arc;

use crate::{
    completion::pipeline::CompletionSettings,
    config::resolve_model,
    engine::{
        remote::{RemoteConfig, RemoteEngine},
        runtime::DevicePref,
        worker::ModelWorker,
        Engine, LoadOptions, ModelState,
    },
};

pub mod engine;
pub mod load;
pub mod lsp_client;
pub mod memory;
pub mod quality;
pub mod soak;
pub mod typing;
pub mod typist;
pub mod workspace;

/// The engine a bench completes with.
#[derive(Clone, Debug)]
pub enum Target {
    /// A local model (catalog name, GGUF file or folder) on its own worker thread.
    Local { model: String, options: LoadOptions },
    /// An OpenAI-compatible server.
    Remote(RemoteConfig),
}

impl Target {
    /// The engine, with its label for the tables; a local model starts loading now (`log`
    /// hears its load time).
    pub fn start(
        &self,
        device: DevicePref,
        log: impl Fn(&str) + Send + 'static,
    ) -> Result<(Arc<dyn Engine>, String), String> {
        Ok(match self {
            Target::Remote(cfg) => {
                let label = format!("remote {}", cfg.url);
                (Arc::new(RemoteEngine::new(cfg.clone())), label)
            }
            Target::Local { model, options } => {
                let label = format!("{model} {}", options.precision);
                let path = resolve_model(model).map_err(|e| e.to_string())?;
                let worker = ModelWorker::spawn(path, options.clone(), device, move |s| {
                    if let ModelState::Ready {
                        load_time, device, ..
                    } = s
                    {
                        log(&format!("loaded in {:.1} s on {device}", load_time.as_secs_f64()));
                    }
                });
                (Arc::new(worker), label)
            }
        })
    }

    /// The local model's tokenizer (to count the tokens of what was shown); `None` for a
    /// remote server.
    pub fn tokenizer(&self) -> Result<Option<crate::engine::Tokenizer>, String> {
        match self {
            Target::Remote(_) => Ok(None),
            Target::Local { model, .. } => {
                let path = resolve_model(model).map_err(|e| e.to_string())?;
                crate::engine::load::tokenizer(&path)
                    .map(Some)
                    .map_err(|e| e.to_string())
            }
        }
    }
}

/// A bench's completion settings: `base` (the LSP's `completion` section, over the defaults)
/// with `overrides` (`--settings`, a JSON object) written over it.
pub fn completion_settings(
    mut base: serde_json::Value,
    overrides: Option<&str>,
) -> Result<CompletionSettings, String> {
    if let Some(text) = overrides {
        let patch = match serde_json::from_str(text) {
            Ok(v @ serde_json::Value::Object(_)) => v,
            Ok(_) => return Err(format!("--settings wants a JSON object, got `{text}`")),
            Err(e) => return Err(format!("--settings is not JSON ({e}): `{text}`")),
        };
        merge_json(&mut base, patch);
    }
    serde_json::from_value(base).map_err(|e| format!("--settings: {e}"))
}

/// Writes `patch` over `base`: objects key by key, anything else replaced.
fn merge_json(base: &mut serde_json::Value, patch: serde_json::Value) {
    match (base, patch) {
        (serde_json::Value::Object(b), serde_json::Value::Object(p)) => {
            for (k, v) in p {
                merge_json(b.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (b, p) => *b = p,
    }
}

/// An error with its causes, `outer: cause: cause`.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        s.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    s
}

/// p-th percentile (0–100) by nearest rank.
pub fn percentile(values: &[f64], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let rank = ((p / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
    v[rank.min(v.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&[3.0, 1.0, 2.0], 50.0), 2.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }

    #[test]
    fn settings_overrides_are_written_over_the_base_key_by_key() {
        let base = serde_json::json!({ "maxTokensLine": 5, "budget": { "maxTokens": 300 } });
        let s = completion_settings(base.clone(), Some(r#"{"budget":{"suffixShare":0.5}}"#)).unwrap();
        assert_eq!(s.max_tokens_line, 5);
        assert_eq!(s.budget.max_tokens, 300, "the base's other budget keys stay");
        assert_eq!(s.budget.suffix_share, Some(0.5));
        assert_eq!(
            completion_settings(base.clone(), Some("[1]")).unwrap_err(),
            "--settings wants a JSON object, got `[1]`"
        );
        assert!(completion_settings(base.clone(), Some("x"))
            .unwrap_err()
            .starts_with("--settings is not JSON ("));
        assert!(completion_settings(base, Some(r#"{"maxTokensLine":"many"}"#))
            .unwrap_err()
            .starts_with("--settings: "));
    }

    #[test]
    fn error_chains_name_every_cause() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer")]
        struct Outer(#[source] std::io::Error);
        let e = Outer(std::io::Error::other("inner"));
        assert_eq!(error_chain(&e), "outer: inner");
    }
}
