//! `laya bench engine`: the engine's measurements ([`crate::engine::measure`]: load time,
//! prefill throughput, decode latency and its bandwidth floor, a decode step's ops, cancel →
//! free) of the models asked for (catalog names, files, or synthetic weights of the catalog's
//! shapes), printed as they come, optionally written as JSON lines, and beside llama.cpp's on
//! the same GGUF files.

use std::{fmt, io::Write, path::PathBuf};

use crate::{
    bench::error_chain,
    catalog,
    config::resolve_model,
    engine::{
        measure::{self, format_row, header, host_copy_bandwidth_gbs, Row, Settings, Source, Target},
        runtime::{use_device, DevicePref},
        Precision,
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
        let Some(model) = catalog::find(s) else {
            let known: Vec<&str> = catalog::MODELS.iter().map(|m| m.name).collect();
            return Err(format!("unknown shape `{s}`; known: {}", known.join(", ")));
        };
        targets.push(Target {
            label: s.clone(),
            source: Source::Synthetic(model.shape),
        });
    }
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
        device: device.clone(),
    };
    let mut out = Output {
        lines: vec![],
        on_line: &mut on_line,
        json,
    };
    out.line(measure::small_op(&device).map_err(|e| error_chain(&e))?);
    out.line(header());
    let mut rows = measure::measure(&targets, &settings, |row| out.row(row)).map_err(|e| error_chain(&e))?;
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
