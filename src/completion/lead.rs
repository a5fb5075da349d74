//! The definitions of the current file that a prompt may show above its window when the
//! budget cuts off the top of the file: what the syntax layer found, as prompt parts.

use crate::prompt::LocalPart;
use crate::syntax::{indent_before, Context, LanguageConfig, Scope};

/// How the parts are written above the window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ContextLayout {
    /// As the file's outline: in the file's order, at their own indentation, the enclosing
    /// scopes open (`impl P {`) and other functions' bodies elided (`fn f() { ... }`,
    /// Python's `def f():` over an indented `...`).
    #[default]
    Outline,
    /// Bare signatures and types at column 0, the most important right above the window.
    List,
}

/// The parts of `cx` (extracted from `text`), most important first: the enclosing scopes
/// (innermost first), this file's types in reach, then the other nearby functions.
pub fn local_parts(
    cx: &Context,
    text: &str,
    language: Option<&LanguageConfig>,
    layout: ContextLayout,
) -> Vec<LocalPart> {
    let outline = layout == ContextLayout::Outline;
    let scope = |s: &Scope, open: bool| LocalPart {
        text: if outline {
            outlined(s, text, language, open)
        } else {
            s.signature_text.clone()
        },
        start: s.byte_range.start,
    };
    let enclosing = cx.enclosing_scopes.iter().rev().map(|s| scope(s, true));
    let types = cx
        .type_definitions
        .iter()
        .filter(|t| t.source_path.is_none())
        .map(|t| LocalPart {
            text: if outline {
                format!("{}{}", indent_before(text, t.byte_range.start), t.text)
            } else {
                t.text.clone()
            },
            start: t.byte_range.start,
        });
    let others = cx
        .signatures
        .iter()
        .filter(|s| !cx.enclosing_scopes.iter().any(|e| e.byte_range == s.byte_range))
        .map(|s| scope(s, false));
    enclosing.chain(types).chain(others).collect()
}

/// `s`'s signature as the file shows it: at its indentation, then, for a scope with a
/// body, the body's opening (`open`: the cursor is inside it) or the body elided.
fn outlined(s: &Scope, text: &str, language: Option<&LanguageConfig>, open: bool) -> String {
    let indent = indent_before(text, s.byte_range.start);
    let mut out: String = s
        .signature_text
        .split('\n')
        .map(|line| format!("{indent}{line}"))
        .collect::<Vec<_>>()
        .join("\n");
    let Some(body) = s.body_start.filter(|&b| b <= text.len()) else {
        return out;
    };
    let offside = language.is_some_and(|l| l.offside_rule);
    if offside {
        if !open {
            let unit = if indent.contains('\t') {
                "\t"
            } else {
                language.map_or("    ", |l| l.indent_unit)
            };
            out.push_str(&format!("\n{indent}{unit}..."));
        }
    } else if text[body..].starts_with('{') {
        out.push_str(if open { " {" } else { " { ... }" });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::syntax::{self, Language};

    /// The parts' texts at `$0` of `fixture` in `language`, in `layout`.
    fn parts(language: &str, fixture: &str, layout: ContextLayout) -> Vec<String> {
        let cursor = fixture.find("$0").unwrap();
        let text = fixture.replacen("$0", "", 1);
        let language = Language::from_name(language).unwrap();
        let tree = syntax::parse(language, &text, None).unwrap();
        let cx = syntax::extract(language, &text, &tree, cursor, &[]);
        local_parts(&cx, &text, Some(language.config()), layout)
            .into_iter()
            .map(|p| p.text)
            .collect()
    }

    #[test]
    fn rust_outline_opens_the_enclosing_scopes_and_elides_other_bodies() {
        let fixture = r#"struct P { x: u8 }

impl P {
    fn first(&self) -> u8 {
        self.x
    }

    fn next(
        &mut self,
    ) -> u8 {
        let p: P = P { x: 1 };
        $0
    }
}
"#;
        assert_eq!(
            parts("rust", fixture, ContextLayout::Outline),
            [
                "    fn next(\n        &mut self,\n    ) -> u8 {",
                "impl P {",
                "struct P { x: u8 }",
                "    fn first(&self) -> u8 { ... }",
            ]
        );
        assert_eq!(
            parts("rust", fixture, ContextLayout::List),
            [
                "fn next(\n    &mut self,\n) -> u8",
                "impl P",
                "struct P { x: u8 }",
                "fn first(&self) -> u8",
            ]
        );
    }

    #[test]
    fn python_outline_elides_bodies_with_an_indented_ellipsis() {
        let fixture = "class A:\n    def f(self):\n        return 1\n\n    def g(self):\n        $0\n";
        assert_eq!(
            parts("python", fixture, ContextLayout::Outline),
            ["    def g(self):", "class A:", "    def f(self):\n        ..."]
        );
    }

    #[test]
    fn tabs_indent_the_elided_body_with_a_tab() {
        let fixture = "class A:\n\tdef f(self):\n\t\treturn 1\n\n\tdef g(self):\n\t\t$0\n";
        assert_eq!(
            parts("python", fixture, ContextLayout::Outline)[2],
            "\tdef f(self):\n\t\t..."
        );
    }
}
