#!/usr/bin/env python3
"""Which calls of gen's decoder block stay our custom ops when torch.compile traces it (CPU, no GPU needed).

    python bench/suite/traced_ops.py                       # Llama-3-8B prefill: B1 L2048, B1 L512, B4 L2048
    python bench/suite/traced_ops.py --model qwen2.5-7b --steps 1x2048,1x512
    python bench/suite/traced_ops.py --mode decode --steps 8x8192,1x1024,64x32768   # BxLk, static caches

The suite's block (bench/suite/block.py) built from our ops, compiled with fullgraph=True on meta tensors with a
backend that records each graph's calls, for steps taken in turn as the suite takes a model's cases (one compiled
layer serves them, so from the second shape on the token count or batch is symbolic; a decode step's cache length is
marked static, as block.static_cache marks it). The dispatch is the committed
table of an sm90 device with 132 SMs (the H100's), read at trace time as on the GPU. An op of ours left in a compiled
graph costs its custom-op dispatch and launch path on the host; this shows where the traced table leaves one.
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.suite import block as suite_block  # noqa: E402
from bench.suite.models import MODELS  # noqa: E402
from bench.suite.trace_overhead import decide_on_meta_as_sm90, decode_step_args, meta_weights  # noqa: E402

WATCHED = ("gen.", "linear", "addmm", "mm", "scaled_dot_product_attention")


def traced_calls(model, mode: str, steps: list[tuple[int, int]]) -> list[list[str]]:
    """Per step, the names of the GEMM and attention calls of the compiled graph that serves it (the step's own
    where it recompiled, else the latest one)."""
    graphs = []

    def recording_backend(gm, example_inputs):
        graphs.append([str(n.target) for n in gm.graph.nodes if n.op == "call_function"
                       and any(w in str(n.target) for w in WATCHED)])
        return gm.forward

    weights = meta_weights(model)
    torch._dynamo.reset()
    step = torch.compile(suite_block.make_block(model, "gen", mode), backend=recording_backend, fullgraph=True)
    served = []
    with torch.no_grad():
        for batch, length in steps:
            if mode == "decode":   # one new token against a static cache of `length`, as the suite runs it
                args = decode_step_args(model, weights, batch, length, static=True)
            else:
                x = torch.empty(batch, length, model.hidden, dtype=torch.bfloat16, device="meta")
                cos = torch.empty(length, 1, model.head_dim, dtype=torch.bfloat16, device="meta")
                args = (weights, x, cos, cos)
            step(*args)
            served.append(graphs[-1])
    return served


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama3-8b", choices=sorted(MODELS))
    parser.add_argument("--mode", default="prefill", choices=("prefill", "decode"))
    parser.add_argument("--steps", help="BxL prefill steps or BxLk decode steps, compiled in turn (default: the "
                                        "suite's Llama-3-8B prefill lengths, or three of its decode steps)")
    args = parser.parse_args()
    decide_on_meta_as_sm90()
    default = "1x2048,1x512,4x2048" if args.mode == "prefill" else "8x8192,1x1024,64x32768"
    steps = [tuple(int(v) for v in s.split("x")) for s in (args.steps or default).split(",")]
    length = "L" if args.mode == "prefill" else "Lk"
    for (batch, n), calls in zip(steps, traced_calls(MODELS[args.model], args.mode, steps)):
        ours = [c for c in calls if c.startswith("gen.")]
        print(f"{args.model} {args.mode} B{batch} {length}{n}: {len(ours)} op(s) of ours in the graph; calls: "
              + ", ".join(c.split(" of ")[0].replace("<built-in method ", "").replace("<built-in function ", "")
                          .rstrip(">") for c in calls))


if __name__ == "__main__":
    main()
