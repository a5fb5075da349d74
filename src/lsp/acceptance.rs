//! Which shown suggestions the user accepted. Clients that run an item's command report an
//! acceptance with `laya.accept`; others (Helix never runs it) only change the document. So an
//! item counts as accepted either way: by its command, or by a `didChange` that takes the
//! document from the text the item was shown for to that text with the suggestion, or a
//! prefix of it that ends at a word or a line (a partial accept), inserted at the cursor. Each
//! shown item counts once, whichever way is seen first; `laya/acceptance` says how many were
//! seen each way. Only the items of a document's last answer are watched (those the editor
//! can still show).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use serde::Serialize;

/// How much of a suggestion was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Full,
    Word,
    Line,
}

impl Kind {
    /// `laya.accept`'s `kind` argument (`full` when absent or unknown).
    pub fn parse(s: Option<&str>) -> Kind {
        match s {
            Some("word") => Kind::Word,
            Some("line") => Kind::Line,
            _ => Kind::Full,
        }
    }
}

/// How an acceptance was seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// The item's `laya.accept` command.
    Command,
    /// The document changed to hold the suggestion at the cursor.
    Edit,
}

/// A suggestion as it was shown.
struct Shown {
    id: u64,
    /// The document's text when it was shown, and the cursor (byte offset).
    text: Arc<str>,
    cursor: usize,
    insert: String,
    /// Bytes after the cursor the item replaces.
    replace_len: usize,
}

#[derive(Default)]
struct Inner {
    /// The items of each document's last answer.
    shown: HashMap<String, Vec<Shown>>,
    /// Items already counted, with the way they were first seen.
    accepted: HashMap<u64, Seen>,
    next_id: u64,
    full: u64,
    word: u64,
    line: u64,
    by_command: u64,
    by_edit: u64,
}

/// Counts of shown and accepted suggestions (see the module text).
#[derive(Default)]
pub struct Acceptance {
    inner: Mutex<Inner>,
}

/// What `laya/acceptance` reports.
#[derive(Debug, PartialEq, Serialize)]
pub struct Report {
    pub shown: u64,
    pub full: u64,
    pub word: u64,
    pub line: u64,
    /// Accepted items first seen through their command, and through the document's change.
    #[serde(rename = "byCommand")]
    pub by_command: u64,
    #[serde(rename = "byEdit")]
    pub by_edit: u64,
}

impl Acceptance {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new answer for `uri` (replacing the last one's items): returns an id for each item,
    /// given as `(text inserted, bytes after the cursor replaced)`, shown for document text
    /// `text` at byte `cursor`.
    pub fn show(&self, uri: &str, text: &Arc<str>, cursor: usize, items: Vec<(String, usize)>) -> Vec<u64> {
        let mut inner = self.lock();
        let ids: Vec<u64> = (0..items.len() as u64).map(|i| inner.next_id + i).collect();
        inner.next_id += items.len() as u64;
        let shown = items
            .into_iter()
            .zip(&ids)
            .map(|((insert, replace_len), &id)| Shown {
                id,
                text: text.clone(),
                cursor,
                insert,
                replace_len,
            })
            .collect();
        inner.shown.insert(uri.to_owned(), shown);
        ids
    }

    /// Whether an item of `uri`'s last answer was shown for `text` (the same allocation) and
    /// is not counted yet: only then is a change worth comparing.
    pub fn watches(&self, uri: &str, text: &Arc<str>) -> bool {
        let inner = self.lock();
        inner.shown.get(uri).is_some_and(|items| {
            items
                .iter()
                .any(|s| Arc::ptr_eq(&s.text, text) && !inner.accepted.contains_key(&s.id))
        })
    }

    /// The document `uri` went from `before` to `after`: count the item this change accepted,
    /// if any. `before` must be the text the item was shown for (the same allocation: a
    /// document changed since is never matched against an older answer).
    pub fn changed(&self, uri: &str, before: &Arc<str>, after: &str) -> Option<Kind> {
        let mut inner = self.lock();
        let (id, kind) = inner.shown.get(uri)?.iter().find_map(|s| {
            if !Arc::ptr_eq(&s.text, before) {
                return None;
            }
            taken(s, after).map(|k| (s.id, k))
        })?;
        if inner.accepted.contains_key(&id) {
            return None;
        }
        inner.count(id, kind, Seen::Edit);
        Some(kind)
    }

    /// `laya.accept` for item `id`.
    pub fn command(&self, id: Option<u64>, kind: Kind) {
        let mut inner = self.lock();
        match id {
            Some(id) if inner.accepted.contains_key(&id) => {}
            Some(id) => inner.count(id, kind, Seen::Command),
            // A command without an id (older clients' items): counted, never matched.
            None => inner.tally(kind, Seen::Command),
        }
    }

    /// Forget a closed document's items.
    pub fn forget(&self, uri: &str) {
        self.lock().shown.remove(uri);
    }

    pub fn report(&self) -> Report {
        let inner = self.lock();
        Report {
            shown: inner.next_id,
            full: inner.full,
            word: inner.word,
            line: inner.line,
            by_command: inner.by_command,
            by_edit: inner.by_edit,
        }
    }
}

impl Inner {
    fn count(&mut self, id: u64, kind: Kind, seen: Seen) {
        self.accepted.insert(id, seen);
        self.tally(kind, seen);
    }

    fn tally(&mut self, kind: Kind, seen: Seen) {
        match kind {
            Kind::Full => self.full += 1,
            Kind::Word => self.word += 1,
            Kind::Line => self.line += 1,
        }
        match seen {
            Seen::Command => self.by_command += 1,
            Seen::Edit => self.by_edit += 1,
        }
    }
}

/// How much of `s` the text `after` holds at its cursor: the whole suggestion (replacing what
/// it replaces), or a prefix of it ending at a word or a line inserted before the text that
/// followed the cursor. A single typed character is not an acceptance.
fn taken(s: &Shown, after: &str) -> Option<Kind> {
    let before: &str = &s.text;
    let head = before.get(..s.cursor)?;
    if !after.starts_with(head) {
        return None;
    }
    let tail = before.get(s.cursor + s.replace_len..)?;
    if after.len() == head.len() + s.insert.len() + tail.len()
        && after.ends_with(tail)
        && after[head.len()..].starts_with(&s.insert)
    {
        return Some(Kind::Full);
    }
    // A partial accept keeps all that followed the cursor.
    let tail = before.get(s.cursor..)?;
    let inserted = after.get(head.len()..after.len().checked_sub(tail.len())?)?;
    if !after.ends_with(tail) || inserted.chars().count() < 2 || !s.insert.starts_with(inserted) {
        return None;
    }
    let next = s.insert[inserted.len()..].chars().next();
    match next {
        None => Some(Kind::Full),
        Some('\n') | Some('\r') => Some(Kind::Line),
        Some(c) if !is_word(c) || !inserted.chars().last().is_some_and(is_word) => Some(Kind::Word),
        Some(_) => None,
    }
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(doc: &str, insert: &str, replace_len: usize) -> (Acceptance, Arc<str>) {
        let cursor = doc.find("$0").unwrap();
        let text: Arc<str> = doc.replace("$0", "").into();
        let a = Acceptance::default();
        a.show("u", &text, cursor, vec![(insert.to_owned(), replace_len)]);
        (a, text)
    }

    #[test]
    fn a_change_that_inserts_the_suggestion_is_an_acceptance_once() {
        let (a, text) = shown("def f():\n    $0\n", "return 1", 0);
        assert_eq!(
            a.changed("u", &text, "def f():\n    return 1\n"),
            Some(Kind::Full)
        );
        // Seen again (the same change reported twice, or the command after it): once.
        assert_eq!(a.changed("u", &text, "def f():\n    return 1\n"), None);
        a.command(Some(0), Kind::Full);
        assert_eq!(
            a.report(),
            Report {
                shown: 1,
                full: 1,
                word: 0,
                line: 0,
                by_command: 0,
                by_edit: 1
            }
        );
    }

    #[test]
    fn the_command_first_then_the_change_counts_once() {
        let (a, text) = shown("x = $0\n", "compute(1)", 0);
        a.command(Some(0), Kind::Full);
        assert_eq!(a.changed("u", &text, "x = compute(1)\n"), None);
        let r = a.report();
        assert_eq!((r.full, r.by_command, r.by_edit), (1, 1, 0));
    }

    #[test]
    fn replaced_closers_and_partial_accepts() {
        let (a, text) = shown("print(fib($0)\n", "10))", 1);
        assert_eq!(a.changed("u", &text, "print(fib(10))\n"), Some(Kind::Full));
        let (a, text) = shown("let $0;\n", "total = items.len()", 0);
        assert_eq!(a.changed("u", &text, "let total;\n"), Some(Kind::Word));
        let (a, text) = shown("fn f() {\n    $0\n}\n", "let x = 1;\n    x", 0);
        assert_eq!(
            a.changed("u", &text, "fn f() {\n    let x = 1;\n}\n"),
            Some(Kind::Line)
        );
    }

    #[test]
    fn typing_other_text_or_one_character_is_no_acceptance() {
        let (a, text) = shown("x = $0\n", "compute(1)", 0);
        assert_eq!(a.changed("u", &text, "x = c\n"), None, "one typed character");
        assert_eq!(a.changed("u", &text, "x = comp\n"), None, "inside a word");
        assert_eq!(a.changed("u", &text, "x = other\n"), None);
        assert_eq!(
            a.changed("u", &text, "y = compute(1)\n"),
            None,
            "the text before changed"
        );
        // A document changed since the answer is not matched against it.
        let later: Arc<str> = "x = \n".into();
        assert_eq!(a.changed("u", &later, "x = compute(1)\n"), None);
        assert_eq!(a.report().by_edit, 0);
    }

    #[test]
    fn a_new_answer_replaces_the_last_ones_items() {
        let (a, text) = shown("x = $0\n", "compute(1)", 0);
        let ids = a.show("u", &text, 4, vec![("other()".into(), 0)]);
        assert_eq!(ids, [1]);
        assert_eq!(a.changed("u", &text, "x = compute(1)\n"), None);
        assert_eq!(a.changed("u", &text, "x = other()\n"), Some(Kind::Full));
        a.forget("u");
        assert_eq!(a.report().shown, 2);
    }
}
