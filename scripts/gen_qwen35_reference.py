#!/usr/bin/env python3
"""Generate tests/data/qwen35-reference.json: logits of mlx-lm's Qwen3.5 models (`qwen3_5`, and
`qwen3_5_moe` with its shared expert, and Qwen3-Next's `qwen3_next`) for tiny models of deterministic weights, which laya's
Qwen3.5 path must reproduce.

The weights are not stored: every tensor is `center + scale * u`, u the uniform(-1, 1) numbers
of the engine's LCG (`synthetic::gguf::Lcg`) seeded with `SEED ^ fnv1a64(name)`. The fixture
lists each tensor's name, shape, scale and center, the names, shapes and dtypes of the tensors
mlx-lm saved (the mlx-community layout: `language_model.` prefix, conv1d as [C, K, 1],
quantized linears as weight/scales/biases), the config.json mlx-lm wrote and the logits of
`PROMPT` at `POSITIONS`. The Rust test (crates/laya-engine/src/tests/engine_qwen35.rs)
makes the same tensors, writes the folder itself, loads it with laya's loader and compares.

Each variant is saved by mlx-lm (`save_model`, `save_config`) and read back by mlx-lm
(`load_model`, which runs the model's `sanitize`) before its logits are taken, so the layout
is the one mlx-lm itself reads. MLX runs on the CPU.

How to run (from the repository root):

    python3 -m venv /tmp/qwen35-venv
    /tmp/qwen35-venv/bin/pip install "mlx[cpu]==0.32.2" mlx-lm==0.32.2
    /tmp/qwen35-venv/bin/python scripts/gen_qwen35_reference.py [OUT.json]

OUT defaults to tests/data/qwen35-reference.json. The output is deterministic; it takes a few
seconds.
"""
import copy
import importlib.metadata
import json
import math
import os
import sys
import tempfile
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_map_with_path
from mlx_lm.models import qwen3_5, qwen3_5_moe, qwen3_next
from mlx_lm.utils import load_model, quantize_model, save_config, save_model

mx.set_default_device(mx.cpu)

SEED = 47
MASK = (1 << 64) - 1

# Like a real Qwen3.5 config.json (nested `text_config`, `layer_types` beside
# `full_attention_interval`, `rope_parameters`), shrunk: 4 layers, linear attention in layers
# 0 and 2, gated full attention in 1 and 3. Key and value heads and dims of the DeltaNet
# layers differ (2 key heads of 32, 4 value heads of 16), the attention's head_dim is not
# hidden / heads, and RoPE turns a quarter of each head (8 of 32 dims).
TEXT_CONFIG = {
    "model_type": "qwen3_5_text",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 2,
    "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
    "rms_norm_eps": 1e-6,
    "vocab_size": 265,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "max_position_embeddings": 4096,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [2, 1, 1],
        "mrope_interleaved": True,
    },
}
CONFIG = {
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "model_type": "qwen3_5",
    "tie_word_embeddings": False,
    "text_config": TEXT_CONFIG,
}

# The mixture-of-experts model (`qwen3_5_moe`, as Qwen3.5-35B-A3B): the same layers with 4
# experts of width 64 (2 a token) and a shared expert of width 64 in place of each dense MLP.
MOE_TEXT_CONFIG = dict(
    TEXT_CONFIG,
    model_type="qwen3_5_moe_text",
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=64,
    shared_expert_intermediate_size=64,
    norm_topk_prob=True,
)
MOE_CONFIG = dict(
    CONFIG,
    architectures=["Qwen3_5MoeForConditionalGeneration"],
    model_type="qwen3_5_moe",
    text_config=MOE_TEXT_CONFIG,
)

# Qwen3-Next's layout (`qwen3_next`, as Qwen3-Coder-Next): the same layers, the DeltaNet's
# projections interleaved per key head (`in_proj_qkvz`, `in_proj_ba`), settings at the top
# level, experts in layers 0, 1 and 3 (layer 2 in `mlp_only_layers`).
NEXT_CONFIG = {
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    **{k: v for k, v in TEXT_CONFIG.items() if k not in ("model_type", "rope_parameters", "layer_types")},
    "rope_theta": 10000.0,
    "partial_rotary_factor": 0.25,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [2],
    "norm_topk_prob": True,
}

# Byte tokens of "def add(a, b):\n    return a + b\n" cut to 20, a FIM control token first.
PROMPT = [256 + 3] + list(b"def add(a, b):\n    return")[:19]

# Positions whose logits the fixture keeps: the first four (inside the convolution's window
# of 4), and on to the last.
POSITIONS = [0, 1, 2, 3, 4, 9, 14, 19]

# (name, config, dtype the float tensors are cast to, (group_size, bits) or None). The
# mixture is f32 only: mlx-lm 0.32.2's quantized experts call mx.gather_qmm with a
# `global_scale` that mlx 0.32.2 does not take, and MLX's CPU gather_mm is f32 only.
VARIANTS = [
    ("f32", CONFIG, "float32", None),
    ("bf16-q4", CONFIG, "bfloat16", (64, 4)),
    ("bf16-q8", CONFIG, "bfloat16", (64, 8)),
    ("moe-f32", MOE_CONFIG, "float32", None),
    ("next-f32", NEXT_CONFIG, "float32", None),
]


def fnv1a64(s: str) -> int:
    h = 0xCBF29CE484222325
    for b in s.encode():
        h = ((h ^ b) * 0x100000001B3) & MASK
    return h


def lcg_uniform(seed: int, n: int) -> np.ndarray:
    """The engine's `Lcg::next_f32`, n times: uniform(-1, 1) as float32."""
    out = np.empty(n, dtype=np.float32)
    s = seed
    for i in range(n):
        s = (s * 6364136223846793005 + 1442695040888963407) & MASK
        out[i] = np.float32(s >> 40) / np.float32(1 << 24) * np.float32(2.0) - np.float32(1.0)
    return out


def scale_and_center(name: str, shape) -> tuple:
    """How a tensor's values spread: norms about 1, A_log about 0.5 (decay rates exp(A_log)
    of 0.6..4.5), dt_bias about 0, matrices 1.7 / sqrt(fan-in)."""
    if name.endswith("norm.weight"):
        return 0.2, 1.0
    if name.endswith("A_log"):
        return 1.0, 0.5
    if name.endswith("dt_bias"):
        return 1.0, 0.0
    if name.endswith("embed_tokens.weight"):
        return 1.0, 0.0
    if name.endswith("conv1d.weight"):
        return 0.5, 0.0
    fan_in = shape[-1]
    return float(np.float32(1.7) / np.sqrt(np.float32(fan_in))), 0.0


def values(name: str, shape, scale: float, center: float) -> np.ndarray:
    n = int(np.prod(shape))
    u = lcg_uniform(SEED ^ fnv1a64(name), n)
    return (np.float32(center) + np.float32(scale) * u).reshape(shape)


def build(config: dict, dtype: str, quantization):
    config = copy.deepcopy(config)
    arch = {"qwen3_5": qwen3_5, "qwen3_5_moe": qwen3_5_moe, "qwen3_next": qwen3_next}[config["model_type"]]
    model = arch.Model(arch.ModelArgs.from_dict(copy.deepcopy(config)))
    tensors = []
    weights = []
    for name, p in sorted(tree_flatten(model.parameters())):
        shape = list(p.shape)
        scale, center = scale_and_center(name, shape)
        tensors.append({"name": name, "shape": shape, "scale": scale, "center": center})
        weights.append((name, mx.array(values(name, shape, scale, center))))
    model.load_weights(weights, strict=True)
    if dtype != "float32":
        # As mlx-lm's convert casts: every float parameter but A_log.
        target = getattr(mx, dtype)
        keep = model.language_model.cast_predicate
        model.update(
            tree_map_with_path(
                lambda path, x: x.astype(target) if keep(path) and mx.issubdtype(x.dtype, mx.floating) else x,
                model.parameters(),
            )
        )
    if quantization is not None:
        group_size, bits = quantization
        model, config = quantize_model(model, config, group_size, bits)
    mx.eval(model.parameters())
    return model, config, tensors


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(__file__), "..", "tests", "data", "qwen35-reference.json"
    )
    variants = []
    for name, config, dtype, quantization in VARIANTS:
        model, config, tensors = build(config, dtype, quantization)
        with tempfile.TemporaryDirectory() as d:
            save_model(Path(d), model, donate_model=True)
            save_config(config, config_path=Path(d) / "config.json")
            saved = {}
            for f in sorted(Path(d).glob("*.safetensors")):
                saved.update(mx.load(str(f)))
            layout = [
                {"name": k, "shape": list(v.shape), "dtype": str(v.dtype).removeprefix("mlx.core.")}
                for k, v in sorted(saved.items())
            ]
            config_text = (Path(d) / "config.json").read_text()
            reloaded, _ = load_model(Path(d))
        logits = reloaded(mx.array([PROMPT])).astype(mx.float32)
        mx.eval(logits)
        # 8 significant digits: f32's precision, far below any tolerance that compares them.
        rows = [[float(f"{x:.8g}") for x in np.array(logits[0, p]).tolist()] for p in POSITIONS]
        spread = float(np.std(np.array(logits)))
        print(f"{name}: {len(layout)} tensors saved, logits std {spread:.3f}", file=sys.stderr)
        variants.append(
            {
                "name": name,
                "dtype": dtype,
                "quantization": None
                if quantization is None
                else {"group_size": quantization[0], "bits": quantization[1]},
                "config_json": json.loads(config_text),
                "tensors": tensors,
                "saved": layout,
                "logits": rows,
            }
        )
    fixture = {
        "generator": "scripts/gen_qwen35_reference.py",
        "mlx": importlib.metadata.version("mlx"),
        "mlx_lm": importlib.metadata.version("mlx-lm"),
        "seed": SEED,
        "prompt": PROMPT,
        "positions": POSITIONS,
        "variants": variants,
    }
    with open(out_path, "w") as f:
        json.dump(fixture, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {out_path}", file=sys.stderr)


if __name__ == "__main__":
    main()
