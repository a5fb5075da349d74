//! `laya complete FILE:LINE:COL`: one fill-in-the-middle completion with a local model, and
//! where its time went. [`run`] loads the model, takes the completion pipeline's plan for an
//! invoked request at the position (`Pipeline::plan_once`: the LSP's prompt), makes one model
//! call and post-processes the answer as the LSP does (`Pipeline::finish_once`); the report's
//! `Display` is the timing line the command writes on stderr (load, prefill, decode, finish).

use std::{
    fmt,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use crate::{
    bench::error_chain,
    completion::pipeline::{CompletionSettings, Pipeline, Request, Trigger},
    config::resolve_model_at,
    document::Document,
    engine::{
        runtime::{use_device, DevicePref},
        send_whole, Cancel, CompletionOutput, CompletionRequest, Engine, EngineError, FinishReason,
        LoadOptions, LocalModel, ModelFacts, ModelKey, ModelState, PieceSender, Precision, RunsOn,
        SamplingParams,
    },
    prompt::{self, LineCol},
};

pub struct Config {
    pub file: PathBuf,
    /// 1-based line and column (in characters).
    pub position: LineCol,
    /// A catalog name, GGUF file or model folder.
    pub model: String,
    pub options: LoadOptions,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    pub temperature: f32,
    pub device: DevicePref,
}

/// `FILE:LINE:COL` → (file, position). The file name itself may contain colons.
pub fn parse_location(location: &str) -> Result<(PathBuf, LineCol), String> {
    let mut parts = location.rsplitn(3, ':');
    let (col, line, file) = (parts.next(), parts.next(), parts.next());
    match (
        file,
        line.and_then(|l| l.parse().ok()),
        col.and_then(|c| c.parse().ok()),
    ) {
        (Some(file), Some(line), Some(col)) if !file.is_empty() => {
            Ok((PathBuf::from(file), LineCol { line, col }))
        }
        _ => Err(format!("expected FILE:LINE:COL (1-based), got `{location}`")),
    }
}

/// The completion and its costs.
#[derive(Debug)]
pub struct Report {
    /// The text to insert, post-processed; `None` when nothing was left of the model's answer.
    pub completion: Option<String>,
    /// The model file's name.
    pub model: String,
    pub precision: Precision,
    /// The device it ran on.
    pub device: String,
    pub load_time: Duration,
    /// Loaded from the converted-weights cache.
    pub from_cache: bool,
    pub prefilled_tokens: usize,
    pub prefill: Duration,
    pub generated_tokens: usize,
    /// Forwards that gave the generated tokens, the prompt's last (which gives the first
    /// token) included: as many as the tokens without drafts, fewer with accepted drafts.
    pub forwards: usize,
    pub decode: Duration,
    pub finish: FinishReason,
}

/// The line `laya complete` writes on stderr: model, device and where the time went.
impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let per_token = if self.generated_tokens > 1 {
            ms(self.decode) / (self.generated_tokens - 1) as f64
        } else {
            0.0
        };
        write!(
            f,
            "[{} {} on {}] load {:.2} s{} | prefill {} tokens {:.0} ms | decode {} tokens in {} forwards {:.0} ms ({per_token:.1} ms/token) | finish {:?}",
            self.model,
            self.precision,
            self.device,
            self.load_time.as_secs_f64(),
            if self.from_cache { " (converted cache)" } else { "" },
            self.prefilled_tokens,
            ms(self.prefill),
            self.generated_tokens,
            self.forwards,
            ms(self.decode),
            self.finish,
        )
    }
}

/// Load the model and complete at the position, with the plan an editor's invoked request
/// gets there (the pipeline's [`plan_once`](Pipeline::plan_once): syntax context, a line or a
/// block, the model's budget and prompt format) and its post-processing.
pub fn run(cfg: &Config) -> Result<Report, String> {
    let file = &cfg.file;
    let text = std::fs::read_to_string(file).map_err(|e| format!("reading {}: {e}", file.display()))?;
    let offset = prompt::byte_offset(&text, cfg.position).map_err(|e| format!("{}: {e}", file.display()))?;
    let device = use_device(cfg.device).map_err(|e| e.to_string())?;
    let path = resolve_model_at(&cfg.model, cfg.options.precision).map_err(|e| e.to_string())?;
    let model = LocalModel::load(&path, &cfg.options).map_err(|e| error_chain(&e))?;
    let (precision, load_time, from_cache) = (
        model.loaded.precision,
        model.loaded.load_time,
        model.loaded.from_cache,
    );
    let name = file.to_string_lossy();
    let doc = Document::for_path(&text, &name).snapshot(&name);
    let settings = CompletionSettings {
        max_tokens_line: cfg.max_tokens,
        max_tokens_block: cfg.max_tokens,
        ..CompletionSettings::default()
    };
    let request = Request {
        doc: &doc,
        others: &[],
        cursor: offset,
        trigger: Trigger::Invoked,
        settings: &settings,
        workspace_root: None,
        workspace: None,
    };
    let model = Arc::new(OnThisThread(Mutex::new(model)));
    let pipeline = Pipeline::new(model.clone());
    let mut plan = pipeline.plan_once(&request, None).map_err(|e| error_chain(&e))?;
    plan.request.sampling = SamplingParams {
        temperature: cfg.temperature,
        ..SamplingParams::default()
    };
    let out = model
        .run(&plan.request, &Cancel::new())
        .map_err(|e| error_chain(&e))?;
    let t = out.timing.clone();
    let finish = out.choices[0].finish_reason;
    let completion = pipeline
        .finish_once(&request, plan, out)
        .edits
        .into_iter()
        .next()
        .map(|e| e.text);
    Ok(Report {
        completion,
        model: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        precision,
        device,
        load_time,
        from_cache,
        prefilled_tokens: t.prefilled_tokens,
        prefill: t.prefill,
        generated_tokens: t.generated_tokens,
        forwards: t.forwards(),
        decode: t.decode,
        finish,
    })
}

/// The loaded model as the pipeline's engine, run on the calling thread: the command does
/// nothing else while it runs.
struct OnThisThread(Mutex<LocalModel>);

impl OnThisThread {
    fn run(&self, req: &CompletionRequest, cancel: &Cancel) -> Result<CompletionOutput, EngineError> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .complete(req, cancel)
    }
}

#[async_trait::async_trait]
impl Engine for OnThisThread {
    async fn complete(
        &self,
        req: CompletionRequest,
        cancel: Cancel,
        pieces: Option<PieceSender>,
    ) -> Result<CompletionOutput, EngineError> {
        let out = self.run(&req, &cancel)?;
        send_whole(&out, pieces.as_ref());
        Ok(out)
    }

    fn state(&self) -> ModelState {
        let m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        ModelState::Ready {
            load_time: m.loaded.load_time,
            time_to_ready: m.loaded.load_time,
            from_cache: m.loaded.from_cache,
            device: if m.facts().runs_on == RunsOn::Gpu {
                "gpu"
            } else {
                "cpu"
            }
            .into(),
        }
    }

    fn facts(&self, _model: ModelKey) -> Option<ModelFacts> {
        Some(self.0.lock().unwrap_or_else(|p| p.into_inner()).facts())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_split_at_the_last_two_colons() {
        let (file, pos) = parse_location("a:b.py:3:7").unwrap();
        assert_eq!(file, PathBuf::from("a:b.py"));
        assert_eq!((pos.line, pos.col), (3, 7));
        for bad in ["nocolons", "f.py:1", ":1:1", "f.py:x:1", "f.py:1:-1"] {
            assert_eq!(
                parse_location(bad).unwrap_err(),
                format!("expected FILE:LINE:COL (1-based), got `{bad}`")
            );
        }
    }
}
