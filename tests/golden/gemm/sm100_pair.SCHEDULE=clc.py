"""GEMM for sm_100a: out = act(a @ b + bias) [+ residual], fp32 accumulation in tensor memory.

Partitions (gl.warp_specialize):
  default  (num_warps)  epilogue: TMEM -> registers in EPI_N-column slices -> bias/activation in fp32 -> smem -> TMA store
  worker 0 (1 warp)     TMA loader: fills the A/B smem ring (ready/empty mbarriers)
  worker 1 (1 warp)     tcgen05 issuer: MMAs into TMEM buffer (tile_count % ACC_BUFFERS), commits acc_ready
All three walk the same persistent grouped tile sequence, so their counters agree without communication.
2-CTA mode: one program is a cluster of two CTAs (num_ctas=2) and owns [2 * BLOCK_M, BLOCK_N] tiles. `ready` and
`acc_empty` are pair barriers: they live in the lead CTA, both CTAs' TMA bytes and epilogue arrivals land there, and
only the lead's MMA warp waits on them (the peer's waits are skipped by the compiler). `empty` and `acc_ready` are each
CTA's own: the lead's MMA commits arrive on both (multicast), so each loader and epilogue waits locally.
"""
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

if __package__:   # generated/<family>/: the package's own copy of the run time
    from .._runtime.gemm_host import GemmPlan as Plan, GluonGemm, tma_compatible
else:             # compiled alone by gen: gen's run time (the same files)
    from gen.runtime.gemm_host import GemmPlan as Plan, GluonGemm, tma_compatible


# Gluon names that moved between Triton releases (templates/_lib/compat.jinja), resolved once here.
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
try:
    from triton.experimental.gluon.language.nvidia.blackwell import get_tmem_reg_layout as _get_tmem_reg_layout
except ImportError:  # triton >= 3.8: the TMEM descriptor type gives its register layout
    _get_tmem_reg_layout = None
from triton.experimental.gluon.language.nvidia.blackwell import tensor_memory_descriptor_type as _tmem_type
from triton.experimental.gluon.language.nvidia.blackwell import tensor_memory_descriptor as _tmem_desc
TMEM_REINTERPRET_PRIVATE = gl.constexpr(hasattr(_tmem_desc, "_reinterpret"))


@gluon.constexpr_function
def tmem_reg_layout(element_ty, shape, layout, num_warps):
    """The register layout of TMEM loads/stores of a `shape` tile in `layout`, by `num_warps` warps."""
    if _get_tmem_reg_layout is not None:
        return _get_tmem_reg_layout(element_ty, shape, layout, num_warps)
    return _tmem_type(element_ty, shape, layout, shape).get_reg_layout(num_warps)


KERNEL_MODE = "gluon"
CONFIG = {'BLOCK_M': 128, 'BLOCK_N': 256, 'BLOCK_K': 64, 'STAGES': 4, 'ACC_BUFFERS': 2, 'EPI_N': 64, 'GROUP_M': 8, 'num_warps': 4, 'SCHEDULE': 'static', 'CTA_PAIR': 1}

BLOCK_M = 128
BLOCK_N = 256
BLOCK_K = 64
GROUP_M = 8
STAGES = 4
ACC_BUFFERS = 2
EPI_N = 64
NUM_WARPS = 4
SMEM_LIMIT = 232448  # bytes of dynamic shared memory per CTA on sm_100
TMEM_COLS = 512
assert ACC_BUFFERS * BLOCK_N <= TMEM_COLS, "TMEM accumulators exceed 512 columns"


@gluon.jit
def ring_slot(counter, NUM_SLOTS: gl.constexpr):
    # Slot and phase parity of the counter-th use of a ring of NUM_SLOTS barriers.
    return counter % NUM_SLOTS, (counter // NUM_SLOTS) & 1


@gluon.jit
def ring_init(bars, NUM_SLOTS: gl.constexpr, ARRIVALS: gl.constexpr):
    for i in gl.static_range(NUM_SLOTS):
        mbarrier.init(bars.index(i), count=ARRIVALS)


@gluon.jit
def ring_invalidate(bars, NUM_SLOTS: gl.constexpr):
    for i in gl.static_range(NUM_SLOTS):
        mbarrier.invalidate(bars.index(i))


@gluon.jit
def producer_acquire(empty_bars, counter, NUM_SLOTS: gl.constexpr):
    # Block until the consumer released the slot of the counter-th fill; return that slot.
    slot, phase = ring_slot(counter, NUM_SLOTS)
    mbarrier.wait(empty_bars.index(slot), phase ^ 1)
    return slot


@gluon.jit
def consumer_wait(ready_bars, counter, NUM_SLOTS: gl.constexpr):
    # Block until the producer filled the slot of the counter-th use; return that slot.
    slot, phase = ring_slot(counter, NUM_SLOTS)
    mbarrier.wait(ready_bars.index(slot), phase)
    return slot


@gluon.jit
def grouped_tile(tile_id, num_pid_m, num_pid_n, GROUP_M: gl.constexpr):
    # Grouped ("super-tile") order: GROUP_M row-tiles share each column sweep, so B tiles stay in L2.
    group_size = GROUP_M * num_pid_n
    group_id = tile_id // group_size
    first_m = group_id * GROUP_M
    rows = gl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile_id % group_size) % rows
    pid_n = (tile_id % group_size) // rows
    return pid_m, pid_n


@gluon.jit
def _tmem_fence_before(dep):
    return gl.inline_asm_elementwise("tcgen05.fence::before_thread_sync;\n mov.b32 $0, $1;", "=r,r", [dep],
                                     dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _tmem_fence_after(dep):
    return gl.inline_asm_elementwise("tcgen05.fence::after_thread_sync;\n mov.b32 $0, $1;", "=r,r", [dep],
                                     dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def apply_activation(x, ACTIVATION: gl.constexpr):
    # fp32 in, fp32 out; ACTIVATION is a constexpr string, so only one branch is compiled.
    if ACTIVATION == "relu":
        x = gl.maximum(x, 0.0)
    elif ACTIVATION == "gelu_tanh":
        # 0.5 * x * (1 + tanh(u)) == x * sigmoid(2u), u = sqrt(2/pi) * (x + 0.044715 x^3): one exp2, one division,
        # and both tails saturate cleanly (exp2 -> inf gives -0, exp2 -> 0 gives x).
        # The constants fold 2 * sqrt(2/pi) and log2(e): t = -2u * log2(e).
        t = x * (-2.302208198144325 - 0.1029432395800235 * x * x)
        x = gl.fdiv(x, 1.0 + gl.exp2(t))
    elif ACTIVATION == "silu":
        x = gl.fdiv(x, 1.0 + gl.exp2(x * -1.4426950408889634))
    return x


@gluon.jit
def bias_activation(acc, bias_ptr, offs_n, N, HAS_BIAS: gl.constexpr, ACTIVATION: gl.constexpr):
    # Bias is added in fp32 whatever its storage dtype; columns past N read 0 (TMA clips their store anyway).
    if HAS_BIAS:
        bias = gl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(gl.float32)
        acc = acc + gl.expand_dims(bias, 0)
    return apply_activation(acc, ACTIVATION)


@gluon.jit
def gated_activation(gate, up, ACTIVATION: gl.constexpr):
    # swiglu: silu(gate) * up; geglu: gelu_tanh(gate) * up (gen.families.gemm.GATED)
    if ACTIVATION == "swiglu":
        out = apply_activation(gate, "silu") * up
    else:
        out = apply_activation(gate, "gelu_tanh") * up
    return out


@gluon.jit
def add_residual(x, res_ptr, offs_r, offs_c, R, C, stride_r, TRANSPOSED: gl.constexpr):
    # x + residual in fp32. offs_r / offs_c: the output rows / columns of x's tile (global indices, each in the
    # slice of x's layout along its axis): x[i, j] is out[offs_r[i], offs_c[j]], or TRANSPOSED (a swap-AB tile of
    # out^T) out[offs_r[j], offs_c[i]]. Rows past R and columns past C read 0 (the TMA store clips them).
    if TRANSPOSED:
        ptrs = res_ptr + gl.expand_dims(offs_c, 1) + gl.expand_dims(offs_r.to(gl.int64) * stride_r, 0)
        mask = gl.expand_dims(offs_c < C, 1) & gl.expand_dims(offs_r < R, 0)
    else:
        ptrs = res_ptr + gl.expand_dims(offs_r.to(gl.int64) * stride_r, 1) + gl.expand_dims(offs_c, 0)
        mask = gl.expand_dims(offs_r < R, 1) & gl.expand_dims(offs_c < C, 0)
    return x + gl.load(ptrs, mask=mask, other=0.0).to(gl.float32)


@gluon.jit
def add_residual_tile(x, res_ptr, off_r, off_c, R, C, stride_r, TRANSPOSED: gl.constexpr):
    # add_residual for the tile whose first output row and column are off_r and off_c, its indices built in x's
    # own layout (whatever layout a split of the accumulator left it in)
    layout: gl.constexpr = x.type.layout
    if TRANSPOSED:   # x is out^T's tile: [output columns, output rows]
        offs_c = off_c + gl.arange(0, x.shape[0], layout=gl.SliceLayout(1, layout))
        offs_r = off_r + gl.arange(0, x.shape[1], layout=gl.SliceLayout(0, layout))
    else:
        offs_r = off_r + gl.arange(0, x.shape[0], layout=gl.SliceLayout(1, layout))
        offs_c = off_c + gl.arange(0, x.shape[1], layout=gl.SliceLayout(0, layout))
    return add_residual(x, res_ptr, offs_r, offs_c, R, C, stride_r, TRANSPOSED)


@gluon.jit
def rms_factors(rms_ptr, offs, R, K, eps):
    # The RMSNorm factors 1 / sqrt(mean(a_row^2) + eps) of output rows offs, from the rows' L2 norms (fp32,
    # rms_ptr[r] = ||a[r, :]||, K = a's columns): rmsnorm(a) @ b = diag(factors) (a @ b). Rows past R take a zero
    # norm's factor (the store clips them).
    norm = gl.load(rms_ptr + offs, mask=offs < R, other=0.0)
    return gl.rsqrt(norm * norm / K + eps)


@gluon.jit
def rms_scale(x, rms_ptr, offs, R, K, eps, AXIS: gl.constexpr):
    # x times its output rows' RMSNorm factors; offs: the output rows along x's AXIS (0: x's rows are output rows;
    # 1: a swap-AB tile of out^T, whose columns are), in the slice of x's layout along that axis.
    return x * gl.expand_dims(rms_factors(rms_ptr, offs, R, K, eps), 1 - AXIS)


@gluon.jit
def rope_table(t_ptr, off_r, col, R, rope_rows, stride_t, like, COL_STEP: gl.constexpr):
    # A RoPE table's values (cos or sin, in fp32) for tile `like`, in its own register layout: rows off_r.. (table
    # row r % rope_rows; rows past R read 0, the store clips them) and table columns col, col + COL_STEP, ...
    layout: gl.constexpr = like.type.layout
    rows = off_r + gl.arange(0, like.shape[0], layout=gl.SliceLayout(1, layout))
    cols = col + COL_STEP * gl.arange(0, like.shape[1], layout=gl.SliceLayout(0, layout))
    ptrs = t_ptr + gl.expand_dims((rows % rope_rows).to(gl.int64) * stride_t, 1) + gl.expand_dims(cols, 0)
    mask = gl.expand_dims(rows < R, 1) & gl.expand_dims(cols >= col, 0)   # (the columns' term: the tile's shape)
    return gl.load(ptrs, mask=mask, other=0.0).to(gl.float32)


@gluon.jit
def rope_pieces(pieces, cos_ptr, sin_ptr, off_r, off_c, R, rope_rows, stride_t, rope_cols, ROPE: gl.constexpr,
                ROPE_D: gl.constexpr):
    # RoPE on an fp32 tile given as its column pieces in order, each W columns wide (W divides ROPE_D / 2), the first
    # at output column off_c (rotate-half: a head's first column), head by head of ROPE_D columns; the heads at
    # rope_cols and past (v's, in a QKV projection: rope_cols is a multiple of ROPE_D) are left alone, their
    # tables unread.
    # ROPE 1, rotate-half: piece k of a head's first half (x1) pairs with piece k of its second half (x2), the same
    # rows and column offsets in one layout: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), each with its own table
    # columns. ROPE 2, interleaved: in each piece the column pairs (2i, 2i + 1), which a thread holds together in
    # the accumulators' layouts, (e, o) -> (e cos - o sin, o cos + e sin).
    W: gl.constexpr = pieces[0].shape[1]
    out = ()
    if ROPE == 1:
        G: gl.constexpr = ROPE_D // (2 * W)   # pieces in half a head
        for h in gl.static_range(len(pieces) // (2 * G)):
            firsts = ()
            seconds = ()
            for k in gl.static_range(G):
                x1 = pieces[2 * G * h + k]
                x2 = pieces[2 * G * h + G + k]
                if off_c + 2 * G * h * W < rope_cols:
                    c1 = rope_table(cos_ptr, off_r, k * W, R, rope_rows, stride_t, x1, 1)
                    s1 = rope_table(sin_ptr, off_r, k * W, R, rope_rows, stride_t, x1, 1)
                    c2 = rope_table(cos_ptr, off_r, G * W + k * W, R, rope_rows, stride_t, x2, 1)
                    s2 = rope_table(sin_ptr, off_r, G * W + k * W, R, rope_rows, stride_t, x2, 1)
                    x1, x2 = x1 * c1 - x2 * s1, x2 * c2 + x1 * s2
                firsts += (x1,)
                seconds += (x2,)
            out += firsts + seconds
    else:
        for j in gl.static_range(len(pieces)):
            x = pieces[j]
            if off_c + j * W < rope_cols:
                e, o = x.reshape(x.shape[0], W // 2, 2).split()
                col = (off_c + j * W) % ROPE_D   # the piece's first column within its head
                ce = rope_table(cos_ptr, off_r, col, R, rope_rows, stride_t, e, 2)
                se = rope_table(sin_ptr, off_r, col, R, rope_rows, stride_t, e, 2)
                co = rope_table(cos_ptr, off_r, col + 1, R, rope_rows, stride_t, o, 2)
                so = rope_table(sin_ptr, off_r, col + 1, R, rope_rows, stride_t, o, 2)
                # (back in x's layout: both arms of the `if` must give one type; no data moves when they agree)
                x = gl.convert_layout(gl.join(e * ce - o * se, o * co + e * so).reshape(x.shape[0], W), x.type.layout)
            out += (x,)
    return out



@gluon.jit
def _load_partition(a_desc, b_desc, a_smem, b_smem, ready, empty, M, N, K,
                    GROUP_M: gl.constexpr, STAGES: gl.constexpr, B_KN: gl.constexpr, GATED: gl.constexpr):
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    if B_KN:
        BLOCK_N: gl.constexpr = b_desc.block_type.shape[1]
    else:
        BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    # Full boxes: TMA zero-fills out-of-bounds rows/columns and still counts them in the transaction bytes.
    # Each CTA expects the bytes of its own half of the cluster's boxes, on the lead's pair barrier.
    STAGE_BYTES: gl.constexpr = a_desc.nbytes_per_cta + b_desc.nbytes_per_cta * (1 + GATED)
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    k_tiles = gl.cdiv(K, BLOCK_K)
    fill = 0
    for tile_id in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n = grouped_tile(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        for ki in range(k_tiles):
            s = producer_acquire(empty, fill, STAGES)
            mbarrier.expect(ready.index(s), STAGE_BYTES)
            _tma_load(a_desc, [off_m, ki * BLOCK_K], ready.index(s), a_smem.index(s), multicast=True)
            if GATED:   # the gate tile at slot 2s, the up projection's (N columns further on) at 2s + 1
                if B_KN:
                    _tma_load(b_desc, [ki * BLOCK_K, off_n], ready.index(s), b_smem.index(2 * s), multicast=True)
                    _tma_load(b_desc, [ki * BLOCK_K, N + off_n], ready.index(s), b_smem.index(2 * s + 1), multicast=True)
                else:
                    _tma_load(b_desc, [off_n, ki * BLOCK_K], ready.index(s), b_smem.index(2 * s), multicast=True)
                    _tma_load(b_desc, [N + off_n, ki * BLOCK_K], ready.index(s), b_smem.index(2 * s + 1), multicast=True)
            else:
                if B_KN:
                    _tma_load(b_desc, [ki * BLOCK_K, off_n], ready.index(s), b_smem.index(s), multicast=True)
                else:
                    _tma_load(b_desc, [off_n, ki * BLOCK_K], ready.index(s), b_smem.index(s), multicast=True)
            fill += 1


@gluon.jit
def _mma_partition(a_smem, b_smem, ready, empty, acc_tmem, acc_ready, acc_empty, M, N, K,
                   BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                   STAGES: gl.constexpr, ACC_BUFFERS: gl.constexpr, B_KN: gl.constexpr, GATED: gl.constexpr):
    num_tiles = gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N)
    k_tiles = gl.cdiv(K, BLOCK_K)
    use = 0  # smem ring uses (consumer side)
    t = 0    # tiles done by this program = TMEM ring fills (producer side)
    for tile_id in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        # The epilogue must have drained this TMEM buffer (from tile t - ACC_BUFFERS) before we overwrite it.
        buf = producer_acquire(acc_empty, t, ACC_BUFFERS)
        _tmem_fence_after(t)   # the epilogue's tcgen05.ld of this buffer happened before our MMAs overwrite it
        use_acc = False  # the first MMA of a tile overwrites the stale accumulator (K >= 1, so it always runs)
        if GATED:   # the gate's accumulator and the up projection's: TMEM buffers 2 buf and 2 buf + 1
            acc = acc_tmem.index(2 * buf)
            up = acc_tmem.index(2 * buf + 1)
        else:
            acc = acc_tmem.index(buf)
        for ki in range(k_tiles):
            s = consumer_wait(ready, use, STAGES)
            if GATED:
                if B_KN:
                    gate_view = b_smem.index(2 * s)
                    up_view = b_smem.index(2 * s + 1)
                else:
                    gate_view = b_smem.index(2 * s).permute((1, 0))
                    up_view = b_smem.index(2 * s + 1).permute((1, 0))
                # Each arrives on empty[s] (count 2) once it has read the stage.
                tcgen05_mma(a_smem.index(s), gate_view, acc, use_acc=use_acc, mbarriers=[empty.index(s)], multicast=True)
                tcgen05_mma(a_smem.index(s), up_view, up, use_acc=use_acc, mbarriers=[empty.index(s)], multicast=True)
            else:
                if B_KN:
                    b_view = b_smem.index(s)  # [BLOCK_K, BLOCK_N], N-major
                else:
                    b_view = b_smem.index(s).permute((1, 0))  # [BLOCK_N, BLOCK_K] K-major, as [BLOCK_K, BLOCK_N]
                # Asynchronous; the hardware arrives on empty[s] once this MMA has read the stage.
                tcgen05_mma(a_smem.index(s), b_view, acc, use_acc=use_acc, mbarriers=[empty.index(s)], multicast=True)
            use_acc = True
            use += 1
        # Arrives once every MMA issued so far (this tile's included) has completed.
        # (in both CTAs of the pair: the commit is multicast to the CTAs whose smem the MMAs read)
        tcgen05_commit(acc_ready.index(buf), descs=[a_smem.index(0), b_smem.index(0)])
        t += 1


@gluon.jit
def _epilogue_partition(c_desc, c_smem, acc_tmem, acc_ready, acc_empty, bias_ptr, res_ptr, rms_ptr, cos_ptr, sin_ptr,
                        M, N, K, stride_rm, rms_eps, rope_rows, stride_cos, rope_cols,
                        BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr,
                        ACC_BUFFERS: gl.constexpr, EPI_BUFFERS: gl.constexpr,
                        HAS_BIAS: gl.constexpr, ACTIVATION: gl.constexpr, GATED: gl.constexpr,
                        RESIDUAL: gl.constexpr, ROW_RMS: gl.constexpr, ROPE: gl.constexpr, ROPE_D: gl.constexpr,
                        num_warps: gl.constexpr):
    EPI_N: gl.constexpr = c_desc.block_type.shape[1]
    SLICES: gl.constexpr = BLOCK_N // EPI_N
    # slices in registers together: RoPE's rotate-half pairs a head's two halves (EPI_N <= ROPE_D / 2), so a whole
    # head's slices (ROPE_D / EPI_N); else one at a time
    if ROPE == 1:
        GROUP: gl.constexpr = ROPE_D // EPI_N
    else:
        GROUP: gl.constexpr = 1
    # the cluster's [BLOCK_M, EPI_N] slice, BLOCK_M / 2 rows in each CTA's TMEM
    slice_tmem_layout: gl.constexpr = TensorMemoryLayout([BLOCK_M // 2, EPI_N], col_stride=1, cga_layout=[[1, 0]],
                                                         two_ctas=True)
    # tcgen05.ld 32x32b: thread i of the partition owns accumulator row i, EPI_N fp32 registers per slice.
    acc_layout: gl.constexpr = tmem_reg_layout(gl.float32, [BLOCK_M, EPI_N], slice_tmem_layout, num_warps)
    col_layout: gl.constexpr = gl.SliceLayout(0, acc_layout)
    row_layout: gl.constexpr = gl.SliceLayout(1, acc_layout)

    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    t = 0      # TMEM ring uses (consumer side)
    store = 0  # TMA stores issued, selects the epilogue smem buffer
    for tile_id in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n = grouped_tile(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        buf = consumer_wait(acc_ready, t, ACC_BUFFERS)
        _tmem_fence_after(t)
        if GATED:
            acc = acc_tmem.index(2 * buf)
            up = acc_tmem.index(2 * buf + 1)
        else:
            acc = acc_tmem.index(buf)
        if ROW_RMS:   # the tile's rows' factors, a [BLOCK_M, 1] column every slice multiplies
            offs_rows = off_m + gl.arange(0, BLOCK_M, layout=row_layout)
            factors = gl.expand_dims(rms_factors(rms_ptr, offs_rows, M, K, rms_eps), 1)
        for g in gl.static_range(SLICES // GROUP):
            ys = ()
            for j in gl.static_range(g * GROUP, (g + 1) * GROUP):
                x = acc.slice(j * EPI_N, EPI_N).load(acc_layout)
                if GATED:
                    u = up.slice(j * EPI_N, EPI_N).load(acc_layout)
                if ROW_RMS:
                    x = x * factors
                    if GATED:
                        u = u * factors
                if j == SLICES - 1:
                    # Whole tile is in registers/smem now: hand the TMEM buffer back to the MMA warp so the
                    # next-but-one tile can start accumulating while we finish this one.
                    _tmem_fence_before(t)   # orders the (waited) tcgen05.ld before the hand-off
                    mbarrier.arrive(acc_empty.index(buf), count=1)
                offs_n = off_n + j * EPI_N + gl.arange(0, EPI_N, layout=col_layout)
                if GATED:   # bias[N:] is the up projection's
                    x = bias_activation(x, bias_ptr, offs_n, N, HAS_BIAS, "none")
                    u = bias_activation(u, bias_ptr + N, offs_n, N, HAS_BIAS, "none")
                    y = gated_activation(x, u, ACTIVATION)
                else:
                    y = bias_activation(x, bias_ptr, offs_n, N, HAS_BIAS, ACTIVATION)
                if RESIDUAL:
                    y = add_residual_tile(y, res_ptr, off_m, off_n + j * EPI_N, M, N, stride_rm, False)
                ys += (y,)
            if ROPE != 0:   # in fp32, before the down-cast (each slice in the TMEM load's layout)
                ys = rope_pieces(ys, cos_ptr, sin_ptr, off_m, off_n + g * GROUP * EPI_N, M, rope_rows, stride_cos,
                                 rope_cols, ROPE, ROPE_D)
            for j in gl.static_range(g * GROUP, (g + 1) * GROUP):
                y = ys[j - g * GROUP].to(c_desc.dtype)
                eb = store % EPI_BUFFERS
                # The store that last read c_smem[eb] was EPI_BUFFERS stores ago: allow the newer ones to stay in
                # flight.
                tma.store_wait(EPI_BUFFERS - 1)
                c_smem.index(eb).store(y)
                fence_async_shared()  # order the generic-proxy smem writes before the async-proxy (TMA) read
                # TMA clips rows >= M and columns >= N.
                _tma_store(c_desc, [off_m, off_n + j * EPI_N], c_smem.index(eb))
                store += 1
        t += 1
    tma.store_wait(0)


# Shape and stride ints are not specialized (no ==1 / %16 variants): one binary per dtype, head dim
# and mod serves every shape, so the precompiled bundle covers every call (zero JIT at import).
SHAPE_ARGS = ("M", "N", "K", "stride_rm", "rope_rows", "stride_cos", "rope_cols")


@gluon.jit(do_not_specialize=SHAPE_ARGS)
def gemm_kernel(a_desc, b_desc, c_desc, bias_ptr, res_ptr, rms_ptr, cos_ptr, sin_ptr, M, N, K, stride_rm, rms_eps,
                rope_rows, stride_cos, rope_cols, HAS_BIAS: gl.constexpr, ACTIVATION: gl.constexpr,
                B_KN: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr, ACC_BUFFERS: gl.constexpr,
                EPI_BUFFERS: gl.constexpr, GATED: gl.constexpr, RESIDUAL: gl.constexpr, ROW_RMS: gl.constexpr,
                ROPE: gl.constexpr, ROPE_D: gl.constexpr, num_warps: gl.constexpr):
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    if B_KN:
        BLOCK_N: gl.constexpr = b_desc.block_type.shape[1]
    else:
        BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    dtype: gl.constexpr = a_desc.dtype

    a_smem = gl.allocate_shared_memory(dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    # GATED: two B tiles a stage (gate, up) at slots 2s and 2s + 1
    b_smem = gl.allocate_shared_memory(dtype, [STAGES * (1 + GATED)] + b_desc.block_type.shape, b_desc.layout)
    c_smem = gl.allocate_shared_memory(c_desc.dtype, [EPI_BUFFERS] + c_desc.block_type.shape, c_desc.layout)

    # smem ring: ready = TMA bytes landed (expect-tx + 1 arrive), empty = tcgen05 MMA finished reading (1 commit).
    # TMEM ring: acc_ready = tile accumulated (1 commit), acc_empty = epilogue drained it (1 arrive).
    # Pair barriers (two_ctas: in the lead CTA; an init count is per CTA, the lead's barrier counts both) for what
    # only the lead's MMA warp waits on; each CTA's own barriers for what the MMA commits signal to both.
    ready = mbarrier.allocate_mbarrier(batch=STAGES, two_ctas=True)
    empty = mbarrier.allocate_mbarrier(batch=STAGES)
    acc_ready = mbarrier.allocate_mbarrier(batch=ACC_BUFFERS)
    acc_empty = mbarrier.allocate_mbarrier(batch=ACC_BUFFERS, two_ctas=True)
    ring_init(ready, STAGES, 1)
    ring_init(empty, STAGES, 1 + GATED)   # GATED: two MMAs read each stage
    ring_init(acc_ready, ACC_BUFFERS, 1)
    ring_init(acc_empty, ACC_BUFFERS, 1)

    # col_stride=1: packed fp32, ACC_BUFFERS * BLOCK_N columns of the 512 (GATED: twice as many buffers, each
    # BLOCK_N / 2 wide: the host halves B's tile).
    # 2-CTA accumulators: each CTA's TMEM holds its BLOCK_M / 2 rows of the cluster's tile
    acc_tmem = allocate_tensor_memory(gl.float32, [ACC_BUFFERS * (1 + GATED), BLOCK_M, BLOCK_N],
                                      TensorMemoryLayout([BLOCK_M // 2, BLOCK_N], col_stride=1, cga_layout=[[1, 0]],
                                                         two_ctas=True))

    gl.warp_specialize([
        (_epilogue_partition, (c_desc, c_smem, acc_tmem, acc_ready, acc_empty, bias_ptr, res_ptr, rms_ptr, cos_ptr,
                               sin_ptr, M, N, K, stride_rm, rms_eps, rope_rows, stride_cos,
                               rope_cols, BLOCK_M, BLOCK_N, GROUP_M, ACC_BUFFERS, EPI_BUFFERS, HAS_BIAS, ACTIVATION,
                               GATED, RESIDUAL, ROW_RMS, ROPE, ROPE_D, num_warps)),
        (_load_partition, (a_desc, b_desc, a_smem, b_smem, ready, empty, M, N, K, GROUP_M, STAGES, B_KN,
                           GATED)),
        (_mma_partition, (a_smem, b_smem, ready, empty, acc_tmem, acc_ready, acc_empty, M, N, K,
                          BLOCK_M, BLOCK_N, BLOCK_K, STAGES, ACC_BUFFERS, B_KN, GATED)),
    ], [1, 1], [24, 24])
    # No ring_invalidate here: the hardware arrivals on empty[] from the last MMAs are not ordered with the
    # epilogue's return, and invalidating a barrier with an arrival in flight is undefined. The kernel ends here.


# ----------------------------------------------------------------------------------------------- host side

_BITS = {"bfloat16": 16, "float16": 16, "float32": 32}


def _epilogue_plan(out_dtype, gated=False, swap=False):
    """(EPI_N, EPI_BUFFERS) for this output dtype: double-buffered slices if they fit next to the A/B ring,
    else narrower slices, else one buffer (then every slice waits for the previous store). Gated, the output tile
    is BLOCK_N / 2 wide (the ring holds the same bytes: two B tiles of that width a stage) and its slices EPI_N / 2
    (the epilogue holds a gate slice and an up slice)."""
    ring = STAGES * (BLOCK_M + BLOCK_N // 2) * BLOCK_K * 2   # per CTA: its A rows and half of the B tile
    barriers = 8 * 2 * (STAGES + ACC_BUFFERS)
    elem = _BITS[out_dtype] // 8
    epi_n = EPI_N // 2 if gated else EPI_N   # gated: a gate slice and an up slice in the registers of one
    while True:
        for bufs in (2, 1):
            if ring + barriers + bufs * BLOCK_M * epi_n * elem <= SMEM_LIMIT:
                return epi_n, bufs
        if epi_n * elem <= 32:  # keep >= 32-byte TMA rows; give up shrinking
            raise ValueError(f"config does not fit in shared memory for {out_dtype} output: {CONFIG}")
        epi_n //= 2


SWAP_AB = 0   # no swap-AB schedule for tcgen05 yet: every call runs unswapped (swap below is always False)


# RoPE (head dim, interleaved) the epilogue rotates: whole heads in a tile (the op sends other calls elsewhere). Not
# rotate-half at D 128: a thread then holds a whole head's row (128 fp32) and its four 64-column table slices, and
# spilled 2 stores on triton 3.7.1 (0 on 3.6.0; CPU cross-compile for sm_100a). Rotating pair by pair (a slice and
# its twin, then the next pair) would shorten those live ranges: not done yet.
ROPE_KINDS = tuple((d, interleaved) for d in (64, 128) for interleaved in (False, True)
                   if BLOCK_N % d == 0 and (interleaved or d < 128))


def _constexprs(has_bias, activation, b_kn, epi_bufs, swap, gated=False, residual=False, row_rms=False,
                rope_kind=(0, False)):
    rope_d, interleaved = rope_kind
    return {"HAS_BIAS": bool(has_bias), "ACTIVATION": activation, "B_KN": bool(b_kn), "GROUP_M": GROUP_M,
            "STAGES": STAGES, "ACC_BUFFERS": ACC_BUFFERS, "EPI_BUFFERS": epi_bufs, "GATED": bool(gated),
            "RESIDUAL": bool(residual), "ROW_RMS": bool(row_rms), "ROPE": 0 if not rope_d else 2 if interleaved else 1,
            "ROPE_D": rope_d, "num_warps": NUM_WARPS}


# The host side (gen/runtime/gemm_host.py, shared with the other Gluon target): descriptor layouts, compile jobs, a plan
# per shape class and the per-call launch.
_HOST = GluonGemm(gemm_kernel, BLOCK_M * 2, BLOCK_N, BLOCK_K, NUM_WARPS, SWAP_AB, _epilogue_plan, _constexprs,
                  cta_pair=True, rope_kinds=ROPE_KINDS)
compile_jobs = _HOST.compile_jobs
plan = _HOST.plan
run = _HOST.run
launch = _HOST.launch
