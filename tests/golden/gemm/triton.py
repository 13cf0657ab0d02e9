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

if __package__:   # generated/<family>/: the package's own copy of the run time
    from .._runtime.shapes import GATED, b_layout
    from .._runtime.launch import COMPILE_OPTIONS
    from .._runtime.rope import check_tables, rope_case_kind, rope_kind
else:             # compiled alone by gen: gen's run time (the same files)
    from gen.runtime.shapes import GATED, b_layout
    from gen.runtime.launch import COMPILE_OPTIONS
    from gen.runtime.rope import check_tables, rope_case_kind, rope_kind


KERNEL_MODE = "triton"
CONFIG = {'BLOCK_M': 128, 'BLOCK_N': 256, 'BLOCK_K': 64, 'GROUP_M': 8, 'num_warps': 8, 'num_stages': 3}

BLOCK_M = 128
BLOCK_N = 256
BLOCK_K = 64
GROUP_M = 8
NUM_WARPS = 8
NUM_STAGES = 3


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
    return jobs


def launch(a, b, bias, out, activation, num_sms, residual=None, rms=None, rope=None):
    """out = act(a @ b + bias) [+ residual]. b is [K, N]: row-major, or the w.t() view of a row-major [N, K] weight
    (no copy); residual [M, N] with unit column stride, or None; rms: (the rows' fp32 L2 norms [M], eps) for
    act(rmsnorm(a) @ b + bias), or None; rope: (cos [P, D], sin [P, D], columns, interleaved) for RoPE on the
    output's first `columns` columns, or None. Launched through Triton's binder: this variant specializes on shapes
    and strides (the fallback path)."""
    # num_sms is unused: one program per output tile (the grouped order keeps B in L2).
    M, K = a.shape
    N = out.shape[1]   # b has 2N columns under a gated activation
    layout = b_layout(b)
    assert a.stride(1) == 1 and out.stride(1) == 1 and layout, "a, out: unit last stride; b: [K, N] or [N, K].t()"
    assert residual is None or residual.stride(1) == 1, "residual: unit last stride"
    b_kn = layout == "kn"
    kind = rope_kind(rope)
    grid = (triton.cdiv(M, BLOCK_M) * triton.cdiv(N, _block_n(activation, residual is not None, kind[0])),)
    upcast = knobs.runtime.interpret and str(a.dtype) == "torch.bfloat16"  # see UPCAST_DOT in the kernel
    # Without bias the pointer is never read (HAS_BIAS is constexpr); pass a valid tensor to keep the signature.
    # Likewise the residual pointer without a residual (RESIDUAL).
    rms_arg, eps = rms if rms is not None else (out, 0.0)   # never read without RMSNorm rows (ROW_RMS)
    cos, sin, rope_rows, stride_cos, rope_cols = _rope_args(rope, a, out)   # likewise without RoPE (ROPE)
    gemm_kernel[grid](a, b, bias if bias is not None else out, out, out if residual is None else residual, rms_arg,
                      cos, sin, M, N, K, a.stride(0), b.stride(0) if b_kn else b.stride(1), out.stride(0),
                      0 if residual is None else residual.stride(0), eps, rope_rows, stride_cos, rope_cols,
                      **_constexprs(bias is not None, activation, b_kn, upcast, residual is not None, rms is not None,
                                    kind),
                      num_warps=NUM_WARPS, num_stages=NUM_STAGES, **COMPILE_OPTIONS)
