//! `laya service install|uninstall`: run `laya serve` as a per-user service that starts at
//! login and restarts on failure: a systemd user unit on Linux
//! (`~/.config/systemd/user/laya.service`), a LaunchAgent on macOS
//! (`~/Library/LaunchAgents/dev.laya.serve.plist`).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

pub const SYSTEMD_UNIT: &str = "laya.service";
pub const LAUNCHD_LABEL: &str = "dev.laya.serve";

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Platform {
    /// A systemd user unit (Linux).
    Systemd,
    /// A launchd LaunchAgent (macOS).
    Launchd,
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
}

/// What the service runs.
#[derive(Clone, Debug)]
pub struct ServiceSpec {
    /// Absolute path of the `laya` binary.
    pub program: PathBuf,
    /// Arguments, starting with `serve`.
    pub args: Vec<String>,
    /// Environment the service needs (e.g. `LAYA_MODEL_DIR` when set at install time).
    pub env: Vec<(String, String)>,
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
    for a in &spec.args {
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
    for a in &spec.args {
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
/// Returns the file's path and the commands run.
pub fn install(
    platform: Platform,
    spec: &ServiceSpec,
    start: bool,
) -> Result<(PathBuf, Vec<String>), ServiceError> {
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
    Ok((path, ran))
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
            args: vec!["serve".into(), "--small".into(), "<x>".into()],
            env: vec![],
        };
        let p = render_launchd(&spec, Path::new("/tmp/l.log"));
        assert!(p.contains("<string>/opt/a&amp;b/laya</string>"), "{p}");
        assert!(p.contains("<string>&lt;x&gt;</string>"), "{p}");
    }
}
