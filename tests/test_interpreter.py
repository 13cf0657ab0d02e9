"""Numerics on CPU: the portable (Triton) variants, as shipped, under TRITON_INTERPRET=1 against float64 torch."""
import itertools

import pytest

from gen.measure.interpret import verify_interpreted
from gen.build.spec import load_spec

from .conftest import ROOT

GEMM_SHAPES = [[1, 1, 1], [17, 33, 65], [128, 96, 200], [300, 130, 72]]


@pytest.mark.parametrize("b_layout", ["kn", "nk"])
def test_gemm_triton_variant_every_dtype_and_epilogue(b_layout):
    """Both memory orders of B: [K, N] row-major, and the w.t() view of an nn.Linear weight [N, K] (no copy)."""
    spec_path = ROOT / "specs" / "gemm.yaml"
    spec = load_spec(spec_path)
    cases = [{"dtype": dt, "out_dtype": out, "bias": bias, "activation": act, "b_layout": b_layout}
             for dt, out, bias, act in itertools.product(("bfloat16", "float16"), ("bfloat16", "float16", "float32"),
                                                         (False, True), ("none", "relu", "gelu_tanh", "silu"))
             if out != ("float16" if dt == "bfloat16" else "bfloat16")]  # mixed half types are not a use case
    report = verify_interpreted(str(spec_path), spec.targets["triton"].config, GEMM_SHAPES, cases)
    assert len(report.cases) == len(cases) * len(GEMM_SHAPES)
    bad = [c for c in report.cases if not c["ok"]]
    assert not bad, bad[:5]


def test_attention_triton_variant_every_mod():
    spec_path = ROOT / "specs" / "attention.yaml"
    spec = load_spec(spec_path)
    cases = [{"dtype": dt, "head_dim": d, "mod": m["name"]} for m in spec.options["mods"]
             for dt, d in (("bfloat16", 64), ("float16", 128))]
    # Lq=1 decode; odd equal lengths; short Q over long K; GQA with Lq > Lk (fully masked rows under causal/window)
    shapes = [[1, 2, 2, 1, 70], [1, 2, 2, 45, 45], [1, 2, 1, 17, 130], [2, 4, 2, 40, 24]]
    report = verify_interpreted(str(spec_path), spec.targets["triton"].config, shapes, cases)
    assert len(report.cases) == len(cases) * len(shapes)
    bad = [c for c in report.cases if not c["ok"]]
    assert not bad, bad[:5]


def test_attention_split_kv_variant_every_mod_and_split():
    """The split-KV decode variant (GQA-packed rows, keys split across programs, a combine kernel): every mod, on
    decode, speculative (Lq > 1) and fully masked (Lq > Lk) shapes; sized for 1 SM (one split: O written directly)
    and for 64 (2-10 splits here, combined)."""
    spec_path = ROOT / "specs" / "attention.yaml"
    spec = load_spec(spec_path)
    config = {**spec.targets["triton"].variants["splitkv"], "BLOCK_N": 16}  # several key blocks on small shapes
    cases = [{"dtype": dt, "head_dim": d, "mod": m["name"]} for m in spec.options["mods"]
             for dt, d in (("bfloat16", 64), ("float16", 128))]
    shapes = [[2, 4, 2, 1, 300], [1, 8, 2, 4, 130], [1, 4, 1, 17, 77], [1, 2, 1, 5, 3]]
    for num_sms in (1, 64):
        report = verify_interpreted(str(spec_path), config, shapes, cases, num_sms=num_sms)
        assert len(report.cases) == len(cases) * len(shapes)
        bad = [c for c in report.cases if not c["ok"]]
        assert not bad, (num_sms, bad[:5])
