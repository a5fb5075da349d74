//! Qwen3.5 (Gated DeltaNet and gated attention layers) against mlx-lm 0.32.2's `qwen3_5`.
//!
//! `tests/data/qwen35-reference.json` (written by `scripts/gen_qwen35_reference.py`) holds, for
//! five variants of a tiny model (f32; bf16 quantized to q4 and to q8, group 64, as mlx-lm's
//! convert makes them; a mixture of experts with a shared expert, `qwen3_5_moe`, in f32;
//! Qwen3-Next's layout, `qwen3_next`, in f32),
//! each tensor's name, shape and spread, the tensors mlx-lm saved (names,
//! shapes, dtypes: the mlx-community layout), the config.json it wrote and its logits of a
//! 20-token prompt at 8 positions. The weights are not stored: both sides make them from the
//! engine's LCG (`Lcg`) seeded per tensor. Each test here makes them, writes the folder as
//! mlx-lm saved it (checked tensor by tensor against the fixture's list), loads it with laya's
//! loader and runs laya's model.
//!
//! Tolerances (max |Δ logit|; the logits' standard deviation is about 1), on the CPU: f32
//! 1e-4 (measured: 2.2e-6), bf16 q4 and q8 1e-3 (measured: 7.5e-9, the fixture's rounding;
//! the bf16 outputs of the recurrence absorb the f32 differences); on a GPU [`tol`] and 0.1.
//! Chunked prefill, decode steps and rewinds are laya against laya: 5e-5 on the CPU ([`PATHS`];
//! bf16 as above).

use std::{collections::HashMap, path::Path};

use mlx_rs::{ops, ops::indexing::TryIndexOp, transforms::eval, Array, Dtype};
use serde::Deserialize;

use super::mlx;
use crate::{
    cache::{rewind, KvCache},
    cancel::Cancel,
    generate::{prefill_anchored, Chunking, Control, GenerateRequest, Pacing},
    load::{self, gguf::GgufFile, LoadOptions},
    models::{test_util::tol, Model},
    prefix::{fim_anchor, generate_with_store, generate_with_store_paced, PrefixLimits, PrefixStore},
    seam::Precision,
    synthetic::gguf::{vocab_gguf, Lcg},
    tokenizer::Tokenizer,
};

#[derive(Deserialize)]
struct Fixture {
    seed: u64,
    mlx_lm: String,
    prompt: Vec<u32>,
    positions: Vec<usize>,
    variants: Vec<Variant>,
}

#[derive(Deserialize)]
struct Variant {
    name: String,
    dtype: String,
    quantization: Option<Quantization>,
    config_json: serde_json::Value,
    tensors: Vec<TensorSpec>,
    saved: Vec<Saved>,
    logits: Vec<Vec<f32>>,
}

#[derive(Deserialize)]
struct Quantization {
    group_size: i32,
    bits: i32,
}

#[derive(Deserialize)]
struct TensorSpec {
    name: String,
    shape: Vec<i32>,
    scale: f32,
    center: f32,
}

#[derive(Deserialize, Debug, PartialEq)]
struct Saved {
    name: String,
    shape: Vec<i32>,
    dtype: String,
}

/// Two f32 computations of the same logits by laya whose recurrences take different forms (a
/// run of 8 tokens or more in chunks, a shorter one token by token; measured up to 1.1e-5).
const PATHS: f32 = 5e-5;

fn fixture() -> Fixture {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/data/qwen35-reference.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).expect("read the Qwen3.5 reference"))
        .expect("parse the Qwen3.5 reference")
}

fn fnv1a64(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The tensor `spec` describes: `center + scale * u`, u from the LCG seeded with
/// `seed ^ fnv1a64(name)` (the generator's `values`).
fn dense(seed: u64, spec: &TensorSpec) -> Array {
    let n = spec.shape.iter().product::<i32>() as usize;
    let mut lcg = Lcg(seed ^ fnv1a64(&spec.name));
    let v: Vec<f32> = (0..n)
        .map(|_| spec.center + spec.scale * lcg.next_f32())
        .collect();
    Array::from_slice(&v, &spec.shape)
}

fn dtype_name(d: Dtype) -> String {
    match d {
        Dtype::Float32 => "float32",
        Dtype::Bfloat16 => "bfloat16",
        Dtype::Float16 => "float16",
        Dtype::Uint32 => "uint32",
        other => panic!("unexpected dtype {other:?}"),
    }
    .into()
}

/// The variant's tensors as mlx-lm saved them: floats cast to the variant's dtype (A_log
/// kept f32, as mlx-lm's convert keeps it), then every linear and embedding matrix whose rows
/// split into groups quantized (weight, scales, biases).
fn saved_weights(f: &Fixture, v: &Variant) -> HashMap<String, Array> {
    let mut out = HashMap::new();
    for spec in &v.tensors {
        let mut a = dense(f.seed, spec);
        if v.dtype == "bfloat16" && !spec.name.ends_with(".A_log") {
            a = a.as_dtype(Dtype::Bfloat16).unwrap();
        }
        let quantize = v
            .quantization
            .as_ref()
            .filter(|q| spec.name.ends_with(".weight") && a.ndim() == 2 && a.dim(-1) % q.group_size == 0);
        match quantize {
            Some(q) => {
                let (w, s, b) = ops::quantize(&a, q.group_size, q.bits).unwrap();
                let stem = spec.name.trim_end_matches(".weight");
                out.insert(format!("{stem}.scales"), s);
                out.insert(format!("{stem}.biases"), b);
                out.insert(spec.name.clone(), w);
            }
            None => {
                out.insert(spec.name.clone(), a);
            }
        }
    }
    out
}

/// Writes the variant's folder (config.json as mlx-lm wrote it, model.safetensors,
/// tokenizer.json of the tests' byte-level vocabulary) and checks its tensors are the ones
/// mlx-lm saved.
fn write_variant(dir: &Path, f: &Fixture, v: &Variant) {
    let weights = saved_weights(f, v);
    let mut layout: Vec<Saved> = weights
        .iter()
        .map(|(name, a)| Saved {
            name: name.clone(),
            shape: a.shape().to_vec(),
            dtype: dtype_name(a.dtype()),
        })
        .collect();
    layout.sort_by(|a, b| a.name.cmp(&b.name));
    assert_eq!(layout, v.saved, "{}: the folder's tensors are mlx-lm's", v.name);
    std::fs::write(dir.join("config.json"), v.config_json.to_string()).unwrap();
    Array::save_safetensors(&weights, None, dir.join("model.safetensors")).unwrap();
    let vocab = dir.join("vocab.gguf");
    let text = v.config_json.get("text_config").unwrap_or(&v.config_json);
    let size = text["vocab_size"].as_u64().unwrap() as usize;
    std::fs::write(&vocab, vocab_gguf(size)).unwrap();
    let tokenizer = Tokenizer::from_gguf(&GgufFile::open(&vocab).unwrap()).unwrap();
    tokenizer.save_json(dir.join("tokenizer.json")).unwrap();
    std::fs::remove_file(vocab).unwrap();
}

/// Two bf16 computations of the same logits: 1e-3 on the CPU, where laya runs mlx-lm's ops in
/// its order and the logits agree to ~1e-8; 0.1 on a GPU (bf16 rounds at 2⁻⁸ relative, and
/// the kernels' order moves the rounding).
fn bf16_tol() -> f32 {
    if crate::models::on_gpu() {
        0.1
    } else {
        1e-3
    }
}

fn opts() -> LoadOptions {
    LoadOptions {
        precision: Precision::Native,
        group_size: 64,
        use_cache: false,
        progress: false,
        ..Default::default()
    }
}

/// The variant `name` of the fixture, written and loaded by laya's loader.
fn load_variant(f: &Fixture, name: &str) -> Model {
    let v = f.variants.iter().find(|v| v.name == name).expect("variant");
    let dir = tempfile::tempdir().unwrap();
    write_variant(dir.path(), f, v);
    load::load(dir.path(), &opts()).unwrap().model
}

fn tokens(ids: &[u32]) -> Array {
    Array::from_slice(ids, &[1, ids.len() as i32])
}

fn all_logits(model: &Model, ids: &[u32]) -> Array {
    let out = model.forward_all(&tokens(ids), &mut model.new_caches()).unwrap();
    eval([&out]).unwrap();
    out
}

fn max_abs_diff(a: &Array, b: &Array) -> f32 {
    assert_eq!(a.shape(), b.shape());
    let d = a.subtract(b).unwrap().abs().unwrap().max(None).unwrap();
    d.item_exact::<f32>()
}

/// laya's logits of the prompt at the fixture's positions against mlx-lm's: the max |Δ|.
fn diff_to_reference(f: &Fixture, name: &str) -> f32 {
    let v = f.variants.iter().find(|v| v.name == name).unwrap();
    let model = load_variant(f, name);
    let cfg = model.config();
    assert_eq!(cfg.arch, crate::models::Arch::Qwen35);
    let hybrid = cfg.hybrid.as_ref().unwrap();
    assert_eq!(hybrid.linear_layers, [true, false, true, false]);
    assert_eq!(hybrid.rope_dims, 8);
    let got = all_logits(&model, &f.prompt);
    let mut worst = 0f32;
    for (row, &p) in v.logits.iter().zip(&f.positions) {
        let want = Array::from_slice(row, &[row.len() as i32]);
        let have = got.try_index((0, p as i32)).unwrap();
        worst = worst.max(max_abs_diff(&have, &want));
    }
    // Not a vacuous comparison: the logits vary.
    let spread = ops::std(&got, None, None).unwrap().item_exact::<f32>();
    assert!(spread > 0.5, "{name}: logits std {spread}");
    eprintln!("{name}: max |Δ logit| against mlx-lm {} {worst:.2e}", f.mlx_lm);
    worst
}

#[test]
fn f32_logits_match_mlx_lm() {
    let (_g, _b) = mlx();
    let f = fixture();
    let d = diff_to_reference(&f, "f32");
    assert!(d <= tol(1e-4), "max |Δ logit| {d}");
}

#[test]
fn bf16_q4_and_q8_folders_match_mlx_lm() {
    let (_g, _b) = mlx();
    let f = fixture();
    for name in ["bf16-q4", "bf16-q8"] {
        let d = diff_to_reference(&f, name);
        assert!(d <= bf16_tol(), "{name}: max |Δ logit| {d}");
    }
}

/// The mixture of experts (`qwen3_5_moe`: routed experts and a shared one in every layer).
#[test]
fn moe_f32_logits_match_mlx_lm() {
    let (_g, _b) = mlx();
    let f = fixture();
    let d = diff_to_reference(&f, "moe-f32");
    assert!(d <= tol(1e-4), "max |Δ logit| {d}");
}

/// Qwen3-Next's layout (`qwen3_next`: the DeltaNet's projections interleaved per key head,
/// settings at the top level, a dense MLP in one layer of a mixture).
#[test]
fn qwen3_next_f32_logits_match_mlx_lm() {
    let (_g, _b) = mlx();
    let f = fixture();
    let d = diff_to_reference(&f, "next-f32");
    assert!(d <= tol(1e-4), "max |Δ logit| {d}");
}

/// Qwen3-Next's interleaved projections quantized (q4, group 64) are regrouped row by row, packed
/// weights, scales and biases alike: the model equals the one of their dequantized values.
#[test]
fn quantized_interleaved_projections_equal_their_dequantized_values() {
    let (_g, _b) = mlx();
    let f = fixture();
    let v = f.variants.iter().find(|v| v.name == "next-f32").unwrap();
    let cfg = load_variant(&f, "next-f32").config().clone();
    let (mut quantized, mut dequantized) = (HashMap::new(), HashMap::new());
    for spec in &v.tensors {
        let a = dense(f.seed, spec);
        if spec.name.contains(".in_proj_") {
            let (w, s, b) = ops::quantize(&a, 64, 4).unwrap();
            dequantized.insert(spec.name.clone(), ops::dequantize(&w, &s, &b, 64, 4).unwrap());
            let stem = spec.name.trim_end_matches(".weight");
            quantized.insert(format!("{stem}.scales"), s);
            quantized.insert(format!("{stem}.biases"), b);
            quantized.insert(spec.name.clone(), w);
        } else {
            quantized.insert(spec.name.clone(), a.clone());
            dequantized.insert(spec.name.clone(), a);
        }
    }
    let q = Model::from_weights(cfg.clone(), quantized, 64).unwrap();
    let d = Model::from_weights(cfg, dequantized, 64).unwrap();
    let diff = max_abs_diff(&all_logits(&q, &f.prompt), &all_logits(&d, &f.prompt));
    assert!(diff <= tol(1e-4), "max |Δ logit| {diff}");
}

/// The same weights in Hugging Face's layout (`model.language_model.`, conv1d `[C, 1, K]`,
/// norms stored as `weight - 1`, the experts' gate and up rows in one `experts.gate_up_proj`,
/// an MTP head and a vision tower to skip) give the same model, dense and mixture.
#[test]
fn a_hugging_face_layout_loads_as_mlx_community_s() {
    let (_g, _b) = mlx();
    let f = fixture();
    for name in ["f32", "moe-f32"] {
        let v = f.variants.iter().find(|v| v.name == name).unwrap();
        let reference = load_variant(&f, name);
        let model = Model::from_weights(reference.config().clone(), hf_layout(&f, v), 64).unwrap();
        let d = max_abs_diff(&all_logits(&model, &f.prompt), &all_logits(&reference, &f.prompt));
        assert!(d <= tol(1e-4), "{name}: max |Δ logit| {d}");
    }
}

/// The variant's (f32) tensors as a Hugging Face checkpoint stores them.
fn hf_layout(f: &Fixture, v: &Variant) -> HashMap<String, Array> {
    let mut hf = HashMap::new();
    let mut experts: HashMap<String, [Option<Array>; 2]> = HashMap::new();
    for spec in &v.tensors {
        let mut a = dense(f.seed, spec);
        let name = spec
            .name
            .replace("language_model.model.", "model.language_model.");
        let name = name.replace("language_model.lm_head", "lm_head");
        if name.ends_with(".conv1d.weight") {
            a = a.swap_axes(1, 2).unwrap();
        }
        let norm = [
            "input_layernorm.weight",
            "post_attention_layernorm.weight",
            "model.language_model.norm.weight",
            "q_norm.weight",
            "k_norm.weight",
        ];
        if norm.iter().any(|n| name.ends_with(n)) {
            a = a.subtract(Array::from_f32(1.0)).unwrap();
        }
        if let Some(mlp) = name.strip_suffix(".switch_mlp.down_proj.weight") {
            hf.insert(format!("{mlp}.experts.down_proj"), a);
        } else if let Some(mlp) = name.strip_suffix(".switch_mlp.gate_proj.weight") {
            experts.entry(mlp.to_owned()).or_default()[0] = Some(a);
        } else if let Some(mlp) = name.strip_suffix(".switch_mlp.up_proj.weight") {
            experts.entry(mlp.to_owned()).or_default()[1] = Some(a);
        } else {
            hf.insert(name, a);
        }
    }
    for (mlp, [gate, up]) in experts {
        let gate_up = ops::concatenate(&[gate.unwrap(), up.unwrap()], -2).unwrap();
        hf.insert(format!("{mlp}.experts.gate_up_proj"), gate_up);
    }
    hf.insert("mtp.fc.weight".into(), Array::zeros::<f32>(&[64, 128]).unwrap());
    hf.insert(
        "model.visual.blocks.0.attn.qkv.weight".into(),
        Array::zeros::<f32>(&[8, 8]).unwrap(),
    );
    hf
}

/// Logits of `ids` fed in chunks of the given sizes, `[1, L, V]`.
fn chunked(model: &Model, ids: &[u32], sizes: &[usize]) -> Array {
    let mut caches = model.new_caches();
    let mut outs = vec![];
    let mut at = 0;
    for &n in sizes {
        outs.push(model.forward_all(&tokens(&ids[at..at + n]), &mut caches).unwrap());
        at += n;
    }
    assert_eq!(at, ids.len());
    assert!(caches.iter().all(|c| c.offset() == ids.len()));
    ops::concatenate(&outs, 1).unwrap()
}

/// Chunked prefill equals one prefill, with cuts inside the convolution's 3-row window (1,
/// 2 and 3 tokens) and past it, on the f32 and the q4 model.
#[test]
fn chunked_prefill_equals_one_prefill() {
    let (_g, _b) = mlx();
    let f = fixture();
    for name in ["f32", "bf16-q4", "moe-f32"] {
        let model = load_variant(&f, name);
        let ids = &f.prompt;
        let whole = all_logits(&model, ids);
        let bf16 = name.starts_with("bf16");
        for sizes in [
            vec![1; 20],
            vec![2; 10],
            vec![3, 3, 3, 3, 3, 3, 2],
            vec![1, 2, 3, 1, 13],
            vec![5, 1, 1, 13],
            vec![17, 3],
        ] {
            let d = max_abs_diff(&chunked(&model, ids, &sizes), &whole);
            let limit = if bf16 { bf16_tol() } else { tol(PATHS) };
            assert!(d <= limit, "{name} {sizes:?}: max |Δ| {d}");
        }
    }
}

/// Decode steps after a prefill give the logits of one forward over everything, and a
/// rewind by one step (the recurrent checkpoint) then the same token again gives them too.
#[test]
fn cached_decode_equals_uncached_forward_and_rewinds_one_step() {
    let (_g, _b) = mlx();
    let f = fixture();
    let model = load_variant(&f, "f32");
    let ids = &f.prompt;
    let whole = all_logits(&model, ids);
    let mut caches = model.new_caches();
    let first = model.forward(&tokens(&ids[..12]), &mut caches).unwrap();
    let at = |p: i32| whole.try_index((.., p)).unwrap();
    assert!(max_abs_diff(&first, &at(11)) <= tol(PATHS));
    for p in 12..ids.len() {
        let step = model.forward(&tokens(&ids[p..=p]), &mut caches).unwrap();
        let d = max_abs_diff(&step, &at(p as i32));
        assert!(d <= tol(PATHS), "position {p}: max |Δ| {d}");
    }
    // One step back is a checkpoint; two are not: the nearest earlier state is the empty one.
    let n = ids.len();
    assert_eq!(crate::cache::restorable(&caches, n - 1), n - 1);
    assert_eq!(crate::cache::restorable(&caches, n - 2), 0);
    assert_eq!(rewind(&mut caches, n - 1), n - 1);
    let again = model.forward(&tokens(&ids[n - 1..]), &mut caches).unwrap();
    assert!(max_abs_diff(&again, &at(n as i32 - 1)) <= tol(PATHS));
    // A rewind to a length between checkpoints goes to an earlier one, never a later one.
    assert_eq!(rewind(&mut caches, n - 3), 0);
    assert!(caches.iter().all(|c| c.offset() == 0));
    let fresh = model.forward(&tokens(ids), &mut caches).unwrap();
    assert!(max_abs_diff(&fresh, &at(n as i32 - 1)) <= tol(PATHS));
}

/// Several candidates share one prefill (the recurrent state repeated per row): each row's
/// first decode step equals the batch-1 step.
#[test]
fn candidates_fork_the_recurrent_state() {
    let (_g, _b) = mlx();
    let f = fixture();
    let model = load_variant(&f, "f32");
    let ids = &f.prompt;
    let mut caches = model.new_caches();
    model.forward(&tokens(&ids[..10]), &mut caches).unwrap();
    let mut wide: Vec<KvCache> = caches.iter().map(|c| c.repeat(3).unwrap()).collect();
    let step = Array::from_slice(&[ids[10]; 3], &[3, 1]);
    let rows = model.forward(&step, &mut wide).unwrap();
    let one = model.forward(&tokens(&ids[10..11]), &mut caches).unwrap();
    for r in 0..3 {
        let row = rows.try_index((r..r + 1, ..)).unwrap();
        assert!(max_abs_diff(&row, &one) <= tol(1e-5));
    }
}

/// Generation through the prefix store over random edits gives the tokens of generation
/// without it: reuse stops at a length the recurrent states were kept at.
#[test]
fn prefix_store_reuse_gives_the_output_of_no_reuse() {
    use rand::{rngs::StdRng, Rng, SeedableRng};
    let (_g, _b) = mlx();
    let f = fixture();
    let model = load_variant(&f, "f32");
    let store = std::sync::Mutex::new(PrefixStore::new(PrefixLimits::default()));
    let req = GenerateRequest::greedy(4);
    let no = Cancel::new();
    let mut rng = StdRng::seed_from_u64(47);
    let mut ids: Vec<u32> = f.prompt.clone();
    let mut last: Vec<u32> = vec![];
    for step in 0..12 {
        // The most this step may reuse, and (taking a suggestion) what it must.
        let (most, exactly) = match step % 3 {
            // The suggestion taken and typed on: all the store held (the last generated
            // token was never fed).
            0 => {
                let held = ids.len() + last.len() - 1;
                ids.extend(&last);
                ids.push(rng.gen_range(0..256));
                (held, (step > 0).then_some(held))
            }
            // An edit inside: a state kept at or before it, never a later one.
            1 => {
                let at = rng.gen_range(1..ids.len());
                ids[at] = (ids[at] + 1) % 256;
                (at, None)
            }
            _ => {
                ids.truncate(ids.len() - 2);
                (ids.len() - 1, None)
            }
        };
        let (cached, reused) =
            generate_with_store(&model, Some(&store), &ids, &req, &no, |_, _| Control::Continue).unwrap();
        let (fresh, _) =
            generate_with_store(&model, None, &ids, &req, &no, |_, _| Control::Continue).unwrap();
        assert_eq!(
            cached.candidates, fresh.candidates,
            "step {step}: reused {reused}"
        );
        assert!(reused <= most, "step {step}: reused {reused} of at most {most}");
        if let Some(n) = exactly {
            assert_eq!(
                reused, n,
                "step {step}: a taken suggestion reuses what was stored"
            );
        }
        last = cached.candidates[0].clone();
    }
}

/// Prompt chunks of 6 tokens (the anchor cutting one), on the CPU or a GPU alike.
fn fixed(tokens: usize) -> Pacing {
    Pacing {
        chunking: Chunking::Fixed(tokens),
        overlap: false,
        layer_groups: None,
    }
}

/// The states kept at chunk ends up to the anchor restore the nearest one at or before a
/// length, never a later one; after a rewind the model diverts (other tokens) and comes back
/// with the logits of a forward from nothing.
#[test]
fn checkpoints_restore_the_nearest_state_at_or_before_a_length() {
    let (_g, _b) = mlx();
    let f = fixture();
    let model = load_variant(&f, "f32");
    let ids = &f.prompt;
    let mut caches = model.new_caches();
    // Chunks end at 6, 9 (the anchor), 15 and 20; states kept at 6 and 9, none past the
    // anchor but the one before the last chunk (15).
    let p = prefill_anchored(&model, &mut caches, ids, &Cancel::new(), fixed(6), Some(9)).unwrap();
    assert_eq!((p.tokens, p.chunks), (20, 4));
    assert_eq!(caches[0].checkpoints(), [6, 9, 15]);
    assert!(
        caches[1].checkpoints().is_empty(),
        "an attention layer keeps keys, not states"
    );
    let restorable = |caches: &[KvCache], len| crate::cache::restorable(caches, len);
    assert_eq!(
        [20, 19, 15, 12, 9, 8, 6, 5, 0].map(|len| restorable(&caches, len)),
        [20, 15, 15, 9, 9, 6, 6, 0, 0]
    );
    // Divert at 12: back to 9, other tokens, the logits of that sequence from nothing.
    assert_eq!(rewind(&mut caches, 12), 9);
    let other = [300u32 % 265, 7, 99, 150, 42];
    let diverted = model.forward_all(&tokens(&other), &mut caches).unwrap();
    let mut seq = ids[..9].to_vec();
    seq.extend(other);
    let want = all_logits(&model, &seq).try_index((.., 9..)).unwrap();
    assert!(max_abs_diff(&diverted, &want) <= tol(PATHS));
    // Back before the divert: 6 is still kept, 9's successors are gone.
    assert_eq!(caches[0].checkpoints(), [6, 9]);
    assert_eq!(rewind(&mut caches, 8), 6);
    let back = model.forward(&tokens(&ids[6..]), &mut caches).unwrap();
    let whole = all_logits(&model, ids);
    assert!(max_abs_diff(&back, &whole.try_index((.., 19)).unwrap()) <= tol(PATHS));
}

/// What a store's byte limit counts: each recurrent state once (current, kept, the one
/// before the last update), as [`crate::models::HybridConfig::state_bytes`] says a state
/// weighs; and the 27B's and 4B's states at their shapes.
#[test]
fn a_checkpoint_weighs_one_state() {
    let (_g, _b) = mlx();
    let f = fixture();
    let model = load_variant(&f, "f32");
    let hybrid = model.config().hybrid.clone().unwrap();
    let state = hybrid.state_bytes(4);
    // Two DeltaNet layers: 4 heads × 16 × 32 f32, 3 rows of 192 channels.
    assert_eq!(state, 2 * (4 * 16 * 32 * 4 + 3 * 192 * 4));
    let recurrent_bytes = |caches: &[KvCache]| -> usize {
        caches
            .iter()
            .zip(&hybrid.linear_layers)
            .filter(|(_, &l)| l)
            .map(|(c, _)| c.nbytes())
            .sum()
    };
    let mut caches = model.new_caches();
    prefill_anchored(&model, &mut caches, &f.prompt, &Cancel::new(), fixed(6), Some(9)).unwrap();
    // The state at 20, those kept at 6 and 9, the one before the last update (15).
    assert_eq!(recurrent_bytes(&caches), 4 * state);
    caches.iter_mut().for_each(KvCache::forget_previous);
    assert_eq!(recurrent_bytes(&caches), 3 * state);
    // Kept at the anchor and again before the last update: counted once.
    let mut caches = model.new_caches();
    prefill_anchored(&model, &mut caches, &f.prompt, &Cancel::new(), fixed(6), Some(15)).unwrap();
    assert_eq!(caches[0].checkpoints(), [6, 12, 15]);
    assert_eq!(recurrent_bytes(&caches), 4 * state);
    // The shapes of Qwen3.5-27B (48 DeltaNet layers of 64, 48 value heads and 16 key heads of
    // 128) and Qwen3.5-4B (24 of 32, 32 and 16 heads of 128), bf16 activations.
    let shape = |layers: i32, hv, hk| crate::models::HybridConfig {
        linear_layers: (0..layers).map(|i| (i + 1) % 4 != 0).collect(),
        linear_num_key_heads: hk,
        linear_num_value_heads: hv,
        linear_key_head_dim: 128,
        linear_value_head_dim: 128,
        linear_conv_kernel_dim: 4,
        rope_dims: 64,
    };
    let (big, small) = (shape(64, 48, 16).state_bytes(2), shape(32, 32, 16).state_bytes(2));
    eprintln!("a state: 27B {big} bytes, 4B {small} bytes");
    assert_eq!(
        (big, small),
        (48 * (3 << 20) + 48 * 61_440, 24 * (2 << 20) + 24 * 49_152)
    );
}

/// Past [`crate::cache::KEPT`] states, the one whose neighbours are closest goes: the newest
/// (the anchor) stays, and the others stay spread over the prompt.
#[test]
fn kept_states_stay_spread_and_the_newest_stays() {
    let (_g, _b) = mlx();
    let f = fixture();
    let model = load_variant(&f, "f32");
    let ids = &f.prompt;
    let mut caches = model.new_caches();
    for (at, n) in [(0, 2), (2, 1), (3, 5), (8, 6), (14, 1), (15, 2)] {
        model.forward(&tokens(&ids[at..at + n]), &mut caches).unwrap();
        crate::cache::checkpoint(&mut caches);
    }
    // Kept at 2, 3, 8, 14, 15, 17 in turn: 2 went (a gap of 3 from the start to 3), then 14
    // (7 from 8 to 15), then 3 (8 from the start to 8); 15 is also the state before the last
    // update, which the cache holds until it is stored.
    assert_eq!(crate::cache::KEPT, 3);
    assert_eq!(caches[0].checkpoints(), [8, 15, 17]);
    caches.iter_mut().for_each(KvCache::forget_previous);
    assert_eq!(caches[0].checkpoints(), [8, 15, 17]);
}

/// The same prompt again (an explicit request after an automatic one, a request cancelled
/// while decoding and asked again) runs no forward before its first token: the store kept
/// the state at the prompt's end and its logits. A prompt one token longer or shorter does
/// not take them.
#[test]
fn the_same_prompt_again_starts_from_its_end() {
    let (_g, _b) = mlx();
    let f = fixture();
    let model = load_variant(&f, "f32");
    let store = std::sync::Mutex::new(PrefixStore::new(PrefixLimits::default()));
    let no = Cancel::new();
    let ids = fim("def add(a, b):\n    return a", "\n\nprint(add(1, 2))\n");
    let req = GenerateRequest {
        anchor: fim_anchor(&ids, 261),
        ..GenerateRequest::greedy(4)
    };
    let run = |ids: &[u32], store| {
        generate_with_store_paced(&model, store, ids, &req, &no, fixed(8), |_, _| Control::Continue).unwrap()
    };
    let (fresh, _) = run(&ids, None);
    let (first, reused) = run(&ids, Some(&store));
    assert_eq!((reused, first.prefill_tokens), (0, ids.len()));
    for _ in 0..2 {
        let (again, reused) = run(&ids, Some(&store));
        assert_eq!((reused, again.prefill_tokens), (ids.len(), 0));
        assert_eq!(again.candidates, fresh.candidates);
    }
    // One token fewer: the nearest kept state, and its last token runs.
    let shorter = &ids[..ids.len() - 1];
    let (out, reused) = run(shorter, Some(&store));
    assert!(reused < shorter.len(), "reused {reused}");
    assert_eq!(out.candidates, run(shorter, None).0.candidates);
    // The end of the longer prompt was replaced by the shorter one's.
    let (out, reused) = run(&ids, Some(&store));
    assert!(reused < ids.len(), "reused {reused}");
    assert_eq!(out.candidates, fresh.candidates);
}

/// `<|fim_prefix|>prefix<|fim_suffix|>suffix<|fim_middle|>` in the fixture's byte-level
/// vocabulary (specials after the 256 bytes: prefix 259, middle 260, suffix 261).
fn fim(prefix: &str, suffix: &str) -> Vec<u32> {
    let mut ids = vec![259];
    ids.extend(prefix.bytes().map(u32::from));
    ids.push(261);
    ids.extend(suffix.bytes().map(u32::from));
    ids.push(260);
    ids
}

/// Keystrokes through the prefix store: a character typed at the cursor reuses the state kept
/// a few tokens before it (the anchor); an edit above the cursor the nearest state kept before
/// the edit; several candidates and a cancelled request after them answer as without reuse.
#[test]
fn keystrokes_reuse_the_anchor_and_an_edit_above_an_earlier_state() {
    let (_g, _b) = mlx();
    let f = fixture();
    let model = load_variant(&f, "f32");
    let store = std::sync::Mutex::new(PrefixStore::new(PrefixLimits::default()));
    let suffix = "\n\nprint(add(1, 2))\n";
    let no = Cancel::new();
    let run = |ids: &[u32], req: &GenerateRequest, store| {
        let go = |_, _| Control::Continue;
        generate_with_store_paced(&model, store, ids, req, &no, fixed(8), go).unwrap()
    };
    let request = |ids: &[u32], n: usize| GenerateRequest {
        n,
        branch_first: n > 1,
        anchor: fim_anchor(ids, 261),
        ..GenerateRequest::greedy(3)
    };
    let check = |ids: &[u32], n: usize| -> usize {
        let (cached, reused) = run(ids, &request(ids, n), Some(&store));
        let (fresh, _) = run(ids, &request(ids, n), None);
        assert_eq!(cached.candidates, fresh.candidates, "reused {reused}");
        reused
    };
    let first = fim("def add(a, b):\n    return a", suffix);
    let cursor = first.iter().position(|&t| t == 261).unwrap();
    let anchor = fim_anchor(&first, 261).unwrap();
    assert_eq!(anchor, cursor - crate::prefix::ANCHOR_BEFORE_CURSOR);
    assert_eq!(check(&first, 1), 0);
    // Typed at the cursor: the anchor serves (chunks end at 8, 16, 24 and the anchor).
    let typed = fim("def add(a, b):\n    return a +", suffix);
    assert_eq!(check(&typed, 1), anchor);
    // An edit above the cursor (token 12 of the prompt): the state kept at 8.
    let edited = fim("def add(a, c):\n    return a +", suffix);
    assert_eq!(
        (first[..12] == edited[..12], first[12] == edited[12]),
        (true, false)
    );
    assert_eq!(check(&edited, 1), 8);
    // Three candidates from the store's state, as from nothing.
    let more = fim("def add(a, c):\n    return a + c", suffix);
    assert!(check(&more, 3) >= 8);
    // A request cancelled at its first token leaves the store usable.
    let cancel = Cancel::new();
    let again = fim("def add(a, c):\n    return a - c", suffix);
    let stop = |_, _| {
        cancel.cancel();
        Control::Continue
    };
    let req = request(&again, 1);
    let (out, _) =
        generate_with_store_paced(&model, Some(&store), &again, &req, &cancel, fixed(8), stop).unwrap();
    assert_eq!(out.candidates[0].len(), 1);
    assert_eq!(out.finish_reasons[0], crate::seam::FinishReason::Cancelled);
    assert!(check(&again, 1) > 0);
}

/// A state kept after a prefill brings the caches back there after any number of decode
/// steps (as `laya bench engine` reruns its decode after one prompt).
#[test]
fn a_kept_prompt_state_outlives_decode_steps() {
    let (_g, _b) = mlx();
    let f = fixture();
    let model = load_variant(&f, "f32");
    let ids = &f.prompt;
    let mut caches = model.new_caches();
    model.forward(&tokens(&ids[..12]), &mut caches).unwrap();
    crate::cache::checkpoint(&mut caches);
    let first = model.forward(&tokens(&ids[12..13]), &mut caches).unwrap();
    for &t in &ids[13..18] {
        model.forward(&tokens(&[t]), &mut caches).unwrap();
    }
    assert_eq!(rewind(&mut caches, 12), 12);
    let again = model.forward(&tokens(&ids[12..13]), &mut caches).unwrap();
    assert!(max_abs_diff(&first, &again) <= tol(1e-6));
}
