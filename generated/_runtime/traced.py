"""A traced call's decision made once, outside Dynamo: the generated ops' fast path under torch.compile.

Dynamo guards on every global a traced function reads (each helper, constant table and module attribute is a guard
checked before each call of the compiled graph); the argument checks and provider decisions of a traced `linear` or
`attention` made a Llama-3-8B decode layer's guard tree 354 lines against torch's 144, 8-9 us a step on the H100
(bench/NOTES.md). Where a call's sizes are static, the op reads its tensors' metadata as constants (static_meta), and one function Dynamo treats as a constant (torch.compiler.assume_constant_result) runs the same
checks and decisions on fake tensors of that metadata (fake_tensors) and returns the verdict. What the verdict
depends on is exactly what Dynamo's tensor guards and global-state guard (grad mode) already check. A symbolic size
is read as None: the ops take the verdict where it is a size the decision leaves free or splits at a bound (GEMM's M,
attention's batch, a decode step's cache length); the traced code takes the split's one shape guard, as the general
path does.
"""
from __future__ import annotations

import contextlib
import logging

import torch

from .shapes import static_size

log = logging.getLogger("gen.runtime")


def compiled_with_cuda_graphs() -> bool:
    """Is the torch.compile call Dynamo is tracing compiled with CUDA graphs (mode="reduce-overhead" or
    "max-autotune", or Inductor's triton.cudagraphs set globally)? Its graph then replays without host code, so the
    trace-time picks are the table's picks for captured calls (graph_provider). Read from the traced frame's
    backend (Dynamo's own state, not a public API): False when not tracing, for other backends, or where this torch
    does not expose it."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        backend = InstructionTranslator.current_tx().output.compiler_fn
    except Exception:   # noqa: BLE001 (not tracing, or another torch's internals)
        return False
    fn = backend
    for _ in range(4):   # Dynamo's wrappers around the backend, outermost first
        config = getattr(fn, "config", None)
        if isinstance(config, dict) and "triton.cudagraphs" in config:
            return bool(config["triton.cudagraphs"])
        fn = next((getattr(fn, a) for a in ("_torchdynamo_orig_backend", "compiler_fn", "__wrapped__")
                   if getattr(fn, a, None) is not None), None)
        if fn is None:
            break
    if "inductor" in (getattr(backend, "_compiler_name", None), getattr(backend, "compiler_name", None)):
        from torch._inductor import config as inductor_config

        return bool(inductor_config.triton.cudagraphs)
    return False


def static_meta(t):
    """t's (shape, strides, dtype, device, requires_grad) as constants while Dynamo traces, each symbolic size or
    stride as None; None for None, False where t is not a tensor."""
    if t is None:
        return None
    if not isinstance(t, torch.Tensor):
        return False
    return tuple(static_size(d) for d in t.shape), tuple(static_size(s) for s in t.stride()), t.dtype, t.device, \
        t.requires_grad


def symbolic_only(meta, free=()) -> bool:
    """Is static_meta's `meta` no tensor (None), or a tensor whose sizes are static but perhaps for the dims in
    `free`, whose last stride is static, and whose other strides are static unless a free size is not?"""
    if meta is None:
        return True
    if meta is False:
        return False
    shape, stride = meta[0], meta[1]
    if stride[-1] is None or any(d is None for i, d in enumerate(shape) if i not in free):
        return False
    return None not in stride or any(shape[i] is None for i in free)


def kv_agree(q, k, v) -> bool:
    """Are q, k and v 4-D tensors of one batch size, k and v of one length? Two sizes that are one symbol compare
    without a guard; two symbols take one shape guard (as the general path's checks would)."""
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k, v)):
        return False
    if q.shape[0] == k.shape[0] and v.shape[0] == k.shape[0] and k.shape[2] == v.shape[2]:
        return True   # (a branch, not the comparison's value: a symbolic one is not a constant)
    return False


# A symbolic size's stand-in in a fake tensor: Dynamo makes a size symbolic only from 2 up (0 and 1 stay static)
SYMBOLIC_STAND_IN = 2


@contextlib.contextmanager
def fake_tensors(metas, grad_enabled: bool):
    """Fake tensors (no storage, any device, no GPU needed) with the metadata static_meta read, under the traced
    call's grad mode; None stays None. A symbolic size is SYMBOLIC_STAND_IN; where a stride is symbolic, the
    tensor is contiguous (only the last stride, static, is read then)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(), torch.set_grad_enabled(grad_enabled):
        tensors = []
        for m in metas:
            if m is None:
                tensors.append(None)
                continue
            shape = tuple(SYMBOLIC_STAND_IN if d is None else d for d in m[0])
            t = (torch.empty(shape, dtype=m[2], device=m[3]) if None in m[1] else
                 torch.empty_strided(shape, m[1], dtype=m[2], device=m[3]))
            tensors.append(t.requires_grad_(m[4]))
        yield tensors


def verdict_or_none(decide, *args):
    """decide(*args), or None where it raises: a bad argument then takes the op's general traced path, whose checks
    raise it where the user's code called the op (as an eager call would)."""
    try:
        return decide(*args)
    except Exception as e:   # the general path reports it (or, for a fault of this path, still runs the call)
        log.debug("constant trace verdict not made (%s: %s); tracing the general path", type(e).__name__, e)
        return None
