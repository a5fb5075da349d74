//! `laya bench soak`: many clients at once against one daemon on loopback, for a bounded
//! time. `laya lsp` clients (each its own process, through the daemon's socket) and HTTP
//! clients (`/complete`, `/v1/completions`, some streaming) send requests back to back, each
//! carrying a unique tag in its prompt. Every request ends in exactly one outcome: answered,
//! error, or lost (no answer in time); an answer that arrives twice is counted apart. The
//! daemon's own count of requests served must equal the answers the clients received. The
//! daemon's resident memory is sampled the whole time, to compare with the prefix store's
//! configured bounds; the daemon keeps no freed MLX buffers for reuse, so that memory is its
//! live memory.

use std::{
    collections::HashMap,
    fmt,
    io::{BufRead, BufReader},
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Mutex,
    },
    time::{Duration, Instant},
};

use serde::Serialize;
use serde_json::{json, Value};

use crate::{
    bench::{
        memory::{mib, rss_bytes, settings, BenchDaemon},
        percentile,
    },
    config::{resolve_model, ServeConfig},
    daemon::{client::status_blocking, paths},
    engine::{
        runtime::{use_device, DevicePref},
        Precision,
    },
};

/// How long one request may take before it counts as lost.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

/// The model the daemon serves.
#[derive(Clone, Debug)]
pub enum Model {
    /// A tiny one of random weights (with the 0.5B's tokenizer), written on the CPU to a
    /// temporary folder that is removed afterwards.
    Tiny,
    /// A GGUF file or model folder.
    Path(PathBuf),
}

pub struct Config {
    /// The `laya` binary.
    pub program: PathBuf,
    /// Where the daemon runs its model.
    pub device: DevicePref,
    /// The model (small tier; no large one).
    pub model: Model,
    /// Bit width the daemon serves by default (the LSP clients route everything there).
    pub precision: Precision,
    /// Clients in all; `lsp_clients` of them are `laya lsp` processes, the rest HTTP.
    pub clients: usize,
    pub lsp_clients: usize,
    pub duration: Duration,
    /// Tokens per completion.
    pub max_tokens: usize,
    /// The prefix store's bounds.
    pub prefix_entries: usize,
    pub prefix_bytes: usize,
    /// Also write the report here (JSON).
    pub json: Option<PathBuf>,
}

impl Config {
    /// The daemon's settings: `model` as the small tier, no large one, HTTP on a free
    /// loopback port. The LSP clients take the same, without HTTP.
    fn serve(&self, model: &Path) -> ServeConfig {
        ServeConfig {
            device: self.device,
            small: model.to_string_lossy().into_owned(),
            large: "none".into(),
            precision: self.precision,
            prefill_cache_size: self.prefix_entries,
            prefill_cache_bytes: self.prefix_bytes,
            http: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            ..ServeConfig::default()
        }
    }
}

/// What one kind of client saw.
#[derive(Clone, Debug, Default, Serialize)]
pub struct KindReport {
    pub kind: String,
    pub sent: usize,
    pub answered: usize,
    pub errors: usize,
    pub lost: usize,
    /// Second answers to one request (or late ones to a request counted lost).
    pub answered_twice: usize,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// The first few error messages.
    pub error_samples: Vec<String>,
}

/// The daemon's resident memory over the run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct MemoryReport {
    /// Ready, before any client.
    pub start: u64,
    /// Highest in the first half of the run (the prefix store fills in it).
    pub warm: u64,
    /// Highest in the second half.
    pub second_half: u64,
    pub max: u64,
    /// After the last client stopped.
    pub end: u64,
    /// (seconds since the clients started, bytes).
    pub samples: Vec<(f64, u64)>,
}

impl MemoryReport {
    /// Growth of the peak from the first half of the run to the second.
    pub fn growth(&self) -> i64 {
        self.second_half as i64 - self.warm as i64
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    pub clients: usize,
    pub lsp_clients: usize,
    pub seconds: f64,
    pub kinds: Vec<KindReport>,
    pub sent: usize,
    pub answered: usize,
    pub errors: usize,
    pub lost: usize,
    pub answered_twice: usize,
    /// Requests the daemon counted as served during the run (its `status`).
    pub daemon_served: u64,
    pub requests_per_s: f64,
    pub memory: MemoryReport,
    pub prefix_entries: usize,
    pub prefix_bytes: usize,
}

/// One request's end.
enum Outcome {
    Answered(Duration),
    Error(String),
    Lost,
}

#[derive(Default)]
struct Tally {
    by_kind: HashMap<&'static str, (Vec<f64>, KindReport)>,
}

impl Tally {
    fn record(&mut self, kind: &'static str, tag: &str, outcome: Outcome, twice: usize) {
        let (lat, r) = self.by_kind.entry(kind).or_default();
        r.sent += 1;
        r.answered_twice += twice;
        match outcome {
            Outcome::Answered(d) => {
                r.answered += 1;
                lat.push(d.as_secs_f64() * 1e3);
            }
            Outcome::Error(e) => {
                r.errors += 1;
                if r.error_samples.len() < 5 {
                    r.error_samples.push(format!("{tag}: {e}"));
                }
            }
            Outcome::Lost => r.lost += 1,
        }
    }
}

/// A block of code each client's prompts start with (a different one per client, the same
/// for every request of that client): the prefix store sees repeats and new tails.
fn header(client: usize) -> String {
    let mut s = format!("# client {client}\nimport math\n\n");
    for f in 0..12 {
        s.push_str(&format!(
            "def f{client}_{f}(x, y):\n    \"\"\"Combine x and y, variant {f}.\"\"\"\n    return math.hypot(x, y) * {f} + {client}\n\n"
        ));
    }
    s
}

/// Text before the cursor for request `n` of `client`: the header, then a tagged line.
fn prefix(client: usize, n: usize, tag: &str) -> String {
    format!(
        "{}# {tag}\ndef g{client}_{n:06}(a, b):\n    return ",
        header(client)
    )
}

fn lsp_client(
    bench: &BenchDaemon,
    cfg: &Config,
    serve: &ServeConfig,
    i: usize,
    stop: &AtomicBool,
    tally: &Mutex<Tally>,
) -> Result<(), String> {
    let mut p = bench.lsp(
        &cfg.program,
        &[],
        serve,
        settings(cfg.precision.label(), cfg.max_tokens),
    )?;
    let uri = format!("file:///soak/c{i}.py");
    p.open(&uri, "python", &prefix(i, 0, "open"))?;
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let tag = format!("soak-lsp-{i}-{n}");
        let text = format!("{}\n\nprint(g{i}_{n:06}(1, 2))\n", prefix(i, n, &tag));
        p.change(&uri, n as i32 + 1, &text)?;
        let before = p.stray_answers;
        let line = prefix(i, n, &tag).lines().count() as u32 - 1;
        let t = Instant::now();
        let outcome = match p.inline_completion(&uri, line, 11, ANSWER_TIMEOUT) {
            Ok(Some(_)) => Outcome::Answered(t.elapsed()),
            Ok(None) => Outcome::Error(p.logs.last().cloned().unwrap_or_else(|| "no completion".into())),
            Err(e) if e.contains("no answer within") => Outcome::Lost,
            Err(e) => Outcome::Error(e),
        };
        let exited = matches!(&outcome, Outcome::Error(e) if e.contains("exited"));
        let twice = p.stray_answers - before;
        tally
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .record("lsp", &tag, outcome, twice);
        if exited {
            return Err(format!("client {i}: the language server exited"));
        }
    }
    // Answers still on their way count too.
    let before = p.stray_answers;
    p.wait_log(|_| false, Duration::from_millis(200));
    let late = p.stray_answers - before;
    if late > 0 {
        tally
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .record("lsp", "late", Outcome::Lost, late);
    }
    p.shutdown(Duration::from_secs(5));
    Ok(())
}

/// One HTTP request of the kind `n` picks; its outcome and how many answers beyond the first
/// it carried.
fn http_request(
    addr: SocketAddr,
    i: usize,
    n: usize,
    tag: &str,
    max_tokens: usize,
) -> (&'static str, Outcome, usize) {
    let pre = prefix(i, n, tag);
    let suffix = format!("\n\nprint(g{i}_{n:06}(1, 2))\n");
    let (kind, path, body) = match n % 3 {
        0 => (
            "http /complete",
            "/complete",
            json!({ "prefix": pre, "suffix": suffix, "max_tokens": max_tokens }),
        ),
        1 => (
            "http /v1/completions",
            "/v1/completions",
            json!({ "prompt": pre, "suffix": suffix, "max_tokens": max_tokens }),
        ),
        _ => (
            "http /v1/completions stream",
            "/v1/completions",
            json!({ "prompt": pre, "suffix": suffix, "max_tokens": max_tokens, "stream": true }),
        ),
    };
    let t = Instant::now();
    let r = ureq::post(&format!("http://{addr}{path}"))
        .timeout(ANSWER_TIMEOUT)
        .set("Content-Type", "application/json")
        .set("X-Laya-Client", &format!("soak {i}"))
        .send_string(&body.to_string());
    let resp = match r {
        Ok(resp) => resp,
        Err(ureq::Error::Status(code, resp)) => {
            let text = resp.into_string().unwrap_or_default();
            return (kind, Outcome::Error(format!("HTTP {code}: {text}")), 0);
        }
        Err(ureq::Error::Transport(e)) if e.to_string().contains("timed out") => {
            return (kind, Outcome::Lost, 0)
        }
        Err(e) => return (kind, Outcome::Error(e.to_string()), 0),
    };
    if path == "/v1/completions" && body["stream"] == true {
        // Exactly one final chunk (with usage) and one [DONE]; no error event.
        let (mut finals, mut dones, mut error) = (0, 0, None);
        for line in BufReader::new(resp.into_reader()).lines() {
            let Ok(line) = line else {
                return (kind, Outcome::Lost, 0);
            };
            let Some(data) = line.strip_prefix("data: ") else {
                continue;
            };
            if data == "[DONE]" {
                dones += 1;
                continue;
            }
            match serde_json::from_str::<Value>(data) {
                Ok(v) if v.get("error").is_some() => error = Some(v["error"]["message"].to_string()),
                Ok(v) if v.get("usage").is_some() => finals += 1,
                Ok(_) => {}
                Err(e) => error = Some(format!("bad event {data:?}: {e}")),
            }
        }
        let twice = (finals.max(dones) as usize).saturating_sub(1);
        return match (error, finals, dones) {
            (Some(e), _, _) => (kind, Outcome::Error(e), twice),
            (None, 0, _) | (None, _, 0) => (kind, Outcome::Lost, 0),
            _ => (kind, Outcome::Answered(t.elapsed()), twice),
        };
    }
    let text = match resp.into_string() {
        Ok(t) => t,
        Err(_) => return (kind, Outcome::Lost, 0),
    };
    // One choice; `/complete`'s are the suggestions an editor is shown, which may be none.
    let counts = if path == "/complete" { 0..=1 } else { 1..=1 };
    match serde_json::from_str::<Value>(&text) {
        Ok(v) if v["choices"].as_array().is_some_and(|c| counts.contains(&c.len())) => {
            (kind, Outcome::Answered(t.elapsed()), 0)
        }
        Ok(v) => (kind, Outcome::Error(format!("unexpected answer: {v}")), 0),
        Err(e) => (kind, Outcome::Error(format!("not JSON ({e}): {text}")), 0),
    }
}

fn http_client(addr: SocketAddr, cfg: &Config, i: usize, stop: &AtomicBool, tally: &Mutex<Tally>) {
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let tag = format!("soak-http-{i}-{n}");
        let (kind, outcome, twice) = http_request(addr, i, n, &tag, cfg.max_tokens);
        tally
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .record(kind, &tag, outcome, twice);
    }
}

fn served(dir: &Path) -> Result<u64, String> {
    Ok(status_blocking(dir, Duration::from_secs(10))?
        .models
        .iter()
        .map(|m| m.served)
        .sum())
}

/// Run the soak: start the daemon (loopback HTTP on a free port, private runtime directory),
/// start the clients, let them run for `duration`, stop them, and report (also to
/// `cfg.json`). `log` hears each step as it happens. The report says whether anything was
/// lost ([`Report::check`]).
pub fn run(cfg: &Config, mut log: impl FnMut(&str)) -> Result<Report, String> {
    let scratch = std::env::temp_dir().join(format!("laya-soak-model-{}", std::process::id()));
    let model = match &cfg.model {
        Model::Path(p) => p.clone(),
        Model::Tiny => {
            use_device(DevicePref::Cpu).map_err(|e| e.to_string())?;
            let gguf = resolve_model("qwen2.5-coder-0.5b")
                .map_err(|e| format!("the tiny model borrows its tokenizer: {e}"))?;
            log(&format!("writing a tiny random model to {}", scratch.display()));
            tiny_model(&scratch, &gguf)?
        }
    };
    let report = soak(cfg, &cfg.serve(&model), &mut log);
    let _ = std::fs::remove_dir_all(&scratch);
    let report = report?;
    if let Some(p) = &cfg.json {
        let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        std::fs::write(p, text).map_err(|e| format!("writing {}: {e}", p.display()))?;
    }
    Ok(report)
}

fn soak(cfg: &Config, serve: &ServeConfig, log: &mut impl FnMut(&str)) -> Result<Report, String> {
    let mut bench = BenchDaemon::dir("soak")?;
    // No freed MLX buffers kept for reuse (laya's default keeps up to 1 GiB): the daemon's
    // RSS then follows its live memory, which is what "stops growing" is about. With the
    // cache, a loaded 2-core machine saw +166 MiB in the second half of a 15 s soak; without
    // it, +0.1 MiB.
    bench.env.push(("LAYA_MLX_CACHE_LIMIT".into(), "0".into()));
    let pid = bench.start(&cfg.program, serve)?;
    let addr = paths::read_http_addr(&bench.dir).ok_or("the daemon serves no HTTP")?;
    log(&format!("daemon pid {pid} ready on http://{addr}"));
    let start_rss = rss_bytes(pid).ok_or("cannot read the daemon's memory")?;
    let served_before = served(&bench.dir)?;

    let stop = AtomicBool::new(false);
    let tally = Mutex::new(Tally::default());
    let samples = Mutex::new(vec![]);
    let sampling = AtomicBool::new(true);
    let lsp_clients = cfg.lsp_clients.min(cfg.clients);
    let lsp_serve = ServeConfig {
        http: None,
        ..serve.clone()
    };
    let mut failures = vec![];
    // Time 0 of the samples: the clients start (LSP clients start their process first).
    let t0 = Instant::now();
    let mut seconds = 0.0;
    std::thread::scope(|s| {
        let sampler = {
            let (sampling, samples) = (&sampling, &samples);
            s.spawn(move || {
                while sampling.load(Ordering::Relaxed) {
                    if let Some(b) = rss_bytes(pid) {
                        samples
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push((t0.elapsed().as_secs_f64(), b));
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        };
        let mut handles = vec![];
        for i in 0..cfg.clients {
            let (bench, stop, tally, lsp_serve) = (&bench, &stop, &tally, &lsp_serve);
            handles.push(s.spawn(move || {
                if i < lsp_clients {
                    lsp_client(bench, cfg, lsp_serve, i, stop, tally)
                } else {
                    http_client(addr, cfg, i, stop, tally);
                    Ok(())
                }
            }));
        }
        std::thread::sleep(cfg.duration);
        stop.store(true, Ordering::Relaxed);
        for h in handles {
            match h.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => failures.push(e),
                Err(_) => failures.push("a client thread panicked".into()),
            }
        }
        seconds = t0.elapsed().as_secs_f64();
        std::thread::sleep(Duration::from_millis(500));
        sampling.store(false, Ordering::Relaxed);
        let _ = sampler.join();
    });
    if !failures.is_empty() {
        return Err(failures.join("; "));
    }
    let end_rss = rss_bytes(pid).ok_or("the daemon is gone")?;
    let daemon_served = served(&bench.dir)? - served_before;
    drop(bench);

    let samples = samples.into_inner().unwrap_or_else(|p| p.into_inner());
    let half = cfg.duration.as_secs_f64() / 2.0;
    let peak = |from: f64, to: f64| {
        samples
            .iter()
            .filter(|(t, _)| *t >= from && *t < to)
            .map(|(_, b)| *b)
            .max()
            .unwrap_or(0)
    };
    let memory = MemoryReport {
        start: start_rss,
        warm: peak(0.0, half),
        second_half: peak(half, f64::INFINITY),
        max: samples.iter().map(|(_, b)| *b).max().unwrap_or(start_rss),
        end: end_rss,
        samples,
    };
    let mut kinds: Vec<KindReport> = tally
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .by_kind
        .into_iter()
        .map(|(kind, (lat, mut r))| {
            r.kind = kind.to_owned();
            r.p50_ms = percentile(&lat, 50.0);
            r.p90_ms = percentile(&lat, 90.0);
            r.p99_ms = percentile(&lat, 99.0);
            r.max_ms = percentile(&lat, 100.0);
            r
        })
        .collect();
    kinds.sort_by(|a, b| a.kind.cmp(&b.kind));
    let sum = |f: fn(&KindReport) -> usize| kinds.iter().map(f).sum::<usize>();
    let report = Report {
        clients: cfg.clients,
        lsp_clients,
        seconds: cfg.duration.as_secs_f64(),
        sent: sum(|k| k.sent),
        answered: sum(|k| k.answered),
        errors: sum(|k| k.errors),
        lost: sum(|k| k.lost),
        answered_twice: sum(|k| k.answered_twice),
        daemon_served,
        requests_per_s: sum(|k| k.answered) as f64 / seconds.max(1e-9),
        kinds,
        memory,
        prefix_entries: cfg.prefix_entries,
        prefix_bytes: cfg.prefix_bytes,
    };
    Ok(report)
}

/// A tiny Qwen2 of random weights (see [`crate::engine::synthetic::tiny`]) written as a
/// safetensors folder in `dir`, with the tokenizer of the GGUF `tokenizer_gguf`. Uses the
/// MLX device the caller selected.
pub fn tiny_model(dir: &Path, tokenizer_gguf: &Path) -> Result<PathBuf, String> {
    use crate::engine::{synthetic, Precision};
    let cfg = synthetic::tiny();
    let weights = synthetic::random_weights(&cfg, Precision::Native, 64, synthetic::Dtype::Float32, 7)
        .map_err(|e| e.to_string())?;
    synthetic::write_folder(dir, &cfg, &weights, None, tokenizer_gguf).map_err(|e| e.to_string())?;
    Ok(dir.to_owned())
}

impl Report {
    /// Nothing lost, answered twice or failed, and the daemon served exactly what the
    /// clients received; else what went wrong.
    pub fn check(&self) -> Result<(), String> {
        if self.lost + self.answered_twice + self.errors > 0 || self.daemon_served != self.answered as u64 {
            return Err("requests were lost, answered twice or failed (see above)".into());
        }
        Ok(())
    }
}

/// The lines `laya bench soak` prints.
impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&summary(self))
    }
}

fn summary(r: &Report) -> String {
    let mut s = format!(
        "{} clients ({} LSP, {} HTTP) for {:.0} s: sent {}, answered {}, errors {}, lost {}, answered twice {}; \
         the daemon served {}; {:.1} requests/s\n",
        r.clients,
        r.lsp_clients,
        r.clients - r.lsp_clients,
        r.seconds,
        r.sent,
        r.answered,
        r.errors,
        r.lost,
        r.answered_twice,
        r.daemon_served,
        r.requests_per_s
    );
    s.push_str(&format!(
        "{:<30} {:>6} {:>8} {:>6} {:>5} {:>6} {:>9} {:>9} {:>9} {:>9}\n",
        "client kind", "sent", "answered", "errors", "lost", "twice", "p50 ms", "p90 ms", "p99 ms", "max ms"
    ));
    for k in &r.kinds {
        s.push_str(&format!(
            "{:<30} {:>6} {:>8} {:>6} {:>5} {:>6} {:>9.1} {:>9.1} {:>9.1} {:>9.1}\n",
            k.kind,
            k.sent,
            k.answered,
            k.errors,
            k.lost,
            k.answered_twice,
            k.p50_ms,
            k.p90_ms,
            k.p99_ms,
            k.max_ms
        ));
        for e in &k.error_samples {
            s.push_str(&format!("  error: {e}\n"));
        }
    }
    let m = &r.memory;
    s.push_str(&format!(
        "daemon RSS MiB: start {:.1}, warm (peak of 1st half) {:.1}, peak of 2nd half {:.1} (growth {:+.1}), max {:.1}, end {:.1}\n",
        mib(m.start),
        mib(m.warm),
        mib(m.second_half),
        m.growth() as f64 / (1024.0 * 1024.0),
        mib(m.max),
        mib(m.end)
    ));
    s.push_str(&format!(
        "prefix store bound: {} entries, {:.1} MiB (end - warm = {:+.1} MiB)\n",
        r.prefix_entries,
        mib(r.prefix_bytes as u64),
        (m.end as i64 - m.warm as i64) as f64 / (1024.0 * 1024.0)
    ));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_passes_only_when_every_request_was_answered_once() {
        let clean = Report {
            sent: 3,
            answered: 3,
            daemon_served: 3,
            ..Default::default()
        };
        assert_eq!(clean.check(), Ok(()));
        for bad in [
            Report {
                lost: 1,
                ..clean.clone()
            },
            Report {
                errors: 1,
                ..clean.clone()
            },
            Report {
                answered_twice: 1,
                ..clean.clone()
            },
            Report {
                daemon_served: 4,
                ..clean.clone()
            },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
        let text = clean.to_string();
        assert!(
            text.starts_with("0 clients (0 LSP, 0 HTTP) for 0 s: sent 3, answered 3,"),
            "{text}"
        );
    }
}
