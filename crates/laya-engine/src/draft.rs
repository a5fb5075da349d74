//! Draft tokens for speculative decoding, looked up in the text itself ("prompt lookup"):
//! code repeats itself, so the tokens that followed the last few tokens the last time they
//! occurred (in the prompt, which holds the document before and after the cursor, or in what
//! was generated) are a good guess of what comes next. The model then checks a whole draft in
//! one forward ([`super::generate`]); a wrong draft costs the extra positions of that forward,
//! never a different answer.

/// Longest n-gram matched at the end of the history.
pub(crate) const NGRAM_MAX: usize = 3;
/// Shortest n-gram matched: a single token repeats too often to predict what follows it.
pub(crate) const NGRAM_MIN: usize = 2;
/// Most tokens drafted for one forward. With the fed token a checking forward is then 7 rows,
/// which MLX's CUDA backend still runs through its matrix-vector kernel for quantized weights
/// (`M * B < 8` in `mlx/backend/cuda/quantized/quantized.cpp`; 8 rows and more go to a tiled
/// matrix kernel, or the naive one for f32 activations).
pub(crate) const DRAFT_MAX: usize = 6;

/// When decoding drafts tokens for the model to verify.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Speculation {
    /// One token per forward.
    Off,
    /// Drafts from n-gram lookup in the prompt and the output, at most `max_draft` a forward.
    Ngram { max_draft: usize },
}

impl Speculation {
    /// The default n-gram drafts.
    pub(crate) const NGRAM: Speculation = Speculation::Ngram { max_draft: DRAFT_MAX };

    pub(crate) fn is_on(self) -> bool {
        !matches!(self, Speculation::Off)
    }
}

/// What a user picks: drafts where they pay (`auto`, which is nowhere measured so far), always,
/// or never.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SpeculationChoice {
    /// Off on every device measured: on the CPU each position costs a full token's time; on
    /// an H100 a forward checking a full draft cost 2.1-2.4 decode steps and line answers of
    /// about 10 tokens took 1.5-1.6 tokens a forward, so requests were no faster (0.5B p50 84
    /// against 87 ms, 1.5B 121 against 119 ms) and slower at p99 (317 against 271 ms, 338
    /// against 319 ms; docs/decisions.md).
    #[default]
    Auto,
    On,
    Off,
}

impl SpeculationChoice {
    /// What decoding does: `auto` is off on every device measured.
    pub(crate) fn resolve(self) -> Speculation {
        match self {
            SpeculationChoice::On => Speculation::NGRAM,
            SpeculationChoice::Auto | SpeculationChoice::Off => Speculation::Off,
        }
    }
}

impl std::str::FromStr for SpeculationChoice {
    type Err = crate::seam::ParseError;

    fn from_str(s: &str) -> Result<Self, crate::seam::ParseError> {
        match s {
            "auto" => Ok(SpeculationChoice::Auto),
            "on" => Ok(SpeculationChoice::On),
            "off" => Ok(SpeculationChoice::Off),
            other => Err(crate::seam::ParseError(format!(
                "speculation must be auto, on or off, not {other:?}"
            ))),
        }
    }
}

impl std::fmt::Display for SpeculationChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SpeculationChoice::Auto => "auto",
            SpeculationChoice::On => "on",
            SpeculationChoice::Off => "off",
        })
    }
}

/// The tokens after the latest earlier occurrence of the history's last n tokens (n from
/// [`NGRAM_MAX`] down to [`NGRAM_MIN`], longest match first), at most `max` of them; empty
/// when nothing matches.
pub(crate) fn ngram_draft(history: &[u32], max: usize) -> &[u32] {
    if max == 0 {
        return &[];
    }
    for n in (NGRAM_MIN..=NGRAM_MAX).rev() {
        if history.len() <= n {
            continue;
        }
        let tail = &history[history.len() - n..];
        // Latest occurrence that ends before the tail itself starts to overlap its end.
        let found = (0..history.len() - n)
            .rev()
            .find(|&start| &history[start..start + n] == tail);
        if let Some(start) = found {
            let from = start + n;
            let to = (from + max).min(history.len());
            return &history[from..to];
        }
    }
    &[]
}

/// How many forwards greedy decoding with n-gram drafts of at most `max_draft` tokens needs to
/// produce `output` after `prompt`, when `output` is what the model decodes greedily: each
/// forward feeds the last token and a draft, and yields the draft's longest prefix that agrees
/// with `output` plus one more token. The first output token comes from the prompt's forward
/// and is not counted. A replay of recorded answers measures drafts without a model.
#[cfg(test)]
pub(crate) fn forwards_to_decode(prompt: &[u32], output: &[u32], max_draft: usize) -> usize {
    let mut history = prompt.to_vec();
    let Some((&first, rest)) = output.split_first() else {
        return 0;
    };
    history.push(first);
    let mut i = 0;
    let mut forwards = 0;
    while i < rest.len() {
        let draft = ngram_draft(&history, max_draft.min(rest.len() - i - 1));
        let accepted = draft.iter().zip(&rest[i..]).take_while(|(d, o)| d == o).count();
        forwards += 1;
        let take = accepted + 1;
        history.extend_from_slice(&rest[i..i + take]);
        i += take;
    }
    forwards
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_longest_latest_match_gives_the_draft() {
        // "1 2 3 4 5 ... 1 2 3" → 4 5 …
        let h = [1, 2, 3, 4, 5, 9, 9, 1, 2, 3];
        assert_eq!(ngram_draft(&h, 8), &[4, 5, 9, 9, 1, 2, 3]);
        assert_eq!(ngram_draft(&h, 2), &[4, 5]);
        // A later occurrence of the 2-gram wins over an earlier one.
        let h = [7, 8, 1, 7, 8, 2, 7, 8];
        assert_eq!(ngram_draft(&h, 1), &[2]);
        // A longer match wins over a later shorter one.
        let h = [5, 7, 8, 1, 6, 7, 8, 2, 5, 7, 8];
        assert_eq!(ngram_draft(&h, 1), &[1]);
    }

    #[test]
    fn no_match_and_single_tokens_draft_nothing() {
        assert!(ngram_draft(&[1, 2, 3, 4], 8).is_empty());
        assert!(ngram_draft(&[1, 2, 1], 8).is_empty(), "1-grams are not matched");
        assert!(ngram_draft(&[], 8).is_empty());
        assert!(ngram_draft(&[1, 2, 1, 2], 0).is_empty());
    }

    #[test]
    fn a_repeated_line_decodes_in_few_forwards() {
        let line = [10, 11, 12, 13, 14, 15, 16, 17];
        let mut prompt = line.to_vec();
        prompt.push(99);
        let forwards = forwards_to_decode(&prompt, &line, DRAFT_MAX);
        // First token from the prompt; [10] alone matches no 2-gram, [99, 10] neither, so
        // one plain step, then [10, 11] drafts the rest at once.
        assert_eq!(forwards, 2);
        assert_eq!(forwards_to_decode(&prompt, &line, 0), line.len() - 1);
        assert_eq!(forwards_to_decode(&prompt, &[], DRAFT_MAX), 0);
    }

    proptest! {
        #[test]
        fn drafts_never_take_more_forwards_than_tokens(
            prompt in proptest::collection::vec(0u32..6, 0..40),
            output in proptest::collection::vec(0u32..6, 1..40),
            max in 0usize..10,
        ) {
            let f = forwards_to_decode(&prompt, &output, max);
            prop_assert!(f < output.len());
            prop_assert!(f * (max + 1) >= output.len() - 1);
            let draft = ngram_draft(&prompt, max);
            prop_assert!(draft.len() <= max);
        }
    }
}
