//! `laya models warm`: load every model `laya serve` with the same flags would serve, at each
//! bit width the router's default policy asks of its tier, through the daemon's own model pool
//! (so each one runs the warm-up a daemon runs at load), and report the time each took. On a
//! GPU this compiles the kernels MLX compiles at first use into its kernel cache
//! (`laya_engine::paths::kernel_dir`), so a daemon started later is ready without compiling;
//! `scripts/setup.sh` runs it on CUDA machines.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{bail, Result};
use laya::{
    catalog,
    engine::{
        pool::{ModelPool, TierSource},
        ModelKey, ModelState,
    },
};

use super::ServeArgs;

pub fn run(serve: ServeArgs, device: laya::engine::runtime::DevicePref) -> Result<()> {
    let config = serve.config(device)?;
    let (mut pool, names) = config.pool()?;
    let keys: Vec<ModelKey> = pool
        .tiers
        .iter()
        .filter(|(_, source)| matches!(source, TierSource::Local { .. }))
        .flat_map(|(&tier, _)| {
            catalog::tier_precisions(tier)
                .into_iter()
                .map(move |precision| ModelKey { tier, precision })
        })
        .collect();
    if keys.is_empty() {
        bail!("no local model to warm: every tier is served from a remote server");
    }
    pool.preload = keys.clone();
    println!(
        "kernel cache: {}",
        std::env::var(laya::engine::runtime::KERNEL_DIR).unwrap_or_else(|_| "(MLX's default)".into())
    );
    let start = Instant::now();
    let pool = ModelPool::new(pool, Arc::new(|_, _| {}))?;
    let mut failed = 0;
    for key in keys {
        let name = names.get(&key.tier).map(String::as_str).unwrap_or("?");
        match settled(&pool, key) {
            ModelState::Ready {
                load_time,
                time_to_ready,
                from_cache,
                device,
            } => println!(
                "{key} ({name}) ready on {device} in {:.1} s: weights {:.1} s ({}), the rest the warm-up",
                time_to_ready.as_secs_f64(),
                load_time.as_secs_f64(),
                if from_cache { "converted cache" } else { "read" }
            ),
            ModelState::Failed(e) => {
                failed += 1;
                eprintln!("{key} ({name}): {e}");
            }
            ModelState::Loading => unreachable!("settled waits while a model loads"),
        }
    }
    // The models' threads wait on the pool's channels; dropping it would have them free their
    // MLX arrays while the process's exit tears MLX down (seen: "corrupted double-linked
    // list" on the CPU). Keep it until the process ends.
    std::mem::forget(pool);
    if failed > 0 {
        bail!("{failed} model(s) failed to load (see above)");
    }
    println!("warm in {:.1} s", start.elapsed().as_secs_f64());
    Ok(())
}

/// `key`'s state once it is no longer loading.
fn settled(pool: &ModelPool, key: ModelKey) -> ModelState {
    loop {
        match pool.states().into_iter().find(|(k, _)| *k == key).map(|(_, s)| s) {
            Some(ModelState::Loading) | None => std::thread::sleep(Duration::from_millis(50)),
            Some(settled) => return settled,
        }
    }
}
