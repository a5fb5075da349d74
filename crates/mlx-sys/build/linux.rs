//! Linux: compile the vendored mlx-c against a prebuilt MLX and link its libmlx.so.
//!
//! The prebuilt MLX is the `mlx` folder of the `mlx-cpu` or `mlx-cuda-1{2,3}` wheel
//! at exactly the version mlx-c pins. It is looked up in this order:
//!   1. `MLX_DIR` (the wheel's `mlx` folder: lib/libmlx.so + include/mlx),
//!   2. laya's cache, where `scripts/setup.sh` unpacks it:
//!      `${LAYA_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/laya}/mlx/<backend>-<version>/mlx`, backend from
//!      `LAYA_MLX_BACKEND` (`cpu`, the default, `cuda12` or `cuda13`),
//!   3. an installed wheel found through `python3 -c 'import mlx'`.
//!
//! mlx-c is compiled with the `cc` crate (no CMake, so the CUDA wheel needs no
//! CUDA toolkit), with a `std::format` shim for libstdc++ < 13 and the half-precision
//! accessors that mlx-c only builds on aarch64.

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

use crate::{fail, Built};

/// laya's cache: `$LAYA_CACHE_DIR`, else `${XDG_CACHE_HOME:-~/.cache}/laya` (as crates/laya-engine/src/paths.rs).
fn cache_root() -> Option<PathBuf> {
    if let Some(dir) = env::var_os("LAYA_CACHE_DIR").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(dir));
    }
    env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .map(|c| c.join("laya"))
}

fn is_mlx_prefix(dir: &Path) -> bool {
    dir.join("lib/libmlx.so").is_file() && dir.join("include/mlx/mlx.h").is_file()
}

fn find_mlx(version: &str, backend: &str) -> PathBuf {
    if let Some(p) = env::var_os("MLX_DIR") {
        let p = PathBuf::from(p);
        if !is_mlx_prefix(&p) {
            fail(&format!(
                "MLX_DIR={} must be the wheel's `mlx` folder (with lib/libmlx.so and include/mlx/mlx.h)",
                p.display()
            ));
        }
        return p;
    }
    if let Some(root) = cache_root() {
        let p = root.join("mlx").join(format!("{backend}-{version}")).join("mlx");
        if is_mlx_prefix(&p) {
            return p;
        }
    }
    let python = env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    // The wheels install `mlx` as a namespace package (no __init__.py): use __path__.
    if let Ok(out) = Command::new(&python)
        .args(["-c", "import mlx\nfor p in mlx.__path__: print(p)"])
        .output()
    {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let p = PathBuf::from(line.trim());
            if is_mlx_prefix(&p) {
                return p;
            }
        }
    }
    fail(&format!(
        "prebuilt MLX {version} ({backend}) not found. Run `scripts/setup.sh` (it unpacks the \
         mlx-cpu=={version} wheel into ~/.cache/laya/mlx), or set MLX_DIR to an unpacked wheel's \
         `mlx` folder"
    ))
}

fn header_version(mlx: &Path) -> Option<String> {
    let text = std::fs::read_to_string(mlx.join("include/mlx/version.h")).ok()?;
    let get = |name: &str| -> Option<u32> {
        text.lines().find_map(|l| {
            let rest = l.trim().strip_prefix("#define ")?.strip_prefix(name)?;
            rest.trim().parse().ok()
        })
    };
    Some(format!(
        "{}.{}.{}",
        get("MLX_VERSION_MAJOR")?,
        get("MLX_VERSION_MINOR")?,
        get("MLX_VERSION_PATCH")?
    ))
}

/// `cuda` when the wheel beside this `mlx` folder is one of the CUDA wheels.
fn wheel_backend(mlx: &Path) -> &'static str {
    let site = mlx.parent().unwrap_or(mlx);
    let cuda = std::fs::read_dir(site)
        .map(|rd| {
            rd.flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with("mlx_cuda"))
        })
        .unwrap_or(false);
    if cuda {
        "cuda"
    } else {
        "cpu"
    }
}

/// The `mlxc-src` list of mlx-c's CMakeLists, so the cc build follows upstream.
fn mlx_c_sources(mlx_c: &Path) -> Vec<PathBuf> {
    let cmake = std::fs::read_to_string(mlx_c.join("CMakeLists.txt")).unwrap_or_default();
    let Some(start) = cmake.find("set(mlxc-src") else {
        fail("mlx-c CMakeLists.txt has no mlxc-src list");
    };
    let block = &cmake[start..];
    let block = &block[..block.find(')').unwrap_or(block.len())];
    block
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_whitespace().find(|w| w.ends_with(".cpp")))
        .map(|w| mlx_c.join(w.replace("${CMAKE_CURRENT_LIST_DIR}/", "")))
        .collect()
}

fn cxx(mlx_c: &Path, mlx_inc: &Path, compat: &Path) -> cc::Build {
    let mut b = cc::Build::new();
    b.cpp(true)
        .std("c++20")
        .opt_level(2)
        .debug(false)
        .pic(true)
        .warnings(false)
        .include(mlx_c)
        .include(mlx_inc)
        .flag("-include")
        .flag(compat.to_str().expect("utf-8 path"));
    b
}

pub fn build(manifest: &Path, mlx_c: &Path) -> Built {
    for v in [
        "MLX_DIR",
        "LAYA_MLX_BACKEND",
        "XDG_CACHE_HOME",
        "HOME",
        "PYTHON",
        "MLX_SYS_ALLOW_VERSION_MISMATCH",
    ] {
        println!("cargo:rerun-if-env-changed={v}");
    }
    if env::var_os("CARGO_FEATURE_METAL").is_some() || env::var_os("CARGO_FEATURE_ACCELERATE").is_some() {
        println!("cargo:warning=mlx-sys: features metal/accelerate are ignored on Linux; the prebuilt libmlx decides the backend");
    }
    let pinned = crate::pinned_mlx_version(mlx_c);
    let backend = env::var("LAYA_MLX_BACKEND").unwrap_or_else(|_| "cpu".into());
    let mlx = find_mlx(&pinned, &backend);
    println!(
        "cargo:rerun-if-changed={}",
        mlx.join("include/mlx/version.h").display()
    );
    let have = header_version(&mlx)
        .unwrap_or_else(|| fail(&format!("cannot read {}/include/mlx/version.h", mlx.display())));
    // mlx-c is C++ compiled against MLX's headers and libmlx has no stable C++ ABI
    // (mlx-c 0.7.0 does not even compile against MLX 0.32.4): require an exact match.
    if pinned != have {
        let msg = format!(
            "{} is MLX {have} but this mlx-c needs MLX {pinned}: run `scripts/setup.sh` or use the \
             mlx-cpu/mlx-cuda-13 wheel =={pinned}",
            mlx.display()
        );
        if env::var_os("MLX_SYS_ALLOW_VERSION_MISMATCH").is_some() {
            println!("cargo:warning={msg}");
        } else {
            fail(&msg);
        }
    }
    let mlx_lib = mlx.join("lib");
    let mlx_inc = mlx.join("include");
    let csrc = manifest.join("csrc");
    let compat = csrc.join("compat_format.hpp");

    let sources = mlx_c_sources(mlx_c);
    for s in &sources {
        if !s.is_file() {
            fail(&format!("missing mlx-c source {}", s.display()));
        }
    }
    cxx(mlx_c, &mlx_inc, &compat).files(&sources).compile("mlxc");
    if env::var("CARGO_CFG_TARGET_ARCH").as_deref() != Ok("aarch64") {
        cxx(mlx_c, &mlx_inc, &compat)
            .file(csrc.join("half_shim.cpp"))
            .compile("mlx_sys_half_shim");
    }

    println!("cargo:rustc-link-search=native={}", mlx_lib.display());
    println!("cargo:rustc-link-lib=dylib=mlx");
    println!("cargo:rustc-link-lib=dylib=stdc++");
    // rpath for this crate's own tests; dependents get DEP_MLX_LIBDIR (rustc-link-arg
    // does not propagate to them).
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", mlx_lib.display());
    Built {
        version: have,
        libdir: mlx_lib.display().to_string(),
        backend: wheel_backend(&mlx),
    }
}
