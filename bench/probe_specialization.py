"""Which unspecialized int argument slows sm90 attention's window mod at L=1024? (GPU; a one-off probe, kept with
its result in bench/NOTES.md.)

    python bench/probe_specialization.py [OLD_MODULE]

Times generated/attention/sm90.py with different `SHAPE_ARGS` (the ints left unspecialized), and the module before
do_not_specialize (OLD_MODULE), on B=4 H=16 L=1024 for the window and none mods, D=128 and 64, in one run.
"""
import re
import sys
import tempfile
from pathlib import Path

import torch
import triton.testing

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from gen.build.compile import import_file
from gen.runtime.device import device_info

ALL = ("window_left", "window_right", "stride_lb", "stride_lh", "num_tiles", "num_m", "Hq", "GROUP", "Lq", "Lk")


def load(text: str, name: str):
    path = Path(tempfile.mkdtemp()) / f"{name}.py"
    path.write_text(text)
    return import_file(path, name)


def main():
    src = (ROOT / "generated" / "attention" / "sm90.py").read_text()
    variants = {}
    if len(sys.argv) > 1:
        variants["before (specialized)"] = load(Path(sys.argv[1]).read_text(), "old_sm90")
    for label, args in [("all unspecialized", ALL), ("window ints specialized", ALL[2:]),
                        ("GROUP specialized", tuple(a for a in ALL if a != "GROUP")),
                        ("Lq/Lk specialized", ALL[:-2])]:
        text = re.sub(r"^SHAPE_ARGS = .*$", f"SHAPE_ARGS = {args!r}", src, count=1, flags=re.M)
        variants[label] = load(text, "v_" + re.sub(r"\W", "_", label))
    n_sm = device_info(0).num_sms
    for d in (128, 64):
        q, k, v = (torch.randn(4, 16, 1024, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        out = torch.empty_like(q)
        lse = torch.empty(4, 16, 1024, device="cuda", dtype=torch.float32)
        for mod, wl in (("window", 1024), ("none", 0)):
            for label, m in variants.items():
                fn = lambda: m.launch(q, k, v, out, lse, d ** -0.5, mod, wl, 0, 0.0, None, n_sm)
                fn()
                ms = triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")
                print(f"D={d} {mod:7s} {label:26s} {ms * 1000:8.1f} us", flush=True)


if __name__ == "__main__":
    main()
