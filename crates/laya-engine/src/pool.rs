//! A pool of models by tier and bit width: one [`Engine`] that sends each request to the model
//! its `model` key names, loading that model on first use. While the model asked for is still
//! loading, a model already loaded answers instead (the same tier first, then the default), and
//! while nothing is loaded a request for the large tier waits for the small one, never for the
//! large one's longer load; `served_by` tells which one answered ([`ModelPool::resolve`]).

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, Mutex},
};

use crate::{
    cancel::Cancel,
    family::Family,
    load::LoadOptions,
    prefix::PrefixLimits,
    remote::{RemoteConfig, RemoteEngine},
    runtime::DevicePref,
    seam::{
        CompletionOutput, CompletionRequest, Engine, EngineError, ModelFacts, ModelKey, ModelState,
        PieceSender, Precision, RunsOn, Tier, WorkStats,
    },
    worker::{Loader, ModelWorker},
};

/// Where a tier's model comes from.
#[derive(Clone, Debug)]
pub enum TierSource {
    /// A GGUF file or safetensors folder, loaded here at the precision a request asks for.
    Local { path: PathBuf, group_size: i32 },
    /// An OpenAI-compatible server; the bit width is the server's business.
    Remote(RemoteConfig),
}

#[derive(Clone, Debug)]
pub struct PoolConfig {
    pub tiers: HashMap<Tier, TierSource>,
    /// The model for requests without a key; loaded at start.
    pub default: ModelKey,
    /// Also loaded at start.
    pub preload: Vec<ModelKey>,
    pub device: DevicePref,
    pub prefix: PrefixLimits,
    /// Drafts for decoding on local models.
    pub speculation: crate::draft::SpeculationChoice,
    /// Read and write the converted-weights cache.
    pub use_cache: bool,
    /// How local models are made from their paths.
    pub loader: Loader,
}

/// Hears (model, state) on every change of any model of the pool.
pub(crate) type PoolReport = Arc<dyn Fn(ModelKey, &ModelState) + Send + Sync>;

pub struct ModelPool {
    config: PoolConfig,
    engines: Mutex<HashMap<ModelKey, Started>>,
    report: PoolReport,
    /// Parameter counts and prompt families read from model files' headers, by path (read
    /// once, before loading).
    file_facts: Mutex<HashMap<PathBuf, crate::load::FileFacts>>,
    /// Where local models run: the device preference, `auto` resolved once (a flag query of
    /// the linked MLX, no device work).
    local_runs_on: RunsOn,
}

/// A model started by the pool; a local one with its source's [`stamp`] at the start.
struct Started {
    engine: Arc<dyn Engine>,
    stamp: Option<Stamp>,
}

/// What tells that a model's files changed on disk: (size, modification time, inode) of the
/// file, or of each entry of a folder; empty when the path does not exist.
type Stamp = Vec<(u64, Option<std::time::SystemTime>, u64)>;

fn stamp(path: &std::path::Path) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    let one = |m: std::fs::Metadata| (m.len(), m.modified().ok(), m.ino());
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => {
            let mut v: Stamp = std::fs::read_dir(path)
                .map(|d| d.flatten().filter_map(|e| e.metadata().ok()).map(one).collect())
                .unwrap_or_default();
            v.sort();
            v
        }
        Ok(m) => vec![one(m)],
        Err(_) => vec![],
    }
}

impl ModelPool {
    /// Start loading the default model and the preloads.
    pub fn new(config: PoolConfig, report: PoolReport) -> Result<ModelPool, EngineError> {
        if !config.tiers.contains_key(&config.default.tier) {
            return Err(EngineError::BadRequest(format!(
                "the default model {} has no source",
                config.default
            )));
        }
        let pool = ModelPool {
            engines: Mutex::new(HashMap::new()),
            report,
            file_facts: Mutex::new(HashMap::new()),
            local_runs_on: match config.device {
                DevicePref::Cpu => RunsOn::Cpu,
                DevicePref::Gpu => RunsOn::Gpu,
                DevicePref::Auto if crate::runtime::MlxInfo::probe().gpu_kind.is_some() => RunsOn::Gpu,
                DevicePref::Auto => RunsOn::Cpu,
            },
            config,
        };
        let mut start = vec![pool.config.default];
        start.extend(pool.config.preload.iter().copied());
        for key in start {
            pool.engine(key)?;
        }
        Ok(pool)
    }

    pub fn config(&self) -> &PoolConfig {
        &self.config
    }

    /// The bit width of a remote tier is fixed by its server, and a folder quantized as stored
    /// cannot gain bits (asked for its own or more, it loads as stored): keys differing only
    /// in such bits are one model, not copies.
    fn canonical(&self, key: ModelKey) -> ModelKey {
        let fixed = match self.config.tiers.get(&key.tier) {
            Some(TierSource::Remote(_)) => true,
            Some(TierSource::Local { path, .. }) => {
                match (self.file_facts(path).stored_bits, key.precision.bits()) {
                    (Some(stored), Some(asked)) => asked as u32 >= stored,
                    (Some(_), None) => true,
                    (None, _) => false,
                }
            }
            None => false,
        };
        match fixed {
            true => ModelKey {
                tier: key.tier,
                precision: Precision::Native,
            },
            false => key,
        }
    }

    /// What the model file at `path` tells before it loads, read once (asked at every
    /// request: a lookup, no copy of the path once it is known).
    fn file_facts(&self, path: &std::path::Path) -> crate::load::FileFacts {
        let mut known = self.file_facts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(facts) = known.get(path) {
            return *facts;
        }
        *known
            .entry(path.to_owned())
            .or_insert_with(|| crate::load::facts_in(path))
    }

    /// The engine of `key`, started (loading) if it was not yet. A local model that failed to
    /// load is started again once its files changed (fetched again, replaced): the fix of a
    /// missing or broken file needs no restart.
    fn engine(&self, key: ModelKey) -> Result<Arc<dyn Engine>, EngineError> {
        let key = self.canonical(key);
        let mut engines = self.engines.lock().unwrap_or_else(|p| p.into_inner());
        let source = self.config.tiers.get(&key.tier);
        if let Some(s) = engines.get(&key) {
            let retry = match (&s.stamp, source) {
                (Some(old), Some(TierSource::Local { path, .. })) => {
                    matches!(s.engine.state(), ModelState::Failed(_)) && *old != stamp(path)
                }
                _ => false,
            };
            if !retry {
                return Ok(s.engine.clone());
            }
            tracing::info!(model = %key, "the model's files changed since it failed to load: loading it again");
        }
        let source = source.ok_or_else(|| {
            EngineError::Unavailable(format!("no {} model is configured", key.tier.label()))
        })?;
        let mut source_stamp = None;
        let engine: Arc<dyn Engine> = match source {
            TierSource::Local { path, group_size } => {
                source_stamp = Some(stamp(path));
                let opts = LoadOptions {
                    precision: key.precision,
                    group_size: *group_size,
                    use_cache: self.config.use_cache,
                    cache_dir: None,
                    progress: false,
                    prefix: self.config.prefix,
                    speculation: self.config.speculation,
                };
                let report = self.report.clone();
                Arc::new(ModelWorker::spawn_with(
                    path.clone(),
                    opts,
                    self.config.device,
                    self.config.loader.clone(),
                    move |s| report(key, s),
                ))
            }
            TierSource::Remote(cfg) => {
                let e = RemoteEngine::new(cfg.clone());
                (self.report)(key, &e.state());
                Arc::new(e)
            }
        };
        engines.insert(
            key,
            Started {
                engine: engine.clone(),
                stamp: source_stamp,
            },
        );
        Ok(engine)
    }

    /// The engine started for `key` (as the pool keys it), if any; starts nothing.
    fn started(&self, key: ModelKey) -> Option<Arc<dyn Engine>> {
        let engines = self.engines.lock().unwrap_or_else(|p| p.into_inner());
        engines.get(&key).map(|s| s.engine.clone())
    }

    /// Every model started so far, with its state.
    pub fn states(&self) -> Vec<(ModelKey, ModelState)> {
        let engines = self.engines.lock().unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<_> = engines.iter().map(|(k, s)| (*k, s.engine.state())).collect();
        v.sort_by_key(|(k, _)| (k.tier as u8, k.precision.label()));
        v
    }

    /// The model a request for `want` asks for: `want` as the pool keys it (bits a tier cannot
    /// have dropped), or the default for a tier not configured. Another answers only while it
    /// loads ([`ModelPool::resolve`]).
    pub fn asked(&self, want: ModelKey) -> ModelKey {
        self.canonical(if self.config.tiers.contains_key(&want.tier) {
            want
        } else {
            self.config.default
        })
    }

    /// The model that will answer a request for `want`: itself once loaded (or failed);
    /// while it loads, a ready one of the same tier, else the default if ready, else any ready
    /// one; with none ready, for a large-tier model, a small-tier one loading too (the default
    /// first: the small model is ready sooner); else itself (the request waits for it).
    pub fn resolve(&self, want: ModelKey) -> Result<(ModelKey, Arc<dyn Engine>), EngineError> {
        let want = self.asked(want);
        let engine = self.engine(want)?;
        if !matches!(engine.state(), ModelState::Loading) {
            return Ok((want, engine));
        }
        let default = self.canonical(self.config.default);
        let states = self.states();
        let of = |state: fn(&ModelState) -> bool| -> Vec<ModelKey> {
            states.iter().filter(|(_, s)| state(s)).map(|(k, _)| *k).collect()
        };
        let ready = of(|s| matches!(s, ModelState::Ready { .. }));
        let loading = of(|s| matches!(s, ModelState::Loading));
        let small_loading = |k: &&ModelKey| k.tier == Tier::Small && want.tier == Tier::Large;
        let stand_in = ready
            .iter()
            .find(|k| k.tier == want.tier)
            .or_else(|| ready.iter().find(|k| **k == default))
            .or_else(|| ready.first())
            .or_else(|| loading.iter().filter(small_loading).find(|k| **k == default))
            .or_else(|| loading.iter().find(small_loading))
            .copied();
        match stand_in {
            Some(k) => Ok((k, self.engine(k)?)),
            None => Ok((want, engine)),
        }
    }
}

#[async_trait::async_trait]
impl Engine for ModelPool {
    async fn complete(
        &self,
        req: CompletionRequest,
        cancel: Cancel,
        pieces: Option<PieceSender>,
    ) -> Result<CompletionOutput, EngineError> {
        let (key, engine) = self.resolve(req.model.unwrap_or(self.config.default))?;
        let mut out = engine.complete(req, cancel, pieces).await?;
        out.served_by = Some(key);
        Ok(out)
    }

    fn state(&self) -> ModelState {
        match self.engine(self.config.default) {
            Ok(e) => e.state(),
            Err(e) => ModelState::Failed(e.to_string()),
        }
    }

    /// What is known of the model behind `model` before a request goes to it (starts
    /// nothing): for a local tier its parameter count (the loaded model's, else its file
    /// header's), the bit width and the device it runs on; for a remote tier what its server
    /// said. `None` for a tier not configured.
    fn facts(&self, model: ModelKey) -> Option<ModelFacts> {
        let key = self.canonical(model);
        let bits = key.precision.bits().map_or(16, |b| b as u32);
        let loaded = || self.started(key)?.facts(key)?.parameters;
        match self.config.tiers.get(&key.tier)? {
            TierSource::Remote(_) => Some(ModelFacts {
                parameters: loaded(),
                active_parameters: None,
                bits,
                runs_on: RunsOn::Remote,
                family: Family::default(),
            }),
            TierSource::Local { path, .. } => {
                let file = self.file_facts(path);
                Some(ModelFacts {
                    parameters: loaded().or(file.parameters),
                    active_parameters: file.active_parameters,
                    bits: match key.precision {
                        Precision::Native => file.stored_bits.unwrap_or(bits),
                        _ => bits,
                    },
                    runs_on: self.local_runs_on,
                    family: file.family.unwrap_or_default(),
                })
            }
        }
    }

    /// What the worker of the local model behind `model` has run (starts nothing).
    fn work(&self, model: ModelKey) -> Option<WorkStats> {
        let key = self.canonical(model);
        self.started(key)?.work(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote_pool() -> ModelPool {
        let mut tiers = HashMap::new();
        tiers.insert(
            Tier::Large,
            TierSource::Remote(RemoteConfig::new("http://127.0.0.1:9/v1")),
        );
        let seen = Arc::new(Mutex::new(vec![]));
        let log = seen.clone();
        ModelPool::new(
            PoolConfig {
                tiers,
                default: ModelKey {
                    tier: Tier::Large,
                    precision: Precision::Q6,
                },
                preload: vec![],
                device: DevicePref::Auto,
                prefix: PrefixLimits::default(),
                speculation: Default::default(),
                use_cache: true,
                loader: Loader::default(),
            },
            Arc::new(move |k, s| log.lock().unwrap().push((k, s.clone()))),
        )
        .unwrap()
    }

    #[test]
    fn remote_tiers_ignore_bits_and_unknown_tiers_fall_back_to_the_default() {
        let pool = remote_pool();
        let (k, _) = pool
            .resolve(ModelKey {
                tier: Tier::Large,
                precision: Precision::Q8,
            })
            .unwrap();
        assert_eq!((k.tier, k.precision), (Tier::Large, Precision::Native));
        // No small model configured: the default answers.
        let (k, _) = pool
            .resolve(ModelKey {
                tier: Tier::Small,
                precision: Precision::Q4,
            })
            .unwrap();
        assert_eq!(k.tier, Tier::Large);
        assert_eq!(pool.states().len(), 1);
        // What the pool says of the remote tier is one answer whatever the bits asked; it
        // runs nothing here, and a tier not configured has no answer.
        let key = |tier, precision| ModelKey { tier, precision };
        let facts = pool.facts(key(Tier::Large, Precision::Q8)).unwrap();
        assert_eq!(pool.facts(key(Tier::Large, Precision::Q4)), Some(facts));
        assert_eq!(facts.runs_on, RunsOn::Remote);
        assert_eq!(pool.work(key(Tier::Large, Precision::Q8)), None);
        assert_eq!(pool.facts(key(Tier::Small, Precision::Q4)), None);
    }

    #[test]
    fn a_default_without_a_source_is_an_error() {
        let err = ModelPool::new(
            PoolConfig {
                tiers: HashMap::new(),
                default: ModelKey {
                    tier: Tier::Small,
                    precision: Precision::Q8,
                },
                preload: vec![],
                device: DevicePref::Auto,
                prefix: PrefixLimits::default(),
                speculation: Default::default(),
                use_cache: true,
                loader: Loader::default(),
            },
            Arc::new(|_, _| {}),
        )
        .err()
        .unwrap();
        assert!(err.to_string().contains("small/q8"), "{err}");
    }
}
