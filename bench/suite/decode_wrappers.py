#!/usr/bin/env python3
"""What the generated ops' Python wrappers cost an eager decode step, per op (GPU).

    python bench/suite/decode_wrappers.py              # prints one line per case and grad mode
    python bench/suite/decode_wrappers.py --compiled   # torch.compile'd steps, with and without guard evaluation

A Llama-3-8B decoder block's decode step (bench/suite/block.py) built four ways: torch, gen, gen-linear (our
linears, SDPA) and gen-attention (F.linear, our attention). Where the dispatch sends every op of the step to torch
(the H100 and H200 tables do for these cases), the kernels are the same and the differences are the wrappers' host
time inside a host-bound step. Timing: 200 steps a loop, synchronized before and after, the four builds in turn,
reversed every other round, median of 11 rounds; under no_grad and with grad enabled. bench/suite/block_swap.py
times each op in place instead. Results: bench/NOTES.md ("Host time per call and the eager decode block").
"""
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.suite import block as suite_block  # noqa: E402
from bench.suite.models import MODELS  # noqa: E402

IMPLS = ("torch", "gen", "gen-linear", "gen-attention")
CASES = ((8, 1024), (1, 8192))   # (batch, KV cache length)
ROUNDS, STEPS = 11, 200


def step_us(steps: dict, args: tuple) -> dict:
    """Median us a step of each build: warmed up, then STEPS steps a loop, synchronized before and after, the builds
    in turn, reversed every other round, ROUNDS rounds."""
    for step in steps.values():
        for _ in range(30):
            step(*args)
    torch.cuda.synchronize()
    times = {v: [] for v in steps}
    for rnd in range(ROUNDS):
        for v in steps if rnd % 2 == 0 else reversed(steps):
            t = time.perf_counter()
            for _ in range(STEPS):
                steps[v](*args)
            torch.cuda.synchronize()
            times[v].append((time.perf_counter() - t) / STEPS * 1e6)
    return {v: statistics.median(ts) for v, ts in times.items()}


def report(label: str, med: dict) -> None:
    print(f"{label}: " + "  ".join(f"{v} {m:.1f}" for v, m in med.items()) +
          f"  | torch/gen {med['torch'] / med['gen']:.3f}  (us a step, {torch.cuda.get_device_name(0)})", flush=True)


def compiled(model, weights, dev, gen) -> None:
    """torch.compile'd decode steps (static cache, a fresh code object per build): torch against gen, timed as
    above, under Dynamo's default stance and with guard evaluation skipped (torch.compiler.set_stance(
    skip_guard_eval_unsafe=True): only the guards that tell cache entries apart run), which shows how much of a
    difference is the guards the wrappers' traced checks add."""
    from bench.suite import run as suite_run

    for bsz, lk in CASES:
        args = suite_block.static_cache(suite_block.decode_inputs(model, weights, bsz, lk, dev, gen))
        steps = {v: torch.compile(suite_run.fresh(suite_block.make_block(model, v, "decode")), fullgraph=True)
                 for v in ("torch", "gen")}
        with torch.no_grad():
            for skip in (False, True):
                with torch.compiler.set_stance(skip_guard_eval_unsafe=skip):
                    report(f"B{bsz} Lk{lk} compiled{', guards skipped' if skip else ''}", step_us(steps, args))


def main() -> None:
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev)
    gen.manual_seed(0)
    model = MODELS["llama3-8b"]
    weights = suite_block.block_weights(model, dev, gen)
    if "--compiled" in sys.argv[1:]:
        return compiled(model, weights, dev, gen)
    for bsz, lk in CASES:
        args = suite_block.decode_inputs(model, weights, bsz, lk, dev, gen)
        blocks = {v: suite_block.make_block(model, v, "decode") for v in IMPLS}
        for mode in ("no_grad", "grad"):
            with torch.no_grad() if mode == "no_grad" else torch.enable_grad():
                report(f"B{bsz} Lk{lk} {mode}", step_us(blocks, args))


if __name__ == "__main__":
    main()
