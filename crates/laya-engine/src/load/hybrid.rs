//! GGUFs of the hybrid models (llama.cpp's `qwen35`, `qwen35moe` and `qwen3next`): the
//! Gated DeltaNet layers' settings from the `{arch}.ssm.*` keys, and their tensors in the
//! layout the model loads (mlx-community's, `model.layers.{i}.linear_attn.*`), undoing what
//! llama.cpp's converter did to them:
//!
//! - `ssm_a` holds `-exp(A_log)`: the model takes `A_log`, so it gets `ln(-ssm_a)`;
//! - the convolution is stored `[channels, kernel]`: the model's is `[channels, kernel, 1]`;
//! - for `qwen35` and `qwen35moe`, the value heads are in *tiled* order (value head `h`
//!   reads key head `h % Hk`; the converter's `_reorder_v_heads`), where the model (like
//!   Hugging Face's and mlx-lm's) keeps them grouped (value head `h` reads key head
//!   `h / (Hv / Hk)`): the value rows of `attn_qkv` and of the convolution, the rows of
//!   `attn_gate`, `ssm_beta`, `ssm_alpha`, `ssm_a` and `ssm_dt`, and the columns of
//!   `ssm_out` go back to grouped order. Qwen3-Next's GGUFs keep the grouped order, and its
//!   `ssm_ba` (and the older `ssm_in`) the per-key-head interleaving that
//!   [`crate::models`]'s sanitizing regroups, as for its Hugging Face folders.
//!
//! Norms need nothing: the converter stores RMSNorm weights with Hugging Face's `+ 1` applied
//! (as mlx-community's folders hold them) and the gated norm's as they are.

use mlx_rs::{ops, Array};

use super::gguf::GgufFile;
use super::EngineLoadError;
use crate::models::HybridConfig;

/// The hybrid layers' settings of a `qwen35`, `qwen35moe` or `qwen3next` GGUF: which layers
/// are recurrent (`{arch}.attention.recurrent_layers` where given, else all but every
/// `{arch}.full_attention_interval`-th, default 4, as llama.cpp reads them) and their shapes.
pub(crate) fn config(
    g: &GgufFile,
    arch: &str,
    layers: i32,
    head_dim: i32,
) -> Result<HybridConfig, EngineLoadError> {
    let k = |s: &str| format!("{arch}.{s}");
    let u = |s: &str| -> Result<i32, EngineLoadError> { Ok(g.get_u32(&k(s))? as i32) };
    let invalid = |reason: String| EngineLoadError::Invalid {
        file: g.path().to_owned(),
        reason,
    };
    let linear_layers = match g.get_bool_array(&k("attention.recurrent_layers")) {
        Ok(v) if v.len() == layers.max(0) as usize => v.to_vec(),
        Ok(v) => {
            return Err(invalid(format!(
                "{} recurrent_layers flags for {layers} layers",
                v.len()
            )))
        }
        Err(super::gguf::LoadError::MissingMetadata { .. }) => {
            HybridConfig::every_nth_full(layers, u("full_attention_interval").unwrap_or(4))
                .map_err(invalid)?
        }
        Err(e) => return Err(e.into()),
    };
    let value_heads = u("ssm.time_step_rank")?;
    let inner = u("ssm.inner_size")?;
    if value_heads <= 0 || inner % value_heads != 0 {
        return Err(invalid(format!(
            "ssm.inner_size {inner} is not a whole number of ssm.time_step_rank {value_heads} heads"
        )));
    }
    Ok(HybridConfig {
        linear_layers,
        linear_num_key_heads: u("ssm.group_count")?,
        linear_num_value_heads: value_heads,
        linear_key_head_dim: u("ssm.state_size")?,
        linear_value_head_dim: inner / value_heads,
        linear_conv_kernel_dim: u("ssm.conv_kernel")?,
        // Without it llama.cpp turns the whole head.
        rope_dims: u("rope.dimension_count").unwrap_or(head_dim),
    })
}

/// A hybrid layer's GGUF tensor (`part`, what follows `blk.{i}.` without the suffix) as the
/// model names it after `model.layers.{i}.`, and whether the name keeps the GGUF's suffix.
pub(crate) fn model_name(part: &str) -> Option<(&'static str, bool)> {
    Some(match part {
        "attn_qkv" => ("linear_attn.in_proj_qkv", true),
        "attn_gate" => ("linear_attn.in_proj_z", true),
        "ssm_beta" => ("linear_attn.in_proj_b", true),
        "ssm_alpha" => ("linear_attn.in_proj_a", true),
        "ssm_ba" => ("linear_attn.in_proj_ba", true),
        "ssm_in" => ("linear_attn.in_proj_qkvz", true),
        "ssm_conv1d" => ("linear_attn.conv1d", true),
        "ssm_dt" => ("linear_attn.dt_bias", false),
        "ssm_a" => ("linear_attn.A_log", false),
        "ssm_norm" => ("linear_attn.norm", true),
        "ssm_out" => ("linear_attn.out_proj", true),
        "post_attention_norm" => ("post_attention_layernorm", true),
        "ffn_gate_shexp" => ("mlp.shared_expert.gate_proj", true),
        "ffn_up_shexp" => ("mlp.shared_expert.up_proj", true),
        "ffn_down_shexp" => ("mlp.shared_expert.down_proj", true),
        "ffn_gate_inp_shexp" => ("mlp.shared_expert_gate", true),
        _ => return None,
    })
}

/// How a hybrid GGUF's tensors go back to the model's layout.
pub(crate) struct Layout {
    key_heads: i32,
    value_heads: i32,
    key_dim: i32,
    value_dim: i32,
    /// Value heads in the converter's tiled order (`qwen35`, `qwen35moe`).
    tiled: bool,
}

impl Layout {
    pub(crate) fn new(arch: &str, hy: &HybridConfig) -> Layout {
        Layout {
            key_heads: hy.linear_num_key_heads,
            value_heads: hy.linear_num_value_heads,
            key_dim: hy.linear_key_head_dim,
            value_dim: hy.linear_value_head_dim,
            tiled: arch != "qwen3next" && hy.linear_num_value_heads != hy.linear_num_key_heads,
        }
    }

    /// Tensor `w` (MLX's shape, f32) named `name` by the model: as the model loads it.
    pub(crate) fn to_model(&self, name: &str, w: Array) -> mlx_rs::error::Result<Array> {
        let Some((_, what)) = name.split_once(".linear_attn.") else {
            if name.ends_with(".mlp.shared_expert_gate.weight") && w.ndim() == 1 {
                return w.reshape(&[1, w.dim(0)]);
            }
            return Ok(w);
        };
        let qk_rows = 2 * self.key_heads * self.key_dim;
        let dv = self.value_dim;
        Ok(match what {
            "in_proj_qkv.weight" => self.grouped_after(&w, qk_rows, dv)?,
            "conv1d.weight" => {
                let w = self.grouped_after(&w, qk_rows, dv)?;
                w.reshape(&[w.dim(0), -1, 1])?
            }
            "in_proj_z.weight" => self.grouped_after(&w, 0, dv)?,
            "in_proj_b.weight" | "in_proj_a.weight" | "dt_bias" => self.grouped_after(&w, 0, 1)?,
            "A_log" => ops::log(self.grouped_after(&w, 0, 1)?.negative()?)?,
            "out_proj.weight" if self.tiled => {
                let rows = w.dim(0);
                let (r, hk) = (self.value_heads / self.key_heads, self.key_heads);
                w.reshape(&[rows, r, hk, dv])?
                    .transpose_axes(&[0, 2, 1, 3])?
                    .reshape(&[rows, -1])?
            }
            _ => w,
        })
    }

    /// `w` with its rows from `start` on (value heads of `width` rows each) put back in
    /// grouped order; unchanged unless the value heads are tiled.
    fn grouped_after(&self, w: &Array, start: i32, width: i32) -> mlx_rs::error::Result<Array> {
        if !self.tiled {
            return Ok(w.clone());
        }
        let (r, hk) = (self.value_heads / self.key_heads, self.key_heads);
        let rest: Vec<i32> = w.shape()[1..].to_vec();
        let regroup = |v: &Array| -> mlx_rs::error::Result<Array> {
            let mut shape = vec![r, hk, width];
            shape.extend(&rest);
            let mut axes: Vec<i32> = (0..shape.len() as i32).collect();
            axes.swap(0, 1);
            let mut back = vec![r * hk * width];
            back.extend(&rest);
            v.reshape(&shape)?.transpose_axes(&axes)?.reshape(&back)
        };
        if start == 0 {
            return regroup(w);
        }
        let parts = ops::split_at_indices(w, &[start], 0)?;
        ops::concatenate(&[parts[0].clone(), regroup(&parts[1])?], 0)
    }
}
