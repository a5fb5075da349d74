//! Where the daemon's socket and files live: a private directory (mode 0700, owned by this
//! user) under `$XDG_RUNTIME_DIR`, or `/tmp/laya-$UID` where that is unset. `/tmp` rather
//! than `$TMPDIR` because the daemon and its clients must agree on the path, and a service
//! manager (launchd, systemd) does not give its jobs the login session's `$TMPDIR`.

use std::{
    fs,
    io::{self, Write},
    os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
};

/// The socket LSP clients connect to.
pub const SOCKET: &str = "laya.sock";
/// Held (flock) by the running daemon: one daemon per directory.
pub const LOCK: &str = "laya.lock";
/// The running daemon's process id.
pub const PID: &str = "laya.pid";
/// The HTTP address the daemon bound (`127.0.0.1:7723`), when it serves HTTP.
pub const HTTP_ADDR: &str = "http.addr";
/// stderr of a daemon started by `laya lsp`.
pub const LOG: &str = "serve.log";

/// `$LAYA_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/laya`, else `/tmp/laya-$UID`.
pub fn runtime_dir() -> PathBuf {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(p) = var("LAYA_RUNTIME_DIR") {
        return p;
    }
    if let Some(p) = var("XDG_RUNTIME_DIR") {
        return p.join("laya");
    }
    PathBuf::from(format!("/tmp/laya-{}", rustix::process::getuid().as_raw()))
}

/// Create `dir` (mode 0700) or check an existing one: a real directory (not a link), owned
/// by this user, writable by no one else (a group- or world-writable one is refused: others
/// may have put files in it); a readable one is tightened to 0700.
pub fn ensure_private_dir(dir: &Path) -> io::Result<()> {
    if let Some(parent) = dir.parent() {
        fs::create_dir_all(parent)?;
    }
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        return Err(io::Error::other(format!("{} is not a directory", dir.display())));
    }
    let uid = rustix::process::getuid().as_raw();
    if meta.uid() != uid {
        return Err(io::Error::other(format!(
            "{} belongs to user {}, not to this user ({uid}); remove it or set LAYA_RUNTIME_DIR",
            dir.display(),
            meta.uid()
        )));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(io::Error::other(format!(
            "{} is writable by other users (mode {:o}); remove it or set LAYA_RUNTIME_DIR",
            dir.display(),
            meta.mode() & 0o7777
        )));
    }
    if meta.mode() & 0o777 != 0o700 {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// Write `text` to `path` through a temporary file and a rename, so readers never see half.
pub fn write_atomic(path: &Path, text: &str) -> io::Result<()> {
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let mut f = fs::File::create(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    fs::rename(&tmp, path)
}

/// The pid written by the running daemon, if any.
pub fn read_pid(dir: &Path) -> Option<u32> {
    fs::read_to_string(dir.join(PID)).ok()?.trim().parse().ok()
}

/// The HTTP address written by the running daemon, if any.
pub fn read_http_addr(dir: &Path) -> Option<std::net::SocketAddr> {
    fs::read_to_string(dir.join(HTTP_ADDR)).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_private_dir_is_created_0700_and_a_loose_one_is_tightened() {
        let base = std::env::temp_dir().join(format!("laya-paths-test-{}", std::process::id()));
        let dir = base.join("rt");
        ensure_private_dir(&dir).unwrap();
        assert_eq!(fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        ensure_private_dir(&dir).unwrap();
        assert_eq!(fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        for loose in [0o775, 0o757, 0o1777] {
            fs::set_permissions(&dir, fs::Permissions::from_mode(loose)).unwrap();
            let e = ensure_private_dir(&dir).unwrap_err().to_string();
            assert!(e.contains("writable by other users"), "{e}");
        }
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        let file = base.join("file");
        fs::write(&file, "x").unwrap();
        assert!(ensure_private_dir(&file).is_err());
        fs::remove_dir_all(&base).unwrap();
    }
}
