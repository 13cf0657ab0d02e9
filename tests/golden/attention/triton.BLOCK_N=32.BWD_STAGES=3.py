import torch
import triton
import triton.language as tl

if __package__:   # generated/<family>/: the package's own copy of the run time
    from .._runtime.launch import COMPILE_OPTIONS
else:             # compiled alone by gen: gen's run time (the same files)
    from gen.runtime.launch import COMPILE_OPTIONS


KERNEL_MODE = "triton"
CONFIG = {'BLOCK_M': 128, 'BLOCK_N': 32, 'num_warps': 8, 'num_stages': 3, 'SPLIT_KV': False, 'BWD_STAGES': 3}
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


@triton.jit
def _attn_fwd(Q, K, V, O, LSE, alibi_ptr, sm_scale, softcap, window_left, window_right,
              stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
              stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om,
              stride_lb, stride_lh, Hq, Lq, Lk, GROUP,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MOD: tl.constexpr,
              DOT_F32: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // Hq
    h = pid_bh % Hq
    hk = h // GROUP  # GQA: GROUP = Hq // Hkv query heads share one KV head
    m0 = pid_m * BLOCK_M

    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q_base = Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
    k_base = K + b.to(tl.int64) * stride_kb + hk.to(tl.int64) * stride_kh
    v_base = V + b.to(tl.int64) * stride_vb + hk.to(tl.int64) * stride_vh
    q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :], mask=offs_m[:, None] < Lq, other=0.0)
    if DOT_F32:
        q = q.to(tl.float32)
    q_idx = offs_m[:, None]

    mult = score_exp2_scale(sm_scale, MOD)
    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)

    lo, full_lo, full_hi, hi = kv_block_range(m0, Lq, Lk, window_left, window_right, BLOCK_M, BLOCK_N, MOD)
    acc, m_i, l_i = _attn_kv_steps(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, lo, full_lo,
                                   mult, sm_scale, b, h, q_idx, Lq, Lk, window_left, window_right, softcap,
                                   alibi_ptr, HEAD_DIM, BLOCK_N, MOD, True, DOT_F32)
    acc, m_i, l_i = _attn_kv_steps(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, full_lo, full_hi,
                                   mult, sm_scale, b, h, q_idx, Lq, Lk, window_left, window_right, softcap,
                                   alibi_ptr, HEAD_DIM, BLOCK_N, MOD, False, DOT_F32)
    acc, m_i, l_i = _attn_kv_steps(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, full_hi, hi,
                                   mult, sm_scale, b, h, q_idx, Lq, Lk, window_left, window_right, softcap,
                                   alibi_ptr, HEAD_DIM, BLOCK_N, MOD, True, DOT_F32)

    out, lse = _attn_finish(acc, m_i, l_i, mult)
    o_base = O + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
    tl.store(o_base + offs_m[:, None] * stride_om + offs_d[None, :], out.to(O.dtype.element_ty),
             mask=offs_m[:, None] < Lq)
    l_base = LSE + b.to(tl.int64) * stride_lb + h.to(tl.int64) * stride_lh
    tl.store(l_base + offs_m, lse, mask=offs_m < Lq)


def _signature(dtype: str):
    t = _NAME_TO_TRITON[dtype]
    sig = {"Q": "*" + t, "K": "*" + t, "V": "*" + t, "O": "*" + t, "LSE": "*fp32", "alibi_ptr": "*fp32",
           "sm_scale": "fp32", "softcap": "fp32", "window_left": "i32", "window_right": "i32"}
    for name in ("stride_qb", "stride_qh", "stride_qm", "stride_kb", "stride_kh", "stride_kn",
                 "stride_vb", "stride_vh", "stride_vn", "stride_ob", "stride_oh", "stride_om",
                 "stride_lb", "stride_lh", "Hq", "Lq", "Lk", "GROUP"):
        sig[name] = "i32"
    for name in ("HEAD_DIM", "BLOCK_M", "BLOCK_N", "MOD", "DOT_F32"):
        sig[name] = "constexpr"
    return sig


def compile_jobs(case: dict) -> list:
    mod = MOD_NAMES.index(case["mod"])
    return [{
        "name": f"attn_fwd_{case['dtype']}_d{case['head_dim']}_{case['mod']}",
        "fn": _attn_fwd,
        "signature": _signature(case["dtype"]),
        "constexprs": {"HEAD_DIM": case["head_dim"], "BLOCK_M": CONFIG["BLOCK_M"],
                       "BLOCK_N": CONFIG["BLOCK_N"], "MOD": mod, "DOT_F32": False},
        "options": {"num_warps": CONFIG["num_warps"], "num_stages": CONFIG.get("num_stages", 3)},
    }] + backward_jobs(case)


def launch(q, k, v, out, lse, scale: float, mod: str, window_left: int, window_right: int, softcap: float,
           alibi_slopes, num_sms: int) -> None:
    B, Hq, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    assert Hq % Hkv == 0 and D in (16, 32, 64, 128, 256)
    # the kernel assumes unit stride in the head dim; anything else is copied once
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    assert out.stride(-1) == 1 and lse.stride(-1) == 1
    wl, wr = _clamped_window(Lq, Lk, window_left, window_right)
    alibi = alibi_slopes if alibi_slopes is not None else lse  # dummy pointer when unused
    grid = (triton.cdiv(Lq, CONFIG["BLOCK_M"]), B * Hq)
    _attn_fwd[grid](
        q, k, v, out, lse, alibi, float(scale), float(softcap), wl, wr,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
        lse.stride(0), lse.stride(1), Hq, Lq, Lk, Hq // Hkv,
        HEAD_DIM=D, BLOCK_M=CONFIG["BLOCK_M"], BLOCK_N=CONFIG["BLOCK_N"], MOD=MOD_NAMES.index(mod),
        DOT_F32=q.device.type == "cpu",  # CPU tensors only run under TRITON_INTERPRET=1
        num_warps=CONFIG["num_warps"], num_stages=CONFIG.get("num_stages", 3), **COMPILE_OPTIONS)


# ------------------------------------------------------------------------------------------------------- backward
# FA2-style, deterministic (no atomics): a pre-pass for delta = rowsum(dO * O) - dLSE, one program per KV block that
# accumulates dK and dV over every query row of its KV group's heads that sees the block (GQA: summed over the
# group in one program), and one program per query block for dQ. Each recomputes P from Q, K and the forward's LSE,
# so S is computed twice; that is the price of no atomics (bit-identical results run to run). The gradient through
# the score mod is the mod IR's derivative (score_math.score_mod_grad); masks pass it through.


@triton.jit
def _bwd_delta(O, DO, DLSE, Delta, stride_ob, stride_oh, stride_om, stride_dob, stride_doh, stride_dom, Hq, Lq,
               HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, HAS_DLSE: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // Hq
    h = pid_bh % Hq
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m[:, None] < Lq
    o = tl.load(O + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh + offs_m[:, None] * stride_om
                + offs_d[None, :], mask=rows, other=0.0).to(tl.float32)
    do = tl.load(DO + b.to(tl.int64) * stride_dob + h.to(tl.int64) * stride_doh + offs_m[:, None] * stride_dom
                 + offs_d[None, :], mask=rows, other=0.0).to(tl.float32)
    delta = tl.sum(o * do, 1)
    if HAS_DLSE:   # a loss that reads the LSE: d lse / d s = P, so it enters as -dLSE beside rowsum(dO * O)
        delta -= tl.load(DLSE + pid_bh.to(tl.int64) * Lq + offs_m, mask=offs_m < Lq, other=0.0)
    tl.store(Delta + pid_bh.to(tl.int64) * Lq + offs_m, delta, mask=offs_m < Lq)


@triton.jit
def _bwd_p(s_in, lse, b, h, q_idx, kv_idx, Lq, Lk, window_left, window_right, softcap, alibi_ptr, MOD: tl.constexpr):
    """P of one tile (either orientation: lse, q_idx and kv_idx broadcast along it) from the scaled QK^T, natural
    units; rows with no visible key (lse = -inf) give P = 0."""
    s = apply_mods(s_in, b, h, q_idx, kv_idx, Lq, Lk, window_left, window_right, softcap, alibi_ptr, MOD)
    live = (lse > -float("inf")) & (q_idx < Lq)
    return tl.where(live, tl.exp(s - tl.where(live, lse, 0.0)), 0.0)


@triton.jit
def _bwd_ds(p, dp, delta, s_in, sm_scale, b, h, q_idx, kv_idx, Lq, Lk, softcap, alibi_ptr, MOD: tl.constexpr):
    """dS of one tile scaled to d(QK^T): P * (dP - delta) through the score mod's derivative at s_in."""
    return p * (dp - delta) * score_mod_grad(s_in, b, h, q_idx, kv_idx, Lq, Lk, softcap, alibi_ptr, MOD) * sm_scale


@triton.jit
def _attn_bwd_dkdv(Q, K, V, DO, LSE, Delta, DK, DV, alibi_ptr, sm_scale, softcap, window_left, window_right,
                   stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
                   stride_dob, stride_doh, stride_dom, Hq, Hkv, Lq, Lk, GROUP,
                   HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MOD: tl.constexpr,
                   DOT_F32: tl.constexpr):
    # one program per (KV block, batch * KV head): dK, dV [BLOCK_N, D] over the group's query heads and the rows
    # that see the block (q_row_range), as one flat loop (so the pipeliner overlaps across heads too); dK and dV are
    # written contiguous [B, Hkv, Lk, D]. Transposed (K-major) tiles: S^T = K Q^T and dP^T = V dO^T, so P^T and dS^T
    # come out of the MMA in the layout the dV += P^T dO and dK += dS^T Q products read them in (no transpose of a
    # register tile: that was a shared-memory round trip per step, and the registers it held spilled at 64 x 64).
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // Hkv
    hk = pid_bh % Hkv
    n0 = pid_n * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_mb = tl.arange(0, BLOCK_M)
    keys = offs_n[:, None] < Lk
    k = tl.load(K + b.to(tl.int64) * stride_kb + hk.to(tl.int64) * stride_kh + offs_n[:, None] * stride_kn
                + offs_d[None, :], mask=keys, other=0.0)
    v = tl.load(V + b.to(tl.int64) * stride_vb + hk.to(tl.int64) * stride_vh + offs_n[:, None] * stride_vn
                + offs_d[None, :], mask=keys, other=0.0)
    in_dtype: tl.constexpr = k.dtype
    if DOT_F32:   # CPU interpreter: its tl.dot multiplies bf16 bit patterns as integers, so dot in fp32 instead
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    lo_row, hi_row = q_row_range(n0, Lq, Lk, window_left, window_right, BLOCK_N, MOD)
    m_lo = (lo_row // BLOCK_M) * BLOCK_M
    steps = tl.cdiv(hi_row - m_lo, BLOCK_M)   # row blocks per query head
    kv_idx = offs_n[:, None]
    for it in range(GROUP * steps):
        g = it // steps
        h = hk * GROUP + g
        bh = b * Hq + h
        offs_m = m_lo + (it - g * steps) * BLOCK_M + offs_mb
        q_idx = offs_m[None, :]
        q_t = tl.load(Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh + q_idx * stride_qm
                      + offs_d[:, None], mask=q_idx < Lq, other=0.0)
        do = tl.load(DO + b.to(tl.int64) * stride_dob + h.to(tl.int64) * stride_doh + offs_m[:, None] * stride_dom
                     + offs_d[None, :], mask=offs_m[:, None] < Lq, other=0.0)
        if DOT_F32:
            q_t = q_t.to(tl.float32)
            do = do.to(tl.float32)
        lse = tl.load(LSE + bh.to(tl.int64) * Lq + offs_m, mask=offs_m < Lq, other=0.0)[None, :]
        delta = tl.load(Delta + bh.to(tl.int64) * Lq + offs_m, mask=offs_m < Lq, other=0.0)[None, :]
        s_t = tl.dot(k, q_t) * sm_scale
        p_t = _bwd_p(s_t, lse, b, h, q_idx, kv_idx, Lq, Lk, window_left, window_right, softcap, alibi_ptr, MOD)
        dp_t = tl.dot(v, tl.trans(do))
        ds_t = _bwd_ds(p_t, dp_t, delta, s_t, sm_scale, b, h, q_idx, kv_idx, Lq, Lk, softcap, alibi_ptr, MOD)
        if DOT_F32:
            dv += tl.dot(p_t, do)
            dk += tl.dot(ds_t, tl.trans(q_t))
        else:   # P and dS rounded to the input dtype for the tensor cores, as the forward rounds P
            dv += tl.dot(p_t.to(in_dtype), do)
            dk += tl.dot(ds_t.to(in_dtype), tl.trans(q_t))
    out = pid_bh.to(tl.int64) * Lk * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DK + out, dk.to(DK.dtype.element_ty), mask=keys)
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=keys)


@triton.jit
def _attn_bwd_dq(Q, K, V, DO, LSE, Delta, DQ, alibi_ptr, sm_scale, softcap, window_left, window_right,
                 stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
                 stride_dob, stride_doh, stride_dom, Hq, Lq, Lk, GROUP,
                 HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MOD: tl.constexpr,
                 DOT_F32: tl.constexpr):
    # one program per (query block, batch * query head) over the KV blocks its rows see (kv_block_range, as the
    # forward); dQ is written contiguous [B, Hq, Lq, D]
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // Hq
    h = pid_bh % Hq
    hk = h // GROUP
    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_nb = tl.arange(0, BLOCK_N)
    rows = offs_m[:, None] < Lq
    q = tl.load(Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh + offs_m[:, None] * stride_qm
                + offs_d[None, :], mask=rows, other=0.0)
    do = tl.load(DO + b.to(tl.int64) * stride_dob + h.to(tl.int64) * stride_doh + offs_m[:, None] * stride_dom
                 + offs_d[None, :], mask=rows, other=0.0)
    in_dtype: tl.constexpr = q.dtype
    if DOT_F32:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    lse = tl.load(LSE + pid_bh.to(tl.int64) * Lq + offs_m, mask=offs_m < Lq, other=0.0)[:, None]
    delta = tl.load(Delta + pid_bh.to(tl.int64) * Lq + offs_m, mask=offs_m < Lq, other=0.0)[:, None]
    k_base = K + b.to(tl.int64) * stride_kb + hk.to(tl.int64) * stride_kh
    v_base = V + b.to(tl.int64) * stride_vb + hk.to(tl.int64) * stride_vh
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    lo, full_lo, full_hi, hi = kv_block_range(m0, Lq, Lk, window_left, window_right, BLOCK_M, BLOCK_N, MOD)
    for n0 in range(lo, hi, BLOCK_N):
        offs_n = n0 + offs_nb
        keys = offs_n[:, None] < Lk
        k = tl.load(k_base + offs_n[:, None] * stride_kn + offs_d[None, :], mask=keys, other=0.0)
        v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_d[None, :], mask=keys, other=0.0)
        if DOT_F32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, tl.trans(k)) * sm_scale
        p = _bwd_p(s, lse, b, h, offs_m[:, None], offs_n[None, :], Lq, Lk, window_left, window_right, softcap,
                   alibi_ptr, MOD)
        dp = tl.dot(do, tl.trans(v))
        ds = _bwd_ds(p, dp, delta, s, sm_scale, b, h, offs_m[:, None], offs_n[None, :], Lq, Lk, softcap, alibi_ptr,
                     MOD)
        if DOT_F32:
            dq += tl.dot(ds, k)
        else:
            dq += tl.dot(ds.to(in_dtype), k)
    tl.store(DQ + pid_bh.to(tl.int64) * Lq * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :],
             dq.to(DQ.dtype.element_ty), mask=rows)


# Backward tiles, chosen for 0 spills in the sm90 cross-compile of every compile case and for speed on the H200
# (bench/attention_bwd_tiles.py). dK/dV: BLOCK_M query rows a step over BLOCK_N keys a program, transposed tiles at
# 4 warps, software-pipelined BWD_STAGES deep (spec config; 2 on triton 3.6, 3 from 3.7 where 2 spills the decay
# case on 3.9 and 3 the softcap case on 3.6); on the H200 it is 1.9-2.1x the kernel it replaced (untransposed 32 x 64
# at 8 warps, not pipelined: at num_stages 2 Triton 3.6's pipeliner gave that one a run-to-run race on its Q tile),
# with the same bits run to run. dQ: BLOCK_M rows a program over BLOCK_N keys a step; 4 warps is 2.2x faster than 8
# (0.37 vs 0.80 ms at B4 H16 L2048 D128 causal). The interpreter runs 16 x 16 tiles.
BWD_DKDV = {"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 4, "num_stages": CONFIG.get("BWD_STAGES", 2)}
BWD_DQ = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2}


def _bwd_signature(fn, dtype: str) -> dict:
    t = _NAME_TO_TRITON[dtype]
    sig = {n: "i32" for n in fn.arg_names}
    sig.update({n: "*" + t for n in ("Q", "K", "V", "DO", "DQ", "DK", "DV") if n in sig})
    sig.update({"LSE": "*fp32", "Delta": "*fp32", "alibi_ptr": "*fp32", "sm_scale": "fp32", "softcap": "fp32"})
    sig.update({n: "constexpr" for n in ("HEAD_DIM", "BLOCK_M", "BLOCK_N", "MOD", "DOT_F32")})
    return sig


def backward_jobs(case: dict) -> list:
    """The backward's dK/dV and dQ kernels at one case, as an aligned launch specializes them (pointers and strides
    divisible by 16): compiled and gated with the forward (compile_jobs)."""
    jobs = []
    for name, fn, cfg in (("dkdv", _attn_bwd_dkdv, BWD_DKDV), ("dq", _attn_bwd_dq, BWD_DQ)):
        sig = _bwd_signature(fn, case["dtype"])
        attrs = _aligned(fn, [n for n in sig if sig[n].startswith("*") or n.startswith("stride")])
        jobs.append({"name": f"attn_bwd_{name}_{case['dtype']}_d{case['head_dim']}_{case['mod']}", "fn": fn,
                     "signature": sig, "attrs": attrs,
                     "constexprs": {"HEAD_DIM": case["head_dim"], "BLOCK_M": cfg["BLOCK_M"], "BLOCK_N": cfg["BLOCK_N"],
                                    "MOD": MOD_NAMES.index(case["mod"]), "DOT_F32": False},
                     "options": {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]}})
    return jobs


def backward(q, k, v, out, lse, dout, dlse, scale: float, mod: str, window_left: int, window_right: int,
             softcap: float, alibi_slopes, dkdv=None, dq_kernel=None, delta_kernel=None):
    """(dq, dk, dv) of the forward's (out, lse) for the loss gradients dout (and dlse, or None), deterministic.
    dq [B, Hq, Lq, D], dk and dv [B, Hkv, Lk, D], contiguous, in q's dtype. `dkdv` / `dq_kernel` / `delta_kernel`: a
    Gluon module's dK/dV, dQ or delta pre-pass launch (its backward_dkdv / backward_dq, same arguments;
    backward_delta(out, dout, dlse, delta)) in place of the portable kernel."""
    B, Hq, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    cpu = q.device.type == "cpu"   # CPU tensors only run under TRITON_INTERPRET=1
    dkdv_cfg, dq_cfg = ({"BLOCK_M": 16, "BLOCK_N": 16}, {"BLOCK_M": 16, "BLOCK_N": 16}) if cpu else (BWD_DKDV, BWD_DQ)
    bm = dq_cfg["BLOCK_M"]
    q, k, v, out, dout = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, out, dout))
    lse = lse.contiguous()
    delta = torch.empty((B, Hq, Lq), device=q.device, dtype=torch.float32)
    dlse_arg = dlse.float().contiguous() if dlse is not None else delta
    if delta_kernel is not None:
        delta_kernel(out, dout, dlse_arg if dlse is not None else None, delta)
    else:
        _bwd_delta[(triton.cdiv(Lq, bm), B * Hq)](
            out, dout, dlse_arg, delta, *out.stride()[:3], *dout.stride()[:3], Hq, Lq,
            HEAD_DIM=D, BLOCK_M=bm, HAS_DLSE=dlse is not None, **COMPILE_OPTIONS)
    wl, wr = _clamped_window(Lq, Lk, window_left, window_right)
    alibi = alibi_slopes if alibi_slopes is not None else delta   # dummy pointer when unused
    common = (float(scale), float(softcap), wl, wr, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
              *dout.stride()[:3])
    consts = {"HEAD_DIM": D, "MOD": MOD_NAMES.index(mod), "DOT_F32": cpu, **COMPILE_OPTIONS}
    dq = torch.empty((B, Hq, Lq, D), device=q.device, dtype=q.dtype)
    dk = torch.empty((B, Hkv, Lk, D), device=q.device, dtype=q.dtype)
    dv = torch.empty((B, Hkv, Lk, D), device=q.device, dtype=q.dtype)
    if dkdv is not None:
        dkdv(q, k, v, dout, lse, delta, dk, dv, float(scale), mod, wl, wr, float(softcap), alibi)
    else:
        _attn_bwd_dkdv[(triton.cdiv(Lk, dkdv_cfg["BLOCK_N"]), B * Hkv)](
            q, k, v, dout, lse, delta, dk, dv, alibi, *common, Hq, Hkv, Lq, Lk, Hq // Hkv, **consts, **dkdv_cfg)
    if dq_kernel is not None:
        dq_kernel(q, k, v, dout, lse, delta, dq, float(scale), mod, wl, wr, float(softcap), alibi)
    else:
        _attn_bwd_dq[(triton.cdiv(Lq, bm), B * Hq)](
            q, k, v, dout, lse, delta, dq, alibi, *common, Hq, Lq, Lk, Hq // Hkv, **consts, **dq_cfg)
    return dq, dk, dv
