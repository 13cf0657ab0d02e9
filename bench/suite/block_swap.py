#!/usr/bin/env python3
"""Where an eager decode block built from our ops loses host time, located by swapping one part at a time (GPU).

    python bench/suite/block_swap.py      # writes $OUT/block-swap.json (or /tmp/block-swap.json)

Timing each op alone, in a loop of its own, misleads: there the GPU is the bottleneck of many ops (a decode weight
read of 30 us hides a 3 us wrapper), and a tight loop runs Python about 3x faster than a step does between other ops.
Here every figure is taken inside the running block, where the step is host-bound (an eager decode step takes 2-4x
its CUDA-graph replay):
- step_us: the block built as torch, gen, gen-linear (our linears, SDPA), gen-attention (F.linear, our attention)
  and torch again (the noise floor of a comparison), timed as the suite times providers (run.interleaved_call_ms:
  loops of >= 20 ms, in turn in a new order each round, median of ROUNDS); with the garbage collector on (what a
  user sees) and off;
- op_us: each linear and the attention timed in place (host clock around the call, no synchronization: the host
  time of issuing it), median over the steps of the probed loops, per position in the block;
- for two cases, the same under torch.compile (torch, torch again, gen: same graph when the table picks torch).
Committed result: bench/results/block-swap-h200.json.
"""
from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from bench.suite import block as suite_block  # noqa: E402
from bench.suite import run as suite_run  # noqa: E402
from bench.suite.models import MODELS  # noqa: E402

CASES = (("llama3-8b", 8, 1024), ("mistral-7b", 8, 4096), ("qwen2.5-7b", 8, 8192), ("llama3-8b", 64, 1024))
COMPILED_CASES = 2          # the first cases also timed under torch.compile
VARIANTS = ("torch", "gen", "gen-linear", "gen-attention", "torch-again")
OPS = ("qkv", "attention", "o", "gate", "up", "down")   # the order the block calls them in
ROUNDS = 11


def step_us(fns: dict, collect: bool) -> dict:
    """us per step of each fn (the suite's interleaved timing), with the garbage collector on or off."""
    (gc.enable if collect else gc.disable)()
    try:
        ms = suite_block.interleaved_ms(fns, torch.cuda.synchronize, ROUNDS)
    finally:
        gc.enable()
    return {k: round(v * 1e3, 1) for k, v in ms.items()}


def probed(model, impl: str, args: tuple):
    """(step fn, per-op host times in ns): the block with each linear and the attention timed where it runs."""
    log: list = []

    def wrap(_name, fn):
        def timed(*a, **kw):
            t = time.perf_counter_ns()
            out = fn(*a, **kw)
            log.append(time.perf_counter_ns() - t)
            return out
        return timed
    block = suite_block.make_block(model, impl, "decode", wrap=wrap)
    return (lambda: block(*args)), log


def op_medians(log: list) -> dict:
    per = [log[i::len(OPS)] for i in range(len(OPS))]
    return {op: round(statistics.median(v) / 1e3, 2) for op, v in zip(OPS, per)}


def main() -> None:
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev)
    gen.manual_seed(0)
    rows = []
    for i, (name, bsz, lk) in enumerate(CASES):
        model = MODELS[name]
        args = suite_block.decode_inputs(model, suite_block.block_weights(model, dev, gen), bsz, lk, dev, gen)
        with torch.no_grad():
            ref = suite_block.make_block(model, "torch", "decode")(*args)
            plain = {v: (lambda b=suite_block.make_block(model, v.replace("-again", ""), "decode"): b(*args))
                     for v in VARIANTS}
            errs = {v: suite_run.rel_err(fn(), ref) for v, fn in plain.items()}
            errs = {v: None if e is None else float(f"{e:.3g}") for v, e in errs.items()}   # None: not finite
            row = {"case": f"{name} decode B{bsz} Lk{lk}", "rel_err": errs,
                   "step_us": step_us(plain, collect=True), "step_us_gc_off": step_us(plain, collect=False)}
            probes = {v: probed(model, v, args) for v in ("torch", "gen")}
            for fn, log in probes.values():
                fn()
                log.clear()
            row["probed_step_us"] = step_us({v: p[0] for v, p in probes.items()}, collect=False)
            row["op_us"] = {v: op_medians(p[1]) for v, p in probes.items()}
            if i < COMPILED_CASES:
                compiled = {}
                for v in ("torch", "torch-again", "gen"):
                    fn = torch.compile(suite_run.fresh(suite_block.make_block(model, v.replace("-again", ""),
                                                                              "decode")), fullgraph=True)
                    fn(*args)
                    compiled[v] = lambda fn=fn: fn(*args)
                row["compile_step_us"] = step_us(compiled, collect=True)
        print(json.dumps(row), flush=True)
        rows.append(row)
    out = Path(os.environ.get("OUT", "/tmp")) / "block-swap.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "device": torch.cuda.get_device_name(0),
        "versions": {"torch": torch.__version__, "triton": __import__("triton").__version__},
        "command": "python bench/suite/block_swap.py",
        "method": __doc__.split("\n\n", 2)[2].rsplit("Committed result", 1)[0].strip(),
        "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
