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
//! - `seam.rs` holds the `Engine` trait the completion pipeline uses and the plain types it
//!   speaks (`CompletionRequest`, `CompletionOutput`, `EngineError`, `ModelKey`, `ModelFacts`,
//!   `ModelState`, `PieceSender`…), at the bottom of the crate: it imports no other module but
//!   `cancel` and `family`. `local.rs` holds `LocalModel`, one loaded model answering a request on
//!   the calling thread (tokens to texts, stop strings, line ends, warm-up). `cancel.rs` holds
//!   `Cancel` (its own doc says who sets and reads it). `lib.rs` only declares the modules and
//!   re-exports what `laya` uses.
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
//!   is loaded again once its file changed (size, mtime or inode). The pool is the one owner of
//!   what a model is: its `Engine::facts(key)` (what the router and the prompt budget use) gives
//!   a tier's parameter count, a mixture's active parameters and its prompt family
//!   (`load::facts_in`: one read of the GGUF header or the folder's `config.json` before the
//!   model loads, kept per path), bit width and device, without starting anything, and
//!   `Engine::work(key)` what the model's worker ran; the daemon asks it through the seam and its
//!   status carries the answer for every key to `laya lsp`.
//! - `remote.rs`: `RemoteEngine`, the OpenAI completions client for a tier served elsewhere (vLLM,
//!   llama.cpp server): the prompt is sent as built, special tokens as text; `--remote-extra`
//!   adds server-specific fields (laya's own fields win).
//! - `synthetic/`: random weights of the catalog's shapes (3B, 32B, 30B-A3B…), quantized by the
//!   loader's policy, for speed runs where real weights cannot travel; and the tests' model files
//!   (tiny configurations, HF folders, a safetensors file of given tensors and the tiny shape the
//!   fetch and verification tests check it against; `gguf.rs`: the tiny GGUF that writes `a`
//!   forever and a vocabulary-only GGUF, which the engine's tests and laya's share).
//! - `measure.rs`: what `laya bench engine` times on a model (prefill, decode after a short and
//!   a long prompt, the bandwidth floor, a decode step's ops, a full draft's check, cancel →
//!   free) and the rows it prints; `laya` picks the models and the llama.cpp peer.
//! - `tests/`: the tests that span modules (MLX ops against f32 references, broken files,
//!   safetensors folders, agreement with llama.cpp on the real 0.5B); `mod.rs` says which.

#![deny(unreachable_pub)]

// The seam, at the bottom: every module may import it, it imports none of them back.
mod cancel;
mod seam;

// Private: caches, generation, drafts, sampling, the tokenizer, one loaded model. The few of
// their items laya uses are re-exported below.
mod cache;
mod direct;
mod draft;
mod generate;
mod local;
mod prefix;
mod sample;
#[cfg(test)]
mod tests;
mod tokenizer;

// Modules laya reaches by name; inside each, `pub` marks what laya uses (or what a `pub`
// item's signature shows), everything else is `pub(crate)`.
pub mod family;
pub mod hash;
pub mod load;
pub mod measure;
pub mod models;
pub mod paths;
pub mod pool;
pub mod remote;
pub mod runtime;
pub mod synthetic;
pub mod testing;
pub mod worker;

// The face's items from private modules and the seam.
pub use cache::STEP as KV_CACHE_STEP;
pub use cancel::{Cancel, CancelOnDrop};
pub use draft::SpeculationChoice;
pub use generate::PREFILL_CHUNK;
pub use load::LoadOptions;
pub use local::{warm_up_source, LocalModel};
pub use prefix::PrefixLimits;
pub use seam::{
    send_whole, Choice, CompletionOutput, CompletionRequest, Engine, EngineError, FinishReason, LineEnd,
    ModelFacts, ModelKey, ModelState, ParseError, PieceSender, Precision, RunsOn, SamplingParams, Speed,
    Tier, Timing, WorkStats, DEFAULT_MAX_SEQ_LEN,
};
pub use tokenizer::Tokenizer;
