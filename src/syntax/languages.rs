//! The languages laya understands: one row of data per language.
//!
//! Adding a language = a grammar crate, a row in [`LANGUAGES`] and a
//! `queries/<name>/context.scm`. Nothing else in the crate matches on a language.

use std::fmt;
use std::path::Path;
use std::sync::OnceLock;

use super::query::ContextQueries;

/// One language: how editors name it, how files are recognised, its grammar and the
/// text conventions the prompt needs.
pub struct LanguageConfig {
    /// laya's own name; also the folder under `queries/`.
    pub name: &'static str,
    /// LSP `languageId`s (the ones VS Code, Neovim, Helix and Zed send).
    pub language_ids: &'static [&'static str],
    /// File extensions without the dot, lower case.
    pub file_extensions: &'static [&'static str],
    /// The tree-sitter grammar.
    pub grammar: fn() -> tree_sitter::Language,
    pub line_comment: Option<&'static str>,
    pub block_comment: Option<(&'static str, &'static str)>,
    /// String delimiters, for reading a line the parser could not make sense of (a string
    /// or comment still being typed): ones whose strings end at the line's end, and ones
    /// whose strings may span lines.
    pub line_strings: &'static [&'static str],
    pub multiline_strings: &'static [&'static str],
    /// Indentation used when the file itself gives no hint.
    pub indent_unit: &'static str,
    /// Scopes end by dedent (Python) rather than by a closing bracket: a cursor on an
    /// indented line after a block's last statement is still inside the block.
    pub offside_rule: bool,
    /// Text that, inserted at the cursor, completes a statement left unfinished (a loop
    /// without a body): tried in order when the parser recovered from an error, so that the
    /// scopes around half-typed code are still found.
    pub repair_fillers: &'static [&'static str],
    /// The text of `queries/<name>/context.scm`.
    pub context_query: &'static str,
    /// The text of `queries/<name>/definitions.scm`: what the workspace index records.
    pub definitions_query: &'static str,
}

/// The table. Order only matters for lookups: the first row that claims an id or an
/// extension wins.
pub static LANGUAGES: &[LanguageConfig] = &[
    LanguageConfig {
        name: "python",
        language_ids: &["python"],
        file_extensions: &["py", "pyi", "pyw"],
        grammar: || tree_sitter_python::LANGUAGE.into(),
        line_comment: Some("#"),
        block_comment: None,
        line_strings: &["\"", "'"],
        multiline_strings: &["\"\"\"", "'''"],
        indent_unit: "    ",
        offside_rule: true,
        repair_fillers: &["pass", ")", "]", "}"],
        context_query: include_str!("../../queries/python/context.scm"),
        definitions_query: include_str!("../../queries/python/definitions.scm"),
    },
    LanguageConfig {
        name: "rust",
        language_ids: &["rust"],
        file_extensions: &["rs"],
        grammar: || tree_sitter_rust::LANGUAGE.into(),
        line_comment: Some("//"),
        block_comment: Some(("/*", "*/")),
        line_strings: &[],
        multiline_strings: &["\""],
        indent_unit: "    ",
        offside_rule: false,
        repair_fillers: &[";", "{}", "}", ")", ");", ")}"],
        context_query: include_str!("../../queries/rust/context.scm"),
        definitions_query: include_str!("../../queries/rust/definitions.scm"),
    },
    LanguageConfig {
        name: "typescript",
        language_ids: &["typescript"],
        file_extensions: &["ts", "mts", "cts"],
        grammar: || tree_sitter_typescript::LANGUAGE_TYPESCRIPT.into(),
        line_comment: Some("//"),
        block_comment: Some(("/*", "*/")),
        line_strings: &["\"", "'"],
        multiline_strings: &["`"],
        indent_unit: "  ",
        offside_rule: false,
        repair_fillers: &[";", "{}", "}", ")", ");", ")}"],
        context_query: include_str!("../../queries/typescript/context.scm"),
        definitions_query: include_str!("../../queries/typescript/definitions.scm"),
    },
    LanguageConfig {
        name: "tsx",
        language_ids: &["typescriptreact", "tsx"],
        file_extensions: &["tsx"],
        grammar: || tree_sitter_typescript::LANGUAGE_TSX.into(),
        line_comment: Some("//"),
        block_comment: Some(("/*", "*/")),
        line_strings: &["\"", "'"],
        multiline_strings: &["`"],
        indent_unit: "  ",
        offside_rule: false,
        repair_fillers: &[";", "{}", "}", ")", ");", ")}"],
        context_query: include_str!("../../queries/tsx/context.scm"),
        definitions_query: include_str!("../../queries/tsx/definitions.scm"),
    },
    LanguageConfig {
        name: "javascript",
        language_ids: &["javascript", "javascriptreact", "jsx"],
        file_extensions: &["js", "mjs", "cjs", "jsx"],
        grammar: || tree_sitter_javascript::LANGUAGE.into(),
        line_comment: Some("//"),
        block_comment: Some(("/*", "*/")),
        line_strings: &["\"", "'"],
        multiline_strings: &["`"],
        indent_unit: "  ",
        offside_rule: false,
        repair_fillers: &[";", "{}", "}", ")", ");", ")}"],
        context_query: include_str!("../../queries/javascript/context.scm"),
        definitions_query: include_str!("../../queries/javascript/definitions.scm"),
    },
    LanguageConfig {
        name: "go",
        language_ids: &["go"],
        file_extensions: &["go"],
        grammar: || tree_sitter_go::LANGUAGE.into(),
        line_comment: Some("//"),
        block_comment: Some(("/*", "*/")),
        line_strings: &["\""],
        multiline_strings: &["`"],
        indent_unit: "\t",
        offside_rule: false,
        repair_fillers: &[";", "{}", "}", ")", ");", ")}"],
        context_query: include_str!("../../queries/go/context.scm"),
        definitions_query: include_str!("../../queries/go/definitions.scm"),
    },
    LanguageConfig {
        name: "c",
        language_ids: &["c"],
        file_extensions: &["c", "h"],
        grammar: || tree_sitter_c::LANGUAGE.into(),
        line_comment: Some("//"),
        block_comment: Some(("/*", "*/")),
        line_strings: &["\""],
        multiline_strings: &[],
        indent_unit: "    ",
        offside_rule: false,
        repair_fillers: &[";", "{}", "}", ")", ");", ")}"],
        context_query: include_str!("../../queries/c/context.scm"),
        definitions_query: include_str!("../../queries/c/definitions.scm"),
    },
    LanguageConfig {
        name: "cpp",
        language_ids: &["cpp", "c++"],
        file_extensions: &["cpp", "cc", "cxx", "c++", "hpp", "hh", "hxx", "h++", "ipp", "inl"],
        grammar: || tree_sitter_cpp::LANGUAGE.into(),
        line_comment: Some("//"),
        block_comment: Some(("/*", "*/")),
        line_strings: &["\""],
        multiline_strings: &[],
        indent_unit: "    ",
        offside_rule: false,
        repair_fillers: &[";", "{}", "}", ")", ");", ")}"],
        context_query: include_str!("../../queries/cpp/context.scm"),
        definitions_query: include_str!("../../queries/cpp/definitions.scm"),
    },
    LanguageConfig {
        name: "java",
        language_ids: &["java"],
        file_extensions: &["java"],
        grammar: || tree_sitter_java::LANGUAGE.into(),
        line_comment: Some("//"),
        block_comment: Some(("/*", "*/")),
        line_strings: &["\""],
        multiline_strings: &["\"\"\""],
        indent_unit: "    ",
        offside_rule: false,
        repair_fillers: &[";", "{}", "}", ")", ");", ")}"],
        context_query: include_str!("../../queries/java/context.scm"),
        definitions_query: include_str!("../../queries/java/definitions.scm"),
    },
];

/// A handle on one row of [`LANGUAGES`]: cheap to copy, compare and hash.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Language(u8);

impl Language {
    /// Every language in the table, in table order.
    pub fn all() -> impl Iterator<Item = Language> {
        (0..LANGUAGES.len()).map(|i| Language(i as u8))
    }

    /// By laya's name (`"python"`, `"tsx"`, …).
    pub fn from_name(name: &str) -> Option<Language> {
        Self::all().find(|l| l.config().name == name)
    }

    /// By LSP `languageId`; case-insensitive.
    pub fn from_language_id(id: &str) -> Option<Language> {
        Self::all().find(|l| l.config().language_ids.iter().any(|x| x.eq_ignore_ascii_case(id)))
    }

    /// By the extension of a path or URI (`file:///a/b.rs`, `src/x.py`).
    pub fn from_path(path: &str) -> Option<Language> {
        let ext = Path::new(path).extension()?.to_str()?;
        Self::all().find(|l| {
            l.config()
                .file_extensions
                .iter()
                .any(|x| x.eq_ignore_ascii_case(ext))
        })
    }

    /// The row's position in [`LANGUAGES`], for per-language caches (below `MAX_LANGUAGES`).
    pub fn index(self) -> usize {
        self.0 as usize
    }

    pub fn config(self) -> &'static LanguageConfig {
        &LANGUAGES[self.0 as usize]
    }

    pub fn name(self) -> &'static str {
        self.config().name
    }

    /// The tree-sitter language, built once.
    pub fn ts_language(self) -> &'static tree_sitter::Language {
        static CELLS: [OnceLock<tree_sitter::Language>; MAX_LANGUAGES] =
            [const { OnceLock::new() }; MAX_LANGUAGES];
        CELLS[self.0 as usize].get_or_init(|| (self.config().grammar)())
    }

    /// The compiled `context.scm`, compiled on first use. An error here is a bug in a
    /// query file; `every_context_query_compiles` keeps that from shipping.
    pub fn context_queries(self) -> Result<&'static ContextQueries, &'static tree_sitter::QueryError> {
        static CELLS: [OnceLock<Result<ContextQueries, tree_sitter::QueryError>>; MAX_LANGUAGES] =
            [const { OnceLock::new() }; MAX_LANGUAGES];
        CELLS[self.0 as usize]
            .get_or_init(|| ContextQueries::new(self.ts_language(), &self.context_query_source()))
            .as_ref()
    }

    /// `context.scm` with the files it inherits (a `; inherits: a, b` comment line, as in
    /// helix) put before it.
    pub fn context_query_source(self) -> String {
        self.query_source(|c| c.context_query)
    }

    /// `definitions.scm` with the files it inherits put before it.
    pub fn definitions_query_source(self) -> String {
        self.query_source(|c| c.definitions_query)
    }

    fn query_source(self, file: fn(&LanguageConfig) -> &'static str) -> String {
        let own = file(self.config());
        let mut source = String::new();
        for line in own.lines().take_while(|l| l.starts_with(';')) {
            let Some(parents) = line.trim_start_matches(';').trim().strip_prefix("inherits:") else {
                continue;
            };
            for parent in parents.split(',').filter_map(|p| Language::from_name(p.trim())) {
                if parent != self {
                    source.push_str(&parent.query_source(file));
                    source.push('\n');
                }
            }
        }
        source.push_str(own);
        source
    }
}

/// Upper bound on the table's length, for the per-language caches above
/// (`languages_table_is_consistent` checks it).
pub const MAX_LANGUAGES: usize = 32;

impl fmt::Debug for Language {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for Language {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
