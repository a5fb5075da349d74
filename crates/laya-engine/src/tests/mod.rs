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

/// What a llama.cpp peer script printed: the prompt's ids, llama.cpp's logits at every prompt
/// position (row after row) and its greedy tokens.
pub(crate) struct PeerRun {
    pub(crate) prompt_ids: Vec<u32>,
    pub(crate) logits: Vec<f32>,
    pub(crate) generated: Vec<u32>,
}

/// What a peer script starts with: its imports and a vocabulary of printable ASCII, the newline,
/// one merge (`ĠĠ`) and Qwen's control tokens (`tokens`, `types`, `specials`), every token
/// decoding to one ASCII character.
const PEER_HEAD: &str = r##"import json, sys
import numpy as np
import gguf

def byte_chars():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b); cs.append(256 + n); n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}

chars = byte_chars()
specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|fim_prefix|>", "<|fim_middle|>",
            "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]
tokens = [chars[b] for b in [0x0A] + list(range(0x20, 0x7F))] + ["\u0120\u0120"] + specials
types = [1] * (len(tokens) - len(specials)) + [3] * len(specials)
"##;

/// What a peer script ends with, once it has written the GGUF at `path`: llama.cpp runs it on
/// `prompt` and greedily for `n_gen` tokens, with an f32 KV cache (ggml type 0, not llama.cpp's
/// default f16: the comparison is of f32 math), and prints the JSON [`llama_cpp_peer`] reads.
const PEER_RUN: &str = r##"
import llama_cpp
llm = llama_cpp.Llama(model_path=path, n_ctx=256, n_threads=2, logits_all=True, verbose=False, type_k=0, type_v=0)
ids = llm.tokenize(prompt.encode(), add_bos=False, special=True)
llm.eval(ids)
prompt_logits = llm.scores[: len(ids)].tolist()
out = []
for _ in range(n_gen):
    t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    out.append(t)
    llm.eval([t])
json.dump({"prompt_ids": ids, "prompt_logits": prompt_logits, "generated": out}, sys.stdout)
"##;

/// Runs `script` (between [`PEER_HEAD`] and [`PEER_RUN`], written to a file) with the llama.cpp
/// peer's Python and `args`, and reads the JSON it prints (`prompt_ids`, `prompt_logits`,
/// `generated`); `None`, the test skipped, without the peer ([`crate::testing::peer_python`]).
pub(crate) fn llama_cpp_peer(script: &str, args: &[&str]) -> Option<PeerRun> {
    let python = crate::testing::peer_python()?;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("peer.py");
    std::fs::write(&file, format!("{PEER_HEAD}{script}{PEER_RUN}")).unwrap();
    let out = std::process::Command::new(python)
        .arg(&file)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the peer failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        let a = v.as_array().unwrap();
        a.iter().map(|x| x.as_u64().unwrap() as u32).collect()
    };
    let rows = v["prompt_logits"].as_array().unwrap().iter();
    Some(PeerRun {
        prompt_ids: ids(&v["prompt_ids"]),
        logits: rows
            .flat_map(|row| row.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32))
            .collect(),
        generated: ids(&v["generated"]),
    })
}

/// `model`'s logits at every position of `ids` against `peer`'s: the largest difference (printed
/// under `what`, with the peer logits' standard deviation) and laya's logits.
pub(crate) fn logits_against_peer(
    model: &crate::models::Model,
    ids: &[u32],
    peer: &PeerRun,
    what: &str,
) -> (f32, mlx_rs::Array) {
    use crate::models::test_util::{max_abs_diff, tokens};
    let got = model.forward_all(&tokens(ids), &mut model.new_caches()).unwrap();
    let want = mlx_rs::Array::from_slice(&peer.logits, got.shape());
    let diff = max_abs_diff(&got, &want);
    let spread = mlx_rs::ops::std(&want, None, None).unwrap().item_exact::<f32>();
    eprintln!(
        "{what}: {} prompt positions, max |laya - llama.cpp| = {diff:e} (logits' std {spread})",
        ids.len()
    );
    (diff, got)
}

/// `model`'s `n` greedy tokens after `ids`, a forward a token through its caches.
pub(crate) fn greedy_tokens(model: &crate::models::Model, ids: &[u32], n: usize) -> Vec<u32> {
    use crate::models::test_util::tokens;
    use mlx_rs::ops::indexing::argmax_axis;
    let mut caches = model.new_caches();
    let mut logits = model.forward(&tokens(ids), &mut caches).unwrap();
    let mut out = vec![];
    for _ in 0..n {
        let t = argmax_axis(&logits, -1, None).unwrap().item_exact::<u32>();
        out.push(t);
        logits = model.forward(&tokens(&[t]), &mut caches).unwrap();
    }
    out
}

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
