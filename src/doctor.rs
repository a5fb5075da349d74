//! `laya doctor`: what is installed, what is missing, and the command that fixes each gap;
//! the machine's memory and the tiers laya recommends for it, with what each needs and
//! whether it is present; what `auto` serves now; and the daemon of the runtime directory, if
//! one runs (asked for its status, never started): each model's state, its time to ready and
//! whether its weights came from the converted cache. [`report`] gathers; [`tiers`] (of a
//! machine and what is present) and [`daemon_section`] (of the daemon's answer) are pure.

use std::{fmt::Write as _, path::Path, time::Duration};

use crate::{
    catalog::{self, CatalogModel, Presence},
    daemon::{client::status_if_running, paths::runtime_dir, protocol::DaemonStatus},
    engine::{
        runtime::{DevicePref, MlxInfo},
        Tier,
    },
    machine::{gib, Machine},
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
    match info.device_for(pref) {
        Ok(desc) => {
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
    let machine = Machine::probe(pref);
    let _ = writeln!(w, "  memory        {machine}");
    let model_dir = paths::model_dir();
    let _ = writeln!(w, "  model dir     {}", model_dir.display());
    let presence = |m: &CatalogModel| crate::fetch::presence_in(m, &model_dir);
    w.push_str(&tiers(&machine, &presence));
    let _ = writeln!(w, "  models:");
    for m in catalog::MODELS {
        let default = if m.name == catalog::DEFAULT_MODEL {
            " (default)"
        } else {
            ""
        };
        let fix = format!("run `laya models fetch {}`", m.name);
        let state = match presence(m) {
            Presence::Present => {
                let here: Vec<&str> = m
                    .variants
                    .iter()
                    .filter(|v| crate::fetch::variant_presence_in(m, v, &model_dir) == Presence::Present)
                    .map(|v| v.label)
                    .collect();
                let _ = writeln!(w, "    {:<20} present ({}){default}", m.name, here.join(", "));
                continue;
            }
            Presence::Missing => format!("missing{default}: {fix}"),
            Presence::Unusable(why) => format!("unusable{default} ({why}): {fix}"),
        };
        if m.name == catalog::DEFAULT_MODEL {
            problems += 1;
        }
        let _ = writeln!(w, "    {:<20} {state}", m.name);
    }
    let dir = runtime_dir();
    w.push_str(&daemon_section(
        &dir,
        status_if_running(&dir, Duration::from_secs(5)),
    ));
    if problems == 0 {
        let _ = writeln!(w, "ready");
    } else {
        let _ = writeln!(w, "{problems} problem(s) above; each line names its fix");
    }
    Report { text: out, problems }
}

/// The tiers section: the recommended small and large model for `machine` with what each
/// needs and whether it is there (the command that fetches it where not), and the models the
/// `auto` defaults use now.
pub fn tiers(machine: &Machine, presence: &dyn Fn(&CatalogModel) -> Presence) -> String {
    let mut out = String::new();
    let w = &mut out;
    let bits = |tier| {
        catalog::tier_precisions(tier)
            .iter()
            .map(|p| p.label())
            .collect::<Vec<_>>()
            .join("+")
    };
    let recommended = catalog::recommend(machine);
    let _ = writeln!(
        w,
        "  tiers         recommended for this machine (at the router's bits: small {}, large {}):",
        bits(Tier::Small),
        bits(Tier::Large)
    );
    for tier in [Tier::Small, Tier::Large] {
        let Some(m) = recommended.get(tier) else {
            let _ = writeln!(w, "    {:<6} none fits beside the small tier", tier.label());
            continue;
        };
        let need = gib(m.tier_need(tier));
        let state = match presence(m) {
            Presence::Present => "present".to_owned(),
            Presence::Missing => format!(
                "missing: run `laya models fetch {}` (~{:.1} GB download, {})",
                m.name,
                m.download_bytes() as f64 / 1e9,
                m.fetch_variant().hub_repo
            ),
            Presence::Unusable(why) => format!("unusable ({why}): run `laya models fetch {}`", m.name),
        };
        let _ = writeln!(
            w,
            "    {:<6} {:<20} needs {need:>9}  {state}",
            tier.label(),
            m.name
        );
    }
    match recommended.budget {
        Some(budget) => {
            let _ = writeln!(
                w,
                "    together {} with {} of headroom, within {} the models may have here",
                gib(recommended.need()),
                gib(catalog::HEADROOM),
                gib(budget)
            );
        }
        None if machine.memory.is_none() => {
            let _ = writeln!(w, "    the memory is not known: the CPU defaults");
        }
        None => {
            let _ = writeln!(
                w,
                "    on the CPU the tiers are the 0.5B and the 1.5B, whatever the memory"
            );
        }
    }
    let in_use = catalog::plan(machine, |m| presence(m) == Presence::Present);
    let name = |m: Option<&CatalogModel>| m.map_or("none", |m| m.name);
    let _ = writeln!(
        w,
        "    `auto` (the default) serves now: small {}, large {}",
        name(in_use.small),
        name(in_use.large)
    );
    out
}

/// The daemon section: none runs in `dir`, or its pid, uptime and address, and per model its
/// state (ready: the time to ready on this start, the load's share of it, whether the weights
/// came from the converted cache, the device).
pub fn daemon_section(dir: &Path, status: Result<Option<DaemonStatus>, String>) -> String {
    let st = match status {
        Ok(Some(st)) => st,
        Ok(None) => return format!("  daemon        none runs (in {})\n", dir.display()),
        Err(e) => return format!("  daemon        no answer: {e}\n"),
    };
    let mut out = format!(
        "  daemon        pid {}, up {:.0} s, {}{}\n",
        st.pid,
        st.uptime_s,
        st.socket,
        st.http.map(|a| format!(", http {a}")).unwrap_or_default()
    );
    for m in &st.models {
        let state = match m.state.as_str() {
            "ready" => {
                let secs = |ms: Option<f64>| ms.unwrap_or(0.0) / 1e3;
                format!(
                    "ready in {:.1} s (load {:.1} s{}) on {}",
                    secs(m.time_to_ready_ms),
                    secs(m.load_time_ms),
                    if m.from_cache == Some(true) {
                        ", from the converted cache"
                    } else {
                        ""
                    },
                    m.device.as_deref().unwrap_or("?")
                )
            }
            "failed" => format!("failed: {}", m.error.as_deref().unwrap_or("?")),
            "not_loaded" => "not loaded (on first use)".to_owned(),
            other => other.to_owned(),
        };
        let _ = writeln!(out, "    {:<12} {:<20} {state}", m.id, m.name);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::Accelerator;

    #[test]
    fn the_tiers_name_what_each_needs_and_the_commands_for_the_missing() {
        let mac = Machine::new(Accelerator::Metal, 64);
        let have = |m: &CatalogModel| {
            if m.name == "qwen2.5-coder-3b" || m.name == "qwen2.5-coder-7b" {
                Presence::Present
            } else {
                Presence::Missing
            }
        };
        let text = tiers(&mac, &have);
        assert!(text.contains("small q8+q4, large q6"), "{text}");
        assert!(text.contains("small  qwen2.5-coder-3b     needs"), "{text}");
        assert!(text.contains("present"), "{text}");
        assert!(
            text.contains("large  qwen3-coder-30b-a3b  needs")
                && text.contains(
                    "missing: run `laya models fetch qwen3-coder-30b-a3b` (~24.8 GB download, mlx-community/Qwen3-Coder-30B-A3B-Instruct-6bit)"
                ),
            "{text}"
        );
        assert!(text.contains("within 48.0 GiB"), "{text}");
        assert!(
            text.contains("serves now: small qwen2.5-coder-3b, large qwen2.5-coder-7b"),
            "{text}"
        );
        let cpu = tiers(&Machine::new(Accelerator::Cpu, 16), &|_| Presence::Missing);
        assert!(
            cpu.contains("on the CPU the tiers are the 0.5B and the 1.5B"),
            "{cpu}"
        );
        assert!(
            cpu.contains("run `laya models fetch qwen2.5-coder-1.5b`"),
            "{cpu}"
        );
        assert!(cpu.contains("serves now: small none, large none"), "{cpu}");
    }

    /// Each model of a running daemon with its state, its time to ready and whether its
    /// weights came from the cache; none running, or no answer, said so.
    #[test]
    fn the_daemon_section_gives_each_models_time_to_ready() {
        let dir = Path::new("/run/laya");
        let model = |id: &str, state: &str, ready: Option<(f64, bool)>| {
            serde_json::json!({
                "id": id, "tier": id.split('/').next().unwrap(), "precision": null,
                "name": "qwen2.5-coder-7b", "source": "local", "state": state,
                "load_time_ms": ready.map(|(ms, _)| ms - 500.0), "time_to_ready_ms": ready.map(|(ms, _)| ms),
                "from_cache": ready.map(|(_, c)| c), "device": ready.map(|_| "cpu"),
                "warm": ready.is_some(), "served": 0, "error": (state == "failed").then_some("no weights"),
            })
        };
        let status: DaemonStatus = serde_json::from_value(serde_json::json!({
            "status": "ok", "version": "0", "protocol": 1, "pid": 42, "uptime_s": 12.3,
            "socket": "/run/laya/laya.sock", "http": "127.0.0.1:7723", "default": "small/q8",
            "models": [
                model("small/q8", "ready", Some((2_100.0, true))),
                model("large/q6", "ready", Some((41_000.0, false))),
                model("small/q4", "failed", None),
                model("large/q8", "loading", None),
                model("large", "not_loaded", None),
            ],
            "queue": {"running": 0, "waiting": 0}
        }))
        .unwrap();
        let text = daemon_section(dir, Ok(Some(status)));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "  daemon        pid 42, up 12 s, /run/laya/laya.sock, http 127.0.0.1:7723"
        );
        assert!(
            lines[1].ends_with("ready in 2.1 s (load 1.6 s, from the converted cache) on cpu")
                && lines[1].contains("small/q8"),
            "{text}"
        );
        assert!(
            lines[2].ends_with("ready in 41.0 s (load 40.5 s) on cpu"),
            "{text}"
        );
        assert!(lines[3].ends_with("failed: no weights"), "{text}");
        assert!(lines[4].ends_with(" loading"), "{text}");
        assert!(lines[5].ends_with("not loaded (on first use)"), "{text}");
        assert_eq!(
            daemon_section(dir, Ok(None)),
            "  daemon        none runs (in /run/laya)\n"
        );
        assert_eq!(
            daemon_section(dir, Err("/run/laya/laya.sock: timed out".into())),
            "  daemon        no answer: /run/laya/laya.sock: timed out\n"
        );
    }
}
