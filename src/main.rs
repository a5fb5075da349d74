//! The `laya` command line: parses the arguments (`cli`), maps them to the library's typed
//! settings, runs the command and prints its report; errors become one line on stderr and a
//! non-zero exit status.

mod cli;

use std::process::ExitCode;

use anyhow::{bail, Result};
use clap::Parser;
use laya::{catalog, doctor, fetch, service};

use cli::{Cli, Command, ModelsCommand, ServiceCommand};

/// The log filter from `LAYA_LOG` (`warn` when unset or invalid). The engine's events have the
/// targets of its own crate, `laya_engine::…`; a directive that names them as the module they
/// were (`laya::engine::worker=debug`) still selects them.
fn log_filter(spec: Option<&str>) -> tracing_subscriber::EnvFilter {
    spec.map(|s| s.replace("laya::engine", "laya_engine"))
        .and_then(|s| tracing_subscriber::EnvFilter::try_new(s).ok())
        .unwrap_or_else(|| "warn".into())
}

fn main() -> ExitCode {
    laya::engine::runtime::apply_mlx_env_defaults();
    tracing_subscriber::fmt()
        .with_env_filter(log_filter(std::env::var("LAYA_LOG").ok().as_deref()))
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

/// Let a closed standard output end the process quietly, as it ends other Unix tools (`laya
/// doctor | head`), instead of a panic in `println!`. Only for commands that write a report
/// and talk to nothing else: the servers and the benchmarks keep SIGPIPE ignored, so that a
/// client or child that goes away is an error they handle, not their death.
fn default_sigpipe() {
    // SAFETY: setting a signal's disposition to its default, before any thread that could
    // write to a pipe exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    let device = cli.device;
    let msg = anyhow::Error::msg;
    if matches!(
        cli.command,
        Command::Doctor | Command::Models { .. } | Command::Service { .. } | Command::Complete { .. }
    ) {
        default_sigpipe();
    }
    match cli.command {
        Command::Doctor => {
            let report = doctor::report(device);
            print!("{}", report.text);
            return Ok(if report.problems == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            });
        }
        Command::Lsp {
            serve,
            remote,
            in_process,
        } => {
            let status = cli::lsp::run(serve.config(device), remote.config(), in_process)?;
            let code = exit_code(status);
            // Leave at once: a model still loading on its own thread, the blocking read of
            // stdin or a daemon connection must not keep `laya lsp` alive after `exit` or
            // the end of its input (nor its teardown: see `skip_teardown`).
            #[cfg(target_os = "linux")]
            skip_teardown(&code);
            #[cfg(not(target_os = "linux"))]
            return Ok(code);
        }
        Command::Serve { serve } => {
            let config = serve.config(device)?.daemon_config()?;
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            if let Err(e) = rt.block_on(laya::daemon::run(config)) {
                eprintln!("error: {e}");
                return Ok(exit_code(e.exit_code()));
            }
        }
        Command::Service {
            command:
                ServiceCommand::Install {
                    serve,
                    no_start,
                    platform,
                },
        } => {
            let serve = serve.config(device)?;
            // The flags must make a daemon that starts: check them here, not at login.
            serve.daemon_config()?;
            let spec = service::ServiceSpec::for_this_program(serve)?;
            let platform = platform.unwrap_or_else(service::Platform::native);
            print!("{}", service::install(platform, &spec, !no_start)?);
        }
        Command::Service {
            command: ServiceCommand::Uninstall { no_stop, platform },
        } => {
            let platform = platform.unwrap_or_else(service::Platform::native);
            match service::uninstall(platform, !no_stop)? {
                Some(p) => println!("removed {}", p.display()),
                None => println!(
                    "no laya service installed ({} does not exist)",
                    service::unit_path(platform)?.display()
                ),
            }
        }
        Command::Complete {
            location,
            model,
            max_tokens,
            temperature,
        } => {
            let config = cli::complete_config(&location, &model, max_tokens, temperature, device)?;
            let report = laya::complete::run(&config).map_err(msg)?;
            match &report.completion {
                Some(text) => println!("{text}"),
                None => eprintln!("(no completion: the model's answer was empty after post-processing)"),
            }
            eprintln!("{report}");
        }
        Command::Bench { command } => cli::bench::run(command, device)?,
        Command::Models {
            command: ModelsCommand::List,
        } => {
            let dir = laya::paths::model_dir();
            println!("model dir: {}", dir.display());
            let machine = laya::machine::Machine::probe(device);
            print!(
                "{}",
                catalog::table(&machine, &|m, v| fetch::variant_presence_in(m, v, &dir))
            );
            println!();
            for m in catalog::MODELS {
                println!("  {:<21} {}; license: {}", m.name, m.description, m.license);
            }
        }
        Command::Models {
            command: ModelsCommand::Warm { serve },
        } => cli::warm::run(*serve, device)?,
        Command::Models {
            command: ModelsCommand::Fetch { names, source },
        } => {
            let names: Vec<String> = if names.is_empty() {
                catalog::DEFAULT_FETCH.iter().map(|s| s.to_string()).collect()
            } else {
                names
            };
            for name in &names {
                let Some(named) = catalog::lookup(name).map_err(msg)? else {
                    let known: Vec<_> = catalog::MODELS.iter().map(|m| m.name).collect();
                    bail!(
                        "unknown model `{name}`; known: {} (a variant as NAME@LABEL: `laya models list`)",
                        known.join(", ")
                    );
                };
                let model = named.model;
                let variant = named.variant.unwrap_or_else(|| model.fetch_variant());
                let name = model.spec(variant);
                // Most fetch errors name the model; the others (a file's path) get its name.
                let fetched = fetch::fetch(model, variant, source).map_err(|e| match e.to_string() {
                    m if m.starts_with(&format!("{name}: ")) => anyhow::Error::msg(m),
                    m => anyhow::Error::msg(format!("fetching {name}: {m}")),
                })?;
                match fetched {
                    fetch::Fetched::AlreadyPresent(p) => {
                        println!("{name}: already present and verified ({})", p.display())
                    }
                    fetch::Fetched::Downloaded { path, source } => {
                        println!("{name}: fetched from {source} → {}", path.display())
                    }
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
