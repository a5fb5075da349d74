//! One completion request from a document snapshot to edits, in two steps. *Plan*: context →
//! route → the routed model's budget → prompt; *finish*: rank → post-process → remember. The
//! engine call sits between them. Knows no LSP types; sees the engine only through the
//! `Engine` trait.
//!
//! Keystrokes are cheap in two ways. *Typing through*: while the user types the first
//! characters of the suggestion last shown, the rest of it is the answer, with no model call
//! (a partial accept looks the same). *Anchored prompts*: after a model call, the document
//! text, cursor, budget and prompt are kept as the document's anchor; while the only change
//! since is text inserted at the anchor's cursor (the user typing on) and the route gives the
//! same budget, the next prompt is the anchor's prompt followed by that text, as the start of
//! the middle. So the prompt grows only at its end, the engine's prefix store finds all of it
//! but the new characters (including the tokens it generated, when the user typed what it
//! suggested), and a keystroke costs a few tokens of prefill.
//!
//! Several candidates (`candidates` > 1) are the model's greedy continuations of its most
//! likely first tokens, made in one batch after one prefill: deterministic alternatives to
//! cycle through, the greedy answer first (docs/decisions.md).

use std::sync::{Arc, Mutex};

use dashmap::DashMap;

use super::{
    lead::{self, ContextLayout},
    postprocess::{self, Edit, Surroundings},
    router::{self, KnownSpeed, Latencies, Route, RouteInput, RouterPolicy},
};
use crate::{
    document::DocumentSnapshot,
    engine::{
        Cancel, Choice, CompletionOutput, CompletionRequest, Engine, EngineError, LineEnd, ModelKey, Timing,
    },
    prompt::{self, Budget, Family, LocalPart, PromptInput, Snippet},
    syntax::CursorKind,
    workspace::{file_path, retrieve, WorkspaceIndex},
};

/// Settings of the completion pipeline (from `initializationOptions` / `workspace/configuration`).
#[derive(Clone, Debug, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct CompletionSettings {
    /// Wait this long after an automatic request before starting it (at most 1 s); a newer
    /// request cancels it. Unset (the default): the wait follows the typist's pace
    /// (`lsp::debounce`). An invoked request never waits.
    pub debounce_ms: Option<u64>,
    pub budget: Budget,
    /// Most tokens for a completion of the rest of a line / of a block.
    pub max_tokens_line: usize,
    pub max_tokens_block: usize,
    /// Most lines of a block answer: the engine stops decoding there, as at the block's end
    /// (docs/decisions.md, "How long a block answer is").
    pub max_lines_block: usize,
    /// Suggestions per request: 1 is the greedy answer; more are the greedy continuations of
    /// the model's next most likely first tokens, after the greedy one (engines that cannot
    /// branch, such as remote servers, answer once).
    pub candidates: usize,
    /// Languages (LSP ids) to complete in; empty means all.
    pub languages: Vec<String>,
    /// Which model answers which request.
    pub router: RouterPolicy,
    /// Answer keystrokes that type the shown suggestion from it, without the model.
    pub typing_through: bool,
    /// Continue the document's last prompt while the user types at its cursor (bytes typed
    /// at most; 0 turns it off and builds every prompt afresh).
    pub anchor_max_bytes: usize,
    /// While a suggestion is shown, compute the answer its accept will ask for (one more
    /// model call per suggestion shown, cancelled as soon as the user types anything else but
    /// the suggestion), so the next suggestion shows with no wait (`lsp::ahead`). Off for an
    /// engine that charges by the request.
    pub look_ahead: bool,
    /// How this file's definitions cut off by the budget are written above the window.
    pub context_layout: ContextLayout,
    /// Show definitions from the workspace's files that are not open (the workspace index),
    /// within the budget's context share. Off by default: on 204 held-out cross-file cases it
    /// gained no exact line on the 0.5B or the 1.5B (docs/decisions.md).
    pub workspace_context: bool,
}

impl Default for CompletionSettings {
    fn default() -> Self {
        CompletionSettings {
            debounce_ms: None,
            budget: Budget::default(),
            max_tokens_line: 48,
            max_tokens_block: 128,
            max_lines_block: 8,
            candidates: 1,
            languages: vec![],
            router: RouterPolicy::default(),
            typing_through: true,
            anchor_max_bytes: 512,
            look_ahead: true,
            context_layout: ContextLayout::default(),
            workspace_context: false,
        }
    }
}

/// How the request was triggered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Trigger {
    /// The user asked (a key binding).
    Invoked,
    /// While typing.
    Automatic,
}

/// Where a completion's edits came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// A model call.
    Model,
    /// The rest of the suggestion being typed; no model call.
    TypedThrough,
}

#[derive(Debug)]
pub struct Completion {
    /// Distinct, non-empty edits, best first.
    pub edits: Vec<Edit>,
    /// Where each edit came from, one per edit (empty when not from a model call).
    pub origins: Vec<Origin>,
    pub timing: Timing,
    pub cursor_kind: CursorKind,
    pub source: Source,
    /// The router's choice (model calls only).
    pub route: Option<Route>,
    /// The model that answered, where the engine says.
    pub served_by: Option<ModelKey>,
    /// The prompt continued the document's anchor.
    pub anchored: bool,
    /// The workspace files the prompt drew on (those of the anchor's prompt when it
    /// continued it).
    pub context_files: Vec<ContextFile>,
}

/// The engine's answer an edit was made from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Origin {
    /// Its index among the engine's choices (0 is greedy; with several candidates `i` began
    /// with the `i`-th most likely first token).
    pub choice: usize,
    pub tokens: usize,
    /// The summed log-probability of its tokens, where the engine reports one.
    pub logprob: Option<f32>,
}

/// What the last request of a document did, for `laya/explain`.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    pub source: Source,
    pub trigger: Trigger,
    pub cursor_kind: CursorKind,
    pub route: Option<Route>,
    /// `small/q8`: the model that answered.
    #[serde(serialize_with = "as_text")]
    pub served_by: Option<ModelKey>,
    pub anchored: bool,
    pub prompt_tokens: usize,
    pub reused_tokens: usize,
    pub prefilled_tokens: usize,
    pub generated_tokens: usize,
    /// Forwards that gave the generated tokens (fewer than them when drafts were accepted).
    pub forwards: usize,
    pub first_token_ms: f64,
    pub total_ms: f64,
    pub suggestion: Option<String>,
    /// The workspace files the prompt drew on, with the names that brought each in.
    pub context_files: Vec<ContextFile>,
}

fn as_text<S: serde::Serializer>(key: &Option<ModelKey>, s: S) -> Result<S::Ok, S::Error> {
    match key {
        Some(k) => s.collect_str(k),
        None => s.serialize_none(),
    }
}

impl Explanation {
    fn of(c: &Completion, trigger: Trigger) -> Self {
        let t = &c.timing;
        Explanation {
            source: c.source,
            trigger,
            cursor_kind: c.cursor_kind,
            route: c.route.clone(),
            served_by: c.served_by,
            anchored: c.anchored,
            prompt_tokens: t.prompt_tokens,
            reused_tokens: t.reused_tokens,
            prefilled_tokens: t.prefilled_tokens,
            generated_tokens: t.generated_tokens,
            forwards: t.forwards(),
            first_token_ms: t.first_token.as_secs_f64() * 1e3,
            total_ms: t.total.as_secs_f64() * 1e3,
            suggestion: c.edits.first().map(|e| e.text.clone()),
            context_files: c.context_files.clone(),
        }
    }

    /// A few lines of Markdown for people.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        match self.source {
            Source::TypedThrough => {
                s.push_str("**typed through**: the rest of the shown suggestion, no model call\n\n")
            }
            Source::Model => {
                if let Some(r) = &self.route {
                    s.push_str(&format!("**model** {} — {}\n\n", r.model, r.reason));
                }
                if let Some(b) = self.served_by {
                    if self.route.as_ref().map(|r| r.model) != Some(b) {
                        s.push_str(&format!(
                            "answered by **{b}** (the chosen model was still loading)\n\n"
                        ));
                    }
                }
                s.push_str(&format!(
                    "prompt {} tokens ({} reused, {} prefilled{}), {} generated in {} forwards; first token {:.0} ms, total {:.0} ms\n\n",
                    self.prompt_tokens,
                    self.reused_tokens,
                    self.prefilled_tokens,
                    if self.anchored { ", continuing the last prompt" } else { "" },
                    self.generated_tokens,
                    self.forwards,
                    self.first_token_ms,
                    self.total_ms
                ));
            }
        }
        let trigger = match self.trigger {
            Trigger::Invoked => "invoked",
            Trigger::Automatic => "automatic",
        };
        s.push_str(&format!(
            "trigger {trigger}, cursor in {}",
            self.cursor_kind.name()
        ));
        if !self.context_files.is_empty() {
            let files: Vec<String> = self
                .context_files
                .iter()
                .map(|f| match f.symbols.is_empty() {
                    true => format!("`{}`", f.path),
                    false => format!("`{}` ({})", f.path, f.symbols.join(", ")),
                })
                .collect();
            s.push_str(&format!("\n\nworkspace context: {}", files.join(", ")));
        }
        if let Some(text) = &self.suggestion {
            s.push_str(&format!("\n\n```\n{text}\n```"));
        }
        s
    }
}

/// A document's text and cursor at some moment.
#[derive(Clone)]
struct Mark {
    text: Arc<str>,
    cursor: usize,
}

impl Mark {
    fn of(doc: &DocumentSnapshot, cursor: usize) -> Mark {
        Mark {
            text: doc.text.clone(),
            cursor,
        }
    }

    /// The text inserted at this mark's cursor to give `text` with the cursor at `cursor`
    /// just after it; `None` for any other change.
    fn typed_since<'t>(&self, text: &'t str, cursor: usize) -> Option<&'t str> {
        let old = &*self.text;
        let n = text.len().checked_sub(old.len())?;
        if cursor != self.cursor + n
            || !text.is_char_boundary(self.cursor)
            || !text.is_char_boundary(cursor)
            || text[..self.cursor] != old[..self.cursor]
            || text[cursor..] != old[self.cursor..]
        {
            return None;
        }
        Some(&text[self.cursor..cursor])
    }
}

/// Where the last fresh prompt was built, and what it was.
struct Anchor {
    mark: Mark,
    prompt: String,
    /// The budget it was built in (that of the model it was routed to).
    budget: Budget,
    /// The format it was written in (that model's family's).
    family: Family,
    /// The workspace files its prompt drew on.
    drawn_on: Vec<ContextFile>,
}

/// An anchor's prompt continued by the text typed at its cursor since: the anchor's budget
/// and format, that prompt, the bytes typed, the workspace files it drew on.
type Continued = ((Budget, Family), String, usize, Vec<ContextFile>);

/// The suggestion last shown, and where.
struct Shown {
    mark: Mark,
    edit: Edit,
}

/// Per-document memory between requests.
#[derive(Default)]
struct DocState {
    anchor: Option<Anchor>,
    shown: Option<Shown>,
    explanation: Option<Explanation>,
}

/// The engine's choices best first. When every choice has a log-probability (branched first
/// tokens, where choice 0 is greedy): the first stays first and the others follow by summed
/// log-probability (docs/decisions.md, "Greedy first"). Each comes with its index in the
/// engine's order.
fn ranked(choices: &[Choice]) -> Vec<(usize, &Choice)> {
    let mut out: Vec<(usize, &Choice)> = choices.iter().enumerate().collect();
    if out.len() > 1 && out.iter().all(|(_, c)| c.logprob.is_some()) {
        let lp = |c: &Choice| c.logprob.unwrap_or(f32::NEG_INFINITY);
        out[1..].sort_by(|(_, a), (_, b)| lp(b).total_cmp(&lp(a)));
    }
    out
}

/// Path shown to the model: the document's path relative to the workspace root when inside
/// it, else its file name. `file://` URIs are paths by [`file_path`] (percent-decoded);
/// anything else (`untitled:Untitled-1`, a plain name) shows its last `/`-segment.
fn display_path(uri: &str, root: Option<&str>) -> String {
    let Some(path) = file_path(uri) else {
        return uri.rsplit('/').next().unwrap_or(uri).to_owned();
    };
    root.and_then(file_path)
        .and_then(|root| path.strip_prefix(root).ok().map(|p| p.to_owned()))
        .filter(|p| !p.as_os_str().is_empty())
        .or_else(|| path.file_name().map(std::path::PathBuf::from))
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The repository's name shown to the model: the workspace root's folder name.
fn repo_name(root: Option<&str>) -> String {
    let Some(root) = root else {
        return "workspace".into();
    };
    match file_path(root) {
        Some(path) => path
            .file_name()
            .map_or_else(|| "workspace".into(), |n| n.to_string_lossy().into_owned()),
        None => root
            .trim_end_matches('/')
            .rsplit('/')
            .next()
            .unwrap_or(root)
            .to_owned(),
    }
}

/// The request's cursor must be a character boundary of its document.
fn check_cursor(r: &Request) -> Result<(), EngineError> {
    let text: &str = &r.doc.text;
    if r.cursor > text.len() || !text.is_char_boundary(r.cursor) {
        return Err(EngineError::BadRequest(format!(
            "cursor byte {} is not inside the document",
            r.cursor
        )));
    }
    Ok(())
}

/// What one completion request needs besides the engine.
pub struct Request<'a> {
    pub doc: &'a DocumentSnapshot,
    /// The other open documents.
    pub others: &'a [DocumentSnapshot],
    /// Byte offset of the cursor in `doc`.
    pub cursor: usize,
    pub trigger: Trigger,
    pub settings: &'a CompletionSettings,
    pub workspace_root: Option<&'a str>,
    /// The definitions of the workspace's files, where an index is built.
    pub workspace: Option<&'a WorkspaceIndex>,
}

/// What the syntax layer lends the prompt at the cursor.
struct Context {
    cursor_kind: CursorKind,
    imports: Vec<String>,
    local: Vec<LocalPart>,
    /// Definitions from other open files, grouped by file, then from the workspace index.
    other_files: Vec<Snippet>,
    /// The files the workspace index lent and the names that brought each in.
    drawn_on: Vec<ContextFile>,
    /// The document was parsed: the workspace index may be asked (`add_workspace`).
    parsed: bool,
}

impl Context {
    fn gather(r: &Request) -> Context {
        let text: &str = &r.doc.text;
        let Some(c) = r.doc.context(r.cursor, r.others) else {
            return Context {
                cursor_kind: CursorKind::Code,
                imports: vec![],
                local: vec![],
                other_files: vec![],
                drawn_on: vec![],
                parsed: false,
            };
        };
        let language = r.doc.language.map(|l| l.config());
        let local = lead::local_parts(&c, text, language, r.settings.context_layout);
        let mut other_files: Vec<Snippet> = vec![];
        for t in c.type_definitions.iter().filter(|t| t.source_path.is_some()) {
            let path = display_path(t.source_path.as_deref().unwrap_or_default(), r.workspace_root);
            match other_files.iter_mut().find(|s| s.path == path) {
                Some(s) => {
                    s.text.push('\n');
                    s.text.push_str(&t.text);
                }
                None => other_files.push(Snippet {
                    path,
                    text: t.text.clone(),
                }),
            }
        }
        Context {
            cursor_kind: c.cursor_kind,
            imports: c.imports.clone(),
            local,
            other_files,
            drawn_on: vec![],
            parsed: true,
        }
    }

    /// Add what the workspace index lends at the cursor (for a prompt built afresh only: a
    /// continued one keeps its anchor's).
    fn add_workspace(&mut self, r: &Request) {
        let text: &str = &r.doc.text;
        let index = r
            .workspace
            .filter(|_| r.settings.workspace_context && self.parsed);
        if let (Some(index), Some(path), Some(language)) = (index, file_path(&r.doc.uri), r.doc.language) {
            let budget = &r.settings.budget;
            let max = (budget.max_tokens * prompt::BYTES_PER_TOKEN) as f32 * budget.context_share;
            let used: usize = self.other_files.iter().map(|s| s.text.len()).sum();
            let found = retrieve(
                index,
                &path,
                language,
                text,
                r.cursor,
                &self.imports,
                (max as usize).saturating_sub(used),
            );
            for (s, (_, names)) in found.snippets.into_iter().zip(found.symbols) {
                if self.other_files.iter().any(|o| o.path == s.path) {
                    continue;
                }
                self.drawn_on.push(ContextFile {
                    path: s.path.clone(),
                    symbols: names,
                });
                self.other_files.push(s);
            }
        }
    }
}

/// A file of the workspace that a prompt drew on, and the names that brought it in (none for
/// a file shown as an outline of what the current file imports).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ContextFile {
    pub path: String,
    pub symbols: Vec<String>,
}

/// Whose request a plan is for.
enum Caller {
    /// An editor's: the document's anchor may be continued, the router chooses.
    Editor,
    /// One outside an editor's session ([`Pipeline::plan_once`]): no anchor continued, the
    /// model given where one is.
    Once(Option<ModelKey>),
}

/// A model call, decided: the route, the request and what the finish needs.
pub struct Plan {
    /// What goes to the engine.
    pub request: CompletionRequest,
    route: Route,
    cursor_kind: CursorKind,
    anchored: bool,
    drawn_on: Vec<ContextFile>,
    /// The document's new anchor, for a prompt built afresh; [`Pipeline::finish`] stores it,
    /// so a request that never finishes (cancelled, failed) leaves the old one.
    anchor: Option<Anchor>,
}

/// A model's answer not yet finished ([`Pipeline::compute`], [`Pipeline::adopt`]).
pub struct Computed {
    plan: Plan,
    out: CompletionOutput,
}

pub struct Pipeline {
    engine: Arc<dyn Engine>,
    docs: DashMap<String, DocState>,
    latencies: Mutex<Latencies>,
}

impl Pipeline {
    pub fn new(engine: Arc<dyn Engine>) -> Self {
        Pipeline {
            engine,
            docs: DashMap::new(),
            latencies: Mutex::new(Latencies::default()),
        }
    }

    pub fn engine(&self) -> &Arc<dyn Engine> {
        &self.engine
    }

    /// What the last request for `uri` did.
    pub fn explain(&self, uri: &str) -> Option<Explanation> {
        self.docs.get(uri).and_then(|d| d.explanation.clone())
    }

    /// Forget a document (closed).
    pub fn forget(&self, uri: &str) {
        self.docs.remove(uri);
    }

    /// The rest of the suggestion last shown in this document, when the only change since is
    /// the user typing its first characters. No model call.
    pub fn typed_through(
        &self,
        doc: &DocumentSnapshot,
        cursor: usize,
        settings: &CompletionSettings,
    ) -> Option<Completion> {
        if !settings.typing_through {
            return None;
        }
        let mut state = self.docs.get_mut(&doc.uri)?;
        let shown = state.shown.as_ref()?;
        let typed = shown.mark.typed_since(&doc.text, cursor)?;
        let rest = shown
            .edit
            .text
            .strip_prefix(typed)
            .filter(|r| !r.trim().is_empty())?;
        let c = Completion {
            edits: vec![Edit {
                text: rest.to_owned(),
                replace_len: shown.edit.replace_len,
            }],
            origins: vec![],
            timing: Timing::default(),
            cursor_kind: CursorKind::Code,
            source: Source::TypedThrough,
            route: None,
            served_by: None,
            anchored: false,
            context_files: vec![],
        };
        state.explanation = Some(Explanation::of(&c, Trigger::Automatic));
        Some(c)
    }

    /// Complete at the request's cursor with a model call; cancelling `cancel` stops the
    /// engine. Typing through the shown suggestion is the caller's to check first
    /// ([`typed_through`](Self::typed_through)), once: the LSP does it before its debounce.
    pub async fn complete(&self, r: Request<'_>, cancel: Cancel) -> Result<Completion, EngineError> {
        let computed = self.compute(&r, cancel).await?;
        Ok(self.adopt(&r, computed))
    }

    /// The model call of [`complete`](Self::complete) without its finish: nothing of the
    /// document is kept until [`adopt`](Self::adopt), so an answer computed before it is asked
    /// for (at the cursor a suggestion's accept will give) leaves what is shown untouched.
    pub async fn compute(&self, r: &Request<'_>, cancel: Cancel) -> Result<Computed, EngineError> {
        check_cursor(r)?;
        let plan = self.plan(r, Caller::Editor);
        let out = self.engine.complete(plan.request.clone(), cancel, None).await?;
        Ok(Computed { plan, out })
    }

    /// Finish a [`compute`](Self::compute)d answer for `r` (a request at the document and
    /// cursor it was computed for) as [`complete`](Self::complete) does, keeping it as shown.
    pub fn adopt(&self, r: &Request, computed: Computed) -> Completion {
        self.finish(r, computed.plan, computed.out, true)
    }

    /// The model call for a completion asked for once, outside an editor's session (HTTP
    /// `/complete` and `/v1/completions` with a suffix, `laya complete`): the plan an editor's
    /// request gets — the syntax context, a line or a block, the routed model's budget and
    /// prompt format, the stop and the block's line end — with `model` in place of the
    /// router's choice where given. The document's anchor is neither continued nor replaced.
    /// Its answer goes to [`finish_once`](Self::finish_once) (`/v1/completions` takes only the
    /// prompt and keeps the model's text as it came).
    pub fn plan_once(&self, r: &Request, model: Option<ModelKey>) -> Result<Plan, EngineError> {
        check_cursor(r)?;
        Ok(self.plan(r, Caller::Once(model)))
    }

    /// Rank and post-process the answer to a [`plan_once`](Self::plan_once) as an editor's
    /// is; the model's speed is noted for the router, nothing of the document is kept.
    pub fn finish_once(&self, r: &Request, plan: Plan, out: CompletionOutput) -> Completion {
        self.finish(r, plan, out, false)
    }

    /// Context → route → the routed model's budget → prompt.
    fn plan(&self, r: &Request, caller: Caller) -> Plan {
        let (text, cursor, settings): (&str, usize, &CompletionSettings) =
            (&r.doc.text, r.cursor, r.settings);
        let mut context = Context::gather(r);
        let surroundings = Surroundings::at(text, cursor);
        let mid_line = !surroundings.line_suffix.trim().is_empty();
        // An invoked request anywhere but mid-line asks for a block; an automatic one only
        // where the cursor starts an empty block: elsewhere it completes the line, and stops
        // at its end (a block answer there was mostly lines the user had not reached, and
        // each costs a decode step while the user waits).
        let block = match r.trigger {
            Trigger::Invoked => !mid_line,
            Trigger::Automatic => surroundings.starts_empty_block(),
        };
        let max_tokens = if block {
            settings.max_tokens_block
        } else {
            settings.max_tokens_line
        };
        // The anchor's prompt followed by the text typed at its cursor since, while typing
        // goes on; with the anchor's budget and format and the bytes typed.
        let session = match caller {
            Caller::Editor => self.docs.get(&r.doc.uri),
            Caller::Once(_) => None,
        };
        let continued: Option<Continued> = session.and_then(|d| {
            let anchor = d.anchor.as_ref()?;
            let typed = anchor.mark.typed_since(text, cursor)?;
            (typed.len() <= settings.anchor_max_bytes).then(|| {
                (
                    (anchor.budget.clone(), anchor.family),
                    format!("{}{typed}", anchor.prompt),
                    typed.len(),
                    anchor.drawn_on.clone(),
                )
            })
        });
        let (prompt_tokens, new_tokens) = match &continued {
            Some((_, prompt, typed, _)) => (
                prompt.len() / prompt::BYTES_PER_TOKEN,
                typed / prompt::BYTES_PER_TOKEN + 1,
            ),
            None => {
                let tokens = (text.len() / prompt::BYTES_PER_TOKEN).min(settings.budget.max_tokens);
                (tokens, tokens)
            }
        };
        let route = match caller {
            Caller::Once(Some(model)) => Route {
                model,
                reason: "asked for by the request".into(),
            },
            Caller::Editor | Caller::Once(None) => self.route(
                settings,
                &RouteInput {
                    trigger: r.trigger,
                    cursor_kind: context.cursor_kind,
                    language_id: &r.doc.language_id,
                    block,
                    prompt_tokens,
                    new_tokens,
                    max_tokens,
                },
            ),
        };
        let facts = self.engine.facts(route.model);
        let budget = settings.budget.for_model(facts.and_then(|f| f.parameters));
        let family = facts.map(|f| f.family).unwrap_or_default();
        let (prompt, anchored, drawn_on, anchor) =
            match continued.filter(|((b, f), ..)| *b == budget && *f == family) {
                Some((_, prompt, _, drawn_on)) => (prompt, true, drawn_on, None),
                None => {
                    context.add_workspace(r);
                    let (prompt, anchor) = self.fresh_prompt(r, &context, budget, family);
                    (prompt, false, context.drawn_on.clone(), anchor)
                }
            };
        let n = settings.candidates.max(1);
        Plan {
            request: CompletionRequest {
                model: Some(route.model),
                n,
                // A blank line after code ends a block in every supported language's style; a
                // line ends at its line break.
                stop: vec![if block { "\n\n\n" } else { "\n" }.into()],
                // A block also ends where post-processing would cut it, and at its line limit.
                lines: if block {
                    postprocess::block_end(&surroundings, Some(settings.max_lines_block))
                } else {
                    LineEnd::default()
                },
                branch_first: n > 1,
                ..CompletionRequest::new(prompt, max_tokens)
            },
            route,
            cursor_kind: context.cursor_kind,
            anchored,
            drawn_on,
            anchor,
        }
    }

    /// The router's choice, weighing each model's measured speed, or its estimated one (the
    /// latencies' lock is not held while the engine is asked: its first answer for a model may
    /// read the model file's header).
    fn route(&self, settings: &CompletionSettings, input: &RouteInput) -> Route {
        let measured = |key| self.latencies.lock().unwrap_or_else(|p| p.into_inner()).get(key);
        let route = router::route(&settings.router, input, |key| match measured(key) {
            Some(speed) => Some(KnownSpeed::Measured(speed)),
            None => self
                .engine
                .facts(key)
                .and_then(|f| f.estimated_speed())
                .map(KnownSpeed::Estimated),
        });
        tracing::debug!(model = %route.model, reason = route.reason, "route");
        route
    }

    /// A prompt built afresh in `budget`, and the anchor it makes (none when anchors are off).
    fn fresh_prompt(
        &self,
        r: &Request,
        context: &Context,
        budget: Budget,
        family: Family,
    ) -> (String, Option<Anchor>) {
        let text: &str = &r.doc.text;
        let repo = repo_name(r.workspace_root);
        let path = display_path(&r.doc.uri, r.workspace_root);
        let prompt = prompt::build(
            &PromptInput {
                repo_name: &repo,
                path: &path,
                prefix: &text[..r.cursor],
                suffix: &text[r.cursor..],
                imports: &context.imports,
                local_context: &context.local,
                outline: r.settings.context_layout == ContextLayout::Outline,
                other_files: &context.other_files,
                family,
            },
            &budget,
        );
        let anchor = (r.settings.anchor_max_bytes > 0).then(|| Anchor {
            mark: Mark::of(r.doc, r.cursor),
            prompt: prompt.text.clone(),
            budget,
            family,
            drawn_on: context.drawn_on.clone(),
        });
        (prompt.text, anchor)
    }

    /// Rank → post-process → with `remember`, keep what was shown and why (and the plan's
    /// anchor) for the document.
    fn finish(&self, r: &Request, plan: Plan, out: CompletionOutput, remember: bool) -> Completion {
        let surroundings = Surroundings::at(&r.doc.text, r.cursor);
        let mut edits: Vec<Edit> = vec![];
        let mut origins: Vec<Origin> = vec![];
        for (index, choice) in ranked(&out.choices) {
            let Some(edit) = postprocess::process(&choice.text, &surroundings) else {
                continue;
            };
            if edits.iter().any(|e| e.text == edit.text) {
                continue;
            }
            edits.push(edit);
            origins.push(Origin {
                choice: index,
                tokens: choice.tokens,
                logprob: choice.logprob,
            });
        }
        if let Some(key) = out.served_by {
            self.latencies
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .record(key, &out.timing);
        }
        let c = Completion {
            edits,
            origins,
            timing: out.timing,
            cursor_kind: plan.cursor_kind,
            source: Source::Model,
            route: Some(plan.route),
            served_by: out.served_by,
            anchored: plan.anchored,
            context_files: plan.drawn_on,
        };
        if !remember {
            return c;
        }
        let mut state = self.docs.entry(r.doc.uri.clone()).or_default();
        if let Some(anchor) = plan.anchor {
            state.anchor = Some(anchor);
        }
        state.shown = c.edits.first().map(|e| Shown {
            mark: Mark::of(r.doc, r.cursor),
            edit: e.clone(),
        });
        state.explanation = Some(Explanation::of(&c, r.trigger));
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        document::Document,
        engine::{CompletionOutput, FinishReason, ModelFacts, ModelState, RunsOn, Tier},
    };

    /// Two tiers of known sizes (a 0.5B and a 1.5B on a remote server, whose speed is not
    /// estimated); records each request's model and prompt.
    #[derive(Default)]
    struct TwoTiers {
        seen: Mutex<Vec<(Option<ModelKey>, String)>>,
        asked: Mutex<Vec<CompletionRequest>>,
    }

    #[async_trait::async_trait]
    impl Engine for TwoTiers {
        async fn complete(
            &self,
            req: CompletionRequest,
            _cancel: Cancel,
            _pieces: Option<crate::engine::PieceSender>,
        ) -> Result<CompletionOutput, EngineError> {
            self.asked.lock().unwrap().push(req.clone());
            self.seen.lock().unwrap().push((req.model, req.prompt));
            Ok(CompletionOutput {
                served_by: req.model,
                choices: vec![choice("x", 1, None)],
                timing: Timing::default(),
            })
        }

        fn state(&self) -> ModelState {
            ModelState::Loading
        }

        fn facts(&self, model: ModelKey) -> Option<ModelFacts> {
            Some(ModelFacts {
                parameters: Some(match model.tier {
                    Tier::Small => 494_000_000,
                    Tier::Large => 1_540_000_000,
                }),
                active_parameters: None,
                bits: 8,
                runs_on: RunsOn::Remote,
                family: Family::default(),
            })
        }
    }

    /// Settings under which every request builds its prompt afresh (no anchor, no typing
    /// through a shown answer).
    fn fresh_prompts() -> CompletionSettings {
        CompletionSettings {
            anchor_max_bytes: 0,
            typing_through: false,
            ..CompletionSettings::default()
        }
    }

    /// A workspace of `shop/cart.py` (class `Cart`) and `shop/views.py` (the returned text,
    /// which completes at its end after `cart.`), indexed.
    fn shop_workspace() -> (tempfile::TempDir, WorkspaceIndex, &'static str) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("shop")).unwrap();
        std::fs::write(
            dir.path().join("shop/cart.py"),
            "class Cart:\n    def add_item(self, sku: str, quantity: int = 1) -> None:\n        pass\n",
        )
        .unwrap();
        let current = "from .cart import Cart\n\ndef checkout(cart: Cart):\n    cart.";
        std::fs::write(dir.path().join("shop/views.py"), current).unwrap();
        let index = WorkspaceIndex::new(vec![dir.path().to_owned()], crate::workspace::Limits::default());
        index.build(1, |_, _| {});
        (dir, index, current)
    }

    /// A file of the workspace that is not open lends the definitions the cursor's code uses,
    /// in Qwen's repository-level form before the current file; `laya/explain` names it and
    /// the names that brought it in; with `workspaceContext` off the prompt has none of it.
    #[tokio::test]
    async fn the_workspace_index_lends_definitions_of_files_not_open() {
        let (_dir, index, current) = shop_workspace();
        let root = index.roots()[0].clone();
        let uri = format!("file://{}", root.join("shop/views.py").display());
        let root_uri = format!("file://{}", root.display());
        let doc = Document::new(current, 1, "python").snapshot(&uri);
        let engine = Arc::new(TwoTiers::default());
        let pipeline = Pipeline::new(engine.clone());
        for on in [true, false] {
            let settings = CompletionSettings {
                workspace_context: on,
                ..fresh_prompts()
            };
            let request = Request {
                doc: &doc,
                others: &[],
                cursor: current.len(),
                trigger: Trigger::Invoked,
                settings: &settings,
                workspace_root: Some(&root_uri),
                workspace: Some(&index),
            };
            let c = pipeline.complete(request, Cancel::new()).await.unwrap();
            let prompt = engine.seen.lock().unwrap().last().unwrap().1.clone();
            let lent = "<|file_sep|>shop/cart.py\nclass Cart:\n    def add_item(self, sku: str, quantity: int = 1) -> None:\n<|file_sep|>shop/views.py\n<|fim_prefix|>";
            assert_eq!(prompt.contains(lent), on, "{prompt}");
            let explained = pipeline.explain(&uri).unwrap();
            if on {
                assert_eq!(
                    c.context_files,
                    [ContextFile {
                        path: "shop/cart.py".into(),
                        symbols: vec!["Cart".into()]
                    }]
                );
                assert!(explained
                    .markdown()
                    .contains("workspace context: `shop/cart.py` (Cart)"));
            } else {
                assert!(c.context_files.is_empty());
            }
        }
    }

    /// A prompt continuing its anchor keeps the anchor's workspace context and does not ask
    /// the index again; a prompt built afresh does.
    #[tokio::test]
    async fn a_continued_prompt_does_not_ask_the_workspace_index() {
        let (_dir, index, current) = shop_workspace();
        let root = index.roots()[0].clone();
        let uri = format!("file://{}", root.join("shop/views.py").display());
        let engine = Arc::new(TwoTiers::default());
        let pipeline = Pipeline::new(engine.clone());
        let settings = CompletionSettings {
            typing_through: false,
            workspace_context: true,
            ..CompletionSettings::default()
        };
        let lent = vec![ContextFile {
            path: "shop/cart.py".into(),
            symbols: vec!["Cart".into()],
        }];
        for (version, typed, anchored, retrievals) in
            [(1, "", false, 1), (2, "a", true, 1), (3, "ad", true, 1)]
        {
            let text = format!("{current}{typed}");
            let doc = Document::new(&text, version, "python").snapshot(&uri);
            let request = Request {
                doc: &doc,
                others: &[],
                cursor: text.len(),
                trigger: Trigger::Automatic,
                settings: &settings,
                workspace_root: None,
                workspace: Some(&index),
            };
            let c = pipeline.complete(request, Cancel::new()).await.unwrap();
            assert_eq!(
                (c.anchored, index.retrievals()),
                (anchored, retrievals),
                "typed {typed:?}"
            );
            assert_eq!(c.context_files, lent, "typed {typed:?}");
        }
    }

    /// A request whose engine call does not finish (cancelled) leaves no anchor: the next
    /// prompt is built afresh, and that one anchors the one after.
    #[tokio::test]
    async fn a_cancelled_request_leaves_no_anchor() {
        #[derive(Default)]
        struct CancelsFirst {
            calls: Mutex<usize>,
        }
        #[async_trait::async_trait]
        impl Engine for CancelsFirst {
            async fn complete(
                &self,
                _: CompletionRequest,
                _: Cancel,
                _: Option<crate::engine::PieceSender>,
            ) -> Result<CompletionOutput, EngineError> {
                let mut calls = self.calls.lock().unwrap();
                *calls += 1;
                if *calls == 1 {
                    return Err(EngineError::Cancelled);
                }
                Ok(CompletionOutput {
                    served_by: None,
                    choices: vec![choice("x", 1, None)],
                    timing: Timing::default(),
                })
            }

            fn state(&self) -> ModelState {
                ModelState::Loading
            }
        }
        let pipeline = Pipeline::new(Arc::new(CancelsFirst::default()));
        let settings = CompletionSettings {
            typing_through: false,
            ..CompletionSettings::default()
        };
        for (version, typed, anchored) in [(1, "", None), (2, "a", Some(false)), (3, "ab", Some(true))] {
            let text = format!("def f():\n    {typed}");
            let doc = Document::new(&text, version, "python").snapshot("file:///a.py");
            let request = Request {
                doc: &doc,
                others: &[],
                cursor: text.len(),
                trigger: Trigger::Automatic,
                settings: &settings,
                workspace_root: None,
                workspace: None,
            };
            let got = pipeline.complete(request, Cancel::new()).await;
            match anchored {
                None => assert_eq!(got.unwrap_err(), EngineError::Cancelled),
                Some(a) => assert_eq!(got.unwrap().anchored, a, "typed {typed:?}"),
            }
        }
    }

    /// A request outside an editor's session gets the request an editor's gets at the same
    /// cursor (the same prompt, limit and stop; the named model where one is named), and keeps
    /// nothing: the editor's anchor is neither continued by it nor replaced, and no
    /// suggestion is remembered for typing through.
    #[tokio::test]
    async fn a_one_off_request_is_planned_as_an_editors_and_keeps_nothing() {
        let engine = Arc::new(TwoTiers::default());
        let pipeline = Pipeline::new(engine.clone());
        let settings = CompletionSettings::default();
        let text = "import os\n\ndef f(path):\n    return os.path.";
        let doc = Document::new(text, 1, "python").snapshot("file:///w/f.py");
        let request = |doc| Request {
            doc,
            others: &[],
            cursor: text.len(),
            trigger: Trigger::Invoked,
            settings: &settings,
            workspace_root: None,
            workspace: None,
        };
        let once = pipeline.plan_once(&request(&doc), None).unwrap().request;
        pipeline.complete(request(&doc), Cancel::new()).await.unwrap();
        let editor = engine.asked.lock().unwrap()[0].clone();
        assert_eq!(
            (&once.prompt, once.max_tokens, &once.stop, once.model),
            (&editor.prompt, editor.max_tokens, &editor.stop, editor.model)
        );
        assert!(
            once.prompt.contains("import os"),
            "the syntax context: {:?}",
            once.prompt
        );

        // The editor's request made an anchor; a one-off after text typed at its cursor is
        // built afresh (a prompt of its own text, not the anchor's plus what was typed).
        let typed = format!("{text}jo");
        let later = Document::new(&typed, 2, "python").snapshot("file:///w/f.py");
        let small = ModelKey {
            tier: Tier::Small,
            precision: crate::engine::Precision::Q4,
        };
        let later_request = Request {
            cursor: typed.len(),
            ..request(&later)
        };
        let plan = pipeline.plan_once(&later_request, Some(small)).unwrap();
        assert_eq!(
            plan.request.model,
            Some(small),
            "the named model, not the router's"
        );
        assert!(
            plan.request.prompt.contains("os.path.jo<"),
            "{:?}",
            plan.request.prompt
        );
        let out = CompletionOutput {
            served_by: Some(small),
            choices: vec![choice("in(path)", 2, None)],
            timing: Timing::default(),
        };
        let c = pipeline.finish_once(&later_request, plan, out);
        assert!(!c.anchored);
        assert_eq!(c.edits[0].text, "in(path)");
        // The editor's next request continues the anchor of its own last one: the one-off
        // did not replace it.
        let c = pipeline.complete(later_request, Cancel::new()).await.unwrap();
        assert!(c.anchored);
        let continued = engine.asked.lock().unwrap()[1].prompt.clone();
        assert_eq!(continued, format!("{}jo", editor.prompt));
        // No one-off answer is remembered to type through (in a document of its own).
        let other = Document::new(text, 1, "python").snapshot("file:///w/g.py");
        let plan = pipeline.plan_once(&request(&other), None).unwrap();
        let out = CompletionOutput {
            served_by: None,
            choices: vec![choice("join(path)", 2, None)],
            timing: Timing::default(),
        };
        assert_eq!(
            pipeline.finish_once(&request(&other), plan, out).edits[0].text,
            "join(path)"
        );
        let next = Document::new(&typed, 2, "python").snapshot("file:///w/g.py");
        assert!(pipeline.typed_through(&next, typed.len(), &settings).is_none());
        let bad = Request {
            cursor: text.len() + 1,
            ..request(&doc)
        };
        assert!(matches!(
            pipeline.plan_once(&bad, None),
            Err(EngineError::BadRequest(_))
        ));
    }

    /// What an automatic request asks for: a block (the block's token limit, ending at a
    /// blank line) where the cursor starts an empty block, the rest of the line (the line's
    /// limit, ending at the line break) on a blank line inside a written block, at the end of
    /// a line and mid-line; an invoked request on a blank line asks for a block.
    #[tokio::test]
    async fn an_automatic_request_asks_for_a_block_only_where_one_starts() {
        let engine = Arc::new(TwoTiers::default());
        let pipeline = Pipeline::new(engine.clone());
        let settings = fresh_prompts();
        let cases = [
            (
                "def f(x):\n    $0\n\ndef g():\n    pass\n",
                Trigger::Automatic,
                true,
            ),
            (
                "def f(x):\n    y = 1\n    $0\n    return y\n",
                Trigger::Automatic,
                false,
            ),
            (
                "def f(x):\n    y = 1$0\n    return y\n",
                Trigger::Automatic,
                false,
            ),
            (
                "def f(x):\n    y = g($0)\n    return y\n",
                Trigger::Automatic,
                false,
            ),
            (
                "def f(x):\n    y = 1\n    $0\n    return y\n",
                Trigger::Invoked,
                true,
            ),
            (
                "def f(x):\n    y = g($0)\n    return y\n",
                Trigger::Invoked,
                false,
            ),
        ];
        for (i, (fixture, trigger, block)) in cases.iter().enumerate() {
            let cursor = fixture.find("$0").unwrap();
            let doc = Document::new(&fixture.replace("$0", ""), 1, "python").snapshot("file:///w/f.py");
            let request = Request {
                doc: &doc,
                others: &[],
                cursor,
                trigger: *trigger,
                settings: &settings,
                workspace_root: None,
                workspace: None,
            };
            pipeline.complete(request, Cancel::new()).await.unwrap();
            let asked = engine.asked.lock().unwrap()[i].clone();
            let (limit, stop) = if *block {
                (settings.max_tokens_block, "\n\n\n")
            } else {
                (settings.max_tokens_line, "\n")
            };
            assert_eq!(
                (asked.max_tokens, asked.stop),
                (limit, vec![stop.to_owned()]),
                "{fixture:?} {trigger:?}"
            );
            // A block ends in the engine where post-processing would cut it: below the
            // cursor's 4 columns, at the suffix's first line of code written again, or after
            // the block's line limit; a line needs no rule beyond its line break.
            let repeats = match (i, block) {
                (0, _) => "def g():",
                (_, true) => "return y",
                _ => "",
            };
            let want = block.then(|| LineEnd {
                dedent_below: Some(4),
                repeats: repeats.into(),
                max_lines: Some(settings.max_lines_block),
            });
            assert_eq!(Some(asked.lines).filter(|l| !l.is_none()), want, "{fixture:?}");
        }
    }

    /// Route first, then the prompt: a request the router sends to the large tier is built in
    /// the large model's budget (its longer suffix), one sent to the small tier in the small's.
    #[tokio::test]
    async fn the_prompt_is_built_in_the_budget_of_the_model_routed_to() {
        let suffix: String = (0..60)
            .map(|i| format!("    total = total + value_{i}\n"))
            .collect();
        let text =
            format!("def f(values):\n    \n\ndef g(values):\n    total = 0\n{suffix}    return total\n");
        let cursor = "def f(values):\n    ".len();
        let doc = Document::new(&text, 1, "python").snapshot("file:///w/f.py");
        let engine = Arc::new(TwoTiers::default());
        let pipeline = Pipeline::new(engine.clone());
        let settings = fresh_prompts();
        let request = |trigger| Request {
            doc: &doc,
            others: &[],
            cursor,
            trigger,
            settings: &settings,
            workspace_root: None,
            workspace: None,
        };
        // The cursor starting an empty block: a block, which the policy gives the large tier;
        // typed mid-line text stays small.
        pipeline
            .complete(request(Trigger::Automatic), Cancel::new())
            .await
            .unwrap();
        let mid_line =
            Document::new(&text.replacen("    \n", "    x = \n", 1), 2, "python").snapshot("file:///w/f.py");
        pipeline
            .complete(
                Request {
                    doc: &mid_line,
                    cursor: cursor + "x = ".len(),
                    ..request(Trigger::Automatic)
                },
                Cancel::new(),
            )
            .await
            .unwrap();
        let seen = engine.seen.lock().unwrap();
        let suffix_bytes = |prompt: &str| {
            let s = &prompt[prompt.find("<|fim_suffix|>").unwrap()..prompt.find("<|fim_middle|>").unwrap()];
            s.len()
        };
        assert_eq!(seen[0].0.map(|k| k.tier), Some(Tier::Large));
        assert_eq!(seen[1].0.map(|k| k.tier), Some(Tier::Small));
        let (large, small) = (suffix_bytes(&seen[0].1), suffix_bytes(&seen[1].1));
        let budget = Budget::default().max_tokens * prompt::BYTES_PER_TOKEN;
        // 6 % of the budget for the 1.5B, 2 % for the 0.5B (whole lines, so a little under).
        assert!(
            large > budget * 5 / 100 && large <= budget * 6 / 100 + 20,
            "{large} of {budget}"
        );
        assert!(
            small > budget / 100 && small <= budget * 2 / 100 + 20,
            "{small} of {budget}"
        );
    }

    /// The paths a prompt shows are those of [`file_path`]: percent-decoded (spaces,
    /// non-ASCII characters), relative to the workspace root when inside it (by whole folder
    /// names), else the file name; a URI of no file shows its last segment.
    #[test]
    fn paths_shown_to_the_model_are_decoded() {
        let root = Some("file:///tmp/my%20dir");
        assert_eq!(
            display_path("file:///tmp/my%20dir/src/caf%C3%A9.rs", root),
            "src/café.rs"
        );
        assert_eq!(display_path("file:///tmp/my%20dir/caf%C3%A9.rs", None), "café.rs");
        assert_eq!(
            display_path("file:///tmp/my%20dir2/a.rs", root),
            "a.rs",
            "a folder whose name starts alike is outside"
        );
        assert_eq!(display_path("untitled:Untitled-1", root), "untitled:Untitled-1");
        assert_eq!(display_path("t/f.py", None), "f.py");
        assert_eq!(repo_name(root), "my dir");
        assert_eq!(repo_name(Some("file:///tmp/caf%C3%A9/")), "café");
        assert_eq!(repo_name(None), "workspace");
    }

    fn choice(text: &str, tokens: usize, logprob: Option<f32>) -> Choice {
        Choice {
            text: text.into(),
            finish_reason: FinishReason::StopToken,
            tokens,
            logprob,
        }
    }

    fn texts(choices: &[(usize, &Choice)]) -> Vec<String> {
        choices.iter().map(|(_, c)| c.text.clone()).collect()
    }

    #[test]
    fn branched_choices_keep_greedy_first_then_rank_by_summed_log_probability() {
        let choices = [
            choice("greedy", 4, Some(-4.0)),
            choice("longer", 10, Some(-5.0)), // best mean a token (-0.5), not first for that
            choice("short", 2, Some(-2.0)),   // best sum after greedy's
            choice("unlikely", 2, Some(-6.0)),
            choice("empty", 0, Some(-3.0)),
        ];
        let ranked = ranked(&choices);
        assert_eq!(texts(&ranked), ["greedy", "short", "empty", "longer", "unlikely"]);
        let order: Vec<usize> = ranked.iter().map(|(i, _)| *i).collect();
        assert_eq!(
            order,
            [0, 2, 4, 1, 3],
            "each keeps its index in the engine's order"
        );
    }

    #[test]
    fn choices_without_log_probabilities_keep_the_engine_order() {
        let choices = [
            choice("a", 1, None),
            choice("b", 1, Some(0.0)),
            choice("c", 1, None),
        ];
        assert_eq!(texts(&ranked(&choices)), ["a", "b", "c"]);
        let tied = [choice("x", 2, Some(-1.0)), choice("y", 1, Some(-0.5))];
        assert_eq!(texts(&ranked(&tied)), ["x", "y"]);
    }
}
