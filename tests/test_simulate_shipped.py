"""Every shipped Gluon variant (generated/<family>/sm100.py, sm90.py and the named configs such as sm90_m64.py) runs in
the CPU simulator and matches torch."""
import json
import subprocess
import sys

import pytest

from gen.measure.simulate import simulate_source
from gen.build.spec import load_spec

from .conftest import ROOT


@pytest.mark.parametrize("family", ["gemm", "attention"])
@pytest.mark.parametrize("target", ["sm100", "sm90"])
@pytest.mark.parametrize("seed", [0, 1])  # a different interleaving / async completion order
def test_shipped_variant_numerics_on_simulator(family, target, seed):
    spec = load_spec(ROOT / "specs" / f"{family}.yaml")
    text = (ROOT / "generated" / family / f"{target}.py").read_text()
    report = simulate_source(spec, text, f"shipped_{family}_{target}_{seed}", seed=seed)
    assert report.cases and report.ok, [c for c in report.cases if not c["ok"]][:3]


def _named_gluon_configs():
    out = []
    for family in ("gemm", "attention"):
        manifest = json.loads((ROOT / "generated" / family / "manifest.json").read_text())
        out += [(family, v["name"]) for v in manifest["variants"]
                if v["target"] in ("sm100", "sm90") and v.get("name", v["target"]) != v["target"]]
    return out


@pytest.mark.parametrize("late", [False, True], ids=["random-order", "late-completions"])
@pytest.mark.parametrize("family, name", _named_gluon_configs())
def test_shipped_named_config_numerics_on_simulator(family, name, late):
    """A named config changes the tiling the protocol runs with (64-row tiles, one consumer warpgroup, 128-wide K
    steps, deeper rings): the same barrier protocol must hold there too (one seed each; the defaults take two), in
    the random completion order and in the late one."""
    spec = load_spec(ROOT / "specs" / f"{family}.yaml")
    text = (ROOT / "generated" / family / f"{name}.py").read_text()
    report = simulate_source(spec, text, f"shipped_{family}_{name}_{late}", seed=0, late=late)
    assert report.cases and report.ok, [c for c in report.cases if not c["ok"]][:3]


def test_simulate_command_reports_a_deadlock_precisely(tmp_path):
    """A broken copy of the shipped sm90 GEMM (consumer waits on the wrong phase) through the CLI."""
    import json
    import shutil

    fam = tmp_path / "gemm"
    shutil.copytree(ROOT / "generated" / "gemm", fam, ignore=shutil.ignore_patterns("inductor", "ir"))
    text = (fam / "sm90.py").read_text()
    old = "mbarrier.wait(ready_bars.index(slot), phase)"
    assert old in text
    (fam / "sm90.py").write_text(text.replace(old, "mbarrier.wait(ready_bars.index(slot), phase ^ 1)", 1))
    proc = subprocess.run([sys.executable, "-m", "gen", "simulate", str(fam), "--target", "sm90"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "DeadlockError" in proc.stdout and "FAIL" in proc.stdout
    sim = next(v for v in json.loads((fam / "manifest.json").read_text())["variants"] if v["target"] == "sm90")["simulate"]
    assert sim["ok"] is False and sim["failures"]


@pytest.mark.parametrize("fence, rule", [
    ("_tmem_fence_before(t)   # orders the (waited) tcgen05.ld before the hand-off", "before_thread_sync"),
    ("_tmem_fence_after(t)   # the epilogue's tcgen05.ld of this buffer happened before our MMAs overwrite it",
     "after_thread_sync"),
])
def test_the_simulator_requires_the_tcgen05_fences_of_a_tmem_hand_off(fence, rule):
    """The shipped sm100 GEMM without one side of its accumulator hand-off's fences (the epilogue's before-fence at
    acc_empty, or the MMA warp's after-fence once it waited on it): a HazardError naming the missing fence (the
    rule is checked per partition, not by timing). Six 128-row tiles on the simulator's two SMs: each program
    reuses a TMEM buffer (ACC_BUFFERS 2), so the MMA warp waits on an acc_empty phase the epilogue completed."""
    spec = load_spec(ROOT / "specs" / "gemm.yaml")
    text = (ROOT / "generated" / "gemm" / "sm100.py").read_text()
    line = next(ln for ln in text.splitlines(keepends=True) if ln.strip() == fence)
    report = simulate_source(spec, text.replace(line, "", 1), f"gemm_sm100_no_{rule}", seed=0, shapes=[[768, 136, 40]])
    assert report.cases and not report.ok
    details = " ".join(c["detail"] for c in report.cases if not c["ok"])
    assert "HazardError" in details and f"tcgen05.fence::{rule}" in details, details[:500]


def test_the_simulator_does_not_order_mmas_into_different_accumulators():
    """The shipped sm100 attention without its wait for PV_t(j) before QK_t(j+1) (the template until 2026-12-04
    assumed tcgen05 MMAs complete in issue order): the QK writes S_t while the PV may still read P_t from the same
    columns, and PTX orders MMAs only into the same accumulator, so the simulator reports the hazard."""
    spec = load_spec(ROOT / "specs" / "attention.yaml")
    text = (ROOT / "generated" / "attention" / "sm100.py").read_text()
    wait = "                        consumer_wait(o_ready, _tile_use(o_use, t, Q_TILES), Q_TILES)\n"
    assert text.count(wait) == 1, "the wait before QK_t(j+1) moved: update this mutant"
    report = simulate_source(spec, text.replace(wait, ""), "attention_sm100_in_order_assumption", seed=0)
    details = " ".join(c["detail"] for c in report.cases if not c["ok"])
    assert "write-after-read hazard on tensor memory `s_tmem`" in details, details[:600]


@pytest.mark.parametrize("family", ["gemm", "attention"])
@pytest.mark.parametrize("target", ["sm100", "sm90"])
def test_shipped_variant_numerics_with_late_completions(family, target):
    """The adversarial completion order: every TMA, MMA and tcgen05 commit completes only when no partition can run,
    so arrivals land after their issuer moved on, and the last ones after the partitions returned."""
    spec = load_spec(ROOT / "specs" / f"{family}.yaml")
    text = (ROOT / "generated" / family / f"{target}.py").read_text()
    report = simulate_source(spec, text, f"shipped_{family}_{target}_late", seed=0, late=True)
    assert report.cases and report.ok and "late completions" in report.device, \
        [c for c in report.cases if not c["ok"]][:3]


def test_late_completions_catch_an_invalidation_with_an_arrival_in_flight():
    """The shipped sm100 attention invalidating kv_empty when its partitions return (as it did until 2026-12-04):
    the last K/V slot's tcgen05 commit may not have arrived yet. With late completions it never has, so every
    seed reports the hazard; the random order (seeds 0-3) let it arrive first every time."""
    spec = load_spec(ROOT / "specs" / "attention.yaml")
    text = (ROOT / "generated" / "attention" / "sm100.py").read_text()
    end = "    # undefined (gen/build/hw_rules.py gates it). The kernel ends here, which releases them.\n"
    assert text.count(end) == 1, "the kernel's end moved: update this mutant"
    mutant = text.replace(end, end + "    ring_invalidate(kv_empty, KV_STAGES)\n")
    for seed in (0, 1):
        report = simulate_source(spec, mutant, f"attention_sm100_inval_late_{seed}", seed=seed,
                                 cases=[{"dtype": "bfloat16", "head_dim": 64, "mod": "none"}], late=True)
        details = " ".join(c["detail"] for c in report.cases if not c["ok"])
        assert "invalidated" in details and "kv_empty" in details and "will still signal it" in details, details[:600]


@pytest.mark.parametrize("late", [False, True], ids=["random-order", "late-completions"])
def test_sm90_split_k_sums_every_slice_on_the_simulator(late):
    """The shipped sm90_splitk at a GPU's SM count (the suite's simulation shapes run it on two SMs, where it cuts K
    in at most two): 8 slices of 2 K blocks, 4 slices with the K tail in the last one, 5 slices of one block each,
    both weight layouts and an epilogue; the output matches the float64 product and the plan's slice count is the
    split rule's."""
    import torch

    from gen.build.targets import SMEM_OPT_IN_BYTES
    from gen.simulator import load_module

    text = (ROOT / "generated" / "gemm" / "sm90_splitk.py").read_text()
    module = load_module(text, f"sm90_splitk_{late}", seed=0, smem_limit=SMEM_OPT_IN_BYTES, late=late)
    gen = torch.Generator().manual_seed(0)
    for (m, n, k), slices, layout, act in [((16, 136, 1000), 8, "kn", "none"), ((5, 64, 200), 4, "nk", "gelu_tanh"),
                                           ((33, 200, 296), 5, "kn", "silu")]:
        a = torch.randn(m, k, generator=gen).to(torch.bfloat16)
        w = torch.randn(n, k, generator=gen).to(torch.bfloat16)
        b = w.t() if layout == "nk" else w.t().contiguous()
        bias = torch.randn(n, generator=gen).to(torch.bfloat16)
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
        plan = module.plan(a, b, bias, out, act, 132)
        assert plan.dims[3] == slices and plan.workspace[0] == slices * -(-m // module.BLOCK_M) * module.BLOCK_M
        module.run(plan, a, b, bias, out)
        ref = a.double() @ b.double() + bias.double()
        ref = {"none": ref, "silu": torch.nn.functional.silu(ref),
               "gelu_tanh": torch.nn.functional.gelu(ref, approximate="tanh")}[act]
        err = ((out.double() - ref).norm() / ref.norm()).item()
        assert torch.isfinite(out).all() and err < 1e-2, (m, n, k, err)


def test_sm100_attention_q_is_released_after_its_last_qk_not_before():
    """FA4's early Q release in the shipped sm100 attention: each Q tile's q_empty is committed right after its last
    QK is issued (so the next CTA tile's Q loads during this tile's last PV), not after the last PV. The simulator
    checks the release point is still safe; committing it just before that QK instead (the mutant) lets the loader
    overwrite Q while the QK reads it, and the simulator reports it."""
    spec = load_spec(ROOT / "specs" / "attention.yaml")
    text = (ROOT / "generated" / "attention" / "sm100.py").read_text()
    qk = ("                        tcgen05_mma(q_view, k_view, s_tmem.index(t), use_acc=False, "
          "mbarriers=[s_ready.index(t)])\n")
    start = text.index(qk + "                        if j + 2 == n:\n")
    end = text.index("tcgen05_commit(q_empty.index(t))\n", start) + len("tcgen05_commit(q_empty.index(t))\n")
    release = text[start + len(qk):end]   # the `if j + 2 == n:` block, its comment and the commit
    assert release.count("\n") <= 6, "the last QK's Q release moved: update this test"
    mutant = text[:start] + release + qk + text[end:]   # the same release, just before the QK it must follow
    report = simulate_source(spec, mutant, "attention_sm100_q_early", seed=0,
                             cases=[{"dtype": "bfloat16", "head_dim": 64, "mod": "none"}])
    details = " ".join(c["detail"] for c in report.cases if not c["ok"])
    assert "hazard on shared memory `q_smem`" in details, details[:600]
