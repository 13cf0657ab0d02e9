#!/usr/bin/env python3
"""Why a compiled decode step built from our ops is slower than torch's when every op routes to torch (GPU).

    python bench/suite/traced_sdpa.py [--rounds 7]

The decoder-block suite reuses one compiled layer per model across its cases, so Dynamo's automatic dynamic shapes
make B and the cache length symbolic. Traced that way, gen's graph equals torch's but for its SDPA call, which
generated.attention traces inside `sdpa_kernel(FLASH)` (the varying-length table's backend: SDPA's own choice can
take cuDNN, which sets up per new length) where torch's block traces SDPA's own choice. This times, per decode case,
the compiled step (block.interleaved_ms, the suite's timing: loops of back-to-back steps of >= 20 ms in turn, median
of rounds) of torch, of gen, and of gen with that SDPA call traced as SDPA's own choice (`_traced_provider` patched
for the run).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from bench.suite import block as suite_block  # noqa: E402
from bench.suite import cases as suite  # noqa: E402
from bench.suite import run as suite_run  # noqa: E402

# (timed case, the case run first so that its B and Lk differ: both become symbolic)
PAIRS = (("llama3-8b/block/decode/B8-Lk8192", "llama3-8b/block/decode/B1-Lk1024"),
         ("llama3-8b/block/decode/B1-Lk8192", "llama3-8b/block/decode/B8-Lk1024"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=suite_block.ROUNDS)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("traced_sdpa.py needs a CUDA GPU", file=sys.stderr)
        return 2
    import generated.attention as att

    env = suite_run.Env(argparse.Namespace(smoke=False, time_budget=None, with_triton=False))
    bench = suite_block.Block()
    cases = {c["id"]: c for c in suite.block_cases()}
    traced = att._traced_provider
    own_choice = lambda *a: "sdpa" if traced(*a) == "sdpa-flash" else traced(*a)   # noqa: E731
    for timed, first in PAIRS:
        model, inputs = bench._inputs(env, cases[timed])
        _, first_inputs = bench._inputs(env, cases[first])
        steps = {}
        for name, impl, provider in (("torch", "torch", traced), ("gen", "gen", traced),
                                     ("gen, SDPA's own choice", "gen", own_choice)):
            layer = torch.compile(suite_run.fresh(suite_block.make_block(model, impl, "decode")), fullgraph=True)

            def step(layer=layer, provider=provider):
                att._traced_provider = provider   # Dynamo guards on this global: set it for each compiled step
                return layer(*inputs)
            att._traced_provider = provider
            layer(*first_inputs)
            att._SEEN_LENGTHS.clear()
            for _ in range(5):
                step()
            steps[name] = step
        times = suite_block.interleaved_ms(steps, torch.cuda.synchronize, args.rounds)
        att._traced_provider = traced
        print(timed, {name: round(ms, 4) for name, ms in times.items()}, "ms/step", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
