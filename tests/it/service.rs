//! `laya service install|uninstall` with a temporary HOME: the unit (systemd) and the
//! LaunchAgent (launchd) files are written with this binary's absolute path and the serve
//! flags, and removed again. `--no-start` / `--no-stop` keep systemctl and launchctl out.

use std::{path::Path, process::Command};

use crate::support::{self, run};

fn laya(home: &Path) -> Command {
    let mut c = support::laya();
    c.env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join("cfg"))
        .env_remove("LAYA_MODEL_DIR")
        .env_remove("LAYA_RUNTIME_DIR")
        .env_remove("LAYA_LOG");
    c
}

fn exe() -> String {
    std::fs::canonicalize(env!("CARGO_BIN_EXE_laya"))
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

#[test]
fn systemd_unit_is_written_with_the_binary_and_flags_and_removed() {
    let home = tempfile::tempdir().unwrap();
    let (code, out, err) = run(laya(home.path())
        .args(["service", "install", "--no-start", "--platform", "systemd"])
        .args([
            "--small-remote",
            "http://127.0.0.1:9/v1",
            "--large",
            "none",
            "--http-addr",
            "127.0.0.1:7799",
        ])
        .env("LAYA_MODEL_DIR", "/models dir/100%"));
    assert_eq!(code, 0, "{err}");
    let unit = home.path().join("cfg/systemd/user/laya.service");
    assert!(out.contains(&unit.display().to_string()), "{out}");
    let text = std::fs::read_to_string(&unit).unwrap();
    let exec = text.lines().find(|l| l.starts_with("ExecStart=")).unwrap();
    assert!(
        exec.starts_with(&format!("ExecStart=\"{}\" \"serve\" ", exe())),
        "{exec}"
    );
    for part in [
        "\"--small-remote\" \"http://127.0.0.1:9/v1\"",
        "\"--large\" \"none\"",
        "\"--http-addr\" \"127.0.0.1:7799\"",
        "\"--warmup\" \"true\"",
    ] {
        assert!(exec.contains(part), "{part} missing: {exec}");
    }
    assert!(text.contains("Restart=on-failure"), "{text}");
    assert!(text.contains("WantedBy=default.target"), "{text}");
    // The model directory set at install time goes with it, escaped for systemd.
    assert!(
        text.contains("Environment=\"LAYA_MODEL_DIR=/models dir/100%%\""),
        "{text}"
    );
    assert!(!out.contains("ran `"), "--no-start runs nothing: {out}");

    let (code, out, _) =
        run(laya(home.path()).args(["service", "uninstall", "--no-stop", "--platform", "systemd"]));
    assert_eq!(code, 0);
    assert!(out.contains("removed"), "{out}");
    assert!(!unit.exists());
    let (code, out, _) =
        run(laya(home.path()).args(["service", "uninstall", "--no-stop", "--platform", "systemd"]));
    assert_eq!(code, 0);
    assert!(out.contains("no laya service installed"), "{out}");
}

#[test]
fn launch_agent_is_written_and_removed() {
    let home = tempfile::tempdir().unwrap();
    let (code, _, err) = run(laya(home.path())
        .args(["service", "install", "--no-start", "--platform", "launchd"])
        .args([
            "--small-remote",
            "http://127.0.0.1:9/v1",
            "--large",
            "none",
            "--no-http",
        ]));
    assert_eq!(code, 0, "{err}");
    let plist = home.path().join("Library/LaunchAgents/dev.laya.serve.plist");
    let text = std::fs::read_to_string(&plist).unwrap();
    assert!(text.contains("<string>dev.laya.serve</string>"), "{text}");
    assert!(
        text.contains(&format!(
            "<string>{}</string>\n        <string>serve</string>",
            exe()
        )),
        "{text}"
    );
    assert!(text.contains("<string>--no-http</string>"), "{text}");
    assert!(
        text.contains("<key>RunAtLoad</key>") && text.contains("<key>KeepAlive</key>"),
        "{text}"
    );
    let (code, _, _) =
        run(laya(home.path()).args(["service", "uninstall", "--no-stop", "--platform", "launchd"]));
    assert_eq!(code, 0);
    assert!(!plist.exists());
}

#[test]
fn flags_that_would_not_start_are_refused_before_anything_is_written() {
    let home = tempfile::tempdir().unwrap();
    let (code, _, err) = run(laya(home.path())
        .args(["service", "install", "--no-start", "--platform", "systemd"])
        .args([
            "--small-remote",
            "http://127.0.0.1:9/v1",
            "--preload",
            "medium/q4",
        ]));
    assert_eq!(code, 1);
    assert!(err.contains("--preload medium/q4"), "{err}");
    assert!(!home.path().join("cfg/systemd/user/laya.service").exists());
}
