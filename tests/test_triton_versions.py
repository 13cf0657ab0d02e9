"""Other Triton releases (CPU, cross-compile): every target that passes its gates on a version keeps passing there.

Runs when GEN_TRITON_VENVS names interpreters with another Triton installed ("3.8.0=/path/bin/python,..."); `.ci/run`
builds them (torch 2.13 CPU + that triton) and sets it, after rebuilding each release's own build
(generated/<family>/triton_X_Y/) and checking that the committed one is current. The expectations (conftest's
MUST_SHIP) are what was proven on 2026-12-02 (README, "Limits"): a target leaving that table is a regression of the
compatibility layer (templates/_lib/compat.jinja) or of a compiler change to look at; a target joining it should be
added.
"""
import json
import os
import subprocess

import pytest

from .conftest import MUST_SHIP, ROOT
from gen.runtime.seed import INDEX

VENVS = dict(item.split("=", 1) for item in os.environ.get("GEN_TRITON_VENVS", "").split(",") if "=" in item)

def release_dir(family: str, version: str):
    """generated/<family>/triton_X_Y/: the committed build of `version` (`.ci/run` rebuilds it with that release and
    fails when the tree changes, so the committed one is what that release's gates choose today)."""
    from gen.runtime.triton_range import release_folder

    return ROOT / "generated" / family / release_folder(version)


@pytest.mark.skipif(not VENVS, reason="set GEN_TRITON_VENVS=version=python,... (.ci/run does)")
@pytest.mark.parametrize("version", sorted(VENVS) or ["-"])
@pytest.mark.parametrize("family", sorted(MUST_SHIP))
def test_targets_keep_shipping_on_other_triton_releases(version, family):
    manifest = json.loads((release_dir(family, version) / "manifest.json").read_text())
    assert manifest["versions"]["triton"] == version
    # every shipped module by name: a target's default config under the target's name, named configs (triton_splitkv)
    # under their own, so that a named one cannot stand in for a lost default
    shipped = {v.get("name", v["target"]): v for v in manifest["variants"] if v["compile"]["ok"]}
    must = {t for t, versions in MUST_SHIP[family].items() if version in versions}
    assert must <= set(shipped), f"lost on triton {version}: {sorted(must - set(shipped))}; " \
                                 f"rejected: {[(r['target'], r['reason'][:200]) for r in manifest['rejected']]}"
    for target in must:   # no spill but the prologue's, which a release's by_triton expect may allow (sass_loops)
        for case in shipped[target]["compile"]["cases"]:
            assert case["spills"] == case["prologue_spills"] and case["hot_reloads"] == 0, (target, case)
    # the package's run time finds the same modules: the folder's SHIPPED names them, each with its bundle
    namespace: dict = {}
    exec((release_dir(family, version) / "__init__.py").read_text(), namespace)
    assert sorted(namespace["SHIPPED"]) == sorted(shipped)
    for name, v in shipped.items():
        assert (release_dir(family, version) / f"{name}.py").exists()
        if v["target"] in ("sm100", "sm90"):
            assert (release_dir(family, version) / "kernels" / name / INDEX).exists(), name



@pytest.mark.skipif(not VENVS, reason="set GEN_TRITON_VENVS=version=python,... (.ci/run does)")
@pytest.mark.parametrize("version", sorted(VENVS) or ["-"])
def test_the_sm100_gemm_schedules_with_cluster_launch_control_where_triton_has_it(version):
    """specs/by_triton/gemm.yaml asks for SCHEDULE clc from 3.8 (Gluon's blackwell.clc): that release's build must ship
    it (gated like the static schedule), with the try_cancel request in the kernel; 3.6 and 3.7 keep the static one."""
    manifest = json.loads((release_dir("gemm", version) / "manifest.json").read_text())
    (sm100,) = [v for v in manifest["variants"] if v.get("name", v["target"]) == "sm100"]
    wants_clc = tuple(int(x) for x in version.split(".")[:2]) >= (3, 8)
    assert sm100["config"].get("SCHEDULE", "static") == ("clc" if wants_clc else "static"), sm100["config"]
    module = (release_dir("gemm", version) / "sm100.py").read_text()
    assert ("clc.try_cancel(" in module) == wants_clc
    assert ("dynamic_schedule=True" in module) == wants_clc   # one program per tile at launch

_SIMULATE = """
import json, sys
from pathlib import Path
from gen.measure.simulate import simulate_source
from gen.build.spec import load_spec
root, folder, out = Path(sys.argv[1]), sys.argv[2], {}
for family in ("gemm", "attention"):
    spec = load_spec(root / "specs" / f"{family}.yaml")
    for target in ("sm100", "sm90"):
        # the module this release runs: its own build's, else the package's (a target its gates rejected)
        own = root / "generated" / family / folder / f"{target}.py"
        path = own if own.exists() else root / "generated" / family / f"{target}.py"
        failed = []
        for late in (False, True):   # the random completion order and the late one
            report = simulate_source(spec, path.read_text(), f"ver_{family}_{target}_{late}", seed=0, late=late)
            failed += [c["detail"] for c in report.cases if not c["ok"]] if report.cases else ["no cases"]
        out[f"{family}/{target}"] = failed
# the attention sm90 module's backward dK/dV kernel (tests/test_attention_backward.py's check, two cases a dtype)
from gen.simulator import load_module
from tests.test_attention_backward import _sim_dkdv
own = root / "generated" / "attention" / folder / "sm90.py"
module = load_module((own if own.exists() else root / "generated" / "attention" / "sm90.py").read_text(), "ver_bwd")
out["attention/sm90 backward"] = []
for shape, mod in (([1, 4, 1, 17, 140], "causal"), ([2, 2, 2, 70, 70], "softcap")):
    for dtype, head_dim in (("bfloat16", 64), ("float16", 128)):
        got, want = _sim_dkdv(module, shape, mod, dtype, head_dim)
        err = max(((a.double() - w).norm() / w.norm()).item() for a, w in zip(got, want))
        if not err < 1e-2:
            out["attention/sm90 backward"].append(f"{shape} {mod} {dtype} D{head_dim}: rel err {err:.2e}")
print(json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.skipif(not VENVS, reason="set GEN_TRITON_VENVS=version=python,... (.ci/run does)")
@pytest.mark.parametrize("version", sorted(VENVS) or ["-"])
def test_shipped_gluon_variants_run_in_the_simulator_on_other_triton_releases(version):
    """The shipped modules (rendered once, names resolved by the compat layer at import) and the simulator itself
    must work with each supported Triton's Gluon package, not only the one the goldens come from: the forward
    variants in both completion orders, and the attention backward's dK/dV kernel."""
    proc = subprocess.run([VENVS[version], "-c", _SIMULATE, str(ROOT), release_dir("gemm", version).name],
                          capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    failures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert failures == {k: [] for k in failures} and len(failures) == 5, failures


@pytest.mark.slow
@pytest.mark.skipif(not VENVS, reason="set GEN_TRITON_VENVS=version=python,... (.ci/run does)")
@pytest.mark.parametrize("version", sorted(VENVS) or ["-"])
def test_sm100_attention_spill_is_the_register_allocator_flag_triton_passes_to_ptxas(version, tmp_path):
    """Why a release's sm100 attention ships with prologue spills allowed (specs/by_triton/attention.yaml `expect`,
    3.8 and 3.9; README "Limits"), pinned so that a change is noticed. Releases that allow none (3.6, and 3.7 with its
    own config since 2026-12-06) skip.

    Triton >= 3.7 runs ptxas with `--regAllocOptLevel=2` ("to work around ptxas 13.x bug"). With it, the thread-index
    values LLVM hoists above the warp_specialize split (tid, tid >> 5, tid & 127, tid << 4, (tid >> 5) << 7: the
    correction and softmax partitions compute them identically since 3.7) are spilled at the kernel's entry; the same
    PTX assembled without that flag has 0 spills. Measured with bench/sm100_spills.py --ptxas. When this fails because
    the kernel stops spilling (a Triton or ptxas change), drop that release's `expect` allowance."""
    from gen.build.spec import by_triton_overrides

    allowed = by_triton_overrides(ROOT / "specs" / "attention.yaml", version).get("sm100", {}).get("expect", {})
    if not allowed.get("prologue_spills"):
        pytest.skip(f"attention sm100 ships with no spill allowed on triton {version}")
    out = tmp_path / "spills.json"
    proc = subprocess.run([VENVS[version], str(ROOT / "bench" / "sm100_spills.py"), "--case", "bfloat16,128,none",
                           "--ptxas", "--json", str(out)], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "GEN_CACHE_DIR": str(tmp_path / "cache")},
                          timeout=900)
    assert proc.returncode == 0 and out.exists(), proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["triton"] == version
    (case,) = report["cases"]
    assert 0 < case["STL"] <= allowed["prologue_spills"], f"attention sm100 on triton {version}: {case}"
    assert case["ptxas_regalloc2"]["spill_store_bytes"] > 0, case
    assert case["ptxas_default"]["spill_store_bytes"] == 0, case


@pytest.mark.skipif(not VENVS, reason="set GEN_TRITON_VENVS=version=python,... (.ci/run does)")
@pytest.mark.parametrize("version", sorted(VENVS) or ["-"])
def test_render_goldens_hold_on_other_triton_releases(version, tmp_path):
    """The goldens of the configs a release takes from specs/by_triton (tests/golden/<family>/<target>.<KEY>=<v>.py)
    are compared only where that release renders them: tests/test_render.py in that release's interpreter. Before
    this ran here, the 3.7/3.8 goldens went stale unnoticed until the clean-clone CI's run per release."""
    proc = subprocess.run([VENVS[version], "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(ROOT / "tests" / "test_render.py")], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "GEN_CACHE_DIR": str(tmp_path / "cache")},
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and " failed" not in proc.stdout, proc.stdout[-2000:]
