//! A model hub on loopback for `laya models fetch`: the Hugging Face API's repository
//! listing (`/api/models/{repo}/revision/{rev}?blobs=true`) and files
//! (`/{repo}/resolve/{rev}/{file}`, with `Range`), and the faults a real one has: a transfer
//! cut short, bytes that are not the listed ones, a server that ignores `Range`, a redirect
//! to another path (as the hub's CDN), an error status. Every request is recorded.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Write},
    net::{TcpListener, TcpStream},
    sync::{Arc, Mutex},
};

/// One file of a repository; `lfs` files are listed with their sha256, as the hub lists
/// weights.
#[derive(Clone, Debug)]
pub struct File {
    pub bytes: Vec<u8>,
    pub lfs: bool,
}

#[derive(Clone, Debug, Default)]
pub struct Faults {
    /// Cut the transfer of this file after this many bytes of it, this many times.
    pub cut: Option<(String, u64, u32)>,
    /// Serve other bytes (of the same length) than the listing's for this file.
    pub corrupt: Option<String>,
    /// Serve these bytes more after this file.
    pub extra: Option<(String, usize)>,
    /// Answer every file in full, ignoring `Range`.
    pub ignore_range: bool,
    /// Send file requests through a redirect first.
    pub redirect: bool,
    /// Answer this status to every request whose path contains the string.
    pub status: Option<(String, u16)>,
}

/// A request as it arrived: path (with query), `Range` and `Authorization` headers.
#[derive(Clone, Debug)]
pub struct Request {
    pub path: String,
    pub range: Option<String>,
    pub auth: Option<String>,
}

#[derive(Default)]
struct State {
    repos: BTreeMap<String, (String, BTreeMap<String, File>)>,
    faults: Faults,
    log: Vec<Request>,
}

pub struct FakeHub {
    pub url: String,
    state: Arc<Mutex<State>>,
}

impl FakeHub {
    pub fn start() -> FakeHub {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let state = shared.clone();
                std::thread::spawn(move || {
                    let _ = serve(conn, &state);
                });
            }
        });
        FakeHub { url, state }
    }

    /// Add (or replace) `repo` at commit `sha`.
    pub fn repo(&self, repo: &str, sha: &str, files: &[(&str, File)]) {
        let files = files.iter().map(|(n, f)| (n.to_string(), f.clone())).collect();
        self.state
            .lock()
            .unwrap()
            .repos
            .insert(repo.to_owned(), (sha.to_owned(), files));
    }

    pub fn faults(&self, faults: Faults) {
        self.state.lock().unwrap().faults = faults;
    }

    pub fn log(&self) -> Vec<Request> {
        self.state.lock().unwrap().log.clone()
    }

    pub fn clear_log(&self) {
        self.state.lock().unwrap().log.clear();
    }

    /// Requests for `file` (its resolve path), in order.
    pub fn gets_of(&self, file: &str) -> Vec<Request> {
        self.log()
            .into_iter()
            .filter(|r| r.path.contains("/resolve/") && r.path.ends_with(&format!("/{file}")))
            .collect()
    }
}

fn respond(
    conn: &mut TcpStream,
    status: u16,
    headers: &[(&str, String)],
    body: &[u8],
) -> std::io::Result<()> {
    let mut head = format!("HTTP/1.1 {status} X\r\nConnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    conn.write_all(head.as_bytes())?;
    conn.write_all(body)?;
    conn.flush()
}

fn serve(mut conn: TcpStream, state: &Mutex<State>) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let path = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
    let (mut range, mut auth) = (None, None);
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            match k.trim().to_ascii_lowercase().as_str() {
                "range" => range = Some(v.trim().to_owned()),
                "authorization" => auth = Some(v.trim().to_owned()),
                _ => {}
            }
        }
    }
    let mut s = state.lock().unwrap();
    s.log.push(Request {
        path: path.clone(),
        range: range.clone(),
        auth,
    });
    if let Some((part, code)) = &s.faults.status {
        if path.contains(part.as_str()) {
            let code = *code;
            drop(s);
            return respond(&mut conn, code, &[("Content-Length", "0".into())], b"");
        }
    }
    if let Some(rest) = path.strip_prefix("/api/models/") {
        let (repo, _rev) = rest.split_once("/revision/").unwrap_or((rest, "main"));
        let Some((sha, files)) = s.repos.get(repo) else {
            drop(s);
            return respond(&mut conn, 404, &[("Content-Length", "0".into())], b"");
        };
        let siblings: Vec<_> = files
            .iter()
            .map(|(name, f)| {
                let mut v = serde_json::json!({"rfilename": name, "size": f.bytes.len()});
                if f.lfs {
                    v["lfs"] = serde_json::json!({
                        "sha256": laya::fetch::sha256_hex(&f.bytes),
                        "size": f.bytes.len(),
                        "pointerSize": 134,
                    });
                }
                v
            })
            .collect();
        let body = serde_json::json!({"id": repo, "sha": sha, "siblings": siblings}).to_string();
        drop(s);
        return respond(
            &mut conn,
            200,
            &[("Content-Length", body.len().to_string())],
            body.as_bytes(),
        );
    }
    let (repo_file, redirected) = match path.strip_prefix("/cdn") {
        Some(p) => (p.to_owned(), true),
        None => (path.clone(), false),
    };
    let Some((repo, rest)) = repo_file.trim_start_matches('/').split_once("/resolve/") else {
        drop(s);
        return respond(&mut conn, 404, &[("Content-Length", "0".into())], b"");
    };
    let (rev, name) = rest.split_once('/').unwrap_or((rest, ""));
    let file = s
        .repos
        .get(repo)
        .filter(|(sha, _)| rev == "main" || rev == sha)
        .and_then(|(_, files)| files.get(name))
        .cloned();
    let Some(file) = file else {
        drop(s);
        return respond(&mut conn, 404, &[("Content-Length", "0".into())], b"");
    };
    if s.faults.redirect && !redirected {
        drop(s);
        return respond(
            &mut conn,
            302,
            &[
                ("Location", format!("/cdn{repo_file}")),
                ("Content-Length", "0".into()),
            ],
            b"",
        );
    }
    let mut bytes = file.bytes.clone();
    if s.faults.corrupt.as_deref() == Some(name) {
        for b in bytes.iter_mut().step_by(7) {
            *b = b.wrapping_add(1);
        }
    }
    if let Some((_, n)) = s.faults.extra.as_ref().filter(|(f, _)| f == name) {
        bytes.extend(vec![7u8; *n]);
    }
    let start: u64 = match (&range, s.faults.ignore_range) {
        (Some(r), false) => r
            .strip_prefix("bytes=")
            .and_then(|r| r.strip_suffix('-'))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0),
        _ => 0,
    };
    let len = bytes.len() as u64;
    if start > len || (start == len && len > 0) {
        drop(s);
        return respond(&mut conn, 416, &[("Content-Length", "0".into())], b"");
    }
    // Where the transfer is cut: after `at` bytes of the file, while cuts are left.
    let mut cut_at = None;
    if let Some((f, at, left)) = s.faults.cut.as_mut() {
        if f == name && *left > 0 && *at > start {
            *left -= 1;
            cut_at = Some(*at);
        }
    }
    drop(s);
    let body = &bytes[start as usize..];
    let mut headers = vec![("Content-Length", body.len().to_string())];
    let status = if start > 0 {
        headers.push(("Content-Range", format!("bytes {start}-{}/{len}", len - 1)));
        206
    } else {
        200
    };
    match cut_at {
        Some(at) => {
            let sent = (at - start) as usize;
            respond(&mut conn, status, &headers, &body[..sent.min(body.len())])?;
            conn.shutdown(std::net::Shutdown::Both)
        }
        None => respond(&mut conn, status, &headers, body),
    }
}
