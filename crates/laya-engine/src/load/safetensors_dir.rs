//! Hugging Face (`config.json` + `*.safetensors`, bf16/f16) and mlx-community (the same, with
//! MLX-quantized weights and a `quantization` entry in `config.json`) model folders. A
//! Qwen3-MoE folder holds its experts one tensor each (HF) or already stacked (mlx-community);
//! the model stacks the former as it loads.

use std::{collections::HashMap, path::Path};

use mlx_rs::Array;
use serde::Deserialize;

use super::{insert_weight, EngineLoadError, LoadOptions, Precision};
use crate::{
    models::{Arch, Model, ModelConfig, MoeConfig},
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
    #[serde(default = "default_theta")]
    rope_theta: f32,
    #[serde(default = "default_eps")]
    rms_norm_eps: f32,
    #[serde(default)]
    tie_word_embeddings: bool,
    quantization: Option<HfQuantization>,
    // Qwen3-MoE; defaults as transformers' Qwen3MoeConfig has them.
    num_experts: Option<i32>,
    num_experts_per_tok: Option<i32>,
    moe_intermediate_size: Option<i32>,
    #[serde(default)]
    norm_topk_prob: bool,
    #[serde(default = "default_sparse_step")]
    decoder_sparse_step: i32,
    #[serde(default)]
    mlp_only_layers: Vec<i32>,
}

#[derive(Deserialize)]
struct HfQuantization {
    group_size: i32,
    #[allow(dead_code)]
    bits: i32,
}

fn default_theta() -> f32 {
    1_000_000.0
}
fn default_eps() -> f32 {
    1e-6
}
fn default_sparse_step() -> i32 {
    1
}

pub fn load(dir: &Path, opts: &LoadOptions) -> Result<(Model, Tokenizer, bool), EngineLoadError> {
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
    // An mlx-community folder is already quantized: use it as stored.
    let (group_size, requantize) = match &hf.quantization {
        Some(q) => (q.group_size, false),
        None => (opts.group_size, opts.precision != Precision::Native),
    };
    let mut weights = HashMap::new();
    for file in &files {
        let map = Array::load_safetensors(file).map_err(|e| EngineLoadError::Invalid {
            file: file.clone(),
            reason: e.to_string(),
        })?;
        for (name, array) in map {
            if requantize {
                insert_weight(&mut weights, name, array, opts, file)?;
            } else {
                weights.insert(name, array);
            }
        }
    }
    let model = Model::from_weights(cfg, weights, group_size).map_err(|source| EngineLoadError::Model {
        file: dir.to_owned(),
        source,
    })?;
    Ok((model, tokenizer, false))
}

/// The folder's `config.json` as the engine's configuration.
pub fn config_of(dir: &Path) -> Result<ModelConfig, EngineLoadError> {
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
    let hf: HfConfig = serde_json::from_str(&text).map_err(|e| EngineLoadError::Invalid {
        file: config_path.clone(),
        reason: e.to_string(),
    })?;
    let arch = match hf.model_type.as_str() {
        "qwen2" => Arch::Qwen2,
        "qwen3" => Arch::Qwen3,
        "qwen3_moe" => Arch::Qwen3Moe,
        other => {
            return Err(EngineLoadError::Invalid {
                file: config_path,
                reason: format!("model_type `{other}` is not supported (qwen2, qwen3 and qwen3_moe are)"),
            })
        }
    };
    let moe = match arch {
        Arch::Qwen3Moe => {
            let missing = |key: &str| EngineLoadError::Invalid {
                file: config_path.clone(),
                reason: format!("a qwen3_moe config needs `{key}`"),
            };
            Some(MoeConfig {
                num_experts: hf.num_experts.ok_or_else(|| missing("num_experts"))?,
                num_experts_per_tok: hf
                    .num_experts_per_tok
                    .ok_or_else(|| missing("num_experts_per_tok"))?,
                moe_intermediate_size: hf
                    .moe_intermediate_size
                    .ok_or_else(|| missing("moe_intermediate_size"))?,
                norm_topk_prob: hf.norm_topk_prob,
                decoder_sparse_step: hf.decoder_sparse_step,
                mlp_only_layers: hf.mlp_only_layers.clone(),
            })
        }
        Arch::Qwen2 | Arch::Qwen3 => None,
    };
    let cfg = ModelConfig {
        arch,
        hidden_size: hf.hidden_size,
        intermediate_size: hf.intermediate_size,
        num_hidden_layers: hf.num_hidden_layers,
        num_attention_heads: hf.num_attention_heads,
        num_key_value_heads: hf.num_key_value_heads.unwrap_or(hf.num_attention_heads),
        head_dim: hf
            .head_dim
            .unwrap_or(hf.hidden_size / hf.num_attention_heads.max(1)),
        vocab_size: hf.vocab_size,
        rope_theta: hf.rope_theta,
        rms_norm_eps: hf.rms_norm_eps,
        tie_word_embeddings: hf.tie_word_embeddings,
        moe,
    };
    Ok((cfg, hf))
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
