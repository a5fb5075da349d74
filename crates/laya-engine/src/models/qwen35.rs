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
//! On CUDA the recurrence is one kernel of laya's ([`super::delta_kernel`]). Elsewhere it
//! runs as MLX ops: a run of 8 tokens or more in chunks of up to 16
//! ([`Step::chunked`]), a shorter one a step a token as mlx-lm's ops path (which it takes off
//! Metal) runs it ([`Step::sequential`]); the projections, the convolution and the norms run
//! over the whole run. A layer's cache is its recurrent state ([`crate::cache`]).
//!
//! Gated attention: `q_proj` gives each head its query and an output gate side by side
//! (`[H, 2 D]`), q and k are RMS-normed per head, RoPE turns the first `rope_dims` dims of
//! each head (a quarter), and the attention's output is multiplied by `sigmoid(gate)`
//! before `o_proj`.
//!
//! Weights come with mlx-community's names (`language_model.model.layers.{i}.linear_attn.*`)
//! or Hugging Face's (`model.language_model.*`, conv1d as `[C, 1, K]`, norms stored as
//! `weight - 1`, Qwen3.5-MoE's experts as `experts.gate_up_proj` and `experts.down_proj`):
//! [`sanitize`] maps both to `model.layers.{i}.*` as mlx-lm does, and drops the vision tower
//! and the multi-token-prediction head; Qwen3-Next's projections, interleaved per key head
//! (`in_proj_qkvz`, `in_proj_ba`), are regrouped as Qwen3.5's. The experts of Qwen3.5-MoE
//! and Qwen3-Next run through [`super::qwen3_moe`]'s block, with its shared expert.

use std::collections::HashMap;

use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::{fast, ops, Array, Dtype};

use super::{
    delta_kernel, pair, triple, AttentionCore, FusedLinear, HybridConfig, Linear, ModelConfig, ModelError,
    Result, RmsNorm, Weights,
};
use crate::cache::{KvCache, Recurrent};

/// A tensor's name without the prefixes a Qwen3.5 checkpoint nests its text model under
/// (mlx-community's `language_model.`, Hugging Face's `model.language_model.`).
pub fn text_model_name(name: &str) -> std::borrow::Cow<'_, str> {
    match name.strip_prefix("model.language_model.") {
        Some(rest) => format!("model.{rest}").into(),
        None => name.strip_prefix("language_model.").unwrap_or(name).into(),
    }
}

/// Maps a Qwen3.5 checkpoint's tensors to the names and layout the model loads, as mlx-lm's
/// `sanitize` does: the `language_model.` / `model.language_model.` prefixes go, vision and
/// MTP tensors are dropped, and a Hugging Face checkpoint (conv1d stored `[C, 1, K]`) gets its
/// convolutions as `[C, K, 1]` and 1 added to its RMSNorm weights (stored as `weight - 1`).
pub(super) fn sanitize(map: HashMap<String, Array>, cfg: &ModelConfig) -> Result<HashMap<String, Array>> {
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
        let name = text_model_name(&name).into_owned();
        // Hugging Face's Qwen3.5-MoE experts: gate and up rows in one tensor, no `.weight`.
        if let Some(mlp) = name.strip_suffix(".experts.gate_up_proj") {
            let [gate, up] = pair(a.split_equal(2, -2)?)?;
            out.insert(format!("{mlp}.switch_mlp.gate_proj.weight"), gate);
            out.insert(format!("{mlp}.switch_mlp.up_proj.weight"), up);
            continue;
        }
        if let Some(mlp) = name.strip_suffix(".experts.down_proj") {
            out.insert(format!("{mlp}.switch_mlp.down_proj.weight"), a);
            continue;
        }
        if let Some(hy) = cfg
            .hybrid
            .as_ref()
            .filter(|_| name.contains(".linear_attn.in_proj_"))
        {
            if let Some(parts) = deinterleave(&name, &a, hy)? {
                out.extend(parts);
                continue;
            }
        }
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

/// Qwen3-Next's DeltaNet projections (`in_proj_qkvz`, `in_proj_ba`: rows grouped per key head,
/// `[q, k, v, z]` and `[b, a]` within each group) as Qwen3.5's (`in_proj_qkv` with all q rows,
/// then k, then v; `in_proj_z`, `in_proj_b`, `in_proj_a`): a gather of rows, which holds for
/// a quantized tensor's packed weight, scales and biases alike. `None` for another tensor.
/// A regrouped projection: its name and its parts, as (offset, width) within a key head's
/// group of rows.
type Output<'a> = (&'a str, Vec<(i32, i32)>);

fn deinterleave(name: &str, a: &Array, hy: &HybridConfig) -> Result<Option<Vec<(String, Array)>>> {
    let Some((stem, part)) = name.rsplit_once('.') else {
        return Ok(None);
    };
    let (nk, dk, dv) = (
        hy.linear_num_key_heads,
        hy.linear_key_head_dim,
        hy.linear_value_head_dim,
    );
    let r = hy.linear_num_value_heads / nk.max(1);
    // Each output's parts, as (offset, width) within a key head's group of rows.
    let (base, outputs): (&str, Vec<Output>) = if let Some(b) = stem.strip_suffix("in_proj_qkvz") {
        let (v, z) = (2 * dk, 2 * dk + r * dv);
        (
            b,
            vec![
                ("in_proj_qkv", vec![(0, dk), (dk, dk), (v, r * dv)]),
                ("in_proj_z", vec![(z, r * dv)]),
            ],
        )
    } else if let Some(b) = stem.strip_suffix("in_proj_ba") {
        (b, vec![("in_proj_b", vec![(0, r)]), ("in_proj_a", vec![(r, r)])])
    } else {
        return Ok(None);
    };
    let group: i32 = outputs.iter().flat_map(|(_, p)| p).map(|(_, w)| w).sum();
    if a.ndim() == 0 || a.dim(0) != nk * group {
        return Err(ModelError::ShapeMismatch {
            name: name.to_owned(),
            expected: vec![nk * group],
            found: a.shape().to_vec(),
        });
    }
    let mut out = vec![];
    for (new, parts) in outputs {
        // Every part's rows for every key head, part by part.
        let rows: Vec<i32> = parts
            .iter()
            .flat_map(|&(offset, width)| {
                (0..nk).flat_map(move |h| (0..width).map(move |i| h * group + offset + i))
            })
            .collect();
        let rows = Array::from_slice(&rows, &[rows.len() as i32]);
        out.push((format!("{base}{new}.{part}"), a.take_axis(&rows, 0)?));
    }
    Ok(Some(out))
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

        // The gates: decay g = exp(log_g) (f32) and write strength beta, `[B, S, Hv]`.
        let beta = ops::sigmoid(&beta)?;
        let a = a.add(&self.dt_bias)?;
        let softplus = ops::logaddexp(&a, scalar(0.0, &a)?)?;
        let log_g = self.neg_a.multiply(&softplus)?;

        let state = match cache.recurrent() {
            Some(r) => r.state.clone(),
            None => ops::zeros::<f32>(&[b, hv, dv, dk])?,
        };
        let (y, state) = if delta_kernel::on_cuda() && delta_kernel::fits(&q, &v) {
            delta_kernel::recurrence(&q, &k, &v, &beta, &ops::exp(&log_g)?, &state)?
        } else {
            let (q, k) = if hv > hk {
                (
                    ops::repeat_axis::<f32>(q, hv / hk, 2)?,
                    ops::repeat_axis::<f32>(k, hv / hk, 2)?,
                )
            } else {
                (q, k)
            };
            let step = Step { q, k, v, beta, log_g };
            match chunk_size(s) {
                Some(c) => step.chunked(state, c)?,
                None => step.sequential(state)?,
            }
        };
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

/// Tokens a chunk of the chunked recurrence holds at most (a power of two). The inverse's
/// products grow as the chunk's cube: on a 2-core CPU 48 heads × 512 tokens of 128 × 128
/// states ran in 1.6-2.1 s in chunks of 16, 2.1-2.4 s of 32, 3.7-4.0 s of 64, and 3.4-3.8 s
/// token by token (docs/decisions.md).
const CHUNK: i32 = 16;

/// The chunk of the chunked recurrence for a run of `s` tokens: none (a step a token) below 8
/// tokens, where the chunked form's fixed ops cost more than the steps; else the power of two
/// at least `s`, at most [`CHUNK`].
fn chunk_size(s: i32) -> Option<i32> {
    (s >= 8).then(|| (s as u32).next_power_of_two().min(CHUNK as u32) as i32)
}

/// The gated delta rule's inputs for a run of `S` tokens: `q`, `k` `[B, S, Hv, Dk]` (normed,
/// repeated to the value heads), `v` `[B, S, Hv, Dv]`, `beta` and `log_g` (f32) `[B, S, Hv]`.
struct Step {
    q: Array,
    k: Array,
    v: Array,
    beta: Array,
    log_g: Array,
}

impl Step {
    /// One step a token, as mlx-lm's ops path runs it (its dtypes too): returns the outputs
    /// `[B, S, Hv, Dv]` (in q's dtype) and the state after the last token.
    fn sequential(&self, mut state: Array) -> Result<(Array, Array)> {
        let Step { q, k, v, beta, log_g } = self;
        let (b, s, hv) = (q.dim(0), q.dim(1), q.dim(2));
        let g = ops::exp(log_g)?;
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
        Ok((ops::stack(&ys, 1)?, state))
    }

    /// The same recurrence in chunks of `c` tokens (a power of two), in f32. Within a chunk
    /// starting from state `S0`, with `γ_t` the decay from its start to `t`, the state is
    /// `S_t = γ_t S0 + Σ_{i≤t} (γ_t/γ_i) u_i k_iᵀ` where the `u` solve a unit lower-triangular
    /// system: `(I + A) U = β V - βγ K S0ᵀ`, `A_ti = β_t (γ_t/γ_i) k_t·k_i` for `i < t`. So
    /// with `T = (I + A)⁻¹` (made for all chunks at once by doubling: each level joins blocks
    /// of `b` rows into blocks of `2b`, `X ← X - X A_off X`), `W = T (βγ K)` and
    /// `U' = T (β V)`, a chunk is `U = U' - W S0ᵀ`, `Y = (γ Q) S0ᵀ + (QKᵀ ⊙ Γ) U`,
    /// `S_c = γ_c S0 + Uᵀ (K γ_c/γ)`: a few products a chunk instead of a few ops a token.
    /// Decays are exponentials of differences of the cumulative log-decay, never above 1.
    /// A run that is not a whole number of chunks is padded with tokens that change nothing
    /// (k = v = 0, β = 0, g = 1).
    fn chunked(&self, state: Array, c: i32) -> Result<(Array, Array)> {
        let f32 = |x: &Array| x.as_dtype(Dtype::Float32);
        let (b, s, hv, dk, dv) = (
            self.q.dim(0),
            self.q.dim(1),
            self.q.dim(2),
            self.q.dim(3),
            self.v.dim(3),
        );
        let n = (s + c - 1) / c;
        let pad = n * c - s;
        // `[B, S, Hv, …]` → `[B, Hv, N, C, …]`, padded.
        let chunks = |x: &Array, last: Option<i32>| -> Result<Array> {
            let x = f32(x)?;
            let x = if pad > 0 {
                let mut shape = x.shape().to_vec();
                shape[1] = pad;
                ops::concatenate(&[x, ops::zeros::<f32>(&shape)?], 1)?
            } else {
                x
            };
            Ok(match last {
                Some(d) => x.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, hv, n, c, d])?,
                None => x.transpose_axes(&[0, 2, 1])?.reshape(&[b, hv, n, c])?,
            })
        };
        let (q, k, v) = (
            chunks(&self.q, Some(dk))?,
            chunks(&self.k, Some(dk))?,
            chunks(&self.v, Some(dv))?,
        );
        let (beta, log_g) = (chunks(&self.beta, None)?, chunks(&self.log_g, None)?);

        let cum = ops::cumsum(&log_g, -1, None, None)?; // [B, Hv, N, C]: log γ_t
        let cum_end = cum.try_index((.., .., .., c - 1..))?; // [B, Hv, N, 1]
        let masks = Masks::new(c)?;
        // Γ_ti = γ_t / γ_i for i ≤ t, 0 above: exp of a difference that is never positive.
        let diff = cum.expand_dims(-1)?.subtract(cum.expand_dims(-2)?)?;
        let neg_inf = Array::from_f32(f32::NEG_INFINITY);
        let gamma = ops::exp(ops::select(&masks.lower, &diff, &neg_inf)?)?;
        let kt = k.transpose_axes(&[0, 1, 2, 4, 3])?;
        let a = beta.expand_dims(-1)?.multiply(k.matmul(&kt)?)?.multiply(&gamma)?;
        let a = a.multiply(&masks.strict)?;
        // T = (I + A)⁻¹ by doubling.
        let mut t = masks.eye.clone();
        for off in &masks.off_blocks {
            let a_off = a.multiply(off)?;
            t = t.subtract(t.matmul(&a_off)?.matmul(&t)?)?;
        }
        let decay = ops::exp(&cum)?.expand_dims(-1)?; // γ_t
        let beta = beta.expand_dims(-1)?;
        let w = t.matmul(beta.multiply(&decay)?.multiply(&k)?)?; // [.., C, Dk]
        let u0 = t.matmul(beta.multiply(&v)?)?; // [.., C, Dv]
        let qk = q.matmul(&kt)?.multiply(&gamma)?; // [.., C, C]
        let q_decayed = q.multiply(&decay)?;
        let k_to_end = k.multiply(ops::exp(cum_end.subtract(&cum)?)?.expand_dims(-1)?)?;
        let decay_end = ops::exp(&cum_end)?.expand_dims(-1)?; // [B, Hv, N, 1, 1]

        let mut state = state;
        let mut ys = Vec::with_capacity(n as usize);
        for i in 0..n {
            let at = |x: &Array| x.try_index((.., .., i));
            let st = state.transpose_axes(&[0, 1, 3, 2])?; // [B, Hv, Dk, Dv]
            let u = at(&u0)?.subtract(at(&w)?.matmul(&st)?)?;
            ys.push(at(&q_decayed)?.matmul(&st)?.add(at(&qk)?.matmul(&u)?)?);
            let ut = u.transpose_axes(&[0, 1, 3, 2])?;
            state = state.multiply(at(&decay_end)?)?.add(ut.matmul(at(&k_to_end)?)?)?;
        }
        // [B, Hv, N·C, Dv] → `[B, S, Hv, Dv]`.
        let y = ops::stack(&ys, 2)?.reshape(&[b, hv, n * c, dv])?;
        let y = y.try_index((.., .., ..s, ..))?.transpose_axes(&[0, 2, 1, 3])?;
        Ok((y.as_dtype(self.q.dtype())?, state))
    }
}

/// The constant masks of the chunked recurrence for chunks of `c` tokens.
struct Masks {
    /// `i ≤ t` (bool), `i < t` (f32), the identity (f32).
    lower: Array,
    strict: Array,
    eye: Array,
    /// For each doubling level `b` = 1, 2, 4, …, c/2: the lower-left `b × b` block of each
    /// diagonal `2b × 2b` block (f32).
    off_blocks: Vec<Array>,
}

impl Masks {
    fn new(c: i32) -> Result<Masks> {
        let grid = |f: &dyn Fn(i32, i32) -> bool| -> Vec<f32> {
            (0..c)
                .flat_map(|t| (0..c).map(move |i| (t, i)))
                .map(|(t, i)| if f(t, i) { 1.0 } else { 0.0 })
                .collect()
        };
        let shape = [c, c];
        let lower = Array::from_slice(&grid(&|t, i| i <= t), &shape).as_dtype(Dtype::Bool)?;
        let mut off_blocks = vec![];
        let mut b = 1;
        while b < c {
            let off = grid(&|t, i| t / (2 * b) == i / (2 * b) && t / b != i / b && i < t);
            off_blocks.push(Array::from_slice(&off, &shape));
            b *= 2;
        }
        Ok(Masks {
            lower,
            strict: Array::from_slice(&grid(&|t, i| i < t), &shape),
            eye: Array::from_slice(&grid(&|t, i| i == t), &shape),
            off_blocks,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::test_util::{max_abs_diff, tol};
    use rand::{rngs::StdRng, Rng, SeedableRng};

    /// A recurrence's inputs as the layer makes them: q and k L2-normed (q scaled), beta in
    /// (0, 1), log-decays of a strong and a weak gate.
    fn random_step(rng: &mut StdRng, b: i32, s: i32, hv: i32, dk: i32, dv: i32) -> Step {
        let mut rand = |shape: &[i32], lo: f32, hi: f32| {
            let n = shape.iter().product::<i32>() as usize;
            let v: Vec<f32> = (0..n).map(|_| rng.gen_range(lo..hi)).collect();
            Array::from_slice(&v, shape)
        };
        let inv = 1.0 / (dk as f32).sqrt();
        let q = fast::rms_norm(rand(&[b, s, hv, dk], -1.0, 1.0), None, 1e-6)
            .unwrap()
            .multiply(Array::from_f32(inv))
            .unwrap();
        let k = fast::rms_norm(rand(&[b, s, hv, dk], -1.0, 1.0), None, 1e-6)
            .unwrap()
            .multiply(Array::from_f32(inv))
            .unwrap();
        Step {
            q,
            k,
            v: rand(&[b, s, hv, dv], -1.0, 1.0),
            beta: rand(&[b, s, hv], 0.0, 1.0),
            log_g: rand(&[b, s, hv], -3.0, 0.0),
        }
    }

    /// The chunked recurrence gives the token-by-token one: outputs and final state, from a
    /// zero state and from a random one, for runs of whole chunks, of a part of one, and of
    /// several chunks and a part (padding), at chunk sizes 4, 8, 16 and 64.
    #[test]
    fn chunked_recurrence_equals_the_sequential_one() {
        let (_g, _b) = crate::testing::mlx();
        let mut rng = StdRng::seed_from_u64(35);
        for (s, c) in [(8, 8), (5, 8), (13, 4), (16, 4), (70, 16), (130, 64)] {
            let (b, hv, dk, dv) = (1, 2, 16, 8);
            let step = random_step(&mut rng, b, s, hv, dk, dv);
            for start in [None, Some(0.5f32)] {
                let state = match start {
                    None => ops::zeros::<f32>(&[b, hv, dv, dk]).unwrap(),
                    Some(x) => {
                        let n = (b * hv * dv * dk) as usize;
                        let v: Vec<f32> = (0..n).map(|_| rng.gen_range(-x..x)).collect();
                        Array::from_slice(&v, &[b, hv, dv, dk])
                    }
                };
                let (y1, s1) = step.sequential(state.clone()).unwrap();
                let (y2, s2) = step.chunked(state, c).unwrap();
                assert_eq!(y1.shape(), y2.shape());
                let (dy, ds) = (max_abs_diff(&y1, &y2), max_abs_diff(&s1, &s2));
                assert!(
                    dy <= tol(1e-5) && ds <= tol(1e-5),
                    "s {s} c {c}: Δy {dy} Δstate {ds}"
                );
                // Not vacuous: the outputs are not all small.
                let big = y1.abs().unwrap().max(None).unwrap().item_exact::<f32>();
                assert!(big > 0.05, "s {s}: max |y| {big}");
            }
        }
    }

    /// On CUDA, the kernel gives the token-by-token ops' outputs and state: the 27B's layer
    /// shape (16 key and 48 value heads of 128) and a small one, f32 and bf16, from a random
    /// state. Elsewhere there is no kernel to test (it says so): `scripts/gpu/cuda-ops.sh run`
    /// runs it on a GPU.
    #[test]
    fn the_cuda_kernel_equals_the_ops() {
        let (_g, _b) = crate::testing::mlx();
        if !delta_kernel::on_cuda() {
            eprintln!("skipped: MLX does not run on CUDA here (LAYA_DEVICE=gpu on a CUDA build runs it)");
            return;
        }
        let mut rng = StdRng::seed_from_u64(48);
        for (hk, hv, d, s, dtype) in [
            (2, 4, 32, 1, Dtype::Float32),
            (2, 4, 32, 37, Dtype::Float32),
            (16, 48, 128, 1, Dtype::Bfloat16),
            (16, 48, 128, 300, Dtype::Bfloat16),
            (16, 48, 128, 300, Dtype::Float32),
        ] {
            let b = 1;
            // q and k at the key heads, as the kernel reads them; the ops get them repeated.
            let small = random_step(&mut rng, b, s, hk, d, d);
            let cast = |x: &Array| x.as_dtype(dtype).unwrap();
            let (q, k) = (cast(&small.q), cast(&small.k));
            let v = cast(&random_step(&mut rng, b, s, hv, d, d).v);
            let full = random_step(&mut rng, b, s, hv, d, d);
            let (beta, log_g) = (cast(&full.beta), full.log_g);
            let n = (b * hv * d * d) as usize;
            let start: Vec<f32> = (0..n).map(|_| rng.gen_range(-0.5..0.5)).collect();
            let state = Array::from_slice(&start, &[b, hv, d, d]);
            let (yk, sk) =
                delta_kernel::recurrence(&q, &k, &v, &beta, &ops::exp(&log_g).unwrap(), &state).unwrap();
            let step = Step {
                q: ops::repeat_axis::<f32>(q, hv / hk, 2).unwrap(),
                k: ops::repeat_axis::<f32>(k, hv / hk, 2).unwrap(),
                v,
                beta,
                log_g,
            };
            // Against the token-by-token ops: element-wise f32 arithmetic, as the kernel's (the
            // chunked form's products may run in TF32 on a GPU).
            let (yo, so) = step.sequential(state).unwrap();
            assert_eq!((yk.shape(), yk.dtype()), (yo.shape(), yo.dtype()));
            let f32 = |x: &Array| x.as_dtype(Dtype::Float32).unwrap();
            let (dy, ds) = (max_abs_diff(&f32(&yk), &f32(&yo)), max_abs_diff(&sk, &so));
            let big = yo
                .abs()
                .unwrap()
                .max(None)
                .unwrap()
                .as_dtype(Dtype::Float32)
                .unwrap()
                .item_exact::<f32>();
            eprintln!(
                "{hk}/{hv} heads of {d}, {s} tokens, {dtype:?}: Δy {dy:e} Δstate {ds:e} (max |y| {big})"
            );
            let bound = if dtype == Dtype::Float32 {
                1e-4
            } else {
                2e-2 * big.max(1.0)
            };
            assert!(dy <= bound && ds <= 1e-3, "{dtype:?} {s}: Δy {dy} Δstate {ds}");
            assert!(big > 0.05, "not vacuous: max |y| {big}");
        }
    }

    #[test]
    fn chunks_are_powers_of_two_from_8_tokens() {
        assert_eq!(chunk_size(1), None);
        assert_eq!(chunk_size(7), None);
        assert_eq!(chunk_size(8), Some(8));
        assert_eq!(chunk_size(12), Some(16));
        assert_eq!(chunk_size(20), Some(16));
        assert_eq!(chunk_size(512), Some(16));
    }
}
