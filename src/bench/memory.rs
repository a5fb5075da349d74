//! `laya bench memory`: the daemon's resident memory with one LSP client completing, then
//! with several completing at once. One copy of the weights serves them all, so the goal is
//! at most 1.1× the one-client figure. For scale it also measures one `laya lsp
//! --in-process`, which holds its own copy of the weights: N editors that way hold N copies.

use std::{
    fmt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::{json, Value};

use super::lsp_client::LspProcess;
use crate::{
    config::ServeConfig,
    daemon::{client::status_blocking, paths},
};

pub struct Config {
    /// The `laya` binary.
    pub program: PathBuf,
    /// The daemon's models and settings, for `laya serve` and `laya lsp` alike (served
    /// without HTTP).
    pub serve: ServeConfig,
    pub clients: usize,
    /// Completions per client in each phase.
    pub requests: usize,
    /// Also measure one in-process language server.
    pub in_process: bool,
}

#[derive(Debug)]
pub struct Report {
    pub one_client: u64,
    pub many_clients: u64,
    pub clients: usize,
    /// Each language server's own resident memory in the many-clients phase.
    pub lsp: Vec<u64>,
    pub in_process: Option<u64>,
}

impl Report {
    pub fn ratio(&self) -> f64 {
        self.many_clients as f64 / self.one_client.max(1) as f64
    }
}

/// The lines `laya bench memory` prints.
impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "daemon RSS with 1 LSP client:  {:8.1} MiB",
            mib(self.one_client)
        )?;
        writeln!(
            f,
            "daemon RSS with {} LSP clients: {:8.1} MiB",
            self.clients,
            mib(self.many_clients)
        )?;
        writeln!(f, "ratio: {:.3} (goal <= 1.1)", self.ratio())?;
        if !self.lsp.is_empty() {
            let each: Vec<String> = self.lsp.iter().map(|b| format!("{:.1}", mib(*b))).collect();
            writeln!(f, "each laya lsp process: {} MiB", each.join(", "))?;
        }
        if let Some(ip) = self.in_process {
            writeln!(
                f,
                "one laya lsp --in-process: {:.1} MiB ({} of them: about {:.1} MiB)",
                mib(ip),
                self.clients,
                mib(ip) * self.clients as f64
            )?;
        }
        Ok(())
    }
}

/// Resident set size of a process in bytes (`/proc` on Linux, `ps` elsewhere).
pub fn rss_bytes(pid: u32) -> Option<u64> {
    if let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
        let kb = s.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
        return kb
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse::<u64>()
            .ok()
            .map(|k| k * 1024);
    }
    let out = Command::new("ps")
        .args(["-o", "rss=", "-p", &pid.to_string()])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse::<u64>()
        .ok()
        .map(|k| k * 1024)
}

/// Settings that keep each completion short: no debounce, `max_tokens` tokens, and every
/// route on the small tier at `precision` (so exactly one model is loaded); no answers
/// computed ahead, so the load is the requests the bench sends.
pub fn settings(precision: &str, max_tokens: usize) -> Value {
    let key = json!({ "tier": "small", "precision": precision });
    json!({
        "completion": {
            "debounceMs": 0,
            "lookAhead": false,
            "maxTokensLine": max_tokens,
            "maxTokensBlock": max_tokens,
            "router": { "codeAutomatic": key, "codeInvoked": key, "codeBlock": key, "prose": key },
        }
    })
}

const DOC: &str = "def add(a, b):\n    return ";

/// A benchmark's private runtime directory and the daemon serving it: the daemon is killed
/// and the directory removed when this is dropped.
pub struct BenchDaemon {
    pub dir: PathBuf,
    /// Environment the daemon starts with, beside this process's.
    pub env: Vec<(String, String)>,
    daemon: Option<Child>,
}

impl BenchDaemon {
    /// A fresh private runtime directory `<tmp>/laya-bench-<name>-<pid>`, no daemon yet.
    pub fn dir(name: &str) -> Result<BenchDaemon, String> {
        let dir = std::env::temp_dir().join(format!("laya-bench-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        paths::ensure_private_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(BenchDaemon {
            dir,
            env: vec![],
            daemon: None,
        })
    }

    /// Start `laya serve` with `serve`'s flags in this directory (stderr to its serve.log)
    /// and wait until its default model is ready.
    pub fn start(&mut self, program: &Path, serve: &ServeConfig) -> Result<u32, String> {
        let log_file = std::fs::File::create(self.dir.join(paths::LOG)).map_err(|e| e.to_string())?;
        let daemon = Command::new(program)
            .arg("serve")
            .args(serve.to_args())
            .env("LAYA_RUNTIME_DIR", &self.dir)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .map_err(|e| format!("starting laya serve: {e}"))?;
        let pid = daemon.id();
        self.daemon = Some(daemon);
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            match status_blocking(&self.dir, Duration::from_secs(5)) {
                Ok(s) if s.status == "ok" => return Ok(pid),
                Ok(s) if s.status == "failed" => {
                    return Err(format!("the model failed to load: {:?}", s.models))
                }
                _ if Instant::now() > deadline => {
                    return Err("the daemon did not get ready in 10 minutes".into())
                }
                _ => {}
            }
            if let Some(Ok(Some(st))) = self.daemon.as_mut().map(Child::try_wait) {
                let log = std::fs::read_to_string(self.dir.join(paths::LOG)).unwrap_or_default();
                return Err(format!("laya serve exited ({st}): {}", log.trim()));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Start `laya lsp EXTRA` with `serve`'s flags against this directory's daemon,
    /// initialize it with `settings` and wait for its engine.
    pub fn lsp(
        &self,
        program: &Path,
        extra: &[&str],
        serve: &ServeConfig,
        settings: Value,
    ) -> Result<LspProcess, String> {
        let mut cmd = Command::new(program);
        cmd.arg("lsp")
            .args(extra)
            .args(serve.to_args())
            .env("LAYA_RUNTIME_DIR", &self.dir)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stderr(Stdio::null());
        let mut p = LspProcess::spawn(cmd).map_err(|e| format!("starting laya lsp: {e}"))?;
        p.initialize(settings)?;
        if !p.wait_log(
            |l| l.contains("model ready") || l.contains("failed"),
            Duration::from_secs(600),
        ) {
            return Err(format!("the language server did not get ready: {:?}", p.logs));
        }
        Ok(p)
    }
}

impl Drop for BenchDaemon {
    fn drop(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            let _ = d.kill();
            let _ = d.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The daemon's settings: the bench's, without HTTP.
fn serve(b: &Config) -> ServeConfig {
    ServeConfig {
        http: None,
        ..b.serve.clone()
    }
}

fn lsp(b: &Config, bench: &BenchDaemon, extra: &[&str], name: &str) -> Result<LspProcess, String> {
    let mut p = bench.lsp(&b.program, extra, &serve(b), settings("q8", 4))?;
    p.open(&format!("file:///bench/{name}.py"), "python", DOC)?;
    Ok(p)
}

fn complete(p: &mut LspProcess, name: &str) -> Result<(), String> {
    let uri = format!("file:///bench/{name}.py");
    let line = DOC.lines().count() as u32 - 1;
    let col = DOC.lines().last().map(|l| l.len()).unwrap_or(0) as u32;
    match p.inline_completion(&uri, line, col, Duration::from_secs(600))? {
        Some(_) => Ok(()),
        None => Err(format!(
            "no completion; the server said: {}",
            p.logs.last().cloned().unwrap_or_default()
        )),
    }
}

/// Measure; `log` hears each step as it happens.
pub fn run(b: &Config, mut log: impl FnMut(&str)) -> Result<Report, String> {
    let mut cleanup = BenchDaemon::dir("memory")?;
    log("starting the daemon; loading the model");
    let pid = cleanup.start(&b.program, &serve(b))?;
    log(&format!("daemon pid {pid} ready"));
    let rss = |what: &str| rss_bytes(pid).ok_or_else(|| format!("cannot read the daemon's memory ({what})"));

    let mut first = lsp(b, &cleanup, &[], "c0")?;
    for _ in 0..b.requests {
        complete(&mut first, "c0")?;
    }
    let one_client = rss("1 client")?;
    log(&format!("1 client: daemon RSS {:.1} MiB", mib(one_client)));

    let mut clients = vec![first];
    for i in 1..b.clients.max(1) {
        clients.push(lsp(b, &cleanup, &[], &format!("c{i}"))?);
    }
    let requests = b.requests;
    let results: Vec<Result<LspProcess, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = clients
            .into_iter()
            .enumerate()
            .map(|(i, mut c)| {
                s.spawn(move || {
                    for _ in 0..requests {
                        complete(&mut c, &format!("c{i}"))?;
                    }
                    Ok(c)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a client thread panicked".into()))
            })
            .collect()
    });
    let clients: Vec<LspProcess> = results.into_iter().collect::<Result<_, _>>()?;
    let many_clients = rss(&format!("{} clients", clients.len()))?;
    let lsp_rss: Vec<u64> = clients.iter().filter_map(|c| rss_bytes(c.pid())).collect();
    log(&format!(
        "{} clients: daemon RSS {:.1} MiB",
        clients.len(),
        mib(many_clients)
    ));
    for c in clients {
        c.shutdown(Duration::from_secs(5));
    }
    drop(cleanup);

    let in_process = if b.in_process {
        let ip = BenchDaemon::dir("memory-ip")?;
        let mut p = lsp(b, &ip, &["--in-process"], "ip")?;
        complete(&mut p, "ip")?;
        let r = rss_bytes(p.pid());
        p.shutdown(Duration::from_secs(5));
        r
    } else {
        None
    };
    Ok(Report {
        one_client,
        many_clients,
        clients: b.clients.max(1),
        lsp: lsp_rss,
        in_process,
    })
}

pub fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_prints_each_phase_and_the_ratio() {
        let mib = 1 << 20;
        let r = Report {
            one_client: 100 * mib,
            many_clients: 105 * mib,
            clients: 4,
            lsp: vec![16 * mib, 17 * mib],
            in_process: Some(110 * mib),
        };
        assert_eq!(
            r.to_string(),
            "daemon RSS with 1 LSP client:     100.0 MiB\n\
             daemon RSS with 4 LSP clients:    105.0 MiB\n\
             ratio: 1.050 (goal <= 1.1)\n\
             each laya lsp process: 16.0, 17.0 MiB\n\
             one laya lsp --in-process: 110.0 MiB (4 of them: about 440.0 MiB)\n"
        );
        let bare = Report {
            lsp: vec![],
            in_process: None,
            ..r
        };
        assert_eq!(bare.to_string().lines().count(), 3);
    }
}
