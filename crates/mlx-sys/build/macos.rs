//! macOS: build mlx-c and MLX from source with CMake (Metal + Accelerate), as the
//! crates.io mlx-sys 0.7.0 does. mlx-c's CMakeLists fetches MLX at the pinned tag.

#[allow(unused_imports)]
use std::{
    env, fs,
    path::{Path, PathBuf},
};

use crate::{native_link, Built};

#[cfg(feature = "metal")]
fn metallib_dir() -> PathBuf {
    if let Some(path) = env::var_os("MLX_RS_METAL_PATH") {
        return PathBuf::from(path);
    }
    let home = env::var_os("HOME").expect("HOME must be set when MLX_RS_METAL_PATH is not provided");
    let key = if cfg!(feature = "metal-jit") {
        "laya-0.7.0-jit"
    } else {
        "laya-0.7.0"
    };
    PathBuf::from(home).join(".mlx").join("lib").join(key)
}

pub fn build(mlx_c: &Path) -> Built {
    println!("cargo:rerun-if-env-changed=MLX_RS_METAL_PATH");
    let mut config = cmake::Config::new(mlx_c);
    config.define("CMAKE_INSTALL_PREFIX", ".");
    config.define("CMAKE_C_COMPILER", "/usr/bin/cc");
    config.define("CMAKE_CXX_COMPILER", "/usr/bin/c++");
    config.define("CMAKE_BUILD_TYPE", "Release");
    config.define("MLX_C_BUILD_EXAMPLES", "OFF");
    config.define("MLX_BUILD_METAL", "OFF");
    config.define("MLX_BUILD_ACCELERATE", "OFF");
    #[cfg(feature = "metal")]
    {
        config.define("MLX_BUILD_METAL", "ON");
        #[cfg(feature = "metal-jit")]
        config.define("MLX_METAL_JIT", "ON");
        let dir = metallib_dir();
        fs::create_dir_all(&dir).expect("create the MLX metallib directory");
        config.define("MLX_METAL_PATH", &dir);
    }
    #[cfg(feature = "accelerate")]
    config.define("MLX_BUILD_ACCELERATE", "ON");
    let dst = config.build();

    println!("cargo:rustc-link-search=native={}/build/lib", dst.display());
    println!(
        "cargo:rustc-link-search=native={}/build/_deps/mlx-build/mlx/io",
        dst.display()
    );
    for library in native_link::libraries(&dst.join("build")) {
        if library == "jaccl" {
            println!("cargo:rustc-link-search=native={}/build/jaccl", dst.display());
        }
        println!("cargo:rustc-link-lib=static={library}");
    }
    println!("cargo:rustc-link-lib=c++");
    println!("cargo:rustc-link-lib=dylib=objc");
    println!("cargo:rustc-link-lib=framework=Foundation");
    #[cfg(feature = "metal")]
    println!("cargo:rustc-link-lib=framework=Metal");
    #[cfg(feature = "accelerate")]
    println!("cargo:rustc-link-lib=framework=Accelerate");
    if let Some(clang_rt) = native_link::find_clang_rt_path() {
        println!("cargo:rustc-link-search={clang_rt}");
        println!("cargo:rustc-link-lib=static=clang_rt.osx");
    }
    Built {
        version: crate::pinned_mlx_version(mlx_c),
        libdir: String::new(),
        backend: if cfg!(feature = "metal") { "metal" } else { "cpu" },
    }
}
