"""Cluster launch control (clc.try_cancel, Blackwell, triton >= 3.8) in the CPU simulator.

A program may take over programs not started yet; the launcher must then skip them, every tile must still be done
exactly once, and the usual mistakes (reading the response before its barrier completed, asking again after a failed
request, a request nobody expected bytes for) must be reported. The kernel below is the protocol the sm100 GEMM's
CLC schedule uses (templates/sm100/gemm.py.jinja): the loader partition asks for the next tile while it works on the
current one, and every partition reads each response from a ring of response slots.
"""
from __future__ import annotations

import pytest
import torch

from gen.simulator import DeadlockError, HazardError, SimulationError, load_module

SOURCE = '''
import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.blackwell import clc, fence_async_shared, mbarrier


@gluon.jit
def _next(result, ready, empty, use, SLOTS: gl.constexpr):
    slot = use % SLOTS
    mbarrier.wait(ready.index(slot), (use // SLOTS) & 1)   # WAIT_READY
    response = clc.load_result(result.index(slot))
    fence_async_shared()   # FENCE: this generic read before the next request's async-proxy write of the slot
    mbarrier.arrive(empty.index(slot), count=1)
    return response.program_id(0), response.is_canceled()


@gluon.jit
def _loader(visits, result, ready, empty, SLOTS: gl.constexpr):
    tile = gl.program_id(0)
    has_work = True
    use = 0
    while has_work:
        slot = use % SLOTS
        mbarrier.wait(empty.index(slot), ((use // SLOTS) & 1) ^ 1)
        mbarrier.expect(ready.index(slot), 16)   # EXPECT
        clc.try_cancel(result.index(slot), ready.index(slot))
        gl.atomic_add(visits + tile, 1)
        tile, has_work = _next(result, ready, empty, use, SLOTS)
        use += 1


@gluon.jit
def _worker(out, result, ready, empty, SLOTS: gl.constexpr):
    tile = gl.program_id(0)
    has_work = True
    use = 0
    while has_work:
        gl.store(out + tile, tile * 10 + 7)
        tile, has_work = _next(result, ready, empty, use, SLOTS)
        use += 1


@gluon.jit
def clc_kernel(out, visits, SLOTS: gl.constexpr):
    result = gl.allocate_shared_memory(gl.int64, [SLOTS, 2], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    ready = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(SLOTS):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)   # the loader and the worker read every response
    gl.warp_specialize([(_worker, (out, result, ready, empty, SLOTS)),
                        (_loader, (visits, result, ready, empty, SLOTS))], [1], [24])


def launch(tiles, slots=2):
    out = torch.full((tiles,), -1, dtype=torch.int32)
    visits = torch.zeros(tiles, dtype=torch.int32)
    clc_kernel[(tiles,)](out, visits, slots, num_warps=4)
    return out, visits
'''


def _run(source: str, seed: int, late: bool = False, tiles: int = 13, slots: int = 2):
    module = load_module(source, f"clc_{seed}_{late}", seed=seed, late=late)
    out, visits = module.launch(tiles, slots)
    return module, out, visits


@pytest.mark.parametrize("late", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_every_tile_is_done_once_whoever_takes_it_over(seed, late):
    module, out, visits = _run(SOURCE, seed, late)
    assert torch.equal(out, torch.arange(13, dtype=torch.int32) * 10 + 7)
    assert torch.equal(visits, torch.ones(13, dtype=torch.int32))
    programs = module.clc_kernel.ctx.last_programs
    started = [p["pid"][0] for p in programs]
    taken = [pid[0] for p in programs for pid in p["took_over"]]
    # each tile ran in exactly one program: its own or the one that took it over, never both
    assert sorted(started + taken) == list(range(13))
    assert taken, "no program took another over: the launcher's cancellation is not exercised"
    assert len(started) > 1, "a request never failed while programs were pending"


def test_one_response_slot_works_too():
    _, out, visits = _run(SOURCE, seed=1, slots=1)
    assert torch.equal(visits, torch.ones(13, dtype=torch.int32))


def test_reading_the_response_before_its_barrier_is_a_hazard():
    broken = SOURCE.replace("    mbarrier.wait(ready.index(slot), (use // SLOTS) & 1)   # WAIT_READY\n", "")
    with pytest.raises(HazardError, match="clc.load_result|CLC response"):
        for seed in range(4):
            _run(broken, seed)


def test_a_response_slot_reused_without_a_proxy_fence_is_a_hazard():
    broken = SOURCE.replace("    fence_async_shared()   # FENCE", "    # FENCE")
    with pytest.raises(HazardError, match="missing fence_async_shared"):
        _run(broken, seed=0)


def test_a_request_nobody_expected_bytes_for_is_refused():
    broken = SOURCE.replace("        mbarrier.expect(ready.index(slot), 16)   # EXPECT\n", "")
    # the response's 16 bytes land on a barrier nobody armed: its phase never completes
    with pytest.raises(DeadlockError, match="tx bytes pending -16"):
        _run(broken, seed=0)


def test_asking_again_after_a_failed_request_is_refused():
    # the loader keeps asking whatever the response said (the worker still stops at the first failure)
    broken = SOURCE.replace("        tile, has_work = _next(result, ready, empty, use, SLOTS)\n        use += 1\n\n\n@gluon.jit\ndef _worker",
                            "        tile, _ = _next(result, ready, empty, use, SLOTS)\n        has_work = use < 20\n"
                            "        use += 1\n\n\n@gluon.jit\ndef _worker")
    assert broken != SOURCE
    with pytest.raises(SimulationError, match="after a request of this program failed"):
        _run(broken, seed=0)


def test_the_kernel_compiles_for_sm100_where_triton_has_clc(tmp_path):
    """The same source is real Gluon: on a Triton with cluster launch control it compiles for sm_100a to PTX with
    the try_cancel and query instructions (CPU cross-compile)."""
    from triton.experimental.gluon.language.nvidia import blackwell

    if not hasattr(blackwell, "clc"):
        pytest.skip("this Triton has no cluster launch control (triton >= 3.8)")
    import importlib.util

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    path = tmp_path / "clc_src.py"
    path.write_text(SOURCE)
    spec = importlib.util.spec_from_file_location("clc_src", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    src = GluonASTSource(module.clc_kernel, signature={"out": "*i32", "visits": "*i32", "SLOTS": "constexpr"},
                         constexprs={"SLOTS": 2})
    ptx = triton.compile(src, target=GPUTarget("cuda", 100, 32), options={"num_warps": 4}).asm["ptx"]
    assert "clusterlaunchcontrol.try_cancel.async" in ptx
    assert "clusterlaunchcontrol.query_cancel.is_canceled" in ptx


def _sm100_gemm_with_clc() -> str:
    """The shipped sm100 GEMM config rendered with SCHEDULE clc (what the triton >= 3.8 builds ship), whatever Triton
    is installed: the render does not need cluster launch control, only its compile does."""
    from gen.build.render import render_variant
    from gen.build.spec import load_spec

    from .conftest import ROOT

    spec = load_spec(ROOT / "specs" / "gemm.yaml", "3.6.0")
    return render_variant(spec, "sm100", {**spec.targets["sm100"].config, "SCHEDULE": "clc"}).text


@pytest.mark.parametrize("seed, late", [(0, False), (1, False), (2, True)])
def test_the_sm100_gemm_with_cluster_launch_control_runs_in_the_simulator(seed, late):
    """Ragged shapes with several tiles, both B layouts, an epilogue: every output element right (against float64),
    and programs took tiles over, so the partitions' shared walk of the responses is exercised."""
    from .test_simulator import check_close, run_gemm

    module = load_module(_sm100_gemm_with_clc(), f"sm100_gemm_clc_{seed}_{late}", seed=seed, late=late)
    took_over = 0
    for (M, N, K), b_layout in (((300, 600, 136), "nk"), ((520, 264, 72), "kn"), ((128, 256, 64), "nk")):
        out, ref = run_gemm(module, M, N, K, torch.bfloat16, torch.bfloat16, True, "silu", b_layout, seed=seed)
        check_close(out, ref, torch.bfloat16)
        programs = module.gemm_kernel.ctx.last_programs
        tiles = -(-M // module.BLOCK_M) * -(-N // module.BLOCK_N)
        assert len(programs) + sum(len(p["took_over"]) for p in programs) == tiles   # one program per tile
        took_over += sum(len(p["took_over"]) for p in programs)
    assert took_over > 0
