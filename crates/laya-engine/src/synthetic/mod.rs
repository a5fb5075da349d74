//! Models with random weights of real shapes (the catalog's, [`crate::models::Shape`]), for
//! speed measurements where the real weights cannot travel (a GPU machine reached through a
//! 64 MiB pipe), and folders of them for load-time measurements (written a shard at a time:
//! `write_random_folder`). Numbers from them are labeled synthetic: speed depends on shapes and
//! bit widths, not on the values. Also the tests' model files: tiny configurations, HF folders
//! of given weights, a safetensors file, and (`gguf`) the tiny GGUF the engine's tests and
//! laya's share.

pub mod gguf;

use std::collections::HashMap;

use mlx_rs::{ops, random, transforms::eval, Array};

/// The float types synthetic weights are made in (MLX's).
pub use mlx_rs::Dtype;

use crate::{
    load::{bits_for, quantizable},
    models::{Arch, Model, ModelConfig, ModelError},
    seam::Precision,
};

/// A model of random weights; see [`random_weights`].
pub(crate) fn random_model(
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
    let mut key = random::key(seed)?;
    let mut weights: HashMap<String, Array> = HashMap::new();
    for (name, shape, ones) in tensors(cfg) {
        let w = random_tensor(&mut key, &shape, ones, dtype)?;
        // The loader's policy: matrices and stacked experts quantized, a MoE router at 8 bits.
        let quantize = precision
            .bits()
            .filter(|_| name.ends_with(".weight") && quantizable(&shape, group_size));
        match quantize {
            Some(bits) => {
                let bits = bits_for(&name, bits);
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
    }
    Ok(weights)
}

/// A tensor of random values (normal, std 0.02), or of ones (a norm's), in `dtype`; `key`
/// moves on for each random one.
fn random_tensor(key: &mut Array, shape: &[i32], ones: bool, dtype: Dtype) -> Result<Array, ModelError> {
    if ones {
        return Ok(ops::ones::<f32>(shape)?.as_dtype(dtype)?);
    }
    let (k, next) = random::split(&*key, 2)?;
    *key = next;
    Ok(random::normal::<f32>(shape, 0.0, 0.02, &k)?.as_dtype(dtype)?)
}

/// The tensors of a model of `cfg` with HF names, in a fixed order: (name, shape, whether it
/// is a norm, of ones). A MoE layer's experts are stacked as mlx-community stores them.
fn tensors(cfg: &ModelConfig) -> Vec<(String, Vec<i32>, bool)> {
    let (h, i, hd) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim);
    let (q, kv) = (cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd);
    let mut v = vec![];
    let mut add = |name: String, shape: &[i32], ones: bool| v.push((name, shape.to_vec(), ones));
    add("model.embed_tokens.weight".into(), &[cfg.vocab_size, h], false);
    for l in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{l}");
        let linear = cfg.hybrid.as_ref().filter(|h| h.linear_layers[l as usize]);
        if let Some(hy) = linear {
            // A Gated DeltaNet layer in mlx-community's layout (conv1d `[C, K, 1]`).
            let a = format!("{p}.linear_attn");
            let (c, vd, hv) = (
                hy.conv_channels(),
                hy.linear_num_value_heads * hy.linear_value_head_dim,
                hy.linear_num_value_heads,
            );
            add(format!("{a}.in_proj_qkv.weight"), &[c, h], false);
            add(format!("{a}.in_proj_z.weight"), &[vd, h], false);
            add(format!("{a}.in_proj_b.weight"), &[hv, h], false);
            add(format!("{a}.in_proj_a.weight"), &[hv, h], false);
            add(
                format!("{a}.conv1d.weight"),
                &[c, hy.linear_conv_kernel_dim, 1],
                false,
            );
            // A_log near 0 (decay rates near 1) and a dt_bias of ones.
            add(format!("{a}.A_log"), &[hv], false);
            add(format!("{a}.dt_bias"), &[hv], true);
            add(format!("{a}.norm.weight"), &[hy.linear_value_head_dim], true);
            add(format!("{a}.out_proj.weight"), &[h, vd], false);
        }
        // A gated attention's q_proj gives each head its gate too.
        let q_rows = if cfg.hybrid.is_some() { 2 * q } else { q };
        let attention = if linear.is_some() {
            vec![]
        } else {
            vec![("q_proj", q_rows), ("k_proj", kv), ("v_proj", kv)]
        };
        for (name, out) in attention {
            add(format!("{p}.self_attn.{name}.weight"), &[out, h], false);
            if cfg.arch == Arch::Qwen2 {
                add(format!("{p}.self_attn.{name}.bias"), &[out], false);
            }
        }
        if linear.is_none() {
            if cfg.arch != Arch::Qwen2 {
                add(format!("{p}.self_attn.q_norm.weight"), &[hd], true);
                add(format!("{p}.self_attn.k_norm.weight"), &[hd], true);
            }
            add(format!("{p}.self_attn.o_proj.weight"), &[h, q], false);
        }
        match cfg.moe.as_ref().filter(|m| m.is_sparse(l)) {
            Some(m) => {
                let (e, mi) = (m.num_experts, m.moe_intermediate_size);
                add(format!("{p}.mlp.gate.weight"), &[e, h], false);
                add(format!("{p}.mlp.switch_mlp.gate_proj.weight"), &[e, mi, h], false);
                add(format!("{p}.mlp.switch_mlp.up_proj.weight"), &[e, mi, h], false);
                add(format!("{p}.mlp.switch_mlp.down_proj.weight"), &[e, h, mi], false);
                if let Some(si) = m.shared_expert_intermediate_size {
                    add(format!("{p}.mlp.shared_expert.gate_proj.weight"), &[si, h], false);
                    add(format!("{p}.mlp.shared_expert.up_proj.weight"), &[si, h], false);
                    add(format!("{p}.mlp.shared_expert.down_proj.weight"), &[h, si], false);
                    add(format!("{p}.mlp.shared_expert_gate.weight"), &[1, h], false);
                }
            }
            None => {
                add(format!("{p}.mlp.gate_proj.weight"), &[i, h], false);
                add(format!("{p}.mlp.up_proj.weight"), &[i, h], false);
                add(format!("{p}.mlp.down_proj.weight"), &[h, i], false);
            }
        }
        add(format!("{p}.input_layernorm.weight"), &[h], true);
        add(format!("{p}.post_attention_layernorm.weight"), &[h], true);
    }
    add("model.norm.weight".into(), &[h], true);
    if !cfg.tie_word_embeddings {
        add("lm_head.weight".into(), &[cfg.vocab_size, h], false);
    }
    v
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
        hybrid: None,
    }
}

/// config.json as Hugging Face writes it for `cfg` (with MLX `quantization` when given as
/// `(group_size, bits)`).
pub fn config_json(cfg: &ModelConfig, quantization: Option<(i32, i32)>) -> String {
    let arch = match cfg.arch {
        Arch::Qwen2 => ("Qwen2ForCausalLM", "qwen2"),
        Arch::Qwen3 => ("Qwen3ForCausalLM", "qwen3"),
        Arch::Qwen3Moe => ("Qwen3MoeForCausalLM", "qwen3_moe"),
        Arch::Qwen35 => ("Qwen3_5ForConditionalGeneration", "qwen3_5"),
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
    if let Some(h) = &cfg.hybrid {
        // Qwen3.5's layout: the text model's settings nested, as its multimodal configs are.
        let types: Vec<&str> = h
            .linear_layers
            .iter()
            .map(|&l| if l { "linear_attention" } else { "full_attention" })
            .collect();
        let mut text = v.clone();
        text["model_type"] = "qwen3_5_text".into();
        text["linear_num_key_heads"] = h.linear_num_key_heads.into();
        text["linear_num_value_heads"] = h.linear_num_value_heads.into();
        text["linear_key_head_dim"] = h.linear_key_head_dim.into();
        text["linear_value_head_dim"] = h.linear_value_head_dim.into();
        text["linear_conv_kernel_dim"] = h.linear_conv_kernel_dim.into();
        text["layer_types"] = types.into();
        text["rope_parameters"] = serde_json::json!({
            "rope_type": "default",
            "rope_theta": cfg.rope_theta,
            "partial_rotary_factor": h.rope_dims as f32 / cfg.head_dim as f32,
        });
        v = serde_json::json!({
            "architectures": [arch.0],
            "model_type": arch.1,
            "tie_word_embeddings": cfg.tie_word_embeddings,
            "text_config": text,
        });
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
) -> std::io::Result<()> {
    write_folder_files(dir, cfg, quantization, tokenizer_gguf)?;
    let (a, b): (Vec<_>, Vec<_>) = weights.iter().partition(|(k, _)| k.contains("layers.1."));
    for (part, name) in [
        (a, "model-00001-of-00002.safetensors"),
        (b, "model-00002-of-00002.safetensors"),
    ] {
        Array::save_safetensors(part, None, dir.join(name)).map_err(|e| io_error(&name, &e))?;
    }
    Ok(())
}

/// A Hugging Face folder of random weights (see [`random_weights`]) in `dtype`, unquantized,
/// as [`write_folder`] writes one; the tensors are made and written a shard of about
/// `shard_bytes` at a time, so a model larger than the memory can be written. Returns the
/// bytes of weights written.
pub fn write_random_folder(
    dir: &std::path::Path,
    cfg: &ModelConfig,
    dtype: Dtype,
    seed: u64,
    tokenizer_gguf: &std::path::Path,
    shard_bytes: u64,
) -> std::io::Result<u64> {
    write_folder_files(dir, cfg, None, tokenizer_gguf)?;
    let mlx = |e: ModelError| io_error(&dir.display(), &e);
    let mut key = random::key(seed).map_err(|e| mlx(e.into()))?;
    let (mut shard, mut shard_size, mut shards, mut total) = (HashMap::new(), 0u64, 0, 0u64);
    let flush = |shard: &mut HashMap<String, Array>, shards: &mut usize| -> std::io::Result<()> {
        *shards += 1;
        let name = format!("model-{:05}.safetensors", *shards);
        Array::save_safetensors(shard.iter(), None, dir.join(&name)).map_err(|e| io_error(&name, &e))?;
        shard.clear();
        Ok(())
    };
    for (name, shape, ones) in tensors(cfg) {
        let w = random_tensor(&mut key, &shape, ones, dtype).map_err(mlx)?;
        eval([&w]).map_err(|e| mlx(e.into()))?;
        let bytes = w.nbytes() as u64;
        if shard_size > 0 && shard_size + bytes > shard_bytes {
            flush(&mut shard, &mut shards)?;
            shard_size = 0;
        }
        shard.insert(name, w);
        shard_size += bytes;
        total += bytes;
    }
    if !shard.is_empty() {
        flush(&mut shard, &mut shards)?;
    }
    Ok(total)
}

/// config.json and tokenizer.json of a folder of `cfg` (see [`write_folder`]).
fn write_folder_files(
    dir: &std::path::Path,
    cfg: &ModelConfig,
    quantization: Option<(i32, i32)>,
    tokenizer_gguf: &std::path::Path,
) -> std::io::Result<()> {
    let gguf = super::load::gguf::GgufFile::open(tokenizer_gguf)
        .map_err(|e| io_error(&tokenizer_gguf.display(), &e))?;
    let tokenizer =
        super::tokenizer::Tokenizer::from_gguf(&gguf).map_err(|e| io_error(&tokenizer_gguf.display(), &e))?;
    let io = |e: std::io::Error| io_error(&dir.display(), &e);
    std::fs::create_dir_all(dir).map_err(io)?;
    std::fs::write(dir.join("config.json"), config_json(cfg, quantization)).map_err(io)?;
    tokenizer
        .save_json(dir.join("tokenizer.json"))
        .map_err(|e| io_error(&"tokenizer.json", &e))
}

fn io_error(what: &dyn std::fmt::Display, e: &dyn std::fmt::Display) -> std::io::Error {
    std::io::Error::other(format!("{what}: {e}"))
}

/// The shape of the tiny model folders the fetch and verification tests write (a Qwen2 of
/// hidden size 8, 2 layers, a vocabulary of 32).
pub const TINY_SHAPE: crate::models::Shape = crate::models::Shape {
    arch: Arch::Qwen2,
    hidden_size: 8,
    intermediate_size: 16,
    layers: 2,
    heads: 2,
    kv_heads: 1,
    head_dim: 4,
    vocab_size: 32,
    tied: true,
    experts: None,
    shared_expert: None,
    hybrid: None,
};

/// A safetensors file of bf16 `tensors` (name, shape), its bytes a pattern (so that a byte
/// out of place changes its hash): for tests of what is read from headers and downloads.
pub fn safetensors_file(tensors: &[(&str, &[u64])]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut offset = 0u64;
    for (name, shape) in tensors {
        let bytes = 2 * shape.iter().product::<u64>();
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    }
    let text = serde_json::to_vec(&header).expect("a JSON map serializes");
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend(text);
    out.extend((0..offset).map(|i| (i % 251) as u8));
    out
}
