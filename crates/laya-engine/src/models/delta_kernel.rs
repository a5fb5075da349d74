//! The gated delta rule as one CUDA kernel (MLX's `fast::cuda_kernel`, compiled by NVRTC the
//! first time a shape and dtype run, then kept for the process): where MLX runs on CUDA, a
//! Gated DeltaNet layer's recurrence is one launch for a whole run of tokens instead of a few
//! ops a chunk ([`super::qwen35`]'s chunked form) or a token (its sequential form). The ops
//! stay the CPU's and Metal's, and the reference the kernel is tested against on every CUDA
//! run (`tests::mlx_ops::the_cuda_recurrence_kernel_equals_the_ops`).
//!
//! One warp (32 threads) owns one row `(b, v_head, dv)` of the state `[B, Hv, Dv, Dk]`; each
//! thread keeps `Dk / 32` of the row's f32 values in registers, and the two dot products a
//! token (`S k` and `S q`) are warp sums. Tokens run one after another inside the kernel, as
//! in mlx-lm's Metal kernel (`mlx_lm/models/gated_delta.py`), which this follows; value head
//! `h` reads key head `h / (Hv / Hk)`, so q and k come at their own head count.

use std::ffi::CString;
use std::sync::OnceLock;

use mlx_rs::error::Exception;
use mlx_rs::{Array, Dtype, Stream};

const SOURCE: &str = r#"
    const int T = q_shape[1];
    const int n = blockIdx.z;
    const int b = n / Hv;
    const int hv = n % Hv;
    const int hk = hv / (Hv / Hk);
    constexpr int per = Dk / 32;
    const int lane = threadIdx.x;
    const int dv = blockIdx.y * blockDim.y + threadIdx.y;
    if (dv >= Dv) {
        return;
    }
    const InT* q_ = q + (size_t)b * T * Hk * Dk + hk * Dk;
    const InT* k_ = k + (size_t)b * T * Hk * Dk + hk * Dk;
    const InT* v_ = v + (size_t)b * T * Hv * Dv + hv * Dv;
    InT* y_ = y + (size_t)b * T * Hv * Dv + hv * Dv;
    const float* g_ = g + (size_t)b * T * Hv + hv;
    const InT* beta_ = beta + (size_t)b * T * Hv + hv;
    const float* s_in = state_in + ((size_t)n * Dv + dv) * Dk;
    float* s_out = state_out + ((size_t)n * Dv + dv) * Dk;
    float s[per];
    for (int i = 0; i < per; ++i) {
        s[i] = s_in[per * lane + i];
    }
    for (int t = 0; t < T; ++t) {
        const float decay = *g_;
        float kv = 0.0f;
        for (int i = 0; i < per; ++i) {
            s[i] *= decay;
            kv += s[i] * static_cast<float>(k_[per * lane + i]);
        }
        for (int off = 16; off > 0; off /= 2) {
            kv += __shfl_xor_sync(0xffffffff, kv, off);
        }
        const float delta = (static_cast<float>(v_[dv]) - kv) * static_cast<float>(*beta_);
        float out = 0.0f;
        for (int i = 0; i < per; ++i) {
            s[i] += static_cast<float>(k_[per * lane + i]) * delta;
            out += s[i] * static_cast<float>(q_[per * lane + i]);
        }
        for (int off = 16; off > 0; off /= 2) {
            out += __shfl_xor_sync(0xffffffff, out, off);
        }
        if (lane == 0) {
            y_[dv] = static_cast<InT>(out);
        }
        q_ += Hk * Dk;
        k_ += Hk * Dk;
        v_ += Hv * Dv;
        y_ += Hv * Dv;
        g_ += Hv;
        beta_ += Hv;
    }
    for (int i = 0; i < per; ++i) {
        s_out[per * lane + i] = s[i];
    }
"#;

/// Rows of the state a block of threads runs (a warp each).
const ROWS_A_BLOCK: i32 = 4;

/// Whether this process runs MLX on CUDA (a GPU made the default device, and MLX's CUDA
/// backend is the one linked).
pub(crate) fn on_cuda() -> bool {
    static CUDA: OnceLock<bool> = OnceLock::new();
    crate::runtime::gpu_in_use()
        && *CUDA.get_or_init(|| {
            let mut yes = false;
            // SAFETY: the callee writes one bool.
            unsafe { mlx_sys::mlx_cuda_is_available(&mut yes) == 0 && yes }
        })
}

/// Whether the kernel runs these inputs: a key dimension of whole warps, value heads a whole
/// number of key heads, and a float type it reads.
pub(crate) fn fits(q: &Array, v: &Array) -> bool {
    let (hk, dk, hv) = (q.dim(2), q.dim(3), v.dim(2));
    dk % 32 == 0
        && dk > 0
        && hk > 0
        && hv % hk == 0
        && matches!(q.dtype(), Dtype::Float32 | Dtype::Bfloat16 | Dtype::Float16)
}

/// The recurrence over `q`, `k` `[B, T, Hk, Dk]` (normed, q scaled), `v` `[B, T, Hv, Dv]`,
/// `beta` `[B, T, Hv]` (q's dtype), the decay `g` `[B, T, Hv]` (f32, `exp` of the log-decay)
/// from `state` `[B, Hv, Dv, Dk]` (f32): the outputs `[B, T, Hv, Dv]` in q's dtype and the
/// state after the last token. Call only where [`on_cuda`] and [`fits`] hold.
pub(crate) fn recurrence(
    q: &Array,
    k: &Array,
    v: &Array,
    beta: &Array,
    g: &Array,
    state: &Array,
) -> Result<(Array, Array), Exception> {
    let (b, t, hk, dk) = (q.dim(0), q.dim(1), q.dim(2), q.dim(3));
    let (hv, dv) = (v.dim(2), v.dim(3));
    let dtype = q.dtype();
    let same = |a: &Array, shape: &[i32], dt: Dtype, what: &str| -> Result<Array, Exception> {
        if a.shape() != shape {
            return Err(Exception::custom(format!(
                "gated delta kernel: {what} is {:?}, expected {shape:?}",
                a.shape()
            )));
        }
        a.as_dtype(dt)
    };
    let k = same(k, &[b, t, hk, dk], dtype, "k")?;
    let v = same(v, &[b, t, hv, dv], dtype, "v")?;
    let beta = same(beta, &[b, t, hv], dtype, "beta")?;
    let g = same(g, &[b, t, hv], Dtype::Float32, "g")?;
    let state = same(state, &[b, hv, dv, dk], Dtype::Float32, "state")?;
    let inputs = [q.clone(), k, v, g, beta, state];
    let kernel = kernel()?;
    let stream = Stream::new();
    let cfg = Config::new()?;
    // SAFETY: every handle passed is live for the call; `outputs` is created and freed here,
    // and the arrays taken from it are owned by the returned `Array`s.
    unsafe {
        let c = cfg.0;
        let y_shape = [b, t, hv, dv];
        let s_shape = [b, hv, dv, dk];
        check(mlx_sys::mlx_fast_cuda_kernel_config_add_output_arg(
            c,
            y_shape.as_ptr(),
            4,
            dtype.into(),
        ))?;
        check(mlx_sys::mlx_fast_cuda_kernel_config_add_output_arg(
            c,
            s_shape.as_ptr(),
            4,
            Dtype::Float32.into(),
        ))?;
        check(mlx_sys::mlx_fast_cuda_kernel_config_set_grid(c, 32, dv, b * hv))?;
        check(mlx_sys::mlx_fast_cuda_kernel_config_set_thread_group(
            c,
            32,
            ROWS_A_BLOCK,
            1,
        ))?;
        check(mlx_sys::mlx_fast_cuda_kernel_config_add_template_arg_dtype(
            c,
            c"InT".as_ptr(),
            dtype.into(),
        ))?;
        for (name, value) in [(c"Dk", dk), (c"Dv", dv), (c"Hk", hk), (c"Hv", hv)] {
            check(mlx_sys::mlx_fast_cuda_kernel_config_add_template_arg_int(
                c,
                name.as_ptr(),
                value,
            ))?;
        }
        let handles: Vec<mlx_sys::mlx_array> = inputs.iter().map(|a| a.as_ptr()).collect();
        let ins = mlx_sys::mlx_vector_array_new_data(handles.as_ptr(), handles.len());
        let mut outs = mlx_sys::mlx_vector_array_new();
        let rc = mlx_sys::mlx_fast_cuda_kernel_apply(&mut outs, kernel.0, ins, c, stream.as_ptr());
        mlx_sys::mlx_vector_array_free(ins);
        let result = (|| {
            check(rc)?;
            let take = |i: usize| -> Result<Array, Exception> {
                let mut a = mlx_sys::mlx_array_new();
                if mlx_sys::mlx_vector_array_get(&mut a, outs, i) != 0 {
                    mlx_sys::mlx_array_free(a);
                    return Err(Exception::custom("gated delta kernel: a missing output"));
                }
                Ok(Array::from_ptr(a))
            };
            Ok((take(0)?, take(1)?))
        })();
        mlx_sys::mlx_vector_array_free(outs);
        result
    }
}

fn check(rc: i32) -> Result<(), Exception> {
    match rc {
        0 => Ok(()),
        _ => Err(Exception::custom("gated delta kernel: an MLX call failed")),
    }
}

/// A launch's configuration, freed when dropped.
struct Config(mlx_sys::mlx_fast_cuda_kernel_config);

impl Config {
    fn new() -> Result<Config, Exception> {
        // SAFETY: a fresh configuration, owned by the value returned.
        let c = unsafe { mlx_sys::mlx_fast_cuda_kernel_config_new() };
        match c.ctx.is_null() {
            true => Err(Exception::custom("gated delta kernel: no configuration")),
            false => Ok(Config(c)),
        }
    }
}

impl Drop for Config {
    fn drop(&mut self) {
        // SAFETY: created by `Config::new`, freed once.
        unsafe { mlx_sys::mlx_fast_cuda_kernel_config_free(self.0) };
    }
}

/// The kernel object, made once per process (MLX keeps its compiled modules by name and
/// source).
struct Kernel(mlx_sys::mlx_fast_cuda_kernel);

// SAFETY: MLX's kernel object is an immutable function object; applying it from any thread is
// what MLX's own bindings do.
unsafe impl Send for Kernel {}
unsafe impl Sync for Kernel {}

fn kernel() -> Result<&'static Kernel, Exception> {
    static KERNEL: OnceLock<Option<Kernel>> = OnceLock::new();
    KERNEL
        .get_or_init(|| {
            let strings = |names: &[&str]| {
                // SAFETY: a fresh vector; each value is copied in by the callee.
                unsafe {
                    let v = mlx_sys::mlx_vector_string_new();
                    for n in names {
                        let c = CString::new(*n).expect("no NUL");
                        mlx_sys::mlx_vector_string_append_value(v, c.as_ptr());
                    }
                    v
                }
            };
            let inputs = strings(&["q", "k", "v", "g", "beta", "state_in"]);
            let outputs = strings(&["y", "state_out"]);
            let source = CString::new(SOURCE).expect("no NUL");
            // SAFETY: the strings and vectors live for the call; the vectors are freed after it
            // (the kernel copies what it keeps).
            unsafe {
                let k = mlx_sys::mlx_fast_cuda_kernel_new(
                    c"laya_gated_delta".as_ptr(),
                    inputs,
                    outputs,
                    source.as_ptr(),
                    c"".as_ptr(),
                    true,
                    0,
                );
                mlx_sys::mlx_vector_string_free(inputs);
                mlx_sys::mlx_vector_string_free(outputs);
                (!k.ctx.is_null()).then_some(Kernel(k))
            }
        })
        .as_ref()
        .ok_or_else(|| Exception::custom("gated delta kernel: MLX made no kernel"))
}
