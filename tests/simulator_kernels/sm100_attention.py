"""A small single-partition Blackwell attention forward (one 128-row Q tile per program, causal or not):
S = Q K^T in TMEM (fp32), online softmax in registers, P written back over S as packed 16-bit
(`_reinterpret`, col_stride=1), O += P V with P read from TMEM (tcgen05 `a` operand) and O in TMEM."""
import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.blackwell import (
    TensorMemoryLayout,
    allocate_tensor_memory,
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
def attn_fwd_kernel(q_desc, k_desc, v_desc, o_ptr, L, sm_scale, CAUSAL: gl.constexpr, num_warps: gl.constexpr):
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_D: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    dtype: gl.constexpr = q_desc.dtype
    pid_m = gl.program_id(0)
    bh = gl.program_id(1)
    row0 = bh * L  # Q/K/V are [B*H*L, D]; the descriptors clip at the end of the whole tensor only
    off_m = pid_m * BLOCK_M

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, HEAD_D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, HEAD_D], v_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())
    q_bar = bars.index(0)
    kv_bar = bars.index(1)
    s_bar = bars.index(2)
    o_bar = bars.index(3)
    for i in gl.static_range(4):
        mbarrier.init(bars.index(i), count=1)

    s_layout: gl.constexpr = TensorMemoryLayout([BLOCK_M, BLOCK_N], col_stride=1)
    p_layout: gl.constexpr = TensorMemoryLayout([BLOCK_M, BLOCK_N], col_stride=1)
    o_layout: gl.constexpr = TensorMemoryLayout([BLOCK_M, HEAD_D], col_stride=1)
    s_tmem = allocate_tensor_memory(gl.float32, [BLOCK_M, BLOCK_N], s_layout)
    o_tmem = allocate_tensor_memory(gl.float32, [BLOCK_M, HEAD_D], o_layout)
    p_tmem = s_tmem._reinterpret(dtype, [BLOCK_M, BLOCK_N], p_layout)
    s_reg: gl.constexpr = get_tmem_reg_layout(gl.float32, [BLOCK_M, BLOCK_N], s_layout, num_warps)
    p_reg: gl.constexpr = get_tmem_reg_layout(dtype, [BLOCK_M, BLOCK_N], p_layout, num_warps)
    o_reg: gl.constexpr = get_tmem_reg_layout(gl.float32, [BLOCK_M, HEAD_D], o_layout, num_warps)

    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [row0 + off_m, 0], q_bar, q_smem)
    if CAUSAL:
        hi = gl.minimum(off_m + BLOCK_M, L)
    else:
        hi = L
    n_blocks = gl.cdiv(hi, BLOCK_N)
    kv_bytes: gl.constexpr = k_desc.block_type.nbytes + v_desc.block_type.nbytes
    mbarrier.expect(kv_bar, kv_bytes)
    tma.async_copy_global_to_shared(k_desc, [row0, 0], kv_bar, k_smem.index(0))
    tma.async_copy_global_to_shared(v_desc, [row0, 0], kv_bar, v_smem.index(0))
    mbarrier.wait(q_bar, 0)

    rows = off_m + gl.arange(0, BLOCK_M, gl.SliceLayout(1, s_reg))
    m_i = gl.full([BLOCK_M], -float("inf"), gl.float32, gl.SliceLayout(1, s_reg))
    l_i = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, s_reg))
    qk_scale = sm_scale * 1.4426950408889634
    for j in range(n_blocks):
        buf = j % 2
        mbarrier.wait(kv_bar, j & 1)
        if j > 0:
            # O += P V of block j-1 read P from S's columns (and the other K/V buffer, refilled below): it must have
            # completed before this QK overwrites S, since tcgen05 orders MMAs only into the same accumulator
            mbarrier.wait(o_bar, (j - 1) & 1)
        tcgen05_mma(q_smem, k_smem.index(buf).permute((1, 0)), s_tmem, use_acc=False, mbarriers=[s_bar])
        mbarrier.wait(s_bar, j & 1)
        if j + 1 < n_blocks:
            nb = 1 - buf
            mbarrier.expect(kv_bar, kv_bytes)
            tma.async_copy_global_to_shared(k_desc, [row0 + (j + 1) * BLOCK_N, 0], kv_bar, k_smem.index(nb))
            tma.async_copy_global_to_shared(v_desc, [row0 + (j + 1) * BLOCK_N, 0], kv_bar, v_smem.index(nb))
        s = s_tmem.load(s_reg) * qk_scale
        cols = j * BLOCK_N + gl.arange(0, BLOCK_N, gl.SliceLayout(0, s_reg))
        keep = gl.expand_dims(cols, 0) < L
        if CAUSAL:
            keep = keep & (gl.expand_dims(cols, 0) <= gl.expand_dims(rows, 1))
        s = gl.where(keep, s, -float("inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        m_safe = gl.where(m_new == -float("inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_safe)
        p = gl.exp2(s - gl.expand_dims(m_safe, 1))
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new
        if j > 0:
            o = o_tmem.load(o_reg)
            alpha_o = gl.convert_layout(alpha, gl.SliceLayout(1, o_reg))
            o_tmem.store(o * gl.expand_dims(alpha_o, 1))
        p_tmem.store(gl.convert_layout(p.to(dtype), p_reg))
        tcgen05_mma(p_tmem, v_smem.index(buf), o_tmem, use_acc=j > 0, mbarriers=[o_bar])
    mbarrier.wait(o_bar, (n_blocks - 1) & 1)

    o = o_tmem.load(o_reg)
    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_reg))
    o = o / gl.expand_dims(l_o, 1)
    o_rows = off_m + gl.arange(0, BLOCK_M, gl.SliceLayout(1, o_reg))
    o_cols = gl.arange(0, HEAD_D, gl.SliceLayout(0, o_reg))
    ptrs = o_ptr + (row0 + gl.expand_dims(o_rows, 1)).to(gl.int64) * HEAD_D + gl.expand_dims(o_cols, 0)
    gl.store(ptrs, o.to(dtype), mask=gl.expand_dims(o_rows, 1) < L)
    for i in gl.static_range(4):
        mbarrier.invalidate(bars.index(i))


def attention(q, k, v, out, causal, BLOCK_M=128, BLOCK_N=64):
    B, H, L, D = q.shape
    gdt = gl.float16 if q.dtype == torch.float16 else gl.bfloat16
    q2, k2, v2 = (t.reshape(B * H * L, D) for t in (q, k, v))
    q_desc = TensorDescriptor.from_tensor(q2, [BLOCK_M, D], gl.NVMMASharedLayout.get_default_for([BLOCK_M, D], gdt))
    kv_lay = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D], gdt)
    k_desc = TensorDescriptor.from_tensor(k2, [BLOCK_N, D], kv_lay)
    v_desc = TensorDescriptor.from_tensor(v2, [BLOCK_N, D], kv_lay)
    attn_fwd_kernel[(triton.cdiv(L, BLOCK_M), B * H)](q_desc, k_desc, v_desc, out, L, D ** -0.5, causal,
                                                       num_warps=4)


def compile_jobs():
    def d(shape):
        return f"tensordesc<bf16{shape},{gl.NVMMASharedLayout.get_default_for(shape, gl.bfloat16)!r}>"
    return [{"fn": attn_fwd_kernel,
             "signature": {"q_desc": d([128, 64]), "k_desc": d([64, 64]), "v_desc": d([64, 64]), "o_ptr": "*bf16",
                           "L": "i32", "sm_scale": "fp32", "CAUSAL": "constexpr", "num_warps": "constexpr"},
             "constexprs": {"CAUSAL": True, "num_warps": 4}, "options": {"num_warps": 4}}]
