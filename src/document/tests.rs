//! The document against a plain `String` model, and the incremental tree against a
//! from-scratch parse, over random edits.

use std::ops::Range;

use proptest::prelude::*;
use proptest::test_runner::Config;

use super::*;
use crate::syntax::Language;

/// Pieces random texts are built from: ASCII, 2-, 3- and 4-byte UTF-8 (the last two
/// are surrogate pairs in UTF-16), and all three line-break styles.
const PIECES: &[&str] = &["a", "b", "x", " ", "\t", "\n", "\r\n", "\r", "é", "中", "😀", "𝄞"];

fn text_strategy(max: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(PIECES), 0..max).prop_map(|v| v.concat())
}

/// The model's reading of a position: lines split at `\n`, characters counted in the
/// encoding, `\r` an ordinary character, past the line end = line end, inside a
/// character = error. Written independently of `position.rs`, on a `String`.
fn model_offset(text: &str, pos: Position, encoding: PositionEncoding) -> Option<usize> {
    let mut line_start = 0;
    for _ in 0..pos.line {
        line_start += text[line_start..].find('\n')? + 1;
    }
    let line_end = text[line_start..]
        .find('\n')
        .map_or(text.len(), |i| line_start + i);
    let mut units = 0;
    for (i, c) in text[line_start..line_end].char_indices() {
        if units == pos.character as usize {
            return Some(line_start + i);
        }
        units += match encoding {
            PositionEncoding::Utf8 => c.len_utf8(),
            PositionEncoding::Utf16 => c.len_utf16(),
        };
        if units > pos.character as usize {
            return None;
        }
    }
    Some(line_end)
}

fn model_apply(text: &str, change: &TextChange<'_>, encoding: PositionEncoding) -> Option<String> {
    let Some((start, end)) = change.range else {
        return Some(change.text.to_owned());
    };
    let (s, e) = (
        model_offset(text, start, encoding)?,
        model_offset(text, end, encoding)?,
    );
    if s > e {
        return None;
    }
    Some(format!("{}{}{}", &text[..s], change.text, &text[e..]))
}

/// Units in line `line` of `text` (0 when there is no such line).
fn line_units(text: &str, line: usize, encoding: PositionEncoding) -> usize {
    text.split('\n').nth(line).map_or(0, |l| match encoding {
        PositionEncoding::Utf8 => l.len(),
        PositionEncoding::Utf16 => l.encode_utf16().count(),
    })
}

/// A change described by seeds, made concrete against the current text so that most
/// positions are valid and some are not (a line past the end, a character past the line
/// end or inside a character, a reversed range).
#[derive(Debug, Clone)]
struct ChangeSeed {
    full: bool,
    start: (u32, u32),
    end: (u32, u32),
    text: String,
}

fn change_seed() -> impl Strategy<Value = ChangeSeed> {
    (
        prop::bool::weighted(0.05),
        any::<(u32, u32)>(),
        any::<(u32, u32)>(),
        text_strategy(6),
    )
        .prop_map(|(full, start, end, text)| ChangeSeed {
            full,
            start,
            end,
            text,
        })
}

fn position_from(text: &str, (line_seed, char_seed): (u32, u32), encoding: PositionEncoding) -> Position {
    let lines = text.split('\n').count();
    let line = line_seed as usize % (lines + 1);
    let character = char_seed as usize % (line_units(text, line, encoding) + 3);
    Position::new(line as u32, character as u32)
}

impl ChangeSeed {
    fn range(&self, text: &str, encoding: PositionEncoding) -> Option<(Position, Position)> {
        (!self.full).then(|| {
            (
                position_from(text, self.start, encoding),
                position_from(text, self.end, encoding),
            )
        })
    }
}

fn encoding_strategy() -> impl Strategy<Value = PositionEncoding> {
    prop_oneof![Just(PositionEncoding::Utf8), Just(PositionEncoding::Utf16)]
}

proptest! {
    #![proptest_config(Config { cases: 256, ..Config::default() })]

    /// After every batch of changes the document equals the model; a batch the model
    /// rejects (any bad change, or a stale version) leaves text and version unchanged.
    #[test]
    fn edits_match_a_string_model(
        initial in text_strategy(40),
        encoding in encoding_strategy(),
        steps in prop::collection::vec(
            (prop::collection::vec(change_seed(), 1..4), prop::sample::select(&[-1i32, 0, 1, 1, 1, 2][..])),
            1..25,
        ),
    ) {
        let mut doc = Document::new(&initial, 0, "plaintext");
        let mut model = initial.clone();
        for (seeds, version_step) in steps {
            let version = doc.version() + version_step;
            // Each change's positions refer to the text its predecessors left.
            let mut expected = Some(model.clone());
            let mut ranges = Vec::new();
            for seed in &seeds {
                let base = expected.clone().unwrap_or_else(|| model.clone());
                let range = seed.range(&base, encoding);
                ranges.push(range);
                expected = expected.and_then(|t| model_apply(&t, &TextChange { range, text: &seed.text }, encoding));
            }
            let changes: Vec<_> = seeds.iter().zip(&ranges).map(|(s, r)| TextChange { range: *r, text: &s.text }).collect();
            let before = doc.version();
            let result = doc.apply_changes(version, &changes, encoding);
            match (version_step > 0, expected) {
                (true, Some(new_text)) => {
                    prop_assert_eq!(result, Ok(()));
                    model = new_text;
                    prop_assert_eq!(doc.version(), version);
                }
                (fresh_version, _) => {
                    prop_assert!(result.is_err());
                    if !fresh_version {
                        prop_assert_eq!(result, Err(DocumentError::StaleVersion { current: before, received: version }));
                    }
                    prop_assert_eq!(doc.version(), before);
                }
            }
            prop_assert_eq!(String::from(doc.rope()), model.clone());
            prop_assert_eq!(&*doc.text(), model.as_str());
        }
    }

    /// Every byte offset on a character boundary converts to a position and back to
    /// itself; every position the model accepts converts to the model's offset.
    #[test]
    fn offsets_and_positions_round_trip(text in text_strategy(60), encoding in encoding_strategy(), seeds in prop::collection::vec(any::<(u32, u32)>(), 1..20)) {
        let doc = Document::new(&text, 0, "plaintext");
        for offset in 0..=text.len() + 1 {
            match doc.position_at(offset, encoding) {
                Ok(pos) => {
                    prop_assert!(text.is_char_boundary(offset));
                    prop_assert_eq!(doc.offset_at(pos, encoding), Ok(offset));
                    prop_assert_eq!(model_offset(&text, pos, encoding), Some(offset));
                }
                Err(_) => prop_assert!(offset > text.len() || !text.is_char_boundary(offset)),
            }
        }
        for seed in seeds {
            let pos = position_from(&text, seed, encoding);
            prop_assert_eq!(doc.offset_at(pos, encoding).ok(), model_offset(&text, pos, encoding));
        }
    }
}

const PYTHON_SOURCE: &str = "import os\n\nclass A:\n    \"\"\"Doc é.\"\"\"\n    def f(self, x):\n        # 中文\n        return [x, 'y', f\"{x}\"]\n\ndef g():\n    pass\n";
const RUST_SOURCE: &str = "use std::fmt;\r\n\r\n/// Doc é.\r\nstruct P { x: i32 }\r\n\r\nimpl P {\r\n    fn f(&self) -> i32 {\r\n        let s = \"中😀\"; // c\r\n        self.x + 1\r\n    }\r\n}\r\n";
const CODE_PIECES: &[&str] = &[
    "def ", "fn ", "class ", "(", ")", ":", "{", "}", ";", "\n", "\r\n", "\n    ", "x", "self", " = ", "\"",
    "'", "#", "//", "/*", "*/", "é", "中", "😀", "return ", "pass", "1", "+", ",",
];

#[derive(Debug, PartialEq, Eq)]
struct NodeRecord {
    kind: &'static str,
    bytes: Range<usize>,
    /// (row, byte column)
    start: (usize, usize),
    end: (usize, usize),
    missing: bool,
    leaf: bool,
}

/// Every node's kind and byte/point range, in order: stronger than `to_sexp`, which
/// leaves positions out.
fn dump(tree: &Tree) -> Vec<NodeRecord> {
    let mut out = Vec::new();
    let mut cursor = tree.walk();
    'walk: loop {
        let n = cursor.node();
        out.push(NodeRecord {
            kind: n.kind(),
            bytes: n.byte_range(),
            start: (n.start_position().row, n.start_position().column),
            end: (n.end_position().row, n.end_position().column),
            missing: n.is_missing(),
            leaf: n.child_count() == 0,
        });
        if cursor.goto_first_child() {
            continue;
        }
        while !cursor.goto_next_sibling() {
            if !cursor.goto_parent() {
                break 'walk;
            }
        }
    }
    out
}

fn edit_strategy() -> impl Strategy<Value = Vec<(usize, usize, String)>> {
    let insert = prop::collection::vec(prop::sample::select(CODE_PIECES), 0..4).prop_map(|v| v.concat());
    prop::collection::vec((any::<usize>(), 0usize..12, insert), 1..30)
}

/// Applies random edits, then undoes them in reverse order. After every edit the tree's
/// node positions must agree with the text (the `InputEdit`s were right), and the tree
/// must equal a fresh parse whenever the text parses without errors; after the undo it
/// must equal the fresh parse of the original text. (With syntax errors, tree-sitter's
/// error recovery may legitimately depend on which subtrees were reused, so there a
/// fresh parse can differ; tree-sitter's own randomized tests compare after undo too.)
fn check_incremental_tree(
    language: &str,
    source: &str,
    encoding: PositionEncoding,
    edits: Vec<(usize, usize, String)>,
) -> Result<(), TestCaseError> {
    let language = Language::from_name(language).unwrap();
    let mut doc = Document::new(source, 1, language.config().language_ids[0]);
    prop_assert_eq!(doc.language(), Some(language));
    let mut undo: Vec<(usize, usize, String)> = Vec::new();
    for (at_seed, delete_chars, insert) in edits {
        let text = doc.text();
        let boundaries: Vec<usize> = text.char_indices().map(|(i, _)| i).chain([text.len()]).collect();
        let at = at_seed % boundaries.len();
        let (start, end) = (
            boundaries[at],
            boundaries[(at + delete_chars).min(boundaries.len() - 1)],
        );
        undo.push((start, start + insert.len(), text[start..end].to_owned()));
        replace(&mut doc, start, end, &insert, encoding)?;
        check_tree(&doc, language)?;
    }
    for (start, end, text) in undo.into_iter().rev() {
        replace(&mut doc, start, end, &text, encoding)?;
        check_tree(&doc, language)?;
    }
    prop_assert_eq!(&*doc.text(), source);
    let fresh = crate::syntax::parse(language, source, None).unwrap();
    prop_assert_eq!(
        doc.tree().unwrap().root_node().to_sexp(),
        fresh.root_node().to_sexp()
    );
    prop_assert_eq!(dump(doc.tree().unwrap()), dump(&fresh));
    Ok(())
}

/// Edits that keep the program valid, so that every step is compared with a fresh
/// parse: multi-byte text typed into comments and strings, and blank lines (in the
/// file's own line-break style) inserted at line starts.
fn check_incremental_tree_valid_edits(
    language: &str,
    source: &str,
    encoding: PositionEncoding,
    edits: Vec<(bool, usize, usize, usize)>,
) -> Result<(), TestCaseError> {
    const TYPED: &[&str] = &["a", " ", "é", "中", "😀", "𝄞"];
    let language = Language::from_name(language).unwrap();
    let mut doc = Document::new(source, 1, language.config().language_ids[0]);
    let line_break = if source.contains("\r\n") { "\r\n" } else { "\n" };
    for (blank_line, node_seed, offset_seed, piece) in edits {
        let text = doc.text();
        let at = if blank_line {
            let starts: Vec<usize> = [0]
                .into_iter()
                .chain(text.match_indices('\n').map(|(i, _)| i + 1))
                .collect();
            starts[node_seed % starts.len()]
        } else {
            let holes: Vec<Range<usize>> = dump(doc.tree().unwrap())
                .into_iter()
                .filter(|n| n.kind.contains("comment") || n.kind == "string_content")
                .map(|n| n.bytes)
                .collect();
            let hole = holes[node_seed % holes.len()].clone();
            // Past a comment's opener (`#`, `//`), before its line break; anywhere in a
            // string's content.
            let hole_text = &text[hole.clone()];
            let skip = if hole_text.starts_with(['#', '/']) { 2 } else { 0 };
            let end = hole.start + hole_text.trim_end_matches(['\r', '\n']).len();
            let inside: Vec<usize> = (hole.start + skip..=end)
                .filter(|&i| text.is_char_boundary(i))
                .collect();
            if inside.is_empty() {
                continue;
            }
            inside[offset_seed % inside.len()]
        };
        let insert = if blank_line {
            line_break
        } else {
            TYPED[piece % TYPED.len()]
        };
        replace(&mut doc, at, at, insert, encoding)?;
        prop_assert!(
            check_tree(&doc, language)?,
            "edit broke the program: {:?}",
            &*doc.text()
        );
    }
    Ok(())
}

fn replace(
    doc: &mut Document,
    start: usize,
    end: usize,
    text: &str,
    encoding: PositionEncoding,
) -> Result<(), TestCaseError> {
    let range = (
        doc.position_at(start, encoding).unwrap(),
        doc.position_at(end, encoding).unwrap(),
    );
    prop_assert_eq!(
        doc.apply_change(doc.version() + 1, Some(range), text, encoding),
        Ok(())
    );
    Ok(())
}

/// Checks the tree against the text; returns whether it was compared with a fresh parse.
fn check_tree(doc: &Document, language: Language) -> Result<bool, TestCaseError> {
    let tree = doc.tree().unwrap();
    let rope = doc.rope();
    for NodeRecord {
        kind,
        bytes,
        start,
        end,
        ..
    } in dump(tree)
    {
        prop_assert!(bytes.end <= rope.len_bytes(), "{} {:?} past the end", kind, bytes);
        let point = |b: usize| (rope.byte_to_line(b), b - rope.line_to_byte(rope.byte_to_line(b)));
        prop_assert_eq!(
            (point(bytes.start), point(bytes.end)),
            (start, end),
            "{} {:?}",
            kind,
            bytes
        );
    }
    let fresh = crate::syntax::parse(language, &doc.text(), None).unwrap();
    if fresh.root_node().has_error() {
        return Ok(false);
    }
    // The tokens (leaves, with their ranges) must be those of a fresh parse: a wrongly mapped
    // edit shows there. The structure above them may differ where the grammar is ambiguous
    // and the incremental parse reuses a different, equally valid reading (seen in Python:
    // `r/*eturn[x]` as `r / *(eturn[x])` or `r / (*eturn)[x]`).
    let leaves = |t: &Tree| dump(t).into_iter().filter(|n| n.leaf).collect::<Vec<_>>();
    prop_assert_eq!(leaves(tree), leaves(&fresh), "text: {:?}", &*doc.text());
    Ok(true)
}

proptest! {
    #![proptest_config(Config { cases: 64, ..Config::default() })]

    #[test]
    fn incremental_python_tree_equals_fresh_parse(encoding in encoding_strategy(), edits in edit_strategy()) {
        check_incremental_tree("python", PYTHON_SOURCE, encoding, edits)?;
    }

    #[test]
    fn incremental_python_tree_equals_fresh_parse_on_valid_edits(encoding in encoding_strategy(), edits in prop::collection::vec(any::<(bool, usize, usize, usize)>(), 1..40)) {
        check_incremental_tree_valid_edits("python", PYTHON_SOURCE, encoding, edits)?;
    }

    #[test]
    fn incremental_rust_tree_equals_fresh_parse_on_valid_edits(encoding in encoding_strategy(), edits in prop::collection::vec(any::<(bool, usize, usize, usize)>(), 1..40)) {
        check_incremental_tree_valid_edits("rust", RUST_SOURCE, encoding, edits)?;
    }

    #[test]
    fn incremental_rust_tree_equals_fresh_parse(encoding in encoding_strategy(), edits in edit_strategy()) {
        check_incremental_tree("rust", RUST_SOURCE, encoding, edits)?;
    }
}

#[test]
fn several_changes_reparse_once_and_match_a_fresh_parse() {
    let mut doc = Document::new("fn a() {}\nfn b() {}\n", 1, "rust");
    let changes = [
        TextChange {
            range: Some((Position::new(0, 3), Position::new(0, 4))),
            text: "alpha",
        },
        TextChange {
            range: Some((Position::new(1, 9), Position::new(1, 9))),
            text: "\nstruct S;",
        },
        TextChange {
            range: None,
            text: "fn only() { 1 }",
        },
        TextChange {
            range: Some((Position::new(0, 12), Position::new(0, 13))),
            text: "2",
        },
    ];
    doc.apply_changes(2, &changes, PositionEncoding::Utf16).unwrap();
    assert_eq!(&*doc.text(), "fn only() { 2 }");
    let fresh = crate::syntax::parse(doc.language().unwrap(), &doc.text(), None).unwrap();
    assert_eq!(dump(doc.tree().unwrap()), dump(&fresh));
}

#[test]
fn a_failing_change_in_a_batch_changes_nothing() {
    let mut doc = Document::new("abc\n", 1, "python");
    let tree_before = doc.tree().unwrap().root_node().to_sexp();
    let changes = [
        TextChange {
            range: Some((Position::new(0, 0), Position::new(0, 0))),
            text: "x = 1\n",
        },
        TextChange {
            range: Some((Position::new(9, 0), Position::new(9, 0))),
            text: "boom",
        },
    ];
    let err = doc
        .apply_changes(2, &changes, PositionEncoding::Utf8)
        .unwrap_err();
    assert_eq!(
        err,
        DocumentError::Position(PositionError::LineOutOfRange {
            line: 9,
            last_line: 2
        })
    );
    assert_eq!((&*doc.text(), doc.version()), ("abc\n", 1));
    assert_eq!(doc.tree().unwrap().root_node().to_sexp(), tree_before);
}

#[test]
fn stale_and_equal_versions_are_rejected() {
    let mut doc = Document::new("a", 5, "python");
    for v in [5, 4, -1] {
        assert_eq!(
            doc.apply_change(v, None, "b", PositionEncoding::Utf16),
            Err(DocumentError::StaleVersion {
                current: 5,
                received: v
            })
        );
    }
    assert_eq!((&*doc.text(), doc.version()), ("a", 5));
    doc.apply_change(7, None, "b", PositionEncoding::Utf16).unwrap();
    assert_eq!((&*doc.text(), doc.version()), ("b", 7));
}

#[test]
fn unknown_language_has_no_tree_but_edits_work() {
    let mut doc = Document::new("hello", 1, "markdown");
    assert!(doc.language().is_none() && doc.tree().is_none());
    doc.apply_change(
        2,
        Some((Position::new(0, 5), Position::new(0, 5))),
        " world",
        PositionEncoding::Utf8,
    )
    .unwrap();
    assert_eq!(&*doc.text(), "hello world");
}

#[test]
fn store_opens_changes_snapshots_and_frees_on_close() {
    let store = DocumentStore::new();
    let uri = "file:///w/src/main.py";
    assert_eq!(
        store.snapshot(uri).unwrap_err(),
        DocumentError::UnknownDocument(uri.to_owned())
    );
    store.open(uri, "def f():\n    return 1\n", 1, "python");
    store.open("file:///w/src/lib.rs", "struct S;\n", 1, "");
    store.open("file:///w/notes.txt", "notes", 1, "plaintext");
    assert_eq!(store.len(), 3);

    let change = TextChange {
        range: Some((Position::new(1, 11), Position::new(1, 12))),
        text: "2",
    };
    store.change(uri, 2, &[change], PositionEncoding::Utf16).unwrap();
    assert!(matches!(
        store.change(uri, 2, &[change], PositionEncoding::Utf16),
        Err(DocumentError::StaleVersion { .. })
    ));

    let snap = store.snapshot(uri).unwrap();
    assert_eq!(
        (&*snap.text, snap.version, snap.language_id.as_str()),
        ("def f():\n    return 2\n", 2, "python")
    );
    assert_eq!(snap.language, Language::from_name("python"));
    let cursor = snap
        .offset_at(Position::new(1, 12), PositionEncoding::Utf16)
        .unwrap();
    assert_eq!(
        snap.position_at(cursor, PositionEncoding::Utf8),
        Ok(Position::new(1, 12))
    );

    // The Rust file's language comes from its extension; the text file has none.
    let others = store.snapshots_except(uri);
    assert_eq!(
        others.iter().map(|s| s.uri.as_str()).collect::<Vec<_>>(),
        ["file:///w/notes.txt", "file:///w/src/lib.rs"]
    );
    assert_eq!(others[1].language, Language::from_name("rust"));
    assert!(others[0].as_open_document().is_none());
    let cx = snap.context(cursor, &others).unwrap();
    assert_eq!(cx.enclosing_scopes.len(), 1);
    assert_eq!(cx.line_prefix, "    return 2");

    store.close(uri).unwrap();
    assert!(!store.contains(uri));
    assert_eq!(
        store.close(uri),
        Err(DocumentError::UnknownDocument(uri.to_owned()))
    );
    assert!(matches!(
        store.change(uri, 3, &[change], PositionEncoding::Utf16),
        Err(DocumentError::UnknownDocument(_))
    ));
    // A snapshot taken before the close is detached from the store.
    assert_eq!(&*snap.text, "def f():\n    return 2\n");
}

#[test]
fn snapshot_text_is_shared_until_the_next_edit() {
    let mut doc = Document::new("abc", 1, "python");
    let a = doc.snapshot("u").text;
    let b = doc.snapshot("u").text;
    assert!(Arc::ptr_eq(&a, &b));
    doc.apply_change(2, None, "xyz", PositionEncoding::Utf8).unwrap();
    assert_eq!(&*doc.snapshot("u").text, "xyz");
    assert_eq!(&*a, "abc");
}

proptest! {
    #![proptest_config(Config { cases: 64, ..Config::default() })]

    /// A suggestion accepted ahead of the editor (`DocumentSnapshot::with_edit`) gives the
    /// text, positions and tree the document has once the editor sends the same edit.
    #[test]
    fn an_edit_ahead_equals_the_edit_applied(
        start_seed in any::<usize>(),
        len in 0usize..12,
        insert in prop::collection::vec(prop::sample::select(CODE_PIECES), 0..4).prop_map(|v| v.concat()),
    ) {
        let mut doc = Document::new(PYTHON_SOURCE, 1, "python");
        let snap = doc.snapshot("file:///a.py");
        let text: &str = &snap.text;
        let mut start = start_seed % (text.len() + 1);
        while !text.is_char_boundary(start) {
            start -= 1;
        }
        let mut end = (start + len).min(text.len());
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let ahead = snap.with_edit(start, end, &insert).expect("boundaries");
        let enc = PositionEncoding::Utf8;
        let range = (snap.position_at(start, enc).unwrap(), snap.position_at(end, enc).unwrap());
        doc.apply_change(2, Some(range), &insert, enc).unwrap();
        let applied = doc.snapshot("file:///a.py");
        prop_assert_eq!(&*ahead.text, &*applied.text);
        prop_assert_eq!(ahead.rope.to_string(), applied.rope.to_string());
        let (a, b) = (ahead.tree.as_ref().unwrap(), applied.tree.as_ref().unwrap());
        prop_assert_eq!(dump(a), dump(b));
        prop_assert!(snap.with_edit(end + 1, end, "x").is_none());
    }
}
