//! The generation loop: prefill the prompt tail, then decode `n` candidates step by step.
//!
//! Contract with the caller (the prefix store):
//! - `caches` (one per layer, batch 1) may already hold a prefix of the prompt; `prompt_ids`
//!   are the ids *after* it, and exactly those are prefilled. At least one id must be given,
//!   because the logits of the last prompt position are not cached (when the whole prompt
//!   is cached, trim the caches by one and pass the last id).
//! - The `n` candidates share that one prefill; the caller's caches keep batch 1.
//! - On return the caches hold a prefix of `cached prompt ++ prompt_ids ++ candidates[0]`:
//!   for `n == 1` the prompt and the generated tokens whose keys and values were computed
//!   (usually all but the last), for `n > 1` the prompt only; `caches[0].offset()` says how
//!   long.
//! - With `branch_first` the candidates start from the `n` most likely first tokens, each
//!   with its summed log-probability.
//! - One greedy candidate may decode with drafts (`draft.rs`); its tokens are those of
//!   plain greedy decoding either way.
//!
//! Cancellation: `cancel` is read (one atomic load, never a host sync) before each prompt
//! chunk, before each decode step is queued and after each token is read back, so a cancelled
//! request runs at most the piece in flight; [`Pacing::for_device`] keeps the pieces short.

use std::cell::RefCell;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::argmax_axis;
use mlx_rs::transforms::{async_eval, eval};
use mlx_rs::{Array, Dtype};

use crate::cache::KvCache;
use crate::cancel::Cancel;
use crate::draft::{ngram_draft, Speculation};
use crate::models::{Model, ModelConfig, ModelError};
use crate::sample::{host_slice, Sampler};
use crate::seam::{EngineError, FinishReason, SamplingParams};

/// Longest piece of prompt run in one forward, bounding activation memory; the chunk on a
/// GPU, where it takes a few milliseconds to a few tens of them for the models in use.
pub const PREFILL_CHUNK: usize = 512;

/// A mixture of experts' chunk on a GPU: each expert's rows of a chunk run as blocks of one
/// expert, and 2,048 tokens give each of 128 experts enough rows (128 on average at top-8)
/// for blocks of 64 rows, where 512 tokens fill 16-row tiles with a third of padding
/// (synthetic 30B-A3B q4, H100: 2,048 tokens prefilled in 212-217 ms against 341-361 ms in
/// 512-token chunks; docs/decisions.md). Its chunks run in groups of layers like any long
/// chunk, so a cancel still waits for one group.
pub(crate) const MOE_PREFILL_CHUNK: usize = 2048;

/// About how long one prompt chunk takes on the CPU: the most a cancelled request keeps the
/// model after its flag is set, while it prefills (unless one token takes longer).
pub(crate) const CPU_CHUNK_TIME: Duration = Duration::from_millis(250);

/// How a prompt is cut into chunks (one forward each, the cancel flag read before each).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Chunking {
    /// Chunks of this many tokens (the last one shorter).
    Fixed(usize),
    /// Chunks sized to take about this long: the first is one token, each next one is as
    /// many tokens as the time per token of the chunk before fits in it, at least one, at
    /// most twice the chunk before and at most [`PREFILL_CHUNK`].
    Timed(Duration),
}

impl Chunking {
    fn first(self) -> usize {
        match self {
            Chunking::Fixed(n) => n.max(1),
            Chunking::Timed(_) => 1,
        }
    }

    /// The size of the chunk after one of `size` tokens (`ran` of them run) took `took`.
    fn next(self, size: usize, ran: usize, took: Duration) -> usize {
        match self {
            Chunking::Fixed(n) => n.max(1),
            Chunking::Timed(target) => {
                let per_token = took.as_secs_f64() / ran.max(1) as f64;
                let fits = if per_token > 0.0 {
                    (target.as_secs_f64() / per_token) as usize
                } else {
                    usize::MAX
                };
                fits.clamp(1, (2 * size).min(PREFILL_CHUNK))
            }
        }
    }
}

/// How generation is cut into the pieces between which `cancel` is read.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Pacing {
    pub(crate) chunking: Chunking,
    /// With a greedy sampler, queue decode step `i + 1` before reading token `i` back.
    pub(crate) overlap: bool,
    /// A prompt chunk expected to take longer than this (by the model's last chunk) runs in
    /// groups of layers that each take about this long, `cancel` read between them
    /// ([`Model::forward_grouped`]); `None`: a chunk is one piece.
    pub(crate) layer_groups: Option<Duration>,
}

/// How long a group of layers of a prompt chunk takes at most on a GPU (where chunks keep
/// their 512 tokens): the most a cancelled prefill keeps the model, whatever its size.
pub(crate) const GPU_PIECE_TIME: Duration = Duration::from_millis(20);

impl Pacing {
    /// A GPU: 512-token chunks, run in groups of layers of about [`GPU_PIECE_TIME`] where a
    /// chunk takes longer (a large model), and the overlapped decode (the step queued ahead is
    /// the one more piece a cancel waits for). The CPU: chunks of about [`CPU_CHUNK_TIME`], one
    /// decode step at a time (the overlap would hide microseconds of graph building behind a
    /// step of 0.4-2 s there, and make a cancel wait for two steps instead of one).
    pub(crate) fn for_device() -> Pacing {
        if super::models::on_gpu() {
            Pacing {
                chunking: Chunking::Fixed(PREFILL_CHUNK),
                overlap: true,
                layer_groups: Some(GPU_PIECE_TIME),
            }
        } else {
            Pacing {
                chunking: Chunking::Timed(CPU_CHUNK_TIME),
                overlap: false,
                layer_groups: None,
            }
        }
    }

    /// [`Pacing::for_device`] with `model`'s chunk on a GPU: [`MOE_PREFILL_CHUNK`] for a
    /// mixture of experts, [`PREFILL_CHUNK`] otherwise.
    pub(crate) fn for_model(model: &Model) -> Pacing {
        let mut pacing = Pacing::for_device();
        if let Chunking::Fixed(_) = pacing.chunking {
            pacing.chunking = Chunking::Fixed(gpu_chunk(model.config()));
        }
        pacing
    }

    /// Groups of layers a chunk of `tokens` runs in: enough that each takes about
    /// `layer_groups`, by the model's last chunk; one a layer before any chunk ran.
    fn groups_for(&self, model: &Model, tokens: usize) -> usize {
        let Some(piece) = self.layer_groups else {
            return 1;
        };
        let layers = model.layer_count().max(1);
        match model.prefill_estimate(tokens) {
            Some(t) => (t.as_secs_f64() / piece.as_secs_f64())
                .ceil()
                .clamp(1.0, layers as f64) as usize,
            None => layers,
        }
    }
}

/// The tokens of a prompt chunk on a GPU for a model of `cfg`.
pub(crate) fn gpu_chunk(cfg: &ModelConfig) -> usize {
    match &cfg.moe {
        Some(moe) if (0..cfg.num_hidden_layers).any(|l| moe.is_sparse(l)) => MOE_PREFILL_CHUNK,
        _ => PREFILL_CHUNK,
    }
}

/// Counts of the forwards generation started, over the life of whoever installed it (a
/// model worker, which reports them in the daemon's status): shared atomics, bumped by
/// [`generate`] on the thread that installed the meter.
#[derive(Debug, Default)]
pub(crate) struct Meter {
    pub(crate) prefill_chunks: AtomicU64,
    pub(crate) prefill_tokens: AtomicU64,
    /// Forwards of one token per candidate after the prompt (decode steps).
    pub(crate) decode_steps: AtomicU64,
}

thread_local! {
    static METER: RefCell<Option<Arc<Meter>>> = const { RefCell::new(None) };
}

impl Meter {
    /// Count the generations run on this thread from now on.
    pub(crate) fn install(self: &Arc<Self>) {
        METER.with(|m| *m.borrow_mut() = Some(self.clone()));
    }

    /// Stop counting on this thread.
    pub(crate) fn uninstall() {
        METER.with(|m| *m.borrow_mut() = None);
    }
}

fn metered(f: impl FnOnce(&Meter)) {
    METER.with(|m| {
        if let Some(m) = m.borrow().as_deref() {
            f(m);
        }
    });
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct GenerateRequest {
    /// Most tokens per candidate; 0 only prefills (warms the caches).
    pub(crate) max_tokens: usize,
    /// Number of candidates (at least 1).
    pub(crate) n: usize,
    pub(crate) sampling: SamplingParams,
    /// Tokens that end a candidate; they are not part of its output.
    pub(crate) stop_token_ids: Vec<u32>,
    /// Candidate `i` starts from the `i`-th most likely first token instead of a sampled one,
    /// and [`GenerateOutput::logprobs`] is filled in.
    pub(crate) branch_first: bool,
    /// Draft tokens for the model to check several at a time; used for one greedy candidate
    /// without `branch_first` of a model without recurrent layers, ignored otherwise. The
    /// output is the same either way.
    pub(crate) speculation: Speculation,
    /// The ids before `prompt_ids` (those the caches hold): drafts are looked up in them, in
    /// `prompt_ids` and in the output. May be empty.
    pub(crate) history: Vec<u32>,
    /// A length of the whole sequence (the cached ids included) where a model with recurrent
    /// layers keeps its state: a prompt chunk ends there. The caller's guess of where the next
    /// request parts from this one (a few tokens before the cursor); `None`: only the chunks'
    /// ends are kept.
    pub(crate) anchor: Option<usize>,
}

impl GenerateRequest {
    /// One greedy candidate of at most `max_tokens`, no stop tokens, no drafts.
    pub(crate) fn greedy(max_tokens: usize) -> GenerateRequest {
        GenerateRequest {
            max_tokens,
            n: 1,
            sampling: SamplingParams::default(),
            stop_token_ids: vec![],
            branch_first: false,
            speculation: Speculation::Off,
            history: vec![],
            anchor: None,
        }
    }
}

/// What the token callback wants next for its candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Control {
    Continue,
    /// Finish this candidate, keeping the token just passed.
    Stop,
}

#[derive(Clone, Debug)]
pub(crate) struct GenerateOutput {
    pub(crate) candidates: Vec<Vec<u32>>,
    pub(crate) finish_reasons: Vec<FinishReason>,
    /// With `branch_first`: per candidate, the summed natural-log probability of its tokens
    /// (each under the model's distribution at its step); else zeros.
    pub(crate) logprobs: Vec<f32>,
    /// Prompt positions run through the model (once, whatever `n`); fewer than the prompt
    /// when cancelled while prefilling.
    pub(crate) prefill_tokens: usize,
    /// From the call to the prompt's logits being computed.
    pub(crate) prefill_time: Duration,
    /// From the first token on the host to the end.
    pub(crate) decode_time: Duration,
    /// From the call to the first token on the host.
    pub(crate) first_token_time: Duration,
    /// Forwards run after the prompt's (whose logits give the first token): one per token
    /// without drafts, fewer when drafts are accepted.
    pub(crate) decode_forwards: usize,
    /// Of `decode_time`: building and queueing the decode forwards on the host (MLX's graph
    /// and the GPU's launches) …
    pub(crate) decode_build_time: Duration,
    /// … and waiting for their tokens to reach the host; the rest is the token callbacks.
    pub(crate) decode_wait_time: Duration,
    /// Of `decode_build_time`: making the steps' graphs (the forward's ops and the sampler's),
    /// before MLX evaluates them (the rest: MLX's eval queueing them on the device).
    pub(crate) decode_graph_time: Duration,
    /// The last prompt position's logits (`[1, vocab]`), once the whole prompt has run.
    pub(crate) prompt_logits: Option<Array>,
}

/// Where a generation's first logits come from.
pub(crate) enum Start<'a> {
    /// These ids run after what the caches hold.
    Prefill(&'a [u32]),
    /// The caches hold the whole prompt already, and these are its last position's logits
    /// (`[1, vocab]`).
    Ready(Array),
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum GenerateError {
    #[error("no prompt ids to prefill (leave at least the last prompt id uncached)")]
    EmptyPrompt,
    #[error("n must be at least 1")]
    NoCandidates,
    #[error("token id {0} is outside the model's vocabulary of {1}")]
    TokenOutOfRange(u32, i32),
    #[error("{0} candidates cannot start from distinct tokens of a vocabulary of {1}")]
    Branches(usize, usize),
    #[error("caches must have batch 1, one has {0}")]
    CacheBatch(i32),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("mlx: {0}")]
    Mlx(#[from] Exception),
}

impl From<GenerateError> for EngineError {
    /// A request the generator refuses is the caller's to fix; a model or MLX failure is not.
    fn from(e: GenerateError) -> Self {
        match e {
            GenerateError::Model(_) | GenerateError::Mlx(_) => EngineError::Unavailable(e.to_string()),
            _ => EngineError::BadRequest(e.to_string()),
        }
    }
}

/// Runs `prompt_ids` after what `caches` hold and generates `req.n` candidates, calling
/// `on_token(candidate, token)` for each token as soon as it is known. `cancel` is checked
/// between prefill chunks and between decode steps, paced for the device
/// ([`Pacing::for_device`]). See the module docs for the cache contract.
pub(crate) fn generate(
    model: &Model,
    caches: &mut [KvCache],
    prompt_ids: &[u32],
    req: &GenerateRequest,
    cancel: &Cancel,
    on_token: impl FnMut(usize, u32) -> Control,
) -> Result<GenerateOutput, GenerateError> {
    generate_paced(
        model,
        caches,
        prompt_ids,
        req,
        cancel,
        Pacing::for_model(model),
        on_token,
    )
}

/// [`generate`] with the pieces cut as `pacing` says.
pub(crate) fn generate_paced(
    model: &Model,
    caches: &mut [KvCache],
    prompt_ids: &[u32],
    req: &GenerateRequest,
    cancel: &Cancel,
    pacing: Pacing,
    on_token: impl FnMut(usize, u32) -> Control,
) -> Result<GenerateOutput, GenerateError> {
    let first = Start::Prefill(prompt_ids);
    generate_from(model, caches, first, req, cancel, pacing, on_token)
}

/// [`generate_paced`] from `first`: a prompt to run, or the logits of one the caches hold. A
/// model with recurrent layers keeps its state at the prompt's end
/// ([`crate::cache::checkpoint_end`]).
pub(crate) fn generate_from(
    model: &Model,
    caches: &mut [KvCache],
    first: Start<'_>,
    req: &GenerateRequest,
    cancel: &Cancel,
    pacing: Pacing,
    mut on_token: impl FnMut(usize, u32) -> Control,
) -> Result<GenerateOutput, GenerateError> {
    let start = Instant::now();
    let n = req.n;
    if n == 0 {
        return Err(GenerateError::NoCandidates);
    }
    let (prompt_ids, ready) = match first {
        Start::Prefill(ids) => (ids, None),
        Start::Ready(logits) => (&[][..], Some(logits)),
    };
    if prompt_ids.is_empty() && ready.is_none() {
        return Err(GenerateError::EmptyPrompt);
    }
    // An id past the embedding table would read outside it.
    let vocab = model.config().vocab_size;
    if let Some(&bad) = prompt_ids.iter().find(|&&t| t as i64 >= vocab as i64) {
        return Err(GenerateError::TokenOutOfRange(bad, vocab));
    }
    if req.branch_first && n > vocab as usize {
        return Err(GenerateError::Branches(n, vocab as usize));
    }
    if let Some(b) = caches.iter().find_map(|c| c.batch_size().filter(|&b| b != 1)) {
        return Err(GenerateError::CacheBatch(b));
    }
    let base = caches.first().map_or(0, KvCache::offset);
    let mut out = GenerateOutput {
        candidates: vec![vec![]; n],
        finish_reasons: vec![FinishReason::Length; n],
        logprobs: vec![0.0; n],
        prefill_tokens: prompt_ids.len(),
        prefill_time: Duration::ZERO,
        decode_time: Duration::ZERO,
        first_token_time: Duration::ZERO,
        decode_forwards: 0,
        decode_build_time: Duration::ZERO,
        decode_wait_time: Duration::ZERO,
        decode_graph_time: Duration::ZERO,
        prompt_logits: None,
    };
    let logits = match ready {
        Some(logits) => logits,
        None => {
            let anchor = req
                .anchor
                .and_then(|a| a.checked_sub(base))
                .filter(|&a| a > 0 && a < prompt_ids.len());
            let p = prefill_anchored(model, caches, prompt_ids, cancel, pacing, anchor)?;
            out.prefill_tokens = p.tokens;
            out.prefill_time = start.elapsed();
            let Some(logits) = p.logits else {
                out.finish_reasons = vec![FinishReason::Cancelled; n];
                return Ok(out);
            };
            if model.is_recurrent() {
                crate::cache::checkpoint_end(caches);
            }
            logits
        }
    };
    out.prompt_logits = Some(logits.clone());
    if req.max_tokens == 0 {
        return Ok(out);
    }
    if cancel.is_cancelled() {
        out.finish_reasons = vec![FinishReason::Cancelled; n];
        return Ok(out);
    }

    let mut sampler = Sampler::new(req.sampling.clone());
    // Drafts need the caches cut back to the accepted tokens after each forward, which a
    // recurrent state cannot do: a hybrid model decodes a token at a time.
    let drafts = req.speculation.is_on() && !model.is_recurrent();
    if n == 1 && !req.branch_first && drafts && sampler.params().is_greedy() {
        let mut history = req.history.clone();
        history.extend_from_slice(prompt_ids);
        decode_drafted(
            model, caches, &logits, history, req, cancel, &mut out, start, on_token,
        )?;
        return Ok(out);
    }

    let mut finished = vec![false; n];
    // Generated tokens whose keys and values are in the caches.
    let mut fed = 0;

    let overlap = pacing.overlap && sampler.params().is_greedy();
    let mut forked;
    let dc: &mut [KvCache] = if n > 1 {
        forked = caches
            .iter()
            .map(|c| c.repeat(n as i32))
            .collect::<Result<Vec<_>, _>>()?;
        &mut forked
    } else {
        caches
    };
    // With `branch_first`, the first tokens come from the prompt's one row of logits.
    let branched = if req.branch_first {
        Some(most_likely(&logits, n)?)
    } else {
        None
    };
    let logits = if n > 1 {
        mlx_rs::ops::broadcast_to(&logits, &[n as i32, logits.dim(1)])?
    } else {
        logits
    };
    let stop: HashSet<u32> = req.stop_token_ids.iter().copied().collect();
    let score = req.branch_first;
    // The next tokens and, when scoring, their log-probabilities (`[n]` each).
    let (mut y, mut y_lp) = match branched {
        Some((ids, lps)) => (
            Array::from_slice(&ids, &[n as i32]),
            Some(Array::from_slice(&lps, &[n as i32])),
        ),
        None => (sampler.sample(&logits)?, None),
    };
    let mut decode_start = None;
    // Time making the steps' graphs, counted from the second token on (as `decode_build_time`).
    let mut graph = Duration::ZERO;
    // Tokens read back so far (per row).
    let mut step = 0;
    loop {
        let steps_left = step + 1 < req.max_tokens;
        // Queue the next step on the still-lazy token before reading it back.
        let mut next = None;
        let built = Instant::now();
        if overlap && steps_left && !cancel.is_cancelled() {
            next = Some(decode_step(model, dc, &y, &mut sampler, score, &mut graph)?);
            fed += 1;
        }
        let waited = Instant::now();
        let tokens = host_slice::<u32>(&y)?.to_vec();
        let lps = match &y_lp {
            Some(lp) => {
                eval([lp])?;
                Some(host_slice::<f32>(lp)?.to_vec())
            }
            None => None,
        };
        step += 1;
        if decode_start.is_none() {
            out.first_token_time = start.elapsed();
            decode_start = Some(Instant::now());
            graph = Duration::ZERO;
        } else {
            out.decode_build_time += waited - built;
            out.decode_wait_time += waited.elapsed();
        }
        for (i, &t) in tokens.iter().enumerate() {
            if finished[i] {
                continue;
            }
            let lp = lps.as_ref().map_or(0.0, |l| l[i]);
            if let Some(r) = take_token(&mut out, i, t, lp, &stop, req.max_tokens, &mut on_token) {
                out.finish_reasons[i] = r;
                finished[i] = true;
            }
        }
        if finished.iter().all(|&f| f) {
            break;
        }
        if cancel.is_cancelled() {
            cancel_unfinished(&mut out.finish_reasons, &finished);
            break;
        }
        (y, y_lp) = match next {
            Some(next) => next,
            None => {
                fed += 1;
                let built = Instant::now();
                let step = decode_step(model, dc, &y, &mut sampler, score, &mut graph)?;
                out.decode_build_time += built.elapsed();
                step
            }
        };
    }
    out.decode_forwards = fed;
    out.decode_graph_time = graph;
    out.decode_time = decode_start.map_or(Duration::ZERO, |t| t.elapsed());
    if n == 1 {
        // Keep only a prefix of prompt ++ candidate: drop a fed stop token or a step
        // queued past the end (one step: a recurrent state's checkpoint).
        let keep = base + prompt_ids.len() + fed.min(out.candidates[0].len());
        crate::cache::rewind(caches, keep);
    }
    Ok(out)
}

/// Adds token `t` to candidate `i` unless it is a stop token, and says whether the candidate
/// is finished and why.
fn take_token(
    out: &mut GenerateOutput,
    i: usize,
    t: u32,
    logprob: f32,
    stop: &HashSet<u32>,
    max_tokens: usize,
    on_token: &mut impl FnMut(usize, u32) -> Control,
) -> Option<FinishReason> {
    if stop.contains(&t) {
        return Some(FinishReason::StopToken);
    }
    out.candidates[i].push(t);
    out.logprobs[i] += logprob;
    match on_token(i, t) {
        Control::Stop => Some(FinishReason::Stop),
        Control::Continue if out.candidates[i].len() >= max_tokens => Some(FinishReason::Length),
        Control::Continue => None,
    }
}

/// Greedy decoding of one candidate with drafts: each forward feeds the last token and the
/// draft [`ngram_draft`] finds in `history` (the whole prompt, then the output), keeps the
/// longest prefix of the draft that the model's own greedy choices agree with, and adds the
/// model's choice after it, so every token is the one plain greedy decoding gives. The caches
/// are cut back to the tokens kept after each forward. No step is queued ahead: the next
/// draft needs the token on the host.
#[allow(clippy::too_many_arguments)]
fn decode_drafted(
    model: &Model,
    caches: &mut [KvCache],
    prompt_logits: &Array,
    mut history: Vec<u32>,
    req: &GenerateRequest,
    cancel: &Cancel,
    out: &mut GenerateOutput,
    start: Instant,
    mut on_token: impl FnMut(usize, u32) -> Control,
) -> Result<(), GenerateError> {
    let Speculation::Ngram { max_draft } = req.speculation else {
        unreachable!("decode_drafted runs only with drafts on")
    };
    let stop: HashSet<u32> = req.stop_token_ids.iter().copied().collect();
    let base = caches.first().map_or(0, KvCache::offset);
    let first = argmax_axis(prompt_logits, -1, false)?.as_dtype(Dtype::Uint32)?;
    eval([&first])?;
    // Tokens to hand out, oldest first: the model's choice, after the accepted draft.
    let mut pending = vec![host_slice::<u32>(&first)?[0]];
    out.first_token_time = start.elapsed();
    let decode_start = Instant::now();
    // Generated tokens whose keys and values are in the caches.
    let mut fed = 0;
    'decode: loop {
        for &t in &pending {
            if let Some(r) = take_token(out, 0, t, 0.0, &stop, req.max_tokens, &mut on_token) {
                out.finish_reasons[0] = r;
                break 'decode;
            }
        }
        if cancel.is_cancelled() {
            out.finish_reasons[0] = FinishReason::Cancelled;
            break;
        }
        history.extend_from_slice(&pending);
        let last = *pending.last().expect("one token at least");
        // Tokens after this forward's last: a draft longer than that is never used.
        let room = req.max_tokens - out.candidates[0].len() - 1;
        let draft = ngram_draft(&history, max_draft.min(room));
        let mut input = Vec::with_capacity(draft.len() + 1);
        input.push(last);
        input.extend_from_slice(draft);
        metered(|m| {
            m.decode_steps.fetch_add(1, Ordering::Relaxed);
        });
        out.decode_forwards += 1;
        let logits = model.forward_all(&Array::from_slice(&input, &[1, input.len() as i32]), caches)?;
        let chosen = argmax_axis(&logits, -1, false)?.as_dtype(Dtype::Uint32)?;
        eval([&chosen])?;
        let chosen = host_slice::<u32>(&chosen)?;
        let accepted = input[1..].iter().zip(chosen).take_while(|(d, c)| d == c).count();
        // The fed token and the accepted draft have their keys and values in the caches.
        fed += 1 + accepted;
        crate::cache::rewind(caches, base + fed);
        pending = chosen[..=accepted].to_vec();
    }
    out.decode_time = decode_start.elapsed();
    // Keep only a prefix of prompt ++ candidate: drop a fed stop token.
    let keep = base + fed.min(out.candidates[0].len());
    crate::cache::rewind(caches, keep);
    Ok(())
}

/// Marks the candidates not finished yet as cancelled.
fn cancel_unfinished(reasons: &mut [FinishReason], finished: &[bool]) {
    for (r, _) in reasons.iter_mut().zip(finished).filter(|(_, &f)| !f) {
        *r = FinishReason::Cancelled;
    }
}

/// Runs `ids` (batch 1) through the model in chunks paced for the device, appending to
/// `caches`; returns the last position's logits (`[1, vocab]`, evaluated), or `None` when
/// `cancel` was set between chunks (the caches then hold the chunks already run).
pub(crate) fn prefill(
    model: &Model,
    caches: &mut [KvCache],
    ids: &[u32],
    cancel: &Cancel,
) -> Result<Option<Array>, GenerateError> {
    Ok(prefill_paced(model, caches, ids, cancel, Pacing::for_model(model))?.logits)
}

/// What a prefill did.
pub(crate) struct Prefilled {
    /// The last position's logits (`[1, vocab]`, evaluated); `None` when cancelled.
    pub(crate) logits: Option<Array>,
    /// Tokens run (all of them unless cancelled).
    pub(crate) tokens: usize,
    /// Chunks run.
    #[cfg_attr(not(test), allow(dead_code))] // read by the tests
    pub(crate) chunks: usize,
}

/// [`prefill`] in chunks cut as `pacing` says; `cancel` is read before each chunk (and
/// between the groups of layers of a chunk run in groups).
pub(crate) fn prefill_paced(
    model: &Model,
    caches: &mut [KvCache],
    ids: &[u32],
    cancel: &Cancel,
    pacing: Pacing,
) -> Result<Prefilled, GenerateError> {
    prefill_anchored(model, caches, ids, cancel, pacing, None)
}

/// [`prefill_paced`], a chunk also ending at `anchor` (a length of `ids`); a model with
/// recurrent layers keeps its state at the end of each chunk but the last, up to the anchor
/// ([`crate::cache::checkpoint`]): past the cursor a keystroke's prompt parts at the anchor,
/// so states there would only push earlier ones out.
pub(crate) fn prefill_anchored(
    model: &Model,
    caches: &mut [KvCache],
    ids: &[u32],
    cancel: &Cancel,
    pacing: Pacing,
    anchor: Option<usize>,
) -> Result<Prefilled, GenerateError> {
    if ids.is_empty() {
        return Err(GenerateError::EmptyPrompt);
    }
    let chunking = pacing.chunking;
    let (mut done, mut chunks) = (0, 0);
    let mut size = chunking.first();
    loop {
        let cancelled = Prefilled {
            logits: None,
            tokens: done,
            chunks,
        };
        if cancel.is_cancelled() {
            return Ok(cancelled);
        }
        let mut end = (done + size).min(ids.len());
        if let Some(a) = anchor.filter(|&a| done < a && a < end) {
            end = a;
        }
        let chunk = &ids[done..end];
        let started = Instant::now();
        metered(|m| {
            m.prefill_chunks.fetch_add(1, Ordering::Relaxed);
            m.prefill_tokens.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        });
        let tokens = Array::from_slice(chunk, &[1, chunk.len() as i32]);
        let groups = pacing.groups_for(model, chunk.len());
        let last = done + chunk.len() == ids.len();
        let logits = if groups > 1 {
            let Some(logits) = model.forward_grouped(&tokens, caches, groups, || !cancel.is_cancelled())?
            else {
                return Ok(cancelled);
            };
            logits
        } else {
            model.forward(&tokens, caches)?
        };
        if last {
            eval([&logits])?;
        } else {
            // Only the caches are needed from a middle chunk.
            eval(caches.iter().flat_map(KvCache::arrays))?;
            if model.is_recurrent() && anchor.is_none_or(|a| done + chunk.len() <= a) {
                crate::cache::checkpoint(caches);
            }
        }
        done += chunk.len();
        chunks += 1;
        model.note_prefill(chunk.len(), started.elapsed());
        if last {
            return Ok(Prefilled {
                logits: Some(logits),
                tokens: done,
                chunks,
            });
        }
        size = chunking.next(size, chunk.len(), started.elapsed());
    }
}

/// Feeds `y` (`[B]` tokens, maybe still lazy) and returns the next tokens, queued for
/// evaluation, with their log-probabilities when `score` is set.
fn decode_step(
    model: &Model,
    caches: &mut [KvCache],
    y: &Array,
    sampler: &mut Sampler,
    score: bool,
    graph: &mut Duration,
) -> Result<(Array, Option<Array>), GenerateError> {
    metered(|m| {
        m.decode_steps.fetch_add(1, Ordering::Relaxed);
    });
    let made = Instant::now();
    let tokens = y.reshape(&[y.dim(0), 1])?.as_dtype(Dtype::Uint32)?;
    let logits = model.forward(&tokens, caches)?;
    let next = sampler.sample(&logits)?;
    if !score {
        *graph += made.elapsed();
        async_eval([&next])?;
        return Ok((next, None));
    }
    let lp = log_softmax(&logits)?
        .take_along_axis(next.reshape(&[-1, 1])?.as_dtype(Dtype::Int32)?, -1)?
        .reshape(&[-1])?;
    *graph += made.elapsed();
    async_eval([&next, &lp])?;
    Ok((next, Some(lp)))
}

/// `logits - logsumexp(logits)` per row, in f32.
fn log_softmax(logits: &Array) -> Result<Array, GenerateError> {
    let l = logits.as_dtype(Dtype::Float32)?;
    let norm = l.logsumexp_axis(-1, true)?;
    Ok(l.subtract(&norm)?)
}

/// The log-probabilities of a `[1, vocab]` logits row, on the host.
fn host_log_probs(logits: &Array) -> Result<Vec<f32>, GenerateError> {
    let lp = log_softmax(logits)?;
    eval([&lp])?;
    Ok(host_slice::<f32>(&lp)?.to_vec())
}

/// The `n` most likely next tokens of a `[1, vocab]` logits row, best first (the lowest id
/// among equals, as greedy picks), with their log-probabilities; `n` is at most the
/// vocabulary (checked by [`generate`] before any work).
fn most_likely(logits: &Array, n: usize) -> Result<(Vec<u32>, Vec<f32>), GenerateError> {
    let row = host_log_probs(logits)?;
    let mut order: Vec<u32> = (0..row.len() as u32).collect();
    if order.len() < n {
        return Err(GenerateError::Branches(n, order.len()));
    }
    let better = |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b));
    if n < order.len() {
        order.select_nth_unstable_by(n, better);
        order.truncate(n);
    }
    order.sort_by(better);
    let lps = order.iter().map(|&t| row[t as usize]).collect();
    Ok((order, lps))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::test_util::tiny_model;
    use crate::models::Arch;
    use std::sync::atomic::AtomicBool;

    const PROMPT: [u32; 9] = [5, 9, 13, 2, 88, 41, 7, 60, 33];

    fn req(max_tokens: usize, n: usize) -> GenerateRequest {
        GenerateRequest {
            max_tokens,
            n,
            sampling: SamplingParams::default(),
            stop_token_ids: vec![],
            branch_first: false,
            speculation: Speculation::Off,
            history: vec![],
            anchor: None,
        }
    }

    fn run(
        model: &Model,
        r: &GenerateRequest,
        on_token: impl FnMut(usize, u32) -> Control,
    ) -> (GenerateOutput, Vec<KvCache>) {
        let mut caches = model.new_caches();
        let out = generate(model, &mut caches, &PROMPT, r, &Cancel::new(), on_token).unwrap();
        (out, caches)
    }

    /// The error `generate` answers `r` with, and the caches it leaves.
    fn refused(model: &Model, ids: &[u32], r: &GenerateRequest) -> (GenerateError, Vec<KvCache>) {
        let mut caches = model.new_caches();
        let err = generate(model, &mut caches, ids, r, &Cancel::new(), |_, _| {
            Control::Continue
        })
        .unwrap_err();
        (err, caches)
    }

    /// A flag set before anything runs.
    fn cancelled() -> Cancel {
        let c = Cancel::new();
        c.cancel();
        c
    }

    /// Greedy decode by hand: forward the whole sequence each step, no cache reuse.
    fn greedy_reference(model: &Model, steps: usize) -> Vec<u32> {
        let mut seq = PROMPT.to_vec();
        for _ in 0..steps {
            let t = Array::from_slice(&seq, &[1, seq.len() as i32]);
            let logits = model.forward(&t, &mut model.new_caches()).unwrap();
            let id = mlx_rs::ops::indexing::argmax_axis(&logits, -1, false).unwrap();
            seq.push(id.item_exact::<u32>());
        }
        seq.split_off(PROMPT.len())
    }

    /// Log-probabilities of the token after `seq`, from a fresh forward of all of it.
    fn reference_log_probs(model: &Model, seq: &[u32]) -> Vec<f32> {
        let t = Array::from_slice(seq, &[1, seq.len() as i32]);
        let logits = model.forward(&t, &mut model.new_caches()).unwrap();
        let lp = log_softmax(&logits).unwrap();
        eval([&lp]).unwrap();
        host_slice::<f32>(&lp).unwrap().to_vec()
    }

    #[test]
    fn branched_candidates_start_from_the_most_likely_tokens_and_carry_their_log_probability() {
        for arch in [Arch::Qwen2, Arch::Qwen3] {
            let model = tiny_model(arch, 31);
            let mut r = req(5, 3);
            r.branch_first = true;
            let (out, caches) = run(&model, &r, |_, _| Control::Continue);
            let first = reference_log_probs(&model, &PROMPT);
            let mut best: Vec<u32> = (0..first.len() as u32).collect();
            best.sort_by(|&a, &b| first[b as usize].total_cmp(&first[a as usize]).then(a.cmp(&b)));
            let firsts: Vec<u32> = out.candidates.iter().map(|c| c[0]).collect();
            assert_eq!(
                firsts,
                best[..3],
                "the prompt's three most likely tokens, best first"
            );
            assert_eq!(out.candidates[0], greedy_reference(&model, 5));
            for (c, &got) in out.candidates.iter().zip(&out.logprobs) {
                assert_eq!(c.len(), 5);
                // Greedy after the first token; the score sums each token's log-probability,
                // recomputed here without any cache.
                let mut seq = PROMPT.to_vec();
                let mut want = 0.0f32;
                for (k, &t) in c.iter().enumerate() {
                    let lps = reference_log_probs(&model, &seq);
                    if k > 0 {
                        assert_eq!(t, crate::sample::argmax_row(&lps));
                    }
                    want += lps[t as usize];
                    seq.push(t);
                }
                assert!(want < 0.0);
                assert!((got - want).abs() <= 1e-3 * want.abs(), "{got} against {want}");
            }
            assert_eq!(caches[0].offset(), PROMPT.len(), "n > 1 leaves the prompt only");
        }
    }

    #[test]
    fn without_branching_no_log_probabilities_and_more_branches_than_tokens_is_an_error() {
        let model = tiny_model(Arch::Qwen2, 32);
        let (out, _) = run(&model, &req(3, 2), |_, _| Control::Continue);
        assert_eq!(out.logprobs, vec![0.0, 0.0]);
        assert_eq!(out.candidates[0], out.candidates[1], "greedy rows agree");
        let mut r = req(3, 98);
        r.branch_first = true;
        let (err, caches) = refused(&model, &PROMPT, &r);
        assert!(matches!(err, GenerateError::Branches(98, 97)), "{err}");
        assert_eq!(caches[0].offset(), 0, "refused before any prefill");
    }

    #[test]
    fn ids_outside_the_vocabulary_are_an_error_not_a_read_past_the_table() {
        let model = tiny_model(Arch::Qwen2, 21);
        let (err, caches) = refused(&model, &[5, 97], &req(2, 1));
        assert!(matches!(err, GenerateError::TokenOutOfRange(97, 97)), "{err}");
        assert_eq!(caches[0].offset(), 0);
    }

    #[test]
    fn stops_at_max_tokens_with_greedy_tokens() {
        for arch in [Arch::Qwen2, Arch::Qwen3] {
            let model = tiny_model(arch, 21);
            let mut seen = vec![];
            let (out, caches) = run(&model, &req(6, 1), |i, t| {
                seen.push((i, t));
                Control::Continue
            });
            assert_eq!(out.candidates[0], greedy_reference(&model, 6));
            assert_eq!(out.finish_reasons, vec![FinishReason::Length]);
            assert_eq!(seen.len(), 6);
            assert_eq!(out.prefill_tokens, PROMPT.len());
            // The caches hold the prompt and the fed tokens, a prefix of prompt ++ output.
            assert_eq!(caches[0].offset(), PROMPT.len() + 5);
        }
    }

    #[test]
    fn stops_at_a_stop_token_without_emitting_it() {
        let model = tiny_model(Arch::Qwen2, 22);
        let free = run(&model, &req(8, 1), |_, _| Control::Continue).0.candidates[0].clone();
        let mut r = req(8, 1);
        r.stop_token_ids = vec![free[3]];
        let first = free.iter().position(|&t| t == free[3]).unwrap();
        let (out, caches) = run(&model, &r, |_, _| Control::Continue);
        assert_eq!(out.candidates[0], free[..first]);
        assert_eq!(out.finish_reasons, vec![FinishReason::StopToken]);
        assert_eq!(caches[0].offset(), PROMPT.len() + first);
    }

    #[test]
    fn stops_when_the_callback_says_stop() {
        let model = tiny_model(Arch::Qwen3, 23);
        let (out, _) = run(&model, &req(10, 1), |_, _| Control::Stop);
        assert_eq!(out.candidates[0].len(), 1);
        assert_eq!(out.finish_reasons, vec![FinishReason::Stop]);
    }

    #[test]
    fn cancel_from_the_callback_after_three_tokens() {
        let model = tiny_model(Arch::Qwen2, 24);
        for sampling in [
            SamplingParams::default(),
            SamplingParams {
                temperature: 0.8,
                seed: Some(1),
                ..SamplingParams::default()
            },
        ] {
            let cancel = Cancel::new();
            let mut caches = model.new_caches();
            let mut r = req(20, 1);
            r.sampling = sampling;
            let mut count = 0;
            let out = generate(&model, &mut caches, &PROMPT, &r, &cancel, |_, _| {
                count += 1;
                if count == 3 {
                    cancel.cancel();
                }
                Control::Continue
            })
            .unwrap();
            assert_eq!(out.candidates[0].len(), 3);
            assert_eq!(out.finish_reasons, vec![FinishReason::Cancelled]);
            assert!(caches[0].offset() <= PROMPT.len() + 3);
        }
        // Cancelled before anything ran: no tokens, caches untouched.
        let mut caches = model.new_caches();
        let out = generate(&model, &mut caches, &PROMPT, &req(5, 2), &cancelled(), |_, _| {
            Control::Continue
        })
        .unwrap();
        assert_eq!(out.candidates, vec![Vec::<u32>::new(); 2]);
        assert_eq!(out.finish_reasons, vec![FinishReason::Cancelled; 2]);
        assert_eq!(caches[0].offset(), 0);
    }

    #[test]
    fn greedy_candidates_equal_a_single_one_and_share_the_prefill() {
        let model = tiny_model(Arch::Qwen3, 25);
        let (one, _) = run(&model, &req(7, 1), |_, _| Control::Continue);
        let mut calls = vec![0; 3];
        let (three, caches) = run(&model, &req(7, 3), |i, _| {
            calls[i] += 1;
            Control::Continue
        });
        assert_eq!(three.candidates, vec![one.candidates[0].clone(); 3]);
        assert_eq!(calls, vec![7; 3]);
        assert_eq!(three.prefill_tokens, PROMPT.len());
        // The caller's caches are still batch 1 and hold the prompt once.
        assert_eq!(caches[0].batch_size(), Some(1));
        assert_eq!(caches[0].offset(), PROMPT.len());
    }

    #[test]
    fn sampled_candidates_are_seeded_and_differ() {
        let model = tiny_model(Arch::Qwen2, 26);
        let mut r = req(12, 3);
        r.sampling = SamplingParams {
            temperature: 1.5,
            top_p: 1.0,
            top_k: 0,
            seed: Some(99),
        };
        let (a, _) = run(&model, &r, |_, _| Control::Continue);
        let (b, _) = run(&model, &r, |_, _| Control::Continue);
        assert_eq!(a.candidates, b.candidates);
        assert!(a.candidates.iter().all(|c| c.len() == 12));
        assert!(a.candidates[0] != a.candidates[1] || a.candidates[1] != a.candidates[2]);
    }

    #[test]
    fn continues_from_a_cached_prefix_and_chunks_long_prompts() {
        let model = tiny_model(Arch::Qwen2, 27);
        let (whole, _) = run(&model, &req(5, 1), |_, _| Control::Continue);
        // Prefix of 4 already cached: prefill only the rest.
        let mut caches = model.new_caches();
        let cancel = Cancel::new();
        prefill(&model, &mut caches, &PROMPT[..4], &cancel).unwrap();
        let out = generate(&model, &mut caches, &PROMPT[4..], &req(5, 1), &cancel, |_, _| {
            Control::Continue
        })
        .unwrap();
        assert_eq!(out.candidates, whole.candidates);
        assert_eq!(out.prefill_tokens, PROMPT.len() - 4);
        // A prompt longer than one chunk gives the same logits as one forward.
        let long: Vec<u32> = (0..PREFILL_CHUNK as u32 + 40).map(|i| i * 7 % 97).collect();
        let mut chunked = model.new_caches();
        let a = prefill(&model, &mut chunked, &long, &cancel).unwrap().unwrap();
        let t = Array::from_slice(&long, &[1, long.len() as i32]);
        let b = model.forward(&t, &mut model.new_caches()).unwrap();
        use crate::models::test_util::{max_abs_diff, tol};
        assert!(max_abs_diff(&a, &b) <= tol(1e-4));
        assert_eq!(chunked[0].offset(), long.len());
        // Any cut gives those logits: fixed chunks of 7, and chunks timed to a few tokens.
        for chunking in [
            Chunking::Fixed(7),
            Chunking::Timed(Duration::from_micros(1)),
            Chunking::Timed(Duration::from_secs(1)),
        ] {
            let mut caches = model.new_caches();
            let pacing = Pacing {
                chunking,
                overlap: false,
                layer_groups: None,
            };
            let p = prefill_paced(&model, &mut caches, &long, &cancel, pacing).unwrap();
            assert!(max_abs_diff(&p.logits.unwrap(), &b) <= tol(1e-4), "{chunking:?}");
            assert_eq!((p.tokens, caches[0].offset()), (long.len(), long.len()));
            if chunking == Chunking::Fixed(7) {
                assert_eq!(p.chunks, long.len().div_ceil(7));
            }
        }
    }

    /// A chunk run in groups of layers gives the logits and caches of one forward; a group
    /// boundary that says stop leaves the caches as they were, and the next run from there
    /// gives the same logits again.
    #[test]
    fn a_chunk_run_in_groups_of_layers_is_the_same_forward_and_a_stop_between_them_undoes_it() {
        use crate::models::test_util::{max_abs_diff, tol};
        for arch in [Arch::Qwen2, Arch::Qwen3, Arch::Qwen3Moe] {
            let model = tiny_model(arch, 36);
            let first = Array::from_slice(&PROMPT[..4], &[1, 4]);
            let rest = Array::from_slice(&PROMPT[4..], &[1, PROMPT.len() as i32 - 4]);
            let mut plain = model.new_caches();
            model.forward(&first, &mut plain).unwrap();
            let want = model.forward(&rest, &mut plain).unwrap();
            for groups in [1, 2, 5] {
                let mut caches = model.new_caches();
                model.forward(&first, &mut caches).unwrap();
                let mut asked = 0;
                let got = model
                    .forward_grouped(&rest, &mut caches, groups, || {
                        asked += 1;
                        true
                    })
                    .unwrap()
                    .unwrap();
                assert!(max_abs_diff(&got, &want) <= tol(1e-5), "{arch:?} {groups}");
                assert_eq!(asked, groups.min(model.layer_count()) - 1);
                assert_eq!(caches[1].offset(), PROMPT.len());
                // Stopped after the first group: nothing of the chunk stays.
                let mut stopped = model.new_caches();
                model.forward(&first, &mut stopped).unwrap();
                let none = model
                    .forward_grouped(&rest, &mut stopped, groups, || false)
                    .unwrap();
                if groups > 1 {
                    assert!(none.is_none());
                    assert!(stopped.iter().all(|c| c.offset() == 4), "{arch:?} {groups}");
                    let again = model.forward(&rest, &mut stopped).unwrap();
                    assert!(max_abs_diff(&again, &want) <= tol(1e-5), "{arch:?} {groups}");
                } else {
                    assert!(none.is_some());
                }
            }
        }
    }

    /// A mixture of experts prefills in chunks of [`MOE_PREFILL_CHUNK`] on a GPU (others, and
    /// a config whose layers are all dense, in [`PREFILL_CHUNK`]); its long chunks, run in
    /// groups of layers, give the logits of short ones.
    #[test]
    fn a_mixture_of_experts_prefills_in_long_chunks_with_the_same_logits() {
        use crate::models::test_util::{max_abs_diff, tiny_config, tol};
        assert_eq!(gpu_chunk(&tiny_config(Arch::Qwen3)), PREFILL_CHUNK);
        let mut moe = tiny_config(Arch::Qwen3Moe);
        assert_eq!(gpu_chunk(&moe), MOE_PREFILL_CHUNK);
        let m = moe.moe.as_mut().unwrap();
        m.mlp_only_layers = (0..moe.num_hidden_layers).collect();
        assert_eq!(gpu_chunk(&moe), PREFILL_CHUNK);

        let model = tiny_model(Arch::Qwen3Moe, 37);
        let ids: Vec<u32> = (0..MOE_PREFILL_CHUNK as u32 + 100)
            .map(|i| (i * 7 + 3) % 97)
            .collect();
        let run = |chunk: usize, groups: Option<Duration>| {
            let pacing = Pacing {
                chunking: Chunking::Fixed(chunk),
                overlap: false,
                layer_groups: groups,
            };
            let mut caches = model.new_caches();
            let p = prefill_paced(&model, &mut caches, &ids, &Cancel::new(), pacing).unwrap();
            (p.logits.unwrap(), p.chunks)
        };
        let (want, short) = run(PREFILL_CHUNK, None);
        let (got, long) = run(MOE_PREFILL_CHUNK, Some(Duration::from_nanos(1)));
        assert_eq!((short, long), (5, 2));
        assert!(max_abs_diff(&got, &want) <= tol(1e-4));
    }

    /// On a GPU a chunk expected (by the last one) to outlast the piece time runs in groups of
    /// layers sized to it, one a layer before any chunk ran; the CPU's chunks are one piece.
    #[test]
    fn layer_groups_follow_the_models_last_chunk() {
        let model = tiny_model(Arch::Qwen2, 37);
        let gpu = Pacing {
            chunking: Chunking::Fixed(PREFILL_CHUNK),
            overlap: true,
            layer_groups: Some(Duration::from_millis(20)),
        };
        let fresh = tiny_model(Arch::Qwen2, 38);
        assert_eq!(gpu.groups_for(&fresh, 512), fresh.layer_count());
        model.note_prefill(512, Duration::from_millis(30));
        assert_eq!(gpu.groups_for(&model, 512), 2);
        assert_eq!(gpu.groups_for(&model, 100), 1);
        model.note_prefill(512, Duration::from_secs(3));
        assert_eq!(gpu.groups_for(&model, 512), model.layer_count());
        let cpu = Pacing {
            layer_groups: None,
            ..gpu
        };
        assert_eq!(cpu.groups_for(&model, 512), 1);
    }

    /// A cancel set while a chunk runs in groups of layers stops it at the next group: the
    /// chunks before it stay in the caches, nothing of it does.
    #[test]
    fn a_cancel_set_during_a_grouped_chunk_stops_it_between_layers() {
        let model = tiny_model(Arch::Qwen2, 39);
        let long: Vec<u32> = (0..60u32).map(|i| i * 13 % 97).collect();
        let pacing = Pacing {
            chunking: Chunking::Fixed(20),
            overlap: false,
            // Far shorter than any chunk: a group a layer.
            layer_groups: Some(Duration::from_nanos(1)),
        };
        let chunks = |m: &Meter| m.prefill_chunks.load(Ordering::SeqCst);
        let mut caches = model.new_caches();
        let (out, _, ran) = cancel_when(2, chunks, |cancel| {
            generate_paced(&model, &mut caches, &long, &req(4, 1), cancel, pacing, |_, _| {
                Control::Continue
            })
            .unwrap()
        });
        assert_eq!(out.finish_reasons, [FinishReason::Cancelled]);
        assert!(ran >= 2);
        assert_eq!(out.prefill_tokens % 20, 0, "whole chunks only");
        assert!(caches.iter().all(|c| c.offset() == out.prefill_tokens));
        assert!(out.prefill_tokens < long.len());
    }

    #[test]
    fn timed_chunks_fit_the_time_per_token_grow_at_most_twofold_and_stay_within_bounds() {
        let t = Chunking::Timed(Duration::from_millis(250));
        let ms = Duration::from_millis;
        assert_eq!(t.first(), 1);
        // One token took longer than the target: one token at a time.
        assert_eq!(t.next(1, 1, ms(500)), 1);
        assert_eq!(t.next(8, 8, ms(4000)), 1);
        // Fast tokens: at most twice the chunk before.
        assert_eq!(t.next(1, 1, ms(1)), 2);
        assert_eq!(t.next(64, 64, ms(1)), 128);
        // What fits: 25 ms a token, 10 tokens in 250 ms.
        assert_eq!(t.next(16, 16, ms(400)), 10);
        // A short last chunk (3 run of 16) measures per token run.
        assert_eq!(t.next(16, 3, ms(75)), 10);
        assert_eq!(t.next(512, 512, Duration::ZERO), PREFILL_CHUNK);
        assert_eq!(Chunking::Fixed(512).next(512, 512, ms(9000)), 512);
        assert_eq!(Chunking::Fixed(0).first(), 1);
    }

    /// Runs `work` on this thread with a meter installed while another thread sets `cancel`
    /// once `count(meter)` reaches `at`, then reads the count at once. Returns what `work`
    /// returned, the count read right after the flag was set (`None`: `work` ended first),
    /// and the count at the end.
    fn cancel_when<T>(
        at: u64,
        count: fn(&Meter) -> u64,
        work: impl FnOnce(&Cancel) -> T,
    ) -> (T, Option<u64>, u64) {
        let meter = Arc::new(Meter::default());
        meter.install();
        let cancel = Cancel::new();
        let finished = Arc::new(AtomicBool::new(false));
        let setter = {
            let (meter, cancel, finished) = (meter.clone(), cancel.clone(), finished.clone());
            std::thread::spawn(move || {
                while !finished.load(Ordering::SeqCst) {
                    if count(&meter) >= at {
                        cancel.cancel();
                        return Some(count(&meter));
                    }
                    std::hint::spin_loop();
                }
                None
            })
        };
        let out = work(&cancel);
        finished.store(true, Ordering::SeqCst);
        let seen = setter.join().unwrap();
        Meter::uninstall();
        (out, seen, count(&meter))
    }

    #[test]
    fn a_cancel_set_during_prefill_stops_it_before_the_next_chunk() {
        let model = tiny_model(Arch::Qwen2, 33);
        // 3000 chunks of one token: the prefill runs for a while unless it stops.
        let long: Vec<u32> = (0..3000u32).map(|i| i * 13 % 97).collect();
        let chunks = |m: &Meter| m.prefill_chunks.load(Ordering::SeqCst);
        for chunking in [Chunking::Fixed(1), Chunking::Timed(Duration::from_nanos(1))] {
            let mut caches = model.new_caches();
            let pacing = Pacing {
                chunking,
                overlap: false,
                layer_groups: None,
            };
            let (out, seen, ran) = cancel_when(3, chunks, |cancel| {
                generate_paced(&model, &mut caches, &long, &req(4, 1), cancel, pacing, |_, _| {
                    Control::Continue
                })
                .unwrap()
            });
            let seen = seen.expect("the flag was set while the prefill ran");
            assert!(
                ran <= seen + 1,
                "{chunking:?}: {ran} chunks ran, {seen} had started when the flag was set"
            );
            assert!(ran < long.len() as u64, "{chunking:?}: stopped early");
            assert_eq!(out.finish_reasons, [FinishReason::Cancelled]);
            assert!(out.candidates[0].is_empty());
            assert_eq!(out.prefill_tokens, ran as usize, "one token a chunk");
            assert_eq!(caches[0].offset(), out.prefill_tokens, "the chunks run are kept");
        }
    }

    #[test]
    fn a_cancel_set_during_decode_stops_it_before_the_next_step() {
        let model = tiny_model(Arch::Qwen3, 34);
        let steps = |m: &Meter| m.decode_steps.load(Ordering::SeqCst);
        for overlap in [false, true] {
            let pacing = Pacing {
                chunking: Chunking::Fixed(PREFILL_CHUNK),
                overlap,
                layer_groups: None,
            };
            let mut caches = model.new_caches();
            let max = 3000;
            let (out, seen, ran) = cancel_when(5, steps, |cancel| {
                generate_paced(
                    &model,
                    &mut caches,
                    &PROMPT,
                    &req(max, 1),
                    cancel,
                    pacing,
                    |_, _| Control::Continue,
                )
                .unwrap()
            });
            let seen = seen.expect("the flag was set while decoding");
            assert!(
                ran <= seen + 1,
                "overlap {overlap}: {ran} steps queued, {seen} had been when the flag was set"
            );
            assert_eq!(out.finish_reasons, [FinishReason::Cancelled]);
            assert!(out.candidates[0].len() < max);
            // Every token read back came from a step but the first (from the prompt).
            assert!(out.candidates[0].len() as u64 <= ran + 1);
        }
    }

    #[test]
    fn overlapped_and_step_by_step_decoding_agree() {
        let model = tiny_model(Arch::Qwen2, 35);
        let go = |overlap: bool, r: &GenerateRequest| {
            let pacing = Pacing {
                chunking: Chunking::Timed(CPU_CHUNK_TIME),
                overlap,
                layer_groups: None,
            };
            let mut caches = model.new_caches();
            let no = Cancel::new();
            let out = generate_paced(&model, &mut caches, &PROMPT, r, &no, pacing, |_, _| {
                Control::Continue
            })
            .unwrap();
            (out.candidates, out.finish_reasons, caches[0].offset())
        };
        for r in [req(9, 1), req(6, 3)] {
            assert_eq!(go(true, &r), go(false, &r), "{r:?}");
        }
        assert_eq!(go(false, &req(9, 1)).0[0], greedy_reference(&model, 9));
    }

    #[test]
    fn bad_requests_are_errors() {
        let model = tiny_model(Arch::Qwen2, 28);
        let mut caches = model.new_caches();
        let cancel = Cancel::new();
        let go = |caches: &mut [KvCache], ids: &[u32], r: &GenerateRequest| {
            generate(&model, caches, ids, r, &cancel, |_, _| Control::Continue)
        };
        assert!(matches!(
            go(&mut caches, &[], &req(3, 1)),
            Err(GenerateError::EmptyPrompt)
        ));
        assert!(matches!(
            go(&mut caches, &PROMPT, &req(3, 0)),
            Err(GenerateError::NoCandidates)
        ));
        let out = go(&mut caches, &PROMPT, &req(0, 1)).unwrap();
        assert_eq!(out.candidates, vec![Vec::<u32>::new()]);
        assert_eq!(caches[0].offset(), PROMPT.len());
        let mut wide: Vec<KvCache> = caches.iter().map(|c| c.repeat(2).unwrap()).collect();
        assert!(matches!(
            go(&mut wide, &[1], &req(3, 1)),
            Err(GenerateError::CacheBatch(2))
        ));
    }

    #[test]
    #[allow(clippy::print_stdout)]
    fn decode_speed_of_the_tiny_model() {
        let model = tiny_model(Arch::Qwen2, 29);
        let (out, _) = run(&model, &req(64, 1), |_, _| Control::Continue);
        let per_token = out.decode_time.as_secs_f64() * 1e3 / 63.0;
        println!(
            "tiny qwen2: prefill {} tokens {:.2} ms, first token {:.2} ms, decode {:.3} ms/token",
            out.prefill_tokens,
            out.prefill_time.as_secs_f64() * 1e3,
            out.first_token_time.as_secs_f64() * 1e3,
            per_token
        );
        assert_eq!(out.candidates[0].len(), 64);
    }

    /// Greedy decoding of `prompt` with `speculation`, from empty caches (or from caches
    /// holding `cached` ids first, passed as the request's history).
    fn decode(
        model: &Model,
        cached: &[u32],
        prompt: &[u32],
        max_tokens: usize,
        stop: &[u32],
        speculation: Speculation,
        stop_after: Option<usize>,
    ) -> (GenerateOutput, usize) {
        let mut caches = model.new_caches();
        if !cached.is_empty() {
            let p = prefill(model, &mut caches, cached, &Cancel::new()).unwrap();
            assert!(p.is_some());
        }
        let mut r = req(max_tokens, 1);
        r.stop_token_ids = stop.to_vec();
        r.speculation = speculation;
        r.history = cached.to_vec();
        let mut seen = 0;
        let out = generate(model, &mut caches, prompt, &r, &Cancel::new(), |_, _| {
            seen += 1;
            if Some(seen) == stop_after {
                Control::Stop
            } else {
                Control::Continue
            }
        })
        .unwrap();
        (out, caches[0].offset())
    }

    /// A prompt that repeats itself (so n-gram drafts exist), from a seeded generator.
    fn repetitive_prompt(rng: &mut rand::rngs::StdRng, vocab: u32) -> Vec<u32> {
        use rand::Rng;
        let motif: Vec<u32> = (0..rng.gen_range(3..9))
            .map(|_| rng.gen_range(0..vocab))
            .collect();
        let mut p = vec![];
        for _ in 0..rng.gen_range(1..4) {
            p.extend((0..rng.gen_range(0..5)).map(|_| rng.gen_range(0..vocab)));
            p.extend_from_slice(&motif[..rng.gen_range(2..=motif.len())]);
        }
        p
    }

    #[test]
    fn drafted_decoding_gives_the_greedy_tokens_in_fewer_forwards() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(2024);
        let (mut plain_forwards, mut drafted_forwards, mut tokens) = (0, 0, 0);
        for case in 0..40 {
            let arch = if case % 2 == 0 { Arch::Qwen2 } else { Arch::Qwen3 };
            let model = tiny_model(arch, 100 + case);
            let vocab = model.config().vocab_size as u32;
            let prompt = repetitive_prompt(&mut rng, vocab);
            // Half the cases start from caches holding part of the prompt.
            let split = if case % 4 < 2 {
                0
            } else {
                rng.gen_range(0..prompt.len() - 1)
            };
            let (cached, tail) = prompt.split_at(split);
            let max = rng.gen_range(1..24);
            let stop: Vec<u32> = (0..rng.gen_range(0..3))
                .map(|_| rng.gen_range(0..vocab))
                .collect();
            let stop_after = (case % 5 == 0).then(|| rng.gen_range(1..6));
            let max_draft = rng.gen_range(1..10);
            let (want, want_kept) = decode(&model, cached, tail, max, &stop, Speculation::Off, stop_after);
            let (got, got_kept) = decode(
                &model,
                cached,
                tail,
                max,
                &stop,
                Speculation::Ngram { max_draft },
                stop_after,
            );
            let what = format!("case {case}: prompt {prompt:?} split {split} max {max} stop {stop:?}");
            assert_eq!(got.candidates, want.candidates, "{what}");
            assert_eq!(got.finish_reasons, want.finish_reasons, "{what}");
            // The caches hold the prompt and the output tokens fed so far (the plain decode
            // never feeds its last token; drafts may have).
            let fed_all = prompt.len() + got.candidates[0].len();
            assert!(
                (want_kept..=fed_all).contains(&got_kept),
                "{what}: kept {got_kept}, plain {want_kept}"
            );
            assert!(got.decode_forwards <= want.decode_forwards.max(1), "{what}");
            plain_forwards += want.decode_forwards;
            drafted_forwards += got.decode_forwards;
            tokens += got.candidates[0].len();
        }
        eprintln!("{tokens} tokens: {plain_forwards} forwards plain, {drafted_forwards} drafted");
        assert!(
            drafted_forwards < plain_forwards,
            "some drafts were accepted ({drafted_forwards} vs {plain_forwards} forwards)"
        );
    }

    #[test]
    fn drafted_decoding_leaves_caches_that_continue_like_fresh_ones() {
        let model = tiny_model(Arch::Qwen3, 7);
        let prompt = [4, 5, 6, 7, 4, 5, 6, 7, 4, 5];
        let mut caches = model.new_caches();
        let mut r = req(12, 1);
        r.speculation = Speculation::NGRAM;
        let out = generate(&model, &mut caches, &prompt, &r, &Cancel::new(), |_, _| {
            Control::Continue
        })
        .unwrap();
        let kept = caches[0].offset();
        let mut seq = prompt.to_vec();
        seq.extend_from_slice(&out.candidates[0]);
        assert!(kept <= seq.len() && kept >= prompt.len());
        // Continue from the caches: the same tokens as a fresh prefill of everything kept.
        let mut fresh = model.new_caches();
        let want = prefill(&model, &mut fresh, &seq[..kept + 1], &Cancel::new())
            .unwrap()
            .unwrap();
        let got = prefill(&model, &mut caches, &seq[kept..kept + 1], &Cancel::new())
            .unwrap()
            .unwrap();
        let tol = crate::models::test_util::tol(1e-4);
        assert!(crate::models::test_util::max_abs_diff(&got, &want) <= tol);
    }

    #[test]
    fn a_cancelled_drafted_decode_stops_between_forwards() {
        let model = tiny_model(Arch::Qwen2, 9);
        let mut caches = model.new_caches();
        let mut r = req(30, 1);
        r.speculation = Speculation::NGRAM;
        let cancel = Cancel::new();
        let mut seen = 0;
        let out = generate(&model, &mut caches, &PROMPT, &r, &cancel, |_, _| {
            seen += 1;
            if seen == 2 {
                cancel.cancel();
            }
            Control::Continue
        })
        .unwrap();
        assert_eq!(out.finish_reasons, [FinishReason::Cancelled]);
        assert!(out.decode_forwards <= 2, "{} forwards", out.decode_forwards);
    }
}
