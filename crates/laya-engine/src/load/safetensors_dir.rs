//! Hugging Face (`config.json` + `*.safetensors`, bf16/f16) and mlx-community (the same, with
//! MLX-quantized weights and a `quantization` entry in `config.json`) model folders. A
//! Qwen3-MoE folder holds its experts one tensor each (HF) or already stacked (mlx-community);
//! the model stacks the former as it loads. A Qwen3.5 folder (`qwen3_5`) nests its text
//! model's settings in `text_config`, and names its layers' kinds in `layer_types` (or every
//! `full_attention_interval`-th layer is full attention). A folder asked for fewer bits than it stores is
//! converted (an mlx-community tensor dequantized first) and the result cached as a GGUF's is;
//! asked for its own bits or more, it is read as stored.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use mlx_rs::{ops, Array};
use serde::Deserialize;

use super::{bits_for, insert_weight, quantizable, EngineLoadError, LoadOptions};
use crate::{
    models::{Arch, HybridConfig, Model, ModelConfig, MoeConfig},
    tokenizer::Tokenizer,
};

#[derive(Deserialize)]
struct HfConfig {
    model_type: String,
    hidden_size: i32,
    intermediate_size: i32,
    num_hidden_layers: i32,
    num_attention_heads: i32,
    num_key_value_heads: Option<i32>,
    head_dim: Option<i32>,
    vocab_size: i32,
    /// `None`: 1,000,000 (Qwen3.5: its `rope_parameters`' or 100,000, as mlx-lm reads it).
    rope_theta: Option<f32>,
    #[serde(default = "default_eps")]
    rms_norm_eps: f32,
    #[serde(default)]
    tie_word_embeddings: bool,
    quantization: Option<HfQuantization>,
    // Qwen3-MoE; defaults as transformers' Qwen3MoeConfig has them.
    num_experts: Option<i32>,
    num_experts_per_tok: Option<i32>,
    moe_intermediate_size: Option<i32>,
    norm_topk_prob: Option<bool>,
    #[serde(default = "default_sparse_step")]
    decoder_sparse_step: i32,
    #[serde(default)]
    mlp_only_layers: Vec<i32>,
    shared_expert_intermediate_size: Option<i32>,
    // Qwen3.5: the Gated DeltaNet layers, which layers they are, and partial RoPE.
    linear_num_key_heads: Option<i32>,
    linear_num_value_heads: Option<i32>,
    linear_key_head_dim: Option<i32>,
    linear_value_head_dim: Option<i32>,
    linear_conv_kernel_dim: Option<i32>,
    layer_types: Option<Vec<String>>,
    full_attention_interval: Option<i32>,
    partial_rotary_factor: Option<f32>,
    rope_parameters: Option<RopeParameters>,
}

/// Qwen3.5's `rope_parameters` (what laya reads of them).
#[derive(Deserialize)]
struct RopeParameters {
    rope_theta: Option<f32>,
    partial_rotary_factor: Option<f32>,
}

#[derive(Deserialize)]
struct HfQuantization {
    group_size: i32,
    bits: i32,
    /// Per-module settings mlx-lm writes for a module quantized otherwise
    /// (`"model.layers.0.mlp.gate": {"group_size": 64, "bits": 8}`).
    #[serde(flatten)]
    modules: HashMap<String, serde_json::Value>,
}

impl HfQuantization {
    /// The group size the module `stem` (`model.layers.0.mlp.gate`) is stored with.
    fn group_size_of(&self, stem: &str) -> i32 {
        self.modules
            .get(stem)
            .and_then(|m| m["group_size"].as_i64())
            .map_or(self.group_size, |g| g as i32)
    }
}

fn default_eps() -> f32 {
    1e-6
}
fn default_sparse_step() -> i32 {
    1
}

pub(crate) fn load(dir: &Path, opts: &LoadOptions) -> Result<(Model, Tokenizer, bool), EngineLoadError> {
    let (cfg, hf) = read_config(dir)?;
    let tokenizer = Tokenizer::from_file(dir.join("tokenizer.json"))?.with_declared_eog(declared_eog(dir));

    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map_err(|source| EngineLoadError::Io {
            file: dir.to_owned(),
            source,
        })?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(EngineLoadError::Invalid {
            file: dir.to_owned(),
            reason: "no *.safetensors files".into(),
        });
    }
    let stored = hf.quantization.as_ref();
    let convert = match (stored.map(|q| q.bits), opts.precision.bits()) {
        (None, Some(_)) => true,
        (Some(stored), Some(asked)) => asked < stored,
        (_, None) => false,
    };
    let cache = (convert && opts.use_cache)
        .then(|| super::cache_entry(dir, opts))
        .flatten();
    if let Some(model) = cache
        .as_ref()
        .and_then(|e| super::read_converted(e, &cfg, opts.group_size))
    {
        return Ok((model, tokenizer, true));
    }
    // Every file's tensors (read lazily: each is read when it is evaluated), with its file.
    let mut tensors: HashMap<String, (Array, PathBuf)> = HashMap::new();
    for file in &files {
        let map = Array::load_safetensors(file).map_err(|e| EngineLoadError::Invalid {
            file: file.clone(),
            reason: e.to_string(),
        })?;
        tensors.extend(map.into_iter().map(|(name, a)| (name, (a, file.clone()))));
    }
    let (weights, group_size) = if !convert {
        let weights = tensors.into_iter().map(|(name, (a, _))| (name, a)).collect();
        (weights, stored.map_or(opts.group_size, |q| q.group_size))
    } else {
        let mut weights = HashMap::new();
        // Weights first: a quantized one takes its scales and biases with it.
        let mut names: Vec<String> = tensors.keys().cloned().collect();
        names.sort_by_key(|n| (!n.ends_with(".weight"), n.clone()));
        for name in names {
            let Some((array, file)) = tensors.remove(&name) else {
                // A quantized weight's scales and biases, taken with it.
                continue;
            };
            let quantized = name
                .strip_suffix(".weight")
                .filter(|s| tensors.contains_key(&format!("{s}.scales")))
                .map(str::to_owned);
            match (stored, quantized) {
                (Some(q), Some(stem)) => {
                    let stem = stem.as_str();
                    let mut part = |p: &str| {
                        let name = format!("{stem}.{p}");
                        tensors
                            .remove(&name)
                            .map(|(a, _)| a)
                            .ok_or_else(|| EngineLoadError::Invalid {
                                file: file.clone(),
                                reason: format!("`{name}` is missing beside `{stem}.weight`"),
                            })
                    };
                    let (scales, biases) = (part("scales")?, part("biases")?);
                    let group_size = q.group_size_of(stem);
                    requantize(
                        &mut weights,
                        (name, array, scales, biases),
                        group_size,
                        opts,
                        &file,
                    )?;
                }
                // An mlx-community folder's dense tensors (norms, biases) stay as stored.
                (Some(_), None) => {
                    weights.insert(name, array);
                }
                (None, _) => insert_weight(&mut weights, name, array, opts, &file)?,
            }
        }
        if let Some(entry) = &cache {
            super::save_converted(&weights, entry);
        }
        (weights, opts.group_size)
    };
    let model = Model::from_weights(cfg, weights, group_size).map_err(|source| EngineLoadError::Model {
        file: dir.to_owned(),
        source,
    })?;
    Ok((model, tokenizer, false))
}

/// One stored quantized weight (`name`, its packed values, scales and biases, stored with
/// `group_size`) at the bits `opts` asks for (a MoE router at 8: [`bits_for`]): kept as stored
/// when that is what it holds already (or its rows do not split into the asked groups), else
/// dequantized and quantized again.
fn requantize(
    out: &mut HashMap<String, Array>,
    (name, weight, scales, biases): (String, Array, Array, Array),
    group_size: i32,
    opts: &LoadOptions,
    file: &Path,
) -> Result<(), EngineLoadError> {
    let invalid = |reason: String| EngineLoadError::Invalid {
        file: file.to_owned(),
        reason: format!("`{name}`: {reason}"),
    };
    if weight.ndim() < 2 || scales.shape() != biases.shape() || scales.ndim() != weight.ndim() {
        return Err(invalid(format!(
            "a quantized weight {:?} needs scales and biases of its rank and one shape, found {:?} and {:?}",
            weight.shape(),
            scales.shape(),
            biases.shape()
        )));
    }
    let (packed, groups) = (weight.dim(-1), scales.dim(-1));
    let inputs = groups * group_size;
    let bits = match (packed * 32).checked_div(inputs) {
        Some(b) if packed * 32 % inputs == 0 && [2, 3, 4, 5, 6, 8].contains(&b) => b,
        _ => {
            return Err(invalid(format!(
                "{packed} packed columns and {groups} groups of {group_size} do not make 2/3/4/5/6/8 bits"
            )))
        }
    };
    let asked = opts.precision.bits().map(|b| bits_for(&name, b));
    let mut dense_shape = weight.shape().to_vec();
    if let Some(last) = dense_shape.last_mut() {
        *last = inputs;
    }
    let keep = asked.is_none_or(|a| (a, opts.group_size) == (bits, group_size) || a > bits)
        || !quantizable(&dense_shape, opts.group_size);
    let stem = name.trim_end_matches(".weight").to_owned();
    if keep {
        out.insert(format!("{stem}.scales"), scales);
        out.insert(format!("{stem}.biases"), biases);
        out.insert(name, weight);
        return Ok(());
    }
    let dense =
        ops::dequantize(&weight, &scales, &biases, group_size, bits).map_err(|e| EngineLoadError::Mlx {
            file: file.to_owned(),
            source: e,
        })?;
    drop((weight, scales, biases));
    insert_weight(out, name, dense, opts, file)
}

/// The folder's `config.json` as the engine's configuration.
pub(crate) fn config_of(dir: &Path) -> Result<ModelConfig, EngineLoadError> {
    read_config(dir).map(|(cfg, _)| cfg)
}

/// The folder's `config.json` as the engine's configuration (and as written, for its
/// quantization).
fn read_config(dir: &Path) -> Result<(ModelConfig, HfConfig), EngineLoadError> {
    let config_path = dir.join("config.json");
    let text = std::fs::read_to_string(&config_path).map_err(|source| EngineLoadError::Io {
        file: config_path.clone(),
        source,
    })?;
    let invalid = |reason: String| EngineLoadError::Invalid {
        file: config_path.clone(),
        reason,
    };
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?;
    let hf: HfConfig = serde_json::from_value(text_model_config(json)).map_err(|e| invalid(e.to_string()))?;
    let arch = match hf.model_type.as_str() {
        "qwen2" => Arch::Qwen2,
        "qwen3" => Arch::Qwen3,
        "qwen3_moe" => Arch::Qwen3Moe,
        "qwen3_5" | "qwen3_5_text" | "qwen3_5_moe" | "qwen3_5_moe_text" | "qwen3_next" => Arch::Qwen35,
        other => {
            return Err(invalid(format!(
                "model_type `{other}` is not supported (qwen2, qwen3, qwen3_moe, qwen3_5, qwen3_5_moe and qwen3_next are)"
            )))
        }
    };
    let moe = match arch {
        // Qwen3.5's and Qwen3-Next's experts, in the layers `decoder_sparse_step` and
        // `mlp_only_layers` leave them (every layer, as Qwen3.5's configs state them).
        _ if arch == Arch::Qwen3Moe || (arch == Arch::Qwen35 && hf.num_experts.unwrap_or(0) > 0) => {
            let missing = |key: &str| EngineLoadError::Invalid {
                file: config_path.clone(),
                reason: format!("a {} config needs `{key}`", hf.model_type),
            };
            Some(MoeConfig {
                num_experts: hf.num_experts.ok_or_else(|| missing("num_experts"))?,
                num_experts_per_tok: hf
                    .num_experts_per_tok
                    .ok_or_else(|| missing("num_experts_per_tok"))?,
                moe_intermediate_size: hf
                    .moe_intermediate_size
                    .ok_or_else(|| missing("moe_intermediate_size"))?,
                // Unstated: transformers' Qwen3-MoE and mlx-lm's Qwen3-Next default (no),
                // mlx-lm's Qwen3.5 one (yes).
                norm_topk_prob: hf.norm_topk_prob.unwrap_or(hf.model_type.starts_with("qwen3_5")),
                decoder_sparse_step: hf.decoder_sparse_step,
                mlp_only_layers: hf.mlp_only_layers.clone(),
                shared_expert_intermediate_size: hf.shared_expert_intermediate_size.filter(|&s| s > 0),
            })
        }
        _ => None,
    };
    let head_dim = hf
        .head_dim
        .unwrap_or(hf.hidden_size / hf.num_attention_heads.max(1));
    let rope = hf.rope_parameters.as_ref();
    let hybrid = match arch {
        Arch::Qwen35 => Some(hybrid_config(&hf, head_dim).map_err(invalid)?),
        _ => None,
    };
    // Qwen3.5 states its RoPE base in `rope_parameters` (mlx-lm's default 100,000 without).
    let rope_theta = match (rope.and_then(|r| r.rope_theta), hf.rope_theta, arch) {
        (Some(theta), _, _) | (None, Some(theta), _) => theta,
        (None, None, Arch::Qwen35) => 100_000.0,
        (None, None, _) => 1_000_000.0,
    };
    let cfg = ModelConfig {
        arch,
        hidden_size: hf.hidden_size,
        intermediate_size: hf.intermediate_size,
        num_hidden_layers: hf.num_hidden_layers,
        num_attention_heads: hf.num_attention_heads,
        num_key_value_heads: hf.num_key_value_heads.unwrap_or(hf.num_attention_heads),
        head_dim,
        vocab_size: hf.vocab_size,
        rope_theta,
        rms_norm_eps: hf.rms_norm_eps,
        tie_word_embeddings: hf.tie_word_embeddings,
        moe,
        hybrid,
    };
    Ok((cfg, hf))
}

/// The text model's settings of a config: a multimodal Qwen3.5 config's `text_config`, with
/// the top level's entries it does not state (`quantization`, `tie_word_embeddings`, …);
/// any other config as it is.
fn text_model_config(mut json: serde_json::Value) -> serde_json::Value {
    let Some(serde_json::Value::Object(mut text)) = json.get_mut("text_config").map(serde_json::Value::take)
    else {
        return json;
    };
    if let serde_json::Value::Object(top) = json {
        for (k, v) in top {
            if k != "text_config" && k != "vision_config" {
                text.entry(k).or_insert(v);
            }
        }
    }
    // The folder's model type (`qwen3_5`) names the family; the text model's (`qwen3_5_text`)
    // is its part.
    serde_json::Value::Object(text)
}

/// Which layers are Gated DeltaNet layers and their shapes, as a Qwen3.5 config states them:
/// `layer_types` when given, else every `full_attention_interval`-th layer (default 4) is
/// full attention.
fn hybrid_config(hf: &HfConfig, head_dim: i32) -> Result<HybridConfig, String> {
    let need = |v: Option<i32>, key: &str| v.ok_or_else(|| format!("a qwen3_5 config needs `{key}`"));
    let layers = hf.num_hidden_layers.max(0);
    let linear_layers = match &hf.layer_types {
        Some(types) => types
            .iter()
            .map(|t| match t.as_str() {
                "linear_attention" => Ok(true),
                "full_attention" => Ok(false),
                other => Err(format!("layer type `{other}` is not supported")),
            })
            .collect::<Result<Vec<_>, _>>()?,
        None => HybridConfig::every_nth_full(layers, hf.full_attention_interval.unwrap_or(4))?,
    };
    let partial = hf
        .rope_parameters
        .as_ref()
        .and_then(|r| r.partial_rotary_factor)
        .or(hf.partial_rotary_factor)
        .unwrap_or(0.25);
    Ok(HybridConfig {
        linear_layers,
        linear_num_key_heads: need(hf.linear_num_key_heads, "linear_num_key_heads")?,
        linear_num_value_heads: need(hf.linear_num_value_heads, "linear_num_value_heads")?,
        linear_key_head_dim: need(hf.linear_key_head_dim, "linear_key_head_dim")?,
        linear_value_head_dim: need(hf.linear_value_head_dim, "linear_value_head_dim")?,
        linear_conv_kernel_dim: hf.linear_conv_kernel_dim.unwrap_or(4),
        // As Python's int(): toward zero.
        rope_dims: (head_dim as f32 * partial) as i32,
    })
}

/// The end-of-generation ids `generation_config.json` states (`eos_token_id`: one id or a
/// list); none without the file.
fn declared_eog(dir: &Path) -> Vec<u32> {
    let Ok(text) = std::fs::read(dir.join("generation_config.json")) else {
        return vec![];
    };
    let config: serde_json::Value = serde_json::from_slice(&text).unwrap_or_default();
    match &config["eos_token_id"] {
        serde_json::Value::Array(ids) => ids.iter().filter_map(|v| v.as_u64()).map(|v| v as u32).collect(),
        v => v.as_u64().map(|v| vec![v as u32]).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(json: serde_json::Value) -> Result<ModelConfig, EngineLoadError> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), json.to_string()).unwrap();
        config_of(dir.path())
    }

    fn qwen35_text() -> serde_json::Value {
        serde_json::json!({
            "model_type": "qwen3_5_text",
            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 8,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
            "linear_num_key_heads": 2, "linear_num_value_heads": 4,
            "linear_key_head_dim": 32, "linear_value_head_dim": 16,
            "vocab_size": 265,
        })
    }

    /// A Qwen3.5 config: the text model's settings nested or at the top level, the layer
    /// kinds from `layer_types` before `full_attention_interval` (default 4), RoPE from
    /// `rope_parameters` (mlx-lm's defaults: base 100,000, a quarter of each head).
    #[test]
    fn qwen35_configs_read_as_mlx_lm_reads_them() {
        let nested = |text: serde_json::Value| serde_json::json!({"model_type": "qwen3_5", "tie_word_embeddings": true, "text_config": text});
        let cfg = config(nested(qwen35_text())).unwrap();
        let h = cfg.hybrid.as_ref().unwrap();
        assert_eq!(cfg.arch, Arch::Qwen35);
        assert_eq!(
            h.linear_layers,
            [true, true, true, false, true, true, true, false]
        );
        assert_eq!(
            (h.rope_dims, h.linear_conv_kernel_dim, cfg.rope_theta),
            (8, 4, 100_000.0)
        );
        assert!(
            cfg.tie_word_embeddings,
            "the top level's entry fills the text model's"
        );
        assert!(cfg.moe.is_none());

        let mut text = qwen35_text();
        text["full_attention_interval"] = 2.into();
        let cfg = config(text.clone()).unwrap();
        assert_eq!(
            cfg.hybrid.unwrap().linear_layers,
            [true, false, true, false, true, false, true, false]
        );
        // layer_types wins over the interval.
        text["layer_types"] = serde_json::json!([
            "full_attention",
            "linear_attention",
            "linear_attention",
            "linear_attention",
            "full_attention",
            "linear_attention",
            "linear_attention",
            "linear_attention"
        ]);
        text["rope_parameters"] = serde_json::json!({"rope_theta": 1e7, "partial_rotary_factor": 0.5});
        let cfg = config(nested(text.clone())).unwrap();
        let h = cfg.hybrid.unwrap();
        assert_eq!(
            h.linear_layers,
            [false, true, true, true, false, true, true, true]
        );
        assert_eq!((h.rope_dims, cfg.rope_theta), (16, 1e7));

        // The mixture: experts in every layer, a shared expert, top-k renormalized unless
        // stated otherwise.
        text["num_experts"] = 8.into();
        text["num_experts_per_tok"] = 2.into();
        text["moe_intermediate_size"] = 32.into();
        text["shared_expert_intermediate_size"] = 64.into();
        let mut moe = nested(text.clone());
        moe["model_type"] = "qwen3_5_moe".into();
        let cfg = config(moe).unwrap();
        let m = cfg.moe.as_ref().unwrap();
        assert_eq!(
            (m.num_experts, m.shared_expert_intermediate_size, m.norm_topk_prob),
            (8, Some(64), true)
        );
        assert!((0..8).all(|l| m.is_sparse(l)));

        // A wrong count of layer types, an unknown kind: errors naming them.
        text["layer_types"] = serde_json::json!(["linear_attention"]);
        text.as_object_mut().unwrap().remove("num_experts");
        let cfg = config(text.clone()).unwrap();
        let err = Model::from_weights(cfg, HashMap::new(), 64)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("1 layer types for 8 layers"), "{err}");
        text["layer_types"] = serde_json::json!(["sliding_attention"]);
        let err = config(text).err().unwrap().to_string();
        assert!(err.contains("sliding_attention"), "{err}");
    }
}
