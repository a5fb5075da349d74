//! Build script for laya's `mlx-sys` 0.7.0.
//!
//! The platform split is one `match` on the target OS:
//! - Linux: compile the vendored mlx-c against the headers of a prebuilt MLX (the
//!   `mlx-cpu` / `mlx-cuda-12` / `mlx-cuda-13` PyPI wheel, unpacked by
//!   `scripts/setup.sh`) and link its `libmlx.so`. Nothing is downloaded here.
//! - macOS: build mlx-c and MLX from source with CMake (Metal + Accelerate), exactly
//!   as the crates.io mlx-sys does.
//!
//! Both paths then run bindgen over the same mlx-c headers.

use std::{env, path::PathBuf, process};

#[path = "build/bindings.rs"]
mod bindings;
#[path = "build/linux.rs"]
mod linux;
#[path = "build/macos.rs"]
mod macos;
#[path = "build/native_link.rs"]
#[allow(dead_code)]
mod native_link;

/// Print a build error that names the fix, then stop (no backtrace noise).
pub fn fail(msg: &str) -> ! {
    eprintln!("\nerror: {msg}\n");
    println!("cargo:warning={msg}");
    process::exit(1);
}

fn main() {
    println!("cargo:rerun-if-changed=build");
    println!("cargo:rerun-if-changed=csrc");
    // The pinned MLX version and the mlx-c sources compiled here.
    println!("cargo:rerun-if-changed=mlx-c/CMakeLists.txt");
    println!("cargo:rerun-if-changed=mlx-c/mlx/c");
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let mlx_c = manifest.join("mlx-c");
    let target_os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let built = match target_os.as_str() {
        "macos" => macos::build(&mlx_c),
        "linux" => linux::build(&manifest, &mlx_c),
        other => fail(&format!(
            "mlx-sys: unsupported target OS `{other}` (laya supports Linux x86_64 and macOS)"
        )),
    };
    println!("cargo:rustc-env=MLX_SYS_MLX_VERSION={}", built.version);
    println!("cargo:rustc-env=MLX_SYS_LIBDIR={}", built.libdir);
    println!("cargo:rustc-env=MLX_SYS_BACKEND={}", built.backend);
    println!("cargo::metadata=version={}", built.version);
    println!("cargo::metadata=libdir={}", built.libdir);
    println!("cargo::metadata=backend={}", built.backend);
    bindings::generate(&mlx_c, &manifest.join("csrc"), &target_os);
}

/// What the platform build produced, published to dependents as `DEP_MLX_*`.
pub struct Built {
    pub version: String,
    /// Folder of the shared libmlx to put on the rpath; empty when linked statically.
    pub libdir: String,
    pub backend: &'static str,
}

/// The MLX version mlx-c pins (`GIT_TAG vX.Y.Z` in its CMakeLists.txt).
pub fn pinned_mlx_version(mlx_c: &std::path::Path) -> String {
    let cmake = std::fs::read_to_string(mlx_c.join("CMakeLists.txt"))
        .unwrap_or_else(|e| fail(&format!("cannot read {}: {e}", mlx_c.display())));
    cmake
        .lines()
        .find_map(|line| {
            let tag = line.trim().strip_prefix("GIT_TAG v")?;
            tag.split(|c: char| c == ')' || c.is_whitespace())
                .next()
                .map(str::to_owned)
        })
        .unwrap_or_else(|| fail("mlx-c CMakeLists.txt has no `GIT_TAG v…` line"))
}
