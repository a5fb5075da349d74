#!/usr/bin/env python3
"""Generate tests/data/dequant_blocks.json: GGUF blocks + the floats the PyPI `gguf` package decodes them to.

The Rust tests in crates/laya-engine/src/load/dequant.rs and crates/laya-engine/src/load/gguf.rs compare laya's
dequantization against this file, so the expected values come from an independent
implementation (gguf-py's numpy `gguf.quants.dequantize`), not from laya itself.

How to run (from the repository root; needs the 0.5B model, `laya models fetch` or
../shared/models/fetch-models.sh puts it in ~/.cache/laya/models):

    python3 -m venv /tmp/gguf-venv
    /tmp/gguf-venv/bin/pip install gguf==0.19.0 numpy
    /tmp/gguf-venv/bin/python scripts/gen_dequant_fixture.py \
        [MODEL.gguf] [OUT.json]

Defaults: MODEL = ${LAYA_MODEL_DIR:-~/.cache/laya/models}/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf,
OUT = tests/data/dequant_blocks.json. The output is deterministic (fixed seed); it takes
~1 min on the 2-core CI machine (output.weight is 136M values) and < 1.5 GiB of memory.

Contents:
- "blocks": per entry a ggml type, where the bytes came from (blocks of a real tensor of the
  0.5B model, or seeded random bytes with sane f16 scales), the raw bytes (hex) and the
  expected f32 values as little-endian bit patterns (hex, 8 chars per value), so the Rust
  test can compare bit for bit.
- "tensors": whole-tensor checksums of a few real tensors: sum and sum of squares (f64),
  the exact first/last 8 values, and two exact order-sensitive integer checksums over the
  f32 bit patterns (sum of bits, and sum of (index+1)*bits, both mod 2^64).
"""
import importlib.metadata
import json
import os
import sys

import numpy as np
from gguf import GGUFReader, GGMLQuantizationType as T
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

SEED = 20240607

model_dir = os.environ.get("LAYA_MODEL_DIR", os.path.expanduser("~/.cache/laya/models"))
MODEL = sys.argv[1] if len(sys.argv) > 1 else os.path.join(model_dir, "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
OUT = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(__file__), "..", "tests", "data", "dequant_blocks.json")

# Real tensors of the 0.5B model to take blocks from: (type, tensor, block indices).
REAL_BLOCKS = [
    (T.Q4_K, "blk.2.ffn_down.weight", [0, 1, 4321, -1]),
    (T.Q5_0, "blk.0.attn_q.weight", [0, 1, 2, 3, 777, 12345, 20000, -1]),
    (T.Q6_K, "blk.0.ffn_down.weight", [0, 1, 9000, -1]),
    (T.Q8_0, "output.weight", [0, 1, 2, 1000000, 4000000, -1]),
    (T.Q8_0, "blk.0.attn_v.weight", [0, 3, 100, -1]),
    (T.F32, "blk.0.attn_norm.weight", list(range(0, 48))),
    (T.F32, "blk.0.attn_q.bias", list(range(0, 16))),
]

# Types to cover with random bytes (all types laya dequantizes), number of blocks each.
RANDOM_BLOCKS = [
    (T.Q4_0, 12), (T.Q4_1, 8), (T.Q5_0, 8), (T.Q5_1, 8), (T.Q8_0, 8),
    (T.Q4_K, 3), (T.Q5_K, 4), (T.Q6_K, 3),
]

# Whole tensors to checksum.
TENSORS = ["blk.0.ffn_down.weight", "blk.0.attn_q.weight", "output.weight", "blk.2.ffn_down.weight",
           "blk.0.attn_norm.weight"]


def compact(idxs: list) -> str:
    """[0, 1, 2, 3] -> '0..=3'; other lists as written."""
    if len(idxs) > 4 and idxs == list(range(idxs[0], idxs[-1] + 1)):
        return f"{idxs[0]}..={idxs[-1]}"
    return str(idxs)


def f32_hex(values: np.ndarray) -> str:
    return np.ascontiguousarray(values, dtype=np.float32).view(np.uint8).tobytes().hex()


def dequant(raw: np.ndarray, qtype: T) -> np.ndarray:
    return np.asarray(quants.dequantize(raw, qtype), dtype=np.float32).reshape(-1)


def sane_f16(rng: np.random.Generator, n: int, lo: float, hi: float, signed: bool) -> np.ndarray:
    mag = rng.uniform(lo, hi, size=n)
    if signed:
        mag *= rng.choice([-1.0, 1.0], size=n)
    return mag.astype(np.float16)


def random_blocks(rng: np.random.Generator, qtype: T, n_blocks: int) -> np.ndarray:
    _, type_size = GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    # Overwrite the f16 scale fields with finite, realistic values (random bytes could be NaN/Inf).
    d = sane_f16(rng, n_blocks, 1e-4, 0.2, signed=True).view(np.uint8).reshape(n_blocks, 2)
    m = sane_f16(rng, n_blocks, 1e-4, 0.2, signed=False).view(np.uint8).reshape(n_blocks, 2)
    if qtype in (T.Q4_0, T.Q5_0, T.Q8_0):
        b[:, 0:2] = d
    elif qtype in (T.Q4_1, T.Q5_1, T.Q4_K, T.Q5_K):
        b[:, 0:2] = d   # d (Q4_1/Q5_1), d (K-quants)
        b[:, 2:4] = m   # m (Q4_1/Q5_1), dmin (K-quants)
    elif qtype == T.Q6_K:
        b[:, type_size - 2:] = d  # d is the last field of block_q6_K
    else:
        raise ValueError(qtype)
    return b


def special_f16() -> np.ndarray:
    bits = [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x3C00, 0xBC00, 0x7BFF, 0xFBFF,
            0x7C00, 0xFC00, 0x3555, 0x0200, 0x1234, 0xC000]
    return np.array(bits, dtype=np.uint16)


def special_bf16() -> np.ndarray:
    bits = [0x0000, 0x8000, 0x0001, 0x8001, 0x007F, 0x0080, 0x3F80, 0xBF80, 0x7F7F, 0xFF7F,
            0x7F80, 0xFF80, 0x3EAB, 0x4049, 0x1234, 0xC000]
    return np.array(bits, dtype=np.uint16)


def main() -> None:
    rng = np.random.default_rng(SEED)
    r = GGUFReader(MODEL)
    tensors = {t.name: t for t in r.tensors}
    entries = []

    for qtype, name, idxs in REAL_BLOCKS:
        t = tensors[name]
        assert t.tensor_type == qtype, (name, t.tensor_type, qtype)
        _, type_size = GGML_QUANT_SIZES[qtype]
        raw = np.asarray(t.data).reshape(-1).view(np.uint8)
        n_blocks = raw.size // type_size
        idxs = [i % n_blocks for i in idxs]
        data = np.concatenate([raw[i * type_size:(i + 1) * type_size] for i in idxs])
        out = dequant(data, qtype)
        entries.append(dict(type=qtype.name, type_id=int(qtype), origin=f"{name} blocks {compact(idxs)}",
                            n_elements=int(out.size), data_hex=data.tobytes().hex(), expected_f32_hex=f32_hex(out)))

    for qtype, n_blocks in RANDOM_BLOCKS:
        data = random_blocks(rng, qtype, n_blocks).reshape(-1)
        out = dequant(data, qtype)
        entries.append(dict(type=qtype.name, type_id=int(qtype), origin=f"random bytes (seed {SEED}), sane f16 scales",
                            n_elements=int(out.size), data_hex=data.tobytes().hex(), expected_f32_hex=f32_hex(out)))

    # F16 / BF16: edge values (zeros, subnormals, max, inf) plus random finite values.
    f16 = np.concatenate([special_f16(), rng.normal(0, 2, size=48).astype(np.float16).view(np.uint16)])
    bf16 = np.concatenate([special_bf16(),
                           (rng.normal(0, 2, size=48).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)])
    for qtype, vals in ((T.F16, f16), (T.BF16, bf16)):
        data = vals.astype("<u2").view(np.uint8)
        out = dequant(data, qtype)
        entries.append(dict(type=qtype.name, type_id=int(qtype), origin=f"edge values + random (seed {SEED})",
                            n_elements=int(out.size), data_hex=data.tobytes().hex(), expected_f32_hex=f32_hex(out)))

    sums = []
    for name in TENSORS:
        t = tensors[name]
        x = dequant(np.asarray(t.data), t.tensor_type)
        n = x.size
        assert n == int(np.prod([int(d) for d in t.shape])), name
        x64 = x.astype(np.float64)
        bits = x.view(np.uint32)
        bits_sum = np.uint64(0)
        weighted = np.uint64(0)
        chunk = 1 << 22
        with np.errstate(over="ignore"):
            for s in range(0, n, chunk):
                b = bits[s:s + chunk].astype(np.uint64)
                bits_sum += b.sum(dtype=np.uint64)
                weighted += (b * np.arange(s + 1, s + 1 + b.size, dtype=np.uint64)).sum(dtype=np.uint64)
        sums.append(dict(name=name, type=t.tensor_type.name, dims=[int(d) for d in t.shape], n_elements=int(n),
                         sum=float(x64.sum()), sum_sq=float((x64 * x64).sum()),
                         first8_f32_hex=f32_hex(x[:8]), last8_f32_hex=f32_hex(x[-8:]),
                         bits_sum_u64=int(bits_sum), bits_weighted_sum_u64=int(weighted)))
        del x, x64, bits

    doc = dict(
        generator=dict(script="scripts/gen_dequant_fixture.py", gguf_py=importlib.metadata.version("gguf"),
                       numpy=np.__version__, model=os.path.basename(MODEL), seed=SEED),
        blocks=entries,
        tensors=sums,
    )
    with open(OUT, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"wrote {OUT}: {len(entries)} block entries, {len(sums)} tensor checksums, {os.path.getsize(OUT)} bytes")


if __name__ == "__main__":
    main()
