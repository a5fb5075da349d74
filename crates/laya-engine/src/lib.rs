//! laya's inference engine: loads Qwen models into MLX and generates text. A request is a
//! prompt string (special-token text parsed) and sampling parameters; an answer is texts with
//! a `Timing`. It knows nothing of editors, LSP, HTTP or the catalog.
//!
//! Boundary: this crate imports nothing from `laya` (Cargo forbids the cycle). This file only
//! declares the modules and re-exports the face `laya` uses (the seam's types, `Cancel`,
//! `LocalModel`, `Tokenizer`, a few settings and constants); the seam, generation, caches,
//! drafts, sampling, the tokenizer and the direct mlx-c calls are private modules; inside the
//! public ones `pub` marks what `laya` uses, and `#![deny(unreachable_pub)]` rejects any other
//! `pub`.
//!
//! Invariant: the tokens are those of plain greedy decoding whatever the drafts and the
//! prefix reuse.
//!
//! Where to start reading, top down: `seam` (the `Engine` trait and the plain types it
//! speaks), `pool` (models by tier and bits), `worker` (one model on its own thread), `local`
//! (one loaded model answering a request), `generate` (prefill and decode), `prefix` (KV
//! caches reused across requests); then `load/` (files to weights) and `models/` (the
//! forward pass). ARCHITECTURE.md is the map; each module's doc has its mechanics.

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
