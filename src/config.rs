//! `laya serve`'s settings as one typed value, [`ServeConfig`] (one field per serve flag,
//! `Default` the flags' defaults): the command line builds it once; it becomes the daemon's
//! [`DaemonConfig`] (and the in-process pool of `laya lsp --in-process`), and
//! [`ServeConfig::to_args`] turns it back into the flags that start the same daemon elsewhere
//! (`laya lsp` starting its daemon, `laya service install` writing the unit, the memory and
//! soak benchmarks). That is the one place where settings become flags.
//!
//! Resolution: [`ServeConfig::pool`] resolves each tier (a catalog name or `NAME@LABEL`: the
//! variant present that serves the tier's widest width; a file or folder; `auto`: the
//! catalog's plan over the models present; `none` for the large one; or a server named by
//! `--small-remote` / `--large-remote`), naming the `laya models fetch` that fixes a missing
//! one. [`ServeConfig::check_models`] is what `laya lsp` checks before it starts a daemon (no
//! GPU probe in the editor's process); [`ServeConfig::daemon_config`] adds what a daemon must
//! pass (the token set, loopback or an explicit opt-in, limits that fit).
//!
//! Invariant: flags → `ServeConfig` → `to_args()` → flags gives the same `ServeConfig`
//! (tested), model files written as absolute paths.

use std::{
    cell::OnceCell,
    collections::HashMap,
    net::SocketAddr,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use crate::{
    catalog,
    daemon::{paths, DaemonConfig, Defaults, Limits},
    engine::{
        pool::{PoolConfig, TierSource},
        remote::RemoteConfig,
        runtime::DevicePref,
        ModelKey, Precision, PrefixLimits, SpeculationChoice, Tier,
    },
    machine::Machine,
};

/// A setting that cannot work, said as the flag that fixes it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// The models `laya serve` holds and its own parameters; each field is the flag of the same
/// name (`small_remote`: `--small-remote`), and [`Default`] is what the flags default to.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServeConfig {
    /// Where local models run.
    pub device: DevicePref,
    /// Small (fast) tier: a catalog name (NAME@LABEL for one variant), a GGUF file or a
    /// safetensors folder; `auto`: the
    /// small tier for this machine among the models present ([`catalog::plan`]; on the CPU
    /// the 0.5B).
    pub small: String,
    /// Large tier: a catalog name (or NAME@LABEL), file or folder; `auto`: the large tier for this machine
    /// among the models present (on the CPU the 1.5B; none when none is there); `none`: no
    /// large tier.
    pub large: String,
    /// Serve the small tier from an OpenAI-compatible server instead (its base URL).
    pub small_remote: Option<String>,
    /// Serve the large tier from an OpenAI-compatible server instead.
    pub large_remote: Option<String>,
    /// Server-specific fields for every request to a remote tier.
    pub remote_extra: serde_json::Map<String, serde_json::Value>,
    /// Requests sent at once to a remote tier's server.
    pub remote_parallel: usize,
    /// Bit width of the default model (the small tier), and of requests naming only a tier.
    pub precision: Precision,
    /// Quantization group size.
    pub group_size: i32,
    /// Read and write the converted-weights cache.
    pub use_cache: bool,
    /// Also loaded at start.
    pub preload: Vec<ModelKey>,
    /// HTTP address; `None`: no HTTP, the unix socket only.
    pub http: Option<SocketAddr>,
    /// Environment variable holding the bearer token HTTP requests must carry.
    pub token_env: Option<String>,
    /// Serve HTTP on a non-loopback address without a token.
    pub allow_unauthenticated_remote: bool,
    /// Most tokens of prompt plus completion per request.
    pub max_seq_len: usize,
    /// Most tokens a request may generate.
    pub max_tokens: usize,
    /// Largest HTTP request body, bytes.
    pub max_body_bytes: usize,
    /// Sampling temperature for HTTP requests that give none.
    pub temperature: f32,
    /// Nucleus sampling for HTTP requests that give none.
    pub top_p: f32,
    /// Prompts (with their KV caches) kept per model for prefix reuse; 0 turns reuse off.
    pub prefill_cache_size: usize,
    /// Most bytes of KV caches kept per model for prefix reuse.
    pub prefill_cache_bytes: usize,
    /// Load and warm the default model at start (false: on the first request).
    pub warmup: bool,
    /// Decode with n-gram drafts checked several tokens a forward: `auto` is off (measured on the CPU and on an H100).
    pub speculation: SpeculationChoice,
}

/// The HTTP address `laya serve` listens on unless told otherwise.
pub const DEFAULT_HTTP_ADDR: SocketAddr =
    SocketAddr::V4(std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, 7723));

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            device: DevicePref::Auto,
            small: "auto".to_owned(),
            large: "auto".to_owned(),
            small_remote: None,
            large_remote: None,
            remote_extra: serde_json::Map::new(),
            remote_parallel: 4,
            precision: Precision::Q8,
            group_size: 64,
            use_cache: true,
            preload: vec![],
            http: Some(DEFAULT_HTTP_ADDR),
            token_env: None,
            allow_unauthenticated_remote: false,
            max_seq_len: crate::engine::DEFAULT_MAX_SEQ_LEN,
            max_tokens: 512,
            max_body_bytes: 1 << 20,
            temperature: 0.0,
            top_p: 1.0,
            prefill_cache_size: PrefixLimits::default().max_entries,
            prefill_cache_bytes: PrefixLimits::default().max_bytes,
            warmup: true,
            speculation: SpeculationChoice::Auto,
        }
    }
}

/// A catalog name, GGUF file or model folder → its path, or the command that fixes it (see
/// [`resolve_model_in`]).
pub fn resolve_model(name: &str) -> Result<PathBuf, ConfigError> {
    resolve_model_in(name, &crate::paths::model_dir(), None)
}

/// [`resolve_model`] for a model loaded at `want`: of a catalog model's variants present, the
/// one that serves that width best.
pub fn resolve_model_at(name: &str, want: Precision) -> Result<PathBuf, ConfigError> {
    resolve_model_in(name, &crate::paths::model_dir(), Some(want))
}

/// A catalog name (`NAME`, or `NAME@LABEL` for one variant), GGUF file or model folder → its
/// path, with the catalog's models in `model_dir`. A name without a label takes the variant
/// present that serves `want` best ([`crate::fetch::present_variant`]; `None`: the widest
/// width the model's tiers use), so whichever of its downloads is there serves.
pub fn resolve_model_in(
    name: &str,
    model_dir: &Path,
    want: Option<Precision>,
) -> Result<PathBuf, ConfigError> {
    let named = match catalog::lookup(name) {
        Ok(named) => named,
        // `NAME@SOMETHING` that is no variant may still be a file or folder.
        Err(_) if Path::new(name).exists() => None,
        Err(e) => return Err(ConfigError(e)),
    };
    if let Some(catalog::Named { model, variant }) = named {
        let (spec, found) = match variant {
            Some(v) => (
                model.spec(v),
                match crate::fetch::variant_presence_in(model, v, model_dir) {
                    catalog::Presence::Present => Ok(v),
                    other => Err(other),
                },
            ),
            None => (
                model.name.to_owned(),
                crate::fetch::present_variant(model, model_dir, want.unwrap_or_else(|| model.widest())),
            ),
        };
        return match found {
            Ok(v) => Ok(v.path_in(model_dir)),
            Err(catalog::Presence::Unusable(why)) => Err(ConfigError(format!(
                "model {spec} is not usable ({why}): run `laya models fetch {spec}`"
            ))),
            Err(_) => Err(ConfigError(format!(
                "model {spec} is not downloaded: run `laya models fetch {spec}`"
            ))),
        };
    }
    let p = PathBuf::from(name);
    if !p.exists() {
        return Err(ConfigError(format!(
            "`{name}` is neither a known model (`laya models list`) nor an existing file or folder"
        )));
    }
    Ok(p)
}

impl ServeConfig {
    /// The flags that start a daemon with these settings (`laya serve FLAGS`; `laya lsp`
    /// takes them too). Model files become absolute paths, so the flags mean the same from
    /// any working directory; settings at their default are written out all the same, so the
    /// daemon does not depend on the defaults of the binary that reads them.
    pub fn to_args(&self) -> Vec<String> {
        let mut a = vec![];
        if self.device != DevicePref::Auto {
            a.extend(["--device".to_owned(), self.device.to_string()]);
        }
        a.extend([
            "--small".to_owned(),
            absolute_model(&self.small),
            "--large".into(),
            absolute_model(&self.large),
            "--precision".into(),
            self.precision.to_string(),
            "--group-size".into(),
            self.group_size.to_string(),
            "--prefill-cache-size".into(),
            self.prefill_cache_size.to_string(),
            "--prefill-cache-bytes".into(),
            self.prefill_cache_bytes.to_string(),
        ]);
        for (flag, v) in [
            ("--small-remote", &self.small_remote),
            ("--large-remote", &self.large_remote),
        ] {
            if let Some(v) = v {
                a.extend([flag.to_owned(), v.clone()]);
            }
        }
        if !self.remote_extra.is_empty() {
            a.extend([
                "--remote-extra".to_owned(),
                serde_json::Value::Object(self.remote_extra.clone()).to_string(),
            ]);
        }
        if !self.use_cache {
            a.push("--no-cache".into());
        }
        for k in &self.preload {
            a.extend(["--preload".to_owned(), k.to_string()]);
        }
        match self.http {
            None => a.push("--no-http".into()),
            Some(addr) => a.extend(["--http-addr".to_owned(), addr.to_string()]),
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
            "--speculation".into(),
            self.speculation.to_string(),
            "--remote-parallel".into(),
            self.remote_parallel.to_string(),
        ]);
        a
    }

    fn remote(&self, url: &str) -> RemoteConfig {
        let mut cfg = RemoteConfig::new(url);
        cfg.api_key = std::env::var("LAYA_REMOTE_API_KEY")
            .ok()
            .filter(|k| !k.is_empty());
        cfg.extra_body = self.remote_extra.clone();
        cfg
    }

    /// The tiers (each model resolved to its file, or its server), with the name clients see
    /// for each. `auto` is resolved for this machine ([`Machine::probe`], only then).
    pub fn pool(&self) -> Result<(PoolConfig, HashMap<Tier, String>), ConfigError> {
        self.pool_in(&crate::paths::model_dir(), &|| Machine::probe(self.device))
    }

    /// [`ServeConfig::pool`] with the catalog's models in `model_dir` and `auto` resolved for
    /// the machine `machine` gives (asked at most once, and only for `auto`).
    pub fn pool_in(
        &self,
        model_dir: &Path,
        probe: &dyn Fn() -> Machine,
    ) -> Result<(PoolConfig, HashMap<Tier, String>), ConfigError> {
        let mut tiers = HashMap::new();
        let mut names = HashMap::new();
        let name_of = |spec: &str, path: &std::path::Path| match catalog::lookup(spec) {
            Ok(Some(named)) => named.model.name.to_owned(),
            _ => path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| spec.to_owned()),
        };
        let local = |path| TierSource::Local {
            path,
            group_size: self.group_size,
        };
        let probed = OnceCell::new();
        let machine = || probed.get_or_init(probe);
        let planned = OnceCell::new();
        let plan = || {
            planned.get_or_init(|| {
                catalog::plan(machine(), |m| {
                    crate::fetch::presence_in(m, model_dir) == catalog::Presence::Present
                })
            })
        };
        match &self.small_remote {
            Some(url) => {
                tiers.insert(Tier::Small, TierSource::Remote(self.remote(url)));
                names.insert(Tier::Small, url.clone());
            }
            None => {
                let want = self.tier_width(Tier::Small);
                let (spec, path) = match self.small.as_str() {
                    "auto" => match plan().small {
                        Some(m) => (
                            m.name.to_owned(),
                            resolve_model_in(m.name, model_dir, Some(want))?,
                        ),
                        None => {
                            let want = catalog::recommend(machine())
                                .small
                                .map_or(catalog::CPU_SMALL, |m| m.name);
                            return Err(ConfigError(format!(
                                "no small model is downloaded: run `laya models fetch {want}` (`laya doctor` lists the tiers for this machine)"
                            )));
                        }
                    },
                    spec => (spec.to_owned(), resolve_model_in(spec, model_dir, Some(want))?),
                };
                names.insert(Tier::Small, name_of(&spec, &path));
                tiers.insert(Tier::Small, local(path));
            }
        }
        let large = match (&self.large_remote, self.large.as_str()) {
            (Some(url), _) => {
                tiers.insert(Tier::Large, TierSource::Remote(self.remote(url)));
                names.insert(Tier::Large, url.clone());
                None
            }
            (None, "none") => None,
            (None, "auto") => match plan().large {
                Some(m) => Some((
                    m.name.to_owned(),
                    resolve_model_in(m.name, model_dir, Some(self.tier_width(Tier::Large)))?,
                )),
                None => None,
            },
            (None, spec) => Some((
                spec.to_owned(),
                resolve_model_in(spec, model_dir, Some(self.tier_width(Tier::Large)))?,
            )),
        };
        if let Some((spec, path)) = large {
            names.insert(Tier::Large, name_of(&spec, &path));
            tiers.insert(Tier::Large, local(path));
        }
        if let Some(key) = self.preload.iter().find(|k| !tiers.contains_key(&k.tier)) {
            return Err(ConfigError(format!(
                "--preload {key}: no {} model is configured",
                key.tier
            )));
        }
        Ok((
            PoolConfig {
                tiers,
                default: ModelKey {
                    tier: Tier::Small,
                    precision: self.precision,
                },
                preload: self.preload.clone(),
                device: self.device,
                prefix: PrefixLimits {
                    max_entries: self.prefill_cache_size,
                    max_bytes: self.prefill_cache_bytes,
                },
                speculation: self.speculation,
                use_cache: self.use_cache,
                loader: Default::default(),
            },
            names,
        ))
    }

    /// What `laya lsp` checks before it starts a daemon with these settings, without looking
    /// at the GPU (the daemon resolves `auto` for its machine): each model named is there, and
    /// for an `auto` small tier some small model is.
    pub fn check_models(&self) -> Result<(), ConfigError> {
        self.check_models_in(&crate::paths::model_dir())
    }

    /// [`ServeConfig::check_models`] with the catalog's models in `model_dir`.
    pub fn check_models_in(&self, model_dir: &Path) -> Result<(), ConfigError> {
        if self.small_remote.is_none() {
            match self.small.as_str() {
                "auto" => {
                    let any = catalog::MODELS.iter().any(|m| {
                        m.tiers.contains(&Tier::Small)
                            && crate::fetch::presence_in(m, model_dir) == catalog::Presence::Present
                    });
                    if !any {
                        return Err(ConfigError(format!(
                            "no small model is downloaded: run `laya models fetch {}` (`laya doctor` lists the tiers for this machine)",
                            catalog::CPU_SMALL
                        )));
                    }
                }
                spec => {
                    resolve_model_in(spec, model_dir, Some(self.tier_width(Tier::Small)))?;
                }
            }
        }
        if self.large_remote.is_none() && !matches!(self.large.as_str(), "auto" | "none") {
            resolve_model_in(&self.large, model_dir, Some(self.tier_width(Tier::Large)))?;
        }
        Ok(())
    }

    /// The widest width `tier` is loaded at: the router's default policy's for it, and for
    /// the small tier `--precision` too. The variant present that serves it best is the one
    /// loaded (it serves the tier's narrower width too).
    fn tier_width(&self, tier: Tier) -> Precision {
        let mut widths = catalog::tier_precisions(tier);
        if tier == Tier::Small {
            widths.push(self.precision);
        }
        catalog::widest(widths).unwrap_or(self.precision)
    }

    /// The daemon these settings make, in the runtime directory of this environment; an
    /// error when it could not start or would be unsafe (a missing model or token, an
    /// unauthenticated non-loopback address, limits that contradict each other).
    pub fn daemon_config(&self) -> Result<DaemonConfig, ConfigError> {
        let (pool, names) = self.pool()?;
        let token = match &self.token_env {
            Some(var) => match std::env::var(var) {
                Ok(t) if !t.trim().is_empty() => Some(t.trim().to_owned()),
                _ => {
                    return Err(ConfigError(format!(
                        "--token-env {var}: the variable is not set (or empty)"
                    )))
                }
            },
            None => None,
        };
        if let Some(addr) = self.http {
            if !addr.ip().is_loopback() && token.is_none() && !self.allow_unauthenticated_remote {
                return Err(ConfigError(format!(
                    "--http-addr {addr} is not a loopback address: anyone who can reach it could use this daemon. \
                     Set a bearer token with --token-env VAR, or pass --allow-unauthenticated-remote if that is meant"
                )));
            }
        }
        if self.max_tokens == 0 || self.max_seq_len <= self.max_tokens {
            return Err(ConfigError(format!(
                "--max-tokens must be at least 1 and below --max-seq-len ({} vs {})",
                self.max_tokens, self.max_seq_len
            )));
        }
        Ok(DaemonConfig {
            pool,
            names,
            runtime_dir: paths::runtime_dir(),
            http: self.http,
            token,
            limits: Limits {
                max_tokens: self.max_tokens,
                max_seq_len: self.max_seq_len,
                max_body_bytes: self.max_body_bytes,
                ..Default::default()
            },
            defaults: Defaults {
                max_tokens: 64.min(self.max_tokens),
                temperature: self.temperature,
                top_p: self.top_p,
            },
            warmup: self.warmup,
            remote_slots: self.remote_parallel.max(1),
        })
    }
}

/// A model setting as another process should see it: a file or folder as an absolute path;
/// catalog names, `auto` and `none` as they are.
fn absolute_model(name: &str) -> String {
    if !matches!(catalog::lookup(name), Ok(Some(_))) && !matches!(name, "auto" | "none") {
        if let Ok(p) = std::fs::canonicalize(name) {
            return p.to_string_lossy().into_owned();
        }
    }
    name.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of `flag` in `args` (the word after it).
    fn value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
        let i = args.iter().position(|a| a == flag)?;
        args.get(i + 1).map(String::as_str)
    }

    #[test]
    fn defaults_are_written_out_and_device_auto_is_left_to_the_reader() {
        let a = ServeConfig::default().to_args();
        assert!(!a.contains(&"--device".to_owned()), "{a:?}");
        for (flag, want) in [
            ("--small", "auto"),
            ("--large", "auto"),
            ("--precision", "q8"),
            ("--http-addr", "127.0.0.1:7723"),
            ("--max-tokens", "512"),
            ("--max-seq-len", "8192"),
            ("--temperature", "0"),
            ("--top-p", "1"),
            ("--warmup", "true"),
            ("--prefill-cache-bytes", "1073741824"),
        ] {
            assert_eq!(value(&a, flag), Some(want), "{flag} in {a:?}");
        }
        for absent in [
            "--no-http",
            "--no-cache",
            "--preload",
            "--token-env",
            "--remote-extra",
        ] {
            assert!(!a.contains(&absent.to_owned()), "{absent} in {a:?}");
        }
    }

    #[test]
    fn every_setting_that_differs_from_the_default_travels() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("m.gguf");
        std::fs::write(&file, b"").unwrap();
        let relative = pathdiff(&file);
        let mut extra = serde_json::Map::new();
        extra.insert("repeat_penalty".into(), serde_json::json!(1.0));
        let c = ServeConfig {
            device: DevicePref::Cpu,
            small: relative,
            large: "none".into(),
            small_remote: Some("http://127.0.0.1:9/v1".into()),
            large_remote: Some("http://127.0.0.1:8/v1".into()),
            remote_extra: extra,
            remote_parallel: 2,
            precision: Precision::Q4,
            group_size: 32,
            use_cache: false,
            preload: vec!["large/q6".parse().unwrap(), "small/8".parse().unwrap()],
            http: None,
            token_env: Some("TOKEN".into()),
            allow_unauthenticated_remote: true,
            max_seq_len: 1000,
            max_tokens: 100,
            max_body_bytes: 77,
            temperature: 0.25,
            top_p: 0.9,
            prefill_cache_size: 3,
            prefill_cache_bytes: 99,
            warmup: false,
            speculation: SpeculationChoice::Off,
        };
        let a = c.to_args();
        let canonical = std::fs::canonicalize(&file).unwrap();
        for (flag, want) in [
            ("--device", "cpu"),
            ("--small", canonical.to_str().unwrap()),
            ("--large", "none"),
            ("--small-remote", "http://127.0.0.1:9/v1"),
            ("--large-remote", "http://127.0.0.1:8/v1"),
            ("--remote-extra", r#"{"repeat_penalty":1.0}"#),
            ("--remote-parallel", "2"),
            ("--precision", "q4"),
            ("--group-size", "32"),
            ("--token-env", "TOKEN"),
            ("--max-seq-len", "1000"),
            ("--max-tokens", "100"),
            ("--max-body-bytes", "77"),
            ("--temperature", "0.25"),
            ("--top-p", "0.9"),
            ("--prefill-cache-size", "3"),
            ("--prefill-cache-bytes", "99"),
            ("--warmup", "false"),
            ("--speculation", "off"),
        ] {
            assert_eq!(value(&a, flag), Some(want), "{flag} in {a:?}");
        }
        for flag in ["--no-cache", "--no-http", "--allow-unauthenticated-remote"] {
            assert!(a.contains(&flag.to_owned()), "{flag} missing: {a:?}");
        }
        assert!(!a.contains(&"--http-addr".to_owned()), "{a:?}");
        let preloads: Vec<_> = a
            .windows(2)
            .filter(|w| w[0] == "--preload")
            .map(|w| w[1].as_str())
            .collect();
        assert_eq!(preloads, ["large/q6", "small/q8"]);
    }

    /// `path` (absolute) written relative to the working directory, so the test sees the
    /// flag made absolute.
    fn pathdiff(path: &std::path::Path) -> String {
        let depth = std::env::current_dir().unwrap().components().count() - 1;
        let rel = format!(
            "{}{}",
            "../".repeat(depth),
            path.to_str().unwrap().trim_start_matches('/')
        );
        assert!(std::path::Path::new(&rel).is_relative() && std::path::Path::new(&rel).exists());
        rel
    }

    #[test]
    fn the_settings_survive_json() {
        let c = ServeConfig {
            preload: vec!["large/q4".parse().unwrap()],
            http: None,
            temperature: 0.5,
            ..Default::default()
        };
        let text = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<ServeConfig>(&text).unwrap(), c);
        let partial: ServeConfig = serde_json::from_str(r#"{"max_tokens": 100}"#).unwrap();
        assert_eq!(
            partial,
            ServeConfig {
                max_tokens: 100,
                ..Default::default()
            }
        );
        assert!(serde_json::from_str::<ServeConfig>(r#"{"max_token": 1}"#).is_err());
    }

    #[test]
    fn a_pool_is_refused_with_the_flag_that_fixes_it() {
        let remote = ServeConfig {
            small_remote: Some("http://127.0.0.1:9/v1".into()),
            large: "none".into(),
            ..Default::default()
        };
        let (pool, names) = remote.pool().unwrap();
        assert!(matches!(
            pool.tiers.get(&Tier::Small),
            Some(TierSource::Remote(_))
        ));
        assert!(!pool.tiers.contains_key(&Tier::Large));
        assert_eq!(names[&Tier::Small], "http://127.0.0.1:9/v1");
        // `--no-cache` reaches the pool's loads.
        assert!(pool.use_cache);
        let no_cache = ServeConfig {
            use_cache: false,
            ..remote.clone()
        };
        assert!(!no_cache.pool().unwrap().0.use_cache);
        let preload = ServeConfig {
            preload: vec!["large/q4".parse().unwrap()],
            ..remote.clone()
        };
        assert_eq!(
            preload.pool().unwrap_err().0,
            "--preload large/q4: no large model is configured"
        );
        let missing = ServeConfig {
            large: "/no/such/model.gguf".into(),
            ..remote.clone()
        };
        assert!(missing.pool().unwrap_err().0.contains("/no/such/model.gguf"));
        let open = ServeConfig {
            http: Some("0.0.0.0:7723".parse().unwrap()),
            ..remote.clone()
        };
        assert!(open
            .daemon_config()
            .unwrap_err()
            .0
            .contains("--allow-unauthenticated-remote"));
        let allowed = ServeConfig {
            allow_unauthenticated_remote: true,
            ..open
        };
        assert!(allowed.daemon_config().is_ok());
        let limits = ServeConfig {
            max_tokens: 8192,
            ..remote
        };
        assert!(limits
            .daemon_config()
            .unwrap_err()
            .0
            .contains("--max-tokens must be"));
    }

    /// A model directory holding `names` (`NAME` for the variant `laya models fetch` gets, or
    /// `NAME@LABEL`): the GGUFs as sparse files of their pinned size, the folders with a
    /// configuration of their shape (quantized to the variant's bits), a tokenizer and a weight
    /// file.
    fn models_dir(names: &[&str]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for name in names {
            let named = catalog::lookup(name).unwrap().unwrap();
            let (m, v) = (named.model, named.variant.unwrap_or(named.model.fetch_variant()));
            let path = v.path_in(dir.path());
            if !v.is_folder() {
                let size = v.size.unwrap_or(1 << 20);
                std::fs::File::create(&path).unwrap().set_len(size).unwrap();
                continue;
            }
            std::fs::create_dir(&path).unwrap();
            let bits = match v.format {
                catalog::Format::Mlx { bits } => Some((64, bits as i32)),
                _ => None,
            };
            let config = crate::engine::synthetic::config_json(&m.shape.config(), bits);
            std::fs::write(path.join("config.json"), config).unwrap();
            std::fs::write(path.join("tokenizer.json"), "{}").unwrap();
            std::fs::write(path.join("model.safetensors"), b"").unwrap();
        }
        dir
    }

    fn served(
        config: &ServeConfig,
        dir: &Path,
        machine: &Machine,
    ) -> Result<(String, Option<String>), String> {
        let (pool, names) = config.pool_in(dir, &|| machine.clone()).map_err(|e| e.0)?;
        let path = |tier| match pool.tiers.get(&tier) {
            Some(TierSource::Local { path, .. }) => {
                Some(path.file_name().unwrap().to_string_lossy().into_owned())
            }
            _ => None,
        };
        assert_eq!(path(Tier::Small).is_some(), names.contains_key(&Tier::Small));
        Ok((
            names[&Tier::Small].clone(),
            path(Tier::Large).and(names.get(&Tier::Large).cloned()),
        ))
    }

    /// With no model named, the daemon serves the tiers recommended for the machine that are
    /// present: the large tier that is there; the CPU keeps the 0.5B and the 1.5B.
    #[test]
    fn auto_serves_the_recommended_tiers_that_are_present() {
        use crate::machine::Accelerator::{Cpu, Metal};
        let auto = ServeConfig::default();
        let mac = Machine::new(Metal, 64);
        let cpu = Machine::new(Cpu, 64);
        let all = models_dir(&[
            "qwen2.5-coder-0.5b",
            "qwen2.5-coder-1.5b",
            "qwen2.5-coder-3b",
            "qwen2.5-coder-7b",
            "qwen3-coder-30b-a3b",
        ]);
        let large = |s: &str| Some(s.to_owned());
        assert_eq!(
            served(&auto, all.path(), &mac),
            Ok(("qwen2.5-coder-3b".into(), large("qwen3-coder-30b-a3b")))
        );
        assert_eq!(
            served(&auto, all.path(), &cpu),
            Ok(("qwen2.5-coder-0.5b".into(), large("qwen2.5-coder-1.5b")))
        );
        // The recommended large tier is missing: the one that is there.
        let some = models_dir(&["qwen2.5-coder-0.5b", "qwen2.5-coder-3b", "qwen2.5-coder-7b"]);
        assert_eq!(
            served(&auto, some.path(), &mac),
            Ok(("qwen2.5-coder-3b".into(), large("qwen2.5-coder-7b")))
        );
        // A 16 GB Mac: the 3B fits, no large model beside it.
        assert_eq!(
            served(&auto, all.path(), &Machine::new(Metal, 16)),
            Ok(("qwen2.5-coder-3b".into(), None))
        );
        // Only the CPU defaults downloaded (what `scripts/setup.sh` fetches): they serve on a Mac too.
        let cpu_defaults = models_dir(&["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]);
        assert_eq!(
            served(&auto, cpu_defaults.path(), &mac),
            Ok(("qwen2.5-coder-1.5b".into(), None))
        );
        // Named models win over `auto`; `none` has no large tier.
        let named = ServeConfig {
            small: "qwen2.5-coder-0.5b".into(),
            large: "none".into(),
            ..Default::default()
        };
        assert_eq!(
            served(&named, all.path(), &mac),
            Ok(("qwen2.5-coder-0.5b".into(), None))
        );
        // Nothing there: the command that fetches the recommended small tier.
        let empty = tempfile::tempdir().unwrap();
        let err = served(&auto, empty.path(), &mac).unwrap_err();
        assert!(err.contains("run `laya models fetch qwen2.5-coder-3b`"), "{err}");
        let err = served(&auto, empty.path(), &cpu).unwrap_err();
        assert!(
            err.contains("run `laya models fetch qwen2.5-coder-0.5b`"),
            "{err}"
        );
        // The machine is asked only for `auto`.
        let (pool, _) = named
            .pool_in(all.path(), &|| panic!("probed for named models"))
            .unwrap();
        assert!(!pool.tiers.contains_key(&Tier::Large));
        // `laya lsp`'s check before it starts a daemon: no probe, some small model there.
        assert!(auto.check_models_in(all.path()).is_ok());
        assert!(auto
            .check_models_in(empty.path())
            .unwrap_err()
            .0
            .contains("no small model"));
        let missing = ServeConfig {
            large: "qwen2.5-coder-14b".into(),
            ..Default::default()
        };
        assert!(missing
            .check_models_in(all.path())
            .unwrap_err()
            .0
            .contains("laya models fetch qwen2.5-coder-14b"));
    }

    /// Each tier loads the variant present that serves its widest width: the small tier's
    /// 8-bit folder over its 4-bit one, the large tier's 6-bit folder, else a wider one
    /// (which serves it), else the narrower one; a variant named is that one, or an error
    /// naming the command that fetches it.
    #[test]
    fn each_tier_loads_the_variant_of_its_width() {
        use crate::machine::Accelerator::Metal;
        let mac = Machine::new(Metal, 64);
        let tiers = |c: &ServeConfig, dir: &Path| {
            let (pool, names) = c.pool_in(dir, &|| mac.clone()).map_err(|e| e.0)?;
            let file = |tier| match pool.tiers.get(&tier) {
                Some(TierSource::Local { path, .. }) => {
                    path.file_name().unwrap().to_string_lossy().into_owned()
                }
                _ => "none".to_owned(),
            };
            Ok::<_, String>((file(Tier::Small), file(Tier::Large), names))
        };
        let auto = ServeConfig::default();
        let dir = models_dir(&[
            "qwen2.5-coder-3b@q4",
            "qwen2.5-coder-3b@q8",
            "qwen3-coder-30b-a3b@q4",
            "qwen3-coder-30b-a3b@q8",
            "qwen3-coder-30b-a3b@bf16",
        ]);
        let (small, large, names) = tiers(&auto, dir.path()).unwrap();
        assert_eq!(
            (small.as_str(), large.as_str()),
            (
                "Qwen2.5-Coder-3B-Instruct-8bit",
                "Qwen3-Coder-30B-A3B-Instruct-8bit"
            )
        );
        assert_eq!(names[&Tier::Large], "qwen3-coder-30b-a3b");
        // The large tier's own width arrives: it serves.
        let q6 = models_dir(&[
            "qwen2.5-coder-3b@q4",
            "qwen3-coder-30b-a3b@q6",
            "qwen3-coder-30b-a3b@q8",
        ]);
        let (small, large, _) = tiers(&auto, q6.path()).unwrap();
        assert_eq!(
            (small.as_str(), large.as_str()),
            (
                "Qwen2.5-Coder-3B-Instruct-4bit",
                "Qwen3-Coder-30B-A3B-Instruct-6bit"
            )
        );
        // A variant named is the one served, whatever the width.
        let named = ServeConfig {
            large: "qwen3-coder-30b-a3b@bf16".into(),
            ..Default::default()
        };
        let (_, large, names) = tiers(&named, dir.path()).unwrap();
        assert_eq!(large, "Qwen3-Coder-30B-A3B-Instruct");
        assert_eq!(names[&Tier::Large], "qwen3-coder-30b-a3b");
        assert_eq!(
            absolute_model("qwen3-coder-30b-a3b@bf16"),
            "qwen3-coder-30b-a3b@bf16"
        );
        // `laya complete --precision q4` takes the 4-bit folder; native, the bf16 one.
        let path = |name, want| {
            resolve_model_in(name, dir.path(), Some(want))
                .unwrap()
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned()
        };
        assert_eq!(
            path("qwen3-coder-30b-a3b", Precision::Q4),
            "Qwen3-Coder-30B-A3B-Instruct-4bit"
        );
        assert_eq!(
            path("qwen3-coder-30b-a3b", Precision::Native),
            "Qwen3-Coder-30B-A3B-Instruct"
        );
        // Missing and unknown variants are named with their fix.
        let missing = ServeConfig {
            large: "qwen3-coder-30b-a3b@q6".into(),
            ..Default::default()
        };
        assert_eq!(
            tiers(&missing, dir.path()).unwrap_err(),
            "model qwen3-coder-30b-a3b@q6 is not downloaded: run `laya models fetch qwen3-coder-30b-a3b@q6`"
        );
        let unknown = ServeConfig {
            small: "qwen2.5-coder-3b@q6".into(),
            ..Default::default()
        };
        let err = unknown.check_models_in(dir.path()).unwrap_err().0;
        assert!(
            err.contains("qwen2.5-coder-3b has no variant `q6`; its variants: q4, q8"),
            "{err}"
        );
    }
}
