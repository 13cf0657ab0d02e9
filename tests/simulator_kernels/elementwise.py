"""Elementwise kernels: pointer loads/stores with masks, and a TMA round trip through shared memory (sm90+)."""
import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

TARGET = 90


@gluon.jit
def axpy_kernel(x_ptr, y_ptr, out_ptr, alpha, n, BLOCK: gl.constexpr, num_warps: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([4], [32], [num_warps], [0])
    pid = gl.program_id(0)
    offs = pid * BLOCK + gl.arange(0, BLOCK, layout)
    mask = offs < n
    x = gl.load(x_ptr + offs, mask=mask, other=0.0).to(gl.float32)
    y = gl.load(y_ptr + offs, mask=mask, other=0.0).to(gl.float32)
    r = alpha * x + y
    r = gl.where(r > 0, r, gl.exp2(r) - 1.0)
    gl.store(out_ptr + offs, r.to(out_ptr.dtype.element_ty), mask=mask)


@gluon.jit
def rowsum_kernel(x_ptr, out_ptr, M, N, stride_m, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                  num_warps: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [num_warps, 1], [1, 0])
    pid = gl.program_id(0)
    rows = pid * BLOCK_M + gl.arange(0, BLOCK_M, gl.SliceLayout(1, layout))
    cols = gl.arange(0, BLOCK_N, gl.SliceLayout(0, layout))
    acc = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, layout))
    mx = gl.full([BLOCK_M], -float("inf"), gl.float32, gl.SliceLayout(1, layout))
    for n0 in range(0, N, BLOCK_N):
        c = n0 + cols
        mask = (gl.expand_dims(rows, 1) < M) & (gl.expand_dims(c, 0) < N)
        ptrs = x_ptr + gl.expand_dims(rows, 1).to(gl.int64) * stride_m + gl.expand_dims(c, 0)
        x = gl.load(ptrs, mask=mask, other=0.0).to(gl.float32)
        acc += gl.sum(x, axis=1)
        mx = gl.maximum(mx, gl.max(gl.where(mask, x, -float("inf")), axis=1))
    gl.store(out_ptr + rows * 2, acc, mask=rows < M)
    gl.store(out_ptr + rows * 2 + 1, mx, mask=rows < M)


@gluon.jit
def tma_roundtrip_kernel(in_desc, out_desc, scale, num_warps: gl.constexpr):
    BM: gl.constexpr = in_desc.block_type.shape[0]
    BN: gl.constexpr = in_desc.block_type.shape[1]
    layout: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [num_warps, 1], [1, 0])
    smem = gl.allocate_shared_memory(in_desc.dtype, [BM, BN], in_desc.layout)
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    off_m = gl.program_id(0) * BM
    off_n = gl.program_id(1) * BN
    mbarrier.expect(bar, in_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(in_desc, [off_m, off_n], bar, smem)
    mbarrier.wait(bar, 0)
    x = smem.load(layout)
    y = (x.to(gl.float32) * scale + 1.0).to(out_desc.dtype)
    smem.store(y)
    fence_async_shared()
    tma.async_copy_shared_to_global(out_desc, [off_m, off_n], smem)
    tma.store_wait(0)
    mbarrier.invalidate(bar)


@gluon.jit
def _ws_fill(x_ptr, bar, BLOCK: gl.constexpr):
    # worker (1 warp): writes x = 0..BLOCK-1 to global memory, then signals the default partition
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    offs = gl.arange(0, BLOCK, layout)
    gl.store(x_ptr + offs, offs.to(gl.float32))
    mbarrier.arrive(bar, count=1)


@gluon.jit
def _ws_compute(x_ptr, bar, BLOCK: gl.constexpr, num_warps: gl.constexpr):
    # default partition: returns two tensors to the parent region
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
    offs = gl.arange(0, BLOCK, layout)
    mbarrier.wait(bar, 0)
    x = gl.load(x_ptr + offs)
    return x * 2.0, offs


@gluon.jit
def ws_return_kernel(x_ptr, out_ptr, BLOCK: gl.constexpr, num_warps: gl.constexpr):
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    doubled, offs = gl.warp_specialize([
        (_ws_compute, (x_ptr, bar, BLOCK, num_warps)),
        (_ws_fill, (x_ptr, bar, BLOCK)),
    ], [1], [24])
    gl.store(out_ptr + offs, doubled + 1.0)
    mbarrier.invalidate(bar)


def ws_return(x, out, BLOCK=128):
    ws_return_kernel[(1,)](x, out, BLOCK, num_warps=4)


def axpy(x, y, out, alpha, BLOCK=256, num_warps=4):
    n = x.numel()
    axpy_kernel[(triton.cdiv(n, BLOCK),)](x, y, out, alpha, n, BLOCK, num_warps=num_warps)


def rowsum(x, out, BLOCK_M=16, BLOCK_N=32, num_warps=4):
    M, N = x.shape
    rowsum_kernel[(triton.cdiv(M, BLOCK_M),)](x, out, M, N, x.stride(0), BLOCK_M, BLOCK_N, num_warps=num_warps)


def tma_roundtrip(x, out, scale, BM=32, BN=64):
    layout = gl.NVMMASharedLayout.get_default_for([BM, BN], gl.float16)
    in_desc = TensorDescriptor.from_tensor(x, [BM, BN], layout)
    out_desc = TensorDescriptor.from_tensor(out, [BM, BN], layout)
    grid = (triton.cdiv(x.shape[0], BM), triton.cdiv(x.shape[1], BN))
    tma_roundtrip_kernel[grid](in_desc, out_desc, scale, num_warps=4)


def compile_jobs():
    lay = gl.NVMMASharedLayout.get_default_for([32, 64], gl.float16)
    return [
        {"fn": axpy_kernel, "signature": {"x_ptr": "*fp16", "y_ptr": "*fp16", "out_ptr": "*fp16", "alpha": "fp32",
                                          "n": "i32", "BLOCK": "constexpr", "num_warps": "constexpr"},
         "constexprs": {"BLOCK": 256, "num_warps": 4}, "options": {"num_warps": 4}},
        {"fn": rowsum_kernel, "signature": {"x_ptr": "*fp32", "out_ptr": "*fp32", "M": "i32", "N": "i32",
                                            "stride_m": "i32", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr",
                                            "num_warps": "constexpr"},
         "constexprs": {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4}, "options": {"num_warps": 4}},
        {"fn": tma_roundtrip_kernel, "signature": {"in_desc": f"tensordesc<fp16[32, 64],{lay!r}>",
                                                   "out_desc": f"tensordesc<fp16[32, 64],{lay!r}>",
                                                   "scale": "fp32", "num_warps": "constexpr"},
         "constexprs": {"num_warps": 4}, "options": {"num_warps": 4}},
        {"fn": ws_return_kernel, "signature": {"x_ptr": "*fp32", "out_ptr": "*fp32", "BLOCK": "constexpr",
                                               "num_warps": "constexpr"},
         "constexprs": {"BLOCK": 128, "num_warps": 4}, "options": {"num_warps": 4}},
    ]
