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


def test_gemm_split_k_variant_every_epilogue_and_split():
    """The split-K variant (K sliced over programs, fp32 slices summed in order by a reduce kernel with the
    epilogue): every epilogue and output dtype, both B layouts, K tails inside and between slices; sized for 1 SM (one
    slice where the shape has two tiles or more: the one-program-per-tile kernel) and for 132 (2-16 slices here)."""
    spec_path = ROOT / "specs" / "gemm.yaml"
    spec = load_spec(spec_path)
    config = spec.targets["triton"].variants["splitk"]
    cases = [{"dtype": dt, "out_dtype": out, "bias": bias, "activation": act, "b_layout": layout}
             for (dt, out), bias, act, layout in itertools.product(
                 (("bfloat16", "bfloat16"), ("float16", "float32")), (False, True),
                 ("none", "relu", "gelu_tanh", "silu"), ("kn", "nk"))]
    shapes = [[1, 70, 1000], [16, 64, 2048], [33, 100, 300], [5, 48, 129]]
    for num_sms in (1, 132):
        report = verify_interpreted(str(spec_path), config, shapes, cases, num_sms=num_sms)
        assert len(report.cases) == len(cases) * len(shapes)
        bad = [c for c in report.cases if not c["ok"]]
        assert not bad, (num_sms, bad[:5])


def test_gemm_split_count_fills_the_gpu_and_leaves_no_slice_empty():
    from gen.build.compile import load_module_from_text
    from gen.build.render import render_variant

    spec = load_spec(ROOT / "specs" / "gemm.yaml")
    module = load_module_from_text(render_variant(spec, "triton", spec.targets["triton"].variants["splitk"]).text,
                                   "gemm_splitk_count")
    for M, N, K, sms in ((1, 4096, 14336, 132), (16, 14336, 4096, 132), (1, 64, 129, 132), (4096, 4096, 4096, 132),
                         (1, 4096, 14336, 1)):
        n, k_slice = module.split_count(M, N, K, sms)
        tiles = -(-M // module.BLOCK_M) * -(-N // module.BLOCK_N)
        assert 1 <= n <= module.SPLIT_K and k_slice % module.BLOCK_K == 0 or (n, k_slice) == (1, K)
        assert (n - 1) * k_slice < K <= n * k_slice          # every slice has columns, together they cover K
        assert n == 1 or tiles * n <= module.PROGRAMS_PER_SM * sms   # no more programs than the target
    assert module.split_count(1, 4096, 14336, 132)[0] == 4   # 64 tiles: 4 slices bring it to 256 of 264 programs
    assert module.split_count(4096, 4096, 4096, 132)[0] == 1  # the tiles fill the GPU: no split
