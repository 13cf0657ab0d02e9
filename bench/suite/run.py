#!/usr/bin/env python3
"""Workload-suite runner: every torch provider and our generated ops on the suite's cases (cases.py), one JSON.

    python bench/suite/run.py --family gemm|attention|block [--subset N | --shard I/N] [--match TEXT] [--out FILE]
                              [--resume FILE] [--time-budget SECONDS] [--with-triton] [--smoke]

Per case: fresh random inputs (seeded by the case id), a float32 reference on the same inputs (attention: on batch 0
and the first KV group's heads when the case is big), then each provider: one checked call (its rel_err; compiles and
JITs happen here, outside the timing), warm-up, and two timings:
- call_ms: back-to-back calls on the host clock, synchronized before and after N calls, N such that a loop takes
  >= 20 ms; median of 5 loops, taken in rounds in which every provider of the case (and the dispatched op) runs one
  loop in turn (a new seeded order each round), so a drift of the host's speed hits them alike. What an eager
  caller waits for, launch and host overhead included.
- gpu_ms: CUDA-graph replay. After a warm-up on a side stream, k calls are captured in one torch.cuda.CUDAGraph
  (k ~ 10 ms of work, 1..20 calls, at least one per input copy), replays are timed with CUDA events, median per
  call; launch overhead does not decide it. `gpu_method` says "graph", or "events" when capture failed (then:
  events around single calls, mean over many) with the capture's error in `graph_error`.
Inputs rotate through copies totalling >= 3x the L2 cache, so a decode GEMM reads its weight from HBM as it does in
a model where every layer has its own weights (one copy when the inputs alone exceed that).

Providers are "torch" names (cases.TORCH_PROVIDERS: what a dispatch table can map to torch code) and ours (every
name in generated.<family>.PROVIDERS that is not a torch name, through run_provider; the portable "triton" only with
--with-triton, since it JITs per shape). `dispatched` is the public op with the provider its dispatch picks
(`picked`). Deferred providers (gemm torch-max-autotune, attention torch-compile: one compile per shape) run after
every case has its other providers, on the cases marked in cases.py, while the time budget lasts.

Each provider entry is {"call_ms", "gpu_ms", "gpu_method", "rel_err"} (plus "wrong": true when rel_err > 2e-2 or the
output is not finite), {"error": "<Type: first line>"} when it raised, or {"skipped": "<why>"} when it does not
apply by design (e.g. SDPA on a score mod). The file is rewritten after every case, so a run killed at its limit
keeps what it measured; --resume FILE skips the cases FILE has. --time-budget stops cleanly before the budget ends
(counted from process start). --smoke runs 3 tiny cases per family on the CPU, host timing only (gpu_method "none"),
our providers only with TRITON_INTERPRET=1. The block family (a whole decoder layer, torch vs our ops) is block.py;
it shares this loop, its entries are {"ms", "rel_err"}. README.md has the JSON contract and the device budget.
"""
from __future__ import annotations

import time

_T0 = time.monotonic()  # --time-budget counts from here: imports and CUDA start-up are part of the budget

import argparse
import contextlib
import functools
import importlib
import itertools
import json
import math
import os
import platform
import random
import re
import statistics
import sys
import types
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench.suite import cases as suite  # noqa: E402
from gen.families import mod_ir  # noqa: E402
from gen.runtime.dispatch import variant_target  # noqa: E402
from gen.build.spec import load_spec  # noqa: E402

TOLERANCE = 2e-2          # rel_err above this (bf16) flags a provider "wrong"
LOOP_S = 0.020            # a call_ms loop lasts at least this long
MAX_LOOP_CALLS = 20000
ATTENTION_MODS = {m["name"]: m for m in load_spec(ROOT / "specs" / "attention.yaml").options["mods"]}  # the build's
CALL_ROUNDS = 5           # call_ms: median of this many loops per provider, the providers of a case in turn
GRAPH_WORK_MS = 10.0      # work captured per graph (calls = GRAPH_WORK_MS / call time, 1..20)
REPLAY_MS = 20.0          # replay time per measurement (at least 3 replays)
ROTATE_L2 = 3             # input copies total >= ROTATE_L2 x the L2 cache
MAX_COPIES = 256
MIN_RESERVE_S = 10.0      # never start a case with less budget left than this
REF_CHUNK_BYTES = 512 << 20   # attention reference: fp32 score chunk size
SLICE_SCORES = 1 << 27        # attention cases with more scores than this are checked on a slice

TIMING = (
    "call_ms: host clock around N back-to-back calls (torch.cuda.synchronize before and after; N so the loop takes "
    f">= {LOOP_S * 1e3:.0f} ms), median of {CALL_ROUNDS} loops, the providers of a case (and the dispatched op) taking "
    "their loops in turn, in a new seeded order each round, so a drift of the host's speed hits them alike; launch "
    "and host overhead included. "
    "gpu_ms: one CUDA graph of k "
    f"calls (k ~ {GRAPH_WORK_MS:.0f} ms of work, 1..20, at least one per input copy) captured after a side-stream "
    f"warm-up, replays timed with CUDA events (>= 3 replays, >= {REPLAY_MS:.0f} ms), median / k; gpu_method "
    "'events' = capture failed, CUDA events around single calls, mean. Inputs rotate through copies totalling "
    f">= {ROTATE_L2}x L2 so weights and KV come from HBM. Compile/JIT time is excluded (the first, checked call). "
    "rel_err = ||out - ref|| / ||ref|| in float64 against float32 torch math on the same inputs.")


class OutOfTime(Exception):
    pass


class DeviceBroken(Exception):
    """The CUDA context is unusable (a sticky error such as an illegal address): later results would be garbage."""


class Budget:
    def __init__(self, seconds: float | None):
        self.end = _T0 + seconds if seconds else math.inf

    def left(self) -> float:
        return self.end - time.monotonic()

    def check(self) -> None:
        if self.left() <= 0:
            raise OutOfTime()


def describe(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"[:300]


_FRESH = itertools.count()


def fresh(fn):
    """`fn` with a code object of its own. Dynamo keeps compiled entries (and its recompile limit) per code object,
    and its automatic-dynamic state (which sizes changed between compiles) per file, line and code name: a copy
    with a name of its own keeps variants from evicting each other, sharing guard checks, or one model's sizes making
    another model's compile dynamic."""
    name = f"{fn.__name__}_v{next(_FRESH)}"
    code = fn.__code__.replace(co_name=name, co_qualname=name) if hasattr(fn.__code__, "co_qualname") else \
        fn.__code__.replace(co_name=name)
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


def sig(x: float) -> float:
    return float(f"{x:.5g}")


class Env:
    """Device, flags, budget and compile caches of one run."""

    def __init__(self, args):
        self.smoke = args.smoke
        self.device = torch.device("cpu" if args.smoke else "cuda")
        self.cuda = self.device.type == "cuda"
        self.budget = Budget(args.time_budget)
        self.interpret = os.environ.get("TRITON_INTERPRET") == "1"
        self.run_ours = self.cuda or self.interpret
        self.with_triton = args.with_triton or (args.smoke and self.interpret)  # on a CPU triton is all there is
        self.compiled: dict = {}  # key -> torch.compile(dynamic=True) callable shared by every shape
        self.per_shape: set = set()  # keys whose dynamic-shape compile failed: one static compile per shape
        self.notes: list = []
        self.first_call_s = 0.0   # time in first (checked) calls: compiles and JITs, for the budget estimate
        l2 = torch.cuda.get_device_properties(self.device).L2_cache_size if self.cuda else 0
        self.rotate_bytes = ROTATE_L2 * l2

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def copies(self, tensors: tuple, footprint: int) -> list[tuple]:
        """tensors plus clones of them, enough that all copies together exceed the rotation size."""
        n = min(MAX_COPIES, max(1, math.ceil(self.rotate_bytes / max(footprint, 1))))
        return [tensors] + [tuple(None if t is None else t.clone() for t in tensors) for _ in range(n - 1)]

    def seeded(self, case_id: str) -> torch.Generator:
        return torch.Generator(device=self.device).manual_seed(zlib.crc32(case_id.encode()))

    def compile(self, key: tuple, fn, args: tuple):
        """torch.compile(fn, dynamic=True), one per key for every shape (compile time outside the timing), tried on
        args. A key whose dynamic-shape compile fails (seen: flex-attention softcap on Inductor CPU) falls back,
        with a note, to a static compile per shape; other errors (e.g. out of memory) propagate."""
        self.budget.check()
        if key not in self.per_shape:
            if key not in self.compiled:
                self.compiled[key] = torch.compile(fresh(fn), dynamic=True)
            t = time.perf_counter()
            try:
                self.compiled[key](*args)
                return self.compiled[key]
            except torch._dynamo.exc.TorchDynamoException as e:  # Dynamo or Inductor failed, not the kernel
                self.after_error()
                self.per_shape.add(key)
                note = f"{' '.join(map(str, key))}: dynamic-shape compile failed ({describe(e)}); compiled per shape"
                if note not in self.notes:  # a resumed run may hit it again
                    self.notes.append(note)
            finally:
                self.first_call_s += time.perf_counter() - t
        return torch.compile(fresh(fn), dynamic=False)

    def after_error(self) -> None:
        if not self.cuda:
            return
        try:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.ones(1, device=self.device).add_(1).item()
        except Exception as e:  # noqa: BLE001 - any failure here means the context is gone
            raise DeviceBroken(describe(e)) from None


# ---------------------------------------------------------------------------------------------------------- timing

def loop_calls(fns: list, sync) -> int:
    """How many back-to-back calls make a loop of >= LOOP_S (from one synchronized call)."""
    sync()
    t = time.perf_counter()
    fns[0]()
    sync()
    return min(MAX_LOOP_CALLS, max(1, math.ceil(LOOP_S / max(time.perf_counter() - t, 1e-7))))


def interleaved_call_ms(timed: list, sync, rounds: int = CALL_ROUNDS) -> list[float]:
    """ms per call of each (fns, ctx factory or None) in `timed`: in each of `rounds` rounds every provider runs one
    loop of back-to-back calls (>= LOOP_S, inputs rotating) in turn, in a new (seeded) order each round; the median
    over rounds. In turn because the host's speed drifts within a run (the H200 host's did, by up to 25% between
    processes and within one), and a drift must hit every provider of a case alike, not the one timed last; in a new
    order so that no provider always follows the same one (a host-bound eager loop timed right after a GPU-bound one
    is not timed as it is after another eager one)."""
    counts = []
    for fns, ctx in timed:
        with ctx() if ctx is not None else contextlib.nullcontext():
            counts.append(loop_calls(fns, sync))
    loops: list = [[] for _ in timed]
    order = random.Random(len(timed))
    for _ in range(rounds):
        for i in order.sample(range(len(timed)), len(timed)):
            (fns, ctx), n, out = timed[i], counts[i], loops[i]
            with ctx() if ctx is not None else contextlib.nullcontext():
                sync()
                t = time.perf_counter()
                for i in range(n):
                    fns[i % len(fns)]()
                sync()
            out.append((time.perf_counter() - t) / n)
    return [statistics.median(v) * 1e3 for v in loops]


def graph_ms(fns: list, est_ms: float) -> float:
    k = max(len(fns), min(20, max(1, round(GRAPH_WORK_MS / max(est_ms, 1e-4)))))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # capture needs lazy initialization (handles, workspaces) done off the capture
        fns[0]()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(k):
            fns[i % len(fns)]()
    graph.replay()
    torch.cuda.synchronize()
    replays = min(50, max(3, math.ceil(REPLAY_MS / max(k * est_ms, 1e-4))))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(replays)]
    for start, end in events:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    del graph
    return statistics.median(s.elapsed_time(e) for s, e in events) / k


def events_ms(fns: list, est_ms: float) -> float:
    n = min(200, max(3, math.ceil(REPLAY_MS / max(est_ms, 1e-4))))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for i, (start, end) in enumerate(events):
        start.record()
        fns[i % len(fns)]()
        end.record()
    torch.cuda.synchronize()
    return statistics.fmean(s.elapsed_time(e) for s, e in events)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float | None:
    """||out - ref|| / ||ref|| in float64 (chunked: no float64 copy of a multi-GB output); None if out is not finite."""
    if tuple(out.shape) != tuple(ref.shape):
        raise ValueError(f"output shape {tuple(out.shape)}, expected {tuple(ref.shape)}")
    o, r = out.reshape(-1), ref.reshape(-1)
    num = torch.zeros((), dtype=torch.float64, device=o.device)
    den = torch.zeros((), dtype=torch.float64, device=o.device)
    finite = torch.ones((), dtype=torch.bool, device=o.device)
    step = 1 << 26
    for i in range(0, o.numel(), step):
        oc, rc = o[i:i + step].double(), r[i:i + step].double()
        finite &= torch.isfinite(oc).all()
        num += (oc - rc).square().sum()
        den += rc.square().sum()
    if not bool(finite):
        return None
    return math.sqrt(num.item() / den.item()) if den.item() > 0 else math.sqrt(num.item())


def check(env: Env, fns: list, ref: torch.Tensor, view=None, ctx=None) -> dict:
    """One provider's checked first call (copy 0 against ref; `view` picks the compared slice; compiles and JITs
    happen here) and a warm-up: {"rel_err"[, "wrong"]}, or {"error"} when it raised."""
    env.budget.check()
    try:
        with ctx() if ctx is not None else contextlib.nullcontext():
            t = time.perf_counter()
            out = fns[0]()
            env.sync()
            env.first_call_s += time.perf_counter() - t
            err = rel_err(view(out) if view else out, ref)
            del out
            for f in fns[:2]:
                f()
    except (OutOfTime, DeviceBroken):
        raise
    except Exception as e:  # noqa: BLE001 - a provider that raises is recorded, never fatal
        env.after_error()
        return {"error": describe(e)}
    res = {"rel_err": None if err is None else float(f"{err:.3g}")}
    if err is None or err > TOLERANCE:
        res["wrong"] = True
    return res


def time_gpu(env: Env, fns: list, est_ms: float, ctx=None) -> dict:
    """gpu_ms by CUDA-graph replay (events around single calls where capture fails, saying why)."""
    if not env.cuda:
        return {"gpu_method": "none"}
    try:
        with ctx() if ctx is not None else contextlib.nullcontext():
            try:
                return {"gpu_ms": sig(graph_ms(fns, est_ms)), "gpu_method": "graph"}
            except Exception as e:  # noqa: BLE001 - not capturable: fall back to events, say why
                env.after_error()
                return {"gpu_ms": sig(events_ms(fns, est_ms)), "gpu_method": "events", "graph_error": describe(e)}
    except (OutOfTime, DeviceBroken):
        raise
    except Exception as e:  # noqa: BLE001
        env.after_error()
        return {"error": describe(e)}


def measure_all(env: Env, entries: dict, ref: torch.Tensor, view=None) -> dict:
    """{name: (fns, ctx)} -> {name: entry}, ctx a zero-argument factory of the context a provider runs in (or None):
    each provider checked, then every provider's call time taken in
    interleaved rounds (interleaved_call_ms), then each one's GPU time. Entry: {"call_ms", "gpu_ms", "gpu_method",
    "rel_err"[, "wrong"]}, or {"error"}."""
    results = {name: check(env, fns, ref, view, ctx) for name, (fns, ctx) in entries.items()}
    timed = [name for name, res in results.items() if "error" not in res]
    env.budget.check()
    try:
        for name, ms in zip(timed, interleaved_call_ms([entries[n] for n in timed], env.sync)):
            results[name] = {"call_ms": sig(ms), **results[name]}
    except (OutOfTime, DeviceBroken):
        raise
    except Exception:  # noqa: BLE001 - a provider that fails only when looped: time each alone, naming it
        env.after_error()
        for name in timed:
            try:
                (ms,) = interleaved_call_ms([entries[name]], env.sync)
                results[name] = {"call_ms": sig(ms), **results[name]}
            except Exception as e1:  # noqa: BLE001
                env.after_error()
                results[name] = {"error": describe(e1)}
    for name in timed:
        if "call_ms" in results[name]:
            results[name].update(time_gpu(env, entries[name][0], results[name]["call_ms"], entries[name][1]))
    return results


def measure(env: Env, fns: list, ref: torch.Tensor, view=None, ctx=None) -> dict:
    """One provider checked and timed (measure_all of one)."""
    return measure_all(env, {"_": (fns, ctx)}, ref, view)["_"]


def best(providers: dict, names) -> str | None:
    """The provider among `names` with the lowest call_ms that ran and was not wrong."""
    ok = [(p["call_ms"], n) for n, p in providers.items() if n in names and "call_ms" in p and not p.get("wrong")]
    return min(ok)[1] if ok else None


# ------------------------------------------------------------------------------------------------------------ gemm

def _gated(act):
    """A gated activation of y = [gate | up] (a fused gate_up projection's output): act(gate) * up."""
    def gated(y):
        gate, up = y.chunk(2, dim=-1)
        return act(gate) * up
    return gated


_ACT = {"none": lambda y: y, "relu": torch.relu, "silu": F.silu,
        "gelu_tanh": lambda y: F.gelu(y, approximate="tanh")}
_ACT.update(swiglu=_gated(F.silu), geglu=_gated(_ACT["gelu_tanh"]))
# In place where torch has it: what an eager model (and generated.gemm's "torch" provider) does after the matmul.
_ACT_INPLACE = {"none": lambda y: y, "relu": torch.relu_, "silu": functools.partial(F.silu, inplace=True),
                "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"),
                "swiglu": _gated(functools.partial(F.silu, inplace=True)), "geglu": _ACT["geglu"]}


def rms_norm(x, gain, eps: float):
    """A pre-norm model's RMSNorm as Hugging Face's LlamaRMSNorm computes it: in fp32, rounded back, times the gain."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)).to(x.dtype) * gain


def rotate_half(x):
    """Hugging Face's rotate_half: (x1, x2) -> (-x2, x1) over the last dim's halves."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def hf_rope(y, cos, sin, columns: int):
    """A model's rotary embedding of the q and k heads in y's first `columns` columns, as Hugging Face's
    apply_rotary_pos_emb computes it (in y's dtype, cos and sin [M, D]): (the rotated q and k heads [M, columns],
    v's columns as a view), the two tensors a model goes on with."""
    d = cos.shape[-1]
    qk = y[:, :columns].unflatten(-1, (columns // d, d))
    rotated = qk * cos.unsqueeze(1) + rotate_half(qk) * sin.unsqueeze(1)
    return rotated.flatten(1), y[:, columns:]


def torch_gemm(weight: str, activation: str, out_dtype: torch.dtype, rms_eps: float | None = None,
               rope_columns: int = 0):
    """The eager torch math: F.linear (weight [N, K]) or a @ b + bias ([K, N]; as addmm, the bias fused into cuBLAS's
    epilogue the way F.linear fuses it), then the activation, in the input dtype, then the cast to out_dtype, then a
    residual's add as a model writes it (`x + F.linear(...)`); with rms_eps, the model's RMSNorm of x (gain
    included) first; with rope_columns, the rotary embedding of those first columns' heads after it (hf_rope: the
    call then returns (rotated q and k, v))."""
    act = _ACT_INPLACE[activation]
    if weight == "nk":
        def linear(x, w, bias, residual=None, gain=None, cos=None, sin=None):
            x = x if rms_eps is None else rms_norm(x, gain, rms_eps)
            y = act(F.linear(x, w, bias)).to(out_dtype)
            if rope_columns:
                return hf_rope(y, cos, sin, rope_columns)
            return y if residual is None else residual + y
        return linear

    def matmul(a, b, bias, residual=None, gain=None, cos=None, sin=None):
        a = a if rms_eps is None else rms_norm(a, gain, rms_eps)
        y = act(a @ b if bias is None else torch.addmm(bias, a, b)).to(out_dtype)
        if rope_columns:
            return hf_rope(y, cos, sin, rope_columns)
        return y if residual is None else residual + y
    return matmul


def _ours(family: str):
    return importlib.import_module(f"generated.{family}")


def our_providers(env: Env, family: str) -> tuple[list, dict, object]:
    """(our provider names to time, {name: entry} for the ones left out and why, generated.<family>.run_provider).
    A missing interface is one "ours" error entry."""
    if not env.run_ours:
        return [], {}, None
    try:
        ops = _ours(family)
        names, run_provider = [n for n in ops.PROVIDERS if n not in suite.TORCH_PROVIDERS[family]], ops.run_provider
    except (ImportError, AttributeError) as e:
        return [], {"ours": {"error": describe(e)}}, None
    here = "sm%d%d" % torch.cuda.get_device_capability(env.device) if env.cuda else None
    run, left_out = [], {}
    for name in names:
        base = variant_target(name)   # a named config (sm90_m64) builds for its target (sm90)
        if re.fullmatch(r"sm\d+", base) and base != here:  # a Gluon variant for another architecture
            left_out[name] = {"skipped": f"built for {base}; this device is {here or 'a CPU'}"}
        elif name == "triton" and not env.with_triton:
            left_out[name] = {"skipped": "portable triton JITs per shape; --with-triton times it"}
        else:
            run.append(name)
    return run, left_out, run_provider


def _split_kv(name: str) -> bool:
    """Is the attention variant `name` a split-KV (decode) config (triton_splitkv and the tuned configs of it)?"""
    module = importlib.import_module(f"{_ours('attention').__name__}.{name}")
    return bool(getattr(module, "CONFIG", {}).get("SPLIT_KV"))


class OpFamily:
    """What gemm and attention share: a row is every provider checked and timed, the public op's dispatch, and the
    best torch provider; one compile-per-shape provider is deferred to a pass after all cases."""
    name = ""
    timing = TIMING

    def cases(self, smoke: bool) -> list[dict]:
        return suite.smoke_cases(self.name) if smoke else \
            suite.gemm_cases() if self.name == "gemm" else suite.attention_cases()

    def notes(self, env: Env) -> list[str]:
        return ["the portable 'triton' provider is not timed (it JITs per shape); --with-triton adds it"] \
            if env.run_ours and not env.with_triton else []

    def row(self, env: Env, case: dict) -> dict:
        st = self.state(env, case)
        providers, timed = {}, {}   # timed: every provider and the dispatched op, measured in one interleaved set
        order = []
        for name, calls, *ctx in self.providers(env, case, st):
            order.append(name)
            if isinstance(calls, dict):
                providers[name] = calls
            else:
                timed[("providers", name)] = (calls, ctx[0] if ctx else None)
        row = {"id": case["id"], "model": case["model"], "case": case_fields(case), "flops": self.flops(case),
               "bytes": self.bytes(case), "providers": providers}
        if not env.run_ours:
            row["dispatched"] = {"skipped": "CPU smoke run without TRITON_INTERPRET=1"}
        for key, decide, calls in self.dispatched(env, case, st) if env.run_ours else ():
            entry = row[key] = {}
            if decide is not None:
                try:
                    entry["picked"] = decide()
                except Exception as e:  # noqa: BLE001 - the timing below still says what the public op costs
                    entry["picked"] = None
                    entry["picked_error"] = describe(e)
            if isinstance(calls, dict):
                entry.update(calls)
            else:
                timed[(key, None)] = (calls, None)
        for (where, name), res in measure_all(env, timed, st["ref"], self.view(st)).items():
            if where == "providers":
                providers[name] = res
            else:
                row[where].update(res)
        row["providers"] = {name: providers[name] for name in order}
        row["best_torch"] = best(providers, suite.TORCH_PROVIDERS[self.name])
        return row

    def add_deferred(self, env: Env, case: dict, row: dict) -> None:
        st = self.state(env, case)
        row["providers"][self.deferred_name] = measure(env, self.deferred(env, case, st), st["ref"], self.view(st))
        row["best_torch"] = best(row["providers"], suite.TORCH_PROVIDERS[self.name])

    def view(self, st: dict):
        """What of a provider's output the reference covers (None: all of it)."""
        return st.get("view")

    def print_table(self, doc: dict) -> None:
        torch_names = suite.TORCH_PROVIDERS[self.name]
        print(f"\n{'case':52s} {'best torch':>26s} {'best ours':>18s} {'dispatched':>20s} {'torch/disp':>10s}")
        for r in doc["rows"]:
            p = r.get("providers", {})
            bt, d = r.get("best_torch"), r.get("dispatched", {})
            ours = best(p, [n for n in p if n not in torch_names])
            cell = lambda n: f"{n} {p[n]['call_ms']:.4f}" if n else "-"  # noqa: E731
            disp = f"{d.get('picked') or '?'} {d['call_ms']:.4f}" if "call_ms" in d else "-"
            ratio = f"{p[bt]['call_ms'] / d['call_ms']:.3f}" if bt and "call_ms" in d else "-"
            print(f"{r['id'][:52]:52s} {cell(bt):>26s} {cell(ours):>18s} {disp:>20s} {ratio:>10s}")


class Gemm(OpFamily):
    name = "gemm"
    deferred_name, deferred_flag, deferred_reserve_s = "torch-max-autotune", "autotune", 90.0
    flops, bytes = staticmethod(suite.gemm_flops), staticmethod(suite.gemm_bytes)

    def state(self, env: Env, case: dict) -> dict:
        m, n, k = case["M"], suite.gemm_columns(case), case["K"]   # a gated case's weight: gate and up, 2N
        dev, gen, dt = env.device, env.seeded(case["id"]), torch.bfloat16
        x = torch.randn(m, k, device=dev, dtype=dt, generator=gen)
        shape = (n, k) if case["weight"] == "nk" else (k, n)
        w = torch.randn(*shape, device=dev, dtype=dt, generator=gen) * k ** -0.5
        bias = torch.randn(n, device=dev, dtype=dt, generator=gen) if case["bias"] else None
        out_dtype = getattr(torch, case["out_dtype"])
        # a residual case: the layer's input x (the residual stream) added to its output
        res = torch.randn(m, case["N"], device=dev, dtype=out_dtype, generator=gen) if case.get("residual") else None
        # an RMSNorm-rows case: the norm's gain, and the weight with it folded in (ours, as a model loads it once)
        gain = (1 + 0.1 * torch.randn(k, device=dev, generator=gen)).to(dt) if case.get("rms") else None
        folded = None
        if gain is not None:   # folded by the op's own helper, as a user's loader does (a [K, N] weight as its [N, K])
            fold = _ours("gemm").fold_rms_gain
            folded = fold(w, gain) if case["weight"] == "nk" else fold(w.t(), gain).t().contiguous()
        b = w.t() if case["weight"] == "nk" else w  # [K, N]: the w.t() view of an nn.Linear weight, or row-major
        xn = x.float() if gain is None else rms_norm(x, gain, case["rms_eps"]).float()
        y = xn @ b.float()
        ref = _ACT[case["activation"]](y if bias is None else y + bias.float())
        ref = ref if res is None else ref + res.float()
        # a RoPE case: the rotary tables of the rows' positions (a model's, in its dtype: [M, D])
        cos = sin = None
        if case.get("rope"):
            cos, sin = rope_tables(m, case["rope_dim"], dev, gen)
            ref = torch.cat(hf_rope(ref, cos.float(), sin.float(), case["rope_columns"]), dim=1)
        footprint = suite.gemm_bytes(case)
        # (x, w as stored, b = its [K, N] view, bias, residual, gain, the weight ours reads and its [K, N] view,
        # cos, sin)
        view = (lambda t: t.t()) if case["weight"] == "nk" else (lambda t: t)
        copies = [(c[0], c[1], view(c[1]), c[2], c[3], c[4], c[5] if gain is not None else c[1],
                   view(c[5] if gain is not None else c[1]), c[6], c[7])
                  for c in env.copies((x, w, bias, res, gain, folded, cos, sin), footprint)]
        return {"copies": copies, "ref": ref, "out_dtype": out_dtype,
                "act": None if case["activation"] == "none" else case["activation"],
                # torch's RoPE call returns (rotated q and k, v): compared as one tensor
                "view": (lambda out: torch.cat(out, dim=1) if isinstance(out, tuple) else out)}

    def providers(self, env: Env, case: dict, st: dict):
        copies, act, out_dtype = st["copies"], st["act"], st["out_dtype"]
        eager = torch_gemm(case["weight"], case["activation"], out_dtype, case.get("rms_eps"),
                           case.get("rope_columns", 0))
        yield "torch", [functools.partial(eager, x, w, bias, r, g, c, s) for x, w, _, bias, r, g, _, _, c, s in copies]
        key = ("torch-compile", case["weight"], f"bias={case['bias']}", case["activation"], case["out_dtype"],
               f"residual={bool(case.get('residual'))}") + ((f"rms={case['rms_eps']}",) if case.get("rms") else ()) \
            + ((f"rope={case['rope_columns']}",) if case.get("rope") else ())
        try:  # one dynamic-shape compile per epilogue covers every shape
            compiled = env.compile(key, eager, copies[0][:2] + copies[0][3:6] + copies[0][8:])
        except (OutOfTime, DeviceBroken):
            raise
        except Exception as e:  # noqa: BLE001
            env.after_error()
            yield "torch-compile", {"error": describe(e)}
        else:
            yield "torch-compile", [functools.partial(compiled, x, w, bias, r, g, c, s)
                                    for x, w, _, bias, r, g, _, _, c, s in copies]
        names, left_out, run_provider = our_providers(env, "gemm")
        yield from left_out.items()
        for name in names:
            why = _cannot_rotate(name, case)
            if why:
                yield name, {"skipped": why}
                continue
            yield name, [functools.partial(run_provider, name, x, fb, bias, act, out_dtype, **_res(r, case, c, s))
                         for x, _, _, bias, r, _, _, fb, c, s in copies]

    def dispatched(self, env: Env, case: dict, st: dict):
        """(row key, picked or None, calls | error dict) for the public ops."""
        copies, act, out_dtype = st["copies"], st["act"], st["out_dtype"]
        try:
            mod = _ours("gemm")
            gemm = mod.gemm
        except (ImportError, AttributeError) as e:
            yield "dispatched", None, {"error": describe(e)}
            return
        x, _, _, bias, r, _, _, fb, c, s = copies[0]
        yield "dispatched", lambda: mod.decide(x, fb, bias, act, out_dtype, **_res(r, case, c, s)), [
            functools.partial(gemm, x, fb, bias=bias, activation=act, out_dtype=out_dtype, **_res(r, case, c, s))
            for x, _, _, bias, r, _, _, fb, c, s in copies]
        if case["weight"] == "nk":
            try:
                linear = mod.linear
            except AttributeError as e:
                yield "dispatched-linear", None, {"error": describe(e)}
                return
            yield "dispatched-linear", None, [
                functools.partial(linear, x, fw, bias, activation=act, out_dtype=out_dtype, **_res(r, case, c, s))
                for x, _, _, bias, r, _, fw, _, c, s in copies]

    def deferred(self, env: Env, case: dict, st: dict) -> list:
        eager = torch_gemm(case["weight"], case["activation"], st["out_dtype"], case.get("rms_eps"),
                           case.get("rope_columns", 0))
        tuned = torch.compile(fresh(eager), mode="max-autotune-no-cudagraphs", dynamic=False)
        return [functools.partial(tuned, x, w, bias, r, g, c, s) for x, w, _, bias, r, g, _, _, c, s in st["copies"]]


def rope_tables(m: int, d: int, device, gen):
    """A rotary embedding's cos and sin [M, D] (rotate-half: the halves repeat) at random positions below 8192,
    theta 500000 (Llama 3's), in bf16 as a model hands them to its attention."""
    pos = torch.randint(0, 8192, (m, 1), device=device, generator=gen).float()
    freqs = pos * 500000.0 ** (-torch.arange(0, d, 2, device=device).float() / d)
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)


def _cannot_rotate(name: str, case: dict) -> str:
    """Why our variant `name` cannot take this RoPE case (its module's ROPE_KINDS), or ""."""
    if not case.get("rope"):
        return ""
    kinds = getattr(importlib.import_module(f"{_ours('gemm').__name__}.{name}"), "ROPE_KINDS", ())
    if (case["rope_dim"], case["rope"] == "interleaved") in kinds:
        return ""
    return f"no RoPE epilogue for head dim {case['rope_dim']} ({case['rope']}) in this variant"


def _res(residual, case: dict, cos=None, sin=None) -> dict:
    """The residual, rms_eps and RoPE keywords of our ops' calls: only for a residual, RMSNorm-rows or RoPE case, so
    the other cases' calls stay as they were (and run on builds from before those epilogues)."""
    return {**({} if residual is None else {"residual": residual}),
            **({"rms_eps": case["rms_eps"]} if case.get("rms") else {}),
            **({"rope": (cos, sin), "rope_columns": case["rope_columns"],
                "rope_interleaved": case["rope"] == "interleaved"} if case.get("rope") else {})}


# ------------------------------------------------------------------------------------------------------- attention

def alibi_slopes(hq: int, device) -> torch.Tensor:
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / hq) for h in range(hq)], dtype=torch.float32, device=device)


def mod_params(mod: str) -> dict:
    """The run-time parameters the build's mod `mod` takes by default (what our providers are called with)."""
    m = ATTENTION_MODS[mod]
    return {"window_left": m["left"] or 0, "window_right": m["right"], "softcap": m["cap"] or 0.0}


def attention_math(q, k, v, mod: str, q_start: int = 0, lq_total: int | None = None, slopes=None):
    """The math definition in float32: softmax(mod(scale * q k^T) + mask) v, masks bottom-right aligned.
    q may be rows [q_start, q_start + q.shape[2]) of a query block of lq_total rows; slopes: ALiBi per q head."""
    b, hq, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    lq_total = lq if lq_total is None else lq_total
    # GQA without expanding K/V to Hq heads (that copy would be B*Hq*Lk*D floats: 69 GB for a 64x32k decode): the
    # query heads sharing a KV head are adjacent, so they fold into the rows of one matmul per KV head.
    rows = q.float().reshape(b, hkv, (hq // hkv) * lq, d)
    s = (rows @ k.float().transpose(-1, -2)).view(b, hq, lq, lk) * d ** -0.5
    dev = q.device
    s = mod_ir.of(ATTENTION_MODS[mod]).apply({
        "score": s, "b": torch.arange(b, device=dev).view(b, 1, 1, 1), "h": torch.arange(hq, device=dev).view(1, hq, 1, 1),
        "q_idx": torch.arange(q_start, q_start + lq, device=dev).view(lq, 1),
        "kv_idx": torch.arange(lk, device=dev).view(1, lk), "Lq": lq_total, "Lk": lk, "alibi_slopes": slopes,
        **mod_params(mod)})
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # a fully masked row gives O = 0
    return (p.view(b, hkv, (hq // hkv) * lq, lk) @ v.float()).view(b, hq, lq, d)


def attention_reference(q, k, v, mod: str, slopes) -> torch.Tensor:
    """attention_math over chunks of query rows, so no more than REF_CHUNK_BYTES of scores exist at a time."""
    b, hq, lq, _ = q.shape
    rows = max(1, REF_CHUNK_BYTES // (4 * b * hq * k.shape[2]))
    return torch.cat([attention_math(q[:, :, i:i + rows], k, v, mod, i, lq, slopes) for i in range(0, lq, rows)],
                     dim=2)


def torch_attention(mod: str, slopes):
    def math_attention(q, k, v):
        return attention_math(q, k, v, mod, slopes=slopes).to(q.dtype)
    return math_attention


def flex_mods(mod: str, lq: int, lk: int, slopes, device):
    """(score_mod, mask_mod) for FlexAttention expressing the mod exactly as ours does. The lengths are tensors so a
    new length does not recompile the kernel."""
    return mod_ir.flex_mods(mod_ir.of(ATTENTION_MODS[mod]), torch.tensor(lq, device=device),
                            torch.tensor(lk, device=device), alibi_slopes=slopes, **mod_params(mod))


def flex_call(q, k, v, score_mod, block_mask, enable_gqa):
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=enable_gqa)


# "sdpa" is SDPA's own backend choice (what a plain call gets); the others force one backend.
_SDPA_BACKENDS = {"sdpa": None, "sdpa-cudnn": "CUDNN_ATTENTION", "sdpa-flash": "FLASH_ATTENTION",
                  "sdpa-efficient": "EFFICIENT_ATTENTION"}


def sdpa_provider(name: str, case: dict, copies: list):
    """(calls, context factory or None) for one SDPA backend, or a {"skipped"} dict where it cannot express the
    case."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import CausalVariant, causal_lower_right

    mod, lq, lk = case["mod"], case["Lq"], case["Lk"]
    gqa = case["Hq"] != case["Hkv"]
    if mod not in ("none", "causal"):
        return {"skipped": f"SDPA has no {mod} score mod or mask"}, None
    backend = _SDPA_BACKENDS[name]
    # a factory: the timing enters the backend's context once per loop, and one sdpa_kernel object enters only once
    ctx = (lambda: sdpa_kernel([getattr(SDPBackend, backend)])) if backend else None
    if mod == "none" or lq == 1:  # with one query, bottom-right causal masks nothing
        kwargs = {}
    elif lq == lk:
        kwargs = {"is_causal": True}
    else:
        # Bottom-right causal with Lq != Lk. torch's causal_lower_right mask ignores sdpa_kernel: it runs flash when
        # flash can, else the efficient kernel, else materializes a mask. So each name runs what it says or nothing.
        q, k, v = copies[0]
        params = torch.backends.cuda.SDPAParams(q, k, v, None, 0.0, False, gqa)
        mask = causal_lower_right(lq, lk)
        if name == "sdpa":
            return [functools.partial(F.scaled_dot_product_attention, q, k, v, attn_mask=mask, enable_gqa=gqa)
                    for q, k, v in copies], ctx
        if name == "sdpa-cudnn":
            return {"skipped": "SDPA's cuDNN backend has no bottom-right causal mask (causal_lower_right runs "
                               "flash or efficient)"}, None
        if name == "sdpa-flash":
            if not torch.backends.cuda.can_use_flash_attention(params):
                return {"skipped": "flash cannot run this case, and causal_lower_right would run another kernel"}, None
            return [functools.partial(F.scaled_dot_product_attention, q, k, v, attn_mask=mask, enable_gqa=gqa)
                    for q, k, v in copies], ctx
        if not torch.backends.cuda.can_use_efficient_attention(params):
            return {"skipped": "the efficient kernel cannot run this case (it has no GQA)"}, None

        def efficient(q, k, v):  # the call causal_lower_right makes when flash cannot run
            return torch.ops.aten._efficient_attention_forward(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), bias=None, cu_seqlens_q=None,
                cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, dropout_p=0.0,
                custom_mask_type=int(CausalVariant.LOWER_RIGHT), compute_log_sumexp=False, scale=None,
                seqlen_k=None)[0].transpose(1, 2)
        return [functools.partial(efficient, q, k, v) for q, k, v in copies], None
    return [functools.partial(F.scaled_dot_product_attention, q, k, v, enable_gqa=gqa, **kwargs)
            for q, k, v in copies], ctx


class Attention(OpFamily):
    name = "attention"
    deferred_name, deferred_flag, deferred_reserve_s = "torch-compile", "compile", 40.0
    flops, bytes = staticmethod(suite.attention_flops), staticmethod(suite.attention_bytes)

    def notes(self, env: Env) -> list[str]:
        return super().notes(env) + [f"{m}: attention skipped: {why}" for m, why in suite.skipped_attention().items()]

    def state(self, env: Env, case: dict) -> dict:
        b, hq, hkv, lq, lk, d = (case[n] for n in ("B", "Hq", "Hkv", "Lq", "Lk", "D"))
        dev, gen, dt = env.device, env.seeded(case["id"]), torch.bfloat16
        q = torch.randn(b, hq, lq, d, device=dev, dtype=dt, generator=gen)
        k = torch.randn(b, hkv, lk, d, device=dev, dtype=dt, generator=gen)
        v = torch.randn(b, hkv, lk, d, device=dev, dtype=dt, generator=gen)
        slopes = alibi_slopes(hq, dev)
        group = hq // hkv
        sliced = b * hq * lq * lk > SLICE_SCORES
        if sliced:  # batch 0, the heads of KV group 0
            ref = attention_reference(q[:1, :group], k[:1, :1], v[:1, :1], case["mod"], slopes[:group])
        else:
            ref = attention_reference(q, k, v, case["mod"], slopes)
        return {"copies": env.copies((q, k, v), suite.attention_bytes(case)), "ref": ref, "slopes": slopes,
                "view": (lambda out: out[:1, :group]) if sliced else None}

    def providers(self, env: Env, case: dict, st: dict):
        copies, mod, slopes = st["copies"], case["mod"], st["slopes"]
        for name in _SDPA_BACKENDS:
            calls, ctx = sdpa_provider(name, case, copies)
            yield (name, calls, ctx) if ctx is not None else (name, calls)
        if suite.score_bytes(case) < suite.MATH_SCORE_BYTES:
            math_fn = torch_attention(mod, slopes)
            yield "torch", [functools.partial(math_fn, q, k, v) for q, k, v in copies]
        else:
            yield "torch", {"skipped": "fp32 score matrix >= 2 GiB"}
        yield "flex-attention", self._flex(env, case, st)
        names, left_out, run_provider = our_providers(env, "attention")
        yield from left_out.items()
        for name in names:
            if case["phase"] != "decode" and _split_kv(name):
                yield name, {"skipped": "the split-KV variant is built for decode; prefill cases leave it out (time)"}
                continue
            yield name, [functools.partial(run_provider, name, q, k, v, mod=mod) for q, k, v in copies]

    def _flex(self, env: Env, case: dict, st: dict):
        from torch.nn.attention.flex_attention import create_block_mask

        score_mod, mask_mod = flex_mods(case["mod"], case["Lq"], case["Lk"], st["slopes"], env.device)
        try:  # the block mask is built once per case, outside the timing
            block_mask = create_block_mask(mask_mod, None, None, case["Lq"], case["Lk"], device=env.device) \
                if mask_mod else None
        except Exception as e:  # noqa: BLE001
            env.after_error()
            return {"error": describe(e)}
        gqa = case["Hq"] != case["Hkv"]
        try:  # dynamic shapes: one compile per mod, plus a few recompiles (decode, sizes 0/1)
            compiled = env.compile(("flex-attention", case["mod"]), flex_call,
                                   (*st["copies"][0], score_mod, block_mask, gqa))
        except (OutOfTime, DeviceBroken):
            raise
        except Exception as e:  # noqa: BLE001
            env.after_error()
            return {"error": describe(e)}
        return [functools.partial(compiled, q, k, v, score_mod, block_mask, gqa) for q, k, v in st["copies"]]

    def dispatched(self, env: Env, case: dict, st: dict):
        mod = case["mod"]
        try:
            ops = _ours("attention")
            attention = ops.attention
        except (ImportError, AttributeError) as e:
            yield "dispatched", None, {"error": describe(e)}
            return
        # Each case is one static shape, as every torch provider is timed. The op remembers the last KV length per
        # call class and takes the varying-length provider (no cuDNN) when it changes: without this reset a decode
        # case would inherit the previous case's length and measure the growing-cache choice instead (the block
        # suite resets the same way; bench/host_time.py times the growing cache).
        getattr(ops, "_SEEN_LENGTHS", {}).clear()
        q, k, v = st["copies"][0]
        yield "dispatched", lambda: ops.decide(q, k, v, mod=mod), [
            functools.partial(attention, q, k, v, mod=mod) for q, k, v in st["copies"]]

    def deferred(self, env: Env, case: dict, st: dict) -> list:
        compiled = torch.compile(fresh(torch_attention(case["mod"], st["slopes"])))
        return [functools.partial(compiled, q, k, v) for q, k, v in st["copies"]]


FAMILIES = {"gemm": Gemm(), "attention": Attention()}


# ------------------------------------------------------------------------------------------------------------- run

def configure_torch() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 references must be float32
    torch.backends.cudnn.allow_tf32 = False
    cfg = torch._dynamo.config
    for name, value in (("recompile_limit", 64), ("cache_size_limit", 64), ("accumulated_recompile_limit", 4096),
                        ("accumulated_cache_size_limit", 4096),
                        # past the limit Dynamo would silently run eager under a compiled provider's name: raise
                        ("fail_on_recompile_limit_hit", True), ("fail_on_cache_limit_hit", True)):
        if hasattr(cfg, name):
            setattr(cfg, name, value)
    import torch.fx.experimental._config as fx_config

    fx_config.use_duck_shape = False  # M == K in one case must not become a guard that recompiles the next


PATH_OPTIONS = ("--out", "--resume")


def command_line(argv: list[str]) -> str:
    """The command as typed, its paths relative to the checkout (or bare file names outside it): no machine paths."""
    def clean(path: str) -> str:
        p = Path(path).resolve()
        return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else p.name

    words = [clean(argv[0])]
    for prev, arg in zip(argv, argv[1:]):
        opt, eq, value = arg.partition("=")
        if prev in PATH_OPTIONS:
            arg = clean(arg)
        elif eq and opt in PATH_OPTIONS:
            arg = f"{opt}={clean(value)}"
        words.append(arg)
    return " ".join(["python"] + words)


def device_name(env_device: torch.device) -> str:
    return torch.cuda.get_device_name(env_device) if env_device.type == "cuda" else "cpu"


def new_doc(fam, env: Env, argv: list[str]) -> dict:
    import triton

    return {"suite_version": suite.SUITE_VERSION, "family": fam.name, "device": device_name(env.device),
            "versions": {"torch": torch.__version__, "triton": triton.__version__,
                         "python": platform.python_version()},
            "command": command_line(argv), "timing": fam.timing, "notes": fam.notes(env), "rows": []}


def load_resume(path: Path, family: str, env: Env, cases: list) -> dict:
    """The results file to continue. One of an older suite version keeps the rows whose case this version has
    unchanged (a case's id never changes meaning; its fields say what was measured) and takes this version."""
    doc = json.loads(path.read_text())
    want = {"family": family, "device": device_name(env.device)}
    for key, value in want.items():
        if doc.get(key) != value:
            raise SystemExit(f"--resume {path}: {key} is {doc.get(key)!r}, this run is {value!r}; "
                             "results of different suites or devices do not mix")
    if doc.get("suite_version") != suite.SUITE_VERSION:
        current = {c["id"]: case_fields(c) for c in cases}
        kept = [r for r in doc["rows"] if current.get(r["id"]) == r.get("case")]
        print(f"[suite] --resume {path.name}: suite v{doc.get('suite_version')} -> v{suite.SUITE_VERSION}, "
              f"{len(kept)} of {len(doc['rows'])} row(s) kept (their cases unchanged)", flush=True)
        doc.update(suite_version=suite.SUITE_VERSION, rows=kept)
    return doc


def write_doc(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)  # a run killed mid-write leaves the previous complete file


def select(all_cases: list, args) -> list:
    if args.shard:
        i, n = (int(x) for x in args.shard.split("/"))
        if not 0 <= i < n:
            raise SystemExit(f"--shard {args.shard}: want I/N with 0 <= I < N")
        all_cases = all_cases[i::n]
    if args.match:
        all_cases = [c for c in all_cases if args.match in c["id"]]
    return all_cases[:args.subset] if args.subset else all_cases


def default_out(family: str, env: Env) -> Path:
    if env.smoke:
        return ROOT / ".cache" / "suite" / f"smoke-{family}.json"
    from bench.gpu_ci import device_slug

    return ROOT / "bench" / "results" / f"suite-{family}-{device_slug(device_name(env.device))}.json"


def case_fields(case: dict) -> dict:
    return {k: v for k, v in case.items() if k not in ("id", "model")}


def run_family(args, argv: list[str], fam) -> int:
    """The case loop any family runs (gemm, attention, block): resume, budget, incremental writes, deferred pass.
    A family has: name, timing, cases(smoke), notes(env), row(env, case), deferred_name, deferred_flag,
    deferred_reserve_s, add_deferred(env, case, row) and print_table(doc)."""
    env = Env(args)
    if not env.smoke and not torch.cuda.is_available():
        print("run.py: no CUDA device; on a CPU use --smoke", file=sys.stderr)
        return 2
    configure_torch()
    cases = select(fam.cases(env.smoke), args)
    out = Path(args.out) if args.out else Path(args.resume) if args.resume else default_out(fam.name, env)
    if args.resume:
        doc = load_resume(Path(args.resume), fam.name, env, fam.cases(env.smoke))
        doc["command"] = command_line(argv)
    else:
        doc = new_doc(fam, env, argv)
    env.notes = doc["notes"]
    done = {r["id"] for r in doc["rows"]}
    todo = [c for c in cases if c["id"] not in done]
    print(f"[suite] {fam.name}: {len(todo)} case(s) to run ({len(cases) - len(todo)} already in {out.name}), "
          f"device {doc['device']}, budget {args.time_budget or 'none'} s", flush=True)
    slowest, stopped = 0.0, ""
    try:
        for i, case in enumerate(todo):
            reserve = max(MIN_RESERVE_S, 1.5 * slowest)
            if env.budget.left() < reserve:
                stopped = f"time budget: {env.budget.left():.0f} s left, a case needs ~{reserve:.0f} s"
                break
            t, first = time.perf_counter(), env.first_call_s
            try:
                row = fam.row(env, case)
            except OutOfTime:
                stopped = f"time budget ran out during {case['id']} (not recorded)"
                break
            except DeviceBroken as e:  # recorded, so a --resume does not run into it again
                doc["rows"].append({"id": case["id"], "model": case["model"], "case": case_fields(case),
                                    "error": f"CUDA context broken: {e}"})
                raise
            slowest = max(slowest, time.perf_counter() - t - (env.first_call_s - first))  # compiles excluded
            doc["rows"].append(row)
            write_doc(out, doc)
            if env.cuda:
                torch.cuda.empty_cache()
            print(f"[suite] {i + 1}/{len(todo)} {case['id']}: {time.perf_counter() - t:.1f} s", flush=True)
        by_id = {r["id"]: r for r in doc["rows"] if "providers" in r}
        pending = [] if stopped else [c for c in cases if c.get(fam.deferred_flag) and c["id"] in by_id
                                      and fam.deferred_name not in by_id[c["id"]]["providers"]]
        for j, case in enumerate(pending):
            if env.budget.left() < fam.deferred_reserve_s:
                stopped = (f"time budget: {fam.deferred_name} not measured on {len(pending) - j} marked case(s); "
                           "rerun with --resume")
                break
            try:
                fam.add_deferred(env, case, by_id[case["id"]])
            except OutOfTime:
                stopped = f"time budget ran out during {fam.deferred_name} on {case['id']} (not recorded)"
                break
            write_doc(out, doc)
            print(f"[suite] {fam.deferred_name} {case['id']}: done", flush=True)
    except DeviceBroken as e:
        write_doc(out, doc)
        print(f"[suite] CUDA context broken ({e}); results so far in {out}, rerun with --resume", file=sys.stderr)
        return 1
    write_doc(out, doc)
    fam.print_table(doc)
    print(f"\n[suite] {len(doc['rows'])} row(s) in {out}" + (f"; stopped: {stopped}" if stopped else ""))
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", choices=("gemm", "attention", "block"), required=True)
    sel = p.add_mutually_exclusive_group()
    sel.add_argument("--subset", type=int, help="only the first N cases (the list is most-informative first)")
    sel.add_argument("--shard", help="I/N: every N-th case starting at I (0-based)")
    p.add_argument("--match", help="only the cases whose id contains this text (e.g. /decode/)")
    p.add_argument("--out", help="results JSON (default bench/results/suite-<family>-<device>.json)")
    p.add_argument("--resume", help="a results file of this device (this suite version, or an older one's rows whose "
                   "cases are unchanged): skip the cases it has")
    p.add_argument("--time-budget", type=float, help="seconds from process start; stops cleanly before")
    p.add_argument("--with-triton", action="store_true", help="also time the portable triton provider")
    p.add_argument("--smoke", action="store_true", help="3 tiny cases on the CPU (tests the runner, not the ops)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[:] if argv is None else argv
    args = parser().parse_args(argv[1:])
    # One compile cache for the suite's processes, in the checkout (ignored by git) so that a later run on a warm
    # machine reuses it; the caller's choice wins. Both are read when the first compile happens, not at import.
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(ROOT / ".cache" / "suite" / "inductor"))
    os.environ.setdefault("TRITON_CACHE_DIR", str(ROOT / ".cache" / "suite" / "triton"))
    if args.family == "block":
        from bench.suite.block import Block

        return run_family(args, argv, Block())
    return run_family(args, argv, FAMILIES[args.family])


if __name__ == "__main__":
    sys.exit(main())
