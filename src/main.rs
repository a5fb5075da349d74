//! The `laya` command line.

use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use laya::{
    catalog, doctor,
    engine::runtime::DevicePref,
    fetch::{self, Fetched, Source},
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
    /// Fetch or list models.
    Models {
        #[command(subcommand)]
        command: ModelsCommand,
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
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LAYA_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
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
