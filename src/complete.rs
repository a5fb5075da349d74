//! `laya complete FILE:LINE:COL`: one fill-in-the-middle completion with a local model, and
//! where its time went (load, prefill, decode).
//!
//! ## How it works
//!
//! `laya complete FILE:LINE:COL`: `parse_location`, then `run(&Config) -> Report`: the model
//! loaded, one fill-in-the-middle request, the answer post-processed; the report's `Display` is
//! the timing line the command writes on stderr (load, prefill, decode, finish).

use std::{fmt, path::PathBuf, time::Duration};

use crate::{
    bench::error_chain,
    completion::postprocess,
    config::resolve_model,
    engine::{
        runtime::{use_device, DevicePref},
        Cancel, CompletionRequest, FinishReason, LoadOptions, LocalModel, Precision, SamplingParams,
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

/// Load the model and complete at the position.
pub fn run(cfg: &Config) -> Result<Report, String> {
    let file = &cfg.file;
    let text = std::fs::read_to_string(file).map_err(|e| format!("reading {}: {e}", file.display()))?;
    let offset = prompt::byte_offset(&text, cfg.position).map_err(|e| format!("{}: {e}", file.display()))?;
    let (prefix, suffix) = text.split_at(offset);
    let device = use_device(cfg.device)?;
    let path = resolve_model(&cfg.model).map_err(|e| e.to_string())?;
    let model = LocalModel::load(&path, &cfg.options).map_err(|e| error_chain(&e))?;
    let req = CompletionRequest {
        sampling: SamplingParams {
            temperature: cfg.temperature,
            ..SamplingParams::default()
        },
        ..CompletionRequest::new(model.specials.family.fim().fim(prefix, suffix), cfg.max_tokens)
    };
    let out = model
        .complete(&req, &Cancel::new())
        .map_err(|e| error_chain(&e))?;
    let choice = &out.choices[0];
    let completion =
        postprocess::process(&choice.text, &postprocess::Surroundings::at(&text, offset)).map(|e| e.text);
    let loaded = &model.loaded;
    let t = &out.timing;
    Ok(Report {
        completion,
        model: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        precision: loaded.precision,
        device,
        load_time: loaded.load_time,
        from_cache: loaded.from_cache,
        prefilled_tokens: t.prefilled_tokens,
        prefill: t.prefill,
        generated_tokens: t.generated_tokens,
        forwards: t.forwards(),
        decode: t.decode,
        finish: choice.finish_reason,
    })
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
