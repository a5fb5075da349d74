#!/usr/bin/env python3
"""The llama.cpp side of `laya bench engine`, on the CPU, through llama-cpp-python.

    $(scripts/peer-setup.sh | tail -1) scripts/bench_llama_cpp.py MODEL.gguf \
        [--threads 2] [--prefill 128,512,2048] [--decode 32] [--label NAME] [--bandwidth GBS]

Prints one JSON object per line with the keys of laya's rows (src/bench/engine.rs), measured the
same way: load_s = Llama(...) construction (mmap); prefill = one llama_decode of n random
plain-text ids (laya's generator and seeds) after clearing the KV cache, logits of the last
position only, after a 16-token warm-up; decode = a 128-token random prompt, then greedy tokens
one llama_decode each, ms per token excluding the first (which comes from the prompt's logits);
weight_bytes_per_token = GGUF tensor bytes minus token_embd.weight plus one row of it (all of it
when there is no output.weight); bandwidth = --bandwidth or a 256 MiB copy (2 * n / best time).

llama.cpp's defaults are kept. On a CPU shared with other work its OpenMP threads spin at
every barrier and a descheduled thread stalls the rest: there OMP_WAIT_POLICY=PASSIVE (or
--threads 1) is faster, but neither is what llama.cpp does by default.
"""

import argparse
import json
import math
import mmap
import struct
import sys
import time
from pathlib import Path

try:
    import numpy as np
    import llama_cpp
    from llama_cpp import Llama
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
except ImportError as e:
    sys.exit(
        f"bench_llama_cpp: cannot import llama_cpp/gguf ({e}); run scripts/peer-setup.sh and use "
        "the python it prints"
    )


def random_ids(n, seed):
    """laya's `random_ids` (src/bench/engine.rs): an LCG, ids below Qwen's special tokens."""
    m = (1 << 64) - 1
    x = (seed * 6364136223846793005 + 1) & m
    ids = []
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) & m
        ids.append((x >> 33) % 150_000)
    return ids


def host_copy_bandwidth_gbs():
    n = 256 << 20
    src = np.ones(n, dtype=np.uint8)
    dst = np.zeros(n, dtype=np.uint8)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    return 2.0 * n / best / 1e9


def gguf_tensor_bytes(path):
    """{name: bytes} of a GGUF file's tensors, read from its header (gguf's GGUFReader takes
    ~15 s on these files because it decodes the whole tokenizer)."""
    with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, buf, pos)
        pos += struct.calcsize("<" + fmt)
        return v[0] if len(v) == 1 else v

    def string():
        nonlocal pos
        n = take("Q")
        pos += n
        return bytes(buf[pos - n : pos]).decode()

    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def skip(t):
        nonlocal pos
        if t == 8:
            n = take("Q")  # (not `pos += take(...)`: that reads pos before take moves it)
            pos += n
        elif t == 9:
            et, n = take("I"), take("Q")
            if et in scalar:
                pos += n * struct.calcsize(scalar[et])
            else:
                for _ in range(n):
                    skip(et)
        else:
            pos += struct.calcsize(scalar[t])

    magic, _version, n_tensors, n_kv = take("4sIQQ")
    if magic != b"GGUF":
        sys.exit(f"bench_llama_cpp: {path} is not a GGUF file")
    for _ in range(n_kv):
        string()
        skip(take("I"))
    sizes = {}
    for _ in range(n_tensors):
        name = string()
        n_dims = take("I")
        dims = struct.unpack_from(f"<{n_dims}Q", buf, pos)  # ne0 (row length) first
        pos += 8 * n_dims
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(take("I"))]
        take("Q")  # offset
        n = math.prod(dims)
        sizes[name] = (n // block * type_size, n // dims[0])  # (bytes, rows)
    return sizes


def weight_bytes_per_token(path):
    sizes = gguf_tensor_bytes(path)
    total = sum(b for b, _ in sizes.values())
    if "output.weight" not in sizes:  # tied: the whole embedding is read as the LM head
        return total
    embd, rows = sizes["token_embd.weight"]
    return total - embd + embd // rows


def last_logits(llm):
    return np.ctypeslib.as_array(
        llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),)
    )


def prefill_time(llm, n):
    ids = random_ids(n, n)
    llm.reset()  # n_tokens = 0; eval() then drops the whole KV cache
    t = time.perf_counter()
    llm.eval(ids)  # one llama_decode (n <= n_batch = n_ubatch), logits of the last position only
    return time.perf_counter() - t


def decode_ms(llm, tokens):
    llm.reset()
    llm.eval(random_ids(128, 7))
    y = int(np.argmax(last_logits(llm)))  # the first token, from the prompt
    t = time.perf_counter()
    for _ in range(tokens - 1):
        llm.eval([y])
        y = int(np.argmax(last_logits(llm)))
    return (time.perf_counter() - t) * 1e3 / (tokens - 1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model", help="GGUF file")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prefill", default="128,512,2048", help="prompt lengths, comma-separated")
    p.add_argument("--decode", type=int, default=32, help="tokens to decode (>= 2)")
    p.add_argument("--label", help="model label in the row (default: the file name)")
    p.add_argument("--bandwidth", type=float, help="memory bandwidth in GB/s (default: measured)")
    a = p.parse_args()
    prefill = [int(x) for x in a.prefill.split(",") if x]
    if a.decode < 2 or not prefill or min(prefill) < 1:
        p.error("--decode must be >= 2 and --prefill lengths >= 1")
    if not Path(a.model).is_file():
        p.error(f"no such file: {a.model}")

    bandwidth = a.bandwidth or host_copy_bandwidth_gbs()
    n_batch = max(2048, *prefill)
    t = time.perf_counter()
    llm = Llama(
        model_path=a.model,
        n_ctx=max(n_batch, 128 + a.decode) + 64,
        n_batch=n_batch,
        n_ubatch=n_batch,
        n_threads=a.threads,
        n_threads_batch=a.threads,
        use_mmap=True,
        logits_all=False,
        n_gpu_layers=0,
        verbose=False,
    )
    load_s = time.perf_counter() - t
    # Warm-up, as laya does.
    prefill_time(llm, 16)
    decode_ms(llm, 4)
    prefill_tok_s = [[n, n / prefill_time(llm, n)] for n in prefill]
    decode = decode_ms(llm, a.decode)
    nbytes = weight_bytes_per_token(a.model)
    floor = nbytes / (bandwidth * 1e9) * 1e3
    row = {
        "model": a.label or Path(a.model).stem,
        "synthetic": False,
        "device": f"cpu (llama.cpp, {a.threads} threads)",
        "precision": "gguf",
        "load_s": load_s,
        "prefill_tok_s": prefill_tok_s,
        "decode_ms_per_token": decode,
        "weight_bytes_per_token": nbytes,
        "bandwidth_gbs": bandwidth,
        "floor_ms_per_token": floor,
        "share_of_floor": floor / decode,
    }
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
