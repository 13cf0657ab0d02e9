#!/usr/bin/env python3
"""What a compiled decode step pays Dynamo before its graph runs, torch vs gen (CPU, no GPU needed).

    python bench/suite/trace_overhead.py            # Llama-3-8B decode layer, B 8, cache 1024
    python bench/suite/trace_overhead.py --model qwen2.5-7b

A decoder block's decode step (bench/suite/block.py) built from torch's ops and from ours, compiled with
fullgraph=True on meta tensors with a backend that returns a constant: a call is then Dynamo's frame evaluation and
guard checks alone, the part of a compiled step our wrappers can make dearer than torch's (the graphs are the same
where the dispatch picks torch, as the H100 and H200 tables do for every op of these steps). Two cases: every size
static (one case); a symbolic batch (cases B 8, 1, 64 compiled first, as a server's batches make it; the cache
length marked static as block.static_cache does); a growing cache (lengths Lk, Lk + 1, Lk + 2 unmarked: Dynamo
makes the length symbolic, as a generation loop over a dynamic cache does). The dispatch is the H200's table, read at trace time as on an
sm90 device. Timing: 2000 calls a loop, the best of 25 loops, each build compiled alone (the two blocks share a
code object, so a cache) and timed three times in turn. Prints us a call and the guard tree's lines.
"""
import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import generated.attention as gen_attention  # noqa: E402
import generated.gemm as gen_gemm  # noqa: E402
from bench.suite import block as suite_block  # noqa: E402
from bench.suite.models import MODELS  # noqa: E402

LOOPS, CALLS = 25, 2000


def _constant_backend(gm, example_inputs):
    out = (torch.empty(1, device="meta"),)
    return lambda *args: out


def decide_on_meta_as_sm90() -> None:
    """Make the generated ops decide at trace time as on an sm90 device with 132 SMs (the committed table of that
    key), on meta tensors."""
    for module in (gen_gemm, gen_attention):
        module._RT.device = lambda index: ("sm90", 132)
        module._TRACED_DEVICES = ("cuda", "meta")


def meta_weights(model) -> dict:
    """The block's weights (block.block_weights) as frozen nn.Parameters on the meta device."""
    weights = suite_block.block_weights(model, "cpu", torch.Generator().manual_seed(0))
    return {k: None if v is None else torch.nn.Parameter(v.to("meta"), requires_grad=False)
            for k, v in weights.items()}


def decode_step_args(model, weights, batch: int, cache: int, static: bool) -> tuple:
    """A decode step's arguments on meta tensors, the cache length marked static (block.static_cache) or not."""
    x = torch.empty(batch, 1, model.hidden, dtype=torch.bfloat16, device="meta")
    cos = torch.empty(1, 1, model.head_dim, dtype=torch.bfloat16, device="meta")
    k_cache = torch.empty(batch, model.kv_heads, cache, model.head_dim, dtype=torch.bfloat16, device="meta")
    args = (weights, x, cos, cos, k_cache, k_cache.clone())
    return suite_block.static_cache(args) if static else args


def measure(model, weights, impl: str, steps: tuple, static: bool) -> tuple:
    """(best us a call of the last step's, guard lines of the entry that serves it); steps: (batch, cache) pairs
    compiled in turn, the cache length marked static or not."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    torch._dynamo.reset()
    block = suite_block.make_block(model, impl, "decode")
    step = torch.compile(block, backend=_constant_backend, fullgraph=True)
    with torch.no_grad():
        for b, cache in steps:
            args = decode_step_args(model, weights, b, cache, static)
            step(*args)
        best = float("inf")
        for _ in range(LOOPS):
            t = time.perf_counter()
            for _ in range(CALLS):
                step(*args)
            best = min(best, (time.perf_counter() - t) / CALLS * 1e6)
    entry = _debug_get_cache_entry_list(block.__code__)[0]
    return best, len(str(entry.guard_manager).splitlines())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama3-8b", choices=sorted(MODELS))
    parser.add_argument("--cache", type=int, default=1024, help="KV cache length (static)")
    args = parser.parse_args()
    decide_on_meta_as_sm90()
    model = MODELS[args.model]
    weights = meta_weights(model)
    c = args.cache
    cases = (("static", ((8, c),), True), ("symbolic B", ((8, c), (1, c), (64, c), (8, c)), True),
             ("growing cache", ((8, c), (8, c + 1), (8, c + 2)), False))
    for label, steps, static in cases:
        found = {}
        for impl in ("torch", "gen") * 3:
            us, lines = measure(model, weights, impl, steps, static)
            found[impl] = (min(us, found.get(impl, (us,))[0]), lines)
        (t_us, t_lines), (g_us, g_lines) = found["torch"], found["gen"]
        print(f"{args.model} decode B8 Lk{steps[-1][1]} {label}: torch {t_us:.2f} us ({t_lines} guard lines), "
              f"gen {g_us:.2f} us ({g_lines}); gen - torch {g_us - t_us:+.2f} us a call")


if __name__ == "__main__":
    main()
