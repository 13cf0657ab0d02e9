"""Launch a compiled Triton/Gluon kernel directly, as Inductor's generated wrappers do.

`fn[grid](*args)` runs Triton's binder on every call: it binds and specializes every argument, hashes the result
and looks the kernel up (about 50-110 us of host time per launch, measured on an H200 host). A generated op already
knows what the binder would find: its case (dtypes, mod or epilogue) fixes the constexprs and descriptor types, and
the only run-time properties Triton specializes on are pointer alignment and the ints it may specialize (== 1,
% 16 == 0; the Gluon kernels mark their shape ints do_not_specialize). So a `Launcher` holds one compiled kernel
per such key, has Triton compile it (or read Triton's cache, which the bundled binaries seed) on the first call
with that key, and afterwards calls the kernel's C launcher with the arguments in order.

Descriptor arguments: Triton's launcher encodes a CUtensorMap for each one on every call (a Python wrapper around
cuTensorMapEncodeTiled). A tensor map depends only on the base address, shape and strides, so `DirectLaunch` keeps the
maps it has encoded (built by Triton's own `make_tensordesc_arg`) per (address, shape, strides) and calls the C
launch function with them; weights and the caching allocator's reused blocks hit every time. Where a Triton version's
launcher is not shaped as 3.6's (3.7 and later pass the C launch function other arguments), or a kernel needs scratch
memory, the kernel's own `run` is used.

Not done on this path: Triton's launch hooks (`knobs.runtime.launch_enter_hook`, used by proton) are not called,
and the used-globals check runs only at compile time. Set GEN_TRITON_BINDER=1 to launch through `fn[grid]` instead.
"""
from __future__ import annotations

import os
import weakref

import torch

USE_BINDER = os.environ.get("GEN_TRITON_BINDER") == "1"
# Compile options every generated kernel is built with, at run time and by gen's gates alike. FP fusion (FMA
# contraction) is what the kernels were verified and timed with; Triton 3.9 warns that its default turns it off in
# 3.10, so it is asked for rather than left to the release's default.
COMPILE_OPTIONS = {"enable_fp_fusion": True}
USE_DIRECT = os.environ.get("GEN_TENSORMAP_CACHE", "1") == "1"   # 0: every launch through kernel.run


class TmaDescriptor:
    """What Triton's launcher reads off a host-side tensor descriptor (base, shape, strides, padding).

    Gluon's `TensorDescriptor` re-validates block shape, dtype and alignment in `__post_init__` on every
    construction; the generated op checks alignment once per call itself (its TMA check), so the per-call
    descriptor is this plain record. The first call of a key still builds real `TensorDescriptor`s for the
    compile (the binder reads their block type and layout)."""

    __slots__ = ("base", "shape", "strides", "padding")
    # read by the launchers of triton >= 3.7 (make_tensordesc_arg): the defaults a TensorDescriptor has
    round_f32_to_tf32 = False
    element_strides = None

    def __init__(self, base: torch.Tensor, shape, strides):
        self.base = base
        self.shape = shape
        self.strides = strides
        self.padding = "zero"


def current_stream(device_index: int) -> int:
    return torch._C._cuda_getCurrentRawStream(device_index)


_LAUNCHERS: "weakref.WeakSet[Launcher]" = weakref.WeakSet()


def forget_compiled() -> None:
    """Drop every launcher's compiled kernels, so the next call of each asks Triton again (tests that swap
    Triton's driver or cache use this, as they clear the JIT's own `device_caches`)."""
    for launcher in list(_LAUNCHERS):
        launcher._kernels.clear()
        launcher._direct_tried.clear()


class DirectLaunch:
    """One compiled kernel's C launch with its descriptor arguments' tensor maps cached (see the module docstring).
    `DirectLaunch.of(kernel)` is None where the launcher is not the shape this reads (then use kernel.run)."""

    MAX_MAPS = 256   # distinct (address, shape, strides) kept; a full cache is cleared, not grown

    def __init__(self, kernel, c_launch, desc_meta: dict, make_arg):
        run = kernel.run
        self.kernel = kernel
        self._c_launch = c_launch
        self._head = (kernel.function, run.launch_cooperative_grid, run.launch_pdl, None, None,
                      kernel.packed_metadata, None, None, None)
        self._desc_meta = desc_meta          # argument index -> Triton's tensordesc metadata
        self._make_arg = make_arg
        self._maps: dict = {}

    @classmethod
    def of(cls, kernel):
        run = getattr(kernel, "run", None)
        if getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1):
            return None                      # scratch is allocated per launch by kernel.run
        if hasattr(run, "arg_annotations"):  # triton >= 3.7: its C launch takes other arguments (annotations, the
            return None                      # signature, the kernel arguments as one tuple); kernel.run calls it
        launch = getattr(run, "launch", None)
        code, cells = getattr(launch, "__code__", None), getattr(launch, "__closure__", None)
        if code is None or not cells:        # no descriptor arguments: `launch` is the C function itself
            return cls(kernel, launch, {}, None) if callable(launch) else None
        free = dict(zip(code.co_freevars, (c.cell_contents for c in cells)))
        try:
            from triton.backends.nvidia.driver import make_tensordesc_arg
        except ImportError:
            return None
        if set(free) != {"launcher", "tensordesc_indices", "tensordesc_meta"} or None in free["tensordesc_meta"]:
            return None
        meta = dict(zip(sorted(free["tensordesc_indices"]), free["tensordesc_meta"]))
        return cls(kernel, free["launcher"], meta, make_tensordesc_arg)

    def _expand(self, i: int, desc) -> list:
        key = (i, desc.base.data_ptr(), tuple(desc.shape), tuple(desc.strides))
        found = self._maps.get(key)
        if found is None:
            if len(self._maps) >= self.MAX_MAPS:
                self._maps.clear()
            found = self._maps[key] = self._make_arg(desc, self._desc_meta[i])
        return found

    def __call__(self, grid: tuple, stream: int, args: tuple, tail: tuple) -> None:
        final = []
        for i, a in enumerate(args):
            if i in self._desc_meta:
                final.extend(self._expand(i, a))
            else:
                final.append(a)
        self._c_launch(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, stream,
                       *self._head, *final, *tail)


class Launcher:
    """One kernel at one case: `constants` are its constexpr arguments and compile options (num_warps, ...);
    every other parameter is passed positionally per call, in the kernel's parameter order."""

    def __init__(self, fn, constants: dict):
        self.fn = fn
        self.constants = {**COMPILE_OPTIONS, **constants}
        self._kernels: dict = {}
        # Anything else launched as fn[grid](...) (gen's Gluon simulator runs the same modules on CPU) goes through
        # its own launch: only Triton's JITFunction has the compiled-kernel path.
        self._direct = hasattr(fn, "warmup") and hasattr(fn, "params")
        if not self._direct:
            return
        names = list(fn.arg_names)
        runtime = [n for n in names if n not in self.constants]
        if names[:len(runtime)] != runtime:
            raise ValueError(f"{fn.__name__}: constexpr parameters must follow the run-time ones, got {names}")
        self._tail = tuple(self.constants[n] for n in names[len(runtime):])  # constexprs, passed last (the C launcher skips them)
        self._params = fn.params[:len(runtime)]
        self._pointer_args: tuple = ()   # indices of tensor arguments (alignment-specialized), set on first call
        self._int_args: tuple = ()       # indices of specializable int arguments
        self._direct_tried: set = set()  # keys whose kernel was offered to DirectLaunch
        _LAUNCHERS.add(self)

    def _key(self, args) -> tuple:
        return (tuple(args[i].data_ptr() % 16 == 0 for i in self._pointer_args),
                tuple((args[i] == 1, args[i] % 16 == 0) for i in self._int_args))

    def _compile(self, grid, compile_args):
        if not self._kernels:  # first call: which arguments Triton specializes, from their kinds
            params = list(enumerate(self._params))
            self._pointer_args = tuple(i for i, p in params if isinstance(compile_args[i], torch.Tensor)
                                       and not p.do_not_specialize_on_alignment)
            self._int_args = tuple(i for i, p in params if type(compile_args[i]) is int and not p.do_not_specialize)
        kernel = self.fn.warmup(*compile_args, grid=grid, **self.constants)  # compiles or reads the cache; no launch
        if kernel is None:  # a JIT cache hook skipped the compile (gen's bundle capture does): nothing to launch
            return None
        if hasattr(kernel, "result"):  # Triton's async compile mode returns a future
            kernel = kernel.result()
        self._kernels[self._key(compile_args)] = kernel
        return kernel

    @staticmethod
    def launch_compiled(kernel, grid: tuple, device_index: int, args: tuple, tail: tuple) -> None:
        if type(kernel) is DirectLaunch:
            kernel(grid, current_stream(device_index), args, tail)
            return
        kernel._init_handles()  # loads the module on first use (a no-op afterwards)
        kernel.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1,
                   current_stream(device_index), kernel.function, kernel.packed_metadata, None, None, None,
                   *args, *tail)

    def __call__(self, grid: tuple, device_index: int, args: tuple, compile_args) -> None:
        """Launch on the current stream of `device_index`. `compile_args()` gives the same arguments with real
        Triton descriptors; it is called only when this key has no compiled kernel yet."""
        if USE_BINDER or not self._direct:
            self.fn[grid](*compile_args(), **self.constants)
            return
        key = self._key(args)
        kernel = self._kernels.get(key) if self._kernels else None
        if kernel is None:
            kernel = self._compile(grid, compile_args())
            if kernel is None:
                return
        self.launch_compiled(kernel, grid, device_index, args, self._tail)
        if type(kernel) is not DirectLaunch and USE_DIRECT and key not in self._direct_tried \
                and getattr(kernel, "module", None) is not None:
            # after the first launch (the module is loaded, its launcher built): later ones go direct if they can
            self._direct_tried.add(key)
            self._kernels[key] = DirectLaunch.of(kernel) or kernel


_SHARED: dict = {}   # (kernel, key) -> Launcher, for shared_launcher


def shared_launcher(fn, key: tuple, constants: dict) -> Launcher:
    """The Launcher of kernel `fn` at `constants`, built once per process for `key` (what selects those constants:
    dtypes, tile, epilogue or mod, CPU), so every shape class's plan shares it and its compiled kernels."""
    found = _SHARED.get((fn, key))
    if found is None:
        found = _SHARED[(fn, key)] = Launcher(fn, constants)
    return found
