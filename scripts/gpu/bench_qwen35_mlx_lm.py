#!/usr/bin/env python3
"""mlx-lm's own Qwen3.5 (`qwen3_5`, module mlx_lm.models.qwen3_5: Gated DeltaNet layers with
every 4th layer gated full attention) on random weights of a real shape: the peer row beside
`laya bench engine --synthetic SHAPE`, on the same GPU in the same run.

Measured as laya's engine bench measures itself (and as scripts/gpu/bench_mlx_lm_moe.py does):
  prefill    a forward of N random ids on a fresh cache (`make_prompt_cache`), logits
             evaluated; the first run at each length (it compiles kernels for that shape) and
             the second, reported as tok/s;
  decode     mlx-lm's own loop (`generate_step`, greedy, the next step queued before the
             current token is read) after a 128-token prompt: the mean time per token over
             the tokens after the first;
  keystroke  after a 2,048-token prompt has run, a prompt that differs from it in its last
             few tokens (--edit, 4) and is one token longer (2,049 tokens): the time from
             `generate_step` to its first token. mlx-lm reuses nothing here: its prompt cache
             (`LRUPromptCache`, mlx_lm.server) reuses a longer cached prompt only by trimming
             it back to the common prefix, and a model with recurrent layers cannot be trimmed
             (`ArraysCache.is_trimmable()` is False: the DeltaNet state of a prefix is not kept),
             so the changed prompt is prefilled again from a fresh cache, all 2,049 tokens
             (one 2,048-token chunk, then the last token's step), plus the first token. That
             is what `keystroke_ms` reports: the median over --keystrokes edits, each listed.
Weights: mlx-lm's initialisation, cast to bf16 except `A_log` (the model's own
`cast_predicate`, as mlx-lm's converter casts), quantized as the converter does (affine, group
size 64, every linear and the embedding whose input width the group divides).

  python3 scripts/gpu/bench_qwen35_mlx_lm.py --shape qwen3.6-27b,qwen3.5-4b --bits 4 \\
      --prefill 512,2048 --decode 64 --json OUT
  (--layers, a multiple of 4, --hidden, --intermediate and --vocab shrink a shape for a check on
  a CPU, where MLX's bf16 quantized matmul is slow; --ops counts the primitives of one decode
  step's graph, as laya's bench does)

One JSON line per shape and precision goes to --json (appended) and to stdout.
"""
import argparse
import copy
import json
import os
import statistics
import sys
import time

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map_with_path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mlx_lm_common import VIEWS, decode_ms as _decode_ms, decode_step_ops as _decode_step_ops  # noqa: E402
from mlx_lm_common import prefill_s as _prefill_s, random_ids as _random_ids  # noqa: E402

try:
    from mlx_lm.models import qwen3_5  # noqa: E402
except ImportError as e:  # mlx-lm before 0.30.7 has no Qwen3.5
    sys.exit(f"mlx_lm.models.qwen3_5 does not import here: {e}")
from mlx_lm.generate import generate_step  # noqa: E402


def _qwen35(hidden, layers, inter, heads, kv, v_heads, tie):
    """A Qwen3.5 config.json as published (the nested `text_config` of
    Qwen3_5ForConditionalGeneration, vision tower left out): head_dim 256, 16 DeltaNet key heads
    of 128, value heads of 128, a convolution of 4, full attention every 4th layer with an
    output gate, RoPE on a quarter of each head (theta 1e7, interleaved M-RoPE sections), a
    vocabulary of 248,320. mlx-lm reads the layer kinds from `full_attention_interval` (not
    `layer_types`) and gates attention always (`attn_output_gate` is not read)."""
    text = dict(
        model_type="qwen3_5_text",
        hidden_size=hidden,
        num_hidden_layers=layers,
        intermediate_size=inter,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=256,
        linear_num_key_heads=16,
        linear_num_value_heads=v_heads,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        full_attention_interval=4,
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)],
        attn_output_gate=True,
        attention_bias=False,
        rms_norm_eps=1e-6,
        vocab_size=248320,
        max_position_embeddings=262144,
        tie_word_embeddings=tie,
        rope_parameters=dict(
            rope_type="default",
            rope_theta=10_000_000.0,
            partial_rotary_factor=0.25,
            mrope_section=[11, 11, 10],
            mrope_interleaved=True,
        ),
    )
    return dict(model_type="qwen3_5", tie_word_embeddings=tie, text_config=text)


SHAPES = {
    # Qwen3.6-27B: 64 layers (48 DeltaNet, 16 attention), 24 query heads, 48 value heads.
    "qwen3.6-27b": _qwen35(5120, 64, 17408, 24, 4, 48, False),
    # Qwen3.5-4B: 32 layers (24 DeltaNet, 8 attention), 16 query heads, 32 value heads, tied head.
    "qwen3.5-4b": _qwen35(2560, 32, 9216, 16, 4, 32, True),
}


def shrink(shape: dict, layers, hidden, intermediate, vocab) -> dict:
    shape = copy.deepcopy(shape)
    text = shape["text_config"]
    if layers:
        interval = text["full_attention_interval"]
        if layers % interval:
            sys.exit(f"--layers {layers}: keep it a multiple of {interval} (the attention layers' interval)")
        text["num_hidden_layers"] = layers
        text["layer_types"] = text["layer_types"][:layers]
    if hidden:
        if hidden % 64:
            sys.exit(f"--hidden {hidden}: keep it a multiple of 64 (the quantization group)")
        text["hidden_size"] = hidden
    if intermediate:
        text["intermediate_size"] = intermediate
    if vocab:
        text["vocab_size"] = vocab
    return shape


def build(shape: dict, bits: int, group_size: int):
    mx.random.seed(1)
    model = qwen3_5.Model(qwen3_5.ModelArgs.from_dict(copy.deepcopy(shape)))
    keep = model.cast_predicate  # every float parameter but A_log goes to bf16
    model.update(
        tree_map_with_path(
            lambda path, x: x.astype(mx.bfloat16) if keep(path) and mx.issubdtype(x.dtype, mx.floating) else x,
            model.parameters(),
        )
    )
    own = getattr(model, "quant_predicate", None)  # None for the dense model

    def predicate(path, module):
        if not hasattr(module, "to_quantized") or module.weight.shape[-1] % group_size:
            return False
        return own(path, module) if own else True

    nn.quantize(model, group_size=group_size, bits=bits, class_predicate=predicate)
    # Layer by layer, so the f32 initial values of one layer at most are alive at a time.
    for layer in model.layers:
        mx.eval(layer.parameters())
    mx.eval(model.parameters())
    return model


def active_bytes(model, shape: dict) -> int:
    """Bytes one decode step reads: every parameter but the embedding table (one row is read),
    unless the head is tied to it (then the table is the head, read whole)."""
    tied = shape["text_config"]["tie_word_embeddings"]
    total = 0
    for name, a in tree_flatten(model.parameters()):
        if "embed_tokens" in name and not tied:
            continue
        total += a.nbytes
    return total


VOCAB = [248_320]  # the ids drawn: below the vocabulary of the shape being run


def random_ids(n: int, seed: int) -> mx.array:
    return _random_ids(n, seed, VOCAB[0])


def prefill_s(model, n: int) -> float:
    return _prefill_s(model, n, random_ids)


def decode_step_ops(model) -> dict:
    return _decode_step_ops(model, random_ids)


def decode_ms(model, tokens: int) -> float:
    return _decode_ms(model, tokens, random_ids)


def first_token_ms(model, prompt: mx.array) -> float:
    """mlx-lm's `generate_step` on a fresh cache: the time to its first token. The step it
    queues behind that token is drained before returning, outside the time."""
    mx.eval(prompt)
    mx.synchronize()
    t = time.perf_counter()
    gen = generate_step(prompt, model, max_tokens=1)
    next(gen)
    ms = (time.perf_counter() - t) * 1e3
    for _ in gen:
        pass
    mx.synchronize()
    return ms


def keystrokes_ms(model, n: int, edit: int, count: int) -> list:
    """After an n-token prompt has run, `count` prompts that each keep its first n - edit tokens
    and end in edit + 1 others (n + 1 tokens): the time to each one's first token."""
    base = random_ids(n, 11)
    first_token_ms(model, base)  # the prompt the keystrokes change
    times = []
    for i in range(count):
        tail = random_ids(edit + 1, 100 + i)
        times.append(first_token_ms(model, mx.concatenate([base[: n - edit], tail])))
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="qwen3.6-27b,qwen3.5-4b", help=f"comma-separated, of {sorted(SHAPES)}")
    ap.add_argument("--bits", default="4")
    ap.add_argument("--group-size", type=int, default=64)
    ap.add_argument("--prefill", default="512,2048")
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--keystroke-tokens", type=int, default=2048, help="the prompt a keystroke changes")
    ap.add_argument("--edit", type=int, default=4, help="its last tokens a keystroke changes")
    ap.add_argument("--keystrokes", type=int, default=3)
    ap.add_argument("--bandwidth-gbs", type=float, default=4800.0)
    ap.add_argument("--layers", type=int, help="fewer layers, a multiple of 4 (a check on a CPU)")
    ap.add_argument("--hidden", type=int, help="a narrower hidden size (a check on a CPU)")
    ap.add_argument("--intermediate", type=int, help="a narrower MLP (a check on a CPU)")
    ap.add_argument("--vocab", type=int, help="a smaller vocabulary (a check on a CPU)")
    ap.add_argument("--json", help="append one JSON line per shape and precision here")
    ap.add_argument("--ops", action="store_true", help="count the primitives of a decode step too")
    a = ap.parse_args()
    names = a.shape.split(",")
    for name in names:
        if name not in SHAPES:
            sys.exit(f"--shape {name}: not one of {sorted(SHAPES)}")
    if not 0 < a.edit < a.keystroke_tokens:
        sys.exit("--edit: between 1 and --keystroke-tokens - 1")
    device = str(mx.default_device())
    print(f"mlx {mx.__version__}, device {device}", flush=True)
    for name in names:
        shape = shrink(SHAPES[name], a.layers, a.hidden, a.intermediate, a.vocab)
        text = shape["text_config"]
        VOCAB[0] = text["vocab_size"]
        for bits in [int(b) for b in a.bits.split(",")]:
            mx.reset_peak_memory()
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
            keys = keystrokes_ms(model, a.keystroke_tokens, a.edit, a.keystrokes)
            ops = decode_step_ops(model) if a.ops else {}
            nbytes = active_bytes(model, shape)
            floor = nbytes / (a.bandwidth_gbs * 1e9) * 1e3
            row = {
                "model": f"mlx-lm {name}",
                "synthetic": True,
                "device": device,
                "precision": f"q{bits}",
                "layers": text["num_hidden_layers"],
                "hidden": text["hidden_size"],
                "intermediate": text["intermediate_size"],
                "vocab": text["vocab_size"],
                "load_s": load_s,
                "prefill_tok_s": second,
                "prefill_first_tok_s": first,
                "decode_ms_per_token": decode,
                "keystroke_ms": statistics.median(keys),
                "keystroke_ms_each": keys,
                "keystroke_prompt_tokens": a.keystroke_tokens + 1,
                "keystroke_changed_tokens": a.edit,
                "keystroke_reused_tokens": 0,
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
