"""GEMM in plain Triton: out = act(a @ b + bias) [+ residual], fp32 accumulation, any M, N, K >= 1 (masked tails).
A gated activation (swiglu, geglu) reads b as [K, 2N] and writes act(z[:, :N]) * z[:, N:] (shapes.GATED); a
residual [M, N] (output dtype, unit column stride) is added in fp32 before the down-cast; RMSNorm rows (ROW_RMS:
act(rmsnorm(a) @ b + bias), the norm's gain folded into b) scale the product by each row's 1 / sqrt(mean(a_row^2) +
eps), from the rows' fp32 L2 norms the host computes, before the bias; RoPE (ROPE: a QKV projection's rotary
embedding) rotates the output's first rope_cols columns head by head after the activation, x * cos + rotate(x) *
sin with the tables' row m % rope_rows, in fp32 before the down-cast (the tile holds whole heads)."""
import triton
import triton.language as tl
from triton import knobs

import torch

if __package__:   # generated/<family>/: the package's own copy of the run time
    from .._runtime.shapes import GATED, b_layout
    from .._runtime.launch import COMPILE_OPTIONS, shared_launcher
    from .._runtime.rope import check_tables, rope_case_kind, rope_kind
else:             # compiled alone by gen: gen's run time (the same files)
    from gen.runtime.shapes import GATED, b_layout
    from gen.runtime.launch import COMPILE_OPTIONS, shared_launcher
    from gen.runtime.rope import check_tables, rope_case_kind, rope_kind


KERNEL_MODE = "triton"
CONFIG = {'BLOCK_M': 16, 'BLOCK_N': 64, 'BLOCK_K': 128, 'GROUP_M': 8, 'num_warps': 4, 'num_stages': 4, 'SPLIT_K': 16}

BLOCK_M = 16
BLOCK_N = 64
BLOCK_K = 128
GROUP_M = 8
NUM_WARPS = 4
NUM_STAGES = 4


@triton.jit
def _apply_activation(x, ACTIVATION: tl.constexpr):
    # The functions of the Gluon epilogue (_lib/pipeline.jinja: epilogue_math), fp32 in, fp32 out. gelu_tanh and
    # silu are x * sigmoid(z), computed from e = exp2(-|z| log2 e) in (0, 1] so that exp2 never overflows (numpy
    # warns on exp2 -> inf in the interpreter, an error under -W error): sigmoid(z) = 1 / (1 + e) for z >= 0 and
    # e / (1 + e) for z < 0, without cancellation in either tail.
    if ACTIVATION == "relu":
        x = tl.maximum(x, 0.0)
    elif ACTIVATION == "gelu_tanh":
        # 0.5 * x * (1 + tanh(u)) == x * sigmoid(2u), u = sqrt(2/pi) * (x + 0.044715 x^3); t = -2u * log2(e).
        # x is clamped to +-11 inside the cubic so x^3 cannot overflow; past +-11, |t| > 150 makes e exactly 0 and
        # the result x or -0, as with the unclamped form.
        xc = tl.minimum(tl.maximum(x, -11.0), 11.0)
        t = xc * (-2.302208198144325 - 0.1029432395800235 * xc * xc)
        e = tl.exp2(-tl.abs(t))
        x = tl.fdiv(tl.where(t <= 0.0, x, x * e), 1.0 + e)
    elif ACTIVATION == "silu":
        e = tl.exp2(tl.abs(x) * -1.4426950408889634)
        x = tl.fdiv(tl.where(x >= 0.0, x, x * e), 1.0 + e)
    return x


@triton.jit
def _gate(acc, up, ACTIVATION: tl.constexpr):
    # The epilogue's function of the (gate, up) pre-activations: act(gate) * up for a gated activation, else
    # act(acc) (up is then an unused zero tile, removed by the compiler).
    if ACTIVATION == "swiglu":
        acc = _apply_activation(acc, "silu") * up
    elif ACTIVATION == "geglu":
        acc = _apply_activation(acc, "gelu_tanh") * up
    else:
        acc = _apply_activation(acc, ACTIVATION)
    return acc


@triton.jit
def _tile_product(a_ptr, b_ptr, M, N, k_lo, k_hi, stride_am, stride_b, pid,
                  B_KN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  GROUP_M: tl.constexpr, UPCAST_DOT: tl.constexpr, GATED: tl.constexpr):
    """A[tile rows, k_lo:k_hi] @ B[k_lo:k_hi, tile columns] in fp32 for output tile `pid`, with the tile's offsets
    and masks: (acc, up, offs_m, offs_n, mask_m, mask_n). GATED: B holds 2N columns, up is the product with the
    tile's columns N further on (the up projection; A is loaded once for both), else an unused zero tile."""
    # Grouped program order: GROUP_M row-tiles share each column sweep, so B tiles stay in L2.
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    group_size = GROUP_M * num_pid_n
    first_m = (pid // group_size) * GROUP_M
    rows = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group_size) % rows
    pid_n = (pid % group_size) // rows

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    # M/N tails: point out-of-range operand rows/columns back into range instead of masking the loads (a mask on
    # M or N keeps Triton 3.6 from software-pipelining them); their results are dropped by the store mask.
    # Only the K tail is masked, with zeros, since it feeds the sum.
    rows_a = tl.where(mask_m, offs_m, 0)
    if B_KN:
        # N is B's contiguous axis: `% N` keeps the contiguity (vector loads) when N % 16 == 0; tl.where would not.
        cols_b = offs_n % N
    else:
        cols_b = tl.where(mask_n, offs_n, 0)
    # Row offsets in int64: M * K or N * K may exceed 2**31 elements.
    a_ptrs = a_ptr + rows_a.to(tl.int64)[:, None] * stride_am + (k_lo + offs_k)[None, :]
    if B_KN:
        b_ptrs = b_ptr + (k_lo + offs_k).to(tl.int64)[:, None] * stride_b + cols_b[None, :]  # B[k, n], n contiguous
    else:
        b_ptrs = b_ptr + cols_b.to(tl.int64)[None, :] * stride_b + (k_lo + offs_k)[:, None]  # B[n, k], k contiguous

    if GATED:
        if B_KN:
            up_offset = tl.cast(N, tl.int64)              # the up projection: N columns further on
        else:
            up_offset = tl.cast(N, tl.int64) * stride_b   # N weight rows further on
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        mask_k = offs_k < k_hi - k0
        a = tl.load(a_ptrs, mask=mask_k[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=mask_k[:, None], other=0.0)
        if UPCAST_DOT:
            # Interpreter only: triton 3.6's CPU interpreter multiplies bf16 as raw uint16 in tl.dot.
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc)  # fp32 accumulation
        if GATED:
            b_up = tl.load(b_ptrs + up_offset, mask=mask_k[:, None], other=0.0)
            if UPCAST_DOT:
                b_up = b_up.to(tl.float32)
            up = tl.dot(a, b_up, up)
        a_ptrs += BLOCK_K
        if B_KN:
            b_ptrs += BLOCK_K * stride_b
        else:
            b_ptrs += BLOCK_K
    return acc, up, offs_m, offs_n, mask_m, mask_n


@triton.jit
def _rms_factors(rms_ptr, offs_m, mask_m, K, rms_eps):
    """The rows' RMSNorm factors 1 / sqrt(mean(a_row^2) + eps) from their L2 norms (fp32, rms_ptr[m] = ||a[m, :]||):
    rmsnorm(a) @ b = diag(factors) (a @ b)."""
    norm = tl.load(rms_ptr + offs_m, mask=mask_m, other=0.0)
    return tl.rsqrt(norm * norm / K + rms_eps)


@triton.jit
def _rope_tile(acc, cos_ptr, sin_ptr, offs_m, offs_n, mask_m, rope_rows, stride_cos, rope_cols, ROPE: tl.constexpr,
               ROPE_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """RoPE on the tile's columns below rope_cols, head by head of ROPE_D columns (BLOCK_N is a multiple of ROPE_D and
    tiles start at multiples of BLOCK_N, so a tile holds whole heads): x * cos + partner * sin with the tables' row
    m % rope_rows (cos and sin [rope_rows, ROPE_D], row stride stride_cos), in fp32. ROPE 1, rotate-half: the partner
    of column d is -x[d + D/2] in the first half, x[d - D/2] in the second; ROPE 2, interleaved: -x[d + 1] at even d,
    x[d - 1] at odd d. The partners come from reshapes and splits of the tile (no second load)."""
    t = (offs_m % rope_rows).to(tl.int64)[:, None] * stride_cos + (offs_n % ROPE_D)[None, :]
    live = mask_m[:, None] & (offs_n < rope_cols)[None, :]
    cos = tl.load(cos_ptr + t, mask=live, other=1.0).to(tl.float32)
    sin = tl.load(sin_ptr + t, mask=live, other=0.0).to(tl.float32)
    if ROPE == 1:   # [M, heads, 2, D/2] -> halves on the last axis
        halves = tl.permute(tl.reshape(acc, [BLOCK_M, BLOCK_N // ROPE_D, 2, ROPE_D // 2]), [0, 1, 3, 2])
        x1, x2 = tl.split(halves)
        partner = tl.reshape(tl.permute(tl.join(-x2, x1), [0, 1, 3, 2]), [BLOCK_M, BLOCK_N])
    else:           # [M, N/2, 2]: the pairs
        even, odd = tl.split(tl.reshape(acc, [BLOCK_M, BLOCK_N // 2, 2]))
        partner = tl.reshape(tl.join(-odd, even), [BLOCK_M, BLOCK_N])
    return tl.where(live, acc * cos + partner * sin, acc)


@triton.jit
def _epilogue_store(acc, up, bias_ptr, c_ptr, res_ptr, rms_ptr, cos_ptr, sin_ptr, offs_m, offs_n, mask_m, mask_n,
                    N, K, stride_cm, stride_rm, rms_eps, rope_rows, stride_cos, rope_cols, HAS_BIAS: tl.constexpr,
                    ACTIVATION: tl.constexpr, RESIDUAL: tl.constexpr, ROW_RMS: tl.constexpr, ROPE: tl.constexpr,
                    ROPE_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    if ROW_RMS:
        factors = _rms_factors(rms_ptr, offs_m, mask_m, K, rms_eps)[:, None]
        acc *= factors
        if ACTIVATION == "swiglu" or ACTIVATION == "geglu":
            up *= factors
    if HAS_BIAS:
        # Bias is added in fp32 whatever its storage dtype (a gated activation's up half: bias[N:]).
        acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        if ACTIVATION == "swiglu" or ACTIVATION == "geglu":
            up += tl.load(bias_ptr + N + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    acc = _gate(acc, up, ACTIVATION)
    if ROPE != 0:
        acc = _rope_tile(acc, cos_ptr, sin_ptr, offs_m, offs_n, mask_m, rope_rows, stride_cos, rope_cols, ROPE, ROPE_D,
                         BLOCK_M, BLOCK_N)
    mask = mask_m[:, None] & mask_n[None, :]
    if RESIDUAL:
        r_ptrs = res_ptr + offs_m.to(tl.int64)[:, None] * stride_rm + offs_n[None, :]
        acc += tl.load(r_ptrs, mask=mask, other=0.0).to(tl.float32)
    c_ptrs = c_ptr + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def gemm_kernel(a_ptr, b_ptr, bias_ptr, c_ptr, res_ptr, rms_ptr, cos_ptr, sin_ptr, M, N, K, stride_am, stride_b,
                stride_cm, stride_rm, rms_eps, rope_rows, stride_cos, rope_cols, HAS_BIAS: tl.constexpr,
                ACTIVATION: tl.constexpr, B_KN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, UPCAST_DOT: tl.constexpr, RESIDUAL: tl.constexpr,
                ROW_RMS: tl.constexpr, ROPE: tl.constexpr, ROPE_D: tl.constexpr):
    # N: the output's columns (a gated activation's b has 2N)
    acc, up, offs_m, offs_n, mask_m, mask_n = _tile_product(
        a_ptr, b_ptr, M, N, 0, K, stride_am, stride_b, tl.program_id(0), B_KN, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
        UPCAST_DOT, ACTIVATION == "swiglu" or ACTIVATION == "geglu")
    _epilogue_store(acc, up, bias_ptr, c_ptr, res_ptr, rms_ptr, cos_ptr, sin_ptr, offs_m, offs_n, mask_m, mask_n, N,
                    K, stride_cm, stride_rm, rms_eps, rope_rows, stride_cos, rope_cols, HAS_BIAS, ACTIVATION,
                    RESIDUAL, ROW_RMS, ROPE, ROPE_D, BLOCK_M, BLOCK_N)


@triton.jit
def gemm_split_kernel(a_ptr, b_ptr, part_ptr, M, N, K, stride_am, stride_b, K_SLICE,
                      B_KN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      GROUP_M: tl.constexpr, UPCAST_DOT: tl.constexpr):
    """Slice program_id(1) of K (K_SLICE columns, a multiple of BLOCK_K) of output tile program_id(0): its fp32
    partial product into part[slice] ([M, N], contiguous; N: all of b's columns, a gated activation's 2N, which
    the reduce kernel gates)."""
    split = tl.program_id(1)
    k_lo = split * K_SLICE
    acc, up, offs_m, offs_n, mask_m, mask_n = _tile_product(
        a_ptr, b_ptr, M, N, k_lo, tl.minimum(K, k_lo + K_SLICE), stride_am, stride_b, tl.program_id(0), B_KN,
        BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, UPCAST_DOT, False)
    p_ptrs = part_ptr + (split * M + offs_m).to(tl.int64)[:, None] * N + offs_n[None, :]
    tl.store(p_ptrs, acc, mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def splitk_reduce_kernel(part_ptr, bias_ptr, c_ptr, res_ptr, rms_ptr, MN, N, K, stride_cm, SPLITS, stride_rm,
                         rms_eps, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, RESIDUAL: tl.constexpr,
                         ROW_RMS: tl.constexpr, BLOCK: tl.constexpr):
    """out = act(sum over the slices, in slice order, of part [* the rows' RMSNorm factors] + bias) [+ residual]:
    BLOCK of the MN = M * N output elements. A gated activation's slices hold [M, 2N] (gate and up columns), gated
    here."""
    GATED: tl.constexpr = ACTIVATION == "swiglu" or ACTIVATION == "geglu"
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    n = offs % N
    if GATED:
        p_offs = (offs // N) * (2 * N) + n
        slice_size = 2 * MN
    else:
        p_offs = offs
        slice_size = MN
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    up = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(0, SPLITS):
        acc += tl.load(part_ptr + p_offs, mask=mask, other=0.0)
        if GATED:
            up += tl.load(part_ptr + p_offs + N, mask=mask, other=0.0)
        part_ptr += slice_size
    if ROW_RMS:
        factors = _rms_factors(rms_ptr, offs // N, mask, K, rms_eps)
        acc *= factors
        if GATED:
            up *= factors
    if HAS_BIAS:
        acc += tl.load(bias_ptr + n, mask=mask, other=0.0).to(tl.float32)
        if GATED:
            up += tl.load(bias_ptr + N + n, mask=mask, other=0.0).to(tl.float32)
    acc = _gate(acc, up, ACTIVATION)
    if RESIDUAL:
        acc += tl.load(res_ptr + (offs // N) * stride_rm + n, mask=mask, other=0.0).to(tl.float32)
    tl.store(c_ptr + (offs // N) * stride_cm + n, acc.to(c_ptr.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------------------------- host side

_TRITON_TY = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
# RoPE (head dim, interleaved) the epilogue rotates: head dims of powers of two, the tile widened to hold a whole
# head (_block_n)
ROPE_KINDS = tuple((d, interleaved) for d in (16, 32, 64, 128) + ((256,) if BLOCK_N >= 256 else ())
                   for interleaved in (False, True))
# RoPE's tile width: the rotation's reshapes and joins beside a 128 x 256 accumulator spilled 141 stores (sm_90a,
# triton 3.6.0); at 128 columns, none
ROPE_BLOCK_N = min(BLOCK_N, 128)


def _block_n(activation, residual=False, rope_dim=0) -> int:
    """The output tile's width: BLOCK_N, halved under a gated activation (two accumulators, gate and up, in the
    registers one took) and halved with a residual (its tile and pointers beside the accumulator in the epilogue);
    with RoPE, ROPE_BLOCK_N or one head (rope_dim) if that is wider, so that a tile's heads are whole."""
    if rope_dim:
        return max(ROPE_BLOCK_N, rope_dim)
    return BLOCK_N // (2 if activation in GATED else 1) // (2 if residual else 1)


def _rope_constexprs(kind: tuple) -> dict:
    """ROPE (0 none, 1 rotate-half, 2 interleaved) and ROPE_D of a RoPE (head dim, interleaved)."""
    dim, interleaved = kind
    assert not dim or kind in ROPE_KINDS, f"RoPE {kind}: not one of ROPE_KINDS {ROPE_KINDS}"
    return {"ROPE": 0 if not dim else 2 if interleaved else 1, "ROPE_D": dim}


def _rope_args(rope, a, out) -> tuple:
    """(cos, sin, rope_rows, stride_cos, rope_cols) as the kernel takes them (one row stride for both tables, unit
    column stride: check_tables); out stands in for the tables without RoPE (never read: ROPE is constexpr)."""
    if rope is None:
        return out, out, 1, 0, 0
    cos, sin, columns, _ = rope
    check_tables(cos, sin, a.dtype)
    return cos, sin, cos.shape[0], cos.stride(0), columns


def _constexprs(has_bias, activation, b_kn, upcast_dot=False, residual=False, row_rms=False, rope=(0, False)):
    rope_c = _rope_constexprs(rope)
    return {"HAS_BIAS": bool(has_bias), "ACTIVATION": activation, "B_KN": bool(b_kn), "BLOCK_M": BLOCK_M,
            "BLOCK_N": _block_n(activation, residual, rope_c["ROPE_D"]), "BLOCK_K": BLOCK_K, "GROUP_M": GROUP_M,
            "UPCAST_DOT": upcast_dot, "RESIDUAL": bool(residual), "ROW_RMS": bool(row_rms), **rope_c}


def compile_jobs(case):
    ty, out_ty = _TRITON_TY[case["dtype"]], _TRITON_TY[case["out_dtype"]]
    residual, row_rms = bool(case.get("residual")), bool(case.get("rms"))
    rope = rope_case_kind(case)
    signature = {"a_ptr": f"*{ty}", "b_ptr": f"*{ty}", "bias_ptr": f"*{ty}", "c_ptr": f"*{out_ty}",
                 "res_ptr": f"*{out_ty}", "rms_ptr": "*fp32", "cos_ptr": f"*{ty}", "sin_ptr": f"*{ty}", "M": "i32",
                 "N": "i32", "K": "i32", "stride_am": "i32", "stride_b": "i32", "stride_cm": "i32",
                 "stride_rm": "i32", "rms_eps": "fp32", "rope_rows": "i32", "stride_cos": "i32", "rope_cols": "i32"}
    constexprs = _constexprs(case["bias"], case["activation"], case.get("b_layout", "kn") == "kn", False, residual,
                             row_rms, rope)
    signature.update({k: "constexpr" for k in constexprs})
    # "attrs": the specialization a launch on an aligned problem gets (pointers, sizes and row strides divisible
    # by 16), which is what enables vectorized/cp.async loads; pass it to ASTSource(..., attrs=job["attrs"]).
    attrs = {(gemm_kernel.arg_names.index(k),): [["tt.divisibility", 16]]
             for k in ("a_ptr", "b_ptr", "bias_ptr", "c_ptr", "res_ptr", "rms_ptr", "cos_ptr", "sin_ptr", "M", "N",
                       "K", "stride_am", "stride_b", "stride_cm", "stride_rm", "stride_cos", "rope_cols")}
    jobs = [{"name": "gemm_kernel", "fn": gemm_kernel, "signature": signature, "constexprs": constexprs,
             "attrs": attrs, "options": {"num_warps": NUM_WARPS, "num_stages": NUM_STAGES}}]
    # the slice kernel and the reduce kernel a split call launches (the gates read all three)
    split_sig = {"a_ptr": f"*{ty}", "b_ptr": f"*{ty}", "part_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32",
                 "stride_am": "i32", "stride_b": "i32", "K_SLICE": "i32"}
    split_consts = _split_constexprs(case.get("b_layout", "kn") == "kn")
    split_sig.update({k: "constexpr" for k in split_consts})
    jobs.append({"name": "gemm_split_kernel", "fn": gemm_split_kernel, "signature": split_sig,
                 "constexprs": split_consts, "options": {"num_warps": NUM_WARPS, "num_stages": NUM_STAGES},
                 "attrs": {(gemm_split_kernel.arg_names.index(k),): [["tt.divisibility", 16]]
                           for k in ("a_ptr", "b_ptr", "part_ptr", "N", "K", "stride_am", "stride_b", "K_SLICE")}})
    reduce_sig = {"part_ptr": "*fp32", "bias_ptr": f"*{ty}", "c_ptr": f"*{out_ty}", "res_ptr": f"*{out_ty}",
                  "rms_ptr": "*fp32", "MN": "i32", "N": "i32", "K": "i32", "stride_cm": "i32", "SPLITS": "i32",
                  "stride_rm": "i32", "rms_eps": "fp32"}
    reduce_consts = _reduce_constexprs(case["bias"], case["activation"], residual, row_rms)
    reduce_sig.update({k: "constexpr" for k in reduce_consts})
    jobs.append({"name": "splitk_reduce_kernel", "fn": splitk_reduce_kernel, "signature": reduce_sig,
                 "constexprs": reduce_consts, "options": {"num_warps": 4},
                 "attrs": {(splitk_reduce_kernel.arg_names.index(k),): [["tt.divisibility", 16]]
                           for k in ("part_ptr", "bias_ptr", "c_ptr", "res_ptr", "rms_ptr", "MN", "N", "stride_cm",
                                     "stride_rm")}})
    return jobs


SPLIT_K = 16
PROGRAMS_PER_SM = 2    # split target: programs in flight per SM, so that B's stream keeps every SM busy (not GPU-tuned)
REDUCE_BLOCK = 1024


def _reduce_constexprs(has_bias, activation, residual, row_rms=False):
    return {"HAS_BIAS": bool(has_bias), "ACTIVATION": activation, "RESIDUAL": bool(residual), "ROW_RMS": bool(row_rms),
            "BLOCK": REDUCE_BLOCK}


def _split_constexprs(b_kn, upcast_dot=False):
    return {"B_KN": bool(b_kn), "BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N, "BLOCK_K": BLOCK_K, "GROUP_M": GROUP_M,
            "UPCAST_DOT": upcast_dot}


def split_count(M: int, N: int, K: int, num_sms: int) -> tuple[int, int]:
    """(slices, K columns per slice): as many slices of K as bring the grid to PROGRAMS_PER_SM programs per SM, at
    most SPLIT_K, each a whole number of BLOCK_K blocks and none empty; (1, K) where the tiles alone fill the GPU."""
    tiles = triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N)
    k_blocks = triton.cdiv(K, BLOCK_K)
    want = min(SPLIT_K, k_blocks, max(1, PROGRAMS_PER_SM * num_sms // tiles))
    if want <= 1:
        return 1, K
    k_slice = triton.cdiv(k_blocks, want) * BLOCK_K
    return triton.cdiv(K, k_slice), k_slice


class Plan:
    """What a launch needs that depends only on the call's shape class: the slice count, launchers, grids and
    scalar arguments (the generated op builds it once per class and keeps it)."""
    __slots__ = ("split", "reduce", "grid", "reduce_grid", "device", "split_args", "reduce_args", "part_shape",
                 "direct")


def plan(a, b, bias, out, activation, num_sms, residual=None, rms=None, rope=None, splits: int = 0) -> Plan:
    """`splits` > 0 forces the slice count (tests); 0 chooses it (split_count). residual: [M, N], unit column
    stride, or None; rms: (the rows' fp32 L2 norms [M], eps) for RMSNorm rows, or None (only its presence is part of
    the plan); rope: (cos [P, D], sin [P, D], columns, interleaved) for RoPE on the output, or None (its head dim and
    convention are part of the plan; a call with RoPE is not split: the reduce kernel's flat blocks hold no heads)."""
    M, K = a.shape
    N, NB = out.shape[1], b.shape[1]   # the output's columns, b's (2N under a gated activation)
    layout = b_layout(b)
    assert a.stride(1) == 1 and out.stride(1) == 1 and layout, "a, out: unit last stride; b: [K, N] or [N, K].t()"
    has_res = residual is not None
    assert not has_res or residual.stride(1) == 1, "residual: unit last stride"
    stride_rm = residual.stride(0) if has_res else 0
    has_rms = rms is not None
    b_kn = layout == "kn"
    n, k_slice = split_count(M, NB, K, num_sms) if rope is None else (1, K)
    if splits and rope is None:
        k_slice = triton.cdiv(triton.cdiv(K, BLOCK_K), splits) * BLOCK_K
        n = triton.cdiv(K, k_slice)
    cpu = a.device.type == "cpu"   # CPU tensors only run under TRITON_INTERPRET=1
    upcast = cpu and a.dtype == torch.bfloat16   # see UPCAST_DOT in the kernel
    p = Plan()
    p.device = a.device.index or 0
    kind = rope_kind(rope)
    tiles = triton.cdiv(M, BLOCK_M) * triton.cdiv(N, _block_n(activation, has_res, kind[0]))
    stride_b = b.stride(0) if b_kn else b.stride(1)
    options = {"num_warps": NUM_WARPS, "num_stages": NUM_STAGES}
    if n == 1:   # the tiles fill the GPU: the one-program-per-tile kernel, epilogue included
        p.direct = shared_launcher(gemm_kernel, ("gemm", a.dtype, out.dtype, bias is not None, activation, b_kn, cpu,
                                                 has_res, has_rms, kind),
                                   {**_constexprs(bias is not None, activation, b_kn, upcast, has_res, has_rms,
                                                  kind), **options})
        p.grid = (tiles,)
        p.split_args = (M, N, K, a.stride(0), stride_b, out.stride(0), stride_rm)
        return p
    p.direct = None
    p.split = shared_launcher(gemm_split_kernel, ("split", a.dtype, b_kn, cpu),
                              {**_split_constexprs(b_kn, upcast), **options})
    p.grid = (triton.cdiv(M, BLOCK_M) * triton.cdiv(NB, BLOCK_N), n)   # the slices cover all of b's columns
    p.split_args = (M, NB, K, a.stride(0), stride_b, k_slice)
    p.part_shape = (n, M, NB)
    p.reduce = shared_launcher(splitk_reduce_kernel, ("reduce", out.dtype, bias is not None, activation, cpu,
                                                      has_res, has_rms),
                               {**_reduce_constexprs(bias is not None, activation, has_res, has_rms), "num_warps": 4})
    p.reduce_grid = (triton.cdiv(M * N, REDUCE_BLOCK),)
    p.reduce_args = (M * N, N, K, out.stride(0), n, stride_rm)
    return p


def run(p: Plan, a, b, bias, out, residual=None, rms=None, rope=None) -> None:
    """Launch a plan on tensors of its shape class."""
    bias_arg = bias if bias is not None else out   # never read without bias (HAS_BIAS is constexpr)
    res_arg = residual if residual is not None else out   # likewise without a residual (RESIDUAL)
    rms_arg, eps = rms if rms is not None else (out, 0.0)   # and without RMSNorm rows (ROW_RMS)
    if p.direct is not None:
        cos, sin, *rope_ints = _rope_args(rope, a, out)
        args = (a, b, bias_arg, out, res_arg, rms_arg, cos, sin) + p.split_args + (eps, *rope_ints)
        p.direct(p.grid, p.device, args, lambda: args)
        return
    part = torch.empty(p.part_shape, device=a.device, dtype=torch.float32)
    args = (a, b, part) + p.split_args
    p.split(p.grid, p.device, args, lambda: args)
    rargs = (part, bias_arg, out, res_arg, rms_arg) + p.reduce_args + (eps,)
    p.reduce(p.reduce_grid, p.device, rargs, lambda: rargs)


def launch(a, b, bias, out, activation, num_sms, residual=None, rms=None, rope=None, splits: int = 0):
    """out = act(a @ b + bias) [+ residual], K split over programs where the output tiles alone leave SMs idle
    (plan); rms: (the rows' fp32 L2 norms [M], eps) for act(rmsnorm(a) @ b + bias), or None; rope: RoPE on the
    output (plan), or None."""
    run(plan(a, b, bias, out, activation, num_sms, residual, rms, rope, splits), a, b, bias, out, residual, rms, rope)
