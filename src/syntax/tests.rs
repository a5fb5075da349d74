//! Golden tests: one realistic file per language with a `$0` cursor, the context
//! extracted there rendered as text next to the fixture (`UPDATE_EXPECT=1` rewrites it).

use expect_test::{expect, Expect};

use super::context::{extract_with_limits, Limits};
use super::query::{self, CAPTURE_NAMES};
use super::{extract, parse, Context, CursorKind, Language, OpenDocument, LANGUAGES};

#[test]
fn every_context_query_compiles_with_known_captures() {
    for language in Language::all() {
        let q = match language.context_queries() {
            Ok(q) => q,
            Err(e) => panic!("queries/{language}/context.scm: {e}"),
        };
        for (use_query, needed) in [
            (&q.cursor, &[query::COMMENT, query::STRING][..]),
            (&q.scopes, &[query::SCOPE_FUNCTION, query::BODY][..]),
            (&q.types, &[query::DEFINITION_TYPE, query::NAME][..]),
            (&q.imports, &[query::IMPORT][..]),
        ] {
            for name in needed {
                assert!(
                    use_query.capture(name).is_some(),
                    "queries/{language}/context.scm lacks @{name}"
                );
            }
            for name in use_query.query.capture_names() {
                assert!(
                    CAPTURE_NAMES.contains(name),
                    "{language}: unknown capture @{name}"
                );
            }
        }
        // Whole-file searches start only at these kinds and skip function bodies.
        assert!(
            !q.types.roots.is_any() && !q.imports.roots.is_any() && !q.function_roots.is_any(),
            "{language}"
        );
    }
}

#[test]
fn languages_table_is_consistent() {
    assert!(LANGUAGES.len() <= super::languages::MAX_LANGUAGES);
    let mut ids = std::collections::HashSet::new();
    let mut exts = std::collections::HashSet::new();
    for language in Language::all() {
        let c = language.config();
        assert_eq!(Language::from_name(c.name), Some(language));
        for id in c.language_ids {
            assert!(ids.insert(*id), "language id {id} claimed twice");
            assert_eq!(Language::from_language_id(id), Some(language));
        }
        for ext in c.file_extensions {
            assert!(exts.insert(*ext), "extension {ext} claimed twice");
            assert_eq!(
                Language::from_path(&format!("file:///src/x.{ext}")),
                Some(language)
            );
        }
        assert!(
            parse(language, "", None).is_some(),
            "{language}: grammar rejected"
        );
        // The repair edits the tree as an insertion within the cursor's line.
        assert!(
            c.repair_fillers
                .iter()
                .all(|f| !f.is_empty() && !f.contains(['\n', '\r'])),
            "{language}: a repair filler must be text within one line"
        );
    }
    assert_eq!(
        Language::from_path("file:///a/b/c.PY"),
        Some(Language::from_name("python").unwrap())
    );
    assert_eq!(Language::from_path("Makefile"), None);
}

/// A fixture: `$0` marks the cursor.
fn cursor_fixture(fixture: &str) -> (String, usize) {
    let cursor = fixture.find("$0").expect("fixture has no $0");
    (fixture.replacen("$0", "", 1), cursor)
}

fn render(cx: &Context) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    writeln!(out, "cursor: {:?}", cx.cursor_kind).unwrap();
    for s in &cx.enclosing_scopes {
        writeln!(out, "scope {:?}: {}", s.kind, s.signature_text).unwrap();
    }
    for s in &cx.signatures {
        writeln!(out, "signature: {}", s.signature_text).unwrap();
    }
    for t in &cx.type_definitions {
        let from = t.source_path.as_deref().unwrap_or("this file");
        let cut = if t.truncated { ", truncated" } else { "" };
        writeln!(out, "type {} ({from}{cut}):", t.name).unwrap();
        for line in t.text.lines() {
            writeln!(out, "  | {line}").unwrap();
        }
    }
    for i in &cx.imports {
        writeln!(out, "import: {}", i.replace('\n', "\n  | ")).unwrap();
    }
    writeln!(out, "indent: {:?}", cx.indent).unwrap();
    writeln!(out, "line: {:?} $0 {:?}", cx.line_prefix, cx.line_suffix).unwrap();
    out
}

/// `others`: (path, fixture text) of other open documents; their language comes from the path.
fn context_at(language: &str, fixture: &str, others: &[(&str, &str)], limits: &Limits) -> Context {
    let language = Language::from_name(language).unwrap();
    let (text, cursor) = cursor_fixture(fixture);
    let tree = parse(language, &text, None).unwrap();
    let other_trees: Vec<_> = others
        .iter()
        .map(|(path, text)| {
            let l = Language::from_path(path).unwrap();
            (*path, *text, parse(l, text, None).unwrap(), l)
        })
        .collect();
    let other_docs: Vec<_> = other_trees
        .iter()
        .map(|(path, text, tree, language)| OpenDocument {
            path,
            text,
            tree,
            language: *language,
        })
        .collect();
    extract_with_limits(language, &text, &tree, cursor, &other_docs, limits)
}

fn check(language: &str, fixture: &str, others: &[(&str, &str)], expect: Expect) {
    expect.assert_eq(&render(&context_at(
        language,
        fixture,
        others,
        &Limits::default(),
    )));
}

fn cursor_kind(language: &str, fixture: &str) -> CursorKind {
    let l = Language::from_name(language).unwrap();
    let (text, cursor) = cursor_fixture(fixture);
    let tree = parse(l, &text, None).unwrap();
    extract(l, &text, &tree, cursor, &[]).cursor_kind
}

#[test]
fn python_method_sees_class_types_and_other_document() {
    check(
        "python",
        r#"import math
from dataclasses import dataclass
from typing import Optional

from .weights import Weights


@dataclass
class Point:
    x: float
    y: float


class Shape:
    """Base of every shape."""

    def area(self) -> float:
        raise NotImplementedError


class Polygon(Shape):
    def __init__(self, points: list[Point]):
        self.points = points

    def perimeter(self) -> float:
        total = 0.0
        for a, b in zip(self.points, self.points[1:]):
            total += math.dist((a.x, a.y), (b.x, b.y))
        return total

    def centroid(self, weights: Optional[Weights] = None) -> Point:
        n = len(self.points)
        if weights is None:
            $0
"#,
        &[(
            "src/shapes/weights.py",
            "class Weights:\n    def __init__(self, values: list[float]):\n        self.values = values\n\n    def normalized(self) -> \"Weights\":\n        s = sum(self.values)\n        return Weights([v / s for v in self.values])\n",
        )],
        expect![[r#"
            cursor: Code
            scope Class: class Polygon(Shape):
            scope Function: def centroid(self, weights: Optional[Weights] = None) -> Point:
            signature: def __init__(self, points: list[Point]):
            signature: def perimeter(self) -> float:
            signature: def centroid(self, weights: Optional[Weights] = None) -> Point:
            type Point (this file):
              | class Point:
              |     x: float
              |     y: float
            type Shape (this file):
              | class Shape:
              |     """Base of every shape."""
              | 
              |     def area(self) -> float:
              |         raise NotImplementedError
            type Weights (src/shapes/weights.py):
              | class Weights:
              |     def __init__(self, values: list[float]):
              |         self.values = values
              | 
              |     def normalized(self) -> "Weights":
              |         s = sum(self.values)
              |         return Weights([v / s for v in self.values])
            import: import math
            import: from dataclasses import dataclass
            import: from typing import Optional
            import: from .weights import Weights
            indent: "            "
            line: "            " $0 ""
        "#]],
    );
}

#[test]
fn rust_method_sees_struct_and_trait_from_other_document() {
    check(
        "rust",
        r#"use std::collections::HashMap;
use crate::store::{Backend, Entry};

/// A cache in front of a slow backend.
pub struct Cache<B: Backend> {
    backend: B,
    entries: HashMap<String, Entry>,
    hits: u64,
}

pub enum Lookup {
    Hit(Entry),
    Miss,
}

impl<B: Backend> Cache<B> {
    pub fn new(backend: B) -> Self {
        Cache { backend, entries: HashMap::new(), hits: 0 }
    }

    fn insert(&mut self, key: &str, entry: Entry) {
        self.entries.insert(key.to_owned(), entry);
    }

    pub fn get(&mut self, key: &str) -> Lookup {
        if let Some(e) = self.entries.get(key) {
            self.hits += 1;
            return Lookup::Hit(e.clone());
        }
        $0
    }
}

fn unrelated() {}
"#,
        &[(
            "src/store.rs",
            "pub trait Backend {\n    fn load(&self, key: &str) -> Option<Entry>;\n}\n\n#[derive(Clone)]\npub struct Entry {\n    pub value: Vec<u8>,\n    pub expires: u64,\n}\n",
        )],
        expect![[r#"
            cursor: Code
            scope Class: impl<B: Backend> Cache<B>
            scope Function: pub fn get(&mut self, key: &str) -> Lookup
            signature: pub fn new(backend: B) -> Self
            signature: fn insert(&mut self, key: &str, entry: Entry)
            signature: pub fn get(&mut self, key: &str) -> Lookup
            type Cache (this file):
              | pub struct Cache<B: Backend> {
              |     backend: B,
              |     entries: HashMap<String, Entry>,
              |     hits: u64,
              | }
            type Lookup (this file):
              | pub enum Lookup {
              |     Hit(Entry),
              |     Miss,
              | }
            type Backend (src/store.rs):
              | pub trait Backend {
              |     fn load(&self, key: &str) -> Option<Entry>;
              | }
            type Entry (src/store.rs):
              | pub struct Entry {
              |     pub value: Vec<u8>,
              |     pub expires: u64,
              | }
            import: use std::collections::HashMap;
            import: use crate::store::{Backend, Entry};
            indent: "        "
            line: "        " $0 ""
        "#]],
    );
}

#[test]
fn typescript_method_sees_interface_and_type_alias() {
    check(
        "typescript",
        r#"import { EventEmitter } from "events";
import type { Logger } from "./logger";

export interface Order {
  id: string;
  total: number;
  status: OrderStatus;
}

type OrderStatus = "open" | "paid" | "shipped";

export class OrderService extends EventEmitter {
  private orders = new Map<string, Order>();

  constructor(private readonly log: Logger) {
    super();
  }

  add(order: Order): void {
    this.orders.set(order.id, order);
  }

  markPaid(id: string): Order | undefined {
    const order = this.orders.get(id);
    if (!order) {
      this.log.warn(`no order ${id}`);
      return undefined;
    }
    $0
  }
}
"#,
        &[(
            "src/logger.ts",
            "export interface Logger {\n  info(msg: string): void;\n  warn(msg: string): void;\n}\n",
        )],
        expect![[r#"
            cursor: Code
            scope Class: class OrderService extends EventEmitter
            scope Function: markPaid(id: string): Order | undefined
            signature: constructor(private readonly log: Logger)
            signature: add(order: Order): void
            signature: markPaid(id: string): Order | undefined
            type Order (this file):
              | interface Order {
              |   id: string;
              |   total: number;
              |   status: OrderStatus;
              | }
            type OrderStatus (this file):
              | type OrderStatus = "open" | "paid" | "shipped";
            type Logger (src/logger.ts):
              | interface Logger {
              |   info(msg: string): void;
              |   warn(msg: string): void;
              | }
            import: import { EventEmitter } from "events";
            import: import type { Logger } from "./logger";
            indent: "    "
            line: "    " $0 ""
        "#]],
    );
}

#[test]
fn tsx_component_sees_props_type() {
    check(
        "tsx",
        r#"import React, { useState } from "react";

type ButtonProps = {
  label: string;
  onClick: () => void;
};

export function Counter({ label }: ButtonProps) {
  const [count, setCount] = useState(0);
  const increment = () => {
    setCount(count + 1);
  };
  const reset = () => {
    $0
  };
  return <button onClick={increment}>{label}: {count}</button>;
}
"#,
        &[],
        expect![[r#"
            cursor: Code
            scope Function: function Counter({ label }: ButtonProps)
            scope Function: reset = () =>
            signature: increment = () =>
            signature: function Counter({ label }: ButtonProps)
            signature: reset = () =>
            type ButtonProps (this file):
              | type ButtonProps = {
              |   label: string;
              |   onClick: () => void;
              | };
            import: import React, { useState } from "react";
            indent: "    "
            line: "    " $0 ""
        "#]],
    );
}

#[test]
fn javascript_method_sees_class_from_other_document() {
    check(
        "javascript",
        r#"import { Parser } from "./parser.js";

export class Interpreter {
  constructor(source) {
    this.parser = new Parser(source);
    this.env = new Map();
  }

  evaluate(node) {
    switch (node.type) {
      case "number":
        return node.value;
      default:
        $0
    }
  }
}
"#,
        &[(
            "src/parser.js",
            "export class Parser {\n  constructor(source) {\n    this.source = source;\n    this.pos = 0;\n  }\n\n  next() {\n    return this.source[this.pos++];\n  }\n}\n",
        )],
        expect![[r#"
            cursor: Code
            scope Class: class Interpreter
            scope Function: evaluate(node)
            signature: constructor(source)
            signature: evaluate(node)
            type Parser (src/parser.js):
              | class Parser {
              |   constructor(source) {
              |     this.source = source;
              |     this.pos = 0;
              |   }
              | 
              |   next() {
              |     return this.source[this.pos++];
              |   }
              | }
            import: import { Parser } from "./parser.js";
            indent: "        "
            line: "        " $0 ""
        "#]],
    );
}

#[test]
fn go_method_sees_struct_and_interface() {
    check(
        "go",
        r#"package inventory

import (
	"errors"
	"fmt"
)

var ErrNotFound = errors.New("not found")

type Item struct {
	SKU   string
	Count int
}

type Store interface {
	Get(sku string) (Item, error)
	Put(item Item) error
}

type Warehouse struct {
	store Store
}

func NewWarehouse(s Store) *Warehouse {
	return &Warehouse{store: s}
}

func (w *Warehouse) Remove(sku string, n int) error {
	item, err := w.store.Get(sku)
	if err != nil {
		return fmt.Errorf("remove %s: %w", sku, err)
	}
	$0
}
"#,
        &[],
        expect![[r#"
            cursor: Code
            scope Function: func (w *Warehouse) Remove(sku string, n int) error
            signature: func NewWarehouse(s Store) *Warehouse
            signature: func (w *Warehouse) Remove(sku string, n int) error
            type Item (this file):
              | type Item struct {
              | 	SKU   string
              | 	Count int
              | }
            type Store (this file):
              | type Store interface {
              | 	Get(sku string) (Item, error)
              | 	Put(item Item) error
              | }
            type Warehouse (this file):
              | type Warehouse struct {
              | 	store Store
              | }
            import: import (
              | 	"errors"
              | 	"fmt"
              | )
            indent: "\t"
            line: "\t" $0 ""
        "#]],
    );
}

#[test]
fn c_function_sees_struct_and_typedef_from_header() {
    check(
        "c",
        r#"#include <stdlib.h>
#include <string.h>
#include "buffer.h"

static size_t grow(size_t cap) {
    return cap ? cap * 2 : 16;
}

int buffer_append(buffer_t *buf, const char *data, size_t len) {
    if (buf->len + len > buf->cap) {
        size_t cap = grow(buf->cap);
        $0
    }
    return 0;
}
"#,
        &[(
            "include/buffer.h",
            "#ifndef BUFFER_H\n#define BUFFER_H\n#include <stddef.h>\n\ntypedef struct buffer {\n    char *data;\n    size_t len;\n    size_t cap;\n} buffer_t;\n\nint buffer_append(buffer_t *buf, const char *data, size_t len);\n#endif\n",
        )],
        expect![[r#"
            cursor: Code
            scope Function: int buffer_append(buffer_t *buf, const char *data, size_t len)
            signature: static size_t grow(size_t cap)
            signature: int buffer_append(buffer_t *buf, const char *data, size_t len)
            type buffer_t (include/buffer.h):
              | typedef struct buffer {
              |     char *data;
              |     size_t len;
              |     size_t cap;
              | } buffer_t;
            import: #include <stdlib.h>
            import: #include <string.h>
            import: #include "buffer.h"
            indent: "        "
            line: "        " $0 ""
        "#]],
    );
}

#[test]
fn cpp_method_sees_class_in_namespace() {
    check(
        "cpp",
        r#"#include <string>
#include <vector>
using std::string;

namespace geo {

struct Vec2 {
    double x, y;
};

class Polygon {
public:
    explicit Polygon(std::vector<Vec2> pts) : pts_(std::move(pts)) {}

    double area() const {
        double sum = 0;
        for (size_t i = 0; i < pts_.size(); ++i) {
            const Vec2 &a = pts_[i];
            $0
        }
        return sum / 2;
    }

private:
    std::vector<Vec2> pts_;
};

}  // namespace geo
"#,
        &[],
        expect![[r#"
            cursor: Code
            scope Class: class Polygon
            scope Function: double area() const
            signature: explicit Polygon(std::vector<Vec2> pts) : pts_(std::move(pts))
            signature: double area() const
            type Vec2 (this file):
              | struct Vec2 {
              |     double x, y;
              | }
            import: #include <string>
            import: #include <vector>
            import: using std::string;
            indent: "            "
            line: "            " $0 ""
        "#]],
    );
}

#[test]
fn java_method_sees_record_and_enum() {
    check(
        "java",
        r#"package com.example.bank;

import java.math.BigDecimal;
import java.util.ArrayList;
import java.util.List;

public class Account {
    public enum Kind { CHECKING, SAVINGS }

    public record Transaction(String id, BigDecimal amount) {}

    private final Kind kind;
    private final List<Transaction> history = new ArrayList<>();

    public Account(Kind kind) {
        this.kind = kind;
    }

    public BigDecimal balance() {
        BigDecimal total = BigDecimal.ZERO;
        for (Transaction t : history) {
            $0
        }
        return total;
    }
}
"#,
        &[],
        expect![[r#"
            cursor: Code
            scope Class: public class Account
            scope Function: public BigDecimal balance()
            signature: public Account(Kind kind)
            signature: public BigDecimal balance()
            type Kind (this file):
              | public enum Kind { CHECKING, SAVINGS }
            type Transaction (this file):
              | public record Transaction(String id, BigDecimal amount) {}
            import: import java.math.BigDecimal;
            import: import java.util.ArrayList;
            import: import java.util.List;
            indent: "            "
            line: "            " $0 ""
        "#]],
    );
}

#[test]
fn cursor_kind_in_comments_strings_and_interpolations() {
    use CursorKind::{Code, Comment, String};
    let cases = [
        ("python", "x = 1  # note $0\n", Comment),
        ("python", "x = 1  # note$0", Comment),
        ("python", "x = 1  $0# note\n", Code),
        ("python", "s = \"ab$0c\"\n", String),
        ("python", "s = \"abc\"$0\n", Code),
        ("python", "s = f\"a {x$0} b\"\n", Code),
        ("python", "s = f\"a {x} $0b\"\n", String),
        ("python", "def f():\n    \"\"\"Doc$0\"\"\"\n", String),
        ("rust", "/// Doc$0\nfn f() {}\n", Comment),
        ("rust", "fn f() { /* c */$0 }\n", Code),
        ("rust", "fn f() { /* c$0 */ }\n", Comment),
        ("rust", "fn f() { let s = \"a$0\"; }\n", String),
        ("rust", "fn f() { let s = r#\"a$0\"#; }\n", String),
        ("rust", "fn f() { let c = 'a'; $0 }\n", Code),
        ("typescript", "const s = `a ${b$0} c`;\n", Code),
        ("typescript", "const s = `a $0${b} c`;\n", String),
        ("tsx", "const a = <div className=\"x$0\" />;\n", String),
        ("javascript", "let x = 1; // todo$0", Comment),
        ("go", "// Package x does$0\npackage x\n", Comment),
        ("go", "package x\n\nvar s = `raw$0`\n", String),
        ("c", "int x; /* multi\n line$0 */\n", Comment),
        ("cpp", "auto s = R\"(raw$0)\";\n", String),
        ("java", "class A { String s = \"\"\"\n  text$0\"\"\"; }\n", String),
        ("java", "class A { void f() { int x = 1;$0 } }\n", Code),
        // Still being typed: the parser sees an error, the lexical reading decides.
        ("python", "x = \"abc$0", String),
        ("python", "def f():\n    \"\"\"Doc$0\n", String),
        ("python", "def f():\n    \"\"\"Doc\n    more$0\n", String),
        ("python", "x = 'a' + \"b$0\ny = 2\n", String),
        ("rust", "fn f() { let s = \"abc$0 }\n", String),
        ("typescript", "const s = `abc$0\n", String),
        ("typescript", "const s = \"a\\\"b$0\nlet y = 2;\n", String),
        ("go", "package x\nvar s = \"abc$0\n", String),
        ("java", "class A { String s = \"abc$0 }\n", String),
        ("c", "/* open comment$0\n", Comment),
        ("cpp", "int x = (1 + ; // broken$0\n", Comment),
        ("typescript", "const s = (\"done\" + ;$0\n", Code),
    ];
    for (language, fixture, want) in cases {
        assert_eq!(cursor_kind(language, fixture), want, "{language}: {fixture:?}");
    }
}

#[test]
fn python_blank_indented_line_after_a_block_stays_in_the_block() {
    let source = "class A:\n    def f(self):\n        return 1\n\n";
    let scopes = |cursor_line: &str| {
        let fixture = format!("{source}{cursor_line}\n\ndef g():\n    pass\n");
        context_at("python", &fixture, &[], &Limits::default())
            .enclosing_scopes
            .into_iter()
            .map(|s| s.signature_text)
            .collect::<Vec<_>>()
    };
    assert_eq!(scopes("        $0"), ["class A:", "def f(self):"]);
    assert_eq!(scopes("    $0"), ["class A:"]);
    assert_eq!(scopes("$0"), Vec::<std::string::String>::new());
}

#[test]
fn brace_scope_ends_at_its_closing_brace() {
    let cx = context_at(
        "rust",
        "impl A {\n    fn f() {\n    }$0\n    fn g() {}\n}\n",
        &[],
        &Limits::default(),
    );
    let kinds: Vec<_> = cx
        .enclosing_scopes
        .iter()
        .map(|s| s.signature_text.as_str())
        .collect();
    assert_eq!(kinds, ["impl A"]);
    let signatures: Vec<_> = cx.signatures.iter().map(|s| s.signature_text.as_str()).collect();
    assert_eq!(signatures, ["fn f()"]);
}

#[test]
fn sibling_signatures_are_the_functions_before_the_cursor_in_the_same_scope() {
    check(
        "python",
        r#"def top_a():
    def nested():
        pass

class Other:
    def method(self):
        pass

def top_b(x):
    return x

def current():
    $0

def after():
    pass
"#,
        &[],
        expect![[r#"
            cursor: Code
            scope Function: def current():
            signature: def top_a():
            signature: def top_b(x):
            signature: def current():
            indent: "    "
            line: "    " $0 ""
        "#]],
    );
}

#[test]
fn types_are_those_named_near_the_cursor() {
    let mut fixture = std::string::String::from("class Far:\n    pass\n\nclass Near:\n    pass\n\n");
    fixture.push_str("x = Far()\n");
    fixture.push_str(&"pass\n".repeat(40));
    fixture.push_str("y = Near()\n$0\n");
    let cx = context_at("python", &fixture, &[], &Limits::default());
    let names: Vec<_> = cx.type_definitions.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["Near"]);
}

#[test]
fn caps_bound_every_list_and_text() {
    let mut fixture = std::string::String::new();
    for i in 0..20 {
        fixture.push_str(&format!("import mod{i}\n"));
    }
    for i in 0..10 {
        fixture.push_str(&format!("class T{i}:\n{}\n", "    field: int = 0\n".repeat(10)));
    }
    for i in 0..10 {
        fixture.push_str(&format!("def f{i}(a, b):\n    pass\n"));
    }
    let uses: Vec<_> = (0..10).map(|i| format!("T{i}")).collect();
    fixture.push_str(&format!(
        "x = [{}]  # {}$0{}\n",
        uses.join(", "),
        "é".repeat(50),
        "中".repeat(50)
    ));
    let limits = Limits {
        signatures: 3,
        type_defs: 4,
        type_def_chars: 40,
        type_defs_total_chars: 100,
        imports: 5,
        line_part_chars: 10,
        ..Limits::default()
    };
    let cx = context_at("python", &fixture, &[], &limits);
    let signatures: Vec<_> = cx.signatures.iter().map(|s| s.signature_text.as_str()).collect();
    assert_eq!(signatures, ["def f7(a, b):", "def f8(a, b):", "def f9(a, b):"]);
    assert_eq!(cx.imports.len(), 5);
    assert!(cx.type_definitions.len() <= 4);
    assert!(cx
        .type_definitions
        .iter()
        .all(|t| t.truncated && t.text.chars().count() <= 40));
    assert!(
        cx.type_definitions
            .iter()
            .map(|t| t.text.chars().count())
            .sum::<usize>()
            <= 100
    );
    assert_eq!(cx.type_definitions[0].text, "class T0:\n    field: int = 0");
    assert_eq!(cx.line_prefix, "é".repeat(10));
    assert_eq!(cx.line_suffix, "中".repeat(10));
}

#[test]
fn cursor_line_parts_are_exact_with_tabs_and_crlf() {
    let cx = context_at(
        "go",
        "package x\r\n\r\nfunc f() {\r\n\t  \tx := 1$0 + 2\r\n}\r\n",
        &[],
        &Limits::default(),
    );
    assert_eq!(cx.indent, "\t  \t");
    assert_eq!(cx.line_prefix, "\t  \tx := 1");
    assert_eq!(cx.line_suffix, " + 2");
    assert_eq!(cx.enclosing_scopes.len(), 1);
}

#[test]
fn odd_cursors_do_not_panic() {
    let l = Language::from_name("rust").unwrap();
    for text in ["", "é", "fn f() { \"中\" }", "\r\n\r\n"] {
        let tree = parse(l, text, None).unwrap();
        for cursor in 0..text.len() + 3 {
            let cx = extract(l, text, &tree, cursor, &[]);
            assert!(cx.line_prefix.len() + cx.line_suffix.len() <= text.len());
        }
    }
}

/// A Python file of `lines` lines or more: imports, then classes with methods that
/// reference each other's types.
pub(crate) fn big_python_file(lines: usize) -> String {
    let mut s = std::string::String::from("import os\nimport sys\nfrom typing import Optional\n\n");
    let mut i = 0usize;
    while s.lines().count() < lines {
        s.push_str(&format!(
            "class Model{i}:\n    \"\"\"Model number {i}.\"\"\"\n\n    def __init__(self, parent: Optional[Model{p}] = None):\n        self.parent = parent\n        self.items = []\n\n    def total(self) -> int:\n        # sum the items\n        result = 0\n        for item in self.items:\n            if item.weight > {i}:\n                result += item.weight * 2\n            else:\n                result -= len(str(item))\n        return result\n\n    def describe(self) -> str:\n        return f\"Model{i}({{self.total()}})\"\n\n\n",
            p = i.saturating_sub(1)
        ));
        i += 1;
    }
    s
}

/// A Rust file of `lines` lines or more, in the same spirit.
pub(crate) fn big_rust_file(lines: usize) -> String {
    let mut s = std::string::String::from("use std::collections::HashMap;\nuse std::fmt;\n\n");
    let mut i = 0usize;
    while s.lines().count() < lines {
        s.push_str(&format!(
            "pub struct Model{i} {{\n    parent: Option<Box<Model{p}>>,\n    items: Vec<u64>,\n}}\n\nimpl Model{i} {{\n    pub fn total(&self) -> u64 {{\n        // sum the items\n        let mut result = 0;\n        for item in &self.items {{\n            if *item > {i} {{\n                result += item * 2;\n            }} else {{\n                result -= 1;\n            }}\n        }}\n        result\n    }}\n\n    pub fn describe(&self) -> String {{\n        format!(\"Model{i}({{}})\", self.total())\n    }}\n}}\n\n",
            p = i.saturating_sub(1)
        ));
        i += 1;
    }
    s
}

/// Median wall time of `extract` at the middle `total`/`describe` of a 5,000-line file,
/// with two more such files open. Printed (`--nocapture`); the bound only catches a
/// pathological regression, the real budget (≪ 5 ms) is checked in release runs.
#[test]
fn extract_on_a_5000_line_file_is_fast() {
    for (language, text) in [("python", big_python_file(5_000)), ("rust", big_rust_file(5_000))] {
        let l = Language::from_name(language).unwrap();
        let tree = parse(l, &text, None).unwrap();
        let cursor = text[..text.len() / 2].rfind("result = 0").unwrap() + "result = 0".len();
        let others: Vec<_> = (0..2).map(|_| (text.clone(), tree.clone())).collect();
        let other_docs: Vec<_> = others
            .iter()
            .map(|(text, tree)| OpenDocument {
                path: "other",
                text,
                tree,
                language: l,
            })
            .collect();
        let mut times = Vec::new();
        let mut cx = None;
        for _ in 0..21 {
            let t = std::time::Instant::now();
            cx = Some(extract(l, &text, &tree, cursor, &other_docs));
            times.push(t.elapsed());
        }
        times.sort();
        let cx = cx.unwrap();
        println!(
            "{language}: {} lines, {} bytes: extract median {:?} (min {:?}); {} scopes, {} signatures, {} types, {} imports",
            text.lines().count(),
            text.len(),
            times[times.len() / 2],
            times[0],
            cx.enclosing_scopes.len(),
            cx.signatures.len(),
            cx.type_definitions.len(),
            cx.imports.len()
        );
        assert_eq!(cx.enclosing_scopes.len(), 2);
        assert!(!cx.type_definitions.is_empty());
        assert!(times[times.len() / 2] < std::time::Duration::from_millis(100));
    }
}

/// Half-typed code makes the parser recover with an `ERROR` node; the scopes around the
/// cursor are still found (the text is parsed again with a filler at the cursor).
#[test]
fn scopes_survive_a_statement_still_being_typed() {
    let scopes = |language: &str, fixture: &str| {
        context_at(language, fixture, &[], &Limits::default())
            .enclosing_scopes
            .into_iter()
            .map(|s| s.signature_text)
            .collect::<Vec<_>>()
    };
    let cases: &[(&str, &str, &[&str])] = &[
        // An unclosed block takes the function's closing brace: without repair the parser
        // finds no function around the cursor.
        (
            "rust",
            "impl Tree {\n    fn depth(&self) -> usize {\n        if self.children.is_empty() {$0\n    }\n}\n",
            &["impl Tree", "fn depth(&self) -> usize"],
        ),
        (
            "rust",
            "fn kind(x: u8) -> &'static str {\n    match x {$0\n}\n",
            &["fn kind(x: u8) -> &'static str"],
        ),
        // An open call swallows the next definition into the signature without repair.
        (
            "python",
            "def f(x):\n    return g(x,$0\n\ndef h():\n    pass\n",
            &["def f(x):"],
        ),
        // Loop headers without a body already parse to the right scopes; kept as guards.
        (
            "python",
            "class Walker:\n    def walk(self, root):\n        for entry in os.scandir(root):\n            $0\n",
            &["class Walker:", "def walk(self, root):"],
        ),
        (
            "c",
            "int count(const char *s) {\n    int n = 0;\n    while (*s++)\n        $0\n}\n",
            &["int count(const char *s)"],
        ),
    ];
    for (language, fixture, want) in cases {
        assert_eq!(scopes(language, fixture), *want, "{language}: {fixture:?}");
    }
}

/// A signature over several lines, inside an `impl`, keeps its continuation lines where they
/// stand relative to its first line (dedented by the method's own indentation).
#[test]
fn multi_line_signatures_are_dedented_as_a_whole() {
    check(
        "rust",
        r#"impl Parser {
    pub fn parse_response<'b>(
        &self,
        buf: &'b [u8],
    ) -> Result<usize> {
        Ok(0)
    }

    fn next(
        &mut self,
    ) -> Option<u8> {
        $0
    }
}
"#,
        &[],
        expect![[r#"
            cursor: Code
            scope Class: impl Parser
            scope Function: fn next(
                &mut self,
            ) -> Option<u8>
            signature: pub fn parse_response<'b>(
                &self,
                buf: &'b [u8],
            ) -> Result<usize>
            signature: fn next(
                &mut self,
            ) -> Option<u8>
            indent: "        "
            line: "        " $0 ""
        "#]],
    );
}

/// A signature longer than [`Limits::signature_chars`] keeps its whole lines.
#[test]
fn long_signatures_are_clipped_at_a_line_end() {
    let fixture = "def f(\n    alpha,\n    beta,\n    gamma,\n):\n    x = 1\n    $0\n";
    let limits = Limits {
        signature_chars: 33,
        ..Limits::default()
    };
    let cx = context_at("python", fixture, &[], &limits);
    let scopes: Vec<_> = cx
        .enclosing_scopes
        .iter()
        .map(|s| s.signature_text.as_str())
        .collect();
    assert_eq!(scopes, ["def f(\n    alpha,\n    beta,"]);
}
