#!/usr/bin/env python3
"""Decoder-block benchmark: one transformer layer, implemented with torch ops and with our generated ops on the same
weights, in prefill and decode, eager and compiled.

    python bench/suite/run.py --family block [--subset N | --shard I/N] [--out FILE] [--resume FILE]
                              [--time-budget SECONDS] [--smoke]
    python bench/suite/block.py [same options]

The layer (Llama-3-8B, Qwen2.5-7B, Mistral-7B shapes; cases.block_cases()): h = x + O(attn(rope(QKV(rmsnorm(x))))),
out = h + down(silu(gate(rmsnorm(h))) * up(rmsnorm(h))); bf16 weights [N, K] as nn.Linear stores them (frozen
nn.Parameters, as a model loaded for inference holds them), fused QKV with Qwen2's q/k/v bias, the gate and up
projections as one fused [2I, hidden] weight (gate rows first, as serving stacks store gate_up_proj), GQA. Two
implementations share every line but the linears and the attention:
- torch: F.linear; for the MLP F.linear of the fused weight, then F.silu(gate) * up on its two halves; the residual
  adds after the O and down projections as `x + F.linear(...)`; F.scaled_dot_product_attention(enable_gqa=True)
  (is_causal for prefill; a decode query sees the whole cache, so no mask);
- gen: generated.gemm.linear for every linear (the MLP's as one call, activation="swiglu": both projections and
  silu(gate) * up; the O and down projections with residual=x, the add in their epilogue; the QKV and gate_up
  projections with rms_eps, the RMSNorm before them folded in: its gain in their weights, folded once with the
  weights, and each row's 1 / rms in their epilogue; the QKV projection with rope=(cos, sin), q and k rotated in its
  epilogue) and generated.attention.attention(q, k, v, mod="causal").
Until 2026-12-06 the MLP had separate gate and up weights (torch: two F.linear calls, silu, product; gen: silu fused
into the gate projection), so suite-block results before then time that block; until 2026-12-07 gen's residual adds
were torch adds after its linears, and its RMSNorms torch's (suite v3); until 2026-12-08 its RoPE torch's (suite v5).
Prefill runs B sequences of L tokens. Decode is one step of B sequences: the new token's K/V are written into the last
slot of a preallocated [B, Hkv, Lk, D] cache (Lk fixed per case, so the step is graph-capturable), and its query
attends over the whole cache. The cache is allocated at exactly Lk, so cache[:, :, :Lk] is the contiguous cache itself.

Providers, for each implementation I in torch, gen: I-eager; I-compile (torch.compile fullgraph=True); for decode
I-graph (the eager step captured in a torch.cuda.CUDAGraph) and I-reduce-overhead (torch.compile
mode="reduce-overhead": Inductor's CUDA graphs); for the prefill cases marked in cases.py, I-max-autotune
(mode="max-autotune-no-cudagraphs", deferred to after every case). Entry: {"ms", "rel_err"}: ms on the host clock
around back-to-back calls (graph: replays), synchronized before and after N calls, N so a loop takes >= 20 ms;
the providers of a case take their loops in turn (a new seeded order each round), median of ROUNDS rounds
(interleaved_ms); compile and capture excluded; rel_err = the layer output against torch-eager's (float64 norm), so
gen-eager's rel_err is the two implementations' agreement; above 2e-2 it is flagged "wrong".
"""
from __future__ import annotations

import functools
import os
import sys
import time
from pathlib import Path

if __name__ == "__main__":  # run directly: the checkout's root on the path, before the imports below
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.suite import run as suite_run  # noqa: E402  (first: importing it starts the --time-budget clock)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench.suite import cases as suite  # noqa: E402
from bench.suite.models import MODELS, Model  # noqa: E402

# Tiny layer for --smoke on a CPU (D=64: a head dim our attention builds).
SMOKE_MODEL = Model("smoke", "-", 256, 4, 2, 64, 512, 0, "swiglu", qkv_bias=True, rope_theta=10000.0)
IMPLS = ("torch", "gen")
ROUNDS = 7   # interleaved timing rounds per case (interleaved_ms)
TRACE = os.environ.get("SUITE_TRACE") == "1"   # name each provider as it is built (to find a failing one)

TIMING = ("ms: host clock around N back-to-back calls of the layer (graph providers: replays), "
          f"synchronized before and after, N so a loop takes >= {suite_run.LOOP_S * 1e3:.0f} ms; every provider of a "
          f"case runs one loop in turn per round, in a new seeded order each round, median of {ROUNDS} rounds; "
          "compile and capture excluded. rel_err: the layer output against torch-eager's, float64 norm.")


rms_norm = suite_run.rms_norm   # the model's RMSNorm, as the suite's GEMM cases run it on torch's side


def rope(x, cos, sin):
    """Rotary embedding (rotate-half form) of x [B, L, H, D]; cos, sin [L, 1, D]."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def rope_tables(theta: float, d: int, positions: torch.Tensor):
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, device=positions.device, dtype=torch.float32) / d)
    freqs = positions.float()[:, None] * inv_freq[None]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(torch.bfloat16)[:, None], emb.sin().to(torch.bfloat16)[:, None]


def block_weights(model: Model, device, gen: torch.Generator) -> dict:
    def linear(n, k):  # scaled so activations keep their size through the layer
        return torch.randn(n, k, device=device, dtype=torch.bfloat16, generator=gen) * k ** -0.5

    def norm(n):
        return 1 + 0.1 * torch.randn(n, device=device, dtype=torch.bfloat16, generator=gen)

    h, q = model.hidden, model.heads * model.head_dim
    weights = {"wqkv": linear(model.qkv_n, h), "wo": linear(h, q),
               "wgate_up": linear(2 * model.intermediate, h),   # gate rows, then up rows
               "wdown": linear(h, model.intermediate),
               "bqkv": 0.1 * torch.randn(model.qkv_n, device=device, dtype=torch.bfloat16, generator=gen)
               if model.qkv_bias else None,
               "norm1": norm(h), "norm2": norm(h)}
    # gen's QKV and gate_up weights with the RMSNorm before them folded in (gain times weight), as a loader folds them
    from generated.gemm import fold_rms_gain

    weights.update(wqkv_norm1=fold_rms_gain(weights["wqkv"], weights["norm1"]),
                   wgate_up_norm2=fold_rms_gain(weights["wgate_up"], weights["norm2"]))
    # as a model loaded for inference holds them: nn.Parameters (nn.Linear's and the norms'), frozen
    return {k: None if w is None else torch.nn.Parameter(w, requires_grad=False) for k, w in weights.items()}


# impl -> (whose linears, whose attention); the mixed ones locate a difference between the two (block_swap.py)
IMPL_PARTS = {"torch": ("torch", "torch"), "gen": ("gen", "gen"), "gen-linear": ("gen", "torch"),
              "gen-attention": ("torch", "gen")}


def decode_inputs(model: Model, weights: dict, bsz: int, lk: int, device, gen: torch.Generator) -> tuple:
    """A decode step's arguments: (weights, x [B, 1, hidden], cos, sin at position lk - 1, k_cache, v_cache [B, Hkv,
    lk, D]), x and the caches drawn from gen in that order."""
    x = torch.randn(bsz, 1, model.hidden, device=device, dtype=torch.bfloat16, generator=gen)
    cos, sin = rope_tables(model.rope_theta, model.head_dim, torch.tensor([lk - 1], device=device))
    kv = [torch.randn(bsz, model.kv_heads, lk, model.head_dim, device=device, dtype=torch.bfloat16, generator=gen)
          for _ in range(2)]
    return (weights, x, cos, sin, *kv)


def make_block(model: Model, impl: str, mode: str, wrap=None):
    """The layer as a function of (weights, x, cos, sin[, k_cache, v_cache]) for one implementation (IMPL_PARTS) and
    mode. wrap(name, fn), when given, wraps each linear and the attention call (block_swap.py times them in place)."""
    hq, hkv, d, eps = model.heads, model.kv_heads, model.head_dim, model.norm_eps
    gqa = hq != hkv  # a bool, not an int closure: Dynamo turns ints that change between models into SymInts,
    # and SDPA's enable_gqa refuses a SymBool
    linears, attention = IMPL_PARTS[impl]
    fused = linears == "gen"   # the RMSNorms folded into the next projection (rms_eps), RoPE into QKV's (rope)
    if linears == "torch":
        def linear(x, w, b=None, activation=None, residual=None, rms_eps=None):
            y = F.linear(x, w, b)
            if activation == "swiglu":   # the fused gate_up weight's output: silu(gate) * up
                gate, up = y.chunk(2, dim=-1)
                return F.silu(gate) * up
            return y if residual is None else residual + y
    else:
        from generated import gemm as gen_gemm

        def linear(x, w, b=None, activation=None, residual=None, rms_eps=None, rope=None, rope_columns=None):
            return gen_gemm.linear(x, w, b, activation=activation, residual=residual, rms_eps=rms_eps, rope=rope,
                                   rope_columns=rope_columns)
    if attention == "torch":
        def attend(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=mode == "prefill", enable_gqa=gqa)
    else:
        from generated import attention as gen_attention

        def attend(q, k, v):
            return gen_attention.attention(q, k, v, mod="causal")  # bottom-right: a decode query sees every key
    if wrap is not None:
        linear, attend = wrap("linear", linear), wrap("attention", attend)

    def block(p, x, cos, sin, k_cache=None, v_cache=None):
        bsz, length, hidden = x.shape
        if fused:   # q and k come out rotated: row (b, l) takes the tables' row l
            qkv = linear(x, p["wqkv_norm1"], p["bqkv"], rms_eps=eps, rope=(cos[:, 0], sin[:, 0]),
                         rope_columns=(hq + hkv) * d)
            q, k, v = qkv.view(bsz, length, hq + 2 * hkv, d).split([hq, hkv, hkv], dim=2)
        else:
            qkv = linear(rms_norm(x, p["norm1"], eps).view(bsz * length, hidden), p["wqkv"], p["bqkv"])
            q, k, v = qkv.view(bsz, length, hq + 2 * hkv, d).split([hq, hkv, hkv], dim=2)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if k_cache is not None:  # decode: the new token's K/V into the cache's last slot, attend over the cache
            pos = k_cache.shape[2] - 1
            k_cache[:, :, pos:pos + 1] = k
            v_cache[:, :, pos:pos + 1] = v
            k, v = k_cache, v_cache
        o = attend(q, k, v).transpose(1, 2).reshape(bsz * length, hq * d)
        x = linear(o, p["wo"], residual=x.view(bsz * length, hidden)).view(bsz, length, hidden)
        if fused:
            m = linear(x.view(bsz * length, hidden), p["wgate_up_norm2"], activation="swiglu", rms_eps=eps)
        else:
            m = linear(rms_norm(x, p["norm2"], eps).view(bsz * length, hidden), p["wgate_up"], activation="swiglu")
        return linear(m, p["wdown"], residual=x.view(bsz * length, hidden)).view(bsz, length, hidden)

    return block


def captured(fn):
    """fn's work in one CUDA graph (after a side-stream warm-up); the returned callable replays it."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()

    def replay():
        graph.replay()
        return out
    return replay


def interleaved_ms(fns: dict, sync, rounds: int = ROUNDS) -> dict:
    """ms per call of each fn, its loops taken in turn with the others' (run.interleaved_call_ms): a host-bound step
    drifts with the host's speed (the same eager decode step at 0.5 and at 1.0 ms minutes apart on the H200 host)."""
    return dict(zip(fns, suite_run.interleaved_call_ms([([fn], None) for fn in fns.values()], sync, rounds)))


def static_cache(args: tuple) -> tuple:
    """A decode step's arguments (decode_inputs) with the caches' length marked static for Dynamo (eager calls and
    captured graphs do not read the mark). One compiled layer serves a model's cases, so Dynamo would make Lk
    symbolic at the second length: the generated attention then traces the provider for a growing cache (flash,
    which never sets up per length), while torch's graph calls SDPA's own choice, warmed at the one length each
    case holds (cuDNN on the H200 and H100). Each case is a static cache, as in eager mode; marked static, both
    graphs hold SDPA's own choice (bench/compile_growing_cache.py times the growing cache)."""
    for cache in args[4:6]:
        torch._dynamo.mark_static(cache, 2)
    return args


def cudagraph_skips() -> int:
    from torch._dynamo.utils import counters

    return counters["inductor"]["cudagraph_skips"]


class Block:
    name = "block"
    timing = TIMING
    deferred_name, deferred_flag, deferred_reserve_s = "torch-max-autotune", "autotune", 150.0

    def __init__(self):
        self._weights: dict = {}

    def cases(self, smoke: bool) -> list[dict]:
        return suite.smoke_cases("block") if smoke else suite.block_cases()

    def notes(self, env) -> list[str]:
        return []

    def _model(self, case: dict) -> Model:
        return SMOKE_MODEL if case["model"] == "smoke" else MODELS[case["model"].split("/")[0]]

    def _inputs(self, env, case: dict) -> tuple[Model, tuple]:
        model = self._model(case)
        if model.name not in self._weights:  # one set of weights per model, shared by its cases and both impls
            self._weights[model.name] = block_weights(model, env.device, env.seeded(model.name))
        gen, dev, bsz = env.seeded(case["id"]), env.device, case["B"]
        if case["mode"] == "decode":
            return model, static_cache(decode_inputs(model, self._weights[model.name], bsz, case["Lk"], dev, gen))
        x = torch.randn(bsz, case["L"], model.hidden, device=dev, dtype=torch.bfloat16, generator=gen)
        cos, sin = rope_tables(model.rope_theta, model.head_dim, torch.arange(case["L"], device=dev))
        return model, (self._weights[model.name], x, cos, sin)

    def _compiled(self, env, model: Model, impl: str, mode: str, how: str):
        """One compiled layer per (model, impl, mode, how), reused across that model's cases (Dynamo's automatic
        dynamic shapes recompile once for the sizes that change: B, L, Lk)."""
        key = ("block", model.name, impl, mode, how)
        if key not in env.compiled:
            fn = suite_run.fresh(make_block(model, impl, mode))
            env.compiled[key] = torch.compile(fn, fullgraph=True) if how == "compile" else \
                torch.compile(fn, fullgraph=True, mode=how)
        return env.compiled[key]

    def _providers(self, env, case: dict, model: Model, args: tuple, modes: tuple):
        """(name, build) pairs; build() returns the callable to time (compiling or capturing on the way)."""
        mode = case["mode"]
        for impl in IMPLS:
            if impl == "gen" and not env.run_ours:
                for how in modes:
                    yield f"gen-{how}", {"skipped": "CPU smoke run without TRITON_INTERPRET=1"}
                continue
            for how in modes:
                name = f"{impl}-{how}"
                if how in ("graph", "reduce-overhead") and not env.cuda:
                    yield name, {"skipped": "CUDA graphs need a GPU"}
                elif how == "eager":
                    yield name, lambda impl=impl: functools.partial(make_block(model, impl, mode), *args)
                elif how == "graph":
                    yield name, lambda impl=impl: captured(functools.partial(make_block(model, impl, mode), *args))
                elif how == "reduce-overhead":
                    yield name, lambda impl=impl: self._reduce_overhead(env, model, impl, args)
                else:
                    yield name, lambda impl=impl, how=how: functools.partial(
                        self._compiled(env, model, impl, mode, how), *args)

    def _reduce_overhead(self, env, model: Model, impl: str, args: tuple):
        # Weights and caches keep their addresses across steps: mark them so Inductor's CUDA graphs read them in
        # place instead of copying them into graph-owned buffers every replay (and allow the in-place cache write).
        for t in list(args[0].values()) + list(args[4:]):
            if t is not None:
                torch._dynamo.mark_static_address(t, guard=False)
        fn = functools.partial(self._compiled(env, model, impl, "decode", "reduce-overhead"), *args)
        skips = cudagraph_skips()
        for _ in range(3):  # Inductor records its graph after warm-up calls
            fn()
        if cudagraph_skips() > skips:
            raise RuntimeError("Inductor skipped CUDA graphs for this step (TORCH_LOGS=perf_hints says why)")
        return fn

    def _prepare(self, env, name: str, build, ref):
        """(entry, fn): fn built (compiled or captured) and checked once against ref; fn is None on an error."""
        env.budget.check()
        if TRACE:
            print(f"[suite]   preparing {name}", file=sys.stderr, flush=True)
        try:
            t = time.perf_counter()
            fn = build()
            out = fn()
            env.sync()
            env.first_call_s += time.perf_counter() - t
            err = suite_run.rel_err(out, ref) if ref is not None else None
            del out
            fn()
        except (suite_run.OutOfTime, suite_run.DeviceBroken):
            raise
        except Exception as e:  # noqa: BLE001 - recorded, never fatal
            print(f"[suite]   {name}: {suite_run.describe(e)}", file=sys.stderr, flush=True)
            env.after_error()
            return {"error": suite_run.describe(e)}, None
        entry = {}
        if ref is not None:
            entry["rel_err"] = None if err is None else float(f"{err:.3g}")
            if err is None or err > suite_run.TOLERANCE:
                entry["wrong"] = True
        return entry, fn

    def _run(self, env, case: dict, modes: tuple, providers: dict) -> None:
        model, args = self._inputs(env, case)
        # Each case is a static cache (one length, warmed up), as torch's block sees it. The generated attention
        # remembers the last cache length per call class, so the previous case's length would make this one look
        # like a growing cache and take the provider for varying lengths (no cuDNN: it sets up per new length).
        import generated.attention as gen_attention
        gen_attention._SEEN_LENGTHS.clear()
        try:  # torch-eager's output: what every provider must match (if it fails, its own entry says why)
            ref = make_block(model, "torch", case["mode"])(*args)
        except Exception:  # noqa: BLE001
            env.after_error()
            ref = None
        fns = {}
        for name, build in self._providers(env, case, model, args, modes):
            if isinstance(build, dict):
                providers[name] = build
                continue
            providers[name], fn = self._prepare(env, name, build, ref)
            if fn is not None:
                fns[name] = fn
        for name, ms in interleaved_ms(fns, env.sync).items():
            providers[name]["ms"] = suite_run.sig(ms)

    def row(self, env, case: dict) -> dict:
        modes = ("eager", "compile") + (("graph", "reduce-overhead") if case["mode"] == "decode" else ())
        providers: dict = {}
        self._run(env, case, modes, providers)
        return {"id": case["id"], "model": case["model"], "case": suite_run.case_fields(case),
                "providers": providers}

    def add_deferred(self, env, case: dict, row: dict) -> None:
        self._run(env, case, ("max-autotune-no-cudagraphs",), row["providers"])
        for impl in IMPLS:  # recorded as <impl>-max-autotune
            row["providers"][f"{impl}-max-autotune"] = row["providers"].pop(f"{impl}-max-autotune-no-cudagraphs")

    def print_table(self, doc: dict) -> None:
        modes = ("eager", "compile", "graph", "reduce-overhead", "max-autotune")
        print(f"\n{'case':40s} " + " ".join(f"{m + ' torch/gen ms':>30s}" for m in modes))
        for r in doc["rows"]:
            p = r.get("providers", {})
            cells = []
            for m in modes:
                t, g = p.get(f"torch-{m}", {}).get("ms"), p.get(f"gen-{m}", {}).get("ms")
                cells.append(f"{t or '-'} / {g or '-'}" + (f" ({t / g:.2f}x)" if t and g else ""))
            print(f"{r['id'][:40]:40s} " + " ".join(f"{c:>30s}" for c in cells))


if __name__ == "__main__":
    argv = sys.argv[:]
    if "--family" not in argv:
        argv[1:1] = ["--family", "block"]
    sys.exit(suite_run.main(argv))
