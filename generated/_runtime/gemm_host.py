"""Host side of the Gluon GEMM variants (sm90, sm100): descriptor layouts, compile jobs, a plan per shape class, and
the per-call launch. A variant module keeps its kernel and the two things only it knows (how its epilogue fits in
shared memory, and its constexprs) and exports one `GluonGemm`'s methods as its `compile_jobs`, `plan`, `run` and
`launch`.

B is [K, N] in either memory order: row-major, or the w.t() view of an nn.Linear weight [N, K], read as K-major
[BLOCK_N, BLOCK_K] tiles that the MMA takes through a transposed shared-memory view (no copy). Where the variant
swaps A and B (sm90's SWAP_AB, for decode M with an nn.Linear weight), a call launches the kernel on (W, a) with M
and N exchanged, and the kernel writes out^T's tiles transposed. Where it splits K (sm90's SPLIT_K), the kernel writes
each slice's fp32 product to a workspace and a reduce kernel sums the slices in order and applies the epilogue.
A gated activation (swiglu, geglu: b [K, 2N], gate columns then up columns) runs the kernel with its GATED
constexpr: two weight tiles a stage, the output tile half as wide unswapped; split-K computes all 2N columns and its
reduce kernel gates. A residual (out = act(a @ b + bias) + residual, residual [M, N] in the output dtype with unit
column stride) runs the kernel with its RESIDUAL constexpr, which reads it in the epilogue; under split-K the reduce
kernel adds it. RMSNorm rows (out = act(rmsnorm(a) @ b + bias), the norm's gain folded into b) run it with ROW_RMS:
the epilogue (or the reduce kernel) scales the product by each row's factor, from the rows' fp32 L2 norms (rms_ptr)
and eps (rms_eps) a call passes as `rms=(norms, eps)`. RoPE on the output (rope=(cos [P, D], sin [P, D], columns,
interleaved), a QKV projection's rotary embedding) runs it with ROPE / ROPE_D where the variant rotates that head dim
(its rope_kinds: unswapped, unsplit): the epilogue rotates the first `columns` columns head by head, reading the
tables' row m % P, and its store slices are at most half a head wide.
"""
from __future__ import annotations

import torch

from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from .launch import Launcher, TmaDescriptor
from .rope import check_tables, rope_case_kind, rope_kind
from .shapes import GATED, b_layout

TRITON_TY = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def dtype_name(t) -> str:
    return str(t).replace("torch.", "")


def tma_compatible(*tensors) -> bool:
    """TMA needs 16-byte aligned base pointers and row strides (e.g. bf16 K % 8 == 0, fp32 out N % 4 == 0)."""
    for t in tensors:
        elem = t.element_size()
        if t.data_ptr() % 16 or t.stride(-1) != 1 or (t.stride(0) * elem) % 16:
            return False
    return True


class GemmPlan:
    """What a launch needs that depends only on the call's shape class (shapes, strides, dtypes, epilogue): the
    generated op builds it once per class and keeps it, so a call only wraps its pointers."""
    __slots__ = ("launcher", "layouts", "grid", "device", "b_kn", "swap", "a_box", "b_box", "c_box", "dims",
                 "workspace", "reduce", "reduce_grid", "reduce_args", "rope_args")


# The narrowest gate (and up) tile a gated unswapped kernel takes: halving swap16's 16 columns gave 8-column B tiles
# ([BLOCK_K, 8] bf16: 16-byte rows, no swizzle), and sm90_swap16's gated kernel on a [K, 2N] row-major b faulted
# with an illegal address on an H100 (2026-12-07); at 16 and above the tiles are those every ungated config uses.
GATED_MIN_TILE_N = 16


def gated_tile_n(block_n: int) -> int:
    """A gated unswapped kernel's gate / up tile width: half the config's BLOCK_N (an output tile half as wide, the
    same smem and registers as ungated), but at least GATED_MIN_TILE_N."""
    return max(block_n // 2, GATED_MIN_TILE_N)


PROGRAMS_PER_SM = 2     # split-K target: work items per SM, so that B's stream keeps every SM busy (not GPU-tuned)
REDUCE_TILE = (32, 128)  # the reduce kernel's output tile (rows, columns), 4 warps


def split_count(split_k: int, block_k: int, tiles: int, K: int, num_sms: int) -> int:
    """K slices per output tile of `tiles`: as many as bring the work items to PROGRAMS_PER_SM per SM, at most
    split_k, each a whole number of BLOCK_K blocks and none empty (the kernel gives slice s blocks [s * per,
    (s+1) * per), per = ceil(blocks / slices)); 1 where the tiles alone fill the GPU."""
    k_blocks = -(-K // block_k)
    want = max(1, min(split_k, k_blocks, PROGRAMS_PER_SM * num_sms // tiles))
    per = -(-k_blocks // want)
    return -(-k_blocks // per)


class GluonGemm:
    """kernel(a_desc, b_desc, c_desc, bias_ptr, res_ptr, rms_ptr, cos_ptr, sin_ptr, M, N, K[, SPLITS], stride_rm,
    rms_eps, rope_rows, stride_cos, rope_cols, <constexprs>) with its tile; epilogue_plan(out dtype name, gated, swap)
    -> (EPI_N, EPI_BUFFERS); constexprs(has_bias, activation, b_kn, epi_buffers, swap, gated, residual, row_rms,
    rope_kind) -> the kernel's constexprs and num_warps; swap_ab: the variant runs calls with an nn.Linear weight
    swapped; rope_kinds: the RoPE (head dim, interleaved) pairs its epilogue rotates (none: it takes no RoPE). split_k: 0 for a kernel without
    the SPLITS argument; 1 for one that takes it and never splits; above 1 the most K slices a tile gets, with
    reduce_kernel(part, bias, out, res, rms, M, N, M_PAD, stride_cm, SPLITS, stride_rm, K, rms_eps, HAS_BIAS,
    ACTIVATION, GATED, RESIDUAL, ROW_RMS, REDUCE_M, REDUCE_N) summing them (c_desc is then the fp32 workspace). dynamic_schedule: the
    kernel takes its first work item from its program id and the next ones from programs it takes over (Blackwell
    cluster launch control), so it launches one program per work item instead of one per SM. cta_pair: a program is a
    cluster of two CTAs (Blackwell 2-CTA MMA, triton >= 3.8): block_m is the cluster's rows, the descriptors' boxes
    are the cluster's with each CTA holding half (A and C split by rows, B by its N columns), and at most half as many
    programs as SMs run."""

    def __init__(self, kernel, block_m: int, block_n: int, block_k: int, num_warps: int, swap_ab: bool,
                 epilogue_plan, constexprs, split_k: int = 0, reduce_kernel=None, dynamic_schedule: bool = False,
                 cta_pair: bool = False, rope_kinds: tuple = ()):
        self.kernel = kernel
        self.block_m, self.block_n, self.block_k = block_m, block_n, block_k
        self.num_warps = num_warps
        self.swap_ab = bool(swap_ab)
        self.epilogue_plan = epilogue_plan
        self.constexprs = constexprs
        self.split_k = split_k
        self.reduce_kernel = reduce_kernel
        self.dynamic_schedule = dynamic_schedule
        self.cta_pair = cta_pair
        self.rope_kinds = tuple(rope_kinds)
        assert (split_k > 1) == (reduce_kernel is not None) and not (split_k > 1 and swap_ab)
        assert not (cta_pair and (swap_ab or split_k or dynamic_schedule))
        self._cases: dict = {}   # (dtype, out dtype, bias?, activation, B is [K, N], swapped, residual?, rms?,
        # rope kind) -> (layouts, Launchers)

    @property
    def partial(self) -> bool:
        """The kernel writes fp32 slices of K to a workspace (split-K), not the output."""
        return self.split_k > 1

    def gated_kernel(self, activation: str) -> bool:
        """Does the main kernel gate (GATED)? Under split-K it computes all 2N columns and the reduce kernel gates."""
        return activation in GATED and not self.partial

    def residual_kernel(self, residual: bool) -> bool:
        """Does the main kernel add the residual (RESIDUAL)? Under split-K the reduce kernel adds it."""
        return residual and not self.partial

    def rms_kernel(self, row_rms: bool) -> bool:
        """Does the main kernel scale by the rows' RMSNorm factors (ROW_RMS)? Under split-K the reduce kernel does."""
        return row_rms and not self.partial

    def tile_n(self, gated: bool, swap: bool) -> int:
        """The kernel's BLOCK_N: halved for a gated unswapped kernel (a gate tile and an up tile a stage; gated_tile_n)."""
        return gated_tile_n(self.block_n) if gated and not swap else self.block_n

    def layouts(self, dtype: str, out_dtype: str, b_kn: bool, swap: bool, gated: bool = False,
                rope: tuple = (0, False)) -> tuple:
        """(C's dtype, ((block shape, NVMMA shared layout) of the A, B and C descriptors), EPI_BUFFERS) of one
        specialization: C is the output, or under split-K the fp32 workspace. gated (the main kernel's GATED):
        unswapped, B's tiles are BLOCK_N / 2 wide (a gate tile and an up tile a stage). rope (rope_kind): a
        rotate-half epilogue stores slices at most half a head wide, each paired with its twin in the head's other
        half."""
        c_dtype = "float32" if self.partial else out_dtype
        epi_n, epi_bufs = self.epilogue_plan(c_dtype, gated, swap)
        if rope[0] and not rope[1]:
            epi_n = min(epi_n, rope[0] // 2)
        in_ty, c_ty = getattr(gl, dtype), getattr(gl, c_dtype)
        a_block = [self.block_m, self.block_k]
        block_n = self.tile_n(gated, swap)
        b_block = [self.block_k, block_n] if b_kn else [block_n, self.block_k]
        c_block = [epi_n, self.block_m] if swap else [self.block_m, epi_n]   # swapped: out^T's tiles land transposed
        # a CTA pair splits A's and C's rows between its CTAs, and B's N columns ([K, N]: dim 1; [N, K]: dim 0)
        by_rows = {"cga_layout": [[1, 0]]} if self.cta_pair else {}
        b_split = {"cga_layout": [[0, 1]] if b_kn else [[1, 0]]} if self.cta_pair else {}
        return c_dtype, ((a_block, gl.NVMMASharedLayout.get_default_for(a_block, in_ty, **by_rows)),
                         (b_block, gl.NVMMASharedLayout.get_default_for(b_block, in_ty, **b_split)),
                         (c_block, gl.NVMMASharedLayout.get_default_for(c_block, c_ty, **by_rows))), epi_bufs

    @property
    def options(self) -> dict:
        """Compile options besides the constexprs: a CTA pair is a cluster of two."""
        return {"num_ctas": 2} if self.cta_pair else {}

    def compile_jobs(self, case: dict) -> list:
        dtype, out_dtype = case["dtype"], case["out_dtype"]
        residual, row_rms = bool(case.get("residual")), bool(case.get("rms"))
        b_kn = case.get("b_layout", "kn") == "kn"
        swap = self.swap_ab and not b_kn
        gated = self.gated_kernel(case["activation"])
        rope = rope_case_kind(case)
        if rope[0] and rope not in self.rope_kinds:
            raise ValueError(f"this variant's epilogue rotates RoPE (head dim, interleaved) {self.rope_kinds}, not "
                             f"{rope} (the op sends such calls to another variant or torch); drop the case from its "
                             "compile cases")
        c_dtype, ((a_blk, a_lay), (b_blk, b_lay), (c_blk, c_lay)), epi_bufs = self.layouts(dtype, out_dtype, b_kn, swap,
                                                                                           gated, rope)
        ty, out_ty = TRITON_TY[dtype], TRITON_TY[out_dtype]
        signature = {
            "a_desc": f"tensordesc<{ty}{a_blk},{a_lay!r}>",
            "b_desc": f"tensordesc<{ty}{b_blk},{b_lay!r}>",
            "c_desc": f"tensordesc<{TRITON_TY[c_dtype]}{c_blk},{c_lay!r}>",
            "bias_ptr": f"*{ty}",  # the public API passes bias in the input dtype; any float dtype works
            "res_ptr": f"*{out_ty}",
            "rms_ptr": "*fp32",
            "cos_ptr": f"*{ty}", "sin_ptr": f"*{ty}",   # RoPE's tables (the op passes a model's: in its dtype)
            "M": "i32", "N": "i32", "K": "i32",
        }
        if self.split_k:
            signature["SPLITS"] = "i32"
        signature.update({"stride_rm": "i32", "rms_eps": "fp32", "rope_rows": "i32", "stride_cos": "i32",
                          "rope_cols": "i32"})
        constexprs = self.constexprs(case["bias"], case["activation"], b_kn, epi_bufs, swap, gated,
                                     self.residual_kernel(residual), self.rms_kernel(row_rms), rope)
        signature.update({k: "constexpr" for k in constexprs})
        jobs = [{"name": "gemm_kernel", "fn": self.kernel, "signature": signature, "constexprs": constexprs,
                 "options": {"num_warps": self.num_warps, **self.options}}]
        if self.partial:
            reduce_sig = {"part_ptr": "*fp32", "bias_ptr": f"*{ty}", "c_ptr": f"*{out_ty}", "res_ptr": f"*{out_ty}",
                          "rms_ptr": "*fp32", "M": "i32", "N": "i32", "M_PAD": "i32", "stride_cm": "i32",
                          "SPLITS": "i32", "stride_rm": "i32", "K": "i32", "rms_eps": "fp32"}
            reduce_consts = _reduce_constexprs(case["bias"], case["activation"], residual, row_rms)
            reduce_sig.update({k: "constexpr" for k in reduce_consts})
            jobs.append({"name": "splitk_reduce_kernel", "fn": self.reduce_kernel, "signature": reduce_sig,
                         "constexprs": reduce_consts, "options": {"num_warps": 4}})
        return jobs

    def _case(self, dtype, out_dtype, has_bias: bool, activation: str, b_kn: bool, swap: bool,
              residual: bool, row_rms: bool = False, rope: tuple = (0, False)) -> tuple:
        """(layouts, the kernel's Launcher, the reduce kernel's Launcher or None) of one specialization."""
        key = (dtype, out_dtype, has_bias, activation, b_kn, swap, residual, row_rms, rope)
        found = self._cases.get(key)
        if found is None:
            gated = self.gated_kernel(activation)
            _, layouts, epi_bufs = self.layouts(dtype_name(dtype), dtype_name(out_dtype), b_kn, swap, gated, rope)
            launcher = Launcher(self.kernel, {**self.constexprs(has_bias, activation, b_kn, epi_bufs, swap, gated,
                                                                self.residual_kernel(residual),
                                                                self.rms_kernel(row_rms), rope), **self.options})
            reduce = (Launcher(self.reduce_kernel, _reduce_constexprs(has_bias, activation, residual, row_rms))
                      if self.partial else None)
            found = self._cases[key] = (layouts, launcher, reduce)
        return found

    def plan(self, a, b, bias, out, activation: str, num_sms: int, residual=None, rms=None, rope=None) -> GemmPlan:
        """Raises ValueError when b is neither memory order or TMA cannot address these strides. residual: None, or
        [M, N] in out's dtype with unit column stride (its row stride is part of the shape class); rms: None, or
        (the rows' fp32 L2 norms [M], eps), of which only the presence is part of the plan; rope: None, or (cos [P,
        D], sin [P, D], columns, interleaved) with (D, interleaved) one of rope_kinds, the tables' shape, row stride
        and the columns part of the plan."""
        kind = rope_kind(rope)
        if kind[0] and kind not in self.rope_kinds:
            raise ValueError(f"this variant's epilogue rotates RoPE (head dim, interleaved) {self.rope_kinds}, not "
                             f"{kind}; call generated.gemm.linear(..., rope=...), which picks one that does or torch")
        if kind[0]:
            check_tables(rope[0], rope[1], a.dtype)
        M, K = a.shape
        N = out.shape[1]   # the output's columns (b has 2N under a gated activation)
        layout = b_layout(b)
        if not layout:
            raise ValueError(f"b {tuple(b.shape)} with strides {b.stride()} is neither [K, N] row-major nor the "
                             "transpose of a row-major [N, K] weight; pass b.contiguous()")
        p = GemmPlan()
        p.b_kn = layout == "kn"
        b_mem = b if p.b_kn else b.t()  # the tensor as stored: [K, N] or [N, K], unit stride last
        if not tma_compatible(a, b_mem, out):
            raise ValueError("TMA needs 16-byte aligned bases and row strides; use the triton variant for this shape")
        if residual is not None and (residual.shape != out.shape or residual.dtype != out.dtype
                                     or residual.stride(1) != 1):
            raise ValueError(f"residual {tuple(residual.shape)} {residual.dtype} with strides {residual.stride()}: "
                             f"needs the output's shape {tuple(out.shape)} and dtype {out.dtype}, unit column stride")
        p.swap = self.swap_ab and not p.b_kn
        p.layouts, p.launcher, p.reduce = self._case(a.dtype, out.dtype, bias is not None, activation, p.b_kn,
                                                     p.swap, residual is not None, rms is not None, kind)
        p.rope_args = (rope[0].shape[0], rope[0].stride(0), rope[2]) if kind[0] else (1, 0, 0)
        stride_rm = residual.stride(0) if residual is not None else 0
        first, second = (b_mem, a) if p.swap else (a, b_mem)   # the kernel's A and B operands
        # the columns the kernel computes: the output's, or under split-K all of b's (its reduce kernel gates)
        kernel_cols = b.shape[1] if self.partial else N
        kernel_m, kernel_n = (kernel_cols, M) if p.swap else (M, kernel_cols)
        tiles = -(-kernel_m // self.block_m) * -(-kernel_n // self.tile_n(self.gated_kernel(activation), p.swap))
        splits = split_count(self.split_k, self.block_k, tiles, K, num_sms) if self.partial else 1
        # persistent: <= 1 CTA/SM walking a static tile order (a CTA pair: <= 1 cluster per 2 SMs); dynamic: one
        # per work item, the running ones taking over the rest
        programs = num_sms // 2 if self.cta_pair else num_sms
        p.grid = (max(1, tiles * splits if self.dynamic_schedule else min(programs, tiles * splits)),)
        p.device = a.device.index or 0
        # boxes as plain tuples: the launcher keys its cached tensor maps on them every call
        p.a_box = (tuple(first.shape), tuple(first.stride()))
        p.b_box = (tuple(second.shape), tuple(second.stride()))
        p.c_box = (tuple(out.shape), tuple(out.stride()))
        p.dims = (kernel_m, kernel_n, K) + ((splits,) if self.split_k else ()) + (stride_rm,)
        p.workspace = None
        if self.partial:
            if kernel_cols % 4:
                raise ValueError("split-K's fp32 workspace rows need N % 4 == 0 for TMA; use another variant")
            m_pad = -(-M // self.block_m) * self.block_m   # each slice owns M_pad rows: tiles never straddle slices
            p.workspace = (splits * m_pad, kernel_cols)
            p.c_box = (p.workspace, (kernel_cols, 1))
            rows, cols = REDUCE_TILE
            p.reduce_grid = (-(-M // rows), -(-N // cols))
            p.reduce_args = (M, N, m_pad, out.stride(0), splits, stride_rm, K)
        return p

    @staticmethod
    def run(p: GemmPlan, a, b, bias, out, residual=None, rms=None, rope=None) -> None:
        """Launch a plan on tensors of its shape class whose base pointers are 16-byte aligned (the caller checked).
        A descriptor reads only its base's address per call (shape and strides are the plan's boxes), so b goes in as
        given: the [K, N] view of an [N, K] weight has the weight's address, and no transposed view is built per
        call."""
        first, second = (b, a) if p.swap else (a, b)   # swapped: the weight is the kernel's A, the call's rows its B
        # Without bias the pointer is never read (HAS_BIAS is constexpr); pass a valid tensor to keep the signature.
        bias_arg = bias if bias is not None else out
        res_arg = residual if residual is not None else out   # likewise never read without RESIDUAL
        rms_arg, eps = rms if rms is not None else (out, 0.0)   # and without ROW_RMS
        cos, sin = (rope[0], rope[1]) if rope is not None else (out, out)   # and without ROPE
        c = out if p.workspace is None else torch.empty(p.workspace, device=out.device, dtype=torch.float32)
        p.launcher(p.grid, p.device,
                   (TmaDescriptor(first, *p.a_box), TmaDescriptor(second, *p.b_box), TmaDescriptor(c, *p.c_box),
                    bias_arg, res_arg, rms_arg, cos, sin) + p.dims + (eps,) + p.rope_args,
                   lambda: _compile_args(p, a, b, bias_arg, res_arg, rms_arg, cos, sin, eps, c))
        if p.workspace is not None:
            args = (c, bias_arg, out, res_arg, rms_arg) + p.reduce_args + (eps,)
            p.reduce(p.reduce_grid, p.device, args, lambda: args)

    def launch(self, a, b, bias, out, activation: str, num_sms: int, residual=None, rms=None, rope=None) -> None:
        """out = act(a @ b + bias) [+ residual] (act(rmsnorm(a) @ b + bias) ... with rms = (the rows' fp32 L2 norms,
        eps)), checked and planned for this one call."""
        self.run(self.plan(a, b, bias, out, activation, num_sms, residual, rms, rope), a, b, bias, out, residual, rms,
                 rope)


def _reduce_constexprs(has_bias: bool, activation: str, residual: bool = False, row_rms: bool = False) -> dict:
    return {"HAS_BIAS": bool(has_bias), "ACTIVATION": activation, "GATED": activation in GATED,
            "RESIDUAL": bool(residual), "ROW_RMS": bool(row_rms), "REDUCE_M": REDUCE_TILE[0], "REDUCE_N": REDUCE_TILE[1], "num_warps": 4}


def _compile_args(p: GemmPlan, a, b, bias_arg, res_arg, rms_arg, cos, sin, eps, out) -> tuple:
    """The launch arguments with Triton's own descriptors over the tensors as stored (the first call of a key);
    `out` is the workspace under split-K."""
    b_mem = b if p.b_kn else b.t()
    first, second = (b_mem, a) if p.swap else (a, b_mem)
    return (TensorDescriptor.from_tensor(first, *p.layouts[0]), TensorDescriptor.from_tensor(second, *p.layouts[1]),
            TensorDescriptor.from_tensor(out, *p.layouts[2]), bias_arg, res_arg, rms_arg, cos, sin) + p.dims + (eps,) \
        + p.rope_args
