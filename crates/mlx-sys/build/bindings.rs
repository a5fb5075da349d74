//! bindgen over mlx-c's public headers (shared by every platform).

use std::{
    env,
    ffi::OsStr,
    fs,
    path::{Path, PathBuf},
};

pub fn generate(mlx_c: &Path, csrc: &Path, target_os: &str) {
    let mut headers: Vec<PathBuf> = fs::read_dir(mlx_c.join("mlx/c"))
        .unwrap_or_else(|e| crate::fail(&format!("cannot list mlx-c headers: {e}")))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension() == Some(OsStr::new("h")))
        .collect();
    headers.sort();
    let mut builder = bindgen::Builder::default()
        .rust_target("1.73.0".parse().expect("rust-version"))
        .clang_arg(format!("-I{}", mlx_c.display()))
        // bindgen's `c_ulong` sizes trip rustc's suspicious_runtime_symbol_definitions lint.
        .blocklist_function("malloc")
        .blocklist_function("realloc");
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    if target_os != "macos" && arch != "aarch64" {
        // mlx-c declares float16_t/bfloat16_t only on aarch64; src/lib.rs defines them.
        builder = builder
            .clang_arg("-include")
            .clang_arg(csrc.join("bindgen_prelude.h").to_string_lossy())
            .blocklist_type("float16_t")
            .blocklist_type("bfloat16_t");
    }
    for h in &headers {
        println!("cargo:rerun-if-changed={}", h.display());
        builder = builder.header(h.to_string_lossy());
    }
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    builder
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .generate()
        .unwrap_or_else(|e| {
            crate::fail(&format!(
                "bindgen failed ({e}); it needs libclang: `apt-get install libclang-dev clang` \
                 (scripts/setup.sh installs it)"
            ))
        })
        .write_to_file(out.join("bindings.rs"))
        .expect("write bindings.rs");
}
