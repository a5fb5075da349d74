//! One completion request from a document snapshot to edits: context → prompt → engine →
//! post-processing. Knows no LSP types; sees the engine only through the `Engine` trait.

use std::sync::{atomic::AtomicBool, Arc};

use super::postprocess::{self, Edit, Surroundings};
use crate::{
    document::DocumentSnapshot,
    engine::{worker::Engine, CompletionRequest, EngineError, SamplingParams, Timing},
    prompt::{self, Budget, PromptInput, Snippet},
    syntax::CursorKind,
};

/// Settings of the completion pipeline (from `initializationOptions` / `workspace/configuration`).
#[derive(Clone, Debug, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct CompletionSettings {
    /// Wait this long after a request before starting it; a newer request cancels it.
    pub debounce_ms: u64,
    pub budget: Budget,
    /// Most tokens for a completion of the rest of a line / of a block.
    pub max_tokens_line: usize,
    pub max_tokens_block: usize,
    /// Candidates per request (1 is greedy; more are sampled at `temperature`).
    pub candidates: usize,
    pub temperature: f32,
    /// Languages (LSP ids) to complete in; empty means all.
    pub languages: Vec<String>,
}

impl Default for CompletionSettings {
    fn default() -> Self {
        CompletionSettings {
            debounce_ms: 75,
            budget: Budget::default(),
            max_tokens_line: 48,
            max_tokens_block: 128,
            candidates: 1,
            temperature: 0.6,
            languages: vec![],
        }
    }
}

/// How the request was triggered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// The user asked (a key binding).
    Invoked,
    /// While typing.
    Automatic,
}

#[derive(Debug)]
pub struct Completion {
    /// Distinct, non-empty edits, best first.
    pub edits: Vec<Edit>,
    pub timing: Timing,
    pub cursor_kind: CursorKind,
}

/// Path shown to the model: the URI's path relative to the workspace root when inside it.
fn display_path(uri: &str, root: Option<&str>) -> String {
    let path = uri.strip_prefix("file://").unwrap_or(uri);
    root.and_then(|r| path.strip_prefix(r.strip_prefix("file://").unwrap_or(r)))
        .map(|p| p.trim_start_matches('/').to_owned())
        .unwrap_or_else(|| path.rsplit('/').next().unwrap_or(path).to_owned())
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
}

pub struct Pipeline {
    engine: Arc<dyn Engine>,
}

impl Pipeline {
    pub fn new(engine: Arc<dyn Engine>) -> Self {
        Pipeline { engine }
    }

    pub fn engine(&self) -> &Arc<dyn Engine> {
        &self.engine
    }

    /// Complete at the request's cursor; setting `cancel` stops the engine.
    pub async fn complete(&self, r: Request<'_>, cancel: Arc<AtomicBool>) -> Result<Completion, EngineError> {
        let Request {
            doc,
            others,
            cursor,
            trigger,
            settings,
            workspace_root,
        } = r;
        let text: &str = &doc.text;
        if cursor > text.len() || !text.is_char_boundary(cursor) {
            return Err(EngineError::Request(format!(
                "cursor byte {cursor} is not inside the document"
            )));
        }
        let ctx = doc.context(cursor, others);
        let surroundings = Surroundings::at(text, cursor);
        let mid_line = !surroundings.line_suffix.trim().is_empty();
        let (imports, local, snippets) = match &ctx {
            Some(c) => {
                let local: Vec<String> = c
                    .type_definitions
                    .iter()
                    .filter(|t| t.source_path.is_none())
                    .map(|t| t.text.clone())
                    .chain(c.signatures.iter().cloned())
                    .collect();
                let mut by_file: Vec<Snippet> = vec![];
                for t in c.type_definitions.iter().filter(|t| t.source_path.is_some()) {
                    let path = display_path(t.source_path.as_deref().unwrap_or_default(), workspace_root);
                    match by_file.iter_mut().find(|s| s.path == path) {
                        Some(s) => {
                            s.text.push('\n');
                            s.text.push_str(&t.text);
                        }
                        None => by_file.push(Snippet {
                            path,
                            text: t.text.clone(),
                        }),
                    }
                }
                (c.imports.clone(), local, by_file)
            }
            None => (vec![], vec![], vec![]),
        };
        let repo = workspace_root
            .and_then(|r| r.trim_end_matches('/').rsplit('/').next())
            .unwrap_or("workspace");
        let path = display_path(&doc.uri, workspace_root);
        let prompt = prompt::build(
            &PromptInput {
                repo_name: repo,
                path: &path,
                prefix: &text[..cursor],
                suffix: &text[cursor..],
                imports: &imports,
                local_context: &local,
                other_files: &snippets,
            },
            &settings.budget,
        );
        let n = settings.candidates.max(1);
        let req = CompletionRequest {
            model: None,
            prompt: prompt.text,
            max_tokens: if mid_line
                || trigger == Trigger::Automatic && !surroundings.line_prefix.trim().is_empty()
            {
                settings.max_tokens_line
            } else {
                settings.max_tokens_block
            },
            n,
            sampling: if n == 1 {
                SamplingParams::default()
            } else {
                SamplingParams {
                    temperature: settings.temperature,
                    top_p: 0.95,
                    ..SamplingParams::default()
                }
            },
            // A blank line after code ends a block in every supported language's style.
            stop: if mid_line {
                vec!["\n".into()]
            } else {
                vec!["\n\n\n".into()]
            },
        };
        let out = self.engine.complete(req, cancel).await?;
        let mut edits: Vec<Edit> = vec![];
        for choice in &out.choices {
            if let Some(edit) = postprocess::process(&choice.text, &surroundings) {
                if !edits.iter().any(|e| e.text == edit.text) {
                    edits.push(edit);
                }
            }
        }
        Ok(Completion {
            edits,
            timing: out.timing,
            cursor_kind: ctx.map(|c| c.cursor_kind).unwrap_or(CursorKind::Code),
        })
    }
}
