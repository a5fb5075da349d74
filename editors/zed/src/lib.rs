//! Zed extension for laya: starts `laya lsp` for the languages in `extension.toml` and hands it
//! the settings under `lsp.laya` in Zed's settings.json.
//!
//! The binary is `lsp.laya.binary.path` when set, else `laya` on the worktree's PATH; the
//! arguments are `lsp.laya.binary.arguments` (default `["lsp"]`). laya's own settings
//! (`{"completion": {...}}`) go in `lsp.laya.initialization_options` and, for
//! `workspace/configuration`, `lsp.laya.settings`.

use std::collections::HashMap;

use zed_extension_api::{self as zed, settings::LspSettings, LanguageServerId, Result};

/// The language server's name, as in `extension.toml` and Zed's `lsp` settings.
pub const SERVER: &str = "laya";

/// The command Zed runs: path, arguments and environment.
#[derive(Debug, PartialEq, Eq)]
pub struct Launch {
    pub command: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// Builds the command from the `lsp.laya.binary` settings (path, arguments, env), where to
/// find `laya` on PATH, and the worktree's shell environment.
pub fn launch(
    path: Option<String>,
    arguments: Option<Vec<String>>,
    env: Option<HashMap<String, String>>,
    on_path: Option<String>,
    shell_env: Vec<(String, String)>,
) -> Result<Launch> {
    let command = path.filter(|p| !p.trim().is_empty()).or(on_path).ok_or_else(|| {
        "laya was not found on PATH: build it (scripts/setup.sh) and put target/release \
         on PATH, or set lsp.laya.binary.path in Zed's settings"
            .to_string()
    })?;
    let args = arguments.unwrap_or_else(|| vec!["lsp".into()]);
    let mut merged = shell_env;
    for (k, v) in env.unwrap_or_default() {
        merged.retain(|(key, _)| *key != k);
        merged.push((k, v));
    }
    Ok(Launch {
        command,
        args,
        env: merged,
    })
}

/// What laya receives for `workspace/configuration` (it asks for the `laya` section).
pub fn workspace_configuration(settings: Option<zed::serde_json::Value>) -> Option<zed::serde_json::Value> {
    settings.map(|s| zed::serde_json::json!({ SERVER: s }))
}

struct Laya;

impl zed::Extension for Laya {
    fn new() -> Self {
        Laya
    }

    fn language_server_command(
        &mut self,
        _id: &LanguageServerId,
        worktree: &zed::Worktree,
    ) -> Result<zed::Command> {
        let binary = LspSettings::for_worktree(SERVER, worktree)
            .ok()
            .and_then(|s| s.binary);
        let (path, arguments, env) = match binary {
            Some(b) => (b.path, b.arguments, b.env),
            None => (None, None, None),
        };
        let l = launch(path, arguments, env, worktree.which("laya"), worktree.shell_env())?;
        Ok(zed::Command {
            command: l.command,
            args: l.args,
            env: l.env,
        })
    }

    fn language_server_initialization_options(
        &mut self,
        _id: &LanguageServerId,
        worktree: &zed::Worktree,
    ) -> Result<Option<zed::serde_json::Value>> {
        Ok(LspSettings::for_worktree(SERVER, worktree)
            .ok()
            .and_then(|s| s.initialization_options))
    }

    fn language_server_workspace_configuration(
        &mut self,
        _id: &LanguageServerId,
        worktree: &zed::Worktree,
    ) -> Result<Option<zed::serde_json::Value>> {
        Ok(workspace_configuration(
            LspSettings::for_worktree(SERVER, worktree)
                .ok()
                .and_then(|s| s.settings),
        ))
    }
}

zed::register_extension!(Laya);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_to_laya_lsp_on_path() {
        let l = launch(None, None, None, Some("/usr/bin/laya".into()), vec![]).unwrap();
        assert_eq!(l.command, "/usr/bin/laya");
        assert_eq!(l.args, ["lsp"]);
    }

    #[test]
    fn settings_override_path_args_and_env() {
        let env = HashMap::from([("LAYA_LOG".to_string(), "info".to_string())]);
        let l = launch(
            Some("/opt/laya".into()),
            Some(vec!["lsp".into(), "--model".into(), "qwen2.5-coder-1.5b".into()]),
            Some(env),
            Some("/usr/bin/laya".into()),
            vec![("PATH".into(), "/bin".into()), ("LAYA_LOG".into(), "warn".into())],
        )
        .unwrap();
        assert_eq!(l.command, "/opt/laya");
        assert_eq!(l.args, ["lsp", "--model", "qwen2.5-coder-1.5b"]);
        assert_eq!(
            l.env,
            [
                ("PATH".to_string(), "/bin".to_string()),
                ("LAYA_LOG".to_string(), "info".to_string())
            ]
        );
    }

    #[test]
    fn missing_binary_says_how_to_fix_it() {
        let e = launch(Some("  ".into()), None, None, None, vec![]).unwrap_err();
        assert!(e.contains("lsp.laya.binary.path"), "{e}");
    }

    #[test]
    fn workspace_configuration_is_the_laya_section() {
        let s = zed::serde_json::json!({ "completion": { "debounceMs": 50 } });
        assert_eq!(
            workspace_configuration(Some(s.clone())),
            Some(zed::serde_json::json!({ "laya": s }))
        );
        assert_eq!(workspace_configuration(None), None);
    }
}
