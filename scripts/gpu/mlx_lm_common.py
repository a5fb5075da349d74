"""What the mlx-lm peer benches share (bench_mlx_lm_moe.py, bench_qwen35_mlx_lm.py): mlx-lm's
package entered without running its __init__ (which imports the converter and tokenizers, that
is transformers; the model code and the decode loop need neither), and the measurements, made
as laya's engine bench makes its own:

  prefill  a forward of N random ids on a fresh cache, logits evaluated;
  decode   mlx-lm's own loop (`generate_step`, greedy, the next step queued before the current
           token is read) after a 128-token prompt: the mean time a token after the first;
  ops      the primitives of one decode step's graph (mlx-lm's `_step`: the forward,
           log-softmax and argmax), by name, counted before evaluation (MLX's export_to_dot).

Each takes `ids(n, seed)`, the bench's random prompt ids (below its vocabulary).
"""
import importlib.util
import os
import re
import sys
import tempfile
import time
import types

import mlx.core as mx


def enter_mlx_lm() -> None:
    """Makes `mlx_lm` importable without running its __init__."""
    spec = importlib.util.find_spec("mlx_lm")
    if spec is None:
        sys.exit("mlx_lm is not installed (carry its wheel: python3 -m pip download mlx-lm)")
    pkg = types.ModuleType("mlx_lm")
    pkg.__path__ = list(spec.submodule_search_locations)
    sys.modules["mlx_lm"] = pkg


enter_mlx_lm()
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402

try:
    from mlx_lm.generate import generate_step  # noqa: E402
except ImportError as e:  # generate.py's imports need transformers
    sys.exit(f"mlx_lm.generate does not import here: {e}")


def random_ids(n: int, seed: int, vocab: int) -> mx.array:
    return mx.random.randint(0, vocab, (n,), key=mx.random.key(seed)).astype(mx.uint32)


def prefill_s(model, n: int, ids) -> float:
    prompt = ids(n, n)
    mx.eval(prompt)
    cache = make_prompt_cache(model)
    t = time.perf_counter()
    logits = model(prompt[None], cache=cache)
    mx.eval(logits)
    return time.perf_counter() - t


VIEWS = {"AsStrided", "Broadcast", "ExpandDims", "Reshape", "Slice", "Split", "Squeeze", "Transpose"}


def decode_step_ops(model, ids) -> dict:
    cache = make_prompt_cache(model)
    mx.eval(model(ids(128, 5)[None], cache=cache))
    step = ids(1, 8)
    mx.eval(step)
    logits = model(step[None], cache=cache)[:, -1, :]
    logprobs = logits - mx.logsumexp(logits, keepdims=True)
    y = mx.argmax(logprobs, axis=-1)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "step.dot")
        mx.export_to_dot(path, y)
        with open(path) as f:
            dot = f.read()
    counts = {}
    for line in dot.splitlines():
        m = re.match(r'\{ \S+ \[label ="([^"]+)", shape=rectangle\]', line)
        if m:  # one line per application of a primitive
            counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return counts


def decode_ms(model, tokens: int, ids) -> float:
    prompt = ids(128, 7)
    mx.eval(prompt)
    stamps = []
    for _ in generate_step(prompt, model, max_tokens=tokens):
        stamps.append(time.perf_counter())
    assert len(stamps) == tokens, len(stamps)
    return (stamps[-1] - stamps[0]) * 1e3 / (len(stamps) - 1)
