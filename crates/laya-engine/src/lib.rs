//! laya's inference engine, a crate of its own that imports nothing from the product crate
//! (`laya`). It loads Qwen models into MLX and generates text. It knows nothing of
//! editors, LSP or HTTP: requests are a prompt string (special tokens parsed) and sampling
//! parameters; answers are texts with timing.
//!
//! ## How it works
//!
//! The inference engine. Knows nothing of editors: `LocalModel::complete` takes a prompt string
//! (special-token text parsed) and sampling parameters and returns texts with a `Timing`
//! (prompt, reused and prefilled tokens, prefill, first token, decode, total).
//! - `runtime.rs`: which MLX is linked (version at build and run time, backend, library path)
//!   and the one place that picks the device (`auto | cpu | gpu`); `graph_primitives` lists the
//!   primitives of a built, unevaluated graph (MLX's `export_to_dot`: how the engine bench counts
//!   the ops of a decode step); it also bounds MLX's cache
//!   of freed buffers (1 GiB, `LAYA_MLX_CACHE_LIMIT`) so a resident process does not keep the
//!   largest working set it ever had, and `main` first gives MLX's environment laya's defaults
//!   (`MLX_ENV_DEFAULTS`: CUDA's graph-cache thrashing check off, a fuse that otherwise fails
//!   every request once a long-lived process has met 800 graph shapes).
//!   On CUDA it gives a model's float tensors bf16 (`activation_dtype`, `LAYA_ACTIVATIONS`) and sets
//!   MLX's environment defaults (`MLX_ENV_DEFAULTS`: no graph-cache fuse, no cuDNN attention).
//! - `load/`: `gguf.rs` parses GGUF (mmap; every count and offset bounds-checked, errors name
//!   the file and tensor; `ggml_type.rs` holds the tensor types both read), `dequant.rs` dequantizes F32/F16/BF16/Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/
//!   Q5_K/Q6_K exactly as llama.cpp, `safetensors_dir.rs` reads HF and mlx-community folders,
//!   `mod.rs` maps GGUF names to HF names (a `qwen3moe` file's 3-D `ffn_*_exps` to stacked
//!   `switch_mlp` experts, a layer without `ffn_gate_inp` to a dense MLP), quantizes to MLX
//!   affine q4/q6/q8 (a MoE router at 8 bits, as mlx-lm does; or keeps the file's own values,
//!   `native`) and caches converted weights under `<cache>/converted/` (a GGUF file at q4/q6/q8;
//!   a folder asked for fewer bits than it stores).
//!   Invariant: a converted cache file is keyed by the source's path, size and mtime (a
//!   folder's: its weight files' and `config.json`'s), the conversion settings and the cache
//!   layout, carries its key (a stale or unreadable one is converted anew), and is written
//!   atomically.
//! - `tokenizer.rs`: byte-level BPE from `tokenizer.json` or from the GGUF vocabulary with the
//!   Qwen2 pre-tokenizer; special tokens: the ids of the family's FIM tokens, and end-of-generation
//!   ids from the family's stop tokens plus those the model file declares (GGUF eos/eot,
//!   `generation_config.json`); a stream decoder that never splits a UTF-8 character.
//! - `models/`: `mod.rs` holds the shared decoder (embedding, fused q/k/v and gate/up linears,
//!   dense or quantized, RMSNorm, SwiGLU — one kernel through MLX compile on the GPU, plain ops on
//!   the CPU —, LM head); `qwen2.rs` and `qwen3.rs` hold the attention that differs (qkv bias vs.
//!   q/k RMSNorm); `qwen3_moe.rs` the mixture of experts that replaces the MLP in the layers
//!   the config makes sparse (`decoder_sparse_step`, `mlp_only_layers`): router, top-k of its
//!   logits, their weights a softmax over the k chosen (= the renormalized probabilities of
//!   `norm_topk_prob`; else the softmax over every expert, taken at the k), SwiGLU experts stacked
//!   `[experts, out, in]` with each expert's gate and up rows in one matrix (one gathered
//!   product, `gather_qmm`/`gather_mm`, then the down rows in another), (token, expert) pairs
//!   sorted by expert from 64 pairs on, as mlx-lm's `SwitchGLU`; the k experts' rows summed with
//!   their weights in one `[1, k] × [k, hidden]` product. Built from a weight map with HF names (per-expert HF tensors are
//!   stacked at load). The fused q/k/v product is taken as heads by one reshape at a decode
//!   step (a chunk copies all heads once: MLX 0.32's CUDA RoPE misreads transposed views);
//!   Qwen2's q and k take RoPE in one call, and each KV buffer one slice update a step. MLX's CPU `gather_mm` is f32-only: there dense experts are
//!   widened to f32 at load.
//! - `cache.rs`: the KV cache (offset, update_and_fetch, trim, nbytes), grown in steps; fetch
//!   returns views of its buffers, no copies.
//! - `sample.rs`: greedy (on device) and temperature/top-k/top-p (seeded) sampling.
//! - `generate.rs`: prefill in chunks paced for the device (512 tokens on a GPU, a chunk that
//!   takes longer than 20 ms run in groups of layers with the cancel flag read between them;
//!   on the CPU sized to take about 250 ms: one token for the models in use here), then decode `n`
//!   candidates sharing the prompt's KV, one evaluation per token (on a GPU with the next step
//!   queued before the current token is read back); the cancel flag is read before each chunk
//!   and each step, so a cancelled request runs at most one more (docs/reliability.md, "Stale
//!   work"). With `branch_first` the candidates start from the `n`
//!   most likely first tokens and each comes back with its summed log-probability (the pipeline
//!   ranks them when `candidates` is above 1). One greedy candidate may decode with drafts
//!   (`Speculation`, from `--speculation auto|on|off`, `auto` = off: measured to gain nothing on the CPU and an H100): each forward feeds
//!   the last token and the tokens `draft.rs` finds after the latest earlier occurrence of the last
//!   2–3 tokens (in the whole prompt, then the output), keeps the draft's prefix the model's own
//!   argmax agrees with plus the model's next token, and cuts the KV cache back to what was kept.
//!   Invariant: the tokens are those of plain greedy decoding (tested on random prompts and
//!   models, and through `laya complete` on the real 0.5B); `Timing::decode_forwards` counts the
//!   forwards.
//! - `lib.rs` holds the `Engine` trait the completion pipeline uses (beside `CompletionRequest`,
//!   `EngineError`, `ModelState` and `PieceSender`); `cancel.rs` holds `Cancel` (its own doc
//!   says who sets and reads it).
//! - `worker.rs`: `ModelWorker`, one model on its own thread behind channels, an `Engine`;
//!   dropping a request's future cancels its generation (a
//!   job cancelled while it waits for the model is skipped), and `Engine::work` counts what the
//!   worker ran (busy, requests, cancelled, prompt chunks, decode steps) for the daemon's status.
//!   Its model comes from a `Loader` (`LocalModel::load`, or a test's that holds the load), and
//!   its ready state says the time to ready and whether the weights came from the converted cache.
//!   `Engine::complete` with a `PieceSender` also sends each candidate's text as it is decoded (the worker's
//!   pieces come from `LocalModel::complete_streaming`: never a split character, never text a
//!   stop string could still claim); engines that cannot stream send the whole text at the end.
//! - `prefix.rs`: the prefix store: token sequences already run with their KV caches; a request
//!   takes the entry with the longest common prefix out (trimmed to it), prefills only the tail
//!   and puts the extended sequence (prompt + generated tokens) back. Bounded by count
//!   (`prefill-cache-size`) and bytes, least recently used out. Invariant: an entry's caches hold
//!   exactly its ids; output with reuse equals output without (tested on random edit sequences).
//! - `pool.rs`: `ModelPool`, an `Engine` holding models by `ModelKey` (tier small|large × bits),
//!   each loaded on first use (local worker or remote server; a remote tier is one model whatever bits are
//!   asked, and so is a folder quantized as stored at its own bits or more, keyed `native`); while the asked-for model loads a
//!   ready one stands in (with none ready, a large-tier request waits for a small-tier model
//!   loading too, not for the large one), and `served_by` says which answered. A local model that failed to load
//!   is loaded again once its file changed (size, mtime or inode). `facts_of(key)` (the
//!   `Engine::facts` the router and the prompt budget use) gives a tier's parameter count, a
//!   mixture's active parameters and its prompt family (`load::facts_in`: one read of the GGUF
//!   header or the folder's `config.json` before the model loads, kept per path), bit width and
//!   device, without starting anything;
//!   the daemon's status carries it per model for `laya lsp`.
//! - `remote.rs`: `RemoteEngine`, the OpenAI completions client for a tier served elsewhere (vLLM,
//!   llama.cpp server): the prompt is sent as built, special tokens as text; `--remote-extra`
//!   adds server-specific fields (laya's own fields win).
//! - `synthetic.rs`: random weights of the catalog's shapes (3B, 32B, 30B-A3B…), quantized by the
//!   loader's policy, for speed runs where real weights cannot travel; and the tests' model files
//!   (tiny configurations, HF folders, a safetensors file of given tensors and the tiny shape the
//!   fetch and verification tests check it against).

pub mod cache;
pub mod cancel;
mod direct;
pub mod draft;
pub mod family;
pub mod generate;
pub mod hash;
pub mod load;
pub mod models;
pub mod paths;
pub mod pool;
pub mod prefix;
pub mod remote;
pub mod runtime;
pub mod sample;
pub mod synthetic;
pub mod testing;
pub mod tokenizer;
pub mod worker;

use std::{
    path::Path,
    time::{Duration, Instant},
};

pub use cancel::{Cancel, CancelOnDrop};
pub use generate::FinishReason;
pub use load::{LoadOptions, Precision};
pub use sample::SamplingParams;

use self::{
    generate::{Control, GenerateError, GenerateRequest},
    load::{EngineLoadError, Loaded},
    tokenizer::{SpecialTokens, TokenizerError},
};

/// Why an engine gave no answer, by what the caller can do about it: the seam's one error
/// type. The daemon's HTTP API maps each kind to a status code (`Cancelled` 499, `Unavailable`
/// 503, `Transport` 502, `BadRequest` 400) and the LSP logs the message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// The request was given up (its [`Cancel`] set) before it was answered.
    #[error("the request was cancelled")]
    Cancelled,
    /// No model can answer it: none is configured for the tier, it failed to load, its thread
    /// stopped, MLX failed while running it.
    #[error("{0}")]
    Unavailable(String),
    /// The way to the model broke: the daemon's socket, a remote server's HTTP.
    #[error("{0}")]
    Transport(String),
    /// The request cannot run as asked: no candidates, an empty or untokenizable prompt, ids
    /// outside the vocabulary.
    #[error("invalid request: {0}")]
    BadRequest(String),
}

impl From<EngineLoadError> for EngineError {
    fn from(e: EngineLoadError) -> Self {
        EngineError::Unavailable(e.to_string())
    }
}

impl From<TokenizerError> for EngineError {
    fn from(e: TokenizerError) -> Self {
        EngineError::BadRequest(e.to_string())
    }
}

impl From<GenerateError> for EngineError {
    /// A request the generator refuses is the caller's to fix; a model or MLX failure is not.
    fn from(e: GenerateError) -> Self {
        match e {
            GenerateError::Model(_) | GenerateError::Mlx(_) => EngineError::Unavailable(e.to_string()),
            _ => EngineError::BadRequest(e.to_string()),
        }
    }
}

/// The longest sequence (prompt and answer, in tokens) a served model runs by default
/// (`laya serve --max-seq-len`); what the catalog sizes a model's KV cache for.
pub const DEFAULT_MAX_SEQ_LEN: usize = 8192;

/// Which model of a pool: the size tier and the bit width.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// The fast model (~3–4B; here the 0.5B).
    Small,
    /// The strong model (~27–32B, or a remote server; here the 1.5B).
    Large,
}

impl Tier {
    pub fn label(self) -> &'static str {
        match self {
            Tier::Small => "small",
            Tier::Large => "large",
        }
    }
}

/// Text that does not parse as a [`Tier`], [`Precision`], [`ModelKey`],
/// [`DevicePref`](runtime::DevicePref), [`SpeculationChoice`](draft::SpeculationChoice) or a
/// remote server's extra body; the message says what was expected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParseError(pub String);

impl std::fmt::Display for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

impl std::str::FromStr for Tier {
    type Err = ParseError;

    /// `small` or `large`.
    fn from_str(s: &str) -> Result<Tier, ParseError> {
        match s {
            "small" => Ok(Tier::Small),
            "large" => Ok(Tier::Large),
            _ => Err(ParseError(format!("expected small or large, got `{s}`"))),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ModelKey {
    pub tier: Tier,
    pub precision: Precision,
}

/// `small/q8`: the tier, a slash and the bit width.
impl std::fmt::Display for ModelKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.tier, self.precision)
    }
}

impl std::str::FromStr for ModelKey {
    type Err = ParseError;

    /// `TIER/BITS`: `small/q4`, `large/q6`, `small/native`; the bits also as a bare number
    /// (`large/8`), as [`Precision`] reads them.
    fn from_str(s: &str) -> Result<ModelKey, ParseError> {
        let parsed = s
            .split_once('/')
            .and_then(|(t, b)| Some((t.parse().ok()?, b.parse().ok()?)));
        match parsed {
            Some((tier, precision)) => Ok(ModelKey { tier, precision }),
            None => Err(ParseError(format!(
                "expected TIER/BITS such as small/q4 or large/q6, got `{s}`"
            ))),
        }
    }
}

/// Where a model runs, for estimates of its speed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunsOn {
    /// MLX on the CPU.
    Cpu,
    /// MLX on a GPU (Metal or CUDA).
    Gpu,
    /// Another server (OpenAI API): its speed is known only once measured.
    Remote,
}

/// What is known of a model before a request goes to it: what the router weighs and the
/// prompt's budget is sized for.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ModelFacts {
    /// Parameter count: the loaded model's, or read from its file's header before loading.
    pub parameters: Option<u64>,
    /// Parameters a token runs through, for a mixture of experts (read from its file); `None`
    /// for a dense model, all of whose parameters run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_parameters: Option<u64>,
    /// Bits a weight is held in (4, 6, 8; 16 for the file's own precision).
    pub bits: u32,
    pub runs_on: RunsOn,
    /// Whose prompt format the model reads, from its file; the default for a remote server's
    /// model, which does not say.
    #[serde(default)]
    pub family: crate::family::Family,
}

/// Milliseconds a model takes per prompt token prefilled and per token decoded.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Speed {
    pub prefill_ms_per_token: f64,
    pub decode_ms_per_token: f64,
}

impl Speed {
    /// The time to prefill `prompt_tokens` and decode `tokens`.
    pub fn request_ms(&self, prompt_tokens: usize, tokens: usize) -> f64 {
        self.prefill_ms_per_token * prompt_tokens as f64 + self.decode_ms_per_token * tokens as f64
    }
}

impl ModelFacts {
    /// A first estimate of the model's speed from its size and where it runs, for the router
    /// before anything was measured (measurements replace it). Decode reads every weight once
    /// a token; prefill costs two operations a parameter a token. The rates are set from
    /// docs/benchmarks.md and err on the slow side:
    /// - CPU: MLX's CPU build (one thread, no AVX, a scalar quantized matmul that costs the
    ///   same per row at any batch) read 0.56 GB a token in 659 ms (0.5B q8) and 1.74 GB in
    ///   2,768 ms (1.5B q8), ~1.6 ms per MB, and prefilled at about the decode rate;
    /// - GPU: ~2.5 ms a token of kernel launches (a 3B decodes in 3.5 ms on an H200 with only
    ///   0.4 ms of weight reads) plus the weights at 400 GB/s (Apple's Max chips; an H200
    ///   reads 4.8 TB/s) and prefill at 0.3 ms a token per billion parameters (a 3B prefilled
    ///   ~7,000 tokens/s on the H200; Apple GPUs are several times slower).
    ///
    /// A mixture of experts is reckoned by the parameters a token runs through: the weights
    /// a decode step reads and the work of a prefill token.
    ///
    /// A remote server's speed is not estimated (`None`).
    pub fn estimated_speed(&self) -> Option<Speed> {
        let params = self.active_parameters.or(self.parameters)? as f64;
        let mb = params * self.bits as f64 / 8.0 / 1e6;
        match self.runs_on {
            RunsOn::Cpu => Some(Speed {
                prefill_ms_per_token: 1.6 * mb,
                decode_ms_per_token: 1.6 * mb,
            }),
            RunsOn::Gpu => Some(Speed {
                prefill_ms_per_token: 0.3 * params / 1e9,
                decode_ms_per_token: 2.5 + mb / 400.0,
            }),
            RunsOn::Remote => None,
        }
    }
}

/// One completion request, in engine terms.
#[derive(Clone, Debug)]
pub struct CompletionRequest {
    /// The model to run it on, for engines that hold several; `None`: the default one.
    pub model: Option<ModelKey>,
    /// The full prompt; special-token text such as `<|fim_prefix|>` is parsed as tokens.
    pub prompt: String,
    pub max_tokens: usize,
    /// Candidates sharing one prefill.
    pub n: usize,
    pub sampling: SamplingParams,
    /// A candidate ends before the first occurrence of any of these strings.
    pub stop: Vec<String>,
    /// A candidate ends where its lines say (a dedent, the suffix written again, a line
    /// count), checked as it is decoded: no token past that end is decoded. Engines that
    /// decode elsewhere ignore it (the caller's post-processing cuts there anyway).
    pub lines: LineEnd,
    /// Candidate `i` starts from the model's `i`-th most likely first token (candidate 0 is
    /// the greedy one when sampling is greedy), and each choice carries its log-probability,
    /// so that the caller can rank them. Engines that cannot do this ignore it.
    pub branch_first: bool,
}

impl CompletionRequest {
    /// One greedy candidate of at most `max_tokens` tokens after `prompt`, on the engine's
    /// default model, with no stop string; the other fields are set with struct update
    /// syntax (`CompletionRequest { n: 3, ..CompletionRequest::new(prompt, 48) }`).
    pub fn new(prompt: impl Into<String>, max_tokens: usize) -> CompletionRequest {
        CompletionRequest {
            model: None,
            prompt: prompt.into(),
            max_tokens,
            n: 1,
            sampling: SamplingParams::default(),
            stop: vec![],
            lines: LineEnd::default(),
            branch_first: false,
        }
    }
}

/// Where a candidate ends by the lines of its text. The candidate's first line (the rest of
/// the cursor's line) is never ended by the indentation or suffix rules; a line that ends the
/// candidate is not part of it, nor is the line break before it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LineEnd {
    /// End before the first later line that carries text and is indented by fewer bytes of
    /// leading whitespace than this: the cursor's block has ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedent_below: Option<usize>,
    /// End before the first later line whose text, leading whitespace aside, starts with this:
    /// the code after the cursor is being written again. Empty: no such end.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub repeats: String,
    /// End after this many lines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_lines: Option<usize>,
}

impl LineEnd {
    /// No rule: the candidate ends by its stop strings, tokens and limit alone.
    pub fn is_none(&self) -> bool {
        *self == LineEnd::default()
    }

    /// The byte offset where these rules end `text`, taken as a whole candidate's text.
    pub fn end_of(&self, text: &str) -> Option<usize> {
        match self.scan(text) {
            LineScan::End(at) => Some(at),
            LineScan::Open { .. } => None,
        }
    }

    /// Where `text` (a candidate's text so far) ends by these rules, or how much of it is
    /// final: a later line whose indentation or start is not known yet may still end the
    /// candidate, and then the line break before it goes too.
    fn scan(&self, text: &str) -> LineScan {
        let mut start = 0;
        let mut lines = 0;
        loop {
            let line_end = text[start..].find('\n').map(|i| start + i);
            let line = &text[start..line_end.unwrap_or(text.len())];
            if lines > 0 {
                let body = line.trim_start();
                let open = line_end.is_none();
                let blank = body.trim().is_empty();
                let dedents = self
                    .dedent_below
                    .is_some_and(|b| !blank && line.len() - body.len() < b);
                let repeats = !self.repeats.is_empty() && body.starts_with(self.repeats.as_str());
                if dedents || repeats {
                    return LineScan::End(start - 1);
                }
                // Not known yet: the indentation before any text, or a start that may become
                // the repeat.
                let undecided = open
                    && ((self.dedent_below.is_some() && blank)
                        || (!self.repeats.is_empty() && self.repeats.starts_with(body)));
                if undecided {
                    return LineScan::Open { settled: start - 1 };
                }
            }
            let Some(end) = line_end else {
                return LineScan::Open { settled: text.len() };
            };
            lines += 1;
            if self.max_lines.is_some_and(|m| lines >= m.max(1)) {
                return LineScan::End(end);
            }
            start = end + 1;
        }
    }
}

/// What [`LineEnd::scan`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LineScan {
    /// The candidate ends: its text is cut at this byte offset.
    End(usize),
    /// Not ended yet: the text up to this byte offset is final.
    Open { settled: usize },
}

#[derive(Clone, Debug)]
pub struct Choice {
    pub text: String,
    pub finish_reason: FinishReason,
    pub tokens: usize,
    /// With `branch_first`: the summed natural-log probability of the choice's tokens.
    pub logprob: Option<f32>,
}

/// Where the time of one request went.
#[derive(Clone, Debug, Default)]
pub struct Timing {
    pub prompt_tokens: usize,
    /// Prompt tokens taken from a cached prefix (no compute).
    pub reused_tokens: usize,
    /// Prompt tokens run through the model.
    pub prefilled_tokens: usize,
    pub generated_tokens: usize,
    pub prefill: Duration,
    pub decode: Duration,
    pub first_token: Duration,
    /// Forwards run after the prompt's: one per token after the first without drafts,
    /// fewer when the model accepts drafted tokens.
    pub decode_forwards: usize,
    /// Of `decode`: building and queueing the forwards on the host, and waiting for their
    /// tokens (the rest is turning tokens into text).
    pub decode_build: Duration,
    pub decode_wait: Duration,
    pub total: Duration,
}

impl Timing {
    /// Forwards that gave the generated tokens: the prompt's last one (which gives the first
    /// token) and the decode forwards after it. Without drafts as many as the tokens (one
    /// more where a stop token ended the answer).
    /// 0 where the engine does not count them (a remote server: several tokens and no
    /// decode forward, which no local model can do).
    pub fn forwards(&self) -> usize {
        match (self.generated_tokens, self.decode_forwards) {
            (0, 0) => 0,
            (n, 0) if n > 1 => 0,
            (_, f) => f + 1,
        }
    }
}

#[derive(Clone, Debug)]
pub struct CompletionOutput {
    /// The model that answered, where an engine holds several.
    pub served_by: Option<ModelKey>,
    pub choices: Vec<Choice>,
    pub timing: Timing,
}

/// Where an engine's model is in its life.
#[derive(Clone, Debug, PartialEq)]
pub enum ModelState {
    Loading,
    Ready {
        /// Reading (and converting) the weights.
        load_time: Duration,
        /// From the worker's start to ready: the device, the load and the warm-up.
        time_to_ready: Duration,
        /// The weights came from the converted-weights cache.
        from_cache: bool,
        device: String,
    },
    Failed(String),
}

impl ModelState {
    /// Ready at once, nothing loaded (a remote server, a test's engine).
    pub fn ready_on(device: impl Into<String>) -> ModelState {
        ModelState::Ready {
            load_time: Duration::ZERO,
            time_to_ready: Duration::ZERO,
            from_cache: false,
            device: device.into(),
        }
    }
}

/// What the completion pipeline needs from an engine: the in-process worker, the model pool,
/// the daemon client and a remote OpenAI-compatible server all provide it.
#[async_trait::async_trait]
pub trait Engine: Send + Sync + 'static {
    /// Run one request; cancelling `cancel` stops it: waiting for the model, between prompt
    /// chunks and between decode steps. Dropping the future cancels it too. With `pieces`,
    /// `(candidate, piece)` is also sent as text is decoded; a candidate's pieces concatenate
    /// to its final text. Engines that cannot stream send each candidate's whole text once it
    /// is done ([`send_whole`]).
    async fn complete(
        &self,
        req: CompletionRequest,
        cancel: Cancel,
        pieces: Option<PieceSender>,
    ) -> Result<CompletionOutput, EngineError>;

    fn state(&self) -> ModelState;

    /// What is known of the model that answers requests for `model` (its size, its bit width,
    /// where it runs, its prompt family), before any request goes to it; an engine of one
    /// model states that model's whatever the key. `None` where the engine cannot tell.
    fn facts(&self, model: ModelKey) -> Option<ModelFacts> {
        let _ = model;
        None
    }

    /// What a local model's worker has run; `None` for engines that run nothing here.
    fn work(&self) -> Option<worker::WorkStats> {
        None
    }
}

/// For an engine that cannot stream: sends each candidate's whole text to `pieces`, once the
/// answer is there.
pub fn send_whole(out: &CompletionOutput, pieces: Option<&PieceSender>) {
    let Some(tx) = pieces else { return };
    for (i, c) in out.choices.iter().enumerate() {
        if !c.text.is_empty() {
            let _ = tx.send((i, c.text.clone()));
        }
    }
}

/// Where streamed text goes: `(candidate index, piece)`.
pub type PieceSender = tokio::sync::mpsc::UnboundedSender<(usize, String)>;

/// A loaded model with its tokenizer: what a model worker thread owns.
pub struct LocalModel {
    pub loaded: Loaded,
    pub specials: SpecialTokens,
    /// Prompts (and continuations) already run, with their KV caches.
    prefix: std::sync::Mutex<prefix::PrefixStore>,
    /// Drafts for decoding, resolved for the device the model runs on.
    speculation: draft::Speculation,
}

impl LocalModel {
    pub fn load(path: &Path, opts: &LoadOptions) -> Result<LocalModel, EngineLoadError> {
        let loaded = load::load(path, opts)?;
        let specials = loaded.tokenizer.special_tokens(loaded.family)?;
        Ok(LocalModel {
            loaded,
            specials,
            prefix: std::sync::Mutex::new(prefix::PrefixStore::new(opts.prefix)),
            speculation: opts.speculation.resolve(),
        })
    }

    /// What the router and the prompt budget weigh: the parameter count (and a mixture's
    /// active one), the bit width, the device and the prompt family of the loaded model.
    pub fn facts(&self) -> ModelFacts {
        let config = self.loaded.model.config();
        let active = config.active_parameters();
        ModelFacts {
            parameters: Some(config.parameters()),
            active_parameters: (active != config.parameters()).then_some(active),
            bits: self.loaded.precision.bits().map_or(16, |b| b as u32),
            runs_on: if models::on_gpu() {
                RunsOn::Gpu
            } else {
                RunsOn::Cpu
            },
            family: self.specials.family,
        }
    }

    /// Run a short request once, so the first real one does not pay for kernel compilation
    /// and buffer allocation (MLX compiles GPU kernels at first use); its prompt starts with
    /// [`warm_up_source`]. On a GPU a second, long one follows ([`long_warm_up_source`]): a
    /// prompt of several prefill chunks whose answer is decoded over more than 1,024 keys
    /// (MLX's CUDA attention switches kernels there) and, with drafts, checked several tokens
    /// a forward. Returns the whole duration.
    pub fn warmup(&self) -> Result<Duration, EngineError> {
        let start = Instant::now();
        let mut bodies = vec![(warm_up_source(), 2)];
        if models::on_gpu() {
            bodies.push((long_warm_up_source(), 8));
        }
        for (body, max_tokens) in bodies {
            let req = CompletionRequest::new(
                self.specials
                    .family
                    .fim()
                    .fim(&format!("{body}def add(a, b):\n    return"), "\n"),
                max_tokens,
            );
            self.complete(&req, &Cancel::new())?;
        }
        if models::on_gpu() {
            self.warm_row_counts()?;
        }
        Ok(start.elapsed())
    }

    /// Runs a forward of each row count in [`WARM_ROWS`] on fresh caches. MLX's CUDA backend
    /// compiles its quantized matrix product for a tile of 16, 32 or 64 rows (fewer than 8 take
    /// the matrix-vector kernel): a prompt's last chunk can be any length, and the first one
    /// of a new tile size cost 28 s on a fresh H100 (no compiled kernels on disk yet) when a
    /// request paid for it.
    fn warm_row_counts(&self) -> Result<(), EngineError> {
        let ids = self.loaded.tokenizer.encode(&warm_up_source_for_rows(), false)?;
        for &rows in WARM_ROWS {
            let Some(chunk) = ids.get(..rows) else {
                return Err(EngineError::Unavailable(format!(
                    "warm-up text has {} tokens, fewer than {rows}",
                    ids.len()
                )));
            };
            let mut caches = self.loaded.model.new_caches();
            generate::prefill(&self.loaded.model, &mut caches, chunk, &Cancel::new())?;
        }
        Ok(())
    }

    /// Run one completion, reusing the longest prefix of the prompt already run. `cancel` is
    /// checked between prefill chunks and decode steps.
    pub fn complete(
        &self,
        req: &CompletionRequest,
        cancel: &Cancel,
    ) -> Result<CompletionOutput, EngineError> {
        self.complete_streaming(req, cancel, |_, _| {})
    }

    /// [`complete`](Self::complete), also handing each candidate's text to `on_piece` as it is
    /// decoded: `(candidate, piece)`, pieces in order, never part of a stop string and never a
    /// split character. A candidate's pieces concatenate to its final `text`.
    pub fn complete_streaming(
        &self,
        req: &CompletionRequest,
        cancel: &Cancel,
        mut on_piece: impl FnMut(usize, &str),
    ) -> Result<CompletionOutput, EngineError> {
        let start = Instant::now();
        if req.n == 0 {
            return Err(EngineError::BadRequest("n must be at least 1".into()));
        }
        let tokenizer = &self.loaded.tokenizer;
        let ids = tokenizer.encode(&req.prompt, true)?;
        if ids.is_empty() {
            return Err(EngineError::BadRequest("the prompt is empty".into()));
        }
        let greq = GenerateRequest {
            max_tokens: req.max_tokens,
            n: req.n,
            sampling: req.sampling.clone(),
            stop_token_ids: self.specials.eog.clone(),
            branch_first: req.branch_first,
            speculation: self.speculation,
            history: vec![],
        };
        let mut texts = StopScanner::new(tokenizer, req.n, &req.stop, &req.lines);
        let (out, reused) = prefix::generate_with_store(
            &self.loaded.model,
            Some(&self.prefix),
            &ids,
            &greq,
            cancel,
            |i, tok| {
                let control = texts.push(i, tok);
                if let Some(piece) = texts.settled(i, false) {
                    on_piece(i, piece);
                }
                control
            },
        )?;
        for i in 0..req.n {
            if let Some(piece) = texts.settled(i, true) {
                on_piece(i, piece);
            }
        }
        let choices = out
            .candidates
            .iter()
            .zip(&out.finish_reasons)
            .enumerate()
            .map(|(i, (toks, reason))| Choice {
                text: texts.text(i),
                finish_reason: *reason,
                tokens: toks.len(),
                logprob: req.branch_first.then(|| out.logprobs[i]),
            })
            .collect();
        Ok(CompletionOutput {
            served_by: None,
            choices,
            timing: Timing {
                prompt_tokens: ids.len(),
                reused_tokens: reused,
                prefilled_tokens: out.prefill_tokens,
                generated_tokens: out.candidates.iter().map(Vec::len).sum(),
                prefill: out.prefill_time,
                decode: out.decode_time,
                first_token: out.first_token_time,
                decode_forwards: out.decode_forwards,
                decode_build: out.decode_build_time,
                decode_wait: out.decode_wait_time,
                total: start.elapsed(),
            },
        })
    }
}

/// Turns each candidate's tokens into text as they arrive (never splitting a UTF-8
/// character) and stops a candidate at the first stop string or where its [`LineEnd`] says.
struct StopScanner<'t> {
    decoders: Vec<tokenizer::StreamDecoder<'t>>,
    texts: Vec<String>,
    stopped: Vec<bool>,
    /// Bytes of each text already handed out by [`settled`](Self::settled).
    settled: Vec<usize>,
    stop: &'t [String],
    lines: &'t LineEnd,
}

impl<'t> StopScanner<'t> {
    fn new(tokenizer: &'t tokenizer::Tokenizer, n: usize, stop: &'t [String], lines: &'t LineEnd) -> Self {
        StopScanner {
            decoders: (0..n).map(|_| tokenizer.stream_decoder()).collect(),
            texts: vec![String::new(); n],
            stopped: vec![false; n],
            settled: vec![0; n],
            stop,
            lines,
        }
    }

    /// Text of candidate `i` that is final and not yet handed out: all of it once the
    /// candidate stopped or `end` is set; otherwise all but the bytes a stop string that
    /// starts there could still claim. `None` when there is nothing new.
    fn settled(&mut self, i: usize, end: bool) -> Option<&str> {
        let text = &self.texts[i];
        let mut upto = if end || self.stopped[i] {
            text.len()
        } else {
            let longest = self.stop.iter().map(String::len).max().unwrap_or(0);
            let by_stop = text.len().saturating_sub(longest.saturating_sub(1));
            match self.lines.scan(text) {
                LineScan::Open { settled } => by_stop.min(settled),
                LineScan::End(_) => by_stop,
            }
        };
        while !text.is_char_boundary(upto) {
            upto -= 1;
        }
        let from = self.settled[i];
        if upto <= from {
            return None;
        }
        self.settled[i] = upto;
        Some(&text[from..upto])
    }

    fn push(&mut self, i: usize, token: u32) -> Control {
        if self.stopped[i] {
            return Control::Stop;
        }
        let piece = self.decoders[i].push(token);
        let before = self.texts[i].len();
        self.texts[i].push_str(&piece);
        // A stop string may straddle pieces: search from where it could start.
        let longest = self.stop.iter().map(String::len).max().unwrap_or(0);
        let mut from = before.saturating_sub(longest);
        while !self.texts[i].is_char_boundary(from) {
            from -= 1;
        }
        let hit = self
            .stop
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| self.texts[i][from..].find(s.as_str()))
            .min();
        if let Some(at) = hit {
            self.texts[i].truncate(from + at);
            self.stopped[i] = true;
        }
        if let LineScan::End(at) = self.lines.scan(&self.texts[i]) {
            self.texts[i].truncate(at);
            self.stopped[i] = true;
        }
        if self.stopped[i] {
            return Control::Stop;
        }
        Control::Continue
    }

    fn text(&self, i: usize) -> String {
        self.texts[i].clone()
    }
}

/// Row counts of the forwards [`LocalModel::warmup`] runs on a GPU, one in each of MLX CUDA's
/// tile sizes for quantized matrix products (up to 16, 32 and 64 rows).
const WARM_ROWS: &[usize] = &[12, 24, 48];

/// Text for [`WARM_ROWS`]'s forwards: more tokens than the largest.
fn warm_up_source_for_rows() -> String {
    scale_functions(4)
}

/// Python code to start a warm-up prompt with (the engine's at load, `laya bench typing`'s
/// untimed trace). On a GPU a few hundred tokens: MLX's CUDA backend builds another
/// matrix-product kernel for more than 16 rows, which every cold prompt uses (3.3 s on an H200
/// when a real request paid for it). Empty on the CPU, which compiles nothing.
pub fn warm_up_source() -> String {
    scale_functions(if models::on_gpu() { 12 } else { 0 })
}

/// Python code for the long warm-up prompt on a GPU (about 2,300 tokens: more than four
/// 512-token prefill chunks); empty on the CPU.
pub fn long_warm_up_source() -> String {
    scale_functions(if models::on_gpu() { 100 } else { 0 })
}

fn scale_functions(n: usize) -> String {
    (0..n)
        .map(|i| format!("def scale_{i}(values, factor={i}):\n    return [v * factor for v in values]\n\n\n"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::{tests::any_vocabulary, Tokenizer};

    #[test]
    fn the_row_count_warm_up_text_has_a_token_for_every_row() {
        // The real vocabulary (with the switch on) merges the most, so it is the one that
        // could fall short.
        for tok in any_vocabulary() {
            let ids = tok.encode(&warm_up_source_for_rows(), false).unwrap();
            let most = WARM_ROWS.iter().max().unwrap();
            assert!(ids.len() >= *most, "{} tokens, {most} rows", ids.len());
        }
    }

    /// Feed `text` token by token as candidate 0; returns (kept text, tokens pushed before Stop).
    fn scan(tok: &Tokenizer, text: &str, stop: &[String]) -> (String, Option<usize>) {
        scan_lines(tok, text, stop, &LineEnd::default())
    }

    fn scan_lines(tok: &Tokenizer, text: &str, stop: &[String], lines: &LineEnd) -> (String, Option<usize>) {
        let ids = tok.encode(text, false).unwrap();
        let mut s = StopScanner::new(tok, 1, stop, lines);
        let stopped_at = ids.iter().position(|&id| s.push(0, id) == Control::Stop);
        (s.text(0), stopped_at)
    }

    fn block(indent: usize) -> LineEnd {
        LineEnd {
            dedent_below: Some(indent),
            ..LineEnd::default()
        }
    }

    #[test]
    fn a_block_ends_at_the_first_later_line_indented_less_than_the_block() {
        let body = "x = 1\n    if x:\n        y = 2\n\n    return y\ndef g():\n    pass\n";
        let rule = block(4);
        assert_eq!(
            rule.end_of(body).map(|at| &body[..at]),
            Some("x = 1\n    if x:\n        y = 2\n\n    return y")
        );
        // The first line is the rest of the cursor's line: never ended by its indentation.
        assert_eq!(rule.end_of("x\n    y"), None);
        assert_eq!(rule.end_of("\n  y"), Some(0));
        // Blank and whitespace-only lines do not end a block.
        assert_eq!(rule.end_of("a\n\n  \n    b\n"), None);
        // A line whose text has not come yet is open, its line break held back.
        let open = "a\n    b\n  ";
        assert_eq!(
            rule.scan(open),
            LineScan::Open {
                settled: open.len() - 3
            }
        );
        assert_eq!(rule.scan("a\n    b"), LineScan::Open { settled: 7 });
    }

    #[test]
    fn a_candidate_ends_where_it_writes_the_suffix_again_or_at_its_line_limit() {
        let rule = LineEnd {
            repeats: "return y".into(),
            ..LineEnd::default()
        };
        // The first line may start with it (it continues the cursor's line).
        assert_eq!(rule.end_of("return y\nz"), None);
        let t = "y = 1\n    return y\n";
        assert_eq!(rule.end_of(t), Some(5));
        // A prefix of the repeat is held back until it is decided either way.
        assert_eq!(rule.scan("y = 1\n    retu"), LineScan::Open { settled: 5 });
        assert_eq!(rule.scan("y = 1\n    retx"), LineScan::Open { settled: 14 });
        let two = LineEnd {
            max_lines: Some(2),
            ..LineEnd::default()
        };
        assert_eq!(two.end_of("a\nb\nc"), Some(3));
        assert_eq!(two.end_of("a\nb"), None);
        assert!(LineEnd::default().is_none() && !two.is_none());
    }

    #[test]
    fn a_line_end_stops_decoding_at_the_token_that_decides_it_and_streams_only_what_stays() {
        for tok in any_vocabulary() {
            let text = "total = 0\n    for v in values:\n        total += v\n    return total\ndef other():\n    pass\n";
            let (kept, at) = scan_lines(&tok, text, &[], &block(4));
            assert_eq!(
                kept,
                "total = 0\n    for v in values:\n        total += v\n    return total"
            );
            let ids = tok.encode(text, false).unwrap();
            // Stopped on the token that brought `def`'s first character, not at the end.
            let stopped = at.expect("stopped");
            assert!(stopped + 1 < ids.len(), "{stopped} of {}", ids.len());
            let decided = tok.decode(&ids[..=stopped]);
            assert!(decided.contains("\nd"), "{decided:?}");
            assert!(!tok.decode(&ids[..stopped]).contains("\nd"));
            // Streamed pieces never hold what is cut.
            let lines = block(4);
            let mut s = StopScanner::new(&tok, 1, &[], &lines);
            let mut streamed = String::new();
            for &id in &ids {
                let c = s.push(0, id);
                if let Some(p) = s.settled(0, false) {
                    streamed.push_str(p);
                    assert!(kept.starts_with(&streamed), "{streamed:?}");
                }
                if c == Control::Stop {
                    break;
                }
            }
            if let Some(p) = s.settled(0, true) {
                streamed.push_str(p);
            }
            assert_eq!(streamed, kept);
        }
    }

    #[test]
    fn stop_strings_end_a_candidate_before_the_match_even_across_tokens() {
        for tok in any_vocabulary() {
            let stop = vec!["\n\n".to_owned(), "def ".to_owned()];
            let (text, at) = scan(&tok, "x = 1\ny = 2\n\nprint(x)", &stop);
            assert_eq!(text, "x = 1\ny = 2");
            assert!(at.is_some());
            let (text, _) = scan(&tok, "return a + b\ndef g():", &stop);
            assert_eq!(text, "return a + b\n");
            let (text, at) = scan(&tok, "no stop here", &stop);
            assert_eq!((text.as_str(), at), ("no stop here", None));
        }
    }

    #[test]
    fn settled_pieces_concatenate_to_the_final_text_and_never_hold_a_stop_string() {
        for tok in any_vocabulary() {
            let stop = vec!["\n\n".to_owned(), "def ".to_owned()];
            for text in [
                "x = 1\ny = 2\n\nprint(x)",
                "return a + b\ndef g():",
                "naïve 🙂 café",
                "no stop",
            ] {
                let ids = tok.encode(text, false).unwrap();
                let none = LineEnd::default();
                let mut s = StopScanner::new(&tok, 1, &stop, &none);
                let mut streamed = String::new();
                for &id in &ids {
                    let c = s.push(0, id);
                    if let Some(p) = s.settled(0, false) {
                        assert!(!p.contains("\n\n") && !p.contains("def "), "{p:?}");
                        streamed.push_str(p);
                    }
                    if c == Control::Stop {
                        break;
                    }
                }
                if let Some(p) = s.settled(0, true) {
                    streamed.push_str(p);
                }
                assert_eq!(streamed, s.text(0), "{text:?}");
            }
        }
    }

    #[test]
    fn model_keys_tiers_and_precisions_read_back_what_they_write() {
        for tier in [Tier::Small, Tier::Large] {
            assert_eq!(tier.to_string().parse::<Tier>(), Ok(tier));
            for precision in [Precision::Native, Precision::Q4, Precision::Q6, Precision::Q8] {
                assert_eq!(precision.to_string().parse::<Precision>(), Ok(precision));
                let key = ModelKey { tier, precision };
                assert_eq!(key.to_string().parse::<ModelKey>(), Ok(key));
            }
        }
        let large_q6 = ModelKey {
            tier: Tier::Large,
            precision: Precision::Q6,
        };
        assert_eq!(large_q6.to_string(), "large/q6");
        assert_eq!(
            "large/6".parse::<ModelKey>(),
            Ok(large_q6),
            "bits as a bare number"
        );
        assert_eq!("8".parse::<Precision>(), Ok(Precision::Q8));
        assert_eq!(
            "small/native".parse::<ModelKey>().map(|k| k.precision),
            Ok(Precision::Native)
        );
        for bad in [
            "",
            "small",
            "small/",
            "/q4",
            "medium/q4",
            "small/q5",
            "small/q4/x",
            "Small/q4",
            " small/q4",
        ] {
            let err = bad.parse::<ModelKey>().unwrap_err();
            assert!(
                err.0.contains("TIER/BITS") && err.0.contains(&format!("`{bad}`")),
                "{bad}: {err}"
            );
        }
        assert!("q5"
            .parse::<Precision>()
            .unwrap_err()
            .0
            .contains("native, q4, q6 or q8"));
        assert!("medium".parse::<Tier>().is_err());
    }

    #[test]
    fn device_preferences_read_back_what_they_write() {
        use runtime::DevicePref;
        for d in [DevicePref::Auto, DevicePref::Cpu, DevicePref::Gpu] {
            assert_eq!(d.to_string().parse::<DevicePref>(), Ok(d));
        }
        assert_eq!(DevicePref::default(), DevicePref::Auto);
        assert!("tpu"
            .parse::<DevicePref>()
            .unwrap_err()
            .0
            .contains("auto, cpu or gpu"));
    }

    #[test]
    fn stop_scanner_keeps_multibyte_text_whole() {
        for tok in any_vocabulary() {
            let (text, _) = scan(&tok, "naïve 🙂 café — ok", &["—".to_owned()]);
            assert_eq!(text, "naïve 🙂 café ");
        }
    }
}
