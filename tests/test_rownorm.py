"""The RMSNorm-rows pre-pass kernel (gen.runtime.rownorm): its numerics in Triton's interpreter, its compiled code
for the GPUs it runs on (tests/test_api.py runs the generated op's RMSNorm rows through it)."""
import json
import os
import subprocess
import sys

import pytest
import torch

from .conftest import ROOT

INTERPRETED_CHECK = r"""
import json, torch
from gen.runtime.rownorm import row_norms
torch.manual_seed(0)
rows = []
for dtype in (torch.bfloat16, torch.float16, torch.float32):
    # one element; under one loop step; one past a step (a masked tail); several steps; offset and padded rows
    for M, K, pad in ((1, 1, 0), (3, 7, 0), (5, 2049, 3), (2, 4096, 0), (4, 5000, 1)):
        x = (torch.randn(M, K + 2 * pad, dtype=dtype) * torch.arange(1, M + 1).unsqueeze(1))[:, pad:pad + K]
        got = row_norms(x)
        ref = torch.linalg.vector_norm(x.double(), dim=1)
        rows.append({"dtype": str(dtype), "M": M, "K": K, "out": [str(got.dtype), list(got.shape)],
                     "err": ((got.double() - ref).norm() / ref.norm()).item()})
print(json.dumps(rows))
"""


def test_row_norms_match_float64_in_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", INTERPRETED_CHECK], capture_output=True, text=True, env=env,
                          timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(rows) == 15
    for r in rows:
        assert r["out"] == ["torch.float32", [r["M"]]], r
        assert r["err"] < 1e-6, r   # fp32 accumulation of at most 5000 squares


@pytest.mark.parametrize("capability", [90, 100])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_row_norm_kernel_compiles_without_spills_and_loads_16_bytes(capability, dtype):
    """As the run time launches it on a model's rows (8 warps, a 2048-element step; x, K and the row stride
    multiples of 16, as the launcher specializes them): no spill stores and no local memory in the cubin ptxas
    made, and 16-byte vector loads of x (8 elements a thread a step), which is what makes it faster than torch's
    reduction."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from gen.build.compile import _disassemble
    from gen.build.mlir import resource_usage, sass_counts
    from gen.runtime.launch import COMPILE_OPTIONS
    from gen.runtime.rownorm import ROW_BLOCK, ROW_WARPS, row_norms_kernel

    src = ASTSource(row_norms_kernel, {"x_ptr": f"*{dtype}", "out_ptr": "*fp32", "K": "i32", "stride_xm": "i32",
                                       "ROW_BLOCK": "constexpr"},
                    constexprs={"ROW_BLOCK": ROW_BLOCK}, attrs={(i,): [["tt.divisibility", 16]]
                                                               for i in (0, 2, 3)})
    k = triton.compile(src, target=GPUTarget("cuda", capability, 32),
                       options={**COMPILE_OPTIONS, "num_warps": ROW_WARPS})
    ptx = k.asm["ptx"]
    assert "ld.global.v4.b32" in ptx or "ld.global.nc.v4.b32" in ptx, "x is not read in 16-byte vectors"
    usage, sass = _disassemble(k.asm["cubin"])
    assert sass_counts(sass)["STL"] == 0 and resource_usage(usage)["local"] == 0, usage

