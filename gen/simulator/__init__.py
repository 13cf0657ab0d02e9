"""Functional CPU simulator for Triton 3.6.0 Gluon kernels (sm100 tcgen05/TMEM and sm90 wgmma).

`load_module(source, name, seed=0, smem_limit=None)` executes the SOURCE TEXT of a rendered kernel module in a
fresh namespace whose `triton.experimental.gluon...` imports resolve to simulated namespaces (nothing global is
patched: the module gets its own `__import__`). Its `launch(...)` then builds the real host `TensorDescriptor`s
and `kernel[grid](...)` runs every program of the grid on CPU torch tensors, at tile level, one program after
another (torch intra-op threading is set to 1 for the duration of a launch: tile-sized ops are faster so).

What is modelled
----------------
* Values: register tensors are torch tensors with Triton's dtype promotion, int32 wrap-around, truncating
  `//` and `%`, rounding to fp16/bf16 on casts and stores; constexprs are plain Python values; `range` over
  tensor bounds yields int32 tensors (like scf.for), `gl.static_range` yields ints. Layouts are carried (and
  checked for mismatches in elementwise ops, expand_dims of non-slice layouts) but never change values.
* Shared memory: byte buffers (initialised to 0xFF = NaN) with strided typed views: `.index`, `.slice`,
  `.permute`, `.reshape`, `._reinterpret`, `.load(layout)`, `.store(v)`. A budget (`smem_limit`) is checked
  on the sum of live allocations (Python liveness, i.e. no compiler aliasing; no compiler scratch).
* Tensor memory: rows x 32-bit columns; packed / unpacked 16-bit layouts (col_stride), `.slice`, `.index`,
  `._reinterpret` alias the same bytes (fp32 S reused as packed bf16 P), more than 512 live columns is an error.
* mbarriers: init / expect (= arrive.expect_tx) / arrive(count) / wait(parity) / invalidate, with pending
  arrivals and transaction bytes; a phase completes when both reach 0; a fresh barrier counts as having
  completed the phase before phase 0; over-delivered tx bytes are an error.
* TMA: `tma.async_copy_global_to_shared` (out-of-bounds box elements zero-filled, full box bytes counted),
  `tma.async_copy_shared_to_global` (clipped), `tma.store_wait(n)`, device-side `make_tensor_descriptor`.
* Cluster launch control (`clc.try_cancel`, `clc.load_result`, Blackwell, triton >= 3.8; offered whatever
  Triton is installed): a request takes over the next program of the launch not started yet (the launcher
  then skips it) or, for a seeded share of requests, fails while programs are pending (they run later, as
  if already running elsewhere); the 16-byte response is an async-proxy write that completes 16 tx bytes on
  the barrier; a request after a failed one is an error (undefined in PTX).
* tcgen05: `tcgen05_mma` (a in smem or TMEM, b in smem, acc in TMEM, use_acc, pred, mbarriers/preds; fp32
  inputs rounded to tf32), `tcgen05_commit`, `tcgen05_copy`. Ordering is PTX's pipelined pairs: an MMA is
  ordered after the partition's earlier MMAs into the same accumulator (and its copies), a commit after
  everything issued before it; MMAs into different accumulators are not ordered.
* wgmma: `warpgroup_mma` (sync or is_async, a from smem or registers), `warpgroup_mma_wait(n, deps)`; an async
  accumulator cannot be used as a value until a wait retired it.
* `gl.warp_specialize`: every partition is a thread of control under a cooperative, seeded scheduler that
  switches only at synchronisation points; asynchronous ops complete at scheduler-chosen points; `seed`
  changes interleavings and completion order deterministically.
* Checks: DeadlockError (every partition blocked and nothing in flight; lists each partition, the barrier it
  waits on, the parity it waits for, the barrier's phase/arrivals/tx bytes and the source line), HazardError
  (vector-clock happens-before between async ops and thread accesses to smem/TMEM regions, missing
  fence_async_shared between generic-proxy and async-proxy accesses, tx-byte over-delivery, invalidating a
  barrier an in-flight op will signal), SimulationError (everything else: TMEM > 512 columns, smem budget,
  out-of-bounds pointer accesses, shape/dtype mismatches, uninitialized/invalidated barriers, ...).
* Globals a kernel reads, by Triton's rule (its code generator's global lookup): modules, jit functions,
  builtins, dtypes and layouts, aggregates, constexpr_functions and names the module assigns from
  `constexpr(...)`; a plain int, list or dict read by a kernel is a SimulationError, as it is a compile
  error on Triton (the simulator's `gl.constexpr(v)` is `v` itself, so the module's source tells them apart).
* Global memory: `gl.load`/`gl.store` (masks, `other`, bounds checked against the tensor's storage), atomics.
* `gl.inline_asm_elementwise`: only register moves (`mov.b32 $0, $1;`, used as optimisation barriers), reads of
  %ctaid/%nctaid, `fence.proxy.async` (= fence_async_shared) and the tcgen05 thread-sync fences; any other
  PTX raises SimulationError.

How hazards are decided: by happens-before (vector clocks over partitions and individual async ops), not by
the simulated timing, so a missing wait is reported whatever interleaving the seed picked. An async op is
ordered before a later access only if the accessing partition observed its completion: through a barrier
phase it signalled (mbarriers= / tcgen05_commit / TMA tx bytes), transitively through other barriers, through
warpgroup_mma_wait / store_wait, or because both are wgmma ops, or tcgen05 ops of a pipelined pair, issued in
order by one partition.

What is NOT modelled
--------------------
* Timing of any kind (latencies, throughput, occupancy, how long a wait takes); the schedule is a seeded random
  interleaving, not a performance model.
* The thread/warp/lane mapping of layouts: a layout never changes values, so layout-dependent behaviour
  (e.g. per-thread duplicated values, `convert_layout` cost, which thread arrives) is invisible; register
  pressure, spills, `maxnreg`/`worker_num_regs`, and `num_warps` beyond `gl.num_warps()`.
* Shared memory swizzling, bank conflicts, alignment/padding and the compiler's buffer aliasing and scratch;
  hence smem totals are the sum of live allocations, not the compiler's number.
* Real TMEM lane restrictions (each warp accessing only its 32 lanes, 16-lane M=64 layouts), the TMEM
  allocator's column placement/power-of-two rounding and tcgen05.ld/st atoms.
* The tcgen05 thread-sync fences are checked per partition, not per TMEM region: an mbarrier arrive after a TMEM
  load/store needs tcgen05.fence::before_thread_sync in between (HazardError otherwise), and a partition whose wait
  observed a phase completed by such an arrive (one after TMEM work since the arriver's previous arrive) needs
  tcgen05.fence::after_thread_sync before its next tcgen05 op, whether or not that op touches the same columns.
* Intra-partition thread synchronisation: `gl.thread_barrier()` is a no-op, a partition's warps act as one
  thread (no check that a TMA store issued by one thread sees the smem stores of all warps); the
  mbarrier-init-visibility fence is not checked.
* L2/global-memory caching, coherence and ordering between programs (programs run one after another), global
  memory races, clusters of more than one CTA, multicast and 2-CTA MMAs, TMA gather/scatter/im2col, cp.async,
  fp4/scaled MMA, inline asm beyond the idioms above.
* Exact floating point of the hardware: MMAs accumulate in fp32 with torch's summation order, fast-math ops
  (exp2, division, rsqrt) are exact torch ops, reductions use torch's order.
"""
from __future__ import annotations

import types

from . import _lang, _src
from .errors import DeadlockError, HazardError, SimulationError

__all__ = ["load_module", "SimulationError", "DeadlockError", "HazardError"]

_loaded_sources: dict[str, str] = {}


def _filename(name: str, source: str) -> str:
    base = name if name.endswith(".py") else name + ".py"
    fn, i = base, 1
    while fn in _loaded_sources and _loaded_sources[fn] != source:
        i += 1
        fn = base[:-3] + f"~{i}.py"
    _loaded_sources[fn] = source
    return fn


def load_module(source: str, name: str, *, seed: int = 0, smem_limit: int | None = None,
                late: bool = False) -> types.ModuleType:
    """Execute a rendered Gluon kernel module's source under the simulator and return the module.

    `seed` picks the interleaving of partitions and the completion order of asynchronous operations;
    `smem_limit` (bytes) makes an allocation that brings the live shared memory above it an error; `late`: the
    adversarial completion order, in which an asynchronous operation (TMA, MMA, tcgen05 commit) completes only when
    no partition can run, so its arrival lands after its issuer moved on or returned.
    Source lines in error messages are reported as `<name>.py:<line>`.
    """
    filename = _filename(name, source)
    _src.register_source(filename, source)
    ctx = _lang.SimContext(seed=seed, smem_limit=smem_limit, late=late)
    mods = _lang.build(ctx)
    module = types.ModuleType(name.removesuffix(".py"))
    module.__file__ = filename
    module.__dict__["__builtins__"] = _lang.make_builtins(mods)
    module.__dict__["__gluon_sim__"] = ctx
    # what Triton lets a kernel read as a global, besides modules and jit functions (SimJITFunction.check_globals):
    # names the module assigns from `constexpr(...)`, and every builtin the simulated namespaces expose
    module.__dict__["__sim_constexpr_globals__"] = _constexpr_assignments(source)
    module.__dict__["__sim_namespace_ids__"] = frozenset(id(v) for m in mods.values() for v in vars(m).values())
    exec(compile(source, filename, "exec"), module.__dict__)
    return module


def _constexpr_assignments(source: str) -> frozenset:
    """Module-level names assigned `<anything>.constexpr(...)` or `constexpr(...)`, also under a top-level if / try /
    with (not inside functions or classes)."""
    import ast

    names = set()
    pending = list(ast.parse(source).body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            func = node.value.func
            if (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")) == "constexpr":
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            for field in ("body", "orelse", "finalbody", "handlers"):
                pending += getattr(node, field, [])
        elif isinstance(node, ast.ExceptHandler):
            pending += node.body
    return frozenset(names)
