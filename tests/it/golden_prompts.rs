//! Golden prompts, one per language: the exact text the pipeline sends to the model for a
//! fixture with a `$0` cursor, with a prompt budget small enough that the prefix window cuts
//! the top of the file, so the imports and definitions that context extraction brings back
//! show. A change to prompt layout, budget arithmetic or context extraction shows up here as
//! a diff (`UPDATE_EXPECT=1 cargo test --test it golden_prompts::` rewrites the expectations).

use expect_test::{expect, Expect};
use laya::{
    completion::pipeline::{CompletionSettings, Pipeline, Request, Trigger},
    document::Document,
    engine::Cancel,
    prompt::Budget,
};

use crate::support::engine::FakeEngine;

fn check(language: &str, file: &str, fixture: &str, expect: Expect) {
    let budget = Budget {
        max_tokens: 64,
        suffix_share: Some(0.2),
        context_share: 0.5,
    };
    expect.assert_eq(&prompt_for(language, file, fixture, budget, None));
}

/// The prompt the pipeline sends for `fixture` within `budget`, to a model of `parameters`.
fn prompt_for(language: &str, file: &str, fixture: &str, budget: Budget, parameters: Option<u64>) -> String {
    let settings = CompletionSettings {
        budget,
        ..CompletionSettings::default()
    };
    prompt_with(language, file, fixture, &settings, parameters)
}

/// The prompt the pipeline sends for `fixture` with `settings`, to a model of `parameters`.
fn prompt_with(
    language: &str,
    file: &str,
    fixture: &str,
    settings: &CompletionSettings,
    parameters: Option<u64>,
) -> String {
    let cursor = fixture.find("$0").expect("$0 in the fixture");
    let text = fixture.replace("$0", "");
    let doc = Document::new(&text, 1, language).snapshot(&format!("file:///repo/{file}"));
    // Records the prompt and answers nothing.
    let engine = FakeEngine::scripted(|_| vec![])
        .with_parameters(parameters)
        .shared();
    let pipeline = Pipeline::new(engine.clone());
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(pipeline.complete(
        Request {
            doc: &doc,
            others: &[],
            cursor,
            trigger: Trigger::Invoked,
            settings,
            workspace_root: Some("file:///repo"),
            workspace: None,
        },
        Cancel::new(),
    ))
    .unwrap();
    engine.last_prompt()
}

/// Unset, the suffix share follows the model's size: a few lines of suffix for a model under
/// 1B parameters, about three times as much for larger or unknown (remote) ones; a configured
/// share wins over both.
#[test]
fn suffix_share_follows_the_model_size() {
    let body: String = (0..60).map(|i| format!("    let v{i} = {i};\n")).collect();
    let fixture = format!("fn main() {{\n    $0\n{body}}}\n");
    let suffix_of = |budget: Budget, parameters: Option<u64>| {
        let p = prompt_for("rust", "main.rs", &fixture, budget, parameters);
        let start = p.find("<|fim_suffix|>").expect("suffix marker") + "<|fim_suffix|>".len();
        let end = p.find("<|fim_middle|>").expect("middle marker");
        p[start..end].len()
    };
    let auto = Budget::default();
    let small = suffix_of(auto.clone(), Some(494_000_000));
    let large = suffix_of(auto.clone(), Some(1_540_000_000));
    let unknown = suffix_of(auto.clone(), None);
    let total = auto.max_tokens * laya::prompt::BYTES_PER_TOKEN;
    assert!(
        small <= (total as f32 * 0.02) as usize && small > 0,
        "small model: {small} bytes"
    );
    assert!(
        large > 2 * small && large <= (total as f32 * 0.06) as usize,
        "1.5B: {large} vs {small} bytes"
    );
    assert_eq!(unknown, large, "an unknown size gets the larger models' share");
    let fixed = Budget {
        suffix_share: Some(0.02),
        ..Budget::default()
    };
    assert_eq!(
        suffix_of(fixed, Some(1_540_000_000)),
        small,
        "a configured share wins"
    );
}

#[test]
fn python() {
    check(
        "python",
        "shapes.py",
        r#"import math
from dataclasses import dataclass


@dataclass
class Point:
    x: float
    y: float


def distance(a: Point, b: Point) -> float:
    dx = a.x - b.x
    dy = a.y - b.y
    return math.hypot(dx, dy)


def perimeter(points: list[Point]) -> float:
    total = 0.0
    for i in range(len(points)):
        $0
    return total
"#,
        expect![[r#"
            <|fim_prefix|>import math
            class Point:
                x: float
                y: float
            def perimeter(points: list[Point]) -> float:

                total = 0.0
                for i in range(len(points)):
                    <|fim_suffix|>
                return total
            <|fim_middle|>"#]],
    );
}

#[test]
fn rust() {
    check(
        "rust",
        "src/geo.rs",
        r#"use std::collections::HashMap;

pub struct Point {
    pub x: f64,
    pub y: f64,
}

pub fn distance(a: &Point, b: &Point) -> f64 {
    ((a.x - b.x).powi(2) + (a.y - b.y).powi(2)).sqrt()
}

pub fn nearest(points: &[Point], to: &Point) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for (i, p) in points.iter().enumerate() {
        $0
    }
    best.map(|(i, _)| i)
}
"#,
        expect![[r#"
            <|fim_prefix|>use std::collections::HashMap;
            pub fn nearest(points: &[Point], to: &Point) -> Option<usize> {

                for (i, p) in points.iter().enumerate() {
                    <|fim_suffix|>
                }
                best.map(|(i, _)| i)
            }
            <|fim_middle|>"#]],
    );
}

#[test]
fn typescript() {
    check(
        "typescript",
        "src/cart.ts",
        r#"import { Money } from "./money";

interface Item {
  name: string;
  price: Money;
  quantity: number;
}

export function lineTotal(item: Item): Money {
  return item.price.times(item.quantity);
}

export function cartTotal(items: Item[]): Money {
  let total = Money.zero();
  for (const item of items) {
    $0
  }
  return total;
}
"#,
        expect![[r#"
            <|fim_prefix|>function lineTotal(item: Item): Money { ... }
            function cartTotal(items: Item[]): Money {

              let total = Money.zero();
              for (const item of items) {
                <|fim_suffix|>
              }
              return total;
            }
            <|fim_middle|>"#]],
    );
}

#[test]
fn javascript() {
    check(
        "javascript",
        "lib/queue.js",
        r#"const { EventEmitter } = require("events");

class Queue extends EventEmitter {
  constructor(limit) {
    super();
    this.limit = limit;
    this.items = [];
  }

  push(item) {
    if (this.items.length >= this.limit) {
      $0
    }
    this.items.push(item);
  }
}
"#,
        expect![[r#"
            <|fim_prefix|>class Queue extends EventEmitter {
              constructor(limit) { ... }

              }

              push(item) {
                if (this.items.length >= this.limit) {
                  <|fim_suffix|>
                }
                this.items.push(item);
              }
            <|fim_middle|>"#]],
    );
}

#[test]
fn go() {
    check(
        "go",
        "store/store.go",
        r#"package store

import (
	"errors"
	"sync"
)

type Store struct {
	mu   sync.Mutex
	data map[string]string
}

var ErrMissing = errors.New("missing")

func (s *Store) Get(key string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	$0
}
"#,
        expect![[r#"
            <|fim_prefix|>import (
            	"errors"
            	"sync"
            )
            type Store struct {
            	mu   sync.Mutex
            	data map[string]string
            }


            func (s *Store) Get(key string) (string, error) {
            	s.mu.Lock()
            	defer s.mu.Unlock()
            	<|fim_suffix|>
            }
            <|fim_middle|>"#]],
    );
}

#[test]
fn c() {
    check(
        "c",
        "src/buf.c",
        r#"#include <stdlib.h>
#include <string.h>

struct buf {
    char *data;
    size_t len;
    size_t cap;
};

int buf_grow(struct buf *b, size_t need) {
    if (b->cap >= need)
        return 0;
    size_t cap = b->cap ? b->cap * 2 : 16;
    while (cap < need)
        $0
    return 0;
}
"#,
        expect![[r#"
            <|fim_prefix|>#include <stdlib.h>
            #include <string.h>
            int buf_grow(struct buf *b, size_t need) {

                size_t cap = b->cap ? b->cap * 2 : 16;
                while (cap < need)
                    <|fim_suffix|>
                return 0;
            }
            <|fim_middle|>"#]],
    );
}

#[test]
fn cpp() {
    check(
        "cpp",
        "src/stack.cpp",
        r#"#include <vector>
#include <stdexcept>

template <typename T>
class Stack {
public:
    void push(const T& v) { items_.push_back(v); }
    T pop() {
        if (items_.empty()) {
            $0
        }
        T v = items_.back();
        items_.pop_back();
        return v;
    }
private:
    std::vector<T> items_;
};
"#,
        expect![[r#"
            <|fim_prefix|>#include <vector>
            #include <stdexcept>

            class Stack {
            public:
                void push(const T& v) { items_.push_back(v); }
                T pop() {
                    if (items_.empty()) {
                        <|fim_suffix|>
                    }
            <|fim_middle|>"#]],
    );
}

#[test]
fn java() {
    check(
        "java",
        "src/main/java/demo/Account.java",
        r#"package demo;

import java.math.BigDecimal;

public class Account {
    private BigDecimal balance = BigDecimal.ZERO;

    public void deposit(BigDecimal amount) {
        balance = balance.add(amount);
    }

    public void withdraw(BigDecimal amount) {
        if (balance.compareTo(amount) < 0) {
            $0
        }
        balance = balance.subtract(amount);
    }
}
"#,
        expect![[r#"
            <|fim_prefix|>public class Account {
                public void deposit(BigDecimal amount) { ... }

                public void withdraw(BigDecimal amount) {
                    if (balance.compareTo(amount) < 0) {
                        <|fim_suffix|>
                    }
            <|fim_middle|>"#]],
    );
}
