//! `laya bench engine`: load time, prefill throughput, decode latency and how close decode
//! comes to the memory-bandwidth floor (every weight byte read once per token), and how long
//! a cancelled request keeps the model after its flag is set (cancel → free), while it
//! prefills and while it decodes.

use std::{
    fmt,
    io::Write,
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use mlx_rs::{transforms::eval, Array, Dtype};

use crate::{
    bench::error_chain,
    catalog,
    config::resolve_model,
    engine::{
        cache::KvCache,
        draft::DRAFT_MAX,
        generate::{generate, prefill, Control, GenerateRequest, Meter, Pacing},
        load::{self, LoadOptions},
        models::Model,
        runtime::{graph_primitives, kernels, use_device, DevicePref},
        synthetic, Cancel, Precision,
    },
};

pub struct Config {
    /// Models to load (catalog names, GGUF files or folders); with no `synthetic` either:
    /// the two CPU tiers.
    pub models: Vec<String>,
    /// Random weights of these real shapes (the catalog's models).
    pub synthetic: Vec<String>,
    pub precisions: Vec<Precision>,
    pub group_size: i32,
    /// Prompt lengths to time prefill at.
    pub prefill: Vec<usize>,
    /// Tokens to decode for the per-token time.
    pub decode: usize,
    /// Memory bandwidth for the floor, GB/s (`None`: 4800 on a CUDA GPU, else the host's
    /// measured copy bandwidth).
    pub bandwidth: Option<f64>,
    /// Also write the rows as JSON lines here.
    pub json: Option<PathBuf>,
    /// Also run llama.cpp on each GGUF.
    pub peer: Option<Peer>,
    pub device: DevicePref,
}

/// llama.cpp through llama-cpp-python (`scripts/peer-setup.sh` prints the Python).
pub struct Peer {
    pub python: PathBuf,
    pub threads: usize,
}

/// What `laya bench engine` printed, line by line, and its rows (laya's, then the peer's).
#[derive(Debug, Default)]
pub struct Report {
    pub lines: Vec<String>,
    pub rows: Vec<Row>,
}

/// The lines `laya bench engine` prints.
impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.lines.iter().try_for_each(|l| writeln!(f, "{l}"))
    }
}

/// Measure every target at every precision, then the peer if asked; `on_line` hears each
/// line of the report as soon as it is measured (the command prints them as they come).
pub fn run(cfg: &Config, mut on_line: impl FnMut(&str)) -> Result<Report, String> {
    let device = use_device(cfg.device).map_err(|e| e.to_string())?;
    let on_gpu = device.starts_with("gpu");
    let mut targets = vec![];
    let models = if cfg.models.is_empty() && cfg.synthetic.is_empty() {
        catalog::DEFAULT_FETCH.iter().map(|s| s.to_string()).collect()
    } else {
        cfg.models.clone()
    };
    for m in models {
        targets.push(Target {
            source: Source::File(resolve_model(&m).map_err(|e| e.to_string())?),
            label: m,
        });
    }
    for s in &cfg.synthetic {
        if crate::catalog::find(s).is_none() {
            let known: Vec<&str> = crate::catalog::MODELS.iter().map(|m| m.name).collect();
            return Err(format!("unknown shape `{s}`; known: {}", known.join(", ")));
        }
        targets.push(Target {
            label: s.clone(),
            source: Source::Synthetic(s.clone()),
        });
    }
    let synthetic_dtype = if on_gpu { Dtype::Bfloat16 } else { Dtype::Float32 };
    let json = match &cfg.json {
        Some(p) => Some(std::fs::File::create(p).map_err(|e| format!("creating {}: {e}", p.display()))?),
        None => None,
    };
    // One bandwidth for every row (laya's and the peer's), so floors compare.
    let bandwidth = cfg
        .bandwidth
        .or(on_gpu.then_some(4800.0))
        .unwrap_or_else(host_copy_bandwidth_gbs);
    let settings = Settings {
        precisions: cfg.precisions.clone(),
        group_size: cfg.group_size,
        prefill_lengths: cfg.prefill.clone(),
        decode_tokens: cfg.decode,
        bandwidth_gbs: Some(bandwidth),
        synthetic_dtype,
        device: device.clone(),
    };
    let mut out = Output {
        lines: vec![],
        on_line: &mut on_line,
        json,
    };
    let (width, chain) = (2048, 1000);
    let op = op_cost_us(width, chain, synthetic_dtype).map_err(|e| error_chain(&e))?;
    out.line(format!(
        "one small op on {device}: {op:.2} us (a chain of {chain} dependent adds on [1, {width}] {synthetic_dtype:?}, one eval)"
    ));
    out.line(header());
    let mut rows = measure(&targets, &settings, |row| out.row(row)).map_err(|e| format!("{e:#}"))?;
    let mut peer_rows = vec![];
    if let Some(peer) = &cfg.peer {
        for t in &targets {
            let Source::File(path) = &t.source else {
                continue;
            };
            if !path.is_file() {
                continue; // llama.cpp reads GGUF files only
            }
            let theirs = peer_llama_cpp(&peer.python, path, &t.label, &settings, bandwidth, peer.threads)
                .map_err(|e| format!("{e:#}"))?;
            out.row(&theirs);
            for r in rows.iter().filter(|r| r.model == t.label) {
                out.line(format!(
                    "  {} {} vs llama.cpp: decode {:.2}x the time, prefill {}",
                    r.model,
                    r.precision,
                    r.decode_ms_per_token / theirs.decode_ms_per_token,
                    r.prefill_tok_s
                        .iter()
                        .zip(&theirs.prefill_tok_s)
                        .map(|((n, a), (_, b))| format!("{n}: {:.2}x the speed", a / b))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            peer_rows.push(theirs);
        }
    }
    rows.extend(peer_rows);
    Ok(Report {
        lines: out.lines,
        rows,
    })
}

/// Where the report's lines go as they come: to the caller and the report, and each row
/// also to the JSON lines file.
struct Output<'a, F: FnMut(&str)> {
    lines: Vec<String>,
    on_line: &'a mut F,
    json: Option<std::fs::File>,
}

impl<F: FnMut(&str)> Output<'_, F> {
    fn line(&mut self, line: String) {
        (self.on_line)(&line);
        self.lines.push(line);
    }

    fn row(&mut self, row: &Row) {
        self.line(format_row(row));
        if let Some(f) = self.json.as_mut() {
            let _ = writeln!(f, "{}", serde_json::to_string(row).unwrap_or_default());
        }
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
    /// Random weights of a named real shape (the catalog's models).
    Synthetic(String),
}

pub struct Settings {
    pub precisions: Vec<Precision>,
    pub group_size: i32,
    pub prefill_lengths: Vec<usize>,
    pub decode_tokens: usize,
    /// Memory bandwidth in GB/s for the floor; `None` measures the host's copy bandwidth.
    pub bandwidth_gbs: Option<f64>,
    /// Dense dtype of synthetic weights (bf16 on GPUs, f32 on CPUs).
    pub synthetic_dtype: Dtype,
    pub device: String,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Row {
    pub model: String,
    pub synthetic: bool,
    pub device: String,
    pub precision: String,
    pub load_s: f64,
    /// (prompt length, tokens per second), the second run at that length.
    pub prefill_tok_s: Vec<(usize, f64)>,
    /// The same for the first run at each length (it pays for kernels first compiled for that
    /// shape); empty where not measured.
    #[serde(default)]
    pub prefill_first_tok_s: Vec<(usize, f64)>,
    /// The primitives of one decode step's graph by name (see [`decode_step_ops`]); empty
    /// where not counted.
    #[serde(default)]
    pub decode_step_ops: std::collections::BTreeMap<String, usize>,
    pub decode_ms_per_token: f64,
    /// Decode ms a token after a long prompt (its length first): what a completion at the end
    /// of a file's window pays, attention over that many keys included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode_long: Option<(usize, f64)>,
    /// Of `decode_long`'s ms a token: building and queueing the forward on the host, and
    /// waiting for its token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode_long_split: Option<(f64, f64)>,
    pub weight_bytes_per_token: u64,
    pub bandwidth_gbs: f64,
    pub floor_ms_per_token: f64,
    /// floor / measured: 1.0 would read every weight byte at full bandwidth.
    pub share_of_floor: f64,
    /// Cancel → free while prefilling and while decoding (absent for llama.cpp's rows).
    #[serde(default)]
    pub cancel: Option<CancelFree>,
    /// A decode forward that checks a full draft: positions fed (the last token and
    /// [`DRAFT_MAX`] drafted ones) and its time in ms (absent for llama.cpp's rows). Drafts pay
    /// where this is close to one decode step.
    #[serde(default)]
    pub draft_check: Option<(usize, f64)>,
}

/// How long a cancelled generation keeps the model: from its flag being set to the model
/// being free (generation returned and the device idle), sampled at points spread over one
/// piece (a prompt chunk, a decode step), so the maximum nears a whole piece and the mean
/// half of one.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct CancelFree {
    pub prefill_ms: Vec<f64>,
    /// Tokens in the chunk run when the flag was set, and how long the chunk before took.
    pub prefill_chunk_tokens: u64,
    pub prefill_chunk_ms: f64,
    pub decode_ms: Vec<f64>,
    pub decode_step_ms: f64,
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
    work: impl FnOnce(&Cancel) -> anyhow::Result<()>,
) -> anyhow::Result<(f64, f64, u64)> {
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
        .map_err(|_| anyhow::anyhow!("the cancelling thread panicked"))?
        .ok_or_else(|| anyhow::anyhow!("the generation ended before the flag was set"))?;
    Ok((
        free.saturating_duration_since(set).as_secs_f64() * 1e3,
        piece.as_secs_f64() * 1e3,
        tokens,
    ))
}

/// Cancel → free while prefilling (a 4096-token prompt, the flag set during its 4th chunk)
/// and while decoding (the flag set during the 4th step), each at [`CANCEL_SAMPLES`] points
/// spread over the piece, with the device's pacing ([`Pacing::for_device`]).
pub fn cancel_to_free(model: &Model) -> anyhow::Result<CancelFree> {
    let mut c = CancelFree::default();
    let request = GenerateRequest::greedy;
    let long = random_ids(8 * crate::engine::generate::PREFILL_CHUNK, 11);
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
    let held = cached[0].offset();
    for i in 0..CANCEL_SAMPLES {
        let share = i as f64 / CANCEL_SAMPLES as f64;
        let (ms, piece, _) = cancel_sample(4, share, steps, |cancel| {
            let caches: &mut [KvCache] = &mut cached;
            caches.iter_mut().for_each(|k| k.truncate_to(held));
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
pub fn format_cancel(c: &CancelFree) -> String {
    let pacing = Pacing::for_device();
    let (pmax, pmean) = max_mean(&c.prefill_ms);
    let (dmax, dmean) = max_mean(&c.decode_ms);
    format!(
        "cancel → free: prefill {pmax:.0} ms at most, {pmean:.0} ms mean (a chunk of {} tokens, {:.0} ms; {:?}); \
         decode {dmax:.0} ms at most, {dmean:.0} ms mean (a step of {:.0} ms; overlap {}); {} samples each",
        c.prefill_chunk_tokens,
        c.prefill_chunk_ms,
        pacing.chunking,
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
pub fn op_cost_us(width: i32, n: usize, dtype: Dtype) -> Result<f64, mlx_rs::error::Exception> {
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

fn prefill_time(model: &Model, n: usize) -> anyhow::Result<Duration> {
    let ids: Vec<i32> = random_ids(n, n as u64).into_iter().map(|i| i as i32).collect();
    let tokens = Array::from_slice(&ids, &[1, n as i32]);
    let mut caches = model.new_caches();
    let t = Instant::now();
    let logits = model.forward(&tokens, &mut caches)?;
    eval([&logits])?;
    Ok(t.elapsed())
}

/// Mean time of a decode forward of `positions` tokens after a 128-token prompt (what checking
/// a draft costs), over a few runs after one untimed.
fn check_ms(model: &Model, positions: usize) -> anyhow::Result<f64> {
    let mut caches = model.new_caches();
    let prompt = random_ids(128, 5);
    let p = prefill(model, &mut caches, &prompt, &Cancel::new())?;
    anyhow::ensure!(p.is_some(), "the prompt did not run");
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
        caches.iter_mut().for_each(|c| c.truncate_to(prompt.len()));
    }
    Ok(total.as_secs_f64() * 1e3 / runs as f64)
}

/// The primitives of one decode step's graph (a token after a 128-token prompt: the model's
/// forward and the argmax), counted before evaluation: the ops, and so nearly the kernels,
/// a token costs on any device.
pub fn decode_step_ops(model: &Model) -> anyhow::Result<std::collections::BTreeMap<String, usize>> {
    let vocab = model.config().vocab_size as u32;
    let ids: Vec<u32> = random_ids(129, 5).into_iter().map(|i| i % vocab).collect();
    let mut caches = model.new_caches();
    let p = prefill(model, &mut caches, &ids[..128], &Cancel::new())?;
    anyhow::ensure!(p.is_some(), "the prompt did not run");
    let step = Array::from_slice(&[ids[128] as i32], &[1, 1]);
    let logits = model.forward(&step, &mut caches)?;
    let next = mlx_rs::ops::indexing::argmax_axis(&logits, -1, false)?;
    Ok(graph_primitives(&[&next])?)
}

/// Mean time of a decode step after a 128-token prompt.
fn decode_ms(model: &Model, tokens: usize) -> anyhow::Result<f64> {
    Ok(decode_ms_after(model, 128, tokens)?.0)
}

/// Mean time of a decode step after a prompt of `prompt` random tokens.
/// Decode ms a token after a `prompt`-token prompt, and of it the ms building the forwards
/// and waiting for their tokens.
fn decode_ms_after(model: &Model, prompt: usize, tokens: usize) -> anyhow::Result<(f64, f64, f64)> {
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
    anyhow::ensure!(n > 1, "decode produced {n} tokens");
    let per = |d: std::time::Duration| d.as_secs_f64() * 1e3 / (n - 1) as f64;
    Ok((
        per(out.decode_time),
        per(out.decode_build_time),
        per(out.decode_wait_time),
    ))
}

/// Each target at each precision, in order; `on_row` hears each row as it is measured.
pub fn measure(targets: &[Target], s: &Settings, mut on_row: impl FnMut(&Row)) -> anyhow::Result<Vec<Row>> {
    let bandwidth = s.bandwidth_gbs.unwrap_or_else(host_copy_bandwidth_gbs);
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
                Source::Synthetic(name) => {
                    let cfg = crate::catalog::find(name)
                        .ok_or_else(|| anyhow::anyhow!("unknown shape {name}"))?
                        .shape
                        .config();
                    (
                        synthetic::random_model(&cfg, precision, s.group_size, s.synthetic_dtype, 1)?,
                        true,
                    )
                }
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
            let (long_ms, long_build, long_wait) = decode_ms_after(&model, LONG_CONTEXT, s.decode_tokens)?;
            let decode_step_ops = decode_step_ops(&model)?;
            let cancel = cancel_to_free(&model)?;
            let draft_check = Some((DRAFT_MAX + 1, check_ms(&model, DRAFT_MAX + 1)?));
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
                decode_long: Some((LONG_CONTEXT, long_ms)),
                decode_long_split: Some((long_build, long_wait)),
                weight_bytes_per_token: bytes,
                bandwidth_gbs: bandwidth,
                floor_ms_per_token: floor,
                share_of_floor: floor / decode,
                cancel: Some(cancel),
                draft_check,
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
        .map(|(n, ms)| {
            let split = r
                .decode_long_split
                .map(|(b, w)| format!(" ({b:.2} building, {w:.2} waiting)"))
                .unwrap_or_default();
            format!("\n  decode after a {n}-token prompt: {ms:.2} ms a token{split}")
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
        + &cancel
        + &check
}

/// Run llama.cpp (through `scripts/bench_llama_cpp.py` and the Python that has
/// llama-cpp-python, see `scripts/peer-setup.sh`) on the same GGUF with the same prompt
/// lengths, token ids and bandwidth, and return its row.
pub fn peer_llama_cpp(
    python: &std::path::Path,
    gguf: &std::path::Path,
    label: &str,
    s: &Settings,
    bandwidth_gbs: f64,
    threads: usize,
) -> anyhow::Result<Row> {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/bench_llama_cpp.py");
    let prefill: Vec<String> = s.prefill_lengths.iter().map(usize::to_string).collect();
    let out = std::process::Command::new(python)
        .arg(&script)
        .arg(gguf)
        .args(["--threads", &threads.to_string(), "--prefill", &prefill.join(",")])
        .args(["--decode", &s.decode_tokens.to_string(), "--label", label])
        .args(["--bandwidth", &bandwidth_gbs.to_string()])
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "llama.cpp peer failed: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let line = String::from_utf8_lossy(&out.stdout);
    let last = line
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or_default();
    Ok(serde_json::from_str(last)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{synthetic, Precision};

    /// A decode step of the 30B-A3B's layers (reduced for a CPU to 16 experts, a 1,024-token
    /// vocabulary and a quarter of the widths: the ops are the same) runs two gathered products
    /// a layer: the experts' gate and up rows in one, their down rows in the other. Prints what
    /// a layer adds to the step (the count set beside mlx-lm's in docs/benchmarks.md; the CPU
    /// writes MLX's fast kernels out as plain ops, so a GPU counts fewer).
    #[test]
    fn a_moe_decode_step_gathers_twice_a_layer() {
        let base = crate::catalog::find("qwen3-coder-30b-a3b")
            .unwrap()
            .shape
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
