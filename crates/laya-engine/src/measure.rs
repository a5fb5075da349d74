//! The engine's measurements, for `laya bench engine`: load time, prefill throughput, decode
//! latency (after a short and a long prompt), how close decode comes to the memory-bandwidth
//! floor (every weight byte read once per token), the ops of one decode step, what checking a
//! full draft costs, and how long a cancelled request keeps the model after its flag is set
//! (cancel → free), while it prefills and while it decodes.
//!
//! Boundary: it times a `Model` from the inside (prefill, decode, forwards, the cancel flag)
//! and returns rows of numbers with their printed form; which models to measure (the catalog's
//! names, files), where rows are written and the llama.cpp peer are the caller's. Every row is
//! measured on the device the caller selected, after an untimed warm-up of each shape.
//!
//! Start with [`measure`].

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use mlx_rs::{transforms::eval, Array, Dtype};

use crate::{
    cache::KvCache,
    cancel::Cancel,
    draft::DRAFT_MAX,
    generate::{
        generate, prefill, Chunking, Control, GenerateError, GenerateRequest, Meter, Pacing, PREFILL_CHUNK,
    },
    load::{self, EngineLoadError, LoadOptions},
    models::{Model, ModelError, Shape},
    runtime::{graph_primitives, kernels},
    seam::Precision,
    synthetic,
};

/// Why a measurement failed: a load, MLX, a generation, or a check of its own; its causes
/// follow as [`source`](std::error::Error::source).
#[derive(Debug)]
pub struct MeasureError(Box<dyn std::error::Error + Send + Sync>);

impl MeasureError {
    fn msg(message: impl Into<String>) -> MeasureError {
        MeasureError(message.into().into())
    }
}

impl std::fmt::Display for MeasureError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for MeasureError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

macro_rules! from_errors {
    ($($t:ty),*) => {$(
        impl From<$t> for MeasureError {
            fn from(e: $t) -> MeasureError {
                MeasureError(Box::new(e))
            }
        }
    )*};
}
from_errors!(
    EngineLoadError,
    GenerateError,
    ModelError,
    mlx_rs::error::Exception,
    std::io::Error
);

fn ensure(ok: bool, message: impl FnOnce() -> String) -> Result<(), MeasureError> {
    match ok {
        true => Ok(()),
        false => Err(MeasureError::msg(message())),
    }
}

/// What to measure one model on.
pub struct Target {
    /// Label in the table.
    pub label: String,
    pub source: Source,
}

pub enum Source {
    /// A GGUF file or model folder.
    File(std::path::PathBuf),
    /// Random weights of a real model's shape (the catalog's models).
    Synthetic(Shape),
}

pub struct Settings {
    pub precisions: Vec<Precision>,
    pub group_size: i32,
    pub prefill_lengths: Vec<usize>,
    pub decode_tokens: usize,
    /// Memory bandwidth in GB/s for the floor; `None` measures the host's copy bandwidth.
    pub bandwidth_gbs: Option<f64>,
    /// The device selected ([`use_device`](crate::runtime::use_device)'s description):
    /// synthetic weights are bf16 on a GPU, f32 on the CPU.
    pub device: String,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Row {
    pub model: String,
    pub(crate) synthetic: bool,
    pub(crate) device: String,
    pub precision: String,
    pub(crate) load_s: f64,
    /// (prompt length, tokens per second), the second run at that length.
    pub prefill_tok_s: Vec<(usize, f64)>,
    /// The same for the first run at each length (it pays for kernels first compiled for that
    /// shape); empty where not measured.
    #[serde(default)]
    pub(crate) prefill_first_tok_s: Vec<(usize, f64)>,
    /// The primitives of one decode step's graph by name (see [`decode_step_ops`]); empty
    /// where not counted.
    #[serde(default)]
    pub(crate) decode_step_ops: std::collections::BTreeMap<String, usize>,
    pub decode_ms_per_token: f64,
    /// Decode after a long prompt (its length first): what a completion at the end of a
    /// file's window pays, attention over that many keys included; ms a token and where they
    /// go on the host (the ops not counted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) decode_long: Option<(usize, StepTimes)>,
    /// Where laya's own primitives took the measured path (CUDA): the same decode after a
    /// 128-token prompt on each path, side by side in one run (see [`PathsCompared`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) paths: Option<PathsCompared>,
    pub(crate) weight_bytes_per_token: u64,
    pub(crate) bandwidth_gbs: f64,
    pub(crate) floor_ms_per_token: f64,
    /// floor / measured: 1.0 would read every weight byte at full bandwidth.
    pub(crate) share_of_floor: f64,
    /// Cancel → free while prefilling and while decoding (absent for llama.cpp's rows).
    #[serde(default)]
    pub(crate) cancel: Option<CancelFree>,
    /// A decode forward that checks a full draft: positions fed (the last token and
    /// [`DRAFT_MAX`] drafted ones) and its time in ms (absent for llama.cpp's rows). Drafts pay
    /// where this is close to one decode step.
    #[serde(default)]
    pub(crate) draft_check: Option<(usize, f64)>,
    /// A keystroke at the cursor of a [`KEYSTROKE_PROMPT`]-token fill-in-the-middle prompt, to
    /// its first token: through the prefix store after the prompt before it ran, and from
    /// nothing (see [`keystroke`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) keystroke: Option<Keystroke>,
}

/// [`Row::paths`]: decode after a 128-token prompt with laya's whole step, with laya's RoPE/KV
/// primitive in MLX's ops, and with MLX's ops alone.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct PathsCompared {
    /// laya's step (one captured graph a token) and its kernel nodes; `None` where the model
    /// is not one it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) step: Option<(StepTimes, usize)>,
    /// The step after a [`LONG_CONTEXT`]-token prompt (its attention reads 12 times the
    /// positions); `None` where the step does not run the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) step_long: Option<StepTimes>,
    /// The step's GPU time by kind of kernel (ms a step, its kernels replayed one by one after
    /// a 128-token prompt); empty where not measured.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) step_kernels: Vec<(String, f64)>,
    pub(crate) primitives: StepTimes,
    pub(crate) ops_only: StepTimes,
    /// ms the primitives' kernels took to compile at their first use in this process.
    pub(crate) compile_ms: f64,
}

/// A decode step on the host: ms a token, of it building the step (of that, making its graph;
/// the rest MLX's eval queueing it) and waiting for the token, and the ops of one step.
#[derive(Clone, Copy, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct StepTimes {
    pub(crate) ms: f64,
    pub(crate) build_ms: f64,
    pub(crate) graph_ms: f64,
    pub(crate) wait_ms: f64,
    pub(crate) ops: usize,
}

/// `t`'s ms a token and where they go on the host.
fn format_step(t: &StepTimes) -> String {
    format!(
        "{:.2} ms a token ({:.2} building: {:.2} the graph, {:.2} MLX's eval; {:.2} waiting)",
        t.ms,
        t.build_ms,
        t.graph_ms,
        t.build_ms - t.graph_ms,
        t.wait_ms
    )
}

/// The decode of [`Row::paths`] on each path, where laya's own primitives are in use here.
fn paths_compared(model: &Model, tokens: usize) -> Result<Option<PathsCompared>, MeasureError> {
    use crate::models::own::{self, Own};
    if !own::available() {
        return Ok(None);
    }
    // The step where it runs the model, in use by default or not yet.
    let has_step = model.step_plan().is_some();
    // (the whole step, the RoPE/KV primitive)
    let run_after = |prompt: usize, whole: bool, primitives: bool| -> Result<StepTimes, MeasureError> {
        Own::Step.force(Some(whole));
        Own::RopeKv.force(Some(primitives));
        let out = decode_times_after(model, prompt, tokens).and_then(|mut t| {
            t.ops = decode_step_ops(model)?.values().sum();
            Ok(t)
        });
        Own::Step.force(None);
        Own::RopeKv.force(None);
        out
    };
    let run = |whole: bool, primitives: bool| run_after(128, whole, primitives);
    // Twice each, in turn, the second of each kept: the host's speed drifts within a run.
    let mut kept = (None, None, None);
    for _ in 0..2 {
        kept.0 = if has_step { Some(run(true, true)?) } else { None };
        kept.1 = Some(run(false, true)?);
        kept.2 = Some(run(false, false)?);
    }
    let nodes = model.step_plan().map_or(0, |p| p.nodes());
    let step_long = if has_step {
        Some(run_after(LONG_CONTEXT, true, true)?)
    } else {
        None
    };
    let step_kernels = if has_step {
        step_kernel_times(model)?
    } else {
        vec![]
    };
    Ok(Some(PathsCompared {
        step: kept.0.map(|t| (t, nodes)),
        step_long,
        step_kernels,
        primitives: kept.1.expect("run"),
        ops_only: kept.2.expect("run"),
        compile_ms: own::compile_ms(),
    }))
}

/// The step's kernels by kind, replayed one by one after a 128-token prompt and 4 steps (the
/// caches alive while they run).
fn step_kernel_times(model: &Model) -> Result<Vec<(String, f64)>, MeasureError> {
    use crate::models::own::Own;
    Own::Step.force(Some(true));
    let mut caches = model.new_caches();
    let mut run = || -> Result<Vec<(String, f64)>, MeasureError> {
        let ids = random_ids(128, 3);
        let mut logits = model.forward(&Array::from_slice(&ids, &[1, 128]), &mut caches)?;
        for t in 0..4u32 {
            logits = model.forward(&Array::from_slice(&[t], &[1, 1]), &mut caches)?;
        }
        mlx_rs::transforms::eval([&logits])?;
        let plan = model
            .step_plan()
            .ok_or_else(|| MeasureError::msg("the model has no step plan"))?;
        Ok(plan.profile()?)
    };
    let out = run();
    Own::Step.force(None);
    out
}

/// [`Row::keystroke`].
#[derive(Clone, Copy, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct Keystroke {
    /// ms to the first token with reuse, and prompt tokens run.
    pub(crate) reuse_ms: f64,
    pub(crate) reuse_tokens: usize,
    /// The same without reuse.
    pub(crate) fresh_ms: f64,
    pub(crate) fresh_tokens: usize,
}

/// The prompt a keystroke row types into, and the suffix after its cursor.
const KEYSTROKE_PROMPT: usize = 2048;
const KEYSTROKE_SUFFIX: usize = 40;

/// A character typed at the cursor of a fill-in-the-middle prompt of [`KEYSTROKE_PROMPT`]
/// random tokens whose cursor is [`KEYSTROKE_SUFFIX`] tokens before the end (the anchor a few
/// tokens before it, as a FIM prompt's): the prompt runs once through a prefix store, then the
/// same prompt with its last prefix token changed runs through the store (from the state or
/// keys kept at the anchor) and without it, to the first token; the median of 3 each.
fn keystroke(model: &Model) -> Result<Keystroke, MeasureError> {
    use crate::prefix::{generate_with_store, PrefixStore, ANCHOR_BEFORE_CURSOR};
    let cursor = KEYSTROKE_PROMPT - KEYSTROKE_SUFFIX;
    let base = random_ids(KEYSTROKE_PROMPT, 11);
    let req = GenerateRequest {
        anchor: Some(cursor - ANCHOR_BEFORE_CURSOR),
        ..GenerateRequest::greedy(1)
    };
    let (mut with, mut without) = (vec![], vec![]);
    let (mut reuse_tokens, mut fresh_tokens) = (0, 0);
    for i in 0..3u32 {
        let store = std::sync::Mutex::new(PrefixStore::new(crate::prefix::PrefixLimits::default()));
        generate_with_store(model, Some(&store), &base, &req, &Cancel::new(), |_, _| {
            Control::Continue
        })?;
        let mut typed = base.clone();
        typed[cursor - 1] = (typed[cursor - 1] + 1 + i) % 1000;
        for (store, times, tokens) in [
            (Some(&store), &mut with, &mut reuse_tokens),
            (None, &mut without, &mut fresh_tokens),
        ] {
            let t = Instant::now();
            let (out, _) = generate_with_store(model, store, &typed, &req, &Cancel::new(), |_, _| {
                Control::Continue
            })?;
            times.push(t.elapsed().as_secs_f64() * 1e3);
            *tokens = out.prefill_tokens;
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Ok(Keystroke {
        reuse_ms: median(&mut with),
        reuse_tokens,
        fresh_ms: median(&mut without),
        fresh_tokens,
    })
}

/// How long a cancelled generation keeps the model: from its flag being set to the model
/// being free (generation returned and the device idle), sampled at points spread over one
/// piece (a prompt chunk, a decode step), so the maximum nears a whole piece and the mean
/// half of one.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct CancelFree {
    pub(crate) prefill_ms: Vec<f64>,
    /// Tokens in the chunk run when the flag was set, and how long the chunk before took.
    pub(crate) prefill_chunk_tokens: u64,
    pub(crate) prefill_chunk_ms: f64,
    pub(crate) decode_ms: Vec<f64>,
    pub(crate) decode_step_ms: f64,
}

/// Points of a piece at which the flag is set.
const CANCEL_SAMPLES: usize = 4;
/// The prompt length decode is timed after as well: about a file window's prompt.
const LONG_CONTEXT: usize = 1536;

/// Waits until `count(meter)` reaches `at`, timing the piece before it (from `at - 1`), then
/// sets `cancel` after `share` of that piece. Returns when it set the flag and the piece's
/// time (`None` when `done` came first).
fn cancel_at(
    meter: &Meter,
    count: fn(&Meter) -> u64,
    at: u64,
    share: f64,
    cancel: &Cancel,
    done: &AtomicBool,
) -> Option<(Instant, Duration, u64)> {
    let wait_for = |n: u64| {
        while count(meter) < n {
            if done.load(Ordering::SeqCst) {
                return None;
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        Some(Instant::now())
    };
    let a = wait_for(at - 1)?;
    let tokens_before = meter.prefill_tokens.load(Ordering::SeqCst);
    let b = wait_for(at)?;
    let piece = b - a;
    std::thread::sleep(piece.mul_f64(share));
    cancel.cancel();
    let chunk = meter.prefill_tokens.load(Ordering::SeqCst) - tokens_before;
    Some((Instant::now(), piece, chunk))
}

/// One sample: runs `work` on this thread (metered) while another thread sets the flag
/// `share` into piece `at`; the time from the flag to `work` returning and the device idle,
/// with the piece's time and the tokens counted in the piece (prompt chunks).
fn cancel_sample(
    at: u64,
    share: f64,
    count: fn(&Meter) -> u64,
    work: impl FnOnce(&Cancel) -> Result<(), MeasureError>,
) -> Result<(f64, f64, u64), MeasureError> {
    let meter = Arc::new(Meter::default());
    meter.install();
    let cancel = Cancel::new();
    let done = Arc::new(AtomicBool::new(false));
    let setter = {
        let (meter, cancel, done) = (meter.clone(), cancel.clone(), done.clone());
        std::thread::spawn(move || cancel_at(&meter, count, at, share, &cancel, &done))
    };
    let result = work(&cancel);
    // The device is idle once a step queued after everything else has run.
    let z = Array::from_int(0).add(Array::from_int(1))?;
    eval([&z])?;
    let free = Instant::now();
    done.store(true, Ordering::SeqCst);
    Meter::uninstall();
    result?;
    let (set, piece, tokens) = setter
        .join()
        .map_err(|_| MeasureError::msg("the cancelling thread panicked"))?
        .ok_or_else(|| MeasureError::msg("the generation ended before the flag was set"))?;
    Ok((
        free.saturating_duration_since(set).as_secs_f64() * 1e3,
        piece.as_secs_f64() * 1e3,
        tokens,
    ))
}

/// Cancel → free while prefilling (a prompt of 8 of the model's chunks, the flag set during
/// its 4th chunk) and while decoding (the flag set during the 4th step), each at
/// [`CANCEL_SAMPLES`] points spread over the piece, with the model's pacing
/// ([`Pacing::for_model`]).
fn cancel_to_free(model: &Model) -> Result<CancelFree, MeasureError> {
    let mut c = CancelFree::default();
    let request = GenerateRequest::greedy;
    let chunk = match Pacing::for_model(model).chunking {
        Chunking::Fixed(n) => n,
        Chunking::Timed(_) => PREFILL_CHUNK,
    };
    let long = random_ids(8 * chunk, 11);
    let chunks = |m: &Meter| m.prefill_chunks.load(Ordering::SeqCst);
    let steps = |m: &Meter| m.decode_steps.load(Ordering::SeqCst);
    for i in 0..CANCEL_SAMPLES {
        let share = i as f64 / CANCEL_SAMPLES as f64;
        let (ms, piece, tokens) = cancel_sample(4, share, chunks, |cancel| {
            let mut caches = model.new_caches();
            generate(model, &mut caches, &long, &request(1), cancel, |_, _| {
                Control::Continue
            })?;
            Ok(())
        })?;
        c.prefill_ms.push(ms);
        c.prefill_chunk_ms = piece;
        c.prefill_chunk_tokens = tokens;
    }
    // Decode after a short prompt, prefilled once and reused but for its last id.
    let prompt = random_ids(16, 12);
    let mut cached = model.new_caches();
    let no = Cancel::new();
    prefill(model, &mut cached, &prompt[..prompt.len() - 1], &no)?;
    // A recurrent model goes back to the prompt through a state kept there.
    crate::cache::checkpoint(&mut cached);
    let held = cached[0].offset();
    for i in 0..CANCEL_SAMPLES {
        let share = i as f64 / CANCEL_SAMPLES as f64;
        let (ms, piece, _) = cancel_sample(4, share, steps, |cancel| {
            let caches: &mut [KvCache] = &mut cached;
            crate::cache::rewind(caches, held);
            let last = &prompt[prompt.len() - 1..];
            generate(model, caches, last, &request(100_000), cancel, |_, _| {
                Control::Continue
            })?;
            Ok(())
        })?;
        c.decode_ms.push(ms);
        c.decode_step_ms = piece;
    }
    Ok(c)
}

fn max_mean(v: &[f64]) -> (f64, f64) {
    let max = v.iter().copied().fold(0.0, f64::max);
    (max, v.iter().sum::<f64>() / v.len().max(1) as f64)
}

/// `cancel → free: prefill max N ms (mean M; chunks of T tokens, C ms), decode max … (steps of …)`.
fn format_cancel(c: &CancelFree) -> String {
    let pacing = Pacing::for_device();
    let (pmax, pmean) = max_mean(&c.prefill_ms);
    let (dmax, dmean) = max_mean(&c.decode_ms);
    format!(
        "cancel → free: prefill {pmax:.0} ms at most, {pmean:.0} ms mean (a chunk of {} tokens, {:.0} ms); \
         decode {dmax:.0} ms at most, {dmean:.0} ms mean (a step of {:.0} ms; overlap {}); {} samples each",
        c.prefill_chunk_tokens,
        c.prefill_chunk_ms,
        c.decode_step_ms,
        pacing.overlap,
        c.prefill_ms.len()
    )
}

/// Host memory bandwidth from copying 256 MiB (best of 5), GB/s counting read + write.
pub fn host_copy_bandwidth_gbs() -> f64 {
    let n = 256 << 20;
    let src = vec![1u8; n];
    let mut dst = vec![0u8; n];
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        dst.copy_from_slice(&src);
        std::hint::black_box(&dst);
        best = best.min(t.elapsed().as_secs_f64());
    }
    2.0 * n as f64 / best / 1e9
}

/// What one small op costs on the default device, host work and launch included: a chain of
/// `n` dependent adds on a `[1, width]` array of `dtype`, built and evaluated at once (one
/// kernel per op), best of 4 (the first pays for kernel compiles). Microseconds per op. A
/// decode step is a few hundred such ops besides its matrix products, so this bounds how fast
/// a small model can decode.
fn op_cost_us(width: i32, n: usize, dtype: Dtype) -> Result<f64, mlx_rs::error::Exception> {
    let x = mlx_rs::ops::ones::<f32>(&[1, width])?.as_dtype(dtype)?;
    eval([&x])?;
    let mut best = f64::MAX;
    for _ in 0..4 {
        let t = Instant::now();
        let mut y = x.clone();
        for _ in 0..n {
            y = y.add(&x)?;
        }
        eval([&y])?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(best * 1e6 / n.max(1) as f64)
}

fn random_ids(n: usize, seed: u64) -> Vec<u32> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            // Plain-text ids only (below Qwen's special tokens).
            ((x >> 33) % 150_000) as u32
        })
        .collect()
}

/// A prompt of `n` ids prefilled as a request prefills it (chunks and groups of layers paced
/// for the device), to its last logits evaluated.
fn prefill_time(model: &Model, n: usize) -> Result<Duration, MeasureError> {
    let ids = random_ids(n, n as u64);
    let mut caches = model.new_caches();
    let t = Instant::now();
    let logits = prefill(model, &mut caches, &ids, &Cancel::new())?;
    if logits.is_none() {
        return Err(MeasureError::msg("the prompt did not run"));
    }
    Ok(t.elapsed())
}

/// Mean time of a decode forward of `positions` tokens after a 128-token prompt (what checking
/// a draft costs), over a few runs after one untimed.
fn check_ms(model: &Model, positions: usize) -> Result<f64, MeasureError> {
    let mut caches = model.new_caches();
    let prompt = random_ids(128, 5);
    let p = prefill(model, &mut caches, &prompt, &Cancel::new())?;
    ensure(p.is_some(), || "the prompt did not run".into())?;
    let step = Array::from_slice(&random_ids(positions, 6), &[1, positions as i32]);
    let runs = 5;
    let mut total = Duration::ZERO;
    for run in 0..=runs {
        let t = Instant::now();
        let logits = model.forward_all(&step, &mut caches)?;
        let chosen = mlx_rs::ops::indexing::argmax_axis(&logits, -1, false)?;
        eval([&chosen])?;
        if run > 0 {
            total += t.elapsed();
        }
        // One forward back: a recurrent state to the one before it.
        crate::cache::rewind(&mut caches, prompt.len());
    }
    Ok(total.as_secs_f64() * 1e3 / runs as f64)
}

/// The primitives of one decode step's graph (a token after a 128-token prompt: the model's
/// forward and the argmax), counted before evaluation: the ops, and so nearly the kernels,
/// a token costs on any device.
fn decode_step_ops(model: &Model) -> Result<std::collections::BTreeMap<String, usize>, MeasureError> {
    let vocab = model.config().vocab_size as u32;
    let ids: Vec<u32> = random_ids(129, 5).into_iter().map(|i| i % vocab).collect();
    let mut caches = model.new_caches();
    let p = prefill(model, &mut caches, &ids[..128], &Cancel::new())?;
    ensure(p.is_some(), || "the prompt did not run".into())?;
    let step = Array::from_slice(&[ids[128] as i32], &[1, 1]);
    let logits = model.forward(&step, &mut caches)?;
    let next = mlx_rs::ops::indexing::argmax_axis(&logits, -1, false)?;
    Ok(graph_primitives(&[&next])?)
}

/// Mean time of a decode step after a 128-token prompt.
fn decode_ms(model: &Model, tokens: usize) -> Result<f64, MeasureError> {
    Ok(decode_times_after(model, 128, tokens)?.ms)
}

/// A decode of `tokens` after a prompt of `prompt` random tokens: ms a token, of it building
/// the forwards (of that, making their graphs) and waiting for their tokens (the ops left 0).
fn decode_times_after(model: &Model, prompt: usize, tokens: usize) -> Result<StepTimes, MeasureError> {
    let mut caches = model.new_caches();
    let req = GenerateRequest::greedy(tokens);
    let out = generate(
        model,
        &mut caches,
        &random_ids(prompt, 7),
        &req,
        &Cancel::new(),
        |_, _| Control::Continue,
    )?;
    let n = out.candidates[0].len();
    ensure(n > 1, || format!("decode produced {n} tokens"))?;
    let per = |d: std::time::Duration| d.as_secs_f64() * 1e3 / (n - 1) as f64;
    Ok(StepTimes {
        ms: per(out.decode_time),
        build_ms: per(out.decode_build_time),
        graph_ms: per(out.decode_graph_time),
        wait_ms: per(out.decode_wait_time),
        ops: 0,
    })
}

/// Each target at each precision, in order; `on_row` hears each row as it is measured.
pub fn measure(
    targets: &[Target],
    s: &Settings,
    mut on_row: impl FnMut(&Row),
) -> Result<Vec<Row>, MeasureError> {
    let bandwidth = s.bandwidth_gbs.unwrap_or_else(host_copy_bandwidth_gbs);
    let dtype = synthetic_dtype(&s.device);
    let mut rows = vec![];
    for target in targets {
        for &precision in &s.precisions {
            let t = Instant::now();
            let (model, synthetic) = match &target.source {
                Source::File(path) => {
                    let opts = LoadOptions {
                        precision,
                        group_size: s.group_size,
                        use_cache: true,
                        progress: false,
                        ..Default::default()
                    };
                    (load::load(path, &opts)?.model, false)
                }
                Source::Synthetic(shape) => (
                    synthetic::random_model(&shape.config(), precision, s.group_size, dtype, 1)?,
                    true,
                ),
            };
            let load_s = t.elapsed().as_secs_f64();
            // Warm-up: the first run of each shape pays for kernel compilation (MLX CUDA compiles
            // its quantized matmul kernels for more than 16 rows at first use) and allocation.
            prefill_time(&model, 64)?;
            decode_ms(&model, 4)?;
            let (mut prefill, mut prefill_first) = (vec![], vec![]);
            for &n in &s.prefill_lengths {
                let first = prefill_time(&model, n)?;
                let d = prefill_time(&model, n)?;
                prefill_first.push((n, n as f64 / first.as_secs_f64()));
                prefill.push((n, n as f64 / d.as_secs_f64()));
            }
            let decode = decode_ms(&model, s.decode_tokens)?;
            let long = decode_times_after(&model, LONG_CONTEXT, s.decode_tokens)?;
            let decode_step_ops = decode_step_ops(&model)?;
            let paths = paths_compared(&model, s.decode_tokens)?;
            let cancel = cancel_to_free(&model)?;
            let draft_check = Some((DRAFT_MAX + 1, check_ms(&model, DRAFT_MAX + 1)?));
            let keystroke = Some(keystroke(&model)?);
            let bytes = model.weight_bytes_per_token() as u64;
            let floor = bytes as f64 / (bandwidth * 1e9) * 1e3;
            let row = Row {
                model: target.label.clone(),
                synthetic,
                device: s.device.clone(),
                precision: precision.label().to_owned(),
                load_s,
                prefill_tok_s: prefill,
                prefill_first_tok_s: prefill_first,
                decode_step_ops,
                decode_ms_per_token: decode,
                decode_long: Some((LONG_CONTEXT, long)),
                paths,
                weight_bytes_per_token: bytes,
                bandwidth_gbs: bandwidth,
                floor_ms_per_token: floor,
                share_of_floor: floor / decode,
                cancel: Some(cancel),
                draft_check,
                keystroke,
            };
            on_row(&row);
            rows.push(row);
        }
    }
    Ok(rows)
}

pub fn header() -> String {
    format!(
        "{:<34} {:<9} {:<6} {:>7}  {:<28} {:>9} {:>9} {:>9} {:>7}",
        "model", "device", "bits", "load s", "prefill tok/s", "decode", "MB/token", "floor ms", "floor%"
    )
}

pub fn format_row(r: &Row) -> String {
    let per_length = |runs: &[(usize, f64)]| {
        let v: Vec<String> = runs.iter().map(|(n, v)| format!("{n}:{v:.0}")).collect();
        v.join(" ")
    };
    let cancel = r
        .cancel
        .as_ref()
        .map(|c| format!("\n  {}", format_cancel(c)))
        .unwrap_or_default();
    let first = if r.prefill_first_tok_s.is_empty() {
        String::new()
    } else {
        format!(
            "\n  prefill tok/s of the first run at each length: {}",
            per_length(&r.prefill_first_tok_s)
        )
    };
    let ops = if r.decode_step_ops.is_empty() {
        String::new()
    } else {
        let mut top: Vec<(&String, &usize)> = r.decode_step_ops.iter().collect();
        top.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let top: Vec<String> = top.iter().take(8).map(|(k, n)| format!("{k} {n}")).collect();
        let total: usize = r.decode_step_ops.values().sum();
        format!(
            "\n  one decode step: {total} ops, {} of them views ({})",
            total - kernels(&r.decode_step_ops),
            top.join(", ")
        )
    };
    let long = r
        .decode_long
        .map(|(n, t)| format!("\n  decode after a {n}-token prompt: {}", format_step(&t)))
        .unwrap_or_default();
    let paths = r
        .paths
        .as_ref()
        .map(|p| {
            let with_ops = |t: StepTimes| format!("{}, {} ops a step", format_step(&t), t.ops);
            let mut step = p
                .step
                .map(|(t, nodes)| {
                    format!("\n  decode with laya's step:       {} ({nodes} kernels in its graph)", with_ops(t))
                })
                .unwrap_or_default();
            if let Some(t) = p.step_long {
                step += &format!("\n  laya's step after a {LONG_CONTEXT}-token prompt: {}", format_step(&t));
            }
            if !p.step_kernels.is_empty() {
                let total: f64 = p.step_kernels.iter().map(|(_, ms)| ms).sum();
                let parts: Vec<String> = p.step_kernels.iter().map(|(k, ms)| format!("{k} {ms:.3}")).collect();
                step += &format!("\n  the step's kernels one by one: {total:.3} ms ({})", parts.join(", "));
            }
            format!(
                "{step}\n  decode with laya's primitives: {}\n  decode on MLX's ops alone:     {}\n  laya's kernels compiled at first use in {:.0} ms",
                with_ops(p.primitives),
                with_ops(p.ops_only),
                p.compile_ms
            )
        })
        .unwrap_or_default();
    let check = r
        .draft_check
        .map(|(positions, ms)| {
            format!(
                "\n  a forward of {positions} positions (a full draft checked): {ms:.2} ms, {:.2}× a decode step",
                ms / r.decode_ms_per_token
            )
        })
        .unwrap_or_default();
    let keystroke = r
        .keystroke
        .map(|k| {
            format!(
                "\n  a keystroke at the cursor of a {KEYSTROKE_PROMPT}-token prompt, to its first token: {:.1} ms \
                 ({} prompt tokens run) with reuse, {:.1} ms ({}) without",
                k.reuse_ms, k.reuse_tokens, k.fresh_ms, k.fresh_tokens
            )
        })
        .unwrap_or_default();
    format!(
        "{:<34} {:<9} {:<6} {:>7.2}  {:<28} {:>6.2} ms {:>9.1} {:>9.3} {:>6.1}%",
        if r.synthetic {
            format!("{} (synthetic)", r.model)
        } else {
            r.model.clone()
        },
        r.device,
        r.precision,
        r.load_s,
        per_length(&r.prefill_tok_s),
        r.decode_ms_per_token,
        r.weight_bytes_per_token as f64 / 1e6,
        r.floor_ms_per_token,
        r.share_of_floor * 100.0
    ) + &first
        + &ops
        + &long
        + &paths
        + &cancel
        + &check
        + &keystroke
}

/// The dense dtype of synthetic weights and of [`small_op`]'s chain on `device` (a
/// [`use_device`](crate::runtime::use_device) description): bf16 on a GPU, f32 on the CPU.
fn synthetic_dtype(device: &str) -> Dtype {
    if device.starts_with("gpu") {
        Dtype::Bfloat16
    } else {
        Dtype::Float32
    }
}

/// The report's line on what one small op costs on `device` (the one selected): a chain of
/// 1,000 dependent adds on a `[1, 2048]` array of the device's dtype, one eval
/// (see `op_cost_us`).
pub fn small_op(device: &str) -> Result<String, MeasureError> {
    let (width, chain) = (2048, 1000);
    let dtype = synthetic_dtype(device);
    let op = op_cost_us(width, chain, dtype)?;
    Ok(format!(
        "one small op on {device}: {op:.2} us (a chain of {chain} dependent adds on [1, {width}] {dtype:?}, one eval)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A decode step of the 30B-A3B's layers (reduced for a CPU to 16 experts, a 1,024-token
    /// vocabulary and a quarter of the widths: the ops are the same) runs two gathered products
    /// a layer: the experts' gate and up rows in one, their down rows in the other. Prints what
    /// a layer adds to the step (the count set beside mlx-lm's in docs/benchmarks.md; the CPU
    /// writes MLX's fast kernels out as plain ops, so a GPU counts fewer).
    #[test]
    fn a_moe_decode_step_gathers_twice_a_layer() {
        // The catalog's qwen3-coder-30b-a3b.
        let base = Shape {
            arch: crate::models::Arch::Qwen3Moe,
            hidden_size: 2048,
            intermediate_size: 6144,
            layers: 48,
            heads: 32,
            kv_heads: 4,
            head_dim: 128,
            vocab_size: 151936,
            tied: false,
            experts: Some((128, 8, 768)),
            shared_expert: None,
            hybrid: None,
        }
        .config();
        let mut steps = vec![];
        for layers in [1, 2] {
            let mut cfg = base.clone();
            cfg.num_hidden_layers = layers;
            cfg.vocab_size = 1024;
            cfg.hidden_size /= 4;
            cfg.num_attention_heads /= 4;
            cfg.moe.as_mut().unwrap().num_experts = 16;
            cfg.moe.as_mut().unwrap().moe_intermediate_size /= 4;
            let model = synthetic::random_model(&cfg, Precision::Q4, 64, Dtype::Float32, 1).unwrap();
            let ops = decode_step_ops(&model).unwrap();
            assert_eq!(ops.get("GatherQMM"), Some(&(2 * layers as usize)), "{ops:?}");
            steps.push(ops);
        }
        let total = |m: &std::collections::BTreeMap<String, usize>| m.values().sum::<usize>();
        eprintln!(
            "a layer adds {} ops, {} of them not views; 2 layers: {:?}",
            total(&steps[1]) - total(&steps[0]),
            kernels(&steps[1]) - kernels(&steps[0]),
            steps[1]
        );
    }
}
