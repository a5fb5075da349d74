//! The workspace index through the LSP server: built after `initialized` over the declared
//! folder, lending definitions of files that are not open to the prompt, kept current from
//! file events and saves, never reading outside the folder; `laya/explain` names what it lent.
//! Folders and files whose names hold spaces and non-ASCII characters come as percent-encoded
//! URIs and are read, and shown, by their decoded paths.

use std::{
    os::unix::ffi::OsStrExt,
    path::Path,
    time::{Duration, Instant},
};

use serde_json::{json, Value};

use crate::support::{engine::FakeEngine, lsp::InProcess};

const CART: &str =
    "class Cart:\n    def add_item(self, sku: str, quantity: int = 1) -> None:\n        pass\n";
const VIEWS: &str = "from .cart import Cart\n\ndef checkout(cart: Cart):\n    cart.$0";

/// Complete at `pos` until the prompt satisfies `want` (the index builds in the background),
/// for at most 20 s; the last prompt.
async fn prompt_until(c: &mut InProcess, uri: &str, pos: (u32, u32), want: impl Fn(&str) -> bool) -> String {
    let start = Instant::now();
    loop {
        c.inline(uri, pos).await;
        let prompt = c.engine.last_prompt();
        if want(&prompt) || start.elapsed() > Duration::from_secs(20) {
            return prompt;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn file_event(path: &std::path::Path, kind: u32) -> Value {
    json!({ "changes": [{ "uri": format!("file://{}", path.display()), "type": kind }] })
}

#[tokio::test]
async fn files_not_open_lend_their_definitions_and_file_events_keep_them_current() {
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    std::fs::create_dir_all(root.join("shop")).unwrap();
    std::fs::write(root.join("shop/cart.py"), CART).unwrap();
    std::fs::write(root.join("shop/views.py"), VIEWS.replace("$0", "")).unwrap();
    let outside = tempfile::tempdir().unwrap();
    let secret = std::fs::canonicalize(outside.path()).unwrap().join("secret.py");
    std::fs::write(
        &secret,
        "class Cart:\n    def leak_outside(self):\n        pass\n",
    )
    .unwrap();

    let mut c = InProcess::new(FakeEngine::answering("x").shared());
    let folders = json!([{ "uri": format!("file://{}", root.display()), "name": "shop" }]);
    let init = json!({ "completion": { "debounceMs": 0, "lookAhead": false, "typingThrough": false, "anchorMaxBytes": 0, "workspaceContext": true } });
    c.initialize(true, init, folders).await;
    let uri = format!("file://{}", root.join("shop/views.py").display());
    let pos = c.open(&uri, "python", VIEWS).await;

    let lent = "<|file_sep|>shop/cart.py\nclass Cart:\n    def add_item(self, sku: str, quantity: int = 1) -> None:\n<|file_sep|>shop/views.py\n";
    let prompt = prompt_until(&mut c, &uri, pos, |p| p.contains(lent)).await;
    assert!(prompt.contains(lent), "{prompt}");
    let explained = c
        .request("laya/explain", json!({ "textDocument": { "uri": uri } }))
        .await;
    assert_eq!(
        explained["result"]["contextFiles"],
        json!([{ "path": "shop/cart.py", "symbols": ["Cart"] }]),
        "{explained}"
    );

    // Changed on disk: the watched-file event brings the new method in.
    std::fs::write(root.join("shop/cart.py"), CART.replace("add_item", "remove_item")).unwrap();
    c.notify(
        "workspace/didChangeWatchedFiles",
        file_event(&root.join("shop/cart.py"), 2),
    )
    .await;
    let prompt = prompt_until(&mut c, &uri, pos, |p| p.contains("remove_item")).await;
    assert!(
        prompt.contains("def remove_item(") && !prompt.contains("add_item"),
        "{prompt}"
    );

    // An event for a file outside the folder is not read.
    c.notify("workspace/didChangeWatchedFiles", file_event(&secret, 1))
        .await;
    c.inline(&uri, pos).await;
    assert!(!c.engine.last_prompt().contains("leak_outside"));

    // Deleted: gone from the prompt.
    std::fs::remove_file(root.join("shop/cart.py")).unwrap();
    c.notify(
        "workspace/didChangeWatchedFiles",
        file_event(&root.join("shop/cart.py"), 3),
    )
    .await;
    c.inline(&uri, pos).await;
    assert!(!c.engine.last_prompt().contains("shop/cart.py"));

    // A saved file is read again (the client sends no text).
    std::fs::write(root.join("shop/cart.py"), CART).unwrap();
    c.notify(
        "textDocument/didSave",
        json!({ "textDocument": { "uri": format!("file://{}", root.join("shop/cart.py").display()) } }),
    )
    .await;
    c.inline(&uri, pos).await;
    assert!(c.engine.last_prompt().contains(lent));
}

#[tokio::test]
async fn the_setting_off_builds_no_index_and_lends_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    std::fs::create_dir_all(root.join("shop")).unwrap();
    std::fs::write(root.join("shop/cart.py"), CART).unwrap();
    let mut c = InProcess::new(FakeEngine::answering("x").shared());
    let folders = json!([{ "uri": format!("file://{}", root.display()), "name": "shop" }]);
    let init = json!({ "completion": { "debounceMs": 0, "lookAhead": false, "typingThrough": false, "anchorMaxBytes": 0, "workspaceContext": false } });
    c.initialize(true, init, folders).await;
    let uri = format!("file://{}", root.join("shop/views.py").display());
    let pos = c.open(&uri, "python", VIEWS).await;
    for _ in 0..5 {
        c.inline(&uri, pos).await;
        assert!(!c.engine.last_prompt().contains("cart.py"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Folders added after start are indexed, folders removed stop lending, and an open document's
/// unsaved text survives the rebuild (the new index reads the disk, then the editor's text).
#[tokio::test]
async fn added_and_removed_workspace_folders_change_what_is_indexed() {
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let (app, lib) = (root.join("app"), root.join("lib"));
    std::fs::create_dir_all(&app).unwrap();
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::write(lib.join("cart.py"), CART).unwrap();
    let fixture = "from cart import Cart\nfrom stock import restock\n\ndef checkout(cart: Cart):\n    restock(cart, \"a\")\n    cart.$0";
    std::fs::write(app.join("views.py"), fixture.replace("$0", "")).unwrap();
    let on_disk = "def restock(count):\n    pass\n";
    std::fs::write(app.join("stock.py"), on_disk).unwrap();

    let mut c = InProcess::new(FakeEngine::answering("x").shared());
    let folder = |p: &std::path::Path| json!({ "uri": format!("file://{}", p.display()), "name": "f" });
    let init = json!({ "completion": { "debounceMs": 0, "lookAhead": false, "typingThrough": false, "anchorMaxBytes": 0, "workspaceContext": true } });
    c.initialize(true, init, json!([folder(&app)])).await;
    let uri = format!("file://{}", app.join("views.py").display());
    let pos = c.open(&uri, "python", fixture).await;
    // An open file of the first folder, edited and not saved: the editor's text is indexed.
    let stock = format!("file://{}", app.join("stock.py").display());
    c.open(&stock, "python", &format!("{on_disk}$0")).await;
    c.notify(
        "textDocument/didChange",
        json!({
            "textDocument": { "uri": stock, "version": 2 },
            "contentChanges": [{ "text": "def restock(cart: Cart, sku: str):\n    pass\n" }],
        }),
    )
    .await;
    let edited = "def restock(cart: Cart, sku: str):";
    let prompt = prompt_until(&mut c, &uri, pos, |p| p.contains(edited)).await;
    assert!(
        prompt.contains(edited) && !prompt.contains("add_item"),
        "{prompt}"
    );

    c.notify(
        "workspace/didChangeWorkspaceFolders",
        json!({ "event": { "added": [folder(&lib)], "removed": [] } }),
    )
    .await;
    let prompt = prompt_until(&mut c, &uri, pos, |p| p.contains("def add_item(")).await;
    assert!(
        prompt.contains("<|file_sep|>cart.py\nclass Cart:\n    def add_item("),
        "{prompt}"
    );
    assert!(
        prompt.contains(edited) && !prompt.contains("restock(count)"),
        "the rebuilt index keeps the editor's text: {prompt}"
    );

    c.notify(
        "workspace/didChangeWorkspaceFolders",
        json!({ "event": { "added": [], "removed": [folder(&lib)] } }),
    )
    .await;
    let prompt = prompt_until(&mut c, &uri, pos, |p| !p.contains("add_item")).await;
    assert!(!prompt.contains("add_item"), "{prompt}");
}

/// `path` as an editor sends it: a `file://` URI with every byte but the unreserved ones and
/// `/` percent-encoded.
fn file_uri(path: &Path) -> String {
    let mut uri = String::from("file://");
    for &b in path.as_os_str().as_bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => uri.push(b as char),
            _ => uri.push_str(&format!("%{b:02X}")),
        }
    }
    uri
}

/// A workspace folder and files whose names hold spaces and non-ASCII characters: the index
/// reads the folder the encoded URI names, and the prompt shows the repository, the file the
/// index lent and the current file by their decoded names (`laya/explain` too).
#[tokio::test]
async fn percent_encoded_uris_are_read_and_shown_as_the_paths_they_name() {
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap().join("my café");
    std::fs::create_dir_all(root.join("my shop")).unwrap();
    std::fs::write(root.join("my shop/cart.py"), CART).unwrap();
    std::fs::write(root.join("my shop/vues é.py"), VIEWS.replace("$0", "")).unwrap();

    let mut c = InProcess::new(FakeEngine::answering("x").shared());
    let folders = json!([{ "uri": file_uri(&root), "name": "my café" }]);
    let init = json!({ "completion": { "debounceMs": 0, "lookAhead": false, "typingThrough": false, "anchorMaxBytes": 0, "workspaceContext": true } });
    c.initialize(true, init, folders).await;
    let uri = file_uri(&root.join("my shop/vues é.py"));
    assert!(uri.ends_with("/my%20shop/vues%20%C3%A9.py"), "{uri}");
    let pos = c.open(&uri, "python", VIEWS).await;

    let lent = "<|repo_name|>my café\n<|file_sep|>my shop/cart.py\nclass Cart:\n    def add_item(self, sku: str, quantity: int = 1) -> None:\n<|file_sep|>my shop/vues é.py\n<|fim_prefix|>";
    let prompt = prompt_until(&mut c, &uri, pos, |p| p.contains(lent)).await;
    assert!(prompt.starts_with(lent), "{prompt}");
    let explained = c
        .request("laya/explain", json!({ "textDocument": { "uri": uri } }))
        .await;
    assert_eq!(
        explained["result"]["contextFiles"],
        json!([{ "path": "my shop/cart.py", "symbols": ["Cart"] }]),
        "{explained}"
    );
}
