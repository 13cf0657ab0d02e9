"""GEMM for sm_90a: out = act(a @ b + bias) [+ residual], fp32 accumulation in registers.

Partitions (gl.warp_specialize):
  default  (num_warps)  consumer warpgroups: async wgmma over the smem ring, one wgmma group in flight; a stage is
                        released (empty arrive) only once the wgmma reading it has retired; then the fused
                        bias/activation epilogue -> smem -> TMA store (asynchronous, double-buffered)
  worker 0 (1 warp)     TMA loader: fills the A/B smem ring (ready/empty mbarriers), running ahead across tiles,
                        so the next tile's first stages land while the consumers run the epilogue
Both walk the same persistent grouped tile sequence, so their ring counters agree without communication.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

if __package__:   # generated/<family>/: the package's own copy of the run time
    from .._runtime.gemm_host import GemmPlan as Plan, GluonGemm, gated_tile_n, tma_compatible
else:             # compiled alone by gen: gen's run time (the same files)
    from gen.runtime.gemm_host import GemmPlan as Plan, GluonGemm, gated_tile_n, tma_compatible


# Gluon names that moved between Triton releases (templates/_lib/compat.jinja), resolved once here.
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global


KERNEL_MODE = "gluon"
CONFIG = {'BLOCK_M': 128, 'BLOCK_N': 256, 'BLOCK_K': 64, 'STAGES': 4, 'GROUP_M': 8, 'EPI_N': 64, 'LOAD_REGS': 24, 'num_warps': 8, 'SWAP_AB': 0}

BLOCK_M = 128
BLOCK_N = 256
BLOCK_K = 64
GROUP_M = 8
STAGES = 4
EPI_N = 64
SWAP_AB = 0
SPLIT_K = 1
LOAD_REGS = 24
NUM_WARPS = 8
SMEM_LIMIT = 232448  # bytes of dynamic shared memory per CTA on sm_90
assert NUM_WARPS % 4 == 0 and BLOCK_M % (16 * NUM_WARPS) == 0, "each warp needs whole 16-row wgmma slabs"
assert BLOCK_N <= 256 and BLOCK_N % EPI_N == 0
assert SPLIT_K >= 1 and not (SPLIT_K > 1 and SWAP_AB), "split-K runs unswapped"


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
def _split_n(x, PIECES: gl.constexpr):
    # Split a register tile into PIECES column blocks, in order. Each halving reshapes N into (2, N/2) and splits
    # on the 2: in the wgmma layout the high column bits are register bits, so no data moves between threads.
    xs = (x,)
    for _ in gl.static_range(PIECES.bit_length() - 1):
        halves = ()
        for i in gl.static_range(len(xs)):
            y = xs[i]
            halves += y.reshape(y.shape[0], 2, y.shape[1] // 2).permute(0, 2, 1).split()
        xs = halves
    return xs


@gluon.jit
def bias_rows_activation(acc, bias_ptr, offs_r, R, HAS_BIAS: gl.constexpr, ACTIVATION: gl.constexpr):
    # The swapped tile holds out^T: the bias runs along its rows (global row indices offs_r, rows past R read 0).
    if HAS_BIAS:
        bias = gl.load(bias_ptr + offs_r, mask=offs_r < R, other=0.0).to(gl.float32)
        acc = acc + gl.expand_dims(bias, 1)
    return apply_activation(acc, ACTIVATION)


@gluon.jit
def _k_range(item, SPLITS, k_tiles, PARTIAL: gl.constexpr):
    # Work item -> (output tile, K blocks [lo, hi) of its slice): slices of a tile are adjacent items. Unsplit
    # (PARTIAL false) an item is a tile with all of K: the constexpr keeps those kernels' code as it was.
    if PARTIAL:
        k_per = gl.cdiv(k_tiles, SPLITS)
        lo = (item % SPLITS) * k_per
        return item // SPLITS, lo, gl.minimum(lo + k_per, k_tiles)
    else:
        return item, 0, k_tiles


@gluon.jit
def _work_items(tiles, SPLITS, PARTIAL: gl.constexpr):
    if PARTIAL:
        return tiles * SPLITS
    else:
        return tiles


@gluon.jit
def _load_partition(a_desc, b_desc, a_smem, b_smem, ready, empty, M, N, K, SPLITS,
                    GROUP_M: gl.constexpr, STAGES: gl.constexpr, B_KN: gl.constexpr, PARTIAL: gl.constexpr,
                    SWAP_AB: gl.constexpr, GATED: gl.constexpr):
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    if B_KN:
        BLOCK_N: gl.constexpr = b_desc.block_type.shape[1]
    else:
        BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    # Full boxes: TMA zero-fills out-of-bounds rows/columns and still counts them in the transaction bytes.
    # GATED: the weight operand (B, or A swapped) has two tiles a stage, the gate's and the up projection's.
    STAGE_BYTES: gl.constexpr = (a_desc.block_type.nbytes * (1 + (GATED and SWAP_AB))
                                 + b_desc.block_type.nbytes * (1 + (GATED and not SWAP_AB)))
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    k_tiles = gl.cdiv(K, BLOCK_K)
    fill = 0
    for item in range(gl.program_id(0), _work_items(num_pid_m * num_pid_n, SPLITS, PARTIAL), gl.num_programs(0)):
        tile_id, k_lo, k_hi = _k_range(item, SPLITS, k_tiles, PARTIAL)
        pid_m, pid_n = grouped_tile(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        for ki in range(k_lo, k_hi):
            s = producer_acquire(empty, fill, STAGES)
            mbarrier.expect(ready.index(s), STAGE_BYTES)
            if GATED:
                if SWAP_AB:   # the weight is A: its gate rows, and its up rows M (the output's N) further on
                    _tma_load(a_desc, [off_m, ki * BLOCK_K], ready.index(s), a_smem.index(2 * s))
                    _tma_load(a_desc, [M + off_m, ki * BLOCK_K], ready.index(s), a_smem.index(2 * s + 1))
                    _tma_load(b_desc, [off_n, ki * BLOCK_K], ready.index(s), b_smem.index(s))
                else:         # the weight is B: its gate columns, and its up columns N further on
                    _tma_load(a_desc, [off_m, ki * BLOCK_K], ready.index(s), a_smem.index(s))
                    if B_KN:
                        _tma_load(b_desc, [ki * BLOCK_K, off_n], ready.index(s), b_smem.index(2 * s))
                        _tma_load(b_desc, [ki * BLOCK_K, N + off_n], ready.index(s), b_smem.index(2 * s + 1))
                    else:
                        _tma_load(b_desc, [off_n, ki * BLOCK_K], ready.index(s), b_smem.index(2 * s))
                        _tma_load(b_desc, [N + off_n, ki * BLOCK_K], ready.index(s), b_smem.index(2 * s + 1))
            else:
                _tma_load(a_desc, [off_m, ki * BLOCK_K], ready.index(s), a_smem.index(s))
                if B_KN:
                    _tma_load(b_desc, [ki * BLOCK_K, off_n], ready.index(s), b_smem.index(s))
                else:
                    _tma_load(b_desc, [off_n, ki * BLOCK_K], ready.index(s), b_smem.index(s))
            fill += 1


@gluon.jit
def _mma_epilogue_partition(a_smem, b_smem, ready, empty, c_desc, c_smem, bias_ptr, res_ptr, rms_ptr, cos_ptr,
                            sin_ptr, M, N, K, SPLITS, stride_rm, rms_eps, rope_rows, stride_cos, rope_cols,
                            BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                            GROUP_M: gl.constexpr, STAGES: gl.constexpr, EPI_BUFFERS: gl.constexpr,
                            HAS_BIAS: gl.constexpr, ACTIVATION: gl.constexpr, B_KN: gl.constexpr,
                            SWAP_AB: gl.constexpr, PARTIAL: gl.constexpr, GATED: gl.constexpr,
                            RESIDUAL: gl.constexpr, ROW_RMS: gl.constexpr, ROPE: gl.constexpr, ROPE_D: gl.constexpr,
                            num_warps: gl.constexpr):
    # PARTIAL (split-K): c_desc is the fp32 workspace [SPLITS * M_pad, N]; each slice's raw product goes to its own
    # M_pad rows (M_pad = M rounded up to BLOCK_M, so slices never overlap) and the reduce kernel applies the epilogue.
    # Swapped, the kernel's M and N are the output's columns and rows, and c_desc's box is [EPI_N, BLOCK_M].
    if SWAP_AB:
        EPI_N: gl.constexpr = c_desc.block_type.shape[0]
    else:
        EPI_N: gl.constexpr = c_desc.block_type.shape[1]
    # Cooperative: warps stack along M (16 rows each per wgmma), so warpgroup g owns rows [64g, 64g + 64) of every
    # 64 * num_warps / 4 rows and the whole BLOCK_N width: one m64nBLOCK_Nk16 wgmma per warpgroup per k16.
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, BLOCK_N, 16])
    col_layout: gl.constexpr = gl.SliceLayout(0, acc_layout)
    row_layout: gl.constexpr = gl.SliceLayout(1, acc_layout)

    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    k_tiles = gl.cdiv(K, BLOCK_K)
    use = 0    # smem ring uses (consumer side)
    store = 0  # TMA stores issued, selects the epilogue smem buffer
    for item in range(gl.program_id(0), _work_items(num_pid_m * num_pid_n, SPLITS, PARTIAL), gl.num_programs(0)):
        tile_id, k_lo, k_hi = _k_range(item, SPLITS, k_tiles, PARTIAL)
        pid_m, pid_n = grouped_tile(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N

        acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, acc_layout)
        if GATED:
            up = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, acc_layout)   # the up projection's product
        prev = 0
        for ki in range(k_lo, k_hi):
            s = consumer_wait(ready, use, STAGES)
            if GATED:
                if SWAP_AB:
                    b_view = b_smem.index(s).permute((1, 0))
                    acc = warpgroup_mma(a_smem.index(2 * s), b_view, acc, is_async=True)
                    up = warpgroup_mma(a_smem.index(2 * s + 1), b_view, up, is_async=True)
                else:
                    if B_KN:
                        gate_view = b_smem.index(2 * s)
                        up_view = b_smem.index(2 * s + 1)
                    else:
                        gate_view = b_smem.index(2 * s).permute((1, 0))
                        up_view = b_smem.index(2 * s + 1).permute((1, 0))
                    acc = warpgroup_mma(a_smem.index(s), gate_view, acc, is_async=True)
                    up = warpgroup_mma(a_smem.index(s), up_view, up, is_async=True)
                # Keep this stage's two wgmmas in flight; the previous stage's have retired.
                acc, up = warpgroup_mma_wait(num_outstanding=2, deps=[acc, up])
            else:
                if B_KN:
                    b_view = b_smem.index(s)  # [BLOCK_K, BLOCK_N], N-major
                else:
                    b_view = b_smem.index(s).permute((1, 0))  # [BLOCK_N, BLOCK_K] K-major, viewed as [BLOCK_K, BLOCK_N]
                acc = warpgroup_mma(a_smem.index(s), b_view, acc, is_async=True)
                # Keep this wgmma in flight; the previous one has retired, so nothing reads its stage any more.
                acc = warpgroup_mma_wait(num_outstanding=1, deps=[acc])
            # (The arrive is one elected thread after a partition-wide bar.sync, so both warpgroups have retired.)
            mbarrier.arrive(empty.index(prev), count=1, pred=ki > k_lo)
            prev = s
            use += 1
        if GATED:
            acc, up = warpgroup_mma_wait(num_outstanding=0, deps=[acc, up])
        else:
            acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
        mbarrier.arrive(empty.index(prev), count=1)

        # Epilogue in fp32, then one down-cast (a residual is added slice by slice before it); the loader is
        # already filling the next tile's stages.
        if PARTIAL:
            out = acc
            off_m += (item % SPLITS) * (num_pid_m * BLOCK_M)   # this slice's rows of the workspace
        elif SWAP_AB:
            offs_r = off_m + gl.arange(0, BLOCK_M, layout=row_layout)
            if ROW_RMS:   # out^T's tile: the output rows are its columns (the kernel's N side)
                offs_rows = off_n + gl.arange(0, BLOCK_N, layout=col_layout)
                acc = rms_scale(acc, rms_ptr, offs_rows, N, K, rms_eps, 1)
                if GATED:
                    up = rms_scale(up, rms_ptr, offs_rows, N, K, rms_eps, 1)
            if GATED:   # bias[M:] is the up projection's
                acc = bias_rows_activation(acc, bias_ptr, offs_r, M, HAS_BIAS, "none")
                up = bias_rows_activation(up, bias_ptr + M, offs_r, M, HAS_BIAS, "none")
                out = gated_activation(acc, up, ACTIVATION)
            else:
                out = bias_rows_activation(acc, bias_ptr, offs_r, M, HAS_BIAS, ACTIVATION)
        else:
            offs_n = off_n + gl.arange(0, BLOCK_N, layout=col_layout)
            if ROW_RMS:
                offs_rows = off_m + gl.arange(0, BLOCK_M, layout=row_layout)
                acc = rms_scale(acc, rms_ptr, offs_rows, M, K, rms_eps, 0)
                if GATED:
                    up = rms_scale(up, rms_ptr, offs_rows, M, K, rms_eps, 0)
            if GATED:   # bias[N:] is the up projection's
                acc = bias_activation(acc, bias_ptr, offs_n, N, HAS_BIAS, "none")
                up = bias_activation(up, bias_ptr + N, offs_n, N, HAS_BIAS, "none")
                out = gated_activation(acc, up, ACTIVATION)
            else:
                out = bias_activation(acc, bias_ptr, offs_n, N, HAS_BIAS, ACTIVATION)
        if not RESIDUAL and ROPE == 0:
            out = out.to(c_desc.dtype)
        pieces = _split_n(out, BLOCK_N // EPI_N)
        if ROPE != 0:   # the store slices rotated in fp32 (EPI_N <= ROPE_D / 2), each in its own layout
            pieces = rope_pieces(pieces, cos_ptr, sin_ptr, off_m, off_n, M, rope_rows, stride_cos, rope_cols, ROPE,
                                 ROPE_D)
        for j in gl.static_range(BLOCK_N // EPI_N):
            piece = pieces[j]
            if RESIDUAL:   # read in the slice's own register layout, before the wait below so the two overlap
                if SWAP_AB:   # out^T's tile: its rows are output columns (kernel M), its columns output rows
                    piece = add_residual_tile(piece, res_ptr, off_n + j * EPI_N, off_m, N, M, stride_rm, True)
                else:
                    piece = add_residual_tile(piece, res_ptr, off_m, off_n + j * EPI_N, M, N, stride_rm, False)
            if RESIDUAL or ROPE != 0:
                piece = piece.to(c_desc.dtype)
            eb = store % EPI_BUFFERS
            # The store that last read c_smem[eb] was EPI_BUFFERS stores ago: the newer ones may stay in flight.
            tma.store_wait(EPI_BUFFERS - 1)
            if SWAP_AB:
                c_smem.index(eb).store(piece.permute(1, 0))   # out^T's columns j are output rows
            else:
                c_smem.index(eb).store(piece)
            fence_async_shared()  # order the generic-proxy smem writes before the async-proxy (TMA) read
            # TMA clips rows and columns past the output's edges.
            if SWAP_AB:
                _tma_store(c_desc, [off_n + j * EPI_N, off_m], c_smem.index(eb))
            else:
                _tma_store(c_desc, [off_m, off_n + j * EPI_N], c_smem.index(eb))
            store += 1
    tma.store_wait(0)


# Shape and stride ints are not specialized (no ==1 / %16 variants): one binary per dtype, head dim
# and mod serves every shape, so the precompiled bundle covers every call (zero JIT at import).
SHAPE_ARGS = ("M", "N", "K", "SPLITS", "stride_rm", "rope_rows", "stride_cos", "rope_cols")


@gluon.jit(do_not_specialize=SHAPE_ARGS)
def gemm_kernel(a_desc, b_desc, c_desc, bias_ptr, res_ptr, rms_ptr, cos_ptr, sin_ptr, M, N, K, SPLITS, stride_rm,
                rms_eps, rope_rows, stride_cos, rope_cols, HAS_BIAS: gl.constexpr, ACTIVATION: gl.constexpr,
                B_KN: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr, EPI_BUFFERS: gl.constexpr,
                LOAD_REGS: gl.constexpr, SWAP_AB: gl.constexpr, PARTIAL: gl.constexpr, GATED: gl.constexpr,
                RESIDUAL: gl.constexpr, ROW_RMS: gl.constexpr, ROPE: gl.constexpr, ROPE_D: gl.constexpr,
                num_warps: gl.constexpr):
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    if B_KN:
        BLOCK_N: gl.constexpr = b_desc.block_type.shape[1]
    else:
        BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    dtype: gl.constexpr = a_desc.dtype

    # GATED: two weight tiles a stage (gate, up) at slots 2s and 2s + 1
    a_smem = gl.allocate_shared_memory(dtype, [STAGES * (1 + (GATED and SWAP_AB))] + a_desc.block_type.shape,
                                       a_desc.layout)
    b_smem = gl.allocate_shared_memory(dtype, [STAGES * (1 + (GATED and not SWAP_AB))] + b_desc.block_type.shape,
                                       b_desc.layout)
    c_smem = gl.allocate_shared_memory(c_desc.dtype, [EPI_BUFFERS] + c_desc.block_type.shape, c_desc.layout)

    # smem ring: ready = TMA bytes landed (expect-tx + 1 arrive), empty = consumers' wgmma retired (1 arrive).
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ring_init(ready, STAGES, 1)
    ring_init(empty, STAGES, 1)

    gl.warp_specialize([
        (_mma_epilogue_partition, (a_smem, b_smem, ready, empty, c_desc, c_smem, bias_ptr, res_ptr, rms_ptr, cos_ptr,
                                   sin_ptr, M, N, K, SPLITS, stride_rm, rms_eps, rope_rows, stride_cos, rope_cols,
                                   BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, STAGES, EPI_BUFFERS, HAS_BIAS, ACTIVATION,
                                   B_KN, SWAP_AB, PARTIAL, GATED, RESIDUAL, ROW_RMS, ROPE, ROPE_D, num_warps)),
        (_load_partition, (a_desc, b_desc, a_smem, b_smem, ready, empty, M, N, K, SPLITS, GROUP_M, STAGES, B_KN,
                           PARTIAL, SWAP_AB, GATED)),
    ], [1], [LOAD_REGS])

    ring_invalidate(ready, STAGES)
    ring_invalidate(empty, STAGES)


# ----------------------------------------------------------------------------------------------- host side

_BITS = {"bfloat16": 16, "float16": 16, "float32": 32}


def _stages(gated_swap):
    """The ring's depth: STAGES, or for a gated swapped call (two 64-row weight tiles a stage) as many as fit
    beside a double-buffered fp32 epilogue slice."""
    if not gated_swap:
        return STAGES
    per_stage = (2 * BLOCK_M + BLOCK_N) * BLOCK_K * 2
    return min(STAGES, (SMEM_LIMIT - 2 * BLOCK_M * EPI_N * 4) // (per_stage + 16))


def _epilogue_plan(out_dtype, gated=False, swap=False):
    """(EPI_N, EPI_BUFFERS) for this output dtype: double-buffered slices if they fit next to the A/B ring,
    else narrower slices, else one buffer (then every slice waits for the previous store). Gated unswapped, the
    output tile is gated_tile_n(BLOCK_N) wide (two weight tiles of that width a stage)."""
    stages = _stages(gated and swap)
    b_cols = 2 * gated_tile_n(BLOCK_N) if gated and not swap else BLOCK_N   # a stage's B columns (gated: two tiles)
    ring = stages * ((1 + (gated and swap)) * BLOCK_M + b_cols) * BLOCK_K * 2
    barriers = 8 * 2 * stages
    elem = _BITS[out_dtype] // 8
    epi_n = min(EPI_N, gated_tile_n(BLOCK_N)) if gated and not swap else EPI_N
    while True:
        for bufs in (2, 1):
            if ring + barriers + bufs * BLOCK_M * epi_n * elem <= SMEM_LIMIT:
                return epi_n, bufs
        if epi_n * elem <= 32:  # keep >= 32-byte TMA rows; give up shrinking
            raise ValueError(f"config does not fit in shared memory for {out_dtype} output: {CONFIG}")
        epi_n //= 2


# RoPE (head dim, interleaved) the epilogue rotates: unswapped and unsplit, whole heads in a tile (the op sends
# other calls elsewhere). Not rotate-half at D 128 with a 128 x 256 tile: beside its 128 accumulator registers a
# thread's four table slices spilled 44-52 stores (CPU cross-compile for sm_90a, triton 3.6.0, store slices of 64
# and of 32 columns, the tables read in either order); the 128 x 128 and 64 x 128 tiles take it with none.
ROPE_KINDS = () if SWAP_AB or SPLIT_K > 1 else tuple(
    (d, interleaved) for d in (64, 128) for interleaved in (False, True)
    if BLOCK_N % d == 0 and (interleaved or d < 128 or BLOCK_M * BLOCK_N < 128 * 256))


def _constexprs(has_bias, activation, b_kn, epi_bufs, swap, gated=False, residual=False, row_rms=False,
                rope_kind=(0, False)):
    rope_d, interleaved = rope_kind
    return {"HAS_BIAS": bool(has_bias), "ACTIVATION": activation, "B_KN": bool(b_kn), "GROUP_M": GROUP_M,
            "STAGES": _stages(gated and swap), "EPI_BUFFERS": epi_bufs, "LOAD_REGS": LOAD_REGS,
            "SWAP_AB": bool(swap), "PARTIAL": SPLIT_K > 1, "GATED": bool(gated), "RESIDUAL": bool(residual),
            "ROW_RMS": bool(row_rms), "ROPE": 0 if not rope_d else 2 if interleaved else 1, "ROPE_D": rope_d,
            "num_warps": NUM_WARPS}


# The host side (gen/runtime/gemm_host.py, shared with the other Gluon target): descriptor layouts, compile jobs, a plan
# per shape class and the per-call launch.
_HOST = GluonGemm(gemm_kernel, BLOCK_M, BLOCK_N, BLOCK_K, NUM_WARPS, SWAP_AB, _epilogue_plan, _constexprs,
                  split_k=SPLIT_K,
                  rope_kinds=ROPE_KINDS)
compile_jobs = _HOST.compile_jobs
plan = _HOST.plan
run = _HOST.run
launch = _HOST.launch
