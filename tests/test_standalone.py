"""A vendored generated/ stands alone: its packages import their run time from themselves (generated/_runtime/,
which the emitter copies from gen/runtime/), so torch, triton and cuda-python are all they need."""
import filecmp
import os
import shutil
import subprocess
import sys

from .conftest import ROOT

_USER = r'''
import importlib.abc
import sys


class NoGenerator(importlib.abc.MetaPathFinder):
    """The generator and what only it needs are not installed on this machine."""

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("gen", "jinja2", "yaml", "redis"):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked: a machine without the generator)")
        return None


sys.meta_path.insert(0, NoGenerator())
import torch
import torch.nn.functional as F

import generated
import generated.attention as att
import generated.gemm as g

assert generated.__file__.startswith(sys.argv[1]), generated.__file__   # the vendored copy, not the checkout
torch.manual_seed(0)
a, w = torch.randn(33, 40, dtype=torch.float16), torch.randn(24, 40, dtype=torch.float16)
got, want = g.linear(a, w, activation="silu").float(), F.silu(a.float() @ w.float().t())
assert (got - want).norm() / want.norm() < 1e-2, "gemm"
q, k, v = (torch.randn(1, 2, n, 64, dtype=torch.float16) for n in (17, 40, 40))
got = att.attention(q, k, v, mod="causal").float()
mask = torch.ones(17, 40, dtype=torch.bool).tril(40 - 17)                  # bottom-right causal
want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
assert (got - want).norm() / want.norm() < 1e-2, "attention"
assert not [m for m in sys.modules if m == "gen" or m.startswith("gen.")], "gen was imported"
print("STANDALONE OK")
'''


def test_generated_runtime_is_gen_runtime_file_for_file():
    ours = sorted(p.name for p in (ROOT / "gen" / "runtime").glob("*.py"))
    shipped = sorted(p.name for p in (ROOT / "generated" / "_runtime").glob("*.py"))
    assert shipped == ours, "regenerate: python -m gen specs/<family>.yaml"
    _, mismatch, errors = filecmp.cmpfiles(ROOT / "gen" / "runtime", ROOT / "generated" / "_runtime", ours,
                                           shallow=False)
    assert not mismatch and not errors, f"generated/_runtime/ is stale: {mismatch + errors}; rerun python -m gen"


def test_a_vendored_generated_tree_runs_without_the_generator(tmp_path):
    """With gen, jinja2, pyyaml and redis unimportable, the public ops import and compute (portable kernels in
    Triton's interpreter on this CPU machine) from a copy of generated/ in another directory."""
    shutil.copytree(ROOT / "generated", tmp_path / "generated", ignore=shutil.ignore_patterns("ir", "inductor"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", _USER, str(tmp_path)], cwd=tmp_path, capture_output=True, text=True,
                          env={**env, "TRITON_INTERPRET": "1"}, timeout=600)
    assert proc.returncode == 0 and "STANDALONE OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]
