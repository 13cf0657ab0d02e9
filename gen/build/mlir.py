"""Artifact -> IRReport: read TTGIR, SASS and resource usage; apply the target's budgets and the spec's expectations."""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass, field

from . import hw_rules, sass_loops
from .compile import Artifact
from .targets import Target

# SASS opcodes worth counting: tensor cores, TMA, mbarrier traffic, local memory.
SASS_OPS = ("UTCHMMA", "UTCQMMA", "UTCIMMA", "UTCBAR", "HGMMA", "HMMA", "UTMALDG", "UTMASTG", "SYNCS", "LDL", "STL",
            "LDTM", "STTM", "MUFU",
            # packed f32x2 math (sm100): where the softmax's FMA-pipe work (exp2 emulation, scaling) is paired
            "FFMA2", "FADD2", "FMUL2")
# TTGIR ops worth counting.
TTGIR_OPS = {
    "tcgen05_mma": "ttng.tc_gen5_mma",
    "tcgen05_commit": "ttng.tc_gen5_commit",
    "wgmma": "ttng.warp_group_dot",
    "tma_load": "ttng.async_tma_copy_global_to_local",
    "tma_store": "ttng.async_tma_copy_local_to_global",
    "mbarrier_wait": "ttng.wait_barrier",
    "mbarrier_arrive": "ttng.arrive_barrier",
    "tmem_alloc": "ttng.tmem_alloc",
    "local_alloc": "ttg.local_alloc",
}

_SASS_LINE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)")
_RESOURCE = re.compile(r"Function\s+(\S+):\s*\n\s*REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")
_CONVERT = re.compile(r"ttg\.convert_layout\s+%\S+\s*:\s*tensor<[^,>]+,\s*(#\w+)>\s*->\s*tensor<[^,>]+,\s*(#\w+)>")
_TMEM_ALLOC = re.compile(r"ttng\.tmem_alloc.*?->\s*!ttg\.memdesc<([0-9x]+)x(\w+),\s*(#\w+)[^>]*>.*?loc\((#loc\d+)\)")
_LOC_NAME = re.compile(r"^(#loc\d+) = loc\(\"([^\"]+)\"\((#loc\d*)\)\)", re.M)
_TMEM_ENC = re.compile(r"^(#tmem\d*) = #ttng\.tensor_memory_encoding<blockM = (\d+), blockN = (\d+), colStride = (\d+)", re.M)
_WS_ATTRS = re.compile(r"ttg\.warp_specialize\(.*?attributes\s*\{([^}]*)\}")
_PARTITION = re.compile(r"^\s*partition(\d+)\(.*num_warps\((\d+)\)", re.M)
_BITS = {"f32": 32, "i32": 32, "f16": 16, "bf16": 16, "i16": 16, "i8": 8, "f8E4M3FN": 8, "f8E5M2": 8, "i1": 1}


@dataclass(frozen=True)
class IRReport:
    target: str
    case: dict
    ok: bool                       # compiled and met every gate
    compiled: bool
    error: str = ""
    seconds: float = 0.0
    smem_bytes: int = 0
    tmem_cols: int = 0
    tmem_buffers: list = field(default_factory=list)       # [{name, shape, dtype, cols, kernel}]
    regs: int = 0
    spills: int = 0                # spill stores (STL) in SASS
    prologue_spills: int = 0       # of those, the stores before the first setmaxnreg (sass_loops.SpillSites)
    hot_reloads: int = 0           # spill reloads (LDL) inside a leaf loop: paid every iteration of a hot loop
    local_bytes: int = 0           # stack frame + local memory from the resource usage
    convert_layouts: int = 0
    convert_layout_pairs: list = field(default_factory=list)  # [{src, dst, count}] with the layouts spelled out
    partitions: list = field(default_factory=list)         # [{name, warps, regs}]
    instructions: dict = field(default_factory=dict)       # SASS opcode -> count
    sass_size: int = 0             # SASS instructions in all: code size, which compile time follows (machine-free)
    ttgir_ops: dict = field(default_factory=dict)          # op -> count
    gates: list = field(default_factory=list)              # [{gate, ok, detail}]
    kernels: list = field(default_factory=list)            # kernel names

    def failures(self) -> list[str]:
        return [g["detail"] for g in self.gates if not g["ok"]] + ([self.error] if self.error else [])

    def to_manifest(self) -> dict:
        d = asdict(self)
        d.pop("case")
        d.pop("seconds")   # wall clock of this machine and its compile cache: a rebuild must not change manifest.json
        return d


def sass_counts(sass: str) -> Counter:
    counts = Counter(m.group(1) for m in _SASS_LINE.finditer(sass))
    return Counter({op: counts[op] for op in SASS_OPS if counts[op]})


def resource_usage(text: str) -> dict:
    """Worst case over the cubin's functions: registers, stack, local memory."""
    out = {"regs": 0, "stack": 0, "local": 0, "shared_static": 0}
    for _, reg, stack, shared, local in _RESOURCE.findall(text):
        out["regs"] = max(out["regs"], int(reg))
        out["stack"] = max(out["stack"], int(stack))
        out["local"] = max(out["local"], int(local))
        out["shared_static"] = max(out["shared_static"], int(shared))
    return out


def _layout_defs(ttgir: str) -> dict:
    return dict(re.findall(r"^(#\w+) = (#ttg\S.*)$", ttgir, re.M))


def convert_layouts(ttgir: str) -> list[dict]:
    defs = _layout_defs(ttgir)
    pairs = Counter(_CONVERT.findall(ttgir))
    return [{"src": defs.get(s, s), "dst": defs.get(d, d), "count": n} for (s, d), n in pairs.most_common()]


def _loc_name(loc: str, names: dict) -> str:
    seen = set()
    while loc in names and loc not in seen:
        seen.add(loc)
        name, parent = names[loc]
        if name and not name.startswith("/"):
            return name
        loc = parent
    return "?"


def tmem_buffers(ttgir: str) -> list[dict]:
    """Every tensor-memory allocation with its variable name (from the NameLoc) and its 32-bit column count."""
    names = {loc: (name, parent) for loc, name, parent in _LOC_NAME.findall(ttgir)}
    encodings = {alias: (int(bm), int(bn), int(cs)) for alias, bm, bn, cs in _TMEM_ENC.findall(ttgir)}
    out = []
    for shape_s, dtype, enc, loc in _TMEM_ALLOC.findall(ttgir):
        shape = [int(x) for x in shape_s.split("x")]
        block_m, _, col_stride = encodings.get(enc, (128, 0, 1))
        bits = _BITS.get(dtype, 32)
        lead = 1
        for x in shape[:-2]:
            lead *= x
        rows, cols = shape[-2], shape[-1]
        # 128 lanes per allocation; blockM=64 packs two row-blocks side by side in the columns.
        row_blocks = max(1, rows // 128) if block_m == 128 else max(1, rows // 64) // 2 or 1
        n_cols = lead * row_blocks * max(1, cols * bits * col_stride // 32)
        out.append({"name": _loc_name(loc, names), "shape": shape, "dtype": dtype, "cols": n_cols})
    return out


def partitions(ttgir: str, kernel_regs: int) -> list[dict]:
    """warp_specialize partitions from the TTGIR alone: warps, and registers from the setmaxnreg requests (workers)
    and, for the default partition, what ptxas gave the kernel at entry. The fallback where the PTX's warp dispatch
    cannot be read (hw_rules.warp_layout has the counts the partitions run with)."""
    m = _WS_ATTRS.search(ttgir)
    if not m:
        return []
    attrs = m.group(1)
    def arr(name):
        a = re.search(name + r"\s*=\s*array<i32(?::\s*([0-9, ]+))?>", attrs)
        return [int(x) for x in a.group(1).split(",")] if a and a.group(1) else []
    actual, requested = arr("actualRegisters"), arr("requestedRegisters")
    workers = sorted((int(i), int(w)) for i, w in _PARTITION.findall(ttgir))
    regs = actual or ([kernel_regs] + requested)
    nw = re.search(r'"ttg\.num-warps"\s*=\s*(\d+)', ttgir)
    parts = [{"name": "default", "warps": int(nw.group(1)) if nw else 0, "regs": regs[0] if regs else 0}]
    for i, warps in workers:
        parts.append({"name": f"worker{i}", "warps": warps, "regs": regs[i + 1] if len(regs) > i + 1 else 0})
    return parts


def inspect(artifacts: list[Artifact], target: Target, expect: dict, tmem_declared: dict | None = None) -> IRReport:
    """Combine the kernels of one variant/case into a report and gate it."""
    case = artifacts[0].case if artifacts else {}
    failed = [a for a in artifacts if not a.ok]
    if failed or not artifacts:
        err = "; ".join(f"{a.kernel}: {a.error}" for a in failed) or "nothing compiled"
        return IRReport(target.name, case, ok=False, compiled=False, error=err,
                        seconds=sum(a.seconds for a in artifacts),
                        gates=[{"gate": "compiles", "ok": False, "detail": f"compile failed: {err[:600]}"}])
    instr, ops, tbufs, pairs, parts, layout, fences, groups, invals, handoffs, acquires, pair_waits = (
        Counter(), Counter(), [], [], [], None, [], [], [], [], [], [])
    pair_mmas = False
    smem = tmem = regs = spills = prologue = hot = local = size = 0
    for a in artifacts:
        ru = resource_usage(a.resource_usage)
        instr += sass_counts(a.sass)
        size += sum(1 for _ in _SASS_LINE.finditer(a.sass))
        ops += Counter({k: a.ttgir.count(v + " ") + a.ttgir.count(v + "\n") for k, v in TTGIR_OPS.items()})
        smem = max(smem, int(a.metadata.get("shared", 0)))
        tmem = max(tmem, int(a.metadata.get("tmem_size", 0)))
        regs = max(regs, ru["regs"])
        local = max(local, ru["stack"] + ru["local"])
        sites = sass_loops.spill_sites(a.sass)
        spills += sites.prologue_stores + sites.stores
        prologue += sites.prologue_stores
        hot += sites.hot_reloads
        tbufs += [{**b, "kernel": a.kernel} for b in tmem_buffers(a.ttgir)]   # each kernel has its own 512
        pairs += convert_layouts(a.ttgir)
        parts = parts or partitions(a.ttgir, ru["regs"])
        layout = layout or hw_rules.warp_layout(a.ptx, a.ttgir)
        if target.kind == "gluon":
            fences += hw_rules.fence_problems(a.ttgir)
        if target.tmem_cols:   # the tcgen05 rules
            groups += hw_rules.cta_group_problems(a.ptx)
            invals += hw_rules.barrier_invalidation_problems(a.ttgir)
            handoffs += hw_rules.tmem_handoff_problems(a.ttgir)
            acquires += hw_rules.tmem_acquire_problems(a.ttgir)
            pair_mmas = pair_mmas or hw_rules.has_pair_mmas(a.ttgir)
            pair_waits += hw_rules.cta_pair_problems(a.ttgir)
    if layout:   # the registers each partition runs with (setmaxnreg), not ptxas's count at the kernel's entry
        parts = [{"name": p.name, "warps": len(p.warps), "regs": p.regs, "first_warp": p.warps[0]}
                 for p in layout if p.name != "idle"]
    n_convert = sum(p["count"] for p in pairs)
    ops = Counter({k: v for k, v in ops.items() if v})

    gates = []
    def gate(name, ok, detail):
        gates.append({"gate": name, "ok": bool(ok), "detail": detail})

    gate("smem", smem <= min(target.smem_bytes, expect.get("smem_bytes", target.smem_bytes)),
         f"shared memory {smem} B (budget {min(target.smem_bytes, expect.get('smem_bytes', target.smem_bytes))} B)")
    if target.tmem_cols:
        gate("tmem", tmem <= min(target.tmem_cols, expect.get("tmem_cols", target.tmem_cols)),
             f"tensor memory {tmem} columns (budget {min(target.tmem_cols, expect.get('tmem_cols', target.tmem_cols))})")
        if tmem_declared:
            declared = sum(tmem_declared.values())
            gate("tmem_budget_table", declared >= sum(b["cols"] for b in tbufs) or declared >= tmem,
                 f"template's TMEM table declares {declared} columns; the dump allocates {tmem}")
    elif tmem:
        gate("tmem", False, f"{tmem} TMEM columns on a target without tensor memory")
    gate("regs", regs <= target.max_regs, f"{regs} registers per thread (max {target.max_regs})")
    # Spills: a store before the warp-specialize dispatch (the prologue) holds a value the compiler hoisted out of the
    # partitions, stored once per CTA; the spec allows those per release (prologue_spills). Any other store, and any
    # reload inside a hot loop, is the spill that costs (gen/build/sass_loops.py).
    allowed_spills = expect.get("spills", 0 if target.kind == "gluon" else None)
    gate("spills", allowed_spills is None or spills - prologue <= allowed_spills,
         f"{spills - prologue} spill stores (STL) in SASS{' after the prologue' if prologue else ''} (allowed "
         f"{'any' if allowed_spills is None else allowed_spills})")
    if prologue or "prologue_spills" in expect:
        gate("prologue_spills", prologue <= expect.get("prologue_spills", 0),
             f"{prologue} spill stores in the prologue, before the first setmaxnreg (allowed "
             f"{expect.get('prologue_spills', 0)})")
    if allowed_spills is not None:
        gate("hot_spill_reloads", hot == 0, f"{hot} spill reloads (LDL) inside a leaf loop (allowed 0)")
    if "local_bytes" in expect or target.kind == "gluon":
        allowed = expect.get("local_bytes", 0)
        gate("local_memory", local <= allowed, f"{local} B stack/local memory (allowed {allowed})")
    if "convert_layouts" in expect:
        gate("convert_layouts", n_convert <= expect["convert_layouts"],
             f"{n_convert} ttg.convert_layout (allowed {expect['convert_layouts']})")
    if layout:
        problems = hw_rules.register_file_problems(layout)
        gate("register_file", not problems, "; ".join(problems) or
             f"setmaxnreg counts use {hw_rules.registers_used(layout)} of {hw_rules.REGFILE} registers over "
             f"{sum(len(p.warps) for p in layout)} warps, one count per warpgroup")
        if target.tmem_cols:
            problems = hw_rules.tmem_lane_problems(layout)
            gate("tmem_lanes", not problems, "; ".join(problems) or
                 "partitions that access TMEM start at a multiple of 4 warps (their lane quarters)")
    # else: no jump table in the PTX (LLVM lowered a small partition switch to compares, seen on triton 3.8/3.9 for
    # the 2-partition sm90 GEMM) or one with a cluster-barrier target (the 2-CTA sm100 GEMM): the layout is unread
    # and these two rules are not checked (README, Limits)
    if target.tmem_cols:
        gate("cta_group", not groups, "; ".join(groups[:1]) or "every tcgen05 instruction names one cta_group")
        gate("barrier_inval", not invals, "; ".join(invals[:1]) or
             "no barrier that tcgen05 arrives on is invalidated")
        gate("tmem_handoff", not handoffs, "; ".join(handoffs[:2]) or
             "every TMEM load/store before an mbarrier arrive is fenced (tcgen05.fence::before_thread_sync)")
        gate("tmem_acquire", not acquires, "; ".join(acquires[:2]) or
             "every tcgen05 op after a wait on a TMEM hand-off is fenced (tcgen05.fence::after_thread_sync)")
        if pair_mmas:   # a CTA pair's kernel (the 2-CTA GEMM): only there, so other variants' records stay as they were
            gate("cta_pair", not pair_waits, "; ".join(pair_waits[:2]) or
                 "the partition issuing 2-CTA MMAs waits only on pair barriers (in the lead CTA)")
    if target.kind == "gluon":
        gate("async_fence", not fences, "; ".join(fences[:3]) or
             "every generic-proxy shared-memory write is fenced before an async-proxy read in its partition")
    if "partitions" in expect:
        gate("partitions", len(parts) == expect["partitions"],
             f"{len(parts)} warp-specialized partitions (expected {expect['partitions']})")
    wanted = {op: 1 for op in target.mma_sass + target.tma_sass}
    wanted.update(expect.get("instructions", {}))
    for op, n in wanted.items():
        gate(f"sass:{op}", instr.get(op, 0) >= n, f"{instr.get(op, 0)} {op} in SASS (need >= {n})")

    return IRReport(
        target=target.name, case=case, ok=all(g["ok"] for g in gates), compiled=True,
        seconds=round(sum(a.seconds for a in artifacts), 3), smem_bytes=smem, tmem_cols=tmem, tmem_buffers=tbufs,
        regs=regs, spills=spills, prologue_spills=prologue, hot_reloads=hot, local_bytes=local, convert_layouts=n_convert, convert_layout_pairs=pairs,
        partitions=parts, instructions=dict(instr), sass_size=size, ttgir_ops=dict(ops), gates=gates,
        kernels=[a.kernel for a in artifacts],
    )
