"""Flash-attention forward for sm_100a (Blackwell): O = softmax(mod(scale * Q K^T) + mask) V and the row LSE.

One persistent CTA works on Q_TILES * 128 query rows of one (batch, head) at a time, sharing every K/V block
between its Q tiles. Partitions (gl.warp_specialize):
  default   (4 warps)  correction: rescales O_t in TMEM when softmax raised the running max, then the epilogue
                       (O_t / l -> smem -> TMA store in 64-column chunks, LSE with plain stores)
  worker t  (4 warps)  softmax of Q tile t (one per tile): S_t from TMEM -> mods/mask -> online softmax ->
                       P_t back into the same TMEM columns (fp16/bf16, packed), alpha/stats to the correction
  worker    (1 warp)   tcgen05 issuer: S_t = Q_t K^T, O_t += P_t V (P read from TMEM)
  worker    (1 warp)   TMA loader: Q tiles once per CTA tile, K/V blocks through one smem ring
Every partition walks the same persistent tile sequence and derives the same KV range from kv_block_range(), so
their barrier counters agree without talking to each other.

Barriers (all count 1; phases follow the shared ring protocol, counters never reset across tiles):
  q_ready/q_empty[t]      loader -> MMA (TMA tx bytes) / MMA -> loader (tcgen05_commit after the tile's last QK)
  kv_ready/kv_empty[s]    loader -> MMA / MMA -> loader (tcgen05_commit after the last MMA that reads the slot)
  s_ready[t]              MMA -> softmax t: S_t = Q_t K_j^T landed (QK MMA completion)
  p_ready[t]              softmax t -> MMA: P_t written into S_t's columns, S_t fully read (the "empty" barrier of
                          S_t for the softmax's side)
  o_ready[t]              MMA -> correction: PV into O_t completed. The MMA warp waits on it too before the next QK
                          into S_t: that QK overwrites P_t, which the PV reads, and tcgen05 orders MMAs only into
                          the same accumulator (PTX's pipelined pairs), not a PV into O_t and a QK into S_t
  o_free[t]               correction -> MMA: O_t rescaled (or, after the tile's last PV, drained by the epilogue)
  msg_ready/msg_empty[t]  softmax t <-> correction: a 2-slot smem ring of row vectors (alpha_j for j >= 1, then the
                          final (m, l) of the tile)
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
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

if __package__:   # generated/<family>/: the package's own copy of the run time
    from .._runtime.launch import Launcher, TmaDescriptor, shared_launcher
else:             # compiled alone by gen: gen's run time (the same files)
    from gen.runtime.launch import Launcher, TmaDescriptor, shared_launcher


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
CONFIG = {'BLOCK_M': 128, 'BLOCK_N': 128, 'num_warps': 4, 'Q_TILES': 2, 'KV_STAGES': 6, 'S_CHUNK': 32, 'SOFTMAX_REGS': 192, 'RESCALE_THRESHOLD': 8.0, 'EXP2_EMU': 1}

BLOCK_M = 128
BLOCK_N = 128
NUM_WARPS = 4
Q_TILES = 2
KV_STAGES = 6
SOFTMAX_REGS = 192
RESCALE_THRESHOLD = 8.0
MOD_NAMES = ['none', 'causal', 'window', 'softcap', 'alibi', 'decay']
EPI_D = 64        # O columns per epilogue chunk (64 x 16-bit = one 128-byte swizzle row)
EPI_BUFS = 2      # epilogue smem chunks in flight
MSG_SLOTS = 2     # softmax -> correction message ring depth
SMEM_LIMIT = 232448
TMEM_COLS = 512
assert BLOCK_M == 128 and NUM_WARPS == 4, "one TMEM lane per row: 128-row tiles, 4-warp partitions"

# Tensor memory, 32-bit columns per buffer (128 lanes each), at the largest head dim this config supports
# (D_MAX = 128); tmem_buffers(head_dim) gives the exact table for a head dim.
#   buffer    cols          holds
#   s<t>      BLOCK_N       S_t = Q_t K^T (fp32); P_t (16-bit, packed 2 per column) aliases its first BLOCK_N/2 cols
#   o<t>      head_dim      O_t accumulator (fp32)
#   total     Q_TILES * (BLOCK_N + head_dim) <= 512:  D=64 -> 384, D=128 -> 512
TMEM_BUFFERS = { "s0": 128, "s1": 128, "o0": 128, "o1": 128, }


def tmem_buffers(head_dim):
    return {**{f"s{t}": BLOCK_N for t in range(Q_TILES)}, **{f"o{t}": head_dim for t in range(Q_TILES)}}


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
    group = min_hi(group_heads, heads)
    band_ranks = (nprog + group - 1) // group
    band = tile // (band_ranks * heads)
    ranks = min_hi(band_ranks, num_m - band * band_ranks)   # the last band may hold fewer ranks
    t = tile - band * band_ranks * heads
    first = t // (group * ranks) * group
    in_group = min_hi(group, heads - first)   # the last group may hold fewer heads
    t = t - first * ranks
    return first + t % in_group, band * band_ranks + t // in_group


@gluon.jit
def l2_group_heads(heads, Lk, GROUP, L2_KEYS: gl.constexpr, GROUP_KEYS: gl.constexpr):
    # The query heads of one causal tile group. Every head, while the K and V of all KV heads (Lk keys each) fit in
    # L2_KEYS keys (the kernel's L2_KV_BYTES); beyond that, as many whole KV groups (GROUP query heads each) as fit in
    # GROUP_KEYS (L2_GROUP_BYTES), at least one. Keys, not bytes: L2_KV_BYTES // (2 tensors * 2 bytes * HEAD_DIM).
    kv_heads = heads // GROUP
    grouped = max_lo(GROUP_KEYS // Lk, 1) * GROUP
    return gl.where(kv_heads <= L2_KEYS // Lk, heads, grouped)



@gluon.jit
def _exp2_fma(x):
    # 2^x without MUFU (FA4's emulation), for x < 128 (the softmax's is at most RESCALE_THRESHOLD): x = j + f with
    # j = round(x) by the 1.5 * 2^23 shifter (FADDs; no FRND, which issues at MUFU's rate) and f in [-0.5, 0.5];
    # 2^f by a degree-3 polynomial (Horner, FFMAs) whose coefficients minimize the relative error on [-0.5, 0.5]
    # (7.5e-5 at most, 6x under fp16's rounding of P); 2^j added to the exponent field (the shifted sum's low bits
    # are j: one shift-add). Below -126 (masked scores, -inf) the result is 0, as exp2's: fully masked rows keep l = 0.
    t = x + 12582912.0
    j = t - 12582912.0
    f = x - j
    p = gl.fma(gl.fma(gl.fma(f, 0.05517143534226604, 0.24261080903055077), f, 0.693260991374304), f,
               0.9999280928110607)
    bits = p.to(gl.int32, bitcast=True) + (t.to(gl.int32, bitcast=True) << 23)
    return gl.where(x < -126.0, 0.0, bits.to(gl.float32, bitcast=True))


@gluon.jit
def _ctaid(dep):
    # program_id(0) / num_programs(0) read inside the partition (volatile asm, for the same reason as _pin).
    return gl.inline_asm_elementwise("mov.u32 $0, %ctaid.x;", "=r,r", [dep], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _nctaid(dep):
    return gl.inline_asm_elementwise("mov.u32 $0, %nctaid.x;", "=r,r", [dep], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _tmem_fence_before(dep):
    return gl.inline_asm_elementwise("tcgen05.fence::before_thread_sync;\n mov.b32 $0, $1;", "=r,r", [dep],
                                     dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _tmem_fence_after(dep):
    return gl.inline_asm_elementwise("tcgen05.fence::after_thread_sync;\n mov.b32 $0, $1;", "=r,r", [dep],
                                     dtype=gl.int32, is_pure=False, pack=1)



@gluon.jit
def _pin_args(B, Hq, HQ_PER_KV, Lq, Lk, window_left, window_right):
    return (pin_scalar(B), pin_scalar(Hq), pin_scalar(HQ_PER_KV), pin_scalar(Lq), pin_scalar(Lk),
            pin_scalar(window_left), pin_scalar(window_right))


@gluon.jit
def _tile_use(counter, t, Q_TILES: gl.constexpr):
    # Tile t's private ring of N slots lives interleaved in a shared ring of N * Q_TILES barriers (slot s of
    # tile t = barrier s * Q_TILES + t). Its counter-th use is use counter * Q_TILES + t of the shared ring:
    # same slot arithmetic, same phase parity, so the shared ring protocol applies unchanged.
    return counter * Q_TILES + t


@gluon.jit
def _cta_tile(tile_id, nprog, num_tiles, num_m, Hq, HQ_PER_KV, Lq, Lk, window_left, window_right,
              CTA_M: gl.constexpr, BLOCK_N: gl.constexpr, MOD: gl.constexpr, L2_KEYS: gl.constexpr,
              GROUP_KEYS: gl.constexpr):
    # The order of the persistent tiles: score_math's tile_order (longest causal tiles first, balanced over CTAs,
    # over groups of heads whose K/V fit in L2).
    # (the group from a pinned Lk and GROUP, so its math stays inside the tile loop instead of living across it:
    # the 1-warp partitions have 24 registers)
    group_heads = l2_group_heads(num_tiles // num_m, pin_scalar(Lk), pin_scalar(HQ_PER_KV), L2_KEYS, GROUP_KEYS)
    bh, rank = tile_order(tile_id, nprog, num_tiles, num_m, group_heads, MOD)
    m0 = (num_m - 1 - rank) * CTA_M
    b = bh // Hq
    h = bh % Hq
    hkv = h // HQ_PER_KV
    lo, full_lo, full_hi, hi = kv_block_range(m0, Lq, Lk, window_left, window_right, CTA_M, BLOCK_N, MOD)
    n = (hi - lo + BLOCK_N - 1) // BLOCK_N  # 0 when every row of the CTA tile is fully masked
    return b, h, hkv, m0, lo, n


@gluon.jit
def _load_partition(q_desc, k_desc, v_desc, q_smem, kv_smem, q_ready, q_empty, kv_ready, kv_empty,
                    B, Hq, HQ_PER_KV, Lq, Lk, window_left, window_right,
                    MOD: gl.constexpr, Q_TILES: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                    KV_STAGES: gl.constexpr, L2_KEYS: gl.constexpr, GROUP_KEYS: gl.constexpr):
    CTA_M: gl.constexpr = Q_TILES * BLOCK_M
    # Full boxes: TMA zero-fills rows past Lq / Lk and still counts them in the transaction bytes.
    Q_BYTES: gl.constexpr = q_desc.block_type.nbytes
    KV_BYTES: gl.constexpr = k_desc.block_type.nbytes
    q_use = 0
    kv_use = 0
    B, Hq, HQ_PER_KV, Lq, Lk, window_left, window_right = _pin_args(B, Hq, HQ_PER_KV, Lq, Lk, window_left, window_right)
    num_m = gl.cdiv(Lq, CTA_M)
    num_tiles = B * Hq * num_m
    nprog = _nctaid(Lq)
    for tile_id in range(_ctaid(Lq), num_tiles, nprog):
        b, h, hkv, m0, lo, n = _cta_tile(tile_id, nprog, num_tiles, num_m, Hq, HQ_PER_KV, Lq, Lk, window_left,
                                         window_right, CTA_M, BLOCK_N, MOD, L2_KEYS, GROUP_KEYS)
        if n > 0:
            # K_0 first: its slot does not depend on this tile's Q buffers being free, so it can be prefetched while
            # the previous tile's last MMAs still read Q. Then the Q tiles, then V_0, K_1, V_1, ...
            for j in range(n):
                kv_row = lo + j * BLOCK_N
                s = producer_acquire(kv_empty, kv_use, KV_STAGES)
                mbarrier.expect(kv_ready.index(s), KV_BYTES)
                _tma_load(k_desc, [b, hkv, kv_row, 0], kv_ready.index(s), kv_smem.index(s))
                kv_use += 1
                if j == 0:
                    for t in gl.static_range(Q_TILES):
                        producer_acquire(q_empty, _tile_use(q_use, t, Q_TILES), Q_TILES)
                        mbarrier.expect(q_ready.index(t), Q_BYTES)
                        _tma_load(q_desc, [b, h, m0 + t * BLOCK_M, 0],
                                                        q_ready.index(t), q_smem.index(t))
                s = producer_acquire(kv_empty, kv_use, KV_STAGES)
                mbarrier.expect(kv_ready.index(s), KV_BYTES)
                _tma_load(v_desc, [b, hkv, kv_row, 0], kv_ready.index(s), kv_smem.index(s))
                kv_use += 1
            q_use += 1


@gluon.jit
def _mma_partition(q_smem, kv_smem, s_tmem, o_tmem, q_ready, q_empty, kv_ready, kv_empty,
                   s_ready, p_ready, o_ready, o_free,
                   B, Hq, HQ_PER_KV, Lq, Lk, window_left, window_right,
                   MOD: gl.constexpr, Q_TILES: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                   HEAD_DIM: gl.constexpr, KV_STAGES: gl.constexpr, L2_KEYS: gl.constexpr, GROUP_KEYS: gl.constexpr):
    CTA_M: gl.constexpr = Q_TILES * BLOCK_M
    dtype: gl.constexpr = q_smem.dtype
    # P_t: 16-bit, packed two per 32-bit column, in the first BLOCK_N / 2 columns of S_t (as in _softmax_partition)
    p_packed_layout: gl.constexpr = TensorMemoryLayout([BLOCK_M, 2 * BLOCK_N], col_stride=1)
    if TMEM_REINTERPRET_PRIVATE:
        p_tmem = s_tmem._reinterpret(dtype, [Q_TILES, BLOCK_M, 2 * BLOCK_N], p_packed_layout)
    else:
        p_tmem = s_tmem.reinterpret(dtype, [Q_TILES, BLOCK_M, 2 * BLOCK_N], p_packed_layout)
    q_use = 0
    kv_use = 0
    s_use = 0  # S/P uses per Q tile (all tiles step together)
    o_use = 0  # PV MMAs per Q tile
    B, Hq, HQ_PER_KV, Lq, Lk, window_left, window_right = _pin_args(B, Hq, HQ_PER_KV, Lq, Lk, window_left, window_right)
    num_m = gl.cdiv(Lq, CTA_M)
    num_tiles = B * Hq * num_m
    nprog = _nctaid(Lq)
    for tile_id in range(_ctaid(Lq), num_tiles, nprog):
        b, h, hkv, m0, lo, n = _cta_tile(tile_id, nprog, num_tiles, num_m, Hq, HQ_PER_KV, Lq, Lk, window_left,
                                         window_right, CTA_M, BLOCK_N, MOD, L2_KEYS, GROUP_KEYS)
        if n > 0:
            # Prologue: S_t = Q_t K_0^T for every tile (tile 0 starts as soon as Q_0 and K_0 have landed).
            ks = consumer_wait(kv_ready, kv_use, KV_STAGES)
            k_view = kv_smem.index(ks).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
            kv_use += 1
            for t in gl.static_range(Q_TILES):
                consumer_wait(q_ready, _tile_use(q_use, t, Q_TILES), Q_TILES)
                # S_t is free once softmax t handed back its previous P and the last PV reading it completed
                # (MMAs into different accumulators are not ordered).
                producer_acquire(p_ready, _tile_use(s_use, t, Q_TILES), Q_TILES)
                if o_use > 0:
                    consumer_wait(o_ready, _tile_use(o_use - 1, t, Q_TILES), Q_TILES)
                _tmem_fence_after(s_use)
                q_view = q_smem.index(t).reshape([BLOCK_M, HEAD_DIM])
                tcgen05_mma(q_view, k_view, s_tmem.index(t), use_acc=False, mbarriers=[s_ready.index(t)])
                if n == 1:
                    tcgen05_commit(q_empty.index(t))   # Q_t's only QK issued: see the last QK below
            # K_0's slot is free once every QK reading it completed: a commit, since the QKs go into different
            # accumulators and tcgen05 does not order their completion.
            tcgen05_commit(kv_empty.index(ks))
            for j in range(n):
                vs = consumer_wait(kv_ready, kv_use, KV_STAGES)
                v_view = kv_smem.index(vs).reshape([BLOCK_N, HEAD_DIM])
                kv_use += 1
                has_next = j + 1 < n
                ks, _ = ring_slot(kv_use, KV_STAGES)  # K_{j+1}'s slot, used only if has_next
                k_view = kv_smem.index(ks).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
                for t in gl.static_range(Q_TILES):
                    producer_acquire(p_ready, _tile_use(s_use + 1, t, Q_TILES), Q_TILES)  # P_t(j) is in TMEM
                    producer_acquire(o_free, _tile_use(o_use, t, Q_TILES), Q_TILES)       # O_t rescaled for step j / drained
                    _tmem_fence_after(o_use)
                    p_view = p_tmem.index(t).slice(0, BLOCK_N)
                    tcgen05_mma(p_view, v_view, o_tmem.index(t), use_acc=j > 0, mbarriers=[o_ready.index(t)])
                    if t == Q_TILES - 1:
                        tcgen05_commit(kv_empty.index(vs))   # every PV reading V_j issued (see K_0's commit)
                    if has_next:
                        if t == 0:
                            consumer_wait(kv_ready, kv_use, KV_STAGES)
                        # QK_t(j+1) overwrites P_t(j), which PV_t(j) reads. tcgen05 orders MMAs only into the same
                        # accumulator (PTX's pipelined pairs), so wait for PV_t(j) to complete (its o_ready phase).
                        consumer_wait(o_ready, _tile_use(o_use, t, Q_TILES), Q_TILES)
                        q_view = q_smem.index(t).reshape([BLOCK_M, HEAD_DIM])
                        tcgen05_mma(q_view, k_view, s_tmem.index(t), use_acc=False, mbarriers=[s_ready.index(t)])
                        if j + 2 == n:
                            # Q_t's last QK issued: Q_t may be refilled once it completes (FA4), so the next CTA
                            # tile's Q loads while this tile's last PVs, softmax and epilogue still run, instead of
                            # after the last PV.
                            tcgen05_commit(q_empty.index(t))
                        if t == Q_TILES - 1:
                            tcgen05_commit(kv_empty.index(ks))
                if has_next:
                    kv_use += 1
                s_use += 1
                o_use += 1
            q_use += 1


@gluon.jit
def _softmax_partition(s_tmem, msg_smem, s_ready, p_ready, msg_ready, msg_empty, alibi_ptr, sm_scale, softcap,
                       B, Hq, HQ_PER_KV, Lq, Lk, window_left, window_right,
                       TILE: gl.constexpr, MOD: gl.constexpr, Q_TILES: gl.constexpr, BLOCK_M: gl.constexpr,
                       BLOCK_N: gl.constexpr, S_CHUNK: gl.constexpr, MSG_SLOTS: gl.constexpr,
                       RESCALE_THRESHOLD: gl.constexpr, EXP2_EMU: gl.constexpr, dtype: gl.constexpr,
                       L2_KEYS: gl.constexpr, GROUP_KEYS: gl.constexpr):
    CTA_M: gl.constexpr = Q_TILES * BLOCK_M
    N_CHUNKS: gl.constexpr = BLOCK_N // S_CHUNK
    # S is processed in S_CHUNK-column slices (TMEM load, mods, exp2, P store) so that a slice's P is stored,
    # and its registers freed, before the next one is computed: 128 fp32 S registers + small change per thread.
    chunk_tmem_layout: gl.constexpr = TensorMemoryLayout([BLOCK_M, S_CHUNK], col_stride=1)
    # tcgen05.ld 32x32b: thread r owns row r, so row max / row sum need no shuffles.
    s_layout: gl.constexpr = tmem_reg_layout(gl.float32, [BLOCK_M, S_CHUNK], chunk_tmem_layout, 4)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    s_buf = s_tmem.index(TILE)
    # P_t: 16-bit, packed two per 32-bit column (col_stride=1), in the first BLOCK_N / 2 columns of S_t. The whole S
    # allocation is reinterpreted as 16-bit [Q_TILES, BLOCK_M, 2 * BLOCK_N] (the same storage; newer Triton refuses a
    # reinterpret that changes a view's size or starts from a subview), then indexed and sliced.
    p_packed_layout: gl.constexpr = TensorMemoryLayout([BLOCK_M, 2 * BLOCK_N], col_stride=1)
    if TMEM_REINTERPRET_PRIVATE:
        p_all = s_tmem._reinterpret(dtype, [Q_TILES, BLOCK_M, 2 * BLOCK_N], p_packed_layout)
    else:
        p_all = s_tmem.reinterpret(dtype, [Q_TILES, BLOCK_M, 2 * BLOCK_N], p_packed_layout)
    p_buf = p_all.index(TILE).slice(0, BLOCK_N)
    # score_tile() units -> log2 units (> 0, so max commutes with it)
    mult = score_exp2_scale(sm_scale, MOD)
    B, Hq, HQ_PER_KV, Lq, Lk, window_left, window_right = _pin_args(B, Hq, HQ_PER_KV, Lq, Lk, window_left, window_right)
    num_m = gl.cdiv(Lq, CTA_M)
    s_use = 0
    msg_use = 0
    num_tiles = B * Hq * num_m
    nprog = _nctaid(Lq)
    for tile_id in range(_ctaid(Lq), num_tiles, nprog):
        b, h, hkv, m0, lo, n = _cta_tile(tile_id, nprog, num_tiles, num_m, Hq, HQ_PER_KV, Lq, Lk, window_left,
                                         window_right, CTA_M, BLOCK_N, MOD, L2_KEYS, GROUP_KEYS)
        mt = m0 + TILE * BLOCK_M
        # Blocks in [full_lo, full_hi) are visible to every row of this tile: no mask needed.
        _lo, full_lo, full_hi, _hi = kv_block_range(mt, Lq, Lk, window_left, window_right, BLOCK_M, BLOCK_N, MOD)
        q_idx = gl.expand_dims(mt + gl.arange(0, BLOCK_M, layout=row_layout), 1)
        m_i = gl.full([BLOCK_M], -float("inf"), gl.float32, row_layout)  # running max, score_tile() units
        l_i = gl.full([BLOCK_M], 0.0, gl.float32, row_layout)
        for j in range(n):
            start = lo + j * BLOCK_N
            full = (start >= full_lo) & (start < full_hi)
            consumer_wait(s_ready, _tile_use(s_use, TILE, Q_TILES), Q_TILES)
            _tmem_fence_after(s_use)
            chunks = ()
            m_blk = gl.full([BLOCK_M], -float("inf"), gl.float32, row_layout)
            for c in gl.static_range(N_CHUNKS):
                kv_idx = gl.expand_dims(start + c * S_CHUNK + gl.arange(0, S_CHUNK, layout=col_layout), 0)
                qk = s_buf.slice(c * S_CHUNK, S_CHUNK).load(s_layout)
                if full:
                    sc = score_tile(qk, sm_scale, b, h, q_idx, kv_idx, Lq, Lk, window_left, window_right, softcap,
                                    alibi_ptr, MOD, False)
                else:
                    sc = score_tile(qk, sm_scale, b, h, q_idx, kv_idx, Lq, Lk, window_left, window_right, softcap,
                                    alibi_ptr, MOD, True)
                m_blk = gl.maximum(m_blk, gl.max(sc, 1))
                chunks = chunks + (sc,)
            m_new = gl.maximum(m_i, m_blk)
            # Lazy rescaling (FA4): keep the stale max unless the new one is larger by more than
            # RESCALE_THRESHOLD (log2 units). P = exp2(s - m) then stays <= 2^THRESHOLD (256 for 8.0: fine in
            # fp16/bf16 and the fp32 sums) and alpha = 1, so the correction skips most O rescales. l and O use
            # the same stale max, so O / l and lse = m + log2(l) stay exact. (-inf - -inf = NaN compares false.)
            grow = (m_new - m_i) * mult > RESCALE_THRESHOLD
            m_use = gl.where(grow, m_new, m_i)
            alpha = gl.where(grow, gl.exp2((m_i - m_use) * mult), 1.0)
            if j > 0:  # O_t(j-1) exists only from j = 1 on: send alpha to the correction
                slot = producer_acquire(msg_empty, _tile_use(msg_use, TILE, Q_TILES), MSG_SLOTS * Q_TILES)
                msg_smem.index(slot * 2).store(alpha)
                _tmem_fence_before(s_use)   # every arrive after a tcgen05.ld is fenced (hw_rules: tmem_handoff)
                mbarrier.arrive(msg_ready.index(slot), count=1)
                msg_use += 1
            # Rows with no visible key so far keep m = -inf: subtract 0 instead (p = exp2(-inf) = 0, no NaN).
            neg_m = gl.expand_dims(gl.where(m_use == -float("inf"), 0.0, -m_use * mult), 1)
            l_blk = gl.full([BLOCK_M], 0.0, gl.float32, row_layout)
            for c in gl.static_range(N_CHUNKS):
                if full and c >= N_CHUNKS - EXP2_EMU:
                    p = _exp2_fma(chunks[c] * mult + neg_m)   # on the FMA pipes, beside the other chunks' MUFU
                else:
                    p = gl.exp2(chunks[c] * mult + neg_m)
                p_buf.slice(c * S_CHUNK, S_CHUNK).store(p.to(dtype))  # 32x32b layout of 16-bit = s_layout's
                l_blk = l_blk + gl.sum(p, 1)
            _tmem_fence_before(s_use)
            mbarrier.arrive(p_ready.index(TILE), count=1)
            l_i = l_i * alpha + l_blk
            m_i = m_use
            s_use += 1
        # Final message: row max in log2 units and the row sum (n == 0: -inf and 0 -> O = 0, lse = -inf).
        slot = producer_acquire(msg_empty, _tile_use(msg_use, TILE, Q_TILES), MSG_SLOTS * Q_TILES)
        msg_smem.index(slot * 2).store(m_i * mult)
        msg_smem.index(slot * 2 + 1).store(l_i)
        mbarrier.arrive(msg_ready.index(slot), count=1)
        msg_use += 1


@gluon.jit
def _correction_partition(o_desc, lse_ptr, o_tmem, o_stage, msg_smem, o_ready, o_free, msg_ready, msg_empty,
                          lse_sb, lse_sh, lse_sl, B, Hq, HQ_PER_KV, Lq, Lk, window_left, window_right,
                          MOD: gl.constexpr, Q_TILES: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                          HEAD_DIM: gl.constexpr, EPI_D: gl.constexpr, EPI_BUFS: gl.constexpr,
                          MSG_SLOTS: gl.constexpr, num_warps: gl.constexpr, L2_KEYS: gl.constexpr,
                          GROUP_KEYS: gl.constexpr):
    CTA_M: gl.constexpr = Q_TILES * BLOCK_M
    dtype: gl.constexpr = o_desc.dtype
    chunk_tmem_layout: gl.constexpr = TensorMemoryLayout([BLOCK_M, EPI_D], col_stride=1)
    o_layout: gl.constexpr = tmem_reg_layout(gl.float32, [BLOCK_M, EPI_D], chunk_tmem_layout, num_warps)
    row_layout: gl.constexpr = gl.SliceLayout(1, o_layout)
    o_use = 0
    msg_use = 0
    epi = 0
    B, Hq, HQ_PER_KV, Lq, Lk, window_left, window_right = _pin_args(B, Hq, HQ_PER_KV, Lq, Lk, window_left, window_right)
    num_m = gl.cdiv(Lq, CTA_M)
    num_tiles = B * Hq * num_m
    nprog = _nctaid(Lq)
    for tile_id in range(_ctaid(Lq), num_tiles, nprog):
        b, h, hkv, m0, lo, n = _cta_tile(tile_id, nprog, num_tiles, num_m, Hq, HQ_PER_KV, Lq, Lk, window_left,
                                         window_right, CTA_M, BLOCK_N, MOD, L2_KEYS, GROUP_KEYS)
        # O_t(j) = alpha_{j+1} * O_t(j) between PV_j and PV_{j+1}; no MMA writes O_t meanwhile (o_free gates it).
        for j in range(n - 1):
            for t in gl.static_range(Q_TILES):
                slot = consumer_wait(msg_ready, _tile_use(msg_use, t, Q_TILES), MSG_SLOTS * Q_TILES)
                alpha = msg_smem.index(slot * 2).load(row_layout)
                mbarrier.arrive(msg_empty.index(slot), count=1)
                consumer_wait(o_ready, _tile_use(o_use, t, Q_TILES), Q_TILES)
                _tmem_fence_after(o_use)
                # Lazy rescaling makes alpha == 1 for every row most of the time: skip the TMEM round trip.
                if gl.min(alpha, 0) < 1.0:
                    for c in gl.static_range(HEAD_DIM // EPI_D):
                        o_ref = o_tmem.index(t).slice(c * EPI_D, EPI_D)
                        o_ref.store(o_ref.load(o_layout) * gl.expand_dims(alpha, 1))
                _tmem_fence_before(o_use)
                mbarrier.arrive(o_free.index(t), count=1)
            msg_use += 1
            o_use += 1
        # Epilogue: O_t / l -> bf16/fp16 -> smem chunk -> TMA store (rows >= Lq clipped by the descriptor).
        for t in gl.static_range(Q_TILES):
            slot = consumer_wait(msg_ready, _tile_use(msg_use, t, Q_TILES), MSG_SLOTS * Q_TILES)
            m_row = msg_smem.index(slot * 2).load(row_layout)
            l_row = msg_smem.index(slot * 2 + 1).load(row_layout)
            mbarrier.arrive(msg_empty.index(slot), count=1)
            if n > 0:
                consumer_wait(o_ready, _tile_use(o_use, t, Q_TILES), Q_TILES)
                _tmem_fence_after(o_use)
            valid = l_row > 0.0
            inv_l = gl.expand_dims(gl.where(valid, 1.0 / l_row, 0.0), 1)
            keep = gl.expand_dims(valid, 1)
            for c in gl.static_range(HEAD_DIM // EPI_D):
                if n > 0:
                    x = o_tmem.index(t).slice(c * EPI_D, EPI_D).load(o_layout)
                    y = gl.where(keep, x * inv_l, 0.0).to(dtype)  # where, not multiply: fully masked rows -> 0
                else:
                    # No visible key for this CTA tile: O_t was never written and the next tile's PV may be
                    # writing it right now, so it must not be read at all.
                    y = gl.zeros([BLOCK_M, EPI_D], dtype, layout=o_layout)
                eb = epi % EPI_BUFS
                tma.store_wait(EPI_BUFS - 1)  # the store that last read o_stage[eb] has finished
                o_stage.index(eb).reshape([BLOCK_M, EPI_D]).store(y)
                fence_async_shared()
                _tma_store(o_desc, [b, h, m0 + t * BLOCK_M, c * EPI_D], o_stage.index(eb))
                epi += 1
            if n > 0:
                _tmem_fence_before(o_use)
                mbarrier.arrive(o_free.index(t), count=1)  # O_t drained: next tile's PV_0 may write
            rows = m0 + t * BLOCK_M + gl.arange(0, BLOCK_M, layout=row_layout)
            lse = gl.where(valid, (m_row + gl.log2(l_row)) * 0.6931471805599453, -float("inf"))
            lse_off = b.to(gl.int64) * lse_sb + h.to(gl.int64) * lse_sh + rows.to(gl.int64) * lse_sl
            gl.store(lse_ptr + lse_off, lse, mask=rows < Lq)
        msg_use += 1
        if n > 0:
            o_use += 1
    tma.store_wait(0)


# Shape and stride ints are not specialized (no ==1 / %16 variants): one binary per dtype, head dim
# and mod serves every shape, so the precompiled bundle covers every call (zero JIT at import).
SHAPE_ARGS = ("B", "Hq", "HQ_PER_KV", "Lq", "Lk", "window_left", "window_right", "lse_sb", "lse_sh")


@gluon.jit(do_not_specialize=SHAPE_ARGS)
def attention_fwd_kernel(q_desc, k_desc, v_desc, o_desc, lse_ptr, alibi_ptr, sm_scale, softcap,
                         B, Hq, HQ_PER_KV, Lq, Lk, window_left, window_right, lse_sb, lse_sh, lse_sl,
                         MOD: gl.constexpr, Q_TILES: gl.constexpr, KV_STAGES: gl.constexpr,
                         RESCALE_THRESHOLD: gl.constexpr, SOFTMAX_REGS: gl.constexpr, num_warps: gl.constexpr):
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[3]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[2]
    EPI_D: gl.constexpr = o_desc.block_type.shape[3]
    EPI_BUFS: gl.constexpr = 2
    S_CHUNK: gl.constexpr = 32
    EXP2_EMU: gl.constexpr = 1
    L2_KEYS: gl.constexpr = 134217728 // (4 * HEAD_DIM)   # L2_KV_BYTES // one key's K and V (16-bit)
    GROUP_KEYS: gl.constexpr = 50331648 // (4 * HEAD_DIM)   # L2_GROUP_BYTES // the same
    MSG_SLOTS: gl.constexpr = 2
    dtype: gl.constexpr = q_desc.dtype
    TILE0: gl.constexpr = 0
    TILE1: gl.constexpr = 1

    # Shared memory: Q tiles, the K/V ring (K and V tiles alternate through the same slots), epilogue chunks,
    # and the softmax -> correction row-vector messages: ring slot r uses rows 2r (alpha, or m) and 2r + 1 (l).
    q_smem = gl.allocate_shared_memory(dtype, [Q_TILES] + q_desc.block_type.shape, q_desc.layout)
    kv_smem = gl.allocate_shared_memory(dtype, [KV_STAGES] + k_desc.block_type.shape, k_desc.layout)
    o_stage = gl.allocate_shared_memory(dtype, [EPI_BUFS] + o_desc.block_type.shape, o_desc.layout)
    msg_smem = gl.allocate_shared_memory(gl.float32, [Q_TILES * MSG_SLOTS * 2, BLOCK_M],
                                         gl.SwizzledSharedLayout(1, 1, 1, [0]))

    bar_layout: gl.constexpr = mbarrier.MBarrierLayout()
    q_ready = gl.allocate_shared_memory(gl.int64, [Q_TILES, 1], bar_layout)
    q_empty = gl.allocate_shared_memory(gl.int64, [Q_TILES, 1], bar_layout)
    kv_ready = gl.allocate_shared_memory(gl.int64, [KV_STAGES, 1], bar_layout)
    kv_empty = gl.allocate_shared_memory(gl.int64, [KV_STAGES, 1], bar_layout)
    s_ready = gl.allocate_shared_memory(gl.int64, [Q_TILES, 1], bar_layout)
    p_ready = gl.allocate_shared_memory(gl.int64, [Q_TILES, 1], bar_layout)
    o_ready = gl.allocate_shared_memory(gl.int64, [Q_TILES, 1], bar_layout)
    o_free = gl.allocate_shared_memory(gl.int64, [Q_TILES, 1], bar_layout)
    msg_ready = gl.allocate_shared_memory(gl.int64, [Q_TILES * MSG_SLOTS, 1], bar_layout)
    msg_empty = gl.allocate_shared_memory(gl.int64, [Q_TILES * MSG_SLOTS, 1], bar_layout)
    ring_init(kv_ready, KV_STAGES, 1)
    ring_init(kv_empty, KV_STAGES, 1)
    # Per-tile barriers are interleaved rings, see _tile_use(): tile t owns barriers t, t + Q_TILES, ...
    ring_init(q_ready, Q_TILES, 1)
    ring_init(q_empty, Q_TILES, 1)
    ring_init(s_ready, Q_TILES, 1)
    ring_init(p_ready, Q_TILES, 1)
    ring_init(o_ready, Q_TILES, 1)
    ring_init(o_free, Q_TILES, 1)
    ring_init(msg_ready, Q_TILES * MSG_SLOTS, 1)
    ring_init(msg_empty, Q_TILES * MSG_SLOTS, 1)

    # Tensor memory (see TMEM_BUFFERS): S/P per Q tile, O per Q tile, fp32 packed (col_stride=1).
    s_tmem = allocate_tensor_memory(gl.float32, [Q_TILES, BLOCK_M, BLOCK_N],
                                    TensorMemoryLayout([BLOCK_M, BLOCK_N], col_stride=1))
    o_tmem = allocate_tensor_memory(gl.float32, [Q_TILES, BLOCK_M, HEAD_DIM],
                                    TensorMemoryLayout([BLOCK_M, HEAD_DIM], col_stride=1))

    # Partition arguments: buffers and barriers, then the tile-walk scalars every partition shares, then constexprs.
    gl.warp_specialize([
        (_correction_partition, (o_desc, lse_ptr, o_tmem, o_stage, msg_smem, o_ready, o_free, msg_ready, msg_empty,
                                 lse_sb, lse_sh, lse_sl,
                                 B, Hq, HQ_PER_KV, Lq, Lk, window_left, window_right,
                                 MOD, Q_TILES, BLOCK_M, BLOCK_N, HEAD_DIM, EPI_D, EPI_BUFS, MSG_SLOTS, num_warps,
                                 L2_KEYS, GROUP_KEYS)),
        (_softmax_partition, (s_tmem, msg_smem, s_ready, p_ready, msg_ready, msg_empty, alibi_ptr, sm_scale, softcap,
                              B, Hq, HQ_PER_KV, Lq, Lk, window_left, window_right,
                              TILE0, MOD, Q_TILES, BLOCK_M, BLOCK_N, S_CHUNK, MSG_SLOTS, RESCALE_THRESHOLD,
                              EXP2_EMU, dtype, L2_KEYS, GROUP_KEYS)),
        (_softmax_partition, (s_tmem, msg_smem, s_ready, p_ready, msg_ready, msg_empty, alibi_ptr, sm_scale, softcap,
                              B, Hq, HQ_PER_KV, Lq, Lk, window_left, window_right,
                              TILE1, MOD, Q_TILES, BLOCK_M, BLOCK_N, S_CHUNK, MSG_SLOTS, RESCALE_THRESHOLD,
                              EXP2_EMU, dtype, L2_KEYS, GROUP_KEYS)),
        (_mma_partition, (q_smem, kv_smem, s_tmem, o_tmem, q_ready, q_empty, kv_ready, kv_empty,
                          s_ready, p_ready, o_ready, o_free,
                          B, Hq, HQ_PER_KV, Lq, Lk, window_left, window_right,
                          MOD, Q_TILES, BLOCK_M, BLOCK_N, HEAD_DIM, KV_STAGES, L2_KEYS, GROUP_KEYS)),
        (_load_partition, (q_desc, k_desc, v_desc, q_smem, kv_smem, q_ready, q_empty, kv_ready, kv_empty,
                           B, Hq, HQ_PER_KV, Lq, Lk, window_left, window_right,
                           MOD, Q_TILES, BLOCK_M, BLOCK_N, KV_STAGES, L2_KEYS, GROUP_KEYS)),
    ], [4, 4, 1, 1], [SOFTMAX_REGS, SOFTMAX_REGS, 24, 24])

    # No ring_invalidate: the tcgen05 arrivals on kv_empty, q_empty, s_ready and o_ready from the last MMAs and
    # commits are not ordered with the partitions' return, and invalidating a barrier with an arrival in flight is
    # undefined (gen/build/hw_rules.py gates it). The kernel ends here, which releases them.


# ----------------------------------------------------------------------------------------------- host side

_TRITON_TY = {"bfloat16": "bf16", "float16": "fp16"}


def supported_head_dims():
    """Head dims whose S/P + O buffers fit the 512 TMEM columns: Q_TILES * (BLOCK_N + D) <= 512."""
    return [d for d in (64, 128, 256) if Q_TILES * (BLOCK_N + d) <= TMEM_COLS]


def smem_bytes(head_dim, kv_slots_=None):
    """Shared memory the kernel allocates (plus compiler scratch, small), 16-bit Q/K/V/O."""
    slots = kv_slots_ if kv_slots_ is not None else KV_STAGES
    q = Q_TILES * BLOCK_M * head_dim * 2
    kv = slots * BLOCK_N * head_dim * 2
    epi = EPI_BUFS * BLOCK_M * min(EPI_D, head_dim) * 2
    msg = Q_TILES * MSG_SLOTS * 2 * BLOCK_M * 4
    bars = 8 * (2 * KV_STAGES + 6 * Q_TILES + 2 * Q_TILES * MSG_SLOTS)
    return q + kv + epi + msg + bars


def kv_slots(head_dim):
    """KV_STAGES clamped to what fits next to the Q tiles (512 B kept for compiler scratch); at least 2."""
    slots = KV_STAGES
    while slots > 2 and smem_bytes(head_dim, slots) + 512 > SMEM_LIMIT:
        slots -= 1
    return slots


def _check(head_dim):
    if head_dim not in supported_head_dims():
        raise ValueError(f"head_dim {head_dim} unsupported by this config (TMEM: Q_TILES * (BLOCK_N + D) <= 512; "
                         f"supported {supported_head_dims()})")
    if smem_bytes(head_dim, kv_slots(head_dim)) + 512 > SMEM_LIMIT:
        raise ValueError(f"head_dim {head_dim} does not fit in shared memory with this config: {CONFIG}")


def _layouts(dtype, head_dim):
    ty = getattr(gl, dtype)
    blocks = {"q": [1, 1, BLOCK_M, head_dim], "kv": [1, 1, BLOCK_N, head_dim], "o": [1, 1, BLOCK_M, min(EPI_D, head_dim)]}
    return {k: (b, gl.NVMMASharedLayout.get_default_for(b, ty)) for k, b in blocks.items()}


def _constexprs(mod, head_dim):
    return {"MOD": MOD_NAMES.index(mod), "Q_TILES": Q_TILES, "KV_STAGES": kv_slots(head_dim),
            "RESCALE_THRESHOLD": float(RESCALE_THRESHOLD), "SOFTMAX_REGS": SOFTMAX_REGS, "num_warps": NUM_WARPS}


def compile_jobs(case):
    dtype, head_dim = case["dtype"], case["head_dim"]
    _check(head_dim)
    lay = _layouts(dtype, head_dim)
    ty = _TRITON_TY[dtype]
    desc = {k: f"tensordesc<{ty}{b},{l!r}>" for k, (b, l) in lay.items()}
    signature = {
        "q_desc": desc["q"], "k_desc": desc["kv"], "v_desc": desc["kv"], "o_desc": desc["o"],
        "lse_ptr": "*fp32", "alibi_ptr": "*fp32", "sm_scale": "fp32", "softcap": "fp32",
        "B": "i32", "Hq": "i32", "HQ_PER_KV": "i32", "Lq": "i32", "Lk": "i32",
        "window_left": "i32", "window_right": "i32", "lse_sb": "i32", "lse_sh": "i32", "lse_sl": "i32",
    }
    constexprs = _constexprs(case["mod"], head_dim)
    signature.update({k: "constexpr" for k in constexprs})
    return [{"name": "attention_fwd_kernel", "fn": attention_fwd_kernel, "signature": signature,
             "constexprs": constexprs, "options": {"num_warps": NUM_WARPS}}] + backward_jobs(case)


def tma_compatible(*tensors):
    """TMA needs 16-byte aligned base pointers and 16-byte aligned strides, unit stride in the last dim."""
    for t in tensors:
        elem = t.element_size()
        if t.data_ptr() % 16 or t.stride(-1) != 1 or any((s * elem) % 16 for s in t.stride()[:-1]):
            return False
    return True


_CASES = {}  # (dtype, head dim, mod) -> (layouts, Launcher): built on first use


def _case(dtype, head_dim: int, mod: str):
    key = (dtype, head_dim, mod)
    found = _CASES.get(key)
    if found is None:
        _check(head_dim)
        lay = _layouts(str(dtype).replace("torch.", ""), head_dim)
        found = _CASES[key] = (lay, Launcher(attention_fwd_kernel, _constexprs(mod, head_dim)))
    return found


class Plan:
    """What a launch needs that depends only on the call's shape class (shapes, strides, dtype, mod, scalars): the
    generated op builds it once per class and keeps it, so a call only wraps its pointers."""
    __slots__ = ("launcher", "layouts", "grid", "device", "boxes", "scalars")


def plan(q, k, v, out, lse, scale, mod, window_left, window_right, softcap, num_sms) -> Plan:
    B, Hq, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    if Hq % Hkv:
        raise ValueError(f"Hq={Hq} is not a multiple of Hkv={Hkv}")
    if min(B, Hq, Lq, Lk) == 0:
        raise ValueError("B, Hq, Lq and Lk must be >= 1")
    if not tma_compatible(q, k, v, out):
        raise ValueError("TMA needs 16-byte aligned bases and strides; use the triton variant for this layout")
    p = Plan()
    p.layouts, p.launcher = _case(q.dtype, D, mod)
    # Clamp window extents so that i + (Lk - Lq) +- extent cannot overflow int32 in the kernel.
    bound = Lq + Lk
    wl = max(-bound, min(int(window_left), bound))
    wr = max(-bound, min(int(window_right), bound))
    num_m = -(-Lq // (Q_TILES * BLOCK_M))
    p.grid = (max(1, min(int(num_sms), B * Hq * num_m)),)  # persistent
    p.device = q.device.index or 0
    # 4-D descriptors over [B, H, L, D] with the tensors' own strides: rows past L are zero-filled on load and
    # clipped on store per (batch, head), so no padding or copies are needed.
    # plain tuples: the launcher keys its cached tensor maps on them every call
    p.boxes = tuple((tuple(t.shape), t.stride()) for t in (q, k, v, out))
    p.scalars = (float(scale), float(softcap or 0.0), B, Hq, Hq // Hkv, Lq, Lk, wl, wr,
                 lse.stride(0), lse.stride(1), lse.stride(2))
    return p


def run(p: Plan, q, k, v, out, lse, alibi_slopes) -> None:
    """Launch a plan on tensors of its shape class whose base pointers are 16-byte aligned (the caller checked)."""
    alibi = alibi_slopes if alibi_slopes is not None else lse  # never read unless the mod is alibi
    (sq, tq), (sk, tk), (sv, tv), (so, to) = p.boxes
    lay = p.layouts
    p.launcher(p.grid, p.device,
               (TmaDescriptor(q, sq, tq), TmaDescriptor(k, sk, tk), TmaDescriptor(v, sv, tv), TmaDescriptor(out, so, to),
                lse, alibi) + p.scalars,
               lambda: (TensorDescriptor(q, list(sq), list(tq), *lay["q"]), TensorDescriptor(k, list(sk), list(tk), *lay["kv"]),
                        TensorDescriptor(v, list(sv), list(tv), *lay["kv"]),
                        TensorDescriptor(out, list(so), list(to), *lay["o"]), lse, alibi) + p.scalars)


def launch(q, k, v, out, lse, scale, mod, window_left, window_right, softcap, alibi_slopes, num_sms):
    """Checked and planned for this one call."""
    if q.shape[0] == 0 or q.shape[1] == 0 or q.shape[2] == 0:
        return
    run(plan(q, k, v, out, lse, scale, mod, window_left, window_right, softcap, num_sms), q, k, v, out, lse, alibi_slopes)


# ------------------------------------------------------------------------------------------------------- backward
# dK and dV of the backward, FA4-style: the accumulators and the transposed score tiles in tensor memory. The
# portable module calls this for dK/dV, the dQ kernel below and the delta pre-pass (the Gluon one sm90 shares,
# templates/_lib/backward.jinja) (generated.attention's backward, triton.backward(dkdv=..., dq_kernel=...,
# delta_kernel=...)), as it calls sm90's; no atomics, so the gradients are the same bits run to run. One CTA per
# (BWD_BLOCK_N = 128 keys, one TMEM lane each; batch * KV head), not persistent: causal CTAs are launched longest
# first (key block 0 sees the most rows). Per query row block i of every query head of the KV group:
#   loader  (1 warp)   K and V once (kv_ready), then Q_i and dO_i through a STAGES-deep ring (ready/empty).
#   MMA     (1 warp)   S^T_i = K Q_i^T and dP^T_i = V dO_i^T into TMEM buffer i % 2 (s_ready, dp_ready), issued one
#                      step ahead; then dV += P^T_i dO_i and dK += dS^T_i Q_i with P^T / dS^T read from TMEM as the
#                      A operand (p_ready, ds_ready); commits after the dK MMA free the Q/dO slot (empty) and the
#                      TMEM buffer (st_free); after the last step a commit (done) hands dK and dV to the epilogue.
#   compute (4 warps)  thread r owns key r: S^T_i -> P^T_i (the mods, rows' LSE), written back as 16-bit into S^T's
#                      columns; dP^T_i -> dS^T_i (the mod's derivative, rows' delta) into dP^T's columns; then the
#                      epilogue: dK and dV from TMEM (64 columns at a time) through the K and V tiles' shared
#                      memory and TMA stores (clipped at Lk). Key blocks no query row sees (window) get zeros
#                      without a TMEM read.
# Tensor memory (32-bit columns of 128 lanes): dK and dV D each, S^T and dP^T 2 x BWD_BLOCK_M each: 2 * 128 + 4 * 64 =
# 512 at D 128.
# The per-tile math is sm90's (templates/_lib/backward.jinja: the mod IR's derivative, q_row_range's rows).
@gluon.jit
def _bwd_p(s_in, lse, b, h, q_idx, kv_idx, Lq, Lk, window_left, window_right, softcap, alibi_ptr, MOD: gl.constexpr):
    """P^T of one transposed tile from the scaled K Q^T, natural units; rows with no visible key (lse = -inf) give 0."""
    s = apply_mods(s_in, b, h, q_idx, kv_idx, Lq, Lk, window_left, window_right, softcap, alibi_ptr, MOD)
    live = (lse > -float("inf")) & (q_idx < Lq)
    return gl.where(live, gl.exp(s - gl.where(live, lse, 0.0)), 0.0)



@gluon.jit
def _bwd_rows(n0, Lq, Lk, window_left, window_right, BLOCK_M: gl.constexpr, CTA_N: gl.constexpr,
              MOD: gl.constexpr):
    # The query row blocks of one query head that see some key of [n0, n0 + CTA_N) (q_row_range's rows, from a
    # BLOCK_M boundary): the first block's row and their count.
    lo_row, hi_row = q_row_range(n0, Lq, Lk, window_left, window_right, CTA_N, MOD)
    m_lo = (lo_row // BLOCK_M) * BLOCK_M
    return m_lo, (hi_row - m_lo + BLOCK_M - 1) // BLOCK_M


@gluon.jit
def _bwd_tmem16(tmem, dtype: gl.constexpr, packed: gl.constexpr, PRIVATE: gl.constexpr):
    # The 16-bit view of [BUFS, ROWS, COLS] fp32 TMEM buffers (two values a column): P^T / dS^T (dS in dQ) live in
    # the first COLS / 2 columns of the S^T / dP^T (dP) they were computed from (index(buf).slice(0, COLS)).
    # It reads no module global (the caller passes TensorMemoryLayout([ROWS, 2 * COLS], col_stride=1) as `packed` and
    # its TMEM_REINTERPRET_PRIVATE): a helper both backward kernels call that read one made Triton's cache key of the
    # second kernel depend on whether the first one's had been computed, so a bundle held two keys for one kernel.
    BUFS: gl.constexpr = tmem.shape[0]
    ROWS: gl.constexpr = tmem.shape[1]
    COLS: gl.constexpr = tmem.shape[2]
    if PRIVATE:
        return tmem._reinterpret(dtype, [BUFS, ROWS, 2 * COLS], packed)
    else:
        return tmem.reinterpret(dtype, [BUFS, ROWS, 2 * COLS], packed)


@gluon.jit
def _bwd_load(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_ready, ready, empty, Hkv, GROUP,
              Lq, Lk, window_left, window_right, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              STAGES: gl.constexpr, MOD: gl.constexpr):
    b = gl.program_id(1) // Hkv
    hk = gl.program_id(1) % Hkv
    n0 = gl.program_id(0) * BLOCK_N
    mbarrier.expect(kv_ready.index(0), k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    _tma_load(k_desc, [b, hk, n0, 0], kv_ready.index(0), k_smem)
    _tma_load(v_desc, [b, hk, n0, 0], kv_ready.index(0), v_smem)
    m_lo, steps = _bwd_rows(n0, Lq, Lk, window_left, window_right, BLOCK_M, BLOCK_N, MOD)
    for it in range(GROUP * steps):
        g = it // steps
        slot = producer_acquire(empty, it, STAGES)
        mbarrier.expect(ready.index(slot), q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        m0 = m_lo + (it - g * steps) * BLOCK_M
        _tma_load(q_desc, [b, hk * GROUP + g, m0, 0], ready.index(slot), q_smem.index(slot))
        _tma_load(do_desc, [b, hk * GROUP + g, m0, 0], ready.index(slot), do_smem.index(slot))


@gluon.jit
def _bwd_issue_scores(x, y, x_ring, y_ring, s_tmem, dp_tmem, s_ready, dp_ready, it, ready, st_free,
                      TILE: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr):
    # Both backward kernels' one-step-ahead scores: S_it = x X_it^T and dP_it = y Y_it^T into TMEM buffer it % 2
    # (dK/dV: x, y = K, V and the ring holds Q, dO, so S^T and dP^T; dQ: x, y = Q, dO and the ring holds K, V), once
    # ring slot it landed and the MMAs that read that buffer's 16-bit P / dS two steps back completed (st_free).
    slot = consumer_wait(ready, it, STAGES)
    buf = producer_acquire(st_free, it, 2)
    _tmem_fence_after(it)
    tcgen05_mma(x, x_ring.index(slot).reshape([TILE, HEAD_DIM]).permute((1, 0)), s_tmem.index(buf),
                use_acc=False, mbarriers=[s_ready.index(buf)])
    tcgen05_mma(y, y_ring.index(slot).reshape([TILE, HEAD_DIM]).permute((1, 0)), dp_tmem.index(buf),
                use_acc=False, mbarriers=[dp_ready.index(buf)])


@gluon.jit
def _bwd_stage_acc(acc_tmem, smem, live, epi_layout: gl.constexpr, EPI_D: gl.constexpr):
    # An fp32 [ROWS, HEAD_DIM] accumulator from TMEM into the 16-bit tile `smem` (which a TMA store then writes), in
    # EPI_D-column chunks (a whole tile at D 128 is 128 registers a thread); zeros where no step ran (`live` false:
    # the accumulator was never written).
    ROWS: gl.constexpr = acc_tmem.shape[0]
    HEAD_DIM: gl.constexpr = acc_tmem.shape[1]
    for c in gl.static_range(HEAD_DIM // EPI_D):
        if live:
            acc = acc_tmem.slice(c * EPI_D, EPI_D).load(epi_layout)
        else:
            acc = gl.zeros([ROWS, EPI_D], gl.float32, epi_layout)
        smem.reshape([ROWS, HEAD_DIM]).slice(c * EPI_D, EPI_D, dim=1).store(acc.to(smem.dtype))


@gluon.jit
def _bwd_mma(q_smem, do_smem, k_smem, v_smem, s_tmem, dp_tmem, dk_tmem, dv_tmem, kv_ready, ready, empty, s_ready,
             p_ready, dp_ready, ds_ready, st_free, done, GROUP, Lq, Lk, window_left, window_right,
             BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
             MOD: gl.constexpr):
    dtype: gl.constexpr = q_smem.dtype
    p_tmem = _bwd_tmem16(s_tmem, dtype, TensorMemoryLayout([BLOCK_N, 2 * BLOCK_M], col_stride=1),
                          TMEM_REINTERPRET_PRIVATE)
    ds_tmem = _bwd_tmem16(dp_tmem, dtype, TensorMemoryLayout([BLOCK_N, 2 * BLOCK_M], col_stride=1),
                           TMEM_REINTERPRET_PRIVATE)
    k = k_smem.reshape([BLOCK_N, HEAD_DIM])
    v = v_smem.reshape([BLOCK_N, HEAD_DIM])
    n0 = gl.program_id(0) * BLOCK_N
    m_lo, steps = _bwd_rows(n0, Lq, Lk, window_left, window_right, BLOCK_M, BLOCK_N, MOD)
    n = GROUP * steps
    mbarrier.wait(kv_ready.index(0), 0)
    if n > 0:
        _bwd_issue_scores(k, v, q_smem, do_smem, s_tmem, dp_tmem, s_ready, dp_ready, 0, ready, st_free, BLOCK_M,
                          HEAD_DIM, STAGES)
    for it in range(n):
        slot, _ = ring_slot(it, STAGES)
        buf, _ = ring_slot(it, 2)
        if it + 1 < n:   # the next step's S^T / dP^T run on the tensor core while the compute warps work on this one
            _bwd_issue_scores(k, v, q_smem, do_smem, s_tmem, dp_tmem, s_ready, dp_ready, it + 1, ready, st_free,
                              BLOCK_M, HEAD_DIM, STAGES)
        consumer_wait(p_ready, it, 2)
        _tmem_fence_after(it)
        tcgen05_mma(p_tmem.index(buf).slice(0, BLOCK_M), do_smem.index(slot).reshape([BLOCK_M, HEAD_DIM]), dv_tmem,
                    use_acc=it > 0)
        consumer_wait(ds_ready, it, 2)
        _tmem_fence_after(it)
        tcgen05_mma(ds_tmem.index(buf).slice(0, BLOCK_M), q_smem.index(slot).reshape([BLOCK_M, HEAD_DIM]), dk_tmem,
                    use_acc=it > 0)
        # commits, not the dK MMA's own mbarriers: they track every MMA issued before them (the dV MMA reads P^T
        # and dO too), so their arrival frees the Q / dO slot and the S^T / dP^T buffer
        tcgen05_commit(empty.index(slot))
        tcgen05_commit(st_free.index(buf))
    tcgen05_commit(done.index(0))   # dK and dV final (with no step: nothing issued, the epilogue writes zeros)


@gluon.jit
def _bwd_compute(dk_desc, dv_desc, LSE, Delta, alibi_ptr, k_smem, v_smem, s_tmem, dp_tmem, dk_tmem, dv_tmem,
                 s_ready, p_ready, dp_ready, ds_ready, done, sm_scale, softcap, window_left, window_right, Hq, Hkv,
                 GROUP, Lq, Lk, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                 MOD: gl.constexpr, num_warps: gl.constexpr):
    dtype: gl.constexpr = dk_desc.dtype
    # tcgen05.ld 32x32b: thread r owns key r, a query row per register. S^T and dP^T are read in CHUNK-column
    # slices, so a thread holds one slice of them and of the rows' LSE / delta at a time, and across the step only
    # pg = P * mod'(S) * scale (dS^T = pg * (dP^T - delta)): a whole 64-column tile of each spilled at D 128.
    CHUNK: gl.constexpr = 32
    st_layout: gl.constexpr = tmem_reg_layout(gl.float32, [BLOCK_N, CHUNK],
                                              TensorMemoryLayout([BLOCK_N, CHUNK], col_stride=1), num_warps)
    p_tmem = _bwd_tmem16(s_tmem, dtype, TensorMemoryLayout([BLOCK_N, 2 * BLOCK_M], col_stride=1),
                          TMEM_REINTERPRET_PRIVATE)
    ds_tmem = _bwd_tmem16(dp_tmem, dtype, TensorMemoryLayout([BLOCK_N, 2 * BLOCK_M], col_stride=1),
                           TMEM_REINTERPRET_PRIVATE)
    b = gl.program_id(1) // Hkv
    hk = gl.program_id(1) % Hkv
    n0 = gl.program_id(0) * BLOCK_N
    kv_idx = gl.expand_dims(n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, st_layout)), 1)
    offs_c = gl.arange(0, CHUNK, layout=gl.SliceLayout(0, st_layout))
    m_lo, steps = _bwd_rows(n0, Lq, Lk, window_left, window_right, BLOCK_M, BLOCK_N, MOD)
    for it in range(GROUP * steps):
        g = it // steps
        h = hk * GROUP + g
        m0 = m_lo + (it - g * steps) * BLOCK_M
        row_base = (b * Hq + h).to(gl.int64) * Lq
        buf = consumer_wait(s_ready, it, 2)
        _tmem_fence_after(it)
        pgs = ()
        for c in gl.static_range(BLOCK_M // CHUNK):
            offs_m = m0 + c * CHUNK + offs_c
            q_idx = gl.expand_dims(offs_m, 0)
            lse = gl.expand_dims(gl.load(LSE + row_base + offs_m, mask=offs_m < Lq, other=0.0), 0)
            # P^T's 16-bit chunk c lands in S^T's 32-bit columns [c * CHUNK / 2, ...): behind the chunks still unread
            s_t = s_tmem.index(buf).slice(c * CHUNK, CHUNK).load(st_layout) * sm_scale
            p_t = _bwd_p(s_t, lse, b, h, q_idx, kv_idx, Lq, Lk, window_left, window_right, softcap,
                         alibi_ptr, MOD)
            # P and dS rounded to the input dtype for the tensor core, as the forward rounds P
            p_tmem.index(buf).slice(c * CHUNK, CHUNK).store(p_t.to(dtype))
            pgs = pgs + (p_t * score_mod_grad(s_t, b, h, q_idx, kv_idx, Lq, Lk, softcap,
                                              alibi_ptr, MOD) * sm_scale, )
        _tmem_fence_before(it)
        mbarrier.arrive(p_ready.index(buf), count=1)
        consumer_wait(dp_ready, it, 2)
        _tmem_fence_after(it)
        for c in gl.static_range(BLOCK_M // CHUNK):
            offs_m = m0 + c * CHUNK + offs_c
            delta = gl.expand_dims(gl.load(Delta + row_base + offs_m, mask=offs_m < Lq, other=0.0), 0)
            dp_t = dp_tmem.index(buf).slice(c * CHUNK, CHUNK).load(st_layout)
            ds_tmem.index(buf).slice(c * CHUNK, CHUNK).store((pgs[c] * (dp_t - delta)).to(dtype))
        _tmem_fence_before(it)
        mbarrier.arrive(ds_ready.index(buf), count=1)

    # epilogue: every MMA has completed (done), so K and V are read for the last time; they stage dK and dV
    mbarrier.wait(done.index(0), 0)
    _tmem_fence_after(steps)
    # in EPI_D-column chunks (a whole [128, D] fp32 tile is D registers a thread beside the loop's)
    EPI_D: gl.constexpr = 64 if HEAD_DIM > 64 else HEAD_DIM
    epi_layout: gl.constexpr = tmem_reg_layout(gl.float32, [BLOCK_N, EPI_D],
                                               TensorMemoryLayout([BLOCK_N, EPI_D], col_stride=1), num_warps)
    _bwd_stage_acc(dk_tmem, k_smem, GROUP * steps > 0, epi_layout, EPI_D)
    _bwd_stage_acc(dv_tmem, v_smem, GROUP * steps > 0, epi_layout, EPI_D)
    fence_async_shared()
    _tma_store(dk_desc, [b, hk, n0, 0], k_smem)   # rows >= Lk are clipped by TMA
    _tma_store(dv_desc, [b, hk, n0, 0], v_smem)
    tma.store_wait(0)


BWD_SHAPE_ARGS = ("window_left", "window_right", "Hq", "Hkv", "GROUP", "Lq", "Lk")


@gluon.jit(do_not_specialize=BWD_SHAPE_ARGS)
def attention_bwd_dkdv_kernel(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, LSE, Delta, alibi_ptr, sm_scale,
                              softcap, window_left, window_right, Hq, Hkv, GROUP, Lq, Lk, STAGES: gl.constexpr,
                              MOD: gl.constexpr, WORKER_REGS: gl.constexpr, num_warps: gl.constexpr):
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[3]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[2]
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [STAGES] + q_desc.block_type.shape, q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES] + do_desc.block_type.shape, do_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, v_desc.block_type.shape, v_desc.layout)
    bar_layout: gl.constexpr = mbarrier.MBarrierLayout()
    kv_ready = gl.allocate_shared_memory(gl.int64, [1, 1], bar_layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    s_ready = gl.allocate_shared_memory(gl.int64, [2, 1], bar_layout)
    p_ready = gl.allocate_shared_memory(gl.int64, [2, 1], bar_layout)
    dp_ready = gl.allocate_shared_memory(gl.int64, [2, 1], bar_layout)
    ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], bar_layout)
    st_free = gl.allocate_shared_memory(gl.int64, [2, 1], bar_layout)
    done = gl.allocate_shared_memory(gl.int64, [1, 1], bar_layout)
    ring_init(kv_ready, 1, 1)
    ring_init(ready, STAGES, 1)
    ring_init(empty, STAGES, 1)
    ring_init(s_ready, 2, 1)
    ring_init(p_ready, 2, 1)
    ring_init(dp_ready, 2, 1)
    ring_init(ds_ready, 2, 1)
    ring_init(st_free, 2, 1)
    ring_init(done, 1, 1)
    fence_async_shared()   # barrier inits visible to the async proxy before the first TMA

    acc_tmem_layout: gl.constexpr = TensorMemoryLayout([BLOCK_N, HEAD_DIM], col_stride=1)
    st_tmem_layout: gl.constexpr = TensorMemoryLayout([BLOCK_N, BLOCK_M], col_stride=1)
    dk_tmem = allocate_tensor_memory(gl.float32, [BLOCK_N, HEAD_DIM], acc_tmem_layout)
    dv_tmem = allocate_tensor_memory(gl.float32, [BLOCK_N, HEAD_DIM], acc_tmem_layout)
    s_tmem = allocate_tensor_memory(gl.float32, [2, BLOCK_N, BLOCK_M], st_tmem_layout)
    dp_tmem = allocate_tensor_memory(gl.float32, [2, BLOCK_N, BLOCK_M], st_tmem_layout)

    gl.warp_specialize([
        (_bwd_compute, (dk_desc, dv_desc, LSE, Delta, alibi_ptr, k_smem, v_smem, s_tmem, dp_tmem, dk_tmem, dv_tmem,
                        s_ready, p_ready, dp_ready, ds_ready, done, sm_scale, softcap, window_left, window_right,
                        Hq, Hkv, GROUP, Lq, Lk, BLOCK_M, BLOCK_N, HEAD_DIM, MOD, num_warps)),
        (_bwd_mma, (q_smem, do_smem, k_smem, v_smem, s_tmem, dp_tmem, dk_tmem, dv_tmem, kv_ready, ready, empty,
                    s_ready, p_ready, dp_ready, ds_ready, st_free, done, GROUP, Lq, Lk, window_left, window_right,
                    BLOCK_M, BLOCK_N, HEAD_DIM, STAGES, MOD)),
        (_bwd_load, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_ready, ready, empty, Hkv,
                     GROUP, Lq, Lk, window_left, window_right, BLOCK_M, BLOCK_N, STAGES, MOD)),
    ], [1, 1], [WORKER_REGS, WORKER_REGS])
    # No ring_invalidate: tcgen05 arrivals (empty, st_free, s_ready, dp_ready) may still be in flight when the
    # partitions return (gen/build/hw_rules.py gates it); the kernel ends here, which releases them.


# dQ of the backward, FA4-style: the forward's shape turned to gradients. One CTA per (DQ_BLOCK_M = 128 query rows,
# one TMEM lane each; batch * query head), not persistent; causal CTAs are launched longest first (the last query
# block sees the most keys). Per key block j the CTA's rows see (kv_block_range):
#   loader  (1 warp)   Q and dO once (q_ready), then K_j and V_j through a STAGES-deep ring (ready/empty).
#   MMA     (1 warp)   S_j = Q K_j^T and dP_j = dO V_j^T into TMEM buffer j % 2 (s_ready, dp_ready), issued one step
#                      ahead; then dQ += dS_j K_j with dS_j read from TMEM as the A operand (ds_ready); commits after
#                      it free the K/V slot (empty) and the TMEM buffer (st_free); after the last block a commit
#                      (done) hands dQ to the epilogue.
#   compute (4 warps)  thread r owns query row r (its LSE and delta are one register each): S_j -> P_j -> dS_j in
#                      32-column slices (keys past Lk get P = 0), dS_j written as 16-bit into dP_j's columns; then
#                      the epilogue: dQ from TMEM (64 columns at a time) through Q's shared memory and a TMA store
#                      (clipped at Lq). Rows that see no key get zeros without a TMEM read.
# Tensor memory: dQ D columns, S and dP 2 x DQ_BLOCK_N each: D + 256 (384 at D 128).


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
def _dq_steps(Lq, Lk, window_left, window_right, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, MOD: gl.constexpr):
    # the CTA's first query row, its first key and the key blocks its rows see
    m0 = _dq_block(Lq, BLOCK_M, MOD)
    lo, _full_lo, _full_hi, hi = kv_block_range(m0, Lq, Lk, window_left, window_right, BLOCK_M, BLOCK_N, MOD)
    return m0, lo, (hi - lo + BLOCK_N - 1) // BLOCK_N


@gluon.jit
def _dq_load(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, q_ready, ready, empty, Hq, GROUP, Lq,
             Lk, window_left, window_right, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
             MOD: gl.constexpr):
    b = gl.program_id(1) // Hq
    h = gl.program_id(1) % Hq
    m0, lo, n = _dq_steps(Lq, Lk, window_left, window_right, BLOCK_M, BLOCK_N, MOD)
    mbarrier.expect(q_ready.index(0), q_desc.block_type.nbytes + do_desc.block_type.nbytes)
    _tma_load(q_desc, [b, h, m0, 0], q_ready.index(0), q_smem)
    _tma_load(do_desc, [b, h, m0, 0], q_ready.index(0), do_smem)
    for it in range(n):
        slot = producer_acquire(empty, it, STAGES)
        mbarrier.expect(ready.index(slot), k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        _tma_load(k_desc, [b, h // GROUP, lo + it * BLOCK_N, 0], ready.index(slot), k_smem.index(slot))
        _tma_load(v_desc, [b, h // GROUP, lo + it * BLOCK_N, 0], ready.index(slot), v_smem.index(slot))


@gluon.jit
def _dq_mma(q_smem, do_smem, k_smem, v_smem, s_tmem, dp_tmem, dq_tmem, q_ready, ready, empty, s_ready, dp_ready,
            ds_ready, st_free, done, Lq, Lk, window_left, window_right, BLOCK_M: gl.constexpr,
            BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, MOD: gl.constexpr):
    dtype: gl.constexpr = q_smem.dtype
    ds_tmem = _bwd_tmem16(dp_tmem, dtype, TensorMemoryLayout([BLOCK_M, 2 * BLOCK_N], col_stride=1),
                           TMEM_REINTERPRET_PRIVATE)
    q = q_smem.reshape([BLOCK_M, HEAD_DIM])
    do = do_smem.reshape([BLOCK_M, HEAD_DIM])
    m0, lo, n = _dq_steps(Lq, Lk, window_left, window_right, BLOCK_M, BLOCK_N, MOD)
    mbarrier.wait(q_ready.index(0), 0)
    if n > 0:
        _bwd_issue_scores(q, do, k_smem, v_smem, s_tmem, dp_tmem, s_ready, dp_ready, 0, ready, st_free, BLOCK_N,
                          HEAD_DIM, STAGES)
    for it in range(n):
        slot, _ = ring_slot(it, STAGES)
        buf, _ = ring_slot(it, 2)
        if it + 1 < n:   # the next block's S / dP run on the tensor core while the compute warps work on this one
            _bwd_issue_scores(q, do, k_smem, v_smem, s_tmem, dp_tmem, s_ready, dp_ready, it + 1, ready, st_free,
                              BLOCK_N, HEAD_DIM, STAGES)
        consumer_wait(ds_ready, it, 2)
        _tmem_fence_after(it)
        tcgen05_mma(ds_tmem.index(buf).slice(0, BLOCK_N), k_smem.index(slot).reshape([BLOCK_N, HEAD_DIM]), dq_tmem,
                    use_acc=it > 0)
        tcgen05_commit(empty.index(slot))    # every MMA reading K_it / V_it issued (commits track them all)
        tcgen05_commit(st_free.index(buf))   # and every MMA reading S / dP buffer it % 2
    tcgen05_commit(done.index(0))


@gluon.jit
def _dq_compute(dq_desc, LSE, Delta, alibi_ptr, q_smem, s_tmem, dp_tmem, dq_tmem, s_ready, dp_ready, ds_ready, done,
                sm_scale, softcap, window_left, window_right, Hq, Lq, Lk, BLOCK_M: gl.constexpr,
                BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, MOD: gl.constexpr, num_warps: gl.constexpr):
    dtype: gl.constexpr = dq_desc.dtype
    CHUNK: gl.constexpr = 32
    s_layout: gl.constexpr = tmem_reg_layout(gl.float32, [BLOCK_M, CHUNK],
                                             TensorMemoryLayout([BLOCK_M, CHUNK], col_stride=1), num_warps)
    ds_tmem = _bwd_tmem16(dp_tmem, dtype, TensorMemoryLayout([BLOCK_M, 2 * BLOCK_N], col_stride=1),
                           TMEM_REINTERPRET_PRIVATE)
    b = gl.program_id(1) // Hq
    h = gl.program_id(1) % Hq
    m0, lo, n = _dq_steps(Lq, Lk, window_left, window_right, BLOCK_M, BLOCK_N, MOD)
    offs_m = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    q_idx = gl.expand_dims(offs_m, 1)
    row_base = (b * Hq + h).to(gl.int64) * Lq
    lse = gl.expand_dims(gl.load(LSE + row_base + offs_m, mask=offs_m < Lq, other=0.0), 1)
    delta = gl.expand_dims(gl.load(Delta + row_base + offs_m, mask=offs_m < Lq, other=0.0), 1)
    offs_c = gl.arange(0, CHUNK, layout=gl.SliceLayout(0, s_layout))
    for it in range(n):
        buf = consumer_wait(s_ready, it, 2)
        _tmem_fence_after(it)
        pgs = ()
        for c in gl.static_range(BLOCK_N // CHUNK):
            kv_idx = gl.expand_dims(lo + it * BLOCK_N + c * CHUNK + offs_c, 0)
            s = s_tmem.index(buf).slice(c * CHUNK, CHUNK).load(s_layout) * sm_scale
            # keys past Lk (TMA zero-filled) get P = 0: a score mod must not see them
            p = gl.where(kv_idx < Lk, _bwd_p(s, lse, b, h, q_idx, kv_idx, Lq, Lk, window_left, window_right, softcap,
                                             alibi_ptr, MOD), 0.0)
            pgs = pgs + (p * score_mod_grad(s, b, h, q_idx, kv_idx, Lq, Lk, softcap,
                                            alibi_ptr, MOD) * sm_scale, )
        consumer_wait(dp_ready, it, 2)
        _tmem_fence_after(it)
        for c in gl.static_range(BLOCK_N // CHUNK):
            dp = dp_tmem.index(buf).slice(c * CHUNK, CHUNK).load(s_layout)
            # dS rounded to the input dtype for the tensor core; its 16-bit chunk c lands in dP's 32-bit columns
            # [c * CHUNK / 2, ...), behind the chunks still unread
            ds_tmem.index(buf).slice(c * CHUNK, CHUNK).store((pgs[c] * (dp - delta)).to(dtype))
        _tmem_fence_before(it)
        mbarrier.arrive(ds_ready.index(buf), count=1)

    # epilogue: every MMA has completed (done), so Q is read for the last time; it stages dQ
    mbarrier.wait(done.index(0), 0)
    _tmem_fence_after(n)
    EPI_D: gl.constexpr = 64 if HEAD_DIM > 64 else HEAD_DIM
    epi_layout: gl.constexpr = tmem_reg_layout(gl.float32, [BLOCK_M, EPI_D],
                                               TensorMemoryLayout([BLOCK_M, EPI_D], col_stride=1), num_warps)
    _bwd_stage_acc(dq_tmem, q_smem, n > 0, epi_layout, EPI_D)
    fence_async_shared()
    _tma_store(dq_desc, [b, h, m0, 0], q_smem)   # rows >= Lq are clipped by TMA
    tma.store_wait(0)


DQ_SHAPE_ARGS = ("window_left", "window_right", "Hq", "GROUP", "Lq", "Lk")


@gluon.jit(do_not_specialize=DQ_SHAPE_ARGS)
def attention_bwd_dq_kernel(q_desc, k_desc, v_desc, do_desc, dq_desc, LSE, Delta, alibi_ptr, sm_scale, softcap,
                            window_left, window_right, Hq, GROUP, Lq, Lk, STAGES: gl.constexpr, MOD: gl.constexpr,
                            WORKER_REGS: gl.constexpr, num_warps: gl.constexpr):
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[3]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[2]
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, q_desc.block_type.shape, q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, do_desc.block_type.shape, do_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    bar_layout: gl.constexpr = mbarrier.MBarrierLayout()
    q_ready = gl.allocate_shared_memory(gl.int64, [1, 1], bar_layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    s_ready = gl.allocate_shared_memory(gl.int64, [2, 1], bar_layout)
    dp_ready = gl.allocate_shared_memory(gl.int64, [2, 1], bar_layout)
    ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], bar_layout)
    st_free = gl.allocate_shared_memory(gl.int64, [2, 1], bar_layout)
    done = gl.allocate_shared_memory(gl.int64, [1, 1], bar_layout)
    ring_init(q_ready, 1, 1)
    ring_init(ready, STAGES, 1)
    ring_init(empty, STAGES, 1)
    ring_init(s_ready, 2, 1)
    ring_init(dp_ready, 2, 1)
    ring_init(ds_ready, 2, 1)
    ring_init(st_free, 2, 1)
    ring_init(done, 1, 1)
    fence_async_shared()   # barrier inits visible to the async proxy before the first TMA

    dq_tmem = allocate_tensor_memory(gl.float32, [BLOCK_M, HEAD_DIM],
                                     TensorMemoryLayout([BLOCK_M, HEAD_DIM], col_stride=1))
    s_layout: gl.constexpr = TensorMemoryLayout([BLOCK_M, BLOCK_N], col_stride=1)
    s_tmem = allocate_tensor_memory(gl.float32, [2, BLOCK_M, BLOCK_N], s_layout)
    dp_tmem = allocate_tensor_memory(gl.float32, [2, BLOCK_M, BLOCK_N], s_layout)

    gl.warp_specialize([
        (_dq_compute, (dq_desc, LSE, Delta, alibi_ptr, q_smem, s_tmem, dp_tmem, dq_tmem, s_ready, dp_ready, ds_ready,
                       done, sm_scale, softcap, window_left, window_right, Hq, Lq, Lk, BLOCK_M, BLOCK_N, HEAD_DIM,
                       MOD, num_warps)),
        (_dq_mma, (q_smem, do_smem, k_smem, v_smem, s_tmem, dp_tmem, dq_tmem, q_ready, ready, empty, s_ready, dp_ready,
                   ds_ready, st_free, done, Lq, Lk, window_left, window_right, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES,
                   MOD)),
        (_dq_load, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, q_ready, ready, empty, Hq, GROUP,
                    Lq, Lk, window_left, window_right, BLOCK_M, BLOCK_N, STAGES, MOD)),
    ], [1, 1], [WORKER_REGS, WORKER_REGS])
    # No ring_invalidate, as in dK/dV: tcgen05 arrivals may still be in flight when the partitions return.


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



BWD_BLOCK_N = 128   # dK/dV: keys a CTA, one TMEM lane each, the M of every tcgen05 MMA
BWD_BLOCK_M = 64    # dK/dV: query rows a step, the N of the S^T / dP^T MMAs, the K of the dV / dK ones
DQ_BLOCK_M = 128    # dQ: query rows a CTA, one TMEM lane each
DQ_BLOCK_N = 64     # dQ: keys a step, the N of the S / dP MMAs, the K of the dQ one


def bwd_tmem_cols(head_dim: int) -> dict:
    """TMEM columns of each backward kernel: dK/dV holds two accumulators and two S^T and dP^T buffers, dQ one
    accumulator and two S and dP buffers."""
    return {"dkdv": 2 * head_dim + 4 * BWD_BLOCK_M, "dq": head_dim + 4 * DQ_BLOCK_N}


def _ring_stages(fixed: int, slot: int) -> int:
    # the deepest ring of 4, 3, 2 slots of `slot` bytes beside `fixed` bytes (512 B kept for compiler scratch)
    for stages in (4, 3, 2):
        if fixed + stages * slot + 512 <= SMEM_LIMIT:
            return stages
    return 2


def _bwd_constexprs(kernel: str, mod: str, head_dim: int) -> dict:
    # WORKER_REGS: the load and MMA warps' registers. At 40 or 48, triton 3.7.1's ptxas keeps the thread index across
    # the warp_specialize split of dK/dV at D 128 (one prologue spill, a reload per partition); 32 and 56-80 spill
    # nothing on 3.6-3.9 (every mod, both head dims), and 56 leaves the 1-warp partitions room.
    if kernel == "dkdv":   # K and V once, Q and dO a slot
        stages = _ring_stages(2 * BWD_BLOCK_N * head_dim * 2, 2 * BWD_BLOCK_M * head_dim * 2)
    else:                  # Q and dO once, K and V a slot
        stages = _ring_stages(2 * DQ_BLOCK_M * head_dim * 2, 2 * DQ_BLOCK_N * head_dim * 2)
    return {"STAGES": stages, "MOD": MOD_NAMES.index(mod), "WORKER_REGS": 56,
            "num_warps": 4}


def _bwd_layouts(kernel: str, dtype: str, head_dim: int) -> dict:
    """The descriptor blocks and layouts of a backward kernel: "q" (Q, dO and dQ) and "kv" (K, V, dK and dV)."""
    ty = getattr(gl, dtype)
    rows = {"dkdv": (BWD_BLOCK_M, BWD_BLOCK_N), "dq": (DQ_BLOCK_M, DQ_BLOCK_N)}[kernel]
    blocks = {"q": [1, 1, rows[0], head_dim], "kv": [1, 1, rows[1], head_dim]}
    return {k: (b, gl.NVMMASharedLayout.get_default_for(b, ty)) for k, b in blocks.items()}


_BWD_KERNELS = {"dkdv": (lambda: attention_bwd_dkdv_kernel, ("q", "kv", "kv", "q", "kv", "kv"), BWD_SHAPE_ARGS),
                "dq": (lambda: attention_bwd_dq_kernel, ("q", "kv", "kv", "q", "q"), DQ_SHAPE_ARGS)}
_BWD_DESCS = {"dkdv": ("q_desc", "k_desc", "v_desc", "do_desc", "dk_desc", "dv_desc"),
              "dq": ("q_desc", "k_desc", "v_desc", "do_desc", "dq_desc")}


def backward_jobs(case: dict) -> list:
    """The dK/dV and dQ kernels and the delta pre-pass at one case: compiled and gated with the forward
    (compile_jobs)."""
    dtype, head_dim = case["dtype"], case["head_dim"]
    jobs = []
    for kernel, (fn, kinds, shape_args) in _BWD_KERNELS.items():
        assert bwd_tmem_cols(head_dim)[kernel] <= TMEM_COLS, f"head_dim {head_dim}: {kernel} exceeds 512 TMEM columns"
        lay = _bwd_layouts(kernel, dtype, head_dim)
        ty = _TRITON_TY[dtype]
        signature = {name: f"tensordesc<{ty}{lay[kind][0]},{lay[kind][1]!r}>"
                     for name, kind in zip(_BWD_DESCS[kernel], kinds)}
        signature.update({"LSE": "*fp32", "Delta": "*fp32", "alibi_ptr": "*fp32", "sm_scale": "fp32",
                          "softcap": "fp32"})
        signature.update({name: "i32" for name in shape_args})
        constexprs = _bwd_constexprs(kernel, case["mod"], head_dim)
        signature.update({k: "constexpr" for k in constexprs})
        jobs.append({"name": f"attention_bwd_{kernel}_kernel", "fn": fn(), "signature": signature,
                     "constexprs": constexprs, "options": {"num_warps": 4}})
    return jobs + [_delta_job(case)]


_BWD_CASES = {}  # (kernel, dtype, head dim, mod) -> (layouts, Launcher): built on first use


def _launch_bwd(kernel: str, grid, tensors, tail, mod: str) -> None:
    """A backward kernel's launch: a TMA descriptor over each of `tensors` (copied once where TMA cannot address a
    view), then `tail` (the row statistics, the slopes and the scalars)."""
    q = tensors[0]
    D = q.shape[-1]
    key = (kernel, q.dtype, D, mod)
    found = _BWD_CASES.get(key)
    if found is None:
        fn, _, _ = _BWD_KERNELS[kernel]
        found = _BWD_CASES[key] = (_bwd_layouts(kernel, str(q.dtype).replace("torch.", ""), D),
                                   Launcher(fn(), _bwd_constexprs(kernel, mod, D)))
    lay, launcher = found
    kinds = _BWD_KERNELS[kernel][1]
    boxes = [(t, tuple(t.shape), t.stride(), kind) for t, kind in zip(tensors, kinds)]
    launcher(grid, q.device.index or 0,
             tuple(TmaDescriptor(t, shape, strides) for t, shape, strides, _ in boxes) + tail,
             lambda: tuple(TensorDescriptor(t, list(shape), list(strides), *lay[kind])
                           for t, shape, strides, kind in boxes) + tail)


def _bwd_inputs(q, k, v, dout, lse, delta, *outs):
    B, Hq, Lq, D = q.shape
    assert Hq % k.shape[1] == 0 and D in (64, 128) and str(q.dtype).replace("torch.", "") in _TRITON_TY
    assert all(t.is_contiguous() for t in outs) and lse.is_contiguous() and delta.is_contiguous()
    return tuple(t if tma_compatible(t) else t.contiguous() for t in (q, k, v, dout))


def backward_dkdv(q, k, v, dout, lse, delta, dk, dv, scale: float, mod: str, window_left: int, window_right: int,
                  softcap: float, alibi_slopes) -> None:
    """dK and dV into `dk`, `dv` ([B, Hkv, Lk, D], contiguous, q's dtype) from the forward's LSE and the pre-pass's
    delta ([B, Hq, Lq] fp32, contiguous); window extents already clamped (the portable backward calls this). A view
    TMA cannot address is copied, once."""
    q, k, v, dout = _bwd_inputs(q, k, v, dout, lse, delta, dk, dv)
    B, Hq, Lq, _ = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    scalars = (float(scale), float(softcap), int(window_left), int(window_right), Hq, Hkv, Hq // Hkv, Lq, Lk)
    _launch_bwd("dkdv", (-(-Lk // BWD_BLOCK_N), B * Hkv), (q, k, v, dout, dk, dv),
                (lse, delta, alibi_slopes) + scalars, mod)


def backward_dq(q, k, v, dout, lse, delta, dq, scale: float, mod: str, window_left: int, window_right: int,
                softcap: float, alibi_slopes) -> None:
    """dQ into `dq` ([B, Hq, Lq, D], contiguous, q's dtype) from the forward's LSE and the pre-pass's delta ([B, Hq,
    Lq] fp32, contiguous); window extents already clamped (the portable backward calls this). A view TMA cannot
    address is copied, once."""
    q, k, v, dout = _bwd_inputs(q, k, v, dout, lse, delta, dq)
    B, Hq, Lq, _ = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    scalars = (float(scale), float(softcap), int(window_left), int(window_right), Hq, Hq // Hkv, Lq, Lk)
    _launch_bwd("dq", (-(-Lq // DQ_BLOCK_M), B * Hq), (q, k, v, dout, dq), (lse, delta, alibi_slopes) + scalars, mod)
