//! `laya service install|uninstall`: run `laya serve` as a per-user service that starts at
//! login and restarts on failure: a systemd user unit on Linux
//! (`~/.config/systemd/user/laya.service`), a LaunchAgent on macOS
//! (`~/Library/LaunchAgents/dev.laya.serve.plist`). The unit runs this binary's absolute path
//! with `serve` and a `ServeConfig`'s flags, checked first as the daemon would; [`install`]
//! then enables it (`systemctl --user enable --now`, `launchctl load -w`) unless told not to.

use std::{
    fmt,
    path::{Path, PathBuf},
    process::Command,
};

use crate::config::ServeConfig;

pub const SYSTEMD_UNIT: &str = "laya.service";
pub const LAUNCHD_LABEL: &str = "dev.laya.serve";

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Platform {
    /// A systemd user unit (Linux).
    Systemd,
    /// A launchd LaunchAgent (macOS).
    Launchd,
}

impl std::str::FromStr for Platform {
    type Err = String;

    /// `systemd` or `launchd`.
    fn from_str(s: &str) -> Result<Platform, String> {
        match s {
            "systemd" => Ok(Platform::Systemd),
            "launchd" => Ok(Platform::Launchd),
            _ => Err(format!("expected systemd or launchd, got `{s}`")),
        }
    }
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Platform::Systemd => "systemd",
            Platform::Launchd => "launchd",
        })
    }
}

impl Platform {
    /// This machine's service manager.
    pub fn native() -> Platform {
        if cfg!(target_os = "macos") {
            Platform::Launchd
        } else {
            Platform::Systemd
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("neither HOME nor XDG_CONFIG_HOME is set: cannot tell where the service file goes")]
    NoHome,
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("`{command}` failed: {detail}")]
    Command { command: String, detail: String },
    #[error("finding this program's path: {0}")]
    Program(std::io::Error),
}

/// What the service runs.
#[derive(Clone, Debug)]
pub struct ServiceSpec {
    /// Absolute path of the `laya` binary.
    pub program: PathBuf,
    /// The daemon's settings: `serve` and their flags are its arguments.
    pub serve: ServeConfig,
    /// Environment the service needs (e.g. `LAYA_MODEL_DIR` when set at install time).
    pub env: Vec<(String, String)>,
}

/// The variables of laya's environment that a service started at login needs to find what
/// this one finds (models, caches, runtime directory, logging).
const SERVICE_ENV: [&str; 4] = ["LAYA_MODEL_DIR", "LAYA_CACHE_DIR", "LAYA_RUNTIME_DIR", "LAYA_LOG"];

impl ServiceSpec {
    /// This binary (its absolute path) serving `serve`, with the variables of
    /// `SERVICE_ENV` that are set now.
    pub fn for_this_program(serve: ServeConfig) -> Result<ServiceSpec, ServiceError> {
        let program = std::env::current_exe()
            .and_then(std::fs::canonicalize)
            .map_err(ServiceError::Program)?;
        let env = SERVICE_ENV
            .iter()
            .filter_map(|k| {
                std::env::var(k)
                    .ok()
                    .filter(|v| !v.is_empty())
                    .map(|v| (k.to_string(), v))
            })
            .collect();
        Ok(ServiceSpec { program, serve, env })
    }

    /// The arguments: `serve` and the settings' flags.
    pub fn args(&self) -> Vec<String> {
        let mut args = vec!["serve".to_owned()];
        args.extend(self.serve.to_args());
        args
    }
}

/// What `install` did.
#[derive(Clone, Debug)]
pub struct Installed {
    /// The service file written.
    pub path: PathBuf,
    /// The commands run to enable and start it.
    pub ran: Vec<String>,
    /// The variable the service needs for its HTTP token, if any.
    pub token_env: Option<String>,
}

/// The lines `laya service install` prints.
impl fmt::Display for Installed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "wrote {}", self.path.display())?;
        for r in &self.ran {
            writeln!(f, "ran `{r}`")?;
        }
        if let Some(var) = &self.token_env {
            writeln!(
                f,
                "note: the service needs {var} in its environment for its HTTP token"
            )?;
        }
        Ok(())
    }
}

fn home() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
}

/// Where the service file goes.
pub fn unit_path(platform: Platform) -> Result<PathBuf, ServiceError> {
    match platform {
        Platform::Systemd => {
            let config = std::env::var_os("XDG_CONFIG_HOME")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
                .or_else(|| home().map(|h| h.join(".config")))
                .ok_or(ServiceError::NoHome)?;
            Ok(config.join("systemd/user").join(SYSTEMD_UNIT))
        }
        Platform::Launchd => Ok(home()
            .ok_or(ServiceError::NoHome)?
            .join("Library/LaunchAgents")
            .join(format!("{LAUNCHD_LABEL}.plist"))),
    }
}

/// One word of a systemd command line: quoted, with `\`, `"`, `%` and `$` escaped.
fn systemd_quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '%' => out.push_str("%%"),
            '$' => out.push_str("$$"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

pub fn render_systemd(spec: &ServiceSpec) -> String {
    let mut exec = systemd_quote(&spec.program.to_string_lossy());
    for a in &spec.args() {
        exec.push(' ');
        exec.push_str(&systemd_quote(a));
    }
    let mut env = String::new();
    for (k, v) in &spec.env {
        env.push_str(&format!("Environment={}\n", systemd_quote(&format!("{k}={v}"))));
    }
    format!(
        "# Written by `laya service install`; `laya service uninstall` removes it.\n\
         [Unit]\n\
         Description=laya code-completion daemon (laya serve)\n\
         \n\
         [Service]\n\
         Type=simple\n\
         ExecStart={exec}\n\
         {env}\
         Restart=on-failure\n\
         RestartSec=2\n\
         \n\
         [Install]\n\
         WantedBy=default.target\n"
    )
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

pub fn render_launchd(spec: &ServiceSpec, log: &Path) -> String {
    let mut args = format!(
        "        <string>{}</string>\n",
        xml_escape(&spec.program.to_string_lossy())
    );
    for a in &spec.args() {
        args.push_str(&format!("        <string>{}</string>\n", xml_escape(a)));
    }
    let mut env = String::new();
    if !spec.env.is_empty() {
        env.push_str("    <key>EnvironmentVariables</key>\n    <dict>\n");
        for (k, v) in &spec.env {
            env.push_str(&format!(
                "        <key>{}</key>\n        <string>{}</string>\n",
                xml_escape(k),
                xml_escape(v)
            ));
        }
        env.push_str("    </dict>\n");
    }
    let log = xml_escape(&log.to_string_lossy());
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
         <!DOCTYPE plist PUBLIC \"-//Apple//DTD PLIST 1.0//EN\" \"http://www.apple.com/DTDs/PropertyList-1.0.dtd\">\n\
         <!-- Written by `laya service install`; `laya service uninstall` removes it. -->\n\
         <plist version=\"1.0\">\n\
         <dict>\n\
         \x20   <key>Label</key>\n\
         \x20   <string>{LAUNCHD_LABEL}</string>\n\
         \x20   <key>ProgramArguments</key>\n\
         \x20   <array>\n\
         {args}\
         \x20   </array>\n\
         {env}\
         \x20   <key>RunAtLoad</key>\n\
         \x20   <true/>\n\
         \x20   <key>KeepAlive</key>\n\
         \x20   <dict>\n\
         \x20       <key>SuccessfulExit</key>\n\
         \x20       <false/>\n\
         \x20   </dict>\n\
         \x20   <key>StandardErrorPath</key>\n\
         \x20   <string>{log}</string>\n\
         </dict>\n\
         </plist>\n"
    )
}

/// The commands that start (`enable`) or stop the service.
pub fn start_commands(platform: Platform, path: &Path) -> Vec<Vec<String>> {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let p = path.to_string_lossy().into_owned();
    match platform {
        Platform::Systemd => vec![
            s(&["systemctl", "--user", "daemon-reload"]),
            s(&["systemctl", "--user", "enable", "--now", SYSTEMD_UNIT]),
        ],
        Platform::Launchd => vec![s(&["launchctl", "load", "-w", &p])],
    }
}

pub fn stop_commands(platform: Platform, path: &Path) -> Vec<Vec<String>> {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let p = path.to_string_lossy().into_owned();
    match platform {
        Platform::Systemd => vec![s(&["systemctl", "--user", "disable", "--now", SYSTEMD_UNIT])],
        Platform::Launchd => vec![s(&["launchctl", "unload", "-w", &p])],
    }
}

fn run(cmd: &[String]) -> Result<(), ServiceError> {
    let line = cmd.join(" ");
    let out = Command::new(&cmd[0])
        .args(&cmd[1..])
        .output()
        .map_err(|e| ServiceError::Command {
            command: line.clone(),
            detail: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(ServiceError::Command {
            command: line,
            detail: format!("{}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim()),
        });
    }
    Ok(())
}

/// Write the service file (replacing an older one) and, with `start`, enable and start it.
pub fn install(platform: Platform, spec: &ServiceSpec, start: bool) -> Result<Installed, ServiceError> {
    let path = unit_path(platform)?;
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |source| ServiceError::Io { path: p, source }
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let text = match platform {
        Platform::Systemd => render_systemd(spec),
        Platform::Launchd => {
            let log = crate::paths::cache_root().join("serve.log");
            render_launchd(spec, &log)
        }
    };
    let mut ran = vec![];
    if start && platform == Platform::Launchd && path.exists() {
        // A loaded agent keeps its old definition until unloaded.
        for cmd in stop_commands(platform, &path) {
            let _ = run(&cmd);
        }
    }
    std::fs::write(&path, text).map_err(io(&path))?;
    if start {
        for cmd in start_commands(platform, &path) {
            run(&cmd)?;
            ran.push(cmd.join(" "));
        }
    }
    Ok(Installed {
        path,
        ran,
        token_env: spec.serve.token_env.clone(),
    })
}

/// Stop (unless `stop` is false) and remove the service. `Ok(None)` when none was installed.
pub fn uninstall(platform: Platform, stop: bool) -> Result<Option<PathBuf>, ServiceError> {
    let path = unit_path(platform)?;
    if !path.exists() {
        return Ok(None);
    }
    if stop {
        for cmd in stop_commands(platform, &path) {
            // Already stopped or never started: removing the file is what matters.
            if let Err(e) = run(&cmd) {
                tracing::warn!(error = %e, "stopping the service");
            }
        }
    }
    std::fs::remove_file(&path).map_err(|source| ServiceError::Io {
        path: path.clone(),
        source,
    })?;
    if stop && platform == Platform::Systemd {
        let _ = run(&["systemctl".into(), "--user".into(), "daemon-reload".into()]);
    }
    Ok(Some(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn systemd_words_are_quoted_and_escaped() {
        assert_eq!(systemd_quote("a b"), "\"a b\"");
        assert_eq!(systemd_quote(r#"x"y\z"#), r#""x\"y\\z""#);
        assert_eq!(systemd_quote("50%$HOME"), "\"50%%$$HOME\"");
    }

    #[test]
    fn plist_text_is_escaped() {
        let spec = ServiceSpec {
            program: "/opt/a&b/laya".into(),
            serve: ServeConfig {
                small: "<x>".into(),
                ..Default::default()
            },
            env: vec![],
        };
        let p = render_launchd(&spec, Path::new("/tmp/l.log"));
        assert!(p.contains("<string>/opt/a&amp;b/laya</string>"), "{p}");
        assert!(
            p.contains("<string>serve</string>\n        <string>--small</string>\n        <string>&lt;x&gt;</string>"),
            "{p}"
        );
    }

    #[test]
    fn platforms_read_back_what_they_write() {
        for p in [Platform::Systemd, Platform::Launchd] {
            assert_eq!(p.to_string().parse::<Platform>(), Ok(p));
        }
        assert!("upstart".parse::<Platform>().is_err());
    }
}
