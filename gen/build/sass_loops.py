"""Where a kernel's register spills sit, read from its SASS: the control-flow graph, its natural loops, and each spill
store and reload placed in it.

A spill count alone cannot tell a value the compiler stored once per CTA from one it reloads every iteration of a
KV loop. Triton >= 3.7 lowers gl.warp_specialize with the worker warps in a dispatch loop, and LLVM's MachineLICM
then hoists what every partition computes alike (the warp index times a row stride, a TMEM column base) out of that
loop into the kernel's prologue, which runs before the first setmaxnreg. Where the partitions' register budgets
cannot keep it live, ptxas stores it once there and reloads it at a partition's or a tile's start: a few L1 hits
per CTA tile. A reload inside a leaf loop (a loop that contains no other loop but mbarrier wait retries) is paid
every iteration of the hot loop: that is the spill that costs.

    sites = spill_sites(sass)   # SpillSites(prologue_stores, stores, reloads, hot_reloads)
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);")
_GUARD = re.compile(r"^@!?U?P[0-9T]+\s+")
_TARGET = re.compile(r"(0x[0-9a-f]+)\s*$")


@dataclass(frozen=True)
class SpillSites:
    prologue_stores: int   # STL before the first USETMAXREG: values hoisted out of the warp-specialized partitions
    stores: int            # every other STL
    reloads: int           # LDL anywhere
    hot_reloads: int       # LDL inside a leaf loop (per iteration of a hot loop)


def _instructions(sass: str) -> list[tuple[int, str, bool]]:
    """(address, instruction without its guard, guarded) in address order."""
    out = []
    for m in _LINE.finditer(sass):
        text = m.group(2).strip()
        guard = _GUARD.match(text)
        out.append((int(m.group(1), 16), text[guard.end():] if guard else text, bool(guard)))
    return out


def _opcode(text: str) -> str:
    return text.split(None, 1)[0] if text else ""


def _blocks(ins: list) -> tuple[list[int], dict[int, list[int]]]:
    """Basic-block leaders (instruction indices) and each block's successor blocks (by leader index).

    BRA to an address: an edge, plus the fall-through where it is conditional (a guard, or a predicate operand as
    in `BRA.U !UP1, 0x170`). EXIT / RET (unguarded): no successor. BRX (the partition dispatch's indirect jump):
    successors unknown; the blocks only it reaches have no predecessor and become roots. CALL falls through."""
    index = {a: i for i, (a, _, _) in enumerate(ins)}
    leaders = {0}
    for i, (_, text, _) in enumerate(ins):
        op = _opcode(text)
        if op.startswith(("BRA", "BRX", "EXIT", "RET", "JMP", "JMX")):
            if i + 1 < len(ins):
                leaders.add(i + 1)
            t = _TARGET.search(text)
            if op.startswith(("BRA", "JMP")) and t and int(t.group(1), 16) in index:
                leaders.add(index[int(t.group(1), 16)])
    order = sorted(leaders)
    succ: dict[int, list[int]] = {}
    for n, start in enumerate(order):
        end = order[n + 1] if n + 1 < len(order) else len(ins)
        _, text, guarded = ins[end - 1]
        op = _opcode(text)
        nxt = [end] if end < len(ins) else []
        t = _TARGET.search(text)
        if op.startswith(("BRA", "JMP")):
            conditional = guarded or "," in text.split(None, 1)[-1]
            target = [index[int(t.group(1), 16)]] if t and int(t.group(1), 16) in index else []
            succ[start] = target + (nxt if conditional else [])
        elif op.startswith(("EXIT", "RET", "BRX", "JMX")):
            succ[start] = nxt if guarded else []
        else:
            succ[start] = nxt
    return order, succ


def _dominators(order: list[int], succ: dict[int, list[int]]) -> tuple[dict[int, int], dict[int, list[int]]]:
    """Immediate dominators (Cooper, Harvey, Kennedy) under a virtual root (-1), and the predecessor lists. The root
    enters the first block and, until every block is reached, the lowest block not yet reached: the BRX dispatch's
    targets (each partition's first block) sit in a constant bank, so nothing in the text branches to them."""
    preds: dict[int, list[int]] = {b: [] for b in order}
    for b, ss in succ.items():
        for s in ss:
            preds[s].append(b)
    roots, seen, rpo = [], {-1}, []

    def visit(root):
        seen.add(root)
        stack = [(root, iter(succ.get(root, [])))]
        while stack:
            node, it = stack[-1]
            child = next(it, None)
            if child is None:
                stack.pop()
                rpo.append(node)
            elif child not in seen:
                seen.add(child)
                stack.append((child, iter(succ.get(child, []))))

    for b in order:
        if b not in seen:
            roots.append(b)
            visit(b)
    rpo.append(-1)
    rpo.reverse()
    pos = {b: i for i, b in enumerate(rpo)}
    all_preds = {b: list(p) for b, p in preds.items()}
    for r in roots:
        all_preds[r].append(-1)
    idom = {-1: -1}

    def intersect(a, b):
        while a != b:
            while pos[a] > pos[b]:
                a = idom[a]
            while pos[b] > pos[a]:
                b = idom[b]
        return a

    changed = True
    while changed:
        changed = False
        for b in rpo[1:]:
            done = [p for p in all_preds[b] if p in idom]
            new = done[0]
            for p in done[1:]:
                new = intersect(p, new)
            if idom.get(b) != new:
                idom[b] = new
                changed = True
    return idom, preds


def _dominates(idom: dict[int, int], a: int, b: int) -> bool:
    while b != -1:
        if b == a:
            return True
        b = idom[b]
    return a == -1


def _loops(order, succ, ins) -> list[set[int]]:
    """The natural loops (block sets), one per header, that are not mbarrier wait retries: those contain a
    SYNCS...TRYWAIT and at most two blocks."""
    idom, preds = _dominators(order, succ)
    bodies: dict[int, set[int]] = {}
    for u, ss in succ.items():
        for h in ss:
            if u in idom and h in idom and _dominates(idom, h, u):   # u -> h is a back edge
                body = bodies.setdefault(h, {h})
                stack = [u]
                while stack:
                    n = stack.pop()
                    if n not in body:
                        body.add(n)
                        stack.extend(preds[n])
    ends = {b: (order[i + 1] if i + 1 < len(order) else len(ins)) for i, b in enumerate(order)}

    def waits(body):
        return len(body) <= 2 and any("TRYWAIT" in ins[k][1] for b in body for k in range(b, ends[b]))

    return [body for body in bodies.values() if not waits(body)]


def spill_sites(sass: str) -> SpillSites:
    ins = _instructions(sass)
    if not ins:
        return SpillSites(0, 0, 0, 0)
    order, succ = _blocks(ins)
    loops = _loops(order, succ, ins)
    leaf_blocks = set()
    for body in loops:
        if not any(other < body for other in loops):   # contains no other (non-wait) loop
            leaf_blocks |= body
    block_of, current = [], order[0]
    starts = set(order)
    for i in range(len(ins)):
        current = i if i in starts else current
        block_of.append(current)
    first_setmax = next((i for i, (_, text, _) in enumerate(ins) if _opcode(text).startswith("USETMAXREG")), None)
    prologue = stores = reloads = hot = 0
    for i, (_, text, _) in enumerate(ins):
        op = _opcode(text)
        if op.startswith("STL"):
            if first_setmax is not None and i < first_setmax:
                prologue += 1
            else:
                stores += 1
        elif op.startswith("LDL"):
            reloads += 1
            hot += block_of[i] in leaf_blocks
    return SpillSites(prologue, stores, reloads, hot)
