//! The inference engine: loads Qwen models into MLX and generates tokens. It knows
//! nothing of editors, LSP or HTTP.

pub mod runtime;
