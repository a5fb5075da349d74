//! The `laya` command line.

use std::{
    collections::HashMap,
    io::IsTerminal,
    path::PathBuf,
    process::ExitCode,
    sync::{atomic::AtomicBool, Arc},
};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use laya::{
    catalog,
    completion::postprocess,
    doctor,
    engine::{
        runtime::{use_device, DevicePref},
        CompletionRequest, LoadOptions, LocalModel, ModelKey, Precision, SamplingParams, Tier,
    },
    fetch::{self, Fetched, Source},
    prompt::{self, LineCol},
};

#[derive(Parser)]
#[command(
    name = "laya",
    version,
    about = "Local-first code completion server (LSP + HTTP) on MLX"
)]
struct Cli {
    /// Device for MLX: auto picks the GPU when the linked MLX has one.
    #[arg(long, global = true, env = "LAYA_DEVICE", value_enum, default_value = "auto")]
    device: DevicePref,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Report the MLX library, backend, device and models, with the fix for anything missing.
    Doctor,
    /// Serve the Language Server Protocol on stdin/stdout (what editors start). Completions
    /// come from the resident daemon (`laya serve`), started with these flags when none runs.
    Lsp {
        #[command(flatten)]
        serve: ServeArgs,
        #[command(flatten)]
        remote: RemoteArgs,
        /// Run the models inside this process instead of the shared daemon.
        #[arg(long, conflicts_with = "remote_url")]
        in_process: bool,
    },
    /// The resident daemon: one copy of each model for every editor and tool, over a unix
    /// socket (`laya lsp`) and HTTP (`/complete`, `/v1/completions`, `/v1/models`, `/health`).
    Serve {
        #[command(flatten)]
        serve: ServeArgs,
    },
    /// Run `laya serve` as a user service (systemd on Linux, launchd on macOS).
    Service {
        #[command(subcommand)]
        command: ServiceCommand,
    },
    /// Complete the code at FILE:LINE:COL (1-based) with the model and print the middle.
    Complete {
        /// `path/to/file:LINE:COL`, 1-based, column in characters.
        location: String,
        #[command(flatten)]
        model: ModelArgs,
        /// Most tokens to generate.
        #[arg(long, default_value_t = 64)]
        max_tokens: usize,
        /// Sampling temperature; 0 is greedy.
        #[arg(long, default_value_t = 0.0)]
        temperature: f32,
    },
    /// Benchmarks that print numbers.
    Bench {
        #[command(subcommand)]
        command: BenchCommand,
    },
    /// Fetch or list models.
    Models {
        #[command(subcommand)]
        command: ModelsCommand,
    },
}

/// Which model to load and how.
#[derive(clap::Args, Clone)]
struct ModelArgs {
    /// A catalog name (`laya models list`), a GGUF file or a safetensors model folder.
    #[arg(long, default_value = catalog::DEFAULT_MODEL)]
    model: String,
    /// Weight precision: native keeps the file's own values (GGUF: dequantized to f32).
    #[arg(long, value_enum, default_value = "q8")]
    precision: Precision,
    /// Quantization group size.
    #[arg(long, default_value_t = 64)]
    group_size: i32,
    /// Do not read or write the converted-weights cache.
    #[arg(long)]
    no_cache: bool,
}

/// A model served elsewhere through the OpenAI completions API, instead of a local one.
#[derive(clap::Args, Clone)]
struct RemoteArgs {
    /// Base URL of an OpenAI-compatible server (vLLM, llama.cpp server), e.g.
    /// http://127.0.0.1:8080/v1; the prompt is sent to {URL}/completions.
    #[arg(long, value_name = "URL")]
    remote_url: Option<String>,
    /// The `model` to ask the remote server for (default: the first of its /models).
    #[arg(long, requires = "remote_url")]
    remote_model: Option<String>,
    /// Environment variable holding a bearer token for the remote server.
    #[arg(long, default_value = "LAYA_REMOTE_API_KEY", requires = "remote_url")]
    remote_api_key_env: String,
    /// Seconds a remote request may take.
    #[arg(long, default_value_t = 30, requires = "remote_url")]
    remote_timeout: u64,
    /// Server-specific fields for every request, as a JSON object (e.g.
    /// '{"repeat_penalty": 1.0}' for llama-cpp-python's server, which otherwise penalizes
    /// repeats).
    #[arg(long, value_name = "JSON", requires = "remote_url", value_parser = remote_extra)]
    remote_extra: Option<serde_json::Map<String, serde_json::Value>>,
}

fn remote_extra(text: &str) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    laya::engine::remote::RemoteConfig::parse_extra_body(text)
}

impl RemoteArgs {
    fn config(&self) -> Option<laya::engine::remote::RemoteConfig> {
        let url = self.remote_url.as_ref()?;
        let mut cfg = laya::engine::remote::RemoteConfig::new(url.clone());
        cfg.model = self.remote_model.clone();
        cfg.api_key = std::env::var(&self.remote_api_key_env)
            .ok()
            .filter(|k| !k.is_empty());
        cfg.timeout = std::time::Duration::from_secs(self.remote_timeout);
        cfg.extra_body = self.remote_extra.clone().unwrap_or_default();
        Some(cfg)
    }
}

/// A catalog name, GGUF file or model folder → its path, or the command that fixes it.
fn resolve_model(name: &str) -> Result<PathBuf> {
    if let Some(m) = catalog::find(name) {
        if !m.is_present() {
            bail!(
                "model {} is not downloaded: run `laya models fetch {}`",
                m.name,
                m.name
            );
        }
        return Ok(m.local_path());
    }
    let p = PathBuf::from(name);
    if !p.exists() {
        bail!("`{name}` is neither a known model (`laya models list`) nor an existing file or folder");
    }
    Ok(p)
}

/// The models `laya serve` holds and its own parameters. `laya lsp` takes the same flags and
/// starts the daemon with them when none is running.
#[derive(clap::Args, Clone, Debug)]
struct ServeArgs {
    /// Small (fast) tier: a catalog name, a GGUF file or a safetensors folder.
    #[arg(long, alias = "model", default_value = catalog::DEFAULT_MODEL)]
    small: String,
    /// Large tier: a catalog name, file or folder; `auto`: qwen2.5-coder-1.5b when it is
    /// downloaded; `none`: no large tier (requests for it go to the small one).
    #[arg(long, default_value = "auto")]
    large: String,
    /// Serve the small tier from an OpenAI-compatible server instead (base URL, e.g.
    /// http://127.0.0.1:8080/v1).
    #[arg(long, value_name = "URL")]
    small_remote: Option<String>,
    /// Serve the large tier from an OpenAI-compatible server instead.
    #[arg(long, value_name = "URL")]
    large_remote: Option<String>,
    /// Bit width of the default model (the small tier), and of requests naming only a tier.
    #[arg(long, value_enum, default_value = "q8")]
    precision: Precision,
    /// Quantization group size.
    #[arg(long, default_value_t = 64)]
    group_size: i32,
    /// Do not read or write the converted-weights cache.
    #[arg(long)]
    no_cache: bool,
    /// Also load these at start: TIER/BITS keys (small/q4, large/q6, …).
    #[arg(long, value_name = "KEY", num_args = 1.., value_delimiter = ',')]
    preload: Vec<String>,
    /// HTTP address (loopback unless you mean otherwise; port 0 picks a free one, written to
    /// the runtime directory's http.addr).
    #[arg(long, default_value = "127.0.0.1:7723")]
    http_addr: std::net::SocketAddr,
    /// No HTTP, the unix socket only.
    #[arg(long)]
    no_http: bool,
    /// Environment variable holding a bearer token that HTTP requests must carry.
    #[arg(long, value_name = "VAR")]
    token_env: Option<String>,
    /// Serve HTTP on a non-loopback --http-addr without a token (refused otherwise: anyone
    /// who can reach the address could use the daemon).
    #[arg(long)]
    allow_unauthenticated_remote: bool,
    /// Most tokens of prompt plus completion per request.
    #[arg(long, default_value_t = 8192)]
    max_seq_len: usize,
    /// Most tokens a request may generate (requests giving none get 64, or this if lower).
    #[arg(long, default_value_t = 512)]
    max_tokens: usize,
    /// Sampling temperature for HTTP requests that give none (0: greedy).
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Nucleus sampling for HTTP requests that give none.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Prompts (with their KV caches) kept per model for prefix reuse; 0 turns reuse off.
    #[arg(long, default_value_t = 8)]
    prefill_cache_size: usize,
    /// Most bytes of KV caches kept per model for prefix reuse.
    #[arg(long, default_value_t = 1 << 30)]
    prefill_cache_bytes: usize,
    /// Largest HTTP request body, bytes.
    #[arg(long, default_value_t = 1 << 20)]
    max_body_bytes: usize,
    /// Load and warm the default model at start (false: on the first request).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    warmup: bool,
    /// Requests sent at once to a remote tier's server (a local model runs one at a time).
    #[arg(long, default_value_t = 4)]
    remote_parallel: usize,
    /// Server-specific fields for every request to a remote tier, as a JSON object (e.g.
    /// '{"repeat_penalty": 1.0}' for llama-cpp-python's server).
    #[arg(long, value_name = "JSON", value_parser = remote_extra)]
    remote_extra: Option<serde_json::Map<String, serde_json::Value>>,
}

impl ServeArgs {
    /// A model flag's value as the daemon should see it: files as absolute paths.
    fn model_value(name: &str) -> String {
        if catalog::find(name).is_none() && !matches!(name, "auto" | "none") {
            if let Ok(p) = std::fs::canonicalize(name) {
                return p.to_string_lossy().into_owned();
            }
        }
        name.to_owned()
    }

    /// The flags that choose models (for `laya serve` and `laya lsp` alike).
    fn model_args(&self) -> Vec<String> {
        let mut a = vec![
            "--small".to_owned(),
            Self::model_value(&self.small),
            "--large".into(),
            Self::model_value(&self.large),
            "--precision".into(),
            self.precision.label().into(),
            "--group-size".into(),
            self.group_size.to_string(),
            "--prefill-cache-size".into(),
            self.prefill_cache_size.to_string(),
            "--prefill-cache-bytes".into(),
            self.prefill_cache_bytes.to_string(),
        ];
        for (flag, v) in [
            ("--small-remote", &self.small_remote),
            ("--large-remote", &self.large_remote),
        ] {
            if let Some(v) = v {
                a.extend([flag.to_owned(), v.clone()]);
            }
        }
        if let Some(extra) = &self.remote_extra {
            a.extend([
                "--remote-extra".to_owned(),
                serde_json::Value::Object(extra.clone()).to_string(),
            ]);
        }
        if self.no_cache {
            a.push("--no-cache".into());
        }
        for k in &self.preload {
            a.extend(["--preload".to_owned(), k.clone()]);
        }
        a
    }

    /// `serve` and every flag, to start the same daemon elsewhere (from `laya lsp`, or as a
    /// service).
    fn to_args(&self, device: DevicePref) -> Vec<String> {
        let mut a = vec!["serve".to_owned()];
        if device != DevicePref::Auto {
            a.extend(["--device".to_owned(), device.label().into()]);
        }
        a.extend(self.model_args());
        if self.no_http {
            a.push("--no-http".into());
        } else {
            a.extend(["--http-addr".to_owned(), self.http_addr.to_string()]);
        }
        if let Some(v) = &self.token_env {
            a.extend(["--token-env".to_owned(), v.clone()]);
        }
        if self.allow_unauthenticated_remote {
            a.push("--allow-unauthenticated-remote".into());
        }
        a.extend([
            "--max-seq-len".to_owned(),
            self.max_seq_len.to_string(),
            "--max-tokens".into(),
            self.max_tokens.to_string(),
            "--temperature".into(),
            self.temperature.to_string(),
            "--top-p".into(),
            self.top_p.to_string(),
            "--max-body-bytes".into(),
            self.max_body_bytes.to_string(),
            "--warmup".into(),
            self.warmup.to_string(),
            "--remote-parallel".into(),
            self.remote_parallel.to_string(),
        ]);
        a
    }

    fn remote(&self, url: &str) -> laya::engine::remote::RemoteConfig {
        let mut cfg = laya::engine::remote::RemoteConfig::new(url);
        cfg.api_key = std::env::var("LAYA_REMOTE_API_KEY")
            .ok()
            .filter(|k| !k.is_empty());
        cfg.extra_body = self.remote_extra.clone().unwrap_or_default();
        cfg
    }

    /// The tiers, each with the name clients see.
    fn pool(&self, device: DevicePref) -> Result<(laya::engine::pool::PoolConfig, HashMap<Tier, String>)> {
        use laya::engine::pool::{PoolConfig, TierSource};
        let mut tiers = HashMap::new();
        let mut names = HashMap::new();
        let name_of = |spec: &str, path: &std::path::Path| match catalog::find(spec) {
            Some(m) => m.name.to_owned(),
            None => path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| spec.to_owned()),
        };
        match &self.small_remote {
            Some(url) => {
                tiers.insert(Tier::Small, TierSource::Remote(self.remote(url)));
                names.insert(Tier::Small, url.clone());
            }
            None => {
                let path = resolve_model(&self.small)?;
                names.insert(Tier::Small, name_of(&self.small, &path));
                tiers.insert(
                    Tier::Small,
                    TierSource::Local {
                        path,
                        group_size: self.group_size,
                    },
                );
            }
        }
        let large = match (&self.large_remote, self.large.as_str()) {
            (Some(url), _) => {
                tiers.insert(Tier::Large, TierSource::Remote(self.remote(url)));
                names.insert(Tier::Large, url.clone());
                None
            }
            (None, "none") => None,
            (None, "auto") => catalog::find("qwen2.5-coder-1.5b")
                .filter(|m| m.is_present())
                .map(|m| (m.name.to_owned(), m.local_path())),
            (None, spec) => Some((spec.to_owned(), resolve_model(spec)?)),
        };
        if let Some((spec, path)) = large {
            names.insert(Tier::Large, name_of(&spec, &path));
            tiers.insert(
                Tier::Large,
                TierSource::Local {
                    path,
                    group_size: self.group_size,
                },
            );
        }
        let mut preload = vec![];
        for k in &self.preload {
            let parsed = k.split_once('/').and_then(|(t, b)| {
                let tier = match t {
                    "small" => Tier::Small,
                    "large" => Tier::Large,
                    _ => return None,
                };
                laya::daemon::server::parse_precision(b).map(|precision| ModelKey { tier, precision })
            });
            match parsed {
                Some(key) if tiers.contains_key(&key.tier) => preload.push(key),
                Some(key) => bail!("--preload {k}: no {} model is configured", key.tier.label()),
                None => bail!("--preload {k}: expected TIER/BITS such as small/q4 or large/q6"),
            }
        }
        Ok((
            PoolConfig {
                tiers,
                default: ModelKey {
                    tier: Tier::Small,
                    precision: self.precision,
                },
                preload,
                device,
                prefix: laya::engine::prefix::PrefixLimits {
                    max_entries: self.prefill_cache_size,
                    max_bytes: self.prefill_cache_bytes,
                },
            },
            names,
        ))
    }

    fn daemon_config(&self, device: DevicePref) -> Result<laya::daemon::DaemonConfig> {
        let (pool, names) = self.pool(device)?;
        let token = match &self.token_env {
            Some(var) => match std::env::var(var) {
                Ok(t) if !t.trim().is_empty() => Some(t.trim().to_owned()),
                _ => bail!("--token-env {var}: the variable is not set (or empty)"),
            },
            None => None,
        };
        if !self.no_http
            && !self.http_addr.ip().is_loopback()
            && token.is_none()
            && !self.allow_unauthenticated_remote
        {
            bail!(
                "--http-addr {} is not a loopback address: anyone who can reach it could use this daemon. \
                 Set a bearer token with --token-env VAR, or pass --allow-unauthenticated-remote if that is meant",
                self.http_addr
            );
        }
        if self.max_tokens == 0 || self.max_seq_len <= self.max_tokens {
            bail!(
                "--max-tokens must be at least 1 and below --max-seq-len ({} vs {})",
                self.max_tokens,
                self.max_seq_len
            );
        }
        Ok(laya::daemon::DaemonConfig {
            pool,
            names,
            runtime_dir: laya::daemon::paths::runtime_dir(),
            http: (!self.no_http).then_some(self.http_addr),
            token,
            limits: laya::daemon::Limits {
                max_tokens: self.max_tokens,
                max_seq_len: self.max_seq_len,
                max_body_bytes: self.max_body_bytes,
                ..Default::default()
            },
            defaults: laya::daemon::Defaults {
                max_tokens: 64.min(self.max_tokens),
                temperature: self.temperature,
                top_p: self.top_p,
            },
            warmup: self.warmup,
            remote_slots: self.remote_parallel.max(1),
        })
    }
}

#[derive(Subcommand)]
enum ServiceCommand {
    /// Write the service file (ExecStart: this binary, `serve` and the flags given here), then
    /// enable and start it.
    Install {
        #[command(flatten)]
        serve: Box<ServeArgs>,
        /// Only write the file.
        #[arg(long)]
        no_start: bool,
        /// Service manager (default: this system's).
        #[arg(long, value_enum)]
        platform: Option<laya::service::Platform>,
    },
    /// Stop and disable the service and remove its file.
    Uninstall {
        /// Only remove the file.
        #[arg(long)]
        no_stop: bool,
        #[arg(long, value_enum)]
        platform: Option<laya::service::Platform>,
    },
}

impl ModelArgs {
    fn path(&self) -> Result<PathBuf> {
        resolve_model(&self.model)
    }

    fn options(&self) -> LoadOptions {
        LoadOptions {
            precision: self.precision,
            group_size: self.group_size,
            use_cache: !self.no_cache,
            progress: std::io::stderr().is_terminal(),
            ..Default::default()
        }
    }
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Load time, prefill tok/s, decode ms/token and share of the memory-bandwidth floor.
    Engine {
        /// Models to load (catalog names, GGUF files or folders); default: the two CPU tiers.
        #[arg(long = "model")]
        models: Vec<String>,
        /// Random weights of a real shape instead (qwen2.5-coder-3b, qwen3-4b, qwen2.5-coder-32b, …).
        #[arg(long = "synthetic")]
        synthetic: Vec<String>,
        #[arg(long, value_enum, value_delimiter = ',', default_value = "q8")]
        precision: Vec<Precision>,
        #[arg(long, default_value_t = 64)]
        group_size: i32,
        /// Prompt lengths to time prefill at.
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
        #[arg(long, value_enum, default_value = "native")]
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
    /// Per-keystroke latency of typing a line through the LSP path: p50/p90/p99, model calls
    /// avoided, prompt tokens reused.
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
        /// e.g. '{"budget":{"suffixShare":0.02}}'.
        #[arg(long, value_name = "JSON")]
        settings: Option<String>,
    },
}

#[derive(Subcommand)]
enum ModelsCommand {
    /// Download models into the model directory (default: the two CPU tiers).
    Fetch {
        /// Model names from `laya models list`.
        names: Vec<String>,
        /// Where to download from.
        #[arg(long, value_enum, default_value = "auto")]
        source: Source,
    },
    /// List known models and whether each is present.
    List,
}

fn main() -> ExitCode {
    laya::engine::runtime::apply_mlx_env_defaults();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LAYA_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let code = match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    };
    #[cfg(target_os = "linux")]
    if laya::engine::runtime::gpu_in_use() {
        skip_teardown(&code);
    }
    code
}

/// The status `exit_code` last made, for [`skip_teardown`] (`ExitCode` cannot be read back).
static EXIT_STATUS: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(1);

/// `ExitCode::from(n)`, remembered.
fn exit_code(n: u8) -> ExitCode {
    EXIT_STATUS.store(n, std::sync::atomic::Ordering::Relaxed);
    ExitCode::from(n)
}

/// Leave without the process's teardown. MLX's CUDA backend can abort in its static
/// destructors once the CUDA runtime has shut down ("terminate called after throwing …
/// std::runtime_error", or a segfault), after all of the command's output, turning a finished
/// run into a failing exit status. Everything of ours is dropped and written by now; flush the
/// standard streams and leave with the status `main` returns.
#[cfg(target_os = "linux")]
fn skip_teardown(code: &ExitCode) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    let status = if *code == ExitCode::SUCCESS {
        0
    } else if *code == ExitCode::FAILURE {
        1
    } else {
        EXIT_STATUS.load(std::sync::atomic::Ordering::Relaxed) as i32
    };
    // SAFETY: `_exit` ends the process at once; nothing after it runs.
    unsafe { libc::_exit(status) }
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Doctor => {
            let report = doctor::report(cli.device);
            print!("{}", report.text);
            Ok(if report.problems == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Lsp {
            serve,
            remote,
            in_process,
        } => {
            let code = exit_code(lsp(serve, remote, in_process, cli.device)?);
            // Leave at once: a model still loading on its own thread, the blocking read of
            // stdin or a daemon connection must not keep `laya lsp` alive after `exit` or
            // the end of its input (nor its teardown: see `skip_teardown`).
            #[cfg(target_os = "linux")]
            skip_teardown(&code);
            #[cfg(not(target_os = "linux"))]
            Ok(code)
        }
        Command::Serve { serve } => {
            let config = serve.daemon_config(cli.device)?;
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            match rt.block_on(laya::daemon::run(config)) {
                Ok(()) => Ok(ExitCode::SUCCESS),
                Err(e) => {
                    eprintln!("error: {e}");
                    Ok(exit_code(e.exit_code()))
                }
            }
        }
        Command::Service { command } => service(command, cli.device),
        Command::Bench {
            command:
                BenchCommand::Memory {
                    serve,
                    clients,
                    requests,
                    no_in_process,
                },
        } => {
            bench_memory(&serve, clients, requests, !no_in_process)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench {
            command:
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
                },
        } => {
            let model_source = match model {
                Some(m) => SoakModel::Named(m),
                None => SoakModel::Tiny,
            };
            bench_soak(SoakArgs {
                clients,
                lsp_fraction,
                duration,
                max_tokens,
                model: model_source,
                precision,
                prefill_cache_size,
                prefill_cache_bytes,
                json,
                device: cli.device,
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Complete {
            location,
            model,
            max_tokens,
            temperature,
        } => {
            complete(&location, &model, max_tokens, temperature, cli.device)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench {
            command:
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
                },
        } => {
            let peer = peer_python.map(|p| (p, peer_threads));
            bench_engine(
                models, synthetic, precision, group_size, prefill, decode, bandwidth, json, peer, cli.device,
            )?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench {
            command:
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
                },
        } => {
            bench_typing(
                &files,
                &cases,
                per_language,
                &model,
                &remote,
                max_tokens,
                budget,
                no_reuse,
                steps_out,
                settings.as_deref(),
                json,
                cli.device,
            )?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench {
            command:
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
                },
        } => {
            bench_quality(
                &cases,
                &model,
                &remote,
                &languages,
                limit,
                max_tokens,
                out,
                compare,
                settings.as_deref(),
                cli.device,
            )?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Models {
            command: ModelsCommand::List,
        } => {
            println!("model dir: {}", laya::paths::model_dir().display());
            for m in catalog::MODELS {
                let state = if m.is_present() { "present" } else { "missing" };
                println!("  {:<20} {:<8} {}", m.name, state, m.description);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Models {
            command: ModelsCommand::Fetch { names, source },
        } => {
            let names: Vec<String> = if names.is_empty() {
                catalog::DEFAULT_FETCH.iter().map(|s| s.to_string()).collect()
            } else {
                names
            };
            for name in &names {
                let Some(model) = catalog::find(name) else {
                    let known: Vec<_> = catalog::MODELS.iter().map(|m| m.name).collect();
                    bail!("unknown model `{name}`; known: {}", known.join(", "));
                };
                match fetch::fetch(model, source).with_context(|| format!("fetching {name}"))? {
                    Fetched::AlreadyPresent(p) => {
                        println!("{name}: already present and verified ({})", p.display())
                    }
                    Fetched::Downloaded { path, source } => {
                        println!("{name}: fetched from {source} → {}", path.display())
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `FILE:LINE:COL` → (file, position). The file name itself may contain colons.
fn parse_location(location: &str) -> Result<(PathBuf, LineCol)> {
    let mut parts = location.rsplitn(3, ':');
    let (col, line, file) = (parts.next(), parts.next(), parts.next());
    match (
        file,
        line.and_then(|l| l.parse().ok()),
        col.and_then(|c| c.parse().ok()),
    ) {
        (Some(file), Some(line), Some(col)) if !file.is_empty() => {
            Ok((PathBuf::from(file), LineCol { line, col }))
        }
        _ => bail!("expected FILE:LINE:COL (1-based), got `{location}`"),
    }
}

fn complete(
    location: &str,
    args: &ModelArgs,
    max_tokens: usize,
    temperature: f32,
    device: DevicePref,
) -> Result<()> {
    let (file, pos) = parse_location(location)?;
    let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    let offset = prompt::byte_offset(&text, pos).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    let (prefix, suffix) = text.split_at(offset);
    let device = use_device(device).map_err(anyhow::Error::msg)?;
    let path = args.path()?;
    let model = LocalModel::load(&path, &args.options())?;
    let loaded = &model.loaded;
    let req = CompletionRequest {
        model: None,
        prompt: prompt::fim(prefix, suffix),
        max_tokens,
        n: 1,
        sampling: SamplingParams {
            temperature,
            ..SamplingParams::default()
        },
        stop: vec![],
        branch_first: false,
        start: String::new(),
    };
    let out = model.complete(&req, &AtomicBool::new(false))?;
    match postprocess::process(
        &out.choices[0].text,
        &postprocess::Surroundings::at(&text, offset),
    ) {
        Some(edit) => println!("{}", edit.text),
        None => eprintln!("(no completion: the model's answer was empty after post-processing)"),
    }
    let t = &out.timing;
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let per_token = if t.generated_tokens > 1 {
        ms(t.decode) / (t.generated_tokens - 1) as f64
    } else {
        0.0
    };
    eprintln!(
        "[{} {} on {device}] load {:.2} s{} | prefill {} tokens {:.0} ms | decode {} tokens {:.0} ms ({per_token:.1} ms/token) | finish {:?}",
        path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        loaded.precision.label(),
        loaded.load_time.as_secs_f64(),
        if loaded.from_cache { " (converted cache)" } else { "" },
        t.prefilled_tokens,
        ms(t.prefill),
        t.generated_tokens,
        ms(t.decode),
        out.choices[0].finish_reason,
    );
    Ok(())
}

/// A bench's completion settings: `base` (the LSP's `completion` section, over the defaults)
/// with `--settings` (a JSON object) written over it.
fn completion_settings(
    mut base: serde_json::Value,
    overrides: Option<&str>,
) -> Result<laya::completion::pipeline::CompletionSettings> {
    if let Some(text) = overrides {
        let patch = match serde_json::from_str(text) {
            Ok(v @ serde_json::Value::Object(_)) => v,
            Ok(_) => bail!("--settings wants a JSON object, got `{text}`"),
            Err(e) => bail!("--settings is not JSON ({e}): `{text}`"),
        };
        merge_json(&mut base, patch);
    }
    serde_json::from_value(base).context("--settings")
}

/// Writes `patch` over `base`: objects key by key, anything else replaced.
fn merge_json(base: &mut serde_json::Value, patch: serde_json::Value) {
    match (base, patch) {
        (serde_json::Value::Object(b), serde_json::Value::Object(p)) => {
            for (k, v) in p {
                merge_json(b.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (b, p) => *b = p,
    }
}

/// The engine a bench runs on: the remote server when `--remote-url` is given, else the local
/// model on its worker thread (load time reported on stderr); with its label for the tables.
fn bench_target(
    args: &ModelArgs,
    opts: LoadOptions,
    remote: &RemoteArgs,
    device: DevicePref,
) -> Result<(Arc<dyn laya::engine::worker::Engine>, String)> {
    use laya::engine::{
        remote::RemoteEngine,
        worker::{ModelState, ModelWorker},
    };
    Ok(match remote.config() {
        Some(cfg) => {
            let label = format!("remote {}", cfg.url);
            (Arc::new(RemoteEngine::new(cfg)), label)
        }
        None => {
            let label = format!("{} {}", args.model, args.precision.label());
            let worker = ModelWorker::spawn(args.path()?, opts, device, |s| {
                if let ModelState::Ready { load_time, device } = s {
                    eprintln!("loaded in {:.1} s on {device}", load_time.as_secs_f64());
                }
            });
            (Arc::new(worker), label)
        }
    })
}

#[allow(clippy::too_many_arguments)]
fn bench_typing(
    files: &[String],
    cases: &std::path::Path,
    per_language: usize,
    args: &ModelArgs,
    remote: &RemoteArgs,
    max_tokens: usize,
    budget: usize,
    no_reuse: bool,
    steps_out: Option<PathBuf>,
    overrides: Option<&str>,
    json_out: Option<PathBuf>,
    device: DevicePref,
) -> Result<()> {
    use laya::{
        bench::{quality, typing as t},
        engine::{prefix::PrefixLimits, worker::ModelState},
    };
    let mut traces = vec![];
    for f in files {
        let mut parts = f.rsplitn(3, ':');
        let (lang, line, path) = (
            parts.next(),
            parts.next().and_then(|l| l.parse().ok()),
            parts.next(),
        );
        let (Some(lang), Some(line), Some(path)) = (lang, line, path) else {
            bail!("--file wants FILE:LINE:LANGUAGE, got `{f}`");
        };
        traces.push(t::trace_from_file(std::path::Path::new(path), line, lang).map_err(anyhow::Error::msg)?);
    }
    if traces.is_empty() {
        let mut seen = std::collections::HashMap::<String, usize>::new();
        for c in quality::load_cases(cases)? {
            let n = seen.entry(c.language.clone()).or_default();
            *n += 1;
            if *n <= per_language {
                traces.push(c);
            }
        }
    }
    if let Some(p) = &steps_out {
        let steps: Vec<_> = traces
            .iter()
            .map(|c| serde_json::json!({ "id": c.id, "steps": t::steps(c) }))
            .collect();
        std::fs::write(p, serde_json::to_string(&steps)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    let mut opts = args.options();
    if no_reuse {
        opts.prefix = PrefixLimits {
            max_entries: 0,
            max_bytes: 0,
        };
    }
    let (engine, label) = bench_target(args, opts, remote, device)?;
    let completion = serde_json::json!({
        "debounceMs": 0,
        "maxTokensLine": max_tokens,
        "maxTokensBlock": max_tokens,
        "budget": { "maxTokens": budget },
        "typingThrough": !no_reuse,
        "anchorMaxBytes": if no_reuse { 0 } else { 512 },
    });
    let completion = serde_json::to_value(completion_settings(completion, overrides)?)?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let start = std::time::Instant::now();
    rt.block_on(t::replay(engine.clone(), &t::warm_up_trace(), completion.clone()))
        .map_err(anyhow::Error::msg)?;
    eprintln!("warm-up trace (untimed): {:.1} s", start.elapsed().as_secs_f64());
    let mut runs = vec![];
    for c in &traces {
        eprintln!(
            "trace {} ({} keystrokes) on {label}",
            c.id,
            c.expected.chars().count()
        );
        let keys = rt
            .block_on(t::replay(engine.clone(), c, completion.clone()))
            .map_err(anyhow::Error::msg)?;
        for k in &keys {
            eprintln!(
                "  {:>3} {:>9.1} ms {:<13} prompt {:>5} reused {:>5} prefilled {:>4} first token {:>7.1} ms",
                k.typed,
                k.ms,
                k.source,
                k.prompt_tokens,
                k.reused_tokens,
                k.prefilled_tokens,
                k.first_token_ms
            );
        }
        runs.push(keys);
    }
    if let ModelState::Failed(e) = engine.state() {
        bail!("the model failed to load: {e}");
    }
    let s = t::summarize(&runs);
    println!(
        "{label}{}: {} keystrokes in {} traces; latency p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms",
        if no_reuse { " (no reuse)" } else { "" },
        s.keystrokes,
        runs.len(),
        s.p50_ms,
        s.p90_ms,
        s.p99_ms
    );
    println!(
        "model calls {} ({} avoided by typing through, {:.0} %); prompt tokens reused {:.1} %",
        s.model_calls,
        s.typed_through,
        100.0 * s.typed_through as f64 / s.keystrokes.max(1) as f64,
        100.0 * s.reused_ratio
    );
    println!(
        "cold call: {:.0} prompt tokens, {:.1} ms; warm calls: {:.1} tokens prefilled ({:.2} % of cold), {:.1} ms ({:.1} % of cold)",
        s.cold_prompt_tokens,
        s.cold_ms,
        s.warm_prefill_tokens,
        100.0 * s.warm_prefill_tokens / s.cold_prompt_tokens.max(1.0),
        s.warm_ms,
        100.0 * s.warm_ms / s.cold_ms.max(1e-9)
    );
    println!(
        "prompt cost (time to first token): cold {:.1} ms, warm {:.1} ms ({:.1} % of cold)",
        s.cold_first_token_ms,
        s.warm_first_token_ms,
        100.0 * s.warm_first_token_ms / s.cold_first_token_ms.max(1e-9)
    );
    println!(
        "suggestion shown at {} of {} keystrokes; it made the expected line at {} ({:.1} %)",
        s.shown,
        s.keystrokes,
        s.exact,
        100.0 * s.exact as f64 / s.keystrokes.max(1) as f64
    );
    if let Some(p) = json_out {
        let v = serde_json::json!({ "engine": label, "summary": s, "traces": traces.iter().map(|c| &c.id).collect::<Vec<_>>(), "keystrokes": runs });
        std::fs::write(&p, serde_json::to_string_pretty(&v)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn bench_quality(
    cases: &std::path::Path,
    args: &ModelArgs,
    remote: &RemoteArgs,
    languages: &[String],
    limit: Option<usize>,
    max_tokens: usize,
    out: Option<PathBuf>,
    compare: Option<PathBuf>,
    overrides: Option<&str>,
    device: DevicePref,
) -> Result<()> {
    use laya::{bench::quality as q, engine::worker::ModelState};
    let mut all = q::load_cases(cases)?;
    if !languages.is_empty() {
        all.retain(|c| languages.contains(&c.language));
    }
    if let Some(limit) = limit {
        let mut seen = std::collections::HashMap::<String, usize>::new();
        all.retain(|c| {
            let n = seen.entry(c.language.clone()).or_default();
            *n += 1;
            *n <= limit
        });
    }
    if all.is_empty() {
        bail!("{}: no cases left to run", cases.display());
    }
    let peer = compare.as_deref().map(q::load_results).transpose()?;
    let (engine, label) = bench_target(args, args.options(), remote, device)?;
    let settings = completion_settings(
        serde_json::json!({ "maxTokensLine": max_tokens, "maxTokensBlock": max_tokens }),
        overrides,
    )?;
    eprintln!("{} cases from {} on {label}", all.len(), cases.display());
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let total = all.len();
    let results = rt.block_on(q::run(engine.clone(), &all, &settings, |i, case, r| {
        let (exact, _) = q::score(&r.output, &case.expected);
        let verdict = match (&r.error, exact) {
            (Some(e), _) => format!("failed: {e}"),
            (None, true) => "exact".into(),
            (None, false) => "miss".into(),
        };
        eprintln!("[{}/{total}] {} {verdict} {:.0} ms", i + 1, case.id, r.ms);
    }));
    if let ModelState::Failed(e) = engine.state() {
        bail!("the model failed to load: {e}");
    }
    let failed = results.iter().filter(|r| r.error.is_some()).count();
    if failed > 0 {
        eprintln!("warning: {failed} of {total} completions failed (scored as misses; `error` in --out)");
    }
    let ours = q::Results {
        engine: "laya".into(),
        model: label,
        settings: Some(serde_json::to_value(&settings)?),
        results,
    };
    if let Some(out) = out {
        std::fs::write(&out, serde_json::to_string_pretty(&ours)?)
            .with_context(|| format!("writing {}", out.display()))?;
    }
    if let Some(p) = &peer {
        println!("laya: {} · {}: {}", ours.model, p.engine, p.model);
    }
    print!("{}", q::table(&all, &ours, peer.as_ref()));
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn bench_engine(
    models: Vec<String>,
    synthetic: Vec<String>,
    precisions: Vec<Precision>,
    group_size: i32,
    prefill: Vec<usize>,
    decode: usize,
    bandwidth: Option<f64>,
    json: Option<PathBuf>,
    peer: Option<(PathBuf, usize)>,
    device: DevicePref,
) -> Result<()> {
    use laya::bench::engine::{self as be, Source, Target};
    let device = use_device(device).map_err(anyhow::Error::msg)?;
    let on_gpu = device.starts_with("gpu");
    let mut targets = vec![];
    let models = if models.is_empty() && synthetic.is_empty() {
        catalog::DEFAULT_FETCH.iter().map(|s| s.to_string()).collect()
    } else {
        models
    };
    for m in models {
        let args = ModelArgs {
            model: m.clone(),
            precision: Precision::Q8,
            group_size,
            no_cache: false,
        };
        targets.push(Target {
            label: m,
            source: Source::File(args.path()?),
        });
    }
    for s in synthetic {
        if laya::engine::synthetic::shape(&s).is_none() {
            bail!(
                "unknown shape `{s}`; known: {}",
                laya::engine::synthetic::SHAPES.join(", ")
            );
        }
        targets.push(Target {
            label: s.clone(),
            source: Source::Synthetic(s),
        });
    }
    let settings = be::Settings {
        precisions,
        group_size,
        prefill_lengths: prefill,
        decode_tokens: decode,
        bandwidth_gbs: bandwidth.or(on_gpu.then_some(4800.0)),
        synthetic_dtype: if on_gpu {
            mlx_rs::Dtype::Bfloat16
        } else {
            mlx_rs::Dtype::Float32
        },
        device: device.clone(),
    };
    let mut out = match &json {
        Some(p) => Some(std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?),
        None => None,
    };
    // One bandwidth for every row (laya's and the peer's), so floors compare.
    let bandwidth = settings.bandwidth_gbs.unwrap_or_else(be::host_copy_bandwidth_gbs);
    let settings = be::Settings {
        bandwidth_gbs: Some(bandwidth),
        ..settings
    };
    let mut emit = |row: &be::Row| {
        println!("{}", be::format_row(row));
        if let Some(f) = out.as_mut() {
            use std::io::Write;
            let _ = writeln!(f, "{}", serde_json::to_string(row).unwrap_or_default());
        }
    };
    let (width, chain) = (2048, 1000);
    println!(
        "one small op on {device}: {:.2} us (a chain of {chain} dependent adds on [1, {width}] {:?}, one eval)",
        be::op_cost_us(width, chain, settings.synthetic_dtype)?,
        settings.synthetic_dtype
    );
    println!("{}", be::header());
    let rows = be::run(&targets, &settings, &mut emit)?;
    if let Some((python, threads)) = peer {
        for t in &targets {
            let be::Source::File(path) = &t.source else {
                continue;
            };
            if !path.is_file() {
                continue; // llama.cpp reads GGUF files only
            }
            let peer = be::peer_llama_cpp(&python, path, &t.label, &settings, bandwidth, threads)?;
            emit(&peer);
            for r in rows.iter().filter(|r| r.model == t.label) {
                println!(
                    "  {} {} vs llama.cpp: decode {:.2}x the time, prefill {}",
                    r.model,
                    r.precision,
                    r.decode_ms_per_token / peer.decode_ms_per_token,
                    r.prefill_tok_s
                        .iter()
                        .zip(&peer.prefill_tok_s)
                        .map(|((n, a), (_, b))| format!("{n}: {:.2}x the speed", a / b))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
        }
    }
    Ok(())
}

/// `laya lsp`; returns LSP's exit status (0 after `shutdown`, else 1).
fn lsp(serve: ServeArgs, remote: RemoteArgs, in_process: bool, device: DevicePref) -> Result<u8> {
    use laya::{
        daemon::{ClientConfig, DaemonEngine, SpawnCommand},
        engine::{
            pool::ModelPool,
            remote::RemoteEngine,
            worker::{Engine, ModelState},
        },
        lsp::{serve_stdio, EngineSource},
    };
    // Resolve the models before the editor connects, so a missing one is a clear error in the
    // editor's log right away (here, not in the daemon's). The server still runs: the editor
    // keeps working, without completions, and shows why.
    let remote = remote.config();
    let pool = match remote {
        Some(_) => None,
        None => Some(serve.pool(device).map_err(|e| format!("{e:#}"))),
    };
    let source = match (remote, pool) {
        (Some(cfg), _) => EngineSource::Ready(Arc::new(RemoteEngine::new(cfg)) as Arc<dyn Engine>),
        (None, Some(Err(why))) => {
            eprintln!("laya lsp: {why}; serving without completions");
            EngineSource::Deferred(Box::new(move |report| {
                report(&ModelState::Failed(why.clone()));
                Arc::new(Unavailable(why)) as Arc<dyn Engine>
            }))
        }
        (None, Some(Ok((pool, _)))) if in_process => {
            let default = pool.default;
            EngineSource::Deferred(Box::new(move |report| {
                let report = std::sync::Mutex::new(report);
                let on_state = Arc::new(move |key: ModelKey, s: &ModelState| {
                    if key.tier == default.tier {
                        (report.lock().unwrap_or_else(|p| p.into_inner()))(s);
                    }
                });
                match ModelPool::new(pool, on_state.clone()) {
                    Ok(p) => Arc::new(p) as Arc<dyn Engine>,
                    Err(e) => {
                        on_state(default, &ModelState::Failed(e.to_string()));
                        Arc::new(Unavailable(e.to_string())) as Arc<dyn Engine>
                    }
                }
            }))
        }
        (None, _) => {
            let program = std::env::current_exe().context("finding this program's path")?;
            let config = ClientConfig {
                runtime_dir: laya::daemon::paths::runtime_dir(),
                spawn: Some(SpawnCommand {
                    program,
                    args: serve.to_args(device),
                }),
                client: format!("lsp {}", std::process::id()),
                start_timeout: std::time::Duration::from_secs(20),
            };
            EngineSource::Deferred(Box::new(move |report| {
                Arc::new(DaemonEngine::new(config, report)) as Arc<dyn Engine>
            }))
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let ending = rt.block_on(serve_stdio(source));
    // Tokio's stdin is a blocking read on a thread of its own that nothing can cancel: do not
    // wait for it (or for anything else still running) to shut the runtime down.
    rt.shutdown_background();
    Ok(ending.exit_code())
}

/// An engine that only says why there is none.
struct Unavailable(String);

#[async_trait::async_trait]
impl laya::engine::worker::Engine for Unavailable {
    async fn complete(
        &self,
        _: CompletionRequest,
        _: Arc<AtomicBool>,
    ) -> Result<laya::engine::CompletionOutput, laya::engine::EngineError> {
        Err(laya::engine::EngineError::Request(self.0.clone()))
    }

    fn state(&self) -> laya::engine::worker::ModelState {
        laya::engine::worker::ModelState::Failed(self.0.clone())
    }
}

fn service(command: ServiceCommand, device: DevicePref) -> Result<ExitCode> {
    use laya::service::{self as svc, Platform, ServiceSpec};
    match command {
        ServiceCommand::Install {
            serve,
            no_start,
            platform,
        } => {
            let platform = platform.unwrap_or_else(Platform::native);
            // The flags must make a daemon that starts: check them here, not at login.
            serve.daemon_config(device)?;
            let program = std::env::current_exe()
                .and_then(std::fs::canonicalize)
                .context("finding this program's path")?;
            let env = ["LAYA_MODEL_DIR", "LAYA_CACHE_DIR", "LAYA_RUNTIME_DIR", "LAYA_LOG"]
                .iter()
                .filter_map(|k| {
                    std::env::var(k)
                        .ok()
                        .filter(|v| !v.is_empty())
                        .map(|v| (k.to_string(), v))
                })
                .collect();
            let spec = ServiceSpec {
                program,
                args: serve.to_args(device),
                env,
            };
            let (path, ran) = svc::install(platform, &spec, !no_start)?;
            println!("wrote {}", path.display());
            for r in ran {
                println!("ran `{r}`");
            }
            if let Some(var) = &serve.token_env {
                println!("note: the service needs {var} in its environment for its HTTP token");
            }
            Ok(ExitCode::SUCCESS)
        }
        ServiceCommand::Uninstall { no_stop, platform } => {
            let platform = platform.unwrap_or_else(Platform::native);
            match svc::uninstall(platform, !no_stop)? {
                Some(p) => println!("removed {}", p.display()),
                None => println!(
                    "no laya service installed ({} does not exist)",
                    svc::unit_path(platform)?.display()
                ),
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn bench_memory(serve: &ServeArgs, clients: usize, requests: usize, in_process: bool) -> Result<()> {
    use laya::bench::memory::{self, mib, MemoryBench};
    let bench = MemoryBench {
        program: std::env::current_exe().context("finding this program's path")?,
        model_args: serve.model_args(),
        clients,
        requests,
        in_process,
    };
    let r = memory::run(&bench, |line| eprintln!("{line}")).map_err(anyhow::Error::msg)?;
    println!("daemon RSS with 1 LSP client:  {:8.1} MiB", mib(r.one_client));
    println!(
        "daemon RSS with {} LSP clients: {:8.1} MiB",
        r.clients,
        mib(r.many_clients)
    );
    println!("ratio: {:.3} (goal <= 1.1)", r.ratio());
    if !r.lsp.is_empty() {
        let each: Vec<String> = r.lsp.iter().map(|b| format!("{:.1}", mib(*b))).collect();
        println!("each laya lsp process: {} MiB", each.join(", "));
    }
    if let Some(ip) = r.in_process {
        println!(
            "one laya lsp --in-process: {:.1} MiB ({} of them: about {:.1} MiB)",
            mib(ip),
            r.clients,
            mib(ip) * r.clients as f64
        );
    }
    Ok(())
}

enum SoakModel {
    Tiny,
    Named(String),
}

struct SoakArgs {
    clients: usize,
    lsp_fraction: f64,
    duration: u64,
    max_tokens: usize,
    model: SoakModel,
    precision: Precision,
    prefill_cache_size: usize,
    prefill_cache_bytes: usize,
    json: Option<PathBuf>,
    device: DevicePref,
}

fn bench_soak(a: SoakArgs) -> Result<()> {
    use laya::bench::soak::{self, SoakConfig};
    if !(0.0..=1.0).contains(&a.lsp_fraction) {
        bail!("--lsp-fraction must be between 0 and 1");
    }
    let scratch = std::env::temp_dir().join(format!("laya-soak-model-{}", std::process::id()));
    let model = match &a.model {
        SoakModel::Named(m) => resolve_model(m)?,
        SoakModel::Tiny => {
            use_device(DevicePref::Cpu).map_err(anyhow::Error::msg)?;
            let gguf = resolve_model("qwen2.5-coder-0.5b").context("the tiny model borrows its tokenizer")?;
            eprintln!("writing a tiny random model to {}", scratch.display());
            soak::tiny_model(&scratch, &gguf).map_err(anyhow::Error::msg)?
        }
    };
    let cfg = SoakConfig {
        program: std::env::current_exe().context("finding this program's path")?,
        device: a.device.label().into(),
        model,
        precision: a.precision.label().into(),
        clients: a.clients.max(1),
        lsp_clients: (a.clients as f64 * a.lsp_fraction).round() as usize,
        duration: std::time::Duration::from_secs(a.duration),
        max_tokens: a.max_tokens,
        prefix_entries: a.prefill_cache_size,
        prefix_bytes: a.prefill_cache_bytes,
    };
    let result = soak::run(&cfg, |line| eprintln!("{line}"));
    let _ = std::fs::remove_dir_all(&scratch);
    let report = result.map_err(anyhow::Error::msg)?;
    print!("{}", soak::summary(&report));
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if report.lost + report.answered_twice + report.errors > 0
        || report.daemon_served != report.answered as u64
    {
        bail!("requests were lost, answered twice or failed (see above)");
    }
    Ok(())
}
