//! What the integration tests share: the MLX lock and the CPU classes (all tests run in
//! one process, two at a time on two cores), `laya` as a command, and the modules below.
#![allow(dead_code)]

pub mod daemon;
pub mod engine;
pub mod hub;
pub mod lsp;
pub mod panics;
pub mod real;

/// The tiny GGUF the engine's tests share with these.
pub use laya::engine::synthetic::gguf;

use std::process::Command;

pub use laya::engine::testing::{mlx, Backend};

/// The tests' two CPU classes. The tests of this binary run side by side (two at a time on
/// two cores), whatever their module: a test that keeps the cores busy for long takes
/// [`busy_cpu`], one whose deadline is about a second (or that depends on timing of a few
/// milliseconds) takes [`quiet_cpu`], so that no such deadline is measured while the cores are
/// taken. Busy tests run beside each other and beside the tests of neither class; a quiet test
/// waits until no busy test runs, and no busy test starts until it ends (the lock is fair). A
/// test that takes both this and [`mlx`] takes this first.
static CPU: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// For a test that keeps the cores busy for long: a real model (in process or in a daemon),
/// the llama.cpp peer, the soak, the fuzzing, long prefills. Not from within a runtime.
pub fn busy_cpu() -> tokio::sync::RwLockReadGuard<'static, ()> {
    CPU.blocking_read()
}

/// For a test whose deadline is about a second, in a runtime.
pub async fn quiet_cpu() -> tokio::sync::RwLockWriteGuard<'static, ()> {
    CPU.write().await
}

/// [`quiet_cpu`] for a test that runs outside a runtime.
pub fn quiet_cpu_blocking() -> tokio::sync::RwLockWriteGuard<'static, ()> {
    CPU.blocking_write()
}

/// The built `laya` binary as a command.
pub fn laya() -> Command {
    Command::new(env!("CARGO_BIN_EXE_laya"))
}

/// Run `cmd` to its end: (exit code, or -1 for a signal; stdout; stderr).
pub fn run(cmd: &mut Command) -> (i32, String, String) {
    let out = cmd.output().expect("run laya");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Deterministic uniform(-1, 1) numbers (an LCG; tests need no crate for this).
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next_f32(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next_f32()).collect()
    }
}

pub fn max_abs(a: &[f32]) -> f32 {
    a.iter().fold(0f32, |m, x| m.max(x.abs()))
}

/// max |got - want| / max |want|; lengths must agree.
pub fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len(), "length mismatch");
    let d = got.iter().zip(want).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    d / max_abs(want).max(1e-12)
}

#[track_caller]
pub fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    let e = rel_err(got, want);
    eprintln!("{what}: rel err {e:.3e} (tol {tol:.0e})");
    assert!(e <= tol, "{what}: relative error {e:.3e} > {tol:.0e}");
}
