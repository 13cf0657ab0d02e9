"""Programs, partitions, the cooperative scheduler, asynchronous operations and the stateful Gluon builtins.

Execution model
---------------
Each program (CTA) of the grid runs on its own, one after the other. Inside a program every partition of
`gl.warp_specialize` is a Python thread, but only the thread holding the baton runs: at every synchronisation
point (barrier op, TMA/MMA issue, shared/tensor memory access, fence, ...) the holder calls the scheduler, which
(with a seeded RNG) may complete pending asynchronous operations and may hand the baton to another runnable
partition. A blocking `mbarrier.wait` parks the thread until the barrier's phase flips. When no partition can run
and no asynchronous operation is pending, the program is deadlocked.

Asynchronous operations (TMA loads/stores, tcgen05 MMAs/commits, async wgmma) perform their data effect and
signal their barriers when the scheduler completes them. TMA operations complete in any order; tcgen05 ops and
wgmma ops of one issuing partition complete in issue order (as on the hardware).
"""
from __future__ import annotations

import math
import threading
import weakref
from collections import deque

import torch
import triton.language.core as tlc
from triton.experimental.gluon.language._layouts import DistributedLayout

from . import _src
from ._dtypes import as_gl, nbytes_of, to_torch, unwrap
from ._memory import Allocation, SmemDesc, TmemDesc, barrier_of, contiguous_strides, tmem_geometry, vc_join
from ._tensor import PtrTensor, Tensor, broadcast_shapes, cast, merge_layouts, to_tensor
from .errors import DeadlockError, HazardError, SimulationError, _Abort

_tls = threading.local()

TMEM_COLUMNS = 512


def current():
    t = getattr(_tls, "thread", None)
    if t is None:
        raise SimulationError("a Gluon builtin was called outside a simulated kernel launch")
    return t


# ====================================================================================== partitions

class Block:
    def ready(self):
        raise NotImplementedError

    def describe(self):
        raise NotImplementedError


class BarrierWait(Block):
    def __init__(self, bar, parity, path, loc):
        self.bar, self.parity, self.path, self.loc = bar, parity, path, loc

    def ready(self):
        return (self.bar.phase & 1) != self.parity

    def describe(self):
        b = self.bar
        return (f"blocked in mbarrier.wait on barrier {b.name} (view {self.path}) waiting for the phase with "
                f"parity {self.parity} to complete; barrier {b.name}: {b.state()}\n{self.loc.format('      ')}")


class JoinWait(Block):
    def __init__(self, workers, loc):
        self.workers, self.loc = workers, loc

    def ready(self):
        return all(w.state == "done" for w in self.workers)

    def describe(self):
        left = ", ".join(f"`{w.name}`" for w in self.workers if w.state != "done")
        return (f"returned from the default partition; waiting for the worker partitions ({left}) to exit "
                f"at the end of gl.warp_specialize\n{self.loc.format('      ')}")


class SimThread:
    def __init__(self, prog, name, role, num_warps):
        self.prog = prog
        self.id = prog.new_actor()
        self.name = name
        self.role = role
        self.num_warps = num_warps
        self.vc = {self.id: 1}
        self.state = "runnable"
        self.block = None
        self.sem = threading.Semaphore(0)
        self.os_thread = None
        self.fn = None
        self.args = ()
        self.tc_fifo = deque()    # pending tcgen05 ops, in issue order (one legal completion order)
        # What orders a tcgen05 op after earlier ones (PTX's pipelined pairs): an MMA follows the last MMA into the
        # same accumulator (same shape) and the last tcgen05_copy; a commit follows everything issued before it.
        # MMAs into different accumulators are not ordered: touching the same TMEM needs a barrier between them.
        self.tc_by_acc = {}
        self.tc_last_copy = None
        self.tc_all_vc = {}
        self.wg_fifo = deque()    # pending async wgmma ops
        self.last_wg = None
        self.wgmma = []           # wgmma ops not yet retired by warpgroup_mma_wait
        self.stores = []          # TMA stores not yet retired by store_wait
        # tcgen05's cross-thread pattern: a TMEM load/store not yet followed by tcgen05.fence::before_thread_sync
        # (an mbarrier arrive must not follow it), and a wait that observed such a hand-off not yet followed by
        # tcgen05.fence::after_thread_sync (no tcgen05 op may follow it)
        self.tmem_since_arrive = False   # TMEM accessed since this partition's last arrive: the next one hands it off
        self.tmem_unfenced = None
        self.await_after_fence = None
        self.in_ws = False

    def tick(self):
        self.vc[self.id] += 1

    def who(self):
        return f"partition `{self.name}`"

    def label(self):
        w = f"{self.num_warps} warp" + ("s" if self.num_warps != 1 else "")
        return f"partition `{self.name}` ({self.role}, {w})"


# ====================================================================================== async operations

class AsyncOp:
    kind = "async op"

    def __init__(self, prog, issuer, loc, fifo=None, prev=None):
        self.prog = prog
        self.id = prog.new_actor()
        self.issuer = issuer
        self.loc = loc
        self.vc = dict(issuer.vc)
        if prev is not None:
            vc_join(self.vc, prev.vc)  # same-queue ops execute in issue order
        self.vc[self.id] = 1
        self.fifo = fifo
        self.done = False
        self.retired = False

    def who(self):
        return f"async {self.kind} issued by partition `{self.issuer.name}`"

    def access(self, desc, write, what):
        desc.alloc.access(desc.region(), write, self.id, self.vc, self.who(), self.loc, desc.path, generic=False,
                          async_proxy=True, what=what)

    def effect(self):
        pass


class TmaLoad(AsyncOp):
    kind = "TMA load (tma.async_copy_global_to_shared)"

    def __init__(self, prog, issuer, loc, desc, coords, dest, bar):
        super().__init__(prog, issuer, loc)
        self.desc, self.coords, self.dest, self.bar = desc, coords, dest, bar
        self.nbytes = math.prod(desc.block_shape) * nbytes_of(desc.dtype)

    def effect(self):
        self.dest.tensor().copy_(self.desc.read_box(self.coords).reshape(self.dest.shape))
        self.prog.complete_tx(self.bar, self.nbytes, self.vc, self)


class TmaStore(AsyncOp):
    kind = "TMA store (tma.async_copy_shared_to_global)"

    def __init__(self, prog, issuer, loc, desc, coords, src):
        super().__init__(prog, issuer, loc)
        self.desc, self.coords, self.src = desc, coords, src

    def effect(self):
        self.desc.write_box(self.coords, self.src.tensor().reshape(self.desc.block_shape))


CLC_RESULT_BYTES = 16


class ClcTryCancel(AsyncOp):
    kind = "cluster launch control request (clc.try_cancel)"

    def __init__(self, prog, issuer, loc, result, bar):
        super().__init__(prog, issuer, loc)
        self.result, self.bar = result, bar

    def effect(self):
        # The response: word 0 = 1 if a program was cancelled for this one, word 1 = its pid (x | y << 21 | z << 42).
        pid = self.prog.queue.try_cancel(self.prog.rng, self.prog.p_cancel_fail)
        if pid is None:
            self.prog.cancel_failed_at = self.loc
        else:
            self.prog.took_over.append(pid)
        words = torch.tensor([0, 0] if pid is None else [1, pid[0] | pid[1] << 21 | pid[2] << 42], dtype=torch.int64)
        self.result.tensor().view(-1).view(torch.uint8).copy_(words.view(torch.uint8))
        self.prog.complete_tx(self.bar, CLC_RESULT_BYTES, self.vc, self)


def _tf32(x):
    return (x.contiguous().view(torch.int32) & ~0x1FFF).view(torch.float32)


def _mma_operand(v):
    if isinstance(v, (SmemDesc, TmemDesc)):
        t = v.tensor()
        dt = v.dtype
    else:
        t = v.t
        dt = v.dtype
    t = t.to(torch.float32)
    if dt.is_fp32():
        t = _tf32(t)  # fp32 operands run as tf32 on the tensor cores
    return t


class Tcgen05Mma(AsyncOp):
    kind = "tcgen05_mma"

    def __init__(self, prog, issuer, loc, a, b, acc, use_acc, bars, fifo, prev):
        super().__init__(prog, issuer, loc, fifo, prev)
        self.a, self.b, self.acc, self.use_acc, self.bars = a, b, acc, use_acc, bars

    def effect(self):
        r = _mma_operand(self.a) @ _mma_operand(self.b)
        out = self.acc.tensor()
        if self.use_acc:
            r = r + out.to(torch.float32)
        out.copy_(r.to(out.dtype))
        for bar in self.bars:
            self.prog.arrive(bar, 1, self.vc, self.loc, self.who())


class Tcgen05Commit(AsyncOp):
    kind = "tcgen05_commit"

    def __init__(self, prog, issuer, loc, bar, fifo, prev):
        super().__init__(prog, issuer, loc, fifo, prev)
        self.bar = bar

    def effect(self):
        self.prog.arrive(self.bar, 1, self.vc, self.loc, self.who())


class Tcgen05Copy(AsyncOp):
    kind = "tcgen05_copy"

    def __init__(self, prog, issuer, loc, src, dst, fifo, prev):
        super().__init__(prog, issuer, loc, fifo, prev)
        self.src, self.dst = src, dst

    def effect(self):
        self.dst.tensor().copy_(self.src.tensor().reshape(self.dst.shape))


class Wgmma(AsyncOp):
    kind = "warpgroup_mma"

    def __init__(self, prog, issuer, loc, a, b, acc, use_acc, fifo, prev):
        super().__init__(prog, issuer, loc, fifo, prev)
        self.a, self.b, self.acc, self.use_acc = a, b, acc, use_acc
        self.result = None

    def effect(self):
        acc = self.acc.op.result if isinstance(self.acc, WgmmaToken) else self.acc
        r = _mma_operand(self.a) @ _mma_operand(self.b)
        if self.use_acc:
            r = r + acc.t.to(torch.float32)
        self.result = Tensor(r.to(to_torch(acc.dtype)), acc.dtype, acc.layout)


class WgmmaToken:
    """gl.nvidia.hopper.warpgroup_mma_accumulator: the value of an async wgmma, usable only after it retires."""

    def __init__(self, op, acc):
        self.op = op
        self._acc = acc

    @property
    def dtype(self):
        return self._acc.dtype

    @property
    def shape(self):
        return self._acc.shape

    @property
    def type(self):
        return self._acc.type

    def _bad(self, *a, **k):
        raise HazardError(f"the accumulator of the async warpgroup_mma issued at {self.op.loc} is used as a value "
                          "before warpgroup_mma_wait retired that wgmma (pass it through warpgroup_mma_wait(deps=[..]))")

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = _bad
    to = _bad

    def __repr__(self):
        return f"WgmmaToken({self.op.loc.short})"


# ====================================================================================== program

class LaunchQueue:
    """The programs of a launch not started yet, in launch order (x fastest). The launcher starts them one after the
    other; a program's `clc.try_cancel` may take the next one over (Blackwell cluster launch control), and the
    launcher then skips it."""

    def __init__(self, grid):
        self.pending = deque((x, y, z) for z in range(grid[2]) for y in range(grid[1]) for x in range(grid[0]))

    def next_program(self):
        return self.pending.popleft() if self.pending else None

    def try_cancel(self, rng, p_fail):
        """The pid of a pending program cancelled for the caller, or None. A seeded share of the requests fails while
        programs are still pending: on hardware they would already be running on other SMs, so the caller must
        exit while the launcher still starts them."""
        if not self.pending or rng.random() < p_fail:
            return None
        return self.pending.popleft()


class Program:
    def __init__(self, kernel_name, pid, grid, rng, smem_limit, num_warps, p_complete=0.35, p_stay=0.55,
                 queue=None, p_cancel_fail=0.25):
        self.kernel_name = kernel_name
        self.pid = pid
        self.queue = queue if queue is not None else LaunchQueue((0, 0, 0))
        self.p_cancel_fail = p_cancel_fail
        self.cancel_failed_at = None   # where a try_cancel of this program completed with no program taken over
        self.took_over = []            # the pids its try_cancel requests took over, in order
        self.grid = grid
        self.rng = rng
        self.smem_limit = smem_limit
        self.num_warps = num_warps
        self.p_complete = p_complete
        self.p_stay = p_stay
        self.threads: list[SimThread] = []
        self.ops: list[AsyncOp] = []
        self._actors = 0
        self.abort = False
        self.error = None
        self.smem_allocs = []   # weakrefs
        self.tmem_allocs = []
        self.alloc_count = 0
        self.peak_smem = 0
        self.main = None

    def new_actor(self):
        self._actors += 1
        return self._actors

    def label(self):
        return f"program {tuple(self.pid)} of `{self.kernel_name}` (grid {tuple(self.grid)})"

    # ------------------------------------------------------------------ running
    def run(self, fn, args):
        main = SimThread(self, fn.__name__, "kernel", self.num_warps)
        self.main = main
        self.threads.append(main)
        prev = getattr(_tls, "thread", None)
        _tls.thread = main
        try:
            fn(*args)
            main.state = "done"
            self.drain()
        except _Abort:
            err = self.error
            self._cleanup()
            raise err.with_traceback(err.__traceback__)
        except BaseException:
            self.abort = True
            self._cleanup()
            raise
        finally:
            _tls.thread = prev

    def drain(self):
        while self.ops:
            ops = self.completable()
            self.complete(ops[0])

    def _cleanup(self):
        self.abort = True
        for t in self.threads:
            if t.os_thread is not None and t.os_thread.is_alive():
                t.sem.release()
        for t in self.threads:
            if t.os_thread is not None:
                t.os_thread.join(timeout=10)

    def fail(self, err):
        if self.error is None:
            self.error = err
        self.abort = True
        self.main.sem.release()

    def _worker_body(self, t):
        _tls.thread = t
        torch.set_num_threads(1)  # per-thread OpenMP setting; see SimContext.launch
        t.sem.acquire()
        if self.abort:
            return
        try:
            t.fn(*t.args)
            t.state = "done"
            self.schedule(t)
        except _Abort:
            return
        except BaseException as e:  # noqa: BLE001 - forwarded to the launching thread
            self.fail(e)

    def spawn(self, fn, args, name, role, num_warps, parent):
        t = SimThread(self, name, role, num_warps)
        vc_join(t.vc, parent.vc)
        t.fn, t.args = fn, args
        t.os_thread = threading.Thread(target=self._worker_body, args=(t,), daemon=True,
                                       name=f"gluon-sim-{name}")
        self.threads.append(t)
        t.os_thread.start()
        return t

    # ------------------------------------------------------------------ scheduler
    def completable(self):
        return [op for op in self.ops if op.fifo is None or op.fifo[0] is op]

    def complete(self, op):
        self.ops.remove(op)
        if op.fifo is not None:
            assert op.fifo[0] is op
            op.fifo.popleft()
        op.done = True
        op.effect()

    def force(self, op):
        """Complete `op` now (and, for ordered queues, everything issued before it)."""
        while not op.done:
            if op.fifo is not None:
                self.complete(op.fifo[0])
            else:
                self.complete(op)

    def schedule(self, me):
        rng = self.rng
        while True:
            if self.abort:
                raise _Abort()
            runnable = [t for t in self.threads
                        if t.state == "runnable" or (t.state == "blocked" and t.block.ready())]
            ops = self.completable() if self.ops else ()
            if not runnable and not ops:
                self.deadlock(me)
            if ops and (not runnable or rng.random() < self.p_complete):
                self.complete(ops[rng.randrange(len(ops))])
                continue
            if me in runnable and rng.random() < self.p_stay:
                choice = me
            else:
                choice = runnable[rng.randrange(len(runnable))]
            choice.state = "runnable"
            choice.block = None
            if choice is me:
                return
            choice.sem.release()
            if me.state == "done":
                return
            me.sem.acquire()
            if self.abort:
                raise _Abort()
            return

    def yield_point(self, me):
        if len(self.threads) > 1 or self.ops:
            self.schedule(me)

    def block_on(self, me, block):
        if block.ready():
            return
        me.state = "blocked"
        me.block = block
        self.schedule(me)

    def deadlock(self, me):
        lines = [f"deadlock in {self.label()}: every partition is blocked and no asynchronous operation is "
                 "pending"]
        for t in self.threads:
            if t.state == "done":
                lines.append(f"  {t.label()}: finished")
            elif t.state == "blocked":
                lines.append(f"  {t.label()}: {t.block.describe()}")
            else:
                lines.append(f"  {t.label()}: runnable")
        err = DeadlockError("\n".join(lines))
        if me is self.main:
            raise err
        self.fail(err)
        raise _Abort()

    # ------------------------------------------------------------------ barriers
    def arrive(self, bar, count, vc, loc, who):
        if not bar.initialized or bar.invalidated:
            state = "an invalidated" if bar.invalidated else "an uninitialized"
            raise SimulationError(f"{who} arrives on {state} mbarrier {bar.name} at {loc}")
        if count > bar.pending:
            raise SimulationError(f"{who} arrives with count {count} on mbarrier {bar.name} which has only "
                                  f"{bar.pending} pending arrivals in its current phase, at {loc}")
        bar.pending -= count
        vc_join(bar.cur_vc, vc)
        bar.arrive_locs.append(loc)
        self._check_phase(bar)

    def complete_tx(self, bar, nbytes, vc, op):
        if not bar.initialized or bar.invalidated:
            raise SimulationError(f"{op.who()} completes transaction bytes on an invalidated/uninitialized "
                                  f"mbarrier {bar.name}; issued at {op.loc}")
        bar.tx -= nbytes
        bar.delivered += nbytes
        vc_join(bar.cur_vc, vc)
        self._check_phase(bar)

    def _check_phase(self, bar):
        if bar.pending:
            return
        if bar.tx == 0:
            bar.phase += 1
            bar.last_vc = bar.cur_vc
            bar.cur_vc = {}
            bar.last_tmem_arrivals, bar.tmem_arrivals = bar.tmem_arrivals, []
            bar.pending = bar.count
            bar.reset_phase_stats()
        elif bar.tx < 0:
            exp = "; ".join(str(l) for l in bar.expect_locs) or "none"
            cps = "\n".join(l.format("      ") for l in bar.copy_locs[-4:])
            raise HazardError(
                f"TMA transaction bytes exceed mbarrier.expect on barrier {bar.name}: expected {bar.expected} "
                f"bytes this phase (mbarrier.expect at {exp}), TMA delivered {bar.delivered}; the phase could "
                f"complete before all data has landed. Copies:\n{cps}")

    # ------------------------------------------------------------------ memory accounting
    def _live(self, lst):
        out = []
        for r in lst:
            a = r()
            if a is not None:
                out.append(a)
        lst[:] = [weakref.ref(a) for a in out]
        return out

    def register_smem(self, alloc):
        live = self._live(self.smem_allocs)
        total = sum(a.nbytes for a in live) + alloc.nbytes
        self.peak_smem = max(self.peak_smem, total)
        if self.smem_limit is not None and total > self.smem_limit:
            listing = "\n".join(f"    {a.name}: {a.nbytes} bytes ({a.loc.short})" for a in live + [alloc])
            raise SimulationError(f"shared memory budget exceeded in {self.label()}: {total} bytes live > limit "
                                  f"{self.smem_limit} at {alloc.loc}\n{listing}")
        self.smem_allocs.append(weakref.ref(alloc))

    def register_tmem(self, alloc):
        live = self._live(self.tmem_allocs)
        total = sum(a.cols for a in live) + alloc.cols
        if total > TMEM_COLUMNS:
            listing = "\n".join(f"    {a.name}: {a.cols} columns ({a.loc.short})" for a in live + [alloc])
            raise SimulationError(f"tensor memory exhausted in {self.label()}: {total} columns live > "
                                  f"{TMEM_COLUMNS} at {alloc.loc}\n{listing}")
        self.tmem_allocs.append(weakref.ref(alloc))

    def alloc_name(self, loc, prefix):
        self.alloc_count += 1
        return loc.assigned_name() or f"{prefix}{self.alloc_count}"


# ====================================================================================== descriptors (TMA)

class BlockType:
    """What kernels read off `desc.block_type`: shape (a list, so `[S] + shape` works), nbytes, element_ty."""

    def __init__(self, dtype, shape):
        self.element_ty = dtype
        self.scalar = dtype
        self.shape = list(shape)

    @property
    def numel(self):
        return math.prod(self.shape)

    @property
    def nbytes(self):
        return self.numel * (self.element_ty.primitive_bitwidth // 8)

    def __repr__(self):
        return f"block_type<{self.shape}, {self.element_ty}>"


class DeviceDesc:
    """The in-kernel view of a host TensorDescriptor (gl.nvidia.hopper.tma.tensor_descriptor)."""

    def __init__(self, base, shape, strides, block_shape, layout, padding="zero", name="desc"):
        self.base = base
        self.gshape = [int(s) for s in shape]
        self.gstrides = [int(s) for s in strides]
        self.block_shape = [int(unwrap(b)) for b in block_shape]
        self.layout = unwrap(layout)
        self.padding = padding
        self.name = name
        self.dtype = as_gl(base.dtype) if isinstance(base, torch.Tensor) else base.elem
        if len(self.block_shape) != len(self.gshape):
            raise SimulationError(f"descriptor {name}: block shape {self.block_shape} rank differs from shape "
                                  f"{self.gshape}")
        self.block_type = BlockType(self.dtype, self.block_shape)
        self.shape = [Tensor(torch.tensor(s, dtype=torch.int32), tlc.int32) for s in self.gshape]
        self.strides = [Tensor(torch.tensor(s, dtype=torch.int64), tlc.int64) for s in self.gstrides]
        if isinstance(base, torch.Tensor):
            st = base.untyped_storage()
            es = base.element_size()
            flat = torch.empty(0, dtype=base.dtype).set_(st, 0, (st.nbytes() // es,), (1,))
            self._global = torch.as_strided(flat, self.gshape, self.gstrides, base.storage_offset())
        else:  # device-side make_tensor_descriptor from a PtrTensor
            self._global = torch.as_strided(base.base, self.gshape, self.gstrides, int(base.offs.item()))

    @staticmethod
    def from_host(d, name):
        return DeviceDesc(d.base, d.shape, d.strides, d.block_shape, d.layout, getattr(d, "padding", "zero"), name)

    def _ranges(self, coords):
        src, dst = [], []
        for c, b, s in zip(coords, self.block_shape, self.gshape):
            lo, hi = max(c, 0), min(c + b, s)
            if hi <= lo:
                return None, None
            src.append(slice(lo, hi))
            dst.append(slice(lo - c, hi - c))
        return tuple(src), tuple(dst)

    def read_box(self, coords):
        fill = float("nan") if self.padding == "nan" else 0
        box = torch.full(self.block_shape, fill, dtype=self._global.dtype)
        src, dst = self._ranges(coords)
        if src is not None:
            box[dst] = self._global[src]
        return box

    def write_box(self, coords, data):
        src, dst = self._ranges(coords)
        if src is not None:
            self._global[src] = data[dst]

    def __repr__(self):
        return f"tensor_descriptor({self.name}, block={self.block_shape}, {self.dtype})"


# ====================================================================================== helpers

def _loc():
    return _src.capture(3)


def _sync_access(th, desc, write, loc, what):
    desc.alloc.access(desc.region(), write, th.id, th.vc, th.who(), loc, desc.path,
                      generic=desc.alloc.kind == "smem", async_proxy=False, what=what)


def _tcgen05_after_sync(th, loc, what):
    """A tcgen05 op (MMA, commit, copy, TMEM load/store) by `th`: refused while a wait that observed a TMEM hand-off
    has not been followed by tcgen05.fence::after_thread_sync."""
    if th.await_after_fence is not None:
        wait_loc, bar = th.await_after_fence
        raise HazardError(f"partition `{th.name}` {what} at {loc} after waiting on mbarrier {bar} at {wait_loc}, "
                          "whose phase a partition completed after accessing tensor memory, with no "
                          "tcgen05.fence::after_thread_sync in between (PTX's tcgen05 cross-thread pattern)")


def _tmem_access(th, loc, what):
    _tcgen05_after_sync(th, loc, what)
    th.tmem_since_arrive = True
    th.tmem_unfenced = loc


def _bool(x):
    return bool(unwrap(x))


def _check_smem(x, what):
    if not isinstance(x, SmemDesc):
        raise SimulationError(f"{what} must be a shared memory descriptor, got {x!r}")


def _check_tmem(x, what):
    if not isinstance(x, TmemDesc):
        raise SimulationError(f"{what} must be a tensor memory descriptor, got {x!r}")


# ====================================================================================== builtins: core

def program_id(axis):
    th = current()
    return Tensor(torch.tensor(th.prog.pid[int(unwrap(axis))], dtype=torch.int32), tlc.int32)


def num_programs(axis):
    th = current()
    return Tensor(torch.tensor(th.prog.grid[int(unwrap(axis))], dtype=torch.int32), tlc.int32)


def num_warps():
    return current().num_warps


def num_ctas():
    return 1


def thread_barrier():
    th = current()
    th.prog.yield_point(th)


def warp_specialize(functions_and_args, worker_num_warps=None, worker_num_regs=None, *rest, **kw):
    th = current()
    prog = th.prog
    loc = _loc()
    # 3.6.0 API: warp_specialize([(default_fn, args), (worker_fn, args), ...], worker_num_warps, worker_num_regs)
    # (the pre-3.5 API (default_args, default_fn, worker_args, worker_fns, warps, regs) is accepted too)
    def _is_pair(p):
        return isinstance(p, (list, tuple)) and len(p) == 2 and callable(p[0]) and isinstance(p[1], tuple)

    if rest or not isinstance(functions_and_args, (list, tuple)) or not all(_is_pair(p) for p in functions_and_args):
        if len(rest) != 3:
            raise SimulationError(f"gl.warp_specialize: expected [(fn, args), ...], worker_num_warps, "
                                  f"worker_num_regs at {loc}")
        default_args, default_fn, worker_args, worker_fns = functions_and_args, worker_num_warps, \
            worker_num_regs, rest[0]
        worker_num_warps, worker_num_regs = rest[1], rest[2]
        functions_and_args = [(default_fn, default_args)] + [(f, worker_args) for f in worker_fns]
    if th.in_ws or th is not prog.main:
        raise SimulationError(f"nested gl.warp_specialize is not supported (at {loc})")
    worker_num_warps = [int(unwrap(w)) for w in worker_num_warps]
    if len(worker_num_warps) != len(functions_and_args) - 1:
        raise SimulationError(f"warp specialize got {len(functions_and_args) - 1} partitions but "
                              f"{len(worker_num_warps)} warp counts")
    if worker_num_regs is not None and len(worker_num_regs) != len(worker_num_warps):
        raise SimulationError(f"warp specialize got {len(functions_and_args) - 1} partitions but "
                              f"{len(worker_num_regs)} register counts")
    for fn, args in functions_and_args:
        if not isinstance(args, tuple):
            raise SimulationError(f"function arguments must be a tuple of arguments, but got {type(args)}")
    default_fn, default_args = functions_and_args[0]
    workers = []
    for i, (fn, args) in enumerate(functions_and_args[1:]):
        name = getattr(fn, "__name__", f"worker{i}")
        workers.append(prog.spawn(fn, args, name, f"worker {i}", worker_num_warps[i], th))
    th.tick()
    old_name, old_role = th.name, th.role
    th.name, th.role, th.in_ws = getattr(default_fn, "__name__", "default"), "default", True
    try:
        prog.yield_point(th)
        result = default_fn(*default_args)
        prog.block_on(th, JoinWait(workers, loc))
    finally:
        th.in_ws = False
    th.name, th.role = old_name, old_role
    for w in workers:
        vc_join(th.vc, w.vc)
    return result


# ====================================================================================== builtins: memory

def allocate_shared_memory(element_ty, shape, layout, value=None):
    th = current()
    prog = th.prog
    loc = _loc()
    dtype = as_gl(element_ty)
    shape = [int(unwrap(s)) for s in unwrap(shape)]
    layout = unwrap(layout)
    nbytes = math.prod(shape) * nbytes_of(dtype)
    alloc = Allocation(prog, "smem", prog.alloc_name(loc, "smem"), dtype, shape, layout, nbytes, loc)
    prog.register_smem(alloc)
    desc = SmemDesc(alloc, dtype, 0, shape, contiguous_strides(shape), layout, alloc.name, shape)
    if value is not None:
        smem_store(desc, value, _loc=loc)
    return desc


def smem_load(self, layout):
    th = current()
    loc = _loc()
    layout = unwrap(layout)
    if not isinstance(layout, DistributedLayout):
        raise SimulationError(f"expected 'layout' to be a DistributedLayout but got {layout}")
    th.prog.yield_point(th)
    _sync_access(th, self, False, loc, "reads (shared_memory_descriptor.load)")
    return Tensor(self.tensor().clone(), self.dtype, layout)


def smem_store(self, value, _loc=None):
    th = current()
    loc = _loc or _src.capture(2)
    if not isinstance(value, Tensor):
        raise SimulationError(f"expected 'value' to be a tensor, but got a {type(value)}")
    if value.shape != self.shape:
        raise SimulationError(f"source shape {value.shape} and destination shape {self.shape} must match "
                              f"(storing into {self.path})")
    if value.dtype != self.dtype:
        raise SimulationError(f"source dtype {value.dtype} and destination dtype {self.dtype} must match "
                              f"(storing into {self.path})")
    th.prog.yield_point(th)
    _sync_access(th, self, True, loc, "writes (shared_memory_descriptor.store)")
    self.tensor().copy_(value.t)


def _smem_index(self, index):
    return self.index_view(int(unwrap(index)))


def _smem_slice(self, start, length, dim=0):
    return self.slice_view(int(unwrap(start)), int(unwrap(length)), int(unwrap(dim)))


def _smem_permute(self, order):
    return self.permute_view([int(unwrap(o)) for o in unwrap(order)])


def _smem_reshape(self, shape):
    return self.reshape_view([int(unwrap(s)) for s in unwrap(shape)])


def _smem_reinterpret(self, dtype, shape, layout):
    return self.reinterpret_view(as_gl(dtype), [int(unwrap(s)) for s in unwrap(shape)], unwrap(layout))


def _keep_alive(self):
    return None


SmemDesc.load = smem_load
SmemDesc.store = smem_store
SmemDesc.index = _smem_index
SmemDesc.slice = _smem_slice
SmemDesc.permute = _smem_permute
SmemDesc.reshape = _smem_reshape
SmemDesc._reinterpret = _smem_reinterpret
SmemDesc.reinterpret = _smem_reinterpret
SmemDesc._keep_alive = _keep_alive


def allocate_tensor_memory(element_ty, shape, layout, value=None):
    th = current()
    prog = th.prog
    loc = _loc()
    dtype = as_gl(element_ty)
    shape = [int(unwrap(s)) for s in unwrap(shape)]
    layout = unwrap(layout)
    if len(shape) not in (2, 3):
        raise SimulationError(f"tensor memory allocations must be 2-D or 3-D, got {shape} at {loc}")
    M, cols, _cs = tmem_geometry(dtype, shape, layout)
    nbuf = shape[0] if len(shape) == 3 else 1
    total_cols = nbuf * cols * max(1, -(-M // 128))
    rowpitch = cols * 4
    alloc = Allocation(prog, "tmem", prog.alloc_name(loc, "tmem"), dtype, shape, layout, nbuf * M * rowpitch, loc,
                       cols=total_cols)
    prog.register_tmem(alloc)
    desc = TmemDesc.make(alloc, dtype, 0, shape, layout, rowpitch, alloc.name)
    if value is not None:
        tmem_store(desc, value, _loc=loc)
    return desc


def tmem_load(self, layout):
    th = current()
    loc = _loc()
    if self.rank != 2:
        raise SimulationError(f"only 2-D tensor memory descriptors can be loaded, {self.path} is {self.shape}")
    th.prog.yield_point(th)
    _sync_access(th, self, False, loc, "reads (tensor_memory_descriptor.load)")
    _tmem_access(th, loc, "loads tensor memory")
    return Tensor(self.tensor().clone(), self.dtype, unwrap(layout))


def tmem_store(self, value, pred=True, _loc=None):
    th = current()
    loc = _loc or _src.capture(2)
    if not isinstance(value, Tensor):
        raise SimulationError(f"expected a tensor to store into {self.path}, got {value!r}")
    if value.shape != self.shape:
        raise SimulationError(f"source shape {value.shape} does not match destination shape {self.shape} "
                              f"({self.path})")
    if value.dtype != self.dtype:
        raise SimulationError(f"source dtype {value.dtype} does not match destination dtype {self.dtype} "
                              f"({self.path})")
    if not _bool(pred):
        return
    th.prog.yield_point(th)
    _sync_access(th, self, True, loc, "writes (tensor_memory_descriptor.store)")
    _tmem_access(th, loc, "stores tensor memory")
    self.tensor().copy_(value.t)


def _tmem_index(self, index):
    return self.index_view(int(unwrap(index)))


def _tmem_slice(self, start, length):
    return self.slice_view(int(unwrap(start)), int(unwrap(length)))


def _tmem_reinterpret(self, dtype, shape, layout):
    return self.reinterpret_view(as_gl(dtype), [int(unwrap(s)) for s in unwrap(shape)], unwrap(layout))


TmemDesc.load = tmem_load
TmemDesc.store = tmem_store
TmemDesc.index = _tmem_index
TmemDesc.slice = _tmem_slice
TmemDesc._reinterpret = _tmem_reinterpret
TmemDesc.reinterpret = _tmem_reinterpret


def fence_async_shared(cluster=False):
    th = current()
    prog = th.prog
    for a in prog._live(prog.smem_allocs):
        a.fence(th.id, th.vc)
    prog.yield_point(th)


# ====================================================================================== builtins: mbarrier

def mbarrier_init(mbarrier, count):
    th = current()
    loc = _loc()
    bar = barrier_of(mbarrier)
    count = int(unwrap(count))
    if count < 1:
        raise SimulationError(f"mbarrier.init count must be >= 1, got {count} at {loc}")
    if bar.initialized and not bar.invalidated:
        raise SimulationError(f"mbarrier {bar.name} initialized twice without mbarrier.invalidate (first init at "
                              f"{bar.init_loc}, again at {loc})")
    bar.initialized, bar.invalidated = True, False
    bar.count = bar.pending = count
    bar.tx = 0
    bar.phase = 0
    bar.cur_vc, bar.last_vc = {}, {}
    bar.reset_phase_stats()
    bar.init_loc = loc
    th.prog.yield_point(th)


def mbarrier_invalidate(mbarrier):
    th = current()
    loc = _loc()
    bar = barrier_of(mbarrier)
    if not bar.initialized:
        raise SimulationError(f"mbarrier.invalidate on uninitialized barrier {bar.name} at {loc}")
    for op in th.prog.ops:
        if getattr(op, "bar", None) is bar or bar in getattr(op, "bars", ()):
            raise HazardError(f"mbarrier {bar.name} invalidated at {loc} while {op.who()} at {op.loc} will still "
                              "signal it")
    bar.invalidated = True
    th.prog.yield_point(th)


def _live_bar(mbarrier, loc, what):
    bar = barrier_of(mbarrier)
    if not bar.initialized:
        raise SimulationError(f"{what} on uninitialized mbarrier {bar.name} at {loc}")
    if bar.invalidated:
        raise SimulationError(f"{what} on invalidated mbarrier {bar.name} at {loc}")
    return bar


def mbarrier_expect(mbarrier, bytes, pred=True):
    th = current()
    loc = _loc()
    if not _bool(pred):
        return
    bar = _live_bar(mbarrier, loc, "mbarrier.expect")
    n = int(unwrap(bytes))
    bar.tx += n
    bar.expected += n
    bar.expect_locs.append(loc)
    th.prog.arrive(bar, 1, th.vc, loc, th.who())  # arrive.expect_tx
    th.tick()
    th.prog.yield_point(th)


def mbarrier_arrive(mbarrier, *, count=1, pred=True):
    th = current()
    loc = _loc()
    if not _bool(pred):
        return
    bar = _live_bar(mbarrier, loc, "mbarrier.arrive")
    if th.tmem_unfenced is not None:
        raise HazardError(f"partition `{th.name}` arrives on mbarrier {bar.name} at {loc} after accessing tensor "
                          f"memory at {th.tmem_unfenced} with no tcgen05.fence::before_thread_sync in between "
                          "(PTX's tcgen05 cross-thread pattern)")
    if th.tmem_since_arrive:   # this arrive publishes TMEM work: its waiters need the after-fence
        bar.tmem_arrivals.append(loc)
        th.tmem_since_arrive = False
    th.prog.arrive(bar, int(unwrap(count)), th.vc, loc, th.who())
    th.tick()
    th.prog.yield_point(th)


def mbarrier_wait(mbarrier, phase, pred=True, deps=()):
    th = current()
    prog = th.prog
    loc = _loc()
    if not _bool(pred):
        return
    bar = _live_bar(mbarrier, loc, "mbarrier.wait")
    parity = int(unwrap(phase)) & 1
    prog.yield_point(th)
    prog.block_on(th, BarrierWait(bar, parity, mbarrier.path, loc))
    if bar.invalidated:
        raise SimulationError(f"mbarrier {bar.name} was invalidated while partition `{th.name}` waited on it at "
                              f"{loc}")
    vc_join(th.vc, bar.last_vc)
    if bar.last_tmem_arrivals:
        th.await_after_fence = (loc, bar.name)


# ====================================================================================== builtins: TMA

def _coords(coord, desc, loc):
    coord = unwrap(coord)
    cs = [int(unwrap(c)) for c in coord]
    if len(cs) != len(desc.block_shape):
        raise SimulationError(f"TMA coordinates {cs} do not match the rank of descriptor {desc.name} at {loc}")
    return cs


def _check_box(desc, smem, loc, what):
    if not isinstance(desc, DeviceDesc):
        raise SimulationError(f"{what}: expected a tensor descriptor, got {desc!r} at {loc}")
    _check_smem(smem, f"{what} shared memory operand")
    if smem.dtype != desc.dtype:
        raise SimulationError(f"{what}: shared memory {smem.path} has dtype {smem.dtype} but descriptor "
                              f"{desc.name} has {desc.dtype} at {loc}")
    if list(smem.shape) != list(desc.block_shape):
        raise SimulationError(f"{what}: shared memory {smem.path} has shape {smem.shape} but descriptor "
                              f"{desc.name} has block shape {desc.block_shape} at {loc}")
    if not smem.is_contiguous():
        raise SimulationError(f"{what}: shared memory view {smem.path} is not contiguous at {loc}")


def async_copy_global_to_shared(tensor_desc, coord, barrier, result, pred=True):
    th = current()
    prog = th.prog
    loc = _loc()
    if not _bool(pred):
        return
    _check_box(tensor_desc, result, loc, "tma.async_copy_global_to_shared")
    bar = _live_bar(barrier, loc, "tma.async_copy_global_to_shared")
    op = TmaLoad(prog, th, loc, tensor_desc, _coords(coord, tensor_desc, loc), result, bar)
    op.access(result, True, "writes (TMA load destination)")
    bar.copy_locs.append(loc)
    prog.ops.append(op)
    th.tick()
    prog.yield_point(th)


def async_copy_shared_to_global(tensor_desc, coord, src):
    th = current()
    prog = th.prog
    loc = _loc()
    _check_box(tensor_desc, src, loc, "tma.async_copy_shared_to_global")
    op = TmaStore(prog, th, loc, tensor_desc, _coords(coord, tensor_desc, loc), src)
    op.access(src, False, "reads (TMA store source)")
    prog.ops.append(op)
    th.stores.append(op)
    th.tick()
    prog.yield_point(th)


def store_wait(pendings):
    th = current()
    prog = th.prog
    n = int(unwrap(pendings))
    keep = th.stores[len(th.stores) - n:] if n > 0 else []
    retire = th.stores[:max(0, len(th.stores) - n)]
    for op in retire:
        prog.force(op)
        vc_join(th.vc, op.vc)
        op.retired = True
    th.stores = keep
    prog.yield_point(th)


def make_tensor_descriptor(base, shape, strides, block_shape, layout, padding_option="zero"):
    if not isinstance(base, PtrTensor) or base.offs.dim():
        raise SimulationError("make_tensor_descriptor needs a scalar pointer base")
    shape = [int(unwrap(s)) for s in unwrap(shape)]
    strides = [int(unwrap(s)) for s in unwrap(strides)]
    if strides[-1] != 1:
        raise SimulationError(f"Tensor descriptor last dim must be 1 but got {strides[-1]}")
    return DeviceDesc(base, shape, strides, unwrap(block_shape), layout, unwrap(padding_option), base.name)


def _not_modelled(name):
    def f(*a, **k):
        raise SimulationError(f"{name} is not modelled by the Gluon simulator")
    f.__name__ = name
    return f


# ====================================================================================== builtins: cluster launch control

def clc_try_cancel(result, barrier):
    """clc.try_cancel (Blackwell, triton >= 3.8): ask to take over a program not started yet. Asynchronous: the
    16-byte response lands in `result` and completes 16 transaction bytes on `barrier` (PTX's complete_tx), so the
    issuer must have expected them, as for a TMA load."""
    th = current()
    prog = th.prog
    loc = _loc()
    if not isinstance(result, SmemDesc) or not result.is_contiguous() or \
            result.numel * nbytes_of(result.dtype) != CLC_RESULT_BYTES:
        raise SimulationError(f"clc.try_cancel at {loc}: the response buffer must be {CLC_RESULT_BYTES} contiguous "
                              f"bytes of shared memory (e.g. int64 [2]), got {result!r}")
    if prog.cancel_failed_at is not None:
        raise SimulationError(f"clc.try_cancel at {loc} after a request of this program failed (completed at "
                              f"{prog.cancel_failed_at}): PTX leaves a request after a failed one undefined; stop "
                              "asking once a response says no program was cancelled")
    bar = _live_bar(barrier, loc, "clc.try_cancel")
    op = ClcTryCancel(prog, th, loc, result, bar)
    op.access(result, True, "writes (CLC response)")
    bar.copy_locs.append(loc)
    prog.ops.append(op)
    th.tick()
    prog.yield_point(th)


class ClcResult:
    """clc.load_result's value: the response in registers."""

    POISON = 2 ** 31 - 1   # program_id of a failed response is undefined: a pid no grid has

    def __init__(self, canceled, pid):
        self.canceled, self.pid = canceled, pid

    def is_canceled(self):
        return Tensor(torch.tensor(self.canceled), tlc.int1)

    def program_id(self, dim):
        value = self.pid[int(unwrap(dim))] if self.canceled else self.POISON
        return Tensor(torch.tensor(value, dtype=torch.int32), tlc.int32)


def clc_load_result(src):
    th = current()
    loc = _loc()
    if not isinstance(src, SmemDesc) or src.numel * nbytes_of(src.dtype) != CLC_RESULT_BYTES:
        raise SimulationError(f"clc.load_result at {loc}: expected the {CLC_RESULT_BYTES}-byte response buffer, "
                              f"got {src!r}")
    th.prog.yield_point(th)
    _sync_access(th, src, False, loc, "reads (clc.load_result)")
    canceled, packed = (int(w) for w in src.tensor().reshape(-1).view(torch.uint8).view(torch.int64))
    mask = (1 << 21) - 1
    return ClcResult(bool(canceled), (packed & mask, packed >> 21 & mask, packed >> 42 & mask))


# ====================================================================================== builtins: tcgen05

def tcgen05_mma(a, b, acc, *, use_acc=True, pred=True, mbarriers=None, mbarrier_preds=None):
    th = current()
    prog = th.prog
    loc = _loc()
    if not isinstance(a, (SmemDesc, TmemDesc)):
        raise SimulationError(f"tcgen05_mma: a must be in shared or tensor memory, got {a!r} at {loc}")
    if isinstance(b, TmemDesc):
        raise SimulationError(f"tcgen05_mma: b must be in shared memory (Triton 3.6.0: 'RHS operand must have a "
                              f"NVMMAShared encoding'), got {b.path} at {loc}")
    _check_smem(b, "tcgen05_mma operand b")
    _check_tmem(acc, "tcgen05_mma accumulator")
    if isinstance(a, TmemDesc) and getattr(a.layout, "col_stride", 1) != 1:
        raise SimulationError(f"tcgen05_mma: The col stride of the LHS operand must be 1 ({a.path}) at {loc}")
    if a.rank != 2 or b.rank != 2 or acc.rank != 2:
        raise SimulationError(f"tcgen05_mma operands must be 2-D: a {a.shape}, b {b.shape}, acc {acc.shape} at {loc}")
    M, K = a.shape
    K2, N = b.shape
    if K != K2 or acc.shape != [M, N]:
        raise SimulationError(f"tcgen05_mma shape mismatch: a {a.shape} @ b {b.shape} -> acc {acc.shape} at {loc}")
    if a.dtype != b.dtype:
        raise SimulationError(f"tcgen05_mma operand dtypes differ: {a.dtype} vs {b.dtype} at {loc}")
    if not (acc.dtype.is_fp32() or acc.dtype.is_fp16() or acc.dtype.is_int32()):
        raise SimulationError(f"tcgen05_mma accumulator dtype {acc.dtype} is not supported at {loc}")
    if not _bool(pred):
        return
    _tcgen05_after_sync(th, loc, "issues tcgen05_mma")
    bars = [barrier_of(m) for m in (mbarriers or [])]
    preds = [True] * len(bars) if mbarrier_preds is None else [_bool(p) for p in mbarrier_preds]
    for bar, p in zip(bars, preds):
        if p:
            _live_bar_obj(bar, loc, "tcgen05_mma mbarrier")
    op = Tcgen05Mma(prog, th, loc, a, b, acc, _bool(use_acc), [bb for bb, p in zip(bars, preds) if p],
                    th.tc_fifo, None)
    acc_key = (id(acc.alloc), acc.offset, tuple(acc.shape), tuple(acc.strides), str(acc.dtype))
    for prev in (th.tc_by_acc.get(acc_key), th.tc_last_copy):
        if prev is not None:
            vc_join(op.vc, prev.vc)
    th.tc_by_acc[acc_key] = op
    op.access(a, False, "reads (tcgen05_mma operand a)")
    op.access(b, False, "reads (tcgen05_mma operand b)")
    op.access(acc, True, "writes (tcgen05_mma accumulator)")
    _issue_tc(th, op)


def _live_bar_obj(bar, loc, what):
    if not bar.initialized or bar.invalidated:
        raise SimulationError(f"{what} {bar.name} is not initialized (or invalidated) at {loc}")


def _issue_tc(th, op):
    th.tc_fifo.append(op)
    vc_join(th.tc_all_vc, op.vc)
    th.prog.ops.append(op)
    th.tick()
    th.prog.yield_point(th)


def tcgen05_commit(barrier):
    th = current()
    loc = _loc()
    _tcgen05_after_sync(th, loc, "issues tcgen05_commit")
    bar = _live_bar(barrier, loc, "tcgen05_commit")
    op = Tcgen05Commit(th.prog, th, loc, bar, th.tc_fifo, None)
    vc_join(op.vc, th.tc_all_vc)   # tracks every tcgen05 op this partition issued before it
    _issue_tc(th, op)


def tcgen05_copy(src, dst):
    th = current()
    loc = _loc()
    _tcgen05_after_sync(th, loc, "issues tcgen05_copy")
    _check_smem(src, "tcgen05_copy source")
    _check_tmem(dst, "tcgen05_copy destination")
    op = Tcgen05Copy(th.prog, th, loc, src, dst, th.tc_fifo, None)
    th.tc_last_copy = op
    op.access(src, False, "reads (tcgen05_copy source)")
    op.access(dst, True, "writes (tcgen05_copy destination)")
    _issue_tc(th, op)


# ====================================================================================== builtins: wgmma

def warpgroup_mma_init(value):
    return value


def warpgroup_mma(a, b, acc, *, use_acc=True, precision=None, max_num_imprecise_acc=None, is_async=False):
    th = current()
    prog = th.prog
    loc = _loc()
    if not isinstance(a, (SmemDesc, Tensor)):
        raise SimulationError(f"warpgroup_mma: a must be a shared memory descriptor or a register tensor at {loc}")
    _check_smem(b, "warpgroup_mma operand b")
    if not isinstance(acc, (Tensor, WgmmaToken)):
        raise SimulationError(f"warpgroup_mma: acc must be a tensor or an async accumulator, got {acc!r} at {loc}")
    if isinstance(acc, WgmmaToken) and acc.op.issuer is not th:
        raise SimulationError(f"warpgroup_mma accumulator from another partition at {loc}")
    M, K = a.shape
    K2, N = b.shape
    if K != K2 or list(acc.shape) != [M, N]:
        raise SimulationError(f"warpgroup_mma shape mismatch: a {a.shape} @ b {b.shape} -> acc {acc.shape} at {loc}")
    if a.dtype != b.dtype:
        raise SimulationError(f"warpgroup_mma operand dtypes differ: {a.dtype} vs {b.dtype} at {loc}")
    op = Wgmma(prog, th, loc, a, b, acc, _bool(use_acc), th.wg_fifo, th.last_wg)
    if isinstance(a, SmemDesc):
        op.access(a, False, "reads (warpgroup_mma operand a)")
    op.access(b, False, "reads (warpgroup_mma operand b)")
    th.wg_fifo.append(op)
    th.last_wg = op
    th.wgmma.append(op)
    prog.ops.append(op)
    th.tick()
    if not _bool(is_async):
        _retire_wgmma(th, 0)
        return op.result
    prog.yield_point(th)
    return WgmmaToken(op, acc if isinstance(acc, Tensor) else acc._acc)


def _retire_wgmma(th, n):
    retire = th.wgmma[:max(0, len(th.wgmma) - n)]
    for op in retire:
        th.prog.force(op)
        vc_join(th.vc, op.vc)
        op.retired = True
    th.wgmma = th.wgmma[len(retire):]


def warpgroup_mma_wait(num_outstanding=0, deps=None):
    th = current()
    if deps is None:
        raise SimulationError("warpgroup_mma_wait deps must be given")
    _retire_wgmma(th, int(unwrap(num_outstanding)))
    out = []
    for d in deps:
        if isinstance(d, WgmmaToken) and d.op.retired:
            out.append(d.op.result)
        else:
            out.append(d)
    th.prog.yield_point(th)
    if len(out) == 1:
        return out[0]
    return tuple(out)


# ====================================================================================== builtins: global memory

def _mask_and_shape(pointer, mask, other=None):
    shape = pointer.shape
    m = to_tensor(mask) if mask is not None else None
    o = to_tensor(other) if other is not None and not isinstance(other, Tensor) else other
    shape = broadcast_shapes(shape, m.shape if m is not None else [], o.shape if o is not None else [])
    return shape, m


def _bounds(pointer, offs, active, loc, what):
    sel = offs if active is None else offs[active]
    if sel.numel():
        lo, hi = int(sel.min()), int(sel.max())
        n = pointer.base.numel()
        if lo < 0 or hi >= n:
            raise SimulationError(f"out-of-bounds global {what} through pointer `{pointer.name}`: element offsets "
                                  f"[{lo}, {hi}] outside its storage of {n} elements at {loc}")


def load(pointer, mask=None, other=None, boundary_check=(), padding_option="", cache_modifier="",
         eviction_policy="", volatile=False):
    loc = _src.capture(2)
    if not isinstance(pointer, PtrTensor):
        raise SimulationError(f"gl.load expects a pointer (tensor), got {pointer!r} at {loc}")
    shape, m = _mask_and_shape(pointer, mask, other)
    offs = pointer.offs.expand(shape) if shape else pointer.offs
    active = m.t.to(torch.bool).expand(shape) if m is not None and shape else (
        m.t.to(torch.bool) if m is not None else None)
    _bounds(pointer, offs, active, loc, "load")
    base = pointer.base
    if active is None:
        vals = base[offs]
    else:
        vals = torch.zeros(shape, dtype=base.dtype)
        if shape:
            vals[active] = base[offs[active]]
        elif bool(active):
            vals = base[offs].clone()
        if other is not None:
            o = cast(to_tensor(other), pointer.elem).t
            vals = torch.where(active, vals, o.expand(shape) if shape else o)
    layout = merge_layouts(pointer.layout, m.layout if m is not None else None)
    return Tensor(vals.clone() if active is None else vals, pointer.elem, layout if shape else None)


def store(pointer, value, mask=None, boundary_check=(), cache_modifier="", eviction_policy=""):
    loc = _src.capture(2)
    if not isinstance(pointer, PtrTensor):
        raise SimulationError(f"gl.store expects a pointer (tensor), got {pointer!r} at {loc}")
    v = cast(to_tensor(value), pointer.elem)
    shape, m = _mask_and_shape(pointer, mask)
    shape = broadcast_shapes(shape, v.shape)
    if shape != pointer.shape and pointer.shape:
        raise SimulationError(f"gl.store: value of shape {v.shape} does not fit pointer shape {pointer.shape}")
    offs = pointer.offs.expand(shape) if shape else pointer.offs
    vals = v.t.expand(shape) if shape else v.t
    active = None
    if m is not None:
        active = m.t.to(torch.bool).expand(shape) if shape else m.t.to(torch.bool)
    _bounds(pointer, offs, active, loc, "store")
    base = pointer.base
    if active is None:
        base[offs.reshape(-1)] = vals.reshape(-1)
    elif shape:
        base[offs[active]] = vals[active]
    elif bool(active):
        base[offs] = vals


def _atomic(name, combine):
    def f(pointer, val, mask=None, sem=None, scope=None):
        loc = _src.capture(2)
        if not isinstance(pointer, PtrTensor):
            raise SimulationError(f"gl.{name} expects a pointer, got {pointer!r} at {loc}")
        v = cast(to_tensor(val), pointer.elem)
        shape, m = _mask_and_shape(pointer, mask)
        shape = broadcast_shapes(shape, v.shape)
        offs = (pointer.offs.expand(shape) if shape else pointer.offs).reshape(-1)
        vals = (v.t.expand(shape) if shape else v.t).reshape(-1)
        act = (m.t.to(torch.bool).expand(shape) if shape else m.t.to(torch.bool)).reshape(-1) if m is not None \
            else torch.ones(offs.numel(), dtype=torch.bool)
        _bounds(pointer, offs, act, loc, name)
        base = pointer.base
        old = torch.zeros(offs.numel(), dtype=base.dtype)
        for i in range(offs.numel()):
            if act[i]:
                o = int(offs[i])
                old[i] = base[o]
                base[o] = combine(base[o], vals[i])
        return Tensor(old.reshape(shape), pointer.elem, pointer.layout if shape else None)
    f.__name__ = name
    return f


atomic_add = _atomic("atomic_add", lambda a, b: a + b)
atomic_max = _atomic("atomic_max", lambda a, b: torch.maximum(a, b))
atomic_min = _atomic("atomic_min", lambda a, b: torch.minimum(a, b))
atomic_xchg = _atomic("atomic_xchg", lambda a, b: b)
atomic_and = _atomic("atomic_and", lambda a, b: a & b)
atomic_or = _atomic("atomic_or", lambda a, b: a | b)
atomic_xor = _atomic("atomic_xor", lambda a, b: a ^ b)


def atomic_cas(pointer, cmp, val, sem=None, scope=None):
    loc = _src.capture(2)
    c = cast(to_tensor(cmp), pointer.elem)
    v = cast(to_tensor(val), pointer.elem)
    shape = broadcast_shapes(pointer.shape, c.shape, v.shape)
    offs = (pointer.offs.expand(shape) if shape else pointer.offs).reshape(-1)
    _bounds(pointer, offs, None, loc, "atomic_cas")
    cs = (c.t.expand(shape) if shape else c.t).reshape(-1)
    vs = (v.t.expand(shape) if shape else v.t).reshape(-1)
    base = pointer.base
    old = torch.zeros(offs.numel(), dtype=base.dtype)
    for i in range(offs.numel()):
        o = int(offs[i])
        old[i] = base[o]
        if base[o] == cs[i]:
            base[o] = vs[i]
    return Tensor(old.reshape(shape), pointer.elem, pointer.layout if shape else None)


def device_assert(cond, msg="", mask=None):
    c = to_tensor(cond).t
    if mask is not None:
        c = c | ~to_tensor(mask).t.to(torch.bool)
    if not bool(c.all()):
        raise SimulationError(f"device_assert failed: {msg} at {_src.capture(2)}")


def device_print(prefix, *args, hex=False):
    th = current()
    vals = ", ".join(repr(a.t.tolist()) if isinstance(a, Tensor) else repr(a) for a in args)
    print(f"[{th.prog.pid} {th.name}] {prefix}{vals}")



# ====================================================================================== inline asm

_SREG = {"%ctaid.x": ("pid", 0), "%ctaid.y": ("pid", 1), "%ctaid.z": ("pid", 2),
         "%nctaid.x": ("grid", 0), "%nctaid.y": ("grid", 1), "%nctaid.z": ("grid", 2)}


def inline_asm_elementwise(asm, constraints, args, dtype, is_pure, pack, **kwargs):
    """Only a few PTX idioms are modelled: register moves (identity / bitcast, e.g. `mov.b32 $0, $1;` used as an
    optimisation barrier), reads of %ctaid / %nctaid, tcgen05 thread-sync fences (no-ops here), `fence.proxy.async`
    (= fence_async_shared) and `tanh.approx.f32` (as fp32 tanh: the hardware's error, <= 2^-11 relative, is not
    modelled; tests/test_fast_tanh.py bounds what it does to attention). Anything else raises SimulationError."""
    th = current()
    loc = _src.capture(2)
    asm = unwrap(asm)
    dtype = unwrap(dtype)
    if isinstance(dtype, (tuple, list)):
        raise SimulationError(f"inline_asm_elementwise with several outputs is not modelled at {loc}")
    dtype = as_gl(dtype)
    args = [to_tensor(a) for a in (unwrap(args) or [])]
    shape = broadcast_shapes(*[a.shape for a in args]) if args else []
    layout = merge_layouts(*[a.layout for a in args]) if args else None
    result = None
    for raw in asm.replace("\n", ";").split(";"):
        ins = raw.strip()
        if not ins:
            continue
        if ins.startswith("tcgen05.fence::before_thread_sync"):
            th.tmem_unfenced = None
            continue
        if ins.startswith("tcgen05.fence::after_thread_sync"):
            th.await_after_fence = None
            continue
        if ins.startswith("fence.proxy.async"):
            fence_async_shared()
            continue
        op, _, operands = ins.partition(" ")
        ops = [o.strip() for o in operands.split(",")]
        if op == "tanh.approx.f32" and len(ops) == 2 and ops[0] == "$0" and ops[1] == "$1" and len(args) == 1:
            x = args[0].t.to(torch.float32).expand(shape)
            result = Tensor(torch.tanh(x), tlc.float32, layout if shape else None)
            continue
        if op.split(".")[0] == "mov" and len(ops) == 2 and ops[0] == "$0":
            src = ops[1]
            if src in _SREG:
                kind, axis = _SREG[src]
                v = (th.prog.pid if kind == "pid" else th.prog.grid)[axis]
                t = torch.full(shape, v, dtype=to_torch(dtype))
                result = Tensor(t, dtype, layout if shape else None)
                continue
            if src.startswith("$") and src[1:].isdigit():
                a = args[int(src[1:]) - 1]
                if a.dtype.primitive_bitwidth == dtype.primitive_bitwidth and a.dtype != dtype:
                    a = cast(a, dtype, bitcast=True)
                elif a.dtype != dtype:
                    a = cast(a, dtype)
                t = a.t.expand(shape).clone() if shape else a.t.clone()
                result = Tensor(t, dtype, layout if shape else None)
                continue
        raise SimulationError(f"inline_asm_elementwise: PTX `{ins}` is not modelled by the simulator at {loc}")
    if result is None:
        raise SimulationError(f"inline_asm_elementwise: the asm never writes $0 ({asm!r}) at {loc}")
    th.prog.yield_point(th)
    return result
