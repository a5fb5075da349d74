//! Prompt layouts for Qwen coder models.

/// Qwen fill-in-the-middle, prefix-suffix-middle order:
/// `<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>`.
pub fn fim(prefix: &str, suffix: &str) -> String {
    format!("<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>")
}

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
    fn fim_layout_is_prefix_suffix_middle() {
        assert_eq!(fim("a", "b"), "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>");
    }

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
