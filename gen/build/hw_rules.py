"""Hardware rules a warp-specialized kernel must keep, read from its PTX and TTGIR (no GPU needed).

- Warp layout: Triton lowers `warp_specialize` to a dispatch table in shared memory (one byte per worker warp: the
  partition it runs) and a `brx.idx` switch whose targets each start with the partition's `setmaxnreg`. Read back,
  it gives every partition's absolute warps and register count (the default partition: the `setmaxnreg` right
  after the table is written), which REPORT.md shows instead of ptxas's entry count.
- Register file: setmaxnreg counts over all the CTA's warps must fit the 64K registers of an SM, and the four warps
  of a warpgroup must ask for the same count (the instruction is warpgroup-wide).
- TMEM lane quarters (sm100): warp w may access only TMEM lanes 32*(w % 4) .. +31. Triton addresses a partition's
  lanes from the warp's index inside the partition, so a partition that loads or stores tensor memory must start at
  a multiple of four warps for the two to agree.
- TMEM hand-off (sm100): a partition that loads or stores tensor memory and then arrives on an mbarrier (handing
  the memory to another partition) issues `tcgen05.fence::before_thread_sync` in between, PTX's cross-thread
  pattern for tcgen05.
- TMEM acquire (sm100), the other side of that pattern: after waiting on a hand-off barrier (one that some
  partition arrives on after a TMEM load or store, found across partitions by the barrier's allocation), a partition
  issues `tcgen05.fence::after_thread_sync` before its next tcgen05 operation (TMEM load, store or MMA). A barrier
  is identified by its allocation, so a ring's slots count as one; barriers only tcgen05 arrives on (MMA completion,
  tcgen05_commit) are not hand-offs between threads and are not checked.
- One CTA group (sm100): every tcgen05 instruction of a kernel names the same `cta_group` (TMEM allocated for one
  CTA cannot be read by a 2-CTA MMA, nor the reverse).
- CTA pair (sm100, 2-CTA MMAs only): the partition issuing `two_ctas` MMAs waits only on pair barriers (one
  barrier in the lead CTA for both, CGALayout [[0]]); waiting on each CTA's own lets the lead start before its
  peer's operand half has landed, and nothing in the compiler refuses it.
- Barrier invalidation (sm100): a barrier that tcgen05 arrives on (an MMA's completion barrier, `tcgen05_commit`) may
  still have an arrival in flight when the code that issued it returns, and invalidating a barrier with a pending
  arrival is undefined, so such barriers are never invalidated (the kernel's end releases them).
- Async-proxy fence: a generic-proxy shared-memory write (`local_store`, `local_alloc` of a value) read next by the
  async proxy in the same partition (TMA store, tcgen05 / wgmma operand) needs `fence_async_shared` in between. The
  check sees one partition's text in order: a write handed to another partition through an mbarrier is not covered.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

REGFILE = 65536   # 32-bit registers per SM on sm_90 and sm_100; these kernels' shared memory allows one CTA per SM

_BRX = re.compile(r"brx\.idx\s+(%r\d+),\s*([$\w]+);")   # the table: $L_brx_0 (3.6), JTI0_0 (3.9)
_TARGETS = r"{}:\s*\.branchtargets\s+([^;]+);"
_TABLE_LOAD = r"ld\.shared\.b8\s+{}\s*,\s*\[%r\d+\+(\d+)\];"
_TABLE_STORE = re.compile(r"st\.shared(?:\.v(\d))?\.b32\s+\[global_smem\+(\d+)\],\s*(\{[^}]*\}|-?\d+);")
_SETMAXNREG = re.compile(r"setmaxnreg\.(?:inc|dec)\.sync\.aligned\.u32\s+(\d+);")
_LABEL = r"^{}:"
_NUM_WARPS = re.compile(r'"ttg\.num-warps"\s*=\s*(\d+)')
_TMEM_ACCESS = ("ttng.tmem_load", "ttng.tmem_store")
_GENERIC_WRITE = re.compile(r"ttg\.local_store\b|ttg\.local_alloc\s+%")
_ASYNC_READ = re.compile(r"ttng\.async_tma_copy_local_to_global\b|ttng\.tc_gen5_mma\b|ttng\.warp_group_dot\b")
_FENCE = "ttng.fence_async_shared"
_CTA_GROUP = re.compile(r"\btcgen05\.[\w.:]*?cta_group::(\d)")


@dataclass(frozen=True)
class WarpPartition:
    name: str          # "default", "worker0", ... (TTGIR order), or "idle" for warps no partition uses
    warps: tuple       # absolute warp ids in the CTA
    regs: int          # its setmaxnreg count
    tmem: bool         # loads or stores tensor memory


_WS_OPERANDS = re.compile(r"ttg\.warp_specialize\(([^)]*)\)")
_PARTITION_ARGS = re.compile(r"^\s*partition(\d+)\((.*)\)\s*num_warps", re.M)
_VIEW = re.compile(r"(%[\w.#]+) = ttg\.memdesc_(?:index|subview|reinterpret|slice)\s+(%[\w.#]+)")
_COMMIT = re.compile(r"ttng\.tc_gen5_commit\s+(%[\w.#]+)")
_MMA = re.compile(r"ttng\.tc_gen5_mma\s+([^{:]*)")
_MMA_BARRIER = re.compile(r"(%[\w.#]+)\[%[\w.#]+\]")   # a completion barrier and its predicate (the acc has [])
_INVAL = re.compile(r"ttng\.inval_barrier\s+(%[\w.#]+)")


def _scopes(ttgir: str) -> list[tuple[str, str, dict]]:
    """(name, text, argument -> kernel-level value) of the kernel body (the default partition's code, before and
    after the warp_specialize op included: the default warps run all of it) and of each worker partition (MLIR
    numbers the values of an isolated partition region afresh, so each scope resolves its own names)."""
    ws = _WS_OPERANDS.search(ttgir)
    if ws is None:
        return [("kernel", ttgir, {})]
    operands = [o.strip() for o in ws.group(1).split(",")]
    scopes, outer, pos = [], [], 0
    for m in _PARTITION_ARGS.finditer(ttgir):
        end = ttgir.find("ttg.warp_return", m.end())
        end = ttgir.find("\n", end) if end != -1 else len(ttgir)
        outer.append(ttgir[pos:m.start()])
        args = [a.split(":")[0].strip() for a in re.split(r",\s*(?=%)", m.group(2))]
        scopes.append((f"worker{m.group(1)}", ttgir[m.start():end], dict(zip(args, operands))))
        pos = end
    outer.append(ttgir[pos:])
    return [("kernel", "".join(outer), {})] + scopes


def _first_setmaxnreg_after(ptx: str, pos: int) -> int | None:
    """The count of the first setmaxnreg after `pos`, unless the code returns first (the exit target)."""
    m = _SETMAXNREG.search(ptx, pos)
    ret = ptx.find("\tret;", pos)
    if m is None or (ret != -1 and ret < m.start()):
        return None
    return int(m.group(1))


def warp_layout(ptx: str, ttgir: str) -> list[WarpPartition] | None:
    """The partitions of a warp-specialized kernel with their absolute warps and setmaxnreg counts; None for a kernel
    without warp specialization or whose PTX does not have the shape this reader knows: a `brx.idx` jump table over
    the partitions (every shipped Gluon variant on triton 3.6.0, the GPU-tested release; 3.8 and 3.9 lower the
    2-partition sm90 GEMM's switch to compares, which this reader does not follow, and give a kernel of a CTA pair
    a target through which the worker warps join the cluster barriers, whose table writes it does not decode)."""
    brx = _BRX.search(ptx)
    nw = _NUM_WARPS.search(ttgir)
    if brx is None or nw is None:
        return None
    index_reg, table_name = brx.groups()
    targets = re.search(_TARGETS.format(re.escape(table_name)), ptx)
    load = None
    for load in re.finditer(_TABLE_LOAD.format(re.escape(index_reg)), ptx[:brx.start()]):
        pass   # the last load of the index register before the switch
    if targets is None or load is None:
        return None
    base = int(load.group(1))
    labels = [t.strip() for t in targets.group(1).split(",")]
    target_regs = []
    for label in labels:
        at = re.search(_LABEL.format(re.escape(label)), ptx, re.M)
        if at is not None:
            branch = ptx.find("bra.uni", at.end())
            if "barrier.cluster." in ptx[at.end():branch if branch != -1 else len(ptx)]:
                return None   # a target that only joins a cluster barrier (2-CTA kernels, triton 3.8+): its table
                # writes are not the partitions' layout
        target_regs.append(None if at is None else _first_setmaxnreg_after(ptx, at.end()))

    # the dispatch table: the first value written to each of its bytes (later writes send the warps to exit)
    table, first_store = {}, None
    for m in _TABLE_STORE.finditer(ptx):
        addr, values = int(m.group(2)), m.group(3).strip("{}").split(",")
        if not base <= addr < base + 1024:
            continue
        first_store = m.end() if first_store is None else first_store
        for i, value in enumerate(values):
            for j, byte in enumerate((int(value) & 0xFFFFFFFF).to_bytes(4, "little")):
                table.setdefault(addr - base + 4 * i + j, byte)
    default_warps = int(nw.group(1))
    default_regs = _first_setmaxnreg_after(ptx, first_store) if first_store is not None else None
    if not table or default_regs is None:
        return None

    tmem = {name: any(op in text for op in _TMEM_ACCESS) for name, text, _ in _scopes(ttgir)}
    n_workers = len(tmem) - 1
    total = -(-max(max(table) + 1, default_warps) // 4) * 4
    by_name: dict = {}
    for w in range(default_warps, total):
        index = table.get(w)
        if index is None or index >= len(labels) or target_regs[index] is None:
            return None   # a warp with no entry, or sent straight to the exit: not a layout this reader knows
        name = f"worker{index}" if index < n_workers else "idle"   # the targets past the partitions park warps
        by_name.setdefault(name, []).append((w, target_regs[index]))
    out = [WarpPartition("default", tuple(range(default_warps)), default_regs, tmem["kernel"])]
    for name in sorted(by_name, key=lambda n: (n == "idle", n)):
        warps = by_name[name]
        regs = {r for _, r in warps}
        if len(regs) > 1:
            return None
        out.append(WarpPartition(name, tuple(w for w, _ in warps), regs.pop(), tmem.get(name, False)))
    return out


def registers_used(layout: list[WarpPartition]) -> int:
    """Registers the setmaxnreg counts take over all the CTA's warps (32 threads each)."""
    return 32 * sum(p.regs * len(p.warps) for p in layout)


def register_file_problems(layout: list[WarpPartition]) -> list[str]:
    """Register-file rules of the setmaxnreg counts (empty when they hold)."""
    per_warp = {w: p.regs for p in layout for w in p.warps}
    problems = []
    used = registers_used(layout)
    if used > REGFILE:
        problems.append(f"setmaxnreg counts need {used} registers over {len(per_warp)} warps; an SM has {REGFILE}")
    for group in range(0, max(per_warp) + 1, 4):
        counts = {per_warp.get(w) for w in range(group, group + 4)}
        if len(counts) > 1:
            problems.append(f"warpgroup of warps {group}-{group + 3} asks for different setmaxnreg counts "
                            f"{sorted(c for c in counts if c is not None)}; the instruction is warpgroup-wide")
    return problems


def tmem_lane_problems(layout: list[WarpPartition]) -> list[str]:
    """Partitions that access tensor memory from warps whose TMEM lane quarter (absolute warp % 4) is not the one
    their index inside the partition addresses."""
    problems = []
    for p in layout:
        if p.tmem and any((w - p.warps[0]) % 4 != w % 4 for w in p.warps):
            problems.append(f"{p.name} accesses TMEM from warps {p.warps[0]}-{p.warps[-1]}: warp w reaches only lanes "
                            f"32*(w % 4)..+31, so a TMEM partition must start at a multiple of 4 warps")
    return problems


def fence_problems(ttgir: str) -> list[str]:
    """Async-proxy reads of shared memory that follow a generic-proxy write in the same partition with no
    fence_async_shared between them."""
    problems = []
    for name, text, _ in _scopes(ttgir):
        dirty_line = None
        for line in text.splitlines():
            if _FENCE in line:
                dirty_line = None
            elif _GENERIC_WRITE.search(line):
                dirty_line = dirty_line or line.strip()[:80]
            elif dirty_line and (read := _ASYNC_READ.search(line)):
                problems.append(f"{name}: {read.group(0)} reads shared memory written through the generic proxy "
                                f"({dirty_line!r}) with no fence_async_shared between")
                dirty_line = None
    return problems


def cta_group_problems(ptx: str) -> list[str]:
    """tcgen05 instructions that disagree on their cta_group."""
    groups = sorted(set(_CTA_GROUP.findall(ptx)))
    return [f"tcgen05 instructions mix cta_group::{' and cta_group::'.join(groups)}"] if len(groups) > 1 else []


_SHARED_DEF = re.compile(r"^(#shared\d*) = #ttg\.swizzled_shared<\{[^}]*CGALayout = (\[[^}]*?\]\])\}>", re.M)
_WAIT_TYPE = re.compile(r"ttng\.wait_barrier\s+[^:]*:\s*!ttg\.memdesc<[^,>]*,\s*(#shared\d*)")


def has_pair_mmas(ttgir: str) -> bool:
    """Does this TTGIR (a kernel or one partition's text) issue 2-CTA tcgen05 MMAs (`two_ctas`)?"""
    return any("two_ctas" in ln for ln in ttgir.splitlines() if "ttng.tc_gen5_mma " in ln)


def cta_pair_problems(ttgir: str) -> list[str]:
    """In a kernel of a CTA pair (tcgen05 MMAs with two_ctas), barriers the MMA-issuing partition waits on that are
    each CTA's own: a barrier the 2-CTA MMA must wait on (the TMA bytes of both CTAs' operand halves, the epilogues of
    both CTAs having drained TMEM) has to be a pair barrier in the lead CTA (`allocate_mbarrier(two_ctas=True)`:
    CGALayout [[0]], one barrier for both CTAs). A per-CTA one compiles without complaint (its TMA loads turn into
    cta_group::1 copies) and lets the lead's MMA start before its peer's half has landed."""
    broadcast = {alias: all(not any(b) for b in json.loads(bases)) for alias, bases in _SHARED_DEF.findall(ttgir)}
    problems = []
    for name, text, _ in _scopes(ttgir):
        if not has_pair_mmas(text):
            continue
        for alias in _WAIT_TYPE.findall(text):
            if not broadcast.get(alias, True):
                problems.append(f"{name} issues 2-CTA MMAs but waits on a per-CTA barrier ({alias}); allocate the "
                                "barriers it waits on with mbarrier.allocate_mbarrier(two_ctas=True)")
    return sorted(set(problems))


def barrier_invalidation_problems(ttgir: str) -> list[str]:
    """Barriers that tcgen05 arrives on and that the kernel invalidates."""
    arrived, invalidated = set(), []
    for name, text, args in _scopes(ttgir):
        parent = dict(_VIEW.findall(text))

        def root(value: str) -> str:
            while value in parent:
                value = parent[value]
            return args.get(value, value)

        arrived |= {root(v) for v in _COMMIT.findall(text)}
        for operands in _MMA.findall(text):
            arrived |= {root(v) for v in _MMA_BARRIER.findall(operands)}
        invalidated += [(name, root(v)) for v in _INVAL.findall(text)]
    bad = sorted({b for _, b in invalidated if b in arrived})
    return [f"invalidates {', '.join(bad)}, which tcgen05 arrives on (an arrival may still be in flight; leave "
            "them valid, the kernel's end releases them)"] if bad else []


_TMEM_OP = re.compile(r"ttng\.tmem_(?:load|store)\b")
_ARRIVE = re.compile(r"ttng\.arrive_barrier\b")
_FENCE_BEFORE = "tcgen05.fence::before_thread_sync"


def tmem_handoff_problems(ttgir: str) -> list[str]:
    """mbarrier arrivals that follow a TMEM load or store in the same partition with no
    tcgen05.fence::before_thread_sync between them."""
    problems = []
    for name, text, _ in _scopes(ttgir):
        pending = None
        for line in text.splitlines():
            if _FENCE_BEFORE in line:
                pending = None
            elif tmem_op := _TMEM_OP.search(line):
                pending = tmem_op.group(0)
            elif pending and _ARRIVE.search(line):
                problems.append(f"{name}: an mbarrier arrive follows a {pending} with no tcgen05.fence::before_thread_sync")
                pending = None
    return problems


_WAIT = re.compile(r"ttng\.wait_barrier\s+(%[\w.#]+)")
_ARRIVE_ON = re.compile(r"ttng\.arrive_barrier\s+(%[\w.#]+)")
_TCGEN05_OP = re.compile(r"ttng\.tmem_(?:load|store)\b|ttng\.tc_gen5_mma\b")
_FENCE_AFTER = "tcgen05.fence::after_thread_sync"


def _barrier_root(text: str, args: dict):
    """value -> the barrier allocation it views (through memdesc index/subview/...), as the kernel names it."""
    parent = dict(_VIEW.findall(text))

    def root(value: str) -> str:
        while value in parent:
            value = parent[value]
        return args.get(value, value)
    return root


def tmem_acquire_problems(ttgir: str) -> list[str]:
    """tcgen05 operations that follow a wait on a TMEM hand-off barrier in the same partition with no
    tcgen05.fence::after_thread_sync between them (the waiting side of tmem_handoff_problems' pattern)."""
    scopes = _scopes(ttgir)
    handoff = set()
    for _, text, args in scopes:
        root, pending = _barrier_root(text, args), False
        for line in text.splitlines():
            if _TMEM_OP.search(line):
                pending = True
            elif pending and (arrive := _ARRIVE_ON.search(line)):
                handoff.add(root(arrive.group(1)))
                pending = False
    problems = []
    for name, text, args in scopes:
        root, waited = _barrier_root(text, args), None
        for line in text.splitlines():
            if _FENCE_AFTER in line:
                waited = None
            elif (wait := _WAIT.search(line)) and root(wait.group(1)) in handoff:
                waited = root(wait.group(1))
            elif waited and (op := _TCGEN05_OP.search(line)):
                problems.append(f"{name}: a {op.group(0)} follows a wait on {waited} (a TMEM hand-off) with no "
                                "tcgen05.fence::after_thread_sync")
                waited = None
    return problems
