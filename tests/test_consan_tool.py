"""bench/consan.py (GPU tool): what it would run, checked on CPU with --dry-run."""
import json
import subprocess
import sys

from .conftest import ROOT


def test_consan_lists_every_shipped_gluon_variant_of_the_arch_with_the_instrumentation_on():
    for arch in ("sm90", "sm100"):
        proc = subprocess.run([sys.executable, "bench/consan.py", "--dry-run", "--arch", arch], capture_output=True,
                              text=True, cwd=ROOT, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        listed = {tuple(line.split(":")[0].split()) for line in proc.stdout.splitlines()}
        want = set()
        for family in ("gemm", "attention"):
            manifest = json.loads((ROOT / "generated" / family / "manifest.json").read_text())
            want |= {(family, v["name"]) for v in manifest["variants"] if v["target"] == arch and v["compile"]["ok"]}
        assert listed == want and want
        # consan on, and the uninstrumented bundles off: a bundled binary must not stand in for the checked one
        assert all("TRITON_INSTRUMENTATION_MODE=consan GEN_NO_PRECOMPILED=1" in line
                   for line in proc.stdout.splitlines())
