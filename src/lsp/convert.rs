//! The one place where LSP positions and ranges meet laya's byte offsets.

use tower_lsp_server::{
    jsonrpc,
    lsp_types::{self as lsp, PositionEncodingKind},
};

use crate::document::{DocumentSnapshot, Position, PositionEncoding};

/// The encoding to use: UTF-8 when the client offers it (no conversion needed), else UTF-16,
/// which every client supports.
pub fn negotiate_encoding(offered: Option<&[PositionEncodingKind]>) -> PositionEncoding {
    match offered {
        Some(kinds) if kinds.contains(&PositionEncodingKind::UTF8) => PositionEncoding::Utf8,
        _ => PositionEncoding::Utf16,
    }
}

pub fn encoding_kind(e: PositionEncoding) -> PositionEncodingKind {
    match e {
        PositionEncoding::Utf8 => PositionEncodingKind::UTF8,
        PositionEncoding::Utf16 => PositionEncodingKind::UTF16,
    }
}

/// `text` as an LSP snippet that inserts exactly `text`: `\`, `$` and `}` escaped.
pub fn snippet_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if matches!(c, '\\' | '$' | '}') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

pub fn position(p: lsp::Position) -> Position {
    Position {
        line: p.line,
        character: p.character,
    }
}

/// Byte offset of an LSP position in `doc`; out of range is an `InvalidParams` error.
pub fn offset(doc: &DocumentSnapshot, p: lsp::Position, enc: PositionEncoding) -> jsonrpc::Result<usize> {
    doc.offset_at(position(p), enc)
        .map_err(|e| invalid_params(format!("{}: {e}", doc.uri)))
}

pub fn lsp_position(
    doc: &DocumentSnapshot,
    offset: usize,
    enc: PositionEncoding,
) -> jsonrpc::Result<lsp::Position> {
    let p = doc
        .position_at(offset, enc)
        .map_err(|e| internal(format!("{}: {e}", doc.uri)))?;
    Ok(lsp::Position {
        line: p.line,
        character: p.character,
    })
}

/// The LSP range of bytes `start..end` of `doc`.
pub fn range(
    doc: &DocumentSnapshot,
    start: usize,
    end: usize,
    enc: PositionEncoding,
) -> jsonrpc::Result<lsp::Range> {
    Ok(lsp::Range {
        start: lsp_position(doc, start, enc)?,
        end: lsp_position(doc, end, enc)?,
    })
}

pub fn invalid_params(msg: impl Into<String>) -> jsonrpc::Error {
    jsonrpc::Error::invalid_params(msg.into())
}

pub fn internal(msg: impl Into<String>) -> jsonrpc::Error {
    jsonrpc::Error {
        message: msg.into().into(),
        ..jsonrpc::Error::internal_error()
    }
}

pub fn cancelled() -> jsonrpc::Error {
    jsonrpc::Error::new(jsonrpc::ErrorCode::RequestCancelled)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snippet_escape_keeps_text_literal() {
        assert_eq!(snippet_escape("return a + b"), "return a + b");
        assert_eq!(snippet_escape(r#"f"${x}\n""#), r#"f"\${x\}\\n""#);
    }
}
