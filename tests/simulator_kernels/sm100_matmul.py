"""Blackwell (sm_100a) matmuls written for the simulator tests: a software-pipelined single-partition
tcgen05 GEMM (TMEM accumulator, per-slot MMA barriers) and a warp-specialized one (TMA loader warp,
tcgen05 issuer warp, epilogue in the default partition), C = A @ B (B given as [K, N] or [N, K])."""
import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.blackwell import (
    TensorMemoryLayout,
    allocate_tensor_memory,
    fence_async_shared,
    mbarrier,
    tcgen05_commit,
    tcgen05_mma,
    tma,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

try:  # triton <= 3.7; from 3.8 the TMEM descriptor type gives its register layout (templates/_lib/compat.jinja)
    from triton.experimental.gluon.language.nvidia.blackwell import get_tmem_reg_layout
except ImportError:
    from triton.experimental.gluon.language.nvidia.blackwell import tensor_memory_descriptor_type

    @gluon.constexpr_function
    def get_tmem_reg_layout(element_ty, shape, layout, num_warps):
        return tensor_memory_descriptor_type(element_ty, shape, layout, shape).get_reg_layout(num_warps)

TARGET = 100


@gluon.jit
def pipelined_matmul_kernel(a_desc, b_desc, c_desc, K, B_NK: gl.constexpr, STAGES: gl.constexpr,
                            num_warps: gl.constexpr):
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    dtype: gl.constexpr = a_desc.dtype
    a_bufs = gl.allocate_shared_memory(dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    freed = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    done = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(freed.index(i), count=1)
    mbarrier.init(done, count=1)

    tmem_layout: gl.constexpr = TensorMemoryLayout([BLOCK_M, BLOCK_N], col_stride=1)
    acc_tmem = allocate_tensor_memory(gl.float32, [BLOCK_M, BLOCK_N], tmem_layout)

    off_m = gl.program_id(0) * BLOCK_M
    off_n = gl.program_id(1) * BLOCK_N
    k_tiles = gl.cdiv(K, BLOCK_K)
    nbytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes

    for i in gl.static_range(STAGES - 1):
        p = i < k_tiles
        mbarrier.expect(ready.index(i), nbytes, pred=p)
        tma.async_copy_global_to_shared(a_desc, [off_m, i * BLOCK_K], ready.index(i), a_bufs.index(i), pred=p)
        if B_NK:
            tma.async_copy_global_to_shared(b_desc, [off_n, i * BLOCK_K], ready.index(i), b_bufs.index(i), pred=p)
        else:
            tma.async_copy_global_to_shared(b_desc, [i * BLOCK_K, off_n], ready.index(i), b_bufs.index(i), pred=p)

    for ki in range(k_tiles):
        s = ki % STAGES
        mbarrier.wait(ready.index(s), (ki // STAGES) & 1)
        if B_NK:
            b = b_bufs.index(s).permute((1, 0))
        else:
            b = b_bufs.index(s)
        tcgen05_mma(a_bufs.index(s), b, acc_tmem, use_acc=ki > 0, mbarriers=[freed.index(s)])
        nk = ki + STAGES - 1
        if nk < k_tiles:
            ns = nk % STAGES
            # slot ns was last read by MMA ki - 1: wait until it has completed
            mbarrier.wait(freed.index(ns), ((ki - 1) // STAGES) & 1, pred=ki > 0)
            mbarrier.expect(ready.index(ns), nbytes)
            tma.async_copy_global_to_shared(a_desc, [off_m, nk * BLOCK_K], ready.index(ns), a_bufs.index(ns))
            if B_NK:
                tma.async_copy_global_to_shared(b_desc, [off_n, nk * BLOCK_K], ready.index(ns), b_bufs.index(ns))
            else:
                tma.async_copy_global_to_shared(b_desc, [nk * BLOCK_K, off_n], ready.index(ns), b_bufs.index(ns))

    tcgen05_commit(done)
    mbarrier.wait(done, 0)

    reg_layout: gl.constexpr = get_tmem_reg_layout(gl.float32, [BLOCK_M, BLOCK_N], tmem_layout, num_warps)
    acc = acc_tmem.load(reg_layout)
    c_smem = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)
    c_smem.store(acc.to(c_desc.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(c_desc, [off_m, off_n], c_smem)
    tma.store_wait(0)


@gluon.jit
def _ws_loader(a_desc, b_desc, a_bufs, b_bufs, ready, empty, off_m, off_n, k_tiles, STAGES: gl.constexpr):
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    for ki in range(k_tiles):
        s = ki % STAGES
        mbarrier.wait(empty.index(s), ((ki // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(s), a_desc.block_type.nbytes + b_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(a_desc, [off_m, ki * BLOCK_K], ready.index(s), a_bufs.index(s))
        tma.async_copy_global_to_shared(b_desc, [ki * BLOCK_K, off_n], ready.index(s), b_bufs.index(s))


@gluon.jit
def _ws_mma(a_bufs, b_bufs, ready, empty, acc_tmem, acc_bar, k_tiles, STAGES: gl.constexpr):
    for ki in range(k_tiles):
        s = ki % STAGES
        mbarrier.wait(ready.index(s), (ki // STAGES) & 1)
        tcgen05_mma(a_bufs.index(s), b_bufs.index(s), acc_tmem, use_acc=ki > 0)
        tcgen05_commit(empty.index(s))
    tcgen05_commit(acc_bar)


@gluon.jit
def _ws_epilogue(c_desc, acc_tmem, acc_bar, bias_ptr, off_m, off_n, N, num_warps: gl.constexpr):
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
    tmem_layout: gl.constexpr = TensorMemoryLayout([BLOCK_M, BLOCK_N], col_stride=1)
    reg_layout: gl.constexpr = get_tmem_reg_layout(gl.float32, [BLOCK_M, BLOCK_N], tmem_layout, num_warps)
    mbarrier.wait(acc_bar, 0)
    acc = acc_tmem.load(reg_layout)
    offs_n = off_n + gl.arange(0, BLOCK_N, gl.SliceLayout(0, reg_layout))
    bias = gl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0)
    acc = gl.maximum(acc + gl.expand_dims(bias, 0), 0.0)
    c_smem = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)
    c_smem.store(acc.to(c_desc.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(c_desc, [off_m, off_n], c_smem)
    tma.store_wait(0)


@gluon.jit
def ws_matmul_kernel(a_desc, b_desc, c_desc, bias_ptr, N, K, STAGES: gl.constexpr, num_warps: gl.constexpr):
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    dtype: gl.constexpr = a_desc.dtype
    a_bufs = gl.allocate_shared_memory(dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    acc_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    mbarrier.init(acc_bar, count=1)
    acc_tmem = allocate_tensor_memory(gl.float32, [BLOCK_M, BLOCK_N],
                                      TensorMemoryLayout([BLOCK_M, BLOCK_N], col_stride=1))
    off_m = gl.program_id(0) * BLOCK_M
    off_n = gl.program_id(1) * BLOCK_N
    k_tiles = gl.cdiv(K, BLOCK_K)
    gl.warp_specialize([
        (_ws_epilogue, (c_desc, acc_tmem, acc_bar, bias_ptr, off_m, off_n, N, num_warps)),
        (_ws_loader, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, off_m, off_n, k_tiles, STAGES)),
        (_ws_mma, (a_bufs, b_bufs, ready, empty, acc_tmem, acc_bar, k_tiles, STAGES)),
    ], [1, 1], [24, 24])


def _descs(a, b, c, BM, BN, BK, b_nk):
    gdt = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16, torch.float32: gl.float32}
    a_desc = TensorDescriptor.from_tensor(a, [BM, BK], gl.NVMMASharedLayout.get_default_for([BM, BK], gdt[a.dtype]))
    b_blk = [BN, BK] if b_nk else [BK, BN]
    b_desc = TensorDescriptor.from_tensor(b, b_blk, gl.NVMMASharedLayout.get_default_for(b_blk, gdt[b.dtype]))
    c_desc = TensorDescriptor.from_tensor(c, [BM, BN], gl.NVMMASharedLayout.get_default_for([BM, BN], gdt[c.dtype]))
    return a_desc, b_desc, c_desc


def pipelined_matmul(a, b, c, b_nk=False, BM=128, BN=64, BK=32, STAGES=3):
    M, K = a.shape
    N = b.shape[0] if b_nk else b.shape[1]
    a_desc, b_desc, c_desc = _descs(a, b, c, BM, BN, BK, b_nk)
    pipelined_matmul_kernel[(triton.cdiv(M, BM), triton.cdiv(N, BN))](a_desc, b_desc, c_desc, K, b_nk, STAGES,
                                                                      num_warps=4)


def ws_matmul(a, b, bias, c, BM=128, BN=64, BK=32, STAGES=2):
    M, K = a.shape
    N = b.shape[1]
    a_desc, b_desc, c_desc = _descs(a, b, c, BM, BN, BK, False)
    ws_matmul_kernel[(triton.cdiv(M, BM), triton.cdiv(N, BN))](a_desc, b_desc, c_desc, bias, N, K, STAGES,
                                                               num_warps=4)


def compile_jobs():
    def d(shape, ty="fp16", gty=gl.float16):
        return f"tensordesc<{ty}{shape},{gl.NVMMASharedLayout.get_default_for(shape, gty)!r}>"
    return [
        {"fn": pipelined_matmul_kernel,
         "signature": {"a_desc": d([128, 32]), "b_desc": d([64, 32]), "c_desc": d([128, 64]), "K": "i32",
                       "B_NK": "constexpr", "STAGES": "constexpr", "num_warps": "constexpr"},
         "constexprs": {"B_NK": True, "STAGES": 3, "num_warps": 4}, "options": {"num_warps": 4}},
        {"fn": pipelined_matmul_kernel,
         "signature": {"a_desc": d([128, 32]), "b_desc": d([32, 64]), "c_desc": d([128, 64], "fp32", gl.float32),
                       "K": "i32", "B_NK": "constexpr", "STAGES": "constexpr", "num_warps": "constexpr"},
         "constexprs": {"B_NK": False, "STAGES": 3, "num_warps": 4}, "options": {"num_warps": 4}},
        {"fn": ws_matmul_kernel,
         "signature": {"a_desc": d([128, 32]), "b_desc": d([32, 64]), "c_desc": d([128, 64]), "bias_ptr": "*fp32",
                       "N": "i32", "K": "i32", "STAGES": "constexpr", "num_warps": "constexpr"},
         "constexprs": {"STAGES": 2, "num_warps": 4}, "options": {"num_warps": 4}},
    ]
