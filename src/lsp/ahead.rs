//! The next suggestion, computed before it is asked for. Once a suggestion is shown, the
//! completion at the cursor its accept will give (the document with the suggestion in place,
//! the cursor after it) starts at once, beside the user reading the ghost text: its prompt is
//! the shown one plus the suggestion, so the prefix store has all but the suggestion's last
//! tokens warm. A request that finds the document and cursor that answer was computed for takes
//! it (or waits for it while it runs), with no debounce. Whatever the editor does to say so
//! (a `laya.accept` command, a partial accept, nothing at all), the accept shows as the next
//! request's document, so the match is on text and cursor, never on the editor's signal.
//!
//! Typing the suggestion keeps the answer coming (typing it to its end is the same document);
//! any other change, a request of the document that asks the model, `didClose` and a newer
//! suggestion cancel it. The engine sees an ordinary request, cancelled as any other.

use std::sync::Arc;

use dashmap::DashMap;
use tokio::task::JoinHandle;

use crate::{
    completion::pipeline::Computed,
    engine::{Cancel, EngineError},
};

/// One document's answer ahead.
struct Ahead {
    /// The document's text before the accept, where the suggestion was shown, and the text
    /// the suggestion inserts there: a document on the way to the accept is this text with
    /// a prefix of the suggestion typed at the cursor.
    shown_text: Arc<str>,
    shown_cursor: usize,
    insert: String,
    /// The text and cursor the answer is for.
    text: Arc<str>,
    cursor: usize,
    cancel: Cancel,
    task: JoinHandle<Result<Computed, EngineError>>,
}

impl Ahead {
    /// Whether `text` is the shown text with a prefix of the suggestion typed at its cursor
    /// (the suggestion itself included).
    fn on_the_way(&self, text: &str) -> bool {
        let old = &*self.shown_text;
        let Some(n) = text.len().checked_sub(old.len()) else {
            return false;
        };
        let c = self.shown_cursor;
        text.is_char_boundary(c)
            && text.is_char_boundary(c + n)
            && text[..c] == old[..c]
            && text[c + n..] == old[c..]
            && self.insert.starts_with(&text[c..c + n])
    }
}

/// The answers ahead, one per document at most.
#[derive(Default)]
pub struct Aheads {
    by_doc: DashMap<String, Ahead>,
}

/// What the answer ahead is computed from, besides the pipeline.
pub struct Shown {
    /// The document's text where the suggestion was shown, and the cursor.
    pub text: Arc<str>,
    pub cursor: usize,
    /// The suggestion and the bytes after the cursor it replaces.
    pub insert: String,
    pub replace_len: usize,
}

impl Aheads {
    /// Start computing the answer for `uri` after `shown` is accepted, replacing (and
    /// cancelling) the document's earlier one. `compute` gets the document's text and cursor
    /// after the accept, and the cancel to pass on.
    pub fn start<F, Fut>(&self, uri: &str, shown: Shown, compute: F)
    where
        F: FnOnce(Cancel) -> Fut,
        Fut: std::future::Future<Output = Result<Computed, EngineError>> + Send + 'static,
    {
        let cancel = Cancel::new();
        let text: Arc<str> = Arc::from(format!(
            "{}{}{}",
            &shown.text[..shown.cursor],
            shown.insert,
            &shown.text[shown.cursor + shown.replace_len..]
        ));
        let cursor = shown.cursor + shown.insert.len();
        let task = tokio::spawn(compute(cancel.clone()));
        let ahead = Ahead {
            shown_text: shown.text,
            shown_cursor: shown.cursor,
            insert: shown.insert,
            text,
            cursor,
            cancel,
            task,
        };
        if let Some(old) = self.by_doc.insert(uri.to_owned(), ahead) {
            old.cancel.cancel();
        }
    }

    /// The answer computed for `uri` at exactly `text` and `cursor`, taken (a request uses it
    /// once). Any other answer ahead of the document is cancelled: the request asking is about
    /// to ask the model, and an answer for an accept that did not come must not hold the model
    /// from it (a keystroke typing the suggestion is answered before it asks).
    pub fn take(
        &self,
        uri: &str,
        text: &str,
        cursor: usize,
    ) -> Option<JoinHandle<Result<Computed, EngineError>>> {
        let (_, ahead) = self.by_doc.remove(uri)?;
        if &*ahead.text == text && ahead.cursor == cursor {
            return Some(ahead.task);
        }
        ahead.cancel.cancel();
        None
    }

    /// The document changed to `text`: cancel its answer ahead unless `text` is on the way
    /// to it or is it.
    pub fn changed(&self, uri: &str, text: &str) {
        self.by_doc.remove_if(uri, |_, a| {
            let keep = a.on_the_way(text) || &*a.text == text;
            if !keep {
                a.cancel.cancel();
            }
            !keep
        });
    }

    /// Cancel and forget `uri`'s answer ahead (closed, or a request that does not want it).
    pub fn forget(&self, uri: &str) {
        if let Some((_, a)) = self.by_doc.remove(uri) {
            a.cancel.cancel();
        }
    }

    /// Cancel every answer ahead (shutdown).
    pub fn cancel_all(&self) {
        for a in self.by_doc.iter() {
            a.cancel.cancel();
        }
        self.by_doc.clear();
    }

    /// Whether no answer ahead is held (computing or computed).
    pub fn is_empty(&self) -> bool {
        self.by_doc.is_empty()
    }
}
