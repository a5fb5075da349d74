//! Choosing the next token from logits.
//!
//! Greedy (temperature 0) stays on the device: an argmax per row, so only one integer per row
//! comes back to the host and the token can feed the next step before it is read. Otherwise
//! the logits come to the host and the chain runs as llama.cpp's default does: top-k, then
//! top-p over the softmax of what is left, then temperature, then a draw from a seeded RNG,
//! so a given seed gives the same tokens.

use mlx_rs::error::{Exception, Result};
use mlx_rs::ops::indexing::argmax_axis;
use mlx_rs::{Array, ArrayElement, Dtype};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::seam::SamplingParams;

/// Sampling parameters with the RNG state they imply.
pub(crate) struct Sampler {
    params: SamplingParams,
    rng: StdRng,
    /// Candidates of the row being sampled, reused across calls.
    scratch: Vec<(f32, u32)>,
}

/// Nucleus sampling first sorts only this many best candidates; all of them only when
/// these do not reach `top_p`.
const NUCLEUS_PRESELECT: usize = 1024;

impl Sampler {
    pub(crate) fn new(params: SamplingParams) -> Self {
        let rng = match params.seed {
            Some(s) => StdRng::seed_from_u64(s),
            None => StdRng::from_entropy(),
        };
        Sampler {
            params,
            rng,
            scratch: vec![],
        }
    }

    pub(crate) fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Next token per row of `logits` (`[B, vocab]`) as a `[B]` uint32 array: a lazy device
    /// argmax when greedy, else sampled on the host (and so already evaluated).
    pub(crate) fn sample(&mut self, logits: &Array) -> Result<Array> {
        if self.params.is_greedy() {
            return argmax_axis(logits, -1, false)?.as_dtype(Dtype::Uint32);
        }
        let rows = logits.dim(0);
        // Contiguous: the rows of `n` candidates may be one broadcast row.
        let host = logits.as_dtype(Dtype::Float32)?.contiguous()?;
        let host = host_slice::<f32>(&host)?;
        let vocab = host.len() / rows.max(1) as usize;
        let ids: Vec<u32> = host.chunks(vocab).map(|r| self.sample_row(r)).collect();
        Ok(Array::from_slice(&ids, &[rows]))
    }

    /// One token from one row of logits, on the host.
    pub(crate) fn sample_row(&mut self, logits: &[f32]) -> u32 {
        let p = &self.params;
        if p.is_greedy() || logits.len() < 2 {
            return argmax_row(logits);
        }
        let c = &mut self.scratch;
        c.clear();
        c.extend(logits.iter().enumerate().map(|(i, &l)| (l, i as u32)));
        // Best first; equal logits by lower id, as llama.cpp orders them.
        let better = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        let keep = if p.top_k == 0 {
            c.len()
        } else {
            p.top_k.min(c.len())
        };
        if keep < c.len() {
            c.select_nth_unstable_by(keep - 1, better);
            c.truncate(keep);
        }
        if p.top_p < 1.0 {
            // Nucleus of the top-k set, by its softmax at temperature 1 (llama.cpp's order).
            let max = c.iter().map(|x| x.0).fold(f32::NEG_INFINITY, f32::max);
            let mass = |x: &(f32, u32)| ((x.0 - max) as f64).exp();
            let target = p.top_p.max(0.0) as f64 * c.iter().map(mass).sum::<f64>();
            let nucleus = |sorted: &[(f32, u32)]| {
                let mut acc = 0.0;
                sorted.iter().position(|x| {
                    acc += mass(x);
                    acc >= target
                })
            };
            // Sort only the best few unless they fall short of `top_p`.
            let pre = c.len().min(NUCLEUS_PRESELECT);
            if pre < c.len() {
                c.select_nth_unstable_by(pre - 1, better);
            }
            c[..pre].sort_unstable_by(better);
            let n = match nucleus(&c[..pre]) {
                Some(i) => i + 1,
                None => {
                    c.sort_unstable_by(better);
                    nucleus(c).map_or(c.len(), |i| i + 1)
                }
            };
            c.truncate(n);
        }
        let kept = &c[..];
        let max = kept.iter().map(|x| x.0).fold(f32::NEG_INFINITY, f32::max);
        let t = p.temperature as f64;
        let weight = |l: f32| ((l - max) as f64 / t).exp();
        let total: f64 = kept.iter().map(|x| weight(x.0)).sum();
        let mut u = self.rng.gen::<f64>() * total;
        for x in kept {
            u -= weight(x.0);
            if u < 0.0 {
                return x.1;
            }
        }
        kept.last().map_or(0, |x| x.1)
    }
}

/// The evaluated data of a row-contiguous array, as an MLX error when it is not one.
pub(crate) fn host_slice<T: ArrayElement>(a: &Array) -> Result<&[T]> {
    a.try_as_slice::<T>()
        .map_err(|e| Exception::custom(format!("reading {:?} {:?}: {e}", a.dtype(), a.shape())))
}

/// Index of the largest logit, the lowest index among equals (llama.cpp's greedy choice).
pub(crate) fn argmax_row(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(temperature: f32, top_p: f32, top_k: usize, seed: u64) -> Sampler {
        Sampler::new(SamplingParams {
            temperature,
            top_p,
            top_k,
            seed: Some(seed),
        })
    }

    fn rows() -> (Vec<f32>, Array) {
        let v: Vec<f32> = vec![
            0.1, 2.0, -1.0, 2.0, 0.5, // tie at 1 and 3: lowest id wins
            -3.0, -2.0, -1.0, -0.5, 4.0,
        ];
        let a = Array::from_slice(&v, &[2, 5]);
        (v, a)
    }

    #[test]
    fn greedy_is_argmax_with_lowest_id_on_ties() {
        let (v, a) = rows();
        let got = sampler(0.0, 1.0, 0, 0).sample(&a).unwrap();
        assert_eq!(got.dtype(), Dtype::Uint32);
        assert_eq!(got.as_slice::<u32>(), &[1, 4]);
        assert_eq!(argmax_row(&v[..5]), 1);
        assert_eq!(sampler(0.0, 1.0, 0, 0).sample_row(&v[5..]), 4);
    }

    #[test]
    fn top_k_one_and_tiny_top_p_are_greedy() {
        let mut rng = StdRng::seed_from_u64(1);
        for seed in 0..20 {
            let logits: Vec<f32> = (0..300).map(|_| rng.gen_range(-3.0..3.0)).collect();
            let want = argmax_row(&logits);
            assert_eq!(sampler(1.5, 1.0, 1, seed).sample_row(&logits), want);
            assert_eq!(sampler(1.5, 1e-6, 0, seed).sample_row(&logits), want);
            assert_eq!(sampler(1.5, 1e-6, 50, seed).sample_row(&logits), want);
        }
        let (_, a) = rows();
        let got = sampler(1.0, 1.0, 1, 3).sample(&a).unwrap();
        assert_eq!(got.as_slice::<u32>(), &[1, 4]);
    }

    #[test]
    fn same_seed_same_tokens() {
        let mut rng = StdRng::seed_from_u64(2);
        let logits: Vec<f32> = (0..2000).map(|_| rng.gen_range(-2.0..2.0)).collect();
        let draw = |seed, top_p, top_k| {
            let mut s = sampler(0.9, top_p, top_k, seed);
            (0..50).map(|_| s.sample_row(&logits)).collect::<Vec<_>>()
        };
        for (p, k) in [(1.0, 0), (0.9, 0), (0.95, 40), (1.0, 40)] {
            assert_eq!(draw(7, p, k), draw(7, p, k));
            assert_ne!(draw(7, p, k), draw(8, p, k), "p {p} k {k}");
        }
    }

    #[test]
    fn temperature_sampling_follows_softmax() {
        let logits = [1.0f32, 2.0, 0.5, -1.0];
        for t in [1.0f32, 0.5] {
            let z: f32 = logits.iter().map(|l| (l / t).exp()).sum();
            let want: Vec<f32> = logits.iter().map(|l| (l / t).exp() / z).collect();
            let mut s = sampler(t, 1.0, 0, 42);
            let n = 20_000;
            let mut counts = [0usize; 4];
            for _ in 0..n {
                counts[s.sample_row(&logits) as usize] += 1;
            }
            for (c, w) in counts.iter().zip(&want) {
                let f = *c as f32 / n as f32;
                assert!((f - w).abs() < 0.015, "t {t}: freq {f} vs {w}");
            }
        }
    }

    #[test]
    fn top_k_and_top_p_restrict_the_support() {
        // softmax ≈ [0.64, 0.24, 0.09, 0.03]
        let logits = [3.0f32, 2.0, 1.0, 0.0];
        let support = |top_p, top_k| {
            let mut s = sampler(1.0, top_p, top_k, 5);
            let mut seen = [false; 4];
            for _ in 0..2000 {
                seen[s.sample_row(&logits) as usize] = true;
            }
            seen
        };
        assert_eq!(support(1.0, 2), [true, true, false, false]);
        assert_eq!(support(0.8, 0), [true, true, false, false]);
        assert_eq!(support(0.95, 0), [true, true, true, false]);
        assert_eq!(support(0.95, 2), [true, true, false, false]);
        assert_eq!(support(1.0, 0), [true; 4]);
    }

    #[test]
    fn nucleus_beyond_the_preselected_candidates() {
        // Flat distribution over 5000 ids: the nucleus needs far more than 1024 of them.
        let logits = vec![0.0f32; 5000];
        let mut s = sampler(1.0, 0.9, 0, 9);
        let max = (0..3000).map(|_| s.sample_row(&logits)).max().unwrap();
        assert!(max > 2000, "max id {max}");
    }
}
