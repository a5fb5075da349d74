//! Rules applied to a generated middle before it is shown.

/// Cut `middle` where it starts re-creating the text after the cursor: at the first line of
/// `suffix` that carries code (at least 3 non-blank characters), when the middle contains it
/// at the start of a line. Instruct models that do not end a FIM middle by themselves (the
/// 0.5B Qwen2.5-Coder Instruct) otherwise write the missing lines and then the suffix again.
pub fn cut_suffix_repeat(middle: &str, suffix: &str) -> String {
    let anchor = suffix.lines().map(str::trim).find(|l| l.len() >= 3);
    let mut out = middle;
    if let Some(anchor) = anchor {
        let mut line_start = 0;
        for line in middle.split_inclusive('\n') {
            if line.trim_start().starts_with(anchor) {
                out = &middle[..line_start];
                break;
            }
            line_start += line.len();
        }
    }
    out.trim_end().to_owned()
}

#[cfg(test)]
mod tests {
    use super::cut_suffix_repeat;

    #[test]
    fn cuts_where_the_suffix_is_repeated() {
        let middle = "    else:\n        return fib(n - 1)\n\n\nif __name__ == \"__main__\":\n    print(1)";
        let suffix = "\n\n\nif __name__ == \"__main__\":\n    print(fibonacci(10))\n";
        assert_eq!(
            cut_suffix_repeat(middle, suffix),
            "    else:\n        return fib(n - 1)"
        );
    }

    #[test]
    fn keeps_a_middle_that_does_not_repeat_and_trims_trailing_space() {
        assert_eq!(cut_suffix_repeat("x = 1  \n", "print(x)\n"), "x = 1");
        assert_eq!(cut_suffix_repeat("a\nb", ""), "a\nb");
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
