import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

if __package__:   # generated/<family>/: the package's own copy of the run time
    from .._runtime.launch import Launcher, TmaDescriptor, shared_launcher
else:             # compiled alone by gen: gen's run time (the same files)
    from gen.runtime.launch import Launcher, TmaDescriptor, shared_launcher


# Gluon names that moved between Triton releases (templates/_lib/compat.jinja), resolved once here.
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global


KERNEL_MODE = "gluon"
CONFIG = {'BLOCK_M': 128, 'BLOCK_N': 64, 'num_warps': 8, 'L2_GROUPS': False}
MOD_NAMES = ['none', 'causal', 'window', 'softcap', 'alibi', 'decay']

_GL_DTYPES = {"bfloat16": gl.bfloat16, "float16": gl.float16}
_TORCH_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}
_TRITON_TY = {"bfloat16": "bf16", "float16": "fp16"}

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
def _sm_exp(x):
    return gl.exp(x)


@gluon.jit
def _sm_log(x):
    return gl.log(x)


@gluon.jit
def _sm_tanh(x):
    return gl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [x], dtype=gl.float32, is_pure=True, pack=1)


@gluon.jit
def _sm_abs(x):
    return gl.abs(x)


@gluon.jit
def _sm_sqrt(x):
    return gl.sqrt(x)


@gluon.jit
def _sm_minimum(x, y):
    return gl.minimum(x, y)


@gluon.jit
def _sm_maximum(x, y):
    return gl.maximum(x, y)


@gluon.jit
def _sm_where(c, x, y):
    return gl.where(c, x, y)



@gluon.jit
def score_exp2_scale(sm_scale, MOD: gl.constexpr):
    # Multiplier from score_tile()'s units to log2 units (see score_math.jinja).
    mult = sm_scale * 1.4426950408889634
    if MOD == 3:  # softcap: tile already holds the modded, scaled score
        mult = sm_scale * 0.0 + 1.4426950408889634
    if MOD == 4:  # alibi: tile already holds the modded, scaled score
        mult = sm_scale * 0.0 + 1.4426950408889634
    if MOD == 5:  # decay: tile already holds the modded, scaled score
        mult = sm_scale * 0.0 + 1.4426950408889634
    return mult


@gluon.jit
def apply_score_mod(score, b, h, q_idx, kv_idx, Lq, Lk, softcap, alibi_ptr, MOD: gl.constexpr):
    if MOD == 0:  # none: score_mod=none
        pass
    if MOD == 1:  # causal: score_mod=none
        pass
    if MOD == 2:  # window: score_mod=none
        pass
    if MOD == 3:  # softcap: score_mod=softcap
        score = softcap * _sm_tanh(score / softcap)
    if MOD == 4:  # alibi: score_mod=alibi
        slope = gl.load(alibi_ptr + h)
        score = score + slope * (kv_idx - (q_idx + (Lk - Lq))).to(gl.float32)
    if MOD == 5:  # decay: score_mod=custom
        score = (score - 0.05 * _sm_abs(q_idx - kv_idx)).to(gl.float32)
    return score


@gluon.jit
def score_mod_grad(score, b, h, q_idx, kv_idx, Lq, Lk, softcap, alibi_ptr, MOD: gl.constexpr):
    # d apply_score_mod / d score at the scaled score (the mod IR's derivative); 1 for masks and ALiBi
    dscore = score * 0.0 + 1.0
    if MOD == 3:  # softcap: score_mod=softcap
        dscore = softcap * ((1 - _sm_tanh(score / softcap) * _sm_tanh(score / softcap)) * (1 / softcap))
    return dscore


@gluon.jit
def q_row_range(n0, Lq, Lk, window_left, window_right, BLOCK_N: gl.constexpr, MOD: gl.constexpr):
    # Query rows that see some key of the block [n0, n0 + BLOCK_N) -> [lo_row, hi_row) (the backward's dK/dV loop):
    # row i sees key j iff j <= i + (Lk - Lq) (+ right) and, for windows, j >= i + (Lk - Lq) - left.
    off = Lk - Lq
    n_last = min_hi(n0 + BLOCK_N, Lk) - 1
    lo_row = n0 * 0
    hi_row = n0 * 0 + Lq
    if MOD == 1:  # causal: mask=causal
        lo_row = max_lo(n0 - off, 0)
    if MOD == 2:  # window: mask=window
        lo_row = max_lo(n0 - off - window_right, 0)
        hi_row = min_hi(n_last - off + window_left + 1, Lq)
    if MOD == 4:  # alibi: mask=causal
        lo_row = max_lo(n0 - off, 0)
    hi_row = gl.where(hi_row > lo_row, hi_row, lo_row)
    return lo_row, hi_row


@gluon.jit
def apply_mask(score, q_idx, kv_idx, Lq, Lk, window_left, window_right, MOD: gl.constexpr):
    if MOD == 0:  # none: mask=none
        score = gl.where(kv_idx < Lk, score, -float("inf"))
    if MOD == 1:  # causal: mask=causal
        # bottom-right aligned causal: key j visible to row i iff j <= i + (Lk - Lq)
        keep = (kv_idx <= q_idx + (Lk - Lq)) & (kv_idx < Lk)
        score = gl.where(keep, score, -float("inf"))
    if MOD == 2:  # window: mask=window
        diag = q_idx + (Lk - Lq)
        keep = (kv_idx <= diag + window_right) & (kv_idx >= diag - window_left) & (kv_idx < Lk)
        score = gl.where(keep, score, -float("inf"))
    if MOD == 3:  # softcap: mask=none
        score = gl.where(kv_idx < Lk, score, -float("inf"))
    if MOD == 4:  # alibi: mask=causal
        # bottom-right aligned causal: key j visible to row i iff j <= i + (Lk - Lq)
        keep = (kv_idx <= q_idx + (Lk - Lq)) & (kv_idx < Lk)
        score = gl.where(keep, score, -float("inf"))
    if MOD == 5:  # decay: mask=none
        score = gl.where(kv_idx < Lk, score, -float("inf"))
    return score


@gluon.jit
def apply_mods(score, b, h, q_idx, kv_idx, Lq, Lk, window_left, window_right, softcap, alibi_ptr,
               MOD: gl.constexpr):
    score = apply_score_mod(score, b, h, q_idx, kv_idx, Lq, Lk, softcap, alibi_ptr, MOD)
    return apply_mask(score, q_idx, kv_idx, Lq, Lk, window_left, window_right, MOD)


@gluon.jit
def score_tile(qk, sm_scale, b, h, q_idx, kv_idx, Lq, Lk, window_left, window_right, softcap, alibi_ptr,
               MOD: gl.constexpr, MASKED: gl.constexpr):
    # Raw qk for pure masks (the scale rides in the exp2 FFMA), modded natural-unit score otherwise.
    s = qk
    if MOD == 3:  # softcap
        s = apply_score_mod(qk * sm_scale, b, h, q_idx, kv_idx, Lq, Lk, softcap, alibi_ptr, MOD)
    if MOD == 4:  # alibi
        s = apply_score_mod(qk * sm_scale, b, h, q_idx, kv_idx, Lq, Lk, softcap, alibi_ptr, MOD)
    if MOD == 5:  # decay
        s = apply_score_mod(qk * sm_scale, b, h, q_idx, kv_idx, Lq, Lk, softcap, alibi_ptr, MOD)
    if MASKED:
        s = apply_mask(s, q_idx, kv_idx, Lq, Lk, window_left, window_right, MOD)
    return s


@gluon.jit
def min_hi(a, b):
    return gl.where(a < b, a, b)


@gluon.jit
def max_lo(a, b):
    return gl.where(a > b, a, b)


@gluon.jit
def kv_block_range(m0, Lq, Lk, window_left, window_right, BLOCK_M: gl.constexpr,
                   BLOCK_N: gl.constexpr, MOD: gl.constexpr):
    # Keys visible to some row of the block -> [lo_key, hi_key); to every row -> [flo_key, fhi_key).
    off = Lk - Lq
    m_last = min_hi(m0 + BLOCK_M, Lq) - 1
    lo_key = 0
    hi_key = Lk
    flo_key = 0
    fhi_key = Lk
    if MOD == 1:  # causal: mask=causal
        lo_key = 0
        hi_key = min_hi(m_last + off + 1, Lk)
        flo_key = 0
        fhi_key = min_hi(m0 + off + 1, Lk)
    if MOD == 2:  # window: mask=window
        lo_key = max_lo(m0 + off - window_left, 0)
        hi_key = min_hi(m_last + off + window_right + 1, Lk)
        flo_key = max_lo(m_last + off - window_left, 0)
        fhi_key = min_hi(m0 + off + window_right + 1, Lk)
    if MOD == 4:  # alibi: mask=causal
        lo_key = 0
        hi_key = min_hi(m_last + off + 1, Lk)
        flo_key = 0
        fhi_key = min_hi(m0 + off + 1, Lk)
    lo = (lo_key // BLOCK_N) * BLOCK_N
    hi = gl.where(hi_key > lo_key, hi_key, lo)  # nothing visible (fully masked block) -> hi = lo
    hi_up = ((hi + BLOCK_N - 1) // BLOCK_N) * BLOCK_N
    # first block boundary at/after flo_key, clamped into [lo, hi_up]
    full_lo = min_hi(max_lo(((flo_key + BLOCK_N - 1) // BLOCK_N) * BLOCK_N, lo), hi_up)
    # last block boundary at/before fhi_key, never below full_lo
    full_hi = max_lo((fhi_key // BLOCK_N) * BLOCK_N, full_lo)
    full_hi = min_hi(full_hi, hi_up)
    return lo, full_lo, full_hi, hi


@gluon.jit
def pin_scalar(x):
    # Volatile identity on a scalar int32. Every partition of a warp-specialized kernel derives the same tile walk
    # from the same arguments; without this LLVM hoists that common math out of the loops (into the parent region,
    # live across the partitions' setmaxnreg), where it takes registers the partitions do not have and ptxas spills.
    return gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def tile_order(tile, nprog, num_tiles, num_m, group_heads, MOD: gl.constexpr):
    # A persistent CTA's tile -> (batch * query head, q-block rank; rank 0 = the last q-block). Unmasked and window
    # tiles cost alike: heads outer, q-blocks inner, so a head's K/V stays in L2 while its q-blocks run. A causal
    # tile costs its q-block's row of keys, so causal tiles go longest first (static LPT): in bands of W q-block
    # ranks, longest band first; within a band, group by group of heads (l2_group_heads: all of them while their K/V
    # fits in L2, else whole KV groups whose K/V fit in a share of it), rank outer and heads inner; W makes one
    # group's share of a band at least a wave of nprog CTAs (with one group: exactly rank outer, heads inner). So a
    # wave takes tiles of about the same length from heads whose K/V its neighbours just read,
    # and every other full wave is dealt in reverse, so the CTA that drew one wave's longest tile draws the next
    # wave's shortest. Dealt round-robin in head-major order, causal waves kept 11-45% of the SMs idle at the end (a
    # CTA's tiles all fell on the same few q-blocks whenever nprog shared factors with num_m); dealt rank by rank
    # over all heads, a wave of an MHA model read as many heads' K/V as it had CTAs, far past L2 (0.73x cuDNN at
    # B4 H32 L2048 on an H100, every K/V byte read from HBM once per q-block, against 1.09x with GQA's 8 KV heads).
    bh = tile // num_m
    rank = tile % num_m
    if MOD == 1:  # causal: mask=causal
        bh, rank = _lpt_order(tile, nprog, num_tiles, num_m, group_heads)
    if MOD == 4:  # alibi: mask=causal
        bh, rank = _lpt_order(tile, nprog, num_tiles, num_m, group_heads)
    return bh, rank


@gluon.jit
def _lpt_order(tile, nprog, num_tiles, num_m, group_heads):
    wave = tile // nprog
    pos = tile - wave * nprog
    # odd full waves reversed (a partial last wave keeps its order: reversed it would index past num_tiles)
    flip = (wave % 2) * ((wave + 1) * nprog <= num_tiles).to(gl.int32)
    tile = tile + flip * (nprog - 1 - 2 * pos)
    heads = num_tiles // num_m
    return tile % heads, tile // heads   # rendered without the L2 groups: the walk over every head at once


@gluon.jit
def l2_group_heads(heads, Lk, GROUP, L2_KEYS: gl.constexpr, GROUP_KEYS: gl.constexpr):
    # The query heads of one causal tile group. Every head, while the K and V of all KV heads (Lk keys each) fit in
    # L2_KEYS keys (the kernel's L2_KV_BYTES); beyond that, as many whole KV groups (GROUP query heads each) as fit in
    # GROUP_KEYS (L2_GROUP_BYTES), at least one. Keys, not bytes: L2_KV_BYTES // (2 tensors * 2 bytes * HEAD_DIM).
    kv_heads = heads // GROUP
    grouped = max_lo(GROUP_KEYS // Lk, 1) * GROUP
    return gl.where(kv_heads <= L2_KEYS // Lk, heads, grouped)



@gluon.jit
def _tile_coords(tile, num_tiles, num_m, Hq, GROUP, group_heads, CTA_M: gl.constexpr, MOD: gl.constexpr):
    # The order of the persistent tiles: score_math's tile_order (longest causal tiles first, balanced over CTAs,
    # in groups of group_heads heads where the K/V of all of them does not fit in L2).
    bh, rank = tile_order(tile, gl.num_programs(0), num_tiles, num_m, group_heads, MOD)
    m0 = (num_m - 1 - rank) * CTA_M
    b = bh // Hq
    h = bh % Hq
    return b, h, h // GROUP, m0


@gluon.jit
def _producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty,
              v_ready, v_empty, num_tiles, num_m, Hq, GROUP, group_heads, Lq, Lk, window_left, window_right,
              BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
              NUM_CONSUMERS: gl.constexpr, Q_STAGES: gl.constexpr, MOD: gl.constexpr):
    CTA_M: gl.constexpr = BLOCK_M * NUM_CONSUMERS
    kv_cnt = 0
    tile_cnt = 0
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        b, h, hk, m0 = _tile_coords(tile, num_tiles, num_m, Hq, GROUP, group_heads, CTA_M, MOD)
        lo, full_lo, full_hi, hi = kv_block_range(m0, Lq, Lk, window_left, window_right, CTA_M, BLOCK_N, MOD)
        # Q: consumer c's tile of this CTA tile is use tile_cnt * NC + c of a ring of NC * Q_STAGES slots.
        for c in gl.static_range(NUM_CONSUMERS):
            slot = producer_acquire(q_empty, tile_cnt * NUM_CONSUMERS + c, NUM_CONSUMERS * Q_STAGES)
            mbarrier.expect(q_ready.index(slot), q_desc.block_type.nbytes)
            _tma_load(q_desc, [b, h, m0 + c * BLOCK_M, 0], q_ready.index(slot),
                                            q_smem.index(slot))
        for n0 in range(lo, hi, BLOCK_N):
            slot = producer_acquire(k_empty, kv_cnt, STAGES)
            mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
            _tma_load(k_desc, [b, hk, n0, 0], k_ready.index(slot), k_smem.index(slot))
            slot = producer_acquire(v_empty, kv_cnt, STAGES)
            mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
            _tma_load(v_desc, [b, hk, n0, 0], v_ready.index(slot), v_smem.index(slot))
            kv_cnt += 1
        tile_cnt += 1


@gluon.jit
def _issue_s(q, k_smem, k_ready, kv_cnt, s_layout: gl.constexpr, BLOCK_M: gl.constexpr,
             BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr):
    # S = Q K^T for the kv_cnt-th KV block, asynchronously (the caller waits); returns the token and the slot.
    slot = consumer_wait(k_ready, kv_cnt, STAGES)
    k_t = k_smem.index(slot).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    s_tok = warpgroup_mma(q, k_t, s_zero, use_acc=False, is_async=True)
    return s_tok, slot


@gluon.jit
def _turn_wait(turn_mine, kv_cnt, CID: gl.constexpr, PINGPONG: gl.constexpr):
    # Ping-pong: consumer 0 waits as the "producer" of its turn barrier (a fresh barrier lets it start),
    # consumer 1 as the "consumer"; each passes the turn after issuing its GEMMs.
    if PINGPONG:
        if CID == 0:
            producer_acquire(turn_mine, kv_cnt, 1)
        else:
            consumer_wait(turn_mine, kv_cnt, 1)


@gluon.jit
def _turn_pass(turn_other, PINGPONG: gl.constexpr):
    if PINGPONG:
        mbarrier.arrive(turn_other.index(0), count=1)


@gluon.jit
def _kv_steps(start, end, hi, s, o_acc, m_i, l_i, kv_cnt, q, k_smem, v_smem, k_ready, k_empty, v_ready,
              v_empty, turn_mine, turn_other, mult, sm_scale, b, h, q_idx, Lq, Lk, window_left, window_right,
              softcap, alibi_ptr, s_layout: gl.constexpr, o_layout: gl.constexpr, BLOCK_M: gl.constexpr,
              BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, CID: gl.constexpr,
              PINGPONG: gl.constexpr, MOD: gl.constexpr, MASKED: gl.constexpr):
    dtype: gl.constexpr = q.dtype
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    col_offs = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    for n0 in range(start, end, BLOCK_N):
        # --- softmax of S_j (registers only; overlaps the other warpgroup's GEMMs) ---
        kv_idx = gl.expand_dims(n0 + col_offs, 0)
        s = score_tile(s, sm_scale, b, h, q_idx, kv_idx, Lq, Lk, window_left, window_right, softcap, alibi_ptr,
                       MOD, MASKED)
        m_new = gl.maximum(m_i, gl.max(s, 1))
        # rows with nothing visible yet keep m = -inf: subtract 0 there so exp2 gives 0 instead of NaN
        m_sub = gl.where(m_new == -float("inf"), 0.0, m_new * mult)
        p = gl.exp2(s * mult - gl.expand_dims(m_sub, 1))
        alpha = gl.exp2(m_i * mult - m_sub)
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new
        o_acc = o_acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
        p_op = gl.convert_layout(p.to(dtype), p_layout)

        # --- GEMMs: O += P_j V_j, then S_{j+1} = Q K_{j+1}^T, issued back to back in this consumer's turn ---
        v_slot = consumer_wait(v_ready, kv_cnt, STAGES)
        v = v_smem.index(v_slot).reshape([BLOCK_N, HEAD_DIM])
        _turn_wait(turn_mine, kv_cnt, CID, PINGPONG)
        o_tok = warpgroup_mma(p_op, v, o_acc, is_async=True)
        if n0 + BLOCK_N < hi:
            s_tok, k_slot = _issue_s(q, k_smem, k_ready, kv_cnt + 1, s_layout, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES)
            _turn_pass(turn_other, PINGPONG)
            s = warpgroup_mma_wait(0, deps=(s_tok, ))
            o_acc, p_op = warpgroup_mma_wait(0, deps=(o_tok, p_op))
            mbarrier.arrive(k_empty.index(k_slot), count=1)
        else:
            _turn_pass(turn_other, PINGPONG)
            o_acc, p_op = warpgroup_mma_wait(0, deps=(o_tok, p_op))
        mbarrier.arrive(v_empty.index(v_slot), count=1)
        kv_cnt += 1
    return s, o_acc, m_i, l_i, kv_cnt


@gluon.jit
def _consumer(o_desc, LSE, alibi_ptr, q_smem, k_smem, v_smem, o_smem, q_ready, q_empty, k_ready, k_empty,
              v_ready, v_empty, turn0, turn1, sm_scale, softcap, window_left, window_right, stride_lb, stride_lh,
              num_tiles, num_m, Hq, GROUP, group_heads, Lq, Lk,
              BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
              NUM_CONSUMERS: gl.constexpr, PINGPONG: gl.constexpr, MOD: gl.constexpr, O_IN_Q: gl.constexpr,
              Q_STAGES: gl.constexpr, CID: gl.constexpr):
    CTA_M: gl.constexpr = BLOCK_M * NUM_CONSUMERS
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    if CID == 0:
        turn_mine = turn0
        turn_other = turn1
    else:
        turn_mine = turn1
        turn_other = turn0
    mult = score_exp2_scale(sm_scale, MOD)
    kv_cnt = 0
    tile_cnt = 0
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        b, h, hk, m0_cta = _tile_coords(tile, num_tiles, num_m, Hq, GROUP, group_heads, CTA_M, MOD)
        lo, full_lo, full_hi, hi = kv_block_range(m0_cta, Lq, Lk, window_left, window_right, CTA_M, BLOCK_N, MOD)
        m0 = m0_cta + CID * BLOCK_M
        q_idx = gl.expand_dims(m0 + gl.arange(0, BLOCK_M, layout=row_s), 1)

        q_slot = consumer_wait(q_ready, tile_cnt * NUM_CONSUMERS + CID, NUM_CONSUMERS * Q_STAGES)
        q = q_smem.index(q_slot).reshape([BLOCK_M, HEAD_DIM])

        m_i = gl.full([BLOCK_M], -float("inf"), gl.float32, row_s)
        l_i = gl.zeros([BLOCK_M], gl.float32, row_s)
        o_acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)
        s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
        if hi > lo:
            # prologue: S of the first KV block (outside the turn order; both consumers issue it at once)
            s_tok, k_slot = _issue_s(q, k_smem, k_ready, kv_cnt, s_layout, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES)
            s = warpgroup_mma_wait(0, deps=(s_tok, ))
            mbarrier.arrive(k_empty.index(k_slot), count=1)
        s, o_acc, m_i, l_i, kv_cnt = _kv_steps(
            lo, full_lo, hi, s, o_acc, m_i, l_i, kv_cnt, q, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty,
            turn_mine, turn_other, mult, sm_scale, b, h, q_idx, Lq, Lk, window_left, window_right, softcap,
            alibi_ptr, s_layout, o_layout, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES, CID, PINGPONG, MOD, True)
        s, o_acc, m_i, l_i, kv_cnt = _kv_steps(
            full_lo, full_hi, hi, s, o_acc, m_i, l_i, kv_cnt, q, k_smem, v_smem, k_ready, k_empty, v_ready,
            v_empty, turn_mine, turn_other, mult, sm_scale, b, h, q_idx, Lq, Lk, window_left, window_right,
            softcap, alibi_ptr, s_layout, o_layout, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES, CID, PINGPONG, MOD, False)
        s, o_acc, m_i, l_i, kv_cnt = _kv_steps(
            full_hi, hi, hi, s, o_acc, m_i, l_i, kv_cnt, q, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty,
            turn_mine, turn_other, mult, sm_scale, b, h, q_idx, Lq, Lk, window_left, window_right, softcap,
            alibi_ptr, s_layout, o_layout, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES, CID, PINGPONG, MOD, True)
        if not O_IN_Q:
            # every wgmma reading Q has retired: hand the Q slot back for the next tile
            mbarrier.arrive(q_empty.index(q_slot), count=1)

        # --- epilogue: fully masked rows (l = 0) -> O = 0, lse = -inf ---
        empty = l_i == 0.0
        l_safe = gl.where(empty, 1.0, l_i)
        lse = gl.where(empty, -float("inf"), (m_i * mult + gl.log2(l_safe)) * 0.6931471805599453)
        inv_l = gl.convert_layout(1.0 / l_safe, row_o)
        out = (o_acc * gl.expand_dims(inv_l, 1)).to(o_desc.dtype)
        if not O_IN_Q:
            tma.store_wait(0)  # the previous tile's O store from o_smem has drained
        o_buf = o_smem.index(q_slot if O_IN_Q else CID)  # with O_IN_Q, o_smem is q_smem: this consumer's Q slot
        o_buf.reshape([BLOCK_M, HEAD_DIM]).store(out)
        fence_async_shared()
        _tma_store(o_desc, [b, h, m0, 0], o_buf)  # rows >= Lq are clipped by TMA
        if O_IN_Q:
            tma.store_wait(0)  # the store has read the Q slot: the producer may refill it
            mbarrier.arrive(q_empty.index(q_slot), count=1)
        rows = m0 + gl.arange(0, BLOCK_M, layout=row_s)
        lse_ptrs = LSE + b.to(gl.int64) * stride_lb + h.to(gl.int64) * stride_lh + rows
        gl.store(lse_ptrs, lse, mask=rows < Lq)
        tile_cnt += 1
    tma.store_wait(0)


# Shape and stride ints are not specialized (no ==1 / %16 variants): one binary per dtype, head dim
# and mod serves every shape, so the precompiled bundle covers every call (zero JIT at import).
SHAPE_ARGS = ("window_left", "window_right", "stride_lb", "stride_lh", "num_tiles", "num_m", "Hq", "GROUP", "Lq", "Lk")


@gluon.jit(do_not_specialize=SHAPE_ARGS)
def _attn_fwd_sm90(q_desc, k_desc, v_desc, o_desc, LSE, alibi_ptr, sm_scale, softcap, window_left, window_right,
                   stride_lb, stride_lh, num_tiles, num_m, Hq, GROUP, Lq, Lk,
                   BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
                   NUM_CONSUMERS: gl.constexpr, PINGPONG: gl.constexpr, MOD: gl.constexpr, O_IN_Q: gl.constexpr,
                   Q_STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr):
    gl.static_assert(not PINGPONG or NUM_CONSUMERS == 2, "ping-pong pairs exactly two consumer warpgroups")
    dtype: gl.constexpr = q_desc.dtype
    Q_SLOTS: gl.constexpr = NUM_CONSUMERS * Q_STAGES
    q_smem = gl.allocate_shared_memory(dtype, [Q_SLOTS] + q_desc.block_type.shape, q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    if O_IN_Q:
        o_smem = q_smem
    else:
        o_smem = gl.allocate_shared_memory(dtype, [NUM_CONSUMERS] + o_desc.block_type.shape, o_desc.layout)

    q_ready = gl.allocate_shared_memory(gl.int64, [Q_SLOTS, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [Q_SLOTS, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn0 = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    turn1 = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    ring_init(q_ready, Q_SLOTS, 1)
    ring_init(q_empty, Q_SLOTS, 1)
    ring_init(k_ready, STAGES, 1)
    ring_init(k_empty, STAGES, NUM_CONSUMERS)  # every consumer reads every K/V block
    ring_init(v_ready, STAGES, 1)
    ring_init(v_empty, STAGES, NUM_CONSUMERS)
    ring_init(turn0, 1, 1)
    ring_init(turn1, 1, 1)
    fence_async_shared()  # barrier inits visible to the async proxy before the first TMA
    group_heads = num_tiles // num_m   # L2_GROUPS off: every head in one group (tile_order's walk without bands)

    # Partition arguments are spelled out per partition: constexprs must stay constexprs (no tuple arithmetic).
    gl.warp_specialize([
        (_consumer, (o_desc, LSE, alibi_ptr, q_smem, k_smem, v_smem, o_smem, q_ready, q_empty, k_ready, k_empty,
                     v_ready, v_empty, turn0, turn1, sm_scale, softcap, window_left, window_right, stride_lb,
                     stride_lh, num_tiles, num_m, Hq, GROUP, group_heads, Lq, Lk, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES,
                     NUM_CONSUMERS, PINGPONG, MOD, O_IN_Q, Q_STAGES, 0)),
        (_consumer, (o_desc, LSE, alibi_ptr, q_smem, k_smem, v_smem, o_smem, q_ready, q_empty, k_ready, k_empty,
                     v_ready, v_empty, turn0, turn1, sm_scale, softcap, window_left, window_right, stride_lb,
                     stride_lh, num_tiles, num_m, Hq, GROUP, group_heads, Lq, Lk, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES,
                     NUM_CONSUMERS, PINGPONG, MOD, O_IN_Q, Q_STAGES, 1)),
        (_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready,
                     v_empty, num_tiles, num_m, Hq, GROUP, group_heads, Lq, Lk, window_left, window_right, BLOCK_M,
                     BLOCK_N, STAGES, NUM_CONSUMERS, Q_STAGES, MOD)),
    ], [4, 1],
       [CONSUMER_REGS, PRODUCER_REGS])

    ring_invalidate(q_ready, Q_SLOTS)
    ring_invalidate(q_empty, Q_SLOTS)
    ring_invalidate(k_ready, STAGES)
    ring_invalidate(k_empty, STAGES)
    ring_invalidate(v_ready, STAGES)
    ring_invalidate(v_empty, STAGES)
    ring_invalidate(turn0, 1)
    ring_invalidate(turn1, 1)


NUM_CONSUMERS = CONFIG["num_warps"] // 4
WG_M = CONFIG["BLOCK_M"] // NUM_CONSUMERS  # Q rows per consumer warpgroup
assert NUM_CONSUMERS >= 1 and WG_M in (64, 128), "sm90 attention: BLOCK_M / (num_warps / 4) must be 64 or 128"
SMEM_LIMIT = 232448 - 1024  # sm_90 opt-in maximum, less room for barriers


MOD_HAS_SCORE_MOD = [score_mod != "none" for score_mod in ['none', 'none', 'none', 'softcap', 'alibi', 'custom']]


def _smem_bytes(head_dim: int, stages: int, o_in_q: bool, q_stages: int = 1) -> int:
    q = NUM_CONSUMERS * WG_M * head_dim * 2
    return q * q_stages + (0 if o_in_q else q) + stages * 2 * CONFIG["BLOCK_N"] * head_dim * 2


def _plan(head_dim: int):
    # (STAGES, O_IN_Q): explicit cfg values win; otherwise the deepest ring that fits with a separate O buffer,
    # else O staged in the Q buffer.
    if "STAGES" in CONFIG or "O_IN_Q" in CONFIG:
        stages = CONFIG.get("STAGES", 2)
        o_in_q = CONFIG.get("O_IN_Q", _smem_bytes(head_dim, stages, False) > SMEM_LIMIT)
        return stages, o_in_q
    for stages in (4, 3, 2):
        if _smem_bytes(head_dim, stages, False) <= SMEM_LIMIT:
            return stages, False
    return 2, True


def _q_stages(head_dim: int, mod: int, stages: int, o_in_q: bool) -> int:
    # Q tiles in flight per consumer (see Q_STAGES): never at the cost of K/V ring depth.
    if "Q_STAGES" in CONFIG:
        return CONFIG["Q_STAGES"]
    fits = not o_in_q and _smem_bytes(head_dim, stages, False, 2) <= SMEM_LIMIT
    return 2 if fits and not MOD_HAS_SCORE_MOD[mod] else 1


def _block_shapes(head_dim: int):
    return [1, 1, WG_M, head_dim], [1, 1, CONFIG["BLOCK_N"], head_dim]


def _options():
    warps = 4 * NUM_CONSUMERS + 4  # the 1-warp producer occupies a whole warpgroup's register slice
    return {"num_warps": 4, "maxnreg": CONFIG.get("MAXNREG", min(256, (65536 // (32 * warps)) // 8 * 8))}


def _constexprs(head_dim: int, mod: int) -> dict:
    stages, o_in_q = _plan(head_dim)
    return {"BLOCK_M": WG_M, "BLOCK_N": CONFIG["BLOCK_N"], "HEAD_DIM": head_dim, "STAGES": stages,
            "NUM_CONSUMERS": NUM_CONSUMERS, "PINGPONG": CONFIG.get("PINGPONG", NUM_CONSUMERS == 2) and NUM_CONSUMERS == 2,
            "MOD": mod, "O_IN_Q": o_in_q, "Q_STAGES": _q_stages(head_dim, mod, stages, o_in_q),
            "CONSUMER_REGS": CONFIG.get("CONSUMER_REGS", 240),
            "PRODUCER_REGS": CONFIG.get("PRODUCER_REGS", 24)}


def _desc_type(dtype: str, block) -> str:
    """The compile signature's type of a TMA descriptor of `block` (its default NVMMA shared layout)."""
    return f"tensordesc<{_TRITON_TY[dtype]}{block},{gl.NVMMASharedLayout.get_default_for(block, _GL_DTYPES[dtype])!r}>"


def compile_jobs(case: dict) -> list:
    dtype, d = case["dtype"], case["head_dim"]
    q_ty, kv_ty = (_desc_type(dtype, block) for block in _block_shapes(d))
    sig = {"q_desc": q_ty, "k_desc": kv_ty, "v_desc": kv_ty, "o_desc": q_ty, "LSE": "*fp32", "alibi_ptr": "*fp32",
           "sm_scale": "fp32", "softcap": "fp32", "window_left": "i32", "window_right": "i32"}
    for name in ("stride_lb", "stride_lh", "num_tiles", "num_m", "Hq", "GROUP", "Lq", "Lk"):
        sig[name] = "i32"
    constexprs = _constexprs(d, MOD_NAMES.index(case["mod"]))
    for name in constexprs:
        sig[name] = "constexpr"
    return [{"name": f"attn_fwd_sm90_{dtype}_d{d}_{case['mod']}", "fn": _attn_fwd_sm90, "signature": sig,
             "constexprs": constexprs, "options": _options()}] + backward_jobs(case)


_CASES = {}  # (kernel, dtype, head dim, mod) -> ((q block, layout), (kv block, layout), Launcher): on first use


def _case(dtype, head_dim: int, mod: str, kernel: str = "forward"):
    """The descriptor blocks with their layouts, and the Launcher, of the forward kernel or of the backward's "dkdv"
    or "dq" kernel."""
    key = (kernel, dtype, head_dim, mod)
    found = _CASES.get(key)
    if found is None:
        gdt = _GL_DTYPES[_TORCH_NAMES[dtype]]
        mod_index = MOD_NAMES.index(mod)
        if kernel == "dkdv":
            blocks = _bwd_blocks(head_dim)
            launcher = Launcher(_attn_bwd_dkdv_sm90, {**_bwd_constexprs(head_dim, mod_index), **_bwd_options()})
        elif kernel == "dq":
            blocks = _dq_blocks(head_dim)
            launcher = Launcher(_attn_bwd_dq_sm90, {**_dq_constexprs(head_dim, mod_index), **_bwd_options()})
        else:
            blocks = _block_shapes(head_dim)
            launcher = Launcher(_attn_fwd_sm90, {**_constexprs(head_dim, mod_index), **_options()})
        found = _CASES[key] = tuple((b, gl.NVMMASharedLayout.get_default_for(b, gdt)) for b in blocks) + (launcher, )
    return found


def _tma_ready(t):
    """t itself when TMA can address it (unit last stride, 16-byte aligned base and strides), else a copy."""
    ok = t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and all((s * t.element_size()) % 16 == 0
                                                              for s in t.stride()[:-1])
    return t if ok else t.contiguous()


class Plan:
    """What a launch needs that depends only on the call's shape class (shapes, strides, dtype, mod, scalars): the
    generated op builds it once per class and keeps it, so a call only wraps its pointers."""
    __slots__ = ("launcher", "q_layout", "kv_layout", "grid", "device", "boxes", "scalars")


def plan(q, k, v, out, lse, scale: float, mod: str, window_left: int, window_right: int, softcap: float,
         num_sms: int) -> Plan:
    """For tensors TMA can address (see _tma_ready): 4-D descriptors over [B, H, L, D] with their own strides, so a
    transposed [B, L, H, D] projection output needs no copy."""
    B, Hq, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    assert Hq % Hkv == 0 and D in (64, 128, 256) and q.dtype in _TORCH_NAMES
    assert k.dtype == q.dtype and v.dtype == q.dtype and out.dtype == q.dtype
    assert lse.dtype == torch.float32 and lse.stride(-1) == 1
    p = Plan()
    p.q_layout, p.kv_layout, p.launcher = _case(q.dtype, D, mod)
    span = Lq + Lk  # clamp window extents so index arithmetic stays in int32
    wl = max(-span, min(span, int(window_left)))
    wr = max(-span, min(span, int(window_right)))
    num_m = -(-Lq // (WG_M * NUM_CONSUMERS))
    num_tiles = B * Hq * num_m
    p.grid = (max(1, min(num_sms, num_tiles)), )
    p.device = q.device.index or 0
    # plain tuples: the launcher keys its cached tensor maps on them every call
    p.boxes = tuple((tuple(t.shape), t.stride()) for t in (q, k, v, out))
    p.scalars = (float(scale), float(softcap), wl, wr, lse.stride(0), lse.stride(1), num_tiles, num_m, Hq,
                 Hq // Hkv, Lq, Lk)
    return p


def run(p: Plan, q, k, v, out, lse, alibi_slopes) -> None:
    """Launch a plan on tensors of its shape class whose base pointers are 16-byte aligned (the caller checked)."""
    alibi = alibi_slopes if alibi_slopes is not None else lse  # dummy pointer when unused
    (sq, tq), (sk, tk), (sv, tv), (so, to) = p.boxes
    (q_block, q_layout), (kv_block, kv_layout) = p.q_layout, p.kv_layout
    p.launcher(p.grid, p.device,
               (TmaDescriptor(q, sq, tq), TmaDescriptor(k, sk, tk), TmaDescriptor(v, sv, tv), TmaDescriptor(out, so, to),
                lse, alibi) + p.scalars,
               lambda: (TensorDescriptor(q, list(sq), list(tq), q_block, q_layout),
                        TensorDescriptor(k, list(sk), list(tk), kv_block, kv_layout),
                        TensorDescriptor(v, list(sv), list(tv), kv_block, kv_layout),
                        TensorDescriptor(out, list(so), list(to), q_block, q_layout), lse, alibi) + p.scalars)


def launch(q, k, v, out, lse, scale: float, mod: str, window_left: int, window_right: int, softcap: float,
           alibi_slopes, num_sms: int) -> None:
    """Checked and planned for this one call; a view TMA cannot address is copied, once."""
    q, k, v = _tma_ready(q), _tma_ready(k), _tma_ready(v)
    o_target = out if _tma_ready(out) is out else torch.empty_like(out, memory_format=torch.contiguous_format)
    run(plan(q, k, v, o_target, lse, scale, mod, window_left, window_right, softcap, num_sms),
        q, k, v, o_target, lse, alibi_slopes)
    if o_target is not out:
        out.copy_(o_target)


# ------------------------------------------------------------------------------------------------------- backward
# dK and dV of the backward, FA3-style, on the forward's ring protocol. The portable module runs the rest (the delta
# pre-pass and the dQ kernel: no atomics, so the gradients are the same bits run to run) and calls this for dK/dV
# (generated.attention's backward, triton.backward(dkdv=...)). One CTA per (BWD_CONSUMERS * BWD_WG_N keys, batch *
# KV head), not persistent: causal CTAs are launched longest first (KV block 0 sees the most rows).
#   producer (1 warp): each consumer's K and V tile once (kv_ready), then Q_i and dO_i of every query row block that
#     sees the CTA's keys (_bwd_rows), for each query head of the KV group, through a STAGES-deep ring.
#   consumers (BWD_CONSUMERS warpgroups, BWD_WG_N keys each), per row block, transposed tiles as the portable kernel:
#     S^T = K Q_i^T and dP^T = V dO_i^T (wgmma: A = K or V from shared memory, B = the Q / dO slot permuted), P^T
#     and dS^T in registers in the accumulator layout, then dV += P^T dO_i and dK += dS^T Q_i with P^T and dS^T as
#     the register A operand; the slot goes back once both have retired. Epilogue: dK and dV through the consumer's
#     own K and V tiles and TMA stores (clipped at Lk).
# The math helpers are score_math's, as in the portable backward (score_mod_grad: the mod IR's derivative;
# q_row_range: the rows that see a key block).


@gluon.jit
def _bwd_p(s_in, lse, b, h, q_idx, kv_idx, Lq, Lk, window_left, window_right, softcap, alibi_ptr, MOD: gl.constexpr):
    """P^T of one transposed tile from the scaled K Q^T, natural units; rows with no visible key (lse = -inf) give 0."""
    s = apply_mods(s_in, b, h, q_idx, kv_idx, Lq, Lk, window_left, window_right, softcap, alibi_ptr, MOD)
    live = (lse > -float("inf")) & (q_idx < Lq)
    return gl.where(live, gl.exp(s - gl.where(live, lse, 0.0)), 0.0)



@gluon.jit
def _bwd_ds(p, dp, delta, s_in, sm_scale, b, h, q_idx, kv_idx, Lq, Lk, softcap, alibi_ptr, MOD: gl.constexpr):
    """dS^T scaled to d(K Q^T): P * (dP - delta) through the score mod's derivative at s_in."""
    return p * (dp - delta) * score_mod_grad(s_in, b, h, q_idx, kv_idx, Lq, Lk, softcap, alibi_ptr, MOD) * sm_scale


@gluon.jit
def _bwd_rows(n0, Lq, Lk, window_left, window_right, BLOCK_M: gl.constexpr, CTA_N: gl.constexpr,
              MOD: gl.constexpr):
    # The query row blocks of one query head that see some key of [n0, n0 + CTA_N) (q_row_range's rows, from a
    # BLOCK_M boundary): the first block's row and their count.
    lo_row, hi_row = q_row_range(n0, Lq, Lk, window_left, window_right, CTA_N, MOD)
    m_lo = (lo_row // BLOCK_M) * BLOCK_M
    return m_lo, (hi_row - m_lo + BLOCK_M - 1) // BLOCK_M


@gluon.jit
def _bwd_producer(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_ready, ready, empty, Hkv,
                  GROUP, Lq, Lk, window_left, window_right, BLOCK_M: gl.constexpr, WG_N: gl.constexpr,
                  STAGES: gl.constexpr, NUM_CONSUMERS: gl.constexpr, MOD: gl.constexpr):
    CTA_N: gl.constexpr = WG_N * NUM_CONSUMERS
    b = gl.program_id(1) // Hkv
    hk = gl.program_id(1) % Hkv
    n0 = gl.program_id(0) * CTA_N
    for c in gl.static_range(NUM_CONSUMERS):
        mbarrier.expect(kv_ready.index(c), k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        _tma_load(k_desc, [b, hk, n0 + c * WG_N, 0], kv_ready.index(c), k_smem.index(c))
        _tma_load(v_desc, [b, hk, n0 + c * WG_N, 0], kv_ready.index(c), v_smem.index(c))
    m_lo, steps = _bwd_rows(n0, Lq, Lk, window_left, window_right, BLOCK_M, CTA_N, MOD)
    for it in range(GROUP * steps):
        g = it // steps
        slot = producer_acquire(empty, it, STAGES)
        mbarrier.expect(ready.index(slot), q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        m0 = m_lo + (it - g * steps) * BLOCK_M
        _tma_load(q_desc, [b, hk * GROUP + g, m0, 0], ready.index(slot), q_smem.index(slot))
        _tma_load(do_desc, [b, hk * GROUP + g, m0, 0], ready.index(slot), do_smem.index(slot))


@gluon.jit
def _bwd_consumer(dk_desc, dv_desc, LSE, Delta, alibi_ptr, q_smem, do_smem, k_smem, v_smem, kv_ready, ready, empty,
                  sm_scale, softcap, window_left, window_right, Hq, Hkv, GROUP, Lq, Lk,
                  BLOCK_M: gl.constexpr, WG_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
                  NUM_CONSUMERS: gl.constexpr, MOD: gl.constexpr, CID: gl.constexpr):
    CTA_N: gl.constexpr = WG_N * NUM_CONSUMERS
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BLOCK_M, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, HEAD_DIM, 16])
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    b = gl.program_id(1) // Hkv
    hk = gl.program_id(1) % Hkv
    n0_cta = gl.program_id(0) * CTA_N
    n0 = n0_cta + CID * WG_N
    # transposed tiles: keys along the rows, query rows along the columns
    kv_idx = gl.expand_dims(n0 + gl.arange(0, WG_N, layout=gl.SliceLayout(1, st_layout)), 1)
    offs_mb = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, st_layout))
    m_lo, steps = _bwd_rows(n0_cta, Lq, Lk, window_left, window_right, BLOCK_M, CTA_N, MOD)

    mbarrier.wait(kv_ready.index(CID), 0)
    k = k_smem.index(CID).reshape([WG_N, HEAD_DIM])
    v = v_smem.index(CID).reshape([WG_N, HEAD_DIM])
    dtype: gl.constexpr = dk_desc.dtype
    dk = gl.zeros([WG_N, HEAD_DIM], gl.float32, acc_layout)
    dv = gl.zeros([WG_N, HEAD_DIM], gl.float32, acc_layout)
    for it in range(GROUP * steps):
        g = it // steps
        h = hk * GROUP + g
        offs_m = m_lo + (it - g * steps) * BLOCK_M + offs_mb
        q_idx = gl.expand_dims(offs_m, 0)
        row_base = (b * Hq + h).to(gl.int64) * Lq
        lse = gl.expand_dims(gl.load(LSE + row_base + offs_m, mask=offs_m < Lq, other=0.0), 0)
        delta = gl.expand_dims(gl.load(Delta + row_base + offs_m, mask=offs_m < Lq, other=0.0), 0)

        slot = consumer_wait(ready, it, STAGES)
        q_t = q_smem.index(slot).reshape([BLOCK_M, HEAD_DIM])
        do_t = do_smem.index(slot).reshape([BLOCK_M, HEAD_DIM])
        s_tok = warpgroup_mma(k, q_t.permute((1, 0)), gl.zeros([WG_N, BLOCK_M], gl.float32, st_layout),
                              use_acc=False, is_async=True)
        dp_tok = warpgroup_mma(v, do_t.permute((1, 0)), gl.zeros([WG_N, BLOCK_M], gl.float32, st_layout),
                               use_acc=False, is_async=True)
        s_t = warpgroup_mma_wait(1, deps=(s_tok, )) * sm_scale   # S^T retired; dP^T may still run
        p_t = _bwd_p(s_t, lse, b, h, q_idx, kv_idx, Lq, Lk, window_left, window_right, softcap, alibi_ptr, MOD)
        # P and dS rounded to the input dtype for the tensor cores, as the forward rounds P
        p_op = gl.convert_layout(p_t.to(dtype), op_layout)
        dv_tok = warpgroup_mma(p_op, do_t, dv, is_async=True)
        dp_t = warpgroup_mma_wait(1, deps=(dp_tok, ))   # dP^T retired; dV may still run
        ds_t = _bwd_ds(p_t, dp_t, delta, s_t, sm_scale, b, h, q_idx, kv_idx, Lq, Lk, softcap, alibi_ptr, MOD)
        ds_op = gl.convert_layout(ds_t.to(dtype), op_layout)
        dk_tok = warpgroup_mma(ds_op, q_t, dk, is_async=True)
        dv, dk, p_op, ds_op = warpgroup_mma_wait(0, deps=(dv_tok, dk_tok, p_op, ds_op))
        mbarrier.arrive(empty.index(slot), count=1)   # every wgmma reading the Q / dO slot has retired

    # epilogue: the K and V tiles are read for the last time above; they stage dK and dV for the TMA stores
    k_out = k_smem.index(CID)
    v_out = v_smem.index(CID)
    k_out.reshape([WG_N, HEAD_DIM]).store(dk.to(dtype))
    v_out.reshape([WG_N, HEAD_DIM]).store(dv.to(dtype))
    fence_async_shared()
    _tma_store(dk_desc, [b, hk, n0, 0], k_out)   # rows >= Lk are clipped by TMA
    _tma_store(dv_desc, [b, hk, n0, 0], v_out)
    tma.store_wait(0)


BWD_SHAPE_ARGS = ("window_left", "window_right", "Hq", "Hkv", "GROUP", "Lq", "Lk")


@gluon.jit(do_not_specialize=BWD_SHAPE_ARGS)
def _attn_bwd_dkdv_sm90(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, LSE, Delta, alibi_ptr, sm_scale,
                        softcap, window_left, window_right, Hq, Hkv, GROUP, Lq, Lk,
                        BLOCK_M: gl.constexpr, WG_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
                        NUM_CONSUMERS: gl.constexpr, MOD: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                        PRODUCER_REGS: gl.constexpr):
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [STAGES] + q_desc.block_type.shape, q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES] + do_desc.block_type.shape, do_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [NUM_CONSUMERS] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [NUM_CONSUMERS] + v_desc.block_type.shape, v_desc.layout)
    kv_ready = gl.allocate_shared_memory(gl.int64, [NUM_CONSUMERS, 1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ring_init(kv_ready, NUM_CONSUMERS, 1)
    ring_init(ready, STAGES, 1)
    ring_init(empty, STAGES, NUM_CONSUMERS)   # every consumer reads every Q / dO slot
    fence_async_shared()   # barrier inits visible to the async proxy before the first TMA

    gl.warp_specialize([
        (_bwd_consumer, (dk_desc, dv_desc, LSE, Delta, alibi_ptr, q_smem, do_smem, k_smem, v_smem, kv_ready, ready,
                         empty, sm_scale, softcap, window_left, window_right, Hq, Hkv, GROUP, Lq, Lk, BLOCK_M, WG_N,
                         HEAD_DIM, STAGES, NUM_CONSUMERS, MOD, 0)),
        (_bwd_consumer, (dk_desc, dv_desc, LSE, Delta, alibi_ptr, q_smem, do_smem, k_smem, v_smem, kv_ready, ready,
                         empty, sm_scale, softcap, window_left, window_right, Hq, Hkv, GROUP, Lq, Lk, BLOCK_M, WG_N,
                         HEAD_DIM, STAGES, NUM_CONSUMERS, MOD, 1)),
        (_bwd_producer, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_ready, ready, empty,
                         Hkv, GROUP, Lq, Lk, window_left, window_right, BLOCK_M, WG_N, STAGES, NUM_CONSUMERS, MOD)),
    ], [4, 1],
       [CONSUMER_REGS, PRODUCER_REGS])

    ring_invalidate(kv_ready, NUM_CONSUMERS)
    ring_invalidate(ready, STAGES)
    ring_invalidate(empty, STAGES)


# dQ of the backward, the forward's shape turned to gradients (the portable dQ kernel's math on wgmma). One CTA per
# (BWD_CONSUMERS * DQ_WG_M query rows, batch * query head), not persistent; causal CTAs are launched longest first
# (the last query block sees the most keys).
#   producer (1 warp): each consumer's Q and dO rows once (q_ready), then the K and V tiles of every key block the
#     CTA's rows see (kv_block_range), through a STAGES-deep ring.
#   consumers (BWD_CONSUMERS warpgroups, DQ_WG_M rows each), per key block: S = Q K^T and dP = dO V^T (wgmma, A = the
#     Q / dO tile, B = the K / V slot permuted), P and dS in registers, then dQ += dS K with dS as the register A
#     operand; the slot goes back once that wgmma has retired. Epilogue: dQ through the consumer's own Q tile and a
#     TMA store (clipped at Lq).


@gluon.jit
def _dq_block(Lq, BLOCK_M: gl.constexpr, MOD: gl.constexpr):
    # This CTA's first query row: the last query block first under a causal mask (it sees the most keys).
    num_m = gl.cdiv(Lq, BLOCK_M)
    block = gl.program_id(0)
    if MOD == 1:  # causal: mask=causal
        block = num_m - 1 - block
    if MOD == 4:  # alibi: mask=causal
        block = num_m - 1 - block
    return block * BLOCK_M



@gluon.jit
def _dq_producer(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, q_ready, ready, empty, Hq,
                 GROUP, Lq, Lk, window_left, window_right, WG_M: gl.constexpr, BLOCK_N: gl.constexpr,
                 STAGES: gl.constexpr, NUM_CONSUMERS: gl.constexpr, MOD: gl.constexpr):
    CTA_M: gl.constexpr = WG_M * NUM_CONSUMERS
    b = gl.program_id(1) // Hq
    h = gl.program_id(1) % Hq
    m0 = _dq_block(Lq, CTA_M, MOD)
    for c in gl.static_range(NUM_CONSUMERS):
        mbarrier.expect(q_ready.index(c), q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        _tma_load(q_desc, [b, h, m0 + c * WG_M, 0], q_ready.index(c), q_smem.index(c))
        _tma_load(do_desc, [b, h, m0 + c * WG_M, 0], q_ready.index(c), do_smem.index(c))
    lo, full_lo, full_hi, hi = kv_block_range(m0, Lq, Lk, window_left, window_right, CTA_M, BLOCK_N, MOD)
    for it in range((hi - lo + BLOCK_N - 1) // BLOCK_N):
        slot = producer_acquire(empty, it, STAGES)
        mbarrier.expect(ready.index(slot), k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        _tma_load(k_desc, [b, h // GROUP, lo + it * BLOCK_N, 0], ready.index(slot), k_smem.index(slot))
        _tma_load(v_desc, [b, h // GROUP, lo + it * BLOCK_N, 0], ready.index(slot), v_smem.index(slot))


@gluon.jit
def _dq_consumer(dq_desc, LSE, Delta, alibi_ptr, q_smem, do_smem, k_smem, v_smem, q_ready, ready, empty, sm_scale,
                 softcap, window_left, window_right, Hq, Lq, Lk, WG_M: gl.constexpr, BLOCK_N: gl.constexpr,
                 HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, NUM_CONSUMERS: gl.constexpr, MOD: gl.constexpr,
                 CID: gl.constexpr):
    CTA_M: gl.constexpr = WG_M * NUM_CONSUMERS
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, HEAD_DIM, 16])
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    dtype: gl.constexpr = dq_desc.dtype
    b = gl.program_id(1) // Hq
    h = gl.program_id(1) % Hq
    m0_cta = _dq_block(Lq, CTA_M, MOD)
    m0 = m0_cta + CID * WG_M
    offs_m = m0 + gl.arange(0, WG_M, layout=gl.SliceLayout(1, s_layout))
    offs_nb = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    q_idx = gl.expand_dims(offs_m, 1)
    row_base = (b * Hq + h).to(gl.int64) * Lq
    lse = gl.expand_dims(gl.load(LSE + row_base + offs_m, mask=offs_m < Lq, other=0.0), 1)
    delta = gl.expand_dims(gl.load(Delta + row_base + offs_m, mask=offs_m < Lq, other=0.0), 1)
    lo, full_lo, full_hi, hi = kv_block_range(m0_cta, Lq, Lk, window_left, window_right, CTA_M, BLOCK_N, MOD)

    mbarrier.wait(q_ready.index(CID), 0)
    q = q_smem.index(CID).reshape([WG_M, HEAD_DIM])
    do = do_smem.index(CID).reshape([WG_M, HEAD_DIM])
    dq = gl.zeros([WG_M, HEAD_DIM], gl.float32, acc_layout)
    for it in range((hi - lo + BLOCK_N - 1) // BLOCK_N):
        kv_idx = gl.expand_dims(lo + it * BLOCK_N + offs_nb, 0)
        slot = consumer_wait(ready, it, STAGES)
        k = k_smem.index(slot).reshape([BLOCK_N, HEAD_DIM])
        v = v_smem.index(slot).reshape([BLOCK_N, HEAD_DIM])
        s_tok = warpgroup_mma(q, k.permute((1, 0)), gl.zeros([WG_M, BLOCK_N], gl.float32, s_layout),
                              use_acc=False, is_async=True)
        dp_tok = warpgroup_mma(do, v.permute((1, 0)), gl.zeros([WG_M, BLOCK_N], gl.float32, s_layout),
                               use_acc=False, is_async=True)
        s = warpgroup_mma_wait(1, deps=(s_tok, )) * sm_scale   # S retired; dP may still run
        # keys past Lk (TMA zero-filled) get P = 0: a score mod must not see them
        p = gl.where(kv_idx < Lk, _bwd_p(s, lse, b, h, q_idx, kv_idx, Lq, Lk, window_left, window_right, softcap,
                                         alibi_ptr, MOD), 0.0)
        dp = warpgroup_mma_wait(0, deps=(dp_tok, ))
        ds = _bwd_ds(p, dp, delta, s, sm_scale, b, h, q_idx, kv_idx, Lq, Lk, softcap, alibi_ptr, MOD)
        ds_op = gl.convert_layout(ds.to(dtype), op_layout)   # rounded to the input dtype, as the portable kernel does
        dq_tok = warpgroup_mma(ds_op, k, dq, is_async=True)
        dq, ds_op = warpgroup_mma_wait(0, deps=(dq_tok, ds_op))
        mbarrier.arrive(empty.index(slot), count=1)   # every wgmma reading the K / V slot has retired

    # epilogue: the Q tile was read for the last time above; it stages dQ for the TMA store
    q_out = q_smem.index(CID)
    q_out.reshape([WG_M, HEAD_DIM]).store(dq.to(dtype))
    fence_async_shared()
    _tma_store(dq_desc, [b, h, m0, 0], q_out)   # rows >= Lq are clipped by TMA
    tma.store_wait(0)


DQ_SHAPE_ARGS = ("window_left", "window_right", "Hq", "GROUP", "Lq", "Lk")


@gluon.jit(do_not_specialize=DQ_SHAPE_ARGS)
def _attn_bwd_dq_sm90(q_desc, k_desc, v_desc, do_desc, dq_desc, LSE, Delta, alibi_ptr, sm_scale, softcap,
                      window_left, window_right, Hq, GROUP, Lq, Lk, WG_M: gl.constexpr, BLOCK_N: gl.constexpr,
                      HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, NUM_CONSUMERS: gl.constexpr, MOD: gl.constexpr,
                      CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr):
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [NUM_CONSUMERS] + q_desc.block_type.shape, q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [NUM_CONSUMERS] + do_desc.block_type.shape, do_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [NUM_CONSUMERS, 1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ring_init(q_ready, NUM_CONSUMERS, 1)
    ring_init(ready, STAGES, 1)
    ring_init(empty, STAGES, NUM_CONSUMERS)   # every consumer reads every K / V slot
    fence_async_shared()   # barrier inits visible to the async proxy before the first TMA

    gl.warp_specialize([
        (_dq_consumer, (dq_desc, LSE, Delta, alibi_ptr, q_smem, do_smem, k_smem, v_smem, q_ready, ready, empty,
                        sm_scale, softcap, window_left, window_right, Hq, Lq, Lk, WG_M, BLOCK_N, HEAD_DIM, STAGES,
                        NUM_CONSUMERS, MOD, 0)),
        (_dq_consumer, (dq_desc, LSE, Delta, alibi_ptr, q_smem, do_smem, k_smem, v_smem, q_ready, ready, empty,
                        sm_scale, softcap, window_left, window_right, Hq, Lq, Lk, WG_M, BLOCK_N, HEAD_DIM, STAGES,
                        NUM_CONSUMERS, MOD, 1)),
        (_dq_producer, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, q_ready, ready, empty, Hq,
                        GROUP, Lq, Lk, window_left, window_right, WG_M, BLOCK_N, STAGES, NUM_CONSUMERS, MOD)),
    ], [4, 1],
       [CONSUMER_REGS, PRODUCER_REGS])

    ring_invalidate(q_ready, NUM_CONSUMERS)
    ring_invalidate(ready, STAGES)
    ring_invalidate(empty, STAGES)


# The backward's row statistic delta = rowsum(dO * O) (less dLSE where the loss reads the LSE), which the dK/dV and
# dQ kernels read: one program per (DELTA_M query rows, batch * query head). A Gluon kernel in this module, so it is
# bundled and launched directly with the two kernels after it (the portable pre-pass JIT-compiles per shape and
# launches through Triton's binder). Its shape ints are not specialized: one binary per dtype and head dim. The
# strides come in 16-byte units (DELTA_VEC elements), so the compiler knows each row starts 16-byte aligned and loads
# 16 bytes a thread (passed in elements, they gave 2-byte loads). 64 rows over 8 warps: 0 spills for sm90 and sm100
# on triton 3.6-3.9, where 64 rows over 4 warps spilled (fp16 D 64 on sm90, bf16 D 128 on sm100).
DELTA_SHAPE_ARGS = ("stride_ob", "stride_oh", "stride_om", "stride_dob", "stride_doh", "stride_dom", "Hq", "Lq",
                    "has_dlse")
DELTA_M = 64        # query rows a program
DELTA_WARPS = 8
DELTA_VEC = 8       # 16-bit elements in 16 bytes


@gluon.jit(do_not_specialize=DELTA_SHAPE_ARGS)
def _attn_bwd_delta(O, DO, DLSE, Delta, stride_ob, stride_oh, stride_om, stride_dob, stride_doh, stride_dom,
                    Hq, Lq, has_dlse, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, VEC: gl.constexpr):
    # VEC-element (16-byte) loads along the head dim; the rows over lanes and warps; strides in units of VEC
    layout: gl.constexpr = gl.BlockedLayout([1, VEC], [32 // (HEAD_DIM // VEC), HEAD_DIM // VEC], [gl.num_warps(), 1],
                                            [1, 0])
    pid_bh = gl.program_id(1)
    b = (pid_bh // Hq).to(gl.int64)
    h = (pid_bh % Hq).to(gl.int64)
    rows = gl.program_id(0) * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
    cols = gl.expand_dims(gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout)), 0)
    live = rows < Lq
    mask = gl.expand_dims(live, 1) & (cols < HEAD_DIM)
    r = gl.expand_dims(rows.to(gl.int64), 1)
    o_row = (b * stride_ob + h * stride_oh + r * stride_om) * VEC
    do_row = (b * stride_dob + h * stride_doh + r * stride_dom) * VEC
    o = gl.load(O + o_row + cols, mask=mask, other=0.0).to(gl.float32)
    do = gl.load(DO + do_row + cols, mask=mask, other=0.0).to(gl.float32)
    delta = gl.sum(o * do, 1)
    stat = pid_bh.to(gl.int64) * Lq + rows   # [B, Hq, Lq] contiguous
    if has_dlse != 0:   # a loss that reads the LSE: d lse / d s = P, so it enters as -dLSE beside rowsum(dO * O)
        delta -= gl.load(DLSE + stat, mask=live, other=0.0)
    gl.store(Delta + stat, delta, mask=live)


def _delta_constexprs(head_dim: int) -> dict:
    return {"HEAD_DIM": head_dim, "BLOCK_M": DELTA_M, "VEC": DELTA_VEC}


def _delta_job(case: dict) -> dict:
    """The delta pre-pass's compile job (no mod: one kernel per dtype and head dim, compiled with each case), with
    the 16-byte aligned pointers a launch on the op's tensors specializes on (what the gates must see: the same
    kernel compiled without them loads 2 bytes at a time and allocates registers differently)."""
    ty = _TRITON_TY[case["dtype"]]
    sig = {"O": f"*{ty}", "DO": f"*{ty}", "DLSE": "*fp32", "Delta": "*fp32"}
    sig.update({name: "i32" for name in DELTA_SHAPE_ARGS})
    constexprs = _delta_constexprs(case["head_dim"])
    sig.update({name: "constexpr" for name in constexprs})
    return {"name": f"attn_bwd_delta_{case['dtype']}_d{case['head_dim']}_{case['mod']}",
            "fn": _attn_bwd_delta, "signature": sig, "constexprs": constexprs,
            "attrs": {(i,): [["tt.divisibility", 16]] for i in range(4)}, "options": {"num_warps": DELTA_WARPS}}


def backward_delta(out, dout, dlse, delta) -> None:
    """delta = rowsum(dO * O) - dLSE (dlse None: no LSE gradient) into `delta` ([B, Hq, Lq] fp32, contiguous), from
    out and dout [B, Hq, Lq, D] with unit last stride (the portable backward calls this before the dK/dV and dQ
    kernels)."""
    B, Hq, Lq, D = out.shape
    assert D in (64, 128) and str(out.dtype).replace("torch.", "") in _TRITON_TY and dout.dtype == out.dtype
    assert out.stride(-1) == 1 and dout.stride(-1) == 1 and delta.is_contiguous()
    assert dlse is None or dlse.is_contiguous()
    # rows 16-byte aligned (strides in DELTA_VEC units); a view that is not is read from a copy
    out, dout = (t if all(s % DELTA_VEC == 0 for s in t.stride()[:3]) else t.contiguous() for t in (out, dout))
    # keyed by dtype too: a Launcher's compiled kernels are keyed by alignment, not dtype
    launcher = shared_launcher(_attn_bwd_delta, (out.dtype, D), {**_delta_constexprs(D), "num_warps": DELTA_WARPS})
    args = (out, dout, delta if dlse is None else dlse, delta, *(s // DELTA_VEC for s in out.stride()[:3]),
            *(s // DELTA_VEC for s in dout.stride()[:3]), Hq, Lq, 0 if dlse is None else 1)
    launcher((-(-Lq // DELTA_M), B * Hq), out.device.index or 0, args, lambda: args)



BWD_CONSUMERS = 2
BWD_WG_N = 64   # keys per consumer warpgroup: one wgmma M of the S^T / dP^T tiles and of the dK / dV accumulators


def _bwd_block_m(head_dim: int) -> int:
    """Query rows a step (the N of the S^T / dP^T wgmmas), chosen for 0 spills in the sm90 cross-compile: at D = 128
    the dK and dV accumulators take 64 registers a thread each, and 64 rows spilled 106 stores (triton 3.6.0) where
    32 spill none."""
    return CONFIG.get("BWD_BLOCK_M", 64 if head_dim <= 64 else 32)


def _bwd_stages(head_dim: int) -> int:
    # the deepest Q / dO ring of 4, 3, 2 beside every consumer's K and V tiles
    block_m = _bwd_block_m(head_dim)
    kv = BWD_CONSUMERS * 2 * BWD_WG_N * head_dim * 2
    for stages in (4, 3, 2):
        if kv + stages * 2 * block_m * head_dim * 2 <= SMEM_LIMIT:
            return stages
    return 2


def _bwd_constexprs(head_dim: int, mod: int) -> dict:
    return {"BLOCK_M": _bwd_block_m(head_dim), "WG_N": BWD_WG_N, "HEAD_DIM": head_dim,
            "STAGES": _bwd_stages(head_dim), "NUM_CONSUMERS": BWD_CONSUMERS, "MOD": mod,
            "CONSUMER_REGS": CONFIG.get("CONSUMER_REGS", 240), "PRODUCER_REGS": CONFIG.get("PRODUCER_REGS", 24)}


def _bwd_options() -> dict:
    warps = 4 * BWD_CONSUMERS + 4
    return {"num_warps": 4, "maxnreg": min(256, (65536 // (32 * warps)) // 8 * 8)}


def _bwd_blocks(head_dim: int):
    return [1, 1, _bwd_block_m(head_dim), head_dim], [1, 1, BWD_WG_N, head_dim]


DQ_WG_M = 64      # query rows per dQ consumer warpgroup: one wgmma M
DQ_BLOCK_N = 64   # keys a step: the N of the S / dP wgmmas, the K of dQ += dS K


def _dq_stages(head_dim: int) -> int:
    # the deepest K / V ring of 4, 3, 2 beside every consumer's Q and dO tiles
    qdo = BWD_CONSUMERS * 2 * DQ_WG_M * head_dim * 2
    for stages in (4, 3, 2):
        if qdo + stages * 2 * DQ_BLOCK_N * head_dim * 2 <= SMEM_LIMIT:
            return stages
    return 2


def _dq_constexprs(head_dim: int, mod: int) -> dict:
    return {"WG_M": DQ_WG_M, "BLOCK_N": DQ_BLOCK_N, "HEAD_DIM": head_dim, "STAGES": _dq_stages(head_dim),
            "NUM_CONSUMERS": BWD_CONSUMERS, "MOD": mod, "CONSUMER_REGS": CONFIG.get("CONSUMER_REGS", 240),
            "PRODUCER_REGS": CONFIG.get("PRODUCER_REGS", 24)}


def _dq_blocks(head_dim: int):
    return [1, 1, DQ_WG_M, head_dim], [1, 1, DQ_BLOCK_N, head_dim]


def _bwd_job(kernel: str, fn, case: dict, blocks, descs, shape_args, constexprs: dict) -> dict:
    """One backward kernel's compile job: its descriptors (name -> the "q" or "kv" block of `blocks`), the row
    statistics and mod scalars every backward kernel takes, its unspecialized shape ints and its constexprs."""
    q_ty, kv_ty = (_desc_type(case["dtype"], block) for block in blocks)
    sig = {name: q_ty if kind == "q" else kv_ty for name, kind in descs}
    sig.update({"LSE": "*fp32", "Delta": "*fp32", "alibi_ptr": "*fp32", "sm_scale": "fp32", "softcap": "fp32"})
    sig.update({name: "i32" for name in shape_args})
    sig.update({name: "constexpr" for name in constexprs})
    return {"name": f"attn_bwd_{kernel}_sm90_{case['dtype']}_d{case['head_dim']}_{case['mod']}", "fn": fn,
            "signature": sig, "constexprs": constexprs, "options": _bwd_options()}


def backward_jobs(case: dict) -> list:
    """The dK/dV and dQ kernels at one case: compiled and gated with the forward (compile_jobs)."""
    d, mod = case["head_dim"], MOD_NAMES.index(case["mod"])
    inputs = (("q_desc", "q"), ("k_desc", "kv"), ("v_desc", "kv"), ("do_desc", "q"))
    return [_bwd_job("dkdv", _attn_bwd_dkdv_sm90, case, _bwd_blocks(d), inputs + (("dk_desc", "kv"), ("dv_desc", "kv")),
                     BWD_SHAPE_ARGS, _bwd_constexprs(d, mod)),
            _bwd_job("dq", _attn_bwd_dq_sm90, case, _dq_blocks(d), inputs + (("dq_desc", "q"), ), DQ_SHAPE_ARGS,
                     _dq_constexprs(d, mod)),
            _delta_job(case)]


def _launch_bwd(launcher, grid, tensors, blocks, layouts, tail) -> None:
    """A backward kernel's launch: a TMA descriptor over each of `tensors` (its block and layout), then `tail`."""
    boxes = [(t, tuple(t.shape), t.stride()) for t in tensors]
    launcher(grid, tensors[0].device.index or 0,
             tuple(TmaDescriptor(t, shape, strides) for t, shape, strides in boxes) + tail,
             lambda: tuple(TensorDescriptor(t, list(shape), list(strides), block, layout)
                           for (t, shape, strides), block, layout in zip(boxes, blocks, layouts)) + tail)


def backward_dkdv(q, k, v, dout, lse, delta, dk, dv, scale: float, mod: str, window_left: int, window_right: int,
                  softcap: float, alibi_slopes) -> None:
    """dK and dV into `dk`, `dv` ([B, Hkv, Lk, D], contiguous, q's dtype) from the forward's LSE and the pre-pass's
    delta ([B, Hq, Lq] fp32, contiguous); window extents already clamped (the portable backward calls this). A view
    TMA cannot address is copied, once."""
    B, Hq, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    assert Hq % Hkv == 0 and D in (64, 128) and q.dtype in _TORCH_NAMES
    assert dk.is_contiguous() and dv.is_contiguous() and lse.is_contiguous() and delta.is_contiguous()
    q, k, v, dout = _tma_ready(q), _tma_ready(k), _tma_ready(v), _tma_ready(dout)
    (q_block, q_layout), (kv_block, kv_layout), launcher = _case(q.dtype, D, mod, "dkdv")
    grid = (-(-Lk // (BWD_CONSUMERS * BWD_WG_N)), B * Hkv)
    scalars = (float(scale), float(softcap), int(window_left), int(window_right), Hq, Hkv, Hq // Hkv, Lq, Lk)
    _launch_bwd(launcher, grid, (q, k, v, dout, dk, dv), (q_block, kv_block, kv_block, q_block, kv_block, kv_block),
                (q_layout, kv_layout, kv_layout, q_layout, kv_layout, kv_layout),
                (lse, delta, alibi_slopes) + scalars)


def backward_dq(q, k, v, dout, lse, delta, dq, scale: float, mod: str, window_left: int, window_right: int,
                softcap: float, alibi_slopes) -> None:
    """dQ into `dq` ([B, Hq, Lq, D], contiguous, q's dtype) from the forward's LSE and the pre-pass's delta ([B, Hq,
    Lq] fp32, contiguous); window extents already clamped (the portable backward calls this). A view TMA cannot
    address is copied, once."""
    B, Hq, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    assert Hq % Hkv == 0 and D in (64, 128) and q.dtype in _TORCH_NAMES
    assert dq.is_contiguous() and lse.is_contiguous() and delta.is_contiguous()
    q, k, v, dout = _tma_ready(q), _tma_ready(k), _tma_ready(v), _tma_ready(dout)
    (q_block, q_layout), (kv_block, kv_layout), launcher = _case(q.dtype, D, mod, "dq")
    grid = (-(-Lq // (BWD_CONSUMERS * DQ_WG_M)), B * Hq)
    scalars = (float(scale), float(softcap), int(window_left), int(window_right), Hq, Hq // Hkv, Lq, Lk)
    _launch_bwd(launcher, grid, (q, k, v, dout, dq), (q_block, kv_block, kv_block, q_block, q_block),
                (q_layout, kv_layout, kv_layout, q_layout, q_layout), (lse, delta, alibi_slopes) + scalars)
