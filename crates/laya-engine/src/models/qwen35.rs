//! Qwen3.5 / Qwen3.6 (and Qwen3-Next's layer design): a hybrid of Gated DeltaNet layers
//! (linear attention with a recurrent state) and gated full-attention layers, as mlx-lm's
//! `qwen3_5` runs them.
//!
//! Gated DeltaNet, per token `t` (`h` the normed input, heads of the value side `Hv`, of the
//! key side `Hk`, `Hv / Hk` value heads per key head):
//!
//! ```text
//! qkv, z, b, a = h W_qkv, h W_z, h W_b, h W_a          // one matmul over the stacked rows
//! q, k, v = silu(causal depthwise conv over the last kernel rows of qkv)   // (kernel-1)-row state
//! q, k = l2norm(q) / sqrt(Dk), l2norm(k)                // per key head
//! g = exp(-exp(A_log) softplus(a + dt_bias)), beta = sigmoid(b)           // f32 decay
//! S = g S;  S += beta (v - S k) kᵀ;  y = S q             // S: [Hv, Dv, Dk], f32
//! o = (rmsnorm(y) * norm) silu(z);  out = o W_out
//! ```
//!
//! The recurrence runs as MLX ops, one step a token (mlx-lm's ops path, which it takes off
//! Metal); the projections, the convolution and the norms run over the whole chunk.
//!
//! Gated attention: `q_proj` gives each head its query and an output gate side by side
//! (`[H, 2 D]`), q and k are RMS-normed per head, RoPE turns the first `rope_dims` dims of
//! each head (a quarter), and the attention's output is multiplied by `sigmoid(gate)`
//! before `o_proj`.
//!
//! Weights come with mlx-community's names (`language_model.model.layers.{i}.linear_attn.*`)
//! or Hugging Face's (`model.language_model.*`, conv1d as `[C, 1, K]`, norms stored as
//! `weight - 1`): [`sanitize`] maps both to `model.layers.{i}.*` as mlx-lm does, and drops the
//! vision tower and the multi-token-prediction head.

use std::collections::HashMap;

use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::{fast, ops, Array, Dtype};

use super::{
    pair, triple, AttentionCore, FusedLinear, Linear, ModelConfig, ModelError, Result, RmsNorm, Weights,
};
use crate::cache::{KvCache, Recurrent};

/// Maps a Qwen3.5 checkpoint's tensors to the names and layout the model loads, as mlx-lm's
/// `sanitize` does: the `language_model.` / `model.language_model.` prefixes go, vision and
/// MTP tensors are dropped, and a Hugging Face checkpoint (conv1d stored `[C, 1, K]`) gets its
/// convolutions as `[C, K, 1]` and 1 added to its RMSNorm weights (stored as `weight - 1`).
pub(super) fn sanitize(map: HashMap<String, Array>) -> Result<HashMap<String, Array>> {
    let mut out = HashMap::with_capacity(map.len());
    for (name, a) in map {
        if name.starts_with("vision_tower")
            || name.starts_with("model.visual")
            || name.starts_with("visual.")
            || name.starts_with("mtp.")
            || name.contains(".mtp.")
        {
            continue;
        }
        let name = if let Some(rest) = name.strip_prefix("model.language_model.") {
            format!("model.{rest}")
        } else if let Some(rest) = name.strip_prefix("language_model.") {
            rest.to_owned()
        } else {
            name
        };
        out.insert(name, a);
    }
    let hf = out
        .iter()
        .any(|(k, v)| k.ends_with(".conv1d.weight") && v.ndim() == 3 && v.dim(-1) != 1);
    if hf {
        const NORMS: [&str; 5] = [
            ".input_layernorm.weight",
            ".post_attention_layernorm.weight",
            "model.norm.weight",
            ".q_norm.weight",
            ".k_norm.weight",
        ];
        for (k, v) in out.iter_mut() {
            if k.ends_with(".conv1d.weight") && v.ndim() == 3 && v.dim(-1) != 1 {
                *v = v.swap_axes(1, 2)?;
            } else if v.ndim() == 1 && NORMS.iter().any(|n| k.ends_with(n)) {
                *v = v.add(Array::from_f32(1.0).as_dtype(v.dtype())?)?;
            }
        }
    }
    Ok(out)
}

/// `x` `[B, L, heads, D]` as `[B, heads, L, D]`, row-contiguous (a reshape at L = 1; MLX 0.32's
/// CUDA RoPE misreads a transposed view, see `AttentionCore::heads`).
fn to_heads(x: &Array) -> Result<Array> {
    let (b, l, h, d) = (x.dim(0), x.dim(1), x.dim(2), x.dim(3));
    if l == 1 {
        return Ok(x.reshape(&[b, h, 1, d])?);
    }
    Ok(x.transpose_axes(&[0, 2, 1, 3])?.contiguous()?)
}

fn silu(x: &Array) -> Result<Array> {
    Ok(x.multiply(ops::sigmoid(x)?)?)
}

/// Gated full attention.
pub(super) struct GatedAttention {
    /// q (with each head's gate), k and v, stacked when their formats allow.
    pub(super) qkv: FusedLinear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    o_proj: Linear,
    core: AttentionCore,
}

impl GatedAttention {
    pub(super) fn load(cfg: &ModelConfig, w: &mut Weights, prefix: &str) -> Result<Self> {
        let core = AttentionCore::new(cfg);
        let (hidden, eps, d) = (cfg.hidden_size, cfg.rms_norm_eps, cfg.head_dim);
        let [q_rows, kv_rows, _] = core.qkv_rows();
        let parts = vec![
            w.linear(&format!("{prefix}.q_proj"), 2 * q_rows, hidden, false)?,
            w.linear(&format!("{prefix}.k_proj"), kv_rows, hidden, false)?,
            w.linear(&format!("{prefix}.v_proj"), kv_rows, hidden, false)?,
        ];
        Ok(GatedAttention {
            qkv: FusedLinear::new(parts)?,
            q_norm: w.rms_norm(&format!("{prefix}.q_norm.weight"), d, eps)?,
            k_norm: w.rms_norm(&format!("{prefix}.k_norm.weight"), d, eps)?,
            o_proj: w.linear(&format!("{prefix}.o_proj"), hidden, q_rows, false)?,
            core,
        })
    }

    /// `x`: `[B, L, hidden]`, already normed.
    pub(super) fn forward(&self, x: &Array, cache: &mut KvCache) -> Result<Array> {
        let core = &self.core;
        let (b, l) = (x.dim(0), x.dim(1));
        let (h, kv, d) = (core.n_heads, core.n_kv_heads, core.head_dim);
        let [qg, k, v] = triple(self.qkv.forward(x)?)?;
        // Each head's query, then its gate.
        let [q, gate] = pair(ops::split_at_indices(&qg.reshape(&[b, l, h, 2 * d])?, &[d], -1)?)?;
        let gate = gate.reshape(&[b, l, h * d])?;
        let q = to_heads(&self.q_norm.forward(&q)?)?;
        let k = to_heads(&self.k_norm.forward(&k.reshape(&[b, l, kv, d])?)?)?;
        let v = to_heads(&v.reshape(&[b, l, kv, d])?)?;
        let q = core.rope(&q, cache)?;
        let k = core.rope(&k, cache)?;
        let out = core.attend(&q, &k, &v, cache)?;
        self.o_proj.forward(&out.multiply(ops::sigmoid(&gate)?)?)
    }

    pub(super) fn arrays(&self) -> Vec<&Array> {
        let mut v = self.qkv.arrays();
        v.extend([&self.q_norm.weight, &self.k_norm.weight]);
        v.extend(self.o_proj.arrays());
        v
    }
}

/// A Gated DeltaNet layer.
pub(super) struct GatedDeltaNet {
    /// `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`, stacked when their formats allow.
    pub(super) proj: FusedLinear,
    /// The depthwise convolution, `[channels, kernel, 1]` (MLX's conv1d layout).
    conv: Array,
    /// `-exp(A_log)`, `[Hv]`, f32.
    neg_a: Array,
    dt_bias: Array,
    /// The gated RMSNorm's weight, `[Dv]`.
    norm: RmsNorm,
    out_proj: Linear,
    k_heads: i32,
    v_heads: i32,
    k_dim: i32,
    v_dim: i32,
    kernel: i32,
}

impl GatedDeltaNet {
    pub(super) fn load(cfg: &ModelConfig, w: &mut Weights, prefix: &str) -> Result<Self> {
        let hy = cfg
            .hybrid
            .as_ref()
            .ok_or_else(|| ModelError::Config("a Gated DeltaNet layer needs the hybrid config".into()))?;
        let hidden = cfg.hidden_size;
        let (hk, hv, dk, dv, kernel) = (
            hy.linear_num_key_heads,
            hy.linear_num_value_heads,
            hy.linear_key_head_dim,
            hy.linear_value_head_dim,
            hy.linear_conv_kernel_dim,
        );
        let channels = 2 * hk * dk + hv * dv;
        let parts = vec![
            w.linear(&format!("{prefix}.in_proj_qkv"), channels, hidden, false)?,
            w.linear(&format!("{prefix}.in_proj_z"), hv * dv, hidden, false)?,
            w.linear(&format!("{prefix}.in_proj_b"), hv, hidden, false)?,
            w.linear(&format!("{prefix}.in_proj_a"), hv, hidden, false)?,
        ];
        let conv = w.take_shaped(&format!("{prefix}.conv1d.weight"), &[channels, kernel, 1])?;
        let a_log = w.take_shaped(&format!("{prefix}.A_log"), &[hv])?;
        let neg_a = ops::exp(a_log.as_dtype(Dtype::Float32)?)?.negative()?;
        Ok(GatedDeltaNet {
            proj: FusedLinear::new(parts)?,
            conv,
            neg_a,
            dt_bias: w.take_shaped(&format!("{prefix}.dt_bias"), &[hv])?,
            norm: w.rms_norm(&format!("{prefix}.norm.weight"), dv, cfg.rms_norm_eps)?,
            out_proj: w.linear(&format!("{prefix}.out_proj"), hidden, hv * dv, false)?,
            k_heads: hk,
            v_heads: hv,
            k_dim: dk,
            v_dim: dv,
            kernel,
        })
    }

    /// `x`: `[B, S, hidden]`, already normed; runs after the state `cache` holds and leaves
    /// the state after `x` there.
    pub(super) fn forward(&self, x: &Array, cache: &mut KvCache) -> Result<Array> {
        let (b, s) = (x.dim(0), x.dim(1));
        let (hk, hv, dk, dv) = (self.k_heads, self.v_heads, self.k_dim, self.v_dim);
        let channels = 2 * hk * dk + hv * dv;
        let parts: [Array; 4] = self
            .proj
            .forward(x)?
            .try_into()
            .map_err(|v: Vec<Array>| ModelError::Input(format!("{} parts, expected 4", v.len())))?;
        let [qkv, z, beta, a] = parts;

        // The causal depthwise convolution over the state's rows and this chunk's.
        let conv_state = match cache.recurrent() {
            Some(r) => r.conv.clone(),
            None => ops::zeros_dtype(&[b, self.kernel - 1, channels], qkv.dtype())?,
        };
        let conv_input = ops::concatenate(&[&conv_state, &qkv], 1)?;
        let next_conv = conv_input.try_index((.., s.., ..))?.contiguous()?;
        let conv = ops::conv1d(&conv_input, &self.conv, 1, 0, 1, channels)?;
        let conv = silu(&conv)?;
        let [q, k, v] = triple(ops::split_at_indices(&conv, &[hk * dk, 2 * hk * dk], -1)?)?;
        let q = q.reshape(&[b, s, hk, dk])?;
        let k = k.reshape(&[b, s, hk, dk])?;
        let v = v.reshape(&[b, s, hv, dv])?;

        // L2 norms (eps 1e-6 on the sum of squares, as rms_norm's on the mean), the readout
        // scale 1/sqrt(Dk) folded into q.
        let inv = 1.0 / (dk as f32).sqrt();
        let eps = 1e-6 * inv * inv;
        let scalar = |x: f32, like: &Array| Array::from_f32(x).as_dtype(like.dtype());
        let q = fast::rms_norm(&q, None, eps)?;
        let q = q.multiply(scalar(inv * inv, &q)?)?;
        let k = fast::rms_norm(&k, None, eps)?;
        let k = k.multiply(scalar(inv, &k)?)?;

        // The gates: decay g (f32) and write strength beta, `[B, S, Hv]`.
        let beta = ops::sigmoid(&beta)?;
        let a = a.add(&self.dt_bias)?;
        let softplus = ops::logaddexp(&a, scalar(0.0, &a)?)?;
        let g = ops::exp(self.neg_a.multiply(&softplus)?)?;

        let (q, k) = if hv > hk {
            (
                ops::repeat_axis::<f32>(q, hv / hk, 2)?,
                ops::repeat_axis::<f32>(k, hv / hk, 2)?,
            )
        } else {
            (q, k)
        };
        let mut state = match cache.recurrent() {
            Some(r) => r.state.clone(),
            None => ops::zeros::<f32>(&[b, hv, dv, dk])?,
        };
        let mut ys = Vec::with_capacity(s as usize);
        for t in 0..s {
            let qt = q.try_index((.., t))?.expand_dims(-2)?; // [B, Hv, 1, Dk]
            let kt = k.try_index((.., t))?.expand_dims(-2)?;
            let vt = v.try_index((.., t))?; // [B, Hv, Dv]
            let gt = g.try_index((.., t))?.reshape(&[b, hv, 1, 1])?;
            let bt = beta.try_index((.., t))?.expand_dims(-1)?; // [B, Hv, 1]
            state = state.multiply(&gt)?;
            let kv_mem = state.multiply(&kt)?.sum_axis(-1, false)?; // [B, Hv, Dv]
            let delta = vt.subtract(&kv_mem)?.multiply(&bt)?;
            state = state.add(kt.multiply(delta.expand_dims(-1)?)?)?;
            ys.push(state.multiply(&qt)?.sum_axis(-1, false)?.as_dtype(q.dtype())?);
        }
        let y = ops::stack(&ys, 1)?; // [B, S, Hv, Dv]
        cache
            .update_recurrent(
                Recurrent {
                    conv: next_conv,
                    state,
                },
                s as usize,
            )
            .map_err(ModelError::Mlx)?;

        // The gated RMSNorm: rmsnorm(y) silu(z), the product in f32.
        let z = z.reshape(&[b, s, hv, dv])?;
        let normed = self.norm.forward(&y)?;
        let gated = silu(&z.as_dtype(Dtype::Float32)?)?
            .multiply(normed.as_dtype(Dtype::Float32)?)?
            .as_dtype(y.dtype())?;
        self.out_proj.forward(&gated.reshape(&[b, s, hv * dv])?)
    }

    pub(super) fn arrays(&self) -> Vec<&Array> {
        let mut v = self.proj.arrays();
        v.extend([&self.conv, &self.neg_a, &self.dt_bias, &self.norm.weight]);
        v.extend(self.out_proj.arrays());
        v
    }
}
