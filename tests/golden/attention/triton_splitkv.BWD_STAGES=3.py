import torch
import triton
import triton.language as tl

if __package__:   # generated/<family>/: the package's own copy of the run time
    from .._runtime.launch import COMPILE_OPTIONS, shared_launcher
else:             # compiled alone by gen: gen's run time (the same files)
    from gen.runtime.launch import COMPILE_OPTIONS, shared_launcher


KERNEL_MODE = "triton"
CONFIG = {'BLOCK_M': 64, 'BLOCK_N': 64, 'num_warps': 4, 'num_stages': 3, 'SPLIT_KV': True, 'BWD_STAGES': 3}
MOD_NAMES = ['none', 'causal', 'window', 'softcap', 'alibi', 'decay']

_TORCH_TO_TRITON = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
_NAME_TO_TRITON = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}

@triton.jit
def _sm_exp(x):
    return tl.exp(x)


@triton.jit
def _sm_log(x):
    return tl.log(x)


@triton.jit
def _sm_tanh(x):
    # tanh(x) = 1 - 2 / (exp(2x) + 1): exp2 overflow to inf gives 1, underflow to 0 gives -1; never NaN.
    return 1.0 - 2.0 / (tl.exp2(x * 2.8853900817779268) + 1.0)


@triton.jit
def _sm_abs(x):
    return tl.abs(x)


@triton.jit
def _sm_sqrt(x):
    return tl.sqrt(x)


@triton.jit
def _sm_minimum(x, y):
    return tl.minimum(x, y)


@triton.jit
def _sm_maximum(x, y):
    return tl.maximum(x, y)


@triton.jit
def _sm_where(c, x, y):
    return tl.where(c, x, y)



@triton.jit
def score_exp2_scale(sm_scale, MOD: tl.constexpr):
    # Multiplier from score_tile()'s units to log2 units (see score_math.jinja).
    mult = sm_scale * 1.4426950408889634
    if MOD == 3:  # softcap: tile already holds the modded, scaled score
        mult = sm_scale * 0.0 + 1.4426950408889634
    if MOD == 4:  # alibi: tile already holds the modded, scaled score
        mult = sm_scale * 0.0 + 1.4426950408889634
    if MOD == 5:  # decay: tile already holds the modded, scaled score
        mult = sm_scale * 0.0 + 1.4426950408889634
    return mult


@triton.jit
def apply_score_mod(score, b, h, q_idx, kv_idx, Lq, Lk, softcap, alibi_ptr, MOD: tl.constexpr):
    if MOD == 0:  # none: score_mod=none
        pass
    if MOD == 1:  # causal: score_mod=none
        pass
    if MOD == 2:  # window: score_mod=none
        pass
    if MOD == 3:  # softcap: score_mod=softcap
        score = softcap * _sm_tanh(score / softcap)
    if MOD == 4:  # alibi: score_mod=alibi
        slope = tl.load(alibi_ptr + h)
        score = score + slope * (kv_idx - (q_idx + (Lk - Lq))).to(tl.float32)
    if MOD == 5:  # decay: score_mod=custom
        score = (score - 0.05 * _sm_abs(q_idx - kv_idx)).to(tl.float32)
    return score


@triton.jit
def score_mod_grad(score, b, h, q_idx, kv_idx, Lq, Lk, softcap, alibi_ptr, MOD: tl.constexpr):
    # d apply_score_mod / d score at the scaled score (the mod IR's derivative); 1 for masks and ALiBi
    dscore = score * 0.0 + 1.0
    if MOD == 3:  # softcap: score_mod=softcap
        dscore = softcap * ((1 - _sm_tanh(score / softcap) * _sm_tanh(score / softcap)) * (1 / softcap))
    return dscore


@triton.jit
def q_row_range(n0, Lq, Lk, window_left, window_right, BLOCK_N: tl.constexpr, MOD: tl.constexpr):
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
    hi_row = tl.where(hi_row > lo_row, hi_row, lo_row)
    return lo_row, hi_row


@triton.jit
def apply_mask(score, q_idx, kv_idx, Lq, Lk, window_left, window_right, MOD: tl.constexpr):
    if MOD == 0:  # none: mask=none
        score = tl.where(kv_idx < Lk, score, -float("inf"))
    if MOD == 1:  # causal: mask=causal
        # bottom-right aligned causal: key j visible to row i iff j <= i + (Lk - Lq)
        keep = (kv_idx <= q_idx + (Lk - Lq)) & (kv_idx < Lk)
        score = tl.where(keep, score, -float("inf"))
    if MOD == 2:  # window: mask=window
        diag = q_idx + (Lk - Lq)
        keep = (kv_idx <= diag + window_right) & (kv_idx >= diag - window_left) & (kv_idx < Lk)
        score = tl.where(keep, score, -float("inf"))
    if MOD == 3:  # softcap: mask=none
        score = tl.where(kv_idx < Lk, score, -float("inf"))
    if MOD == 4:  # alibi: mask=causal
        # bottom-right aligned causal: key j visible to row i iff j <= i + (Lk - Lq)
        keep = (kv_idx <= q_idx + (Lk - Lq)) & (kv_idx < Lk)
        score = tl.where(keep, score, -float("inf"))
    if MOD == 5:  # decay: mask=none
        score = tl.where(kv_idx < Lk, score, -float("inf"))
    return score


@triton.jit
def apply_mods(score, b, h, q_idx, kv_idx, Lq, Lk, window_left, window_right, softcap, alibi_ptr,
               MOD: tl.constexpr):
    score = apply_score_mod(score, b, h, q_idx, kv_idx, Lq, Lk, softcap, alibi_ptr, MOD)
    return apply_mask(score, q_idx, kv_idx, Lq, Lk, window_left, window_right, MOD)


@triton.jit
def score_tile(qk, sm_scale, b, h, q_idx, kv_idx, Lq, Lk, window_left, window_right, softcap, alibi_ptr,
               MOD: tl.constexpr, MASKED: tl.constexpr):
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


@triton.jit
def min_hi(a, b):
    return tl.where(a < b, a, b)


@triton.jit
def max_lo(a, b):
    return tl.where(a > b, a, b)


@triton.jit
def kv_block_range(m0, Lq, Lk, window_left, window_right, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, MOD: tl.constexpr):
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
    hi = tl.where(hi_key > lo_key, hi_key, lo)  # nothing visible (fully masked block) -> hi = lo
    hi_up = ((hi + BLOCK_N - 1) // BLOCK_N) * BLOCK_N
    # first block boundary at/after flo_key, clamped into [lo, hi_up]
    full_lo = min_hi(max_lo(((flo_key + BLOCK_N - 1) // BLOCK_N) * BLOCK_N, lo), hi_up)
    # last block boundary at/before fhi_key, never below full_lo
    full_hi = max_lo((fhi_key // BLOCK_N) * BLOCK_N, full_lo)
    full_hi = min_hi(full_hi, hi_up)
    return lo, full_lo, full_hi, hi



@triton.jit
def _attn_kv_steps(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, start, end,
                   mult, sm_scale, b, h, q_idx, Lq, Lk, window_left, window_right, softcap, alibi_ptr,
                   HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MOD: tl.constexpr, MASKED: tl.constexpr,
                   DOT_F32: tl.constexpr):
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for n0 in range(start, end, BLOCK_N):
        kv_idx = n0 + offs_n
        k_ptrs = k_base + kv_idx[:, None] * stride_kn + offs_d[None, :]
        v_ptrs = v_base + kv_idx[:, None] * stride_vn + offs_d[None, :]
        if MASKED:
            # only masked steps can reach past Lk; zero padding keeps qk and P @ V finite
            k = tl.load(k_ptrs, mask=kv_idx[:, None] < Lk, other=0.0)
            v = tl.load(v_ptrs, mask=kv_idx[:, None] < Lk, other=0.0)
        else:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
        p_dtype: tl.constexpr = v.dtype
        if DOT_F32:
            # CPU interpreter: its tl.dot multiplies bf16 bit patterns as integers, so dot in fp32 instead
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        qk = tl.dot(q, tl.trans(k))
        s = score_tile(qk, sm_scale, b, h, q_idx, kv_idx[None, :], Lq, Lk, window_left, window_right, softcap,
                       alibi_ptr, MOD, MASKED)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # a row with nothing visible so far keeps m = -inf; subtract 0 instead so exp2 gives 0, not NaN
        m_sub = tl.where(m_new == -float("inf"), 0.0, m_new * mult)
        p = tl.exp2(s * mult - m_sub[:, None])
        alpha = tl.exp2(m_i * mult - m_sub)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(p_dtype).to(v.dtype), v)  # P rounded like on the GPU
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _attn_finish(acc, m_i, l_i, mult):
    """(O, LSE in natural log) of the online softmax's state; rows that saw no key (l = 0: fully masked, or an
    empty split) give O = 0, LSE = -inf."""
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    lse = tl.where(empty, -float("inf"), (m_i * mult + tl.log2(l_safe)) * 0.6931471805599453)
    return acc / l_safe[:, None], lse


def _clamped_window(Lq: int, Lk: int, window_left: int, window_right: int) -> tuple[int, int]:
    """Window extents clamped to [-(Lq + Lk), Lq + Lk], so the kernels' index arithmetic stays in int32."""
    span = Lq + Lk
    return max(-span, min(span, int(window_left))), max(-span, min(span, int(window_right)))


def _aligned(fn, names) -> dict:
    # the specialization an aligned launch gets (pointers and strides divisible by 16): without it the K/V loads are
    # neither vectorized nor pipelined through shared memory, and the tiles spill
    return {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in names}


@triton.jit(do_not_specialize=["window_left", "window_right", "Hkv", "Lq", "Lk", "GROUP", "split_keys"])
def _attn_split_kv(Q, K, V, O, LSE, alibi_ptr, sm_scale, softcap, window_left, window_right,
                   stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
                   stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om, stride_os,
                   stride_lb, stride_lh, stride_ls, Hkv, Lq, Lk, GROUP, split_keys,
                   HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MOD: tl.constexpr,
                   DOT_F32: tl.constexpr):
    # program (row tile, batch * KV head, split); row r of the packed tile is query position r // GROUP of query
    # head hk * GROUP + r % GROUP, so the tile's positions rise with its rows and K/V is read once per group
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    pid_s = tl.program_id(2)
    last_split = tl.num_programs(2) - 1
    b = pid_bh // Hkv
    hk = pid_bh % Hkv
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    qpos = rows // GROUP
    h = hk * GROUP + rows % GROUP
    row_ok = qpos < Lq
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + b.to(tl.int64) * stride_qb + h[:, None].to(tl.int64) * stride_qh + qpos[:, None] * stride_qm
                + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    if DOT_F32:
        q = q.to(tl.float32)
    k_base = K + b.to(tl.int64) * stride_kb + hk.to(tl.int64) * stride_kh
    v_base = V + b.to(tl.int64) * stride_vb + hk.to(tl.int64) * stride_vh

    mult = score_exp2_scale(sm_scale, MOD)
    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    # The tile's positions lie in [first, first + BLOCK_M): the range of that block of positions covers the tile's
    # keys (a superset where GROUP > 1: the extra blocks are visited masked). This split takes split_keys of them
    # (a multiple of BLOCK_N), the last split everything to the end.
    lo, full_lo, full_hi, hi = kv_block_range((pid_m * BLOCK_M) // GROUP, Lq, Lk, window_left, window_right,
                                              BLOCK_M, BLOCK_N, MOD)
    s_lo = lo + pid_s * split_keys
    s_hi = tl.where(pid_s == last_split, hi, min_hi(s_lo + split_keys, hi))
    h_col = h[:, None]
    q_idx = qpos[:, None]
    acc, m_i, l_i = _attn_kv_steps(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, max_lo(lo, s_lo),
                                   min_hi(full_lo, s_hi), mult, sm_scale, b, h_col, q_idx, Lq, Lk, window_left,
                                   window_right, softcap, alibi_ptr, HEAD_DIM, BLOCK_N, MOD, True, DOT_F32)
    acc, m_i, l_i = _attn_kv_steps(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, max_lo(full_lo, s_lo),
                                   min_hi(full_hi, s_hi), mult, sm_scale, b, h_col, q_idx, Lq, Lk, window_left,
                                   window_right, softcap, alibi_ptr, HEAD_DIM, BLOCK_N, MOD, False, DOT_F32)
    acc, m_i, l_i = _attn_kv_steps(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, max_lo(full_hi, s_lo),
                                   min_hi(hi, s_hi), mult, sm_scale, b, h_col, q_idx, Lq, Lk, window_left,
                                   window_right, softcap, alibi_ptr, HEAD_DIM, BLOCK_N, MOD, True, DOT_F32)

    out, lse = _attn_finish(acc, m_i, l_i, mult)   # an empty split's rows: LSE = -inf, no weight in the combine
    o_row = pid_s.to(tl.int64) * stride_os + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh + qpos * stride_om
    tl.store(O + o_row[:, None] + offs_d[None, :], out.to(O.dtype.element_ty), mask=row_ok[:, None])
    l_row = pid_s.to(tl.int64) * stride_ls + b.to(tl.int64) * stride_lb + h.to(tl.int64) * stride_lh + qpos
    tl.store(LSE + l_row, lse, mask=row_ok)


@triton.jit(do_not_specialize=["num_splits", "rows", "Hq", "Lq"])
def _combine_splits(O_part, LSE_part, O, LSE, num_splits, rows, Hq, Lq, stride_ob, stride_oh, stride_om,
                    stride_lb, stride_lh, HEAD_DIM: tl.constexpr, SPLITS: tl.constexpr):
    # one program per (batch, query head, position) row: O = sum_s w_s O_s / sum_s w_s, w_s = exp(lse_s - max lse);
    # a row no split saw (every lse_s = -inf) gets O = 0, LSE = -inf
    row = tl.program_id(0)
    offs_s = tl.arange(0, SPLITS)
    offs_d = tl.arange(0, HEAD_DIM)
    s_ok = offs_s < num_splits
    lse_s = tl.load(LSE_part + offs_s * rows + row, mask=s_ok, other=-float("inf"))
    m = tl.max(lse_s, 0)
    m_safe = tl.where(m == -float("inf"), 0.0, m)
    w = tl.exp(lse_s - m_safe)
    total = tl.sum(w, 0)
    o_s = tl.load(O_part + (offs_s[:, None] * rows + row).to(tl.int64) * HEAD_DIM + offs_d[None, :],
                  mask=s_ok[:, None], other=0.0)
    total_safe = tl.where(total == 0.0, 1.0, total)
    out = tl.sum(o_s * w[:, None], 0) / total_safe
    lse = tl.where(total == 0.0, -float("inf"), m_safe + tl.log(total_safe))
    bh = row // Lq
    qpos = row % Lq
    b = (bh // Hq).to(tl.int64)
    h = (bh % Hq).to(tl.int64)
    tl.store(O + b * stride_ob + h * stride_oh + qpos * stride_om + offs_d, out.to(O.dtype.element_ty))
    tl.store(LSE + b * stride_lb + h * stride_lh + qpos, lse)


# Split choice (H200: bench/split_kv.py, bench/results/split-kv-h200.json): as many splits as give each SM RESIDENT
# programs, no more (a partial extra round of programs costs a whole round). One a SM measured best: geomean 1.35x
# SDPA over the sweep's nine causal decode shapes, against 1.30x for two and 1.17x for four. At most MAX_SPLITS, and
# at least MIN_SPLIT_BLOCKS KV blocks a split.
RESIDENT = 1
MAX_SPLITS = 128
MIN_SPLIT_BLOCKS = 2
ROW_TILES = (16, 32, 64)   # packed-row tile sizes (tl.dot needs >= 16 rows), capped at CONFIG["BLOCK_M"]
MOD_MASKS = ['none', 'causal', 'window', 'none', 'causal', 'none']


def _row_tile(rows: int) -> int:
    for bm in ROW_TILES:
        if rows <= bm or bm >= CONFIG["BLOCK_M"]:
            return bm
    return ROW_TILES[-1]


def visible_span(mod: str, Lq: int, Lk: int, window_left: int, window_right: int) -> int:
    """The most keys one query position can see: a window bounds it, other masks do not."""
    if MOD_MASKS[MOD_NAMES.index(mod)] == "window":
        return max(1, min(Lk, window_left + window_right + 1))
    return Lk


def split_count(B: int, Hkv: int, row_tiles: int, span: int, num_sms: int) -> tuple[int, int]:
    """(splits, keys per split: a multiple of BLOCK_N) for a grid of B * Hkv * row_tiles programs whose tiles each
    see about `span` keys (one block more for the spread of a tile's own positions)."""
    bn = CONFIG["BLOCK_N"]
    blocks = -(-span // bn) + 1
    splits = max(1, min(RESIDENT * num_sms // (B * Hkv * row_tiles), blocks // MIN_SPLIT_BLOCKS, MAX_SPLITS))
    return _even_split(blocks, splits)


def _even_split(blocks: int, splits: int) -> tuple[int, int]:
    per = -(-blocks // splits)
    return -(-blocks // per), per * CONFIG["BLOCK_N"]


def _signature(dtype: str):
    t = _NAME_TO_TRITON[dtype]
    sig = {"Q": "*" + t, "K": "*" + t, "V": "*" + t, "O": "*fp32", "LSE": "*fp32", "alibi_ptr": "*fp32",
           "sm_scale": "fp32", "softcap": "fp32", "window_left": "i32", "window_right": "i32"}
    for name in ("stride_qb", "stride_qh", "stride_qm", "stride_kb", "stride_kh", "stride_kn",
                 "stride_vb", "stride_vh", "stride_vn", "stride_ob", "stride_oh", "stride_om", "stride_os",
                 "stride_lb", "stride_lh", "stride_ls", "Hkv", "Lq", "Lk", "GROUP", "split_keys"):
        sig[name] = "i32"
    for name in ("HEAD_DIM", "BLOCK_M", "BLOCK_N", "MOD", "DOT_F32"):
        sig[name] = "constexpr"
    return sig


def _combine_signature(dtype: str):
    sig = {"O_part": "*fp32", "LSE_part": "*fp32", "O": "*" + _NAME_TO_TRITON[dtype], "LSE": "*fp32"}
    for name in ("num_splits", "rows", "Hq", "Lq", "stride_ob", "stride_oh", "stride_om", "stride_lb", "stride_lh"):
        sig[name] = "i32"
    sig["HEAD_DIM"] = sig["SPLITS"] = "constexpr"
    return sig


def _options() -> dict:
    return {"num_warps": CONFIG["num_warps"], "num_stages": CONFIG.get("num_stages", 3)}


def compile_jobs(case: dict) -> list:
    """The split kernel at the decode tile (16 packed rows) and the largest one, and the combine kernel (the gates
    read all three; the split kernel's partial O is fp32)."""
    mod = MOD_NAMES.index(case["mod"])
    name = f"{case['dtype']}_d{case['head_dim']}_{case['mod']}"
    split_sig = _signature(case["dtype"])
    split_attrs = _aligned(_attn_split_kv, ["Q", "K", "V", "O", "LSE", "alibi_ptr"] +
                           [n for n in split_sig if n.startswith("stride")])
    jobs = [{"name": f"attn_split_kv_{name}_m{bm}", "fn": _attn_split_kv, "signature": split_sig, "attrs": split_attrs,
             "constexprs": {"HEAD_DIM": case["head_dim"], "BLOCK_M": bm, "BLOCK_N": CONFIG["BLOCK_N"], "MOD": mod,
                            "DOT_F32": False}, "options": _options()}
            for bm in sorted({ROW_TILES[0], _row_tile(1 << 30)})]
    combine_sig = _combine_signature(case["dtype"])
    jobs.append({"name": f"attn_combine_{name}", "fn": _combine_splits, "signature": combine_sig,
                 "attrs": _aligned(_combine_splits, ["O_part", "LSE_part", "O", "LSE", "rows", "stride_ob", "stride_oh",
                                                     "stride_om", "stride_lb", "stride_lh"]),
                 "constexprs": {"HEAD_DIM": case["head_dim"], "SPLITS": MAX_SPLITS}, "options": {"num_warps": 4}})
    return jobs


class Plan:
    """What a launch needs that depends only on the call's shape class: the launchers, grids, split and scalar
    arguments (the generated op builds it once per class and keeps it)."""
    __slots__ = ("split", "combine", "grid", "device", "head", "out_strides", "tail", "part_shape", "combine_grid",
                 "combine_tail")


def plan(q, k, v, out, lse, scale: float, mod: str, window_left: int, window_right: int, softcap: float,
         num_sms: int, splits: int = 0) -> Plan:
    """`splits` > 0 forces the split count (tests); 0 chooses it (split_count)."""
    B, Hq, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    assert Hq % Hkv == 0 and D in (16, 32, 64, 128, 256) and q.stride(-1) == k.stride(-1) == v.stride(-1) == 1
    assert out.stride(-1) == 1 and lse.stride(-1) == 1
    group = Hq // Hkv
    bm = _row_tile(Lq * group)
    row_tiles = -(-Lq * group // bm)
    if splits:
        n, split_keys = _even_split(-(-Lk // CONFIG["BLOCK_N"]) + 1, splits)
    else:
        n, split_keys = split_count(B, Hkv, row_tiles, visible_span(mod, Lq, Lk, window_left, window_right), num_sms)
    cpu = q.device.type == "cpu"   # CPU tensors only run under TRITON_INTERPRET=1
    p = Plan()
    # one Launcher per (dtype, tile, mod, partial or final O): it keys compiled kernels on alignment only
    p.split = shared_launcher(_attn_split_kv, (q.dtype, bm, D, mod, cpu, n > 1),
                              {"HEAD_DIM": D, "BLOCK_M": bm, "BLOCK_N": CONFIG["BLOCK_N"],
                               "MOD": MOD_NAMES.index(mod), "DOT_F32": cpu, **_options()})
    p.grid = (row_tiles, B * Hkv, n)
    p.device = q.device.index or 0
    wl, wr = _clamped_window(Lq, Lk, window_left, window_right)
    p.head = (float(scale), float(softcap), wl, wr, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3])
    p.tail = (Hkv, Lq, Lk, group, split_keys)
    p.part_shape = (n, B, Hq, Lq, D)   # partial O [splits, B, Hq, Lq, D] and LSE [splits, B, Hq, Lq], fp32
    if n == 1:
        p.combine = None
        p.out_strides = (*out.stride()[:3], 0, *lse.stride()[:2], 0)
        return p
    rows = B * Hq * Lq   # the contiguous partials' strides: (b, h, position, split) of O, then of the LSE
    p.out_strides = (Hq * Lq * D, Lq * D, D, rows * D, Hq * Lq, Lq, rows)
    sp = triton.next_power_of_2(n)
    p.combine = shared_launcher(_combine_splits, (q.dtype, "combine", D, sp, cpu),
                                {"HEAD_DIM": D, "SPLITS": sp, "num_warps": 4})
    p.combine_grid = (rows,)
    p.combine_tail = (n, rows, Hq, Lq, *out.stride()[:3], *lse.stride()[:2])
    return p


def run(p: Plan, q, k, v, out, lse, alibi_slopes) -> None:
    """Launch a plan on tensors of its shape class."""
    alibi = alibi_slopes if alibi_slopes is not None else lse  # dummy pointer when unused
    if p.combine is None:
        args = (q, k, v, out, lse, alibi) + p.head + p.out_strides + p.tail
        p.split(p.grid, p.device, args, lambda: args)
        return
    o_part = torch.empty(p.part_shape, device=q.device, dtype=torch.float32)
    l_part = torch.empty(p.part_shape[:4], device=q.device, dtype=torch.float32)
    args = (q, k, v, o_part, l_part, alibi) + p.head + p.out_strides + p.tail
    p.split(p.grid, p.device, args, lambda: args)
    cargs = (o_part, l_part, out, lse) + p.combine_tail
    p.combine(p.combine_grid, p.device, cargs, lambda: cargs)


def launch(q, k, v, out, lse, scale: float, mod: str, window_left: int, window_right: int, softcap: float,
           alibi_slopes, num_sms: int, splits: int = 0) -> None:
    run(plan(q, k, v, out, lse, scale, mod, window_left, window_right, softcap, num_sms, splits),
        q, k, v, out, lse, alibi_slopes)
