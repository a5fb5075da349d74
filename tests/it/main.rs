//! laya's integration tests: one test binary, one module per subject, and `support` for
//! what they share (the MLX lock and the CPU classes, the fake engine, the OpenAI-compatible
//! stub, the LSP clients, `laya` processes, the tiny GGUF).
//!
//! `cargo test --release --locked --test it` runs them all; `--test it lsp_transport::` one
//! module; `--test it NAME` the tests whose path contains NAME.

mod support;

mod cli;
mod daemon;
mod engine_load;
mod engine_reference;
mod engine_safetensors;
mod faults;
mod fetch_hub;
mod fuzz_lsp;
mod golden_prompts;
mod lsp_server;
mod lsp_transport;
mod mlx_ops;
mod remote_llama_cpp;
mod security;
mod service;
mod soak;
mod stale_work;
mod workspace_context;
