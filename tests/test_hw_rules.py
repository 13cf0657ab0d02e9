"""Hardware rules read from the compiled code (CPU): the warp layout and setmaxnreg counts of warp_specialize, the
register file, TMEM lane quarters and async-proxy fences (gen/build/hw_rules.py). The shipped variants keep every
rule; a mutant of each (the PTX a broken layout would give, or a template without its fence) is caught."""
import dataclasses
import json
import re

import pytest

from gen.build import hw_rules
from gen.build.compile import CompileRequest, compile_many
from gen.build.mlir import inspect
from gen.build.render import render_variant
from gen.build.spec import load_spec
from gen.build.targets import get_target

from .conftest import ROOT, on_tested_triton

pytestmark = pytest.mark.skipif(not on_tested_triton(), reason="the PTX shapes read here are triton 3.6.0's")


def _shipped(family: str, name: str) -> dict:
    manifest = json.loads((ROOT / "generated" / family / "manifest.json").read_text())
    return next(v for v in manifest["variants"] if v.get("name", v["target"]) == name)


def _artifacts(family: str, target: str, edit=None):
    spec = load_spec(ROOT / "specs" / f"{family}.yaml")
    source = render_variant(spec, target, _shipped(family, target)["config"])
    if edit:
        source = dataclasses.replace(source, text=edit(source.text))
    (arts,) = compile_many([CompileRequest(source, spec.compile_cases[0], get_target(target))], jobs=1)
    assert all(a.ok for a in arts), [a.error[:300] for a in arts]
    return arts


def _without(line: str):
    """A template edit that deletes `line` (failing loudly if the template no longer has it)."""
    def edit(text: str) -> str:
        assert line in text, f"the template no longer has {line.strip()!r}: update this mutant"
        return text.replace(line, "")
    return edit


@pytest.mark.parametrize("family", ["gemm", "attention"])
def test_every_shipped_gluon_variant_passes_the_hardware_rules(family):
    """Every Gluon variant of the committed build was gated by the rules, on every compile case, and its partitions'
    registers are the setmaxnreg counts (they fit the register file together)."""
    manifest = json.loads((ROOT / "generated" / family / "manifest.json").read_text())
    gluon = [v for v in manifest["variants"] if v["target"] in ("sm100", "sm90")]
    assert gluon
    for v in gluon:
        gates = {g["gate"]: g for g in v["compile"]["gates"]}   # the primary case's; every case passed them all
        wanted = {"register_file", "async_fence"} | ({"tmem_lanes", "cta_group", "barrier_inval", "tmem_handoff", "tmem_acquire"} if v["target"] == "sm100" else set())
        assert wanted <= set(gates), (v["name"], sorted(gates))
        assert all(gates[g]["ok"] for g in wanted) and all(c["ok"] for c in v["compile"]["cases"]), v["name"]
        used = int(re.search(r"use (\d+) of", gates["register_file"]["detail"]).group(1))
        partitions = 32 * sum(p["regs"] * p["warps"] for p in v["compile"]["partitions"])
        assert partitions <= used <= hw_rules.REGFILE, (v["name"], partitions, used)   # parked warps count too


def test_the_layout_read_from_sm100_attention_is_its_warp_specialization():
    """Partitions in TTGIR order with their warps as the dispatch table assigns them and the counts each asks for:
    the workers' setmaxnreg equal the template's requests, the TMEM users are the default and the two softmax
    partitions, and the report shows the default partition's count, not ptxas's entry count."""
    arts = _artifacts("attention", "sm100")
    layout = hw_rules.warp_layout(arts[0].ptx, arts[0].ttgir)
    parts = {p.name: p for p in layout}
    requested = [int(x) for x in re.search(r"requestedRegisters = array<i32: ([0-9, ]+)>", arts[0].ttgir)
                 .group(1).split(",")]
    assert [parts[f"worker{i}"].regs for i in range(len(requested))] == requested
    assert {n for n, p in parts.items() if p.tmem} == {"default", "worker0", "worker1"}
    assert parts["default"].warps == (0, 1, 2, 3) and len(parts["worker0"].warps) == 4
    assert sorted(w for p in layout for w in p.warps) == list(range(16))   # every warp of the CTA, once
    report = inspect(arts, get_target("sm100"), {})
    default = next(p for p in report.partitions if p["name"] == "default")
    assert default["regs"] == parts["default"].regs != report.regs


def _mutate_setmaxnreg_after(ptx: str, label_index: int, regs: int) -> str:
    """The PTX with the first setmaxnreg of the dispatch's `label_index`-th target set to `regs`."""
    table = re.search(r"brx\.idx\s+%r\d+,\s*([$\w]+);", ptx).group(1)
    labels = re.search(re.escape(table) + r":\s*\.branchtargets\s+([^;]+);", ptx).group(1).split(",")
    at = re.search("^" + re.escape(labels[label_index].strip()) + ":", ptx, re.M).end()
    m = re.compile(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+\d+;").search(ptx, at)
    return ptx[:m.start()] + f"setmaxnreg.inc.sync.aligned.u32 \t{regs};" + ptx[m.end():]


def test_mutants_of_the_register_budget_are_caught():
    """A softmax partition asking for 8 registers more overflows the register file (the shipped kernel uses all
    64K); the parking warps asking for another count than the 1-warp workers of their warpgroup break the
    warpgroup-wide rule."""
    arts = _artifacts("attention", "sm100")
    ptx, ttgir = arts[0].ptx, arts[0].ttgir
    assert not hw_rules.register_file_problems(hw_rules.warp_layout(ptx, ttgir))
    greedy = hw_rules.warp_layout(_mutate_setmaxnreg_after(ptx, 0, 200), ttgir)
    assert any("an SM has 65536" in p for p in hw_rules.register_file_problems(greedy))
    idle = next(p for p in hw_rules.warp_layout(ptx, ttgir) if p.name == "idle")
    n_workers = sum(1 for p in hw_rules.warp_layout(ptx, ttgir) if p.name.startswith("worker"))
    mixed = hw_rules.warp_layout(_mutate_setmaxnreg_after(ptx, n_workers, idle.regs + 8), ttgir)
    assert any("warpgroup" in p for p in hw_rules.register_file_problems(mixed))
    report = inspect([dataclasses.replace(arts[0], ptx=_mutate_setmaxnreg_after(ptx, 0, 200))] + arts[1:],
                     get_target("sm100"), {})
    gate = next(g for g in report.gates if g["gate"] == "register_file")
    assert not gate["ok"] and not report.ok, gate


def test_a_tmem_partition_off_its_warp_quarter_is_caught():
    """The dispatch table rewritten so the first softmax partition runs on warps 6-9 (what reordering partitions
    could give): its warps' TMEM lane quarters no longer match the rows it addresses."""
    arts = _artifacts("attention", "sm100")
    ptx, ttgir = arts[0].ptx, arts[0].ttgir
    layout = hw_rules.warp_layout(ptx, ttgir)
    assert not hw_rules.tmem_lane_problems(layout)
    store = re.compile(r"st\.shared\.v2\.b32\s+\[global_smem\+(\d+)\],\s*\{0, 16843009\};")
    m = store.search(ptx)
    assert m, "the dispatch table's store of warps 4-11 (partitions 0 and 1) moved: update this mutant"
    idle = sum(1 for p in layout if p.name.startswith("worker"))   # the dispatch index past the partitions
    shifted = int.from_bytes(bytes([idle, idle, 0, 0]), "little"), int.from_bytes(bytes([0, 0, 1, 1]), "little")
    mutant = ptx[:m.start()] + f"st.shared.v2.b32 [global_smem+{m.group(1)}], {{{shifted[0]}, {shifted[1]}}};" \
        + ptx[m.end():]
    problems = hw_rules.tmem_lane_problems(hw_rules.warp_layout(mutant, ttgir))
    assert any(p.startswith("worker0 accesses TMEM from warps 6-9") for p in problems), problems


def test_a_template_without_its_async_proxy_fence_is_caught():
    """The sm100 GEMM epilogue with its fence_async_shared() removed: the TMA store reads the tile written through
    the generic proxy unfenced, and the gate rejects the variant."""
    fence = "            fence_async_shared()  # order the generic-proxy smem writes before the async-proxy (TMA) read\n"
    assert not hw_rules.fence_problems(_artifacts("gemm", "sm100")[0].ttgir)
    arts = _artifacts("gemm", "sm100", _without(fence))
    problems = hw_rules.fence_problems(arts[0].ttgir)
    assert problems and "async_tma_copy_local_to_global" in problems[0], problems
    report = inspect(arts, get_target("sm100"), {})
    fence_gate = next(g for g in report.gates if g["gate"] == "async_fence")
    assert not fence_gate["ok"] and not report.ok


def test_a_kernel_mixing_cta_groups_is_caught():
    """One tcgen05.mma rewritten to cta_group::2 (a 2-CTA MMA) in a kernel whose TMEM is allocated per CTA."""
    arts = _artifacts("gemm", "sm100")
    ptx = arts[0].ptx
    assert not hw_rules.cta_group_problems(ptx) and "tcgen05.mma.cta_group::1" in ptx
    mutant = ptx.replace("tcgen05.mma.cta_group::1", "tcgen05.mma.cta_group::2", 1)
    assert hw_rules.cta_group_problems(mutant) == ["tcgen05 instructions mix cta_group::1 and cta_group::2"]
    report = inspect([dataclasses.replace(arts[0], ptx=mutant)] + arts[1:], get_target("sm100"), {})
    assert not next(g for g in report.gates if g["gate"] == "cta_group")["ok"] and not report.ok


def test_invalidating_a_barrier_tcgen05_arrives_on_is_caught():
    """The sm100 attention template invalidating kv_empty after its partitions return (as it did until 2026-12-04):
    the last PV MMA's arrival on it may still be in flight, and the gate rejects the variant. Barriers the MMAs do
    not arrive on may be invalidated."""
    end = "    # undefined (gen/build/hw_rules.py gates it). The kernel ends here, which releases them.\n"

    def invalidate(ring: str):
        def edit(text: str) -> str:
            assert end in text, "the template's end moved: update this mutant"
            return text.replace(end, end + f"    ring_invalidate({ring})\n")
        return edit

    problems = hw_rules.barrier_invalidation_problems(_artifacts("attention", "sm100", invalidate("kv_empty, KV_STAGES"))[0].ttgir)
    assert problems and "%kv_empty" in problems[0], problems
    assert not hw_rules.barrier_invalidation_problems(
        _artifacts("attention", "sm100", invalidate("kv_ready, KV_STAGES"))[0].ttgir)   # TMA arrivals, all waited


def test_a_tmem_hand_off_without_its_fence_is_caught():
    """The sm100 GEMM epilogue handing its TMEM accumulator back (acc_empty) without
    tcgen05.fence::before_thread_sync after its loads, as it did until 2026-12-04."""
    fence = "                _tmem_fence_before(t)   # orders the (waited) tcgen05.ld before the hand-off\n"
    assert not hw_rules.tmem_handoff_problems(_artifacts("gemm", "sm100")[0].ttgir)
    arts = _artifacts("gemm", "sm100", _without(fence))
    assert hw_rules.tmem_handoff_problems(arts[0].ttgir) == [
        "kernel: an mbarrier arrive follows a ttng.tmem_load with no tcgen05.fence::before_thread_sync"]
    assert not next(g for g in inspect(arts, get_target("sm100"), {}).gates if g["gate"] == "tmem_handoff")["ok"]


def test_a_tmem_acquire_without_its_fence_is_caught():
    """The sm100 GEMM's MMA warp overwriting a TMEM accumulator right after the epilogue handed it back (acc_empty),
    without tcgen05.fence::after_thread_sync; the shipped attention and GEMM pass, and their hand-off barriers are the
    ones the epilogue, softmax and correction arrive on after TMEM loads."""
    fence = "        _tmem_fence_after(t)   # the epilogue's tcgen05.ld of this buffer happened before our MMAs overwrite it\n"
    assert not hw_rules.tmem_acquire_problems(_artifacts("gemm", "sm100")[0].ttgir)
    assert not hw_rules.tmem_acquire_problems(_artifacts("attention", "sm100")[0].ttgir)
    arts = _artifacts("gemm", "sm100", _without(fence))
    assert hw_rules.tmem_acquire_problems(arts[0].ttgir) == [
        "worker1: a ttng.tc_gen5_mma follows a wait on %acc_empty (a TMEM hand-off) with no "
        "tcgen05.fence::after_thread_sync"]
    assert not next(g for g in inspect(arts, get_target("sm100"), {}).gates if g["gate"] == "tmem_acquire")["ok"]


def test_a_dispatch_with_a_cluster_barrier_target_is_not_read_as_a_layout():
    """A CTA pair's kernel (the 2-CTA sm100 GEMM, triton 3.8+) dispatches its worker warps first to a target that
    only joins a cluster barrier, and its table writes are not the partitions' layout: the reader declines it (the
    gates then take the partitions from the TTGIR and skip the register-file and TMEM-lane rules) instead of
    reporting a wrong layout. Shown on the shipped GEMM's PTX with such a target made of its first one."""
    arts = _artifacts("gemm", "sm100")
    ptx, ttgir = arts[0].ptx, arts[0].ttgir
    assert hw_rules.warp_layout(ptx, ttgir)
    table = re.search(r"brx\.idx\s+%r\d+,\s*([$\w]+);", ptx).group(1)
    first = re.search(re.escape(table) + r":\s*\.branchtargets\s+([^,;]+)", ptx).group(1).strip()
    at = re.search("^" + re.escape(first) + ":.*$", ptx, re.M).end()
    stub = ptx[:at] + "\n\tbarrier.cluster.arrive.relaxed.aligned;\n\tbarrier.cluster.wait.aligned;" + ptx[at:]
    assert hw_rules.warp_layout(stub, ttgir) is None


_PAIR_TTGIR = """#shared1 = #ttg.swizzled_shared<{vec = 1, perPhase = 1, maxPhase = 1, order = [0], CGALayout = [[0]]}>
#shared2 = #ttg.swizzled_shared<{vec = 1, perPhase = 1, maxPhase = 1, order = [0], CGALayout = [[1]]}>
    ttng.wait_barrier %s_28, %s_27, %true : !ttg.memdesc<1xi64, #shared1, #smem, mutable> loc(#loc1)
    %20 = ttng.tc_gen5_mma %19, %b, %acc[], %use, %true, %18[%true] {is_async, multicast, two_ctas} : !ttg.memdesc<2x>
"""


def test_a_2cta_mma_waiting_on_a_per_cta_barrier_is_caught():
    """The CTA-pair rule on TTGIR text shaped as triton 3.8 prints it: the MMA partition waiting on a pair barrier
    passes; the same wait on a per-CTA barrier (CGALayout [[1]]: what `ready` becomes without two_ctas=True) is
    named; a one-CTA kernel's per-CTA waits are not this rule's business."""
    assert hw_rules.cta_pair_problems(_PAIR_TTGIR) == []
    per_cta = _PAIR_TTGIR.replace("<1xi64, #shared1", "<2xi64, #shared2")
    (problem,) = hw_rules.cta_pair_problems(per_cta)
    assert "per-CTA barrier (#shared2)" in problem and "two_ctas=True" in problem
    assert hw_rules.cta_pair_problems(per_cta.replace(", two_ctas}", "}")) == []

