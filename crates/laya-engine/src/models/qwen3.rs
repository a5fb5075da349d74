//! Qwen3 (dense) attention: like Qwen2 but without q/k/v bias, with an explicit `head_dim`
//! (not necessarily `hidden / heads`), and with an RMSNorm over each query and key head
//! before RoPE:
//!
//! ```text
//! q, k, v = h Wq, h Wk, h Wv                      // one matmul over stacked [Wq; Wk; Wv]
//! q, k = rmsnorm(q_head) * q_norm, rmsnorm(k_head) * k_norm   // per head, over head_dim
//! q, k = rope_neox(q, pos), rope_neox(k, pos)
//! o = softmax(q kᵀ / sqrt(head_dim) + causal) v
//! ```
//!
//! Everything around attention is shared with Qwen2 in [`super::Model`].

use mlx_rs::Array;

use super::{triple, AttentionCore, FusedLinear, Linear, ModelConfig, Result, RmsNorm, Weights};
use crate::cache::KvCache;

pub(super) struct Attention {
    /// q, k and v projections, stacked when their formats allow.
    pub(super) qkv: FusedLinear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    o_proj: Linear,
    core: AttentionCore,
}

impl Attention {
    pub(super) fn load(cfg: &ModelConfig, w: &mut Weights, prefix: &str) -> Result<Self> {
        let core = AttentionCore::new(cfg);
        let (hidden, eps) = (cfg.hidden_size, cfg.rms_norm_eps);
        let [q_rows, _, _] = core.qkv_rows();
        Ok(Attention {
            // Qwen3: no q/k/v bias; q and k normed per head below.
            qkv: core.qkv(w, prefix, hidden, false)?,
            q_norm: w.rms_norm(&format!("{prefix}.q_norm.weight"), cfg.head_dim, eps)?,
            k_norm: w.rms_norm(&format!("{prefix}.k_norm.weight"), cfg.head_dim, eps)?,
            o_proj: w.linear(&format!("{prefix}.o_proj"), hidden, q_rows, false)?,
            core,
        })
    }

    /// `x`: `[B, L, hidden]`, already normed.
    pub(super) fn forward(&self, x: &Array, cache: &mut KvCache) -> Result<Array> {
        let core = &self.core;
        let heads = core.heads(&self.qkv.forward_joined(x)?)?;
        let (h, kv) = (core.n_heads, core.n_kv_heads);
        let [q, k, v] = triple(core.split_heads(&heads, &[h, h + kv])?)?;
        // Heads are [B, heads, L, head_dim], so the norm runs over head_dim; q and k have
        // norms of their own, so RoPE runs on each.
        let q = core.rope(&self.q_norm.forward(&q)?, cache)?;
        let k = core.rope(&self.k_norm.forward(&k)?, cache)?;
        self.o_proj.forward(&core.attend(&q, &k, &v, cache)?)
    }

    /// What laya's decode step reads: the stacked q/k/v, the output projection and the
    /// per-head q and k norms (Qwen3's).
    pub(super) fn step_parts(&self) -> (&FusedLinear, &Linear, Option<[&Array; 2]>) {
        (
            &self.qkv,
            &self.o_proj,
            Some([&self.q_norm.weight, &self.k_norm.weight]),
        )
    }

    pub(super) fn arrays(&self) -> Vec<&Array> {
        let mut v = self.qkv.arrays();
        v.extend([&self.q_norm.weight, &self.k_norm.weight]);
        v.extend(self.o_proj.arrays());
        v
    }
}
