"""The simulated `triton.experimental.gluon` namespaces (gluon, gl, nvidia.hopper, nvidia.blackwell, ...).

Dtypes and layout classes are the real Triton objects; every builtin is replaced by a CPU implementation.
"""
from __future__ import annotations

import builtins
import functools
import inspect
import random
import types

import torch
import triton
import triton.experimental as _texp
import triton.language.core as tlc
from triton.experimental.gluon.language import _layouts as _real_layouts
from triton.experimental.gluon.language.nvidia import blackwell as _real_bw
from triton.experimental.gluon.language.nvidia.ampere.mbarrier import MBarrierLayout
from triton.experimental.gluon.language.nvidia.hopper import tma as _real_tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from . import _runtime as rt
from . import _tensor as T
from ._dtypes import unwrap
from ._memory import SmemDesc, TmemDesc
from ._tensor import PtrTensor, Tensor
from .errors import SimulationError

_DTYPE_NAMES = ["void", "int1", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                "float8e5", "float8e5b16", "float8e4nv", "float8e4b8", "float8e4b15", "float16", "bfloat16",
                "float32", "float64"]
_LAYOUT_NAMES = ["AutoLayout", "BlockedLayout", "SliceLayout", "DistributedLinearLayout", "DotOperandLayout",
                 "NVMMADistributedLayout", "NVMMASharedLayout", "SwizzledSharedLayout", "PaddedSharedLayout",
                 "SharedLinearLayout", "CoalescedLayout", "DistributedLayout", "SharedLayout"]


class constexpr:
    """`gl.constexpr(v)` is just `v` in the simulator (constexprs are plain Python values)."""

    def __new__(cls, value=None):
        return unwrap(value)


def _is_constexpr_annotation(ann):
    if ann is constexpr or ann is tlc.constexpr:
        return True
    return isinstance(ann, str) and ann.split(".")[-1] == "constexpr"


def static_range(arg1, arg2=None, step=None, **kwargs):
    for v in (arg1, arg2, step):
        if isinstance(v, Tensor):
            raise SimulationError(f"gl.static_range needs constexpr bounds, got the runtime value {v!r}")
    a = int(unwrap(arg1))
    if arg2 is None:
        return builtins.range(a)
    b = int(unwrap(arg2))
    return builtins.range(a, b, 1 if step is None else int(unwrap(step)))


def sim_range(*args, **kwargs):
    """`range` inside simulated modules: Triton loop counters are i32 tensors when a bound is a tensor."""
    args = [unwrap(a) for a in args]
    if not any(isinstance(a, Tensor) for a in args):
        return builtins.range(*args)
    dt = tlc.int64 if any(isinstance(a, Tensor) and a.dtype == tlc.int64 for a in args) else tlc.int32
    tdt = torch.int64 if dt == tlc.int64 else torch.int32
    ints = [int(a) for a in args]

    def gen():
        for i in builtins.range(*ints):
            yield Tensor(torch.tensor(i, dtype=tdt), dt)
    return gen()


def _identity_decorator(fn=None, *args, **kwargs):
    if fn is None or not callable(fn):
        return lambda f: f
    return fn


def _constexpr_function(fn=None, *args, **kwargs):
    """gluon.constexpr_function: the function itself, marked so that kernels may reach it as a global."""
    if fn is None or not callable(fn):
        return _constexpr_function
    fn.__sim_constexpr_function__ = True
    return fn


def _ns(name, **attrs):
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    return m


def _cdiv(x, div):
    return (x + div - 1) // div


def _map_elementwise(scalar_fn, *args, pack=1, **kw):
    return scalar_fn(*args)


def _dot_fma(a, b, acc):
    r = a.t.to(torch.float32) @ b.t.to(torch.float32) + acc.t.to(torch.float32)
    return Tensor(r.to(acc.t.dtype), acc.dtype, acc.layout)


def _mma_v2(a, b, acc, input_precision=None):
    return _dot_fma(a, b, acc)


def _static_assert(cond, msg=""):
    if not unwrap(cond):
        raise SimulationError(f"static_assert failed: {msg}")


def _static_print(*values, sep=" ", end="\n", file=None, flush=False):
    print(*values, sep=sep, end=end, file=file, flush=flush)


def _add(x, y, sanitize_overflow=True):
    return x + y


def _sub(x, y, sanitize_overflow=True):
    return x - y


def _mul(x, y, sanitize_overflow=True):
    return x * y


def _passthrough(x, *a, **k):
    return x


def _assume(cond):
    return None


def _math(name):
    def f(x):
        return T.unary_math(x, name)
    f.__name__ = name
    return f


def _abs(x):
    return T.abs_(x)


def build(ctx):
    """Build the simulated namespaces for one loaded module (`ctx` carries seed, smem budget, launch count)."""
    NM = rt._not_modelled

    def jit(fn=None, **kwargs):
        if fn is None:
            return lambda f: SimJITFunction(f, ctx)
        if isinstance(fn, SimJITFunction):
            return fn
        return SimJITFunction(fn, ctx)

    gl = _ns("triton.experimental.gluon.language")
    for n in _DTYPE_NAMES:
        setattr(gl, n, getattr(tlc, n))
    for n in _LAYOUT_NAMES:
        setattr(gl, n, getattr(_real_layouts, n))
    from triton.experimental.gluon.language import _core as _real_core
    gl.__dict__.update(
        constexpr=constexpr, dtype=tlc.dtype, pointer_type=tlc.pointer_type, block_type=tlc.block_type,
        base_value=tlc.base_value, base_type=tlc.base_type, tuple=builtins.tuple, tuple_type=tlc.tuple_type,
        distributed_type=_real_core.distributed_type, shared_memory_descriptor_type=_real_core.shared_memory_descriptor_type,
        tensor=Tensor, shared_memory_descriptor=SmemDesc, _unwrap_if_constexpr=unwrap,
        # creation / shape
        arange=T.arange, full=T.full, zeros=T.zeros, full_like=T.full_like, zeros_like=T.zeros_like,
        expand_dims=T.expand_dims, broadcast=T.broadcast, reshape=T.reshape, permute=T.permute, join=T.join,
        split=T.split, ravel=T.ravel, convert_layout=T.convert_layout, set_auto_layout=T.set_auto_layout,
        cast=T.cast, to_tensor=T.to_tensor, where=T.where, maximum=T.maximum, minimum=T.minimum,
        add=_add, sub=_sub, mul=_mul, gather=T.gather, histogram=T.histogram,
        associative_scan=T.associative_scan, reduce=T.reduce_, sum=T.sum_, max=T.max_, min=T.min_,
        xor_sum=T.xor_sum, reduce_or=T.reduce_or, cdiv=_cdiv, map_elementwise=_map_elementwise,
        dot_fma=_dot_fma,
        # math
        exp=_math("exp"), exp2=_math("exp2"), log=_math("log"), log2=_math("log2"), cos=_math("cos"),
        sin=_math("sin"), sqrt=_math("sqrt"), sqrt_rn=_math("sqrt_rn"), rsqrt=_math("rsqrt"), erf=_math("erf"),
        floor=_math("floor"), ceil=_math("ceil"), abs=_abs, fma=T.fma, fdiv=T.fdiv, div_rn=T.div_rn,
        umulhi=T.umulhi,
        # hints / debugging
        multiple_of=_passthrough, max_contiguous=_passthrough, max_constancy=_passthrough, assume=_assume,
        static_assert=_static_assert, static_print=_static_print, device_assert=rt.device_assert,
        device_print=rt.device_print, static_range=static_range,
        inline_asm_elementwise=rt.inline_asm_elementwise, fp4_to_fp=NM("gl.fp4_to_fp"),
        bank_conflicts=NM("gl.bank_conflicts"), to_linear_layout=NM("gl.to_linear_layout"),
        # memory / program
        load=rt.load, store=rt.store, atomic_add=rt.atomic_add, atomic_max=rt.atomic_max,
        atomic_min=rt.atomic_min, atomic_xchg=rt.atomic_xchg, atomic_and=rt.atomic_and, atomic_or=rt.atomic_or,
        atomic_xor=rt.atomic_xor, atomic_cas=rt.atomic_cas,
        allocate_shared_memory=rt.allocate_shared_memory, program_id=rt.program_id,
        num_programs=rt.num_programs, num_warps=rt.num_warps, num_ctas=rt.num_ctas,
        thread_barrier=rt.thread_barrier, warp_specialize=rt.warp_specialize,
    )

    mbarrier = _ns("triton.experimental.gluon.language.nvidia.hopper.mbarrier", MBarrierLayout=MBarrierLayout,
                   init=rt.mbarrier_init, invalidate=rt.mbarrier_invalidate, expect=rt.mbarrier_expect,
                   arrive=rt.mbarrier_arrive, wait=rt.mbarrier_wait)
    tma = _ns("triton.experimental.gluon.language.nvidia.hopper.tma",
              async_copy_global_to_shared=rt.async_copy_global_to_shared,
              async_copy_shared_to_global=rt.async_copy_shared_to_global, store_wait=rt.store_wait,
              make_tensor_descriptor=rt.make_tensor_descriptor, tensor_descriptor=rt.DeviceDesc,
              tensor_descriptor_type=_real_tma.tensor_descriptor_type)
    bw_tma = _ns("triton.experimental.gluon.language.nvidia.blackwell.tma", **{
        k: v for k, v in tma.__dict__.items() if not k.startswith("__")})
    bw_tma.async_gather = NM("tma.async_gather")
    bw_tma.async_scatter = NM("tma.async_scatter")
    async_copy = _ns("triton.experimental.gluon.language.nvidia.ampere.async_copy",
                     async_copy_global_to_shared=NM("async_copy.async_copy_global_to_shared"),
                     mbarrier_arrive=NM("async_copy.mbarrier_arrive"), commit_group=NM("async_copy.commit_group"),
                     wait_group=NM("async_copy.wait_group"))
    ampere = _ns("triton.experimental.gluon.language.nvidia.ampere", async_copy=async_copy, mbarrier=mbarrier,
                 mma_v2=_mma_v2)
    hopper = _ns("triton.experimental.gluon.language.nvidia.hopper", fence_async_shared=rt.fence_async_shared,
                 mbarrier=mbarrier, tma=tma, async_copy=async_copy, mma_v2=_mma_v2,
                 warpgroup_mma=rt.warpgroup_mma, warpgroup_mma_wait=rt.warpgroup_mma_wait,
                 warpgroup_mma_init=rt.warpgroup_mma_init, warpgroup_mma_accumulator=rt.WgmmaToken)
    # cluster launch control (Blackwell, triton >= 3.8): offered whatever the installed Triton, so that a module
    # rendered for a newer release runs here too
    clc = _ns("triton.experimental.gluon.language.nvidia.blackwell.clc", try_cancel=rt.clc_try_cancel,
              load_result=rt.clc_load_result, clc_result=rt.ClcResult)
    blackwell = _ns("triton.experimental.gluon.language.nvidia.blackwell",
                    TensorMemoryLayout=_real_bw.TensorMemoryLayout,
                    TensorMemoryScalesLayout=_real_bw.TensorMemoryScalesLayout,
                    # only where this Triton has it (gone in 3.8, whose descriptor type gives the layout): the
                    # shipped modules' compat layer picks its spelling by what the namespace holds, as on hardware
                    **({"get_tmem_reg_layout": _real_bw.get_tmem_reg_layout}
                       if hasattr(_real_bw, "get_tmem_reg_layout") else {}),
                    allocate_tensor_memory=rt.allocate_tensor_memory, tensor_memory_descriptor=TmemDesc,
                    tensor_memory_descriptor_type=_real_bw.tensor_memory_descriptor_type,
                    tcgen05_mma=rt.tcgen05_mma, tcgen05_commit=rt.tcgen05_commit, tcgen05_copy=rt.tcgen05_copy,
                    tcgen05_mma_scaled=NM("tcgen05_mma_scaled"), fence_async_shared=rt.fence_async_shared,
                    mbarrier=mbarrier, tma=bw_tma, async_copy=async_copy, mma_v2=_mma_v2,
                    float2=_ns("triton.experimental.gluon.language.nvidia.blackwell.float2"),
                    clc=clc)
    lang_nvidia = _ns("triton.experimental.gluon.language.nvidia", hopper=hopper, blackwell=blackwell, ampere=ampere)
    gl.nvidia = lang_nvidia
    host_hopper = _ns("triton.experimental.gluon.nvidia.hopper", TensorDescriptor=TensorDescriptor)
    host_bw = _ns("triton.experimental.gluon.nvidia.blackwell", TensorDescriptor=TensorDescriptor)
    host_nvidia = _ns("triton.experimental.gluon.nvidia", hopper=host_hopper, blackwell=host_bw)
    gluon = _ns("triton.experimental.gluon", jit=jit, constexpr_function=_constexpr_function,
                must_use_result=_identity_decorator, language=gl, nvidia=host_nvidia)
    mods = {
        "triton.experimental.gluon": gluon,
        "triton.experimental.gluon.language": gl,
        "triton.experimental.gluon.language.nvidia": lang_nvidia,
        "triton.experimental.gluon.language.nvidia.hopper": hopper,
        "triton.experimental.gluon.language.nvidia.hopper.tma": tma,
        "triton.experimental.gluon.language.nvidia.hopper.mbarrier": mbarrier,
        "triton.experimental.gluon.language.nvidia.blackwell": blackwell,
        "triton.experimental.gluon.language.nvidia.blackwell.tma": bw_tma,
        "triton.experimental.gluon.language.nvidia.blackwell.clc": clc,
        "triton.experimental.gluon.language.nvidia.ampere": ampere,
        "triton.experimental.gluon.language.nvidia.ampere.mbarrier": mbarrier,
        "triton.experimental.gluon.language.nvidia.ampere.async_copy": async_copy,
        "triton.experimental.gluon.nvidia": host_nvidia,
        "triton.experimental.gluon.nvidia.hopper": host_hopper,
        "triton.experimental.gluon.nvidia.blackwell": host_bw,
    }
    return mods


class _Proxy(types.ModuleType):
    """A module that forwards to a real one except for a few overridden attributes."""

    def __init__(self, name, real, **overrides):
        super().__init__(name)
        object.__setattr__(self, "_real", real)
        self.__dict__.update(overrides)

    def __getattr__(self, name):
        return getattr(object.__getattribute__(self, "_real"), name)


def make_builtins(mods):
    exp_proxy = _Proxy("triton.experimental", _texp, gluon=mods["triton.experimental.gluon"])
    triton_proxy = _Proxy("triton", triton, experimental=exp_proxy)
    real_import = builtins.__import__

    def sim_import(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and (name == "triton" or name.startswith("triton.")):
            if name in mods:
                mod = mods[name]
            elif name == "triton":
                mod = triton_proxy
            elif name == "triton.experimental":
                mod = exp_proxy
            else:
                real = real_import(name, globals, locals, fromlist, level)
                return real if fromlist else triton_proxy
            return mod if fromlist else triton_proxy
        return real_import(name, globals, locals, fromlist, level)

    b = dict(builtins.__dict__)
    b["__import__"] = sim_import
    b["range"] = sim_range
    return b


# ====================================================================================== jit / launch

def _convert_arg(name, v):
    v = unwrap(v)
    if isinstance(v, torch.Tensor):
        if v.device.type != "cpu":
            raise SimulationError(f"argument `{name}` is on {v.device}; the simulator runs on CPU tensors")
        return PtrTensor.from_torch(v, name)
    if isinstance(v, TensorDescriptor) or (hasattr(v, "block_shape") and hasattr(v, "base")
                                           and hasattr(v, "layout")):
        if isinstance(v.base, torch.Tensor) and v.base.device.type != "cpu":
            raise SimulationError(f"descriptor `{name}` is over a {v.base.device} tensor; use CPU tensors")
        return rt.DeviceDesc.from_host(v, name)
    if isinstance(v, bool):
        return Tensor(torch.tensor(v), tlc.int1)
    if isinstance(v, int):
        dt = tlc.int32 if -2**31 <= v < 2**31 else tlc.int64
        return Tensor(torch.tensor(v, dtype=torch.int32 if dt == tlc.int32 else torch.int64), dt)
    if isinstance(v, float):
        return Tensor(torch.tensor(v, dtype=torch.float32), tlc.float32)
    return v


def _loaded_globals(code) -> set:
    """The global names a function's code (and the code nested in it) loads."""
    import dis

    names = {ins.argval for ins in dis.get_instructions(code) if ins.opname == "LOAD_GLOBAL"}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _loaded_globals(const)
    return names


def _triton_accepts_global(val) -> bool:
    if isinstance(val, (types.ModuleType, SimJITFunction, tlc.dtype)):
        return True
    if getattr(val, "__triton_builtin__", False) or getattr(val, "__triton_aggregate__", False):
        return True
    if getattr(val, "__sim_constexpr_function__", False):
        return True
    if isinstance(val, tuple) and hasattr(val, "_fields"):   # a namedtuple
        return True
    module = getattr(val, "__module__", None) or ""
    return module.startswith(("triton.language", "triton.experimental.gluon.language"))


class SimJITFunction:
    """What `@gluon.jit` returns under the simulator: callable inside kernels, `[grid](...)` launches on CPU."""

    def __init__(self, fn, ctx):
        self.fn = fn
        self.ctx = ctx
        functools.update_wrapper(self, fn)
        self.signature = inspect.signature(fn)
        self.constexprs = {n for n, p in self.signature.parameters.items()
                           if _is_constexpr_annotation(p.annotation)}

        self.globals_checked = False

    def check_globals(self):
        """Triton's rule for the globals a kernel reads (code_generator's global_lookup): modules, jit functions,
        Triton builtins, dtypes and layouts, aggregates and constexpr_functions, and values made with
        `gl.constexpr(...)`; any other global (an int, a list, a config dict) fails the compile, so it fails here."""
        if self.globals_checked:
            return
        scope = self.fn.__globals__
        allowed_names = scope.get("__sim_constexpr_globals__", frozenset())
        exposed = scope.get("__sim_namespace_ids__", frozenset())
        for name in sorted(_loaded_globals(self.fn.__code__)):
            if name not in scope:
                continue   # a Python builtin (range, min, ...) or undefined: Triton's builtin lookup decides
            val = scope[name]
            if name in allowed_names or id(val) in exposed or _triton_accepts_global(val):
                continue
            raise SimulationError(
                f"`{self.fn.__name__}` reads the global `{name}` ({type(val).__name__}): Triton kernels can only "
                "access global variables that are instantiated as constexpr (`x = gl.constexpr(42)`), modules, jit "
                "functions and Triton builtins; the real compile fails with \"Cannot access global variable "
                f"{name} from within @jit'ed function\"")
        self.globals_checked = True

    def __call__(self, *args, **kwargs):
        self.check_globals()
        return self.fn(*args, **kwargs)

    def __getitem__(self, grid):
        return functools.partial(self.ctx.launch, self, grid)

    def run(self, *args, grid, warmup=False, **kwargs):
        return self.ctx.launch(self, grid, *args, **kwargs)

    def __repr__(self):
        return f"SimJITFunction({self.fn.__name__})"


class SimContext:
    def __init__(self, seed=0, smem_limit=None, late=False):
        self.seed = seed
        self.smem_limit = smem_limit
        self.late = late   # asynchronous operations complete only when no partition can run (load_module)
        self.launches = 0
        self.last_programs = []  # stats of the last launch (per program: peak smem, the pids it took over)

    def launch(self, kernel, grid, *args, **kwargs):
        kernel.check_globals()
        params = kernel.signature.parameters
        opts = {k: v for k, v in kwargs.items() if k not in params}
        call = {k: v for k, v in kwargs.items() if k in params}
        num_warps = int(unwrap(opts.get("num_warps", call.get("num_warps", 4))))
        if "num_warps" in params and "num_warps" not in call:
            names = list(params)
            if names.index("num_warps") >= len(args):
                call["num_warps"] = num_warps
        bound = kernel.signature.bind(*args, **call)
        bound.apply_defaults()
        raw = dict(bound.arguments)
        if callable(grid):
            meta = dict(raw)
            meta.update(opts)
            grid = grid(meta)
        grid = [int(unwrap(g)) for g in (grid if isinstance(grid, (tuple, list)) else (grid,))]
        grid = (grid + [1, 1, 1])[:3]
        conv = {}
        for name, val in raw.items():
            conv[name] = unwrap(val) if name in kernel.constexprs else _convert_arg(name, val)
        self.launches += 1
        stats = []
        # Tile-sized torch ops are far slower with intra-op (OpenMP) parallelism than without, especially from
        # the partition threads: run launches single-threaded and restore the setting afterwards.
        old_threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            self._run_grid(kernel, grid, conv, num_warps, stats)
        finally:
            torch.set_num_threads(old_threads)
        self.last_programs = stats

    def _run_grid(self, kernel, grid, conv, num_warps, stats):
        # Programs start in launch order; one that a running program took over (clc.try_cancel) never starts.
        queue = rt.LaunchQueue(grid)
        while (pid := queue.next_program()) is not None:
            rng = random.Random(hash((self.seed, self.launches, pid)))
            prog = rt.Program(kernel.fn.__name__, pid, tuple(grid), rng, self.smem_limit, num_warps,
                              queue=queue, **({"p_complete": 0.0} if self.late else {}))
            prog.run(_bind(kernel.fn, conv), ())
            stats.append({"pid": pid, "peak_smem": prog.peak_smem, "took_over": list(prog.took_over)})


def _bind(fn, kwargs):
    def call():
        return fn(**kwargs)
    call.__name__ = fn.__name__
    return call

