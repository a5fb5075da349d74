//! `laya doctor`: what is installed, what is missing, and the command that fixes each gap.

use std::fmt::Write as _;

use crate::{
    catalog,
    engine::runtime::{choose_device, DevicePref, MlxInfo},
    paths,
};

/// Path of the libmlx mapped into this process (Linux: from /proc/self/maps).
fn loaded_libmlx() -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.rsplit('/').next().is_some_and(|f| f.starts_with("libmlx.so")))
        .map(str::to_owned)
}

pub struct Report {
    pub text: String,
    /// Problems that stop the main job (the default model cannot run).
    pub problems: usize,
}

pub fn report(pref: DevicePref) -> Report {
    let mut out = String::new();
    let mut problems = 0;
    let info = MlxInfo::probe();
    let w = &mut out;
    let _ = writeln!(w, "laya {}", env!("CARGO_PKG_VERSION"));
    match info.check_version() {
        Ok(()) => {
            let _ = writeln!(
                w,
                "  mlx version   {} (built against {}): ok",
                info.runtime_version, info.build_version
            );
        }
        Err(e) => {
            problems += 1;
            let _ = writeln!(w, "  mlx version   PROBLEM: {e}");
        }
    }
    let gpu = info
        .gpu_kind
        .map(|k| format!("gpu: {k}"))
        .unwrap_or_else(|| "no gpu".into());
    let _ = writeln!(w, "  mlx backend   {} build ({gpu})", info.build_backend);
    match choose_device(pref, &info) {
        Ok((_, desc)) => {
            let _ = writeln!(
                w,
                "  device        {desc} (--device {})",
                format!("{pref:?}").to_lowercase()
            );
        }
        Err(e) => {
            problems += 1;
            let _ = writeln!(w, "  device        PROBLEM: {e}");
        }
    }
    let lib = loaded_libmlx().unwrap_or_else(|| {
        if info.libdir.is_empty() {
            "linked statically".into()
        } else {
            format!("{}/libmlx.so", info.libdir)
        }
    });
    let _ = writeln!(w, "  libmlx        {lib}");
    let model_dir = paths::model_dir();
    let _ = writeln!(w, "  model dir     {}", model_dir.display());
    let _ = writeln!(w, "  models:");
    for m in catalog::MODELS {
        let default = if m.name == catalog::DEFAULT_MODEL {
            " (default)"
        } else {
            ""
        };
        if m.is_present() {
            let _ = writeln!(w, "    {:<20} present{default}", m.name);
        } else {
            if m.name == catalog::DEFAULT_MODEL {
                problems += 1;
            }
            let _ = writeln!(
                w,
                "    {:<20} missing{default}: run `laya models fetch {}`",
                m.name, m.name
            );
        }
    }
    if problems == 0 {
        let _ = writeln!(w, "ready");
    } else {
        let _ = writeln!(w, "{problems} problem(s) above; each line names its fix");
    }
    Report { text: out, problems }
}
