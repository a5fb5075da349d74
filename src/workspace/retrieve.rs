//! What the prompt shows of the workspace at a cursor: the definitions of the identifiers
//! near it that other files define (with the members of the types among them, and of the
//! types their signatures name), then outlines of the files the current file imports (and,
//! for Go and Java, the other files of its package), most relevant first, inside a byte
//! budget. Everything comes from the index; a lookup reads no file.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use std::sync::Arc;

use super::{resolve, DefKind, Definition, FileEntry, WorkspaceIndex};
use crate::prompt::Snippet;
use crate::syntax::Language;

/// Lines before and after the cursor whose identifiers count as near it.
pub const LINES_BEFORE: usize = 40;
pub const LINES_AFTER: usize = 10;
/// A name defined in more files than this, none of them imported, is too common to guess.
pub const MAX_AMBIGUOUS: usize = 2;
/// Members shown for one type.
pub const MAX_MEMBERS: usize = 24;
/// One file's share of the budget at most, so that one large outline does not crowd out
/// the rest.
pub const FILE_SHARE: f32 = 0.6;

/// What retrieval chose: the snippets for the prompt, most relevant first, and per file the
/// names it drew on (for `laya/explain`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Retrieved {
    pub snippets: Vec<Snippet>,
    pub symbols: Vec<(String, Vec<String>)>,
}

/// Retrieval for the file at `path` (absolute) holding `text`, cursor at byte `cursor`,
/// with import statements `imports`; at most `max_bytes` of snippets.
pub fn retrieve(
    index: &WorkspaceIndex,
    path: &Path,
    language: Language,
    text: &str,
    cursor: usize,
    imports: &[String],
    max_bytes: usize,
) -> Retrieved {
    index
        .retrievals
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if max_bytes == 0 || index.root_of(path).is_none() {
        return Retrieved::default();
    }
    let local: HashSet<String> = match index.file(path) {
        Some(f) => f.definitions.iter().map(|d| d.name.clone()).collect(),
        None => super::defs::extract(language, text)
            .into_iter()
            .map(|d| d.name)
            .collect(),
    };
    let mut imported = resolve::imported_files(index, language, path, imports);
    for p in resolve::same_package(index, language, path) {
        if !imported.contains(&p) {
            imported.push(p);
        }
    }
    let mut picks = Picks::default();
    let no_defs = Arc::new(FileEntry {
        language,
        definitions: vec![],
    });
    let mut defs_of = |p: &Path| -> Arc<FileEntry> { index.file(p).unwrap_or_else(|| no_defs.clone()) };

    // 1. Identifiers near the cursor that other files define.
    for name in identifiers_near(text, cursor) {
        if local.contains(&name) {
            continue;
        }
        let files: Vec<PathBuf> = index
            .files_defining(&name)
            .into_iter()
            .filter(|p| p != path)
            .collect();
        let preferred: Vec<&PathBuf> = files.iter().filter(|p| imported.contains(p)).collect();
        let chosen: Vec<&PathBuf> = if !preferred.is_empty() {
            preferred
        } else if files.len() <= MAX_AMBIGUOUS {
            files.iter().collect()
        } else {
            continue;
        };
        for file in chosen {
            let entry = defs_of(file);
            let defs = &entry.definitions;
            for (i, d) in defs.iter().enumerate().filter(|(_, d)| d.name == name) {
                picks.add(file, i, defs, &name);
                if d.kind == DefKind::Type {
                    picks.add_members(file, i, defs);
                }
                // The types its signature names: `client: HttpClient`, `-> Response`.
                for t in identifiers(&d.signature) {
                    if t == name || local.contains(&t) {
                        continue;
                    }
                    for tf in index
                        .files_defining(&t)
                        .into_iter()
                        .filter(|p| p != path)
                        .take(MAX_AMBIGUOUS)
                    {
                        let tentry = defs_of(&tf);
                        let tdefs = &tentry.definitions;
                        for (j, _) in tdefs
                            .iter()
                            .enumerate()
                            .filter(|(_, x)| x.name == t && x.kind == DefKind::Type)
                        {
                            picks.add(&tf, j, tdefs, &t);
                            picks.add_members(&tf, j, tdefs);
                        }
                    }
                }
            }
        }
    }
    // 2. Outlines of the imported files: their top-level definitions, and the members of
    // their types.
    for file in &imported {
        let entry = defs_of(file);
        let defs = &entry.definitions;
        for (i, d) in defs.iter().enumerate() {
            let top = d.container.is_none();
            let member_of_type = d.container.is_some_and(|c| defs[c].container.is_none());
            if top || member_of_type {
                picks.add_outline(file, i, defs);
            }
        }
    }
    picks.render(index, &mut defs_of, max_bytes)
}

/// Definitions chosen per file, in the order files were first chosen.
#[derive(Default)]
struct Picks {
    order: Vec<PathBuf>,
    /// Per file: definition index → whether it was asked for by name (not only as an
    /// outline line), and the names that brought it in.
    chosen: HashMap<PathBuf, BTreeMap<usize, (bool, Vec<String>)>>,
}

impl Picks {
    fn entry(&mut self, file: &Path) -> &mut BTreeMap<usize, (bool, Vec<String>)> {
        if !self.chosen.contains_key(file) {
            self.order.push(file.to_owned());
        }
        self.chosen.entry(file.to_owned()).or_default()
    }

    /// Definition `i` of `file` (and the type holding it) asked for by `name`.
    fn add(&mut self, file: &Path, i: usize, defs: &[Definition], name: &str) {
        let e = self.entry(file);
        let slot = e.entry(i).or_insert((true, vec![]));
        slot.0 = true;
        if !slot.1.iter().any(|n| n == name) {
            slot.1.push(name.to_owned());
        }
        if let Some(c) = defs[i].container {
            e.entry(c).or_insert((true, vec![]));
        }
    }

    fn add_members(&mut self, file: &Path, ty: usize, defs: &[Definition]) {
        let e = self.entry(file);
        for (j, _) in defs
            .iter()
            .enumerate()
            .filter(|(_, d)| d.container == Some(ty))
            .take(MAX_MEMBERS)
        {
            e.entry(j).or_insert((true, vec![]));
        }
    }

    fn add_outline(&mut self, file: &Path, i: usize, defs: &[Definition]) {
        let e = self.entry(file);
        e.entry(i).or_insert((false, vec![]));
        if let Some(c) = defs[i].container {
            e.entry(c).or_insert((false, vec![]));
        }
    }

    /// One snippet per file, the file's chosen definitions in file order; files in the order
    /// chosen while they fit (a file's asked-for definitions first, then its outline lines).
    fn render(
        self,
        index: &WorkspaceIndex,
        defs_of: &mut impl FnMut(&Path) -> Arc<FileEntry>,
        max_bytes: usize,
    ) -> Retrieved {
        let mut out = Retrieved::default();
        let mut used = 0;
        let per_file = ((max_bytes as f32) * FILE_SHARE) as usize;
        for file in &self.order {
            let entry = defs_of(file);
            let defs = &entry.definitions;
            let chosen = &self.chosen[file];
            let room = per_file.min(max_bytes.saturating_sub(used));
            // Asked-for lines first while they fit, then outline lines, shown in file order.
            let mut keep: Vec<usize> = vec![];
            let mut size = 0;
            for pass in [true, false] {
                for (&i, (asked, _)) in chosen {
                    if *asked != pass {
                        continue;
                    }
                    let len = defs[i].signature.len() + 1;
                    if size + len <= room {
                        keep.push(i);
                        size += len;
                    }
                }
            }
            if keep.is_empty() {
                continue;
            }
            keep.sort_unstable();
            let text: String = keep.iter().map(|&i| format!("{}\n", defs[i].signature)).collect();
            let rel = index.relative(file).to_string_lossy().into_owned();
            used += text.len() + rel.len() + 16;
            let mut names: Vec<String> = keep.iter().flat_map(|i| chosen[i].1.clone()).collect();
            names.dedup();
            out.symbols.push((rel.clone(), names));
            out.snippets.push(Snippet { path: rel, text });
            if used >= max_bytes {
                break;
            }
        }
        out
    }
}

/// The identifiers (two characters or more, not starting with a digit) of the lines near the
/// cursor, nearest first (lines before the cursor before lines after at the same distance);
/// the word the cursor is in is left out (it is still being typed).
pub fn identifiers_near(text: &str, cursor: usize) -> Vec<String> {
    let cursor = cursor.min(text.len());
    let mut word_start = cursor;
    while word_start > 0 && text[..word_start].chars().next_back().is_some_and(is_ident_char) {
        word_start -= text[..word_start].chars().next_back().map_or(1, char::len_utf8);
    }
    let before: Vec<&str> = text[..word_start].rsplit('\n').take(LINES_BEFORE + 1).collect();
    let after: Vec<&str> = text[cursor..].split('\n').skip(1).take(LINES_AFTER).collect();
    let mut seen = HashSet::new();
    let mut out = vec![];
    for d in 0..before.len().max(after.len() + 1) {
        let lines = before
            .get(d)
            .into_iter()
            .chain(d.checked_sub(1).and_then(|a| after.get(a)));
        for line in lines {
            // Within a line, the identifiers nearest its end (the cursor's side) first.
            let mut ids = identifiers(line);
            ids.reverse();
            for id in ids {
                if seen.insert(id.clone()) {
                    out.push(id);
                }
            }
        }
    }
    out
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The identifiers of `s`, in order.
pub fn identifiers(s: &str) -> Vec<String> {
    let mut out = vec![];
    let mut cur = String::new();
    for c in s.chars().chain(std::iter::once(' ')) {
        if is_ident_char(c) {
            cur.push(c);
        } else {
            if cur.chars().count() >= 2 && !cur.starts_with(|c: char| c.is_ascii_digit()) {
                out.push(std::mem::take(&mut cur));
            }
            cur.clear();
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workspace::tests::workspace;
    use crate::workspace::Limits;

    /// Retrieval at `$0` in `current` (which is also written to the workspace).
    fn at_cursor(
        files: &[(&str, &str)],
        current: &str,
        marked: &str,
        imports: &[&str],
        max: usize,
    ) -> Retrieved {
        let cursor = marked.find("$0").unwrap();
        let text = marked.replace("$0", "");
        let mut all: Vec<(&str, &str)> = files.to_vec();
        all.push((current, &text));
        let dir = workspace(&all);
        let index = WorkspaceIndex::new(vec![dir.path().to_owned()], Limits::default());
        index.build(1, |_, _| {});
        let path = index.roots()[0].join(current);
        let imports: Vec<String> = imports.iter().map(|s| s.to_string()).collect();
        retrieve(
            &index,
            &path,
            Language::from_path(current).unwrap(),
            &text,
            cursor,
            &imports,
            max,
        )
    }

    #[test]
    fn identifiers_nearest_first_without_the_word_being_typed() {
        let text = "alpha = 1\nbeta(gamma)\nuser.sa\nafter_line\n";
        let cursor = text.find("user.sa").unwrap() + 7;
        assert_eq!(
            identifiers_near(text, cursor),
            ["user", "gamma", "beta", "after_line", "alpha"]
        );
    }

    #[test]
    fn a_type_used_near_the_cursor_brings_its_members_from_its_file() {
        let r = at_cursor(
            &[
                ("app/models.py", "class User:\n    name: str\n\n    def save(self, force: bool = False) -> None:\n        pass\n\n    def delete(self):\n        pass\n\ndef unrelated():\n    pass\n"),
                ("app/other.py", "def noise():\n    pass\n"),
            ],
            "app/views.py",
            "from .models import User\n\ndef handle(u: User):\n    u.$0\n",
            &["from .models import User"],
            2000,
        );
        assert_eq!(r.snippets.len(), 1, "{r:?}");
        assert_eq!(r.snippets[0].path, "app/models.py");
        assert_eq!(
            r.snippets[0].text,
            "class User:\n    name: str\n    def save(self, force: bool = False) -> None:\n    def delete(self):\ndef unrelated():\n"
        );
        assert_eq!(r.symbols, [("app/models.py".to_owned(), vec!["User".to_owned()])]);
    }

    #[test]
    fn names_defined_here_or_too_common_are_not_fetched_and_the_budget_holds() {
        let common = "def get():\n    pass\n";
        let r = at_cursor(
            &[
                ("a.py", common),
                ("b.py", common),
                ("c.py", common),
                ("d.py", "def helper(x):\n    pass\n"),
            ],
            "main.py",
            "def local():\n    pass\n\nlocal()\nget()\nhelper(1)\n$0",
            &[],
            2000,
        );
        let paths: Vec<&str> = r.snippets.iter().map(|s| s.path.as_str()).collect();
        assert_eq!(paths, ["d.py"]);
        let r = at_cursor(
            &[("d.py", "def helper(x):\n    pass\n")],
            "main.py",
            "helper(1)\n$0",
            &[],
            10,
        );
        assert!(r.snippets.is_empty(), "nothing fits 10 bytes");
    }

    #[test]
    fn a_signatures_types_come_with_their_members() {
        let r = at_cursor(
            &[
                ("client.ts", "export class HttpClient {\n  get(url: string): Promise<Response> { return fetch(url) }\n  post(url: string, body: unknown): Promise<Response> { return fetch(url) }\n}\n"),
                ("service.ts", "export function makeClient(base: string): HttpClient { return new HttpClient() }\n"),
            ],
            "main.ts",
            "const c = makeClient('x')\nc.$0\n",
            &[],
            2000,
        );
        let text: String = r
            .snippets
            .iter()
            .map(|s| format!("{}:\n{}", s.path, s.text))
            .collect();
        assert!(
            text.contains("service.ts:\nexport function makeClient(base: string): HttpClient\n"),
            "{text}"
        );
        assert!(text.contains("  get(url: string): Promise<Response>"), "{text}");
        assert!(
            text.contains("  post(url: string, body: unknown): Promise<Response>"),
            "{text}"
        );
    }
}
