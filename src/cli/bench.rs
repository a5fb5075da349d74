//! `laya bench …`: each command's flags become its bench's `Config`; the bench runs and its
//! report is printed.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Subcommand;
use laya::{
    bench::{self, Target},
    config::resolve_model,
    engine::{runtime::DevicePref, Precision},
};

use super::{precision, this_program, ModelArgs, RemoteArgs, ServeArgs};

#[derive(Subcommand)]
pub enum BenchCommand {
    /// The workspace index over a folder: build time, what it holds, retrieval time.
    Workspace {
        /// The workspace folder.
        dir: PathBuf,
        /// Threads building the index (default: the machine's cores).
        #[arg(long)]
        threads: Option<usize>,
        /// Cursors to time retrieval at, spread over the files.
        #[arg(long, default_value_t = 500)]
        samples: usize,
        /// Snippet budget per retrieval, bytes.
        #[arg(long, default_value_t = 1600)]
        max_bytes: usize,
    },
    /// Load time, prefill tok/s, decode ms/token and share of the memory-bandwidth floor.
    Engine {
        /// Models to load (catalog names, GGUF files or folders); default: the two CPU tiers.
        #[arg(long = "model")]
        models: Vec<String>,
        /// Random weights of a catalog model's shape instead (qwen2.5-coder-3b, qwen3-coder-30b-a3b, …).
        #[arg(long = "synthetic")]
        synthetic: Vec<String>,
        #[arg(long, value_parser = precision(), value_delimiter = ',', default_value = "q8")]
        precision: Vec<Precision>,
        #[arg(long, default_value_t = 64)]
        group_size: i32,
        /// Prompt lengths to time prefill at (as a request prefills: chunks and groups of layers
        /// paced for the device).
        #[arg(long, value_delimiter = ',', default_value = "128,512,2048")]
        prefill: Vec<usize>,
        /// Tokens to decode for the per-token time.
        #[arg(long, default_value_t = 32)]
        decode: usize,
        /// Memory bandwidth for the floor, GB/s (default: 4800 on a CUDA GPU, else the host's measured copy bandwidth).
        #[arg(long)]
        bandwidth: Option<f64>,
        /// Also write the rows as JSON lines to this file.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Python with llama-cpp-python (`scripts/peer-setup.sh` prints it): also run llama.cpp
        /// on each GGUF, same prompts, in the same run, and print the ratios.
        #[arg(long)]
        peer_python: Option<PathBuf>,
        /// Threads for the llama.cpp peer.
        #[arg(long, default_value_t = 2)]
        peer_threads: usize,
    },
    /// Time to ready of a model converted at load, first start (converting, writing the
    /// converted cache) and second (reading it); synthetic bf16 folders of catalog shapes or
    /// models as they are.
    Load {
        /// Random bf16 weights of a catalog model's shape (qwen2.5-coder-3b, …), written as a
        /// Hugging Face folder to the scratch folder.
        #[arg(long = "synthetic")]
        synthetic: Vec<String>,
        /// Models as they are (catalog names, folders or GGUF files).
        #[arg(long = "model")]
        models: Vec<String>,
        #[arg(long, value_parser = precision(), value_delimiter = ',', default_value = "q6,q4")]
        precision: Vec<Precision>,
        #[arg(long, default_value_t = 64)]
        group_size: i32,
        /// Keep this many of a synthetic shape's layers (where its weights do not fit).
        #[arg(long)]
        layers: Option<i32>,
        /// Where the synthetic folders and the converted cache go (removed at the end);
        /// default: the system's temporary folder.
        #[arg(long)]
        scratch: Option<PathBuf>,
        /// The vocabulary of the synthetic folders: a catalog name or GGUF file.
        #[arg(long, default_value = "qwen2.5-coder-0.5b")]
        tokenizer: String,
        /// Time the load alone, without the warm-up a start ends with (the same on either
        /// start; on the CPU a 3B's takes minutes).
        #[arg(long)]
        no_warmup: bool,
        /// Also write the rows as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Resident memory of the daemon with one LSP client completing, then several at once
    /// (one copy of the weights serves them all; the goal is at most 1.1x).
    Memory {
        #[command(flatten)]
        serve: ServeArgs,
        /// LSP clients in the second phase.
        #[arg(long, default_value_t = 4)]
        clients: usize,
        /// Completions per client per phase (prompts are short, 4 tokens each).
        #[arg(long, default_value_t = 2)]
        requests: usize,
        /// Skip measuring one `laya lsp --in-process` for comparison.
        #[arg(long)]
        no_in_process: bool,
    },
    /// Many LSP and HTTP clients at once against one daemon on loopback for a bounded time:
    /// requests sent, answered, lost, answered twice, errors; p50/p90/p99 latency per client
    /// kind; the daemon's memory against the prefix store's bounds. Default model: a tiny one
    /// of random weights, written to a temporary folder.
    Soak {
        /// Clients in all.
        #[arg(long, default_value_t = 8)]
        clients: usize,
        /// Share of the clients that are `laya lsp` processes (the rest speak HTTP).
        #[arg(long, default_value_t = 0.5)]
        lsp_fraction: f64,
        /// Seconds to run.
        #[arg(long, default_value_t = 60)]
        duration: u64,
        /// Tokens per completion.
        #[arg(long, default_value_t = 8)]
        max_tokens: usize,
        /// A real model (catalog name, GGUF or folder) instead of the tiny random one.
        #[arg(long)]
        model: Option<String>,
        #[arg(long, value_parser = precision(), default_value = "native")]
        precision: Precision,
        /// Prefix store bound: entries per model.
        #[arg(long, default_value_t = 16)]
        prefill_cache_size: usize,
        /// Prefix store bound: bytes of KV caches per model.
        #[arg(long, default_value_t = 8 << 20)]
        prefill_cache_bytes: usize,
        /// Also write the report as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Typing a line back through the LSP path. By default at a person's pace in real time,
    /// with the server's debounce and cancels and an accept (Tab) once the ghost text makes the
    /// line: keystroke to ghost text, the wait and the model time apart, model calls a
    /// keystroke, accept to the next answer. With --sequential, one keystroke at a time, no
    /// debounce: latency p50/p90/p99, model calls avoided, prompt tokens reused.
    Typing {
        /// Traces: `FILE:LINE:LANGUAGE` of a real file (the line is typed back); repeatable.
        #[arg(long = "file")]
        files: Vec<String>,
        /// Or lines of the quality cases: the first N cases of each language.
        #[arg(long, default_value = "bench/quality/cases.jsonl")]
        cases: PathBuf,
        #[arg(long, default_value_t = 1)]
        per_language: usize,
        #[command(flatten)]
        model: ModelArgs,
        #[command(flatten)]
        remote: RemoteArgs,
        /// Most tokens per suggestion.
        #[arg(long, default_value_t = 16)]
        max_tokens: usize,
        /// Prompt budget in tokens.
        #[arg(long, default_value_t = 2048)]
        budget: usize,
        /// Build every prompt afresh: no typing-through, no anchored prompts, no prefix store.
        #[arg(long)]
        no_reuse: bool,
        /// Write each keystroke's prefix/suffix here, for replaying on another engine.
        #[arg(long)]
        steps_out: Option<PathBuf>,
        /// Completion settings (JSON, the LSP's `completion` section) over the bench's own,
        /// e.g. '{"budget":{"suffixShare":0.02}}'.
        #[arg(long, value_name = "JSON")]
        settings: Option<String>,
        /// Write the keystrokes and the summary here (JSON).
        #[arg(long)]
        json: Option<PathBuf>,
        /// One keystroke at a time, each waiting for its answer, no debounce.
        #[arg(long)]
        sequential: bool,
        /// Explicit requests instead of typing: one at each case's cursor (the user's key for a
        /// suggestion), timed to its answer.
        #[arg(long, conflicts_with = "sequential")]
        explicit: bool,
        /// Type through this LSP server over stdio instead of one in this process, e.g.
        /// "target/release/laya lsp --small M" (through the daemon); split on whitespace.
        #[arg(long, value_name = "COMMAND", conflicts_with = "sequential")]
        lsp_command: Option<String>,
    },
    /// Exact-line and edit similarity per language on masked-line cases from real code,
    /// through the whole completion pipeline, beside another engine's answers.
    Quality {
        /// JSON-lines case file (bench/quality/README.md).
        #[arg(long, default_value = "bench/quality/cases.jsonl")]
        cases: PathBuf,
        #[command(flatten)]
        model: ModelArgs,
        #[command(flatten)]
        remote: RemoteArgs,
        /// Only these languages (repeatable).
        #[arg(long = "language")]
        languages: Vec<String>,
        /// At most this many cases per language.
        #[arg(long)]
        limit: Option<usize>,
        /// Most tokens per completion (the same for every engine compared).
        #[arg(long, default_value_t = 48)]
        max_tokens: usize,
        /// Write laya's answers here (JSON), for `--compare` in a later run.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Another engine's answers to the same cases (scripts/bench_infill.py writes them).
        #[arg(long)]
        compare: Option<PathBuf>,
        /// Completion settings (JSON, the LSP's `completion` section) over the bench's own,
        /// e.g. '{"budget":{"suffixShare":0.02}}'; '{"workspaceContext":true}' runs repository
        /// cases with the workspace index.
        #[arg(long, value_name = "JSON")]
        settings: Option<String>,
        /// Folder of the repository cases' workspaces (`<name>.tar.xz`; default: `repos/`
        /// beside the case file).
        #[arg(long)]
        repos: Option<PathBuf>,
        /// Explicit requests (the user asked; at the start of a line: a block) instead of
        /// requests made while typing.
        #[arg(long)]
        invoked: bool,
    },
}

/// The engine of the typing and quality benches: the remote server when `--remote-url` is
/// given, else the local model.
fn target(model: &ModelArgs, remote: &RemoteArgs) -> Target {
    match remote.config() {
        Some(cfg) => Target::Remote(cfg),
        None => Target::Local {
            model: model.model.clone(),
            options: model.options(),
        },
    }
}

fn log(line: &str) {
    eprintln!("{line}");
}

/// Run the bench `command` and print its report.
pub fn run(command: BenchCommand, device: DevicePref) -> Result<()> {
    let msg = anyhow::Error::msg;
    match command {
        BenchCommand::Workspace {
            dir,
            threads,
            samples,
            max_bytes,
        } => {
            let cfg = bench::workspace::Config {
                dir,
                threads: threads
                    .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get())),
                samples,
                max_bytes,
            };
            let report = bench::workspace::run(&cfg, |l| eprintln!("{l}")).map_err(anyhow::Error::msg)?;
            print!("{report}");
        }
        BenchCommand::Engine {
            models,
            synthetic,
            precision,
            group_size,
            prefill,
            decode,
            bandwidth,
            json,
            peer_python,
            peer_threads,
        } => {
            let cfg = bench::engine::Config {
                models,
                synthetic,
                precisions: precision,
                group_size,
                prefill,
                decode,
                bandwidth,
                json,
                peer: peer_python.map(|python| bench::engine::Peer {
                    python,
                    threads: peer_threads,
                }),
                device,
            };
            // The lines are printed as they are measured, not as a report at the end.
            bench::engine::run(&cfg, |line| println!("{line}")).map_err(msg)?;
        }
        BenchCommand::Load {
            synthetic,
            models,
            precision,
            group_size,
            layers,
            scratch,
            tokenizer,
            no_warmup,
            json,
        } => {
            if synthetic.is_empty() && models.is_empty() {
                bail!("name a shape (--synthetic qwen2.5-coder-3b) or a model (--model PATH)");
            }
            let cfg = bench::load::Config {
                synthetic,
                models,
                precisions: precision,
                group_size,
                layers,
                scratch: scratch.unwrap_or_else(std::env::temp_dir),
                tokenizer: resolve_model(&tokenizer)?,
                device,
                warmup: !no_warmup,
            };
            let report = bench::load::run(&cfg, log).map_err(msg)?;
            print!("{report}");
            if let Some(p) = json {
                let text = serde_json::to_string_pretty(&report.rows)?;
                std::fs::write(&p, text).map_err(|e| msg(format!("writing {}: {e}", p.display())))?;
            }
        }
        BenchCommand::Memory {
            serve,
            clients,
            requests,
            no_in_process,
        } => {
            let cfg = bench::memory::Config {
                program: this_program()?,
                serve: serve.config(device)?,
                clients,
                requests,
                in_process: !no_in_process,
            };
            print!("{}", bench::memory::run(&cfg, log).map_err(msg)?);
        }
        BenchCommand::Soak {
            clients,
            lsp_fraction,
            duration,
            max_tokens,
            model,
            precision,
            prefill_cache_size,
            prefill_cache_bytes,
            json,
        } => {
            if !(0.0..=1.0).contains(&lsp_fraction) {
                bail!("--lsp-fraction must be between 0 and 1");
            }
            let model = match model {
                Some(m) => bench::soak::Model::Path(resolve_model(&m)?),
                None => bench::soak::Model::Tiny,
            };
            let cfg = bench::soak::Config {
                program: this_program()?,
                device,
                model,
                precision,
                clients: clients.max(1),
                lsp_clients: (clients as f64 * lsp_fraction).round() as usize,
                duration: std::time::Duration::from_secs(duration),
                max_tokens,
                prefix_entries: prefill_cache_size,
                prefix_bytes: prefill_cache_bytes,
                json,
            };
            let report = bench::soak::run(&cfg, log).map_err(msg)?;
            print!("{report}");
            report.check().map_err(msg)?;
        }
        BenchCommand::Typing {
            files,
            cases,
            per_language,
            model,
            remote,
            max_tokens,
            budget,
            no_reuse,
            steps_out,
            settings,
            json,
            sequential,
            explicit,
            lsp_command,
        } => {
            use bench::typing::{FileTrace, Traces};
            let mut traces = vec![];
            for f in &files {
                let mut parts = f.rsplitn(3, ':');
                let (language, line, path) = (
                    parts.next(),
                    parts.next().and_then(|l| l.parse().ok()),
                    parts.next(),
                );
                let (Some(language), Some(line), Some(path)) = (language, line, path) else {
                    bail!("--file wants FILE:LINE:LANGUAGE, got `{f}`");
                };
                traces.push(FileTrace {
                    path: path.into(),
                    line,
                    language: language.to_owned(),
                });
            }
            let cfg = bench::typing::Config {
                traces: if traces.is_empty() {
                    Traces::Cases {
                        path: cases,
                        per_language,
                    }
                } else {
                    Traces::Files(traces)
                },
                target: target(&model, &remote),
                device,
                max_tokens,
                budget,
                no_reuse,
                steps_out,
                settings,
                json,
                sequential,
                explicit,
                lsp_command: lsp_command.map(|c| c.split_whitespace().map(str::to_owned).collect()),
            };
            print!("{}", bench::typing::run(&cfg, log).map_err(msg)?);
        }
        BenchCommand::Quality {
            cases,
            model,
            remote,
            languages,
            limit,
            max_tokens,
            out,
            compare,
            settings,
            repos,
            invoked,
        } => {
            let cfg = bench::quality::Config {
                cases,
                target: target(&model, &remote),
                device,
                languages,
                limit,
                max_tokens,
                out,
                compare,
                settings,
                repos,
                invoked,
            };
            print!("{}", bench::quality::run(&cfg, log).map_err(msg)?);
        }
    }
    Ok(())
}
