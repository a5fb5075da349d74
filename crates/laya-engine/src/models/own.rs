//! Which of laya's own MLX primitives a thread uses, and what compiling their kernels cost:
//! [`Own::RopeKv`] ([`super::rope_kv`], RoPE and the K/V write of a layer) and [`Own::Step`]
//! ([`super::step`], a dense model's whole decode step). Both are CUDA's (where a step waits
//! on the host's time per op); the ops stay the path on the CPU and Metal and the reference.
//! Built on Linux only (`cfg(laya_primitives)`, set by build.rs where the linked MLX's headers
//! are at hand).

use std::cell::Cell;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Own {
    RopeKv = 0,
    Step = 1,
}

thread_local! {
    /// A test's or a benchmark's choice of path on this thread, over the device's.
    static FORCED: Cell<[Option<bool>; 2]> = const { Cell::new([None; 2]) };
    /// Primitives made on this thread (tests check that the path they compare ran).
    static MADE: Cell<[u64; 2]> = const { Cell::new([0; 2]) };
}

/// Whether the primitives can run here: on CUDA, in builds that have them.
pub(crate) fn available() -> bool {
    cfg!(laya_primitives) && super::delta_kernel::on_cuda()
}

impl Own {
    /// Whether this thread uses the primitive: as forced, else where [`available`] and its
    /// tests have passed on a GPU. Neither is CUDA's default yet: the step's kernels have not
    /// run their tests there, and the K/V writes in place (and the RoPE primitive's copy
    /// ordering) are newer than its last GPU run (docs/decisions.md).
    pub(crate) fn in_use(self) -> bool {
        FORCED
            .with(|f| f.get()[self as usize])
            .unwrap_or_else(|| available() && self.checked_on_a_gpu())
    }

    /// Whether this build's primitive has passed its tests on a GPU.
    fn checked_on_a_gpu(self) -> bool {
        match self {
            Own::RopeKv | Own::Step => false,
        }
    }

    /// The primitive (`Some(true)`), the ops (`Some(false)`) or the device's choice (`None`)
    /// on this thread: tests and `laya bench engine`'s side-by-side rows.
    pub(crate) fn force(self, path: Option<bool>) {
        FORCED.with(|f| {
            let mut v = f.get();
            v[self as usize] = path;
            f.set(v);
        });
    }

    /// Counts one primitive made on this thread.
    pub(crate) fn note_made(self) {
        MADE.with(|m| {
            let mut v = m.get();
            v[self as usize] += 1;
            m.set(v);
        });
    }

    /// How many primitives this thread has made.
    #[cfg(test)]
    pub(crate) fn made(self) -> u64 {
        MADE.with(|m| m.get()[self as usize])
    }
}

/// A C function's return code as a result: 0 is success; else its NUL-terminated message in
/// `error`.
#[cfg(laya_primitives)]
pub(crate) fn error_of(rc: i32, error: &[std::ffi::c_char]) -> mlx_rs::error::Result<()> {
    if rc == 0 {
        return Ok(());
    }
    // SAFETY: the C side writes a NUL-terminated message into the buffer.
    let msg = unsafe { std::ffi::CStr::from_ptr(error.as_ptr()) };
    Err(mlx_rs::error::Exception::custom(
        msg.to_string_lossy().into_owned(),
    ))
}

#[cfg(laya_primitives)]
extern "C" {
    fn laya_primitives_compile_ms() -> f64;
}

/// Milliseconds the primitives' CUDA kernels took to compile (or load from laya's cache) in
/// this process (0: not yet, or no CUDA here).
pub(crate) fn compile_ms() -> f64 {
    #[cfg(laya_primitives)]
    // SAFETY: reads a counter.
    return unsafe { laya_primitives_compile_ms() };
    #[cfg(not(laya_primitives))]
    0.0
}
