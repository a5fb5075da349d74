//! GGUFs of the hybrid models (llama.cpp's `qwen35`, `qwen35moe`, `qwen3next`) run as llama.cpp
//! runs them. A script run by the llama.cpp peer's Python (gguf-py 0.19 and
//! llama-cpp-python 0.3.36, `scripts/peer-setup.sh`) makes Hugging Face-layout weights, writes
//! them as llama.cpp's converter does (value heads tiled for `qwen35` and `qwen35moe`,
//! `ssm_a = -exp(A_log)`, the convolution squeezed, `ssm_ba` kept interleaved for
//! `qwen3next`), then runs the file in llama.cpp: the prompt's ids, the logits at every prompt
//! position and 16 greedy tokens. laya loads the same file. Peer tests: they run with
//! `LAYA_TEST_REAL_MODELS=1`.

use super::{greedy_tokens, llama_cpp_peer, logits_against_peer, mlx};
use crate::{
    family::Family,
    load::{facts_in, LoadOptions},
    local::LocalModel,
    models::Arch,
    seam::Precision,
};

/// Arguments: the architecture, the GGUF path, the prompt, the tokens to generate.
const PEER: &str = r##"
arch, path, prompt, n_gen = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
V, H, L, EVERY, NH, NKV, D, FF = len(tokens), 64, 4, 2, 4, 2, 32, 96
HK, HV, DK, DV, K = 2, 4, 16, 16, 4
R = HV // HK
E, USED, FE, FS = 4, 2, 32, 48
moe = arch != "qwen35"

rng = np.random.default_rng(35)
def mat(rows, cols, scale=1.0):
    return (rng.standard_normal((rows, cols)) * scale / np.sqrt(cols)).astype(np.float32)
def vec(n, lo, hi):
    return rng.uniform(lo, hi, n).astype(np.float32)

def tiled(t, axis, width):
    # The converter's _reorder_v_heads: grouped value heads (key head by key head) to tiled.
    shape = list(t.shape)
    t = t.reshape(shape[:axis] + [HK, R, width] + shape[axis + 1:])
    return np.swapaxes(t, axis, axis + 1).reshape(shape)

w = gguf.GGUFWriter(path, arch)
w.add_context_length(256)
w.add_embedding_length(H)
w.add_block_count(L)
w.add_feed_forward_length(FF)
w.add_head_count(NH)
w.add_head_count_kv(NKV)
w.add_key_length(D)
w.add_value_length(D)
w.add_rope_freq_base(1_000_000.0)
w.add_rope_dimension_count(D // 4)
if arch != "qwen3next":
    w.add_rope_dimension_sections([2, 1, 1, 0])
w.add_layer_norm_rms_eps(1e-6)
w.add_ssm_conv_kernel(K)
w.add_ssm_state_size(DK)
w.add_ssm_group_count(HK)
w.add_ssm_time_step_rank(HV)
w.add_ssm_inner_size(HV * DV)
w.add_full_attention_interval(EVERY)
if moe:
    w.add_expert_count(E)
    w.add_expert_used_count(USED)
    w.add_expert_feed_forward_length(FE)
    w.add_expert_shared_feed_forward_length(FS)
w.add_tokenizer_model("gpt2")
w.add_tokenizer_pre("qwen2" if arch == "qwen3next" else "qwen35")
w.add_token_list(tokens)
w.add_token_types(types)
w.add_token_merges(["\u0120 \u0120"])
w.add_eos_token_id(tokens.index("<|endoftext|>"))
w.add_add_bos_token(False)
w.add_tensor("token_embd.weight", rng.standard_normal((V, H)).astype(np.float32))
for l in range(L):
    p = f"blk.{l}."
    # RMSNorm weights as the converter stores them (Hugging Face's weight + 1).
    w.add_tensor(p + "attn_norm.weight", vec(H, 0.8, 1.2))
    w.add_tensor(p + "post_attention_norm.weight", vec(H, 0.8, 1.2))
    if (l + 1) % EVERY != 0:
        qk = mat(2 * HK * DK, H)
        # Hugging Face's grouped value heads.
        v, z = mat(HV * DV, H), mat(HV * DV, H)
        b, a = mat(HV, H), mat(HV, H)
        conv = rng.uniform(-0.5, 0.5, (2 * HK * DK + HV * DV, K)).astype(np.float32)
        a_log, dt = vec(HV, -1.0, 1.0), vec(HV, -0.5, 0.5)
        out = mat(H, HV * DV)
        if arch == "qwen3next":
            w.add_tensor(p + "attn_qkv.weight", np.concatenate([qk, v]))
            w.add_tensor(p + "attn_gate.weight", z)
            # Per key head: its R rows of b, then its R of a.
            ba = np.concatenate([b.reshape(HK, R, H), a.reshape(HK, R, H)], 1).reshape(2 * HV, H)
            w.add_tensor(p + "ssm_ba.weight", ba)
        else:
            w.add_tensor(p + "attn_qkv.weight", np.concatenate([qk, tiled(v, 0, DV)]))
            w.add_tensor(p + "attn_gate.weight", tiled(z, 0, DV))
            w.add_tensor(p + "ssm_beta.weight", tiled(b, 0, 1))
            w.add_tensor(p + "ssm_alpha.weight", tiled(a, 0, 1))
            conv = np.concatenate([conv[: 2 * HK * DK], tiled(conv[2 * HK * DK:], 0, DV)])
            a_log, dt, out = tiled(a_log, 0, 1), tiled(dt, 0, 1), tiled(out, 1, DV)
        w.add_tensor(p + "ssm_conv1d.weight", conv)
        w.add_tensor(p + "ssm_a", (-np.exp(a_log)).astype(np.float32))
        w.add_tensor(p + "ssm_dt.bias", dt)
        w.add_tensor(p + "ssm_norm.weight", vec(DV, 0.8, 1.2))
        w.add_tensor(p + "ssm_out.weight", out)
    else:
        w.add_tensor(p + "attn_q.weight", mat(2 * NH * D, H))
        w.add_tensor(p + "attn_k.weight", mat(NKV * D, H))
        w.add_tensor(p + "attn_v.weight", mat(NKV * D, H))
        w.add_tensor(p + "attn_output.weight", mat(H, NH * D))
        w.add_tensor(p + "attn_q_norm.weight", vec(D, 0.8, 1.2))
        w.add_tensor(p + "attn_k_norm.weight", vec(D, 0.8, 1.2))
    if moe:
        w.add_tensor(p + "ffn_gate_inp.weight", mat(E, H, 2.0))
        w.add_tensor(p + "ffn_gate_exps.weight", np.stack([mat(FE, H) for _ in range(E)]))
        w.add_tensor(p + "ffn_up_exps.weight", np.stack([mat(FE, H) for _ in range(E)]))
        w.add_tensor(p + "ffn_down_exps.weight", np.stack([mat(H, FE) for _ in range(E)]))
        w.add_tensor(p + "ffn_gate_shexp.weight", mat(FS, H))
        w.add_tensor(p + "ffn_up_shexp.weight", mat(FS, H))
        w.add_tensor(p + "ffn_down_shexp.weight", mat(H, FS))
        w.add_tensor(p + "ffn_gate_inp_shexp.weight", mat(1, H, 2.0)[0])
    else:
        w.add_tensor(p + "ffn_gate.weight", mat(FF, H))
        w.add_tensor(p + "ffn_up.weight", mat(FF, H))
        w.add_tensor(p + "ffn_down.weight", mat(H, FF))
w.add_tensor("output_norm.weight", vec(H, 0.8, 1.2))
w.add_tensor("output.weight", mat(V, H, 3.0))
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
"##;

const PROMPT: &str =
    "<|fim_prefix|>def add(a, b):\n    return <|fim_suffix|>\n\nprint(add(1, 2))\n<|fim_middle|>";

/// Each architecture's file: laya's prompt ids, logits at every position and greedy tokens
/// against llama.cpp's, and the shapes it read.
#[test]
fn hybrid_ggufs_run_as_llama_cpp_runs_them() {
    const N: usize = 16;
    let dir = tempfile::tempdir().unwrap();
    for arch in ["qwen35", "qwen35moe", "qwen3next"] {
        let file = dir.path().join(format!("tiny-{arch}.gguf"));
        let n = N.to_string();
        let Some(peer) = llama_cpp_peer(PEER, &[arch, file.to_str().unwrap(), PROMPT, &n]) else {
            return;
        };

        let (_g, _b) = mlx();
        let opts = LoadOptions {
            precision: Precision::Native,
            use_cache: false,
            ..LoadOptions::default()
        };
        let local = LocalModel::load(&file, &opts).unwrap();
        assert_eq!(facts_in(&file).family, Some(Family::Qwen3Coder));
        let model = &local.loaded.model;
        let cfg = model.config();
        assert_eq!(cfg.arch, Arch::Qwen35);
        let hy = cfg.hybrid.clone().unwrap();
        assert_eq!(hy.linear_layers, [true, false, true, false], "{arch}");
        assert_eq!(
            (
                hy.linear_num_key_heads,
                hy.linear_num_value_heads,
                hy.linear_key_head_dim,
                hy.linear_value_head_dim,
                hy.rope_dims
            ),
            (2, 4, 16, 16, 8)
        );
        match &cfg.moe {
            Some(m) => assert_eq!(
                (
                    m.num_experts,
                    m.num_experts_per_tok,
                    m.moe_intermediate_size,
                    m.shared_expert_intermediate_size
                ),
                (4, 2, 32, Some(48))
            ),
            None => assert_eq!(arch, "qwen35"),
        }

        let ids = local.loaded.tokenizer.encode(PROMPT, true).unwrap();
        assert_eq!(ids, peer.prompt_ids, "{arch}");
        let (diff, _) = logits_against_peer(model, &ids, &peer, arch);
        // Measured 1.7e-5 to 2.7e-5 (logits' std about 3); a value head read from the wrong key
        // head, or `ssm_a` taken for `A_log`, is off by about the logits' spread.
        assert!(diff <= 1e-3, "{arch}: max |laya - llama.cpp| {diff}");
        // Greedy through the recurrent state and the KV cache, one token at a time.
        let greedy = greedy_tokens(model, &ids, N);
        assert_eq!(greedy, peer.generated, "{arch}");
        let distinct: std::collections::BTreeSet<_> = greedy.iter().collect();
        assert!(distinct.len() >= 4, "{arch}: {greedy:?}");
    }
}
