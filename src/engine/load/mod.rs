//! Model loading: GGUF files and Hugging Face / mlx-community safetensors folders become a
//! weight map with HF names, at the precision asked for, then a [`Model`].
//!
//! GGUF tensors are dequantized to f32 exactly as llama.cpp defines each type, then either kept
//! dense (`Precision::Native`: the file's own values, nothing re-quantized) or quantized to MLX's
//! affine format (q4/q6/q8, one group size). Quantized conversions are cached on disk as
//! safetensors under `<cache>/converted/`, so the second start reads instead of converting.
//! Re-quantizing a Q4_K_M file to q8 cannot add precision the file does not have: q8 only
//! keeps (almost) all that the file has.

pub mod dequant;
pub mod gguf;
mod safetensors_dir;

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use mlx_rs::{ops, transforms::eval, Array};

use self::gguf::{GgufFile, LoadError};
use crate::engine::{
    models::{Arch, Model, ModelConfig, ModelError},
    tokenizer::{Tokenizer, TokenizerError},
};

/// Version of the converted-weights cache layout; bump when the conversion changes.
const CONVERT_FORMAT: u32 = 1;

/// Weight precision after loading.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// The source's own values, dequantized to f32 (GGUF) or kept as stored (safetensors).
    Native,
    Q4,
    Q6,
    Q8,
}

impl Precision {
    pub fn bits(self) -> Option<i32> {
        match self {
            Precision::Native => None,
            Precision::Q4 => Some(4),
            Precision::Q6 => Some(6),
            Precision::Q8 => Some(8),
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Precision::Native => "native",
            Precision::Q4 => "q4",
            Precision::Q6 => "q6",
            Precision::Q8 => "q8",
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

impl std::str::FromStr for Precision {
    type Err = crate::engine::ParseError;

    /// `native`, `q4`, `q6` or `q8`; the bit widths also as bare numbers (`4`, `6`, `8`), as
    /// HTTP clients send them.
    fn from_str(s: &str) -> Result<Precision, Self::Err> {
        match s {
            "native" => Ok(Precision::Native),
            "q4" | "4" => Ok(Precision::Q4),
            "q6" | "6" => Ok(Precision::Q6),
            "q8" | "8" => Ok(Precision::Q8),
            _ => Err(crate::engine::ParseError(format!(
                "expected native, q4, q6 or q8, got `{s}`"
            ))),
        }
    }
}

#[derive(Clone, Debug)]
pub struct LoadOptions {
    pub precision: Precision,
    /// MLX affine quantization group size.
    pub group_size: i32,
    /// Read and write the converted-weights cache.
    pub use_cache: bool,
    /// Show a progress bar (on a terminal).
    pub progress: bool,
    /// Bounds of the model's prefix KV store.
    pub prefix: crate::engine::prefix::PrefixLimits,
    /// Whether decoding checks drafted tokens several at a time.
    pub speculation: crate::engine::draft::SpeculationChoice,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            precision: Precision::Q8,
            group_size: 64,
            use_cache: true,
            progress: false,
            prefix: crate::engine::prefix::PrefixLimits::default(),
            speculation: Default::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineLoadError {
    #[error(transparent)]
    Gguf(#[from] LoadError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error("{}: {source}", file.display())]
    Model { file: PathBuf, source: ModelError },
    #[error("{}: {reason}", file.display())]
    Invalid { file: PathBuf, reason: String },
    #[error("{}: mlx: {source}", file.display())]
    Mlx {
        file: PathBuf,
        source: mlx_rs::error::Exception,
    },
    #[error("{}: {source}", file.display())]
    Io { file: PathBuf, source: std::io::Error },
    #[error("{}: does not exist; run `laya models fetch` or pass an existing GGUF file or model folder", .0.display())]
    NotFound(PathBuf),
}

/// A model ready to run, with what it took to get there.
pub struct Loaded {
    pub model: Model,
    pub tokenizer: Tokenizer,
    pub source: PathBuf,
    pub precision: Precision,
    pub load_time: Duration,
    /// The converted-weights cache was read instead of converting.
    pub from_cache: bool,
}

/// Load a GGUF file or a safetensors folder.
pub fn load(path: &Path, opts: &LoadOptions) -> Result<Loaded, EngineLoadError> {
    let start = Instant::now();
    if !path.exists() {
        return Err(EngineLoadError::NotFound(path.to_owned()));
    }
    let (model, tokenizer, from_cache) = if path.is_dir() {
        safetensors_dir::load(path, opts)?
    } else {
        load_gguf(path, opts)?
    };
    Ok(Loaded {
        model,
        tokenizer,
        source: path.to_owned(),
        precision: opts.precision,
        load_time: start.elapsed(),
        from_cache,
    })
}

/// The parameter count of the model at `path` without loading it: from a GGUF file's header
/// (its configuration's shapes), or for a safetensors folder from its weight files' size (two
/// bytes a parameter, or the bits `config.json`'s `quantization` names plus its scales).
/// `None` when the path cannot be read as either.
pub fn parameters_in(path: &Path) -> Option<u64> {
    if path.is_dir() {
        let bytes: u64 = std::fs::read_dir(path)
            .ok()?
            .filter_map(Result::ok)
            .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
            .filter_map(|e| e.metadata().ok())
            .map(|m| m.len())
            .sum();
        let config: serde_json::Value =
            serde_json::from_slice(&std::fs::read(path.join("config.json")).ok()?).ok()?;
        let bits = config["quantization"]["bits"]
            .as_f64()
            .map(|b| b + 0.5)
            .unwrap_or(16.0);
        return (bytes > 0).then(|| (bytes as f64 * 8.0 / bits) as u64);
    }
    let g = GgufFile::open(path).ok()?;
    gguf_config(&g).ok().map(|c| c.parameters())
}

/// Model hyper-parameters from GGUF metadata (`<arch>.*` keys).
pub fn gguf_config(g: &GgufFile) -> Result<ModelConfig, EngineLoadError> {
    let arch_name = g.get_str("general.architecture")?.to_owned();
    let arch = match arch_name.as_str() {
        "qwen2" => Arch::Qwen2,
        "qwen3" => Arch::Qwen3,
        other => {
            return Err(EngineLoadError::Invalid {
                file: g.path().to_owned(),
                reason: format!("architecture `{other}` is not supported (qwen2 and qwen3 are)"),
            })
        }
    };
    let k = |s: &str| format!("{arch_name}.{s}");
    let u = |s: &str| -> Result<i32, EngineLoadError> { Ok(g.get_u32(&k(s))? as i32) };
    let hidden = u("embedding_length")?;
    let heads = u("attention.head_count")?;
    let vocab = match g.get_u32(&k("vocab_size")) {
        Ok(v) => v as i32,
        Err(_) => g.get_str_array("tokenizer.ggml.tokens")?.len() as i32,
    };
    let head_dim = g
        .get_u32(&k("attention.key_length"))
        .map(|v| v as i32)
        .unwrap_or(hidden / heads);
    Ok(ModelConfig {
        arch,
        hidden_size: hidden,
        intermediate_size: u("feed_forward_length")?,
        num_hidden_layers: u("block_count")?,
        num_attention_heads: heads,
        num_key_value_heads: u("attention.head_count_kv")?,
        head_dim,
        vocab_size: vocab,
        rope_theta: g.get_f32(&k("rope.freq_base")).unwrap_or(1_000_000.0),
        rms_norm_eps: g.get_f32(&k("attention.layer_norm_rms_epsilon")).unwrap_or(1e-6),
        tie_word_embeddings: g.tensor("output.weight").is_err(),
    })
}

/// GGUF tensor name → HF name (`None` for tensors the model does not use).
pub fn hf_name(gguf_name: &str) -> Option<String> {
    let (base, suffix) = gguf_name.rsplit_once('.')?;
    let mapped = match base {
        "token_embd" => "model.embed_tokens".to_owned(),
        "output_norm" => "model.norm".to_owned(),
        "output" => "lm_head".to_owned(),
        _ => {
            let rest = base.strip_prefix("blk.")?;
            let (layer, part) = rest.split_once('.')?;
            let part = match part {
                "attn_q" => "self_attn.q_proj",
                "attn_k" => "self_attn.k_proj",
                "attn_v" => "self_attn.v_proj",
                "attn_output" => "self_attn.o_proj",
                "attn_q_norm" => "self_attn.q_norm",
                "attn_k_norm" => "self_attn.k_norm",
                "attn_norm" => "input_layernorm",
                "ffn_norm" => "post_attention_layernorm",
                "ffn_gate" => "mlp.gate_proj",
                "ffn_up" => "mlp.up_proj",
                "ffn_down" => "mlp.down_proj",
                _ => return None,
            };
            format!("model.layers.{layer}.{part}")
        }
    };
    Some(format!("{mapped}.{suffix}"))
}

/// Whether a weight is quantized at the given group size: 2-D matrices (linear layers and the
/// embedding) whose rows split into whole groups. Norms and biases stay f32.
fn quantizable(shape: &[i32], group_size: i32) -> bool {
    shape.len() == 2 && shape[1] % group_size == 0 && shape[1] >= group_size
}

fn mlx_err(file: &Path) -> impl Fn(mlx_rs::error::Exception) -> EngineLoadError + '_ {
    move |source| EngineLoadError::Mlx {
        file: file.to_owned(),
        source,
    }
}

/// Quantize (or keep) one f32 weight and put it into `out` under its HF name.
pub(crate) fn insert_weight(
    out: &mut HashMap<String, Array>,
    name: String,
    w: Array,
    opts: &LoadOptions,
    file: &Path,
) -> Result<(), EngineLoadError> {
    let err = mlx_err(file);
    match opts.precision.bits() {
        Some(bits) if name.ends_with(".weight") && quantizable(w.shape(), opts.group_size) => {
            let (wq, scales, biases) = ops::quantize(&w, opts.group_size, bits).map_err(&err)?;
            eval([&wq, &scales, &biases]).map_err(&err)?;
            let stem = name.trim_end_matches(".weight");
            out.insert(format!("{stem}.scales"), scales);
            out.insert(format!("{stem}.biases"), biases);
            out.insert(name, wq);
        }
        _ => {
            eval([&w]).map_err(&err)?;
            out.insert(name, w);
        }
    }
    Ok(())
}

fn progress(len: usize, what: &str, show: bool) -> indicatif::ProgressBar {
    if !show {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::new(len as u64);
    pb.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} tensors {elapsed}")
            .expect("static template")
            .progress_chars("=> "),
    );
    pb.set_message(what.to_owned());
    pb
}

/// Cache file for a converted GGUF: keyed by the source's identity and the conversion.
fn converted_path(path: &Path, opts: &LoadOptions) -> Option<PathBuf> {
    let meta = std::fs::metadata(path).ok()?;
    let mtime = meta
        .modified()
        .ok()?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_secs();
    let canonical = std::fs::canonicalize(path).ok()?;
    let key = format!(
        "{}|{}|{}|{}|{}|{}",
        canonical.display(),
        meta.len(),
        mtime,
        opts.precision.label(),
        opts.group_size,
        CONVERT_FORMAT
    );
    let digest = crate::fetch::sha256_hex(key.as_bytes());
    let stem = path.file_stem()?.to_string_lossy();
    Some(crate::paths::converted_dir().join(format!(
        "{stem}.{}-g{}.{}.safetensors",
        opts.precision.label(),
        opts.group_size,
        &digest[..12]
    )))
}

fn load_gguf(path: &Path, opts: &LoadOptions) -> Result<(Model, Tokenizer, bool), EngineLoadError> {
    let g = GgufFile::open(path)?;
    let cfg = gguf_config(&g)?;
    let tokenizer = Tokenizer::from_gguf(&g)?;
    let cache_file = (opts.use_cache && opts.precision != Precision::Native)
        .then(|| converted_path(path, opts))
        .flatten();
    if let Some(cached) = cache_file.as_ref().filter(|p| p.is_file()) {
        match Array::load_safetensors(cached) {
            Ok(weights) => {
                tracing::info!(file = %cached.display(), "loading converted weights");
                let model = Model::from_weights(cfg.clone(), weights, opts.group_size).map_err(|source| {
                    EngineLoadError::Model {
                        file: cached.clone(),
                        source,
                    }
                });
                match model {
                    Ok(model) => return Ok((model, tokenizer, true)),
                    Err(e) => tracing::warn!("ignoring unusable converted cache: {e}"),
                }
            }
            Err(e) => tracing::warn!(file = %cached.display(), "ignoring unreadable converted cache: {e}"),
        }
    }
    let mut weights = HashMap::new();
    let tensors: Vec<_> = g
        .tensors()
        .iter()
        .filter(|t| hf_name(t.name()).is_some())
        .collect();
    let pb = progress(
        tensors.len(),
        &format!("converting to {}", opts.precision.label()),
        opts.progress,
    );
    for info in tensors {
        let name = hf_name(info.name()).expect("filtered above");
        let values = g.dequantize(info.name())?;
        // GGUF lists ne0 (the contiguous dimension) first; MLX shapes list it last.
        let shape: Vec<i32> = info.dims().iter().rev().map(|&d| d as i32).collect();
        let w = Array::from_slice(&values, &shape);
        drop(values);
        insert_weight(&mut weights, name, w, opts, path)?;
        pb.inc(1);
    }
    pb.finish_and_clear();
    if let Some(cached) = &cache_file {
        save_converted(&weights, cached);
    }
    let model =
        Model::from_weights(cfg, weights, opts.group_size).map_err(|source| EngineLoadError::Model {
            file: path.to_owned(),
            source,
        })?;
    Ok((model, tokenizer, false))
}

/// Write the converted weights atomically; a failure (disk full, read-only cache) only costs
/// the next start a conversion, so it is logged, not returned.
fn save_converted(weights: &HashMap<String, Array>, dest: &Path) {
    let Some(dir) = dest.parent() else { return };
    if let Err(e) = std::fs::create_dir_all(dir) {
        tracing::warn!("cannot create {}: {e}", dir.display());
        return;
    }
    let tmp = dest.with_extension(format!("tmp{}.safetensors", std::process::id()));
    match Array::save_safetensors(weights.iter(), None, &tmp) {
        Ok(()) => {
            if let Err(e) = std::fs::rename(&tmp, dest) {
                tracing::warn!("cannot move converted weights into {}: {e}", dest.display());
                let _ = std::fs::remove_file(&tmp);
            }
        }
        Err(e) => {
            tracing::warn!("cannot write converted weights to {}: {e}", tmp.display());
            let _ = std::fs::remove_file(&tmp);
        }
    }
}
