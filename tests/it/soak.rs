//! A short soak through the code of `laya bench soak`: LSP and HTTP clients at once against
//! one daemon running a tiny model of random weights (the real engine, KV cache and prefix
//! store, on the CPU). Nothing may be lost, answered twice or fail, and the daemon's memory
//! must stop growing once the prefix store is full.

use std::time::Duration;

use laya::{
    bench::soak::{self, Config, Model},
    engine::{
        runtime::{use_device, DevicePref},
        synthetic, Precision, KV_CACHE_STEP as STEP, PREFILL_CHUNK,
    },
};

use crate::support;

const MIB: u64 = 1 << 20;

#[test]
fn a_soak_of_lsp_and_http_clients_loses_nothing_and_memory_stays_within_the_prefix_bound() {
    let _busy = support::busy_cpu();
    let tmp = tempfile::tempdir().unwrap();
    // Its tokenizer: the byte-level vocabulary of `support::gguf`, as long as Qwen's.
    let gguf = support::gguf::write_vocab(tmp.path()).unwrap();
    let model = {
        // Written with MLX in this process, on the CPU.
        let _mlx = support::mlx();
        use_device(DevicePref::Cpu).unwrap();
        soak::tiny_model(&tmp.path().join("tiny"), &gguf).unwrap()
    };
    let (entries, bytes) = (16, 4 * MIB as usize);
    let max_tokens = 8;
    let cfg = Config {
        program: env!("CARGO_BIN_EXE_laya").into(),
        device: DevicePref::Cpu,
        model: Model::Path(model),
        precision: Precision::Native,
        clients: 8,
        lsp_clients: 4,
        // Requests queue behind one model (about 1 s each on 2 busy cores, 8 clients round
        // robin: ~8 s a request), so a client sends two or three in 20 s.
        duration: Duration::from_secs(20),
        max_tokens,
        prefix_entries: entries,
        prefix_bytes: bytes,
        json: None,
    };
    let r = soak::run(&cfg, |l| eprintln!("{l}")).unwrap();
    eprintln!("{r}");

    for kind in [
        "lsp",
        "http /complete",
        "http /v1/completions",
        "http /v1/completions stream",
    ] {
        let k = r.kinds.iter().find(|k| k.kind == kind);
        assert!(
            k.is_some_and(|k| k.answered >= 2),
            "too few {kind} requests ran: {:?}",
            r.kinds
        );
    }
    assert_eq!((r.lost, r.answered_twice, r.errors), (0, 0, 0), "{:?}", r.kinds);
    assert_eq!(
        r.daemon_served, r.answered as u64,
        "the daemon served what the clients received, no more"
    );

    // The slack: what one request holds while it runs, beside the prefix store (which the
    // bound covers), for this model and these prompts (a token a byte in this vocabulary:
    // under 1,536 tokens, the longest about 1,220, + 8 generated):
    let cfg_m = synthetic::tiny();
    let positions = (1536 + max_tokens).div_ceil(STEP as usize) * STEP as usize;
    let per_position = (cfg_m.num_hidden_layers * 2 * cfg_m.num_key_value_heads * cfg_m.head_dim) as u64 * 4;
    let kv = positions as u64 * per_position; // its own KV cache, f32
    let chunk = PREFILL_CHUNK as u64;
    let scores = cfg_m.num_attention_heads as u64 * chunk * positions as u64 * 4; // attention of one chunk
    let mlp = chunk * (cfg_m.intermediate_size as u64 * 3 + cfg_m.hidden_size as u64 * 4) * 4;
    let logits = cfg_m.vocab_size as u64 * 4;
    let slack = kv + scores + mlp + logits;
    eprintln!(
        "slack (one request's working set): {:.1} MiB",
        slack as f64 / MIB as f64
    );
    let m = &r.memory;
    assert!(
        m.growth() <= slack as i64,
        "the daemon kept growing: peak {:.1} MiB in the 2nd half vs {:.1} MiB in the 1st (slack {:.1} MiB)",
        m.second_half as f64 / MIB as f64,
        m.warm as f64 / MIB as f64,
        slack as f64 / MIB as f64
    );
    assert!(
        m.end <= m.warm + bytes as u64 + slack,
        "RSS at the end {:.1} MiB > warm {:.1} + prefix bound {:.1} + slack {:.1} MiB",
        m.end as f64 / MIB as f64,
        m.warm as f64 / MIB as f64,
        bytes as f64 / MIB as f64,
        slack as f64 / MIB as f64
    );
}
