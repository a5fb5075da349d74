//! A whole decode step of a dense Qwen2/Qwen3 model as one MLX primitive of laya's own
//! (`csrc/decode_step.cpp`): the embedding row, every layer and the head for one token of one
//! sequence, with the keys and values written into the caches in place.
//!
//! On CUDA the step is one CUDA graph of laya's kernels, captured once a model and replayed
//! every token, so the host's cost of a step no longer grows with the layer count (the ops
//! path builds some 15 MLX ops a layer, each ~2.8 us of host time on an H100: docs/decisions.md,
//! "A decode step's ops"). The ops stay the path for prompts, candidates, drafts, the CPU and
//! Metal, and the reference: tests compare the two on the CPU (the primitive's CPU side, the
//! same arithmetic in loops) and on every CUDA run (its kernels). Built on Linux only
//! (`cfg(laya_primitives)`). Whether a thread takes it is [`super::own::Own::Step`]'s to say: the
//! benchmark's rows and the tests ask for it; it becomes CUDA's default once its kernels'
//! tests have passed on a GPU.

use mlx_rs::error::{Exception, Result};
use mlx_rs::Array;

/// What a plan is made of: the model's sizes and its arrays in the order the C side reads
/// (`laya_step_plan_new`), `None` where an array is absent.
pub(crate) struct Parts<'a> {
    /// hidden, heads, KV heads, head size, intermediate size, vocabulary, layers.
    pub dims: [i32; 7],
    pub eps: f32,
    pub theta: f32,
    pub arrays: Vec<Option<&'a Array>>,
}

/// A model's step: its weights (held), and on a GPU its kernels, buffers and captured graph.
pub(crate) struct Plan {
    handle: *mut std::ffi::c_void,
}

// SAFETY: the plan is immutable after it is made but for its GPU side, which the C side makes
// once under a mutex.
unsafe impl Send for Plan {}
unsafe impl Sync for Plan {}

#[cfg(laya_primitives)]
extern "C" {
    fn laya_step_plan_new(
        plan: *mut *mut std::ffi::c_void,
        arrays: *const mlx_sys::mlx_array,
        n: usize,
        dims: *const i32,
        eps: f32,
        theta: f32,
        error: *mut std::ffi::c_char,
        error_len: usize,
    ) -> i32;
    fn laya_step_plan_free(plan: *mut std::ffi::c_void);
    #[cfg(test)]
    fn laya_kv_copies() -> u64;
    fn laya_step_plan_nodes(plan: *mut std::ffi::c_void) -> i32;
    fn laya_step_profile(
        plan: *mut std::ffi::c_void,
        out: *mut std::ffi::c_char,
        out_len: usize,
        error: *mut std::ffi::c_char,
        error_len: usize,
    ) -> i32;
    fn laya_step_run(
        outs: *mut mlx_sys::mlx_array,
        plan: *mut std::ffi::c_void,
        tokens: mlx_sys::mlx_array,
        bufs: *const mlx_sys::mlx_array,
        n_bufs: usize,
        in_place: *const u8,
        offset: i32,
        stream: mlx_sys::mlx_stream,
        error: *mut std::ffi::c_char,
        error_len: usize,
    ) -> i32;
}

impl Plan {
    /// The plan of a model made of `parts`; an error says which part laya's step cannot run
    /// (a dense or unusual quantization, too many query heads a KV head, ...).
    #[cfg(laya_primitives)]
    pub(crate) fn new(parts: &Parts) -> Result<Plan> {
        let arrays: Vec<mlx_sys::mlx_array> = parts
            .arrays
            .iter()
            // SAFETY: an empty handle (no array) is what the C side reads as absent.
            .map(|a| a.map_or_else(|| unsafe { mlx_sys::mlx_array_new() }, |a| a.as_ptr()))
            .collect();
        let mut error = [0 as std::ffi::c_char; 512];
        let mut handle = std::ptr::null_mut();
        // SAFETY: the arrays outlive the call (the plan keeps its own references).
        let rc = unsafe {
            laya_step_plan_new(
                &mut handle,
                arrays.as_ptr(),
                arrays.len(),
                parts.dims.as_ptr(),
                parts.eps,
                parts.theta,
                error.as_mut_ptr(),
                error.len(),
            )
        };
        super::own::error_of(rc, &error)?;
        Ok(Plan { handle })
    }

    #[cfg(not(laya_primitives))]
    pub(crate) fn new(_parts: &Parts) -> Result<Plan> {
        Err(Exception::custom(
            "laya's own primitives are not in this build (Linux builds have them)",
        ))
    }

    /// Kernel nodes of the captured step once it is built on a GPU (0 before, and on the CPU).
    pub(crate) fn nodes(&self) -> usize {
        #[cfg(laya_primitives)]
        // SAFETY: a live plan.
        return unsafe { laya_step_plan_nodes(self.handle) }.max(0) as usize;
        #[cfg(not(laya_primitives))]
        0
    }

    /// Where a step's GPU time goes: the last step's kernels replayed one by one, ms by kind
    /// of kernel (in the step's order). The caches of that step must still be alive.
    #[cfg(laya_primitives)]
    pub(crate) fn profile(&self) -> Result<Vec<(String, f64)>> {
        let mut out = vec![0 as std::ffi::c_char; 4096];
        let mut error = [0 as std::ffi::c_char; 512];
        // SAFETY: both buffers outlive the call, which writes NUL-terminated text into them.
        let rc = unsafe {
            laya_step_profile(
                self.handle,
                out.as_mut_ptr(),
                out.len(),
                error.as_mut_ptr(),
                error.len(),
            )
        };
        super::own::error_of(rc, &error)?;
        // SAFETY: NUL-terminated by the C side.
        let text = unsafe { std::ffi::CStr::from_ptr(out.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        Ok(text
            .lines()
            .filter_map(|l| l.rsplit_once(' '))
            .filter_map(|(name, ms)| Some((name.to_owned(), ms.parse().ok()?)))
            .collect())
    }

    #[cfg(not(laya_primitives))]
    pub(crate) fn profile(&self) -> Result<Vec<(String, f64)>> {
        Err(Exception::custom("laya's own primitives are not in this build"))
    }

    /// One step of the token `tokens` (`[1, 1]`) at `offset`, over `bufs` (each layer's k and
    /// v buffers `[1, KV, Cap, D]`, Cap > offset): the logits `[1, vocab]` f32 and the buffers
    /// with position `offset` written, in place for the layers `in_place` says nothing else
    /// holds, else into copies.
    #[cfg(laya_primitives)]
    pub(crate) fn run(
        &self,
        tokens: &Array,
        bufs: &[Array],
        offset: i32,
        in_place: &[bool],
    ) -> Result<(Array, Vec<Array>)> {
        let stream = mlx_rs::Stream::new();
        let handles: Vec<mlx_sys::mlx_array> = bufs.iter().map(|b| b.as_ptr()).collect();
        if in_place.len() * 2 != bufs.len() {
            return Err(Exception::custom("laya step: an in-place flag for every layer"));
        }
        let in_place: Vec<u8> = in_place.iter().map(|&b| b as u8).collect();
        let mut error = [0 as std::ffi::c_char; 512];
        // SAFETY: `outs` has room for every output; the C side sets each on success.
        let outs = unsafe {
            let mut outs: Vec<mlx_sys::mlx_array> =
                (0..=bufs.len()).map(|_| mlx_sys::mlx_array_new()).collect();
            let rc = laya_step_run(
                outs.as_mut_ptr(),
                self.handle,
                tokens.as_ptr(),
                handles.as_ptr(),
                handles.len(),
                in_place.as_ptr(),
                offset,
                stream.as_ptr(),
                error.as_mut_ptr(),
                error.len(),
            );
            let outs: Vec<Array> = outs.into_iter().map(|a| Array::from_ptr(a)).collect();
            super::own::error_of(rc, &error)?;
            outs
        };
        super::own::Own::Step.note_made();
        let mut outs = outs.into_iter();
        let logits = outs.next().expect("the logits come first");
        Ok((logits, outs.collect()))
    }

    #[cfg(not(laya_primitives))]
    pub(crate) fn run(
        &self,
        _tokens: &Array,
        _bufs: &[Array],
        _offset: i32,
        _in_place: &[bool],
    ) -> Result<(Array, Vec<Array>)> {
        Err(Exception::custom(
            "laya's own primitives are not in this build (Linux builds have them)",
        ))
    }
}

impl Drop for Plan {
    fn drop(&mut self) {
        #[cfg(laya_primitives)]
        // SAFETY: the handle came from `laya_step_plan_new` and is freed once; a step still
        // queued holds its own reference to the plan.
        unsafe {
            laya_step_plan_free(self.handle)
        };
    }
}

#[cfg(all(test, laya_primitives))]
mod tests {
    use std::collections::HashMap;

    use mlx_rs::ops::{self, indexing::argmax_axis};
    use mlx_rs::transforms::eval;
    use mlx_rs::Dtype;

    use super::super::own::Own;
    use super::super::test_util::*;
    use super::super::{Arch, Model};
    use super::*;

    /// A prompt of `prompt` tokens, then `steps` steps of one token (each the last step's
    /// argmax), on laya's step or the ops: the logits of every step and the tokens picked.
    fn run(model: &Model, prompt: usize, steps: usize, on: bool) -> (Vec<Array>, Vec<u32>) {
        Own::Step.force(Some(on));
        // The ops path without the RoPE primitive: the reference as the CPU and Metal run it.
        Own::RopeKv.force(Some(false));
        let before = Own::Step.made();
        let ids: Vec<u32> = (0..prompt as u32).map(|i| (i * 37 + 11) % 97).collect();
        let mut caches = model.new_caches();
        let mut logits = vec![model.forward(&tokens(&ids), &mut caches).unwrap()];
        let mut picked = vec![];
        for _ in 0..steps {
            let next = argmax_axis(logits.last().unwrap(), -1, None)
                .unwrap()
                .as_dtype(Dtype::Uint32)
                .unwrap();
            picked.push(next.as_slice::<u32>()[0]);
            logits.push(
                model
                    .forward(&next.reshape(&[1, 1]).unwrap(), &mut caches)
                    .unwrap(),
            );
        }
        Own::Step.force(None);
        Own::RopeKv.force(None);
        assert_eq!(
            Own::Step.made() - before,
            if on { steps as u64 } else { 0 },
            "steps run by laya's step"
        );
        (logits, picked)
    }

    /// A tiny model quantized at `bits` in groups of `group`, its floats in `dtype` (where the
    /// device keeps the loaded type), and the host's copy of the weights it runs (dequantized,
    /// rounded as the model holds them) for [`reference_forward`].
    fn quantized(arch: Arch, bits: i32, group: i32, dtype: Dtype) -> (Model, HostWeights) {
        let cfg = tiny_config(arch);
        let (q, _) = quantized_pair(&random_weights(&cfg, 5 + bits as u64), group, bits);
        // The floats (scales, biases, norms) in `dtype`; the packed weights stay integers.
        let q: HashMap<String, Array> = q
            .into_iter()
            .map(|(k, a)| match a.dtype() {
                Dtype::Uint32 => (k, a),
                _ => (k, a.as_dtype(dtype).unwrap()),
            })
            .collect();
        let model = Model::from_weights(cfg, q.clone(), group).unwrap();
        // What the model holds: the device may have changed the floats' type at load.
        let held = model.embed_tokens.float_dtype();
        let f = |a: &Array| a.as_dtype(held).unwrap().as_dtype(Dtype::Float32).unwrap();
        let mut host = HostWeights::new();
        for (k, a) in &q {
            let dense = match a.dtype() {
                Dtype::Uint32 => {
                    let base = k.trim_end_matches(".weight");
                    ops::dequantize(
                        a,
                        f(&q[&format!("{base}.scales")]),
                        &f(&q[&format!("{base}.biases")]),
                        group,
                        bits,
                    )
                    .unwrap()
                }
                _ if k.ends_with(".scales") || k.ends_with(".biases") => continue,
                _ => f(a),
            };
            host.insert(
                k.clone(),
                (dense.as_slice::<f32>().to_vec(), dense.shape().to_vec()),
            );
        }
        (model, host)
    }

    /// The step against the ops on `model` after a prompt of `prompt` tokens for `steps`
    /// steps: the same greedy tokens; logits within `tolerance` of the ops' where the model
    /// runs in f32; and at least as close to the host's f32 forward as the ops' are (the two
    /// paths round at nearly the same places, but for a few sums the step keeps in f32: the
    /// normed inputs of the products, attention's scores and weights).
    fn same_steps(
        model: &Model,
        host: &HostWeights,
        prompt: usize,
        steps: usize,
        tolerance: f32,
        what: &str,
    ) {
        let (ops, ops_ids) = run(model, prompt, steps, false);
        let (own, own_ids) = run(model, prompt, steps, true);
        assert_eq!(ops_ids, own_ids, "{what}: greedy tokens differ");
        let exact = model.embed_tokens.float_dtype() == Dtype::Float32;
        let ids: Vec<u32> = (0..prompt as u32)
            .map(|i| (i * 37 + 11) % 97)
            .chain(ops_ids.iter().copied())
            .collect();
        let reference = reference_forward(&model.cfg, host, &ids);
        let (mut ops_off, mut own_off) = (0.0f32, 0.0f32);
        for (i, (a, b)) in ops.iter().zip(&own).enumerate() {
            assert_eq!((b.shape(), b.dtype()), (a.shape(), Dtype::Float32), "{what}");
            let d = max_abs_diff(a, b);
            assert!(
                !exact || d <= tolerance,
                "{what}, step {i}: max |Δlogit| {d} > {tolerance}"
            );
            let want = Array::from_slice(&reference[prompt - 1 + i], a.shape());
            ops_off = ops_off.max(max_abs_diff(a, &want));
            own_off = own_off.max(max_abs_diff(b, &want));
        }
        assert!(
            own_off <= 1.25 * ops_off + tolerance,
            "{what}: the step is {own_off} off the f32 forward, the ops {ops_off}"
        );
    }

    /// The step gives the ops' logits at every step and the same greedy tokens: Qwen2 (biases)
    /// and Qwen3 (per-head norms), 4, 6 and 8 bits, groups of 32 and 64.
    #[test]
    fn the_step_equals_the_ops() {
        for arch in [Arch::Qwen2, Arch::Qwen3] {
            for (bits, group) in [(4, 64), (6, 32), (8, 64)] {
                let (model, host) = quantized(arch, bits, group, Dtype::Float32);
                same_steps(
                    &model,
                    &host,
                    12,
                    8,
                    tol(2e-4),
                    &format!("{arch:?} q{bits} g{group}"),
                );
            }
        }
    }

    /// In bf16 the step is as close to the f32 forward as the ops are, and picks their tokens.
    #[test]
    fn the_step_in_bf16_is_as_close_to_f32_as_the_ops() {
        for arch in [Arch::Qwen2, Arch::Qwen3] {
            let (model, host) = quantized(arch, 8, 64, Dtype::Bfloat16);
            same_steps(&model, &host, 12, 6, tol(2e-4), &format!("{arch:?} bf16"));
        }
    }

    /// Steps that cross the caches' growth (256 positions) write into the new buffers.
    #[test]
    fn steps_across_a_cache_growth() {
        let (model, host) = quantized(Arch::Qwen2, 8, 64, Dtype::Float32);
        same_steps(&model, &host, 253, 6, tol(2e-4), "across 256");
    }

    /// KV buffers copied by the steps evaluated on this thread.
    fn copies() -> u64 {
        // SAFETY: reads a counter.
        unsafe { laya_kv_copies() }
    }

    /// A copy of the caches kept aside (as the prefix store keeps a document's) is left as it
    /// was by later steps, and goes on to give the logits a fresh prompt gives. The first step
    /// after the copy was made copies the buffers (2 a layer), the steps after it write into
    /// the new buffers in place, as steps on caches nothing else holds do.
    #[test]
    fn a_kept_copy_of_the_caches_is_left_as_it_was() {
        let (model, _) = quantized(Arch::Qwen3, 4, 64, Dtype::Float32);
        let ids = [3u32, 17, 42, 5, 96, 0, 11, 64, 23, 8, 77, 31];
        Own::Step.force(Some(true));
        let mut caches = model.new_caches();
        model.forward(&tokens(&ids[..8]), &mut caches).unwrap();
        let before = copies();
        model.forward(&tokens(&[9]), &mut caches).unwrap();
        eval(caches.iter().flat_map(|c| c.arrays())).unwrap();
        assert_eq!(
            copies(),
            before,
            "a step on caches nothing else holds copied buffers"
        );
        let kept = caches.clone();
        for t in [1u32, 2, 3, 4] {
            model.forward(&tokens(&[t]), &mut caches).unwrap();
            eval(caches.iter().flat_map(|c| c.arrays())).unwrap();
        }
        assert_eq!(
            copies(),
            before + 4,
            "copies: the first step after the clone's, of 4 buffers"
        );
        let mut kept = kept;
        let resumed = model.forward(&tokens(&ids[8..]), &mut kept).unwrap();
        Own::Step.force(Some(false));
        let whole: Vec<u32> = ids[..8].iter().chain(&[9]).chain(&ids[8..]).copied().collect();
        let fresh = model.forward(&tokens(&whole), &mut model.new_caches()).unwrap();
        Own::Step.force(None);
        let d = max_abs_diff(&resumed, &fresh);
        assert!(d <= tol(2e-4), "max |Δlogit| {d}");
    }

    /// Models the step does not run decode through the ops, and say why: dense weights,
    /// 3 bits, a mixture of experts.
    #[test]
    fn other_models_decode_through_the_ops() {
        let dense = tiny_model(Arch::Qwen2, 3);
        assert!(dense.step_plan().is_none());
        let (_, picked) = run(&dense, 6, 2, false);
        Own::Step.force(Some(true));
        let before = Own::Step.made();
        let mut caches = dense.new_caches();
        dense.forward(&tokens(&[1, 2, 3]), &mut caches).unwrap();
        dense.forward(&tokens(&picked[..1]), &mut caches).unwrap();
        Own::Step.force(None);
        assert_eq!(Own::Step.made(), before, "a dense model ran laya's step");

        let (q3, _) = quantized(Arch::Qwen2, 3, 64, Dtype::Float32);
        let e = Plan::new(&q3.step_parts().unwrap()).err().expect("3 bits");
        assert!(e.what().contains("3 bits"), "{}", e.what());
        assert!(q3.step_plan().is_none());
        let cfg = tiny_config(Arch::Qwen3Moe);
        let (q, _) = quantized_pair(&random_weights(&cfg, 1), 64, 4);
        assert!(Model::from_weights(cfg, q, 64).unwrap().step_parts().is_none());
    }

    /// Bad inputs to a step are errors with their reason, and the caches are left whole.
    #[test]
    fn bad_steps_are_errors() {
        let (model, _) = quantized(Arch::Qwen2, 8, 64, Dtype::Float32);
        let plan = model.step_plan().expect("a plan");
        let buf = Array::zeros::<f32>(&[1, 2, 4, 16]).unwrap();
        let bufs = vec![buf.clone(); 4];
        let e = plan
            .run(&tokens(&[1]), &bufs, 4, &[false, false])
            .err()
            .expect("past the capacity");
        assert!(e.what().contains("Cap > offset"), "{}", e.what());
        let e = plan
            .run(&tokens(&[1]), &bufs[..2], 0, &[false])
            .err()
            .expect("one layer's buffers");
        assert!(e.what().contains("every layer"), "{}", e.what());
        let e = plan
            .run(&tokens(&[1, 2]), &bufs, 0, &[false, false])
            .err()
            .expect("two tokens");
        assert!(e.what().contains("one token"), "{}", e.what());
        let half = vec![buf.as_dtype(Dtype::Bfloat16).unwrap(); 4];
        let e = plan
            .run(&tokens(&[1]), &half, 0, &[false, false])
            .err()
            .expect("bf16 buffers");
        assert!(e.what().contains("activations' type"), "{}", e.what());
        assert!(plan.run(&tokens(&[1]), &bufs, 3, &[false, false]).is_ok());
        // The caches at different offsets: an error, and both as they were.
        let mut caches = model.new_caches();
        model.forward(&tokens(&[1, 2, 3]), &mut caches).unwrap();
        caches[1].truncate_to(2);
        Own::Step.force(Some(true));
        let e = model
            .forward(&tokens(&[4]), &mut caches)
            .err()
            .expect("uneven caches");
        Own::Step.force(None);
        assert!(e.to_string().contains("different offsets"), "{e}");
        assert_eq!((caches[0].offset(), caches[1].offset()), (3, 2));
    }
}
