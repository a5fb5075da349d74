//! What keeps the daemon from opening the machine to others: loopback unless configured, a
//! private runtime directory and socket, a bearer token on every HTTP endpoint, bounded
//! requests (body, tokens, candidates, sequence, socket line), no file read on a client's
//! behalf, and no shell run with a client's text. Each test fails if its property breaks.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{SocketAddr, TcpStream, UdpSocket},
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::Path,
    process::Stdio,
    time::{Duration, Instant},
};

use crate::support::{
    daemon::{
        assert_private, http, json_of, serve_in, serve_stub, serve_with, socket_request, stub, stub_tiers,
    },
    laya,
};
use laya::{
    bench::memory::rss_bytes,
    daemon::{paths, protocol::MAX_LINE_BYTES},
};

/// This machine's address on its default route, if it has one (no packet is sent).
fn non_loopback_ip() -> Option<std::net::IpAddr> {
    for probe in ["10.255.255.255:1", "192.168.255.255:1", "8.8.8.8:53"] {
        let s = UdpSocket::bind("0.0.0.0:0").ok()?;
        if s.connect(probe).is_ok() {
            if let Ok(a) = s.local_addr() {
                if !a.ip().is_loopback() && !a.ip().is_unspecified() {
                    return Some(a.ip());
                }
            }
        }
    }
    None
}

fn reachable(addr: SocketAddr) -> bool {
    TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok()
}

#[test]
fn http_is_loopback_by_default_and_a_remote_address_needs_a_token_or_an_explicit_flag() {
    let help = laya().args(["serve", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("[default: 127.0.0.1:7723]"), "{help}");

    let stub = stub();
    let other_ip = non_loopback_ip();
    // The default address, when its port is free here: bound on loopback only.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("default");
    let mut child = laya()
        .args(["serve", "--small-remote", &stub.url, "--large", "none"])
        .env("LAYA_RUNTIME_DIR", &dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::os::unix::net::UnixStream::connect(dir.join("laya.sock")).is_err() {
        assert!(
            Instant::now() < deadline && child.try_wait().unwrap().is_none(),
            "no daemon"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // `status` answers once HTTP is bound (or given up: the port may be taken here).
    let status = socket_request(&dir, r#"{"op":"status"}"#);
    let on_7723 = !status[0]["status"]["http"].is_null();
    if on_7723 {
        assert_eq!(status[0]["status"]["http"], "127.0.0.1:7723");
        assert_eq!(paths::read_http_addr(&dir).unwrap().to_string(), "127.0.0.1:7723");
        if let Some(ip) = other_ip {
            assert!(
                !reachable(SocketAddr::new(ip, 7723)),
                "the default daemon answers on {ip}"
            );
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    // Any loopback address: the same, whatever the port.
    let (_t, d) = serve_stub(&stub, &[]);
    let a = d.http.unwrap();
    assert!(a.ip().is_loopback(), "{a}");
    assert!(reachable(a));
    match other_ip {
        Some(ip) => assert!(!reachable(SocketAddr::new(ip, a.port())), "reachable on {ip}"),
        None => eprintln!("no non-loopback address here: reachability from outside not checked"),
    }
    eprintln!("default port 7723 free here: {on_7723}");
    drop(d);

    // A non-loopback address without a token is refused, with the way out named.
    let out = laya()
        .arg("serve")
        .args(stub_tiers(&stub, "0.0.0.0:0"))
        .env("LAYA_RUNTIME_DIR", tmp.path().join("refused"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not a loopback address")
            && err.contains("--token-env")
            && err.contains("--allow-unauthenticated-remote"),
        "{err}"
    );
    assert!(
        !tmp.path().join("refused").join("laya.sock").exists(),
        "nothing was served"
    );

    // With a token it serves, and the token is required.
    let dir = tmp.path().join("token");
    let d = serve_with(
        &dir,
        &[
            &stub_tiers(&stub, "0.0.0.0:0")[..],
            &["--token-env", "LAYA_SEC_TOKEN"],
        ]
        .concat(),
        |c| {
            c.env("LAYA_SEC_TOKEN", "tok-123");
        },
    );
    let port = d.http.unwrap().port();
    let (code, _) = http(
        SocketAddr::from(([127, 0, 0, 1], port)),
        "GET",
        "/health",
        None,
        &[],
    );
    assert_eq!(code, 401);
    drop(d);

    // With the explicit flag it serves, and says loudly that anyone may use it.
    let dir = tmp.path().join("open");
    let mut child = laya()
        .arg("serve")
        .args(stub_tiers(&stub, "0.0.0.0:0"))
        .arg("--allow-unauthenticated-remote")
        .env("LAYA_RUNTIME_DIR", &dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = String::new();
    for line in BufReader::new(child.stderr.take().unwrap()).lines().take(20) {
        let line = line.unwrap();
        said.push_str(&line);
        said.push('\n');
        if line.contains("laya serve: pid") {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        said.contains("warning: HTTP on 0.0.0.0:") && said.contains("without a token"),
        "{said}"
    );
}

#[test]
fn the_runtime_directory_must_be_private_and_owned_by_this_user() {
    let stub = stub();
    let tmp = tempfile::tempdir().unwrap();
    let refused = |dir: &Path, why: &str| {
        let out = laya()
            .args([
                "serve",
                "--small-remote",
                &stub.url,
                "--large",
                "none",
                "--no-http",
            ])
            .env("LAYA_RUNTIME_DIR", dir)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains(why), "{err}");
        assert!(
            !dir.join("laya.sock").exists() && !dir.join("laya.pid").exists(),
            "nothing was written"
        );
    };
    for mode in [0o770, 0o707, 0o777, 0o1777] {
        let dir = tmp.path().join(format!("loose-{mode:o}"));
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
        refused(&dir, "writable by other users");
        assert_eq!(
            std::fs::metadata(&dir).unwrap().mode() & 0o7777,
            mode,
            "left as it was"
        );
    }
    // A link to a directory is not the directory.
    let real = tmp.path().join("real");
    std::fs::create_dir(&real).unwrap();
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o700)).unwrap();
    let link = tmp.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    refused(&link, "is not a directory");
    // Someone else's directory (only root can make one here).
    if rustix::process::getuid().is_root() {
        let theirs = tmp.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        refused(&theirs, "belongs to user 65534");
    } else {
        eprintln!("not root: a directory of another user cannot be made here");
    }
    // A fresh one is made 0700 and the socket in it is 0600.
    let dir = tmp.path().join("fresh").join("rt");
    let d = serve_in(
        &dir,
        &["--small-remote", &stub.url, "--large", "none", "--no-http"],
    );
    assert_private(&dir);
    drop(d);
}

#[test]
fn a_configured_token_guards_every_endpoint() {
    let stub = stub();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("rt");
    let token = "s3cret-token";
    let d = serve_with(
        &dir,
        &[
            &stub_tiers(&stub, "127.0.0.1:0")[..],
            &["--token-env", "LAYA_SEC_TOKEN"],
        ]
        .concat(),
        |c| {
            c.env("LAYA_SEC_TOKEN", token);
        },
    );
    let addr = d.http.unwrap();
    let endpoints: [(&str, &str, Option<&str>); 5] = [
        ("GET", "/health", None),
        ("GET", "/v1/models", None),
        ("POST", "/complete", Some(r#"{"prefix":"x = ","max_tokens":2}"#)),
        (
            "POST",
            "/v1/completions",
            Some(r#"{"prompt":"x = ","max_tokens":2}"#),
        ),
        (
            "POST",
            "/v1/completions",
            Some(r#"{"prompt":"x = ","max_tokens":2,"stream":true}"#),
        ),
    ];
    let wrong = [
        None,
        Some("Bearer s3cret-tokeN".to_owned()),
        Some("Bearer s3cret".to_owned()),
        Some(format!("Bearer {token}x")),
        Some(format!("Basic {token}")),
        Some(token.to_owned()),
        Some("Bearer ".to_owned()),
    ];
    for (method, path, body) in endpoints {
        for w in &wrong {
            let headers: Vec<(&str, &str)> = w.iter().map(|v| ("Authorization", v.as_str())).collect();
            let (code, text) = http(addr, method, path, body, &headers);
            assert_eq!(code, 401, "{method} {path} with {w:?}: {text}");
            assert_eq!(json_of(&text)["error"]["type"], "authentication_error");
        }
        let bearer = format!("Bearer {token}");
        let (code, text) = http(addr, method, path, body, &[("Authorization", &bearer)]);
        assert_eq!(code, 200, "{method} {path}: {text}");
    }
    assert_eq!(
        stub.prompts.lock().unwrap().len(),
        3,
        "only the three authorized completions ran"
    );
    // An unknown path is no way around it either.
    let (code, _) = http(addr, "GET", "/nope", None, &[]);
    assert_eq!(code, 401);
}

#[test]
fn requests_are_bounded_over_http_and_over_the_socket() {
    let stub = stub();
    let (_tmp, d) = serve_stub(
        &stub,
        &[
            "--max-tokens",
            "32",
            "--max-body-bytes",
            "8192",
            "--max-seq-len",
            "256",
        ],
    );
    let addr = d.http.unwrap();
    let check = |path: &str, body: &str, want: u16, says: &str| {
        let (code, text) = http(addr, "POST", path, Some(body), &[]);
        assert_eq!(code, want, "{path} {}: {text}", &body[..body.len().min(80)]);
        let msg = json_of(&text)["error"]["message"].as_str().unwrap().to_owned();
        assert!(msg.contains(says), "{msg}");
    };
    let big = format!(r#"{{"prompt":"{}"}}"#, "x".repeat(9000));
    check("/v1/completions", &big, 413, "size limit");
    check(
        "/complete",
        &format!(r#"{{"prefix":"{}"}}"#, "x".repeat(9000)),
        413,
        "size limit",
    );
    check(
        "/v1/completions",
        r#"{"prompt":"x","max_tokens":33}"#,
        400,
        "limit of 32",
    );
    check(
        "/complete",
        r#"{"prefix":"x","max_tokens":33}"#,
        400,
        "limit of 32",
    );
    check(
        "/v1/completions",
        r#"{"prompt":"x","max_tokens":2,"n":9}"#,
        400,
        "n must be between 1 and 8",
    );
    check(
        "/complete",
        r#"{"prefix":"x","n":100000}"#,
        400,
        "n must be between 1 and 8",
    );
    // A prompt longer than the sequence limit (256 tokens) but inside the body limit.
    let long = format!(
        r#"{{"prompt":"{}","max_tokens":8}}"#,
        "def f(): pass\\n".repeat(300)
    );
    check("/v1/completions", &long, 400, "sequence limit of 256");
    // The same limits over the socket.
    let socket_err = |request: &str, says: &str| {
        let line = format!(r#"{{"op":"complete","request":{request}}}"#);
        let answer = socket_request(&d.dir, &line);
        assert_eq!(answer.len(), 1, "{answer:?}");
        assert_eq!(answer[0]["error"]["kind"], "invalid_request_error", "{answer:?}");
        assert!(
            answer[0]["error"]["message"].as_str().unwrap().contains(says),
            "{answer:?}"
        );
    };
    socket_err(r#"{"prompt":"x","max_tokens":33}"#, "limit of 32");
    socket_err(r#"{"prompt":"x","max_tokens":2,"n":9}"#, "n must be between");
    socket_err(
        &format!(
            r#"{{"prompt":"{}","max_tokens":8}}"#,
            "def f(): pass\\n".repeat(300)
        ),
        "sequence limit of 256",
    );
    assert!(
        stub.prompts.lock().unwrap().is_empty(),
        "no request over a limit reached the model"
    );

    // A 100 MB line without a newline: the daemon reads at most MAX_LINE_BYTES of it, answers
    // with an error and closes, so its memory grows by a bounded amount.
    let pid = d.child.id();
    let before = rss_bytes(pid).unwrap();
    let mut s = std::os::unix::net::UnixStream::connect(d.dir.join("laya.sock")).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut reader = s.try_clone().unwrap();
    reader.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(before));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (peak, stop) = (peak.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Some(b) = rss_bytes(pid) {
                    peak.fetch_max(b, std::sync::atomic::Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let chunk = vec![b'x'; 1 << 20];
    let mut written = 0usize;
    let started = Instant::now();
    while written < 100 << 20 {
        match s.write(&chunk) {
            Ok(n) => written += n,
            Err(_) => break, // the daemon closed the connection
        }
    }
    let mut answer = String::new();
    let _ = reader.read_to_string(&mut answer);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    sampler.join().unwrap();
    let growth = peak
        .load(std::sync::atomic::Ordering::Relaxed)
        .saturating_sub(before);
    eprintln!(
        "100 MB line: {:.1} MB written before the daemon closed, in {:?}; daemon RSS growth {:.1} MiB",
        written as f64 / 1e6,
        started.elapsed(),
        growth as f64 / (1 << 20) as f64
    );
    assert!(written < 100 << 20, "the daemon swallowed all 100 MB");
    assert!(answer.contains("longer than"), "{answer}");
    // The line buffer grows by doubling up to 2 × MAX_LINE_BYTES; one more for the rest
    // (allocator, socket buffers).
    assert!(growth < 3 * MAX_LINE_BYTES as u64, "RSS grew {growth} bytes");
    // And it keeps serving.
    assert_eq!(socket_request(&d.dir, r#"{"op":"status"}"#)[0]["type"], "status");
}

/// Source files under `dir` (recursively), with their text up to `#[cfg(test)]` (unit tests
/// may do what the server may not).
fn sources(dir: &str) -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = vec![];
    let mut stack = vec![root.join(dir)];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs")
                && p.file_name().is_some_and(|n| n != "tests.rs")
            {
                let text = std::fs::read_to_string(&p).unwrap();
                let text = text.split("#[cfg(test)]").next().unwrap_or("").to_owned();
                out.push((p.strip_prefix(root).unwrap().display().to_string(), text));
            }
        }
    }
    out.sort();
    out
}

/// Every line of the source folders `dirs` (`src/`, the engine crate's `crates/laya-engine/src/`)
/// matching one of `patterns`, as (file, trimmed line).
fn sites(dirs: &[&str], patterns: &[&str]) -> Vec<(String, String)> {
    let mut found = vec![];
    for dir in dirs {
        for (file, text) in sources(dir) {
            for line in text.lines() {
                let t = line.trim();
                if t.starts_with("//") {
                    continue;
                }
                if patterns.iter().any(|p| t.contains(p)) {
                    found.push((file.clone(), t.to_owned()));
                }
            }
        }
    }
    found
}

/// Compare what the scan found with a reviewed list; a new site fails until it is reviewed
/// and listed, a listed one that is gone fails until it is removed from the list.
fn check_reviewed(found: &[(String, String)], reviewed: &[(&str, &str, &str)], what: &str) {
    let listed = |f: &str, l: &str| reviewed.iter().any(|(rf, rl, _)| *rf == f && l.contains(rl));
    let new: Vec<_> = found.iter().filter(|(f, l)| !listed(f, l)).collect();
    assert!(
        new.is_empty(),
        "{what} not reviewed (add each, with why it is safe, to the list): {new:#?}"
    );
    let gone: Vec<_> = reviewed
        .iter()
        .filter(|(rf, rl, _)| !found.iter().any(|(f, l)| f == rf && l.contains(rl)))
        .collect();
    assert!(
        gone.is_empty(),
        "listed {what} no longer in the source: {gone:#?}"
    );
}

#[test]
fn every_process_laya_starts_is_a_reviewed_site_and_none_runs_a_shell() {
    let found = sites(&["src", "crates/laya-engine/src"], &["Command::new"]);
    // (file, code, why no client text reaches a shell there)
    let reviewed = [
        ("src/daemon/client.rs", "std::process::Command::new(&spawn.program)", "this laya binary, `serve` and the editor's own flags as separate argv entries; no shell"),
        ("src/bench/memory.rs", "Command::new(\"ps\")", "`ps -o rss= -p PID`, the pid a number; only where /proc is missing"),
        ("src/bench/memory.rs", "Command::new(program)", "this laya binary (`serve` / `lsp`) for the benchmarks, argv from the bench's own flags"),
        ("src/service.rs", "Command::new(&cmd[0])", "systemctl / launchctl with fixed arguments and the unit path; no shell"),
        ("src/bench/engine.rs", "std::process::Command::new(python)", "the llama.cpp peer: the user's --peer-python, our script and numbers; a local bench, no client input"),
        ("crates/laya-engine/src/tests/mod.rs", "std::process::Command::new(python)", "the engine's tests only (a cfg(test) module): the llama.cpp peer's Python from scripts/peer-setup.sh, the tests' own scripts and a temporary file's path; not in any binary"),
        ("src/machine.rs", "Command::new(\"nvidia-smi\")", "`nvidia-smi` with fixed arguments (the first GPU's total memory), only where MLX states no memory for a CUDA GPU; no client input"),
        ("src/bench/typing.rs", "let mut c = std::process::Command::new(prog);", "`laya bench typing --lsp-command`: the user's own LSP server command, split on whitespace into argv; no shell, a local bench, no client input"),
        ("src/bench/quality.rs", "Command::new(\"tar\")", "`tar -xJf ARCHIVE -C SCRATCH` for a repository case's workspace, its name checked to be plain; a local bench, no client input"),
    ];
    check_reviewed(&found, &reviewed, "process starts");
    // No shell anywhere: no `sh -c`, no `bash`, no `-c` argument.
    let shells = sites(
        &["src", "crates/laya-engine/src"],
        &["\"sh\"", "\"bash\"", "\"/bin/sh\"", "\"-c\"", "sh -c", "cmd.exe"],
    );
    assert!(shells.is_empty(), "a shell is run: {shells:#?}");
}

#[test]
fn the_language_server_and_the_daemon_read_no_files_on_a_clients_behalf() {
    let patterns = [
        "std::fs",
        "fs::",
        "File::open",
        "read_to_string",
        "OpenOptions",
        "read_dir",
        "canonicalize",
        "memmap",
        "Mmap",
    ];
    // The editor-facing path: documents come only as text the client sent.
    let found = sites(
        &[
            "src/lsp",
            "src/completion",
            "src/prompt",
            "src/syntax",
            "src/document",
        ],
        &patterns,
    );
    assert!(
        found.is_empty(),
        "the LSP path touches the file system: {found:#?}"
    );
    // The workspace index: only under the declared folders (walks start at them, updates
    // and reads of other paths are refused by `root_of`, import resolution keeps to indexed
    // files and to folders inside the roots).
    let found = sites(&["src/workspace"], &patterns);
    let reviewed = [
        (
            "src/workspace/mod.rs",
            "std::fs::canonicalize(&r)",
            "the declared roots themselves",
        ),
        (
            "src/workspace/mod.rs",
            "std::fs::metadata(&path)",
            "a file the walk of a root found",
        ),
        (
            "src/workspace/mod.rs",
            "std::fs::read_to_string(path)",
            "reload: only after `root_of(path)` is checked",
        ),
        (
            "src/workspace/mod.rs",
            "std::fs::read(path)",
            "the build: a file the walk of a root found",
        ),
        (
            "src/workspace/resolve.rs",
            "std::fs::read_to_string(a.join(\"go.mod\"))",
            "folders between the file and its root only",
        ),
        (
            "src/workspace/resolve.rs",
            "std::fs::read_dir(&folder)",
            "only after `root_of(folder)` is checked",
        ),
        (
            "src/workspace/mod.rs",
            "defs::",
            "the `defs` module, not the file system",
        ),
        (
            "src/workspace/retrieve.rs",
            "defs::",
            "the `defs` module, not the file system",
        ),
    ];
    check_reviewed(&found, &reviewed, "workspace file access");
    // The daemon: only its own runtime directory and /proc; never a path from a request.
    let found = sites(&["src/daemon"], &patterns);
    let reviewed = [
        ("src/daemon/paths.rs", "os::unix::fs::", "the import"),
        (
            "src/daemon/paths.rs",
            "fs::create_dir_all(parent)",
            "the runtime directory's parent",
        ),
        (
            "src/daemon/paths.rs",
            "fs::DirBuilder::new()",
            "the runtime directory",
        ),
        (
            "src/daemon/paths.rs",
            "fs::symlink_metadata(dir)",
            "the runtime directory",
        ),
        (
            "src/daemon/paths.rs",
            "fs::set_permissions(dir",
            "the runtime directory",
        ),
        (
            "src/daemon/paths.rs",
            "fs::File::create(&tmp)",
            "pid and http.addr files in the runtime directory",
        ),
        (
            "src/daemon/paths.rs",
            "fs::rename(&tmp, path)",
            "pid and http.addr files in the runtime directory",
        ),
        (
            "src/daemon/paths.rs",
            "fs::read_to_string(dir.join(PID))",
            "the pid file",
        ),
        (
            "src/daemon/paths.rs",
            "fs::read_to_string(dir.join(HTTP_ADDR))",
            "the http.addr file",
        ),
        (
            "src/daemon/server.rs",
            "std::fs::",
            "lock, socket, cleanup: files of the runtime directory",
        ),
        ("src/daemon/server.rs", "PermissionsExt", "the import"),
        (
            "src/daemon/server.rs",
            "rustix::fs::",
            "flock on laya.lock and the umask for the socket",
        ),
        (
            "src/daemon/client.rs",
            "read_to_string(&mut text)",
            "the tail of serve.log (above)",
        ),
        (
            "src/daemon/client.rs",
            "std::fs::",
            "serve.log in the runtime directory (the daemon's stderr, shown when it fails to start)",
        ),
    ];
    check_reviewed(&found, &reviewed, "file accesses");
}
