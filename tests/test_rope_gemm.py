"""RoPE in the GEMM epilogues (linear(..., rope=(cos, sin))): every (head dim, convention) a shipped variant claims
in its ROPE_KINDS compiles for its architecture with no spills (and, in the Gluon epilogues, no shared-memory round
trip: the rotation's partners come from register splits), and the Gluon ones rotate correctly on the CPU simulator
at head dim 128 (the spec's verify cases, which the shipped-variant simulator tests run, use 64)."""
import hashlib
import json
import re

import pytest

from gen.build import mlir
from gen.build.compile import CompileRequest, compile_many, load_module_from_text
from gen.build.render import render_variant
from gen.build.spec import load_spec
from gen.build.targets import get_target
from gen.measure.simulate import simulate_source

from .conftest import ROOT

SPEC = ROOT / "specs" / "gemm.yaml"
BASE_CASE = {"dtype": "bfloat16", "out_dtype": "bfloat16", "bias": True, "activation": "none", "b_layout": "nk",
             "residual": False, "rms": False}


def _shipped(kinds=("sm90", "sm100", "triton")):
    manifest = json.loads((ROOT / "generated" / "gemm" / "manifest.json").read_text())
    return [(v["name"], v["target"], v["config"]) for v in manifest["variants"] if v["target"] in kinds]


def _rope_cases(source) -> list:
    """The variant's claimed RoPE kinds as compile cases (the portable one: head dims 64 and 128 of its many), each
    alone and after RMSNorm rows (a pre-norm model's QKV projection: linear(x, w, rms_eps=eps, rope=...))."""
    module = load_module_from_text(source.text, source.digest)
    return [dict(BASE_CASE, rms=rms, rope="interleaved" if inter else "half", rope_dim=d)
            for d, inter in module.ROPE_KINDS if d in (64, 128) for rms in (False, True)]


@pytest.mark.parametrize("name, target, config", _shipped())
def test_every_claimed_rope_kind_compiles_without_spills(name, target, config):
    spec = load_spec(SPEC)
    source = render_variant(spec, target, config)
    cases = _rope_cases(source)
    if not cases:
        assert name in ("sm90_swap16", "sm90_splitk"), f"{name} claims no RoPE kind"   # swapped or split: none
        return
    bases = [dict(BASE_CASE, rms=rms) for rms in (False, True)]
    arts = compile_many([CompileRequest(source, case, get_target(target)) for case in bases + cases], jobs=2)
    base = {False: _shared_memory_ops(arts[0]), True: _shared_memory_ops(arts[1])}   # per rms
    for case, art in zip(cases, arts[2:]):
        report = mlir.inspect(art, get_target(target), spec.targets[target].expect)
        assert report.ok, (name, case, report.failures())
        assert report.spills == 0 and report.local_bytes == 0, (name, case, report.spills, report.local_bytes)
        if target != "triton":   # the same shared-memory loads and stores as without RoPE
            assert _shared_memory_ops(art) == base[case["rms"]], (name, case, _shared_memory_ops(art), base)


def _shared_memory_ops(art) -> int:
    return sum(len(re.findall(r"\b(?:LDS|STS)(?:\.[\w.]+)?\s", a.sass)) for a in art)


@pytest.mark.parametrize("name", ["sm90_n128", "sm100"])
def test_rope_at_head_dim_128_on_the_simulator(name):
    """The conventions the variant claims at D 128 (rotate-half pairs a head's 64-column store slices half to half),
    including a decode row and a tile whose last head is v's (unrotated), against float64."""
    spec = load_spec(SPEC)
    text = (ROOT / "generated" / "gemm" / f"{name}.py").read_text()
    # (a digest of the text: the module file is cached under it, and a fixed name would load a stale one)
    module = load_module_from_text(text, hashlib.sha256(text.encode()).hexdigest())
    kinds = [inter for d, inter in module.ROPE_KINDS if d == 128]
    assert kinds, f"{name} claims no RoPE at head dim 128"
    cases = [dict(BASE_CASE, dtype=dt, out_dtype=out, b_layout=layout, rope="interleaved" if inter else "half",
                  rope_dim=128)
             for inter in kinds for dt, out, layout in (("bfloat16", "bfloat16", "nk"), ("float16", "float32", "kn"))]
    report = simulate_source(spec, text, name, cases=cases, shapes=[[200, 384, 72], [1, 136, 64], [130, 256, 40]])
    assert report.ok and len(report.cases) == 3 * len(cases), report.cases
    assert not any(c["detail"] for c in report.cases), report.cases   # none skipped as not applicable
