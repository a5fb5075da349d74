//! A step's attention input as one MLX primitive of laya's own (`csrc/rope_kv.cpp`): RoPE on
//! the q and k heads and the k and v positions written into the layer's KV buffers in place.
//! It stands for six ops of the reference path (two splits, RoPE, two slice updates and the
//! two slices attention reads; `AttentionCore::rope` and `KvCache::update_and_fetch`), which
//! the host builds one by one every layer of every step.
//!
//! It runs on CUDA, where the host's time per op is what a decode step waits on (issue-level
//! detail in docs/decisions.md, "A decode step's ops"). The ops stay the path on the CPU and
//! on Metal, and the reference: tests compare the two on the CPU (the primitive's CPU side)
//! and on every CUDA run (its GPU side). Built on Linux only (`cfg(laya_primitives)`, set by
//! build.rs where the linked MLX's headers are at hand).

use mlx_rs::error::Result;
use mlx_rs::{Array, Dtype};

/// Whether the primitive can take these heads: a float dtype, an even head size, RoPE over
/// all of it.
pub(crate) fn fits(heads: &Array, rope_dims: i32, head_dim: i32) -> bool {
    rope_dims == head_dim
        && head_dim % 2 == 0
        && heads.ndim() == 4
        && matches!(heads.dtype(), Dtype::Float32 | Dtype::Bfloat16 | Dtype::Float16)
}

/// What the primitive gives: q roped `[B, H, L, D]`, the k and v buffers with the positions
/// `[offset, offset + L)` written, and views of their first `offset + L` positions.
pub(crate) struct Written {
    pub q: Array,
    pub k_buf: Array,
    pub v_buf: Array,
    pub keys: Array,
    pub values: Array,
}

#[cfg(laya_primitives)]
extern "C" {
    fn laya_rope_kv_write(
        outs: *mut mlx_sys::mlx_array,
        heads: mlx_sys::mlx_array,
        k_buf: mlx_sys::mlx_array,
        v_buf: mlx_sys::mlx_array,
        n_heads: i32,
        n_kv_heads: i32,
        offset: i32,
        theta: f32,
        in_place: i32,
        stream: mlx_sys::mlx_stream,
        error: *mut std::ffi::c_char,
        error_len: usize,
    ) -> i32;
}

/// `heads` `[B, H + 2 KV, L, D]` (q, then k, then v heads) with RoPE at positions from
/// `offset`, k and v written into `k_buf` and `v_buf` `[B, KV, Cap, D]` there: in place when
/// `in_place` (nothing else holds them), else into copies.
#[cfg(laya_primitives)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn write(
    heads: &Array,
    k_buf: &Array,
    v_buf: &Array,
    n_heads: i32,
    n_kv_heads: i32,
    offset: i32,
    theta: f32,
    in_place: bool,
) -> Result<Written> {
    let stream = mlx_rs::Stream::new();
    let mut error = [0 as std::ffi::c_char; 512];
    unsafe {
        let mut outs: [mlx_sys::mlx_array; 5] = std::array::from_fn(|_| mlx_sys::mlx_array_new());
        let rc = laya_rope_kv_write(
            outs.as_mut_ptr(),
            heads.as_ptr(),
            k_buf.as_ptr(),
            v_buf.as_ptr(),
            n_heads,
            n_kv_heads,
            offset,
            theta,
            in_place as i32,
            stream.as_ptr(),
            error.as_mut_ptr(),
            error.len(),
        );
        let [q, k_buf, v_buf, keys, values] = outs.map(|a| Array::from_ptr(a));
        super::own::error_of(rc, &error)?;
        super::own::Own::RopeKv.note_made();
        Ok(Written {
            q,
            k_buf,
            v_buf,
            keys,
            values,
        })
    }
}

#[cfg(not(laya_primitives))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn write(
    _heads: &Array,
    _k_buf: &Array,
    _v_buf: &Array,
    _n_heads: i32,
    _n_kv_heads: i32,
    _offset: i32,
    _theta: f32,
    _in_place: bool,
) -> Result<Written> {
    Err(mlx_rs::error::Exception::custom(
        "laya's own primitives are not in this build (Linux builds have them)",
    ))
}

#[cfg(all(test, laya_primitives))]
mod tests {
    use mlx_rs::ops::indexing::argmax_axis;
    use mlx_rs::Dtype;

    use super::super::own::Own;
    use super::super::test_util::*;
    use super::super::{Arch, Model};
    use super::*;

    /// A prompt of 12 tokens, then 6 steps of one token (each the last step's argmax), for
    /// `batch` sequences, on the primitive or the ops: the logits of every step and the tokens.
    fn run(model: &Model, batch: i32, primitive: bool) -> (Vec<Array>, Vec<Vec<u32>>) {
        Own::RopeKv.force(Some(primitive));
        // Steps of one sequence through MLX's ops, not laya's whole step (which has no RoPE
        // primitive of its own to count).
        Own::Step.force(Some(false));
        let before = Own::RopeKv.made();
        let prompt: Vec<u32> = (0..batch as u32)
            .flat_map(|b| [3, 17, 42, 5, 96, 0, 11, 64, 23, 8, 77, 31].map(|t| (t + 7 * b) % 97))
            .collect();
        let mut caches = model.new_caches();
        let mut logits = vec![model
            .forward(&Array::from_slice(&prompt, &[batch, 12]), &mut caches)
            .unwrap()];
        let mut picked = vec![];
        for _ in 0..6 {
            let next = argmax_axis(logits.last().unwrap(), -1, None)
                .unwrap()
                .as_dtype(Dtype::Uint32)
                .unwrap();
            let ids: Vec<u32> = next.as_slice::<u32>().to_vec();
            logits.push(
                model
                    .forward(&next.reshape(&[batch, 1]).unwrap(), &mut caches)
                    .unwrap(),
            );
            picked.push(ids);
        }
        Own::RopeKv.force(None);
        Own::Step.force(None);
        // Two layers, seven forwards: the path asked for is the one that ran.
        let want = if primitive { 14 } else { 0 };
        assert_eq!(Own::RopeKv.made() - before, want, "primitives made");
        (logits, picked)
    }

    fn same_steps(model: &Model, batch: i32, tolerance: f32, what: &str) {
        let (ops, ops_ids) = run(model, batch, false);
        let (prim, prim_ids) = run(model, batch, true);
        for (i, (a, b)) in ops.iter().zip(&prim).enumerate() {
            let d = max_abs_diff(
                &a.as_dtype(Dtype::Float32).unwrap(),
                &b.as_dtype(Dtype::Float32).unwrap(),
            );
            assert!(d <= tolerance, "{what}, step {i}: max |Δlogit| {d} > {tolerance}");
        }
        assert_eq!(ops_ids, prim_ids, "{what}: greedy tokens differ");
    }

    /// The primitive's path gives the ops path's logits at every step and the same greedy
    /// tokens: f32, bf16 and a q4 model, one sequence and two (candidates).
    #[test]
    fn the_primitive_equals_the_ops() {
        let cfg = tiny_config(Arch::Qwen2);
        let w = random_weights(&cfg, 11);
        let f32_model = Model::from_weights(cfg.clone(), to_device(&w), 64).unwrap();
        same_steps(&f32_model, 1, tol(2e-5), "f32");
        same_steps(&f32_model, 2, tol(2e-5), "f32, two sequences");
        // bf16: the two paths round differently (the primitive rounds once, after RoPE in f32),
        // so they may differ by as much as bf16 differs from f32, no more. (Where the device
        // runs every model in bf16, the two models are one: the tolerance is then the f32 one.)
        let bf16 = Model::from_weights(cfg.clone(), cast(&to_device(&w), Dtype::Bfloat16), 64).unwrap();
        let (exact, _) = run(&f32_model, 1, false);
        let (rounded, _) = run(&bf16, 1, false);
        let noise = exact
            .iter()
            .zip(&rounded)
            .map(|(a, b)| max_abs_diff(a, &b.as_dtype(Dtype::Float32).unwrap()))
            .fold(0.0f32, f32::max);
        assert!(noise < 1.0, "bf16 against f32: {noise}");
        same_steps(&bf16, 1, noise.max(tol(2e-5)), "bf16");
        let (q4, _) = quantized_pair(&w, 64, 4);
        same_steps(&Model::from_weights(cfg, q4, 64).unwrap(), 1, tol(2e-5), "q4");
    }

    /// A copy of the caches kept aside (as the prefix store keeps a document's) is left as it
    /// was by later steps: the primitive copies a buffer it does not own, and the copy goes
    /// on to give the logits a fresh prompt gives.
    #[test]
    fn a_kept_copy_of_the_caches_is_left_as_it_was() {
        let model = tiny_model(Arch::Qwen2, 12);
        let ids = [3u32, 17, 42, 5, 96, 0, 11, 64, 23, 8, 77, 31];
        Own::RopeKv.force(Some(true));
        Own::Step.force(Some(false));
        let mut caches = model.new_caches();
        model.forward(&tokens(&ids[..8]), &mut caches).unwrap();
        let kept = caches.clone();
        for t in [1u32, 2, 3, 4] {
            model.forward(&tokens(&[t]), &mut caches).unwrap();
        }
        let mut kept = kept;
        let resumed = model.forward(&tokens(&ids[8..]), &mut kept).unwrap();
        Own::RopeKv.force(Some(false));
        let fresh = model.forward(&tokens(&ids), &mut model.new_caches()).unwrap();
        Own::RopeKv.force(None);
        Own::Step.force(None);
        let d = max_abs_diff(&resumed, &fresh);
        assert!(d <= tol(2e-5), "max |Δlogit| {d}");
    }

    /// Buffers of the wrong shape are an error with its reason, not a crash.
    #[test]
    fn mismatched_buffers_are_an_error() {
        let heads = Array::zeros::<f32>(&[1, 8, 1, 16]).unwrap();
        let buf = Array::zeros::<f32>(&[1, 2, 4, 16]).unwrap();
        let small = Array::zeros::<f32>(&[1, 2, 2, 16]).unwrap();
        let e = write(&heads, &buf, &buf, 4, 2, 4, 1e4, false)
            .err()
            .expect("past the capacity");
        assert!(e.what().contains("Cap >= offset + L"), "{}", e.what());
        let e = write(&heads, &buf, &small, 4, 2, 0, 1e4, false)
            .err()
            .expect("unequal buffers");
        assert!(e.what().contains("[B, KV, Cap, D]"), "{}", e.what());
        let e = write(&heads, &buf, &buf, 3, 2, 0, 1e4, false)
            .err()
            .expect("wrong head count");
        assert!(e.what().contains("H + 2 KV"), "{}", e.what());
        assert!(write(&heads, &buf, &buf, 4, 2, 3, 1e4, false).is_ok());
    }
}
