"""Every shipped Gluon variant (generated/<family>/sm100.py, sm90.py) runs in the CPU simulator and matches torch."""
import subprocess
import sys

import pytest

from gen.simulate_cli import simulate_source
from gen.spec import load_spec

from .conftest import ROOT


@pytest.mark.parametrize("family", ["gemm", "attention"])
@pytest.mark.parametrize("target", ["sm100", "sm90"])
@pytest.mark.parametrize("seed", [0, 1])  # a different interleaving / async completion order
def test_shipped_variant_numerics_on_simulator(family, target, seed):
    spec = load_spec(ROOT / "specs" / f"{family}.yaml")
    text = (ROOT / "generated" / family / f"{target}.py").read_text()
    report = simulate_source(spec, text, f"shipped_{family}_{target}_{seed}", seed=seed)
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
