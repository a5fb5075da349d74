//! Prompt layouts for Qwen coder models, in the fill-in-the-middle format of the model's
//! family ([`Family`]): families differ in data (their control tokens), not in code. FIM
//! (prefix-suffix-middle), and the repo-level form (`<|repo_name|>`, `<|file_sep|>`) when
//! other files contribute (chosen most relevant first while they fit the context share,
//! written most relevant last, nearest the current file).
//!
//! Units: a [`Budget`] is in tokens, estimated from bytes ([`BYTES_PER_TOKEN`], a digit a
//! whole token: [`cost`]), split between prefix, suffix and context; the suffix's share
//! follows the model's size unless set ([`Budget::suffix_share_for`]).
//!
//! Invariants: pure functions of their input; stable parts first, so consecutive keystrokes
//! share the longest token prefix; lines kept whole and indentation byte for byte. When the
//! prefix window cuts the top of the file, the enclosing scopes' signatures, types in reach
//! and imports it no longer shows come back above it, chosen again against the window they
//! shrink until that settles, so none is lost for being in a window that then dropped it.
//!
//! Start with [`build`].

pub use crate::engine::family::{Family, FimFormat};

/// A text position given as 1-based line and 1-based column (in characters), as editors and
/// compilers print them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LineCol {
    pub line: usize,
    pub col: usize,
}

/// Byte offset of `pos` in `text`, or a message saying why it is out of range. A column one
/// past the end of the line is the line's end.
pub fn byte_offset(text: &str, pos: LineCol) -> Result<usize, String> {
    if pos.line == 0 || pos.col == 0 {
        return Err(format!(
            "line and column are 1-based, got {}:{}",
            pos.line, pos.col
        ));
    }
    let mut start = 0;
    for _ in 1..pos.line {
        match text[start..].find('\n') {
            Some(i) => start += i + 1,
            None => {
                let lines = text.lines().count().max(1);
                return Err(format!(
                    "line {} is past the end of the file ({lines} lines)",
                    pos.line
                ));
            }
        }
    }
    let line = &text[start..];
    let line = &line[..line.find('\n').unwrap_or(line.len())];
    let line = line.strip_suffix('\r').unwrap_or(line);
    let mut chars = line
        .char_indices()
        .map(|(i, _)| i)
        .chain(std::iter::once(line.len()));
    match chars.nth(pos.col - 1) {
        Some(i) => Ok(start + i),
        None => Err(format!(
            "column {} is past the end of line {} ({} characters)",
            pos.col,
            pos.line,
            line.chars().count()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_offset_counts_characters_and_rejects_out_of_range() {
        let text = "ab\nçé🙂x\r\n\nlast";
        assert_eq!(byte_offset(text, LineCol { line: 1, col: 1 }), Ok(0));
        assert_eq!(byte_offset(text, LineCol { line: 1, col: 3 }), Ok(2));
        // 'ç' and 'é' are 2 bytes, the emoji 4.
        assert_eq!(byte_offset(text, LineCol { line: 2, col: 4 }), Ok(3 + 8));
        assert_eq!(byte_offset(text, LineCol { line: 2, col: 5 }), Ok(3 + 9));
        assert_eq!(
            byte_offset(text, LineCol { line: 3, col: 1 }),
            Ok(text.find("\n\n").unwrap() + 1)
        );
        assert_eq!(byte_offset(text, LineCol { line: 4, col: 5 }), Ok(text.len()));
        assert!(byte_offset(text, LineCol { line: 2, col: 7 })
            .unwrap_err()
            .contains("column 7"));
        assert!(byte_offset(text, LineCol { line: 9, col: 1 })
            .unwrap_err()
            .contains("line 9"));
        assert!(byte_offset(text, LineCol { line: 0, col: 1 }).is_err());
    }
}

/// How many tokens a prompt may take, and how they are shared. Sizes are estimated from bytes
/// (`BYTES_PER_TOKEN`): the prompt is built before a tokenizer is at hand (the engine may be
/// another process or machine), and code averages a little over 3 bytes per Qwen token.
#[derive(Clone, Debug, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Budget {
    pub max_tokens: usize,
    /// Share of `max_tokens` for the text after the cursor; unset (the default), it follows
    /// the model's size ([`Budget::suffix_share_for`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suffix_share: Option<f32>,
    /// Share of `max_tokens` for context from other files and far parts of this file.
    pub context_share: f32,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            max_tokens: 2048,
            suffix_share: None,
            context_share: 0.2,
        }
    }
}

impl Budget {
    /// Models under this many parameters get the short suffix.
    pub const SMALL_MODEL_PARAMETERS: u64 = 1_000_000_000;

    /// The suffix share for a model of `parameters` (unknown: a remote server's model).
    /// Measured on 600 masked-line cases (docs/lab/2026-12-03-large-set-vs-llama-server.md,
    /// "Suffix share by model size"): the 0.5B answers best with a few lines of suffix (0.02;
    /// 10.2 % exact against 7.7 % at 0.06), the 1.5B with about 370 bytes of it (0.06; 33.8 % against 30.8 % at 0.02), and
    /// more suffix did not help it further (32.8 % at 0.15). Larger models, the product's
    /// tiers and those behind a remote server, get the longer one.
    pub fn suffix_share_for(parameters: Option<u64>) -> f32 {
        match parameters {
            Some(p) if p < Self::SMALL_MODEL_PARAMETERS => 0.02,
            _ => 0.06,
        }
    }

    /// The suffix share to use: the configured one, else the one for a model of `parameters`.
    pub fn suffix_share_or_for(&self, parameters: Option<u64>) -> f32 {
        self.suffix_share
            .unwrap_or_else(|| Self::suffix_share_for(parameters))
    }

    /// This budget with its suffix share set ([`Budget::suffix_share_or_for`]).
    pub fn for_model(&self, parameters: Option<u64>) -> Budget {
        Budget {
            suffix_share: Some(self.suffix_share_or_for(parameters)),
            ..self.clone()
        }
    }
}

pub const BYTES_PER_TOKEN: usize = 3;

/// A snippet of another file that the prompt shows before the current file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snippet {
    pub path: String,
    pub text: String,
}

/// A definition of the current file that the prefix window may cut off.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalPart {
    /// What to show for it.
    pub text: String,
    /// Where it starts in the file (`prefix` is the file up to the cursor): a part that
    /// starts inside the prefix window is not shown again.
    pub start: usize,
}

/// Everything a prompt is made of, already extracted.
#[derive(Clone, Debug, Default)]
pub struct PromptInput<'a> {
    pub repo_name: &'a str,
    /// Path of the current file as shown to the model (relative when possible).
    pub path: &'a str,
    pub prefix: &'a str,
    pub suffix: &'a str,
    /// Import statements of the current file (shown when the prefix window cuts them off).
    pub imports: &'a [String],
    /// Definitions from this file that the prefix window may cut off, most important first
    /// (the enclosing scopes' signatures, innermost first, then the types in reach, then
    /// nearby functions' signatures).
    pub local_context: &'a [LocalPart],
    /// Show the chosen local parts in the file's order (their texts are the file's outline:
    /// at their own indentation, bodies elided) rather than most important last.
    pub outline: bool,
    /// Snippets of other files, most relevant first.
    pub other_files: &'a [Snippet],
    /// Whose control tokens the prompt is written in.
    pub family: Family,
}

/// The prompt text and what it kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prompt {
    pub text: String,
    /// Bytes of the prefix and suffix that made it in.
    pub prefix_bytes: usize,
    pub suffix_bytes: usize,
    pub context_files: usize,
}

/// What `s` takes of a budget, in bytes of average code: a byte is a byte, but a digit is a
/// whole token (Qwen's tokenizers split numbers into single digits), so it counts as
/// [`BYTES_PER_TOKEN`]. Tables of numbers, hex constants and Unicode ranges would otherwise
/// fill twice the tokens the budget names.
pub fn cost(s: &str) -> usize {
    s.len() + s.bytes().filter(u8::is_ascii_digit).count() * (BYTES_PER_TOKEN - 1)
}

fn byte_cost(b: u8) -> usize {
    if b.is_ascii_digit() {
        BYTES_PER_TOKEN
    } else {
        1
    }
}

/// The end of `s` that [`cost`]s at most `max`, cut at a line start (or at a char boundary for
/// one long line).
fn tail_lines(s: &str, max: usize) -> &str {
    let mut used = 0;
    let mut start = s.len();
    for (i, &b) in s.as_bytes().iter().enumerate().rev() {
        used += byte_cost(b);
        if used > max {
            break;
        }
        start = i;
    }
    if start == 0 {
        return s;
    }
    while !s.is_char_boundary(start) {
        start += 1;
    }
    match s[start..].find('\n') {
        Some(i) if start + i + 1 < s.len() => &s[start + i + 1..],
        _ => &s[start..],
    }
}

/// The start of `s` that [`cost`]s at most `max`, cut at a line end (or a char boundary for
/// one long line).
fn head_lines(s: &str, max: usize) -> &str {
    let mut used = 0;
    let mut end = 0;
    for &b in s.as_bytes() {
        used += byte_cost(b);
        if used > max {
            break;
        }
        end += 1;
    }
    if end == s.len() {
        return s;
    }
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    match s[..end].rfind('\n') {
        Some(i) if i > 0 => &s[..=i],
        _ => &s[..end],
    }
}

/// The imports and local definitions to show above the prefix window `shown` (a tail of
/// `input.prefix`), as text: those the window does not already hold, most important first
/// while they fit in `max` bytes.
fn lead_parts(input: &PromptInput, shown: &str, max: usize) -> String {
    let cut = input.prefix.len() - shown.len();
    let in_window = |start: usize| (cut..input.prefix.len()).contains(&start);
    let mut used = 0;
    let mut chosen_local: Vec<&LocalPart> = vec![];
    let mut chosen_imports: Vec<&str> = vec![];
    let parts = input
        .local_context
        .iter()
        .map(|p| (p.text.trim_end(), Some(p)))
        .chain(input.imports.iter().map(|p| (p.trim_end(), None)));
    for (text, local) in parts {
        let seen = match local {
            Some(p) => in_window(p.start),
            // An import has no place here, but its text is the file's, byte for byte.
            None => shown.contains(text),
        };
        if text.is_empty() || seen || used + cost(text) + 1 > max {
            continue;
        }
        used += cost(text) + 1;
        match local {
            Some(p) => chosen_local.push(p),
            None => chosen_imports.push(text),
        }
    }
    if input.outline {
        chosen_local.sort_by_key(|p| p.start);
    } else {
        chosen_local.reverse();
    }
    let mut lead = String::new();
    for text in chosen_imports
        .into_iter()
        .chain(chosen_local.into_iter().map(|p| p.text.trim_end()))
    {
        lead.push_str(text);
        lead.push('\n');
    }
    lead
}

/// Build a FIM prompt in `input.family`'s format inside `budget`. Stable parts come first so consecutive
/// keystrokes share the longest token prefix: other files (repo-level form, when there are
/// any; the most relevant, first in `other_files`, written last), then the current file's path, the context cut off from
/// its prefix, the prefix window, and last the suffix. Indentation is kept byte for byte.
pub fn build(input: &PromptInput, budget: &Budget) -> Prompt {
    let total = budget.max_tokens * BYTES_PER_TOKEN;
    let context_max = (total as f32 * budget.context_share) as usize;
    let suffix_max = (total as f32 * budget.suffix_share_or_for(None)) as usize;

    let format = input.family.fim();
    let mut header = String::new();
    let mut context_files = 0;
    if !input.other_files.is_empty() {
        header.push_str(format.repo_name);
        header.push_str(input.repo_name);
        header.push('\n');
        // The most relevant first while they fit, written most relevant last: nearest the
        // current file.
        let mut used = 0;
        let mut entries = vec![];
        for s in input.other_files {
            let entry = format!("{}{}\n{}\n", format.file_sep, s.path, s.text.trim_end());
            if used + cost(&entry) > context_max {
                break;
            }
            used += cost(&entry);
            entries.push(entry);
        }
        context_files = entries.len();
        for entry in entries.iter().rev() {
            header.push_str(entry);
        }
        header.push_str(format.file_sep);
        header.push_str(input.path);
        header.push('\n');
    }

    let suffix = head_lines(input.suffix, suffix_max);
    let prefix_max = total.saturating_sub(cost(&header) + cost(suffix));
    let mut prefix = tail_lines(input.prefix, prefix_max).to_owned();
    if prefix.len() < input.prefix.len() {
        // The window cut off the top of the file: bring back the local definitions in reach
        // of the cursor and the imports, most important first while they fit (a part that
        // does not fit is skipped, a smaller one may still), then shown as the file would:
        // imports first, the most important definition last, right above the window. A part
        // the window shows is not repeated; as the parts take room from the window, it is
        // chosen again against the smaller window until nothing changes, so a part is never
        // dropped for being in a window that then lost it.
        let mut lead = String::new();
        let mut tail = prefix.clone();
        for _ in 0..4 {
            let next_lead = lead_parts(input, &tail, context_max);
            let next_tail = if next_lead.is_empty() {
                prefix.clone()
            } else {
                tail_lines(input.prefix, prefix_max.saturating_sub(cost(&next_lead) + 1)).to_owned()
            };
            let settled = next_lead == lead && next_tail == tail;
            (lead, tail) = (next_lead, next_tail);
            if settled {
                break;
            }
        }
        if !lead.is_empty() {
            prefix = format!("{lead}\n{tail}");
        }
    }
    let text = format!("{header}{}", format.fim(&prefix, suffix));
    Prompt {
        text,
        prefix_bytes: prefix.len(),
        suffix_bytes: suffix.len(),
        context_files,
    }
}

#[cfg(test)]
mod budget_tests {
    use super::*;

    #[test]
    fn suffix_share_follows_the_model_size_unless_set() {
        assert_eq!(Budget::suffix_share_for(Some(494_032_768)), 0.02);
        assert_eq!(Budget::suffix_share_for(Some(1_543_714_304)), 0.06);
        assert_eq!(Budget::suffix_share_for(None), 0.06);
        let auto = Budget::default();
        assert_eq!(auto.for_model(Some(400_000_000)).suffix_share, Some(0.02));
        assert_eq!(auto.for_model(None).suffix_share, Some(0.06));
        let set = Budget {
            suffix_share: Some(0.15),
            ..Budget::default()
        };
        assert_eq!(set.for_model(Some(400_000_000)).suffix_share, Some(0.15));
        // Settings without the field leave it unset; `null` does too.
        let b: Budget = serde_json::from_str(r#"{"maxTokens": 1024}"#).unwrap();
        assert_eq!(b.suffix_share, None);
        let b: Budget = serde_json::from_str(r#"{"suffixShare": null}"#).unwrap();
        assert_eq!(b.suffix_share, None);
    }

    #[test]
    fn small_file_is_a_plain_fim_prompt() {
        let p = build(
            &PromptInput {
                path: "a.py",
                prefix: "def f():\n\t",
                suffix: "\nf()\n",
                ..Default::default()
            },
            &Budget::default(),
        );
        assert_eq!(
            p.text,
            "<|fim_prefix|>def f():\n\t<|fim_suffix|>\nf()\n<|fim_middle|>"
        );
    }

    #[test]
    fn other_files_use_the_repo_level_form_first() {
        let others = [Snippet {
            path: "types.rs".into(),
            text: "pub struct P { x: i32 }\n".into(),
        }];
        let p = build(
            &PromptInput {
                repo_name: "demo",
                path: "main.rs",
                prefix: "fn main() {\n    let p = P",
                suffix: "\n}\n",
                other_files: &others,
                ..Default::default()
            },
            &Budget::default(),
        );
        assert_eq!(
            p.text,
            "<|repo_name|>demo\n<|file_sep|>types.rs\npub struct P { x: i32 }\n<|file_sep|>main.rs\n<|fim_prefix|>fn main() {\n    let p = P<|fim_suffix|>\n}\n<|fim_middle|>"
        );
        assert_eq!(p.context_files, 1);
    }

    /// Every control token of the prompt is the family's: built from its format, for each.
    #[test]
    fn prompts_are_written_in_the_models_family_format() {
        let others = [Snippet {
            path: "a.py".into(),
            text: "A = 1\n".into(),
        }];
        for family in Family::ALL {
            let f = family.fim();
            let p = build(
                &PromptInput {
                    repo_name: "r",
                    path: "b.py",
                    prefix: "x = ",
                    suffix: "\n",
                    other_files: &others,
                    family,
                    ..Default::default()
                },
                &Budget::default(),
            );
            let want = format!(
                "{}r\n{}a.py\nA = 1\n{}b.py\n{}x = {}\n{}",
                f.repo_name, f.file_sep, f.file_sep, f.prefix, f.suffix, f.middle
            );
            assert_eq!(p.text, want, "{family:?}");
        }
    }

    #[test]
    fn long_prefix_is_cut_at_a_line_and_keeps_imports() {
        let mut prefix = String::from("import os\n");
        for i in 0..2000 {
            prefix.push_str(&format!("x{i} = {i}\n"));
        }
        prefix.push_str("y = ");
        let imports = ["import os".to_owned()];
        let budget = Budget {
            max_tokens: 256,
            ..Budget::default()
        };
        let p = build(
            &PromptInput {
                path: "a.py",
                prefix: &prefix,
                suffix: "",
                imports: &imports,
                ..Default::default()
            },
            &budget,
        );
        assert!(p.text.len() <= 256 * BYTES_PER_TOKEN + 64, "{}", p.text.len());
        assert!(
            p.text.starts_with("<|fim_prefix|>import os\n\nx"),
            "{}",
            &p.text[..40]
        );
        assert!(p.text.contains("y = <|fim_suffix|>"));
        // Every kept line is whole.
        let body = &p.text["<|fim_prefix|>import os\n\n".len()..p.text.find("y = ").unwrap()];
        assert!(
            body.lines().all(|l| l.starts_with('x') && l.contains(" = ")),
            "{body}"
        );
    }

    /// A digit is a token of Qwen's vocabularies: a table of numbers gets the budget in
    /// tokens, not three times as many, and text without digits is cut where bytes cut it.
    #[test]
    fn digits_count_as_tokens_in_the_budget() {
        assert_eq!(cost("abc"), 3);
        assert_eq!(cost("0x1F, 42"), 8 + 4 * (BYTES_PER_TOKEN - 1));
        let budget = Budget {
            max_tokens: 256,
            ..Budget::default()
        };
        let mut table = String::new();
        for i in 0..2000 {
            table.push_str(&format!(
                "  0x{:04X}, 0x{:04X}, {i},\n",
                i * 7919 % 65536,
                i * 104729 % 65536
            ));
        }
        table.push_str("  ");
        let p = build(
            &PromptInput {
                path: "t.c",
                prefix: &table,
                ..Default::default()
            },
            &budget,
        );
        // At most the budget's tokens if every digit is one and the rest three bytes a token.
        assert!(cost(&p.text) <= 256 * BYTES_PER_TOKEN + 64, "{}", cost(&p.text));
        let digits = p.text.bytes().filter(u8::is_ascii_digit).count();
        assert!(digits > 100, "{digits} digits kept: the cut went too far");
        // Without digits the window is as many bytes as before.
        let words = "let alpha = beta;\n".repeat(2000);
        assert_eq!(tail_lines(&words, 300).len(), 288);
        assert_eq!(head_lines(&words, 300).len(), 288);
    }

    /// `struct Far;` and 400 lines of constants (more than a 256-token prompt holds), then `tail`.
    fn far_prefix(tail: &str) -> String {
        let mut prefix = String::from("struct Far;\n");
        for i in 0..400 {
            prefix.push_str(&format!("const C{i}: u32 = {i};\n"));
        }
        prefix + tail
    }

    /// The part `text` of `prefix`, placed where `at` first occurs in it (or after the cursor).
    fn part(prefix: &str, at: &str, text: &str) -> LocalPart {
        LocalPart {
            text: text.to_owned(),
            start: prefix.find(at).unwrap_or(prefix.len() + 1),
        }
    }

    /// The prompt for `prefix` and the context parts `local` in 256 tokens, 40 % for context.
    fn with_context(prefix: &str, local: &[LocalPart], outline: bool) -> Prompt {
        let budget = Budget {
            max_tokens: 256,
            suffix_share: Some(0.0),
            context_share: 0.4,
        };
        build(
            &PromptInput {
                path: "a.rs",
                prefix,
                local_context: local,
                outline,
                ..Default::default()
            },
            &budget,
        )
    }

    /// The enclosing function's signature is in the window before the context takes its room,
    /// and out of it after: it must then come back with the context, not be lost.
    #[test]
    fn a_signature_pushed_out_of_the_window_by_the_context_comes_back() {
        let body: String = (0..22).map(|i| format!("    let v{i} = a + {i};\n")).collect();
        let prefix = far_prefix(&format!("fn outer(a: u32) -> u32 {{\n{body}    "));
        let big_type = format!("struct Big {{\n{}}}", "    field: [u8; 64],\n".repeat(8));
        let local = [
            part(&prefix, "fn outer", "fn outer(a: u32) -> u32"),
            part(&prefix, "struct Big", &big_type),
        ];
        let window_alone = tail_lines(&prefix, 256 * BYTES_PER_TOKEN);
        assert!(
            window_alone.contains("fn outer(a: u32) -> u32 {"),
            "the case needs it in the first window"
        );
        let p = with_context(&prefix, &local, false);
        assert!(p.text.contains("fn outer(a: u32) -> u32"), "{}", p.text);
        assert!(p.text.contains("struct Big {"), "{}", p.text);
        assert_eq!(p.text.matches("fn outer(a: u32) -> u32").count(), 1, "{}", p.text);
    }

    /// A part is known by where it starts, not by its text (a method's signature comes
    /// dedented, an outline part with its body elided): one that starts in the window is not
    /// shown again above it.
    #[test]
    fn a_part_that_starts_in_the_window_is_not_repeated() {
        let prefix = far_prefix("impl P {\n    fn next(\n        &mut self,\n    ) -> u8 {\n        ");
        let local = [
            part(&prefix, "fn next", "fn next(\n    &mut self,\n) -> u8"),
            part(&prefix, "struct Far", "struct Far;"),
        ];
        for outline in [false, true] {
            let p = with_context(&prefix, &local, outline);
            assert!(p.text.starts_with("<|fim_prefix|>struct Far;\n\n"), "{}", p.text);
            assert_eq!(p.text.matches("fn next(").count(), 1, "{}", p.text);
        }
    }

    /// The list puts the most important part (the first) right above the window; the
    /// outline keeps the file's order.
    #[test]
    fn an_outline_lead_keeps_the_files_order() {
        let body: String = (0..60).map(|i| format!("    const D{i}: u8 = {i};\n")).collect();
        let prefix = far_prefix(&format!("impl P {{\n{body}    "));
        let local = [
            part(&prefix, "impl P", "impl P {"),
            part(&prefix, "struct Far", "struct Far;"),
            part(&prefix, "const C1:", "const C1: u32 = 1;"),
        ];
        let lead = |outline| {
            let p = with_context(&prefix, &local, outline);
            let text = p.text["<|fim_prefix|>".len()..].to_owned();
            text[..text.find("\n\n").unwrap()].to_owned()
        };
        assert_eq!(lead(false), "const C1: u32 = 1;\nstruct Far;\nimpl P {");
        assert_eq!(lead(true), "struct Far;\nconst C1: u32 = 1;\nimpl P {");
    }

    #[test]
    fn long_suffix_is_cut_at_a_line_end() {
        let suffix: String = (0..1000).map(|i| format!("z{i}()\n")).collect();
        let budget = Budget {
            max_tokens: 200,
            ..Budget::default()
        };
        let p = build(
            &PromptInput {
                path: "a.py",
                prefix: "a = 1\n",
                suffix: &suffix,
                ..Default::default()
            },
            &budget,
        );
        let kept =
            &p.text[p.text.find("<|fim_suffix|>").unwrap() + 14..p.text.find("<|fim_middle|>").unwrap()];
        assert!(kept.ends_with(")\n") && kept.len() <= 90, "{kept:?}");
    }
}
