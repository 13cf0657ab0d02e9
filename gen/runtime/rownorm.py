"""The RMSNorm-rows pre-pass: the fp32 L2 norm of each row of x [M, K], which the GEMM kernels' epilogues turn into
the factor 1 / sqrt(norm^2 / K + eps).

torch.linalg.vector_norm(x, dim=1, dtype=float32) took 7-8 us of GPU time at M 16-2048, K 3584-8192 on an H100, where
this one-row-per-program kernel took 1.8-4.3 us at the same error (bench/results/rms-prepass-h100.json: at decode M
that is about half of the RMSNorm tax of a linear with rms_eps). It is launched through a `Launcher` (no binder per
call) and specialized on the dtype alone: K and the row stride are run-time arguments, and the loop over K in
ROW_BLOCK chunks serves every width.

Not bundled: Triton compiles it on a GPU's first call per dtype (a fraction of a second; Triton's disk cache keeps
it), as the portable variants' kernels are. On CPU the norms are torch's, except under TRITON_INTERPRET=1, where the
kernel runs in Triton's interpreter (that is how the CPU tests check it).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .launch import shared_launcher

ROW_BLOCK = 2048   # elements of a row per loop step: 8 warps x 32 lanes x 8 bf16 (16-byte loads)
ROW_WARPS = 8      # the fastest of 512/2, 1024/4, 2048/8 at every measured M and K (rms-prepass-h100.json)
INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def row_norms_kernel(x_ptr, out_ptr, K, stride_xm, ROW_BLOCK: tl.constexpr):
    row = tl.program_id(0)
    base = x_ptr + row.to(tl.int64) * stride_xm
    acc = tl.zeros([ROW_BLOCK], tl.float32)
    for k in range(0, K, ROW_BLOCK):
        offs = k + tl.arange(0, ROW_BLOCK)
        v = tl.load(base + offs, mask=offs < K, other=0.0).to(tl.float32)
        acc += v * v
    tl.store(out_ptr + row, tl.sqrt(tl.sum(acc, axis=0)))


def row_norms(x: torch.Tensor) -> torch.Tensor:
    """The fp32 L2 norms of x's rows (x [M, K] with a unit last stride, any float dtype), as
    torch.linalg.vector_norm(x, dim=1, dtype=torch.float32) computes them."""
    if not (x.is_cuda or INTERPRETING) or x.dim() != 2 or x.stride(1) != 1 or x.shape[0] == 0:
        return torch.linalg.vector_norm(x, dim=1, dtype=torch.float32)
    M, K = x.shape
    out = torch.empty(M, device=x.device, dtype=torch.float32)
    launcher = shared_launcher(row_norms_kernel, (x.dtype, x.device.type),
                               {"ROW_BLOCK": ROW_BLOCK, "num_warps": ROW_WARPS})
    args = (x, out, K, x.stride(0))
    launcher((M,), x.device.index or 0, args, lambda: args)
    return out
