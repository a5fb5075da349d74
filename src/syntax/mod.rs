//! Syntax: the languages table (`languages`), tree-sitter parsing and the context at a cursor
//! (`context`: cursor kind, enclosing scopes and signatures, types referenced near the cursor,
//! imports, indentation). Where the parser recovered from an error at the cursor (half-typed
//! code), the text is parsed again with a filler from the language's row (`pass`, `;`, `}`…)
//! at the cursor to find the scopes.
//!
//! Boundary: works on text (`&str` or a rope) plus a `tree_sitter::Tree`, in byte
//! offsets. It knows nothing of documents, versions, URIs or LSP; `document` calls in here
//! to keep its tree current, never the other way round.
//!
//! Invariant: language differences are data — a row in [`languages::LANGUAGES`] and a
//! `queries/<lang>/context.scm` using the capture names of `queries/README.md`. Adding a
//! language is a grammar crate, a row and a query file.

pub mod context;
pub mod languages;
pub mod query;

#[cfg(test)]
mod tests;

use std::cell::RefCell;

use tree_sitter::{Parser, Tree};

pub use context::{
    extract, extract_with_limits, indent_before, Context, CursorKind, Limits, OpenDocument, Scope, ScopeKind,
    TypeDef,
};
pub use languages::{Language, LanguageConfig, LANGUAGES, MAX_LANGUAGES};

/// Parses `text`. With `old_tree` (already `edit`ed to match `text`) tree-sitter reuses
/// the unchanged parts. `None` only if tree-sitter refuses the grammar (an ABI mismatch).
pub fn parse(language: Language, text: &str, old_tree: Option<&Tree>) -> Option<Tree> {
    with_parser(language, |parser| parser.parse(text, old_tree))
}

/// Like [`parse`], reading the rope chunk by chunk instead of copying it into a string.
pub fn parse_rope(language: Language, rope: &ropey::Rope, old_tree: Option<&Tree>) -> Option<Tree> {
    let len = rope.len_bytes();
    let mut read = |offset: usize, _: tree_sitter::Point| -> &[u8] {
        if offset >= len {
            return &[];
        }
        let (chunk, chunk_start, _, _) = rope.chunk_at_byte(offset);
        &chunk.as_bytes()[offset - chunk_start..]
    };
    with_parser(language, |parser| {
        parser.parse_with_options(&mut read, old_tree, None)
    })
}

/// One parser per thread, re-pointed at the language each call (that costs nothing).
fn with_parser<R>(language: Language, f: impl FnOnce(&mut Parser) -> Option<R>) -> Option<R> {
    thread_local! {
        static PARSER: RefCell<Parser> = RefCell::new(Parser::new());
    }
    PARSER.with(|parser| {
        let mut parser = parser.borrow_mut();
        parser.set_language(language.ts_language()).ok()?;
        f(&mut parser)
    })
}
