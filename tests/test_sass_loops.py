"""gen/build/sass_loops.py: where spills sit in a kernel's SASS (prologue, other code, leaf loops), on hand-written
SASS in cuobjdump's format, each rule with the mutant it must catch, and on the shipped dumps."""
import pytest

from gen.build.sass_loops import SpillSites, spill_sites


def sass(*lines: str) -> str:
    """cuobjdump -sass text: one instruction per 16 bytes, from address 0."""
    return "\n".join(f"        /*{16 * i:04x}*/                   {text} ;   /* 0x0 */\n" for i, text in enumerate(lines))


def kernel(partition_body: list[str], prologue_store: bool = True, in_retry: tuple = ()) -> str:
    """A warp-specialized kernel's shape: a prologue (before the first setmaxnreg), the BRX dispatch to a worker
    partition reached only through the jump table, and in that partition a KV loop (header at 0x60) whose mbarrier
    wait retries out of line at the end (a two-block retry loop). partition_body goes inside the KV loop, in_retry
    into the retry block."""
    body = list(partition_body)
    head = ["S2R R0, SR_TID.X",                                         # 0x00
            "STL [R1], R0" if prologue_store else "NOP",                # 0x10
            "BRX R4 -0x30",                                             # 0x20  dispatch: targets in a constant bank
            "NOP",                                                      # 0x30  the partition's first block
            "USETMAXREG.DEALLOC.CTAPOOL 0x18",                          # 0x40
            "LDL R2, [R1]"]                                             # 0x50  reload at the partition's start
    loop_start = 16 * len(head)                                         # 0x60: the KV loop's header
    kv = ["SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R3", "@!P0 BRA {retry}"] + body + [
        f"@P1 BRA 0x{loop_start:x}", "EXIT"]
    retry_at = loop_start + 16 * len(kv)
    after_wait = loop_start + 32
    kv[1] = kv[1].format(retry=f"0x{retry_at:x}")
    retry = [*in_retry, "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R3", f"@!P0 BRA 0x{retry_at:x}",
             f"BRA 0x{after_wait:x}"]
    return sass(*head, *kv, *retry)


def test_a_prologue_store_reloaded_at_the_partition_start_is_not_hot():
    assert spill_sites(kernel(["FADD R5, R5, R6"])) == SpillSites(prologue_stores=1, stores=0, reloads=1,
                                                                  hot_reloads=0)


def test_a_reload_inside_the_kv_loop_is_hot_even_behind_a_dispatch_no_branch_names():
    """Mutant: the same kernel with the reload moved into the KV loop. The partition is reached only through BRX, so
    the loop must be found from a block nothing in the text branches to."""
    sites = spill_sites(kernel(["LDL R7, [R1]", "FADD R5, R5, R7"]))
    assert sites.hot_reloads == 1 and sites.reloads == 2


def test_a_store_after_the_prologue_is_an_ordinary_spill():
    sites = spill_sites(kernel(["STL [R1+0x4], R5", "FADD R5, R5, R6"], prologue_store=False))
    assert sites == SpillSites(prologue_stores=0, stores=1, reloads=1, hot_reloads=0)


def test_an_mbarrier_retry_loop_is_not_the_leaf_that_makes_a_reload_hot():
    """The KV loop contains the wait's out-of-line retry loop; were that counted as the leaf, a reload in the KV
    loop's own body would look cold. Mutant of the check: a reload in the retry block itself is hot too (it is
    inside the KV loop, a leaf once the retry loop is set aside)."""
    assert spill_sites(kernel(["LDL R7, [R1]"])).hot_reloads == 1
    assert spill_sites(kernel(["FADD R5, R5, R6"], in_retry=("LDL R9, [R1]",))).hot_reloads == 1


def test_without_warp_specialization_every_store_counts_and_loops_still_make_reloads_hot():
    text = sass("STL [R1], R0", "LDL R2, [R1]", "IADD3 R3, R3, 0x1, RZ", "LDL R4, [R1]", "@P0 BRA 0x20", "EXIT")
    assert spill_sites(text) == SpillSites(prologue_stores=0, stores=1, reloads=2, hot_reloads=1)


def test_nothing_to_read():
    assert spill_sites("") == SpillSites(0, 0, 0, 0)


@pytest.mark.parametrize("family", ["attention", "gemm"])
def test_the_shipped_gluon_variants_reload_nothing_in_a_hot_loop(family):
    """The committed dumps of the GPU-tested build have no spills; every other release's build passed the same
    gates (hot_spill_reloads, prologue_spills), recorded per case in its manifest."""
    import json

    from .conftest import ROOT

    for manifest in sorted((ROOT / "generated" / family).glob("**/manifest.json")):
        for v in json.loads(manifest.read_text())["variants"]:
            if v["target"] in ("sm100", "sm90"):
                for case in v["compile"]["cases"]:
                    assert case["spills"] == case["prologue_spills"] and case["hot_reloads"] == 0, (manifest, v["name"])
