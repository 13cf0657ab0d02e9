"""Spill report of the sm100 attention variant under the installed Triton (CPU cross-compile, that release's ptxas).

    python bench/sm100_spills.py [--case dtype,head_dim,mod ...] [--set KEY=VALUE ...] [--ptxas] [--dump DIR] [--json F]

Renders templates/sm100/attention.py.jinja with the spec's sm100 config (specs/by_triton/ overrides for this release
included; --set overrides a key on top, for experiments), compiles every compile case (or the --case ones) for sm_100a
in this process with a fresh Triton cache, and prints per case: spill stores (STL) and loads (LDL) in the SASS,
stack bytes, the kernel's registers, each warp_specialize partition's warps/registers, and the SASS figures the gates
count.

--ptxas re-assembles each case's PTX with this release's own ptxas twice: with the flags Triton passes (triton >= 3.7
adds `--regAllocOptLevel=2`, "to work around ptxas 13.x bug") and without that flag (ptxas's default register
allocator), and prints the spill bytes ptxas reports for both. That is the measurement behind README "Limits": on
3.8.0 and 3.9.0 the same PTX has 0 spills without the flag. --dump writes ttgir/llir/ptx/sass per case.
"""
import argparse
import ast
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

REGALLOC_FLAG = "--regAllocOptLevel=2"


def ptxas_spills(ptx: str, with_triton_regalloc: bool) -> dict:
    """ptxas's own -v report for `ptx` (sm_100a), with or without the register-allocator flag Triton >= 3.7 adds."""
    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(100).path
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "k.ptx"
        src.write_text(ptx)
        cmd = [ptxas, "-lineinfo", "-v", *([REGALLOC_FLAG] if with_triton_regalloc else []), "--gpu-name=sm_100a",
               str(src), "-o", str(Path(d) / "k.cubin")]
        log = subprocess.run(cmd, capture_output=True, text=True, timeout=600).stderr
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
    if not m:
        return {"error": log[-500:]}
    return {"stack": int(m.group(1)), "spill_store_bytes": int(m.group(2)), "spill_load_bytes": int(m.group(3))}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", default="")
    ap.add_argument("--case", action="append", default=[], help="dtype,head_dim,mod (repeatable); default: all")
    ap.add_argument("--json", default="")
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE config override (a Python literal)")
    ap.add_argument("--ptxas", action="store_true", help="also re-assemble the PTX with and without " + REGALLOC_FLAG)
    args = ap.parse_args()
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="sm100spill-")
    os.environ.setdefault("GEN_CACHE_DIR", tempfile.mkdtemp(prefix="sm100spill-gen-"))
    import triton
    from triton.backends.nvidia.compiler import get_ptxas_version

    from gen.build import compile as C
    from gen.build import mlir
    from gen.build.render import render_variant
    from gen.build.spec import load_spec

    spec = load_spec(ROOT / "specs" / "attention.yaml")
    cfg = dict(spec.targets["sm100"].config)
    for kv in args.set:
        k, v = kv.split("=", 1)
        cfg[k] = ast.literal_eval(v)
    src = render_variant(spec, "sm100", cfg)
    cases = spec.compile_cases
    if args.case:
        want = [tuple(c.split(",")) for c in args.case]
        cases = [c for c in cases if (c["dtype"], str(c["head_dim"]), c["mod"]) in want]
    ptxas_version = next((l for l in get_ptxas_version(100).splitlines() if "release" in l), "?").strip()
    out = {"triton": triton.__version__, "ptxas": ptxas_version, "config": cfg, "cases": []}
    print(f"triton {triton.__version__}  ptxas: {ptxas_version}\nconfig {cfg}")
    for case in cases:
        arts = [C.Artifact(**d) for d in C._compile_in_this_process(src.text, src.digest, case, "sm100", 100)]
        a = arts[0]
        tag = f"{case['dtype']}-d{case['head_dim']}-{case['mod']}"
        if not a.ok:
            print(tag, "FAILED", a.error[:300])
            out["cases"].append({"case": tag, "ok": False, "error": a.error[:2000]})
            continue
        ru = mlir.resource_usage(a.resource_usage)
        counts = mlir.sass_counts(a.sass)
        parts = mlir.partitions(a.ttgir, ru["regs"])
        # what each partition runs at after the split (setmaxnreg in the PTX: the default partition's own decrease)
        setmaxnreg = sorted(set(re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", a.ptx)))
        row = {"case": tag, "STL": counts.get("STL", 0), "LDL": counts.get("LDL", 0), "stack": ru["stack"],
               "local": ru["local"], "regs": ru["regs"],
               "partitions": " ".join(f"{p['name']}:{p['warps']}w/{p['regs']}" for p in parts),
               "setmaxnreg": [f"{k}{n}" for k, n in setmaxnreg],
               "instr": {k: v for k, v in counts.items() if k not in ("STL", "LDL")}}
        line = (f"{tag:26s} STL {row['STL']:2d} LDL {row['LDL']:2d} stack {row['stack']:3d} regs {row['regs']:3d}  "
                f"{row['partitions']}")
        if args.ptxas:
            row["ptxas_regalloc2"] = ptxas_spills(a.ptx, True)
            row["ptxas_default"] = ptxas_spills(a.ptx, False)
            line += (f"  | ptxas spill-store bytes: with {REGALLOC_FLAG} "
                     f"{row['ptxas_regalloc2'].get('spill_store_bytes')}, without "
                     f"{row['ptxas_default'].get('spill_store_bytes')}")
        else:
            line += f"  {json.dumps(row['instr'])}"
        out["cases"].append(row)
        print(line, flush=True)
        if args.dump:
            d = Path(args.dump)
            d.mkdir(parents=True, exist_ok=True)
            for ext, text in (("ttgir", a.ttgir), ("llir", a.llir), ("ptx", a.ptx), ("sass", a.sass)):
                (d / f"{tag}.{ext}").write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
