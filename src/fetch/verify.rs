//! What can be checked of a safetensors model folder without a pinned hash: `config.json`
//! names an architecture laya runs and, for a catalog model, that model's shape (and, through
//! `check_quantization`, the bits its variant stores: none for bf16); the tokenizer
//! is there; the weights index names only files that are there and nothing else is among them;
//! each weight file's header parses and its tensors fill the file exactly; every tensor the
//! index names is in the file it names; every layer has tensors. The bytes themselves are
//! checked at download time, against the sha256 the hub lists for each weight file.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    io::Read,
    path::Path,
};

use crate::engine::models::{text_model_name, Arch, Shape};

/// The architectures laya loads, by `config.json`'s `model_type`.
pub const MODEL_TYPES: &[(&str, Arch)] = &[
    ("qwen2", Arch::Qwen2),
    ("qwen3", Arch::Qwen3),
    ("qwen3_moe", Arch::Qwen3Moe),
    ("qwen3_5", Arch::Qwen35),
    ("qwen3_5_moe", Arch::Qwen35),
    ("qwen3_next", Arch::Qwen35),
];

const INDEX: &str = "model.safetensors.index.json";

/// The quick check, for presence (`laya doctor`, the defaults in use): the configuration
/// (architecture, and `expect`'s shape), the tokenizer, and the weight files the index names
/// (or any weight file without an index). Reads two small JSON files, no weights.
pub fn folder_presence(dir: &Path, expect: Option<&Shape>) -> Result<(), String> {
    check_config(dir, expect)?;
    let tokenizer = dir.join("tokenizer.json");
    if !tokenizer.is_file() {
        return Err(format!("{} is missing", tokenizer.display()));
    }
    weight_files(dir).map(|_| ())
}

/// The full check after a download: [`folder_presence`], then every weight file's header and
/// size, the index's tensors in the files it names, and tensors for every layer.
pub fn verify_folder(dir: &Path, expect: Option<&Shape>) -> Result<(), String> {
    let config = check_config(dir, expect)?;
    let layers = config.layers;
    folder_presence(dir, expect)?;
    let (files, index) = weight_files(dir)?;
    let mut names = BTreeSet::new();
    let mut by_file = HashMap::new();
    for file in &files {
        let header = safetensors_header(&dir.join(file))?;
        names.extend(header.keys().map(|k| text_model_name(k).into_owned()));
        by_file.insert(file.clone(), header);
    }
    if let Some(map) = index {
        for (tensor, file) in &map {
            if !by_file.get(file).is_some_and(|h| h.contains_key(tensor)) {
                return Err(format!("{file}: no tensor {tensor}, which {INDEX} puts there"));
            }
        }
    }
    let embed = by_file.values().find_map(|h| {
        h.iter()
            .find(|(k, _)| text_model_name(k) == "model.embed_tokens.weight")
            .map(|(_, t)| t)
    });
    let Some(embed) = embed else {
        return Err(format!(
            "{}: no model.embed_tokens.weight in its weight files",
            dir.display()
        ));
    };
    let want = [config.vocab_size, config.hidden_size];
    if !config.quantized && embed.shape != want {
        return Err(format!(
            "{}: model.embed_tokens.weight is {:?}, not [vocab_size, hidden_size] = {want:?}",
            dir.display(),
            embed.shape
        ));
    }
    if let Some(layer) = (0..layers).find(|i| {
        let prefix = format!("model.layers.{i}.");
        !names.iter().any(|n| n.starts_with(&prefix))
    }) {
        return Err(format!(
            "{}: no tensors of layer {layer} (config.json says {layers} layers)",
            dir.display()
        ));
    }
    Ok(())
}

/// What the full check needs of `config.json`.
pub struct ConfigFacts {
    pub layers: i32,
    pub vocab_size: u64,
    pub hidden_size: u64,
    /// MLX-quantized weights (an mlx-community folder): tensor shapes are packed.
    pub quantized: bool,
}

/// `config.json` parsed and checked: an architecture laya runs and, with `expect`, that
/// shape.
pub fn check_config(dir: &Path, expect: Option<&Shape>) -> Result<ConfigFacts, String> {
    let path = dir.join("config.json");
    let text = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let c: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| format!("{}: not JSON: {e}", path.display()))?;
    let model_type = c["model_type"].as_str().unwrap_or("");
    let Some(&(_, arch)) = MODEL_TYPES.iter().find(|(t, _)| *t == model_type) else {
        let known: Vec<&str> = MODEL_TYPES.iter().map(|(t, _)| *t).collect();
        return Err(format!(
            "{}: model_type `{model_type}` is not one laya runs ({})",
            path.display(),
            known.join(", ")
        ));
    };
    // A Qwen3.5 folder states its text model's shape in `text_config`.
    let text = c.get("text_config").filter(|t| t.is_object()).unwrap_or(&c);
    let int = |key: &str| text[key].as_i64().or_else(|| c[key].as_i64());
    let layers = int("num_hidden_layers").unwrap_or(0) as i32;
    if let Some(s) = expect {
        let heads = int("num_attention_heads");
        let mut want = vec![
            ("hidden_size", s.hidden_size),
            ("num_hidden_layers", s.layers),
            ("num_attention_heads", s.heads),
            ("vocab_size", s.vocab_size),
        ];
        if let Some((experts, used, width)) = s.experts {
            want.extend([
                ("num_experts", experts),
                ("num_experts_per_tok", used),
                ("moe_intermediate_size", width),
            ]);
        }
        // Qwen3.5-MoE's configs state no dense width that a layer uses.
        if s.experts.is_none() || s.hybrid.is_none() {
            want.push(("intermediate_size", s.intermediate_size));
        }
        if let Some(width) = s.shared_expert {
            want.push(("shared_expert_intermediate_size", width));
        }
        if let Some(h) = s.hybrid {
            want.extend([
                ("linear_num_key_heads", h.key_heads),
                ("linear_num_value_heads", h.value_heads),
                ("linear_key_head_dim", h.key_dim),
                ("linear_value_head_dim", h.value_dim),
            ]);
        }
        let mut got: Vec<(&str, i32, Option<i64>)> = want.into_iter().map(|(k, v)| (k, v, int(k))).collect();
        got.push((
            "num_key_value_heads",
            s.kv_heads,
            int("num_key_value_heads").or(heads),
        ));
        if arch != s.arch {
            return Err(format!(
                "{}: model_type `{model_type}` is not the catalog's {:?} architecture: the folder holds another model",
                path.display(),
                s.arch
            ));
        }
        if let Some((key, want, have)) = got
            .into_iter()
            .find(|(_, want, have)| *have != Some(*want as i64))
        {
            let have = have.map_or("nothing".to_owned(), |v| v.to_string());
            return Err(format!(
                "{}: {key} is {have}, the catalog's model has {want}: the folder holds another model",
                path.display()
            ));
        }
    }
    Ok(ConfigFacts {
        layers,
        vocab_size: int("vocab_size").unwrap_or(0).max(0) as u64,
        hidden_size: int("hidden_size").unwrap_or(0).max(0) as u64,
        quantized: !c["quantization"].is_null(),
    })
}

/// `config.json`'s `quantization` against the bits a variant stores (`None`: unquantized
/// weights, as Hugging Face's bf16 repositories hold): a folder of another width under a
/// variant's name is another variant.
pub fn check_quantization(dir: &Path, want: Option<u32>) -> Result<(), String> {
    let path = dir.join("config.json");
    let text = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let c: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| format!("{}: not JSON: {e}", path.display()))?;
    let q = &c["quantization"];
    let got = match q["bits"].as_u64() {
        Some(bits) => Some(bits as u32),
        None if q.is_null() => None,
        None => return Err(format!("{}: `quantization` names no bits", path.display())),
    };
    if got == want {
        return Ok(());
    }
    let say = |bits: Option<u32>| match bits {
        Some(b) => format!("weights quantized to {b} bits"),
        None => "unquantized weights".to_owned(),
    };
    let want = match want {
        Some(b) => format!("{b} were expected"),
        None => "unquantized ones were expected".to_owned(),
    };
    Err(format!(
        "{}: {} where {want}: the folder holds another variant",
        path.display(),
        say(got)
    ))
}

/// The weight files: those the index names (each must exist, and no other `*.safetensors` may
/// sit beside them: the loader reads them all), or every `*.safetensors` without an index.
/// With the index's tensor → file map.
#[allow(clippy::type_complexity)]
fn weight_files(dir: &Path) -> Result<(Vec<String>, Option<BTreeMap<String, String>>), String> {
    let mut present: Vec<String> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .filter(|n| n.ends_with(".safetensors") && !n.starts_with('.'))
        .collect();
    present.sort();
    let index_path = dir.join(INDEX);
    if !index_path.exists() {
        if present.is_empty() {
            return Err(format!("{}: no *.safetensors weight files", dir.display()));
        }
        return Ok((present, None));
    }
    let text = std::fs::read(&index_path).map_err(|e| format!("{}: {e}", index_path.display()))?;
    let index: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| format!("{}: not JSON: {e}", index_path.display()))?;
    let map: BTreeMap<String, String> = index["weight_map"]
        .as_object()
        .ok_or_else(|| format!("{}: no weight_map", index_path.display()))?
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
        .collect();
    let named: BTreeSet<&String> = map.values().collect();
    if let Some(missing) = named.iter().find(|f| !present.contains(f)) {
        return Err(format!(
            "{}: {missing} is missing ({INDEX} names it)",
            dir.display()
        ));
    }
    if let Some(extra) = present.iter().find(|f| !named.contains(f)) {
        return Err(format!(
            "{}: {extra} is not in {INDEX} (a file of another revision?); remove it",
            dir.display()
        ));
    }
    Ok((present, Some(map)))
}

/// One tensor's entry in a safetensors header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorEntry {
    pub dtype: String,
    pub shape: Vec<u64>,
    pub data: (u64, u64),
}

fn dtype_bytes(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "F64" | "I64" | "U64" => 8,
        "F32" | "I32" | "U32" => 4,
        "F16" | "BF16" | "I16" | "U16" => 2,
        "I8" | "U8" | "BOOL" | "F8_E4M3" | "F8_E5M2" => 1,
        _ => return None,
    })
}

/// A safetensors file's header (8 bytes of little-endian length, then that much JSON),
/// checked against the file: each tensor's bytes are its shape times its dtype's size, inside
/// the data, and the tensors end where the file ends (a cut file fails here).
pub fn safetensors_header(path: &Path) -> Result<BTreeMap<String, TensorEntry>, String> {
    let err = |what: String| format!("{}: {what}", path.display());
    let mut f = std::fs::File::open(path).map_err(|e| err(e.to_string()))?;
    let file_len = f.metadata().map_err(|e| err(e.to_string()))?.len();
    let mut len = [0u8; 8];
    f.read_exact(&mut len)
        .map_err(|_| err("shorter than a safetensors header".into()))?;
    let n = u64::from_le_bytes(len);
    if n > 100 << 20 || 8 + n > file_len {
        return Err(err(format!(
            "header of {n} bytes does not fit a file of {file_len} bytes"
        )));
    }
    let mut text = vec![0u8; n as usize];
    f.read_exact(&mut text).map_err(|e| err(e.to_string()))?;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&text).map_err(|e| err(format!("header is not a JSON object: {e}")))?;
    let data_len = file_len - 8 - n;
    let mut out = BTreeMap::new();
    let mut end_max = 0;
    for (name, v) in header {
        if name == "__metadata__" {
            continue;
        }
        let bad = |why: &str| err(format!("tensor {name}: {why}"));
        let dtype = v["dtype"].as_str().ok_or_else(|| bad("no dtype"))?.to_owned();
        let shape: Vec<u64> = v["shape"]
            .as_array()
            .ok_or_else(|| bad("no shape"))?
            .iter()
            .map(|d| d.as_u64().ok_or_else(|| bad("a dimension is not a number")))
            .collect::<Result<_, _>>()?;
        let offsets = v["data_offsets"]
            .as_array()
            .ok_or_else(|| bad("no data_offsets"))?;
        let (begin, end) = match offsets.as_slice() {
            [b, e] => (
                b.as_u64().ok_or_else(|| bad("bad data_offsets"))?,
                e.as_u64().ok_or_else(|| bad("bad data_offsets"))?,
            ),
            _ => return Err(bad("data_offsets is not [begin, end]")),
        };
        let size = dtype_bytes(&dtype).ok_or_else(|| bad(&format!("unknown dtype {dtype}")))?;
        let want = shape.iter().try_fold(size, |a, &d| a.checked_mul(d));
        if end < begin || Some(end - begin) != want {
            return Err(bad(&format!(
                "its bytes {begin}..{end} do not hold a {dtype} tensor of shape {shape:?}"
            )));
        }
        if end > data_len {
            return Err(bad(&format!(
                "its bytes end at {end}, past the {data_len} bytes of data: the file is cut short"
            )));
        }
        end_max = end_max.max(end);
        out.insert(
            name,
            TensorEntry {
                dtype,
                shape,
                data: (begin, end),
            },
        );
    }
    if end_max != data_len {
        return Err(err(format!(
            "{data_len} bytes of data but its tensors end at {end_max}"
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::engine::synthetic::{safetensors_file, TINY_SHAPE};

    fn write_safetensors(path: &Path, tensors: &[(&str, &[u64])]) {
        std::fs::write(path, safetensors_file(tensors)).unwrap();
    }

    fn tiny_folder(dir: &Path) {
        std::fs::write(
            dir.join("config.json"),
            r#"{"model_type": "qwen2", "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 2,
                "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 32}"#,
        )
        .unwrap();
        std::fs::write(dir.join("tokenizer.json"), "{}").unwrap();
        write_safetensors(
            &dir.join("model-00001-of-00002.safetensors"),
            &[
                ("model.embed_tokens.weight", &[32, 8]),
                ("model.layers.0.mlp.up_proj.weight", &[16, 8]),
            ],
        );
        write_safetensors(
            &dir.join("model-00002-of-00002.safetensors"),
            &[("model.layers.1.mlp.up_proj.weight", &[16, 8])],
        );
        std::fs::write(
            dir.join(INDEX),
            r#"{"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
                "model.layers.0.mlp.up_proj.weight": "model-00001-of-00002.safetensors",
                "model.layers.1.mlp.up_proj.weight": "model-00002-of-00002.safetensors"}}"#,
        )
        .unwrap();
    }

    #[test]
    fn a_whole_folder_passes() {
        let dir = tempfile::tempdir().unwrap();
        tiny_folder(dir.path());
        verify_folder(dir.path(), Some(&TINY_SHAPE)).unwrap();
        folder_presence(dir.path(), Some(&TINY_SHAPE)).unwrap();
        let header = safetensors_header(&dir.path().join("model-00001-of-00002.safetensors")).unwrap();
        assert_eq!(header["model.embed_tokens.weight"].shape, [32, 8]);
    }

    #[test]
    fn each_defect_is_named() {
        let shard = "model-00002-of-00002.safetensors";
        type Breaks<'a> = Box<dyn Fn(&Path) + 'a>;
        let cases: Vec<(&str, Breaks)> = vec![
            (
                "is missing (model.safetensors.index.json names it)",
                Box::new(|d: &Path| std::fs::remove_file(d.join(shard)).unwrap()),
            ),
            (
                "the file is cut short",
                Box::new(|d: &Path| {
                    let f = std::fs::OpenOptions::new()
                        .write(true)
                        .open(d.join(shard))
                        .unwrap();
                    let len = f.metadata().unwrap().len();
                    f.set_len(len - 1).unwrap();
                }),
            ),
            (
                "but its tensors end at",
                Box::new(|d: &Path| {
                    let mut bytes = std::fs::read(d.join(shard)).unwrap();
                    bytes.push(0);
                    std::fs::write(d.join(shard), bytes).unwrap();
                }),
            ),
            (
                "not in model.safetensors.index.json",
                Box::new(|d: &Path| {
                    std::fs::copy(d.join(shard), d.join("model-old.safetensors")).unwrap();
                }),
            ),
            (
                "no tensor model.layers.1.mlp.up_proj.weight",
                Box::new(|d: &Path| {
                    write_safetensors(&d.join(shard), &[("model.layers.1.other.weight", &[16, 8])]);
                }),
            ),
            (
                "model_type `llama` is not one laya runs",
                Box::new(|d: &Path| {
                    std::fs::write(d.join("config.json"), r#"{"model_type": "llama"}"#).unwrap();
                }),
            ),
            (
                "hidden_size is 16, the catalog's model has 8",
                Box::new(|d: &Path| {
                    let c = std::fs::read_to_string(d.join("config.json")).unwrap();
                    std::fs::write(
                        d.join("config.json"),
                        c.replace("\"hidden_size\": 8", "\"hidden_size\": 16"),
                    )
                    .unwrap();
                }),
            ),
            (
                "model.embed_tokens.weight is [32, 4]",
                Box::new(|d: &Path| {
                    write_safetensors(
                        &d.join("model-00001-of-00002.safetensors"),
                        &[
                            ("model.embed_tokens.weight", &[32, 4]),
                            ("model.layers.0.mlp.up_proj.weight", &[16, 8]),
                        ],
                    );
                }),
            ),
            (
                "tokenizer.json is missing",
                Box::new(|d: &Path| std::fs::remove_file(d.join("tokenizer.json")).unwrap()),
            ),
            (
                "header of",
                Box::new(|d: &Path| std::fs::write(d.join(shard), u64::MAX.to_le_bytes()).unwrap()),
            ),
        ];
        for (want, break_it) in cases {
            let dir = tempfile::tempdir().unwrap();
            tiny_folder(dir.path());
            break_it(dir.path());
            let err = verify_folder(dir.path(), Some(&TINY_SHAPE)).unwrap_err();
            assert!(err.contains(want), "{want}: {err}");
        }
    }

    #[test]
    fn the_stored_bits_are_those_of_the_variant() {
        let dir = tempfile::tempdir().unwrap();
        tiny_folder(dir.path());
        check_quantization(dir.path(), None).unwrap();
        let err = check_quantization(dir.path(), Some(8)).unwrap_err();
        assert!(err.contains("unquantized weights where 8 were expected"), "{err}");
        let c = std::fs::read_to_string(dir.path().join("config.json")).unwrap();
        let quantized = c.replacen('{', r#"{"quantization": {"group_size": 64, "bits": 8}, "#, 1);
        std::fs::write(dir.path().join("config.json"), &quantized).unwrap();
        check_quantization(dir.path(), Some(8)).unwrap();
        let err = check_quantization(dir.path(), Some(6)).unwrap_err();
        assert!(
            err.contains("weights quantized to 8 bits where 6 were expected"),
            "{err}"
        );
        let err = check_quantization(dir.path(), None).unwrap_err();
        assert!(
            err.contains("8 bits where unquantized ones were expected"),
            "{err}"
        );
        std::fs::write(
            dir.path().join("config.json"),
            c.replacen('{', r#"{"quantization": {"group_size": 64}, "#, 1),
        )
        .unwrap();
        let err = check_quantization(dir.path(), Some(8)).unwrap_err();
        assert!(err.contains("`quantization` names no bits"), "{err}");
    }

    /// A Qwen3.5 folder as mlx-community writes it: the text model's shape in `text_config`,
    /// its tensors under `language_model.`; the catalog's hybrid shape is checked against it,
    /// DeltaNet heads included.
    #[test]
    fn a_qwen35_folder_is_checked_in_its_text_config() {
        use crate::engine::models::HybridShape;
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let config = |value_heads: u32| {
            format!(
                r#"{{"model_type": "qwen3_5", "tie_word_embeddings": true, "text_config": {{
                    "model_type": "qwen3_5_text", "hidden_size": 8, "intermediate_size": 16,
                    "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
                    "vocab_size": 32, "linear_num_key_heads": 1, "linear_num_value_heads": {value_heads},
                    "linear_key_head_dim": 4, "linear_value_head_dim": 4}}}}"#
            )
        };
        std::fs::write(d.join("config.json"), config(2)).unwrap();
        std::fs::write(d.join("tokenizer.json"), "{}").unwrap();
        write_safetensors(
            &d.join("model.safetensors"),
            &[
                ("language_model.model.embed_tokens.weight", &[32, 8]),
                (
                    "language_model.model.layers.0.linear_attn.out_proj.weight",
                    &[8, 8],
                ),
                ("language_model.model.layers.1.self_attn.o_proj.weight", &[8, 4]),
            ],
        );
        let shape = Shape {
            arch: Arch::Qwen35,
            head_dim: 4,
            hybrid: Some(HybridShape {
                full_attention_interval: 2,
                key_heads: 1,
                value_heads: 2,
                key_dim: 4,
                value_dim: 4,
                conv_kernel: 4,
                rope_dims: 1,
            }),
            ..TINY_SHAPE
        };
        verify_folder(d, Some(&shape)).unwrap();
        std::fs::write(d.join("config.json"), config(4)).unwrap();
        let err = verify_folder(d, Some(&shape)).unwrap_err();
        assert!(err.contains("linear_num_value_heads is 4"), "{err}");
    }

    #[test]
    fn layers_without_tensors_fail_the_full_check() {
        let dir = tempfile::tempdir().unwrap();
        tiny_folder(dir.path());
        let c = std::fs::read_to_string(dir.path().join("config.json")).unwrap();
        std::fs::write(
            dir.path().join("config.json"),
            c.replace("\"num_hidden_layers\": 2", "\"num_hidden_layers\": 3"),
        )
        .unwrap();
        let err = verify_folder(dir.path(), None).unwrap_err();
        assert!(err.contains("no tensors of layer 2"), "{err}");
    }
}
