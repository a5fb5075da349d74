//! `laya bench quality`: masked-line cases from real code, run through the whole completion
//! pipeline (document, syntax context, prompt, engine, post-processing), scored by exact line
//! and edit similarity per language, beside another engine's answers to the same cases.
//!
//! A case is a file cut at the start of one line (after its indentation): the model sees the
//! text before and after, and the first line it produces is compared with the line that was
//! there. The case set and how it was built: `bench/quality/README.md`.

use std::{
    collections::BTreeMap,
    fmt,
    path::{Path, PathBuf},
    sync::Arc,
    time::Instant,
};

use serde::{Deserialize, Serialize};

use crate::{
    bench::{completion_settings, error_chain, Target},
    completion::pipeline::{CompletionSettings, Pipeline, Request, Trigger},
    document::Document,
    engine::{runtime::DevicePref, Cancel, Engine, ModelState},
    workspace::{Limits, WorkspaceIndex},
};

pub struct Config {
    /// JSON-lines case file (bench/quality/README.md).
    pub cases: PathBuf,
    pub target: Target,
    pub device: DevicePref,
    /// Only these languages (all when empty).
    pub languages: Vec<String>,
    /// At most this many cases per language.
    pub limit: Option<usize>,
    /// Most tokens per completion (the same for every engine compared).
    pub max_tokens: usize,
    /// Write laya's answers here (JSON), for `compare` in a later run.
    pub out: Option<PathBuf>,
    /// Another engine's answers to the same cases.
    pub compare: Option<PathBuf>,
    /// Completion settings (JSON, the LSP's `completion` section) over the bench's own.
    pub settings: Option<String>,
    /// Where repository cases' workspaces are (`<name>.tar.xz`); default: `repos/` beside
    /// the case file.
    pub repos: Option<PathBuf>,
    /// Send each case as an explicit request (the user asked: a block, the cursor being at
    /// the start of a line) instead of one made while typing.
    pub invoked: bool,
}

/// What `laya bench quality` found: the cases run, laya's answers and the other engine's.
#[derive(Debug)]
pub struct Report {
    pub cases: Vec<Case>,
    pub ours: Results,
    pub peer: Option<Results>,
}

/// Run the cases through the pipeline (`log` hears each verdict as it comes) and score them.
pub fn run(cfg: &Config, log: impl Fn(&str) + Clone + Send + 'static) -> Result<Report, String> {
    let mut all = load_cases(&cfg.cases).map_err(|e| error_chain(&e))?;
    if !cfg.languages.is_empty() {
        all.retain(|c| cfg.languages.contains(&c.language));
    }
    if let Some(limit) = cfg.limit {
        let mut seen = std::collections::HashMap::<String, usize>::new();
        all.retain(|c| {
            let n = seen.entry(c.language.clone()).or_default();
            *n += 1;
            *n <= limit
        });
    }
    if all.is_empty() {
        return Err(format!("{}: no cases left to run", cfg.cases.display()));
    }
    let peer = cfg
        .compare
        .as_deref()
        .map(load_results)
        .transpose()
        .map_err(|e| error_chain(&e))?;
    let (engine, label) = cfg.target.start(cfg.device, log.clone())?;
    // The first case is timed like the others: from a loaded, warmed-up model, as `laya serve`
    // answers once it says it is ready (the load and warm-up took 1.5 to 2 s of the first
    // case on an H100).
    let waited = std::time::Instant::now();
    while engine.state() == ModelState::Loading {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    if let ModelState::Failed(e) = engine.state() {
        return Err(format!("the model failed to load: {e}"));
    }
    log(&format!(
        "model ready after {:.1} s",
        waited.elapsed().as_secs_f64()
    ));
    let settings = completion_settings(
        serde_json::json!({ "maxTokensLine": cfg.max_tokens, "maxTokensBlock": cfg.max_tokens }),
        cfg.settings.as_deref(),
    )?;
    log(&format!(
        "{} cases from {} on {label}",
        all.len(),
        cfg.cases.display()
    ));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let total = all.len();
    let mut workspaces = match all.iter().any(|c| c.workspace.is_some()) {
        true => Some(Workspaces::new(cfg.repos.clone().unwrap_or_else(|| {
            cfg.cases.parent().unwrap_or(Path::new(".")).join("repos")
        }))?),
        false => None,
    };
    let trigger = if cfg.invoked {
        Trigger::Invoked
    } else {
        Trigger::Automatic
    };
    let tokenizer = cfg.target.tokenizer()?;
    let mut results = rt.block_on(run_cases(
        engine.clone(),
        &all,
        &settings,
        trigger,
        workspaces.as_mut(),
        |i, case, r| {
            let (exact, _) = score(&r.output, &case.expected);
            let verdict = match (&r.error, exact) {
                (Some(e), _) => format!("failed: {e}"),
                (None, true) => "exact".into(),
                (None, false) => "miss".into(),
            };
            log(&format!(
                "[{}/{total}] {} {verdict} {:.0} ms",
                i + 1,
                case.id,
                r.ms
            ));
        },
    ));
    if let ModelState::Failed(e) = engine.state() {
        return Err(format!("the model failed to load: {e}"));
    }
    // Tokens of what was shown, against the tokens decoded.
    if let Some(tok) = &tokenizer {
        for r in results.iter_mut() {
            // A text the tokenizer refuses is left uncounted rather than counted as none.
            r.kept_tokens = tok.encode(&r.output, false).ok().map(|ids| ids.len());
        }
    }
    let failed = results.iter().filter(|r| r.error.is_some()).count();
    if failed > 0 {
        log(&format!(
            "warning: {failed} of {total} completions failed (scored as misses; `error` in --out)"
        ));
    }
    let ours = Results {
        engine: "laya".into(),
        model: label,
        settings: Some(serde_json::to_value(&settings).map_err(|e| e.to_string())?),
        results,
    };
    if let Some(out) = &cfg.out {
        let text = serde_json::to_string_pretty(&ours).map_err(|e| e.to_string())?;
        std::fs::write(out, text).map_err(|e| format!("writing {}: {e}", out.display()))?;
    }
    Ok(Report {
        cases: all,
        ours,
        peer,
    })
}

/// The lines `laya bench quality` prints: the engines compared, then the table.
impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(p) = &self.peer {
            writeln!(f, "laya: {} · {}: {}", self.ours.model, p.engine, p.model)?;
        }
        f.write_str(&table(&self.cases, &self.ours, self.peer.as_ref()))?;
        for r in std::iter::once(&self.ours).chain(&self.peer) {
            writeln!(f, "{}", speed(r))?;
        }
        Ok(())
    }
}

/// One engine's request latency (p50/p99 over the cases, failures included) and, where it
/// told, the tokens its model produced per forward.
pub fn speed(r: &Results) -> String {
    let ms: Vec<f64> = r.results.iter().map(|c| c.ms).collect();
    let mut s = format!(
        "{}: request latency p50 {:.0} ms, p99 {:.0} ms over {} cases",
        r.engine,
        super::percentile(&ms, 50.0),
        super::percentile(&ms, 99.0),
        ms.len()
    );
    let tokens: usize = r.results.iter().map(|c| c.tokens).sum();
    let forwards: usize = r.results.iter().map(|c| c.forwards).sum();
    if forwards > 0 {
        s += &format!(
            "; {tokens} tokens in {forwards} forwards ({:.2} tokens per forward)",
            tokens as f64 / forwards as f64
        );
    }
    let kept: Vec<(usize, usize)> = r
        .results
        .iter()
        .filter_map(|c| c.kept_tokens.map(|k| (c.tokens, k)))
        .collect();
    if !kept.is_empty() {
        let decoded: usize = kept.iter().map(|(d, _)| d).sum();
        let shown: usize = kept.iter().map(|(_, k)| k).sum();
        let mut per: Vec<f64> = kept.iter().map(|&(d, _)| d as f64).collect();
        per.sort_by(f64::total_cmp);
        s += &format!(
            "\n{}: tokens decoded {decoded}, kept {shown} ({:.0} %); decoded per case p50 {:.0}, p99 {:.0}, max {:.0}",
            r.engine,
            100.0 * shown as f64 / decoded.max(1) as f64,
            super::percentile(&per, 50.0),
            super::percentile(&per, 99.0),
            per.last().copied().unwrap_or(0.0)
        );
    }
    if let Some(stages) = stage_medians(r) {
        s += &format!("\n{}: {stages}", r.engine);
    }
    s
}

/// The medians of each stage over the cases that carry them, and the median time outside the
/// engine: where a typical request's time goes.
pub fn stage_medians(r: &Results) -> Option<String> {
    let timed: Vec<(&CaseResult, &Stages)> = r
        .results
        .iter()
        .filter_map(|c| c.stages.as_ref().map(|s| (c, s)))
        .collect();
    if timed.is_empty() {
        return None;
    }
    let p50 = |f: &dyn Fn(&CaseResult, &Stages) -> f64| {
        super::percentile(&timed.iter().map(|(c, s)| f(c, s)).collect::<Vec<_>>(), 50.0)
    };
    Some(format!(
        "medians over {} cases: prompt {:.0} tokens ({:.0} reused, {:.0} run), prefill {:.1} ms, first token {:.1} ms, \
         decode {:.1} ms for {:.0} tokens ({:.2} ms a token: {:.2} building, {:.2} waiting), engine {:.1} ms, outside the engine {:.1} ms",
        timed.len(),
        p50(&|_, s| s.prompt_tokens as f64),
        p50(&|_, s| s.reused_tokens as f64),
        p50(&|_, s| s.prefilled_tokens as f64),
        p50(&|_, s| s.prefill_ms),
        p50(&|_, s| s.first_token_ms),
        p50(&|_, s| s.decode_ms),
        p50(&|c, _| c.tokens as f64),
        p50(&|c, s| if c.tokens > 1 { s.decode_ms / (c.tokens - 1) as f64 } else { 0.0 }),
        p50(&|c, s| if c.tokens > 1 { s.decode_build_ms / (c.tokens - 1) as f64 } else { 0.0 }),
        p50(&|c, s| if c.tokens > 1 { s.decode_wait_ms / (c.tokens - 1) as f64 } else { 0.0 }),
        p50(&|_, s| s.engine_ms),
        p50(&|c, s| (c.ms - s.engine_ms).max(0.0)),
    ))
}

#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Case {
    pub id: String,
    /// LSP language id (`python`, `rust`, `typescript`, `go`, `c`, `java`, …).
    pub language: String,
    #[serde(default)]
    pub source: String,
    pub file_name: String,
    pub prefix: String,
    pub suffix: String,
    pub expected: String,
    /// Repository cases: the workspace (`<repos>/<workspace>.tar.xz`, its files under
    /// `<workspace>/`) and the file's path in it. The file on disk still holds the masked
    /// line; the case's text is what the editor holds, and the index reads that instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// The workspaces of repository cases, each unpacked once into a scratch folder (removed on
/// drop) and indexed.
pub struct Workspaces {
    repos: PathBuf,
    scratch: PathBuf,
    indexes: std::collections::HashMap<String, Arc<WorkspaceIndex>>,
}

impl Workspaces {
    pub fn new(repos: PathBuf) -> Result<Workspaces, String> {
        let scratch = std::env::temp_dir().join(format!("laya-bench-repos-{}", std::process::id()));
        std::fs::create_dir_all(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
        Ok(Workspaces {
            repos,
            scratch,
            indexes: Default::default(),
        })
    }

    /// The index of workspace `name`, unpacked and built on first use.
    pub fn get(&mut self, name: &str) -> Result<Arc<WorkspaceIndex>, String> {
        if let Some(i) = self.indexes.get(name) {
            return Ok(i.clone());
        }
        if name.is_empty() || name.contains(['/', '\\', '.']) {
            return Err(format!("workspace {name:?}: not a plain name"));
        }
        let archive = self.repos.join(format!("{name}.tar.xz"));
        let status = std::process::Command::new("tar")
            .arg("-xJf")
            .arg(&archive)
            .arg("-C")
            .arg(&self.scratch)
            .status()
            .map_err(|e| format!("running tar: {e}"))?;
        if !status.success() {
            return Err(format!("unpacking {}: tar {status}", archive.display()));
        }
        let index = Arc::new(WorkspaceIndex::new(
            vec![self.scratch.join(name)],
            Limits::default(),
        ));
        index.build(2, |_, _| {});
        self.indexes.insert(name.to_owned(), index.clone());
        Ok(index)
    }
}

impl Drop for Workspaces {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.scratch);
    }
}

/// One engine's answer to one case.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct CaseResult {
    pub id: String,
    /// The completion as inserted at the cursor (empty when it failed).
    pub output: String,
    #[serde(default)]
    pub ms: f64,
    /// Why the completion failed, where it did: a failure scores as a miss, and is told apart
    /// from an empty answer here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Every edit the pipeline returned, best first (the first is `output`), with where it
    /// came from: recorded when there is more than one or they carry log-probabilities, so
    /// that other rankings can be scored from one run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alternatives: Vec<Alternative>,
    /// Tokens the model generated for this case, and the forwards that gave them (the
    /// prompt's last included; fewer than the tokens when drafts were accepted). Zero for
    /// answers made elsewhere.
    #[serde(default)]
    pub tokens: usize,
    #[serde(default)]
    pub forwards: usize,
    /// Tokens of the text shown (the model's tokenizer), where the bench had it: what of the
    /// tokens decoded was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_tokens: Option<usize>,
    /// Where the request's time went, for answers this engine made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stages: Option<Stages>,
}

/// Where one case's request time went: the prompt and the engine's share of it; the rest of
/// `ms` was spent outside the engine (context, prompt building, post-processing, queueing).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct Stages {
    pub prompt_tokens: usize,
    /// Prompt tokens taken from the prefix store (no compute).
    pub reused_tokens: usize,
    /// Prompt tokens run through the model.
    pub prefilled_tokens: usize,
    pub prefill_ms: f64,
    /// From the engine's start to the first token read back.
    pub first_token_ms: f64,
    pub decode_ms: f64,
    /// Of `decode_ms`: building and queueing the forwards on the host, and waiting for
    /// their tokens.
    #[serde(default)]
    pub decode_build_ms: f64,
    #[serde(default)]
    pub decode_wait_ms: f64,
    /// The engine's whole time (tokenizing, prefill, decode, detokenizing).
    pub engine_ms: f64,
}

impl Stages {
    pub fn of(t: &crate::engine::Timing) -> Stages {
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        Stages {
            prompt_tokens: t.prompt_tokens,
            reused_tokens: t.reused_tokens,
            prefilled_tokens: t.prefilled_tokens,
            prefill_ms: ms(t.prefill),
            first_token_ms: ms(t.first_token),
            decode_ms: ms(t.decode),
            decode_build_ms: ms(t.decode_build),
            decode_wait_ms: ms(t.decode_wait),
            engine_ms: ms(t.total),
        }
    }
}

/// One of the pipeline's edits for a case.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Alternative {
    pub text: String,
    /// Its index among the engine's choices (0 is greedy when the first token branches).
    pub choice: usize,
    pub tokens: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprob: Option<f32>,
}

/// An engine's answers to a case set, as `--out` writes and `--compare` reads them.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Results {
    pub engine: String,
    #[serde(default)]
    pub model: String,
    /// The completion settings the answers were made with (laya's runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<serde_json::Value>,
    pub results: Vec<CaseResult>,
}

#[derive(Debug, thiserror::Error)]
pub enum QualityError {
    #[error("{file}:{line}: {msg}")]
    Case { file: String, line: usize, msg: String },
    #[error("{file}: {source}")]
    Io { file: String, source: std::io::Error },
    #[error("{file}: {source}")]
    Json { file: String, source: serde_json::Error },
}

/// Read a JSON-lines case file.
pub fn load_cases(path: &Path) -> Result<Vec<Case>, QualityError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| QualityError::Io {
        file: file.clone(),
        source,
    })?;
    let mut cases = vec![];
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let case: Case = serde_json::from_str(line).map_err(|e| QualityError::Case {
            file: file.clone(),
            line: i + 1,
            msg: e.to_string(),
        })?;
        if case.expected.contains('\n') {
            return Err(QualityError::Case {
                file: file.clone(),
                line: i + 1,
                msg: format!("case {}: expected must be one line", case.id),
            });
        }
        cases.push(case);
    }
    Ok(cases)
}

pub fn load_results(path: &Path) -> Result<Results, QualityError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| QualityError::Io {
        file: file.clone(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| QualityError::Json { file, source })
}

/// The line a completion produced: its first line, trailing whitespace trimmed.
pub fn first_line(output: &str) -> &str {
    output.split('\n').next().unwrap_or("").trim_end()
}

/// (exact line, edit similarity in [0, 1]) of an output against the expected line.
pub fn score(output: &str, expected: &str) -> (bool, f64) {
    let got = first_line(output);
    let want = expected.trim_end();
    (got == want, strsim::normalized_levenshtein(got, want))
}

/// Run every case through the pipeline on `engine`, one at a time, greedy.
pub async fn run_cases(
    engine: Arc<dyn Engine>,
    cases: &[Case],
    settings: &CompletionSettings,
    trigger: Trigger,
    mut workspaces: Option<&mut Workspaces>,
    mut progress: impl FnMut(usize, &Case, &CaseResult),
) -> Vec<CaseResult> {
    let pipeline = Pipeline::new(engine);
    let mut out = Vec::with_capacity(cases.len());
    for (i, case) in cases.iter().enumerate() {
        let text = format!("{}{}", case.prefix, case.suffix);
        // A repository case: its file in its unpacked workspace, indexed with the case's text.
        let mut repo: Option<(Arc<WorkspaceIndex>, PathBuf, String)> = None;
        let mut failure = None;
        if let (Some(ws), Some(name), Some(path)) = (workspaces.as_deref_mut(), &case.workspace, &case.path) {
            match ws.get(name) {
                Ok(index) => {
                    let root = index.roots()[0].clone();
                    let file = root.join(path);
                    index.update(&file, &text);
                    repo = Some((index, file, format!("file://{}", root.display())));
                }
                Err(e) => failure = Some(e),
            }
        }
        let uri = match &repo {
            Some((_, file, _)) => format!("file://{}", file.display()),
            None => format!("file:///{}", case.file_name),
        };
        let doc = Document::new(&text, 1, &case.language).snapshot(&uri);
        let start = Instant::now();
        let completion = match failure {
            Some(e) => Err(crate::engine::EngineError::Unavailable(e)),
            None => {
                pipeline
                    .complete(
                        Request {
                            doc: &doc,
                            others: &[],
                            cursor: case.prefix.len(),
                            trigger,
                            settings,
                            workspace_root: repo.as_ref().map(|(_, _, root)| root.as_str()),
                            workspace: repo.as_ref().map(|(index, _, _)| &**index),
                        },
                        Cancel::new(),
                    )
                    .await
            }
        };
        // The file as on disk again, for the cases of other files.
        if let Some((index, file, _)) = &repo {
            index.reload(file);
        }
        let (mut tokens, mut forwards, mut stages) = (0, 0, None);
        let (output, error, alternatives) = match completion {
            Ok(c) => {
                (tokens, forwards) = (c.timing.generated_tokens, c.timing.forwards());
                // A typed-through answer or a remote one has no engine time to split.
                stages = (c.timing.total > std::time::Duration::ZERO).then(|| Stages::of(&c.timing));
                let output = c.edits.first().map(|e| e.text.clone()).unwrap_or_default();
                let alternatives = if c.edits.len() > 1 || c.origins.iter().any(|o| o.logprob.is_some()) {
                    c.edits
                        .iter()
                        .zip(&c.origins)
                        .map(|(e, o)| Alternative {
                            text: e.text.clone(),
                            choice: o.choice,
                            tokens: o.tokens,
                            logprob: o.logprob,
                        })
                        .collect()
                } else {
                    vec![]
                };
                (output, None, alternatives)
            }
            Err(e) => {
                tracing::warn!(case = case.id, "completion failed: {e}");
                (String::new(), Some(e.to_string()), vec![])
            }
        };
        let r = CaseResult {
            id: case.id.clone(),
            output,
            ms: start.elapsed().as_secs_f64() * 1e3,
            error,
            alternatives,
            tokens,
            forwards,
            kept_tokens: None,
            stages,
        };
        progress(i, case, &r);
        out.push(r);
    }
    out
}

/// Per-language totals for one engine.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Scores {
    pub cases: usize,
    pub exact: usize,
    pub similarity_sum: f64,
}

impl Scores {
    pub fn exact_rate(&self) -> f64 {
        if self.cases == 0 {
            0.0
        } else {
            self.exact as f64 / self.cases as f64
        }
    }

    pub fn similarity(&self) -> f64 {
        if self.cases == 0 {
            0.0
        } else {
            self.similarity_sum / self.cases as f64
        }
    }
}

/// Scores per language (and `all`) of `results` on `cases`; a case without a result counts
/// as a miss.
pub fn tally(cases: &[Case], results: &[CaseResult]) -> BTreeMap<String, Scores> {
    let by_id: std::collections::HashMap<&str, &CaseResult> =
        results.iter().map(|r| (r.id.as_str(), r)).collect();
    let mut table: BTreeMap<String, Scores> = BTreeMap::new();
    for case in cases {
        let (exact, sim) = by_id
            .get(case.id.as_str())
            .map(|r| score(&r.output, &case.expected))
            .unwrap_or((false, 0.0));
        for key in [case.language.as_str(), "all"] {
            let s = table.entry(key.to_owned()).or_default();
            s.cases += 1;
            s.exact += exact as usize;
            s.similarity_sum += sim;
        }
    }
    table
}

/// The side-by-side table: per language, laya's and the peer's exact-line rate and edit
/// similarity, and the ratio of exact-line rates.
pub fn table(cases: &[Case], ours: &Results, peer: Option<&Results>) -> String {
    use std::fmt::Write;
    let a = tally(cases, &ours.results);
    let b = peer.map(|p| tally(cases, &p.results));
    let mut s = String::new();
    let peer_name = peer.map(|p| p.engine.as_str()).unwrap_or("-");
    let _ = writeln!(
        s,
        "| language | cases | {} exact | {} similarity | {peer_name} exact | {peer_name} similarity | exact ratio |",
        ours.engine, ours.engine
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|");
    let mut langs: Vec<&String> = a.keys().filter(|k| *k != "all").collect();
    let all = "all".to_owned();
    langs.push(&all);
    for lang in langs {
        let x = &a[lang];
        let (pe, ps, ratio) = match b.as_ref().and_then(|b| b.get(lang)) {
            Some(y) => (
                format!("{:.1} %", 100.0 * y.exact_rate()),
                format!("{:.3}", y.similarity()),
                if y.exact == 0 {
                    if x.exact == 0 {
                        "—".to_owned()
                    } else {
                        "∞".to_owned()
                    }
                } else {
                    format!("{:.2}×", x.exact_rate() / y.exact_rate())
                },
            ),
            None => ("—".into(), "—".into(), "—".into()),
        };
        let _ = writeln!(
            s,
            "| {lang} | {} | {:.1} % | {:.3} | {pe} | {ps} | {ratio} |",
            x.cases,
            100.0 * x.exact_rate(),
            x.similarity()
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(id: &str, lang: &str, expected: &str) -> Case {
        Case {
            id: id.into(),
            language: lang.into(),
            source: String::new(),
            file_name: "f".into(),
            prefix: String::new(),
            suffix: String::new(),
            expected: expected.into(),
            workspace: None,
            path: None,
        }
    }

    fn result(id: &str, output: &str) -> CaseResult {
        CaseResult {
            id: id.into(),
            output: output.into(),
            ms: 0.0,
            error: None,
            alternatives: vec![],
            tokens: 0,
            forwards: 0,
            kept_tokens: None,
            stages: None,
        }
    }

    #[test]
    fn stage_medians_split_a_request_and_leave_out_answers_without_an_engine_time() {
        let timed = |id: &str, ms: f64, prefill: f64, decode: f64, tokens: usize| CaseResult {
            ms,
            tokens,
            stages: Some(Stages {
                prompt_tokens: 1000,
                reused_tokens: 400,
                prefilled_tokens: 600,
                prefill_ms: prefill,
                first_token_ms: prefill + 1.0,
                decode_ms: decode,
                decode_build_ms: decode / 4.0,
                decode_wait_ms: decode / 2.0,
                engine_ms: prefill + 1.0 + decode,
            }),
            ..result(id, "x")
        };
        let r = Results {
            engine: "laya".into(),
            model: String::new(),
            settings: None,
            results: vec![
                timed("a", 40.0, 10.0, 20.0, 11),
                timed("b", 60.0, 20.0, 30.0, 11),
                timed("c", 90.0, 30.0, 40.0, 11),
                result("typed", "y"),
            ],
        };
        let m = stage_medians(&r).unwrap();
        assert!(
            m.starts_with("medians over 3 cases: prompt 1000 tokens (400 reused, 600 run)"),
            "{m}"
        );
        assert!(
            m.contains(
                "prefill 20.0 ms, first token 21.0 ms, decode 30.0 ms for 11 tokens \
                 (3.00 ms a token: 0.75 building, 1.50 waiting)"
            ),
            "{m}"
        );
        // 60 - 51 = 9 ms outside the engine for the median case.
        assert!(m.contains("engine 51.0 ms, outside the engine 9.0 ms"), "{m}");
        assert!(stage_medians(&Results {
            results: vec![result("a", "x")],
            ..r
        })
        .is_none());
    }

    #[test]
    fn scoring_uses_the_first_line_without_trailing_space() {
        assert_eq!(score("return a + b  \n    x", "return a + b"), (true, 1.0));
        let (exact, sim) = score("return a - b", "return a + b");
        assert!(!exact);
        assert!((sim - (1.0 - 1.0 / 12.0)).abs() < 1e-9, "{sim}");
        assert_eq!(score("", "x = 1"), (false, 0.0));
        // Leading whitespace is part of the line: the cursor sits after the indentation.
        assert!(!score(" x = 1", "x = 1").0);
    }

    #[test]
    fn tally_counts_missing_results_as_misses_per_language_and_overall() {
        let cases = [
            case("a", "python", "x = 1"),
            case("b", "python", "y = 2"),
            case("c", "rust", "let z = 3;"),
        ];
        let results = [result("a", "x = 1\n"), result("c", "let z = 4;")];
        let t = tally(&cases, &results);
        assert_eq!((t["python"].cases, t["python"].exact), (2, 1));
        assert_eq!((t["rust"].cases, t["rust"].exact), (1, 0));
        assert_eq!((t["all"].cases, t["all"].exact), (3, 1));
        assert!((t["python"].similarity() - 0.5).abs() < 1e-9);
    }

    #[test]
    fn table_shows_the_ratio_of_exact_rates() {
        let cases = [case("a", "go", "x := 1"), case("b", "go", "y := 2")];
        let ours = Results {
            engine: "laya".into(),
            model: String::new(),
            settings: None,
            results: vec![result("a", "x := 1"), result("b", "y := 2")],
        };
        let peer = Results {
            engine: "llama.cpp".into(),
            model: String::new(),
            settings: None,
            results: vec![result("a", "x := 1"), result("b", "nope")],
        };
        let t = table(&cases, &ours, Some(&peer));
        assert!(t.contains("| go | 2 | 100.0 % | 1.000 | 50.0 % |"), "{t}");
        assert!(t.contains("2.00×"), "{t}");
    }

    struct Failing;

    #[async_trait::async_trait]
    impl Engine for Failing {
        async fn complete(
            &self,
            _: crate::engine::CompletionRequest,
            _: Cancel,
            _: Option<crate::engine::PieceSender>,
        ) -> Result<crate::engine::CompletionOutput, crate::engine::EngineError> {
            Err(crate::engine::EngineError::Unavailable(
                "the model is gone".into(),
            ))
        }

        fn state(&self) -> crate::engine::ModelState {
            crate::engine::ModelState::ready_on("test")
        }
    }

    #[tokio::test]
    async fn failed_completions_are_recorded_as_failures_not_as_empty_answers() {
        let mut c = case("a", "python", "x = 1");
        c.prefix = "def f():\n    ".into();
        let settings = CompletionSettings {
            debounce_ms: Some(0),
            ..CompletionSettings::default()
        };
        let results = run_one(Arc::new(Failing), c, &settings).await;
        assert_eq!(results[0].output, "");
        let err = results[0].error.as_deref().unwrap_or_default();
        assert!(err.contains("the model is gone"), "{err}");
        let json = serde_json::to_string(&results[0]).unwrap();
        assert!(json.contains("\"error\""), "{json}");
        let ok = serde_json::to_string(&result("b", "y")).unwrap();
        assert!(!ok.contains("error"), "no error field when there was none: {ok}");
    }

    /// Answers three branched choices with log-probabilities: greedy, then two in the
    /// engine's order that their sums reverse.
    struct Branched;

    #[async_trait::async_trait]
    impl Engine for Branched {
        async fn complete(
            &self,
            req: crate::engine::CompletionRequest,
            _: Cancel,
            _: Option<crate::engine::PieceSender>,
        ) -> Result<crate::engine::CompletionOutput, crate::engine::EngineError> {
            assert!(req.branch_first && req.n == 3, "{req:?}");
            let choice = |text: &str, tokens, logprob| crate::engine::Choice {
                text: text.into(),
                finish_reason: crate::engine::FinishReason::StopToken,
                tokens,
                logprob: Some(logprob),
            };
            Ok(crate::engine::CompletionOutput {
                served_by: None,
                choices: vec![
                    choice("x = 1", 3, -3.0),
                    choice("z = 3", 2, -5.0),
                    choice("y = 22", 2, -4.0),
                ],
                timing: Default::default(),
            })
        }

        fn state(&self) -> crate::engine::ModelState {
            Failing.state()
        }
    }

    /// One automatic request for `case` through the bench's loop.
    async fn run_one(engine: Arc<dyn Engine>, case: Case, settings: &CompletionSettings) -> Vec<CaseResult> {
        run_cases(engine, &[case], settings, Trigger::Automatic, None, |_, _, _| {}).await
    }

    #[tokio::test]
    async fn branched_runs_record_every_edit_with_its_origin() {
        let mut c = case("a", "python", "x = 1");
        c.prefix = "def f():\n    ".into();
        let settings = CompletionSettings {
            debounce_ms: Some(0),
            candidates: 3,
            ..CompletionSettings::default()
        };
        let results = run_one(Arc::new(Branched), c, &settings).await;
        let r = &results[0];
        assert_eq!(r.output, "x = 1", "greedy first");
        let got: Vec<(&str, usize, usize, Option<f32>)> = r
            .alternatives
            .iter()
            .map(|a| (a.text.as_str(), a.choice, a.tokens, a.logprob))
            .collect();
        assert_eq!(
            got,
            [
                ("x = 1", 0, 3, Some(-3.0)),
                ("y = 22", 2, 2, Some(-4.0)),
                ("z = 3", 1, 2, Some(-5.0))
            ]
        );
        let json = serde_json::to_string(&result("b", "y")).unwrap();
        assert!(
            !json.contains("alternatives"),
            "none recorded for a plain answer: {json}"
        );
    }

    #[test]
    fn case_files_with_bad_lines_name_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("cases.jsonl");
        std::fs::write(&p, "{\"id\":\"a\"}\n").unwrap();
        let err = load_cases(&p).unwrap_err().to_string();
        assert!(err.contains("cases.jsonl:1:"), "{err}");
    }
}
