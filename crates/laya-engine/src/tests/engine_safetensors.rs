//! Hugging Face safetensors folders (dense bf16) and mlx-community folders (MLX-quantized,
//! `quantization` in config.json) load into the same model as the weights they hold.

use std::{collections::HashMap, path::Path};

use mlx_rs::{transforms::eval, Array, Dtype};

use super::{assert_close, mlx, real_05b};
use crate::{
    load::{self, LoadOptions},
    models::{Model, ModelConfig},
    seam::Precision,
    synthetic::{self, gguf},
};

fn tiny_config() -> ModelConfig {
    synthetic::tiny()
}

/// Writes config.json, tokenizer.json (exported from the byte-level vocabulary of
/// `synthetic::gguf`, as long as Qwen's) and the weights split over two safetensors files, as
/// HF checkpoints are.
fn write_folder(
    dir: &Path,
    cfg: &ModelConfig,
    weights: &HashMap<String, Array>,
    quantization: Option<(i32, i32)>,
) {
    let vocab = tempfile::tempdir().unwrap();
    let gguf = gguf::write_vocab(vocab.path()).unwrap();
    synthetic::write_folder(dir, cfg, weights, quantization, &gguf).unwrap();
}

fn logits(model: &Model) -> Vec<f32> {
    let ids = [151659, 750, 75698, 1445, 982, 151661, 198, 151660];
    let tokens = Array::from_slice(&ids, &[1, ids.len() as i32]);
    let out = model
        .forward(&tokens, &mut model.new_caches())
        .unwrap()
        .as_dtype(Dtype::Float32)
        .unwrap();
    eval([&out]).unwrap();
    out.as_slice::<f32>().to_vec()
}

fn opts(precision: Precision) -> LoadOptions {
    LoadOptions {
        precision,
        group_size: 64,
        use_cache: false,
        progress: false,
        ..Default::default()
    }
}

#[test]
fn hf_bf16_folder_loads_the_weights_it_holds() {
    let (_g, _b) = mlx();
    let cfg = tiny_config();
    let weights = synthetic::random_weights(&cfg, Precision::Native, 64, Dtype::Bfloat16, 3).unwrap();
    let dir = tempfile::tempdir().unwrap();
    write_folder(dir.path(), &cfg, &weights, None);
    let want = logits(&Model::from_weights(cfg.clone(), weights, 64).unwrap());

    let native = load::load(dir.path(), &opts(Precision::Native)).unwrap();
    assert_close("hf folder, native", &logits(&native.model), &want, 1e-5);
    // tokenizer.json is read: the byte-level vocabulary makes each byte a token of its id.
    let line = "def fibonacci(n):\n";
    assert_eq!(
        native.tokenizer.encode(line, false).unwrap(),
        line.bytes().map(u32::from).collect::<Vec<_>>()
    );

    // Quantized at load: close to the dense model, within q8's error.
    let q8 = load::load(dir.path(), &opts(Precision::Q8)).unwrap();
    assert_close("hf folder, q8", &logits(&q8.model), &want, 5e-2);
}

/// tokenizer.json exported from the real 0.5B's vocabulary reads back as llama.cpp
/// tokenizes: fim_python's first line (`):\n` is one token).
#[test]
fn a_folder_with_the_real_vocabulary_tokenizes_as_llama_cpp() {
    let Some(real) = real_05b() else {
        return;
    };
    let (_g, _b) = mlx();
    let cfg = tiny_config();
    let weights = synthetic::random_weights(&cfg, Precision::Native, 64, Dtype::Bfloat16, 3).unwrap();
    let dir = tempfile::tempdir().unwrap();
    synthetic::write_folder(dir.path(), &cfg, &weights, None, &real).unwrap();
    let native = load::load(dir.path(), &opts(Precision::Native)).unwrap();
    assert_eq!(
        native.tokenizer.encode("def fibonacci(n):\n", false).unwrap(),
        vec![750, 75698, 1445, 982]
    );
}

#[test]
fn mlx_community_quantized_folder_loads_as_stored() {
    let (_g, _b) = mlx();
    let cfg = tiny_config();
    let weights = synthetic::random_weights(&cfg, Precision::Q4, 64, Dtype::Bfloat16, 4).unwrap();
    let dir = tempfile::tempdir().unwrap();
    write_folder(dir.path(), &cfg, &weights, Some((64, 4)));
    let want = logits(&Model::from_weights(cfg.clone(), weights, 64).unwrap());
    // Asked for more bits than it stores, the folder loads as stored (fewer: see
    // `load`'s tests of the converted cache).
    let loaded = load::load(dir.path(), &opts(Precision::Q8)).unwrap();
    assert_close("mlx-community folder", &logits(&loaded.model), &want, 1e-5);
}

/// A tier on a folder quantized as stored is one model at its own bits or more: q8 and q4 of
/// a 4-bit folder are not two identical copies, and its facts give the stored bits.
#[test]
fn a_quantized_folder_is_one_model_in_the_pool_at_its_stored_bits() {
    use crate::{
        pool::{ModelPool, PoolConfig, TierSource},
        seam::{Engine, ModelKey, ModelState, Tier},
    };
    let (_g, _b) = mlx();
    let cfg = tiny_config();
    let weights = synthetic::random_weights(&cfg, Precision::Q4, 64, Dtype::Bfloat16, 4).unwrap();
    let dir = tempfile::tempdir().unwrap();
    write_folder(dir.path(), &cfg, &weights, Some((64, 4)));
    let key = |precision| ModelKey {
        tier: Tier::Small,
        precision,
    };
    let pool = ModelPool::new(
        PoolConfig {
            tiers: HashMap::from([(
                Tier::Small,
                TierSource::Local {
                    path: dir.path().to_owned(),
                    group_size: 64,
                },
            )]),
            default: key(Precision::Q8),
            preload: vec![],
            device: crate::runtime::DevicePref::Cpu,
            prefix: Default::default(),
            speculation: Default::default(),
            use_cache: false,
            loader: Default::default(),
        },
        std::sync::Arc::new(|_, _| {}),
    )
    .unwrap();
    let (a, _) = pool.resolve(key(Precision::Q8)).unwrap();
    let (b, _) = pool.resolve(key(Precision::Q4)).unwrap();
    assert_eq!((a, b), (key(Precision::Native), key(Precision::Native)));
    let facts = pool.facts(key(Precision::Q8)).unwrap();
    assert_eq!(facts.bits, 4);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while matches!(pool.states()[..], [(_, ModelState::Loading)]) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let states = pool.states();
    assert!(
        matches!(states[..], [(k, ModelState::Ready { .. })] if k == key(Precision::Native)),
        "one model, loaded: {states:?}"
    );
}

#[test]
fn folder_with_a_missing_tensor_names_it() {
    let (_g, _b) = mlx();
    let cfg = tiny_config();
    let mut weights = synthetic::random_weights(&cfg, Precision::Native, 64, Dtype::Bfloat16, 5).unwrap();
    weights.remove("model.layers.1.mlp.down_proj.weight");
    let dir = tempfile::tempdir().unwrap();
    write_folder(dir.path(), &cfg, &weights, None);
    let err = load::load(dir.path(), &opts(Precision::Native))
        .err()
        .expect("must fail")
        .to_string();
    assert!(err.contains("model.layers.1.mlp.down_proj"), "{err}");
}

/// A folder of random weights written a shard at a time holds the weights `random_weights`
/// makes of the same seed, over as many files as the shard size asks.
#[test]
fn a_random_folder_written_in_shards_holds_the_seeds_weights() {
    let (_g, _b) = mlx();
    let cfg = tiny_config();
    let vocab = tempfile::tempdir().unwrap();
    let gguf = gguf::write_vocab(vocab.path()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bytes = synthetic::write_random_folder(dir.path(), &cfg, Dtype::Bfloat16, 9, &gguf, 8 << 20).unwrap();
    let shards = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "safetensors")
        })
        .count();
    // The embedding alone is ~39 MB in bf16: a shard of its own, and the layers another.
    assert_eq!(shards, 2, "{bytes} bytes");
    let weights = synthetic::random_weights(&cfg, Precision::Native, 64, Dtype::Bfloat16, 9).unwrap();
    assert_eq!(bytes, weights.values().map(|a| a.nbytes() as u64).sum::<u64>());
    let want = logits(&Model::from_weights(cfg.clone(), weights, 64).unwrap());
    let loaded = load::load(dir.path(), &opts(Precision::Native)).unwrap();
    assert_close("random folder", &logits(&loaded.model), &want, 0.0);
}
