//! The workspace index's life in the server: built in the background after `initialized`
//! (reported through `$/progress`, never delaying `initialize` or a completion), built again
//! over the new folders after `workspace/didChangeWorkspaceFolders` (the old index serves
//! until the new one is ready), kept current from `didSave`, from the text of open documents
//! edited since the last request, and from `workspace/didChangeWatchedFiles` (registered
//! dynamically where the client allows it).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use dashmap::DashSet;
use tower_lsp_server::{lsp_types::*, Client};

use crate::document::DocumentStore;
use crate::workspace::{file_path, Limits, WorkspaceIndex};

/// The index of a server, once it is built, and the open documents edited since it last read
/// them.
#[derive(Default)]
pub struct Indexing {
    index: std::sync::RwLock<Option<Arc<WorkspaceIndex>>>,
    dirty: DashSet<String>,
    /// Open documents edited since they were last saved: a new build reads the disk, so it
    /// takes their editor text again.
    edited: DashSet<String>,
    /// The latest build started: a build that ends after a newer one started is dropped.
    generation: AtomicU64,
}

impl Indexing {
    /// The index, once built (completions before that go without workspace context).
    pub fn index(&self) -> Option<Arc<WorkspaceIndex>> {
        self.index.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Build the index over `roots` on a blocking thread, reporting progress to the client
    /// (when it takes progress), then keep it in place of the one before, unless another
    /// build started meanwhile. No roots: no index. Returns at once.
    pub fn start(self: &Arc<Self>, client: Client, roots: Vec<PathBuf>, progress: bool) {
        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        if roots.is_empty() {
            *self.index.write().unwrap_or_else(|p| p.into_inner()) = None;
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            // The build starts at once; the progress request to the client runs beside it
            // (a client that never answers delays nothing).
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, usize)>();
            let keep = this.clone();
            // The index serves completions as soon as it is built, whatever the progress
            // messages are doing.
            let build = tokio::task::spawn_blocking(move || {
                let index = WorkspaceIndex::new(roots, Limits::default());
                let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(4);
                let stats = index.build(threads, |done, total| {
                    let _ = tx.send((done, total));
                });
                let mut slot = keep.index.write().unwrap_or_else(|p| p.into_inner());
                if keep.generation.load(Ordering::SeqCst) == generation {
                    *slot = Some(Arc::new(index));
                    for uri in keep.edited.iter() {
                        keep.dirty.insert(uri.clone());
                    }
                }
                stats
            });
            let progress = super::progress::Progress::create(&client, "laya/index", progress).await;
            let send = |value: WorkDoneProgress| {
                let progress = progress.clone();
                async move { progress.send(value).await }
            };
            send(WorkDoneProgress::Begin(WorkDoneProgressBegin {
                title: "laya: indexing the workspace".into(),
                percentage: Some(0),
                ..Default::default()
            }))
            .await;
            let mut last = 0;
            while let Some((done, total)) = rx.recv().await {
                let pct = (100 * done / total.max(1)) as u32;
                if pct >= last + 5 {
                    last = pct;
                    send(WorkDoneProgress::Report(WorkDoneProgressReport {
                        message: Some(format!("{done}/{total} files")),
                        percentage: Some(pct),
                        ..Default::default()
                    }))
                    .await;
                }
            }
            let Ok(stats) = build.await else {
                send(WorkDoneProgress::End(WorkDoneProgressEnd {
                    message: Some("failed".into()),
                }))
                .await;
                return;
            };
            let msg = format!(
                "{} files, {} definitions in {:.1} s",
                stats.files,
                stats.definitions,
                stats.elapsed.as_secs_f64()
            );
            send(WorkDoneProgress::End(WorkDoneProgressEnd {
                message: Some(msg.clone()),
            }))
            .await;
            client
                .log_message(MessageType::INFO, format!("laya: workspace indexed: {msg}"))
                .await;
        });
    }

    /// Ask the client to report file events under the workspace, where it registers
    /// watchers dynamically.
    pub async fn watch(client: &Client) {
        let options = DidChangeWatchedFilesRegistrationOptions {
            watchers: vec![FileSystemWatcher {
                glob_pattern: GlobPattern::String("**/*".into()),
                kind: None,
            }],
        };
        let registration = Registration {
            id: "laya/watched-files".into(),
            method: "workspace/didChangeWatchedFiles".into(),
            register_options: serde_json::to_value(options).ok(),
        };
        let _ = tokio::time::timeout(
            super::CONFIGURATION_TIMEOUT,
            client.register_capability(vec![registration]),
        )
        .await;
    }

    /// An open document changed: its text is read into the index before the next request.
    pub fn changed(&self, uri: &str) {
        self.dirty.insert(uri.to_owned());
        self.edited.insert(uri.to_owned());
    }

    /// Read the open documents changed since the last call into the index.
    pub fn refresh(&self, docs: &DocumentStore) {
        let Some(index) = self.index() else { return };
        let uris: Vec<String> = self.dirty.iter().map(|u| u.clone()).collect();
        for uri in uris {
            self.dirty.remove(&uri);
            if let (Some(path), Ok(doc)) = (file_path(&uri), docs.snapshot(&uri)) {
                index.update(&path, &doc.text);
            }
        }
    }

    /// A document was saved (with its text when the client sends it) or closed: the index
    /// takes what is on disk (or the saved text).
    pub fn saved(&self, uri: &str, text: Option<&str>) {
        self.dirty.remove(uri);
        self.edited.remove(uri);
        let (Some(index), Some(path)) = (self.index(), file_path(uri)) else {
            return;
        };
        match text {
            Some(t) => index.update(&path, t),
            None => index.reload(&path),
        }
    }

    /// Files created, changed or deleted on disk; open documents keep their editor text.
    pub fn files_changed(&self, docs: &DocumentStore, changes: &[FileEvent]) {
        let Some(index) = self.index() else { return };
        for c in changes {
            let uri = c.uri.as_str();
            let Some(path) = file_path(uri) else { continue };
            if docs.snapshot(uri).is_ok() {
                continue;
            }
            if c.typ == FileChangeType::DELETED {
                index.remove(&path);
            } else {
                index.reload(&path);
            }
        }
    }
}
