//! Puts the folder of the linked libmlx on the rpath of the engine's own binaries (its test
//! binaries), and passes it on to dependents as `DEP_LAYA_ENGINE_LIBDIR` (laya's build script
//! puts it on laya's rpath): rustc-link-arg in mlx-sys does not reach dependents, and laya
//! reaches MLX only through this crate.
//!
//! On Linux it also compiles laya's own MLX primitives (`csrc/`) against the headers of the
//! linked MLX, as mlx-sys compiles mlx-c, and sets `cfg(laya_primitives)`. A CUDA build
//! (`LAYA_MLX_BACKEND` cuda12/cuda13) compiles their GPU side too, which needs the CUDA
//! headers (`CUDA_INCLUDE`, else `$CUDA_HOME/include`, else where `scripts/setup.sh` puts
//! them) and fmt's (`libfmt-dev`, which MLX's CUDA headers include). Elsewhere (macOS, where
//! MLX is built from source) the ops path runs alone.
use std::{
    env,
    path::{Path, PathBuf},
};

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_MLX_LIBDIR");
    println!("cargo::rustc-check-cfg=cfg(laya_primitives)");
    let libdir = env::var("DEP_MLX_LIBDIR").unwrap_or_default();
    if !libdir.is_empty() {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{libdir}");
        println!("cargo::metadata=libdir={libdir}");
    }
    if env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") && !libdir.is_empty() {
        primitives(Path::new(&libdir));
    }
}

fn primitives(libdir: &Path) {
    println!("cargo:rerun-if-changed=csrc");
    println!("cargo:rerun-if-env-changed=DEP_MLX_BACKEND");
    println!("cargo:rerun-if-env-changed=CUDA_INCLUDE");
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let mlx_sys = manifest.join("../mlx-sys");
    let include = libdir.join("../include");
    let mut b = cc::Build::new();
    b.cpp(true)
        .std("c++20")
        .opt_level(2)
        .debug(false)
        .pic(true)
        .warnings(false)
        .include(mlx_sys.join("mlx-c"))
        .include(&include)
        .flag("-include")
        .flag(
            mlx_sys
                .join("csrc/compat_format.hpp")
                .to_str()
                .expect("utf-8 path"),
        )
        .file(manifest.join("csrc/rope_kv.cpp"))
        .file(manifest.join("csrc/decode_step.cpp"))
        .file(manifest.join("csrc/own.cpp"));
    if env::var("DEP_MLX_BACKEND").is_ok_and(|b| b.starts_with("cuda")) {
        // mlx-sys says "cuda"; which CUDA is the backend's name (what setup.sh was given).
        println!("cargo:rerun-if-env-changed=LAYA_MLX_BACKEND");
        let backend = env::var("LAYA_MLX_BACKEND").unwrap_or_else(|_| "cuda13".into());
        let cuda = cuda_include(&backend).unwrap_or_else(|| {
            fail(&format!(
                "the {backend} build compiles laya's CUDA primitives and needs the CUDA headers \
                 (cuda.h): run `scripts/setup.sh --backend {backend}`, or set CUDA_INCLUDE to the folder holding them"
            ))
        });
        b.include(cuda)
            .define("LAYA_CUDA", None)
            .define("FMT_HEADER_ONLY", None);
    }
    b.compile("laya_primitives");
    println!("cargo:rustc-cfg=laya_primitives");
}

/// The folder holding `cuda.h`: `CUDA_INCLUDE`, `$CUDA_HOME/include`, the headers
/// `scripts/setup.sh` installs for the backend, or the toolkit's usual place.
fn cuda_include(backend: &str) -> Option<PathBuf> {
    let cache = env::var_os("LAYA_CACHE_DIR").map(PathBuf::from).or_else(|| {
        env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .map(|c| c.join("laya"))
    });
    let candidates = [
        env::var_os("CUDA_INCLUDE").map(PathBuf::from),
        env::var_os("CUDA_HOME").map(|h| PathBuf::from(h).join("include")),
        cache.map(|c| c.join(format!("cuda/{backend}/include"))),
        Some(PathBuf::from("/usr/local/cuda/include")),
    ];
    candidates
        .into_iter()
        .flatten()
        .find(|d| d.join("cuda.h").is_file())
}

fn fail(msg: &str) -> ! {
    eprintln!("\nerror: {msg}\n");
    println!("cargo:warning={msg}");
    std::process::exit(1);
}
