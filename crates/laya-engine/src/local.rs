//! `LocalModel`: one model loaded here with its tokenizer, its prefix store and its drafts,
//! answering a [`CompletionRequest`] on the calling thread. What a model worker's thread owns.
//!
//! Boundary: above `generate`, `prefix`, `tokenizer` and `load`, below `worker`; it turns the
//! seam's request into token generation and the tokens back into texts. Invariants: a
//! candidate's streamed pieces concatenate to its final text and never hold a split character
//! or text a stop string could still claim; no token is decoded past where a candidate's
//! [`LineEnd`] ends it.
//!
//! Start with [`LocalModel::complete_streaming`].

use std::{
    path::Path,
    time::{Duration, Instant},
};

use crate::{
    cancel::Cancel,
    draft, generate,
    generate::{Control, GenerateRequest},
    load::{self, EngineLoadError, LoadOptions, Loaded},
    models, prefix,
    seam::{
        Choice, CompletionOutput, CompletionRequest, EngineError, LineEnd, LineScan, ModelFacts, RunsOn,
        Timing,
    },
    tokenizer::{self, SpecialTokens},
};

/// A loaded model with its tokenizer: what a model worker thread owns.
pub struct LocalModel {
    pub loaded: Loaded,
    pub(crate) specials: SpecialTokens,
    /// Prompts (and continuations) already run, with their KV caches.
    prefix: std::sync::Mutex<prefix::PrefixStore>,
    /// Drafts for decoding, resolved for the device the model runs on.
    speculation: draft::Speculation,
}

impl LocalModel {
    pub fn load(path: &Path, opts: &LoadOptions) -> Result<LocalModel, EngineLoadError> {
        let loaded = load::load(path, opts)?;
        let specials = loaded.tokenizer.special_tokens(loaded.family)?;
        Ok(LocalModel {
            loaded,
            specials,
            prefix: std::sync::Mutex::new(prefix::PrefixStore::new(opts.prefix)),
            speculation: opts.speculation.resolve(),
        })
    }

    /// What the router and the prompt budget weigh: the parameter count (and a mixture's
    /// active one), the bit width, the device and the prompt family of the loaded model.
    pub fn facts(&self) -> ModelFacts {
        let config = self.loaded.model.config();
        let active = config.active_parameters();
        ModelFacts {
            parameters: Some(config.parameters()),
            active_parameters: (active != config.parameters()).then_some(active),
            bits: self.loaded.precision.bits().map_or(16, |b| b as u32),
            runs_on: if models::on_gpu() {
                RunsOn::Gpu
            } else {
                RunsOn::Cpu
            },
            family: self.specials.family,
        }
    }

    /// Run a short request once, so the first real one does not pay for kernel compilation
    /// and buffer allocation (MLX compiles GPU kernels at first use); its prompt starts with
    /// [`warm_up_source`]. On a GPU a second, long one follows (`long_warm_up_source`): a
    /// prompt of several prefill chunks whose answer is decoded over more than 1,024 keys
    /// (MLX's CUDA attention switches kernels there) and, with drafts, checked several tokens
    /// a forward. Returns the whole duration.
    pub fn warmup(&self) -> Result<Duration, EngineError> {
        let start = Instant::now();
        let mut bodies = vec![(warm_up_source(), 2)];
        if models::on_gpu() {
            bodies.push((long_warm_up_source(), 8));
        }
        for (body, max_tokens) in bodies {
            let req = CompletionRequest::new(
                self.specials
                    .family
                    .fim()
                    .fim(&format!("{body}def add(a, b):\n    return"), "\n"),
                max_tokens,
            );
            self.complete(&req, &Cancel::new())?;
        }
        if models::on_gpu() {
            self.warm_row_counts()?;
        }
        Ok(start.elapsed())
    }

    /// Runs a forward of each row count in [`WARM_ROWS`] on fresh caches. MLX's CUDA backend
    /// compiles its quantized matrix product for a tile of 16, 32 or 64 rows (fewer than 8 take
    /// the matrix-vector kernel): a prompt's last chunk can be any length, and the first one
    /// of a new tile size cost 28 s on a fresh H100 (no compiled kernels on disk yet) when a
    /// request paid for it.
    fn warm_row_counts(&self) -> Result<(), EngineError> {
        let ids = self.loaded.tokenizer.encode(&warm_up_source_for_rows(), false)?;
        for &rows in WARM_ROWS {
            let Some(chunk) = ids.get(..rows) else {
                return Err(EngineError::Unavailable(format!(
                    "warm-up text has {} tokens, fewer than {rows}",
                    ids.len()
                )));
            };
            let mut caches = self.loaded.model.new_caches();
            generate::prefill(&self.loaded.model, &mut caches, chunk, &Cancel::new())?;
        }
        Ok(())
    }

    /// Run one completion, reusing the longest prefix of the prompt already run. `cancel` is
    /// checked between prefill chunks and decode steps.
    pub fn complete(
        &self,
        req: &CompletionRequest,
        cancel: &Cancel,
    ) -> Result<CompletionOutput, EngineError> {
        self.complete_streaming(req, cancel, |_, _| {})
    }

    /// [`complete`](Self::complete), also handing each candidate's text to `on_piece` as it is
    /// decoded: `(candidate, piece)`, pieces in order, never part of a stop string and never a
    /// split character. A candidate's pieces concatenate to its final `text`.
    pub(crate) fn complete_streaming(
        &self,
        req: &CompletionRequest,
        cancel: &Cancel,
        mut on_piece: impl FnMut(usize, &str),
    ) -> Result<CompletionOutput, EngineError> {
        let start = Instant::now();
        if req.n == 0 {
            return Err(EngineError::BadRequest("n must be at least 1".into()));
        }
        let tokenizer = &self.loaded.tokenizer;
        let ids = tokenizer.encode(&req.prompt, true)?;
        if ids.is_empty() {
            return Err(EngineError::BadRequest("the prompt is empty".into()));
        }
        let greq = GenerateRequest {
            max_tokens: req.max_tokens,
            n: req.n,
            sampling: req.sampling.clone(),
            stop_token_ids: self.specials.eog.clone(),
            branch_first: req.branch_first,
            speculation: self.speculation,
            history: vec![],
            anchor: self
                .loaded
                .model
                .is_recurrent()
                .then(|| prefix::fim_anchor(&ids, self.specials.fim_suffix))
                .flatten(),
        };
        let mut texts = StopScanner::new(tokenizer, req.n, &req.stop, &req.lines);
        let (out, reused) = prefix::generate_with_store(
            &self.loaded.model,
            Some(&self.prefix),
            &ids,
            &greq,
            cancel,
            |i, tok| {
                let control = texts.push(i, tok);
                if let Some(piece) = texts.settled(i, false) {
                    on_piece(i, piece);
                }
                control
            },
        )?;
        for i in 0..req.n {
            if let Some(piece) = texts.settled(i, true) {
                on_piece(i, piece);
            }
        }
        let choices = out
            .candidates
            .iter()
            .zip(&out.finish_reasons)
            .enumerate()
            .map(|(i, (toks, reason))| Choice {
                text: texts.text(i),
                finish_reason: *reason,
                tokens: toks.len(),
                logprob: req.branch_first.then(|| out.logprobs[i]),
            })
            .collect();
        Ok(CompletionOutput {
            served_by: None,
            choices,
            timing: Timing {
                prompt_tokens: ids.len(),
                reused_tokens: reused,
                prefilled_tokens: out.prefill_tokens,
                generated_tokens: out.candidates.iter().map(Vec::len).sum(),
                prefill: out.prefill_time,
                decode: out.decode_time,
                first_token: out.first_token_time,
                decode_forwards: out.decode_forwards,
                decode_build: out.decode_build_time,
                decode_wait: out.decode_wait_time,
                total: start.elapsed(),
            },
        })
    }
}

/// Turns each candidate's tokens into text as they arrive (never splitting a UTF-8
/// character) and stops a candidate at the first stop string or where its [`LineEnd`] says.
struct StopScanner<'t> {
    decoders: Vec<tokenizer::StreamDecoder<'t>>,
    texts: Vec<String>,
    stopped: Vec<bool>,
    /// Bytes of each text already handed out by [`settled`](Self::settled).
    settled: Vec<usize>,
    stop: &'t [String],
    lines: &'t LineEnd,
}

impl<'t> StopScanner<'t> {
    fn new(tokenizer: &'t tokenizer::Tokenizer, n: usize, stop: &'t [String], lines: &'t LineEnd) -> Self {
        StopScanner {
            decoders: (0..n).map(|_| tokenizer.stream_decoder()).collect(),
            texts: vec![String::new(); n],
            stopped: vec![false; n],
            settled: vec![0; n],
            stop,
            lines,
        }
    }

    /// Text of candidate `i` that is final and not yet handed out: all of it once the
    /// candidate stopped or `end` is set; otherwise all but the bytes a stop string that
    /// starts there could still claim. `None` when there is nothing new.
    fn settled(&mut self, i: usize, end: bool) -> Option<&str> {
        let text = &self.texts[i];
        let mut upto = if end || self.stopped[i] {
            text.len()
        } else {
            let longest = self.stop.iter().map(String::len).max().unwrap_or(0);
            let by_stop = text.len().saturating_sub(longest.saturating_sub(1));
            match self.lines.scan(text) {
                LineScan::Open { settled } => by_stop.min(settled),
                LineScan::End(_) => by_stop,
            }
        };
        while !text.is_char_boundary(upto) {
            upto -= 1;
        }
        let from = self.settled[i];
        if upto <= from {
            return None;
        }
        self.settled[i] = upto;
        Some(&text[from..upto])
    }

    fn push(&mut self, i: usize, token: u32) -> Control {
        if self.stopped[i] {
            return Control::Stop;
        }
        let piece = self.decoders[i].push(token);
        let before = self.texts[i].len();
        self.texts[i].push_str(&piece);
        // A stop string may straddle pieces: search from where it could start.
        let longest = self.stop.iter().map(String::len).max().unwrap_or(0);
        let mut from = before.saturating_sub(longest);
        while !self.texts[i].is_char_boundary(from) {
            from -= 1;
        }
        let hit = self
            .stop
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| self.texts[i][from..].find(s.as_str()))
            .min();
        if let Some(at) = hit {
            self.texts[i].truncate(from + at);
            self.stopped[i] = true;
        }
        if let LineScan::End(at) = self.lines.scan(&self.texts[i]) {
            self.texts[i].truncate(at);
            self.stopped[i] = true;
        }
        if self.stopped[i] {
            return Control::Stop;
        }
        Control::Continue
    }

    fn text(&self, i: usize) -> String {
        self.texts[i].clone()
    }
}

/// Row counts of the forwards [`LocalModel::warmup`] runs on a GPU, one in each of MLX CUDA's
/// tile sizes for quantized matrix products (up to 16, 32 and 64 rows).
const WARM_ROWS: &[usize] = &[12, 24, 48];

/// Text for [`WARM_ROWS`]'s forwards: more tokens than the largest.
fn warm_up_source_for_rows() -> String {
    scale_functions(4)
}

/// Python code to start a warm-up prompt with (the engine's at load, `laya bench typing`'s
/// untimed trace). On a GPU a few hundred tokens: MLX's CUDA backend builds another
/// matrix-product kernel for more than 16 rows, which every cold prompt uses (3.3 s on an H200
/// when a real request paid for it). Empty on the CPU, which compiles nothing.
pub fn warm_up_source() -> String {
    scale_functions(if models::on_gpu() { 12 } else { 0 })
}

/// Python code for the long warm-up prompt on a GPU (about 2,300 tokens: more than four
/// 512-token prefill chunks); empty on the CPU.
pub(crate) fn long_warm_up_source() -> String {
    scale_functions(if models::on_gpu() { 100 } else { 0 })
}

fn scale_functions(n: usize) -> String {
    (0..n)
        .map(|i| format!("def scale_{i}(values, factor={i}):\n    return [v * factor for v in values]\n\n\n"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::{tests::any_vocabulary, Tokenizer};

    #[test]
    fn the_row_count_warm_up_text_has_a_token_for_every_row() {
        // The real vocabulary (with the switch on) merges the most, so it is the one that
        // could fall short.
        for tok in any_vocabulary() {
            let ids = tok.encode(&warm_up_source_for_rows(), false).unwrap();
            let most = WARM_ROWS.iter().max().unwrap();
            assert!(ids.len() >= *most, "{} tokens, {most} rows", ids.len());
        }
    }

    /// Feed `text` token by token as candidate 0; returns (kept text, tokens pushed before Stop).
    fn scan(tok: &Tokenizer, text: &str, stop: &[String]) -> (String, Option<usize>) {
        scan_lines(tok, text, stop, &LineEnd::default())
    }

    fn scan_lines(tok: &Tokenizer, text: &str, stop: &[String], lines: &LineEnd) -> (String, Option<usize>) {
        let ids = tok.encode(text, false).unwrap();
        let mut s = StopScanner::new(tok, 1, stop, lines);
        let stopped_at = ids.iter().position(|&id| s.push(0, id) == Control::Stop);
        (s.text(0), stopped_at)
    }

    fn block(indent: usize) -> LineEnd {
        LineEnd {
            dedent_below: Some(indent),
            ..LineEnd::default()
        }
    }

    #[test]
    fn a_line_end_stops_decoding_at_the_token_that_decides_it_and_streams_only_what_stays() {
        for tok in any_vocabulary() {
            let text = "total = 0\n    for v in values:\n        total += v\n    return total\ndef other():\n    pass\n";
            let (kept, at) = scan_lines(&tok, text, &[], &block(4));
            assert_eq!(
                kept,
                "total = 0\n    for v in values:\n        total += v\n    return total"
            );
            let ids = tok.encode(text, false).unwrap();
            // Stopped on the token that brought `def`'s first character, not at the end.
            let stopped = at.expect("stopped");
            assert!(stopped + 1 < ids.len(), "{stopped} of {}", ids.len());
            let decided = tok.decode(&ids[..=stopped]);
            assert!(decided.contains("\nd"), "{decided:?}");
            assert!(!tok.decode(&ids[..stopped]).contains("\nd"));
            // Streamed pieces never hold what is cut.
            let lines = block(4);
            let mut s = StopScanner::new(&tok, 1, &[], &lines);
            let mut streamed = String::new();
            for &id in &ids {
                let c = s.push(0, id);
                if let Some(p) = s.settled(0, false) {
                    streamed.push_str(p);
                    assert!(kept.starts_with(&streamed), "{streamed:?}");
                }
                if c == Control::Stop {
                    break;
                }
            }
            if let Some(p) = s.settled(0, true) {
                streamed.push_str(p);
            }
            assert_eq!(streamed, kept);
        }
    }

    #[test]
    fn stop_strings_end_a_candidate_before_the_match_even_across_tokens() {
        for tok in any_vocabulary() {
            let stop = vec!["\n\n".to_owned(), "def ".to_owned()];
            let (text, at) = scan(&tok, "x = 1\ny = 2\n\nprint(x)", &stop);
            assert_eq!(text, "x = 1\ny = 2");
            assert!(at.is_some());
            let (text, _) = scan(&tok, "return a + b\ndef g():", &stop);
            assert_eq!(text, "return a + b\n");
            let (text, at) = scan(&tok, "no stop here", &stop);
            assert_eq!((text.as_str(), at), ("no stop here", None));
        }
    }

    #[test]
    fn settled_pieces_concatenate_to_the_final_text_and_never_hold_a_stop_string() {
        for tok in any_vocabulary() {
            let stop = vec!["\n\n".to_owned(), "def ".to_owned()];
            for text in [
                "x = 1\ny = 2\n\nprint(x)",
                "return a + b\ndef g():",
                "naïve 🙂 café",
                "no stop",
            ] {
                let ids = tok.encode(text, false).unwrap();
                let none = LineEnd::default();
                let mut s = StopScanner::new(&tok, 1, &stop, &none);
                let mut streamed = String::new();
                for &id in &ids {
                    let c = s.push(0, id);
                    if let Some(p) = s.settled(0, false) {
                        assert!(!p.contains("\n\n") && !p.contains("def "), "{p:?}");
                        streamed.push_str(p);
                    }
                    if c == Control::Stop {
                        break;
                    }
                }
                if let Some(p) = s.settled(0, true) {
                    streamed.push_str(p);
                }
                assert_eq!(streamed, s.text(0), "{text:?}");
            }
        }
    }

    #[test]
    fn stop_scanner_keeps_multibyte_text_whole() {
        for tok in any_vocabulary() {
            let (text, _) = scan(&tok, "naïve 🙂 café — ok", &["—".to_owned()]);
            assert_eq!(text, "naïve 🙂 café ");
        }
    }
}
