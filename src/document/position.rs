//! Line/character positions ⇄ byte offsets: the one place laya converts them.
//!
//! The rules, in one place:
//! - Lines are split at `\n` only. In a `\r\n` file the `\r` is the last character of
//!   its line (it counts as one unit in either encoding); a lone `\r` is an ordinary
//!   character. The rope is built without ropey's CR/Unicode line-break features so that
//!   its line index agrees (and so does tree-sitter's row count).
//! - `character` counts UTF-8 bytes or UTF-16 code units from the line start, per
//!   [`PositionEncoding`]. A position that would land inside a character (inside a UTF-8
//!   sequence, or between the two halves of a UTF-16 surrogate pair) is an error.
//! - A line past the last line is an error. A `character` past the end of its line means
//!   the end of the line (just before its `\n`), as the LSP specification says
//!   ("If the character value is greater than the line length it defaults back to the
//!   line length"); this is the only clamp.
//! - A byte offset past the end of the text, or not on a character boundary, is an error.

use ropey::Rope;
use thiserror::Error;

/// How `character` in a [`Position`] is counted (LSP `positionEncoding`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PositionEncoding {
    Utf8,
    /// The LSP default.
    #[default]
    Utf16,
}

/// A zero-based line and a character offset within it, counted in some
/// [`PositionEncoding`]. Not an LSP type: the LSP layer converts to and from this.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Position {
    pub line: u32,
    pub character: u32,
}

impl Position {
    pub const fn new(line: u32, character: u32) -> Self {
        Position { line, character }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PositionError {
    #[error("line {line} is past the last line ({last_line})")]
    LineOutOfRange { line: u32, last_line: u32 },
    #[error("{line}:{character} ({encoding:?}) falls inside a character")]
    InsideCharacter {
        line: u32,
        character: u32,
        encoding: PositionEncoding,
    },
    #[error("byte offset {offset} is past the end of the text ({len} bytes)")]
    OffsetOutOfRange { offset: usize, len: usize },
    #[error("byte offset {offset} falls inside a character")]
    OffsetInsideCharacter { offset: usize },
}

/// The byte range of line `line`, without its `\n` (a `\r` before it is included).
fn line_bytes(rope: &Rope, line: u32) -> Result<(usize, usize), PositionError> {
    let last_line = rope.len_lines() - 1;
    let l = line as usize;
    if l > last_line {
        return Err(PositionError::LineOutOfRange {
            line,
            last_line: last_line as u32,
        });
    }
    let start = rope.line_to_byte(l);
    let end = if l < last_line {
        rope.line_to_byte(l + 1) - 1
    } else {
        rope.len_bytes()
    };
    Ok((start, end))
}

/// The byte offset of `pos` (see the module docs for the rules).
pub fn position_to_byte(
    rope: &Rope,
    pos: Position,
    encoding: PositionEncoding,
) -> Result<usize, PositionError> {
    let (start, end) = line_bytes(rope, pos.line)?;
    let inside = PositionError::InsideCharacter {
        line: pos.line,
        character: pos.character,
        encoding,
    };
    match encoding {
        PositionEncoding::Utf8 => {
            let at = start.saturating_add(pos.character as usize);
            if at >= end {
                return Ok(end);
            }
            // A char boundary maps to a char index that maps back to the same byte.
            if rope.char_to_byte(rope.byte_to_char(at)) != at {
                return Err(inside);
            }
            Ok(at)
        }
        PositionEncoding::Utf16 => {
            let start_cu = rope.char_to_utf16_cu(rope.byte_to_char(start));
            let end_cu = rope.char_to_utf16_cu(rope.byte_to_char(end));
            let at_cu = start_cu.saturating_add(pos.character as usize);
            if at_cu >= end_cu {
                return Ok(end);
            }
            let ch = rope.utf16_cu_to_char(at_cu);
            if rope.char_to_utf16_cu(ch) != at_cu {
                return Err(inside);
            }
            Ok(rope.char_to_byte(ch))
        }
    }
}

/// The position of byte offset `offset`.
pub fn byte_to_position(
    rope: &Rope,
    offset: usize,
    encoding: PositionEncoding,
) -> Result<Position, PositionError> {
    let len = rope.len_bytes();
    if offset > len {
        return Err(PositionError::OffsetOutOfRange { offset, len });
    }
    let ch = rope.byte_to_char(offset);
    if rope.char_to_byte(ch) != offset {
        return Err(PositionError::OffsetInsideCharacter { offset });
    }
    let line = rope.byte_to_line(offset);
    let line_start = rope.line_to_byte(line);
    let character = match encoding {
        PositionEncoding::Utf8 => offset - line_start,
        PositionEncoding::Utf16 => rope.char_to_utf16_cu(ch) - rope.char_to_utf16_cu(rope.line_to_char(line)),
    };
    Ok(Position {
        line: line as u32,
        character: character as u32,
    })
}

/// tree-sitter's point for a byte offset: row split at `\n`, column in bytes.
pub(crate) fn byte_to_point(rope: &Rope, offset: usize) -> tree_sitter::Point {
    let row = rope.byte_to_line(offset);
    tree_sitter::Point {
        row,
        column: offset - rope.line_to_byte(row),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rope(s: &str) -> Rope {
        Rope::from_str(s)
    }

    #[test]
    fn crlf_cr_counts_as_a_character_of_its_line() {
        let r = rope("ab\r\ncd");
        assert_eq!(
            position_to_byte(&r, Position::new(0, 2), PositionEncoding::Utf16),
            Ok(2)
        );
        assert_eq!(
            position_to_byte(&r, Position::new(0, 3), PositionEncoding::Utf16),
            Ok(3)
        );
        assert_eq!(
            position_to_byte(&r, Position::new(1, 0), PositionEncoding::Utf16),
            Ok(4)
        );
        assert_eq!(
            byte_to_position(&r, 3, PositionEncoding::Utf8),
            Ok(Position::new(0, 3))
        );
        assert_eq!(
            byte_to_position(&r, 4, PositionEncoding::Utf8),
            Ok(Position::new(1, 0))
        );
    }

    #[test]
    fn lone_cr_is_not_a_line_break() {
        let r = rope("a\rb\nc");
        assert_eq!(
            position_to_byte(&r, Position::new(1, 0), PositionEncoding::Utf8),
            Ok(4)
        );
        assert_eq!(
            byte_to_position(&r, 2, PositionEncoding::Utf16),
            Ok(Position::new(0, 2))
        );
    }

    #[test]
    fn utf16_counts_surrogate_pairs_as_two_and_rejects_their_middle() {
        let r = rope("a😀b");
        assert_eq!(
            position_to_byte(&r, Position::new(0, 1), PositionEncoding::Utf16),
            Ok(1)
        );
        assert_eq!(
            position_to_byte(&r, Position::new(0, 3), PositionEncoding::Utf16),
            Ok(5)
        );
        assert_eq!(
            position_to_byte(&r, Position::new(0, 2), PositionEncoding::Utf16),
            Err(PositionError::InsideCharacter {
                line: 0,
                character: 2,
                encoding: PositionEncoding::Utf16
            })
        );
        assert_eq!(
            byte_to_position(&r, 5, PositionEncoding::Utf16),
            Ok(Position::new(0, 3))
        );
    }

    #[test]
    fn utf8_rejects_the_middle_of_a_sequence() {
        let r = rope("é中");
        assert_eq!(
            position_to_byte(&r, Position::new(0, 2), PositionEncoding::Utf8),
            Ok(2)
        );
        assert!(matches!(
            position_to_byte(&r, Position::new(0, 3), PositionEncoding::Utf8),
            Err(PositionError::InsideCharacter { .. })
        ));
        assert_eq!(
            byte_to_position(&r, 3, PositionEncoding::Utf8),
            Err(PositionError::OffsetInsideCharacter { offset: 3 })
        );
    }

    #[test]
    fn character_past_line_end_means_line_end_but_line_past_end_is_an_error() {
        let r = rope("ab\r\ncd\n");
        assert_eq!(
            position_to_byte(&r, Position::new(0, 99), PositionEncoding::Utf16),
            Ok(3)
        );
        assert_eq!(
            position_to_byte(&r, Position::new(1, 99), PositionEncoding::Utf8),
            Ok(6)
        );
        assert_eq!(
            position_to_byte(&r, Position::new(2, 0), PositionEncoding::Utf8),
            Ok(7)
        );
        assert_eq!(
            position_to_byte(&r, Position::new(3, 0), PositionEncoding::Utf8),
            Err(PositionError::LineOutOfRange {
                line: 3,
                last_line: 2
            })
        );
        assert_eq!(
            byte_to_position(&r, 8, PositionEncoding::Utf8),
            Err(PositionError::OffsetOutOfRange { offset: 8, len: 7 })
        );
    }
}
