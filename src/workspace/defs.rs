//! The definitions of one file, read with `queries/<lang>/definitions.scm`: functions and
//! methods, types, fields and constants, each with its name and signature.

use std::sync::OnceLock;

use tree_sitter::{Query, QueryCursor, StreamingIterator};

use crate::syntax::{self, Language};

/// What a definition is, from its capture name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DefKind {
    /// `@definition.function`: functions, methods, constructors, prototypes.
    Function,
    /// `@definition.type`: classes, structs, enums, unions, traits, interfaces, aliases.
    Type,
    /// `@definition.field`: fields, attributes, properties, enum variants.
    Field,
    /// `@definition.constant`: constants, statics, module-level bindings, macros.
    Constant,
}

/// The capture names a `definitions.scm` may use (besides `@_`-prefixed predicate helpers).
pub const CAPTURES: &[(&str, Option<DefKind>)] = &[
    ("definition.function", Some(DefKind::Function)),
    ("definition.type", Some(DefKind::Type)),
    ("definition.field", Some(DefKind::Field)),
    ("definition.constant", Some(DefKind::Constant)),
    ("name", None),
    ("body", None),
];

/// Longest signature kept, in bytes (cut at a line end).
pub const MAX_SIGNATURE: usize = 400;

/// One definition in a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Definition {
    pub name: String,
    pub kind: DefKind,
    /// The definition's text up to its body (`@body`), or its first line without one;
    /// indented as in the file, trailing whitespace removed, at most [`MAX_SIGNATURE`] bytes.
    pub signature: String,
    /// 0-based line of its start.
    pub line: u32,
    /// Byte range of the whole definition.
    pub start: usize,
    pub end: usize,
    /// The type definition it is inside (an index into the same list), for members.
    pub container: Option<usize>,
}

/// A compiled `definitions.scm` with its capture indices.
pub struct DefinitionsQuery {
    query: Query,
    /// Per capture index: its meaning (`None` for helpers like `@_self`).
    roles: Vec<Option<Role>>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Role {
    Definition(DefKind),
    Name,
    Body,
}

impl DefinitionsQuery {
    pub fn new(language: &tree_sitter::Language, source: &str) -> Result<Self, String> {
        let query = Query::new(language, source).map_err(|e| e.to_string())?;
        let mut roles = vec![];
        for name in query.capture_names() {
            let role = match CAPTURES.iter().find(|(n, _)| n == name) {
                Some((_, Some(kind))) => Some(Role::Definition(*kind)),
                Some(("name", None)) => Some(Role::Name),
                Some(("body", None)) => Some(Role::Body),
                _ if name.starts_with('_') => None,
                _ => return Err(format!("unknown capture @{name}")),
            };
            roles.push(role);
        }
        Ok(DefinitionsQuery { query, roles })
    }

    /// The language's query, compiled on first use. An error is a bug in a query file (the
    /// `every_definitions_query_compiles` test keeps that from shipping).
    pub fn of(language: Language) -> Result<&'static DefinitionsQuery, &'static String> {
        static CELLS: [OnceLock<Result<DefinitionsQuery, String>>; crate::syntax::MAX_LANGUAGES] =
            [const { OnceLock::new() }; crate::syntax::MAX_LANGUAGES];
        CELLS[language.index()]
            .get_or_init(|| {
                DefinitionsQuery::new(language.ts_language(), &language.definitions_query_source())
                    .map_err(|e| format!("queries/{}/definitions.scm: {e}", language.name()))
            })
            .as_ref()
    }
}

/// The definitions of `text`, in file order; empty when it cannot be parsed.
pub fn extract(language: Language, text: &str) -> Vec<Definition> {
    let Ok(q) = DefinitionsQuery::of(language) else {
        return vec![];
    };
    let Some(tree) = syntax::parse(language, text, None) else {
        return vec![];
    };
    let mut defs: Vec<Definition> = vec![];
    let mut cursor = QueryCursor::new();
    let mut matches = cursor.matches(&q.query, tree.root_node(), text.as_bytes());
    while let Some(m) = matches.next() {
        let (mut def, mut name, mut body) = (None, None, None);
        for c in m.captures {
            match q.roles[c.index as usize] {
                Some(Role::Definition(kind)) => def = Some((kind, c.node)),
                Some(Role::Name) => name = Some(c.node),
                Some(Role::Body) => body = Some(c.node),
                None => {}
            }
        }
        let (Some((kind, node)), Some(name)) = (def, name) else {
            continue;
        };
        let Ok(name) = name.utf8_text(text.as_bytes()) else {
            continue;
        };
        let start = node.start_byte();
        // From the start of the line, so the signature keeps its indentation.
        let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
        let indent = &text[line_start..start];
        let head_end = match body {
            Some(b) if b.start_byte() > start => b.start_byte(),
            _ => text[start..node.end_byte()]
                .find('\n')
                .map_or(node.end_byte(), |i| start + i),
        };
        let head = text[start..head_end].trim_end();
        // The line's start too when it is indentation or a short lead-in such as `export `
        // or `const ` (not the end of another statement).
        let lead_in = indent.len() <= 40 && !indent.contains([';', '{', '}', '(', ')']);
        let signature = if lead_in {
            format!("{indent}{head}")
        } else {
            head.to_owned()
        };
        defs.push(Definition {
            name: name.to_owned(),
            kind,
            signature: cut(&signature, MAX_SIGNATURE),
            line: node.start_position().row as u32,
            start,
            end: node.end_byte(),
            container: None,
        });
    }
    // One definition per node and name: where two patterns match (a module-level `const f =
    // () => …` is a constant and a function), the more specific kind, listed first, wins.
    defs.sort_by_key(|d| (d.start, std::cmp::Reverse(d.end), d.kind));
    defs.dedup_by(|a, b| a.start == b.start && a.name == b.name);
    // Containers: the innermost type definition whose range holds a definition.
    let mut open: Vec<usize> = vec![];
    for i in 0..defs.len() {
        while let Some(&top) = open.last() {
            if defs[top].end <= defs[i].start {
                open.pop();
            } else {
                break;
            }
        }
        defs[i].container = open.last().copied();
        if defs[i].kind == DefKind::Type {
            open.push(i);
        }
    }
    defs
}

/// `s` cut to at most `max` bytes at a line end (or a char boundary for one long line).
fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    match s[..end].rfind('\n') {
        Some(i) if i > 0 => s[..i].to_owned(),
        _ => s[..end].to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defs(lang: &str, text: &str) -> Vec<(DefKind, String, String, Option<String>)> {
        let language = Language::from_name(lang).unwrap();
        let d = extract(language, text);
        d.iter()
            .map(|x| {
                (
                    x.kind,
                    x.name.clone(),
                    x.signature.clone(),
                    x.container.map(|c| d[c].name.clone()),
                )
            })
            .collect()
    }

    #[test]
    fn every_definitions_query_compiles() {
        for l in Language::all() {
            if let Err(e) = DefinitionsQuery::of(l) {
                panic!("{e}");
            }
        }
    }

    #[test]
    fn python_functions_classes_fields_and_constants() {
        let d = defs(
            "python",
            "MAX = 3\n\nclass Point(Base):\n    dims: int = 2\n\n    def __init__(self, x, y):\n        self.x = x\n\n    def norm(self) -> float:\n        return 0\n\ndef make(x: int) -> Point:\n    pass\n",
        );
        use DefKind::*;
        let point = Some("Point".to_owned());
        assert_eq!(
            d,
            vec![
                (Constant, "MAX".into(), "MAX = 3".into(), None),
                (Type, "Point".into(), "class Point(Base):".into(), None),
                (Field, "dims".into(), "    dims: int = 2".into(), point.clone()),
                (
                    Function,
                    "__init__".into(),
                    "    def __init__(self, x, y):".into(),
                    point.clone()
                ),
                (Field, "x".into(), "        self.x = x".into(), point.clone()),
                (
                    Function,
                    "norm".into(),
                    "    def norm(self) -> float:".into(),
                    point
                ),
                (Function, "make".into(), "def make(x: int) -> Point:".into(), None),
            ]
        );
    }

    #[test]
    fn each_language_finds_its_kinds_of_definition() {
        use DefKind::*;
        // (language, text, the definitions it holds in order)
        type Case<'a> = (&'a str, &'a str, &'a [(DefKind, &'a str)]);
        let cases: &[Case] = &[
            (
                "rust",
                "pub struct Config { pub port: u16 }\nimpl Config {\n    pub fn new(port: u16) -> Self { Config { port } }\n}\npub enum Mode { Fast, Slow }\nconst LIMIT: usize = 4;\ntrait Run { fn run(&self); }\ntype Id = u32;\n",
                &[
                    (Type, "Config"),
                    (Field, "port"),
                    (Function, "new"),
                    (Type, "Mode"),
                    (Field, "Fast"),
                    (Field, "Slow"),
                    (Constant, "LIMIT"),
                    (Type, "Run"),
                    (Function, "run"),
                    (Type, "Id"),
                ],
            ),
            (
                "typescript",
                "export interface Options { retries: number; run(x: string): void }\nexport class Client {\n  private base: string;\n  get(path: string): Promise<Response> { return fetch(path) }\n}\nexport const DEFAULT = 3;\nexport function create(o: Options): Client { return new Client() }\nconst helper = (a: number) => a + 1;\ntype Id = string;\n",
                &[
                    (Type, "Options"),
                    (Field, "retries"),
                    (Function, "run"),
                    (Type, "Client"),
                    (Field, "base"),
                    (Function, "get"),
                    (Constant, "DEFAULT"),
                    (Function, "create"),
                    (Function, "helper"),
                    (Type, "Id"),
                ],
            ),
            (
                "go",
                "package p\n\ntype Server struct {\n\tAddr string\n}\n\ntype Handler interface {\n\tServe(w Writer)\n}\n\nconst Max = 3\n\nfunc (s *Server) Start(port int) error {\n\treturn nil\n}\n\nfunc New() *Server { return nil }\n",
                &[
                    (Type, "Server"),
                    (Field, "Addr"),
                    (Type, "Handler"),
                    (Function, "Serve"),
                    (Constant, "Max"),
                    (Function, "Start"),
                    (Function, "New"),
                ],
            ),
            (
                "c",
                "#define BUF 64\nstruct conn {\n    int fd;\n    char *name;\n};\ntypedef struct conn conn_t;\nint conn_open(const char *host, int port);\nstatic int helper(void) { return 0; }\nenum state { IDLE, BUSY };\n",
                &[
                    (Constant, "BUF"),
                    (Type, "conn"),
                    (Field, "fd"),
                    (Field, "name"),
                    (Type, "conn_t"),
                    (Function, "conn_open"),
                    (Function, "helper"),
                    (Type, "state"),
                    (Constant, "IDLE"),
                    (Constant, "BUSY"),
                ],
            ),
            (
                "java",
                "package a.b;\npublic class Parser {\n    public static final int MAX = 3;\n    private String input;\n    public Parser(String input) { this.input = input; }\n    public Node parse() { return null; }\n}\ninterface Visitor { void visit(Node n); }\nenum Kind { LEAF, BRANCH }\n",
                &[
                    (Type, "Parser"),
                    (Field, "MAX"),
                    (Field, "input"),
                    (Function, "Parser"),
                    (Function, "parse"),
                    (Type, "Visitor"),
                    (Function, "visit"),
                    (Type, "Kind"),
                    (Constant, "LEAF"),
                    (Constant, "BRANCH"),
                ],
            ),
            (
                "cpp",
                "class Shape {\npublic:\n    virtual double area() const;\n    int sides;\n};\ndouble Shape::area() const { return 0; }\nusing Size = int;\n",
                &[
                    (Type, "Shape"),
                    (Function, "area"),
                    (Field, "sides"),
                    (Function, "Shape::area"),
                    (Type, "Size"),
                ],
            ),
            (
                "javascript",
                "export class Queue {\n  size = 0;\n  push(x) { this.items.push(x) }\n}\nexport function drain(q) {}\nexport const LIMIT = 10;\n",
                &[
                    (Type, "Queue"),
                    (Field, "size"),
                    (Function, "push"),
                    (Function, "drain"),
                    (Constant, "LIMIT"),
                ],
            ),
        ];
        for (lang, text, want) in cases {
            let got: Vec<(DefKind, String)> =
                defs(lang, text).into_iter().map(|(k, n, _, _)| (k, n)).collect();
            let want: Vec<(DefKind, String)> = want.iter().map(|(k, n)| (*k, n.to_string())).collect();
            assert_eq!(got, want, "{lang}");
        }
    }

    #[test]
    fn signatures_stop_at_the_body_and_members_know_their_type() {
        let d = defs(
            "rust",
            "impl Foo {}\npub fn connect(\n    host: &str,\n    port: u16,\n) -> Result<Conn, Error> {\n    todo!()\n}\n",
        );
        assert_eq!(
            d[0].2,
            "pub fn connect(\n    host: &str,\n    port: u16,\n) -> Result<Conn, Error>"
        );
        let d = defs("java", "class A {\n    int f() { return 1; }\n}\n");
        assert_eq!(d[1].3.as_deref(), Some("A"));
        assert_eq!(d[1].2, "    int f()");
    }
}
