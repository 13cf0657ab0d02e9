"""Shared memory, tensor memory, mbarriers and the access records used for hazard detection.

Every allocation owns a byte buffer (initialised to 0xFF, i.e. NaN for floats, so reads of never-written memory
show up in results). Descriptors are typed strided views over it (offset/shape/strides in elements of the view's
dtype), so `.index`, `.slice`, `.permute`, `.reshape` and `._reinterpret` alias exactly like the real memory.

Tensor memory is modelled as rows x 32-bit columns per buffer: a [M, N] view of a b-bit dtype with
TensorMemoryLayout(col_stride=cs) uses N*b*cs/32 columns; packed 16-bit data (cs=1) puts element 2j in the
low half of column j, unpacked (cs=2) puts one element in the low half of each column.

Hazards are detected with vector clocks (happens-before), not by timing: each access to a region records
(actor, clock); a later conflicting access (at least one write) whose actor has not observed that record through
barrier waits / wgmma waits / store waits / program order is a hazard, whatever order the scheduler picked.
"""
from __future__ import annotations

import dataclasses

import math

import numpy as np
import torch

from ._dtypes import nbytes_of, to_torch
from .errors import HazardError, SimulationError


def vc_join(dst: dict, src: dict) -> None:
    for k, v in src.items():
        if dst.get(k, 0) < v:
            dst[k] = v


def contiguous_strides(shape):
    strides = []
    acc = 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= s
    return list(reversed(strides))


class Access:
    """One recorded access to a region of an allocation."""
    __slots__ = ("mask", "write", "actor", "clock", "who", "loc", "path", "generic", "fenced", "what")

    def __init__(self, mask, write, actor, clock, who, loc, path, generic, what):
        self.mask = mask
        self.write = write
        self.actor = actor
        self.clock = clock
        self.who = who          # "partition `x`" or "async tcgen05_mma issued by partition `x`"
        self.loc = loc          # _src.Loc
        self.path = path        # e.g. "a_smem.index(2)"
        self.generic = generic  # access through the generic proxy (ld/st.shared by threads)
        self.fenced = False     # generic access followed by fence_async_shared
        self.what = what        # "reads" / "writes" phrase

    def describe(self):
        return f"{self.who} {self.what} {self.path} at\n{self.loc.format('      ')}"


class Allocation:
    def __init__(self, program, kind, name, dtype, shape, layout, nbytes, loc, cols=0):
        self.program = program
        self.kind = kind          # "smem" | "tmem"
        self.name = name
        self.dtype = dtype
        self.shape = list(shape)
        self.layout = layout
        self.nbytes = nbytes
        self.loc = loc
        self.cols = cols          # TMEM columns (32-bit) of the allocation
        padded = max(16, (nbytes + 15) // 16 * 16)
        self.data = torch.full((padded,), 0xFF, dtype=torch.uint8)
        self._typed = {}
        self._masks = {}
        self.records: list[Access] = []
        self.barriers = {}

    def typed(self, tdt: torch.dtype) -> torch.Tensor:
        t = self._typed.get(tdt)
        if t is None:
            t = self.data.view(tdt)
            self._typed[tdt] = t
        return t

    def label(self):
        what = "shared memory" if self.kind == "smem" else "tensor memory"
        return f"{what} `{self.name}` ({self.loc.short})"

    # ------------------------------------------------------------------ region masks (python int bitsets)
    def mask(self, offset, shape, strides, es):
        key = (offset, tuple(shape), tuple(strides), es)
        m = self._masks.get(key)
        if m is not None:
            return m
        n = math.prod(shape)
        if n == 0:
            m = 0
        elif list(strides) == contiguous_strides(shape) or n == 1:
            m = ((1 << (n * es)) - 1) << (offset * es)
        else:
            idx = np.full([1] * len(shape), offset, dtype=np.int64)
            for d, (s, st) in enumerate(zip(shape, strides)):
                r = np.arange(s, dtype=np.int64) * st
                idx = idx + r.reshape([s if i == d else 1 for i in range(len(shape))])
            b = (idx.reshape(-1, 1) * es + np.arange(es, dtype=np.int64)).reshape(-1)
            arr = np.zeros(self.data.numel(), dtype=bool)
            arr[b] = True
            m = int.from_bytes(np.packbits(arr, bitorder="little").tobytes(), "little")
        self._masks[key] = m
        return m

    # ------------------------------------------------------------------ hazard checks
    def access(self, mask, write, actor_id, vc, who, loc, path, generic, async_proxy, what):
        """Check an access against the records, then record it."""
        smem = self.kind == "smem"
        for r in self.records:
            if not (r.mask & mask):
                continue
            ordered = r.actor == actor_id or vc.get(r.actor, 0) >= r.clock
            if not ordered and (r.write or write):
                cur = Access(mask, write, actor_id, 0, who, loc, path, generic, what)
                kind = "write-after-write" if (r.write and write) else ("read-after-write" if r.write
                                                                          else "write-after-read")
                raise HazardError(
                    f"{kind} hazard on {self.label()}: region {path}\n"
                    f"  earlier: {r.describe()}\n"
                    f"  later:   {cur.describe()}\n"
                    f"  the earlier access has not been ordered before the later one by a completed barrier "
                    f"wait (or wgmma/TMA-store wait) observed by {who.split(' issued by ')[-1]}")
            if smem and async_proxy and r.generic and not r.fenced and (r.write or write):
                cur = Access(mask, write, actor_id, 0, who, loc, path, generic, what)
                raise HazardError(
                    f"missing fence_async_shared on {self.label()}: region {path}\n"
                    f"  generic-proxy access: {r.describe()}\n"
                    f"  async-proxy access:   {cur.describe()}\n"
                    f"  a generic-proxy (ld/st.shared) access must be followed by fence_async_shared() before an "
                    f"async-proxy (TMA / MMA) access to the same memory")
        rec = Access(mask, write, actor_id, vc.get(actor_id, 0), who, loc, path, generic, what)
        # prune records made redundant by this one (covered and ordered before it)
        keep = []
        for r in self.records:
            covered = (r.mask & ~mask) == 0
            ordered = r.actor == actor_id or vc.get(r.actor, 0) >= r.clock
            if covered and ordered and (write or not r.write) and (r.fenced or not r.generic or generic):
                continue
            keep.append(r)
        keep.append(rec)
        self.records = keep
        return rec

    def fence(self, actor_id, vc):
        for r in self.records:
            if r.generic and not r.fenced and (r.actor == actor_id or vc.get(r.actor, 0) >= r.clock):
                r.fenced = True


class _DescType:
    def __init__(self, d):
        self.element_ty = d.dtype
        self.shape = list(d.shape)
        self.layout = d.layout
        self.alloc_shape = list(d.alloc_shape)

    def __repr__(self):
        return f"memdesc<{self.shape}, {self.element_ty}, {self.layout}>"


class _MemDesc:
    """Common part of shared / tensor memory descriptors: a typed strided view of an Allocation."""
    __slots__ = ("alloc", "dtype", "offset", "shape", "strides", "layout", "path", "alloc_shape", "rowpitch")

    def __init__(self, alloc, dtype, offset, shape, strides, layout, path, alloc_shape=None, rowpitch=0):
        self.alloc = alloc
        self.dtype = dtype
        self.offset = offset
        self.shape = list(shape)
        self.strides = list(strides)
        self.layout = layout
        self.path = path
        self.alloc_shape = list(alloc_shape if alloc_shape is not None else shape)
        self.rowpitch = rowpitch
        es = nbytes_of(dtype)
        if self.shape:
            last = offset + sum((s - 1) * st for s, st in zip(self.shape, self.strides))
        else:
            last = offset
        if offset < 0 or (last + 1) * es > alloc.nbytes:
            raise SimulationError(f"view {path} ({self.shape} {dtype}) exceeds {alloc.label()} of {alloc.nbytes} "
                                  "bytes")

    @property
    def type(self):
        return _DescType(self)

    @property
    def rank(self):
        return len(self.shape)

    @property
    def numel(self):
        return math.prod(self.shape)

    @property
    def nbytes(self):
        return self.numel * nbytes_of(self.dtype)

    @property
    def es(self):
        return nbytes_of(self.dtype)

    def tensor(self) -> torch.Tensor:
        return torch.as_strided(self.alloc.typed(to_torch(self.dtype)), self.shape, self.strides, self.offset)

    def region(self):
        return self.alloc.mask(self.offset, self.shape, self.strides, self.es)

    def is_contiguous(self):
        return self.strides == contiguous_strides(self.shape) or self.numel <= 1

    def __repr__(self):
        return f"{type(self).__name__}({self.path}, {self.shape}, {self.dtype})"

    def __str__(self):
        return self.path

    def _index_path(self, i):
        return f"{self.path}.index({i})"


def fmt_index(i):
    return str(int(i))


class SmemDesc(_MemDesc):
    """gl.shared_memory_descriptor"""
    __slots__ = ()

    def sub(self, offset, shape, strides, path, layout=None, alloc_shape=None):
        return SmemDesc(self.alloc, self.dtype, offset, shape, strides, layout or self.layout, path,
                        alloc_shape if alloc_shape is not None else self.alloc_shape)

    def index_view(self, i):
        i = int(i)
        if not self.shape:
            raise SimulationError(f"cannot index the 0-d descriptor {self.path}")
        if not 0 <= i < self.shape[0]:
            raise SimulationError(f"index {i} out of range for {self.path} with shape {self.shape}")
        return SmemDesc(self.alloc, self.dtype, self.offset + i * self.strides[0], self.shape[1:],
                        self.strides[1:], self.layout, self._index_path(i), self.shape[1:])

    def slice_view(self, start, length, dim=0):
        start, length, dim = int(start), int(length), int(dim)
        if dim < 0:
            dim += self.rank
        if start < 0 or start + length > self.shape[dim]:
            raise SimulationError(f"slice [{start}:{start + length}] of dim {dim} out of range for {self.path} "
                                  f"with shape {self.shape}")
        shape = list(self.shape)
        shape[dim] = length
        return SmemDesc(self.alloc, self.dtype, self.offset + start * self.strides[dim], shape, self.strides,
                        self.layout, f"{self.path}.slice({start}, {length}, dim={dim})", self.alloc_shape)

    def permute_view(self, order):
        order = [int(o) for o in order]
        if sorted(order) != list(range(self.rank)):
            raise SimulationError(f"invalid permutation {order} for {self.path} of rank {self.rank}")
        return SmemDesc(self.alloc, self.dtype, self.offset, [self.shape[o] for o in order],
                        [self.strides[o] for o in order], _permuted_layout(self.layout, order),
                        f"{self.path}.permute({tuple(order)})", self.alloc_shape)

    def reshape_view(self, shape):
        shape = [int(s) for s in shape]
        if math.prod(shape) != self.numel:
            raise SimulationError(f"memdesc_reshape total elements mismatch: {self.shape} -> {shape}")
        if not self.is_contiguous():
            raise SimulationError(f"reshape of the non-contiguous shared memory view {self.path} is not modelled")
        return SmemDesc(self.alloc, self.dtype, self.offset, shape, contiguous_strides(shape), self.layout,
                        f"{self.path}.reshape({shape})", shape)

    def reinterpret_view(self, dtype, shape, layout):
        shape = [int(s) for s in shape]
        if not self.is_contiguous():
            raise SimulationError(f"_reinterpret of the non-contiguous shared memory view {self.path}")
        byte_off = self.offset * self.es
        nes = nbytes_of(dtype)
        if byte_off % nes:
            raise SimulationError(f"_reinterpret of {self.path} to {dtype}: misaligned offset")
        return SmemDesc(self.alloc, dtype, byte_off // nes, shape, contiguous_strides(shape), layout,
                        f"{self.path}._reinterpret({dtype}, {shape})", shape)


def _permuted_layout(layout, order):
    # NVMMASharedLayout of a transposed view flips `transposed`; other layouts are carried unchanged.
    try:
        from triton.experimental.gluon.language._layouts import NVMMASharedLayout
        if isinstance(layout, NVMMASharedLayout) and len(order) == 2 and order == [1, 0]:
            return NVMMASharedLayout(layout.swizzle_byte_width, layout.element_bitwidth, layout.rank,
                                     not layout.transposed, layout.fp4_padded, layout.cga_layout)
    except Exception:  # pragma: no cover - layout API drift: carry the layout unchanged
        pass
    return layout


def tmem_geometry(dtype, shape, layout):
    """(rows, 32-bit columns per buffer, element column stride) of a TMEM [.., M, N] view."""
    bits = dtype.primitive_bitwidth
    cs = int(getattr(layout, "col_stride", 1))
    if bits * cs > 32 and bits < 32:
        raise SimulationError(f"TensorMemoryLayout col_stride={cs} is invalid for {bits}-bit {dtype}")
    if bits == 32 and cs != 1:
        raise SimulationError(f"32-bit tensor memory needs col_stride=1, got {cs}")
    M, N = int(shape[-2]), int(shape[-1])
    cols = -(-N * bits * cs // 32)
    return M, cols, cs


class TmemDesc(_MemDesc):
    """tensor_memory_descriptor"""
    __slots__ = ()

    @staticmethod
    def make(alloc, dtype, offset_bytes, shape, layout, rowpitch, path, alloc_shape=None):
        es = nbytes_of(dtype)
        M, cols, cs = tmem_geometry(dtype, shape, layout)
        if offset_bytes % es or rowpitch % es:
            raise SimulationError(f"misaligned tensor memory view {path}")
        row = rowpitch // es
        strides = [row, cs]
        if len(shape) == 3:
            strides = [M * row, row, cs]
        elif len(shape) != 2:
            raise SimulationError(f"tensor memory descriptors must be 2-D or 3-D, got shape {shape}")
        return TmemDesc(alloc, dtype, offset_bytes // es, shape, strides, layout, path, alloc_shape or shape,
                        rowpitch)

    def index_view(self, i):
        i = int(i)
        if self.rank != 3:
            raise SimulationError(f"index() needs a 3-D tensor memory descriptor, {self.path} is {self.shape}")
        if not 0 <= i < self.shape[0]:
            raise SimulationError(f"index {i} out of range for {self.path} with shape {self.shape}")
        return TmemDesc(self.alloc, self.dtype, self.offset + i * self.strides[0], self.shape[1:], self.strides[1:],
                        self.layout, self._index_path(i), self.shape[1:], self.rowpitch)

    def slice_view(self, start, length):
        from triton.experimental.gluon.language.nvidia.blackwell import TensorMemoryLayout
        start, length = int(start), int(length)
        if start < 0 or start + length > self.shape[-1]:
            raise SimulationError(f"tensor memory slice [{start}:{start + length}] out of range for {self.path} "
                                  f"with shape {self.shape}")
        lay = self.layout
        if isinstance(lay, TensorMemoryLayout):   # a dataclass whose other fields differ between Triton releases
            lay = dataclasses.replace(lay, block=(lay.block[0], min(lay.block[1], length)))
        shape = self.shape[:-1] + [length]
        return TmemDesc(self.alloc, self.dtype, self.offset + start * self.strides[-1], shape, self.strides, lay,
                        f"{self.path}.slice({start}, {length})", self.alloc_shape, self.rowpitch)

    def reinterpret_view(self, dtype, shape, layout):
        shape = [int(s) for s in shape]
        return TmemDesc.make(self.alloc, dtype, self.offset * self.es, shape, layout, self.rowpitch,
                             f"{self.path}._reinterpret({dtype}, {shape})", shape)


class Barrier:
    """State of one mbarrier (an int64 slot of a shared memory allocation)."""

    def __init__(self, alloc, offset, name):
        self.alloc_label = alloc.label()
        self.offset = offset
        self.name = name
        self.initialized = False
        self.invalidated = False
        self.count = 0
        self.pending = 0       # arrivals still missing in the current phase
        self.tx = 0            # transaction bytes still missing in the current phase (expect - delivered)
        self.phase = 0         # number of completed phases; the current phase has parity phase & 1
        self.cur_vc = {}       # join of the clocks of everything that arrived in the current phase
        self.last_vc = {}      # clock of the last completed phase (what a waiter observes)
        self.expected = 0      # bytes declared by mbarrier.expect in the current phase
        self.delivered = 0     # bytes delivered by TMA in the current phase
        self.expect_locs = []
        self.copy_locs = []
        self.arrive_locs = []
        self.tmem_arrivals = []   # this phase's arrivals by partitions that accessed TMEM (tcgen05 hand-offs)
        self.last_tmem_arrivals = []
        self.init_loc = None

    def reset_phase_stats(self):
        self.expected = 0
        self.delivered = 0
        self.expect_locs = []
        self.copy_locs = []
        self.arrive_locs = []

    def state(self):
        s = (f"current phase {self.phase} (parity {self.phase & 1}), {self.pending} of {self.count} arrivals "
             f"pending")
        if self.tx or self.expected or self.delivered:
            s += (f", tx bytes pending {self.tx} (expected {self.expected} via mbarrier.expect, "
                  f"TMA delivered {self.delivered} so far this phase)")
        return s


def barrier_of(desc) -> Barrier:
    if not isinstance(desc, SmemDesc):
        raise SimulationError(f"expected an mbarrier (shared memory descriptor), got {desc!r}")
    if desc.numel != 1 or desc.dtype.primitive_bitwidth != 64:
        raise SimulationError(f"mbarrier operations need a single int64 slot, got {desc.path} with shape "
                              f"{desc.shape} {desc.dtype}")
    alloc = desc.alloc
    b = alloc.barriers.get(desc.offset)
    if b is None:
        b = Barrier(alloc, desc.offset, barrier_name(desc))
        alloc.barriers[desc.offset] = b
    return b


def barrier_name(desc) -> str:
    """`ready.index(2)` -> `ready[2]`, `q_ready.index(1).index(0)` -> `q_ready[1][0]`."""
    alloc = desc.alloc
    idx = np.unravel_index(desc.offset, alloc.shape) if alloc.shape else ()
    # drop trailing singleton dims (the usual [N, 1] barrier arrays)
    dims = list(zip(idx, alloc.shape))
    while dims and dims[-1][1] == 1:
        dims.pop()
    return alloc.name + "".join(f"[{int(i)}]" for i, _ in dims)

