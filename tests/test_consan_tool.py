"""bench/consan.py (GPU tool): what it would run, checked on CPU with --dry-run."""
import json
import subprocess
import sys

from .conftest import ROOT


def test_consan_lists_every_shipped_gluon_variant_of_the_arch_with_the_instrumentation_on():
    """Every shipped Gluon variant of the arch, and the Gluon backward kernels of the attention variants that have
    them, each with consan on."""
    for arch in ("sm90", "sm100"):
        proc = subprocess.run([sys.executable, "bench/consan.py", "--dry-run", "--arch", arch], capture_output=True,
                              text=True, cwd=ROOT, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        listed = {tuple(line.split(":")[0].split()) for line in proc.stdout.splitlines()}
        want = set()
        for family in ("gemm", "attention"):
            manifest = json.loads((ROOT / "generated" / family / "manifest.json").read_text())
            want |= {(family, v["name"]) for v in manifest["variants"] if v["target"] == arch and v["compile"]["ok"]}
        # the attention variants with Gluon backward kernels (sm90's and sm100's) are listed again, for their backward
        backward = {("attention-backward", name) for family, name in want
                    if family == "attention" and "def backward_dkdv" in
                    (ROOT / "generated" / "attention" / f"{name}.py").read_text()}
        assert backward
        assert listed == want | backward and want
        # consan on, and the uninstrumented bundles off: a bundled binary must not stand in for the checked one
        assert all("TRITON_INSTRUMENTATION_MODE=consan GEN_NO_PRECOMPILED=1" in line
                   for line in proc.stdout.splitlines())
