"""GPU layer (-m gpu; skipped without CUDA): every shipped variant this device can run, against float64 torch."""
import logging

import pytest
import torch

from gen.measure.accuracy import rel_err
from gen.build.compile import load_module_from_text
from gen.families import get_family
from gen.runtime.device import device_info
from gen.build.render import render_variant
from gen.build.spec import load_spec
from gen.build.targets import get_target
from gen.measure.verify import verify_module

from .conftest import ROOT, installed_build_manifest

pytestmark = pytest.mark.gpu
FAMILIES = ("gemm", "attention")


def _shipped_variants(family):
    """(name, target, config) of every variant the package runs with the installed Triton (its release's own build
    where it has one: on a Blackwell runner with triton 3.8+, the CLC sm100 GEMM and the 2-CTA sm100_pair): each
    target's default and its named configs (sm90_n64, sm90_swap16, ...), which the dispatch table may pick per
    bucket like any provider."""
    manifest = installed_build_manifest(family)
    return [(v.get("name", v["target"]), v["target"], v["config"]) for v in manifest["variants"]]


def _params():
    out = []
    for family in FAMILIES:
        spec = load_spec(ROOT / "specs" / f"{family}.yaml")
        for name, _, _ in _shipped_variants(family):
            out += [(family, name, i) for i in range(len(get_family(family).verify_cases(spec)))]
    return out


@pytest.mark.parametrize("family, name, case_index", _params())
def test_variant_matches_reference(family, name, case_index):
    """One case of one shipped variant over the spec's verify shapes (odd, tails, GQA, decode), twice with fresh
    inputs."""
    spec = load_spec(ROOT / "specs" / f"{family}.yaml")
    target, config = next((t, c) for n, t, c in _shipped_variants(family) if n == name)
    info = device_info(0)
    if not get_target(target).runs_on(info.major):
        pytest.skip(f"{target} does not run on {info.label}")
    src = render_variant(spec, target, config)
    module = load_module_from_text(src.text, src.digest)
    case = get_family(family).verify_cases(spec)[case_index]
    for seed in (0, 1):  # fresh inputs each time: a moving error is a race
        rep = verify_module(spec, module, [case], spec.verify["shapes"], "cuda", info.num_sms, seed=seed)
        assert rep.ok, [c for c in rep.cases if not c["ok"]]


def test_gemm_large_and_tails_through_public_api():
    from generated.gemm import gemm

    for m, n, k in ((8192, 8192, 8192), (1000, 520, 320), (1, 4096, 4096), (4097, 129, 8)):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        out = gemm(a, b, bias, "gelu_tanh")
        ref = torch.nn.functional.gelu(a.double() @ b.double() + bias.double(), approximate="tanh")
        assert rel_err(out, ref) < 1e-2, (m, n, k)


def test_gemm_unaligned_strides_fall_back_with_a_reason(caplog):
    import generated.gemm as g

    a = torch.randn(64, 299, device="cuda", dtype=torch.float16)  # 598-byte rows: not a multiple of 16
    b = torch.randn(299, 72, device="cuda", dtype=torch.float16)
    with caplog.at_level(logging.DEBUG, logger="generated.gemm"), pytest.MonkeyPatch.context() as mp:
        mp.setattr(g._RT, "pick", lambda target, bucket: target)   # as if the table chose our variant here
        out = g.gemm(a, b)
    if device_info(0).major in (9, 10):
        assert any("needs TMA but" in r.getMessage() and "598 bytes" in r.getMessage() for r in caplog.records)
    assert rel_err(out, a.double() @ b.double()) < 4e-3


def test_attention_public_api_gqa_and_lse():
    from generated.attention import attention

    fam_ref = __import__("gen.families.attention", fromlist=["reference"])
    spec = load_spec(ROOT / "specs" / "attention.yaml")
    q = torch.randn(2, 8, 333, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 2, 1000, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, 2, 1000, 128, device="cuda", dtype=torch.bfloat16)
    for mod in ("none", "causal", "window", "softcap", "alibi", "decay"):
        o, lse = attention(q, k, v, mod=mod, return_lse=True)
        inputs = {"q": q, "k": k, "v": v, "mod": mod, "scale": 128 ** -0.5, "window_left": 1024, "window_right": 0,
                  "softcap": 50.0, "alibi_slopes": fam_ref.alibi_slopes(8).cuda()}
        ref_o, ref_lse = fam_ref.reference(inputs, spec.options)
        assert rel_err(o, ref_o) < 1e-2, mod
        fin = torch.isfinite(ref_lse)
        assert (lse.double()[fin] - ref_lse[fin]).abs().max() < 2e-2, mod
