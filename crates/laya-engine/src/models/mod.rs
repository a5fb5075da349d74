//! Decoder-only transformers of the Qwen family, written as plain functions over MLX arrays.
//!
//! One [`Model`] serves the three architectures: they share the embedding, the decoder block
//! (pre-norm attention + MLP, each with a residual), the final norm and the LM head, and
//! differ inside attention and in the MLP. `qwen2` adds a bias to q/k/v; `qwen3` has no
//! bias but RMS-normalizes every query and key head and takes `head_dim` from its config;
//! `qwen3_moe` is Qwen3's attention with a mixture of SwiGLU experts in place of the dense
//! MLP in the layers its config makes sparse; `qwen35` (Qwen3.5 / Qwen3.6) mixes Gated
//! DeltaNet layers, whose cache is a recurrent state, with gated full-attention layers. The
//! block dispatches on `Attention` and `FeedForward`, two enums.
//!
//! Weights come in as a map with HF / mlx-community names (`model.layers.{i}.self_attn.q_proj.weight`,
//! …). A linear layer (and the embedding) is either dense (`.weight` `[out, in]`, any float
//! dtype) or MLX affine-quantized (`.weight` uint32 packed, `.scales`, `.biases`); bits and
//! group size are read from the shapes per tensor, so mixed-bit checkpoints load. At load
//! time q/k/v become one matrix and gate/up another (one matmul each instead of three and
//! two), because decode on a GPU is bound by the number of kernels per token.

mod delta_kernel;
pub(crate) mod own;
mod qwen2;
mod qwen3;
mod qwen35;
mod qwen3_moe;
pub(crate) mod rope_kv;
mod shape;
pub(crate) mod step;

pub use qwen35::text_model_name;
pub use shape::{HybridShape, Shape};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;
use std::{cell::RefCell, collections::HashMap};

use mlx_rs::error::Exception;
use mlx_rs::fast;
use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::ops::{self, quantized_matmul};
use mlx_rs::transforms::{compile::compile, eval};
use mlx_rs::{Array, Dtype};

use crate::cache::KvCache;

/// Which attention variant a checkpoint uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Qwen2 / Qwen2.5 / Qwen2.5-Coder: bias on q, k and v.
    Qwen2,
    /// Qwen3 dense: no q/k/v bias, per-head RMSNorm on queries and keys.
    Qwen3,
    /// Qwen3-MoE (Qwen3-Coder-30B-A3B, …): Qwen3's attention, a mixture of experts as MLP.
    Qwen3Moe,
    /// Qwen3.5 / Qwen3.6: Gated DeltaNet layers and gated full-attention layers
    /// ([`HybridConfig`]), a dense MLP or (Qwen3.5-MoE) experts with a shared expert.
    Qwen35,
}

/// Hyper-parameters of a model, filled by the loader from GGUF metadata or `config.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub num_hidden_layers: i32,
    pub num_attention_heads: i32,
    pub num_key_value_heads: i32,
    /// Qwen2: `hidden_size / num_attention_heads`; Qwen3 states it explicitly.
    pub head_dim: i32,
    pub vocab_size: i32,
    pub rope_theta: f32,
    pub rms_norm_eps: f32,
    /// Without an `lm_head.weight`, the LM head is the embedding matrix.
    pub tie_word_embeddings: bool,
    /// The experts of a [`Arch::Qwen3Moe`] model; `None` for the dense ones.
    pub moe: Option<MoeConfig>,
    /// The layer kinds and linear attention of an [`Arch::Qwen35`] model; `None` for the others.
    pub hybrid: Option<HybridConfig>,
}

/// The Gated DeltaNet side of a Qwen3.5 model (`config.json`'s `text_config` names).
#[derive(Clone, Debug, PartialEq)]
pub struct HybridConfig {
    /// Per layer: a Gated DeltaNet layer (`linear_attention`) or full attention.
    pub linear_layers: Vec<bool>,
    pub linear_num_key_heads: i32,
    pub linear_num_value_heads: i32,
    pub linear_key_head_dim: i32,
    pub linear_value_head_dim: i32,
    /// Width of the causal depthwise convolution (its state keeps one row fewer).
    pub linear_conv_kernel_dim: i32,
    /// Dimensions of each attention head RoPE turns (`head_dim × partial_rotary_factor`).
    pub rope_dims: i32,
}

impl HybridConfig {
    /// The layers' kinds where a configuration names no list: every `every`-th of `layers` is
    /// full attention, the others Gated DeltaNet layers (`true`), as Qwen3.5's configs
    /// (`full_attention_interval`) and llama.cpp's GGUFs state them.
    pub(crate) fn every_nth_full(layers: i32, every: i32) -> std::result::Result<Vec<bool>, String> {
        if every <= 0 {
            return Err(format!("full_attention_interval must be positive, is {every}"));
        }
        Ok((0..layers).map(|i| (i + 1) % every != 0).collect())
    }

    /// Channels of the convolution: q, k and v side by side.
    pub(crate) fn conv_channels(&self) -> i32 {
        2 * self.linear_num_key_heads * self.linear_key_head_dim
            + self.linear_num_value_heads * self.linear_value_head_dim
    }

    /// Bytes of one recurrent state of the whole model (every DeltaNet layer's f32 matrices
    /// and its convolution's last rows in the activations' `dtype_bytes`): what a checkpoint
    /// costs.
    pub fn state_bytes(&self, dtype_bytes: usize) -> usize {
        let layers = self.linear_layers.iter().filter(|&&l| l).count();
        let [hv, dv, dk] = [
            self.linear_num_value_heads,
            self.linear_value_head_dim,
            self.linear_key_head_dim,
        ]
        .map(|x| x.max(0) as usize);
        let conv = (self.linear_conv_kernel_dim.max(1) - 1) as usize * self.conv_channels().max(0) as usize;
        layers * (hv * dv * dk * 4 + conv * dtype_bytes)
    }

    fn validate(&self, cfg: &ModelConfig) -> Result<(), ModelError> {
        all_positive(&[
            ("linear_num_key_heads", self.linear_num_key_heads),
            ("linear_num_value_heads", self.linear_num_value_heads),
            ("linear_key_head_dim", self.linear_key_head_dim),
            ("linear_value_head_dim", self.linear_value_head_dim),
            ("linear_conv_kernel_dim", self.linear_conv_kernel_dim),
            ("rope_dims", self.rope_dims),
        ])?;
        if self.linear_layers.len() != cfg.num_hidden_layers as usize {
            return Err(ModelError::Config(format!(
                "{} layer types for {} layers",
                self.linear_layers.len(),
                cfg.num_hidden_layers
            )));
        }
        if self.linear_num_value_heads % self.linear_num_key_heads != 0 {
            return Err(ModelError::Config(format!(
                "linear_num_value_heads ({}) is not a multiple of linear_num_key_heads ({})",
                self.linear_num_value_heads, self.linear_num_key_heads
            )));
        }
        if self.rope_dims % 2 != 0 || self.rope_dims > cfg.head_dim {
            return Err(ModelError::Config(format!(
                "rope_dims ({}) must be even and at most head_dim ({})",
                self.rope_dims, cfg.head_dim
            )));
        }
        Ok(())
    }
}

/// The mixture of experts of a Qwen3-MoE model (`config.json`'s names).
#[derive(Clone, Debug, PartialEq)]
pub struct MoeConfig {
    pub num_experts: i32,
    /// Experts each token runs through: the router's `k` most likely.
    pub(crate) num_experts_per_tok: i32,
    /// Hidden width of one expert's SwiGLU.
    pub moe_intermediate_size: i32,
    /// Rescale the `k` chosen probabilities to sum to 1.
    pub(crate) norm_topk_prob: bool,
    /// Layer `i` is sparse when `(i + 1) % decoder_sparse_step == 0` …
    pub(crate) decoder_sparse_step: i32,
    /// … and `i` is not listed here; the others keep a dense MLP of `intermediate_size`.
    pub(crate) mlp_only_layers: Vec<i32>,
    /// A shared expert of this width beside the routed ones, every token through it and its
    /// output scaled by `sigmoid(shared_expert_gate(x))` (Qwen3.5-MoE); `None` without.
    pub(crate) shared_expert_intermediate_size: Option<i32>,
}

impl MoeConfig {
    /// Whether layer `layer` (from 0) runs the experts, as mlx-lm and transformers decide.
    pub(crate) fn is_sparse(&self, layer: i32) -> bool {
        !self.mlp_only_layers.contains(&layer)
            && self.num_experts > 0
            && (layer + 1) % self.decoder_sparse_step == 0
    }
}

impl ModelConfig {
    /// Parameter count, from the shapes the configuration implies (projections, MLP or
    /// router and every expert, embedding and an untied LM head; biases and norms, a rounding
    /// error, left out).
    pub fn parameters(&self) -> u64 {
        let [h, i, q, kv, d, v] = [
            self.hidden_size,
            self.intermediate_size,
            self.num_attention_heads,
            self.num_key_value_heads,
            self.head_dim,
            self.vocab_size,
        ]
        .map(|x| x.max(0) as u64);
        let attention = |layer: i32| match &self.hybrid {
            Some(hy) if hy.linear_layers.get(layer as usize) == Some(&true) => {
                let [hk, hv, dk, dv, kernel] = [
                    hy.linear_num_key_heads,
                    hy.linear_num_value_heads,
                    hy.linear_key_head_dim,
                    hy.linear_value_head_dim,
                    hy.linear_conv_kernel_dim,
                ]
                .map(|x| x.max(0) as u64);
                let channels = 2 * hk * dk + hv * dv;
                // qkv, z, b and a; the convolution; A_log and dt_bias; out.
                h * (channels + hv * dv + 2 * hv) + channels * kernel + 2 * hv + hv * dv * h
            }
            // A gated attention's q_proj gives each head's gate too.
            Some(_) => 3 * h * q * d + 2 * h * kv * d,
            None => 2 * h * q * d + 2 * h * kv * d,
        };
        let mlp = |layer: i32| match &self.moe {
            Some(m) if m.is_sparse(layer) => {
                let (e, mi) = (m.num_experts.max(0) as u64, m.moe_intermediate_size.max(0) as u64);
                let shared = m
                    .shared_expert_intermediate_size
                    .map_or(0, |s| 3 * h * s.max(0) as u64 + h);
                e * h + 3 * e * h * mi + shared
            }
            _ => 3 * h * i,
        };
        let heads = if self.tie_word_embeddings { 1 } else { 2 };
        let layers: u64 = (0..self.num_hidden_layers).map(|l| attention(l) + mlp(l)).sum();
        layers + heads * v * h
    }

    /// Parameters one token runs through: all of a dense model's; of a mixture of experts,
    /// the experts a token is routed to instead of all of them (the rest as
    /// [`ModelConfig::parameters`] counts it, embedding included, as Qwen counts "activated"
    /// parameters).
    pub(crate) fn active_parameters(&self) -> u64 {
        let Some(m) = &self.moe else {
            return self.parameters();
        };
        let (h, mi) = (
            self.hidden_size.max(0) as u64,
            m.moe_intermediate_size.max(0) as u64,
        );
        let experts = m.num_experts.max(0);
        let idle = (experts - m.num_experts_per_tok.clamp(0, experts)) as u64;
        let sparse = (0..self.num_hidden_layers).filter(|&l| m.is_sparse(l)).count() as u64;
        self.parameters() - sparse * idle * 3 * h * mi
    }

    fn validate(&self) -> Result<(), ModelError> {
        all_positive(&[
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("vocab_size", self.vocab_size),
        ])?;
        if self.num_attention_heads % self.num_key_value_heads != 0 {
            return Err(ModelError::Config(format!(
                "num_attention_heads ({}) is not a multiple of num_key_value_heads ({})",
                self.num_attention_heads, self.num_key_value_heads
            )));
        }
        if self.head_dim % 2 != 0 {
            return Err(ModelError::Config(format!(
                "head_dim ({}) must be even for RoPE",
                self.head_dim
            )));
        }
        match (&self.hybrid, self.arch) {
            (None, Arch::Qwen35) => {
                return Err(ModelError::Config(
                    "a Qwen3.5 model needs its layer types and linear attention".into(),
                ))
            }
            (Some(h), Arch::Qwen35) => h.validate(self)?,
            (Some(_), _) => {
                return Err(ModelError::Config(format!(
                    "{:?} has no linear attention, but it is configured",
                    self.arch
                )))
            }
            (None, _) => {}
        }
        match (&self.moe, self.arch) {
            (None, Arch::Qwen3Moe) => Err(ModelError::Config("a Qwen3-MoE model needs its experts".into())),
            (Some(_), Arch::Qwen2 | Arch::Qwen3) => Err(ModelError::Config(format!(
                "{:?} is a dense architecture, but experts are configured",
                self.arch
            ))),
            (Some(m), _) => m.validate(),
            (None, _) => Ok(()),
        }
    }
}

impl MoeConfig {
    fn validate(&self) -> Result<(), ModelError> {
        all_positive(&[
            ("num_experts", self.num_experts),
            ("num_experts_per_tok", self.num_experts_per_tok),
            ("moe_intermediate_size", self.moe_intermediate_size),
            ("decoder_sparse_step", self.decoder_sparse_step),
        ])?;
        if self.num_experts_per_tok > self.num_experts {
            return Err(ModelError::Config(format!(
                "num_experts_per_tok ({}) exceeds num_experts ({})",
                self.num_experts_per_tok, self.num_experts
            )));
        }
        Ok(())
    }
}

/// An error naming the first of the (name, value) pairs that is not positive.
fn all_positive(fields: &[(&str, i32)]) -> Result<(), ModelError> {
    match fields.iter().find(|(_, v)| *v <= 0) {
        Some((name, v)) => Err(ModelError::Config(format!("{name} must be positive, is {v}"))),
        None => Ok(()),
    }
}

/// Format of one MLX affine-quantized matrix: `group_size` consecutive inputs share a scale
/// and a bias; each weight takes `bits` bits of a packed uint32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QuantSpec {
    pub(crate) group_size: i32,
    pub(crate) bits: i32,
}

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("missing tensor `{0}`")]
    MissingTensor(String),
    #[error("tensor `{name}`: expected shape {expected:?}, found {found:?}")]
    ShapeMismatch {
        name: String,
        expected: Vec<i32>,
        found: Vec<i32>,
    },
    #[error("tensor `{name}`: {reason}")]
    BadTensor { name: String, reason: String },
    #[error("invalid model config: {0}")]
    Config(String),
    #[error("invalid input: {0}")]
    Input(String),
    #[error("mlx: {0}")]
    Mlx(#[from] Exception),
}

type Result<T, E = ModelError> = std::result::Result<T, E>;

/// A Qwen2, Qwen3 or Qwen3-MoE decoder with its weights.
pub struct Model {
    cfg: ModelConfig,
    embed_tokens: Linear,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    /// `None`: tied, the head is `embed_tokens`.
    lm_head: Option<Linear>,
    /// Seconds a prompt token took in the last prompt chunk run (`f64` bits; 0: none yet):
    /// how long the next chunk will take, which sets how it is paced.
    prefill_secs_per_token: AtomicU64,
    /// laya's own decode step of this model, made at the first step that asks for it; `None`
    /// where the model is not one it runs ([`step`]).
    step: OnceLock<Option<step::Plan>>,
}

impl Model {
    /// Builds the model from a weight map (HF names), consuming it. `group_size` is the
    /// checkpoint's quantization group size (ignored for dense tensors; a tensor whose scales
    /// only fit another group size uses that one). Unknown extra tensors are ignored.
    /// `lm_head.weight` is used when present, even with tied embeddings (GGUF files carry a
    /// separately quantized `output.weight`); otherwise tied embeddings are required.
    /// All weights are evaluated before returning, so a lazily loaded map is read here.
    pub fn from_weights(cfg: ModelConfig, weights: HashMap<String, Array>, group_size: i32) -> Result<Model> {
        cfg.validate()?;
        if group_size <= 0 {
            return Err(ModelError::Config(format!(
                "group_size must be positive, is {group_size}"
            )));
        }
        let mut weights = if cfg.arch == Arch::Qwen35 {
            qwen35::sanitize(weights, &cfg)?
        } else {
            weights
        };
        let float = crate::runtime::activation_dtype().map_err(|e| ModelError::Config(e.to_string()))?;
        if let Some(dtype) = float {
            // Quantized weights stay integers; their scales and biases and every float tensor
            // take the type, and the activations follow them (a DeltaNet's A_log stays f32).
            for (name, a) in weights.iter_mut() {
                if matches!(a.dtype(), Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16)
                    && a.dtype() != dtype
                    && !name.ends_with(".A_log")
                {
                    *a = a.as_dtype(dtype)?;
                }
            }
        }
        let mut w = Weights {
            map: weights,
            group_size,
        };
        let (hidden, vocab) = (cfg.hidden_size, cfg.vocab_size);
        let embed_tokens = w.linear("model.embed_tokens", vocab, hidden, false)?;
        eval(embed_tokens.arrays())?;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers as usize);
        for i in 0..cfg.num_hidden_layers {
            let layer = DecoderLayer::load(&cfg, &mut w, i)?;
            eval(layer.arrays())?;
            layers.push(layer);
        }
        let norm = w.rms_norm("model.norm.weight", hidden, cfg.rms_norm_eps)?;
        let lm_head = if w.map.contains_key("lm_head.weight") || !cfg.tie_word_embeddings {
            Some(w.linear("lm_head", vocab, hidden, false)?)
        } else {
            None
        };
        let mut rest = vec![&norm.weight];
        rest.extend(lm_head.iter().flat_map(Linear::arrays));
        eval(rest)?;
        Ok(Model {
            cfg,
            embed_tokens,
            layers,
            norm,
            lm_head,
            prefill_secs_per_token: AtomicU64::new(0),
            step: OnceLock::new(),
        })
    }

    /// Notes that a prompt chunk of `tokens` tokens took `took`.
    pub(crate) fn note_prefill(&self, tokens: usize, took: Duration) {
        let per = took.as_secs_f64() / tokens.max(1) as f64;
        self.prefill_secs_per_token
            .store(per.to_bits(), Ordering::Relaxed);
    }

    /// How long a prompt chunk of `tokens` tokens should take, from the last one run; `None`
    /// before any.
    pub(crate) fn prefill_estimate(&self, tokens: usize) -> Option<Duration> {
        let per = f64::from_bits(self.prefill_secs_per_token.load(Ordering::Relaxed));
        (per > 0.0).then(|| Duration::from_secs_f64(per * tokens as f64))
    }

    /// Decoder layers.
    pub(crate) fn layer_count(&self) -> usize {
        self.layers.len()
    }

    pub(crate) fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Some layers keep a recurrent state, which can go back only to the lengths it kept a
    /// state of ([`crate::cache::rewind`]).
    pub(crate) fn is_recurrent(&self) -> bool {
        self.cfg.hybrid.is_some()
    }

    /// One empty KV cache per layer.
    pub fn new_caches(&self) -> Vec<KvCache> {
        (0..self.layers.len()).map(|_| KvCache::new()).collect()
    }

    /// Bytes held by the weights.
    pub(crate) fn nbytes(&self) -> usize {
        let mut arrays = self.embed_tokens.arrays();
        arrays.extend(self.layers.iter().flat_map(DecoderLayer::arrays));
        arrays.push(&self.norm.weight);
        arrays.extend(self.lm_head.iter().flat_map(Linear::arrays));
        arrays.iter().map(|a| a.nbytes()).sum()
    }

    /// Weight bytes one decode step reads: everything but the embedding table, of which only
    /// one row is gathered, unless the table is also the (tied) LM head, and but the experts a
    /// token is not routed to.
    pub(crate) fn weight_bytes_per_token(&self) -> usize {
        let embed: usize = self.embed_tokens.arrays().iter().map(|a| a.nbytes()).sum();
        let row = embed / self.cfg.vocab_size.max(1) as usize;
        let unread: usize = self
            .layers
            .iter()
            .map(|l| match &l.mlp {
                FeedForward::Sparse(m) => m.unread_bytes_per_token(),
                FeedForward::Dense(_) => 0,
            })
            .sum();
        let read = if self.lm_head.is_some() {
            self.nbytes() - embed + row
        } else {
            self.nbytes()
        };
        read - unread
    }

    /// Runs `tokens` (`[B, L]`, int32 or uint32) after what `caches` hold, appends their keys
    /// and values to the caches, and returns the logits of the last position, `[B, vocab]` f32.
    /// The result is lazy: nothing is computed until it (or a cache) is evaluated.
    pub fn forward(&self, tokens: &Array, caches: &mut [KvCache]) -> Result<Array> {
        if let Some(logits) = self.decode_step(tokens, caches)? {
            return Ok(logits);
        }
        let h = self.hidden_states(tokens, caches)?;
        self.logits_of_last(h)
    }

    /// One token of one sequence as laya's own step ([`step`]) where it is in use and runs
    /// this model: the logits, `[1, vocab]` f32. `None`: the ops' to do.
    fn decode_step(&self, tokens: &Array, caches: &mut [KvCache]) -> Result<Option<Array>> {
        if !own::Own::Step.in_use() || tokens.shape() != [1, 1] {
            return Ok(None);
        }
        self.check_input(tokens, caches)?;
        let Some(plan) = self.step_plan() else {
            return Ok(None);
        };
        let shape = [1, self.cfg.num_key_value_heads, 1, self.cfg.head_dim];
        let dtype = self.embed_tokens.float_dtype();
        let logits = crate::cache::update_all_in_place(caches, shape, dtype, |bufs, at, in_place| {
            plan.run(tokens, bufs, at, in_place)
        })?;
        Ok(Some(logits))
    }

    /// This model's step plan, made once; `None` where the step does not run it.
    pub(crate) fn step_plan(&self) -> Option<&step::Plan> {
        self.step
            .get_or_init(|| {
                let parts = self.step_parts()?;
                step::Plan::new(&parts)
                    .map_err(|e| tracing::debug!("the model decodes through MLX's ops: {}", e.what()))
                    .ok()
            })
            .as_ref()
    }

    /// The arrays of a dense Qwen2/Qwen3 with quantized linears, in the step's order, or
    /// `None` for other models (mixtures of experts, hybrids, dense or unstacked linears).
    fn step_parts(&self) -> Option<step::Parts<'_>> {
        fn linear<'a>(l: &'a Linear, out: &mut Vec<Option<&'a Array>>) -> Option<()> {
            let Linear::Quantized {
                weight,
                scales,
                biases,
                bias,
                ..
            } = l
            else {
                return None;
            };
            out.extend([Some(weight), Some(scales), Some(biases), bias.as_ref()]);
            Some(())
        }
        let c = &self.cfg;
        if c.moe.is_some() || c.hybrid.is_some() {
            return None;
        }
        let mut a = vec![];
        linear(&self.embed_tokens, &mut a)?;
        for layer in &self.layers {
            a.extend([
                Some(&layer.input_layernorm.weight),
                Some(&layer.post_attention_layernorm.weight),
            ]);
            let (qkv, o, norms) = match &layer.self_attn {
                Attention::Qwen2(x) => x.step_parts(),
                Attention::Qwen3(x) => x.step_parts(),
                Attention::Gated(_) | Attention::DeltaNet(_) => return None,
            };
            a.extend([norms.map(|n| n[0]), norms.map(|n| n[1])]);
            linear(qkv.single()?, &mut a)?;
            linear(o, &mut a)?;
            let FeedForward::Dense(mlp) = &layer.mlp else {
                return None;
            };
            linear(mlp.gate_up.single()?, &mut a)?;
            linear(&mlp.down_proj, &mut a)?;
        }
        a.push(Some(&self.norm.weight));
        linear(self.lm_head.as_ref().unwrap_or(&self.embed_tokens), &mut a)?;
        Some(step::Parts {
            dims: [
                c.hidden_size,
                c.num_attention_heads,
                c.num_key_value_heads,
                c.head_dim,
                c.intermediate_size,
                c.vocab_size,
                self.layers.len() as i32,
            ],
            eps: c.rms_norm_eps,
            theta: c.rope_theta,
            arrays: a,
        })
    }

    /// The logits of the last position of hidden states `[B, L, hidden]`: `[B, vocab]` f32.
    fn logits_of_last(&self, h: Array) -> Result<Array> {
        let (b, l) = (h.dim(0), h.dim(1));
        let last = if l == 1 {
            h
        } else {
            h.try_index((.., l - 1.., ..))?
        };
        let logits = self.head(&self.norm.forward(&last)?)?;
        Ok(logits
            .reshape(&[b, self.cfg.vocab_size])?
            .as_dtype(Dtype::Float32)?)
    }

    /// [`Model::forward`] evaluated in `groups` runs of consecutive layers (at most one a
    /// layer), `keep_going` asked after each run but the last: a long prompt chunk of a large
    /// model can be given up within one run's time. `None` when `keep_going` said no; the
    /// caches then hold what they held before the call. The layers are evaluated; the logits,
    /// as [`Model::forward`]'s, are not.
    pub(crate) fn forward_grouped(
        &self,
        tokens: &Array,
        caches: &mut [KvCache],
        groups: usize,
        mut keep_going: impl FnMut() -> bool,
    ) -> Result<Option<Array>> {
        self.check_input(tokens, caches)?;
        let before = caches.first().map_or(0, KvCache::offset);
        let per = self
            .layers
            .len()
            .div_ceil(groups.clamp(1, self.layers.len().max(1)));
        let mut h = self.embed_tokens.lookup(tokens)?;
        let mut done = 0;
        for (layers, caches) in self.layers.chunks(per).zip(caches.chunks_mut(per)) {
            if done > 0 {
                eval([&h])?;
                if !keep_going() {
                    break;
                }
            }
            for (layer, cache) in layers.iter().zip(caches.iter_mut()) {
                h = layer.forward(&h, cache)?;
            }
            done += layers.len();
        }
        if done < self.layers.len() {
            // The layers run went one update ahead: back to `before` (a recurrent state to
            // its checkpoint).
            crate::cache::rewind(caches, before);
            return Ok(None);
        }
        eval([&h])?;
        Ok(Some(self.logits_of_last(h)?))
    }

    /// Like [`Model::forward`] but returns the logits of every position, `[B, L, vocab]` f32.
    pub(crate) fn forward_all(&self, tokens: &Array, caches: &mut [KvCache]) -> Result<Array> {
        let h = self.hidden_states(tokens, caches)?;
        let logits = self.head(&self.norm.forward(&h)?)?;
        Ok(logits.as_dtype(Dtype::Float32)?)
    }

    /// Embedding and decoder blocks, before the final norm: `[B, L, hidden]`.
    fn hidden_states(&self, tokens: &Array, caches: &mut [KvCache]) -> Result<Array> {
        self.check_input(tokens, caches)?;
        let mut h = self.embed_tokens.lookup(tokens)?;
        for (layer, cache) in self.layers.iter().zip(caches.iter_mut()) {
            h = layer.forward(&h, cache)?;
        }
        Ok(h)
    }

    fn check_input(&self, tokens: &Array, caches: &[KvCache]) -> Result<()> {
        if tokens.ndim() != 2 || tokens.dim(1) == 0 {
            return Err(ModelError::Input(format!(
                "tokens must be [batch, length>0], got {:?}",
                tokens.shape()
            )));
        }
        if !matches!(tokens.dtype(), Dtype::Int32 | Dtype::Uint32) {
            return Err(ModelError::Input(format!(
                "tokens must be int32 or uint32, got {:?}",
                tokens.dtype()
            )));
        }
        if caches.len() != self.layers.len() {
            return Err(ModelError::Input(format!(
                "{} caches for {} layers",
                caches.len(),
                self.layers.len()
            )));
        }
        Ok(())
    }

    fn head(&self, h: &Array) -> Result<Array> {
        self.lm_head.as_ref().unwrap_or(&self.embed_tokens).forward(h)
    }
}

/// Pre-norm residual block: `x + attn(norm(x))`, then `h + mlp(norm(h))`.
struct DecoderLayer {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: FeedForward,
}

impl DecoderLayer {
    fn load(cfg: &ModelConfig, w: &mut Weights, layer: i32) -> Result<Self> {
        let (hidden, eps) = (cfg.hidden_size, cfg.rms_norm_eps);
        let prefix = format!("model.layers.{layer}");
        let attn_prefix = format!("{prefix}.self_attn");
        let mlp_prefix = format!("{prefix}.mlp");
        Ok(DecoderLayer {
            input_layernorm: w.rms_norm(&format!("{prefix}.input_layernorm.weight"), hidden, eps)?,
            self_attn: match (cfg.arch, &cfg.hybrid) {
                (Arch::Qwen2, _) => Attention::Qwen2(qwen2::Attention::load(cfg, w, &attn_prefix)?),
                (Arch::Qwen3 | Arch::Qwen3Moe, _) => {
                    Attention::Qwen3(qwen3::Attention::load(cfg, w, &attn_prefix)?)
                }
                (Arch::Qwen35, Some(h)) if h.linear_layers[layer as usize] => Attention::DeltaNet(
                    qwen35::GatedDeltaNet::load(cfg, w, &format!("{prefix}.linear_attn"))?,
                ),
                (Arch::Qwen35, _) => Attention::Gated(qwen35::GatedAttention::load(cfg, w, &attn_prefix)?),
            },
            post_attention_layernorm: w.rms_norm(
                &format!("{prefix}.post_attention_layernorm.weight"),
                hidden,
                eps,
            )?,
            mlp: match &cfg.moe {
                Some(moe) if moe.is_sparse(layer) => {
                    FeedForward::Sparse(qwen3_moe::SparseMoeBlock::load(cfg, moe, w, &mlp_prefix)?)
                }
                _ => FeedForward::Dense(Mlp::load(cfg, w, &mlp_prefix)?),
            },
        })
    }

    fn forward(&self, x: &Array, cache: &mut KvCache) -> Result<Array> {
        let normed = self.input_layernorm.forward(x)?;
        let attn = match &self.self_attn {
            Attention::Qwen2(a) => a.forward(&normed, cache)?,
            Attention::Qwen3(a) => a.forward(&normed, cache)?,
            Attention::Gated(a) => a.forward(&normed, cache)?,
            Attention::DeltaNet(a) => a.forward(&normed, cache)?,
        };
        let h = x.add(&attn)?;
        let normed = self.post_attention_layernorm.forward(&h)?;
        let mlp = match &self.mlp {
            FeedForward::Dense(m) => m.forward(&normed)?,
            FeedForward::Sparse(m) => m.forward(&normed)?,
        };
        Ok(h.add(&mlp)?)
    }

    fn arrays(&self) -> Vec<&Array> {
        let mut v = vec![
            &self.input_layernorm.weight,
            &self.post_attention_layernorm.weight,
        ];
        v.extend(match &self.self_attn {
            Attention::Qwen2(a) => a.arrays(),
            Attention::Qwen3(a) => a.arrays(),
            Attention::Gated(a) => a.arrays(),
            Attention::DeltaNet(a) => a.arrays(),
        });
        match &self.mlp {
            FeedForward::Dense(m) => {
                v.extend(m.gate_up.arrays());
                v.extend(m.down_proj.arrays());
            }
            FeedForward::Sparse(m) => v.extend(m.arrays()),
        }
        v
    }
}

/// Where the architectures differ: attention (Qwen3-MoE's is Qwen3's; Qwen3.5 has two kinds
/// of layer) …
enum Attention {
    Qwen2(qwen2::Attention),
    Qwen3(qwen3::Attention),
    Gated(qwen35::GatedAttention),
    DeltaNet(qwen35::GatedDeltaNet),
}

/// … and the MLP: dense SwiGLU, or a mixture of SwiGLU experts.
enum FeedForward {
    Dense(Mlp),
    Sparse(qwen3_moe::SparseMoeBlock),
}

#[cfg(test)]
impl FeedForward {
    fn dense(&self) -> &Mlp {
        match self {
            FeedForward::Dense(m) => m,
            FeedForward::Sparse(_) => panic!("a sparse layer"),
        }
    }
}

/// What both attention variants do once q, k and v (`[B, L, heads, head_dim]`) are known:
/// RoPE at the cache offset, append k/v to the cache, attend, merge the heads.
struct AttentionCore {
    n_heads: i32,
    n_kv_heads: i32,
    head_dim: i32,
    /// Leading dimensions of each head RoPE turns (all of them but in Qwen3.5).
    rope_dims: i32,
    rope_theta: f32,
}

impl AttentionCore {
    fn new(cfg: &ModelConfig) -> Self {
        AttentionCore {
            n_heads: cfg.num_attention_heads,
            n_kv_heads: cfg.num_key_value_heads,
            head_dim: cfg.head_dim,
            rope_dims: cfg.hybrid.as_ref().map_or(cfg.head_dim, |h| h.rope_dims),
            rope_theta: cfg.rope_theta,
        }
    }

    /// The q, k and v projections of the layer at `prefix`, fused into one linear (with
    /// biases where the architecture has them).
    fn qkv(&self, w: &mut Weights, prefix: &str, hidden: i32, bias: bool) -> Result<FusedLinear> {
        let [q_rows, kv_rows, _] = self.qkv_rows();
        let qkv = vec![
            w.linear(&format!("{prefix}.q_proj"), q_rows, hidden, bias)?,
            w.linear(&format!("{prefix}.k_proj"), kv_rows, hidden, bias)?,
            w.linear(&format!("{prefix}.v_proj"), kv_rows, hidden, bias)?,
        ];
        FusedLinear::new(qkv)
    }

    /// Output rows of the q, k and v projections.
    fn qkv_rows(&self) -> [i32; 3] {
        let kv = self.n_kv_heads * self.head_dim;
        [self.n_heads * self.head_dim, kv, kv]
    }

    /// The fused projection `[B, L, (H + 2 KV) · D]` as heads `[B, H + 2 KV, L, D]`,
    /// row-contiguous. At L = 1 (a decode step) that is one reshape of the same memory; a
    /// longer chunk takes a reshape, a transpose and one copy of all heads (MLX 0.32's CUDA
    /// RoPE misreads a transposed view at offsets past 0: the cached-vs-uncached tests failed
    /// on an H200).
    fn heads(&self, qkv: &Array) -> Result<Array> {
        let (b, l) = (qkv.dim(0), qkv.dim(1));
        let heads = self.n_heads + 2 * self.n_kv_heads;
        if l == 1 {
            return Ok(qkv.reshape(&[b, heads, 1, self.head_dim])?);
        }
        Ok(qkv
            .reshape(&[b, l, heads, self.head_dim])?
            .transpose_axes(&[0, 2, 1, 3])?
            .contiguous()?)
    }

    /// `heads` (`[B, heads, L, D]`) cut along the heads axis before each of `at`: one `Split`.
    fn split_heads(&self, heads: &Array, at: &[i32]) -> Result<Vec<Array>> {
        Ok(ops::split_at_indices(heads, at, 1)?)
    }

    /// NEOX RoPE (halves, not interleaved pairs, as llama.cpp runs qwen2/qwen3) of heads
    /// `[B, heads, L, D]` at the cache's offset: q and k in one call where they are adjacent.
    fn rope(&self, x: &Array, cache: &KvCache) -> Result<Array> {
        let offset = cache.offset() as i32;
        Ok(fast::rope(
            x,
            self.rope_dims,
            false,
            self.rope_theta,
            1.0,
            offset,
            None,
        )?)
    }

    /// RoPE on `heads` `[B, H + 2 KV, L, D]` and its k and v written into the cache, as
    /// laya's own primitive ([`rope_kv`]) where it is in use and fits: roped q and the
    /// cache's keys and values so far, for [`attend_to`](Self::attend_to). `None`: the ops
    /// path's to do.
    fn rope_kv_in_place(&self, heads: &Array, cache: &mut KvCache) -> Result<Option<[Array; 3]>> {
        if !own::Own::RopeKv.in_use() || !rope_kv::fits(heads, self.rope_dims, self.head_dim) {
            return Ok(None);
        }
        let (b, l, d) = (heads.dim(0), heads.dim(2), heads.dim(3));
        let mut q = None;
        let (keys, values) =
            cache.update_in_place([b, self.n_kv_heads, l, d], heads.dtype(), |k, v, at, in_place| {
                let w = rope_kv::write(
                    heads,
                    k,
                    v,
                    self.n_heads,
                    self.n_kv_heads,
                    at,
                    self.rope_theta,
                    in_place,
                )?;
                q = Some(w.q);
                Ok([w.k_buf, w.v_buf, w.keys, w.values])
            })?;
        Ok(q.map(|q| [q, keys, values]))
    }

    /// q `[B, H, L, D]`, k and v `[B, KV, L, D]` (RoPE applied) → `[B, L, H · D]`: append k/v
    /// to the cache, attend, merge the heads (at L = 1 a reshape: the same memory).
    fn attend(&self, q: &Array, k: &Array, v: &Array, cache: &mut KvCache) -> Result<Array> {
        let (keys, values) = cache.update_and_fetch(k, v)?;
        self.attend_to(q, keys, values)
    }

    /// q `[B, H, L, D]` over the cache's `keys` and `values` `[B, KV, offset + L, D]`.
    fn attend_to(&self, q: &Array, keys: Array, values: Array) -> Result<Array> {
        let (b, l) = (q.dim(0), q.dim(2));
        let scale = 1.0 / (self.head_dim as f32).sqrt();
        // MLX's causal mask is aligned to the bottom right (query i sees keys up to
        // offset + i), so a chunk after a cached prefix needs no explicit mask; GQA is native.
        let mask = (l > 1).then_some(fast::ScaledDotProductAttentionMask::Causal);
        // Several candidates (B > 1) make q a strided view of the heads; attention gets a
        // plain copy, as it always had.
        let q = if b > 1 { q.contiguous()? } else { q.clone() };
        let out = fast::scaled_dot_product_attention(q, keys, values, scale, mask, None)?;
        let width = self.n_heads * self.head_dim;
        if l == 1 {
            return Ok(out.reshape(&[b, 1, width])?);
        }
        Ok(out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, width])?)
    }
}

/// SwiGLU: `down(silu(gate(x)) * up(x))`, gate and up in one matmul.
struct Mlp {
    gate_up: FusedLinear,
    down_proj: Linear,
    /// SwiGLU through MLX compile (one kernel) rather than plain ops: decided at load, on the
    /// device the model is loaded for (see [`swiglu`]).
    fused_swiglu: bool,
}

impl Mlp {
    fn load(cfg: &ModelConfig, w: &mut Weights, prefix: &str) -> Result<Self> {
        Self::load_width(cfg, cfg.intermediate_size, w, prefix)
    }

    /// An MLP of hidden width `inter` (a shared expert's).
    fn load_width(cfg: &ModelConfig, inter: i32, w: &mut Weights, prefix: &str) -> Result<Self> {
        let hidden = cfg.hidden_size;
        let gate = w.linear(&format!("{prefix}.gate_proj"), inter, hidden, false)?;
        let up = w.linear(&format!("{prefix}.up_proj"), inter, hidden, false)?;
        Ok(Mlp {
            gate_up: FusedLinear::new(vec![gate, up])?,
            down_proj: w.linear(&format!("{prefix}.down_proj"), hidden, inter, false)?,
            fused_swiglu: on_gpu(),
        })
    }

    fn forward(&self, x: &Array) -> Result<Array> {
        let [gate, up] = pair(self.gate_up.forward(x)?)?;
        self.down_proj.forward(&swiglu(&gate, &up, self.fused_swiglu)?)
    }
}

/// The two parts of a split (gate/up, q+k/v, q/k), as an array.
fn pair(parts: Vec<Array>) -> Result<[Array; 2]> {
    parts
        .try_into()
        .map_err(|v: Vec<Array>| ModelError::Input(format!("{} parts, expected 2", v.len())))
}

/// The three parts of a split (q/k/v), as an array.
fn triple(parts: Vec<Array>) -> Result<[Array; 3]> {
    parts
        .try_into()
        .map_err(|v: Vec<Array>| ModelError::Input(format!("{} parts, expected 3", v.len())))
}

pub(crate) use crate::runtime::on_gpu;

type Fused2 = Box<dyn for<'a> FnMut((&'a Array, &'a Array)) -> std::result::Result<Array, Exception>>;

thread_local! {
    /// This thread's compiled `swiglu` (MLX keys a compiled graph by the function's identity).
    static SWIGLU: RefCell<Option<Fused2>> = const { RefCell::new(None) };
}

/// `silu(gate) * up`. `fused` (on a GPU): one kernel through MLX compile instead of three
/// (small models are launch-bound there: each op is a kernel launch). Otherwise (the CPU) the
/// plain ops: MLX's CPU backend would build the fused kernel with the system's C++ compiler at
/// run time.
fn swiglu(gate: &Array, up: &Array, fused: bool) -> Result<Array> {
    fn plain((g, u): (&Array, &Array)) -> std::result::Result<Array, Exception> {
        g.multiply(ops::sigmoid(g)?)?.multiply(u)
    }
    if !fused {
        return Ok(plain((gate, up))?);
    }
    SWIGLU.with(|cell| {
        let mut slot = cell.borrow_mut();
        let f = slot.get_or_insert_with(|| Box::new(compile(plain, true)));
        Ok(f((gate, up))?)
    })
}

struct RmsNorm {
    weight: Array,
    eps: f32,
}

impl RmsNorm {
    /// Normalizes over the last axis.
    fn forward(&self, x: &Array) -> Result<Array> {
        Ok(fast::rms_norm(x, Some(&self.weight), self.eps)?)
    }
}

/// `y = x Wᵀ (+ b)` with `W` `[out, in]` dense or MLX affine-quantized. Also the embedding
/// table (`[vocab, hidden]`, looked up by row) and a tied LM head.
enum Linear {
    Dense {
        weight: Array,
        bias: Option<Array>,
    },
    Quantized {
        weight: Array,
        scales: Array,
        biases: Array,
        bias: Option<Array>,
        spec: QuantSpec,
    },
}

impl Linear {
    fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            Linear::Dense { weight, bias } => Ok(match bias {
                Some(b) => ops::addmm(b, x, weight.transpose()?, None, None)?,
                None => x.matmul(weight.transpose()?)?,
            }),
            Linear::Quantized {
                weight,
                scales,
                biases,
                bias,
                spec,
            } => {
                let y = quantized_matmul(x, weight, scales, biases, true, spec.group_size, spec.bits)?;
                Ok(match bias {
                    Some(b) => y.add(b)?,
                    None => y,
                })
            }
        }
    }

    /// Rows `ids` of the matrix (the embedding lookup), dequantized: `ids.shape + [in]`.
    fn lookup(&self, ids: &Array) -> Result<Array> {
        match self {
            Linear::Dense { weight, .. } => Ok(weight.take_axis(ids, 0)?),
            Linear::Quantized {
                weight,
                scales,
                biases,
                spec,
                ..
            } => Ok(ops::dequantize(
                weight.take_axis(ids, 0)?,
                scales.take_axis(ids, 0)?,
                &biases.take_axis(ids, 0)?,
                spec.group_size,
                spec.bits,
            )?),
        }
    }

    /// The float type of the activations this layer makes: its weight's, or its scales'.
    fn float_dtype(&self) -> Dtype {
        match self {
            Linear::Dense { weight, .. } => weight.dtype(),
            Linear::Quantized { scales, .. } => scales.dtype(),
        }
    }

    fn out_features(&self) -> i32 {
        match self {
            Linear::Dense { weight, .. } | Linear::Quantized { weight, .. } => weight.dim(0),
        }
    }

    fn arrays(&self) -> Vec<&Array> {
        let (mut v, bias) = match self {
            Linear::Dense { weight, bias } => (vec![weight], bias),
            Linear::Quantized {
                weight,
                scales,
                biases,
                bias,
                ..
            } => (vec![weight, scales, biases], bias),
        };
        v.extend(bias);
        v
    }

    /// Stacks the output rows of same-format layers into one layer, or `None` when their
    /// formats (dense dtype, quantization, bias presence) differ.
    fn concat_rows(parts: &[Linear]) -> Result<Option<Linear>> {
        Self::join(parts, |arrays| ops::concatenate(&arrays, 0))
    }

    /// Same-format layers `[out, in]` as one `[parts, out, in]` (the experts of a MoE layer),
    /// or `None` when their formats differ.
    fn stack(parts: &[Linear]) -> Result<Option<Linear>> {
        Self::join(parts, |arrays| ops::stack(&arrays, 0))
    }

    /// Each array of same-format layers joined by `cat`, or `None` when their formats differ.
    fn join(
        parts: &[Linear],
        cat: impl Fn(Vec<&Array>) -> std::result::Result<Array, Exception>,
    ) -> Result<Option<Linear>> {
        let biases: Option<Vec<&Array>> = parts.iter().map(Linear::bias).collect();
        if biases.is_none() && parts.iter().any(|p| p.bias().is_some()) {
            return Ok(None);
        }
        let bias = biases.map(&cat).transpose()?;
        match &parts[0] {
            Linear::Dense { weight, .. } => {
                let mut ws = vec![];
                for p in parts {
                    match p {
                        Linear::Dense { weight: w, .. } if w.dtype() == weight.dtype() => ws.push(w),
                        _ => return Ok(None),
                    }
                }
                Ok(Some(Linear::Dense {
                    weight: cat(ws)?,
                    bias,
                }))
            }
            Linear::Quantized { spec, .. } => {
                let (mut ws, mut ss, mut bs) = (vec![], vec![], vec![]);
                for p in parts {
                    match p {
                        Linear::Quantized {
                            weight,
                            scales,
                            biases,
                            spec: s,
                            ..
                        } if s == spec => {
                            ws.push(weight);
                            ss.push(scales);
                            bs.push(biases);
                        }
                        _ => return Ok(None),
                    }
                }
                Ok(Some(Linear::Quantized {
                    weight: cat(ws)?,
                    scales: cat(ss)?,
                    biases: cat(bs)?,
                    bias,
                    spec: *spec,
                }))
            }
        }
    }

    /// The bias `[out]` as `[1, 1, out]`, the shape of a decode step's output row, so that
    /// adding it there broadcasts nothing (one op fewer a step).
    fn with_bias_as_row(mut self) -> Result<Linear> {
        let (Linear::Dense { bias, .. } | Linear::Quantized { bias, .. }) = &mut self;
        if let Some(b) = bias {
            if b.ndim() == 1 {
                *b = b.reshape(&[1, 1, b.dim(0)])?;
            }
        }
        Ok(self)
    }

    fn bias(&self) -> Option<&Array> {
        match self {
            Linear::Dense { bias, .. } | Linear::Quantized { bias, .. } => bias.as_ref(),
        }
    }
}

/// Linear maps of the same input (q/k/v, gate/up): one matmul over their stacked rows, split
/// after. Layers that cannot be stacked (different bits) stay separate.
struct FusedLinear {
    parts: Vec<Linear>,
    /// Where the fused output splits; empty when `parts` are separate.
    splits: Vec<i32>,
}

impl FusedLinear {
    fn new(parts: Vec<Linear>) -> Result<Self> {
        let Some(fused) = Linear::concat_rows(&parts)? else {
            return Ok(FusedLinear {
                parts,
                splits: vec![],
            });
        };
        let fused = fused.with_bias_as_row()?;
        eval(fused.arrays())?;
        let splits = parts[..parts.len() - 1]
            .iter()
            .scan(0, |end, p| {
                *end += p.out_features();
                Some(*end)
            })
            .collect();
        Ok(FusedLinear {
            parts: vec![fused],
            splits,
        })
    }

    fn forward(&self, x: &Array) -> Result<Vec<Array>> {
        if let [fused] = &self.parts[..] {
            if !self.splits.is_empty() {
                return Ok(ops::split_at_indices(fused.forward(x)?, &self.splits, -1)?);
            }
        }
        self.parts.iter().map(|p| p.forward(x)).collect()
    }

    /// The one stacked layer, when the parts could be stacked.
    fn single(&self) -> Option<&Linear> {
        match &self.parts[..] {
            [one] => Some(one),
            _ => None,
        }
    }

    /// The parts' outputs side by side, `[..., Σ out]`: the fused product itself, or the
    /// separate products joined (one more op, for checkpoints whose parts differ in format).
    fn forward_joined(&self, x: &Array) -> Result<Array> {
        match &self.parts[..] {
            [one] => one.forward(x),
            parts => {
                let outs = parts.iter().map(|p| p.forward(x)).collect::<Result<Vec<_>>>()?;
                Ok(ops::concatenate(&outs, -1)?)
            }
        }
    }

    fn arrays(&self) -> Vec<&Array> {
        self.parts.iter().flat_map(Linear::arrays).collect()
    }
}

/// The weight map being consumed, with shape checks that name the tensor.
struct Weights {
    map: HashMap<String, Array>,
    group_size: i32,
}

impl Weights {
    fn take(&mut self, name: &str) -> Result<Array> {
        self.map
            .remove(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))
    }

    fn take_shaped(&mut self, name: &str, shape: &[i32]) -> Result<Array> {
        let a = self.take(name)?;
        check_shape(name, &a, shape)?;
        if !a.dtype().is_float() {
            return Err(ModelError::BadTensor {
                name: name.into(),
                reason: format!("expected a float dtype, found {:?}", a.dtype()),
            });
        }
        Ok(a)
    }

    fn rms_norm(&mut self, name: &str, dim: i32, eps: f32) -> Result<RmsNorm> {
        Ok(RmsNorm {
            weight: self.take_shaped(name, &[dim])?,
            eps,
        })
    }

    /// `{prefix}.weight` `[out, in]` (+ `.scales`/`.biases` when quantized, + `.bias` `[out]`).
    fn linear(&mut self, prefix: &str, out: i32, inp: i32, bias: bool) -> Result<Linear> {
        self.stacked_linear(prefix, &[], out, inp, bias)
    }

    /// [`Weights::linear`] with leading dimensions `lead` on every tensor: `[...lead, out, in]`
    /// (the stacked experts of a MoE layer: `lead` is `[experts]`).
    fn stacked_linear(
        &mut self,
        prefix: &str,
        lead: &[i32],
        out: i32,
        inp: i32,
        bias: bool,
    ) -> Result<Linear> {
        let shape = |last: &[i32]| [lead, last].concat();
        let bias = if bias {
            Some(self.take_shaped(&format!("{prefix}.bias"), &shape(&[out]))?)
        } else {
            None
        };
        let name = format!("{prefix}.weight");
        if !self.map.contains_key(&format!("{prefix}.scales")) {
            let weight = self.take_shaped(&name, &shape(&[out, inp]))?;
            return Ok(Linear::Dense { weight, bias });
        }
        let weight = self.take(&name)?;
        let scales_name = format!("{prefix}.scales");
        let scales = self.take(&scales_name)?;
        let biases_name = format!("{prefix}.biases");
        let biases = self.take(&biases_name)?;
        let rows = shape(&[out]);
        let n = rows.len();
        if weight.dtype() != Dtype::Uint32 || weight.ndim() != n + 1 || weight.shape()[..n] != rows[..] {
            let rows: Vec<String> = rows.iter().map(i32::to_string).collect();
            return Err(ModelError::BadTensor {
                name,
                reason: format!(
                    "quantized weight must be uint32 [{}, packed], found {:?} {:?}",
                    rows.join(", "),
                    weight.dtype(),
                    weight.shape()
                ),
            });
        }
        // The declared group size, or the one these scales imply (mixed recipes).
        let groups = scales.shape().get(n).copied().unwrap_or(0);
        let group_size = [self.group_size, 32, 64, 128]
            .into_iter()
            .find(|&g| inp % g == 0 && inp / g == groups)
            .unwrap_or(self.group_size);
        let expected_groups = inp / group_size;
        check_shape(&scales_name, &scales, &shape(&[out, expected_groups]))?;
        check_shape(&biases_name, &biases, &shape(&[out, expected_groups]))?;
        let packed = weight.dim(-1);
        let bits = packed * 32 / inp;
        if packed * 32 % inp != 0 || ![2, 3, 4, 5, 6, 8].contains(&bits) {
            return Err(ModelError::BadTensor {
                name,
                reason: format!(
                    "{packed} packed uint32 columns do not hold {inp} inputs at 2/3/4/5/6/8 bits"
                ),
            });
        }
        Ok(Linear::Quantized {
            weight,
            scales,
            biases,
            bias,
            spec: QuantSpec { group_size, bits },
        })
    }
}

fn check_shape(name: &str, a: &Array, expected: &[i32]) -> Result<()> {
    if a.shape() != expected {
        return Err(ModelError::ShapeMismatch {
            name: name.to_string(),
            expected: expected.to_vec(),
            found: a.shape().to_vec(),
        });
    }
    Ok(())
}

/// Tiny random models and an independent f32 forward pass to check them against.
#[cfg(test)]
pub(crate) mod test_util {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// A CPU tolerance for comparing two computations of the same logits, on the device the
    /// tests run on: GPUs run f32 matrix products in TF32 (10-bit mantissa), so two orders of
    /// summation differ by about 1e-3 of the logits' size there.
    pub(crate) fn tol(cpu: f32) -> f32 {
        if on_gpu() {
            cpu.max(1e-2)
        } else {
            cpu
        }
    }

    /// Host copy of a weight: data and shape.
    pub(crate) type HostWeights = HashMap<String, (Vec<f32>, Vec<i32>)>;

    pub(crate) fn tiny_config(arch: Arch) -> ModelConfig {
        ModelConfig {
            arch,
            hidden_size: 64,
            intermediate_size: 128,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            // Qwen3 states head_dim; make it differ from hidden / heads to prove it is used.
            head_dim: if arch == Arch::Qwen2 { 16 } else { 32 },
            vocab_size: 97,
            rope_theta: 10000.0,
            rms_norm_eps: 1e-6,
            tie_word_embeddings: arch == Arch::Qwen2,
            // 8 experts, 2 a token, every layer sparse.
            moe: (arch == Arch::Qwen3Moe).then(|| MoeConfig {
                num_experts: 8,
                num_experts_per_tok: 2,
                moe_intermediate_size: 64,
                norm_topk_prob: true,
                decoder_sparse_step: 1,
                mlp_only_layers: vec![],
                shared_expert_intermediate_size: None,
            }),
            hybrid: None,
        }
    }

    /// Random weights with HF names, on the host.
    pub(crate) fn random_weights(cfg: &ModelConfig, seed: u64) -> HostWeights {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut w = HostWeights::new();
        let mut put = |name: String, shape: Vec<i32>, scale: f32, center: f32| {
            let n = shape.iter().product::<i32>() as usize;
            let data = (0..n)
                .map(|_| center + scale * rng.gen_range(-1.0f32..1.0))
                .collect();
            w.insert(name, (data, shape));
        };
        let (h, i, v, d) = (
            cfg.hidden_size,
            cfg.intermediate_size,
            cfg.vocab_size,
            cfg.head_dim,
        );
        let (qd, kvd) = (cfg.num_attention_heads * d, cfg.num_key_value_heads * d);
        let lin = |fan_in: i32| 1.7 / (fan_in as f32).sqrt();
        put("model.embed_tokens.weight".into(), vec![v, h], 1.0, 0.0);
        for l in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{l}");
            let swiglu = |at: &str, i: i32| {
                [("gate_proj", i, h), ("up_proj", i, h), ("down_proj", h, i)]
                    .map(|(n, r, c)| (format!("{at}.{n}"), r, c))
            };
            let mut matrices = vec![
                ("self_attn.q_proj".to_owned(), qd, h),
                ("self_attn.k_proj".to_owned(), kvd, h),
                ("self_attn.v_proj".to_owned(), kvd, h),
                ("self_attn.o_proj".to_owned(), h, qd),
            ];
            match &cfg.moe {
                // The router, then each expert's own tensors, as Hugging Face names them.
                Some(moe) if moe.is_sparse(l) => {
                    matrices.push(("mlp.gate".to_owned(), moe.num_experts, h));
                    for e in 0..moe.num_experts {
                        matrices.extend(swiglu(&format!("mlp.experts.{e}"), moe.moe_intermediate_size));
                    }
                }
                _ => matrices.extend(swiglu("mlp", i)),
            }
            for (n, rows, cols) in matrices {
                put(format!("{p}.{n}.weight"), vec![rows, cols], lin(cols), 0.0);
            }
            if cfg.arch == Arch::Qwen2 {
                for (n, rows) in [("q_proj", qd), ("k_proj", kvd), ("v_proj", kvd)] {
                    put(format!("{p}.self_attn.{n}.bias"), vec![rows], 0.3, 0.0);
                }
            } else {
                for n in ["q_norm", "k_norm"] {
                    put(format!("{p}.self_attn.{n}.weight"), vec![d], 0.2, 1.0);
                }
            }
            for n in ["input_layernorm", "post_attention_layernorm"] {
                put(format!("{p}.{n}.weight"), vec![h], 0.2, 1.0);
            }
        }
        put("model.norm.weight".into(), vec![h], 0.2, 1.0);
        if !cfg.tie_word_embeddings {
            put("lm_head.weight".into(), vec![v, h], lin(h), 0.0);
        }
        w
    }

    pub(crate) fn to_device(w: &HostWeights) -> HashMap<String, Array> {
        w.iter()
            .map(|(k, (data, shape))| (k.clone(), Array::from_slice(data, shape)))
            .collect()
    }

    pub(crate) fn tiny_model(arch: Arch, seed: u64) -> Model {
        let cfg = tiny_config(arch);
        let w = random_weights(&cfg, seed);
        Model::from_weights(cfg, to_device(&w), 64).unwrap()
    }

    /// Quantizes every 2-D weight with MLX; returns the quantized map and the dense map of
    /// its dequantized values (same function, no rounding difference).
    pub(crate) fn quantized_pair(
        w: &HostWeights,
        group_size: i32,
        bits: i32,
    ) -> (HashMap<String, Array>, HashMap<String, Array>) {
        let mut q = HashMap::new();
        let mut d = HashMap::new();
        for (k, (data, shape)) in w {
            let a = Array::from_slice(data, shape);
            if shape.len() == 2 {
                let (wq, s, b) = ops::quantize(&a, group_size, bits).unwrap();
                let deq = ops::dequantize(&wq, &s, &b, group_size, bits).unwrap();
                let base = k.trim_end_matches(".weight");
                q.insert(format!("{base}.scales"), s);
                q.insert(format!("{base}.biases"), b);
                q.insert(k.clone(), wq);
                d.insert(k.clone(), deq);
            } else {
                q.insert(k.clone(), a.clone());
                d.insert(k.clone(), a);
            }
        }
        (q, d)
    }

    pub(crate) fn max_abs_diff(a: &Array, b: &Array) -> f32 {
        assert_eq!(a.shape(), b.shape());
        let d = a.subtract(b).unwrap().abs().unwrap().max(None).unwrap();
        d.item_exact::<f32>()
    }

    /// Logits of `ids` fed in the given chunk sizes, `[1, L, V]`.
    pub(crate) fn chunked(model: &Model, ids: &[u32], chunks: &[usize]) -> Array {
        let mut caches = model.new_caches();
        let mut outs = vec![];
        let mut start = 0;
        for &c in chunks {
            outs.push(
                model
                    .forward_all(&tokens(&ids[start..start + c]), &mut caches)
                    .unwrap(),
            );
            start += c;
        }
        assert_eq!(start, ids.len());
        assert_eq!(caches[0].offset(), ids.len());
        ops::concatenate(&outs, 1).unwrap()
    }

    /// Mean |a - b| over the logits as a share of `b`'s spread (standard deviation), and the
    /// share of positions whose most likely token agrees.
    pub(crate) fn relative_error(a: &Array, b: &Array) -> (f32, f32) {
        let mean_abs = a
            .subtract(b)
            .unwrap()
            .abs()
            .unwrap()
            .mean(None)
            .unwrap()
            .item_exact::<f32>();
        let spread = ops::std(b, None, None).unwrap().item_exact::<f32>();
        let argmax = |x: &Array| ops::indexing::argmax_axis(x, -1, None).unwrap();
        let same = argmax(a).eq(argmax(b)).unwrap().as_dtype(Dtype::Float32).unwrap();
        (mean_abs / spread, same.mean(None).unwrap().item_exact::<f32>())
    }

    /// Every weight of `w` in `dtype`.
    pub(crate) fn cast(w: &HashMap<String, Array>, dtype: Dtype) -> HashMap<String, Array> {
        w.iter()
            .map(|(k, a)| (k.clone(), a.as_dtype(dtype).unwrap()))
            .collect()
    }

    pub(crate) fn tokens(ids: &[u32]) -> Array {
        Array::from_slice(ids, &[1, ids.len() as i32])
    }

    /// Independent f32 forward pass of one sequence (f64 accumulation): logits per position.
    pub(crate) fn reference_forward(cfg: &ModelConfig, w: &HostWeights, ids: &[u32]) -> Vec<Vec<f32>> {
        reference_forward_routed(cfg, w, ids).0
    }

    /// [`reference_forward`], also returning the experts each position ran in each layer,
    /// most likely first (empty for a dense layer): `[layer][position]`. Expert weights are
    /// read per expert (`mlp.experts.{e}.*`, Hugging Face's names).
    pub(crate) fn reference_forward_routed(
        cfg: &ModelConfig,
        w: &HostWeights,
        ids: &[u32],
    ) -> (Vec<Vec<f32>>, Vec<Vec<Vec<usize>>>) {
        let get = |n: &str| &w[n].0;
        let (h, d) = (cfg.hidden_size as usize, cfg.head_dim as usize);
        let (nh, nkv) = (cfg.num_attention_heads as usize, cfg.num_key_value_heads as usize);
        let rms = |x: &[f32], g: &[f32]| -> Vec<f32> {
            let ms = x.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / x.len() as f64;
            let r = 1.0 / (ms + cfg.rms_norm_eps as f64).sqrt();
            x.iter().zip(g).map(|(v, g)| (*v as f64 * r) as f32 * g).collect()
        };
        // y[o] = sum_i W[o, i] x[i] (+ b[o]); W is [out, in] row-major.
        let matvec = |wname: &str, x: &[f32], bias: Option<&str>| -> Vec<f32> {
            let wt = get(wname);
            let cols = x.len();
            (0..wt.len() / cols)
                .map(|o| {
                    let row = &wt[o * cols..(o + 1) * cols];
                    let s: f64 = row.iter().zip(x).map(|(a, b)| *a as f64 * *b as f64).sum();
                    (s + bias.map_or(0.0, |b| get(b)[o] as f64)) as f32
                })
                .collect()
        };
        // NEOX: rotate pairs (i, i + d/2) by pos * theta^(-2i/d).
        let rope = |x: &mut [f32], pos: usize| {
            for i in 0..d / 2 {
                let freq = (cfg.rope_theta as f64).powf(-2.0 * i as f64 / d as f64);
                let (s, c) = (pos as f64 * freq).sin_cos();
                let (a, b) = (x[i] as f64, x[i + d / 2] as f64);
                x[i] = (a * c - b * s) as f32;
                x[i + d / 2] = (a * s + b * c) as f32;
            }
        };
        let n = ids.len();
        let mut xs: Vec<Vec<f32>> = ids
            .iter()
            .map(|&t| get("model.embed_tokens.weight")[t as usize * h..(t as usize + 1) * h].to_vec())
            .collect();
        let mut routes = vec![vec![]; cfg.num_hidden_layers as usize];
        for l in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{l}");
            let bias = |n: &str| (cfg.arch == Arch::Qwen2).then(|| format!("{p}.self_attn.{n}.bias"));
            let (mut qs, mut ks, mut vs) = (vec![], vec![], vec![]);
            for (pos, x) in xs.iter().enumerate() {
                let hn = rms(x, get(&format!("{p}.input_layernorm.weight")));
                let proj = |n: &str| {
                    let b = bias(n);
                    matvec(&format!("{p}.self_attn.{n}.weight"), &hn, b.as_deref())
                };
                let (mut q, mut k) = (proj("q_proj"), proj("k_proj"));
                for (v, heads, norm) in [(&mut q, nh, "q_norm"), (&mut k, nkv, "k_norm")] {
                    for hd in 0..heads {
                        let head = &mut v[hd * d..(hd + 1) * d];
                        if cfg.arch != Arch::Qwen2 {
                            let g = get(&format!("{p}.self_attn.{norm}.weight"));
                            head.copy_from_slice(&rms(head, g));
                        }
                        rope(head, pos);
                    }
                }
                qs.push(q);
                ks.push(k);
                vs.push(proj("v_proj"));
            }
            for i in 0..n {
                let mut att = vec![0f32; nh * d];
                for hd in 0..nh {
                    let kv = hd / (nh / nkv);
                    let q = &qs[i][hd * d..(hd + 1) * d];
                    let scores: Vec<f64> = (0..=i)
                        .map(|j| {
                            let k = &ks[j][kv * d..(kv + 1) * d];
                            q.iter().zip(k).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>()
                                / (d as f64).sqrt()
                        })
                        .collect();
                    let m = scores.iter().cloned().fold(f64::MIN, f64::max);
                    let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for (j, ej) in e.iter().enumerate() {
                        for t in 0..d {
                            att[hd * d + t] += (ej / z * vs[j][kv * d + t] as f64) as f32;
                        }
                    }
                }
                let o = matvec(&format!("{p}.self_attn.o_proj.weight"), &att, None);
                let x = &mut xs[i];
                x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
                let hn = rms(x, get(&format!("{p}.post_attention_layernorm.weight")));
                let swiglu = |at: &str| {
                    let g = matvec(&format!("{at}.gate_proj.weight"), &hn, None);
                    let u = matvec(&format!("{at}.up_proj.weight"), &hn, None);
                    let act: Vec<f32> = g
                        .iter()
                        .zip(&u)
                        .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                        .collect();
                    matvec(&format!("{at}.down_proj.weight"), &act, None)
                };
                let (dn, chosen) = match &cfg.moe {
                    Some(moe) if moe.is_sparse(l) => {
                        // Softmax over the router's logits, the k most likely, their weights.
                        let logits = matvec(&format!("{p}.mlp.gate.weight"), &hn, None);
                        let m = logits.iter().cloned().fold(f32::MIN, f32::max) as f64;
                        let e: Vec<f64> = logits.iter().map(|v| (*v as f64 - m).exp()).collect();
                        let z: f64 = e.iter().sum();
                        let probs: Vec<f64> = e.iter().map(|v| v / z).collect();
                        let mut order: Vec<usize> = (0..probs.len()).collect();
                        order.sort_by(|a, b| probs[*b].total_cmp(&probs[*a]));
                        order.truncate(moe.num_experts_per_tok as usize);
                        let total: f64 = order.iter().map(|&j| probs[j]).sum();
                        let mut y = vec![0f64; h];
                        for &j in &order {
                            let wj = if moe.norm_topk_prob {
                                probs[j] / total
                            } else {
                                probs[j]
                            };
                            let out = swiglu(&format!("{p}.mlp.experts.{j}"));
                            y.iter_mut().zip(&out).for_each(|(a, b)| *a += wj * *b as f64);
                        }
                        (y.into_iter().map(|v| v as f32).collect(), order)
                    }
                    _ => (swiglu(&format!("{p}.mlp")), vec![]),
                };
                routes[l as usize].push(chosen);
                x.iter_mut().zip(&dn).for_each(|(a, b)| *a += b);
            }
        }
        let head = if w.contains_key("lm_head.weight") {
            "lm_head.weight"
        } else {
            "model.embed_tokens.weight"
        };
        let logits = xs
            .iter()
            .map(|x| matvec(head, &rms(x, get("model.norm.weight")), None))
            .collect();
        (logits, routes)
    }
}

#[cfg(test)]
mod tests {
    use super::test_util::*;
    use super::*;
    use mlx_rs::ops::indexing::IndexOp;

    fn seq() -> Vec<u32> {
        vec![3, 17, 42, 5, 96, 0, 11, 64, 23, 8, 77, 31]
    }

    fn check_cache_consistency(model: &Model) {
        let ids = seq();
        let whole = chunked(model, &ids, &[ids.len()]);
        let one_by_one = chunked(model, &ids, &[1; 12]);
        let in_chunks = chunked(model, &ids, &[5, 4, 3]);
        assert!(max_abs_diff(&whole, &one_by_one) <= tol(1e-4));
        assert!(max_abs_diff(&whole, &in_chunks) <= tol(1e-4));
        // forward (last position only) agrees with forward_all.
        let mut caches = model.new_caches();
        let last = model.forward(&tokens(&ids), &mut caches).unwrap();
        assert_eq!(last.shape(), &[1, 97]);
        let l = ids.len() as i32;
        assert!(max_abs_diff(&last, &whole.index((.., l - 1, ..))) <= tol(1e-5));
    }

    #[test]
    fn cached_logits_equal_uncached_qwen2_qwen3_and_qwen3_moe() {
        check_cache_consistency(&tiny_model(Arch::Qwen2, 1));
        check_cache_consistency(&tiny_model(Arch::Qwen3, 2));
        check_cache_consistency(&tiny_model(Arch::Qwen3Moe, 2));
    }

    #[test]
    fn cached_logits_equal_uncached_quantized() {
        for (arch, gs, bits) in [
            (Arch::Qwen2, 64, 4),
            (Arch::Qwen3, 32, 6),
            (Arch::Qwen2, 32, 8),
            (Arch::Qwen3Moe, 64, 4),
        ] {
            let cfg = tiny_config(arch);
            let (q, _) = quantized_pair(&random_weights(&cfg, 3), gs, bits);
            check_cache_consistency(&Model::from_weights(cfg, q, gs).unwrap());
        }
    }

    #[test]
    fn trim_and_refeed_matches_never_going_past() {
        for arch in [Arch::Qwen2, Arch::Qwen3, Arch::Qwen3Moe] {
            let model = tiny_model(arch, 4);
            let ids = seq();
            let k = 7;
            let mut caches = model.new_caches();
            model.forward(&tokens(&ids), &mut caches).unwrap();
            for c in caches.iter_mut() {
                assert_eq!(c.trim(ids.len() - k), ids.len() - k);
            }
            let other = [50u32, 51, 52];
            let refed = model.forward_all(&tokens(&other), &mut caches).unwrap();
            let mut fresh = model.new_caches();
            model.forward(&tokens(&ids[..k]), &mut fresh).unwrap();
            let direct = model.forward_all(&tokens(&other), &mut fresh).unwrap();
            assert!(max_abs_diff(&refed, &direct) <= tol(1e-5));
        }
    }

    fn check_against_reference(arch: Arch) {
        let cfg = tiny_config(arch);
        let w = random_weights(&cfg, 5);
        let model = Model::from_weights(cfg.clone(), to_device(&w), 64).unwrap();
        assert_fused(&model);
        let ids = seq();
        let got = model.forward_all(&tokens(&ids), &mut model.new_caches()).unwrap();
        let want = reference_forward(&cfg, &w, &ids);
        let want: Vec<f32> = want.into_iter().flatten().collect();
        let want = Array::from_slice(&want, got.shape());
        let diff = max_abs_diff(&got, &want);
        assert!(diff <= 1e-4, "{arch:?}: max abs diff {diff}");
        // Not a vacuous comparison: logits vary.
        let spread =
            want.max(None).unwrap().item_exact::<f32>() - want.min(None).unwrap().item_exact::<f32>();
        assert!(spread > 1.0, "spread {spread}");
    }

    #[test]
    fn qwen2_forward_matches_reference() {
        check_against_reference(Arch::Qwen2);
    }

    #[test]
    fn qwen3_forward_matches_reference() {
        check_against_reference(Arch::Qwen3);
    }

    #[test]
    fn untied_qwen2_uses_lm_head() {
        let mut cfg = tiny_config(Arch::Qwen2);
        cfg.tie_word_embeddings = false;
        let w = random_weights(&cfg, 6);
        let model = Model::from_weights(cfg.clone(), to_device(&w), 64).unwrap();
        assert!(model.lm_head.is_some());
        let ids = seq();
        let got = model.forward(&tokens(&ids), &mut model.new_caches()).unwrap();
        let want = reference_forward(&cfg, &w, &ids).pop().unwrap();
        assert!(max_abs_diff(&got, &Array::from_slice(&want, &[1, 97])) <= tol(1e-4));
    }

    #[test]
    fn quantized_equals_dense_on_dequantized_weights() {
        for arch in [Arch::Qwen2, Arch::Qwen3] {
            for (gs, bits) in [(64, 4), (32, 4), (64, 6), (32, 8)] {
                let cfg = tiny_config(arch);
                let (q, d) = quantized_pair(&random_weights(&cfg, 7), gs, bits);
                let qm = Model::from_weights(cfg.clone(), q, gs).unwrap();
                assert!(matches!(
                    qm.layers[0].mlp.dense().down_proj,
                    Linear::Quantized { spec, .. } if spec == QuantSpec { group_size: gs, bits }
                ));
                assert_fused(&qm);
                let dm = Model::from_weights(cfg, d, gs).unwrap();
                assert_fused(&dm);
                let ids = tokens(&seq());
                let a = qm.forward_all(&ids, &mut qm.new_caches()).unwrap();
                let b = dm.forward_all(&ids, &mut dm.new_caches()).unwrap();
                let diff = max_abs_diff(&a, &b);
                assert!(diff <= 1e-4, "{arch:?} q{bits} g{gs}: {diff}");
                assert!(qm.nbytes() < dm.nbytes());
            }
        }
    }

    /// q/k/v and gate/up each run as one matmul.
    fn assert_fused(model: &Model) {
        for layer in &model.layers {
            let qkv = match &layer.self_attn {
                Attention::Qwen2(a) => &a.qkv,
                Attention::Qwen3(a) => &a.qkv,
                Attention::Gated(a) => &a.qkv,
                Attention::DeltaNet(a) => {
                    assert_eq!((a.proj.parts.len(), a.proj.splits.len()), (1, 3));
                    continue;
                }
            };
            assert_eq!((qkv.parts.len(), qkv.splits.len()), (1, 2));
            if let FeedForward::Dense(mlp) = &layer.mlp {
                assert_eq!((mlp.gate_up.parts.len(), mlp.gate_up.splits.len()), (1, 1));
            }
        }
    }

    #[test]
    fn bf16_weights_run_close_to_f32() {
        for arch in [Arch::Qwen2, Arch::Qwen3] {
            let cfg = tiny_config(arch);
            let w = to_device(&random_weights(&cfg, 12));
            let half = cast(&w, Dtype::Bfloat16);
            let full = Model::from_weights(cfg.clone(), w, 64).unwrap();
            let half = Model::from_weights(cfg.clone(), half, 64).unwrap();
            assert!(half.nbytes() * 2 == full.nbytes());
            let ids = tokens(&seq());
            let a = full.forward_all(&ids, &mut full.new_caches()).unwrap();
            let mut caches = half.new_caches();
            let b = half.forward_all(&ids, &mut caches).unwrap();
            assert_eq!(b.dtype(), Dtype::Float32);
            assert_eq!(caches[0].state().unwrap().0.dtype(), Dtype::Bfloat16);
            let diff = max_abs_diff(&a, &b);
            assert!(diff < 0.5, "{arch:?}: bf16 vs f32 {diff}");
            // Quantizing bf16 weights gives bf16 scales; that model runs too.
            let (q, _) = quantized_pair(&random_weights(&cfg, 12), 64, 8);
            let q: HashMap<String, Array> = q
                .into_iter()
                .map(|(k, a)| {
                    let a = if a.dtype() == Dtype::Float32 {
                        a.as_dtype(Dtype::Bfloat16).unwrap()
                    } else {
                        a
                    };
                    (k, a)
                })
                .collect();
            let qm = Model::from_weights(cfg, q, 64).unwrap();
            let c = qm.forward_all(&ids, &mut qm.new_caches()).unwrap();
            assert!(max_abs_diff(&a, &c) < 0.5);
        }
    }

    #[test]
    fn mixed_bits_and_group_sizes_per_tensor() {
        let cfg = tiny_config(Arch::Qwen2);
        let w = random_weights(&cfg, 8);
        let (mut q4, d4) = quantized_pair(&w, 64, 4);
        let (q8, d8) = quantized_pair(&w, 64, 8);
        let (q4g32, d4g32) = quantized_pair(&w, 32, 4);
        let mut dense = d4;
        // v_proj at 8 bits as Q4_K_M does "more bits" layers: q/k/v cannot be stacked.
        // down_proj with group 32 while the checkpoint says 64: read from the scales.
        for (name, qsrc, dsrc) in [
            ("model.layers.0.self_attn.v_proj", &q8, &d8),
            ("model.layers.1.mlp.down_proj", &q4g32, &d4g32),
        ] {
            for s in ["weight", "scales", "biases"] {
                let t = format!("{name}.{s}");
                q4.insert(t.clone(), qsrc[&t].clone());
            }
            let t = format!("{name}.weight");
            dense.insert(t.clone(), dsrc[&t].clone());
        }
        let model = Model::from_weights(cfg.clone(), q4, 64).unwrap();
        match &model.layers[0].self_attn {
            Attention::Qwen2(a) => assert_eq!(a.qkv.parts.len(), 3),
            _ => unreachable!(),
        }
        let spec = |l: &Linear| match l {
            Linear::Quantized { spec, .. } => Some(*spec),
            Linear::Dense { .. } => None,
        };
        let g32 = QuantSpec {
            group_size: 32,
            bits: 4,
        };
        assert_eq!(spec(&model.layers[1].mlp.dense().down_proj), Some(g32));
        check_cache_consistency(&model);
        let dm = Model::from_weights(cfg, dense, 64).unwrap();
        let ids = tokens(&seq());
        let a = model.forward_all(&ids, &mut model.new_caches()).unwrap();
        let b = dm.forward_all(&ids, &mut dm.new_caches()).unwrap();
        assert!(max_abs_diff(&a, &b) <= tol(1e-4));
    }

    #[test]
    fn bad_weights_are_errors_naming_the_tensor() {
        let cfg = tiny_config(Arch::Qwen2);
        let w = random_weights(&cfg, 9);
        let mut missing = to_device(&w);
        missing.remove("model.layers.1.mlp.up_proj.weight");
        let err = Model::from_weights(cfg.clone(), missing, 64).err().unwrap();
        assert!(matches!(&err, ModelError::MissingTensor(n) if n == "model.layers.1.mlp.up_proj.weight"));

        let mut wrong = to_device(&w);
        wrong.insert(
            "model.layers.0.self_attn.k_proj.weight".into(),
            Array::zeros::<f32>(&[16, 64]).unwrap(),
        );
        let err = Model::from_weights(cfg.clone(), wrong, 64).err().unwrap();
        assert_eq!(
            err.to_string(),
            "tensor `model.layers.0.self_attn.k_proj.weight`: expected shape [32, 64], found [16, 64]"
        );

        let (mut q, _) = quantized_pair(&w, 64, 4);
        q.insert(
            "model.layers.0.mlp.gate_proj.scales".into(),
            Array::zeros::<f32>(&[128, 3]).unwrap(),
        );
        let err = Model::from_weights(cfg.clone(), q, 64).err().unwrap();
        assert!(
            matches!(&err, ModelError::ShapeMismatch { name, .. } if name == "model.layers.0.mlp.gate_proj.scales"),
            "{err}"
        );

        let mut untied = cfg.clone();
        untied.tie_word_embeddings = false;
        let err = Model::from_weights(untied, to_device(&w), 64).err().unwrap();
        assert!(matches!(&err, ModelError::MissingTensor(n) if n == "lm_head.weight"));

        let mut bad_cfg = cfg;
        bad_cfg.num_key_value_heads = 3;
        assert!(matches!(
            Model::from_weights(bad_cfg, to_device(&w), 64),
            Err(ModelError::Config(_))
        ));
    }

    #[test]
    fn bad_inputs_are_errors() {
        let model = tiny_model(Arch::Qwen2, 10);
        let mut caches = model.new_caches();
        let flat = Array::from_slice(&[1u32, 2], &[2]);
        assert!(matches!(
            model.forward(&flat, &mut caches),
            Err(ModelError::Input(_))
        ));
        let floats = Array::from_slice(&[1.0f32], &[1, 1]);
        assert!(matches!(
            model.forward(&floats, &mut caches),
            Err(ModelError::Input(_))
        ));
        assert!(matches!(
            model.forward(&tokens(&[1]), &mut caches[..1]),
            Err(ModelError::Input(_))
        ));
    }

    /// MLX's causal sdpa mask must be bottom-right aligned for chunked prefill to be right:
    /// compare it with an explicit additive mask for 3 queries after 5 cached keys.
    #[test]
    fn sdpa_causal_mask_is_bottom_right_aligned() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let mut rand_arr = |shape: &[i32]| {
            let n = shape.iter().product::<i32>() as usize;
            let v: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
            Array::from_slice(&v, shape)
        };
        let (q, k, v) = (
            rand_arr(&[1, 4, 3, 16]),
            rand_arr(&[1, 2, 8, 16]),
            rand_arr(&[1, 2, 8, 16]),
        );
        let causal = fast::scaled_dot_product_attention(
            &q,
            &k,
            &v,
            0.25,
            fast::ScaledDotProductAttentionMask::Causal,
            None,
        )
        .unwrap();
        let mask: Vec<f32> = (0..3)
            .flat_map(|i| (0..8).map(move |j| if j <= 5 + i { 0.0 } else { f32::NEG_INFINITY }))
            .collect();
        let mask = Array::from_slice(&mask, &[3, 8]);
        let explicit = fast::scaled_dot_product_attention(&q, &k, &v, 0.25, &mask, None).unwrap();
        assert!(max_abs_diff(&causal, &explicit) <= 1e-6);
    }
}
