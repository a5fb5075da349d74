//! The LSP server driven in-process through `tower::Service`, message by message, as an
//! editor would: no sockets, no sleeps in the protocol. The engine is a deterministic fake
//! (these tests are about the LSP layer and the pipeline around the engine).

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::StreamExt;
use laya::lsp::{build_service, EngineSource};
use serde_json::{json, Value};
use tower::{Service, ServiceExt};
use tower_lsp_server::jsonrpc::Request;

use crate::support::{
    engine::{FakeEngine, Load},
    lsp::InProcess,
};

/// A server on `engine`, initialized in the workspace folder `file:///work/demo`, offering
/// UTF-8 positions or not, with laya's settings `init`.
async fn start(engine: FakeEngine, utf8: bool, init: Value) -> InProcess {
    let mut c = InProcess::new(engine.shared());
    let folders = json!([{ "uri": "file:///work/demo", "name": "demo" }]);
    let caps = c.initialize(utf8, init, folders).await;
    assert_eq!(caps["inlineCompletionProvider"], true);
    assert_eq!(caps["textDocumentSync"]["change"], 2, "incremental sync");
    c
}

/// Every method the server handles, plus one it does not: targets for malformed input.
const METHODS: [&str; 10] = [
    "textDocument/inlineCompletion",
    "textDocument/completion",
    "textDocument/didOpen",
    "textDocument/didChange",
    "textDocument/didClose",
    "workspace/executeCommand",
    "workspace/didChangeConfiguration",
    "laya/acceptance",
    "laya/explain",
    "no/suchMethod",
];

fn no_debounce() -> Value {
    json!({ "completion": { "debounceMs": 0, "lookAhead": false } })
}

#[tokio::test]
async fn inline_completion_lifecycle() {
    let answer = |_: &str| vec!["    return a + b\n\n\ndef main():\n    pass".to_owned()];
    // Every request builds its prompt afresh here (typing-through and anchors: next test).
    let init = json!({ "completion": { "debounceMs": 0, "lookAhead": false, "typingThrough": false, "anchorMaxBytes": 0 } });
    let mut c = start(FakeEngine::scripted(answer), false, init).await;
    let uri = "file:///work/demo/calc.py";
    let fixture = "import math\n\ndef add(a, b):\n$0\n\ndef main():\n    print(add(1, 2))\n";
    let pos = c.open(uri, "python", fixture).await;

    let r = c.inline(uri, pos).await;
    let items = r["result"].as_array().expect("items");
    assert_eq!(items.len(), 1);
    // Post-processing cut the re-created suffix.
    assert_eq!(items[0]["insertText"], "    return a + b");
    assert_eq!(
        items[0]["range"],
        json!({ "start": { "line": 3, "character": 0 }, "end": { "line": 3, "character": 0 } })
    );
    assert_eq!(items[0]["command"]["command"], "laya.accept");
    // The prompt is Qwen FIM with the path relative to the workspace folder.
    let prompt = c.engine.last_prompt();
    assert!(
        prompt.starts_with("<|fim_prefix|>import math\n\ndef add(a, b):\n<|fim_suffix|>\n\ndef main():"),
        "{prompt}"
    );
    assert!(prompt.ends_with("<|fim_middle|>"));

    // The completion fallback carries the same text as a textEdit.
    let r = c
        .request(
            "textDocument/completion",
            json!({ "textDocument": { "uri": uri }, "position": { "line": pos.0, "character": pos.1 } }),
        )
        .await;
    let item = &r["result"]["items"][0];
    assert_eq!(item["textEdit"]["newText"], "    return a + b");
    assert_eq!(item["label"], "return a + b");

    // Incremental edit: type "    ret" on the cursor line; the server's text follows.
    c.notify(
        "textDocument/didChange",
        json!({
            "textDocument": { "uri": uri, "version": 2 },
            "contentChanges": [{ "range": { "start": { "line": 3, "character": 0 }, "end": { "line": 3, "character": 0 } }, "text": "    ret" }],
        }),
    )
    .await;
    let r = c.inline(uri, (3, 7)).await;
    assert!(r["result"].is_array(), "{r}");
    let prompt = c.engine.last_prompt();
    assert!(
        prompt.contains("def add(a, b):\n    ret<|fim_suffix|>"),
        "{prompt}"
    );

    // Acceptance is counted.
    let r = c
        .request(
            "workspace/executeCommand",
            json!({ "command": "laya.accept", "arguments": [{ "id": 0, "kind": "word" }] }),
        )
        .await;
    assert!(r.get("error").is_none(), "{r}");
    let r = c.request("laya/acceptance", json!(null)).await;
    assert_eq!(r["result"]["word"], 1);

    // Closed documents are forgotten: asking for one is an error, not a panic.
    c.notify("textDocument/didClose", json!({ "textDocument": { "uri": uri } }))
        .await;
    let r = c.inline(uri, (0, 0)).await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    let r = c.request("shutdown", json!(null)).await;
    assert!(r.get("error").is_none(), "{r}");
}

/// Typing the shown suggestion is answered without the model; typing something else continues
/// the last prompt (so the engine's prefix store reuses it); moving away builds a new one.
#[tokio::test]
async fn typing_through_and_anchored_prompts() {
    let answer = |_: &str| vec!["return a + b".to_owned()];
    let mut c = start(FakeEngine::scripted(answer), true, no_debounce()).await;
    let uri = "file:///work/demo/calc.py";
    let pos = c
        .open(uri, "python", "def add(a, b):\n    $0\n\nprint(add(1, 2))\n")
        .await;
    let r = c.inline(uri, pos).await;
    assert_eq!(r["result"][0]["insertText"], "return a + b");
    fn c_prompts_len(c: &InProcess) -> usize {
        c.engine.prompts().len()
    }
    assert_eq!(c_prompts_len(&c), 1);
    let first = c.engine.prompts()[0].clone();

    let type_at = |line: u32, ch: u32, text: &str, version: i32| {
        json!({
            "textDocument": { "uri": uri, "version": version },
            "contentChanges": [{ "range": { "start": { "line": line, "character": ch }, "end": { "line": line, "character": ch } }, "text": text }],
        })
    };
    // Type "ret": the rest of the suggestion comes back, no model call.
    c.notify("textDocument/didChange", type_at(1, 4, "ret", 2)).await;
    let r = c.inline(uri, (1, 7)).await;
    assert_eq!(r["result"][0]["insertText"], "urn a + b", "{r}");
    assert_eq!(
        r["result"][0]["range"]["start"],
        json!({ "line": 1, "character": 7 })
    );
    assert_eq!(c_prompts_len(&c), 1);
    let r = c
        .request("laya/explain", json!({ "textDocument": { "uri": uri } }))
        .await;
    assert_eq!(r["result"]["source"], "typed-through", "{r}");

    // Type "x", off the suggestion: a model call whose prompt continues the first one.
    c.notify("textDocument/didChange", type_at(1, 7, "x", 3)).await;
    c.inline(uri, (1, 8)).await;
    assert_eq!(c_prompts_len(&c), 2);
    let second = c.engine.prompts()[1].clone();
    assert_eq!(second, format!("{first}retx"));
    let r = c
        .request("laya/explain", json!({ "textDocument": { "uri": uri } }))
        .await;
    assert_eq!(r["result"]["anchored"], true, "{r}");
    assert_eq!(r["result"]["source"], "model");

    // An edit elsewhere (above the cursor) ends the anchor: a fresh prompt.
    c.notify("textDocument/didChange", type_at(0, 0, "# sum\n", 4))
        .await;
    c.inline(uri, (2, 8)).await;
    let third = c.engine.prompts()[2].clone();
    assert!(
        third.starts_with("<|fim_prefix|># sum\ndef add(a, b):\n    retx<|fim_suffix|>"),
        "{third}"
    );
}

/// On a line that holds only indentation the prompt ends at the cursor, and the indentation the
/// model writes back is not inserted twice.
#[tokio::test]
async fn an_indented_blank_line_keeps_its_indentation_once() {
    let answer = |_: &str| vec!["    return a + b".to_owned()];
    let uri = "file:///work/demo/calc.py";
    let mut c = start(FakeEngine::scripted(answer), true, no_debounce()).await;
    let pos = c
        .open(uri, "python", "def add(a, b):\n    $0\n\nprint(add(1, 2))\n")
        .await;
    let r = c.inline(uri, pos).await;
    assert_eq!(r["result"][0]["insertText"], "return a + b", "{r}");
    let prompt = c.engine.prompts()[0].clone();
    assert!(
        prompt.starts_with("<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>"),
        "{prompt}"
    );
}

/// `laya/explain` says which model the router chose and why.
#[tokio::test]
async fn explain_reports_the_route_and_its_reason() {
    let mut c = start(FakeEngine::answering("x = 1"), true, no_debounce()).await;
    let r = c
        .request(
            "laya/explain",
            json!({ "textDocument": { "uri": "file:///none.py" } }),
        )
        .await;
    assert_eq!(r["result"], Value::Null, "nothing to explain yet");
    let r = c.request("laya/explain", json!({})).await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    let uri = "file:///work/demo/a.py";
    // In a comment: the prose policy (small q4).
    let pos = c.open(uri, "python", "# compute the $0\nx = 1\n").await;
    c.inline(uri, pos).await;
    let r = c
        .request("laya/explain", json!({ "textDocument": { "uri": uri } }))
        .await;
    assert_eq!(
        r["result"]["route"]["model"],
        json!({ "tier": "small", "precision": "q4" }),
        "{r}"
    );
    assert!(
        r["result"]["route"]["reason"]
            .as_str()
            .unwrap()
            .contains("comment"),
        "{r}"
    );
    assert!(
        r["result"]["markdown"].as_str().unwrap().contains("small/q4"),
        "{r}"
    );
    // Code on an empty line, asked for: the large tier.
    let uri = "file:///work/demo/b.py";
    let pos = c.open(uri, "python", "def f(a):\n    $0\n").await;
    c.request(
        "textDocument/inlineCompletion",
        json!({ "textDocument": { "uri": uri }, "position": { "line": pos.0, "character": pos.1 }, "context": { "triggerKind": 1 } }),
    )
    .await;
    let r = c
        .request("laya/explain", json!({ "textDocument": { "uri": uri } }))
        .await;
    assert_eq!(
        r["result"]["route"]["model"],
        json!({ "tier": "large", "precision": "q6" }),
        "{r}"
    );
}

#[tokio::test]
async fn out_of_range_positions_and_unknown_documents_are_errors() {
    let mut c = start(FakeEngine::answering("x"), true, no_debounce()).await;
    let uri = "file:///work/demo/a.rs";
    c.open(uri, "rust", "fn main() {\n    $0\n}\n").await;
    for (line, ch) in [(10, 0), (0, 999_999), (u32::MAX, u32::MAX)] {
        let r = c.inline(uri, (line, ch)).await;
        // A character past the line end means the line end (LSP); a line past the end is an error.
        if line == 0 {
            assert!(r["result"].is_array(), "{r}");
        } else {
            assert_eq!(r["error"]["code"], -32602, "{r}");
        }
    }
    let r = c.inline("file:///work/demo/never-opened.rs", (0, 0)).await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
}

#[tokio::test]
async fn utf16_positions_count_surrogate_pairs() {
    let mut c = start(FakeEngine::answering("1"), false, no_debounce()).await;
    let uri = "file:///work/demo/e.ts";
    let pos = c
        .open(uri, "typescript", "const s = \"🙂é\"; const n = $0;\n")
        .await;
    assert_eq!(pos, (0, 27), "🙂 is two UTF-16 units");
    let r = c.inline(uri, pos).await;
    assert_eq!(r["result"][0]["insertText"], "1");
    assert_eq!(r["result"][0]["range"]["start"]["character"], 27);
    let prompt = c.engine.last_prompt();
    assert!(prompt.contains("const n = <|fim_suffix|>;"), "{prompt}");
    // Inside the surrogate pair is not a position.
    let r = c.inline(uri, (0, 12)).await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
}

#[tokio::test]
async fn a_newer_request_cancels_the_older_one() {
    let mut c = start(
        FakeEngine::answering("done").delayed(Duration::from_millis(400)),
        true,
        no_debounce(),
    )
    .await;
    let uri = "file:///work/demo/c.go";
    let pos = c
        .open(uri, "go", "package main\n\nfunc f() int {\n\treturn $0\n}\n")
        .await;
    let params = json!({
        "textDocument": { "uri": uri }, "position": { "line": pos.0, "character": pos.1 }, "context": { "triggerKind": 2 },
    });
    let first = Request::build("textDocument/inlineCompletion")
        .id(100)
        .params(params.clone())
        .finish();
    let second = Request::build("textDocument/inlineCompletion")
        .id(101)
        .params(params)
        .finish();
    let f1 = c.service.ready().await.unwrap().call(first);
    let f2 = c.service.ready().await.unwrap().call(second);
    let (r1, r2) = tokio::join!(f1, f2);
    let r1 = serde_json::to_value(r1.unwrap().unwrap()).unwrap();
    let r2 = serde_json::to_value(r2.unwrap().unwrap()).unwrap();
    assert_eq!(r1["error"]["code"], -32800, "older request is cancelled: {r1}");
    assert_eq!(r2["result"][0]["insertText"], "done", "{r2}");
}

#[tokio::test]
async fn malformed_messages_never_panic() {
    let mut c = start(FakeEngine::answering("y"), true, no_debounce()).await;
    c.open("file:///work/demo/m.py", "python", "x = $0\n").await;
    let bad_params = [
        json!(null),
        json!(42),
        json!("text"),
        json!([1, 2, 3]),
        json!({}),
        json!({ "textDocument": {} }),
        json!({ "textDocument": { "uri": 7 }, "position": { "line": -1, "character": "a" } }),
        json!({ "textDocument": { "uri": "file:///work/demo/m.py" }, "position": { "line": 0 } }),
        json!({ "textDocument": { "uri": "file:///work/demo/m.py", "version": 1 }, "contentChanges": [{ "range": { "start": { "line": 99, "character": 0 }, "end": { "line": 0, "character": 0 } }, "text": "z" }] }),
    ];
    let methods = METHODS;
    for m in methods {
        for p in &bad_params {
            c.call(m, Some(1), p.clone()).await;
        }
    }
    // Still serving, and the bad edits changed nothing.
    let r = c.inline("file:///work/demo/m.py", (0, 4)).await;
    assert_eq!(r["result"][0]["insertText"], "y", "{r}");
    let prompt = c.engine.last_prompt();
    assert_eq!(prompt, "<|fim_prefix|>x = <|fim_suffix|>\n<|fim_middle|>");
}

#[tokio::test]
async fn settings_from_initialization_options_apply() {
    // Only Rust is enabled: a Python document gets no completion and the engine is not called.
    let init = json!({ "completion": { "debounceMs": 0, "lookAhead": false, "languages": ["rust"] } });
    let mut c = start(FakeEngine::answering("z"), true, init).await;
    let pos = c.open("file:///work/demo/s.py", "python", "a = $0\n").await;
    let r = c.inline("file:///work/demo/s.py", pos).await;
    assert!(r["result"].is_null(), "{r}");
    assert!(c.engine.prompts().is_empty());
}

#[tokio::test]
async fn other_open_files_contribute_types_in_the_repo_level_form() {
    let mut c = start(FakeEngine::answering("Point { x: 0, y: 0 }"), true, no_debounce()).await;
    c.open(
        "file:///work/demo/src/geom.rs",
        "rust",
        "pub struct Point {\n    pub x: i32,\n    pub y: i32,\n}\n$0",
    )
    .await;
    let pos = c
        .open(
            "file:///work/demo/src/main.rs",
            "rust",
            "use geom::Point;\n\nfn origin() -> Point {\n    $0\n}\n",
        )
        .await;
    let r = c.inline("file:///work/demo/src/main.rs", pos).await;
    assert_eq!(r["result"][0]["insertText"], "Point { x: 0, y: 0 }", "{r}");
    let prompt = c.engine.last_prompt();
    assert!(
        prompt.starts_with("<|repo_name|>demo\n<|file_sep|>src/geom.rs\npub struct Point {"),
        "{prompt}"
    );
    assert!(
        prompt.contains("<|file_sep|>src/main.rs\n<|fim_prefix|>use geom::Point;"),
        "{prompt}"
    );
}

/// Random JSON values as params of every method the server knows: every call answers (an
/// error or a result) and the server keeps serving.
#[test]
fn random_params_never_panic() {
    use proptest::prelude::*;
    let leaf = prop_oneof![
        Just(json!(null)),
        any::<bool>().prop_map(|b| json!(b)),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u32>().prop_map(|n| json!(n)),
        "[a-z/:.🙂é]{0,12}".prop_map(|s| json!(s)),
        Just(json!("file:///work/demo/f.py")),
    ];
    let value = leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::vec(
                (
                    prop_oneof![
                        Just("textDocument".to_owned()),
                        Just("uri".to_owned()),
                        Just("position".to_owned()),
                        Just("line".to_owned()),
                        Just("character".to_owned()),
                        Just("range".to_owned()),
                        Just("start".to_owned()),
                        Just("end".to_owned()),
                        Just("text".to_owned()),
                        Just("version".to_owned()),
                        Just("contentChanges".to_owned()),
                        Just("context".to_owned()),
                        Just("triggerKind".to_owned()),
                    ],
                    inner
                ),
                0..5
            )
            .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    });
    let methods = METHODS;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut c = rt.block_on(start(FakeEngine::answering("ok"), true, no_debounce()));
    rt.block_on(c.open("file:///work/demo/f.py", "python", "a = $0\n"));
    let c = std::cell::RefCell::new(c);
    let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
        cases: 2000,
        ..Default::default()
    });
    runner
        .run(&(0..methods.len(), value), |(m, params)| {
            rt.block_on(c.borrow_mut().call(methods[m], Some(1), params));
            Ok(())
        })
        .unwrap();
    let r = rt.block_on(c.borrow_mut().inline("file:///work/demo/f.py", (0, 4)));
    assert!(
        r["result"].is_array() || r["error"]["code"] == -32602,
        "still serving: {r}"
    );
}

/// Cross-file context comes only from open documents inside the declared workspace folders:
/// not from /etc, a sibling folder, a `..` way out, or a folder removed from the workspace.
/// The server reads no file: what is on disk under a document's URI never reaches a prompt.
#[tokio::test]
async fn open_documents_outside_the_workspace_never_reach_a_prompt() {
    // Every request builds its prompt afresh (no typing-through, no anchored prompt).
    let init = json!({ "completion": { "debounceMs": 0, "lookAhead": false, "typingThrough": false, "anchorMaxBytes": 0 } });
    let mut c = start(FakeEngine::answering("x"), true, init).await;
    let on_disk = tempfile::tempdir().unwrap();
    let disk_file = on_disk.path().join("main.rs");
    std::fs::write(&disk_file, "struct DiskSecret;\n").unwrap();
    let outside = [
        ("file:///etc/passwd", "pub struct SecretEtc { pub root: i32 }\n"),
        (
            "file:///work/demo2/leak.rs",
            "pub struct SecretSibling { pub a: i32 }\n",
        ),
        (
            "file:///work/demo/../keys/k.rs",
            "pub struct SecretDotDot { pub a: i32 }\n",
        ),
        (
            "file:///work/demo/%2E%2E/keys/e.rs",
            "pub struct SecretEncoded { pub a: i32 }\n",
        ),
        ("file:///work/lib/lib.rs", "pub struct SecretLib { pub a: i32 }\n"),
    ];
    for (uri, text) in outside {
        c.open(uri, "rust", &format!("{text}$0")).await;
    }
    c.open(
        "file:///work/demo/src/geom.rs",
        "rust",
        "pub struct Point {\n    pub x: i32,\n}\n$0",
    )
    .await;
    let uri = format!("file://{}", disk_file.display());
    let fixture = "use geom::Point;\n\nfn f(a: SecretEtc, b: SecretSibling, c: SecretDotDot, d: SecretEncoded, e: SecretLib) -> Point {\n    $0\n}\n";
    // The document completed is in the workspace too (its folder is added below).
    c.notify(
        "workspace/didChangeWorkspaceFolders",
        json!({ "event": { "added": [{ "uri": format!("file://{}", on_disk.path().display()), "name": "disk" }], "removed": [] } }),
    )
    .await;
    let pos = c.open(&uri, "rust", fixture).await;
    c.inline(&uri, pos).await;
    let prompt = c.engine.last_prompt();
    assert!(
        prompt.contains("pub struct Point"),
        "a document inside the workspace lends: {prompt}"
    );
    for secret in [
        "struct SecretEtc",
        "SecretSibling {",
        "SecretDotDot {",
        "SecretEncoded {",
        "SecretLib {",
        "DiskSecret",
    ] {
        assert!(!prompt.contains(secret), "{secret} reached the prompt: {prompt}");
    }
    // A folder added to the workspace lends; removed again, it does not.
    let lib = json!([{ "uri": "file:///work/lib", "name": "lib" }]);
    c.notify(
        "workspace/didChangeWorkspaceFolders",
        json!({ "event": { "added": lib, "removed": [] } }),
    )
    .await;
    c.inline(&uri, pos).await;
    assert_eq!(c.engine.prompts().len(), 2);
    let prompt = c.engine.last_prompt();
    assert!(prompt.contains("pub struct SecretLib"), "{prompt}");
    c.notify(
        "workspace/didChangeWorkspaceFolders",
        json!({ "event": { "added": [], "removed": lib } }),
    )
    .await;
    c.inline(&uri, pos).await;
    assert_eq!(c.engine.prompts().len(), 3);
    let prompt = c.engine.last_prompt();
    assert!(!prompt.contains("SecretLib {"), "{prompt}");
}

/// Helix never runs an item's `laya.accept`: an acceptance is also seen when the document
/// changes to hold the suggestion at the cursor, once per item, and `laya/acceptance` says
/// which way each was seen.
#[tokio::test]
async fn an_acceptance_is_seen_in_the_document_without_the_command() {
    let mut c = start(FakeEngine::answering("return w * h"), false, no_debounce()).await;
    let uri = "file:///work/demo/area.py";
    let pos = c
        .open(uri, "python", "def area(w, h):\n    $0\n\nprint(area(2, 3))\n")
        .await;
    let r = c.inline(uri, pos).await;
    assert_eq!(r["result"][0]["insertText"], "return w * h", "{r}");
    // The editor inserts the item's text as an edit, and runs no command.
    c.insert(uri, 2, (1, 4), "return w * h").await;
    let r = c.request("laya/acceptance", json!(null)).await;
    assert_eq!(
        r["result"],
        json!({ "shown": 1, "full": 1, "word": 0, "line": 0, "byCommand": 0, "byEdit": 1 }),
        "{r}"
    );
    // A client that also runs the command does not count it twice.
    c.request(
        "workspace/executeCommand",
        json!({ "command": "laya.accept", "arguments": [{ "id": 0, "kind": "full" }] }),
    )
    .await;
    let r = c.request("laya/acceptance", json!(null)).await;
    assert_eq!(
        (r["result"]["full"].as_u64(), r["result"]["byCommand"].as_u64()),
        (Some(1), Some(0)),
        "{r}"
    );

    // Typing one character of the next suggestion is no acceptance.
    c.insert(uri, 3, (1, "    return w * h".len() as u32), "\n    ")
        .await;
    let r = c.inline(uri, (2, 4)).await;
    assert!(r["result"].is_array(), "{r}");
    c.insert(uri, 4, (2, 4), "r").await;
    let r = c.request("laya/acceptance", json!(null)).await;
    assert_eq!(
        (r["result"]["shown"].as_u64(), r["result"]["byEdit"].as_u64()),
        (Some(2), Some(1)),
        "{r}"
    );
}

/// Helix answers `workspace/configuration` with `[null]` when it has no `laya` section: the
/// settings from `initializationOptions` and `didChangeConfiguration` stay.
#[tokio::test]
async fn a_null_configuration_answer_keeps_the_settings() {
    use futures::SinkExt;
    use tower_lsp_server::jsonrpc::Response;
    let engine = FakeEngine::answering("z").shared();
    let (service, socket) = build_service(EngineSource::Ready(engine.clone()));
    let asked = Arc::new(Mutex::new(0));
    let (mut from_server, mut to_server) = socket.split();
    let counted = asked.clone();
    tokio::spawn(async move {
        while let Some(req) = from_server.next().await {
            if req.method() == "workspace/configuration" {
                *counted.lock().unwrap() += 1;
                let id = req.id().cloned().unwrap();
                let _ = to_server.send(Response::from_ok(id, json!([null]))).await;
            }
        }
    });
    let mut c = InProcess::of(service, engine);
    c.request(
        "initialize",
        json!({ "capabilities": {}, "initializationOptions": { "completion": { "debounceMs": 0, "lookAhead": false, "languages": ["rust"] } } }),
    )
    .await;
    c.notify("initialized", json!({})).await;
    let py = "file:///work/demo/s.py";
    let pos = c.open(py, "python", "a = $0\n").await;
    // No `laya` section: the server asks, the client answers [null].
    c.notify("workspace/didChangeConfiguration", json!({ "settings": {} }))
        .await;
    assert_eq!(*asked.lock().unwrap(), 1, "the server asked for the section");
    assert!(c.inline(py, pos).await["result"].is_null(), "still only Rust");
    // Settings sent with the notification apply, and a later [null] keeps them too.
    c.notify(
        "workspace/didChangeConfiguration",
        json!({ "settings": { "laya": { "completion": { "debounceMs": 0, "lookAhead": false, "languages": ["python"] } } } }),
    )
    .await;
    c.notify("workspace/didChangeConfiguration", json!({ "settings": null }))
        .await;
    assert_eq!(*asked.lock().unwrap(), 2);
    let r = c.inline(py, pos).await;
    assert_eq!(r["result"][0]["insertText"], "z", "{r}");
}

/// A client that offers progress but never answers `window/workDoneProgress/create` still gets
/// its engine (made once the request times out, 5 s) and its completions.
#[tokio::test]
async fn an_unanswered_progress_request_does_not_keep_the_engine_from_starting() {
    let engine = FakeEngine::answering("z").shared();
    let made = engine.clone();
    let (service, socket) = build_service(EngineSource::Deferred(Box::new(move |_| made)));
    // Server→client requests are read and never answered.
    tokio::spawn(socket.for_each(|_| async {}));
    let mut c = InProcess::of(service, engine);
    c.request(
        "initialize",
        json!({ "capabilities": { "window": { "workDoneProgress": true } }, "initializationOptions": no_debounce() }),
    )
    .await;
    c.notify("initialized", json!({})).await;
    let uri = "file:///work/demo/s.py";
    let pos = c.open(uri, "python", "a = $0\n").await;
    let r = c.inline(uri, pos).await;
    assert_eq!(r["result"][0]["insertText"], "z", "{r}");
}

// ---------------------------------------------------------------------------------------
// Requests that meet a model still loading.

/// What the server sent the client: (method, params) of each request and notification.
type Sent = Arc<Mutex<Vec<(String, Value)>>>;

/// A server whose engine is made after `initialized` (as `laya lsp` makes it) and whose model
/// loads until `load` finishes; answering "z". The client offers `$/progress` when
/// `progress`, answers each request of the server after `answer_after`, and keeps what the
/// server sent it. `initialize` is done; `initialized` is not.
async fn loading_server(load: &Arc<Load>, progress: bool, answer_after: Duration) -> (InProcess, Sent) {
    use futures::SinkExt;
    use tower_lsp_server::jsonrpc::Response;
    let engine = FakeEngine::answering("z").loading(load.clone()).shared();
    let (made, gate) = (engine.clone(), load.clone());
    let (service, socket) = build_service(EngineSource::Deferred(Box::new(move |report| {
        gate.report_to(report);
        made
    })));
    let sent: Sent = Arc::default();
    let (mut from_server, mut to_server) = socket.split();
    let log = sent.clone();
    tokio::spawn(async move {
        while let Some(req) = from_server.next().await {
            let params = req.params().cloned().unwrap_or(Value::Null);
            log.lock().unwrap().push((req.method().to_owned(), params));
            if let Some(id) = req.id().cloned() {
                tokio::time::sleep(answer_after).await;
                let _ = to_server.send(Response::from_ok(id, Value::Null)).await;
            }
        }
    });
    let mut c = InProcess::of(service, engine);
    let capabilities = match progress {
        true => json!({ "window": { "workDoneProgress": true } }),
        false => json!({}),
    };
    c.request(
        "initialize",
        json!({ "capabilities": capabilities, "initializationOptions": no_debounce() }),
    )
    .await;
    (c, sent)
}

/// Sends `method` to the service now and returns its answer's task (the answer as JSON).
async fn spawn_call(
    c: &mut InProcess,
    method: &str,
    id: Option<i64>,
    params: Value,
) -> tokio::task::JoinHandle<Value> {
    let mut request = Request::build(method.to_owned()).params(params);
    if let Some(id) = id {
        request = request.id(id);
    }
    let answer = c.service.ready().await.unwrap().call(request.finish());
    tokio::spawn(async move { serde_json::to_value(answer.await.unwrap()).unwrap() })
}

/// An inline completion at the end of `uri`'s line 0 (`a = `), invoked or automatic.
fn inline_params(uri: &str, invoked: bool) -> Value {
    json!({
        "textDocument": { "uri": uri }, "position": { "line": 0, "character": 4 },
        "context": { "triggerKind": if invoked { 1 } else { 2 } },
    })
}

fn inline_request(id: i64, uri: &str, invoked: bool) -> Request {
    Request::build("textDocument/inlineCompletion")
        .id(id)
        .params(inline_params(uri, invoked))
        .finish()
}

/// Waits (10 s at most) until the server has sent a message that `what` matches.
async fn until_sent(sent: &Sent, what: impl Fn(&str, &Value) -> bool) {
    let found = tokio::time::timeout(Duration::from_secs(10), async {
        while !sent.lock().unwrap().iter().any(|(m, p)| what(m, p)) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(
        found.is_ok(),
        "not sent; the server sent {:?}",
        sent.lock().unwrap()
    );
}

/// `$/progress` of the model's token: each value's kind.
fn model_progress(sent: &Sent) -> Vec<String> {
    let sent = sent.lock().unwrap();
    sent.iter()
        .filter(|(m, p)| m == "$/progress" && p["token"] == "laya/model")
        .map(|(_, p)| p["value"]["kind"].as_str().unwrap_or("?").to_owned())
        .collect()
}

fn is_waiting_report(m: &str, p: &Value) -> bool {
    m == "$/progress" && p["token"] == "laya/model" && p["value"]["kind"] == "report"
}

/// The first request comes right after `initialized`, while the client has not yet answered
/// the progress request and the model still loads: it waits for the load, `$/progress` says
/// so (created, begun, a report that a completion waits, ended), and it is answered with the
/// completion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_request_waits_for_the_model_to_load_and_is_answered() {
    let load = Load::new();
    let (mut c, sent) = loading_server(&load, true, Duration::from_millis(300)).await;
    // `initialized` runs beside what follows, as the real transport runs handlers.
    let initialized = spawn_call(&mut c, "initialized", None, json!({})).await;
    let uri = "file:///work/demo/a.py";
    c.open(uri, "python", "a = $0\n").await;
    let first = spawn_call(
        &mut c,
        "textDocument/inlineCompletion",
        Some(7),
        inline_params(uri, true),
    )
    .await;
    until_sent(&sent, is_waiting_report).await;
    assert!(!first.is_finished(), "answered before the model loaded");
    load.finish();
    let answer = tokio::time::timeout(Duration::from_secs(10), first)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answer["result"][0]["insertText"], "z", "{answer}");
    initialized.await.unwrap();
    until_sent(&sent, |m, p| {
        m == "window/logMessage" && p["message"].as_str().is_some_and(|t| t.contains("model ready"))
    })
    .await;
    assert_eq!(model_progress(&sent), ["begin", "report", "end"]);
    let created = sent
        .lock()
        .unwrap()
        .iter()
        .position(|(m, p)| m == "window/workDoneProgress/create" && p["token"] == "laya/model");
    let begun = sent.lock().unwrap().iter().position(|(m, _)| m == "$/progress");
    assert!(created.is_some() && created < begun, "{:?}", sent.lock().unwrap());
}

/// A client that does not offer `window.workDoneProgress` is sent no progress at all, and its
/// request during the load is answered all the same.
#[tokio::test]
async fn no_progress_goes_to_a_client_that_did_not_offer_it() {
    let load = Load::new();
    let (mut c, sent) = loading_server(&load, false, Duration::ZERO).await;
    c.notify("initialized", json!({})).await;
    let uri = "file:///work/demo/a.py";
    c.open(uri, "python", "a = $0\n").await;
    let first = spawn_call(
        &mut c,
        "textDocument/inlineCompletion",
        Some(7),
        inline_params(uri, false),
    )
    .await;
    load.finish();
    let answer = tokio::time::timeout(Duration::from_secs(10), first)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answer["result"][0]["insertText"], "z", "{answer}");
    until_sent(&sent, |m, p| {
        m == "window/logMessage" && p["message"].as_str().is_some_and(|t| t.contains("model ready"))
    })
    .await;
    let progress: Vec<_> = sent
        .lock()
        .unwrap()
        .iter()
        .filter(|(m, _)| m.contains("rogress"))
        .cloned()
        .collect();
    assert_eq!(progress, vec![], "no progress for this client");
}

/// A request that comes before `initialized` made the engine waits for it.
#[tokio::test]
async fn a_request_before_the_engine_exists_waits_for_it() {
    let load = Load::new();
    load.finish();
    let (mut c, _sent) = loading_server(&load, true, Duration::ZERO).await;
    let uri = "file:///work/demo/a.py";
    c.open(uri, "python", "a = $0\n").await;
    let first = spawn_call(
        &mut c,
        "textDocument/inlineCompletion",
        Some(7),
        inline_params(uri, true),
    )
    .await;
    c.notify("initialized", json!({})).await;
    let answer = tokio::time::timeout(Duration::from_secs(10), first)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answer["result"][0]["insertText"], "z", "{answer}");
}

/// `$/cancelRequest` for a request waiting on the load answers it at once (RequestCancelled),
/// with the model still loading; nothing reached the model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_during_the_load_answers_at_once() {
    let load = Load::new();
    let (mut c, sent) = loading_server(&load, true, Duration::ZERO).await;
    c.notify("initialized", json!({})).await;
    let uri = "file:///work/demo/a.py";
    c.open(uri, "python", "a = $0\n").await;
    let first = spawn_call(
        &mut c,
        "textDocument/inlineCompletion",
        Some(7),
        inline_params(uri, true),
    )
    .await;
    until_sent(&sent, is_waiting_report).await;
    c.notify("$/cancelRequest", json!({ "id": 7 })).await;
    let answer = tokio::time::timeout(Duration::from_secs(10), first)
        .await
        .expect("answered while the model still loads")
        .unwrap();
    assert_eq!(answer["error"]["code"], -32800, "{answer}");
    assert!(c.engine.prompts().is_empty());
    assert_eq!(model_progress(&sent), ["begin", "report"], "the load goes on");
}

/// While the model loads, a newer request for the document supersedes an older automatic one
/// (answered RequestCancelled) but not an invoked one, which the client asked for and is
/// answered once the model is ready; so is the newest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_automatic_requests_are_superseded_while_the_model_loads() {
    let load = Load::new();
    let (mut c, sent) = loading_server(&load, true, Duration::ZERO).await;
    c.notify("initialized", json!({})).await;
    let uri = "file:///work/demo/a.py";
    c.open(uri, "python", "a = $0\n").await;
    let invoked = spawn_call(
        &mut c,
        "textDocument/inlineCompletion",
        Some(1),
        inline_params(uri, true),
    )
    .await;
    until_sent(&sent, is_waiting_report).await;
    // Sent in this order: the older one's handler starts first (as the transport starts them).
    let older = c
        .service
        .ready()
        .await
        .unwrap()
        .call(inline_request(2, uri, false));
    let newer = c
        .service
        .ready()
        .await
        .unwrap()
        .call(inline_request(3, uri, false));
    let (superseded, told) = tokio::sync::oneshot::channel();
    let older = async move {
        let r = serde_json::to_value(older.await.unwrap()).unwrap();
        let _ = superseded.send(());
        r
    };
    let finish = async {
        let _ = told.await;
        load.finish();
    };
    let (older, newer, ()) = tokio::time::timeout(Duration::from_secs(10), async {
        tokio::join!(older, newer, finish)
    })
    .await
    .unwrap();
    assert_eq!(older["error"]["code"], -32800, "{older}");
    let newer = serde_json::to_value(newer.unwrap()).unwrap();
    for r in [
        tokio::time::timeout(Duration::from_secs(10), invoked)
            .await
            .unwrap()
            .unwrap(),
        newer,
    ] {
        assert_eq!(r["result"][0]["insertText"], "z", "{r}");
    }
}
