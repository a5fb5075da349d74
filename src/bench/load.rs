//! `laya bench load`: a model's time to ready when it is converted at load, on its first start
//! (converting, writing the converted-weights cache) and on the second (reading the cache).
//! A start is what a daemon's model worker does: the load, then the warm-up. Models are
//! synthetic bf16 folders of a catalog model's shape (optionally with fewer layers, where the
//! machine's memory or disk is short), written to a scratch folder, or model files as they are;
//! the cache is a private one in the scratch folder, removed with it.

use std::{
    fmt,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use crate::{
    catalog,
    config::resolve_model,
    engine::{
        load::converted_file,
        runtime::{use_device, DevicePref},
        synthetic, LoadOptions, LocalModel, Precision,
    },
};

/// Synthetic folders are written a shard of this many bytes at a time.
const SHARD_BYTES: u64 = 2 << 30;

pub struct Config {
    /// Catalog shapes to write as synthetic bf16 folders (`qwen2.5-coder-3b`, …).
    pub synthetic: Vec<String>,
    /// Models as they are: catalog names, folders or GGUF files.
    pub models: Vec<String>,
    pub precisions: Vec<Precision>,
    pub group_size: i32,
    /// Layers kept of a synthetic shape (`None`: all of them).
    pub layers: Option<i32>,
    /// Where the synthetic folders and the converted cache are written; removed at the end.
    pub scratch: PathBuf,
    /// A GGUF file whose vocabulary the synthetic folders take.
    pub tokenizer: PathBuf,
    pub device: DevicePref,
    /// Run the warm-up a start ends with (the same on either start; on the CPU a 3B's takes
    /// minutes).
    pub warmup: bool,
}

/// One start of a model.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Start {
    /// From the start of the load to the end of the warm-up.
    pub ready_s: f64,
    /// Of which the load (reading and converting the weights).
    pub load_s: f64,
    pub from_cache: bool,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Row {
    pub model: String,
    pub synthetic: bool,
    /// Layers loaded, of the shape's.
    pub layers: Option<(i32, i32)>,
    pub precision: String,
    /// Bytes of the source's weights.
    pub source_bytes: u64,
    /// Bytes of the converted cache entry (0: none was written).
    pub cache_bytes: u64,
    pub first: Start,
    pub second: Start,
}

pub struct Report {
    pub device: String,
    pub warmup: bool,
    pub rows: Vec<Row>,
}

/// Write or find each model, then start it twice at each precision; `log` hears each step.
pub fn run(cfg: &Config, mut log: impl FnMut(&str)) -> Result<Report, String> {
    let device = use_device(cfg.device).map_err(|e| e.to_string())?;
    for s in &cfg.synthetic {
        if catalog::find(s).is_none() {
            let known: Vec<&str> = catalog::MODELS.iter().map(|m| m.name).collect();
            return Err(format!("unknown shape `{s}`; known: {}", known.join(", ")));
        }
    }
    if cfg.layers.is_some_and(|l| l < 1) {
        return Err("--layers must be at least 1".into());
    }
    let scratch = Scratch(
        cfg.scratch
            .join(format!("laya-bench-load-{}", std::process::id())),
    );
    std::fs::create_dir_all(scratch.path()).map_err(|e| format!("{}: {e}", scratch.path().display()))?;
    let mut rows = vec![];
    for name in &cfg.synthetic {
        let mut shape = catalog::find(name).expect("checked above").shape.config();
        let all = shape.num_hidden_layers;
        shape.num_hidden_layers = cfg.layers.map_or(all, |l| l.min(all));
        let dir = scratch.path().join(name);
        log(&format!(
            "writing a bf16 folder of {name}'s shape ({} of {all} layers) to {}",
            shape.num_hidden_layers,
            dir.display()
        ));
        let t = Instant::now();
        let bytes = synthetic::write_random_folder(
            &dir,
            &shape,
            synthetic::Dtype::Bfloat16,
            1,
            &cfg.tokenizer,
            SHARD_BYTES,
        )
        .map_err(|e| e.to_string())?;
        log(&format!(
            "  {:.1} GB in {:.0} s",
            bytes as f64 / 1e9,
            t.elapsed().as_secs_f64()
        ));
        let layers = Some((shape.num_hidden_layers, all));
        measure(cfg, &dir, name, true, layers, scratch.path(), &mut rows, &mut log)?;
        let _ = std::fs::remove_dir_all(&dir);
    }
    for name in &cfg.models {
        let path = resolve_model(name).map_err(|e| e.to_string())?;
        measure(cfg, &path, name, false, None, scratch.path(), &mut rows, &mut log)?;
    }
    Ok(Report {
        device,
        warmup: cfg.warmup,
        rows,
    })
}

/// The bench's own folder, removed when dropped (on an error too).
struct Scratch(PathBuf);

impl Scratch {
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Start the model at `path` twice at each precision, with the converted cache under
/// `scratch` (each entry removed once measured).
#[allow(clippy::too_many_arguments)]
fn measure(
    cfg: &Config,
    path: &Path,
    label: &str,
    synthetic: bool,
    layers: Option<(i32, i32)>,
    scratch: &Path,
    rows: &mut Vec<Row>,
    log: &mut impl FnMut(&str),
) -> Result<(), String> {
    let source_bytes = weight_bytes(path);
    for &precision in &cfg.precisions {
        let opts = LoadOptions {
            precision,
            group_size: cfg.group_size,
            use_cache: true,
            cache_dir: Some(scratch.join("converted")),
            ..LoadOptions::default()
        };
        let entry = converted_file(path, &opts);
        if let Some(e) = &entry {
            let _ = std::fs::remove_file(e);
        }
        log(&format!("{label} at {precision}: first start"));
        let first = start(path, &opts, cfg.warmup)?;
        let cache_bytes = entry
            .as_ref()
            .and_then(|e| std::fs::metadata(e).ok())
            .map_or(0, |m| m.len());
        log(&format!("{label} at {precision}: second start"));
        let second = start(path, &opts, cfg.warmup)?;
        if let Some(e) = &entry {
            let _ = std::fs::remove_file(e);
        }
        rows.push(Row {
            model: label.to_owned(),
            synthetic,
            layers,
            precision: precision.label().to_owned(),
            source_bytes,
            cache_bytes,
            first,
            second,
        });
        log(&format_row(rows.last().expect("just pushed")));
    }
    Ok(())
}

/// One start: load, warm up (with `warmup`), drop the model.
fn start(path: &Path, opts: &LoadOptions, warmup: bool) -> Result<Start, String> {
    let t = Instant::now();
    let model = LocalModel::load(path, opts).map_err(|e| e.to_string())?;
    if warmup {
        model.warmup().map_err(|e| e.to_string())?;
    }
    let secs = |d: Duration| d.as_secs_f64();
    Ok(Start {
        ready_s: secs(t.elapsed()),
        load_s: secs(model.loaded.load_time),
        from_cache: model.loaded.from_cache,
    })
}

/// Bytes of a GGUF file, or of a folder's `*.safetensors`.
fn weight_bytes(path: &Path) -> u64 {
    if !path.is_dir() {
        return std::fs::metadata(path).map_or(0, |m| m.len());
    }
    std::fs::read_dir(path)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum()
}

fn format_start(s: &Start) -> String {
    format!(
        "{:>7.1} s (load {:>6.1} s, {})",
        s.ready_s,
        s.load_s,
        if s.from_cache { "cache" } else { "no cache" }
    )
}

fn format_row(r: &Row) -> String {
    let mut model = r.model.clone();
    if let Some((n, all)) = r.layers.filter(|(n, all)| n < all) {
        model.push_str(&format!(" ({n}/{all} layers)"));
    }
    if r.synthetic {
        model.push_str(" synthetic");
    }
    format!(
        "{model:<46} {:<4} {:>7.2} GB {:>7.2} GB  {}  {}",
        r.precision,
        r.source_bytes as f64 / 1e9,
        r.cache_bytes as f64 / 1e9,
        format_start(&r.first),
        format_start(&r.second),
    )
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "time to ready ({}) on {}: the first start converts and writes the cache, the second reads it",
            if self.warmup {
                "load + warm-up"
            } else {
                "load alone: no warm-up"
            },
            self.device
        )?;
        writeln!(
            f,
            "{:<46} {:<4} {:>10} {:>10}  {:<36}  second start",
            "model", "bits", "weights", "cache", "first start"
        )?;
        for r in &self.rows {
            writeln!(f, "{}", format_row(r))?;
        }
        Ok(())
    }
}
