//! Qwen3-MoE (Qwen3-Coder-30B-A3B, …): Qwen3's attention ([`super::qwen3`]) and, in the layers
//! the config makes sparse, a mixture of SwiGLU experts in place of the dense MLP:
//!
//! ```text
//! p = softmax(h' Wr)                             // the router: a probability per expert
//! top = the k largest p_e                        // k = num_experts_per_tok
//! w_e = p_e / sum(p_top)   (norm_topk_prob; else w_e = p_e)
//! x = x + sum over e in top of  w_e * down_e(silu(gate_e(h')) * up_e(h'))
//! ```
//!
//! The experts of a layer are stacked (`[experts, out, in]`, each expert's gate and up rows
//! one matrix) and run through MLX's gathered matmuls, which take each token's experts by
//! index: `gather_qmm` when quantized, `gather_mm` at the source's precision. A decode step's
//! few (token, expert) pairs go in as one row each; a prompt chunk's pairs as blocks of rows
//! of one expert ([`Blocks`]), so a product reads an expert's weights once a block, not once
//! a pair. The renormalised weights are a softmax over the k chosen logits (equal to
//! `p_e / sum(p_top)`), and the weighted sum over the k experts is one `[1, k] x [k, hidden]`
//! product: fewer kernels, the same logits within rounding (docs/decisions.md, "The mixture
//! of experts' fused layer"). MLX's CPU `gather_mm` computes in f32 only: there, dense
//! experts of another float dtype are widened to f32 when loaded, and their rows go in and out
//! at the model's own dtype.
//!
//! Qwen3.5-MoE adds a shared expert, a dense SwiGLU every token runs through, its output
//! scaled by `sigmoid(h' W_sg)` (one value a token) and added to the routed experts' sum.

use std::cell::RefCell;

use mlx_rs::ops::{self, gather_mm, gather_qmm, indexing::TryIndexOp};
use mlx_rs::{Array, Dtype};

use super::{on_gpu, pair, swiglu, Linear, Mlp, ModelConfig, ModelError, MoeConfig, Result, Weights};

pub(super) struct SparseMoeBlock {
    /// The router, `[experts, hidden]`.
    gate: Linear,
    switch_mlp: SwitchGlu,
    top_k: i32,
    norm_topk_prob: bool,
    /// Qwen3.5-MoE's shared expert and its gate (`[1, hidden]`).
    shared: Option<Box<(Mlp, Linear)>>,
}

impl SparseMoeBlock {
    pub(super) fn load(cfg: &ModelConfig, moe: &MoeConfig, w: &mut Weights, prefix: &str) -> Result<Self> {
        let (hidden, experts) = (cfg.hidden_size, moe.num_experts);
        let inter = moe.moe_intermediate_size;
        let expert = |w: &mut Weights, name: &str, out: i32, inp: i32| {
            SwitchLinear::load(w, prefix, name, experts, out, inp)
        };
        let gate_proj = expert(w, "gate_proj", inter, hidden)?;
        let up_proj = expert(w, "up_proj", inter, hidden)?;
        // `[experts, 2 * inter, hidden]`: the gate rows, then the up rows.
        let gate_up = Linear::join(&[gate_proj.0, up_proj.0], |parts| ops::concatenate(&parts, 1))?
            .ok_or_else(|| ModelError::BadTensor {
                name: format!("{prefix}.switch_mlp.up_proj.weight"),
                reason: "the experts' gate and up matrices differ in dtype or quantization".into(),
            })?;
        Ok(SparseMoeBlock {
            gate: w.linear(&format!("{prefix}.gate"), experts, hidden, false)?,
            switch_mlp: SwitchGlu {
                gate_up: SwitchLinear(gate_up),
                down_proj: expert(w, "down_proj", hidden, inter)?,
                inter,
                fused_swiglu: on_gpu(),
            },
            top_k: moe.num_experts_per_tok,
            norm_topk_prob: moe.norm_topk_prob,
            shared: match moe.shared_expert_intermediate_size {
                Some(width) => Some(Box::new((
                    Mlp::load_width(cfg, width, w, &format!("{prefix}.shared_expert"))?,
                    w.linear(&format!("{prefix}.shared_expert_gate"), 1, hidden, false)?,
                ))),
                None => None,
            },
        })
    }

    /// `x`: `[B, L, hidden]`, already normed.
    pub(super) fn forward(&self, x: &Array) -> Result<Array> {
        let (b, l, hidden) = (x.dim(0), x.dim(1), x.dim(2));
        // [B, L, 1, hidden]: each token a one-row matrix, so the router's choices come out
        // as [B, L, 1, k], the shape of the weights the experts' rows are summed with.
        let x = x.reshape(&[b, l, 1, hidden])?;
        let logits = self.gate.forward(&x)?;
        let (experts, k) = (logits.dim(-1), self.top_k);
        // The k largest logits (softmax keeps the order) end up last; their order among
        // themselves is free.
        let inds =
            ops::argpartition_axis(&logits, experts - k, -1)?.try_index((.., .., .., experts - k..))?;
        let scores = if self.norm_topk_prob {
            // exp(l_e) / sum over the top of exp(l_j): the renormalised probabilities.
            ops::softmax_axis(logits.take_along_axis(&inds, -1)?, -1, true)?
        } else {
            ops::softmax_axis(&logits, -1, true)?.take_along_axis(&inds, -1)?
        };
        // [B, L, k, hidden] weighted by [B, L, 1, k]: one product per token.
        let y = self.switch_mlp.forward(&x, &inds)?;
        let w = scores.as_dtype(y.dtype())?;
        let routed = w.matmul(&y)?.reshape(&[b, l, hidden])?;
        let Some((mlp, gate)) = self.shared.as_deref() else {
            return Ok(routed);
        };
        let x = x.reshape(&[b, l, hidden])?;
        let shared = mlp.forward(&x)?.multiply(ops::sigmoid(gate.forward(&x)?)?)?;
        Ok(routed.add(shared.as_dtype(routed.dtype())?)?)
    }

    pub(super) fn arrays(&self) -> Vec<&Array> {
        let mut v = self.gate.arrays();
        let m = &self.switch_mlp;
        for p in [&m.gate_up, &m.down_proj] {
            v.extend(p.0.arrays());
        }
        if let Some((mlp, gate)) = self.shared.as_deref() {
            v.extend(mlp.gate_up.arrays());
            v.extend(mlp.down_proj.arrays());
            v.extend(gate.arrays());
        }
        v
    }

    /// Bytes of the experts one token is not routed to (a decode step does not read them).
    pub(super) fn unread_bytes_per_token(&self) -> usize {
        let m = &self.switch_mlp;
        let experts = m.down_proj.experts() as usize;
        let bytes: usize = [&m.gate_up, &m.down_proj]
            .iter()
            .flat_map(|p| p.0.arrays())
            .map(|a| a.nbytes())
            .sum();
        bytes / experts * (experts - self.top_k as usize)
    }
}

/// `down(silu(gate(x)) * up(x))` with each token's own experts.
struct SwitchGlu {
    /// Gate and up rows of each expert in one matrix: `[experts, 2 * inter, hidden]`.
    gate_up: SwitchLinear,
    down_proj: SwitchLinear,
    inter: i32,
    /// See [`super::swiglu`].
    fused_swiglu: bool,
}

impl SwitchGlu {
    /// `x` `[B, L, 1, hidden]`, `indices` `[B, L, 1, k]` → `[B, L, k, hidden]`, one row per
    /// expert.
    fn forward(&self, x: &Array, indices: &Array) -> Result<Array> {
        let (b, l, k, hidden) = (x.dim(0), x.dim(1), indices.dim(-1), x.dim(-1));
        let y = if indices.size() >= BLOCKS_FROM && sorted_rows() {
            self.forward_sorted(x, indices)?
        } else if indices.size() >= BLOCKS_FROM {
            let rows = block_rows(indices.size() as i32, self.down_proj.experts());
            self.forward_blocks(x, indices, rows)?
        } else {
            self.forward_rows(x, indices)?
        };
        Ok(y.reshape(&[b, l, k, hidden])?)
    }

    /// A few pairs (a decode step): each token's row times each of its k experts, the rows
    /// named by index arrays made on the host (MLX would otherwise build them in the graph:
    /// an arange, a reshape and a broadcast a product).
    fn forward_rows(&self, x: &Array, indices: &Array) -> Result<Array> {
        let (token, pair) = row_indices(indices.shape());
        let gate_up = self.gate_up.forward(x, Some(&token), indices, false)?;
        self.down(&gate_up, Some(&pair), indices, false)
    }

    /// The (token, expert) pairs in blocks of `rows` rows of one expert each (see
    /// [`Blocks`]): each gathered product multiplies whole blocks, not single rows.
    /// `[pairs, hidden]`, the pairs in `indices`' order.
    fn forward_blocks(&self, x: &Array, indices: &Array, rows: i32) -> Result<Array> {
        let hidden = x.dim(-1);
        let blocks = Blocks::new(indices, self.down_proj.experts(), rows)?;
        let xb = x
            .reshape(&[-1, hidden])?
            .take_axis(&blocks.row_token, 0)?
            .reshape(&[-1, rows, hidden])?;
        let gate_up = self.gate_up.forward(&xb, None, &blocks.expert, true)?;
        let y = self.down(&gate_up, None, &blocks.expert, true)?;
        Ok(y.reshape(&[-1, hidden])?.take_axis(&blocks.pair_row, 0)?)
    }

    /// The (token, expert) pairs sorted by expert, one row each, as mlx-lm runs a prompt:
    /// MLX's gathered product over ascending expert indices (on CUDA its `gather_qmm_rhs`
    /// kernel) reads an expert's weights once for its run of rows. `[pairs, hidden]`, the
    /// pairs in `indices`' order.
    fn forward_sorted(&self, x: &Array, indices: &Array) -> Result<Array> {
        let int = |a: Array| a.as_dtype(Dtype::Int32);
        let (hidden, k) = (x.dim(-1), indices.dim(-1));
        let flat = int(indices.flatten(None, None)?)?;
        let order = int(ops::argsort_axis(&flat, 0)?)?;
        let back = int(ops::argsort_axis(&order, 0)?)?;
        let rows = x
            .reshape(&[-1, 1, hidden])?
            .take_axis(order.floor_divide(Array::from_int(k))?, 0)?;
        let experts = flat.take_axis(&order, 0)?;
        let gate_up = self.gate_up.forward(&rows, None, &experts, true)?;
        let y = self.down(&gate_up, None, &experts, true)?;
        Ok(y.reshape(&[-1, hidden])?.take_axis(&back, 0)?)
    }

    fn down(&self, gate_up: &Array, rows: Option<&Array>, indices: &Array, sorted: bool) -> Result<Array> {
        let [gate, up] = pair(ops::split_at_indices(gate_up, &[self.inter], -1)?)?;
        self.down_proj
            .forward(&swiglu(&gate, &up, self.fused_swiglu)?, rows, indices, sorted)
    }
}

thread_local! {
    /// [`row_indices`]' last arrays and the shape they are for: a decode step's shape is the
    /// same in every sparse layer and every step.
    static ROW_INDICES: RefCell<Option<(Vec<i32>, Array, Array)>> = const { RefCell::new(None) };
}

/// For the (token, expert) pairs of an `indices` array of `shape` (`[..., k]`): each pair's
/// token and each pair's own row, made on the host once a shape (on this thread), not once a
/// sparse layer.
fn row_indices(shape: &[i32]) -> (Array, Array) {
    ROW_INDICES.with(|cell| {
        let mut cached = cell.borrow_mut();
        if let Some((s, token, pair)) = cached.as_ref() {
            if s == shape {
                return (token.clone(), pair.clone());
            }
        }
        let k = (*shape.last().unwrap_or(&1)).max(1) as u32;
        let pairs = shape.iter().product::<i32>() as u32;
        let token: Vec<u32> = (0..pairs).map(|p| p / k).collect();
        let pair: Vec<u32> = (0..pairs).collect();
        let (token, pair) = (Array::from_slice(&token, shape), Array::from_slice(&pair, shape));
        *cached = Some((shape.to_vec(), token.clone(), pair.clone()));
        (token, pair)
    })
}

/// From this many (token, expert) pairs on, they run grouped by expert: in blocks of one
/// expert each, or sorted ([`sorted_rows`]).
const BLOCKS_FROM: usize = 64;

thread_local! {
    /// A test's choice between sorted rows and blocks on this thread.
    static SORTED: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Whether a prompt chunk's pairs run as sorted rows rather than blocks: a test's choice on
/// this thread, else `LAYA_MOE_ROWS=sorted` (a measurement's switch while the two are
/// compared on a GPU; docs/decisions.md keeps one).
fn sorted_rows() -> bool {
    static ENV: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    SORTED
        .with(|s| s.get())
        .unwrap_or_else(|| *ENV.get_or_init(|| std::env::var("LAYA_MOE_ROWS").is_ok_and(|v| v == "sorted")))
}

/// Rows a block: half the pairs an expert gets on average, as a power of two from 16 to 64
/// (the tile heights of MLX's CUDA quantized product), so the padding (at most `rows - 1` rows
/// an expert) stays a small part of the rows. Measured on an H100 (synthetic 30B-A3B, q4,
/// tok/s at 512 / 2,048 tokens): 16 rows 6,781 / 9,248, 32 rows 6,323 / 9,977, 64 rows
/// 6,118 / 9,972; this rule takes 16 at 512 tokens and 64 at 2,048 (docs/decisions.md).
fn block_rows(pairs: i32, experts: i32) -> i32 {
    let half_mean = (pairs / experts.max(1) / 2).max(1) as u32;
    (half_mean.next_power_of_two() as i32).clamp(16, 64)
}

/// A prompt chunk's (token, expert) pairs laid out in blocks of `rows` rows that each belong
/// to one expert, experts ascending: expert e's pairs fill `ceil(count_e / rows)` blocks, the
/// last one padded with rows whose output nobody reads. A gathered product over `[blocks,
/// rows, in]` then reads each expert's weights once a block and multiplies `rows` rows with
/// them, instead of one row a (token, expert) pair. The number of blocks is the most the
/// pairs can need (`(pairs + experts * (rows - 1)) / rows`), so the graph's shapes depend on
/// the chunk's length only; the layout is computed on the device (no wait for the router).
struct Blocks {
    /// The token each row takes its input from: `[blocks * rows]`.
    row_token: Array,
    /// The expert of each block: `[blocks]`, ascending.
    expert: Array,
    /// The row each pair's output is in, in the pairs' order (`indices` flattened).
    pair_row: Array,
}

impl Blocks {
    fn new(indices: &Array, experts: i32, rows: i32) -> Result<Blocks> {
        let int = |a: Array| a.as_dtype(Dtype::Int32);
        let k = indices.dim(-1);
        let expert = int(indices.flatten(None, None)?)?;
        let pairs = expert.size() as i32;
        let blocks = (pairs + experts * (rows - 1) + rows - 1) / rows;
        // The pairs in expert order, and the position of each pair in that order.
        let order = int(ops::argsort_axis(&expert, 0)?)?;
        let position = int(ops::argsort_axis(&order, 0)?)?;
        let count = int(expert
            .expand_dims(-1)?
            .eq(Array::arange::<_, i32>(None, experts, None)?)?)?
        .sum_axis(0, false)?;
        // Where each expert's pairs start in expert order, and its padded rows in the blocks.
        let start = count.cumsum(0, None, false)?;
        let padded = count
            .add(Array::from_int(rows - 1))?
            .floor_divide(Array::from_int(rows))?
            .multiply(Array::from_int(rows))?;
        let padded_end = padded.cumsum(0, None, true)?;
        let padded_start = padded_end.subtract(&padded)?;
        // A block belongs to the expert whose padded rows hold its first row; blocks past
        // the last expert's (unused) to the last expert.
        let first_row = Array::arange::<_, i32>(None, blocks * rows, rows)?;
        let block_expert =
            int(first_row.expand_dims(-1)?.ge(padded_end.expand_dims(0)?)?)?.sum_axis(1, false)?;
        let block_expert = ops::minimum(&block_expert, Array::from_int(experts - 1))?;
        // Row r of expert e's blocks holds e's r-th pair in expert order, or is padding.
        let row_expert =
            ops::broadcast_to(block_expert.expand_dims(-1)?, &[blocks, rows])?.flatten(None, None)?;
        let rank = Array::arange::<_, i32>(None, blocks * rows, None)?
            .subtract(padded_start.take_axis(&row_expert, 0)?)?;
        let source = start.take_axis(&row_expert, 0)?.add(&rank)?;
        let real = rank.lt(count.take_axis(&row_expert, 0)?)?;
        let source = ops::select(&real, &source, Array::from_int(0))?;
        let row_token = order.take_axis(&source, 0)?.floor_divide(Array::from_int(k))?;
        let pair_row = padded_start
            .take_axis(&expert, 0)?
            .add(&position)?
            .subtract(start.take_axis(&expert, 0)?)?;
        Ok(Blocks {
            row_token,
            expert: block_expert,
            pair_row,
        })
    }
}

/// One linear map per expert, stacked: `[experts, out, in]`, dense or quantized.
struct SwitchLinear(Linear);

impl SwitchLinear {
    /// Expert matrix `name` of every expert: stored stacked (`{prefix}.switch_mlp.{name}`, as
    /// mlx-community and laya's GGUF mapping name it) or one tensor per expert
    /// (`{prefix}.experts.{e}.{name}`, Hugging Face), stacked here.
    fn load(w: &mut Weights, prefix: &str, name: &str, experts: i32, out: i32, inp: i32) -> Result<Self> {
        let stacked = format!("{prefix}.switch_mlp.{name}");
        let linear = if w.map.contains_key(&format!("{stacked}.weight")) {
            w.stacked_linear(&stacked, &[experts], out, inp, false)?
        } else {
            let parts = (0..experts)
                .map(|e| w.linear(&format!("{prefix}.experts.{e}.{name}"), out, inp, false))
                .collect::<Result<Vec<_>>>()?;
            Linear::stack(&parts)?.ok_or_else(|| ModelError::BadTensor {
                name: format!("{prefix}.experts.*.{name}.weight"),
                reason: "the experts differ in dtype or quantization".into(),
            })?
        };
        Ok(SwitchLinear(match linear {
            Linear::Dense { weight, bias } if !on_gpu() && weight.dtype() != Dtype::Float32 => {
                Linear::Dense {
                    weight: weight.as_dtype(Dtype::Float32)?,
                    bias,
                }
            }
            other => other,
        }))
    }

    fn experts(&self) -> i32 {
        self.0.out_features()
    }

    /// The `[m, in]` matrix of `x` number `rows[...]` (default: `x`'s own batch, broadcast)
    /// times the transposed matrix of expert `indices[...]`: `[..., m, out]` (`sorted`: the
    /// indices ascend).
    fn forward(&self, x: &Array, rows: Option<&Array>, indices: &Array, sorted: bool) -> Result<Array> {
        Ok(match &self.0 {
            Linear::Dense { weight, .. } => {
                let xw = x.as_dtype(weight.dtype())?;
                gather_mm(xw, weight.swap_axes(-1, -2)?, rows, indices, sorted)?.as_dtype(x.dtype())?
            }
            Linear::Quantized {
                weight,
                scales,
                biases,
                spec,
                ..
            } => gather_qmm(
                x,
                weight,
                scales,
                biases,
                rows,
                indices,
                true,
                spec.group_size,
                spec.bits,
                sorted,
            )?,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeSet, HashMap};

    use mlx_rs::{Array, Dtype};

    use super::super::test_util::*;
    use super::super::{Arch, FeedForward, Linear, Model, ModelConfig, ModelError, MoeConfig, QuantSpec};
    use super::*;

    /// 40 tokens: 80 (token, expert) pairs, over [`BLOCKS_FROM`], so a prefill of them runs in blocks.
    fn long_seq() -> Vec<u32> {
        (0..40u32).map(|i| (i * 37 + 11) % 97).collect()
    }

    fn short_seq() -> Vec<u32> {
        vec![3, 17, 42, 5, 96, 0, 11, 64, 23, 8, 77, 31]
    }

    /// The configurations the tests cover: all layers sparse with renormalized or raw top-k
    /// probabilities, and two mixed layouts of dense and sparse layers.
    fn configs() -> Vec<(&'static str, ModelConfig)> {
        let base = tiny_config(Arch::Qwen3Moe);
        let with = |f: &dyn Fn(&mut ModelConfig)| {
            let mut c = base.clone();
            f(&mut c);
            c
        };
        fn moe(c: &mut ModelConfig) -> &mut MoeConfig {
            c.moe.as_mut().unwrap()
        }
        vec![
            ("top-2 of 8, renormalized", base.clone()),
            (
                "top-2 of 8, raw probabilities",
                with(&|c| moe(c).norm_topk_prob = false),
            ),
            (
                "3 layers, mlp_only_layers [1]",
                with(&|c| {
                    c.num_hidden_layers = 3;
                    moe(c).mlp_only_layers = vec![1];
                }),
            ),
            ("decoder_sparse_step 2", with(&|c| moe(c).decoder_sparse_step = 2)),
        ]
    }

    fn logits_of(model: &Model, ids: &[u32]) -> Array {
        model.forward_all(&tokens(ids), &mut model.new_caches()).unwrap()
    }

    fn as_array(want: Vec<Vec<f32>>, shape: &[i32]) -> Array {
        let flat: Vec<f32> = want.into_iter().flatten().collect();
        Array::from_slice(&flat, shape)
    }

    fn sparse_layers(model: &Model) -> Vec<bool> {
        model
            .layers
            .iter()
            .map(|l| matches!(l.mlp, FeedForward::Sparse(_)))
            .collect()
    }

    /// The logits of prefills of 12 tokens (a row a pair) and 40 tokens (blocks) match the
    /// host's f32 reference, and those tokens were routed to many different experts.
    #[test]
    fn forward_matches_reference() {
        let mut worst = 0f32;
        for (seed, (what, cfg)) in configs().into_iter().enumerate() {
            let w = random_weights(&cfg, 40 + seed as u64);
            let model = Model::from_weights(cfg.clone(), to_device(&w), 64).unwrap();
            let moe = cfg.moe.as_ref().unwrap();
            let layout: Vec<bool> = (0..cfg.num_hidden_layers).map(|l| moe.is_sparse(l)).collect();
            assert_eq!(sparse_layers(&model), layout, "{what}");
            assert!(layout.contains(&true) && (what.starts_with("top") || layout.contains(&false)));
            for ids in [short_seq(), long_seq()] {
                let got = logits_of(&model, &ids);
                let (want, routes) = reference_forward_routed(&cfg, &w, &ids);
                let want = as_array(want, got.shape());
                let diff = max_abs_diff(&got, &want);
                eprintln!("{what}, {} tokens: max |laya - reference| = {diff:e}", ids.len());
                assert!(diff <= 1e-4, "{what}, {} tokens: max abs diff {diff}", ids.len());
                worst = worst.max(diff);
                // Not vacuous: the tokens took many experts, and not all the same ones.
                let sparse = layout.iter().position(|&s| s).unwrap();
                let per_token: Vec<&Vec<usize>> = routes[sparse].iter().collect();
                let used: BTreeSet<usize> = per_token.iter().flat_map(|r| r.iter().copied()).collect();
                let distinct: BTreeSet<BTreeSet<usize>> =
                    per_token.iter().map(|r| r.iter().copied().collect()).collect();
                assert!(
                    used.len() >= 6 && distinct.len() >= 4,
                    "{what}: {used:?}, {distinct:?}"
                );
            }
        }
        eprintln!("worst max |laya - reference| over all: {worst:e}");
    }

    /// The block (prefill) and row (decode) paths agree: a prompt run whole, token by token
    /// and in chunks on both sides of the blocks' threshold gives the same logits.
    #[test]
    fn cached_equals_uncached_across_the_blocks_threshold() {
        for (seed, (what, cfg)) in configs().into_iter().enumerate() {
            let model = Model::from_weights(
                cfg.clone(),
                to_device(&random_weights(&cfg, 50 + seed as u64)),
                64,
            )
            .unwrap();
            let ids = long_seq();
            let run = |chunks: &[usize]| chunked(&model, &ids, chunks);
            let whole = run(&[40]);
            let one_by_one = run(&[1; 40]);
            // 33 tokens (66 pairs) run in blocks, the 7 after them (14 pairs) a row a pair.
            let chunked = run(&[33, 7]);
            let (d1, d2) = (max_abs_diff(&whole, &one_by_one), max_abs_diff(&whole, &chunked));
            eprintln!("{what}: whole vs one by one {d1:e}, vs chunks 33 + 7 {d2:e}");
            assert!(d1 <= tol(1e-4) && d2 <= tol(1e-4), "{what}: {d1} {d2}");
        }
    }

    /// Sorted rows give the logits blocks give, for a dense and a quantized model, in one chunk
    /// and across the threshold.
    #[test]
    fn sorted_rows_give_the_logits_of_blocks() {
        let (_, cfg) = configs().into_iter().next().unwrap();
        let w = random_weights(&cfg, 61);
        let (q, _) = loader_quantized(&w, 64, 4);
        for (what, model) in [
            (
                "dense",
                Model::from_weights(cfg.clone(), to_device(&w), 64).unwrap(),
            ),
            ("q4", Model::from_weights(cfg.clone(), q, 64).unwrap()),
        ] {
            let ids = long_seq();
            let run = |sorted: bool| {
                SORTED.with(|s| s.set(Some(sorted)));
                let out = [chunked(&model, &ids, &[40]), chunked(&model, &ids, &[33, 7])];
                SORTED.with(|s| s.set(None));
                out
            };
            let (blocks, sorted) = (run(false), run(true));
            for (b, s) in blocks.iter().zip(&sorted) {
                let d = max_abs_diff(b, s);
                assert!(d <= tol(1e-4), "{what}: sorted rows against blocks: {d}");
            }
        }
    }

    /// The block layout on the host: each pair's output row is a real row of its own expert's
    /// blocks that takes its token's input, blocks ascend by expert, and no two pairs share a
    /// row; for several block heights and routings (one expert taking every pair included).
    #[test]
    fn blocks_hold_each_pair_once_in_a_block_of_its_expert() {
        let host = |a: &Array| a.as_dtype(Dtype::Int32).unwrap().as_slice::<i32>().to_vec();
        let routings: Vec<(i32, Vec<i32>)> = vec![
            (8, (0..80).map(|i| (i * 5 + i / 7) % 8).collect()),
            (8, vec![3; 40]),
            (16, (0..64).map(|i| (i * i + 3) % 16).collect()),
            (4, vec![0, 3, 0, 3, 1, 1, 0, 2, 2, 2, 3, 0]),
        ];
        for (experts, flat) in routings {
            let k = 2;
            let indices = Array::from_slice(&flat, &[1, flat.len() as i32 / k, k]);
            for rows in [1, 3, 4, 16, 64] {
                let b = Blocks::new(&indices, experts, rows).unwrap();
                let (row_token, block_expert, pair_row) =
                    (host(&b.row_token), host(&b.expert), host(&b.pair_row));
                assert_eq!(row_token.len(), block_expert.len() * rows as usize);
                assert!(block_expert.windows(2).all(|w| w[0] <= w[1]), "{block_expert:?}");
                let mut seen = BTreeSet::new();
                for (p, &row) in pair_row.iter().enumerate() {
                    let row = row as usize;
                    assert!(seen.insert(row), "rows {rows}: row {row} twice");
                    assert_eq!(row_token[row], p as i32 / k, "rows {rows}: pair {p}'s token");
                    assert_eq!(
                        block_expert[row / rows as usize],
                        flat[p],
                        "rows {rows}: pair {p}'s expert"
                    );
                }
            }
        }
        assert_eq!(block_rows(4096, 128), 16);
        assert_eq!(block_rows(16384, 128), 64);
        assert_eq!(block_rows(80, 8), 16);
    }

    /// Whatever the block height, a prefill's logits are those of one row a pair.
    #[test]
    fn every_block_height_gives_the_logits_of_one_row_a_pair() {
        let cfg = tiny_config(Arch::Qwen3Moe);
        let w = random_weights(&cfg, 45);
        let (q, _) = quantized_pair(&w, 64, 4);
        for (what, weights) in [("q4", q), ("f32", to_device(&w))] {
            let model = Model::from_weights(cfg.clone(), weights, 64).unwrap();
            let FeedForward::Sparse(block) = &model.layers[0].mlp else {
                panic!("dense")
            };
            let x = Array::from_slice(
                &(0..40 * 64)
                    .map(|i| ((i * 7919) % 113) as f32 / 113.0 - 0.5)
                    .collect::<Vec<_>>(),
                &[1, 40, 64],
            );
            let indices = Array::from_slice(
                &(0..80).map(|i| (i * 3 + i / 5) % 8).collect::<Vec<i32>>(),
                &[1, 40, 2],
            );
            let m = &block.switch_mlp;
            let x = x.reshape(&[1, 40, 1, 64]).unwrap();
            let indices = indices.reshape(&[1, 40, 1, 2]).unwrap();
            let one_row = m.forward_rows(&x, &indices).unwrap().reshape(&[80, 64]).unwrap();
            for rows in [1, 4, 16, 64] {
                let blocks = m.forward_blocks(&x, &indices, rows).unwrap();
                assert_eq!(blocks.shape(), one_row.shape());
                let diff = max_abs_diff(&blocks, &one_row);
                assert!(diff <= 1e-5, "{what}, {rows} rows: {diff}");
            }
        }
    }

    fn spec(l: &SwitchLinear) -> Option<QuantSpec> {
        match &l.0 {
            Linear::Quantized { spec, .. } => Some(*spec),
            Linear::Dense { .. } => None,
        }
    }

    /// `w` quantized as the loader quantizes a checkpoint (the router kept at 8 bits), and the
    /// values that quantization leaves, on the host.
    fn loader_quantized(w: &HostWeights, gs: i32, bits: i32) -> (HashMap<String, Array>, HostWeights) {
        let opts = crate::load::LoadOptions {
            precision: match bits {
                4 => crate::seam::Precision::Q4,
                6 => crate::seam::Precision::Q6,
                _ => crate::seam::Precision::Q8,
            },
            group_size: gs,
            ..Default::default()
        };
        let mut q = HashMap::new();
        for (name, (data, shape)) in w {
            let a = Array::from_slice(data, shape);
            crate::load::insert_weight(&mut q, name.clone(), a, &opts, std::path::Path::new("test")).unwrap();
        }
        let mut deq = w.clone();
        for (name, (data, _)) in deq.iter_mut() {
            let stem = name.trim_end_matches(".weight");
            let Some(scales) = q.get(&format!("{stem}.scales")) else {
                continue;
            };
            let wq = &q[name];
            let b = wq.dim(-1) * 32 / scales.dim(-1) / gs;
            let d = ops::dequantize(wq, scales, &q[&format!("{stem}.biases")], gs, b).unwrap();
            *data = d.as_slice::<f32>().to_vec();
        }
        (q, deq)
    }

    /// Quantized experts (gather_qmm) compute what the reference computes on the dequantized
    /// weights; against the original weights they differ by what the bits lose (a share of
    /// the logits' spread; measured: 0.15-0.24 at q4, 0.03-0.04 at q6, 0.01 at q8, as the dense
    /// Qwen3 of the same size loses 0.15, 0.04 and 0.01: a token sent to other experts than
    /// the f32 router picks moves more than rounding does, the rest is the same).
    #[test]
    fn quantized_matches_reference_on_dequantized_weights() {
        for (gs, bits, loss) in [(64, 4, 0.3), (32, 4, 0.3), (64, 6, 0.06), (64, 8, 0.015)] {
            for (what, cfg) in configs().into_iter().take(2) {
                let w = random_weights(&cfg, 60);
                let (q, deq) = loader_quantized(&w, gs, bits);
                let qm = Model::from_weights(cfg.clone(), q, gs).unwrap();
                let FeedForward::Sparse(block) = &qm.layers[0].mlp else {
                    panic!("dense")
                };
                let want_spec = Some(QuantSpec { group_size: gs, bits });
                assert_eq!(spec(&block.switch_mlp.down_proj), want_spec);
                assert_eq!(spec(&block.switch_mlp.gate_up), want_spec);
                assert!(matches!(block.gate, Linear::Quantized { spec, .. } if spec.bits == 8));
                let ids = long_seq();
                let got = logits_of(&qm, &ids);
                let exact = max_abs_diff(&got, &as_array(reference_forward(&cfg, &deq, &ids), got.shape()));
                let orig = as_array(reference_forward(&cfg, &w, &ids), got.shape());
                let (rel, agree) = relative_error(&got, &orig);
                eprintln!(
                    "q{bits} g{gs}, {what}: vs dequantized reference max {exact:e}; vs f32 reference max {:e}, mean {rel:.4} of the spread, argmax agrees at {agree:.3}",
                    max_abs_diff(&got, &orig)
                );
                assert!(exact <= 1e-4, "q{bits} g{gs} {what}: {exact}");
                assert!(rel <= loss, "q{bits} g{gs} {what}: {rel}");
            }
        }
    }

    /// Joins each expert's tensors (`mlp.experts.{e}.{proj}.{weight,scales,biases}`) into
    /// mlx-community's stacked ones (`mlp.switch_mlp.{proj}.…`).
    fn stacked(cfg: &ModelConfig, mut w: HashMap<String, Array>) -> HashMap<String, Array> {
        let moe = cfg.moe.as_ref().unwrap();
        for l in (0..cfg.num_hidden_layers).filter(|&l| moe.is_sparse(l)) {
            for proj in ["gate_proj", "up_proj", "down_proj"] {
                for part in ["weight", "scales", "biases"] {
                    let name = |e: i32| format!("model.layers.{l}.mlp.experts.{e}.{proj}.{part}");
                    let Some(parts) = (0..moe.num_experts)
                        .map(|e| w.remove(&name(e)))
                        .collect::<Option<Vec<_>>>()
                    else {
                        continue;
                    };
                    let joined = ops::stack(&parts, 0).unwrap();
                    w.insert(format!("model.layers.{l}.mlp.switch_mlp.{proj}.{part}"), joined);
                }
            }
        }
        w
    }

    /// mlx-community's stacked experts and Hugging Face's one tensor per expert load to the
    /// same model, quantized and dense.
    #[test]
    fn stacked_and_per_expert_tensors_load_alike() {
        let cfg = tiny_config(Arch::Qwen3Moe);
        let w = random_weights(&cfg, 70);
        let (q, _) = quantized_pair(&w, 64, 4);
        for (what, per_expert) in [("q4", q), ("f32", to_device(&w))] {
            let whole = stacked(&cfg, per_expert.clone());
            assert!(whole.contains_key("model.layers.1.mlp.switch_mlp.down_proj.weight"));
            assert!(!whole.keys().any(|k| k.contains(".experts.")));
            let a = Model::from_weights(cfg.clone(), per_expert, 64).unwrap();
            let b = Model::from_weights(cfg.clone(), whole, 64).unwrap();
            let ids = long_seq();
            let diff = max_abs_diff(&logits_of(&a, &ids), &logits_of(&b, &ids));
            assert!(diff <= 1e-6, "{what}: {diff}");
        }
    }

    /// Experts at bf16 (gather_mm at the source's precision) run close to f32, and the KV
    /// cache keeps their dtype.
    #[test]
    fn bf16_experts_run_close_to_f32() {
        let cfg = tiny_config(Arch::Qwen3Moe);
        let w = to_device(&random_weights(&cfg, 80));
        let half = cast(&w, Dtype::Bfloat16);
        let full = Model::from_weights(cfg.clone(), w, 64).unwrap();
        let half = Model::from_weights(cfg.clone(), half, 64).unwrap();
        let FeedForward::Sparse(block) = &half.layers[0].mlp else {
            panic!("dense")
        };
        let Linear::Dense { weight, .. } = &block.switch_mlp.gate_up.0 else {
            panic!("quantized")
        };
        // The experts stay bf16 on a GPU; MLX's CPU gather_mm needs them f32.
        let expert_dtype = if on_gpu() { Dtype::Bfloat16 } else { Dtype::Float32 };
        assert_eq!(weight.dtype(), expert_dtype);
        let ids = long_seq();
        let mut caches = half.new_caches();
        let b = half.forward_all(&tokens(&ids), &mut caches).unwrap();
        assert_eq!(caches[0].state().unwrap().0.dtype(), Dtype::Bfloat16);
        // bf16 rounding may send a token to another expert: measured as a share of the spread.
        let a = logits_of(&full, &ids);
        let (rel, agree) = relative_error(&b, &a);
        eprintln!(
            "bf16 vs f32: max {:e}, mean {rel:.4} of the spread, argmax agrees at {agree:.3}",
            max_abs_diff(&a, &b)
        );
        assert!(rel < 0.03, "bf16 vs f32 {rel}");
        // Quantized from bf16: bf16 scales and activations through gather_qmm.
        let (q, _) = quantized_pair(&random_weights(&cfg, 80), 64, 8);
        let q: HashMap<String, Array> = q
            .into_iter()
            .map(|(k, a)| match a.dtype() {
                Dtype::Float32 => (k, a.as_dtype(Dtype::Bfloat16).unwrap()),
                _ => (k, a),
            })
            .collect();
        let qm = Model::from_weights(cfg, q, 64).unwrap();
        let (rel, agree) = relative_error(&logits_of(&qm, &ids), &a);
        eprintln!("q8 with bf16 scales vs f32: mean {rel:.4} of the spread, argmax agrees at {agree:.3}");
        assert!(rel < 0.05, "q8 bf16 vs f32 {rel}");
    }

    #[test]
    fn bad_experts_and_configs_are_errors() {
        let cfg = tiny_config(Arch::Qwen3Moe);
        let w = random_weights(&cfg, 90);
        let mut missing = to_device(&w);
        missing.remove("model.layers.1.mlp.experts.5.up_proj.weight");
        let err = Model::from_weights(cfg.clone(), missing, 64).err().unwrap();
        assert!(
            matches!(&err, ModelError::MissingTensor(n) if n == "model.layers.1.mlp.experts.5.up_proj.weight")
        );

        // One expert quantized, the others dense: they cannot be stacked.
        let (q, _) = quantized_pair(&w, 64, 8);
        let mut mixed = to_device(&w);
        for part in ["weight", "scales", "biases"] {
            let k = format!("model.layers.0.mlp.experts.3.gate_proj.{part}");
            mixed.insert(k.clone(), q[&k].clone());
        }
        let err = Model::from_weights(cfg.clone(), mixed, 64).err().unwrap();
        assert!(
            matches!(&err, ModelError::BadTensor { name, .. } if name == "model.layers.0.mlp.experts.*.gate_proj.weight"),
            "{err}"
        );

        // A stacked tensor of the wrong expert count.
        let mut short = stacked(&cfg, to_device(&w));
        let k = "model.layers.0.mlp.switch_mlp.up_proj.weight";
        short.insert(k.into(), Array::zeros::<f32>(&[7, 64, 64]).unwrap());
        let err = Model::from_weights(cfg.clone(), short, 64).err().unwrap();
        assert_eq!(
            err.to_string(),
            format!("tensor `{k}`: expected shape [8, 64, 64], found [7, 64, 64]")
        );

        let broken = |f: &dyn Fn(&mut ModelConfig)| {
            let mut c = cfg.clone();
            f(&mut c);
            matches!(
                Model::from_weights(c, to_device(&w), 64),
                Err(ModelError::Config(_))
            )
        };
        assert!(broken(&|c| c.moe.as_mut().unwrap().num_experts_per_tok = 9));
        assert!(broken(&|c| c.moe.as_mut().unwrap().decoder_sparse_step = 0));
        assert!(broken(&|c| c.moe = None));
        assert!(broken(&|c| c.arch = Arch::Qwen3));
    }

    /// A decode step reads the experts of one token only (the 30B-A3B's parameter count is
    /// the catalog's test, `qwen3_coder_30b_a3b_counts_the_parameters_of_its_model_card`).
    #[test]
    fn parameters_and_bytes_read_per_token() {
        let model = tiny_model(Arch::Qwen3Moe, 95);
        let FeedForward::Sparse(block) = &model.layers[0].mlp else {
            panic!("dense")
        };
        let m = &block.switch_mlp;
        let experts: usize = [&m.gate_up, &m.down_proj]
            .iter()
            .flat_map(|p| p.0.arrays())
            .map(|a| a.nbytes())
            .sum();
        // Untied: the whole embedding table but one row is not read; of 8 experts, 6 are not.
        let embed = 97 * 64 * 4;
        let unread = 2 * experts * 6 / 8;
        assert_eq!(
            model.weight_bytes_per_token(),
            model.nbytes() - embed + 64 * 4 - unread
        );
    }
}
