//! `queries/<lang>/context.scm`, compiled once per use.
//!
//! One file holds every pattern; it is compiled once per use (cursor kind, scopes, type
//! definitions, imports) with the other uses' patterns disabled, so each use can limit its
//! search (a byte range around the cursor, a start depth) without the others' patterns
//! doing work. The capture names are documented in `queries/README.md`.

use tree_sitter::{CaptureQuantifier, Query, QueryError};

pub const SCOPE_FUNCTION: &str = "scope.function";
pub const SCOPE_CLASS: &str = "scope.class";
pub const BODY: &str = "body";
pub const DEFINITION_TYPE: &str = "definition.type";
pub const NAME: &str = "name";
pub const IMPORT: &str = "import";
pub const COMMENT: &str = "comment";
pub const STRING: &str = "string";
pub const STRING_INTERPOLATION: &str = "string.interpolation";

/// Every capture name a `context.scm` may use.
pub const CAPTURE_NAMES: &[&str] = &[
    SCOPE_FUNCTION,
    SCOPE_CLASS,
    BODY,
    DEFINITION_TYPE,
    NAME,
    IMPORT,
    COMMENT,
    STRING,
    STRING_INTERPOLATION,
];

/// A query restricted to the patterns of one use, with the indices of its captures.
pub struct UseQuery {
    pub query: Query,
    captures: Vec<Option<u32>>,
}

impl UseQuery {
    /// The index of capture `name`, if this use's patterns have it.
    pub fn capture(&self, name: &str) -> Option<u32> {
        let i = CAPTURE_NAMES.iter().position(|n| *n == name)?;
        self.captures[i]
    }
}

/// The compiled `context.scm` of one language.
pub struct ContextQueries {
    /// `@comment`, `@string`, `@string.interpolation`.
    pub cursor: UseQuery,
    /// `@scope.function`, `@scope.class`, `@body`.
    pub scopes: UseQuery,
    /// `@definition.type`, `@name`.
    pub types: UseQuery,
    /// `@import`.
    pub imports: UseQuery,
}

impl ContextQueries {
    pub fn new(language: &tree_sitter::Language, source: &str) -> Result<Self, QueryError> {
        let check = Query::new(language, source)?;
        if let Some(unknown) = check.capture_names().iter().find(|n| !CAPTURE_NAMES.contains(n)) {
            return Err(QueryError {
                row: 0,
                column: 0,
                offset: 0,
                message: format!("unknown capture name @{unknown} (see queries/README.md)"),
                kind: tree_sitter::QueryErrorKind::Capture,
            });
        }
        let build = |keys: &[&str]| -> Result<UseQuery, QueryError> {
            let mut query = Query::new(language, source)?;
            let key_indices: Vec<u32> =
                keys.iter().filter_map(|k| query.capture_index_for_name(k)).collect();
            for pattern in 0..query.pattern_count() {
                let quantifiers = query.capture_quantifiers(pattern);
                let used = key_indices
                    .iter()
                    .any(|&i| quantifiers[i as usize] != CaptureQuantifier::Zero);
                if !used {
                    query.disable_pattern(pattern);
                }
            }
            let captures = CAPTURE_NAMES.iter().map(|n| query.capture_index_for_name(n)).collect();
            Ok(UseQuery { query, captures })
        };
        Ok(ContextQueries {
            cursor: build(&[COMMENT, STRING, STRING_INTERPOLATION])?,
            scopes: build(&[SCOPE_FUNCTION, SCOPE_CLASS])?,
            types: build(&[DEFINITION_TYPE])?,
            imports: build(&[IMPORT])?,
        })
    }
}
