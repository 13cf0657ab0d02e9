"""Hopper (sm_90a) pipelined GEMM for the simulator tests: TMA ring + async wgmma with one group in flight
(`warpgroup_mma_wait(1)`), register accumulator, C = A @ B (+ optional second kernel with `a` from registers)."""
import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

TARGET = 90


@gluon.jit
def wgmma_matmul_kernel(a_desc, b_desc, c_desc, K, STAGES: gl.constexpr, num_warps: gl.constexpr):
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    dtype: gl.constexpr = a_desc.dtype
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, BLOCK_N, 16])
    a_bufs = gl.allocate_shared_memory(dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    off_m = gl.program_id(0) * BLOCK_M
    off_n = gl.program_id(1) * BLOCK_N
    k_tiles = gl.cdiv(K, BLOCK_K)
    nbytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes
    for i in gl.static_range(STAGES - 1):
        p = i < k_tiles
        mbarrier.expect(ready.index(i), nbytes, pred=p)
        tma.async_copy_global_to_shared(a_desc, [off_m, i * BLOCK_K], ready.index(i), a_bufs.index(i), pred=p)
        tma.async_copy_global_to_shared(b_desc, [i * BLOCK_K, off_n], ready.index(i), b_bufs.index(i), pred=p)
    acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, acc_layout)
    for ki in range(k_tiles):
        s = ki % STAGES
        mbarrier.wait(ready.index(s), (ki // STAGES) & 1)
        acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s), acc, is_async=True)
        # keep one wgmma in flight: the one issued at ki - 1 has retired, so its slot may be refilled
        acc, _, _ = warpgroup_mma_wait(1, deps=[acc, a_bufs.index(s), b_bufs.index(s)])
        nk = ki + STAGES - 1
        if nk < k_tiles:
            ns = nk % STAGES
            mbarrier.expect(ready.index(ns), nbytes)
            tma.async_copy_global_to_shared(a_desc, [off_m, nk * BLOCK_K], ready.index(ns), a_bufs.index(ns))
            tma.async_copy_global_to_shared(b_desc, [nk * BLOCK_K, off_n], ready.index(ns), b_bufs.index(ns))
    acc = warpgroup_mma_wait(0, deps=[acc])
    c_smem = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)
    c_smem.store(acc.to(c_desc.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(c_desc, [off_m, off_n], c_smem)
    tma.store_wait(0)


@gluon.jit
def wgmma_regs_a_kernel(a_ptr, b_desc, c_ptr, M, N, K, num_warps: gl.constexpr):
    # A from registers (DotOperandLayout), B through TMA, synchronous wgmma, plain pointer epilogue.
    BLOCK_K: gl.constexpr = b_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[1]
    BLOCK_M: gl.constexpr = 64
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, BLOCK_N, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    blk: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    b_smem = gl.allocate_shared_memory(b_desc.dtype, b_desc.block_type.shape, b_desc.layout)
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    off_m = gl.program_id(0) * BLOCK_M
    off_n = gl.program_id(1) * BLOCK_N
    rows = off_m + gl.arange(0, BLOCK_M, gl.SliceLayout(1, blk))
    acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, acc_layout)
    phase = 0
    for k0 in range(0, K, BLOCK_K):
        mbarrier.expect(bar, b_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(b_desc, [k0, off_n], bar, b_smem)
        cols = k0 + gl.arange(0, BLOCK_K, gl.SliceLayout(0, blk))
        mask = (gl.expand_dims(rows, 1) < M) & (gl.expand_dims(cols, 0) < K)
        a = gl.load(a_ptr + gl.expand_dims(rows, 1) * K + gl.expand_dims(cols, 0), mask=mask, other=0.0)
        mbarrier.wait(bar, phase)
        phase ^= 1
        acc = warpgroup_mma(gl.convert_layout(a, a_layout), b_smem, acc)
    mbarrier.invalidate(bar)
    out_rows = off_m + gl.arange(0, BLOCK_M, gl.SliceLayout(1, acc_layout))
    out_cols = off_n + gl.arange(0, BLOCK_N, gl.SliceLayout(0, acc_layout))
    mask = (gl.expand_dims(out_rows, 1) < M) & (gl.expand_dims(out_cols, 0) < N)
    gl.store(c_ptr + gl.expand_dims(out_rows, 1) * N + gl.expand_dims(out_cols, 0), acc, mask=mask)


def _gdt(t):
    return {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16, torch.float32: gl.float32}[t.dtype]


def wgmma_matmul(a, b, c, BM=64, BN=64, BK=32, STAGES=3):
    M, K = a.shape
    N = b.shape[1]
    a_desc = TensorDescriptor.from_tensor(a, [BM, BK], gl.NVMMASharedLayout.get_default_for([BM, BK], _gdt(a)))
    b_desc = TensorDescriptor.from_tensor(b, [BK, BN], gl.NVMMASharedLayout.get_default_for([BK, BN], _gdt(b)))
    c_desc = TensorDescriptor.from_tensor(c, [BM, BN], gl.NVMMASharedLayout.get_default_for([BM, BN], _gdt(c)))
    wgmma_matmul_kernel[(triton.cdiv(M, BM), triton.cdiv(N, BN))](a_desc, b_desc, c_desc, K, STAGES, num_warps=4)


def wgmma_regs_a(a, b, c, BN=64, BK=32):
    M, K = a.shape
    N = b.shape[1]
    b_desc = TensorDescriptor.from_tensor(b, [BK, BN], gl.NVMMASharedLayout.get_default_for([BK, BN], _gdt(b)))
    wgmma_regs_a_kernel[(triton.cdiv(M, 64), triton.cdiv(N, BN))](a, b_desc, c, M, N, K, num_warps=4)


def compile_jobs():
    def d(shape, ty="fp16", gty=gl.float16):
        return f"tensordesc<{ty}{shape},{gl.NVMMASharedLayout.get_default_for(shape, gty)!r}>"
    return [
        {"fn": wgmma_matmul_kernel,
         "signature": {"a_desc": d([64, 32]), "b_desc": d([32, 64]), "c_desc": d([64, 64]), "K": "i32",
                       "STAGES": "constexpr", "num_warps": "constexpr"},
         "constexprs": {"STAGES": 3, "num_warps": 4}, "options": {"num_warps": 4}},
        {"fn": wgmma_regs_a_kernel,
         "signature": {"a_ptr": "*fp16", "b_desc": d([32, 64]), "c_ptr": "*fp32", "M": "i32", "N": "i32",
                       "K": "i32", "num_warps": "constexpr"},
         "constexprs": {"num_warps": 4}, "options": {"num_warps": 4}},
    ]
