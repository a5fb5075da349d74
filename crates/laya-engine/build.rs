//! Puts the folder of the linked libmlx on the binary's rpath, so `laya` runs with no
//! environment set (rustc-link-arg in mlx-sys does not reach dependents).
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_MLX_LIBDIR");
    if let Ok(dir) = std::env::var("DEP_MLX_LIBDIR") {
        if !dir.is_empty() {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        }
    }
}
