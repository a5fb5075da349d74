//! Puts the folder of the linked libmlx on the binary's rpath, so `laya` runs with no
//! environment set: the engine's build script passes it on (`DEP_LAYA_ENGINE_LIBDIR`), since
//! rustc-link-arg in mlx-sys does not reach dependents and laya reaches MLX only through the
//! engine.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_LAYA_ENGINE_LIBDIR");
    if let Ok(dir) = std::env::var("DEP_LAYA_ENGINE_LIBDIR") {
        if !dir.is_empty() {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        }
    }
}
