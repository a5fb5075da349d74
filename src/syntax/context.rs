//! What the model should know about the cursor, read off the syntax tree.
//!
//! [`extract`] looks at one document (text + tree + cursor byte offset) and the other
//! open documents and returns a [`Context`]: whether the cursor sits in code, a comment or
//! a string; the enclosing functions/classes with their signatures; signatures of nearby
//! functions; definitions of the types named near the cursor; the file's imports; and the
//! cursor line split at the cursor. Every list and text is capped ([`Limits`]) so a huge
//! file cannot blow up the prompt, and every search is bounded so a large file stays fast:
//! scopes and cursor kind look at a byte range around the cursor, the whole-file lists
//! (types, imports) walk the file's outline and skip function bodies.

use std::collections::{HashMap, HashSet};
use std::ops::Range;

use tree_sitter::{InputEdit, Node, Point, QueryCursor, StreamingIterator, Tree};

use super::query::{self, ContextQueries, UseQuery};
use super::Language;

/// Another open document, searched for type definitions.
#[derive(Clone, Copy)]
pub struct OpenDocument<'a> {
    /// Shown to the model next to what is taken from it (a path or URI).
    pub path: &'a str,
    pub text: &'a str,
    pub tree: &'a Tree,
    pub language: Language,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CursorKind {
    Code,
    Comment,
    String,
}

impl CursorKind {
    /// `code`, `comment` or `string`.
    pub fn name(self) -> &'static str {
        match self {
            CursorKind::Code => "code",
            CursorKind::Comment => "comment",
            CursorKind::String => "string",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScopeKind {
    /// `@scope.function`: a function, method or named closure.
    Function,
    /// `@scope.class`: a class, impl, trait, interface and the like.
    Class,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    pub kind: ScopeKind,
    /// The scope's text up to its body, trailing whitespace removed (clipped).
    pub signature_text: String,
    pub byte_range: Range<usize>,
    /// Where the body starts (`{`, or Python's indented block); `None` for a declaration
    /// without one.
    pub body_start: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeDef {
    pub name: String,
    /// The definition's text, clipped at a line boundary to [`Limits::type_def_chars`].
    pub text: String,
    pub truncated: bool,
    /// `None` for the document being completed, else the [`OpenDocument::path`].
    pub source_path: Option<String>,
    /// Where the definition is in its own document.
    pub byte_range: Range<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Context {
    pub cursor_kind: CursorKind,
    /// Outermost first, innermost last.
    pub enclosing_scopes: Vec<Scope>,
    /// Functions defined before the cursor in the same scope as the cursor's function
    /// (source order, the nearest [`Limits::signatures`]), then the enclosing functions'
    /// own signatures, outermost first.
    pub signatures: Vec<Scope>,
    /// Types whose name appears within [`Limits::window_lines`] of the cursor line: this
    /// document's first (source order), then the other documents' (in the order given).
    /// A type whose definition contains the cursor is left out, and so are types defined
    /// inside function bodies.
    pub type_definitions: Vec<TypeDef>,
    /// Import statements of this document, in source order (those inside function bodies
    /// are left out).
    pub imports: Vec<String>,
    /// Leading spaces and tabs of the cursor line, exactly.
    pub indent: String,
    /// The cursor line before the cursor (its last [`Limits::line_part_chars`] chars).
    pub line_prefix: String,
    /// The cursor line after the cursor, without the line break (its first
    /// [`Limits::line_part_chars`] chars).
    pub line_suffix: String,
}

/// Caps on what [`extract`] returns and how far it looks. Sizes are in characters.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Lines above and below the cursor line searched for type names.
    pub window_lines: usize,
    /// Lines above the cursor searched for sibling functions.
    pub sibling_window_lines: usize,
    pub signatures: usize,
    pub signature_chars: usize,
    pub type_defs: usize,
    pub type_def_chars: usize,
    pub type_defs_total_chars: usize,
    pub imports: usize,
    pub import_chars: usize,
    pub imports_total_chars: usize,
    pub line_part_chars: usize,
    /// Other documents searched (the first ones given).
    pub other_documents: usize,
    /// Deepest node (root = 0) at which types and imports are looked for.
    pub outline_depth: u32,
    /// Most nodes visited per document when looking for types and imports.
    pub outline_nodes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            window_lines: 30,
            sibling_window_lines: 400,
            signatures: 8,
            signature_chars: 400,
            type_defs: 8,
            type_def_chars: 1_500,
            type_defs_total_chars: 6_000,
            imports: 60,
            import_chars: 400,
            imports_total_chars: 4_000,
            line_part_chars: 1_000,
            other_documents: 16,
            outline_depth: 12,
            outline_nodes: 100_000,
        }
    }
}

/// [`extract_with_limits`] with the default [`Limits`].
pub fn extract(
    language: Language,
    text: &str,
    tree: &Tree,
    cursor_byte: usize,
    other_docs: &[OpenDocument<'_>],
) -> Context {
    extract_with_limits(language, text, tree, cursor_byte, other_docs, &Limits::default())
}

/// The context at `cursor_byte` in `text` (parsed as `tree`). A cursor past the end or
/// inside a UTF-8 sequence is moved back to the previous character boundary; the
/// document layer only hands out valid offsets, so this is a guard, not a feature.
pub fn extract_with_limits(
    language: Language,
    text: &str,
    tree: &Tree,
    cursor_byte: usize,
    other_docs: &[OpenDocument<'_>],
    limits: &Limits,
) -> Context {
    let cursor = floor_char_boundary(text, cursor_byte);
    let line = LineAt::new(text, cursor);
    let mut cx = Context {
        cursor_kind: CursorKind::Code,
        enclosing_scopes: Vec::new(),
        signatures: Vec::new(),
        type_definitions: Vec::new(),
        imports: Vec::new(),
        indent: line.indent(text).to_owned(),
        line_prefix: clip_tail(&text[line.start..cursor], limits.line_part_chars).to_owned(),
        line_suffix: clip_chars(&text[cursor..line.end], limits.line_part_chars)
            .0
            .to_owned(),
    };
    // A query that fails to compile is a bug caught by `every_context_query_compiles`;
    // at run time the context then degrades to the text-only fields.
    let Ok(queries) = language.context_queries() else {
        return cx;
    };
    let root = tree.root_node();
    let bytes = text.as_bytes();

    cx.cursor_kind = match cursor_kind(&queries.cursor, language, root, text, cursor) {
        CursorKind::Code => lexical_cursor_kind_in_error(language, root, text, cursor),
        kind => kind,
    };

    let mut enclosing = enclosing_scopes(&queries.scopes, language, root, text, cursor, &line);
    if in_error(root, text, cursor) {
        if let Some(repaired) = repaired_scopes(
            &queries.scopes,
            language,
            text,
            tree,
            cursor,
            &line,
            enclosing.len(),
        ) {
            enclosing = repaired;
        }
    }
    cx.signatures = sibling_signatures(&queries.scopes, root, text, cursor, &enclosing, limits);
    cx.signatures.extend(
        enclosing
            .iter()
            .filter(|s| s.kind == ScopeKind::Function)
            .map(|s| scope(text, s, limits)),
    );
    cx.enclosing_scopes = enclosing.iter().map(|s| scope(text, s, limits)).collect();

    // The definitions the cursor is inside of are in the prompt already.
    let around_cursor: Vec<Range<usize>> = enclosing.iter().map(|s| s.range.clone()).collect();
    let mut types = TypeCollector {
        names: identifiers_near(text, cursor, limits.window_lines),
        seen: HashSet::new(),
        budget: limits.type_defs_total_chars,
        out: Vec::new(),
        limits,
    };
    let this = outline(queries, root, bytes, limits, true);
    types.collect(this.types, bytes, None, Some(cursor), &around_cursor);
    for doc in other_docs.iter().take(limits.other_documents) {
        let Ok(q) = doc.language.context_queries() else {
            continue;
        };
        let (text, root) = (doc.text.as_bytes(), doc.tree.root_node());
        types.collect(
            outline(q, root, text, limits, false).types,
            text,
            Some(doc.path),
            None,
            &[],
        );
    }
    cx.type_definitions = types.out;
    cx.imports = import_texts(this.imports, text, limits);
    cx
}

/// The cursor line: `start..end` excludes the line break (`\n` or `\r\n`).
struct LineAt {
    start: usize,
    end: usize,
}

impl LineAt {
    fn new(text: &str, cursor: usize) -> Self {
        let start = text[..cursor].rfind('\n').map_or(0, |i| i + 1);
        let mut end = text[cursor..].find('\n').map_or(text.len(), |i| cursor + i);
        if end > cursor && text.as_bytes()[end - 1] == b'\r' && end < text.len() {
            end -= 1;
        }
        LineAt { start, end }
    }

    fn indent<'t>(&self, text: &'t str) -> &'t str {
        leading_whitespace(&text[self.start..self.end])
    }
}

fn leading_whitespace(line: &str) -> &str {
    let n = line.len() - line.trim_start_matches([' ', '\t']).len();
    &line[..n]
}

/// The spaces and tabs between the start of `at`'s line and `at`, when nothing else stands
/// there (else empty): the indentation of a definition that starts its line.
pub fn indent_before(text: &str, at: usize) -> &str {
    let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let before = &text[line_start..at];
    if before.trim().is_empty() {
        before
    } else {
        ""
    }
}

/// Indentation of the line holding byte `at`.
fn indent_at(text: &str, at: usize) -> &str {
    let start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let end = text[start..].find('\n').map_or(text.len(), |i| start + i);
    leading_whitespace(&text[start..end])
}

fn cursor_kind(q: &UseQuery, language: Language, root: Node, text: &str, cursor: usize) -> CursorKind {
    let (comment, string, interpolation) = (
        q.capture(query::COMMENT),
        q.capture(query::STRING),
        q.capture(query::STRING_INTERPOLATION),
    );
    let mut qc = QueryCursor::new();
    qc.set_byte_range(cursor.saturating_sub(1)..(cursor + 1).min(text.len()));
    let mut matches = qc.matches(&q.query, root, text.as_bytes());
    let mut best: Option<(usize, CursorKind)> = None;
    while let Some(m) = matches.next() {
        for cap in m.captures {
            let idx = Some(cap.index);
            let node = cap.node;
            let kind = if idx == comment {
                if !comment_contains(language, text, node, cursor) {
                    continue;
                }
                CursorKind::Comment
            } else if idx == string {
                if !string_contains(node, cursor) {
                    continue;
                }
                CursorKind::String
            } else if idx == interpolation {
                if !(node.start_byte() < cursor && cursor < node.end_byte()) {
                    continue;
                }
                CursorKind::Code
            } else {
                continue;
            };
            // The innermost node decides: code inside `${…}` inside a string is code.
            let len = node.end_byte() - node.start_byte();
            if best.is_none_or(|(l, _)| len <= l) {
                best = Some((len, kind));
            }
        }
    }
    best.map_or(CursorKind::Code, |(_, k)| k)
}

/// Where the parser gave up around the cursor (a string or comment still being typed is
/// usually an `ERROR`, not a string), read the text the way a lexer would: from the start
/// of the top-level node holding the cursor (at most [`LEXICAL_SCAN_BYTES`] back, else from
/// the cursor line), with the table's comment and string delimiters. Code that parsed
/// without errors never gets here.
fn lexical_cursor_kind_in_error(language: Language, root: Node, text: &str, cursor: usize) -> CursorKind {
    let Some(top) = top_level_node_before(root, cursor) else {
        return CursorKind::Code;
    };
    if !top.has_error() {
        return CursorKind::Code;
    }
    let line_start = text[..cursor].rfind('\n').map_or(0, |i| i + 1);
    let start = if cursor - top.start_byte() <= LEXICAL_SCAN_BYTES {
        top.start_byte()
    } else {
        line_start
    };
    lex_kind_at(language, &text[start..cursor])
}

/// How far back [`lexical_cursor_kind_in_error`] reads.
const LEXICAL_SCAN_BYTES: usize = 64 * 1024;

/// The child of `root` holding `cursor`, or the last one before it.
fn top_level_node_before(root: Node, cursor: usize) -> Option<Node> {
    let mut c = root.walk();
    let i = c.goto_first_child_for_byte(cursor);
    let node = c.node();
    match i {
        Some(_) if node.start_byte() < cursor => Some(node),
        Some(_) => node.prev_sibling(),
        None => root.child(root.child_count().checked_sub(1)?),
    }
}

/// The kind of the position at the end of `text`, reading `text` as a lexer would.
fn lex_kind_at(language: Language, text: &str) -> CursorKind {
    enum State {
        Code,
        LineComment,
        BlockComment(&'static str),
        String { close: &'static str, multiline: bool },
    }
    let config = language.config();
    let mut delimiters: Vec<(&'static str, bool)> = (config.line_strings.iter().map(|d| (*d, false)))
        .chain(config.multiline_strings.iter().map(|d| (*d, true)))
        .collect();
    delimiters.sort_by_key(|(d, _)| std::cmp::Reverse(d.len()));
    let mut state = State::Code;
    let mut i = 0;
    while i < text.len() {
        let rest = &text[i..];
        let step = rest.chars().next().map_or(1, char::len_utf8);
        state = match state {
            State::Code => {
                if let Some(open) = config.line_comment.filter(|t| rest.starts_with(*t)) {
                    i += open.len();
                    State::LineComment
                } else if let Some((open, close)) = config.block_comment.filter(|(o, _)| rest.starts_with(*o))
                {
                    i += open.len();
                    State::BlockComment(close)
                } else if let Some(&(d, multiline)) = delimiters.iter().find(|(d, _)| rest.starts_with(*d)) {
                    i += d.len();
                    State::String { close: d, multiline }
                } else {
                    i += step;
                    State::Code
                }
            }
            State::LineComment if rest.starts_with('\n') => {
                i += 1;
                State::Code
            }
            State::BlockComment(close) if rest.starts_with(close) => {
                i += close.len();
                State::Code
            }
            State::String { close, multiline } => {
                if let Some(escaped) = rest.strip_prefix('\\') {
                    i += 1 + escaped.chars().next().map_or(0, char::len_utf8);
                    State::String { close, multiline }
                } else if rest.starts_with(close) {
                    i += close.len();
                    State::Code
                } else if rest.starts_with('\n') && !multiline {
                    i += 1;
                    State::Code
                } else {
                    i += step;
                    State::String { close, multiline }
                }
            }
            other => {
                i += step;
                other
            }
        };
    }
    match state {
        State::Code => CursorKind::Code,
        State::LineComment | State::BlockComment(_) => CursorKind::Comment,
        State::String { .. } => CursorKind::String,
    }
}

/// Inside a comment: after its first byte and up to its end, but not after a closing
/// `*/` (a trailing line break, which some grammars include in line comments, is not
/// part of the comment either).
fn comment_contains(language: Language, text: &str, node: Node, cursor: usize) -> bool {
    let body = &text[node.start_byte()..node.end_byte()];
    let end = node.start_byte() + body.trim_end_matches(['\n', '\r']).len();
    if !(node.start_byte() < cursor && cursor <= end) {
        return false;
    }
    let closed = language
        .config()
        .block_comment
        .is_some_and(|(open, close)| body.starts_with(open) && body.trim_end().ends_with(close));
    cursor < end || !closed
}

/// Inside a string: strictly between its delimiters, or at the end of one whose closing
/// delimiter is missing (the user is still typing it).
fn string_contains(node: Node, cursor: usize) -> bool {
    if node.start_byte() < cursor && cursor < node.end_byte() {
        return true;
    }
    cursor == node.end_byte()
        && cursor > node.start_byte()
        && (node.is_missing()
            || node
                .child(node.child_count().saturating_sub(1))
                .is_some_and(|c| c.is_missing()))
}

/// A `@scope.*` match.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ScopeHit {
    kind: ScopeKind,
    range: Range<usize>,
    body_start: Option<usize>,
}

impl ScopeHit {
    fn strictly_contains(&self, other: &ScopeHit) -> bool {
        self.range.start <= other.range.start
            && other.range.end <= self.range.end
            && self.range != other.range
    }
}

/// Every `@scope.*` whose node starts matching within `range`, deduplicated, in
/// document order.
fn scope_hits(q: &UseQuery, root: Node, text: &str, range: Range<usize>) -> Vec<ScopeHit> {
    let (function, class, body) = (
        q.capture(query::SCOPE_FUNCTION),
        q.capture(query::SCOPE_CLASS),
        q.capture(query::BODY),
    );
    let mut qc = QueryCursor::new();
    qc.set_byte_range(range);
    let mut matches = qc.matches(&q.query, root, text.as_bytes());
    let mut hits: Vec<ScopeHit> = Vec::new();
    while let Some(m) = matches.next() {
        let mut hit: Option<ScopeHit> = None;
        let mut body_start = None;
        for cap in m.captures {
            let idx = Some(cap.index);
            if idx == function || idx == class {
                let kind = if idx == function {
                    ScopeKind::Function
                } else {
                    ScopeKind::Class
                };
                hit = Some(ScopeHit {
                    kind,
                    range: cap.node.byte_range(),
                    body_start: None,
                });
            } else if idx == body {
                body_start = Some(cap.node.start_byte());
            }
        }
        if let Some(mut hit) = hit {
            hit.body_start = body_start.filter(|b| hit.range.contains(b));
            if !hits.contains(&hit) {
                hits.push(hit);
            }
        }
    }
    hits.sort_by_key(|h| (h.range.start, std::cmp::Reverse(h.range.end)));
    hits
}

fn enclosing_scopes(
    q: &UseQuery,
    language: Language,
    root: Node,
    text: &str,
    cursor: usize,
    line: &LineAt,
) -> Vec<ScopeHit> {
    // Reach back over whitespace so that, in an offside-rule language, a block that ended
    // on an earlier line is still found when the cursor sits indented below it.
    let anchor = text[..cursor]
        .trim_end()
        .len()
        .saturating_sub(1)
        .min(cursor.saturating_sub(1));
    let end = (cursor + 1).min(text.len());
    let offside = language.config().offside_rule;
    let cursor_indent = line.indent(text).len();
    scope_hits(q, root, text, anchor..end)
        .into_iter()
        .filter(|s| {
            if s.range.start < cursor && cursor < s.range.end {
                return true;
            }
            offside
                && s.range.start < cursor
                && s.range.end <= cursor
                && (s.range.end == cursor
                    || (text[s.range.end..cursor].trim().is_empty()
                        && text[s.range.end..cursor].contains('\n')
                        && cursor_indent > indent_at(text, s.range.start).len()))
        })
        .collect()
}

/// Whether the parser recovered from an error around the cursor: the node just before it
/// lies inside an `ERROR` node.
fn in_error(root: Node, text: &str, cursor: usize) -> bool {
    if !root.has_error() {
        return false;
    }
    let anchor = text[..cursor].trim_end().len().saturating_sub(1);
    let mut node = root.descendant_for_byte_range(anchor, anchor);
    while let Some(n) = node {
        if n.is_error() {
            return true;
        }
        node = n.parent();
    }
    false
}

/// The enclosing scopes of half-typed code: the text is parsed again with each of the
/// language's [`repair_fillers`](super::LanguageConfig::repair_fillers) inserted at the
/// cursor. A parse with no error at the cursor that finds at least the `found` scopes of the
/// original beats one that only finds more; the first best filler wins. Its ranges are mapped
/// back to the original text (offsets past the cursor move back by the filler's length;
/// offsets inside the filler become the cursor).
#[allow(clippy::too_many_arguments)]
fn repaired_scopes(
    q: &UseQuery,
    language: Language,
    text: &str,
    tree: &Tree,
    cursor: usize,
    line: &LineAt,
    found: usize,
) -> Option<Vec<ScopeHit>> {
    let mut best: Option<Vec<ScopeHit>> = None;
    // (no error at the cursor, scopes found) of the parse to beat.
    let mut best_score = (false, found);
    let at = Point {
        row: text[..cursor].matches('\n').count(),
        column: cursor - line.start,
    };
    for filler in language.config().repair_fillers {
        let fixed = format!("{}{filler}{}", &text[..cursor], &text[cursor..]);
        // The filler is an insertion at the cursor (no line break): the document's tree,
        // edited to match, lets tree-sitter reparse only around it.
        let mut edited = tree.clone();
        edited.edit(&InputEdit {
            start_byte: cursor,
            old_end_byte: cursor,
            new_end_byte: cursor + filler.len(),
            start_position: at,
            old_end_position: at,
            new_end_position: Point {
                column: at.column + filler.len(),
                ..at
            },
        });
        let Some(tree) = super::parse(language, &fixed, Some(&edited)) else {
            continue;
        };
        // The cursor line of `fixed`: the filler sits inside it, so its end moves by the
        // filler's length (the original end can fall inside a character of `fixed`).
        let fixed_line = LineAt {
            start: line.start,
            end: line.end + filler.len(),
        };
        let hits = enclosing_scopes(q, language, tree.root_node(), &fixed, cursor, &fixed_line);
        let score = (!in_error(tree.root_node(), &fixed, cursor), hits.len());
        let better = if score.0 {
            score.1 >= found
        } else {
            score.1 > found
        };
        if !better || score <= best_score {
            continue;
        }
        let back = |o: usize| {
            if o <= cursor {
                o
            } else {
                o.saturating_sub(filler.len()).max(cursor)
            }
        };
        best_score = score;
        best = Some(
            hits.into_iter()
                .map(|h| ScopeHit {
                    kind: h.kind,
                    range: back(h.range.start)..back(h.range.end),
                    body_start: h.body_start.map(back),
                })
                .collect(),
        );
    }
    best
}

/// Functions defined before the cursor directly in the scope that holds the cursor's
/// function (or the cursor itself, when it is not in a function).
fn sibling_signatures(
    q: &UseQuery,
    root: Node,
    text: &str,
    cursor: usize,
    enclosing: &[ScopeHit],
    limits: &Limits,
) -> Vec<Scope> {
    let container = match enclosing.last() {
        Some(s) if s.kind == ScopeKind::Function => {
            enclosing.len().checked_sub(2).and_then(|i| enclosing.get(i))
        }
        other => other,
    };
    let window_start = nth_line_start_before(text, cursor, limits.sibling_window_lines);
    let start = container
        .map_or(0, |c| c.body_start.unwrap_or(c.range.start))
        .max(window_start);
    if start >= cursor {
        return Vec::new();
    }
    let hits = scope_hits(q, root, text, start..cursor);
    let mut siblings: Vec<&ScopeHit> = hits
        .iter()
        .filter(|f| {
            f.kind == ScopeKind::Function
                && f.range.start >= start
                && f.range.end <= cursor
                && !enclosing.contains(f)
        })
        .filter(|f| {
            let parent = hits
                .iter()
                .filter(|h| h.strictly_contains(f))
                .max_by_key(|h| h.range.start);
            match (parent, container) {
                (None, None) => true,
                (Some(p), Some(c)) => p.range == c.range,
                _ => false,
            }
        })
        .collect();
    let skip = siblings.len().saturating_sub(limits.signatures);
    siblings.drain(..skip);
    siblings.into_iter().map(|s| scope(text, s, limits)).collect()
}

fn scope(text: &str, s: &ScopeHit, limits: &Limits) -> Scope {
    Scope {
        kind: s.kind,
        signature_text: signature(text, s, limits),
        byte_range: s.range.clone(),
        body_start: s.body_start,
    }
}

/// A scope's text up to its body (whole lines of it within [`Limits::signature_chars`]);
/// without a body, its first line. A signature over several
/// lines is dedented by its first line's indentation, so its continuation lines keep their
/// place relative to its start (`fn f(` then `    a: u8,`), as the first line has none.
fn signature(text: &str, s: &ScopeHit, limits: &Limits) -> String {
    let node_text = &text[s.range.clone()];
    let head = match s.body_start {
        Some(b) => &text[s.range.start..b],
        None => node_text.lines().next().unwrap_or(""),
    };
    let indent = indent_before(text, s.range.start);
    let head = head.trim_end();
    // A long signature keeps its whole lines (a line cut in the middle reads as code).
    let clipped = clip_lines(head, limits.signature_chars).0.trim_end();
    if indent.is_empty() || !clipped.contains('\n') {
        return clipped.to_owned();
    }
    clipped
        .split('\n')
        .map(|line| line.strip_prefix(indent).unwrap_or(line))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Byte offset of the start of the line `n` lines above the cursor line (or 0).
fn nth_line_start_before(text: &str, cursor: usize, n: usize) -> usize {
    let mut newlines = 0;
    for (i, b) in text.as_bytes()[..cursor].iter().enumerate().rev() {
        if *b == b'\n' {
            if newlines == n {
                return i + 1;
            }
            newlines += 1;
        }
    }
    0
}

/// Identifier-like words within `lines` lines of the cursor line: for each, how often it
/// occurs and the byte offset of its first occurrence.
fn identifiers_near(text: &str, cursor: usize, lines: usize) -> HashMap<&str, (usize, usize)> {
    let start = nth_line_start_before(text, cursor, lines);
    let mut end = cursor;
    let mut newlines = 0;
    for b in text.as_bytes()[cursor..].iter() {
        if *b == b'\n' {
            if newlines == lines {
                break;
            }
            newlines += 1;
        }
        end += 1;
    }
    let mut words: HashMap<&str, (usize, usize)> = HashMap::new();
    let window = &text[start..end];
    let is_word = |c: char| c.is_alphanumeric() || c == '_' || c == '$';
    let mut word_start = None;
    for (i, c) in window.char_indices().chain(std::iter::once((window.len(), ' '))) {
        match (word_start, is_word(c)) {
            (None, true) => word_start = Some(i),
            (Some(s), false) => {
                let word = &window[s..i];
                if !word.starts_with(|c: char| c.is_ascii_digit()) {
                    words.entry(word).or_insert((0, start + s)).0 += 1;
                }
                word_start = None;
            }
            _ => {}
        }
    }
    words
}

/// Gathers the definitions of the types named near the cursor, within the caps.
struct TypeCollector<'n, 'l> {
    /// Words near the cursor: how often each occurs there, and the first's byte offset.
    names: HashMap<&'n str, (usize, usize)>,
    /// Names already taken: the first definition of a name wins.
    seen: HashSet<String>,
    /// Characters left for definition texts.
    budget: usize,
    out: Vec<TypeDef>,
    limits: &'l Limits,
}

impl TypeCollector<'_, '_> {
    /// Adds the wanted definitions among `found` ((definition, name) nodes of one
    /// document). A definition whose name is not near the cursor (in this document: not
    /// counting the name in the definition itself), that contains the cursor, is one of
    /// `skip`, or lies inside a definition already taken whole from the same document,
    /// adds nothing.
    fn collect(
        &mut self,
        found: Vec<(Node, Node)>,
        bytes: &[u8],
        source_path: Option<&str>,
        cursor: Option<usize>,
        skip: &[Range<usize>],
    ) {
        let mut found: Vec<(Node, &str)> = found
            .into_iter()
            .filter_map(|(def_node, name_node)| {
                let name = name_node.utf8_text(bytes).ok()?;
                let (count, first) = *self.names.get(name)?;
                let wanted = cursor.is_none() || count > 1 || first != name_node.start_byte();
                wanted.then_some((def_node, name))
            })
            .collect();
        // Outer definitions first: a match completes (and so arrives) after the matches
        // nested in it, an inner struct before its typedef.
        found.sort_by_key(|(n, _)| (n.start_byte(), std::cmp::Reverse(n.end_byte())));

        let first_of_document = self.out.len();
        for (def_node, name) in found {
            if self.out.len() >= self.limits.type_defs || self.budget == 0 {
                return;
            }
            let range = def_node.byte_range();
            let inside_taken = self.out[first_of_document..]
                .iter()
                .any(|t| !t.truncated && t.byte_range.start <= range.start && range.end <= t.byte_range.end);
            if self.seen.contains(name)
                || inside_taken
                || skip.contains(&range)
                || cursor.is_some_and(|c| range.start < c && c < range.end)
            {
                continue;
            }
            let Ok(full) = def_node.utf8_text(bytes) else {
                continue;
            };
            let (text, truncated) = clip_lines(full, self.limits.type_def_chars.min(self.budget));
            if text.is_empty() {
                continue;
            }
            self.budget -= text.chars().count();
            self.seen.insert(name.to_owned());
            self.out.push(TypeDef {
                name: name.to_owned(),
                text: text.to_owned(),
                truncated,
                source_path: source_path.map(str::to_owned),
                byte_range: range,
            });
        }
    }
}

/// What one walk over a document's outline found.
struct Outline<'t> {
    /// (`@definition.type`, `@name`) nodes.
    types: Vec<(Node<'t>, Node<'t>)>,
    /// `@import` ranges, in document order.
    imports: Vec<Range<usize>>,
}

/// Matches the type and (if `with_imports`) import patterns at every node of the outline:
/// everywhere except inside functions (kinds in `function_roots`). Types and imports live
/// at the top, in namespaces, modules and classes; skipping function bodies — most of a
/// file — keeps this cheap, and each query runs only at the node kinds its patterns start
/// at. Bounded by [`Limits::outline_depth`] and [`Limits::outline_nodes`] against
/// pathological files (a huge literal at top level).
fn outline<'t>(
    q: &ContextQueries,
    root: Node<'t>,
    bytes: &[u8],
    limits: &Limits,
    with_imports: bool,
) -> Outline<'t> {
    let mut out = Outline {
        types: Vec::new(),
        imports: Vec::new(),
    };
    let (def, name, import) = (
        q.types.capture(query::DEFINITION_TYPE),
        q.types.capture(query::NAME),
        q.imports.capture(query::IMPORT),
    );
    let mut qc = QueryCursor::new();
    qc.set_max_start_depth(Some(0));
    let mut cursor = root.walk();
    let mut depth = 0u32;
    let mut visited = 0usize;
    loop {
        let node = cursor.node();
        let kind = node.kind_id();
        if let (Some(def), Some(name), true) = (def, name, q.types.roots.contains(kind)) {
            let mut matches = qc.matches(&q.types.query, node, bytes);
            while let Some(m) = matches.next() {
                let node_of = |idx| m.captures.iter().find(|c| c.index == idx).map(|c| c.node);
                if let (Some(d), Some(n)) = (node_of(def), node_of(name)) {
                    out.types.push((d, n));
                }
            }
        }
        if let Some(import) = import.filter(|_| with_imports && q.imports.roots.contains(kind)) {
            let mut matches = qc.matches(&q.imports.query, node, bytes);
            while let Some(m) = matches.next() {
                let ranges = m
                    .captures
                    .iter()
                    .filter(|c| c.index == import)
                    .map(|c| c.node.byte_range());
                out.imports.extend(ranges);
            }
        }
        visited += 1;
        if visited >= limits.outline_nodes {
            break;
        }
        let descend = !q.function_roots.contains(kind) && depth < limits.outline_depth;
        if descend && cursor.goto_first_child() {
            depth += 1;
            continue;
        }
        while !cursor.goto_next_sibling() {
            if !cursor.goto_parent() {
                out.imports.dedup();
                return out;
            }
            depth -= 1;
        }
    }
    out.imports.dedup();
    out
}

/// The import statements' texts, within the caps.
fn import_texts(ranges: Vec<Range<usize>>, text: &str, limits: &Limits) -> Vec<String> {
    let mut out = Vec::new();
    let mut budget = limits.imports_total_chars;
    for range in ranges.into_iter().take(limits.imports) {
        let (clipped, _) = clip_lines(text[range].trim_end(), limits.import_chars.min(budget));
        if clipped.is_empty() {
            break;
        }
        budget -= clipped.chars().count();
        out.push(clipped.to_owned());
    }
    out
}

/// The largest char boundary of `text` at or before byte `at` (at most its length).
pub(crate) fn floor_char_boundary(text: &str, at: usize) -> usize {
    let mut at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// The first `max` characters of `s`, and whether anything was cut.
fn clip_chars(s: &str, max: usize) -> (&str, bool) {
    match s.char_indices().nth(max) {
        Some((i, _)) => (&s[..i], true),
        None => (s, false),
    }
}

/// The last `max` characters of `s`.
fn clip_tail(s: &str, max: usize) -> &str {
    if max == 0 {
        return "";
    }
    match s.char_indices().rev().nth(max - 1) {
        Some((i, _)) => &s[i..],
        None => s,
    }
}

/// The whole lines of `s` that fit in `max` characters (the first line clipped by
/// characters if even it does not fit), and whether anything was cut.
fn clip_lines(s: &str, max: usize) -> (&str, bool) {
    let (clipped, cut) = clip_chars(s, max);
    if !cut {
        return (s, false);
    }
    match clipped.rfind('\n') {
        Some(i) => (clipped[..i].trim_end_matches('\r'), true),
        None => (clipped, true),
    }
}
