"""What Inductor makes of a spec's reference: its kernels, their IR, their time (GPU), side by side with ours.

`capture(spec, case, shape, out_dir)` compiles the family's eager reference with torch.compile in each mode, each in a
fresh TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR (so the dumps hold only this compile), runs it, reads the kernels
Inductor generated with gen.analysis.scan (Triton source, TTGIR, SASS), times every kernel with torch.profiler (CUDA kernel
times by name, median over iterations) and the whole call with gen.measure.bench.time_ms, and stores the sources and TTGIR under
out_dir/<mode>/. Kernels Inductor launches but did not generate (cuBLAS, cuDNN, flash) come from the profiler and are
marked `origin: extern`.

`side_by_side_markdown(result, manifest_variants)` renders the REPORT.md section. The GPU-free parts
(`kernel_times_from_events`, `join_kernels`, `extern_kind`, `side_by_side_markdown`) are tested on CPU.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import statistics
import tempfile
from pathlib import Path

from ..families import get_family
from ..build.spec_types import KernelSpec

MODES = ("default", "max-autotune")
PROFILE_ITERS = 20
# Device activity that is not a kernel launch of the op.
_NOT_KERNELS = re.compile(r"^(Memcpy|Memset|cudaMemcpy|cudaMemset)", re.I)
# Names of vendor kernels: (regex, class, tensor cores)
_EXTERN = (
    (re.compile(r"flash|fmha|cudnn.*(attn|sdpa)|attention", re.I), "attention-like", True),
    (re.compile(r"gemm|xmma|nvjet|cutlass|cublas|wgmma|hmma|s16816|s1688|tensorop|matmul|_mma", re.I), "matmul", True),
    (re.compile(r"reduce|softmax|norm|sum|max|argmax", re.I), "reduction", None),
)
_TC_SASS = ("UTCHMMA", "UTCQMMA", "UTCIMMA", "HGMMA", "HMMA")


# ---------------------------------------------------------------- pure helpers (CPU-testable)

def extern_kind(name: str) -> tuple[str, bool | None]:
    """(class, tensor cores) of a kernel Inductor did not generate, guessed from its name (None: cannot tell)."""
    for rx, kind, tc in _EXTERN:
        if rx.search(name):
            return kind, tc
    return "pointwise", None


def kernel_times_from_events(events: list, iters: int) -> dict:
    """Per-kernel device time from profiler events [(name, start_us, duration_us)] of `iters` identical calls.

    When the launch sequence repeats exactly, each iteration's time per name (summed over its launches) is taken and the
    median over iterations reported; otherwise the mean per iteration, flagged `approx`. Returns
    {name: {"ms", "calls" (launches per iteration), "approx"?}} in launch order.
    """
    evs = sorted((e for e in events if not _NOT_KERNELS.match(e[0])), key=lambda e: e[1])
    if not evs or iters <= 0:
        return {}
    out = {}
    if len(evs) % iters == 0:
        per = len(evs) // iters
        chunks = [evs[i * per:(i + 1) * per] for i in range(iters)]
        seq = [e[0] for e in chunks[0]]
        if all([e[0] for e in c] == seq for c in chunks):
            for name in dict.fromkeys(seq):
                times = [sum(e[2] for e in c if e[0] == name) for c in chunks]
                out[name] = {"ms": round(statistics.median(times) / 1000.0, 5), "calls": seq.count(name)}
            return out
    for name in dict.fromkeys(e[0] for e in evs):
        mine = [e for e in evs if e[0] == name]
        out[name] = {"ms": round(sum(e[2] for e in mine) / iters / 1000.0, 5), "calls": round(len(mine) / iters, 2),
                     "approx": "mean per call of the op (the launch sequence varied between iterations)"}
    return out


def _safe_name(name: str) -> str:
    return re.sub(r"[^\w.-]", "_", name)[:120]


def join_kernels(scanned: list, times: dict) -> list[dict]:
    """What ran (the profiler's kernels, in launch order) joined with what the dump says about each (gen.analysis.scan).

    A generated kernel the profiler did not see is kept only if an Inductor wrapper launches it (`used`) and there was
    no profile at all; autotuning candidates that were compiled but not launched are dropped.
    """
    by_name = {}
    for k in scanned:
        if k.name not in by_name or (k.used and not by_name[k.name].used):
            by_name[k.name] = k
    rows = []
    names = list(times) if times else [k.name for k in scanned if k.used is not False]
    for name in names:
        t = times.get(name, {})
        k = by_name.get(name)
        if k is not None:
            row = {"name": name, "class": k.kind, "origin": "triton", "tensor_cores": k.tensor_cores,
                   "convert_layouts": k.convert_layouts, "num_warps": k.num_warps, "smem_bytes": k.smem_bytes,
                   "regs": k.regs, "spills": k.spills, "tc_ops": dict(k.tc_ops), "sass": dict(k.sass),
                   "families": list(k.families)}
        else:
            kind, tc = extern_kind(name)
            row = {"name": name, "class": kind, "origin": "extern", "tensor_cores": tc, "convert_layouts": None,
                   "families": []}
        if "ms" in t:
            row["ms"] = t["ms"]
            row["calls"] = t["calls"]
            if "approx" in t:
                row["approx"] = t["approx"]
        rows.append({k2: v for k2, v in row.items() if v is not None})
    return rows


def _fmt_ms(v) -> str:
    return "-" if v is None else f"{v:.4f}"


def _fmt_tc(v) -> str:
    return {True: "yes", False: "no", None: "?"}[v]


def _our_time(variant: dict, label: str) -> float | None:
    prov = f"gen-{variant['target']}"
    for r in variant.get("bench", {}).get("rows", []):
        if r.get("case") == label and r.get("provider") == prov:
            return r.get("ms")
    return None


def side_by_side_markdown(result: dict, variants: list) -> str:
    """REPORT.md section: Inductor's kernels for the reference (per mode) against our shipped variants."""
    label = result.get("label", "")
    flops = result.get("flops")
    lines = [f"Inductor on `{label}` ({result.get('device', 'unknown device')}; torch {result.get('versions', {}).get('torch', '?')}, "
             f"triton {result.get('versions', {}).get('triton', '?')}). Kernel times: torch.profiler, median of "
             f"{result.get('iters', PROFILE_ITERS)} calls; total: gen.measure.bench.time_ms of the whole call. "
             f"Sources and TTGIR of Inductor's kernels: `{result.get('out_dir', 'inductor/')}<mode>/`.", "",
             "| provider | kernels | on tensor cores | convert_layouts | smem B (max) | time ms | TFLOP/s |",
             "|---|---|---|---|---|---|---|"]

    def tflops(ms):
        return f"{flops / ms / 1e9:.1f}" if flops and ms else "-"

    for mode, m in result.get("modes", {}).items():
        ks = m.get("kernels", [])
        if "error" in m:
            lines.append(f"| inductor ({mode}) | failed: {m['error'][:120].replace('|', '/')} | | | | | |")
            continue
        n_triton = sum(1 for k in ks if k["origin"] == "triton")
        count = f"{len(ks)} ({n_triton} Triton, {len(ks) - n_triton} vendor)" if len(ks) != n_triton else str(len(ks))
        tc = sum(1 for k in ks if k.get("tensor_cores"))
        unknown = sum(1 for k in ks if k.get("tensor_cores") is None)
        cvt = [k["convert_layouts"] for k in ks if "convert_layouts" in k]
        smem = [k["smem_bytes"] for k in ks if "smem_bytes" in k]
        lines.append(f"| inductor ({mode}) | {count} | {tc}/{len(ks)}" + (f" ({unknown} unknown)" if unknown else "")
                     + f" | {sum(cvt) if cvt else '-'} | {max(smem) if smem else '-'} | {_fmt_ms(m.get('total_ms'))} | "
                     f"{tflops(m.get('total_ms'))} |")
    for v in variants:
        c = v.get("compile", {})
        instr = c.get("instructions", {})
        tc_ops = [op for op in _TC_SASS if instr.get(op)]
        ms = _our_time(v, label)
        n = len(c.get("kernels", [])) or 1
        lines.append(f"| gen-{v['target']} | {n} | {'yes (' + ', '.join(tc_ops) + ')' if tc_ops else ('no' if instr else '?')} | "
                     f"{c.get('convert_layouts', '-')} | {c.get('smem_bytes', '-')} | {_fmt_ms(ms)} | {tflops(ms)} |")
    lines += ["", "convert_layouts and smem cover the Triton kernels (vendor kernels show no IR); ours come from "
              "the cross-compiled dumps, theirs from Inductor's Triton cache on this device."]
    for mode, m in result.get("modes", {}).items():
        ks = m.get("kernels", [])
        if not ks:
            continue
        total = sum(k.get("ms", 0) for k in ks) or None
        lines += ["", f"Inductor {mode}: {len(ks)} kernel(s) per call",
                  "", "| kernel | class | origin | tensor cores | convert_layouts | warps | smem B | ms | share |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for k in ks:
            share = f"{100 * k['ms'] / total:.0f}%" if total and "ms" in k else "-"
            calls = f" x{k['calls']}" if k.get("calls", 1) != 1 else ""
            lines.append(f"| `{k['name']}`{calls} | {k['class']} | {k['origin']} | {_fmt_tc(k.get('tensor_cores'))} | "
                         f"{k.get('convert_layouts', '-')} | {k.get('num_warps', '-')} | {k.get('smem_bytes', '-')} | "
                         f"{_fmt_ms(k.get('ms'))} | {share} |")
    return "\n".join(lines) + "\n"


def manifest_entry(result: dict, variants: list) -> dict:
    """What the manifest keeps under "inductor" (manifest.report_markdown prints its "markdown")."""
    return {"capture": result, "markdown": side_by_side_markdown(result, variants)}


# ---------------------------------------------------------------- GPU side

def reference_call(spec: KernelSpec, case: dict, shape, device: str = "cuda"):
    """(fn, args, flops): the family's eager reference, what a user writes in PyTorch, on fresh inputs."""
    import torch

    fam = get_family(spec.family)
    gen = torch.Generator(device="cpu").manual_seed(1)
    inputs = fam.make_inputs(shape, case, spec.options, "cpu", gen)
    return fam.eager_call(inputs, case, shape, spec.options, device)


@contextlib.contextmanager
def fresh_caches(root: Path):
    """Inductor and Triton caches in `root` (empty), in-memory compile caches cleared; the old env restored after."""
    import torch

    keys = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
    old = {k: os.environ.get(k) for k in keys}
    (root / "inductor").mkdir(parents=True, exist_ok=True)
    (root / "triton").mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(root / "inductor")
    os.environ["TRITON_CACHE_DIR"] = str(root / "triton")

    def clear():
        torch._dynamo.reset()
        try:
            from torch._inductor.utils import clear_caches
            clear_caches()
        except ImportError:
            pass
    clear()
    try:
        yield root
    finally:
        clear()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def profile_kernels(fn, iters: int = PROFILE_ITERS) -> dict:
    """Device time per kernel name over `iters` calls of fn (see kernel_times_from_events)."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):  # past compilation, autotuning and CUDA-graph recording (max-autotune records on a later call)
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    events = []
    for e in prof.events():
        if getattr(e, "device_type", None) != DeviceType.CUDA:
            continue
        tr = e.time_range
        events.append((e.name, float(tr.start), float(tr.elapsed_us())))
    return kernel_times_from_events(events, iters)


def _store(kernels: list, scanned: list, mode_dir: Path) -> None:
    """Sources (<name>.py) and TTGIR (<name>.ttgir) of the generated kernels that ran, plus kernels.json."""
    if mode_dir.exists():
        shutil.rmtree(mode_dir)
    mode_dir.mkdir(parents=True)
    by_name = {k.name: k for k in scanned if k.used is not False}
    for row in kernels:
        k = by_name.get(row["name"])
        if k is None:
            continue
        stem = _safe_name(k.name)
        if k.source:
            (mode_dir / f"{stem}.py").write_text(k.source)
            row["source_file"] = f"{stem}.py"
        if k.ttgir:
            (mode_dir / f"{stem}.ttgir").write_text(k.ttgir)
            row["ttgir_file"] = f"{stem}.ttgir"
    (mode_dir / "kernels.json").write_text(json.dumps(kernels, indent=1) + "\n")


def capture(spec: KernelSpec, case: dict, shape, out_dir, modes=MODES, iters: int = PROFILE_ITERS) -> dict:
    """Compile the family's reference with Inductor in each mode and record its kernels (GPU only).

    Returns {"family", "case", "shape", "label", "device", "versions", "flops", "iters", "out_dir",
             "modes": {mode: {"total_ms", "n_kernels", "kernels": [{name, class, origin, tensor_cores, ms, calls,
                                                                   convert_layouts, num_warps, smem_bytes, ...}]}
                      or {"error"}}}.
    A mode that fails to compile or run is recorded with its error, not raised.
    """
    import torch
    import triton

    from .bench import time_ms
    from ..runtime.device import device_info
    from ..analysis.scan import ScanError, scan

    if not torch.cuda.is_available():
        raise RuntimeError("gen.measure.inductor.capture needs a CUDA GPU (it runs and profiles Inductor's kernels)")
    fam = get_family(spec.family)
    out_dir = Path(out_dir)
    fn, args, flops = reference_call(spec, case, shape)
    result = {"family": spec.family, "case": case, "shape": list(shape), "label": fam.case_label(case, shape),
              "device": device_info(0).label, "versions": {"torch": torch.__version__.split("+")[0],
                                                           "triton": triton.__version__},
              "flops": flops, "iters": iters, "out_dir": _display_path(out_dir), "modes": {}}
    for mode in modes:
        with tempfile.TemporaryDirectory(prefix=f"gen-inductor-{mode}-") as tmp, fresh_caches(Path(tmp)):
            try:
                compiled = torch.compile(fn, mode=None if mode == "default" else mode)
                call = lambda: compiled(*args)  # noqa: E731
                call()                                  # compiles (and autotunes) here, inside the fresh caches
                torch.cuda.synchronize()
                times = profile_kernels(call, iters)
                total = time_ms(call)
            except Exception as e:  # one mode failing is a finding, not a crash
                result["modes"][mode] = {"error": f"{type(e).__name__}: {e}"[:1000]}
                continue
            try:
                scanned = scan(tmp)
            except ScanError:
                scanned = []                            # e.g. a graph made only of vendor kernels
        kernels = join_kernels(scanned, times)
        _store(kernels, scanned, out_dir / mode)
        result["modes"][mode] = {"total_ms": round(total, 5), "n_kernels": len(kernels), "kernels": kernels}
    return result


def _display_path(p: Path) -> str:
    from ..cache import REPO_ROOT

    try:
        return str(p.resolve().relative_to(REPO_ROOT)) + "/"
    except ValueError:
        return str(p) + "/"


def main(argv=None) -> int:
    """`python -m gen.measure.inductor specs/gemm.yaml`: capture on this GPU, write generated/<family>/inductor/, print the table."""
    import argparse

    from ..build.manifest import GENERATED, load_record
    from ..build.spec import load_spec

    p = argparse.ArgumentParser(prog="python -m gen.measure.inductor", description=main.__doc__)
    p.add_argument("spec")
    p.add_argument("--mode", action="append", choices=list(MODES), help="only these modes (repeatable)")
    p.add_argument("--out", default=None, help="default: generated/<family>/inductor")
    args = p.parse_args(argv)
    spec = load_spec(args.spec)
    case, shape = get_family(spec.family).capture_case(spec)
    out = Path(args.out) if args.out else GENERATED / spec.family / "inductor"
    result = capture(spec, case, shape, out, modes=tuple(args.mode or MODES))
    (out / "capture.json").write_text(json.dumps(result, indent=1) + "\n")
    record = load_record(GENERATED / spec.family)
    print(side_by_side_markdown(result, [v.to_json() for v in record.variants] if record else []))
    return 0 if all("error" not in m for m in result["modes"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
