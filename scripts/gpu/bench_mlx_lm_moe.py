#!/usr/bin/env python3
"""mlx-lm's own models on random weights of a real shape: the peer row beside
`laya bench engine --synthetic SHAPE`, on the same GPU in the same run (Qwen3-MoE for
qwen3-coder-30b-a3b, Qwen2 for the Qwen2.5-Coder shapes).

Measured as laya's engine bench measures itself:
  prefill  a forward of N random ids on a fresh cache, logits evaluated; the first run at each
           length (it compiles kernels for that shape) and the second, reported as tok/s;
  decode   mlx-lm's own loop (`generate_step`, greedy, the next step queued before the current
           token is read) after a 128-token prompt: the mean time per token over the tokens
           after the first.
Weights: mlx-lm's initialisation, cast to bf16, quantized as mlx-lm's converter does (affine,
group size 64, the router `mlp.gate` at 8 bits: the model's own `quant_predicate`).

  python3 scripts/gpu/bench_mlx_lm_moe.py --bits 4,6,8 --prefill 128,512,2048 --decode 64 --json OUT
  (--layers/--experts shrink the shape for a check on a CPU; --ops counts the primitives of
  one decode step's graph, as laya's bench does)

One JSON line per precision goes to --json (appended) and to stdout.
"""
import argparse
import json
import os
import sys
import time

import mlx.core as mx
import mlx.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mlx_lm_common import VIEWS, decode_ms as _decode_ms, decode_step_ops as _decode_step_ops  # noqa: E402
from mlx_lm_common import prefill_s as _prefill_s, random_ids as _random_ids  # noqa: E402
from mlx_lm.models import qwen2, qwen3_moe  # noqa: E402

# Qwen3-Coder-30B-A3B-Instruct's config.json.
SHAPES = {
    "qwen3-coder-30b-a3b": dict(
        model_type="qwen3_moe",
        hidden_size=2048,
        num_hidden_layers=48,
        intermediate_size=6144,
        num_attention_heads=32,
        num_experts=128,
        num_experts_per_tok=8,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        moe_intermediate_size=768,
        rms_norm_eps=1e-6,
        vocab_size=151936,
        num_key_value_heads=4,
        head_dim=128,
        rope_theta=10_000_000.0,
        tie_word_embeddings=False,
        max_position_embeddings=262144,
        norm_topk_prob=True,
    )
}


def _qwen25(hidden, inter, layers, heads, kv, vocab, tie):
    """A Qwen2.5-Coder shape as laya's catalog gives it (`src/catalog.rs`, the same tied head or
    not, so both engines run the same weights); RoPE theta 1e6."""
    return dict(model_type="qwen2", hidden_size=hidden, num_hidden_layers=layers, intermediate_size=inter,
                num_attention_heads=heads, num_key_value_heads=kv, rms_norm_eps=1e-6, vocab_size=vocab,
                rope_theta=1_000_000.0, tie_word_embeddings=tie, max_position_embeddings=32768)


SHAPES.update({
    "qwen2.5-coder-0.5b": _qwen25(896, 4864, 24, 14, 2, 151936, False),
    "qwen2.5-coder-1.5b": _qwen25(1536, 8960, 28, 12, 2, 151936, False),
    "qwen2.5-coder-3b": _qwen25(2048, 11008, 36, 16, 2, 151936, True),
    "qwen2.5-coder-32b": _qwen25(5120, 27648, 64, 40, 8, 152064, False),
})
MODULES = {"qwen3_moe": qwen3_moe, "qwen2": qwen2}


def build(shape: dict, bits: int, group_size: int):
    mx.random.seed(1)
    module = MODULES[shape["model_type"]]
    model = module.Model(module.ModelArgs(**shape))
    model.set_dtype(mx.bfloat16)
    own = getattr(model, "quant_predicate", None)

    def predicate(path, module):
        if not hasattr(module, "to_quantized") or module.weight.shape[-1] % group_size:
            return False
        return own(path, module) if own else True

    nn.quantize(model, group_size=group_size, bits=bits, class_predicate=predicate)
    # Layer by layer, so the f32 initial values of one layer at most are alive at a time.
    for layer in model.model.layers:
        mx.eval(layer.parameters())
    mx.eval(model.parameters())
    return model


def active_bytes(model, shape: dict) -> int:
    """Bytes one decode step reads: every parameter but the embedding table (one row is
    read) and the experts a token is not routed to."""
    total = 0
    experts = shape.get("num_experts", 1)
    k = shape.get("num_experts_per_tok", 1)
    for name, a in nn.utils.tree_flatten(model.parameters()):
        if "embed_tokens" in name:
            continue
        n = a.nbytes
        if ".switch_mlp." in name:
            n = n // experts * k
        total += n
    return total


def random_ids(n: int, seed: int) -> mx.array:
    return _random_ids(n, seed, 150_000)


def prefill_s(model, n: int) -> float:
    return _prefill_s(model, n, random_ids)


def decode_step_ops(model) -> dict:
    return _decode_step_ops(model, random_ids)


def decode_ms(model, tokens: int) -> float:
    return _decode_ms(model, tokens, random_ids)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="qwen3-coder-30b-a3b", choices=sorted(SHAPES))
    ap.add_argument("--bits", default="4,6,8")
    ap.add_argument("--group-size", type=int, default=64)
    ap.add_argument("--prefill", default="128,512,2048")
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--bandwidth-gbs", type=float, default=4800.0)
    ap.add_argument("--layers", type=int, help="fewer layers (a check on a CPU)")
    ap.add_argument("--experts", type=int, help="fewer experts (a check on a CPU)")
    ap.add_argument("--json", help="append one JSON line per precision here")
    ap.add_argument("--ops", action="store_true", help="count the primitives of a decode step too")
    a = ap.parse_args()
    shape = dict(SHAPES[a.shape])
    if a.layers:
        shape["num_hidden_layers"] = a.layers
    if a.experts:
        shape["num_experts"] = a.experts
    device = str(mx.default_device())
    print(f"mlx {mx.__version__}, device {device}", flush=True)
    for bits in [int(b) for b in a.bits.split(",")]:
        t = time.perf_counter()
        model = build(shape, bits, a.group_size)
        load_s = time.perf_counter() - t
        prefill_s(model, 64)  # warm-up, as laya's bench
        decode_ms(model, 4)
        first, second = [], []
        for n in [int(x) for x in a.prefill.split(",")]:
            first.append((n, n / prefill_s(model, n)))
            second.append((n, n / prefill_s(model, n)))
        decode = decode_ms(model, a.decode)
        ops = decode_step_ops(model) if a.ops else {}
        nbytes = active_bytes(model, shape)
        floor = nbytes / (a.bandwidth_gbs * 1e9) * 1e3
        row = {
            "model": f"mlx-lm {a.shape}",
            "synthetic": True,
            "device": device,
            "precision": f"q{bits}",
            "load_s": load_s,
            "prefill_tok_s": second,
            "prefill_first_tok_s": first,
            "decode_ms_per_token": decode,
            "weight_bytes_per_token": nbytes,
            "bandwidth_gbs": a.bandwidth_gbs,
            "floor_ms_per_token": floor,
            "share_of_floor": floor / decode,
            "decode_step_ops": ops,
            "decode_step_kernels": sum(n for k, n in ops.items() if k not in VIEWS),
            "peak_memory_gb": mx.get_peak_memory() / 1e9,
        }
        line = json.dumps(row)
        print(line, flush=True)
        if a.json:
            with open(a.json, "a") as f:
                f.write(line + "\n")
        del model
        mx.clear_cache()


if __name__ == "__main__":
    main()
