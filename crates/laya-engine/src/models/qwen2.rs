//! Qwen2 attention (Qwen2.5-Coder): grouped-query attention with a bias on q, k and v.
//!
//! The full block, as llama.cpp runs `qwen2`:
//!
//! ```text
//! h = rmsnorm(x) * attn_norm
//! q, k, v = h Wq + bq, h Wk + bk, h Wv + bv       // one matmul over stacked [Wq; Wk; Wv]
//! q, k = rope_neox(q, pos), rope_neox(k, pos)     // one call over both; pairs (i, i + d/2)
//! o = softmax(q kᵀ / sqrt(d) + causal) v          // heads / kv_heads query heads per kv head
//! x = x + o Wo
//! x = x + down(silu(gate(h')) * up(h')),  h' = rmsnorm(x) * ffn_norm
//! ```
//!
//! The embedding, block, final norm and (tied or untied) head live in [`super::Model`].

use mlx_rs::Array;

use super::{pair, AttentionCore, FusedLinear, Linear, ModelConfig, Result, Weights};
use crate::cache::KvCache;

pub(super) struct Attention {
    /// q, k and v projections with their biases, stacked when their formats allow.
    pub(super) qkv: FusedLinear,
    o_proj: Linear,
    core: AttentionCore,
}

impl Attention {
    pub(super) fn load(cfg: &ModelConfig, w: &mut Weights, prefix: &str) -> Result<Self> {
        let core = AttentionCore::new(cfg);
        let hidden = cfg.hidden_size;
        let [q_rows, _, _] = core.qkv_rows();
        Ok(Attention {
            // Qwen2: q, k and v carry biases.
            qkv: core.qkv(w, prefix, hidden, true)?,
            o_proj: w.linear(&format!("{prefix}.o_proj"), hidden, q_rows, false)?,
            core,
        })
    }

    /// `x`: `[B, L, hidden]`, already normed.
    pub(super) fn forward(&self, x: &Array, cache: &mut KvCache) -> Result<Array> {
        let core = &self.core;
        let heads = core.heads(&self.qkv.forward_joined(x)?)?;
        if let Some([q, keys, values]) = core.rope_kv_in_place(&heads, cache)? {
            return self.o_proj.forward(&core.attend_to(&q, keys, values)?);
        }
        // q and k are adjacent heads: RoPE runs once over both.
        let (h, kv) = (core.n_heads, core.n_kv_heads);
        let [qk, v] = pair(core.split_heads(&heads, &[h + kv])?)?;
        let [q, k] = pair(core.split_heads(&core.rope(&qk, cache)?, &[h])?)?;
        self.o_proj.forward(&core.attend(&q, &k, &v, cache)?)
    }

    /// What laya's decode step reads: the stacked q/k/v, the output projection and the
    /// per-head q and k norms (Qwen3's).
    pub(super) fn step_parts(&self) -> (&FusedLinear, &Linear, Option<[&Array; 2]>) {
        (&self.qkv, &self.o_proj, None)
    }

    pub(super) fn arrays(&self) -> Vec<&Array> {
        let mut v = self.qkv.arrays();
        v.extend(self.o_proj.arrays());
        v
    }
}
