//! A tiny Qwen2 GGUF (and a GGUF of its vocabulary alone, for the models of random weights the
//! tests build): a byte-level vocabulary (the 256 byte tokens, no merges, Qwen's special
//! tokens), 2 layers of width 64, F32 tensors. It loads, converts and answers in milliseconds,
//! so the loader's faults (truncation, corrupt tables, a full disk under the converted-weights
//! cache) and serving end to end can be tested on a real file without real weights; the engine's
//! tests and laya's share it.
//!
//! The weights are chosen, not random: every embedding row is small and positive except the
//! one of `a`, so greedy decoding writes `a` forever (no end-of-text token): a generation runs
//! until `max_tokens` unless it is cancelled.

use std::{
    ops::Range,
    path::{Path, PathBuf},
};

const F32: u32 = 0;
const HIDDEN: u64 = 64;
const INTER: u64 = 128;
const LAYERS: u64 = 2;
const HEADS: u64 = 2;
const KV_HEADS: u64 = 1;
const HEAD_DIM: u64 = HIDDEN / HEADS;
const ALIGN: usize = 32;

/// The token every generation repeats.
pub const TOKEN_TEXT: &str = "a";

pub(crate) const SPECIALS: &[&str] = &[
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
];

/// Deterministic uniform(-1, 1) numbers (an LCG), the weights' source (and the engine's
/// tests').
pub(crate) struct Lcg(pub(crate) u64);

impl Lcg {
    pub(crate) fn next_f32(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    pub(crate) fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next_f32()).collect()
    }
}

/// The file's bytes and where its parts lie.
pub struct TinyGguf {
    pub bytes: Vec<u8>,
    /// The tensor infos (name, dims, type, offset of each tensor).
    pub table: Range<usize>,
    /// Each tensor's info within `table`, by GGUF name.
    pub(crate) infos: Vec<(String, Range<usize>)>,
    /// Start of the tensor data.
    pub data_offset: usize,
}

impl TinyGguf {
    /// The byte range of the info of tensor `name`.
    pub fn info(&self, name: &str) -> Range<usize> {
        self.infos
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no tensor {name}"))
            .1
            .clone()
    }
}

/// GPT-2's byte → printable character map (what byte-level BPE vocabularies store).
fn byte_chars() -> Vec<char> {
    let printable: Vec<u32> = (u32::from(b'!')..=u32::from(b'~'))
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut chars = vec!['\0'; 256];
    for &b in &printable {
        chars[b as usize] = char::from_u32(b).unwrap();
    }
    let mut extra = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            chars[b as usize] = char::from_u32(256 + extra).unwrap();
            extra += 1;
        }
    }
    chars
}

struct Writer(Vec<u8>);

impl Writer {
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn str(&mut self, s: &str) {
        self.u64(s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
    }
    fn key(&mut self, k: &str, ty: u32) {
        self.str(k);
        self.u32(ty);
    }
    fn kv_u32(&mut self, k: &str, v: u32) {
        self.key(k, 4);
        self.u32(v);
    }
    fn kv_f32(&mut self, k: &str, v: f32) {
        self.key(k, 6);
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn kv_str(&mut self, k: &str, v: &str) {
        self.key(k, 8);
        self.str(v);
    }
    fn kv_strs(&mut self, k: &str, v: &[String]) {
        self.key(k, 9);
        self.u32(8);
        self.u64(v.len() as u64);
        for s in v {
            self.str(s);
        }
    }
    fn kv_i32s(&mut self, k: &str, v: &[i32]) {
        self.key(k, 9);
        self.u32(5);
        self.u64(v.len() as u64);
        for x in v {
            self.0.extend_from_slice(&x.to_le_bytes());
        }
    }
}

/// The tensors (GGUF name, dims with ne0 first, values).
fn tensors(vocab: u64) -> Vec<(String, Vec<u64>, Vec<f32>)> {
    let mut lcg = Lcg(7);
    let mut small = |n: u64| -> Vec<f32> { lcg.vec(n as usize).iter().map(|x| x * 1e-3).collect() };
    let a = byte_chars()
        .iter()
        .position(|&c| c.to_string() == TOKEN_TEXT)
        .unwrap();
    let mut embd = Vec::with_capacity((vocab * HIDDEN) as usize);
    let mut u = Lcg(11);
    for t in 0..vocab as usize {
        for _ in 0..HIDDEN {
            let x = (u.next_f32() + 1.0) / 2.0; // [0, 1)
            embd.push(if t == a { 1.0 + 0.01 * x } else { 0.01 + 0.01 * x });
        }
    }
    let mut v = vec![("token_embd.weight".to_owned(), vec![HIDDEN, vocab], embd)];
    let q = HEADS * HEAD_DIM;
    let kv = KV_HEADS * HEAD_DIM;
    for l in 0..LAYERS {
        let p = |s: &str| format!("blk.{l}.{s}");
        v.push((p("attn_norm.weight"), vec![HIDDEN], vec![1.0; HIDDEN as usize]));
        v.push((p("attn_q.weight"), vec![HIDDEN, q], small(HIDDEN * q)));
        v.push((p("attn_q.bias"), vec![q], small(q)));
        v.push((p("attn_k.weight"), vec![HIDDEN, kv], small(HIDDEN * kv)));
        v.push((p("attn_k.bias"), vec![kv], small(kv)));
        v.push((p("attn_v.weight"), vec![HIDDEN, kv], small(HIDDEN * kv)));
        v.push((p("attn_v.bias"), vec![kv], small(kv)));
        v.push((p("attn_output.weight"), vec![q, HIDDEN], small(q * HIDDEN)));
        v.push((p("ffn_norm.weight"), vec![HIDDEN], vec![1.0; HIDDEN as usize]));
        v.push((p("ffn_gate.weight"), vec![HIDDEN, INTER], small(HIDDEN * INTER)));
        v.push((p("ffn_up.weight"), vec![HIDDEN, INTER], small(HIDDEN * INTER)));
        v.push((p("ffn_down.weight"), vec![INTER, HIDDEN], small(INTER * HIDDEN)));
    }
    v.push((
        "output_norm.weight".to_owned(),
        vec![HIDDEN],
        vec![1.0; HIDDEN as usize],
    ));
    v
}

/// The byte-level vocabulary: the 256 byte tokens, then [`SPECIALS`] (control tokens), then,
/// up to `size` tokens, fillers (`tok300`: normal tokens no text encodes to).
fn vocabulary(size: usize) -> (Vec<String>, Vec<i32>) {
    let mut tokens: Vec<String> = byte_chars().iter().map(|c| c.to_string()).collect();
    let mut types = vec![1i32; tokens.len()];
    for s in SPECIALS {
        tokens.push((*s).to_owned());
        types.push(3); // control
    }
    for i in tokens.len()..size {
        tokens.push(format!("tok{i}"));
        types.push(1);
    }
    (tokens, types)
}

/// A GGUF of the byte-level vocabulary and no tensors, `size` tokens long: the tokenizer of
/// the models the tests build from random weights ([`tiny`](super::tiny), whose vocabulary is
/// Qwen's 151,936 ids), in place of the real model's.
pub fn vocab_gguf(size: usize) -> Vec<u8> {
    let (tokens, types) = vocabulary(size);
    let mut w = Writer(b"GGUF".to_vec());
    w.u32(3);
    w.u64(0);
    w.u64(6);
    w.kv_str("general.architecture", "qwen2");
    w.kv_str("tokenizer.ggml.model", "gpt2");
    w.kv_str("tokenizer.ggml.pre", "qwen2");
    w.kv_strs("tokenizer.ggml.tokens", &tokens);
    w.kv_i32s("tokenizer.ggml.token_type", &types);
    w.kv_strs("tokenizer.ggml.merges", &[]);
    w.0
}

/// [`vocab_gguf`] of [`tiny`](super::tiny)'s vocabulary, written as `vocab.gguf` in `dir`.
pub fn write_vocab(dir: &Path) -> std::io::Result<PathBuf> {
    let path = dir.join("vocab.gguf");
    std::fs::write(&path, vocab_gguf(super::tiny().vocab_size as usize))?;
    Ok(path)
}

/// The tiny model, written as `tiny.gguf` in `dir`.
pub fn write_tiny(dir: &Path) -> std::io::Result<PathBuf> {
    let path = dir.join("tiny.gguf");
    std::fs::write(&path, tiny_gguf().bytes)?;
    Ok(path)
}

/// The tiny model as GGUF bytes.
pub fn tiny_gguf() -> TinyGguf {
    let (tokens, types) = vocabulary(0);
    let vocab = tokens.len() as u64;
    let tensors = tensors(vocab);

    let mut w = Writer(b"GGUF".to_vec());
    w.u32(3);
    w.u64(tensors.len() as u64);
    w.u64(13);
    w.kv_str("general.architecture", "qwen2");
    w.kv_u32("general.alignment", ALIGN as u32);
    w.kv_u32("qwen2.embedding_length", HIDDEN as u32);
    w.kv_u32("qwen2.feed_forward_length", INTER as u32);
    w.kv_u32("qwen2.block_count", LAYERS as u32);
    w.kv_u32("qwen2.attention.head_count", HEADS as u32);
    w.kv_u32("qwen2.attention.head_count_kv", KV_HEADS as u32);
    w.kv_f32("qwen2.rope.freq_base", 1_000_000.0);
    w.kv_str("tokenizer.ggml.model", "gpt2");
    w.kv_str("tokenizer.ggml.pre", "qwen2");
    w.kv_strs("tokenizer.ggml.tokens", &tokens);
    w.kv_i32s("tokenizer.ggml.token_type", &types);
    // No merges: every byte is its own token.
    w.kv_strs("tokenizer.ggml.merges", &[]);

    let table_start = w.0.len();
    let mut infos = vec![];
    let mut offset = 0u64;
    for (name, dims, values) in &tensors {
        let start = w.0.len();
        w.str(name);
        w.u32(dims.len() as u32);
        for &d in dims {
            w.u64(d);
        }
        w.u32(F32);
        w.u64(offset);
        infos.push((name.clone(), start..w.0.len()));
        offset = ((offset as usize + values.len() * 4).next_multiple_of(ALIGN)) as u64;
    }
    let table = table_start..w.0.len();
    let data_offset = w.0.len().next_multiple_of(ALIGN);
    w.0.resize(data_offset, 0);
    for (_, _, values) in &tensors {
        for x in values {
            w.0.extend_from_slice(&x.to_le_bytes());
        }
        let padded = w.0.len().next_multiple_of(ALIGN);
        w.0.resize(padded, 0);
    }
    TinyGguf {
        bytes: w.0,
        table,
        infos,
        data_offset,
    }
}
