//! `laya lsp`: the Language Server Protocol edge, the only module that knows LSP types.
//! [`LayaServer`] keeps the open documents and answers `textDocument/inlineCompletion` (LSP
//! 3.18, ghost text) and, for clients without it, `textDocument/completion` items with a
//! `textEdit`; also `laya/explain` (what a document's last request did) and acceptance counts.
//!
//! A request cancels the document's older one (RequestCancelled): an automatic one any newer
//! request, an invoked one a newer invoked request or any made once the document changed;
//! `$/cancelRequest` drops it at once. A keystroke that types the shown suggestion is answered
//! at once, with no model call; so is a request at the cursor a suggestion's accept gave, from
//! the answer computed ahead while the suggestion was shown (`ahead`). Otherwise an invoked
//! request starts at once and an automatic one waits what the typist's pace says (`debounce`),
//! or the user's fixed `debounceMs`. A request that meets a loading model (or comes before the
//! engine exists) waits for it, bounded only by its cancellation, and `$/progress` says it
//! waits.
//!
//! Invariants: client input never panics the server (bad positions and unknown documents are
//! InvalidParams); `initialize` never waits for a model (the engine is made in `initialized`);
//! a document is only the text the client sent; files are read only by the workspace index,
//! under the declared folders.
//!
//! Submodules: `transport` (the wire), `convert` (positions to byte offsets and back),
//! `progress`, `workspace` (which open documents may lend context), `indexing` (the
//! workspace index's life), `acceptance`, `debounce` (the wait of an automatic request),
//! `ahead` (the answer after an accept, computed before it is asked for), `panic_guard`. Start with [`serve_stdio`], then
//! [`LayaServer::inline_completion`].

pub mod acceptance;
pub mod ahead;
pub mod convert;
pub mod debounce;
pub mod indexing;
pub mod panic_guard;
pub mod progress;
pub mod transport;
pub mod workspace;

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, OnceLock, RwLock,
    },
    time::{Duration, Instant},
};

use dashmap::DashMap;
use serde::Deserialize;
use serde_json::Value;
use tower_lsp_server::{
    jsonrpc::Result as RpcResult,
    lsp_types::{self as lsp, *},
    Client, LanguageServer, LspService,
};

use crate::{
    completion::{
        pipeline::{Completion, CompletionSettings, Pipeline, Request, Trigger},
        postprocess::Edit,
    },
    document::{DocumentSnapshot, DocumentStore, PositionEncoding, TextChange},
    engine::{Cancel, Engine, ModelState},
};

/// The command attached to every item; clients call it when the user accepts (all of it,
/// a word or a line), so acceptance can be counted.
pub const ACCEPT_COMMAND: &str = "laya.accept";

/// How long the server waits for the client to answer its requests (`workspace/configuration`:
/// then it keeps the settings it has; `window/workDoneProgress/create`: then it reports no
/// progress).
const CONFIGURATION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The longest debounce wait, whatever `debounceMs` says.
const MAX_DEBOUNCE: Duration = Duration::from_secs(1);

/// Settings a client may send in `initializationOptions` or as the `laya` section of
/// `workspace/configuration`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct ClientSettings {
    pub completion: CompletionSettings,
}

/// Hears every model state change (loading, ready, failed).
pub type StateReport = Box<dyn Fn(&ModelState) + Send>;

/// Makes the engine, given where to report its state.
pub type EngineFactory = Box<dyn FnOnce(StateReport) -> Arc<dyn Engine> + Send>;

/// Where the server's engine comes from.
pub enum EngineSource {
    /// Already running (tests, or an engine shared by the caller).
    Ready(Arc<dyn Engine>),
    /// Built after `initialized`, so that loading never blocks `initialize`.
    Deferred(EngineFactory),
}

struct State {
    encoding: PositionEncoding,
    /// The client takes snippet-format completion items.
    snippets: bool,
    settings: ClientSettings,
    root: Option<String>,
    /// The declared workspace folders: only open documents inside them lend context, and
    /// the workspace index reads only files inside them.
    workspace: workspace::Workspace,
    /// The client registers file watchers dynamically.
    watch_files: bool,
    /// The client takes `$/progress` the server starts (`window.workDoneProgress`).
    progress: bool,
}

/// A request in flight for a document: how to stop it, and what may supersede it.
struct InFlight {
    cancel: Cancel,
    /// An automatic request (typing), which any newer request for the document supersedes.
    automatic: bool,
    /// The document's version it was made for: an invoked request is superseded only by a
    /// request made after the document changed.
    version: i32,
}

/// Takes a request out of the document's requests in flight when it ends, however it ends
/// (answered, cancelled, or its future dropped on `$/cancelRequest`).
struct Leave<'a> {
    inflight: &'a DashMap<String, Vec<InFlight>>,
    uri: &'a str,
    cancel: Cancel,
}

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.inflight.remove_if_mut(self.uri, |_, list| {
            list.retain(|r| !r.cancel.same(&self.cancel));
            list.is_empty()
        });
    }
}

/// How the requests of this server went, for `laya/requests`: what a keystroke costs the
/// model, and what was answered without it.
#[derive(Default)]
struct Counts {
    /// Completion requests (inline and fallback) for a document laya completes.
    requests: AtomicU64,
    /// Answered from the shown suggestion, with no model call.
    typed_through: AtomicU64,
    /// Answered from the answer computed ahead.
    ahead: AtomicU64,
    /// Cancelled while they waited (the debounce), before any model call.
    waited_out: AtomicU64,
    /// Model calls started for a request, and those of them cancelled before they answered.
    model_calls: AtomicU64,
    model_cancelled: AtomicU64,
    /// Answers computed ahead that were started.
    ahead_started: AtomicU64,
}

impl Counts {
    fn add(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    fn report(&self) -> Value {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        serde_json::json!({
            "requests": g(&self.requests),
            "typedThrough": g(&self.typed_through),
            "ahead": g(&self.ahead),
            "waitedOut": g(&self.waited_out),
            "modelCalls": g(&self.model_calls),
            "modelCancelled": g(&self.model_cancelled),
            "aheadStarted": g(&self.ahead_started),
        })
    }
}

/// What a request has around its document: the settings, the other documents that may lend
/// context, the workspace's root and index.
struct Around {
    settings: CompletionSettings,
    others: Vec<DocumentSnapshot>,
    root: Option<String>,
    index: Option<Arc<crate::workspace::WorkspaceIndex>>,
}

impl Around {
    fn request<'a>(&'a self, doc: &'a DocumentSnapshot, cursor: usize, trigger: Trigger) -> Request<'a> {
        Request {
            doc,
            others: &self.others,
            cursor,
            trigger,
            settings: &self.settings,
            workspace_root: self.root.as_deref(),
            workspace: self.index.as_deref(),
        }
    }
}

/// The end of a request's wait or model call, however it comes (answered, cancelled, or the
/// future dropped on `$/cancelRequest`): a wait that ends here was waited out; a model call
/// gives the document's pace its time, and is counted cancelled unless it answered.
struct Ending<'a> {
    server: &'a LayaServer,
    uri: &'a str,
    stage: Stage,
}

enum Stage {
    Waiting,
    /// A model call since then.
    Calling(Instant),
    /// Answered (a model call's time is still given to the pace).
    Answered(Option<Instant>),
}

impl Ending<'_> {
    /// The stage went well: the wait ended, or the model answered.
    fn passed(&mut self) {
        self.stage = match self.stage {
            Stage::Calling(t) => Stage::Answered(Some(t)),
            _ => Stage::Answered(None),
        };
    }
}

impl Drop for Ending<'_> {
    fn drop(&mut self) {
        let counts = &self.server.counts;
        let model_since = match self.stage {
            Stage::Waiting => {
                Counts::add(&counts.waited_out);
                None
            }
            Stage::Calling(t) => {
                Counts::add(&counts.model_cancelled);
                Some(t)
            }
            Stage::Answered(t) => t,
        };
        if let Some(t) = model_since {
            self.server
                .pace
                .entry(self.uri.to_owned())
                .or_default()
                .model_took(t.elapsed());
        }
    }
}

/// What the server did for a document's last answered request, besides the pipeline's
/// explanation: the document version it answered, its wait, whether it came from ahead.
#[derive(Clone, Copy)]
struct Note {
    version: i32,
    wait: Duration,
    ahead: bool,
}

pub struct LayaServer {
    client: Client,
    docs: DocumentStore,
    state: RwLock<State>,
    source: Mutex<Option<EngineSource>>,
    /// The pipeline, once its engine exists (requests before that wait for it).
    pipeline: tokio::sync::watch::Sender<Option<Arc<Pipeline>>>,
    /// The model's loading as the client sees it (a deferred engine's, once started).
    model: OnceLock<progress::ModelProgress>,
    /// The requests in flight per document.
    inflight: DashMap<String, Vec<InFlight>>,
    accepted: acceptance::Acceptance,
    indexing: Arc<indexing::Indexing>,
    /// Each document's typing pace and model times (the debounce).
    pace: DashMap<String, debounce::Pace>,
    /// The answers computed ahead of an accept.
    aheads: ahead::Aheads,
    counts: Counts,
    notes: DashMap<String, Note>,
}

impl LayaServer {
    pub fn new(client: Client, source: EngineSource) -> Self {
        let pipeline = match &source {
            EngineSource::Ready(engine) => Some(Arc::new(Pipeline::new(engine.clone()))),
            EngineSource::Deferred(_) => None,
        };
        LayaServer {
            client,
            docs: DocumentStore::new(),
            state: RwLock::new(State {
                encoding: PositionEncoding::Utf16,
                snippets: false,
                settings: ClientSettings::default(),
                root: None,
                workspace: workspace::Workspace::default(),
                watch_files: false,
                progress: false,
            }),
            source: Mutex::new(Some(source).filter(|_| pipeline.is_none())),
            pipeline: tokio::sync::watch::Sender::new(pipeline),
            model: OnceLock::new(),
            inflight: DashMap::new(),
            accepted: acceptance::Acceptance::default(),
            indexing: Arc::default(),
            pace: DashMap::new(),
            aheads: ahead::Aheads::default(),
            counts: Counts::default(),
            notes: DashMap::new(),
        }
    }

    fn encoding(&self) -> PositionEncoding {
        self.state.read().unwrap_or_else(|p| p.into_inner()).encoding
    }

    fn settings(&self) -> CompletionSettings {
        self.state
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .settings
            .completion
            .clone()
    }

    fn apply_settings(&self, value: Value) {
        match serde_json::from_value::<ClientSettings>(value) {
            Ok(s) => self.state.write().unwrap_or_else(|p| p.into_inner()).settings = s,
            Err(e) => {
                let client = self.client.clone();
                tokio::spawn(async move {
                    client
                        .log_message(
                            MessageType::WARNING,
                            format!("laya: ignoring invalid settings: {e}"),
                        )
                        .await;
                });
            }
        }
    }

    /// Make the deferred engine (it starts loading its model) and follow its state with
    /// `$/progress`. The engine is made at once: asking the client for the progress token
    /// goes on beside the load, and requests wait for the engine, never for the client.
    fn start_engine(&self) {
        let Some(EngineSource::Deferred(make)) = self.source.lock().unwrap_or_else(|p| p.into_inner()).take()
        else {
            return;
        };
        let supported = self.state.read().unwrap_or_else(|p| p.into_inner()).progress;
        let model = self
            .model
            .get_or_init(|| progress::ModelProgress::start(self.client.clone(), supported))
            .clone();
        model.state(&ModelState::Loading);
        let engine = make(Box::new(move |state: &ModelState| model.state(state)));
        self.pipeline.send_replace(Some(Arc::new(Pipeline::new(engine))));
    }

    /// The pipeline, if its engine exists yet.
    fn pipeline(&self) -> Option<Arc<Pipeline>> {
        self.pipeline.borrow().clone()
    }

    /// The pipeline once its engine exists (made after `initialized`).
    async fn engine_made(&self) -> Arc<Pipeline> {
        let mut made = self.pipeline.subscribe();
        let pipeline = match made.wait_for(Option::is_some).await {
            Ok(p) => p.clone(),
            // The sender lives as long as the server: never reached.
            Err(_) => None,
        };
        match pipeline {
            Some(p) => p,
            None => futures::future::pending().await,
        }
    }

    /// Say through `$/progress` that a request waits for the model.
    fn waiting_for_model(&self) {
        if let Some(m) = self.model.get() {
            m.waiting();
        }
    }

    /// Register a request for `uri` (at `version`), superseding the document's older requests
    /// that it may: automatic ones, and invoked ones made for an older version or superseded
    /// by a newer invoked one (the user asked again).
    fn enter(&self, uri: &str, version: i32, trigger: Trigger) -> Cancel {
        let cancel = Cancel::new();
        let mut list = self.inflight.entry(uri.to_owned()).or_default();
        list.retain(|older| {
            let superseded = older.automatic || older.version != version || trigger == Trigger::Invoked;
            if superseded {
                older.cancel.cancel();
            }
            !superseded
        });
        list.push(InFlight {
            cancel: cancel.clone(),
            automatic: trigger == Trigger::Automatic,
            version,
        });
        cancel
    }

    /// Snapshot + cursor offset for a request, or the error to answer with.
    fn locate(&self, uri: &Uri, pos: lsp::Position) -> RpcResult<(DocumentSnapshot, usize)> {
        let doc = self
            .docs
            .snapshot(uri.as_str())
            .map_err(|e| convert::invalid_params(e.to_string()))?;
        let offset = convert::offset(&doc, pos, self.encoding())?;
        Ok((doc, offset))
    }

    /// Run the pipeline for one request: cancel the document's older request; answer from the
    /// shown suggestion or the answer computed ahead where they apply; else wait (an automatic
    /// request) and complete. `Ok(None)` when there is nothing to show.
    async fn run(
        &self,
        uri: &Uri,
        pos: lsp::Position,
        trigger: Trigger,
    ) -> RpcResult<Option<(DocumentSnapshot, usize, Completion)>> {
        let (doc, cursor) = self.locate(uri, pos)?;
        let settings = self.settings();
        if !settings.languages.is_empty() && !settings.languages.contains(&doc.language_id) {
            return Ok(None);
        }
        Counts::add(&self.counts.requests);
        let cancel = self.enter(uri.as_str(), doc.version, trigger);
        let _leave = Leave {
            inflight: &self.inflight,
            uri: uri.as_str(),
            cancel: cancel.clone(),
        };
        // Before `initialized` has made the engine, the request waits for it.
        let pipeline = match self.pipeline() {
            Some(p) => p,
            None => {
                self.waiting_for_model();
                tokio::select! {
                    biased;
                    _ = cancel.cancelled() => return Err(convert::cancelled()),
                    p = self.engine_made() => p,
                }
            }
        };
        // Typing the shown suggestion: answer at once, no wait, no model.
        if let Some(c) = pipeline.typed_through(&doc, cursor, &settings) {
            tracing::info!(uri = uri.as_str(), "completion typed through");
            Counts::add(&self.counts.typed_through);
            self.note(&doc, Duration::ZERO, false);
            return Ok(Some((doc, cursor, c)));
        }
        let (root, others) = {
            let st = self.state.read().unwrap_or_else(|p| p.into_inner());
            let mut others = self.docs.snapshots_except(uri.as_str());
            others.retain(|o| st.workspace.may_lend(uri.as_str(), &o.uri));
            (st.root.clone(), others)
        };
        self.indexing.refresh(&self.docs);
        let around = Around {
            settings,
            others,
            root,
            index: self.indexing.index(),
        };
        let request = around.request(&doc, cursor, trigger);
        // The document and cursor an accept gave: the answer computed ahead, ready or on its
        // way, with no wait. One that failed or was cancelled leaves the request to ask.
        if let Some(task) = self.aheads.take(uri.as_str(), &doc.text, cursor) {
            let got = tokio::select! {
                biased;
                _ = cancel.cancelled() => return Err(convert::cancelled()),
                r = task => r,
            };
            if let Ok(Ok(computed)) = got {
                let c = pipeline.adopt(&request, computed);
                tracing::info!(
                    uri = uri.as_str(),
                    items = c.edits.len(),
                    "completion computed ahead"
                );
                Counts::add(&self.counts.ahead);
                self.note(&doc, Duration::ZERO, true);
                self.look_ahead(&pipeline, &doc, cursor, &c, around);
                return Ok(Some((doc, cursor, c)));
            }
        }
        // An invoked request starts at once; an automatic one waits (the user's fixed
        // `debounceMs`, at most MAX_DEBOUNCE, or the typist's pace). The wait ends early when a
        // newer request cancels this one.
        let wait = match (trigger, around.settings.debounce_ms) {
            (Trigger::Invoked, _) => Duration::ZERO,
            (Trigger::Automatic, Some(ms)) => Duration::from_millis(ms).min(MAX_DEBOUNCE),
            (Trigger::Automatic, None) => match self.pace.get(uri.as_str()) {
                Some(p) => p.wait(),
                None => debounce::wait(&[], Duration::ZERO),
            },
        };
        // Counted however it ends: `$/cancelRequest` drops this future mid-wait.
        let mut waiting = Ending {
            server: self,
            uri: uri.as_str(),
            stage: Stage::Waiting,
        };
        if !wait.is_zero() {
            tokio::select! {
                biased;
                _ = cancel.cancelled() => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
        if cancel.is_cancelled() {
            return Err(convert::cancelled());
        }
        waiting.passed();
        drop(waiting);
        // A model still loading answers once loaded: the request waits for it (the engines
        // queue it), bounded only by its cancellation, which ends the wait at once.
        if pipeline.engine().state() == ModelState::Loading {
            self.waiting_for_model();
        }
        Counts::add(&self.counts.model_calls);
        // The call's time goes to the document's pace however it ends, and a call that does
        // not answer is counted cancelled (dropped on `$/cancelRequest` too).
        let mut call = Ending {
            server: self,
            uri: uri.as_str(),
            stage: Stage::Calling(Instant::now()),
        };
        let result = tokio::select! {
            biased;
            _ = cancel.cancelled() => None,
            r = pipeline.complete(request, cancel.clone()) => Some(r),
        };
        let result = match result {
            Some(r) if !cancel.is_cancelled() => {
                call.passed();
                drop(call);
                r
            }
            _ => return Err(convert::cancelled()),
        };
        match result {
            Ok(c) => {
                tracing::info!(
                    uri = uri.as_str(),
                    items = c.edits.len(),
                    model = c.route.as_ref().map(|r| r.model.to_string()),
                    served_by = c.served_by.map(|k| k.to_string()),
                    reason = c.route.as_ref().map(|r| r.reason.as_str()),
                    anchored = c.anchored,
                    prompt_tokens = c.timing.prompt_tokens,
                    reused_tokens = c.timing.reused_tokens,
                    wait_ms = wait.as_millis() as u64,
                    total_ms = c.timing.total.as_millis() as u64,
                    "completion"
                );
                self.note(&doc, wait, false);
                self.look_ahead(&pipeline, &doc, cursor, &c, around);
                Ok(Some((doc, cursor, c)))
            }
            Err(e) => {
                self.client
                    .log_message(MessageType::WARNING, format!("laya: completion failed: {e}"))
                    .await;
                Ok(None)
            }
        }
    }

    fn note(&self, doc: &DocumentSnapshot, wait: Duration, ahead: bool) {
        self.notes.insert(
            doc.uri.clone(),
            Note {
                version: doc.version,
                wait,
                ahead,
            },
        );
    }

    /// Start the answer at the cursor that accepting `c`'s first suggestion gives (see
    /// [`ahead`]), with what this request had around it.
    fn look_ahead(
        &self,
        pipeline: &Arc<Pipeline>,
        doc: &DocumentSnapshot,
        cursor: usize,
        c: &Completion,
        around: Around,
    ) {
        let Some(edit) = c.edits.first().filter(|_| around.settings.look_ahead) else {
            return;
        };
        let Some(after) = doc.with_edit(cursor, cursor + edit.replace_len, &edit.text) else {
            return;
        };
        let next = cursor + edit.text.len();
        let pipeline = pipeline.clone();
        Counts::add(&self.counts.ahead_started);
        let shown = ahead::Shown {
            text: doc.text.clone(),
            cursor,
            insert: edit.text.clone(),
            replace_len: edit.replace_len,
        };
        self.aheads.start(&doc.uri, shown, move |cancel| async move {
            let request = around.request(&after, next, Trigger::Automatic);
            pipeline.compute(&request, cancel).await
        });
    }

    /// Watch the items of an answer for acceptance; their ids.
    fn show(&self, doc: &DocumentSnapshot, cursor: usize, edits: &[Edit]) -> Vec<u64> {
        let items: Vec<(String, usize)> = edits.iter().map(|e| (e.text.clone(), e.replace_len)).collect();
        self.accepted.show(&doc.uri, &doc.text, cursor, items)
    }

    fn accept_command(&self, id: u64) -> Command {
        Command {
            title: "laya: accepted".into(),
            command: ACCEPT_COMMAND.into(),
            arguments: Some(vec![serde_json::json!({ "id": id, "kind": "full" })]),
        }
    }

    pub async fn inline_completion(
        &self,
        params: InlineCompletionParams,
    ) -> RpcResult<Option<InlineCompletionResponse>> {
        let tdp = params.text_document_position;
        let trigger = if params.context.trigger_kind == InlineCompletionTriggerKind::Invoked {
            Trigger::Invoked
        } else {
            Trigger::Automatic
        };
        let Some((doc, cursor, c)) = self.run(&tdp.text_document.uri, tdp.position, trigger).await? else {
            return Ok(None);
        };
        let enc = self.encoding();
        let mut items = vec![];
        let ids = self.show(&doc, cursor, &c.edits);
        for (edit, id) in c.edits.into_iter().zip(ids) {
            items.push(InlineCompletionItem {
                insert_text: edit.text,
                filter_text: None,
                range: Some(convert::range(&doc, cursor, cursor + edit.replace_len, enc)?),
                command: Some(self.accept_command(id)),
                insert_text_format: Some(InsertTextFormat::PLAIN_TEXT),
            });
        }
        Ok(Some(InlineCompletionResponse::Array(items)))
    }

    /// `laya/acceptance`: counts of items shown and accepted (full, word, line).
    /// `laya/explain` `{textDocument: {uri}}`: what the last request of that document did
    /// (model and why, reuse, timing), as `{markdown, ...fields}`; `null` before any request.
    pub async fn explain(&self, params: Value) -> RpcResult<Value> {
        let uri = params
            .pointer("/textDocument/uri")
            .and_then(Value::as_str)
            .ok_or_else(|| convert::invalid_params("laya/explain needs {textDocument: {uri}}"))?;
        let Some(pipeline) = self.pipeline() else {
            return Ok(Value::Null);
        };
        let note = self.notes.get(uri).map(|n| *n);
        Ok(match pipeline.explain(uri) {
            Some(e) => {
                let mut v = serde_json::to_value(&e).unwrap_or(Value::Null);
                if let Value::Object(m) = &mut v {
                    let mut markdown = e.markdown();
                    if let Some(n) = note {
                        m.insert("version".into(), n.version.into());
                        m.insert("waitMs".into(), (n.wait.as_secs_f64() * 1e3).into());
                        m.insert("ahead".into(), n.ahead.into());
                        if n.ahead {
                            markdown.push_str("\n\ncomputed ahead, while the suggestion before it was shown");
                        } else if !n.wait.is_zero() {
                            markdown.push_str(&format!("\n\nwaited {} ms before asking", n.wait.as_millis()));
                        }
                    }
                    m.insert("markdown".into(), Value::String(markdown));
                }
                v
            }
            None => Value::Null,
        })
    }

    /// The open document `uri` as this server holds it (text, version), or `None`: what a
    /// test compares with the editor's copy after edits.
    pub fn document(&self, uri: &str) -> Option<DocumentSnapshot> {
        self.docs.snapshot(uri).ok()
    }

    /// `laya/requests`: how this server's completion requests went: `requests`, answered by
    /// `typedThrough` or from `ahead` with no wait, `waitedOut` (cancelled in the debounce),
    /// `modelCalls` started and `modelCancelled` of them, `aheadStarted` (answers computed
    /// ahead of an accept).
    pub async fn requests(&self, _: Value) -> RpcResult<Value> {
        Ok(self.counts.report())
    }

    /// `laya/acceptance`: items shown, accepted (full, word, line), and how many acceptances
    /// were seen through the item's command (`byCommand`) and through the document's change
    /// (`byEdit`).
    pub async fn acceptance(&self, _: Value) -> RpcResult<Value> {
        Ok(serde_json::to_value(self.accepted.report()).unwrap_or(Value::Null))
    }
}

impl LanguageServer for LayaServer {
    async fn initialize(&self, params: InitializeParams) -> RpcResult<InitializeResult> {
        let offered = params
            .capabilities
            .general
            .as_ref()
            .and_then(|g| g.position_encodings.as_deref());
        let encoding = convert::negotiate_encoding(offered);
        {
            let mut st = self.state.write().unwrap_or_else(|p| p.into_inner());
            st.encoding = encoding;
            st.snippets = params
                .capabilities
                .text_document
                .as_ref()
                .and_then(|t| t.completion.as_ref())
                .and_then(|c| c.completion_item.as_ref())
                .and_then(|i| i.snippet_support)
                .unwrap_or(false);
            st.root = params
                .workspace_folders
                .as_ref()
                .and_then(|f| f.first())
                .map(|f| f.uri.as_str().to_owned());
            let folders: Vec<&str> = params
                .workspace_folders
                .iter()
                .flatten()
                .map(|f| f.uri.as_str())
                .collect();
            #[allow(deprecated)]
            let (root_uri, root_path) = (
                params.root_uri.as_ref().map(|u| u.as_str()),
                params.root_path.as_deref(),
            );
            st.workspace = workspace::Workspace::from_initialize(&folders, root_uri, root_path);
            st.progress = params
                .capabilities
                .window
                .as_ref()
                .and_then(|w| w.work_done_progress)
                .unwrap_or(false);
            st.watch_files = params
                .capabilities
                .workspace
                .as_ref()
                .and_then(|w| w.did_change_watched_files.as_ref())
                .and_then(|d| d.dynamic_registration)
                .unwrap_or(false);
        }
        if let Some(opts) = params.initialization_options {
            self.apply_settings(opts);
        }
        Ok(InitializeResult {
            capabilities: ServerCapabilities {
                position_encoding: Some(convert::encoding_kind(encoding)),
                text_document_sync: Some(TextDocumentSyncCapability::Options(TextDocumentSyncOptions {
                    open_close: Some(true),
                    change: Some(TextDocumentSyncKind::INCREMENTAL),
                    save: Some(TextDocumentSyncSaveOptions::SaveOptions(SaveOptions {
                        include_text: Some(false),
                    })),
                    ..Default::default()
                })),
                inline_completion_provider: Some(OneOf::Left(true)),
                completion_provider: Some(CompletionOptions {
                    resolve_provider: Some(false),
                    ..Default::default()
                }),
                execute_command_provider: Some(ExecuteCommandOptions {
                    commands: vec![ACCEPT_COMMAND.into()],
                    ..Default::default()
                }),
                workspace: Some(WorkspaceServerCapabilities {
                    workspace_folders: Some(WorkspaceFoldersServerCapabilities {
                        supported: Some(true),
                        change_notifications: Some(OneOf::Left(true)),
                    }),
                    file_operations: None,
                }),
                ..Default::default()
            },
            server_info: Some(ServerInfo {
                name: "laya".into(),
                version: Some(env!("CARGO_PKG_VERSION").into()),
            }),
            offset_encoding: None,
        })
    }

    async fn initialized(&self, _: InitializedParams) {
        let (roots, watch, wanted, progress) = {
            let st = self.state.read().unwrap_or_else(|p| p.into_inner());
            (
                st.workspace.file_roots(),
                st.watch_files,
                st.settings.completion.workspace_context,
                st.progress,
            )
        };
        self.start_engine();
        if wanted {
            self.indexing.start(self.client.clone(), roots, progress);
        }
        if wanted && watch {
            indexing::Indexing::watch(&self.client).await;
        }
    }

    async fn did_save(&self, p: DidSaveTextDocumentParams) {
        self.indexing
            .saved(p.text_document.uri.as_str(), p.text.as_deref());
    }

    async fn did_change_watched_files(&self, p: DidChangeWatchedFilesParams) {
        self.indexing.files_changed(&self.docs, &p.changes);
    }

    async fn shutdown(&self) -> RpcResult<()> {
        for list in self.inflight.iter() {
            for r in list.iter() {
                r.cancel.cancel();
            }
        }
        self.aheads.cancel_all();
        Ok(())
    }

    async fn did_open(&self, p: DidOpenTextDocumentParams) {
        let d = p.text_document;
        self.docs.open(d.uri.as_str(), &d.text, d.version, &d.language_id);
    }

    async fn did_change(&self, p: DidChangeTextDocumentParams) {
        let changes: Vec<TextChange> = p
            .content_changes
            .iter()
            .map(|c| TextChange {
                range: c
                    .range
                    .map(|r| (convert::position(r.start), convert::position(r.end))),
                text: &c.text,
            })
            .collect();
        let uri = p.text_document.uri.as_str();
        self.indexing.changed(uri);
        self.pace
            .entry(uri.to_owned())
            .or_default()
            .changed(Instant::now());
        // The text before the change, when an answer was made for it (never built here).
        let before = self.docs.text_if_built(uri);
        if let Err(e) = self
            .docs
            .change(uri, p.text_document.version, &changes, self.encoding())
        {
            // The document may now differ from the editor's: say so, keep serving.
            self.client
                .log_message(MessageType::ERROR, format!("laya: edit not applied: {e}"))
                .await;
            return;
        }
        let watched = before.filter(|b| self.accepted.watches(uri, b));
        if watched.is_none() && self.aheads.is_empty() {
            return;
        }
        let Ok(after) = self.docs.snapshot(uri) else {
            return;
        };
        // An answer ahead lives on while the document is on its way to it.
        self.aheads.changed(uri, &after.text);
        // A client that accepts an item without running its command changes the document to
        // hold the suggestion: count that.
        if let Some(before) = watched {
            if let Some(kind) = self.accepted.changed(uri, &before, &after.text) {
                tracing::info!(uri, ?kind, "suggestion accepted (seen in the document)");
            }
        }
    }

    async fn did_change_workspace_folders(&self, p: DidChangeWorkspaceFoldersParams) {
        let (roots, wanted, progress) = {
            let mut st = self.state.write().unwrap_or_else(|p| p.into_inner());
            let before = st.workspace.file_roots();
            for f in &p.event.removed {
                st.workspace.remove(f.uri.as_str());
            }
            for f in &p.event.added {
                st.workspace.add(f.uri.as_str());
            }
            let roots = st.workspace.file_roots();
            (
                (roots != before).then_some(roots),
                st.settings.completion.workspace_context,
                st.progress,
            )
        };
        if let (Some(roots), true) = (roots, wanted) {
            self.indexing.start(self.client.clone(), roots, progress);
        }
    }

    async fn did_close(&self, p: DidCloseTextDocumentParams) {
        let uri = p.text_document.uri.as_str().to_owned();
        if let Some((_, list)) = self.inflight.remove(&uri) {
            for r in list {
                r.cancel.cancel();
            }
        }
        let _ = self.docs.close(&uri);
        self.indexing.saved(&uri, None);
        self.accepted.forget(&uri);
        self.aheads.forget(&uri);
        self.pace.remove(&uri);
        self.notes.remove(&uri);
        if let Some(p) = self.pipeline() {
            p.forget(&uri);
        }
    }

    async fn did_change_configuration(&self, p: DidChangeConfigurationParams) {
        let value = match p.settings.get("laya") {
            Some(v) => v.clone(),
            // Bounded: a client that never answers (or whose input closed while the
            // request was out) must not keep this handler, and so the server, alive.
            None => match tokio::time::timeout(
                CONFIGURATION_TIMEOUT,
                self.client.configuration(vec![ConfigurationItem {
                    scope_uri: None,
                    section: Some("laya".into()),
                }]),
            )
            .await
            {
                Ok(Ok(mut v)) if !v.is_empty() => v.remove(0),
                _ => return,
            },
        };
        if !value.is_null() {
            self.apply_settings(value);
        }
    }

    async fn completion(&self, params: CompletionParams) -> RpcResult<Option<CompletionResponse>> {
        let tdp = params.text_document_position;
        let trigger = match params.context.map(|c| c.trigger_kind) {
            Some(CompletionTriggerKind::INVOKED) => Trigger::Invoked,
            _ => Trigger::Automatic,
        };
        let Some((doc, cursor, c)) = self.run(&tdp.text_document.uri, tdp.position, trigger).await? else {
            return Ok(None);
        };
        let enc = self.encoding();
        let snippets = self.state.read().unwrap_or_else(|p| p.into_inner()).snippets;
        let mut items = vec![];
        let ids = self.show(&doc, cursor, &c.edits);
        for ((rank, edit), id) in c.edits.into_iter().enumerate().zip(ids) {
            let first = edit
                .text
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("")
                .trim();
            let label: String = first.chars().take(60).collect();
            items.push(CompletionItem {
                label,
                kind: Some(CompletionItemKind::TEXT),
                detail: Some("laya".into()),
                documentation: Some(Documentation::MarkupContent(MarkupContent {
                    kind: MarkupKind::Markdown,
                    value: format!("```\n{}\n```", edit.text),
                })),
                sort_text: Some(format!("{rank:04}")),
                preselect: Some(rank == 0),
                // Neovim 0.11's popup inserts a plain-text item only up to its first
                // whitespace, even with a textEdit; a snippet (escaped, no tab stops) goes in
                // whole. Clients without snippets get plain text.
                text_edit: Some(CompletionTextEdit::Edit(TextEdit {
                    range: convert::range(&doc, cursor, cursor + edit.replace_len, enc)?,
                    new_text: if snippets {
                        convert::snippet_escape(&edit.text)
                    } else {
                        edit.text
                    },
                })),
                insert_text_format: Some(if snippets {
                    InsertTextFormat::SNIPPET
                } else {
                    InsertTextFormat::PLAIN_TEXT
                }),
                command: Some(self.accept_command(id)),
                ..Default::default()
            });
        }
        Ok(Some(CompletionResponse::List(CompletionList {
            is_incomplete: true,
            items,
        })))
    }

    async fn execute_command(&self, p: ExecuteCommandParams) -> RpcResult<Option<Value>> {
        if p.command != ACCEPT_COMMAND {
            return Err(convert::invalid_params(format!("unknown command {}", p.command)));
        }
        let arg = p.arguments.first();
        let kind = acceptance::Kind::parse(arg.and_then(|a| a.get("kind")).and_then(Value::as_str));
        self.accepted
            .command(arg.and_then(|a| a.get("id")).and_then(Value::as_u64), kind);
        Ok(None)
    }
}

/// Build the service with laya's custom methods.
pub fn build_service(source: EngineSource) -> (LspService<LayaServer>, tower_lsp_server::ClientSocket) {
    LspService::build(move |client| LayaServer::new(client, source))
        .custom_method("textDocument/inlineCompletion", LayaServer::inline_completion)
        .custom_method("laya/acceptance", LayaServer::acceptance)
        .custom_method("laya/requests", LayaServer::requests)
        .custom_method("laya/explain", LayaServer::explain)
        .finish()
}

/// Serve LSP on stdin/stdout until the client sends `exit` or closes stdin; see
/// [`transport`]. The ending's [`transport::Ending::exit_code`] is the process's status.
pub async fn serve_stdio(source: EngineSource) -> transport::Ending {
    transport::serve_lsp(source, tokio::io::stdin(), tokio::io::stdout()).await
}
