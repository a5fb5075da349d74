//! Open documents: text (a rope), version, language and syntax tree, kept in step with
//! the editor's incremental edits. [`Document`] is one; `DocumentStore` holds them by URI.
//!
//! Boundary: no LSP types. Callers give [`Position`]s in a [`PositionEncoding`] (the LSP
//! layer builds them from the protocol's) and get byte offsets back (`position`: UTF-8 or
//! UTF-16); inside laya everything is byte offsets into the rope. `document` uses `syntax` to
//! keep each document's tree current; `syntax` never sees a `Document`.
//!
//! Invariants: a change is applied whole or not at all (a stale version, a bad position or
//! a reversed range leaves the document untouched); a position inside a character is an
//! error, a character past the line end means the line end; after every change the tree,
//! when the language is known, is the incremental reparse of the new text.

pub mod position;

#[cfg(test)]
mod tests;

use std::sync::{Arc, OnceLock};

use dashmap::DashMap;
use ropey::Rope;
use thiserror::Error;
use tree_sitter::{InputEdit, Tree};

use crate::syntax::{self, Language};
pub use position::{byte_to_position, position_to_byte, Position, PositionEncoding, PositionError};

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DocumentError {
    #[error("version {received} is not newer than the current version {current}")]
    StaleVersion { current: i32, received: i32 },
    #[error(transparent)]
    Position(#[from] PositionError),
    #[error("range start {start:?} is after its end {end:?}")]
    ReversedRange { start: Position, end: Position },
    #[error("no open document {0}")]
    UnknownDocument(String),
}

/// One content change: replace `range` (start, end) by `text`; `None` replaces the
/// whole text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TextChange<'a> {
    pub range: Option<(Position, Position)>,
    pub text: &'a str,
}

pub struct Document {
    rope: Rope,
    version: i32,
    language_id: String,
    language: Option<Language>,
    tree: Option<Tree>,
    /// The text as one string, built on first request and dropped on every edit, so that
    /// snapshots of documents that did not change cost nothing.
    text: OnceLock<Arc<str>>,
}

impl std::fmt::Debug for Document {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Document")
            .field("version", &self.version)
            .field("language_id", &self.language_id)
            .field("language", &self.language)
            .field("bytes", &self.rope.len_bytes())
            .finish_non_exhaustive()
    }
}

impl Document {
    /// The language is looked up by `language_id`; unknown ones get no tree.
    pub fn new(text: &str, version: i32, language_id: &str) -> Self {
        Self::with_language(
            text,
            version,
            language_id,
            Language::from_language_id(language_id),
        )
    }

    /// A file's text outside an editor (HTTP, the command line): the language by the
    /// extension of `path` (its first LSP id, else `plaintext`); unknown ones get no tree.
    pub fn for_path(text: &str, path: &str) -> Self {
        let language = Language::from_path(path);
        let id = language
            .and_then(|l| l.config().language_ids.first().copied())
            .unwrap_or("plaintext");
        Self::with_language(text, 1, id, language)
    }

    pub fn with_language(text: &str, version: i32, language_id: &str, language: Option<Language>) -> Self {
        let rope = Rope::from_str(text);
        let tree = language.and_then(|l| syntax::parse_rope(l, &rope, None));
        Document {
            rope,
            version,
            language_id: language_id.to_owned(),
            language,
            tree,
            text: OnceLock::new(),
        }
    }

    pub fn rope(&self) -> &Rope {
        &self.rope
    }

    pub fn version(&self) -> i32 {
        self.version
    }

    pub fn language_id(&self) -> &str {
        &self.language_id
    }

    pub fn language(&self) -> Option<Language> {
        self.language
    }

    pub fn tree(&self) -> Option<&Tree> {
        self.tree.as_ref()
    }

    /// The whole text as [`text`](Self::text) last made it, if it did since the last change
    /// (never builds it).
    pub fn text_if_built(&self) -> Option<Arc<str>> {
        self.text.get().cloned()
    }

    /// The whole text, shared.
    pub fn text(&self) -> Arc<str> {
        self.text
            .get_or_init(|| Arc::from(String::from(&self.rope)))
            .clone()
    }

    pub fn offset_at(&self, pos: Position, encoding: PositionEncoding) -> Result<usize, PositionError> {
        position_to_byte(&self.rope, pos, encoding)
    }

    pub fn position_at(&self, offset: usize, encoding: PositionEncoding) -> Result<Position, PositionError> {
        byte_to_position(&self.rope, offset, encoding)
    }

    /// One change; see [`Document::apply_changes`].
    pub fn apply_change(
        &mut self,
        version: i32,
        range: Option<(Position, Position)>,
        text: &str,
        encoding: PositionEncoding,
    ) -> Result<(), DocumentError> {
        self.apply_changes(version, &[TextChange { range, text }], encoding)
    }

    /// Applies `changes` in order (each one's positions refer to the text left by the
    /// previous one, as in LSP `didChange`) and sets the version. All or nothing: on any
    /// error the document is unchanged. The tree is edited per change and reparsed once.
    pub fn apply_changes(
        &mut self,
        version: i32,
        changes: &[TextChange<'_>],
        encoding: PositionEncoding,
    ) -> Result<(), DocumentError> {
        if version <= self.version {
            return Err(DocumentError::StaleVersion {
                current: self.version,
                received: version,
            });
        }
        // Ropes clone in O(1); edits go to the copy, which replaces the original only
        // once every change has applied.
        let mut rope = self.rope.clone();
        let mut edits = Vec::with_capacity(changes.len());
        for change in changes {
            edits.push(apply_one(&mut rope, change, encoding)?);
        }
        self.rope = rope;
        self.version = version;
        self.text = OnceLock::new();
        if let Some(language) = self.language {
            let old = self.tree.take().map(|mut tree| {
                for edit in &edits {
                    match edit {
                        Some(edit) => tree.edit(edit),
                        None => return None,
                    }
                }
                Some(tree)
            });
            self.tree = syntax::parse_rope(language, &self.rope, old.flatten().as_ref());
        }
        Ok(())
    }

    pub fn snapshot(&self, uri: &str) -> DocumentSnapshot {
        DocumentSnapshot {
            uri: uri.to_owned(),
            text: self.text(),
            rope: self.rope.clone(),
            version: self.version,
            language_id: self.language_id.clone(),
            language: self.language,
            tree: self.tree.clone(),
        }
    }
}

/// Applies one change to `rope`; returns the tree edit it implies (`None` for a full
/// replacement, after which the old tree is useless). On error `rope` is untouched.
fn apply_one(
    rope: &mut Rope,
    change: &TextChange<'_>,
    encoding: PositionEncoding,
) -> Result<Option<InputEdit>, DocumentError> {
    let Some((start, end)) = change.range else {
        *rope = Rope::from_str(change.text);
        return Ok(None);
    };
    let start_byte = position_to_byte(rope, start, encoding)?;
    let old_end_byte = position_to_byte(rope, end, encoding)?;
    if start_byte > old_end_byte {
        return Err(DocumentError::ReversedRange { start, end });
    }
    let start_position = position::byte_to_point(rope, start_byte);
    let old_end_position = position::byte_to_point(rope, old_end_byte);
    let start_char = rope.byte_to_char(start_byte);
    rope.remove(start_char..rope.byte_to_char(old_end_byte));
    rope.insert(start_char, change.text);
    let new_end_byte = start_byte + change.text.len();
    Ok(Some(InputEdit {
        start_byte,
        old_end_byte,
        new_end_byte,
        start_position,
        old_end_position,
        new_end_position: position::byte_to_point(rope, new_end_byte),
    }))
}

/// A document as it was at one version, detached from the store: what the completion
/// pipeline works on while edits keep arriving.
#[derive(Clone)]
pub struct DocumentSnapshot {
    pub uri: String,
    pub text: Arc<str>,
    pub rope: Rope,
    pub version: i32,
    pub language_id: String,
    pub language: Option<Language>,
    pub tree: Option<Tree>,
}

impl std::fmt::Debug for DocumentSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DocumentSnapshot")
            .field("uri", &self.uri)
            .field("version", &self.version)
            .field("language_id", &self.language_id)
            .field("language", &self.language)
            .field("bytes", &self.text.len())
            .finish_non_exhaustive()
    }
}

impl DocumentSnapshot {
    pub fn offset_at(&self, pos: Position, encoding: PositionEncoding) -> Result<usize, PositionError> {
        position_to_byte(&self.rope, pos, encoding)
    }

    pub fn position_at(&self, offset: usize, encoding: PositionEncoding) -> Result<Position, PositionError> {
        byte_to_position(&self.rope, offset, encoding)
    }

    /// The document as it would be with bytes `start..end` replaced by `insert` (a suggestion
    /// accepted, before the editor says so): the tree edited and reparsed incrementally, the
    /// version unchanged. `None` when the range is not on character boundaries in order.
    pub fn with_edit(&self, start: usize, end: usize, insert: &str) -> Option<DocumentSnapshot> {
        let text: &str = &self.text;
        if start > end || !text.is_char_boundary(start) || !text.is_char_boundary(end) {
            return None;
        }
        let mut rope = self.rope.clone();
        let (start_char, end_char) = (rope.byte_to_char(start), rope.byte_to_char(end));
        let start_position = position::byte_to_point(&rope, start);
        let old_end_position = position::byte_to_point(&rope, end);
        rope.remove(start_char..end_char);
        rope.insert(start_char, insert);
        let new_end_byte = start + insert.len();
        let edit = InputEdit {
            start_byte: start,
            old_end_byte: end,
            new_end_byte,
            start_position,
            old_end_position,
            new_end_position: position::byte_to_point(&rope, new_end_byte),
        };
        let tree = self.language.and_then(|language| {
            let mut old = self.tree.clone()?;
            old.edit(&edit);
            syntax::parse_rope(language, &rope, Some(&old))
        });
        Some(DocumentSnapshot {
            uri: self.uri.clone(),
            text: Arc::from(format!("{}{insert}{}", &text[..start], &text[end..])),
            rope,
            version: self.version,
            language_id: self.language_id.clone(),
            language: self.language,
            tree,
        })
    }

    /// This document as an input to [`syntax::extract`]'s other documents (`None` when
    /// its language is unknown).
    pub fn as_open_document(&self) -> Option<syntax::OpenDocument<'_>> {
        Some(syntax::OpenDocument {
            path: &self.uri,
            text: &self.text,
            tree: self.tree.as_ref()?,
            language: self.language?,
        })
    }

    /// [`syntax::extract`] at `cursor_byte`, with `others` as the other open documents.
    /// `None` when this document's language is unknown.
    pub fn context(&self, cursor_byte: usize, others: &[DocumentSnapshot]) -> Option<syntax::Context> {
        let others: Vec<_> = others
            .iter()
            .filter(|o| o.uri != self.uri)
            .filter_map(DocumentSnapshot::as_open_document)
            .collect();
        Some(syntax::extract(
            self.language?,
            &self.text,
            self.tree.as_ref()?,
            cursor_byte,
            &others,
        ))
    }
}

/// The open documents by URI. Shared by reference between the LSP handlers; each
/// document is locked only for the duration of one call.
#[derive(Default)]
pub struct DocumentStore {
    docs: DashMap<String, Document>,
}

impl DocumentStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// Opens (or reopens, replacing) `uri`. The language comes from `language_id`, else
    /// from the URI's extension.
    pub fn open(&self, uri: &str, text: &str, version: i32, language_id: &str) {
        let language = Language::from_language_id(language_id).or_else(|| Language::from_path(uri));
        self.docs.insert(
            uri.to_owned(),
            Document::with_language(text, version, language_id, language),
        );
    }

    pub fn change(
        &self,
        uri: &str,
        version: i32,
        changes: &[TextChange<'_>],
        encoding: PositionEncoding,
    ) -> Result<(), DocumentError> {
        let mut doc = self
            .docs
            .get_mut(uri)
            .ok_or_else(|| DocumentError::UnknownDocument(uri.to_owned()))?;
        doc.apply_changes(version, changes, encoding)
    }

    /// Closes `uri` and frees its text and tree.
    pub fn close(&self, uri: &str) -> Result<(), DocumentError> {
        self.docs
            .remove(uri)
            .map(drop)
            .ok_or_else(|| DocumentError::UnknownDocument(uri.to_owned()))
    }

    pub fn snapshot(&self, uri: &str) -> Result<DocumentSnapshot, DocumentError> {
        let doc = self
            .docs
            .get(uri)
            .ok_or_else(|| DocumentError::UnknownDocument(uri.to_owned()))?;
        Ok(doc.snapshot(uri))
    }

    /// `uri`'s whole text if it was built since its last change (see [`Document::text_if_built`]).
    pub fn text_if_built(&self, uri: &str) -> Option<Arc<str>> {
        self.docs.get(uri)?.text_if_built()
    }

    /// Snapshots of every open document except `except` (for cross-file context).
    pub fn snapshots_except(&self, except: &str) -> Vec<DocumentSnapshot> {
        let mut all: Vec<_> = self
            .docs
            .iter()
            .filter(|e| e.key() != except)
            .map(|e| e.value().snapshot(e.key()))
            .collect();
        all.sort_by(|a, b| a.uri.cmp(&b.uri));
        all
    }

    pub fn contains(&self, uri: &str) -> bool {
        self.docs.contains_key(uri)
    }

    pub fn len(&self) -> usize {
        self.docs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.docs.is_empty()
    }
}
