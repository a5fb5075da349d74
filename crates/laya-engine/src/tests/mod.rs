//! The engine's tests that span its modules, run by `cargo test -p laya-engine`: the MLX ops
//! against plain f32 references (`mlx_ops`: matmul, quantized products at 4/6/8 bits,
//! rms_norm, RoPE, attention with causal masks and GQA, the strided inputs the model feeds MLX,
//! decode steps over the KV cache), broken model files (`engine_load`: missing, truncated,
//! corrupt, of the wrong kind), safetensors folders (`engine_safetensors`: HF bf16 and
//! mlx-community quantized, sharded, in the pool), agreement with llama.cpp on the real 0.5B
//! (`engine_reference`, with `tests/data/reference-0.5b.json`), with mlx-lm's Qwen3.5 on
//! tiny models (`engine_qwen35`, with `tests/data/qwen35-reference.json`) and with llama.cpp on
//! tiny Qwen3.5 / Qwen3.5-MoE / Qwen3-Next GGUFs (`engine_qwen35_gguf`).
//!
//! Invariants: every test that builds MLX graphs takes [`mlx`] first, which also selects the
//! device `LAYA_DEVICE` names (default cpu), so `scripts/gpu/cuda-ops.sh` runs `mlx_ops::` on
//! a GPU; a test of the real model asks [`real_05b`] and, without `LAYA_TEST_REAL_MODELS=1`,
//! is skipped, saying so.

mod engine_load;
mod engine_qwen35;
mod engine_qwen35_gguf;
mod engine_reference;
mod engine_safetensors;
mod mlx_ops;

use std::path::PathBuf;

use crate::testing::{mlx, Backend};

/// The real Qwen2.5-Coder 0.5B GGUF of the model directory: `None` (the test is skipped, and
/// says so) unless `LAYA_TEST_REAL_MODELS=1`; with it, a missing file fails the test.
#[track_caller]
fn real_05b() -> Option<PathBuf> {
    use crate::load::gguf::tests::{real_model_path, MODEL_05B};
    real_model_path(MODEL_05B)
}

use crate::synthetic::gguf::Lcg;

fn max_abs(a: &[f32]) -> f32 {
    a.iter().fold(0f32, |m, x| m.max(x.abs()))
}

/// max |got - want| / max |want|; lengths must agree.
fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len(), "length mismatch");
    let d = got.iter().zip(want).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    d / max_abs(want).max(1e-12)
}

#[track_caller]
fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    let e = rel_err(got, want);
    eprintln!("{what}: rel err {e:.3e} (tol {tol:.0e})");
    assert!(e <= tol, "{what}: relative error {e:.3e} > {tol:.0e}");
}
