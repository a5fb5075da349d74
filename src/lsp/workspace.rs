//! Which open documents may lend context to a prompt: only those inside the workspace folders
//! the client declared (`workspaceFolders`, else `rootUri`, else `rootPath`, kept up to date
//! by `workspace/didChangeWorkspaceFolders`). A client that declares none (one file opened on
//! its own) shares context only between documents of the same folder as the one completed.
//!
//! A document's text is what the client sent; files on disk are read only by the workspace
//! index (`crate::workspace`), and only under the folders declared here
//! ([`Workspace::file_roots`]). This module decides, by URI, whose text may go into another
//! document's prompt. URIs are compared as
//! paths: percent-decoded, `.` and `..` resolved, segment by segment, so
//! `file:///work/demo/../secret.py` is outside `file:///work/demo`, and `file:///work/demo2`
//! is not inside `file:///work/demo`. A local `file://` URI's path is
//! [`crate::workspace::file_path`]'s, the one the workspace index and the prompt use.

use std::ffi::OsString;

use crate::workspace::file_path;

/// A URI as scheme + authority and its path segments (decoded, `.`/`..` resolved).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UriPath {
    origin: String,
    segments: Vec<OsString>,
}

impl UriPath {
    /// `None` for what is not `scheme://authority/path` (`untitled:Untitled-1`).
    pub fn parse(uri: &str) -> Option<UriPath> {
        // A local file: its path.
        if let Some(path) = file_path(uri) {
            return Some(UriPath {
                origin: "file://".into(),
                segments: path.iter().skip(1).map(OsString::from).collect(),
            });
        }
        // Another scheme (or a file on another host): its path, decoded, as segments.
        let (scheme, rest) = uri.split_once("://")?;
        if scheme.is_empty()
            || !scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
        {
            return None;
        }
        let rest = rest.split(['?', '#']).next().unwrap_or("");
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let mut segments: Vec<OsString> = vec![];
        // Decoded first, so `%2e%2e` and an encoded `/` count as what they spell.
        for seg in percent_encoding::percent_decode_str(path)
            .decode_utf8_lossy()
            .split(['/', '\\'])
        {
            match seg {
                "" | "." => {}
                ".." => {
                    segments.pop();
                }
                s => segments.push(s.into()),
            }
        }
        let origin = format!(
            "{}://{}",
            scheme.to_ascii_lowercase(),
            authority.to_ascii_lowercase()
        );
        // A local file URI that `file_path` refuses names no path.
        (origin != "file://").then_some(UriPath { origin, segments })
    }

    /// A plain path (`rootPath`) as a `file://` URI path.
    pub fn from_path(path: &str) -> Option<UriPath> {
        path.starts_with('/')
            .then(|| UriPath::parse(&format!("file://{path}")))
            .flatten()
    }

    /// `self` is `other` or lies below it.
    pub fn is_within(&self, other: &UriPath) -> bool {
        self.origin == other.origin
            && self.segments.len() >= other.segments.len()
            && self.segments[..other.segments.len()] == other.segments[..]
    }

    /// The folder holding this document.
    pub fn parent(&self) -> UriPath {
        let mut p = self.clone();
        p.segments.pop();
        p
    }
}

/// The declared workspace folders.
#[derive(Clone, Debug, Default)]
pub struct Workspace {
    folders: Vec<UriPath>,
}

impl Workspace {
    /// From `initialize`: the workspace folders, else `rootUri`, else `rootPath`.
    pub fn from_initialize(folders: &[&str], root_uri: Option<&str>, root_path: Option<&str>) -> Workspace {
        let mut w = Workspace::default();
        if !folders.is_empty() {
            for f in folders {
                w.add(f);
            }
        } else if let Some(p) = root_uri.and_then(UriPath::parse) {
            w.folders.push(p);
        } else if let Some(p) = root_path.and_then(UriPath::from_path) {
            w.folders.push(p);
        }
        w
    }

    pub fn add(&mut self, uri: &str) {
        if let Some(p) = UriPath::parse(uri) {
            if !self.folders.contains(&p) {
                self.folders.push(p);
            }
        }
    }

    pub fn remove(&mut self, uri: &str) {
        if let Some(p) = UriPath::parse(uri) {
            self.folders.retain(|f| *f != p);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.folders.is_empty()
    }

    /// The declared folders that are local paths (`file://` URIs, made paths by
    /// [`file_path`]), for the workspace index.
    pub fn file_roots(&self) -> Vec<std::path::PathBuf> {
        self.folders
            .iter()
            .filter(|f| f.origin == "file://")
            .map(|f| {
                let mut p = std::path::PathBuf::from("/");
                p.extend(&f.segments);
                p
            })
            .collect()
    }

    /// May the text of the open document `other` go into the prompt for `current`? Inside a
    /// declared folder; with none declared, inside `current`'s own folder.
    pub fn may_lend(&self, current: &str, other: &str) -> bool {
        let Some(other) = UriPath::parse(other) else {
            return false;
        };
        if self.folders.is_empty() {
            return UriPath::parse(current).is_some_and(|c| other.is_within(&c.parent()));
        }
        self.folders.iter().any(|f| other.is_within(f))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_lend_context_only_from_inside_the_declared_folders() {
        let w = Workspace::from_initialize(&["file:///work/demo", "file:///work/lib/"], None, None);
        let cur = "file:///work/demo/src/main.rs";
        assert!(w.may_lend(cur, "file:///work/demo/src/geom.rs"));
        assert!(w.may_lend(cur, "file:///work/lib/a.rs"));
        assert!(
            !w.may_lend(cur, "file:///work/demo2/a.rs"),
            "a sibling whose name starts alike"
        );
        assert!(!w.may_lend(cur, "file:///etc/passwd"));
        assert!(!w.may_lend(cur, "file:///work/demo/../secret.rs"));
        assert!(
            !w.may_lend(cur, "file:///work/demo/%2E%2E/secret.rs"),
            "encoded .."
        );
        assert!(
            !w.may_lend(cur, "file:///work/demo/src/..%2F..%2F..%2Fetc/passwd"),
            "encoded /"
        );
        assert!(!w.may_lend(cur, "file://otherhost/work/demo/a.rs"));
        assert!(!w.may_lend(cur, "untitled:Untitled-1"));
        assert!(w.may_lend(cur, "file:///work/demo/./src/x.rs"));
    }

    #[test]
    fn without_folders_only_the_current_documents_folder_lends() {
        let w = Workspace::from_initialize(&[], None, None);
        let cur = "file:///home/u/proj/main.py";
        assert!(w.may_lend(cur, "file:///home/u/proj/util.py"));
        assert!(w.may_lend(cur, "file:///home/u/proj/pkg/mod.py"));
        assert!(!w.may_lend(cur, "file:///home/u/other/x.py"));
        assert!(!w.may_lend(cur, "file:///home/u/x.py"));
        let root = Workspace::from_initialize(&[], Some("file:///home/u"), None);
        assert!(root.may_lend(cur, "file:///home/u/x.py"));
        let path = Workspace::from_initialize(&[], None, Some("/home/u/proj"));
        assert!(path.may_lend(cur, "file:///home/u/proj/util.py"));
        assert!(!path.may_lend(cur, "file:///home/u/x.py"));
    }

    #[test]
    fn folders_follow_add_and_remove() {
        let mut w = Workspace::default();
        w.add("file:///a");
        assert!(w.may_lend("file:///b/x", "file:///a/y"));
        w.remove("file:///a");
        assert!(w.is_empty());
        assert!(!w.may_lend("file:///b/x", "file:///a/y"));
    }

    /// A folder's URI is the path `workspace::file_path` makes of it: the index reads that
    /// folder, and documents are compared by the same decoded paths.
    #[test]
    fn folders_are_the_decoded_paths_of_their_uris() {
        let w = Workspace::from_initialize(&["file:///tmp/my%20dir/caf%C3%A9/"], None, None);
        assert_eq!(w.file_roots(), [std::path::PathBuf::from("/tmp/my dir/café")]);
        let cur = "file:///tmp/my%20dir/caf%C3%A9/a.rs";
        assert!(w.may_lend(cur, "file:///tmp/my%20dir/caf%c3%a9/src/b.rs"));
        assert!(!w.may_lend(cur, "file:///tmp/my%20dir/cafe/b.rs"));
        let other_host = Workspace::from_initialize(&["file://host/w"], None, None);
        assert!(other_host.file_roots().is_empty());
        assert!(other_host.may_lend("file://host/w/a.rs", "file://host/w/b.rs"));
    }

    #[test]
    fn odd_uris_never_panic() {
        for u in [
            "",
            "://",
            "file://",
            "%",
            "file:///%",
            "file:///%zz/%e",
            "a://b%",
            "file:///\u{1F642}/..",
        ] {
            let _ = UriPath::parse(u);
            let _ = Workspace::default().may_lend(u, u);
        }
    }
}
