//! The model families laya builds prompts for, as data: a family's fill-in-the-middle control
//! tokens and those a completion stops at. The engine tells a model's family from its
//! architecture and finds these tokens' ids in its vocabulary; the prompt builder writes them.

/// A coder family's fill-in-the-middle format: the control tokens its prompts are made of, as
/// text, and those a completion ends at. The engine finds their ids in the model's vocabulary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FimFormat {
    pub prefix: &'static str,
    pub suffix: &'static str,
    pub middle: &'static str,
    pub(crate) pad: &'static str,
    /// Opens the repository-level form: `{repo_name}name\n{file_sep}path\ntext\n…`.
    pub repo_name: &'static str,
    pub file_sep: &'static str,
    /// Tokens that end a completion: the end-of-text and end-of-turn tokens, and those that
    /// would start another file or hole (llama.cpp's end-of-generation set for the vocabulary).
    /// The engine adds the end tokens the model file declares.
    pub(crate) stop: &'static [&'static str],
}

impl FimFormat {
    /// Prefix-suffix-middle order: `{prefix token}{prefix}{suffix token}{suffix}{middle token}`.
    pub fn fim(&self, prefix: &str, suffix: &str) -> String {
        format!("{}{prefix}{}{suffix}{}", self.prefix, self.suffix, self.middle)
    }
}

/// The model families laya builds prompts for. The engine tells a model's family from its
/// architecture (`qwen2` or the Qwen3 ones); a model it knows nothing of (a remote server's)
/// gets the default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Family {
    /// Qwen2.5-Coder (and the Qwen2 generation).
    #[default]
    Qwen25Coder,
    /// Qwen3-Coder (30B-A3B, 480B-A35B) and the Qwen3 generation.
    Qwen3Coder,
}

/// Qwen2.5-Coder's control tokens (tokenizer_config.json: `<|fim_prefix|>` 151659 …
/// `<|file_sep|>` 151664, `<|endoftext|>` 151643, `<|im_end|>` 151645).
const QWEN25_CODER: FimFormat = FimFormat {
    prefix: "<|fim_prefix|>",
    suffix: "<|fim_suffix|>",
    middle: "<|fim_middle|>",
    pad: "<|fim_pad|>",
    repo_name: "<|repo_name|>",
    file_sep: "<|file_sep|>",
    stop: &[
        "<|endoftext|>",
        "<|im_end|>",
        "<|fim_pad|>",
        "<|repo_name|>",
        "<|file_sep|>",
    ],
};

/// Qwen3-Coder's, checked against Qwen2.5-Coder's: the same FIM and repository tokens with the
/// same ids (Qwen3's vocabulary adds `<tool_response>`, `<think>` and `</think>` after them);
/// its declared end token is `<|im_end|>` (Qwen2.5-Coder base: `<|endoftext|>`), in the stop
/// set of both. Qwen's README also shows Qwen3-Coder-Instruct given the FIM string inside a
/// chat turn; laya gives it the plain form, as llama.cpp's `/infill` does.
const QWEN3_CODER: FimFormat = QWEN25_CODER;

impl Family {
    pub const ALL: [Family; 2] = [Family::Qwen25Coder, Family::Qwen3Coder];

    pub fn fim(self) -> &'static FimFormat {
        match self {
            Family::Qwen25Coder => &QWEN25_CODER,
            Family::Qwen3Coder => &QWEN3_CODER,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Family::Qwen25Coder => "qwen2.5-coder",
            Family::Qwen3Coder => "qwen3-coder",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fim_layout_is_prefix_suffix_middle_in_both_families() {
        for family in Family::ALL {
            let f = family.fim();
            assert_eq!(f.fim("a", "b"), "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>");
            for t in [f.pad, f.repo_name, f.file_sep] {
                assert!(f.stop.contains(&t), "{family:?}: {t}");
            }
        }
        assert_eq!(Family::default(), Family::Qwen25Coder);
        let json = serde_json::to_string(&Family::Qwen3Coder).unwrap();
        assert_eq!(json, "\"qwen3-coder\"");
        assert_eq!(serde_json::from_str::<Family>(&json).unwrap(), Family::Qwen3Coder);
    }
}
