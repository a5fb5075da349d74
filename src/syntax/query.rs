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
    /// The node kinds this use's patterns can start at.
    pub roots: KindSet,
}

impl UseQuery {
    /// The index of capture `name`, if this use's patterns have it.
    pub fn capture(&self, name: &str) -> Option<u32> {
        let i = CAPTURE_NAMES.iter().position(|n| *n == name)?;
        self.captures[i]
    }
}

/// A set of node kinds of one grammar, by kind id.
pub struct KindSet {
    ids: Vec<bool>,
    any: bool,
}

impl KindSet {
    /// Whether the patterns can start at any node (so the set prunes nothing).
    pub fn is_any(&self) -> bool {
        self.any
    }

    pub fn contains(&self, kind_id: u16) -> bool {
        self.any || self.ids.get(kind_id as usize).copied().unwrap_or(false)
    }

    /// The kinds the given patterns of `query` can start at, read off their source text.
    fn of_patterns(
        language: &tree_sitter::Language,
        query: &Query,
        source: &str,
        patterns: &[usize],
    ) -> Self {
        let mut set = KindSet {
            ids: vec![false; language.node_kind_count()],
            any: false,
        };
        for &p in patterns {
            let text = &source[query.start_byte_for_pattern(p)..query.end_byte_for_pattern(p)];
            match pattern_root_kinds(text) {
                Some(kinds) => {
                    for kind in kinds {
                        // Aliases give one name several ids: take them all.
                        for id in 0..language.node_kind_count() as u16 {
                            if language.node_kind_for_id(id) == Some(kind) {
                                set.ids[id as usize] = true;
                            }
                        }
                    }
                }
                None => set.any = true,
            }
        }
        set
    }
}

/// The node kinds a pattern's root can be: `(kind …)` or `[(a …) (b …)]`. `None` when
/// the pattern can start anywhere (`(_)`, a group of siblings, anything unusual).
fn pattern_root_kinds(pattern: &str) -> Option<Vec<&str>> {
    fn kind_after_paren(rest: &str) -> Option<&str> {
        let rest = rest.trim_start();
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let kind = &rest[..end];
        (!kind.is_empty() && kind != "_").then_some(kind)
    }
    let pattern = pattern.trim_start();
    if let Some(rest) = pattern.strip_prefix('(') {
        return Some(vec![kind_after_paren(rest)?]);
    }
    let inner = pattern.strip_prefix('[')?;
    let mut kinds = Vec::new();
    let mut depth = 0usize;
    let mut chars = inner.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            ';' => {
                chars.by_ref().find(|&(_, c)| c == '\n');
            }
            '"' => {
                let mut escaped = false;
                for (_, c) in chars.by_ref() {
                    if c == '"' && !escaped {
                        break;
                    }
                    escaped = c == '\\' && !escaped;
                }
                if depth == 0 {
                    return None;
                }
            }
            '(' | '[' => {
                if depth == 0 {
                    if c == '[' {
                        return None;
                    }
                    kinds.push(kind_after_paren(&inner[i + 1..])?);
                }
                depth += 1;
            }
            ')' => depth = depth.checked_sub(1)?,
            ']' if depth == 0 => return Some(kinds),
            ']' => depth -= 1,
            _ => {}
        }
    }
    None
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
    /// The node kinds `@scope.function` patterns start at: whole-file searches (types,
    /// imports) do not look inside them.
    pub function_roots: KindSet,
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
        // The patterns that capture any of `keys`.
        let patterns_with = |query: &Query, keys: &[&str]| -> Vec<usize> {
            let key_indices: Vec<u32> = keys
                .iter()
                .filter_map(|k| query.capture_index_for_name(k))
                .collect();
            (0..query.pattern_count())
                .filter(|&p| {
                    let quantifiers = query.capture_quantifiers(p);
                    key_indices
                        .iter()
                        .any(|&i| quantifiers[i as usize] != CaptureQuantifier::Zero)
                })
                .collect()
        };
        let build = |keys: &[&str]| -> Result<UseQuery, QueryError> {
            let mut query = Query::new(language, source)?;
            let used = patterns_with(&query, keys);
            for pattern in 0..query.pattern_count() {
                if !used.contains(&pattern) {
                    query.disable_pattern(pattern);
                }
            }
            let captures = CAPTURE_NAMES
                .iter()
                .map(|n| query.capture_index_for_name(n))
                .collect();
            let roots = KindSet::of_patterns(language, &query, source, &used);
            Ok(UseQuery {
                query,
                captures,
                roots,
            })
        };
        let function_roots = KindSet::of_patterns(
            language,
            &check,
            source,
            &patterns_with(&check, &[SCOPE_FUNCTION]),
        );
        Ok(ContextQueries {
            cursor: build(&[COMMENT, STRING, STRING_INTERPOLATION])?,
            scopes: build(&[SCOPE_FUNCTION, SCOPE_CLASS])?,
            types: build(&[DEFINITION_TYPE])?,
            imports: build(&[IMPORT])?,
            function_roots,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::pattern_root_kinds;

    #[test]
    fn root_kinds_are_read_off_pattern_text() {
        assert_eq!(
            pattern_root_kinds("(function_item\n  body: (_) @body) @scope.function"),
            Some(vec!["function_item"])
        );
        assert_eq!(
            pattern_root_kinds("[\n  ; a comment (not_a_kind)\n  (a body: (_) @b)\n  (b \"(\" (c))\n] @x"),
            Some(vec!["a", "b"])
        );
        assert_eq!(pattern_root_kinds("(_) @x"), None);
        assert_eq!(pattern_root_kinds("((comment) @c . (function_item))"), None);
        assert_eq!(pattern_root_kinds("[\"fn\" \"struct\"] @keyword"), None);
    }
}
