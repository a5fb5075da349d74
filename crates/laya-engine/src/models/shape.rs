//! A model's shape as its configuration states it, as data: what a catalog entry records
//! before a byte is downloaded (parameters, KV cache), what a downloaded folder's
//! configuration is checked against, and what synthetic models are built in.

use super::{Arch, HybridConfig, ModelConfig, MoeConfig};

/// A model's shape as its configuration states it: enough for its parameter count and KV
/// cache, and to tell that a downloaded folder holds this model and not another.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    pub arch: Arch,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub layers: i32,
    pub heads: i32,
    pub kv_heads: i32,
    pub head_dim: i32,
    pub vocab_size: i32,
    /// The LM head is the embedding (no head tensor of its own in the weights laya loads).
    pub tied: bool,
    /// A mixture of experts in every layer: (experts, experts a token, an expert's width).
    pub experts: Option<(i32, i32, i32)>,
    /// The width of a shared expert beside the routed ones (Qwen3.5-MoE).
    pub shared_expert: Option<i32>,
    /// Gated DeltaNet layers between the full-attention ones (Qwen3.5).
    pub hybrid: Option<HybridShape>,
}

/// A hybrid model's layers as its configuration states them: every
/// `full_attention_interval`-th layer is (gated) full attention, the others Gated DeltaNet
/// layers of these heads.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HybridShape {
    pub full_attention_interval: i32,
    pub key_heads: i32,
    pub value_heads: i32,
    pub key_dim: i32,
    pub value_dim: i32,
    pub conv_kernel: i32,
    /// Dimensions of each attention head RoPE turns.
    pub rope_dims: i32,
}

impl HybridShape {
    /// Per layer, whether it is a DeltaNet layer.
    fn linear_layers(&self, layers: i32) -> Vec<bool> {
        HybridConfig::every_nth_full(layers, self.full_attention_interval.max(1))
            .expect("a positive interval")
    }

    fn config(&self, layers: i32) -> HybridConfig {
        HybridConfig {
            linear_layers: self.linear_layers(layers),
            linear_num_key_heads: self.key_heads,
            linear_num_value_heads: self.value_heads,
            linear_key_head_dim: self.key_dim,
            linear_value_head_dim: self.value_dim,
            linear_conv_kernel_dim: self.conv_kernel,
            rope_dims: self.rope_dims,
        }
    }
}

impl Shape {
    /// The engine's configuration of this shape (rope and norm constants at Qwen's values;
    /// they change no count).
    pub fn config(&self) -> ModelConfig {
        ModelConfig {
            arch: self.arch,
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            num_hidden_layers: self.layers,
            num_attention_heads: self.heads,
            num_key_value_heads: self.kv_heads,
            head_dim: self.head_dim,
            vocab_size: self.vocab_size,
            rope_theta: 1_000_000.0,
            rms_norm_eps: 1e-6,
            tie_word_embeddings: self.tied,
            moe: self.experts.map(|(num_experts, used, width)| MoeConfig {
                num_experts,
                num_experts_per_tok: used,
                moe_intermediate_size: width,
                norm_topk_prob: true,
                decoder_sparse_step: 1,
                mlp_only_layers: vec![],
                shared_expert_intermediate_size: self.shared_expert,
            }),
            hybrid: self.hybrid.map(|h| h.config(self.layers)),
        }
    }

    /// Parameters as the engine counts them ([`ModelConfig::parameters`]).
    pub fn parameters(&self) -> u64 {
        self.config().parameters()
    }

    /// Parameters one token runs through (`ModelConfig::active_parameters`).
    pub fn active_parameters(&self) -> u64 {
        self.config().active_parameters()
    }

    /// Values the KV cache holds per token: keys and values of every attention layer's KV
    /// heads (a hybrid model's DeltaNet layers keep a state of fixed size instead).
    pub fn kv_values_per_token(&self) -> u64 {
        let linear = self
            .hybrid
            .map_or(0, |h| h.linear_layers(self.layers).iter().filter(|&&l| l).count());
        let attention = (self.layers.max(0) as usize - linear) as u64;
        2 * attention * self.kv_heads.max(0) as u64 * self.head_dim.max(0) as u64
    }
}
