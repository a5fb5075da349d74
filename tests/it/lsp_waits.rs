//! What a request waits for before it asks the model, and what is asked before a request comes:
//! an invoked request starts at once, an automatic one waits its debounce (fixed, or the
//! typist's pace), and the answer an accept will ask for is computed while the suggestion
//! shows. In-process on the fake engine, as `lsp_server`.

use std::time::Duration;

use serde_json::{json, Value};
use tower::{Service, ServiceExt};
use tower_lsp_server::jsonrpc::Request;

use crate::support::{engine::FakeEngine, lsp::InProcess};

async fn start(engine: FakeEngine, init: Value) -> InProcess {
    let mut c = InProcess::new(engine.shared());
    let folders = json!([{ "uri": "file:///work/demo", "name": "demo" }]);
    c.initialize(true, init, folders).await;
    c
}

async fn explain(c: &mut InProcess, uri: &str) -> Value {
    c.request("laya/explain", json!({ "textDocument": { "uri": uri } }))
        .await["result"]
        .clone()
}

fn inline_params(uri: &str, (line, character): (u32, u32), trigger: u32) -> Value {
    json!({
        "textDocument": { "uri": uri },
        "position": { "line": line, "character": character },
        "context": { "triggerKind": trigger },
    })
}

/// An invoked request (triggerKind 1) never waits; an automatic one waits the fixed
/// `debounceMs` when the user set one, and what the pace says otherwise (here: a fake that
/// answers at once, well inside any typist's gaps, so nothing).
#[tokio::test]
async fn an_invoked_request_starts_at_once_and_an_automatic_one_waits_its_debounce() {
    let init = json!({ "completion": { "debounceMs": 300, "lookAhead": false, "typingThrough": false } });
    let mut c = start(FakeEngine::answering("x + 1"), init).await;
    let uri = "file:///work/demo/a.py";
    let pos = c.open(uri, "python", "def f(x):\n    return $0\n").await;
    let r = c
        .request("textDocument/inlineCompletion", inline_params(uri, pos, 1))
        .await;
    assert_eq!(r["result"][0]["insertText"], "x + 1", "{r}");
    let e = explain(&mut c, uri).await;
    assert_eq!(
        (e["waitMs"].as_f64(), e["trigger"].as_str()),
        (Some(0.0), Some("invoked")),
        "{e}"
    );

    let r = c.inline(uri, pos).await;
    assert_eq!(r["result"][0]["insertText"], "x + 1", "{r}");
    let e = explain(&mut c, uri).await;
    assert_eq!(e["waitMs"].as_f64(), Some(300.0), "{e}");
    assert!(e["markdown"].as_str().unwrap().contains("waited 300 ms"), "{e}");

    // No `debounceMs`: the typist's pace, against a model that answers at once.
    let init = json!({ "completion": { "lookAhead": false, "typingThrough": false } });
    let mut c = start(FakeEngine::answering("x + 1"), init).await;
    let pos = c.open(uri, "python", "def f(x):\n    return $0\n").await;
    for version in 2..6 {
        c.insert(uri, version, (pos.0, pos.1 + version as u32 - 2), " ")
            .await;
        c.inline(uri, (pos.0, pos.1 + version as u32 - 1)).await;
    }
    // At most one step of the rule: the fake's microseconds can fall inside a gap.
    let e = explain(&mut c, uri).await;
    assert!(e["waitMs"].as_f64().is_some_and(|w| w <= 5.0), "{e}");
    let counts = c.request("laya/requests", json!(null)).await["result"].clone();
    assert_eq!(
        (counts["requests"].as_u64(), counts["modelCalls"].as_u64()),
        (Some(4), Some(4)),
        "{counts}"
    );
}

/// An invoked request is cancelled by a newer invoked one (the user asked again), as an
/// automatic one is by any newer request.
#[tokio::test]
async fn a_newer_invoked_request_cancels_the_older_one() {
    let init = json!({ "completion": { "lookAhead": false } });
    let mut c = start(
        FakeEngine::answering("done").delayed(Duration::from_millis(300)),
        init,
    )
    .await;
    let uri = "file:///work/demo/c.go";
    let pos = c
        .open(uri, "go", "package main\n\nfunc f() int {\n\treturn $0\n}\n")
        .await;
    let call = |id: i64| {
        Request::build("textDocument/inlineCompletion")
            .id(id)
            .params(inline_params(uri, pos, 1))
            .finish()
    };
    let f1 = c.service.ready().await.unwrap().call(call(100));
    let f2 = c.service.ready().await.unwrap().call(call(101));
    let (r1, r2) = tokio::join!(f1, f2);
    let r1 = serde_json::to_value(r1.unwrap().unwrap()).unwrap();
    let r2 = serde_json::to_value(r2.unwrap().unwrap()).unwrap();
    assert_eq!(r1["error"]["code"], -32800, "the older is cancelled: {r1}");
    assert_eq!(r2["result"][0]["insertText"], "done", "{r2}");
    let counts = c.request("laya/requests", json!(null)).await["result"].clone();
    assert_eq!(
        (counts["modelCalls"].as_u64(), counts["modelCancelled"].as_u64()),
        (Some(2), Some(1)),
        "{counts}"
    );
}

/// The fake's answers: a fresh prompt gets the line, a prompt that continues it with the line
/// accepted gets a comment after it.
fn line_then_comment(prompt: &str) -> Vec<String> {
    if prompt.ends_with("<|fim_middle|>") {
        vec!["return a + b".into()]
    } else if prompt.ends_with("return a + b") {
        vec!["  # the sum".into()]
    } else {
        vec![]
    }
}

/// While a suggestion shows, the answer at the cursor its accept gives is computed: the accept
/// (here as Helix makes it, an edit and no command) finds it with no wait and no model call;
/// typing the suggestion on the way there keeps it.
#[tokio::test]
async fn the_answer_after_an_accept_is_computed_while_the_suggestion_shows() {
    let init = json!({ "completion": { "debounceMs": 200 } });
    let mut c = start(FakeEngine::scripted(line_then_comment), init).await;
    let uri = "file:///work/demo/calc.py";
    let pos = c
        .open(uri, "python", "def add(a, b):\n    $0\n\nprint(add(1, 2))\n")
        .await;
    let r = c
        .request("textDocument/inlineCompletion", inline_params(uri, pos, 1))
        .await;
    assert_eq!(r["result"][0]["insertText"], "return a + b", "{r}");
    // The accept's answer is asked for at once, continuing the shown prompt with the suggestion.
    let prompts = c.engine.until_prompts(2).await;
    assert_eq!(prompts.len(), 2, "{prompts:?}");
    assert_eq!(prompts[1], format!("{}return a + b", prompts[0]));

    // Typing the suggestion's start: answered from it, the answer ahead kept.
    c.insert(uri, 2, pos, "ret").await;
    let r = c.inline(uri, (pos.0, pos.1 + 3)).await;
    assert_eq!(r["result"][0]["insertText"], "urn a + b", "{r}");
    // Then the accept of the rest: an edit (Helix runs no command).
    c.insert(uri, 3, (pos.0, pos.1 + 3), "urn a + b").await;
    let r = c.inline(uri, (pos.0, pos.1 + 12)).await;
    assert_eq!(r["result"][0]["insertText"], "  # the sum", "{r}");
    let e = explain(&mut c, uri).await;
    assert_eq!(
        (e["ahead"].as_bool(), e["waitMs"].as_f64()),
        (Some(true), Some(0.0)),
        "{e}"
    );
    assert_eq!(e["source"], "model", "{e}");
    // No model call for it; the shown answer computed ahead again (it has nothing after it).
    let prompts = c.engine.until_prompts(3).await;
    assert_eq!(prompts.len(), 3, "{prompts:?}");
    let counts = c.request("laya/requests", json!(null)).await["result"].clone();
    assert_eq!(
        (
            counts["ahead"].as_u64(),
            counts["modelCalls"].as_u64(),
            counts["typedThrough"].as_u64()
        ),
        (Some(1), Some(1), Some(1)),
        "{counts}"
    );
    let acceptance = c.request("laya/acceptance", json!(null)).await["result"].clone();
    assert_eq!(acceptance["byEdit"], 1, "{acceptance}");
}

/// Typing anything but the suggestion cancels the answer computed ahead (it frees the model
/// for the request that matters), and the next request asks the model as usual.
#[tokio::test]
async fn a_change_off_the_suggestion_cancels_the_answer_ahead() {
    let init = json!({ "completion": { "debounceMs": 0 } });
    let engine = FakeEngine::scripted(line_then_comment).delayed(Duration::from_millis(200));
    let mut c = start(engine, init).await;
    let uri = "file:///work/demo/calc.py";
    let pos = c
        .open(uri, "python", "def add(a, b):\n    $0\n\nprint(add(1, 2))\n")
        .await;
    let r = c.inline(uri, pos).await;
    assert_eq!(r["result"][0]["insertText"], "return a + b", "{r}");
    c.engine.until_prompts(2).await;
    // Off the suggestion: the answer ahead, still waiting out its 200 ms, is cancelled.
    c.insert(uri, 2, pos, "pass").await;
    let end = tokio::time::Instant::now() + Duration::from_secs(5);
    while c.engine.cancelled() < 1 && tokio::time::Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(c.engine.cancelled(), 1);
    let r = c.inline(uri, (pos.0, pos.1 + 4)).await;
    assert!(r["result"].is_array(), "{r}");
    let e = explain(&mut c, uri).await;
    assert_eq!(e["ahead"].as_bool(), Some(false), "{e}");
    let counts = c.request("laya/requests", json!(null)).await["result"].clone();
    assert_eq!(
        (counts["ahead"].as_u64(), counts["modelCalls"].as_u64()),
        (Some(0), Some(2)),
        "{counts}"
    );
}

/// `lookAhead` off: nothing is computed beside the requests.
#[tokio::test]
async fn nothing_is_computed_ahead_when_look_ahead_is_off() {
    let init = json!({ "completion": { "debounceMs": 0, "lookAhead": false } });
    let mut c = start(FakeEngine::scripted(line_then_comment), init).await;
    let uri = "file:///work/demo/calc.py";
    let pos = c
        .open(uri, "python", "def add(a, b):\n    $0\n\nprint(add(1, 2))\n")
        .await;
    c.inline(uri, pos).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(c.engine.prompts().len(), 1);
    let counts = c.request("laya/requests", json!(null)).await["result"].clone();
    assert_eq!(counts["aheadStarted"], 0, "{counts}");
}

/// A request dropped by `$/cancelRequest` while the model runs, or while it waits, is counted
/// where it stopped (`laya/requests`): its future ends without reaching the code after its
/// await.
#[tokio::test]
async fn requests_the_client_cancels_are_counted_where_they_stopped() {
    let init = json!({ "completion": { "debounceMs": 1000, "lookAhead": false } });
    let mut c = start(
        FakeEngine::answering("done").delayed(Duration::from_secs(5)),
        init,
    )
    .await;
    let uri = "file:///work/demo/c.py";
    let pos = c.open(uri, "python", "def f():\n    return $0\n").await;
    // Invoked: no wait, so it is in the model; automatic: in its 1 s wait.
    for (id, trigger) in [(500, 1), (501, 2)] {
        let request = Request::build("textDocument/inlineCompletion")
            .id(id)
            .params(inline_params(uri, pos, trigger))
            .finish();
        let pending = tokio::spawn(c.service.ready().await.unwrap().call(request));
        tokio::time::sleep(Duration::from_millis(100)).await;
        c.notify("$/cancelRequest", json!({ "id": id })).await;
        let answer = serde_json::to_value(pending.await.unwrap().unwrap()).unwrap();
        assert_eq!(answer["error"]["code"], -32800, "{answer}");
    }
    let counts = c.request("laya/requests", json!(null)).await["result"].clone();
    assert_eq!(
        (
            counts["modelCalls"].as_u64(),
            counts["modelCancelled"].as_u64(),
            counts["waitedOut"].as_u64()
        ),
        (Some(1), Some(1), Some(1)),
        "{counts}"
    );
}
