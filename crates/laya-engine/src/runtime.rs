//! What MLX is linked and which device it runs on: the facts `laya doctor` reports and
//! the one place that picks the device.

use std::ffi::CStr;

use mlx_rs::{Device, DeviceType};

/// Which device the user asked for (`--device`, `LAYA_DEVICE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DevicePref {
    /// The GPU when the linked MLX has one (Metal or CUDA), else the CPU.
    #[default]
    Auto,
    Cpu,
    Gpu,
}

impl DevicePref {
    /// The name `--device` takes.
    pub(crate) fn label(self) -> &'static str {
        match self {
            DevicePref::Auto => "auto",
            DevicePref::Cpu => "cpu",
            DevicePref::Gpu => "gpu",
        }
    }
}

impl std::fmt::Display for DevicePref {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

impl std::str::FromStr for DevicePref {
    type Err = crate::seam::ParseError;

    /// `auto`, `cpu` or `gpu`.
    fn from_str(s: &str) -> Result<DevicePref, Self::Err> {
        match s {
            "auto" => Ok(DevicePref::Auto),
            "cpu" => Ok(DevicePref::Cpu),
            "gpu" => Ok(DevicePref::Gpu),
            _ => Err(crate::seam::ParseError(format!(
                "expected auto, cpu or gpu, got `{s}`"
            ))),
        }
    }
}

/// Facts about the linked MLX library.
#[derive(Clone, Debug)]
pub struct MlxInfo {
    /// Version reported by the loaded libmlx at run time.
    pub runtime_version: String,
    /// Version the binary was compiled against.
    pub build_version: &'static str,
    /// `cpu`, `cuda` or `metal`: what the linked libmlx was built with.
    pub build_backend: &'static str,
    /// Folder of the linked libmlx.so (empty on macOS, where MLX is linked statically).
    pub libdir: &'static str,
    pub gpu_kind: Option<&'static str>,
}

fn c_string(f: impl FnOnce(*mut mlx_sys::mlx_string) -> i32) -> Option<String> {
    // SAFETY: mlx_string is created, filled by the callee and freed here.
    unsafe {
        let mut s = mlx_sys::mlx_string_new();
        let ok = f(&mut s) == 0;
        let out = ok.then(|| {
            CStr::from_ptr(mlx_sys::mlx_string_data(s))
                .to_string_lossy()
                .into_owned()
        });
        mlx_sys::mlx_string_free(s);
        out
    }
}

fn flag(f: unsafe extern "C" fn(*mut bool) -> i32) -> bool {
    let mut b = false;
    // SAFETY: the callee writes one bool.
    unsafe { f(&mut b) == 0 && b }
}

impl MlxInfo {
    pub fn probe() -> MlxInfo {
        let runtime_version = c_string(|s| unsafe { mlx_sys::mlx_version(s) }).unwrap_or_default();
        let cuda = flag(mlx_sys::mlx_cuda_is_available);
        let metal = flag(mlx_sys::mlx_metal_is_available);
        MlxInfo {
            runtime_version,
            build_version: mlx_sys::MLX_BUILD_VERSION,
            build_backend: mlx_sys::MLX_BUILD_BACKEND,
            libdir: mlx_sys::MLX_BUILD_LIBDIR,
            gpu_kind: if cuda {
                Some("cuda")
            } else if metal {
                Some("metal")
            } else {
                None
            },
        }
    }

    /// The description of the device `pref` chooses with this MLX (`cpu`, `gpu (cuda)`): what
    /// [`use_device`] would select, selecting nothing.
    pub fn device_for(&self, pref: DevicePref) -> Result<String, RuntimeError> {
        choose_device(pref, self).map(|(_, desc)| desc)
    }

    /// The loaded libmlx must be the version mlx-c was compiled against (no stable C++ ABI).
    pub fn check_version(&self) -> Result<(), RuntimeError> {
        if self.runtime_version == self.build_version {
            Ok(())
        } else {
            Err(RuntimeError::VersionMismatch {
                runtime: self.runtime_version.clone(),
                build: self.build_version,
            })
        }
    }
}

/// Why MLX cannot run as asked: the linked library, the device or a setting of the
/// environment; the message says how to fix it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RuntimeError {
    #[error(
        "the loaded libmlx is version {runtime} but laya was built against {build}; run \
         `scripts/setup.sh` to rebuild"
    )]
    VersionMismatch { runtime: String, build: &'static str },
    #[error(
        "--device gpu: the linked MLX ({backend} backend) has no GPU; use --device cpu, or build \
         against mlx-cuda-13 (scripts/setup.sh --backend cuda13)"
    )]
    NoGpu { backend: &'static str },
    /// An environment variable that does not parse.
    #[error("{name} must be {expected}, got `{value}`")]
    Setting {
        name: &'static str,
        expected: &'static str,
        value: String,
    },
    #[error("setting MLX's cache limit: {0}")]
    Mlx(String),
}

/// The device chosen for a preference, with a human description (`cpu`, `gpu (cuda)`).
pub(crate) fn choose_device(pref: DevicePref, info: &MlxInfo) -> Result<(Device, String), RuntimeError> {
    match (pref, info.gpu_kind) {
        (DevicePref::Cpu, _) | (DevicePref::Auto, None) => {
            Ok((Device::new(DeviceType::Cpu, 0), "cpu".into()))
        }
        (DevicePref::Gpu | DevicePref::Auto, Some(kind)) => {
            Ok((Device::new(DeviceType::Gpu, 0), format!("gpu ({kind})")))
        }
        (DevicePref::Gpu, None) => Err(RuntimeError::NoGpu {
            backend: info.build_backend,
        }),
    }
}

/// Bytes of freed buffers MLX keeps for reuse when `LAYA_MLX_CACHE_LIMIT` does not say. MLX's
/// own default is its whole memory limit, so a resident process would keep the largest
/// working set it ever had (on a Mac that is system memory, on a shared GPU another process's
/// room: two such processes on one GPU ran out of memory). The bound only limits what is kept
/// between uses: a step that needs more still gets it, from the allocator. On the H200 the
/// 0.5B and 1.5B answered 600 quality cases each with it, with the same answers and no higher
/// request times (docs/lab/2026-12-03-mlx-buffer-cache.md).
pub const DEFAULT_CACHE_LIMIT: usize = 1 << 30;

/// The cache limit: `LAYA_MLX_CACHE_LIMIT` (bytes; `0` keeps no freed buffers) or the default.
pub(crate) fn cache_limit() -> Result<usize, RuntimeError> {
    parse_cache_limit(std::env::var("LAYA_MLX_CACHE_LIMIT").ok().as_deref())
}

fn parse_cache_limit(value: Option<&str>) -> Result<usize, RuntimeError> {
    match value {
        Some(v) => v.trim().parse().map_err(|_| RuntimeError::Setting {
            name: "LAYA_MLX_CACHE_LIMIT",
            expected: "a number of bytes",
            value: v.to_owned(),
        }),
        None => Ok(DEFAULT_CACHE_LIMIT),
    }
}

/// The float type a model's weights and so its activations and KV cache are kept in:
/// `LAYA_ACTIVATIONS` (`f32`, `bf16`, `f16`) where set, else bf16 on MLX's CUDA backend and
/// what the weights were loaded as elsewhere (`None`: f32 for a converted GGUF, the stored type
/// for a folder). On CUDA, MLX multiplies quantized weights with the tensor cores only for
/// f16/bf16 activations (f32 takes its naive kernel): the 0.5B's prompt ran at 55-79k tokens/s
/// in bf16 against 24-28k in f32 on an H100, its decode step 2.19 against 2.02 ms
/// (docs/benchmarks.md, "MLX's CUDA backend"). Unmeasured on Metal, which keeps f32.
pub(crate) fn activation_dtype() -> Result<Option<mlx_rs::Dtype>, RuntimeError> {
    match parse_activation_dtype(std::env::var("LAYA_ACTIVATIONS").ok().as_deref())? {
        Some(d) => Ok(Some(d)),
        None => Ok(on_cuda().then_some(mlx_rs::Dtype::Bfloat16)),
    }
}

/// Whether MLX's default device (where the model runs) is a GPU.
pub(crate) fn on_gpu() -> bool {
    matches!(Device::default().get_type(), Ok(DeviceType::Gpu))
}

/// Whether arrays go to MLX's CUDA backend by default.
fn on_cuda() -> bool {
    on_gpu() && flag(mlx_sys::mlx_cuda_is_available)
}

fn parse_activation_dtype(value: Option<&str>) -> Result<Option<mlx_rs::Dtype>, RuntimeError> {
    use mlx_rs::Dtype;
    match value.map(str::trim) {
        None | Some("") => Ok(None),
        Some("f32") => Ok(Some(Dtype::Float32)),
        Some("bf16") => Ok(Some(Dtype::Bfloat16)),
        Some("f16") => Ok(Some(Dtype::Float16)),
        Some(v) => Err(RuntimeError::Setting {
            name: "LAYA_ACTIVATIONS",
            expected: "f32, bf16 or f16",
            value: v.to_owned(),
        }),
    }
}

/// MLX settings read from the environment that laya gives other defaults, each applied only
/// when the environment does not set it.
///
/// `MLX_ENABLE_CACHE_THRASHING_CHECK=0`: MLX's CUDA backend caches a graph per op sequence and
/// counts misses over the process's whole life; past twice the cache's size (2 x 400) it
/// throws on every further miss (`mlx/backend/cuda/lru_cache.h`), and the failed commit leaves
/// the stream unusable. A resident server meets new prompt and cache lengths with nearly every
/// request: on the H200 the 1.5B failed every completion after its 371st quality case with
/// 2K-token prompts ("Cache thrashing is happening";
/// docs/lab/2026-12-03-whole-file-windows-1.5b.md). With the check off
/// MLX does not count at all and a miss only costs a graph capture; MLX's own test runner
/// sets the same.
///
/// `MLX_CUDA_USE_CUDNN_SDPA=0`: with f16/bf16 activations MLX's CUDA backend runs prompt
/// attention through cuDNN, building a cuDNN graph for every new pair of query and key lengths
/// (`mlx/backend/cuda/scaled_dot_product_attention.cpp`), and a completion server meets a new
/// pair with nearly every request: on an H100 the 0.5B's first prompt of 700 tokens ran at
/// 13.8k tokens/s against 84k the second time, and a decode step took 2.70 ms against 2.19
/// without cuDNN. Off, prompts take MLX's own attention (matrix products and a softmax).
///
/// `MLX_PTX_CACHE_DIR` ([`KERNEL_DIR`]): where MLX's CUDA backend keeps the kernels it compiles
/// at first use, [`crate::paths::kernel_dir`] rather than MLX's default under the temporary
/// directory, so a reboot does not send the next model load back to compiling them (102.7 s on
/// a fresh H100); `laya models warm` fills it.
pub(crate) const MLX_ENV_DEFAULTS: &[(&str, &str)] = &[
    ("MLX_ENABLE_CACHE_THRASHING_CHECK", "0"),
    ("MLX_CUDA_USE_CUDNN_SDPA", "0"),
];

/// The variable naming MLX's kernel cache, set to `crate::paths::kernel_dir` when unset.
pub const KERNEL_DIR: &str = "MLX_PTX_CACHE_DIR";

/// The [`MLX_ENV_DEFAULTS`] and [`KERNEL_DIR`] that `get` (the environment) leaves unset.
pub(crate) fn mlx_env_to_set(get: impl Fn(&str) -> Option<String>) -> Vec<(&'static str, String)> {
    let kernels = crate::paths::kernel_dir().to_string_lossy().into_owned();
    MLX_ENV_DEFAULTS
        .iter()
        .map(|&(name, value)| (name, value.to_string()))
        .chain([(KERNEL_DIR, kernels)])
        .filter(|(name, _)| get(name).is_none())
        .collect()
}

/// Apply `MLX_ENV_DEFAULTS` to this process's environment. MLX reads these when it first
/// uses a device, so this runs at the start of `main`, before any other thread exists.
pub fn apply_mlx_env_defaults() {
    for (name, value) in mlx_env_to_set(|n| std::env::var_os(n).map(|v| v.to_string_lossy().into_owned())) {
        std::env::set_var(name, value);
    }
}

/// What MLX states of GPU 0's memory, in bytes; `None` where it states nothing (no GPU).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuMemory {
    /// The memory the GPU has: Metal's `memory_size` (the RAM, unified), CUDA's
    /// `total_memory`.
    pub total: Option<u64>,
    /// The most the GPU should hold, where the device states it (Metal's
    /// `max_recommended_working_set_size`).
    pub working_set: Option<u64>,
}

/// MLX's device information for GPU 0 ([`GpuMemory`]).
pub fn gpu_memory() -> GpuMemory {
    // Route MLX's errors to mlx-rs's handler (MLX's own default exits the process).
    let _ = Device::gpu().get_type();
    let size = |info: mlx_sys::mlx_device_info, key: &CStr| {
        let mut v: usize = 0;
        // SAFETY: `info` is live; the callee writes one size_t when the key holds one.
        let found = unsafe { mlx_sys::mlx_device_info_get_size(&mut v, info, key.as_ptr()) } == 0;
        (found && v > 0).then_some(v as u64)
    };
    // SAFETY: the device and the info object are created here and freed below.
    unsafe {
        let dev = mlx_sys::mlx_device_new_type(mlx_sys::mlx_device_type__MLX_GPU, 0);
        let mut info = mlx_sys::mlx_device_info_new();
        let out = if mlx_sys::mlx_device_info_get(&mut info, dev) == 0 {
            GpuMemory {
                total: size(info, c"memory_size").or_else(|| size(info, c"total_memory")),
                working_set: size(info, c"max_recommended_working_set_size"),
            }
        } else {
            GpuMemory::default()
        };
        mlx_sys::mlx_device_info_free(info);
        mlx_sys::mlx_device_free(dev);
        out
    }
}

static GPU_IN_USE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Make `pref` the default device for every MLX op of this process and return its description.
pub fn use_device(pref: DevicePref) -> Result<String, RuntimeError> {
    let info = MlxInfo::probe();
    info.check_version()?;
    let (device, desc) = choose_device(pref, &info)?;
    Device::set_default(&device);
    mlx_rs::memory::set_cache_limit(cache_limit()?).map_err(|e| RuntimeError::Mlx(e.to_string()))?;
    if matches!(device.get_type(), Ok(DeviceType::Gpu)) {
        GPU_IN_USE.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    Ok(desc)
}

/// Whether this process made a GPU its MLX device ([`use_device`]).
pub fn gpu_in_use() -> bool {
    GPU_IN_USE.load(std::sync::atomic::Ordering::Relaxed)
}

/// The primitives of the graph that computes `outputs` (built, not evaluated), by name, as
/// MLX's `export_to_dot` lists them: what one evaluation runs, op by op, on any device.
/// Views (reshapes, slices, transposes, broadcasts) are among them but launch no kernel.
pub(crate) fn graph_primitives(
    outputs: &[&mlx_rs::Array],
) -> std::io::Result<std::collections::BTreeMap<String, usize>> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let path = std::env::temp_dir().join(format!(
        "laya-graph-{}-{}.dot",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let c_path = std::ffi::CString::new(path.to_string_lossy().into_owned())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: the FILE is opened, written by MLX and closed here; the vector and namer are
    // created and freed here; the arrays outlive the call.
    let rc = unsafe {
        let fp = mlx_sys::fopen(c_path.as_ptr(), c"w".as_ptr());
        if fp.is_null() {
            return Err(std::io::Error::last_os_error());
        }
        let vec = mlx_sys::mlx_vector_array_new();
        for a in outputs {
            mlx_sys::mlx_vector_array_append_value(vec, a.as_ptr());
        }
        let namer = mlx_sys::mlx_node_namer_new();
        let rc = mlx_sys::mlx_export_to_dot(fp, namer, vec);
        mlx_sys::fclose(fp);
        mlx_sys::mlx_node_namer_free(namer);
        mlx_sys::mlx_vector_array_free(vec);
        rc
    };
    let dot = std::fs::read_to_string(&path);
    let _ = std::fs::remove_file(&path);
    if rc != 0 {
        return Err(std::io::Error::other("mlx_export_to_dot failed"));
    }
    Ok(primitives_of_dot(&dot?))
}

/// MLX primitives that make a view of their input (no kernel, no copy).
pub(crate) const VIEWS: &[&str] = &[
    "AsStrided",
    "Broadcast",
    "ExpandDims",
    "Reshape",
    "Slice",
    "Split",
    "Squeeze",
    "Transpose",
];

/// The primitives of `counts` that launch work: all but [`VIEWS`].
pub(crate) fn kernels(counts: &std::collections::BTreeMap<String, usize>) -> usize {
    counts
        .iter()
        .filter(|(name, _)| !VIEWS.contains(&name.as_str()))
        .map(|(_, n)| n)
        .sum()
}

/// `{ ID [label ="Name", shape=rectangle]; }` lines, counted by name: MLX writes one per
/// application of a primitive (a multi-output one once; a compiled function reused by several
/// calls once per call, under the one ID they share).
fn primitives_of_dot(dot: &str) -> std::collections::BTreeMap<String, usize> {
    let mut counts = std::collections::BTreeMap::new();
    for line in dot.lines().filter(|l| l.contains("shape=rectangle")) {
        if let Some(label) = line.split("label =\"").nth(1).and_then(|r| r.split('"').next()) {
            *counts.entry(label.to_owned()).or_insert(0) += 1;
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_preferences_read_back_what_they_write() {
        for d in [DevicePref::Auto, DevicePref::Cpu, DevicePref::Gpu] {
            assert_eq!(d.to_string().parse::<DevicePref>(), Ok(d));
        }
        assert_eq!(DevicePref::default(), DevicePref::Auto);
        assert!("tpu"
            .parse::<DevicePref>()
            .unwrap_err()
            .0
            .contains("auto, cpu or gpu"));
    }

    /// The graph's primitives are counted by MLX's name for them, before any evaluation, one
    /// per application (a split's two outputs once, a compiled function's two calls twice);
    /// evaluated inputs are not part of it.
    #[test]
    fn graph_primitives_count_the_ops_of_a_graph() {
        use mlx_rs::{ops, transforms::eval, Array};
        let a = Array::from_slice(&[1f32, 2., 3., 4.], &[2, 2]);
        eval([&a]).unwrap();
        let b = a.add(&a).unwrap();
        let c = b.multiply(&a).unwrap().add(&b).unwrap();
        let halves = c.split_equal(2, 0).unwrap();
        let mut twice = mlx_rs::transforms::compile::compile(
            |(x, y): (&Array, &Array)| x.multiply(ops::sigmoid(x)?)?.multiply(y),
            true,
        );
        let e = twice((&halves[0], &halves[1])).unwrap();
        let e = twice((&e, &halves[1])).unwrap();
        let d = ops::sum(&e, None).unwrap();
        let counts = graph_primitives(&[&d, &b]).unwrap();
        eprintln!("{counts:?}");
        assert_eq!(counts.get("Add"), Some(&2), "{counts:?}");
        assert_eq!(counts.get("Multiply"), Some(&1), "{counts:?}");
        assert_eq!(counts.get("Split"), Some(&1), "{counts:?}");
        let compiled: usize = counts
            .iter()
            .filter(|(k, _)| k.starts_with("Compiled"))
            .map(|(_, n)| n)
            .sum();
        assert_eq!(compiled, 2, "{counts:?}");
        // sum over every axis ends in a view, the reshape to a scalar.
        assert_eq!(counts.get("Squeeze"), Some(&1), "{counts:?}");
        assert_eq!(counts.values().sum::<usize>(), 8, "{counts:?}");
        assert_eq!(kernels(&counts), 6);
        eval([&d]).unwrap();
        assert!(graph_primitives(&[&d]).unwrap().is_empty());
    }

    #[test]
    fn mlx_defaults_fill_only_what_the_environment_leaves_unset() {
        let kernels = crate::paths::kernel_dir().to_string_lossy().into_owned();
        assert!(
            kernels.ends_with(&format!("kernels/mlx-{}", mlx_sys::MLX_BUILD_VERSION)),
            "{kernels}"
        );
        let owned =
            |v: &[(&'static str, &str)]| v.iter().map(|&(n, v)| (n, v.to_string())).collect::<Vec<_>>();
        assert_eq!(
            mlx_env_to_set(|_| None),
            owned(&[
                ("MLX_ENABLE_CACHE_THRASHING_CHECK", "0"),
                ("MLX_CUDA_USE_CUDNN_SDPA", "0"),
                ("MLX_PTX_CACHE_DIR", &kernels),
            ])
        );
        assert_eq!(
            mlx_env_to_set(
                |n| (n == "MLX_ENABLE_CACHE_THRASHING_CHECK" || n == KERNEL_DIR).then(|| "1".into())
            ),
            owned(&[("MLX_CUDA_USE_CUDNN_SDPA", "0")])
        );
        assert!(mlx_env_to_set(|n| n.starts_with("MLX_").then(|| "1".into())).is_empty());
    }

    #[test]
    fn the_cache_limit_is_bytes_from_the_environment_or_the_default() {
        assert_eq!(parse_cache_limit(None), Ok(DEFAULT_CACHE_LIMIT));
        assert_eq!(parse_cache_limit(Some(" 268435456 ")), Ok(256 << 20));
        assert_eq!(parse_cache_limit(Some("0")), Ok(0));
        let e = parse_cache_limit(Some("1G")).unwrap_err().to_string();
        assert!(e.contains("LAYA_MLX_CACHE_LIMIT") && e.contains("`1G`"), "{e}");
        use mlx_rs::Dtype;
        assert_eq!(parse_activation_dtype(None), Ok(None));
        assert_eq!(parse_activation_dtype(Some("bf16")), Ok(Some(Dtype::Bfloat16)));
        assert_eq!(parse_activation_dtype(Some(" f16 ")), Ok(Some(Dtype::Float16)));
        assert_eq!(parse_activation_dtype(Some("f32")), Ok(Some(Dtype::Float32)));
        let e = parse_activation_dtype(Some("fp8")).unwrap_err().to_string();
        assert!(e.contains("LAYA_ACTIVATIONS") && e.contains("`fp8`"), "{e}");
    }

    #[test]
    fn choosing_the_device_bounds_the_allocator_cache() {
        use_device(DevicePref::Cpu).unwrap();
        // Setting it again returns what `use_device` set (MLX's own default is its memory limit).
        let previous = mlx_rs::memory::set_cache_limit(DEFAULT_CACHE_LIMIT).unwrap();
        assert_eq!(previous, DEFAULT_CACHE_LIMIT);
    }
}
