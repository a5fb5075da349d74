//! Models with random weights of real shapes, for speed measurements where the real weights
//! cannot travel (a GPU machine reached through a 64 MiB pipe). Numbers from them are labeled
//! synthetic: speed depends on shapes and bit widths, not on the values.

use std::collections::HashMap;

use mlx_rs::{ops, random, transforms::eval, Array, Dtype};

use super::{
    load::Precision,
    models::{Arch, Model, ModelConfig, ModelError},
};

/// The architectures laya targets, by name.
pub fn shape(name: &str) -> Option<ModelConfig> {
    let qwen2 = |hidden, inter, layers, heads, kv, vocab, tied| ModelConfig {
        arch: Arch::Qwen2,
        hidden_size: hidden,
        intermediate_size: inter,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        num_key_value_heads: kv,
        head_dim: hidden / heads,
        vocab_size: vocab,
        rope_theta: 1_000_000.0,
        rms_norm_eps: 1e-6,
        tie_word_embeddings: tied,
        moe: None,
    };
    Some(match name {
        "qwen2.5-coder-0.5b" => qwen2(896, 4864, 24, 14, 2, 151936, true),
        "qwen2.5-coder-1.5b" => qwen2(1536, 8960, 28, 12, 2, 151936, true),
        "qwen2.5-coder-3b" => qwen2(2048, 11008, 36, 16, 2, 151936, true),
        "qwen2.5-coder-32b" => qwen2(5120, 27648, 64, 40, 8, 152064, false),
        "qwen3-4b" => ModelConfig {
            arch: Arch::Qwen3,
            hidden_size: 2560,
            intermediate_size: 9728,
            num_hidden_layers: 36,
            num_attention_heads: 32,
            num_key_value_heads: 8,
            head_dim: 128,
            vocab_size: 151936,
            rope_theta: 1_000_000.0,
            rms_norm_eps: 1e-6,
            tie_word_embeddings: true,
            moe: None,
        },
        _ => return None,
    })
}

pub const SHAPES: &[&str] = &[
    "qwen2.5-coder-0.5b",
    "qwen2.5-coder-1.5b",
    "qwen2.5-coder-3b",
    "qwen3-4b",
    "qwen2.5-coder-32b",
];

/// A model of random weights; see [`random_weights`].
pub fn random_model(
    cfg: &ModelConfig,
    precision: Precision,
    group_size: i32,
    dtype: Dtype,
    seed: u64,
) -> Result<Model, ModelError> {
    let weights = random_weights(cfg, precision, group_size, dtype, seed)?;
    Model::from_weights(cfg.clone(), weights, group_size)
}

/// Random weights with HF names (normal, std 0.02; norms 1) in `dtype`, quantized per
/// `precision` with `group_size`. Each tensor is made and quantized on its own, so the peak
/// memory is the quantized model plus one dense tensor.
pub fn random_weights(
    cfg: &ModelConfig,
    precision: Precision,
    group_size: i32,
    dtype: Dtype,
    seed: u64,
) -> Result<HashMap<String, Array>, ModelError> {
    let (h, i, hd) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim);
    let (q, kv) = (cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd);
    let mut key = random::key(seed)?;
    let mut weights: HashMap<String, Array> = HashMap::new();
    let mut add = |name: String, shape: &[i32], ones: bool| -> Result<(), ModelError> {
        let w = if ones {
            ops::ones::<f32>(shape)?.as_dtype(dtype)?
        } else {
            let (k, next) = random::split(&key, 2)?;
            key = next;
            random::normal::<f32>(shape, 0.0, 0.02, &k)?.as_dtype(dtype)?
        };
        let quantize = precision
            .bits()
            .filter(|_| shape.len() == 2 && shape[1] % group_size == 0);
        match quantize {
            Some(bits) => {
                let (wq, s, b) = ops::quantize(&w, group_size, bits)?;
                eval([&wq, &s, &b])?;
                let stem = name.trim_end_matches(".weight").to_owned();
                weights.insert(format!("{stem}.scales"), s);
                weights.insert(format!("{stem}.biases"), b);
                weights.insert(name, wq);
            }
            None => {
                eval([&w])?;
                weights.insert(name, w);
            }
        }
        Ok(())
    };
    add("model.embed_tokens.weight".into(), &[cfg.vocab_size, h], false)?;
    for l in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{l}");
        for (name, out) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
            add(format!("{p}.self_attn.{name}.weight"), &[out, h], false)?;
            if cfg.arch == Arch::Qwen2 {
                add(format!("{p}.self_attn.{name}.bias"), &[out], false)?;
            }
        }
        if cfg.arch == Arch::Qwen3 {
            add(format!("{p}.self_attn.q_norm.weight"), &[hd], true)?;
            add(format!("{p}.self_attn.k_norm.weight"), &[hd], true)?;
        }
        add(format!("{p}.self_attn.o_proj.weight"), &[h, q], false)?;
        add(format!("{p}.mlp.gate_proj.weight"), &[i, h], false)?;
        add(format!("{p}.mlp.up_proj.weight"), &[i, h], false)?;
        add(format!("{p}.mlp.down_proj.weight"), &[h, i], false)?;
        add(format!("{p}.input_layernorm.weight"), &[h], true)?;
        add(format!("{p}.post_attention_layernorm.weight"), &[h], true)?;
    }
    add("model.norm.weight".into(), &[h], true)?;
    if !cfg.tie_word_embeddings {
        add("lm_head.weight".into(), &[cfg.vocab_size, h], false)?;
    }
    Ok(weights)
}

/// A tiny Qwen2 (2 layers, hidden 128) with the real vocabulary: loads and runs in well under
/// a second on a CPU, so tests and the soak bench exercise the real engine (KV cache, prefix
/// store, tokenizer) without real weights.
pub fn tiny() -> ModelConfig {
    ModelConfig {
        arch: Arch::Qwen2,
        hidden_size: 128,
        intermediate_size: 256,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 32,
        vocab_size: 151936,
        rope_theta: 1_000_000.0,
        rms_norm_eps: 1e-6,
        tie_word_embeddings: true,
        moe: None,
    }
}

/// config.json as Hugging Face writes it for `cfg` (with MLX `quantization` when given as
/// `(group_size, bits)`).
pub fn config_json(cfg: &ModelConfig, quantization: Option<(i32, i32)>) -> String {
    let arch = match cfg.arch {
        Arch::Qwen2 => ("Qwen2ForCausalLM", "qwen2"),
        Arch::Qwen3 => ("Qwen3ForCausalLM", "qwen3"),
        Arch::Qwen3Moe => ("Qwen3MoeForCausalLM", "qwen3_moe"),
    };
    let mut v = serde_json::json!({
        "architectures": [arch.0],
        "model_type": arch.1,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "vocab_size": cfg.vocab_size,
        "rope_theta": cfg.rope_theta,
        "rms_norm_eps": cfg.rms_norm_eps,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "torch_dtype": "bfloat16",
    });
    if let Some(m) = &cfg.moe {
        v["num_experts"] = m.num_experts.into();
        v["num_experts_per_tok"] = m.num_experts_per_tok.into();
        v["moe_intermediate_size"] = m.moe_intermediate_size.into();
        v["norm_topk_prob"] = m.norm_topk_prob.into();
        v["decoder_sparse_step"] = m.decoder_sparse_step.into();
        v["mlp_only_layers"] = m.mlp_only_layers.clone().into();
    }
    if let Some((group_size, bits)) = quantization {
        v["quantization"] = serde_json::json!({ "group_size": group_size, "bits": bits });
    }
    v.to_string()
}

/// Write a model folder as HF checkpoints are: config.json, tokenizer.json (exported from the
/// GGUF `tokenizer_gguf`'s vocabulary) and `weights` split over two safetensors files.
pub fn write_folder(
    dir: &std::path::Path,
    cfg: &ModelConfig,
    weights: &HashMap<String, Array>,
    quantization: Option<(i32, i32)>,
    tokenizer_gguf: &std::path::Path,
) -> Result<(), String> {
    let gguf = super::load::gguf::GgufFile::open(tokenizer_gguf).map_err(|e| e.to_string())?;
    let tokenizer = super::tokenizer::Tokenizer::from_gguf(&gguf).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    std::fs::write(dir.join("config.json"), config_json(cfg, quantization))
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    tokenizer
        .save_json(dir.join("tokenizer.json"))
        .map_err(|e| e.to_string())?;
    let (a, b): (Vec<_>, Vec<_>) = weights.iter().partition(|(k, _)| k.contains("layers.1."));
    for (part, name) in [
        (a, "model-00001-of-00002.safetensors"),
        (b, "model-00002-of-00002.safetensors"),
    ] {
        Array::save_safetensors(part, None, dir.join(name)).map_err(|e| format!("{name}: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The counts `ModelConfig::parameters` gives the shapes match the sizes their model
    /// cards state (0.49B, 1.54B, 3.09B, 4.0B, 32.5B) within 2 %.
    #[test]
    fn parameter_counts_match_the_model_cards() {
        for (name, card) in [
            ("qwen2.5-coder-0.5b", 0.49e9),
            ("qwen2.5-coder-1.5b", 1.54e9),
            ("qwen2.5-coder-3b", 3.09e9),
            ("qwen3-4b", 4.0e9),
            ("qwen2.5-coder-32b", 32.5e9),
        ] {
            let n = shape(name).unwrap().parameters() as f64;
            assert!(
                (n / card - 1.0).abs() < 0.02,
                "{name}: {n} parameters, card {card}"
            );
        }
    }
}
