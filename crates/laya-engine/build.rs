//! Puts the folder of the linked libmlx on the rpath of the engine's own binaries (its test
//! binaries), and passes it on to dependents as `DEP_LAYA_ENGINE_LIBDIR` (laya's build script
//! puts it on laya's rpath): rustc-link-arg in mlx-sys does not reach dependents, and laya
//! reaches MLX only through this crate.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_MLX_LIBDIR");
    if let Ok(dir) = std::env::var("DEP_MLX_LIBDIR") {
        if !dir.is_empty() {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
            println!("cargo::metadata=libdir={dir}");
        }
    }
}
