//! The MLX operations the engine uses agree with plain f32 Rust references.
//!
//! Tolerances are relative to the largest reference value. On the CPU backend every op is
//! computed in f32 and agrees to ~1e-6. On CUDA (Hopper), f32 matmuls and attention run on
//! TF32 tensor cores (10-bit mantissa), so those ops get a GPU tolerance of 2e-3.

use mlx_rs::{
    fast::{self, ScaledDotProductAttentionMask},
    ops::{
        self,
        indexing::{TryIndexMutOp, TryIndexOp},
    },
    Array,
};

use super::{assert_close, mlx, Backend, Lcg};

fn arr(v: &[f32], shape: &[usize]) -> Array {
    let shape: Vec<i32> = shape.iter().map(|&d| d as i32).collect();
    Array::from_slice(v, &shape)
}

fn host(a: &Array) -> Vec<f32> {
    // Row-contiguous first: the GPU may hand back a strided result, which `as_slice` refuses.
    let a = a.as_type::<f32>().unwrap().contiguous().unwrap();
    a.eval().unwrap();
    a.as_slice::<f32>().to_vec()
}

/// f32 tolerance for ops that go through matrix units.
fn mm_tol(b: Backend) -> f32 {
    match b {
        Backend::Cpu => 1e-5,
        Backend::Gpu => 2e-3,
    }
}

/// x[m,k] · w[n,k]ᵀ in f64 accumulation.
fn matmul_t(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut out = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let s: f64 = (0..k).map(|p| x[i * k + p] as f64 * w[j * k + p] as f64).sum();
            out[i * n + j] = s as f32;
        }
    }
    out
}

#[test]
fn matmul_matches_reference() {
    let (_g, backend) = mlx();
    let mut rng = Lcg(1);
    for (m, k, n) in [(1, 896, 128), (37, 96, 53), (64, 256, 192)] {
        let x = rng.vec(m * k);
        let w = rng.vec(n * k);
        let y = ops::matmul(arr(&x, &[m, k]), arr(&w, &[n, k]).t()).unwrap();
        assert_close(
            &format!("matmul {m}x{k}x{n}"),
            &host(&y),
            &matmul_t(&x, &w, m, k, n),
            mm_tol(backend),
        );
    }
}

/// Our own reading of MLX's affine format: a little-endian stream of `bits`-bit codes per
/// row, w = scale·q + bias per group.
fn unpack_affine(wq: &[u32], s: &[f32], b: &[f32], n: usize, k: usize, bits: usize, gs: usize) -> Vec<f32> {
    let words = k * bits / 32;
    let mask = (1u64 << bits) - 1;
    let mut out = vec![0f32; n * k];
    for r in 0..n {
        let row = &wq[r * words..(r + 1) * words];
        for j in 0..k {
            let (wi, sh) = ((j * bits) / 32, (j * bits) % 32);
            let mut v = (row[wi] as u64) >> sh;
            if sh + bits > 32 {
                v |= (row[wi + 1] as u64) << (32 - sh);
            }
            let g = r * (k / gs) + j / gs;
            out[r * k + j] = s[g] * (v & mask) as f32 + b[g];
        }
    }
    out
}

#[test]
fn quantize_and_quantized_matmul_at_4_6_8_bits() {
    let (_g, _backend) = mlx();
    let (n, k, gs) = (256usize, 512usize, 64usize);
    let mut rng = Lcg(2);
    let w = rng.vec(n * k);
    for bits in [4usize, 6, 8] {
        let (wq, s, b) = ops::quantize(arr(&w, &[n, k]), gs as i32, bits as i32).unwrap();
        wq.eval().unwrap();
        assert_eq!(
            wq.shape(),
            &[n as i32, (k * bits / 32) as i32],
            "q{bits} packed shape"
        );
        assert_eq!(s.shape(), &[n as i32, (k / gs) as i32], "q{bits} scales shape");
        let deq = unpack_affine(wq.as_slice::<u32>(), &host(&s), &host(&b), n, k, bits, gs);
        // MLX's affine quantizer snaps the group's bias so that zero stays representable,
        // which costs up to one step (not half) of the group's range (< 2 here).
        let step = 2.0 / ((1u32 << bits) - 1) as f32;
        let qerr = w.iter().zip(&deq).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(qerr <= step, "q{bits}: |w - deq(w)| = {qerr} > one step {step}");
        let mlx_deq = host(&ops::dequantize(&wq, &s, &b, gs as i32, bits as i32).unwrap());
        assert_close(&format!("q{bits} dequantize vs own unpack"), &mlx_deq, &deq, 1e-6);
        // Quantized kernels accumulate in f32 on every backend (no TF32).
        for m in [1usize, 3, 17] {
            let x = rng.vec(m * k);
            let y =
                ops::quantized_matmul(arr(&x, &[m, k]), &wq, &s, &b, true, gs as i32, bits as i32).unwrap();
            assert_close(
                &format!("q{bits} quantized_matmul M={m}"),
                &host(&y),
                &matmul_t(&x, &deq, m, k, n),
                1e-5,
            );
        }
    }
}

#[test]
fn rms_norm_matches_reference() {
    let (_g, _backend) = mlx();
    let (m, d, eps) = (4usize, 896usize, 1e-6f32);
    let mut rng = Lcg(3);
    let x = rng.vec(m * d);
    let w = rng.vec(d);
    let y = fast::rms_norm(arr(&x, &[m, d]), Some(&arr(&w, &[d])), eps).unwrap();
    let mut want = vec![0f32; m * d];
    for i in 0..m {
        let r = &x[i * d..(i + 1) * d];
        let inv = 1.0 / (r.iter().map(|v| v * v).sum::<f32>() / d as f32 + eps).sqrt();
        for j in 0..d {
            want[i * d + j] = r[j] * inv * w[j];
        }
    }
    assert_close("rms_norm 4x896", &host(&y), &want, 1e-5);
}

/// RoPE over [heads, len, dim]; NEOX style (halves) unless `traditional` (pairs).
#[allow(clippy::too_many_arguments)]
fn rope_ref(
    x: &[f32],
    h: usize,
    l: usize,
    d: usize,
    dims: usize,
    traditional: bool,
    base: f32,
    offset: usize,
) -> Vec<f32> {
    let mut out = x.to_vec();
    let half = dims / 2;
    for hh in 0..h {
        for p in 0..l {
            let row = (hh * l + p) * d;
            for i in 0..half {
                let theta = (offset + p) as f64 * (base as f64).powf(-(i as f64) / half as f64);
                let (sn, cs) = (theta.sin() as f32, theta.cos() as f32);
                let (a, b) = if traditional {
                    (row + 2 * i, row + 2 * i + 1)
                } else {
                    (row + i, row + i + half)
                };
                out[a] = x[a] * cs - x[b] * sn;
                out[b] = x[a] * sn + x[b] * cs;
            }
        }
    }
    out
}

#[test]
fn rope_matches_reference() {
    let (_g, _backend) = mlx();
    let (h, l, d) = (2usize, 8usize, 64usize);
    let x = Lcg(4).vec(h * l * d);
    let xa = arr(&x, &[1, h, l, d]);
    // Qwen uses NEOX style with base 1e6; large offsets are where f32 angle error shows.
    for (dims, trad, base, offset) in [
        (64, false, 1e6, 0),
        (64, false, 1e6, 1000),
        (64, true, 1e4, 3),
        (32, false, 1e4, 7),
    ] {
        let y = fast::rope(&xa, dims as i32, trad, base, 1.0, offset as i32, None).unwrap();
        let want = rope_ref(&x, h, l, d, dims, trad, base, offset);
        assert_close(
            &format!("rope dims={dims} trad={trad} base={base} offset={offset}"),
            &host(&y),
            &want,
            2e-4,
        );
    }
}

#[allow(clippy::too_many_arguments)]
fn sdpa_ref(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    hq: usize,
    hkv: usize,
    l: usize,
    s: usize,
    d: usize,
    causal: bool,
) -> Vec<f32> {
    let scale = 1.0 / (d as f32).sqrt();
    let mut out = vec![0f32; hq * l * d];
    for h in 0..hq {
        let hk = h / (hq / hkv);
        for i in 0..l {
            // Query i sits at absolute position s - l + i and sees keys 0..=that.
            let visible = if causal { s - l + i + 1 } else { s };
            let scores: Vec<f32> = (0..visible)
                .map(|j| {
                    (0..d)
                        .map(|t| q[(h * l + i) * d + t] * k[(hk * s + j) * d + t])
                        .sum::<f32>()
                        * scale
                })
                .collect();
            let mx = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f32> = scores.iter().map(|x| (x - mx).exp()).collect();
            let z: f32 = e.iter().sum();
            for t in 0..d {
                out[(h * l + i) * d + t] = (0..visible).map(|j| e[j] / z * v[(hk * s + j) * d + t]).sum();
            }
        }
    }
    out
}

#[test]
fn scaled_dot_product_attention_causal_and_gqa() {
    let (_g, backend) = mlx();
    let mut rng = Lcg(5);
    // (q heads, kv heads, new tokens, total tokens, causal): plain, GQA 7:1 like the 0.5B,
    // one-token decode over a cache, and a causal chunk appended after cached tokens.
    for (hq, hkv, l, s, causal) in [
        (4, 4, 8, 8, true),
        (14, 2, 6, 6, true),
        (14, 2, 1, 33, false),
        (12, 2, 5, 12, true),
        (8, 2, 5, 12, false),
    ] {
        let d = 64;
        let q = rng.vec(hq * l * d);
        let k = rng.vec(hkv * s * d);
        let v = rng.vec(hkv * s * d);
        let mask = causal.then_some(ScaledDotProductAttentionMask::Causal);
        let o = fast::scaled_dot_product_attention(
            arr(&q, &[1, hq, l, d]),
            arr(&k, &[1, hkv, s, d]),
            arr(&v, &[1, hkv, s, d]),
            1.0 / (d as f32).sqrt(),
            mask,
            None,
        )
        .unwrap();
        let want = sdpa_ref(&q, &k, &v, hq, hkv, l, s, d, causal);
        assert_close(
            &format!("sdpa hq={hq} hkv={hkv} l={l} s={s} causal={causal}"),
            &host(&o),
            &want,
            mm_tol(backend),
        );
    }
}

/// Transposes host data `[a, b, c, d]` → `[a, c, b, d]`.
fn swap12(x: &[f32], a: usize, b: usize, c: usize, d: usize) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    for i in 0..a {
        for j in 0..b {
            for k in 0..c {
                for t in 0..d {
                    out[((i * c + k) * b + j) * d + t] = x[((i * b + j) * c + k) * d + t];
                }
            }
        }
    }
    out
}

/// The KV cache's write: a transposed (strided) view written into a slice of a larger buffer.
#[test]
fn slice_update_from_a_transposed_view() {
    let (_g, _backend) = mlx();
    let (heads, len, d, cap, at) = (2usize, 3usize, 16usize, 8usize, 2usize);
    let x = Lcg(11).vec(len * heads * d);
    // [1, len, heads, d] viewed as [1, heads, len, d].
    let src = arr(&x, &[1, len, heads, d])
        .transpose_axes(&[0, 2, 1, 3])
        .unwrap();
    let mut buf = ops::zeros::<f32>(&[1, heads as i32, cap as i32, d as i32]).unwrap();
    buf.try_index_mut((.., .., at as i32..(at + len) as i32, ..), &src)
        .unwrap();
    let t = swap12(&x, 1, len, heads, d);
    let mut want = vec![0f32; heads * cap * d];
    for h in 0..heads {
        for p in 0..len {
            for i in 0..d {
                want[(h * cap + at + p) * d + i] = t[(h * len + p) * d + i];
            }
        }
    }
    assert_close("slice_update from a transposed view", &host(&buf), &want, 0.0);
}

/// The KV cache's read: the valid positions of a larger buffer, made contiguous.
#[test]
fn contiguous_copy_of_a_sliced_buffer() {
    let (_g, _backend) = mlx();
    let (heads, cap, d, end) = (2usize, 8usize, 16usize, 5usize);
    let x = Lcg(12).vec(heads * cap * d);
    let a = arr(&x, &[1, heads, cap, d]);
    let v = a
        .try_index((.., .., ..end as i32, ..))
        .unwrap()
        .contiguous()
        .unwrap();
    let mut want = vec![];
    for h in 0..heads {
        want.extend_from_slice(&x[h * cap * d..(h * cap + end) * d]);
    }
    assert_close("contiguous slice", &host(&v), &want, 0.0);
}

/// Attention at the head sizes of the test models (16, 32) and the real ones (64, 128), one
/// query over a cache, keys and values sliced out of a larger buffer.
#[test]
fn attention_of_one_query_at_small_and_real_head_sizes() {
    let (_g, backend) = mlx();
    let mut rng = Lcg(13);
    for d in [16usize, 32, 64, 128] {
        let (hq, hkv, s, cap) = (4usize, 2usize, 9usize, 16usize);
        let q = rng.vec(hq * d);
        let kb = rng.vec(hkv * cap * d);
        let vb = rng.vec(hkv * cap * d);
        let take = |b: &[f32]| -> Vec<f32> {
            (0..hkv)
                .flat_map(|h| b[h * cap * d..(h * cap + s) * d].to_vec())
                .collect()
        };
        let (k, v) = (take(&kb), take(&vb));
        let want = sdpa_ref(&q, &k, &v, hq, hkv, 1, s, d, false);
        for sliced in [false, true] {
            let (ka, va) = if sliced {
                let c = |b: &[f32]| {
                    arr(b, &[1, hkv, cap, d])
                        .try_index((.., .., ..s as i32, ..))
                        .unwrap()
                };
                (c(&kb), c(&vb))
            } else {
                (arr(&k, &[1, hkv, s, d]), arr(&v, &[1, hkv, s, d]))
            };
            let o = fast::scaled_dot_product_attention(
                arr(&q, &[1, hq, 1, d]),
                ka,
                va,
                1.0 / (d as f32).sqrt(),
                None,
                None,
            )
            .unwrap();
            assert_close(
                &format!("sdpa d={d} sliced={sliced}"),
                &host(&o),
                &want,
                mm_tol(backend),
            );
        }
    }
}

/// RoPE of a transposed view at an offset, as the model applies it to q and k.
#[test]
fn rope_of_a_transposed_view_at_an_offset() {
    let (_g, _backend) = mlx();
    let (l, h, d) = (3usize, 2usize, 16usize);
    let x = Lcg(14).vec(l * h * d);
    let view = arr(&x, &[1, l, h, d]).transpose_axes(&[0, 2, 1, 3]).unwrap();
    let y = fast::rope(&view, d as i32, false, 1e6, 1.0, 5, None).unwrap();
    let want = rope_ref(&swap12(&x, 1, l, h, d), h, l, d, d, false, 1e6, 5);
    assert_close("rope of a transposed view", &host(&y), &want, 2e-4);
}

/// The decode path (one token over the KV cache: q/k/v as heads of one reshape, RoPE of q and
/// k in one call, one slice update a buffer) gives the logits of a whole forward of the same
/// tokens, for both attention variants, one candidate and two; and a chunk run in groups of
/// layers gives the logits of one forward.
#[test]
fn decode_steps_over_the_cache_give_the_logits_of_whole_forwards() {
    use crate::{models::Arch, seam::Precision, synthetic};
    let (_g, backend) = mlx();
    let tol = mm_tol(backend) * 10.0;
    for arch in [Arch::Qwen2, Arch::Qwen3] {
        let mut cfg = synthetic::tiny();
        cfg.arch = arch;
        cfg.vocab_size = 512;
        let model = synthetic::random_model(&cfg, Precision::Q8, 64, mlx_rs::Dtype::Float32, 5).unwrap();
        let ids: Vec<u32> = (0..40u32).map(|i| i * 37 % 512).collect();
        let row = |ids: &[u32]| Array::from_slice(ids, &[1, ids.len() as i32]);
        let mut caches = model.new_caches();
        model.forward(&row(&ids[..30]), &mut caches).unwrap();
        let mut pair: Vec<_> = caches.iter().map(|c| c.repeat(2).unwrap()).collect();
        for t in 30..40 {
            let step = model.forward(&row(&ids[t..=t]), &mut caches).unwrap();
            let whole = model.forward(&row(&ids[..=t]), &mut model.new_caches()).unwrap();
            let want = host(&whole);
            assert_close(&format!("{arch:?} step {t}"), &host(&step), &want, tol);
            let both = Array::from_slice(&[ids[t], ids[t]], &[2, 1]);
            let two = host(&model.forward(&both, &mut pair).unwrap());
            let n = want.len();
            assert_close(&format!("{arch:?} step {t}, row 0 of 2"), &two[..n], &want, tol);
            assert_close(&format!("{arch:?} step {t}, row 1 of 2"), &two[n..], &want, tol);
        }
        let mut grouped = model.new_caches();
        model.forward(&row(&ids[..10]), &mut grouped).unwrap();
        let g = model
            .forward_grouped(&row(&ids[10..]), &mut grouped, 2, || true)
            .unwrap()
            .unwrap();
        let whole = model.forward(&row(&ids), &mut model.new_caches()).unwrap();
        assert_close(&format!("{arch:?} grouped"), &host(&g), &host(&whole), tol);
    }
}
