//! Byte-level BPE tokenizer (Qwen2 family) on top of the `tokenizers` crate.
//!
//! Built either from a Hugging Face `tokenizer.json` or from a GGUF file's vocabulary
//! (`tokenizer.ggml.*`), where it reproduces llama.cpp's tokenization of `gpt2`/`qwen2` models:
//! the Qwen2 split regex, GPT-2's byte-to-unicode map, lowest-rank-first merges, no normalizer,
//! no BOS. Token types follow llama.cpp: control (3) and unknown (2) tokens are matched in the
//! text only when specials are parsed, user-defined tokens (4, e.g. `<tool_call>`) always,
//! unused tokens (5) never and they decode to nothing.
//!
//! Decoding works on each token's raw bytes, so [`StreamDecoder`] can hold back a UTF-8
//! character split across tokens and emit it whole.

use std::path::{Path, PathBuf};

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{
    AddedToken, AddedVocabulary, DecoderWrapper, Model, OffsetReferential, OffsetType, PreTokenizer,
    SplitDelimiterBehavior,
};

use super::load::gguf::{GgufFile, LoadError};
use crate::family::Family;

/// Qwen2's pre-tokenizer split regex (as in its tokenizer.json and llama.cpp's `qwen2` pre type).
pub(crate) const QWEN2_SPLIT_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen3.5's: Qwen2's with combining marks (`\p{M}`) kept with the letters they mark
/// (llama.cpp's `qwen35` pre type).
const QWEN35_SPLIT_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GGUF `tokenizer.ggml.token_type` values (llama.cpp `llama_token_type`).
mod token_type {
    pub(crate) const UNKNOWN: i32 = 2;
    pub(crate) const CONTROL: i32 = 3;
    pub(crate) const USER_DEFINED: i32 = 4;
    pub(crate) const UNUSED: i32 = 5;
}

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("{}: cannot load tokenizer: {source}", path.display())]
    Load {
        path: PathBuf,
        #[source]
        source: tokenizers::Error,
    },
    #[error(transparent)]
    Gguf(#[from] LoadError),
    #[error(
        "{}: tokenizer.ggml.model is {found:?}; laya supports only \"gpt2\" (byte-level BPE)",
        path.display()
    )]
    UnsupportedModel { path: PathBuf, found: String },
    #[error(
        "{}: tokenizer.ggml.pre is {found:?}; laya supports the \"qwen2\" and \"qwen35\" pre-tokenizers",
        path.display()
    )]
    UnsupportedPreTokenizer { path: PathBuf, found: String },
    #[error("{}: invalid tokenizer: {reason}", path.display())]
    Invalid { path: PathBuf, reason: String },
    #[error("tokenizing failed: {0}")]
    Encode(#[source] tokenizers::Error),
    #[error("{}: cannot write tokenizer: {source}", path.display())]
    Save {
        path: PathBuf,
        #[source]
        source: tokenizers::Error,
    },
    #[error("the vocabulary has no {0:?} token")]
    MissingSpecialToken(&'static str),
}

impl From<TokenizerError> for crate::seam::EngineError {
    fn from(e: TokenizerError) -> Self {
        crate::seam::EngineError::BadRequest(e.to_string())
    }
}

/// Ids of the control tokens of a model's family ([`Family::fim`]) that laya builds prompts
/// from and stops on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SpecialTokens {
    pub(crate) family: Family,
    pub(crate) fim_prefix: u32,
    pub(crate) fim_suffix: u32,
    pub(crate) fim_middle: u32,
    pub(crate) fim_pad: u32,
    pub(crate) repo_name: u32,
    pub(crate) file_sep: u32,
    /// End-of-generation ids, ascending: the family's stop tokens (for the Qwen coders
    /// llama.cpp's set: `<|endoftext|>`, `<|im_end|>`, `<|fim_pad|>`, `<|repo_name|>`,
    /// `<|file_sep|>`) and the end tokens the model file declares.
    pub(crate) eog: Vec<u32>,
}

/// A byte-level BPE tokenizer; cheap to share (`&self` everywhere, `Send + Sync`).
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// The added vocabulary with special tokens demoted to plain text (for `parse_special = false`).
    plain_added: AddedVocabulary,
    /// Decoded bytes of token `id`: `piece_bytes[piece_ends[id - 1]..piece_ends[id]]`.
    piece_bytes: Vec<u8>,
    piece_ends: Vec<usize>,
    /// End-of-generation ids the model file states (GGUF `tokenizer.ggml.eos_token_id` and
    /// `eot_token_id`, HF `generation_config.json`'s `eos_token_id`).
    declared_eog: Vec<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Load a Hugging Face `tokenizer.json` (its decoder must be ByteLevel).
    pub(crate) fn from_file(path: impl AsRef<Path>) -> Result<Tokenizer, TokenizerError> {
        let path = path.as_ref();
        let inner = tokenizers::Tokenizer::from_file(path).map_err(|source| TokenizerError::Load {
            path: path.to_path_buf(),
            source,
        })?;
        if !matches!(inner.get_decoder(), Some(DecoderWrapper::ByteLevel(_))) {
            return Err(TokenizerError::Invalid {
                path: path.to_path_buf(),
                reason: "laya needs a byte-level BPE tokenizer (decoder ByteLevel)".into(),
            });
        }
        let added = inner.get_added_vocabulary().get_added_tokens_decoder();
        let pieces = (0..inner.get_vocab_size(true) as u32).map(|id| match added.get(&id) {
            Some(tok) => Piece::Raw(tok.content.clone()),
            None => inner.id_to_token(id).map_or(Piece::Empty, Piece::ByteLevel),
        });
        let (piece_bytes, piece_ends) = piece_table(pieces);
        Ok(Self::assemble(inner, piece_bytes, piece_ends))
    }

    /// Build the tokenizer from a GGUF file's `tokenizer.ggml.*` metadata (`gpt2` model,
    /// `qwen2` or `qwen35` pre-tokenizer).
    pub(crate) fn from_gguf(gguf: &GgufFile) -> Result<Tokenizer, TokenizerError> {
        let path = gguf.path();
        let model = gguf.get_str("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(TokenizerError::UnsupportedModel {
                path: path.to_path_buf(),
                found: model.to_owned(),
            });
        }
        let split_regex = match gguf.get_str("tokenizer.ggml.pre")? {
            "qwen2" => QWEN2_SPLIT_REGEX,
            "qwen35" => QWEN35_SPLIT_REGEX,
            pre => {
                return Err(TokenizerError::UnsupportedPreTokenizer {
                    path: path.to_path_buf(),
                    found: pre.to_owned(),
                })
            }
        };
        let invalid = |reason: String| TokenizerError::Invalid {
            path: path.to_path_buf(),
            reason,
        };
        let tokens = gguf.get_str_array("tokenizer.ggml.tokens")?;
        let merges = gguf.get_str_array("tokenizer.ggml.merges")?;
        // Optional in llama.cpp too: without it every token is a normal one.
        let types = match gguf.get_i32_array("tokenizer.ggml.token_type") {
            Ok(t) => t,
            Err(LoadError::MissingMetadata { .. }) => vec![1; tokens.len()],
            Err(e) => return Err(e.into()),
        };
        if types.len() != tokens.len() {
            return Err(invalid(format!(
                "{} token types for {} tokens",
                types.len(),
                tokens.len()
            )));
        }
        if u32::try_from(tokens.len()).is_err() {
            return Err(invalid(format!("{} tokens is too many", tokens.len())));
        }

        let vocab: Vocab = tokens
            .iter()
            .enumerate()
            .map(|(id, t)| (t.clone(), id as u32))
            .collect();
        if vocab.len() != tokens.len() {
            return Err(invalid("the token list has duplicates".into()));
        }
        let merges = merges
            .iter()
            .map(|m| {
                // llama.cpp splits at the first space after the first character.
                let split = m.char_indices().skip(1).find(|&(_, c)| c == ' ');
                match split {
                    Some((i, _)) => Ok((m[..i].to_owned(), m[i + 1..].to_owned())),
                    None => Err(invalid(format!("merge {m:?} has no space"))),
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(|e| invalid(format!("cannot build BPE: {e}")))?;

        let split = Split::new(
            SplitPattern::Regex(split_regex.into()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| invalid(format!("split regex: {e}")))?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner
            .with_pre_tokenizer(Some(Sequence::new(vec![
                split.into(),
                ByteLevel::new(false, false, false).into(),
            ])))
            .with_decoder(Some(ByteLevelDecoder::default()));

        let added = |special: bool, wanted: &[i32]| -> Vec<AddedToken> {
            tokens
                .iter()
                .zip(&types)
                .filter(|(_, ty)| wanted.contains(ty))
                .map(|(t, _)| AddedToken::from(t.clone(), special).normalized(false))
                .collect()
        };
        inner.add_special_tokens(&added(true, &[token_type::CONTROL, token_type::UNKNOWN]));
        inner.add_tokens(&added(false, &[token_type::USER_DEFINED]));

        let pieces = tokens.iter().zip(&types).map(|(t, &ty)| match ty {
            token_type::CONTROL | token_type::UNKNOWN | token_type::USER_DEFINED => Piece::Raw(t.clone()),
            token_type::UNUSED => Piece::Empty,
            _ => Piece::ByteLevel(t.clone()),
        });
        let (piece_bytes, piece_ends) = piece_table(pieces);
        // Optional, as in llama.cpp; an id outside the vocabulary is ignored.
        let declared = ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"]
            .iter()
            .filter_map(|k| gguf.get_u32(k).ok())
            .filter(|&id| (id as usize) < tokens.len())
            .collect();
        Ok(Self::assemble(inner, piece_bytes, piece_ends).with_declared_eog(declared))
    }

    fn assemble(inner: tokenizers::Tokenizer, piece_bytes: Vec<u8>, piece_ends: Vec<usize>) -> Tokenizer {
        let mut plain_added = inner.get_added_vocabulary().clone();
        plain_added.set_encode_special_tokens(true);
        Tokenizer {
            inner,
            plain_added,
            piece_bytes,
            piece_ends,
            declared_eog: vec![],
        }
    }

    /// This tokenizer with `ids` as the end-of-generation tokens its model declares (ids
    /// outside the vocabulary are dropped).
    pub(crate) fn with_declared_eog(mut self, ids: Vec<u32>) -> Tokenizer {
        let n = self.vocab_size();
        self.declared_eog = ids.into_iter().filter(|&id| (id as usize) < n).collect();
        self
    }

    /// Token ids of `text`, without BOS. With `parse_special`, control-token strings such as
    /// `<|fim_prefix|>` in the text become their ids; without it they are tokenized as plain
    /// text (use this for file contents, so a file cannot inject control tokens).
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>, TokenizerError> {
        // The steps of tokenizers' `encode` (no normalizer, no post-processor), with the added
        // vocabulary chosen per call instead of a `&mut` flag on the shared tokenizer.
        let added = if parse_special {
            self.inner.get_added_vocabulary()
        } else {
            &self.plain_added
        };
        let mut pieces = added.extract_and_normalize(self.inner.get_normalizer(), text);
        if let Some(pre) = self.inner.get_pre_tokenizer() {
            pre.pre_tokenize(&mut pieces).map_err(TokenizerError::Encode)?;
        }
        let model = self.inner.get_model();
        pieces
            .tokenize(|s| model.tokenize(s.get()))
            .map_err(TokenizerError::Encode)?;
        Ok(pieces
            .get_splits(OffsetReferential::Original, OffsetType::None)
            .into_iter()
            .flat_map(|(_, _, toks)| toks.iter().flatten().map(|t| t.id))
            .collect())
    }

    /// Text of `ids`, control tokens rendered as their text; invalid UTF-8 becomes U+FFFD and
    /// ids outside the vocabulary are skipped.
    #[cfg(test)]
    pub(crate) fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend_from_slice(self.token_bytes(id));
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The bytes token `id` decodes to (empty for unused or unknown ids).
    pub(crate) fn token_bytes(&self, id: u32) -> &[u8] {
        let id = id as usize;
        if id >= self.vocab_size() {
            return &[];
        }
        let start = if id == 0 { 0 } else { self.piece_ends[id - 1] };
        &self.piece_bytes[start..self.piece_ends[id]]
    }

    /// The id of the token whose vocabulary string is exactly `token`.
    pub(crate) fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Write the tokenizer as a Hugging Face `tokenizer.json`.
    pub(crate) fn save_json(&self, path: impl AsRef<Path>) -> Result<(), TokenizerError> {
        let path = path.as_ref();
        self.inner
            .save(path, false)
            .map_err(|source| TokenizerError::Save {
                path: path.to_owned(),
                source,
            })
    }

    /// Number of token ids (including added tokens).
    pub(crate) fn vocab_size(&self) -> usize {
        self.piece_ends.len()
    }

    /// The control tokens of `family`'s format, found by their text; every one must be in
    /// the vocabulary.
    pub(crate) fn special_tokens(&self, family: Family) -> Result<SpecialTokens, TokenizerError> {
        let format = family.fim();
        let id = |text: &'static str| {
            self.token_id(text)
                .ok_or(TokenizerError::MissingSpecialToken(text))
        };
        let mut eog = format.stop.iter().map(|t| id(t)).collect::<Result<Vec<_>, _>>()?;
        eog.extend(&self.declared_eog);
        eog.sort_unstable();
        eog.dedup();
        Ok(SpecialTokens {
            family,
            fim_prefix: id(format.prefix)?,
            fim_suffix: id(format.suffix)?,
            fim_middle: id(format.middle)?,
            fim_pad: id(format.pad)?,
            repo_name: id(format.repo_name)?,
            file_sep: id(format.file_sep)?,
            eog,
        })
    }

    /// A decoder for a stream of generated ids.
    pub(crate) fn stream_decoder(&self) -> StreamDecoder<'_> {
        StreamDecoder {
            tokenizer: self,
            pending: Vec::new(),
        }
    }
}

/// Turns token ids, one at a time, into text pieces that never split a UTF-8 character.
///
/// The concatenation of all [`push`](Self::push) results and [`finish`](Self::finish) equals
/// [`Tokenizer::decode`] of all the ids.
#[derive(Debug)]
pub(crate) struct StreamDecoder<'a> {
    tokenizer: &'a Tokenizer,
    /// Bytes of an incomplete UTF-8 character at the end of the stream so far (at most 3).
    pending: Vec<u8>,
}

impl StreamDecoder<'_> {
    /// Text completed by token `id`; empty while a character is still incomplete.
    pub(crate) fn push(&mut self, id: u32) -> String {
        self.pending.extend_from_slice(self.tokenizer.token_bytes(id));
        let mut out = String::new();
        let mut rest = &self.pending[..];
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        // Invalid bytes: replaced exactly as `String::from_utf8_lossy` does.
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[n..];
                        }
                        // A character cut off at the end: wait for the next token.
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        self.pending.drain(..self.pending.len() - keep);
        out
    }

    /// Flush what is held back (an unfinished character becomes U+FFFD).
    #[cfg(test)]
    pub(crate) fn finish(self) -> String {
        String::from_utf8_lossy(&self.pending).into_owned()
    }
}

enum Piece {
    /// Vocabulary string in GPT-2's byte-to-unicode alphabet.
    ByteLevel(String),
    /// Text emitted as is (control and user-defined tokens).
    Raw(String),
    Empty,
}

fn piece_table(pieces: impl Iterator<Item = Piece>) -> (Vec<u8>, Vec<usize>) {
    let unicode_to_byte = unicode_to_byte_table();
    let mut bytes = Vec::new();
    let mut ends = Vec::new();
    for piece in pieces {
        match piece {
            Piece::ByteLevel(s) => {
                let start = bytes.len();
                for c in s.chars() {
                    match unicode_to_byte.get(c as usize).copied().flatten() {
                        Some(b) => bytes.push(b),
                        // Not byte-level text: keep it verbatim, like the ByteLevel decoder.
                        None => {
                            bytes.truncate(start);
                            bytes.extend_from_slice(s.as_bytes());
                            break;
                        }
                    }
                }
            }
            Piece::Raw(s) => bytes.extend_from_slice(s.as_bytes()),
            Piece::Empty => {}
        }
        ends.push(bytes.len());
    }
    (bytes, ends)
}

/// Inverse of GPT-2's `bytes_to_unicode`: printable Latin-1 bytes map to themselves, the other
/// 68 bytes to U+0100.. in byte order. Indexed by code point (all are below U+0144).
fn unicode_to_byte_table() -> [Option<u8>; 0x144] {
    let mut table = [None; 0x144];
    let mut next = 0x100;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let c = if printable {
            usize::from(b)
        } else {
            next += 1;
            next - 1
        };
        table[c] = Some(b);
    }
    table
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::OnceLock;
    use std::time::Instant;

    use super::super::load::gguf::tests::{real_model_path, GgufWriter, MODEL_05B};
    use super::*;
    use crate::family::Family;

    fn reference() -> &'static serde_json::Value {
        static REF: OnceLock<serde_json::Value> = OnceLock::new();
        REF.get_or_init(|| {
            let path = concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../tests/data/reference-0.5b.json"
            );
            let text = std::fs::read_to_string(path).expect("read tests/data/reference-0.5b.json");
            serde_json::from_str(&text).expect("parse reference-0.5b.json")
        })
    }

    /// The real 0.5B's tokenizer, for the tests of its vocabulary against llama.cpp's
    /// reference: `None` (the test is skipped) unless `LAYA_TEST_REAL_MODELS=1`.
    fn qwen() -> Option<&'static Tokenizer> {
        static TOK: OnceLock<Tokenizer> = OnceLock::new();
        let path = real_model_path(MODEL_05B)?;
        Some(TOK.get_or_init(|| {
            let gguf = GgufFile::open(path).unwrap();
            let start = Instant::now();
            let tok = Tokenizer::from_gguf(&gguf).unwrap();
            eprintln!("tokenizer built from GGUF in {:?}", start.elapsed());
            tok
        }))
    }

    /// A byte-level vocabulary with no merges (every byte its own token, so characters of
    /// several bytes are always split) and Qwen2.5-Coder's control tokens: what the tests of
    /// behaviour that holds for any vocabulary run on without the real model.
    pub(crate) fn byte_level() -> Tokenizer {
        let table = unicode_to_byte_table();
        let mut tokens: Vec<String> = (0..=255u8)
            .map(|b| {
                let c = (0u32..0x144).find(|&c| table[c as usize] == Some(b)).unwrap();
                char::from_u32(c).unwrap().to_string()
            })
            .collect();
        let fim = Family::Qwen25Coder.fim();
        let controls = [
            fim.prefix,
            fim.suffix,
            fim.middle,
            fim.pad,
            fim.repo_name,
            fim.file_sep,
        ];
        for t in controls.iter().chain(fim.stop) {
            if !tokens.iter().any(|x| x == t) {
                tokens.push((*t).to_owned());
            }
        }
        let types: Vec<i32> = (0..tokens.len()).map(|i| if i < 256 { 1 } else { 3 }).collect();
        let tokens: Vec<&str> = tokens.iter().map(String::as_str).collect();
        let mut w = GgufWriter::new();
        w.str("tokenizer.ggml.model", "gpt2")
            .str("tokenizer.ggml.pre", "qwen2")
            .str_array("tokenizer.ggml.tokens", &tokens)
            .i32_array("tokenizer.ggml.token_type", &types)
            .str_array("tokenizer.ggml.merges", &[]);
        Tokenizer::from_gguf(&GgufFile::from_bytes("bytes.gguf", w.bytes()).unwrap()).unwrap()
    }

    /// The byte-level vocabulary, and the real 0.5B's too with `LAYA_TEST_REAL_MODELS=1`.
    pub(crate) fn any_vocabulary() -> Vec<Tokenizer> {
        let mut v = vec![byte_level()];
        if crate::testing::real_models() {
            let path = real_model_path(MODEL_05B).expect("the switch is on");
            v.push(Tokenizer::from_gguf(&GgufFile::open(path).unwrap()).unwrap());
        }
        v
    }

    fn ids(v: &serde_json::Value) -> Vec<u32> {
        v.as_array()
            .expect("id array")
            .iter()
            .map(|x| x.as_u64().expect("id") as u32)
            .collect()
    }

    #[test]
    fn tokenizer_can_be_shared_across_threads() {
        fn shareable<T: Send + Sync>() {}
        shareable::<Tokenizer>();
        shareable::<TokenizerError>();
    }

    #[test]
    fn byte_table_inverts_gpt2_bytes_to_unicode() {
        let t = unicode_to_byte_table();
        assert_eq!(t.iter().flatten().count(), 256);
        assert_eq!(t['A' as usize], Some(b'A'));
        assert_eq!(t['Ġ' as usize], Some(b' '));
        assert_eq!(t['Ċ' as usize], Some(b'\n'));
        assert_eq!(t[0x100], Some(0));
        assert_eq!(t[0x143], Some(0xAD));
    }

    #[test]
    fn reference_tokenization_matches_llama_cpp() {
        let Some(tok) = qwen() else {
            return;
        };
        let cases = reference()["tokenization"].as_array().unwrap();
        assert_eq!(cases.len(), 40);
        for c in cases {
            let text = c["text"].as_str().unwrap();
            assert_eq!(
                tok.encode(text, true).unwrap(),
                ids(&c["ids_special"]),
                "special: {text:?}"
            );
            assert_eq!(
                tok.encode(text, false).unwrap(),
                ids(&c["ids_nospecial"]),
                "no special: {text:?}"
            );
            if c["roundtrip_nospecial_ok"].as_bool().unwrap() {
                assert_eq!(tok.decode(&ids(&c["ids_nospecial"])), text);
            }
        }
    }

    #[test]
    fn reference_prompts_tokenize_like_llama_cpp() {
        let Some(tok) = qwen() else {
            return;
        };
        let prompts = reference()["prompts"].as_array().unwrap();
        assert_eq!(prompts.len(), 7);
        for p in prompts {
            let prompt = p["prompt"].as_str().unwrap();
            assert_eq!(
                tok.encode(prompt, true).unwrap(),
                ids(&p["prompt_token_ids"]),
                "prompt {}",
                p["name"]
            );
        }
    }

    #[test]
    fn own_pipeline_agrees_with_tokenizers_encode() {
        let Some(tok) = qwen() else {
            return;
        };
        for c in reference()["tokenization"].as_array().unwrap() {
            let text = c["text"].as_str().unwrap();
            let hf = tok.inner.encode(text, false).unwrap();
            assert_eq!(tok.encode(text, true).unwrap(), hf.get_ids(), "{text:?}");
        }
    }

    #[test]
    fn decode_renders_generated_text_like_llama_cpp() {
        let Some(tok) = qwen() else {
            return;
        };
        for p in reference()["prompts"].as_array().unwrap() {
            let gen = ids(&p["generated_token_ids"]);
            assert_eq!(
                tok.decode(&gen),
                p["generated_text"].as_str().unwrap(),
                "{}",
                p["name"]
            );
            // tokenizers' own decode agrees (no unused tokens in these outputs).
            assert_eq!(tok.decode(&gen), tok.inner.decode(&gen, false).unwrap());
        }
    }

    #[test]
    fn stream_decoder_reproduces_decode() {
        let Some(tok) = qwen() else {
            return;
        };
        let mut runs: Vec<Vec<u32>> = reference()["prompts"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|p| [ids(&p["generated_token_ids"]), ids(&p["prompt_token_ids"])])
            .collect();
        runs.extend(
            reference()["tokenization"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| ids(&c["ids_special"])),
        );
        for run in runs {
            let mut dec = tok.stream_decoder();
            let mut text: String = run.iter().map(|&id| dec.push(id)).collect();
            text.push_str(&dec.finish());
            assert_eq!(text, tok.decode(&run));
        }
    }

    #[test]
    fn stream_decoder_keeps_split_characters_whole() {
        for tok in any_vocabulary() {
            let text = "emoji 😀👍🏽🚀 日本語のテキスト 👨\u{200d}👩\u{200d}👧 🇩🇪";
            let ids = tok.encode(text, false).unwrap();
            // Some token must end inside a character, or this test would prove nothing.
            assert!(ids
                .iter()
                .any(|&id| std::str::from_utf8(tok.token_bytes(id)).is_err()));
            let mut dec = tok.stream_decoder();
            let mut held_back = 0;
            let mut out = String::new();
            for &id in &ids {
                let piece = dec.push(id);
                assert!(!piece.contains(char::REPLACEMENT_CHARACTER), "{piece:?}");
                held_back += usize::from(piece.is_empty());
                out.push_str(&piece);
            }
            assert!(held_back > 0);
            assert_eq!(dec.finish(), "");
            assert_eq!(out, text);
        }
    }

    #[test]
    fn stream_decoder_replaces_invalid_bytes_like_decode() {
        for tok in any_vocabulary() {
            let byte_token = |b: u8| {
                let c = (0u32..0x144)
                    .find(|&c| unicode_to_byte_table()[c as usize] == Some(b))
                    .and_then(char::from_u32)
                    .unwrap();
                tok.token_id(&c.to_string()).unwrap()
            };
            // A lone continuation byte, a truncated 3-byte sequence followed by ASCII, and a
            // dangling lead byte at the end.
            let ids = [
                byte_token(0x80),
                byte_token(b'a'),
                byte_token(0xE6),
                byte_token(0x97),
                byte_token(b'b'),
                byte_token(0xF0),
            ];
            let mut dec = tok.stream_decoder();
            let mut text: String = ids.iter().map(|&id| dec.push(id)).collect();
            assert_eq!(text, "\u{FFFD}a\u{FFFD}b");
            text.push_str(&dec.finish());
            assert_eq!(text, tok.decode(&ids));
            assert_eq!(text, "\u{FFFD}a\u{FFFD}b\u{FFFD}");
        }
    }

    #[test]
    fn special_tokens_match_models_md() {
        let Some(tok) = qwen() else {
            return;
        };
        let s = tok.special_tokens(Family::Qwen25Coder).unwrap();
        let r = &reference()["special_tokens"];
        let get = |k: &str| r[k].as_u64().unwrap() as u32;
        assert_eq!(s.fim_prefix, get("<|fim_prefix|>"));
        assert_eq!(s.fim_suffix, get("<|fim_suffix|>"));
        assert_eq!(s.fim_middle, get("<|fim_middle|>"));
        assert_eq!(s.fim_pad, get("<|fim_pad|>"));
        assert_eq!(s.repo_name, get("<|repo_name|>"));
        assert_eq!(s.file_sep, get("<|file_sep|>"));
        assert_eq!(s.eog, ids(&reference()["eog_token_ids"]));
        assert_eq!(s.eog, [151643, 151645, 151662, 151663, 151664]);
        // Qwen3-Coder's format is the same tokens: the same ids in this vocabulary.
        let q3 = tok.special_tokens(Family::Qwen3Coder).unwrap();
        assert_eq!(
            SpecialTokens {
                family: Family::Qwen25Coder,
                ..q3
            },
            s
        );
        assert_eq!(tok.vocab_size(), 151_936);
        assert_eq!(tok.token_id("<tool_call>"), Some(151_657));
    }

    #[test]
    fn parse_special_controls_only_control_tokens() {
        let Some(tok) = qwen() else {
            return;
        };
        let s = tok.special_tokens(Family::Qwen25Coder).unwrap();
        assert_eq!(tok.encode("<|fim_prefix|>", true).unwrap(), [s.fim_prefix]);
        assert!(tok.encode("<|fim_prefix|>", false).unwrap().len() > 1);
        // User-defined tokens are split out of plain text too (llama.cpp and HF agree).
        assert_eq!(tok.encode("<tool_call>", false).unwrap(), [151_657]);
        assert_eq!(tok.encode("<tool_call>", true).unwrap(), [151_657]);
        // Unused padding tokens are never produced and decode to nothing.
        assert!(!tok.encode("[PAD151665]", true).unwrap().contains(&151_665));
        assert_eq!(tok.decode(&[151_665]), "");
        assert_eq!(tok.decode(&[u32::MAX]), "");
        assert!(tok.encode("", true).unwrap().is_empty());
    }

    /// The GGUF-built tokenizer saved as tokenizer.json and loaded back through `from_file`
    /// tokenizes and decodes the reference exactly like the original.
    #[test]
    fn tokenizer_json_round_trip_matches_reference() {
        let Some(tok) = qwen() else {
            return;
        };
        let path = std::env::temp_dir().join(format!("laya-tokenizer-{}.json", std::process::id()));
        tok.inner.save(&path, false).unwrap();
        let loaded = Tokenizer::from_file(&path);
        std::fs::remove_file(&path).unwrap();
        let loaded = loaded.unwrap();
        assert_eq!(loaded.vocab_size(), tok.vocab_size());
        let family = Family::Qwen25Coder;
        assert_eq!(
            loaded.special_tokens(family).unwrap(),
            tok.special_tokens(family).unwrap()
        );
        for c in reference()["tokenization"].as_array().unwrap() {
            let text = c["text"].as_str().unwrap();
            assert_eq!(
                loaded.encode(text, true).unwrap(),
                ids(&c["ids_special"]),
                "{text:?}"
            );
            assert_eq!(
                loaded.encode(text, false).unwrap(),
                ids(&c["ids_nospecial"]),
                "{text:?}"
            );
        }
        for p in reference()["prompts"].as_array().unwrap() {
            let gen = ids(&p["generated_token_ids"]);
            assert_eq!(loaded.decode(&gen), p["generated_text"].as_str().unwrap());
        }
        let missing = Tokenizer::from_file(std::env::temp_dir().join("laya-no-such-tokenizer.json"));
        assert!(matches!(missing, Err(TokenizerError::Load { .. })));
    }

    #[test]
    fn builds_from_gguf_quickly() {
        let Some(path) = real_model_path(MODEL_05B) else {
            return;
        };
        let gguf = GgufFile::open(path).unwrap();
        let start = Instant::now();
        let tok = Tokenizer::from_gguf(&gguf).unwrap();
        let took = start.elapsed();
        eprintln!("Tokenizer::from_gguf: {took:?}");
        assert_eq!(tok.vocab_size(), 151_936);
        // Generous bound for a busy 2-core CI box (release build measures ~0.1-0.3 s).
        assert!(took.as_secs_f64() < 5.0, "building the tokenizer took {took:?}");
    }

    #[test]
    fn unsupported_tokenizer_kinds_are_named() {
        let file = |kv: &[(&str, &str)]| {
            let mut w = GgufWriter::new();
            for (k, v) in kv {
                w.str(k, v);
            }
            GgufFile::from_bytes("tok.gguf", w.bytes()).unwrap()
        };
        let e = Tokenizer::from_gguf(&file(&[("tokenizer.ggml.model", "llama")])).unwrap_err();
        assert!(
            e.to_string().contains("\"llama\"") && e.to_string().contains("gpt2"),
            "{e}"
        );
        let gpt2 = ("tokenizer.ggml.model", "gpt2");
        let e = Tokenizer::from_gguf(&file(&[gpt2, ("tokenizer.ggml.pre", "llama-bpe")])).unwrap_err();
        assert!(
            e.to_string().contains("llama-bpe") && e.to_string().contains("qwen2"),
            "{e}"
        );
        let e = Tokenizer::from_gguf(&file(&[gpt2, ("tokenizer.ggml.pre", "qwen2")])).unwrap_err();
        assert!(
            matches!(e, TokenizerError::Gguf(LoadError::MissingMetadata { .. })),
            "{e}"
        );
    }

    /// A toy vocabulary: merges apply lowest rank first, control tokens split out only with
    /// `parse_special`, and the bytes of every token decode back.
    #[test]
    fn tiny_gguf_vocabulary_builds_and_encodes() {
        let mut w = GgufWriter::new();
        w.str("tokenizer.ggml.model", "gpt2")
            .str("tokenizer.ggml.pre", "qwen2")
            .str_array(
                "tokenizer.ggml.tokens",
                &[
                    "a", "b", "c", "Ġ", "ab", "bc", "abc", "Ġa", "<|x|>", "<", "|", "x", ">", "[PAD9]",
                ],
            )
            .i32_array(
                "tokenizer.ggml.token_type",
                &[1, 1, 1, 1, 1, 1, 1, 1, 3, 1, 1, 1, 1, 5],
            )
            .str_array("tokenizer.ggml.merges", &["b c", "a b", "a bc", "Ġ a"]);
        let gguf = GgufFile::from_bytes("toy.gguf", w.bytes()).unwrap();
        let tok = Tokenizer::from_gguf(&gguf).unwrap();
        // "b c" (rank 0) beats "a b" (rank 1), then "a bc" forms "abc".
        assert_eq!(tok.encode("abc", false).unwrap(), [6]);
        assert_eq!(tok.encode("ab a", false).unwrap(), [4, 7]);
        assert_eq!(tok.encode("a<|x|>", true).unwrap(), [0, 8]);
        assert_eq!(tok.encode("a<|x|>", false).unwrap(), [0, 9, 10, 11, 10, 12]);
        assert_eq!(tok.decode(&[4, 7, 8, 13]), "ab a<|x|>");
        assert_eq!(tok.vocab_size(), 14);
        assert!(matches!(
            tok.special_tokens(Family::Qwen25Coder),
            Err(TokenizerError::MissingSpecialToken(_))
        ));
    }

    /// Qwen3.5's pre-tokenizer keeps a combining mark with its letter, Qwen2's splits it off:
    /// `e` + U+0301 (bytes CC 81, byte-level `Ìģ`) merges into one token only with the first.
    #[test]
    fn the_qwen35_pre_tokenizer_keeps_marks_with_their_letters() {
        let encode = |pre: &str| {
            let mut w = GgufWriter::new();
            w.str("tokenizer.ggml.model", "gpt2")
                .str("tokenizer.ggml.pre", pre)
                .str_array("tokenizer.ggml.tokens", &["e", "Ì", "ģ", "Ìģ", "eÌģ"])
                .str_array("tokenizer.ggml.merges", &["Ì ģ", "e Ìģ"]);
            let tok = Tokenizer::from_gguf(&GgufFile::from_bytes("marks.gguf", w.bytes()).unwrap()).unwrap();
            tok.encode("e\u{301}", false).unwrap()
        };
        assert_eq!(encode("qwen35"), [4]);
        assert_eq!(encode("qwen2"), [0, 3]);
    }

    /// A vocabulary laid out as Qwen3-Coder's (its control tokens at their ids after 151643,
    /// `<think>` after them) with its declared end token: for each family, the format's tokens
    /// resolve to the vocabulary's ids, and the stop ids are the format's plus what the file
    /// declares.
    #[test]
    fn special_tokens_follow_the_family_and_the_declared_end_tokens() {
        const CONTROL: [&str; 26] = [
            "<|endoftext|>",
            "<|im_start|>",
            "<|im_end|>",
            "<|object_ref_start|>",
            "<|object_ref_end|>",
            "<|box_start|>",
            "<|box_end|>",
            "<|quad_start|>",
            "<|quad_end|>",
            "<|vision_start|>",
            "<|vision_end|>",
            "<|vision_pad|>",
            "<|image_pad|>",
            "<|video_pad|>",
            "<tool_call>",
            "</tool_call>",
            "<|fim_prefix|>",
            "<|fim_middle|>",
            "<|fim_suffix|>",
            "<|fim_pad|>",
            "<|repo_name|>",
            "<|file_sep|>",
            "<tool_response>",
            "</tool_response>",
            "<think>",
            "</think>",
        ];
        let base = 151_643u32;
        let mut tokens: Vec<String> = (0..base).map(|i| format!("t{i}")).collect();
        tokens.extend(CONTROL.iter().map(|t| t.to_string()));
        let tokens: Vec<&str> = tokens.iter().map(String::as_str).collect();
        let mut types = vec![1; base as usize];
        types.extend([3; CONTROL.len()]);
        let vocab = |declared: &[(&str, u32)]| {
            let mut w = GgufWriter::new();
            w.str("tokenizer.ggml.model", "gpt2")
                .str("tokenizer.ggml.pre", "qwen2")
                .str_array("tokenizer.ggml.tokens", &tokens)
                .i32_array("tokenizer.ggml.token_type", &types)
                .str_array("tokenizer.ggml.merges", &[]);
            for (k, v) in declared {
                w.u32(k, *v);
            }
            Tokenizer::from_gguf(&GgufFile::from_bytes("qwen3-coder.gguf", w.bytes()).unwrap()).unwrap()
        };
        // Qwen3-Coder declares <|im_end|> its end token, already a stop token.
        let tok = vocab(&[("tokenizer.ggml.eos_token_id", 151_645)]);
        for family in Family::ALL {
            let s = tok.special_tokens(family).unwrap();
            assert_eq!(s.family, family);
            let ids = [
                s.fim_prefix,
                s.fim_middle,
                s.fim_suffix,
                s.fim_pad,
                s.repo_name,
                s.file_sep,
            ];
            assert_eq!(
                ids,
                [151_659, 151_660, 151_661, 151_662, 151_663, 151_664],
                "{family:?}"
            );
            assert_eq!(s.eog, [151_643, 151_645, 151_662, 151_663, 151_664], "{family:?}");
            for t in family.fim().stop {
                assert!(s.eog.contains(&tok.token_id(t).unwrap()), "{family:?}: {t}");
            }
        }
        // An end-of-turn token the file declares stops generation too; an id past the
        // vocabulary is ignored.
        let tok = vocab(&[
            ("tokenizer.ggml.eot_token_id", 151_668),
            ("tokenizer.ggml.eos_token_id", 999_999),
        ]);
        let s = tok.special_tokens(Family::Qwen3Coder).unwrap();
        assert_eq!(s.eog, [151_643, 151_645, 151_662, 151_663, 151_664, 151_668]);
    }
}
