//! The seam: the types every engine shares with its callers, and nothing else. `Engine` is
//! what the completion pipeline calls; the in-process worker, the model pool, a remote server
//! and laya's daemon client implement it. A request is a [`CompletionRequest`] (a prompt string,
//! sampling, stop rules), an answer a [`CompletionOutput`] (texts with a [`Timing`]), a failure
//! an [`EngineError`] by what the caller can do about it.
//!
//! Boundary: this file is the bottom of the crate. It depends only on plain data of its own
//! kind (`Cancel`, `Family`) and on no loading, model or MLX code, so every other module may
//! import it and it imports none of them back. The conversions of the engine's inner errors
//! into [`EngineError`] live beside those errors.
//!
//! Start with [`Engine`], then [`CompletionRequest`] and [`CompletionOutput`].

use std::time::Duration;

use crate::{cancel::Cancel, family::Family};

/// Why an engine gave no answer, by what the caller can do about it: the seam's one error
/// type. The daemon's HTTP API maps each kind to a status code (`Cancelled` 499, `Unavailable`
/// 503, `Transport` 502, `BadRequest` 400) and the LSP logs the message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// The request was given up (its [`Cancel`] set) before it was answered.
    #[error("the request was cancelled")]
    Cancelled,
    /// No model can answer it: none is configured for the tier, it failed to load, its thread
    /// stopped, MLX failed while running it.
    #[error("{0}")]
    Unavailable(String),
    /// The way to the model broke: the daemon's socket, a remote server's HTTP.
    #[error("{0}")]
    Transport(String),
    /// The request cannot run as asked: no candidates, an empty or untokenizable prompt, ids
    /// outside the vocabulary.
    #[error("invalid request: {0}")]
    BadRequest(String),
}

/// The longest sequence (prompt and answer, in tokens) a served model runs by default
/// (`laya serve --max-seq-len`); what the catalog sizes a model's KV cache for.
pub const DEFAULT_MAX_SEQ_LEN: usize = 8192;

/// Which model of a pool: the size tier and the bit width.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// The fast model (~3–4B; here the 0.5B).
    Small,
    /// The strong model (~27–32B, or a remote server; here the 1.5B).
    Large,
}

impl Tier {
    pub fn label(self) -> &'static str {
        match self {
            Tier::Small => "small",
            Tier::Large => "large",
        }
    }
}

/// Text that does not parse as a [`Tier`], [`Precision`], [`ModelKey`],
/// device preference, a drafts choice or a remote server's extra body; the message says what
/// was expected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParseError(pub String);

impl std::fmt::Display for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

impl std::str::FromStr for Tier {
    type Err = ParseError;

    /// `small` or `large`.
    fn from_str(s: &str) -> Result<Tier, ParseError> {
        match s {
            "small" => Ok(Tier::Small),
            "large" => Ok(Tier::Large),
            _ => Err(ParseError(format!("expected small or large, got `{s}`"))),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ModelKey {
    pub tier: Tier,
    pub precision: Precision,
}

/// `small/q8`: the tier, a slash and the bit width.
impl std::fmt::Display for ModelKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.tier, self.precision)
    }
}

impl std::str::FromStr for ModelKey {
    type Err = ParseError;

    /// `TIER/BITS`: `small/q4`, `large/q6`, `small/native`; the bits also as a bare number
    /// (`large/8`), as [`Precision`] reads them.
    fn from_str(s: &str) -> Result<ModelKey, ParseError> {
        let parsed = s
            .split_once('/')
            .and_then(|(t, b)| Some((t.parse().ok()?, b.parse().ok()?)));
        match parsed {
            Some((tier, precision)) => Ok(ModelKey { tier, precision }),
            None => Err(ParseError(format!(
                "expected TIER/BITS such as small/q4 or large/q6, got `{s}`"
            ))),
        }
    }
}

/// Where a model runs, for estimates of its speed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunsOn {
    /// MLX on the CPU.
    Cpu,
    /// MLX on a GPU (Metal or CUDA).
    Gpu,
    /// Another server (OpenAI API): its speed is known only once measured.
    Remote,
}

/// What is known of a model before a request goes to it: what the router weighs and the
/// prompt's budget is sized for.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ModelFacts {
    /// Parameter count: the loaded model's, or read from its file's header before loading.
    pub parameters: Option<u64>,
    /// Parameters a token runs through, for a mixture of experts (read from its file); `None`
    /// for a dense model, all of whose parameters run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_parameters: Option<u64>,
    /// Bits a weight is held in (4, 6, 8; 16 for the file's own precision).
    pub bits: u32,
    pub runs_on: RunsOn,
    /// Whose prompt format the model reads, from its file; the default for a remote server's
    /// model, which does not say.
    #[serde(default)]
    pub family: Family,
}

/// Milliseconds a model takes per prompt token prefilled and per token decoded.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Speed {
    pub prefill_ms_per_token: f64,
    pub decode_ms_per_token: f64,
}

impl Speed {
    /// The time to prefill `prompt_tokens` and decode `tokens`.
    pub fn request_ms(&self, prompt_tokens: usize, tokens: usize) -> f64 {
        self.prefill_ms_per_token * prompt_tokens as f64 + self.decode_ms_per_token * tokens as f64
    }
}

impl ModelFacts {
    /// A first estimate of the model's speed from its size and where it runs, for the router
    /// before anything was measured (measurements replace it). Decode reads every weight once
    /// a token; prefill costs two operations a parameter a token. The rates are set from
    /// docs/benchmarks.md and err on the slow side:
    /// - CPU: MLX's CPU build (one thread, no AVX, a scalar quantized matmul that costs the
    ///   same per row at any batch) read 0.56 GB a token in 659 ms (0.5B q8) and 1.74 GB in
    ///   2,768 ms (1.5B q8), ~1.6 ms per MB, and prefilled at about the decode rate;
    /// - GPU: ~2.5 ms a token of kernel launches (a 3B decodes in 3.5 ms on an H200 with only
    ///   0.4 ms of weight reads) plus the weights at 400 GB/s (Apple's Max chips; an H200
    ///   reads 4.8 TB/s) and prefill at 0.3 ms a token per billion parameters (a 3B prefilled
    ///   ~7,000 tokens/s on the H200; Apple GPUs are several times slower).
    ///
    /// A mixture of experts is reckoned by the parameters a token runs through: the weights
    /// a decode step reads and the work of a prefill token.
    ///
    /// A remote server's speed is not estimated (`None`).
    pub fn estimated_speed(&self) -> Option<Speed> {
        let params = self.active_parameters.or(self.parameters)? as f64;
        let mb = params * self.bits as f64 / 8.0 / 1e6;
        match self.runs_on {
            RunsOn::Cpu => Some(Speed {
                prefill_ms_per_token: 1.6 * mb,
                decode_ms_per_token: 1.6 * mb,
            }),
            RunsOn::Gpu => Some(Speed {
                prefill_ms_per_token: 0.3 * params / 1e9,
                decode_ms_per_token: 2.5 + mb / 400.0,
            }),
            RunsOn::Remote => None,
        }
    }
}

/// One completion request, in engine terms.
#[derive(Clone, Debug)]
pub struct CompletionRequest {
    /// The model to run it on, for engines that hold several; `None`: the default one.
    pub model: Option<ModelKey>,
    /// The full prompt; special-token text such as `<|fim_prefix|>` is parsed as tokens.
    pub prompt: String,
    pub max_tokens: usize,
    /// Candidates sharing one prefill.
    pub n: usize,
    pub sampling: SamplingParams,
    /// A candidate ends before the first occurrence of any of these strings.
    pub stop: Vec<String>,
    /// A candidate ends where its lines say (a dedent, the suffix written again, a line
    /// count), checked as it is decoded: no token past that end is decoded. Engines that
    /// decode elsewhere ignore it (the caller's post-processing cuts there anyway).
    pub lines: LineEnd,
    /// Candidate `i` starts from the model's `i`-th most likely first token (candidate 0 is
    /// the greedy one when sampling is greedy), and each choice carries its log-probability,
    /// so that the caller can rank them. Engines that cannot do this ignore it.
    pub branch_first: bool,
}

impl CompletionRequest {
    /// One greedy candidate of at most `max_tokens` tokens after `prompt`, on the engine's
    /// default model, with no stop string; the other fields are set with struct update
    /// syntax (`CompletionRequest { n: 3, ..CompletionRequest::new(prompt, 48) }`).
    pub fn new(prompt: impl Into<String>, max_tokens: usize) -> CompletionRequest {
        CompletionRequest {
            model: None,
            prompt: prompt.into(),
            max_tokens,
            n: 1,
            sampling: SamplingParams::default(),
            stop: vec![],
            lines: LineEnd::default(),
            branch_first: false,
        }
    }
}

/// Where a candidate ends by the lines of its text. The candidate's first line (the rest of
/// the cursor's line) is never ended by the indentation or suffix rules; a line that ends the
/// candidate is not part of it, nor is the line break before it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LineEnd {
    /// End before the first later line that carries text and is indented by fewer bytes of
    /// leading whitespace than this: the cursor's block has ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedent_below: Option<usize>,
    /// End before the first later line whose text, leading whitespace aside, starts with this:
    /// the code after the cursor is being written again. Empty: no such end.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub repeats: String,
    /// End after this many lines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_lines: Option<usize>,
}

impl LineEnd {
    /// No rule: the candidate ends by its stop strings, tokens and limit alone.
    pub fn is_none(&self) -> bool {
        *self == LineEnd::default()
    }

    /// The byte offset where these rules end `text`, taken as a whole candidate's text.
    pub fn end_of(&self, text: &str) -> Option<usize> {
        match self.scan(text) {
            LineScan::End(at) => Some(at),
            LineScan::Open { .. } => None,
        }
    }

    /// Where `text` (a candidate's text so far) ends by these rules, or how much of it is
    /// final: a later line whose indentation or start is not known yet may still end the
    /// candidate, and then the line break before it goes too.
    pub(crate) fn scan(&self, text: &str) -> LineScan {
        let mut start = 0;
        let mut lines = 0;
        loop {
            let line_end = text[start..].find('\n').map(|i| start + i);
            let line = &text[start..line_end.unwrap_or(text.len())];
            if lines > 0 {
                let body = line.trim_start();
                let open = line_end.is_none();
                let blank = body.trim().is_empty();
                let dedents = self
                    .dedent_below
                    .is_some_and(|b| !blank && line.len() - body.len() < b);
                let repeats = !self.repeats.is_empty() && body.starts_with(self.repeats.as_str());
                if dedents || repeats {
                    return LineScan::End(start - 1);
                }
                // Not known yet: the indentation before any text, or a start that may become
                // the repeat.
                let undecided = open
                    && ((self.dedent_below.is_some() && blank)
                        || (!self.repeats.is_empty() && self.repeats.starts_with(body)));
                if undecided {
                    return LineScan::Open { settled: start - 1 };
                }
            }
            let Some(end) = line_end else {
                return LineScan::Open { settled: text.len() };
            };
            lines += 1;
            if self.max_lines.is_some_and(|m| lines >= m.max(1)) {
                return LineScan::End(end);
            }
            start = end + 1;
        }
    }
}

/// What [`LineEnd::scan`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LineScan {
    /// The candidate ends: its text is cut at this byte offset.
    End(usize),
    /// Not ended yet: the text up to this byte offset is final.
    Open { settled: usize },
}

#[derive(Clone, Debug)]
pub struct Choice {
    pub text: String,
    pub finish_reason: FinishReason,
    pub tokens: usize,
    /// With `branch_first`: the summed natural-log probability of the choice's tokens.
    pub logprob: Option<f32>,
}

/// Where the time of one request went.
#[derive(Clone, Debug, Default)]
pub struct Timing {
    pub prompt_tokens: usize,
    /// Prompt tokens taken from a cached prefix (no compute).
    pub reused_tokens: usize,
    /// Prompt tokens run through the model.
    pub prefilled_tokens: usize,
    pub generated_tokens: usize,
    pub prefill: Duration,
    pub decode: Duration,
    pub first_token: Duration,
    /// Forwards run after the prompt's: one per token after the first without drafts,
    /// fewer when the model accepts drafted tokens.
    pub decode_forwards: usize,
    /// Of `decode`: building and queueing the forwards on the host, and waiting for their
    /// tokens (the rest is turning tokens into text).
    pub decode_build: Duration,
    pub decode_wait: Duration,
    pub total: Duration,
}

impl Timing {
    /// Forwards that gave the generated tokens: the prompt's last one (which gives the first
    /// token) and the decode forwards after it. Without drafts as many as the tokens (one
    /// more where a stop token ended the answer).
    /// 0 where the engine does not count them (a remote server: several tokens and no
    /// decode forward, which no local model can do).
    pub fn forwards(&self) -> usize {
        match (self.generated_tokens, self.decode_forwards) {
            (0, 0) => 0,
            (n, 0) if n > 1 => 0,
            (_, f) => f + 1,
        }
    }
}

#[derive(Clone, Debug)]
pub struct CompletionOutput {
    /// The model that answered, where an engine holds several.
    pub served_by: Option<ModelKey>,
    pub choices: Vec<Choice>,
    pub timing: Timing,
}

/// Where an engine's model is in its life.
#[derive(Clone, Debug, PartialEq)]
pub enum ModelState {
    Loading,
    Ready {
        /// Reading (and converting) the weights.
        load_time: Duration,
        /// From the worker's start to ready: the device, the load and the warm-up.
        time_to_ready: Duration,
        /// The weights came from the converted-weights cache.
        from_cache: bool,
        device: String,
    },
    Failed(String),
}

impl ModelState {
    /// Ready at once, nothing loaded (a remote server, a test's engine).
    pub fn ready_on(device: impl Into<String>) -> ModelState {
        ModelState::Ready {
            load_time: Duration::ZERO,
            time_to_ready: Duration::ZERO,
            from_cache: false,
            device: device.into(),
        }
    }
}

/// Weight precision after loading.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// The source's own values, dequantized to f32 (GGUF) or kept as stored (safetensors).
    Native,
    Q4,
    Q6,
    Q8,
}

impl Precision {
    pub fn bits(self) -> Option<i32> {
        match self {
            Precision::Native => None,
            Precision::Q4 => Some(4),
            Precision::Q6 => Some(6),
            Precision::Q8 => Some(8),
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Precision::Native => "native",
            Precision::Q4 => "q4",
            Precision::Q6 => "q6",
            Precision::Q8 => "q8",
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

impl std::str::FromStr for Precision {
    type Err = ParseError;

    /// `native`, `q4`, `q6` or `q8`; the bit widths also as bare numbers (`4`, `6`, `8`), as
    /// HTTP clients send them.
    fn from_str(s: &str) -> Result<Precision, Self::Err> {
        match s {
            "native" => Ok(Precision::Native),
            "q4" | "4" => Ok(Precision::Q4),
            "q6" | "6" => Ok(Precision::Q6),
            "q8" | "8" => Ok(Precision::Q8),
            _ => Err(ParseError(format!("expected native, q4, q6 or q8, got `{s}`"))),
        }
    }
}

/// Why a candidate ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// The token callback ended it: a stop string, or where its [`LineEnd`] says.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// `cancel` was set.
    Cancelled,
    /// A stop token was generated.
    StopToken,
}

#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 (or below): greedy.
    pub temperature: f32,
    /// Nucleus: keep the most likely tokens until their mass reaches `top_p`; 1 keeps all.
    pub top_p: f32,
    /// Keep the `top_k` most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// `None`: seeded from the OS.
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            seed: None,
        }
    }
}

impl SamplingParams {
    pub(crate) fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == 1
    }
}

/// What a model worker has run over its life (the daemon's status shows it): whether a
/// request runs now, how many ended and how many of those were stopped by their cancel flag,
/// and the forwards started (prompt chunks with their tokens, decode steps).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WorkStats {
    pub(crate) busy: bool,
    pub(crate) requests: u64,
    /// Requests stopped by their cancel flag: before they started (skipped), while
    /// prefilling or while decoding.
    pub(crate) cancelled: u64,
    pub(crate) prefill_chunks: u64,
    pub(crate) prefill_tokens: u64,
    pub(crate) decode_steps: u64,
}

/// What the completion pipeline needs from an engine: the in-process worker, the model pool,
/// the daemon client and a remote OpenAI-compatible server all provide it.
#[async_trait::async_trait]
pub trait Engine: Send + Sync + 'static {
    /// Run one request; cancelling `cancel` stops it: waiting for the model, between prompt
    /// chunks and between decode steps. Dropping the future cancels it too. With `pieces`,
    /// `(candidate, piece)` is also sent as text is decoded; a candidate's pieces concatenate
    /// to its final text. Engines that cannot stream send each candidate's whole text once it
    /// is done ([`send_whole`]).
    async fn complete(
        &self,
        req: CompletionRequest,
        cancel: Cancel,
        pieces: Option<PieceSender>,
    ) -> Result<CompletionOutput, EngineError>;

    fn state(&self) -> ModelState;

    /// What is known of the model that answers requests for `model` (its size, its bit width,
    /// where it runs, its prompt family), before any request goes to it; an engine of one
    /// model states that model's whatever the key. `None` where the engine cannot tell.
    fn facts(&self, model: ModelKey) -> Option<ModelFacts> {
        let _ = model;
        None
    }

    /// What the worker of the local model that answers requests for `model` has run; an
    /// engine of one model states that model's whatever the key. `None` for engines that run
    /// nothing here.
    fn work(&self, model: ModelKey) -> Option<WorkStats> {
        let _ = model;
        None
    }
}

/// For an engine that cannot stream: sends each candidate's whole text to `pieces`, once the
/// answer is there.
pub fn send_whole(out: &CompletionOutput, pieces: Option<&PieceSender>) {
    let Some(tx) = pieces else { return };
    for (i, c) in out.choices.iter().enumerate() {
        if !c.text.is_empty() {
            let _ = tx.send((i, c.text.clone()));
        }
    }
}

/// Where streamed text goes: `(candidate index, piece)`.
pub type PieceSender = tokio::sync::mpsc::UnboundedSender<(usize, String)>;

#[cfg(test)]
mod tests {
    use super::*;

    fn block(indent: usize) -> LineEnd {
        LineEnd {
            dedent_below: Some(indent),
            ..LineEnd::default()
        }
    }

    #[test]
    fn a_block_ends_at_the_first_later_line_indented_less_than_the_block() {
        let body = "x = 1\n    if x:\n        y = 2\n\n    return y\ndef g():\n    pass\n";
        let rule = block(4);
        assert_eq!(
            rule.end_of(body).map(|at| &body[..at]),
            Some("x = 1\n    if x:\n        y = 2\n\n    return y")
        );
        // The first line is the rest of the cursor's line: never ended by its indentation.
        assert_eq!(rule.end_of("x\n    y"), None);
        assert_eq!(rule.end_of("\n  y"), Some(0));
        // Blank and whitespace-only lines do not end a block.
        assert_eq!(rule.end_of("a\n\n  \n    b\n"), None);
        // A line whose text has not come yet is open, its line break held back.
        let open = "a\n    b\n  ";
        assert_eq!(
            rule.scan(open),
            LineScan::Open {
                settled: open.len() - 3
            }
        );
        assert_eq!(rule.scan("a\n    b"), LineScan::Open { settled: 7 });
    }

    #[test]
    fn a_candidate_ends_where_it_writes_the_suffix_again_or_at_its_line_limit() {
        let rule = LineEnd {
            repeats: "return y".into(),
            ..LineEnd::default()
        };
        // The first line may start with it (it continues the cursor's line).
        assert_eq!(rule.end_of("return y\nz"), None);
        let t = "y = 1\n    return y\n";
        assert_eq!(rule.end_of(t), Some(5));
        // A prefix of the repeat is held back until it is decided either way.
        assert_eq!(rule.scan("y = 1\n    retu"), LineScan::Open { settled: 5 });
        assert_eq!(rule.scan("y = 1\n    retx"), LineScan::Open { settled: 14 });
        let two = LineEnd {
            max_lines: Some(2),
            ..LineEnd::default()
        };
        assert_eq!(two.end_of("a\nb\nc"), Some(3));
        assert_eq!(two.end_of("a\nb"), None);
        assert!(LineEnd::default().is_none() && !two.is_none());
    }

    #[test]
    fn model_keys_tiers_and_precisions_read_back_what_they_write() {
        for tier in [Tier::Small, Tier::Large] {
            assert_eq!(tier.to_string().parse::<Tier>(), Ok(tier));
            for precision in [Precision::Native, Precision::Q4, Precision::Q6, Precision::Q8] {
                assert_eq!(precision.to_string().parse::<Precision>(), Ok(precision));
                let key = ModelKey { tier, precision };
                assert_eq!(key.to_string().parse::<ModelKey>(), Ok(key));
            }
        }
        let large_q6 = ModelKey {
            tier: Tier::Large,
            precision: Precision::Q6,
        };
        assert_eq!(large_q6.to_string(), "large/q6");
        assert_eq!(
            "large/6".parse::<ModelKey>(),
            Ok(large_q6),
            "bits as a bare number"
        );
        assert_eq!("8".parse::<Precision>(), Ok(Precision::Q8));
        assert_eq!(
            "small/native".parse::<ModelKey>().map(|k| k.precision),
            Ok(Precision::Native)
        );
        for bad in [
            "",
            "small",
            "small/",
            "/q4",
            "medium/q4",
            "small/q5",
            "small/q4/x",
            "Small/q4",
            " small/q4",
        ] {
            let err = bad.parse::<ModelKey>().unwrap_err();
            assert!(
                err.0.contains("TIER/BITS") && err.0.contains(&format!("`{bad}`")),
                "{bad}: {err}"
            );
        }
        assert!("q5"
            .parse::<Precision>()
            .unwrap_err()
            .0
            .contains("native, q4, q6 or q8"));
        assert!("medium".parse::<Tier>().is_err());
    }
}
