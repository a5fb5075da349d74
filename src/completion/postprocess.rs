//! Rules applied to a generated middle before it is shown. They also make instruct models that
//! do not end a fill-in-the-middle answer by themselves usable.
//!
//! In order:
//! 1. cut where the middle starts re-creating the text after the cursor (the suffix);
//! 2. a cursor in the middle of a line gets a single-line completion;
//! 3. a multi-line completion stops at the first line indented less than the cursor's block;
//! 4. trailing whitespace is trimmed, and an empty result is no completion at all;
//! 5. closing brackets and quotes that already follow the cursor are not inserted twice: when
//!    the completion ends with the rest of the line, the item replaces that rest instead;
//! 6. an answer whose first line, completed as the cursor's line, is the next non-blank line
//!    after the cursor is no completion: accepting it would leave that line twice (a model
//!    that skips to the suffix writes it; single-line and block answers alike).
//!
//! Rules 1 and 3 are also handed to the engine for a block ([`block_end`]), which stops
//! decoding where they would cut: what is shown is the same, without the tokens after.

use crate::engine::LineEnd;

/// The text around the cursor that the rules look at.
#[derive(Clone, Copy, Debug)]
pub struct Surroundings<'a> {
    /// Everything before the cursor's line (its line break included).
    pub before_line: &'a str,
    /// Text of the cursor's line before the cursor.
    pub line_prefix: &'a str,
    /// Text of the cursor's line after the cursor (without the line break).
    pub line_suffix: &'a str,
    /// Everything after the cursor's line.
    pub after_line: &'a str,
}

impl<'a> Surroundings<'a> {
    /// Split `text` at byte `cursor` (which must be a char boundary).
    pub fn at(text: &'a str, cursor: usize) -> Self {
        let (before, after) = text.split_at(cursor);
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let (before_line, line_prefix) = before.split_at(line_start);
        let eol = after.find('\n').unwrap_or(after.len());
        let line_suffix = after[..eol].strip_suffix('\r').unwrap_or(&after[..eol]);
        let after_line = after.get(eol + 1..).unwrap_or("");
        Surroundings {
            before_line,
            line_prefix,
            line_suffix,
            after_line,
        }
    }

    fn mid_line(&self) -> bool {
        !self.line_suffix.trim().is_empty() && !only_closers(self.line_suffix.trim())
    }

    /// Whether the cursor starts the body of a block that holds nothing yet, where the text to
    /// come is several lines: at the end of a line that opens a block, or on a line of only
    /// whitespace after one, with the next line that carries text indented no deeper than the
    /// opener (or none); or on a line of only whitespace with nothing but whitespace after it.
    /// Elsewhere a blank line inside code is one more line of a block already written.
    pub fn starts_empty_block(&self) -> bool {
        if !self.line_suffix.trim().is_empty() {
            return false;
        }
        let next = self.after_line.lines().find(|l| !l.trim().is_empty());
        let opener = if self.line_prefix.trim().is_empty() {
            if next.is_none() {
                return true;
            }
            match self.before_line.lines().rev().find(|l| !l.trim().is_empty()) {
                Some(l) => l,
                None => return false,
            }
        } else {
            self.line_prefix
        };
        opens_block(opener) && next.is_none_or(|n| indent_of(n).len() <= indent_of(opener).len())
    }
}

/// Whether a line of code ends by opening a block or a bracketed list.
fn opens_block(line: &str) -> bool {
    let code = line.trim();
    code.ends_with(['{', '(', '[', ':'])
        || code.ends_with("=>")
        || code.ends_with("->")
        || [" do", " then", " else"].iter().any(|k| code.ends_with(k))
        || code == "else"
        || code == "do"
}

/// What to insert at the cursor, and how many bytes after the cursor it replaces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Edit {
    pub text: String,
    pub replace_len: usize,
}

fn is_closer(c: char) -> bool {
    matches!(c, ')' | ']' | '}' | '"' | '\'' | '`' | ';' | ',' | '>')
}

fn only_closers(s: &str) -> bool {
    s.chars().all(|c| is_closer(c) || c == ' ')
}

fn indent_of(line: &str) -> &str {
    &line[..line.len() - line.trim_start().len()]
}

/// Apply every rule to the raw model output; `None` when nothing worth showing is left.
pub fn process(raw: &str, s: &Surroundings) -> Option<Edit> {
    let suffix = model_suffix(s);
    // On a line indented already and holding nothing else, indentation at the start of the
    // answer is that indentation again (models write lines from column 0 after a prompt that
    // ends in spaces): it is not inserted twice.
    let raw = if !s.line_prefix.is_empty() && s.line_prefix.trim().is_empty() {
        raw.trim_start_matches(|c: char| c.is_whitespace() && c != '\n' && c != '\r')
    } else {
        raw
    };
    let mut text = cut_suffix_repeat(raw, &suffix);
    if s.mid_line() {
        text.truncate(text.find('\n').unwrap_or(text.len()));
    } else {
        text = stop_at_dedent(&text, s.line_prefix);
    }
    let text = text.trim_end().to_owned();
    if text.trim().is_empty() {
        return None;
    }
    let edit = merge_closers(text, s.line_suffix);
    (!repeats_next_line(&edit, s)).then_some(edit)
}

/// Whether the cursor's line as `edit` leaves it (the text before the cursor, the edit's first
/// line and, for a one-line edit, what stays after it) is the next non-blank line after the
/// cursor's line, indentation included (trailing whitespace aside).
pub fn repeats_next_line(edit: &Edit, s: &Surroundings) -> bool {
    let Some(next) = s.after_line.lines().find(|l| !l.trim().is_empty()) else {
        return false;
    };
    let (first, rest_of_line) = match edit.text.split_once('\n') {
        Some((first, _)) => (first, ""),
        None => (
            edit.text.as_str(),
            s.line_suffix.get(edit.replace_len..).unwrap_or(""),
        ),
    };
    let line = format!("{}{first}{rest_of_line}", s.line_prefix);
    line.trim_end() == next.trim_end()
}

/// The suffix as the model saw it: the rest of the cursor's line, then the following lines.
fn model_suffix(s: &Surroundings) -> String {
    format!("{}\n{}", s.line_suffix, s.after_line)
}

/// The first line of `suffix` that carries code (at least 3 non-blank characters), trimmed:
/// a middle that starts one of its later lines with it is writing the suffix again.
fn suffix_anchor(suffix: &str) -> Option<&str> {
    suffix.lines().map(str::trim).find(|l| l.len() >= 3)
}

/// Where the engine may end a block answer at the cursor as it decodes, by the rules below
/// that cut a block (the suffix written again, the first line indented less than the
/// cursor's block), so that no token these rules would throw away is decoded; `max_lines`
/// bounds the block besides.
pub fn block_end(s: &Surroundings, max_lines: Option<usize>) -> LineEnd {
    LineEnd {
        dedent_below: Some(block_indent(s.line_prefix)),
        repeats: suffix_anchor(&model_suffix(s)).unwrap_or_default().to_owned(),
        max_lines,
    }
}

/// Cut `middle` where it starts re-creating the text after the cursor: at the first line of
/// `suffix` that carries code (at least 3 non-blank characters), when the middle contains it
/// at the start of one of its lines.
pub fn cut_suffix_repeat(middle: &str, suffix: &str) -> String {
    let Some(anchor) = suffix_anchor(suffix) else {
        return middle.trim_end().to_owned();
    };
    let mut line_start = 0;
    for line in middle.split_inclusive('\n') {
        // The first line continues the cursor's line; only later lines can re-create the suffix.
        if line_start > 0 && line.trim_start().starts_with(anchor) {
            return middle[..line_start].trim_end().to_owned();
        }
        line_start += line.len();
    }
    middle.trim_end().to_owned()
}

/// Keep lines until one (after the first) is indented less than the cursor's block. The
/// block's indentation is the cursor line's: its text before the cursor when that is blank,
/// else that line's leading whitespace.
fn stop_at_dedent(text: &str, line_prefix: &str) -> String {
    let block = block_indent(line_prefix);
    let mut out = String::new();
    for (i, line) in text.split_inclusive('\n').enumerate() {
        // The first line's indentation is relative to the cursor, not to column 0.
        let indent = if i == 0 {
            line_prefix.len() + indent_of(line).len()
        } else {
            indent_of(line).len()
        };
        if i > 0 && !line.trim().is_empty() && indent < block {
            break;
        }
        out.push_str(line);
    }
    out
}

/// The cursor's block's indentation in bytes: the text before the cursor when that is blank,
/// else that line's leading whitespace.
fn block_indent(line_prefix: &str) -> usize {
    if line_prefix.trim().is_empty() {
        line_prefix.len()
    } else {
        indent_of(line_prefix).len()
    }
}

/// When the completion's last line ends with closers that already follow the cursor, replace
/// them rather than insert them again.
fn merge_closers(text: String, line_suffix: &str) -> Edit {
    let rest = line_suffix.trim_end();
    if !rest.is_empty() && text.ends_with(rest) {
        return Edit {
            text,
            replace_len: rest.len(),
        };
    }
    // The longest tail of the completion that is made of closers and starts the rest.
    let tail_start = text
        .char_indices()
        .rev()
        .take_while(|(_, c)| is_closer(*c))
        .last()
        .map(|(i, _)| i)
        .unwrap_or(text.len());
    let tail = &text[tail_start..];
    let replace_len = tail
        .char_indices()
        .map(|(i, _)| &tail[i..])
        .find(|candidate| rest.starts_with(candidate))
        .map_or(0, str::len);
    Edit { text, replace_len }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `$0` marks the cursor in `doc`.
    fn run(doc: &str, raw: &str) -> Option<Edit> {
        let cursor = doc.find("$0").expect("fixture needs $0");
        let text = doc.replace("$0", "");
        process(raw, &Surroundings::at(&text, cursor))
    }

    fn edit(text: &str, replace_len: usize) -> Option<Edit> {
        Some(Edit {
            text: text.to_owned(),
            replace_len,
        })
    }

    #[test]
    fn a_block_is_wanted_only_where_the_cursor_starts_an_empty_one_or_ends_the_file() {
        let at = |doc: &str| {
            let cursor = doc.find("$0").expect("fixture needs $0");
            let text = doc.replace("$0", "");
            Surroundings::at(&text, cursor).starts_empty_block()
        };
        let cases: &[(&str, bool)] = &[
            ("def f(x):\n    $0\n\ndef g():\n    pass\n", true),
            ("fn f() {\n    $0\n}\n", true),
            ("if (x) {\n\t$0\n}\nfoo();\n", true),
            ("match x {\n    Some(y) =>\n        $0\n    None => 0,\n}\n", true),
            ("items.each do\n  $0\nend\n", true),
            ("x = 1\n$0", true),
            ("x = 1\n$0\n   \n", true),
            // A blank line inside a body already written: one more line.
            ("def f(x):\n    y = 1\n    $0\n    return y\n", false),
            ("def f(x):\n    $0\n    return x\n", false),
            ("fn f() {\n    let a = 1;\n    $0\n    a\n}\n", false),
            // At the end of a line that opens an empty block.
            ("fn f() {$0\n}\n", true),
            ("def f(x):$0\n\ndef g():\n    pass\n", true),
            ("def f(x):$0\n    return x\n", false),
            // Text on the cursor's line that opens nothing, or text after the cursor.
            ("def f(x):\n    y = $0\n\n", false),
            ("def f(x):\n    y = 1$0\n    return y\n", false),
            ("def f(x):\n    $0y\n", false),
            // Nothing opens a block before the cursor.
            ("$0\nx = 1\n", false),
        ];
        for (doc, want) in cases {
            assert_eq!(at(doc), *want, "{doc:?}");
        }
    }

    #[test]
    fn rules_table() {
        let fib = "def fib(n):\n    if n < 2:\n        return n\n$0\n\nif __name__ == \"__main__\":\n    print(fib(10))\n";
        let cases: &[(&str, &str, &str, Option<Edit>)] = &[
            (
                "instruct model re-creates the suffix",
                fib,
                "    return fib(n - 1) + fib(n - 2)\n\n\nif __name__ == \"__main__\":\n    print(fib(10))",
                edit("    return fib(n - 1) + fib(n - 2)", 0),
            ),
            (
                "mid-line cursor keeps the first line only",
                "x = compute($0, y)\nprint(x)\n",
                "a, b\nmore = 1",
                edit("a, b", 0),
            ),
            (
                "block completion stops at a dedent",
                "def f(x):\n    $0\n\ndef g():\n    pass\n",
                "y = x * 2\n    return y\nprint(f(3))\n",
                edit("y = x * 2\n    return y", 0),
            ),
            (
                "whitespace only is no completion",
                "a = 1\n$0\n",
                "  \n\t\n",
                None,
            ),
            ("empty is no completion", "a = 1\n$0\n", "", None),
            (
                "trailing whitespace is trimmed",
                "a = 1\n$0\n",
                "b = 2   \n\n",
                edit("b = 2", 0),
            ),
            (
                "closing paren already after the cursor is replaced, not doubled",
                "print(fib($0)\n",
                "10))",
                edit("10))", 1),
            ),
            (
                "whole rest of line re-typed is replaced",
                "foo($0);\n",
                "a, b);",
                edit("a, b);", 2),
            ),
            (
                "closers the line does not have are kept",
                "call($0\n",
                "x)",
                edit("x)", 0),
            ),
            (
                "quote after the cursor is not doubled",
                "name = \"$0\"\n",
                "laya\"",
                edit("laya\"", 1),
            ),
            (
                "indentation the line already has is not inserted again",
                "def f(x):\n    if x:\n        return 1\n    $0\n",
                "    return 0\n",
                edit("return 0", 0),
            ),
            (
                "any leading indentation on an indented blank line goes, later lines keep theirs",
                "class A {\n  void f() {\n    try {\n      g();\n    $0\n  }\n}\n",
                "  } catch (E e) {\n      h();",
                edit("} catch (E e) {\n      h();", 0),
            ),
            (
                "at column 0 the answer's indentation is the line's indentation and stays",
                "def f(x):\n$0\n",
                "    return x",
                edit("    return x", 0),
            ),
            (
                "tabs: dedent measured in the same whitespace",
                "func f() {\n\tif x {\n\t\t$0\n\t}\n}\n",
                "y()\n\t\tz()\n\t}\n}",
                edit("y()\n\t\tz()", 0),
            ),
        ];
        for (name, doc, raw, want) in cases {
            assert_eq!(&run(doc, raw), want, "{name}");
        }
    }

    /// An answer that is the next line again is no suggestion, in every language and for
    /// single-line and block answers alike; the same text at another indentation, or a line
    /// that only resembles the next one, stays.
    #[test]
    fn an_answer_repeating_the_next_line_is_dropped() {
        let cases: &[(&str, &str, &str, Option<Edit>)] = &[
            (
                "python: the indented blank line above `return area`",
                "def area(w, h):\n    area = w * h\n    $0\n    return area\n",
                "return area",
                None,
            ),
            (
                "python: the model wrote the indentation itself",
                "def area(w, h):\n    area = w * h\n$0\n    return area\n",
                "    return area\n",
                None,
            ),
            (
                "a block answer starting with the next line",
                "def area(w, h):\n    area = w * h\n    $0\n    return area\n",
                "return area\n\nprint(area(2, 3))",
                None,
            ),
            (
                "blank lines between the cursor and the next line",
                "fn f() -> i32 {\n    let x = 1;\n    $0\n\n    x + 1\n}\n",
                "x + 1",
                None,
            ),
            (
                "typescript: typed start of the next line completed to it",
                "function f(a: number) {\n  const b = a * 2;\n  ret$0\n  return b;\n}\n",
                "urn b;",
                None,
            ),
            (
                "go, with tabs",
                "func f() int {\n\tx := 1\n\t$0\n\treturn x\n}\n",
                "return x",
                None,
            ),
            (
                "mid-line: the completed line, with what follows the cursor, is the next one",
                "int f(int a) {\n    int b = g($0);\n    int b = g(a);\n}\n",
                "a",
                None,
            ),
            (
                "the same text at another indentation is another line",
                "if x:\n    if y:\n        $0\n    }\n",
                "}",
                edit("}", 0),
            ),
            (
                "a line like the next one but not it stays",
                "def area(w, h):\n    area = w * h\n    $0\n    return area\n",
                "return area * 2",
                edit("return area * 2", 0),
            ),
            (
                "the next line of a block answer may repeat later lines",
                "def f(x):\n    $0\n    return y\n",
                "y = x + 1\n    return y",
                edit("y = x + 1", 0),
            ),
        ];
        for (name, doc, raw, want) in cases {
            assert_eq!(&run(doc, raw), want, "{name}");
        }
    }

    #[test]
    fn surroundings_split_the_cursor_line() {
        let text = "ab\r\ncd ef\r\ngh";
        let s = Surroundings::at(text, text.find('d').unwrap() + 1);
        assert_eq!((s.line_prefix, s.line_suffix, s.after_line), ("cd", " ef", "gh"));
        let end = Surroundings::at(text, text.len());
        assert_eq!((end.line_prefix, end.line_suffix, end.after_line), ("gh", "", ""));
    }

    proptest::proptest! {
        /// The engine's end of a block (the suffix written again, the first line indented
        /// less than the block) cuts only what post-processing would cut: the answer shown is
        /// the same with it as without.
        #[test]
        fn ending_a_block_in_the_engine_shows_what_post_processing_alone_shows(
            fixture in 0usize..4,
            lines in proptest::collection::vec((0usize..10, 0usize..6), 0..8),
            first in 0usize..4,
        ) {
            let docs = [
                "def f(x):\n    $0\n    return y\n",
                "def f(x):\n    $0\n\ndef g():\n    pass\n",
                "fn f() {\n    let a = 1;$0\n}\n",
                "if (x) {\n\t$0\n}\nfoo();\n",
            ];
            let words = ["", "return y", "return", "def g():", "x = 1", "}", "\tfoo();"];
            let doc = docs[fixture];
            let cursor = doc.find("$0").unwrap();
            let text = doc.replace("$0", "");
            let s = Surroundings::at(&text, cursor);
            let mut raw = ["y = 2", "", "  z", "return y"][first].to_owned();
            for (indent, word) in lines {
                raw.push('\n');
                raw.push_str(&" ".repeat(indent));
                raw.push_str(words[word]);
            }
            let end = block_end(&s, None);
            let cut = end.end_of(&raw).map_or(raw.as_str(), |at| &raw[..at]);
            proptest::prop_assert_eq!(process(cut, &s), process(&raw, &s), "{:?} cut to {:?}", raw, cut);
        }
    }

    #[test]
    fn short_suffix_lines_are_not_anchors() {
        // `}` alone would cut real code; lines under 3 characters never anchor.
        assert_eq!(
            cut_suffix_repeat("if x {\n    y();\n}\n", "}\n"),
            "if x {\n    y();\n}"
        );
    }
}
