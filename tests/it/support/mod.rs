//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod daemon;
pub mod gguf;

use std::sync::{Mutex, MutexGuard};

use laya::engine::runtime::{use_device, DevicePref};

/// MLX graphs are built from one thread at a time in laya (one worker per model);
/// tests follow the same rule.
static MLX: Mutex<()> = Mutex::new(());

/// Take the MLX lock and select the device named by `LAYA_DEVICE` (default cpu), so the
/// same tests run on the CPU here and on a GPU through `scripts/gpu/cuda-ops.sh`.
pub fn mlx() -> (MutexGuard<'static, ()>, Backend) {
    let guard = MLX.lock().unwrap_or_else(|p| p.into_inner());
    let pref = match std::env::var("LAYA_DEVICE").as_deref() {
        Ok("gpu") => DevicePref::Gpu,
        Ok("auto") => DevicePref::Auto,
        _ => DevicePref::Cpu,
    };
    let desc = use_device(pref).expect("select MLX device");
    let backend = if desc.starts_with("gpu") {
        Backend::Gpu
    } else {
        Backend::Cpu
    };
    (guard, backend)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Cpu,
    Gpu,
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
