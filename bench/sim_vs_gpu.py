"""Do the CPU simulator and the GPU agree? Run the shipped sm90 variants on the same inputs in both.

    python bench/sim_vs_gpu.py gpu --out DIR        # on the H200: run generated/<family>/sm90.py, save inputs+outputs
    python bench/sim_vs_gpu.py compare DIR          # here: replay the same inputs in the simulator, compare, record

The record (bench/results/sim_vs_h200.json) lists per case: |sim - gpu| max, and each one's relative error against
the float64 reference.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
FAMILIES = ("gemm", "attention")


def cases_and_inputs(family: str):
    import torch

    from gen.families import get_family
    from gen.build.spec import load_spec

    spec = load_spec(ROOT / "specs" / f"{family}.yaml")
    fam = get_family(family)
    gen = torch.Generator().manual_seed(1234)
    out = []
    for case in fam.simulation_cases(spec):
        for shape in fam.simulation_shapes():
            out.append((fam.case_label(case, shape), case, fam.make_inputs(shape, case, spec.options, "cpu", gen)))
    return spec, out


def run(module, family: str, inputs: dict, device: str, num_sms: int):
    import torch

    from gen.build.spec import load_spec
    from gen.measure.verify import launch_poisoned

    options = load_spec(ROOT / "specs" / f"{family}.yaml").options
    inp = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    return {k: v.cpu() for k, v in launch_poisoned(family, module, inp, options, num_sms).items()}


def gpu(out_dir: Path) -> int:
    import os

    import torch

    from gen.build.compile import import_file
    from gen.runtime.device import device_info

    if os.environ.get("TRITON_INSTRUMENTATION_MODE") == "consan":
        import triton

        # consan (Triton's concurrency sanitizer) needs a global scratch allocation
        triton.set_allocator(lambda n, align, stream: torch.empty(n, dtype=torch.int8, device="cuda"))

    out_dir.mkdir(parents=True, exist_ok=True)
    for family in FAMILIES:
        path = ROOT / "generated" / family / "sm90.py"
        module = import_file(path, f"generated.{family}.sm90")
        _, items = cases_and_inputs(family)
        results = {label: run(module, family, inputs, "cuda", device_info(0).num_sms) for label, _, inputs in items}
        # the inputs travel with the outputs: torch's CPU RNG is not stable across versions (2.11 there, 2.13 here)
        torch.save({"device": device_info(0).label, "results": results,
                    "inputs": {label: inputs for label, _, inputs in items}}, out_dir / f"sim_vs_gpu_{family}.pt")
        print(f"{family}: {len(results)} cases on {device_info(0).label}")
    return 0


def compare(in_dir: Path) -> int:
    import torch

    from gen.families import get_family
    from gen.simulator import load_module
    from gen.measure.accuracy import rel_err

    record = {"command": "python bench/sim_vs_gpu.py gpu (on the H200), then python bench/sim_vs_gpu.py compare",
              "families": {}}
    ok = True
    for family in FAMILIES:
        saved = torch.load(in_dir / f"sim_vs_gpu_{family}.pt")
        spec, items = cases_and_inputs(family)
        text = (ROOT / "generated" / family / "sm90.py").read_text()
        module = load_module(text, f"{family}_sm90_vs_gpu", seed=0)
        rows = []
        if "inputs" not in saved:
            raise SystemExit(f"{in_dir}: this run saved no inputs; rerun the gpu step with this script")
        for label, case, _ in items:
            inputs = saved["inputs"][label]
            sim = run(module, family, inputs, "cpu", 2)
            dev = saved["results"][label]
            ref = get_family(family).reference(inputs, spec.options)
            ref_o = ref if family == "gemm" else ref[0]
            row = {"case": label, "max_abs_sim_vs_gpu": (sim["out"].double() - dev["out"].double()).abs().max().item(),
                   "rel_err_sim": rel_err(sim["out"], ref_o), "rel_err_gpu": rel_err(dev["out"], ref_o)}
            if family == "attention":
                fin = torch.isfinite(ref[1])
                row["lse_max_abs_sim_vs_gpu"] = (sim["lse"][fin].double() - dev["lse"][fin].double()).abs().max().item()
                row["lse_inf_agree"] = bool(torch.equal(torch.isinf(sim["lse"]), torch.isinf(dev["lse"])))
            rows.append(row)
            print(row)
        record["families"][family] = {"device": saved["device"], "rows": rows}
        ok &= all(r["rel_err_sim"] < 1e-2 and r["rel_err_gpu"] < 1e-2 for r in rows)
    (ROOT / "bench" / "results" / "sim_vs_h200.json").write_text(json.dumps(record, indent=1) + "\n")
    print("agree" if ok else "DISAGREE")
    return 0 if ok else 1


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["gpu", "compare"])
    p.add_argument("dir", nargs="?", default=".")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    return gpu(Path(args.out or args.dir)) if args.mode == "gpu" else compare(Path(args.dir))


if __name__ == "__main__":
    sys.exit(main())
