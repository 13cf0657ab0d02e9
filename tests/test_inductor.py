"""gen.measure.inductor's GPU-free parts on synthetic data: profiler event folding, the join of scanned kernels with the
profile, storing, the REPORT.md side-by-side table; and the reference callables on CPU tensors."""
import json
import os
from pathlib import Path

import pytest

from gen.families import get_family
from gen.measure.inductor import (extern_kind, join_kernels, kernel_times_from_events, manifest_entry,
                          reference_call, side_by_side_markdown, _store)
from gen.analysis.scan import ScannedKernel
from gen.build.spec import load_spec

ROOT = Path(__file__).resolve().parent.parent


def _events(seq, iters, dur):
    """seq: names launched per iteration; dur(name, i) -> microseconds."""
    out, t = [], 0.0
    for i in range(iters):
        for name in seq:
            d = dur(name, i)
            out.append((name, t, d))
            t += d + 1.0
        out.append(("Memcpy DtoD (Device -> Device)", t, 50.0))
        t += 60.0
    return out


def test_kernel_times_median_per_iteration():
    seq = ["triton_poi_a", "gemm_kernel", "triton_poi_a"]
    # one outlier iteration: the median ignores it; two launches of the same kernel per iteration are summed
    ev = _events(seq, 5, lambda n, i: (1000.0 if i == 2 else 10.0) if n == "gemm_kernel" else 2.0)
    t = kernel_times_from_events(list(reversed(ev)), 5)         # order of the input does not matter
    assert list(t) == ["triton_poi_a", "gemm_kernel"]
    assert t["gemm_kernel"] == {"ms": 0.01, "calls": 1}
    assert t["triton_poi_a"] == {"ms": 0.004, "calls": 2}
    assert not any("Memcpy" in n for n in t)


def test_kernel_times_irregular_sequence_falls_back_to_mean():
    ev = _events(["k1", "k2"], 4, lambda n, i: 4.0) + [("k3", 10_000.0, 8.0)]
    t = kernel_times_from_events(ev, 4)
    assert t["k1"]["ms"] == pytest.approx(0.004) and t["k3"]["ms"] == pytest.approx(0.002)
    assert all("approx" in v for v in t.values())
    assert kernel_times_from_events([], 20) == {}


def test_extern_kind():
    assert extern_kind("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_cublas") == ("matmul", True)
    assert extern_kind("nvjet_hsh_256x128_64x4_2x1_v_bz_coopA_NTN") == ("matmul", True)
    assert extern_kind("void pytorch_flash::flash_fwd_kernel<...>") == ("attention-like", True)
    assert extern_kind("void at::native::reduce_kernel<512, 1>") == ("reduction", None)
    assert extern_kind("void at::native::vectorized_elementwise_kernel<4>") == ("pointwise", None)


def _sk(name, kind, **kw):
    base = dict(reason="test", where=("x",), origin=("inductor-cache", "triton-cache"), source=f"def {name}(): pass\n",
                ttgir=f"// ttgir of {name}\n", num_warps=4, smem_bytes=0, convert_layouts=0, tensor_cores=False, used=True)
    base.update(kw)
    return ScannedKernel(name=name, kind=kind, **base)


SCANNED = [
    _sk("triton_tem_fused_addmm_gelu_0", "matmul", tensor_cores=True, convert_layouts=2, smem_bytes=98304,
        tc_ops={"ttng.warp_group_dot": 1}, sass={"HGMMA": 16}, families=("gemm",), num_warps=8),
    _sk("triton_mm", "matmul", used=False, tensor_cores=True),              # an autotuning candidate, never launched
    _sk("triton_poi_fused_gelu_1", "pointwise"),
]


def test_join_kernels_profile_first():
    times = {"triton_tem_fused_addmm_gelu_0": {"ms": 0.5, "calls": 1},
             "sm90_xmma_gemm_bf16bf16_cublas": {"ms": 0.4, "calls": 1}}
    rows = join_kernels(SCANNED, times)
    assert [r["name"] for r in rows] == ["triton_tem_fused_addmm_gelu_0", "sm90_xmma_gemm_bf16bf16_cublas"]
    tem, ext = rows
    assert tem["origin"] == "triton" and tem["tensor_cores"] is True and tem["convert_layouts"] == 2
    assert tem["ms"] == 0.5 and tem["families"] == ["gemm"] and tem["tc_ops"] == {"ttng.warp_group_dot": 1}
    assert ext["origin"] == "extern" and ext["class"] == "matmul" and "convert_layouts" not in ext  # absent, not 0
    # no profile: the kernels the wrappers launch, without times
    rows = join_kernels(SCANNED, {})
    assert [r["name"] for r in rows] == ["triton_tem_fused_addmm_gelu_0", "triton_poi_fused_gelu_1"]
    assert all("ms" not in r for r in rows)


def test_store_writes_sources_ttgir_and_json(tmp_path):
    rows = join_kernels(SCANNED, {"triton_tem_fused_addmm_gelu_0": {"ms": 0.5, "calls": 1}, "nvjet_x": {"ms": 1.0, "calls": 1}})
    mode_dir = tmp_path / "inductor" / "default"
    mode_dir.mkdir(parents=True)
    (mode_dir / "stale.ttgir").write_text("old")
    _store(rows, SCANNED, mode_dir)
    files = sorted(p.name for p in mode_dir.iterdir())
    assert files == ["kernels.json", "triton_tem_fused_addmm_gelu_0.py", "triton_tem_fused_addmm_gelu_0.ttgir"]
    saved = json.loads((mode_dir / "kernels.json").read_text())
    assert saved[0]["ttgir_file"] == "triton_tem_fused_addmm_gelu_0.ttgir" and "source_file" not in saved[1]


CAPTURE = {
    "family": "gemm", "label": "M=4096 N=4096 K=4096 bfloat16->bfloat16 bias+gelu_tanh", "device": "NVIDIA H200 (sm_90)",
    "versions": {"torch": "2.13.0", "triton": "3.6.0"}, "flops": 2.0 * 4096 ** 3, "iters": 20,
    "out_dir": "generated/gemm/inductor/",
    "modes": {
        "default": {"total_ms": 0.9, "n_kernels": 2, "kernels": [
            {"name": "nvjet_hsh_256x128", "class": "matmul", "origin": "extern", "tensor_cores": True, "ms": 0.7, "calls": 1,
             "families": []},
            {"name": "triton_poi_fused_addmm_gelu_0", "class": "pointwise", "origin": "triton", "tensor_cores": False,
             "convert_layouts": 0, "num_warps": 4, "smem_bytes": 0, "ms": 0.15, "calls": 1, "families": []}]},
        "max-autotune": {"total_ms": 0.8, "n_kernels": 1, "kernels": [
            {"name": "triton_tem_fused_addmm_gelu_0", "class": "matmul", "origin": "triton", "tensor_cores": True,
             "convert_layouts": 1, "num_warps": 8, "smem_bytes": 147456, "ms": 0.79, "calls": 1, "families": ["gemm"]}]},
    },
}
VARIANTS = [
    {"target": "sm90", "compile": {"kernels": ["gemm_kernel"], "convert_layouts": 0, "smem_bytes": 229620,
                                   "instructions": {"HGMMA": 8, "UTMALDG": 5}},
     "bench": {"rows": [{"case": CAPTURE["label"], "provider": "gen-sm90", "ms": 0.6, "tflops": 229.1},
                        {"case": "other", "provider": "gen-sm90", "ms": 9.0}]}},
    {"target": "sm100", "compile": {"kernels": ["gemm_kernel"], "convert_layouts": 0, "smem_bytes": 229620,
                                    "instructions": {"UTCHMMA": 8}}},
]


def test_side_by_side_markdown():
    md = side_by_side_markdown(CAPTURE, VARIANTS)
    lines = md.splitlines()
    summary = {l.split("|")[1].strip(): [c.strip() for c in l.split("|")[2:-1]] for l in lines if l.startswith("| inductor (") or l.startswith("| gen-")}
    assert summary["inductor (default)"][:5] == ["2 (1 Triton, 1 vendor)", "1/2", "0", "0", "0.9000"]
    assert summary["inductor (default)"][5] == f"{CAPTURE['flops'] / 0.9 / 1e9:.1f}"
    assert summary["inductor (max-autotune)"][:5] == ["1", "1/1", "1", "147456", "0.8000"]
    assert summary["gen-sm90"][:5] == ["1", "yes (HGMMA)", "0", "229620", "0.6000"]
    assert summary["gen-sm100"][:5] == ["1", "yes (UTCHMMA)", "0", "229620", "-"]      # not benchmarked: no time
    assert "| `triton_tem_fused_addmm_gelu_0` | matmul | triton | yes | 1 | 8 | 147456 | 0.7900 | 100% |" in md
    assert "| `nvjet_hsh_256x128` | matmul | extern | yes | - | - | - | 0.7000 | 82% |" in md
    assert "NVIDIA H200" in md and "generated/gemm/inductor/" in md
    failed = {**CAPTURE, "modes": {"max-autotune": {"error": "InductorError: boom | bang"}}}
    assert "| inductor (max-autotune) | failed: InductorError: boom / bang |" in side_by_side_markdown(failed, [])
    entry = manifest_entry(CAPTURE, VARIANTS)
    assert entry["markdown"] == md and entry["capture"] is CAPTURE


def test_reference_call_on_cpu_and_capture_needs_gpu(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CPU-only check")
    from gen.measure.inductor import capture

    gemm = load_spec(ROOT / "specs" / "gemm.yaml")
    case, shape = get_family("gemm").capture_case(gemm)
    assert case["activation"] == "gelu_tanh" and shape == gemm.bench["shapes"][0]
    fn, args, flops = reference_call(gemm, case, [64, 32, 48], device="cpu")
    assert fn(*args).shape == (64, 32) and flops == 2.0 * 64 * 32 * 48
    att = load_spec(ROOT / "specs" / "attention.yaml")
    case, shape = get_family("attention").capture_case(att)
    fn, args, flops = reference_call(att, {**case, "mod": "causal"}, [1, 2, 1, 8, 16], device="cpu")
    assert fn(*args).shape == (1, 2, 8, case["head_dim"]) and 0 < flops < 4.0 * 2 * 8 * 16 * case["head_dim"]
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        capture(gemm, case, shape, tmp_path)


def test_fresh_caches_sets_and_restores_env(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from gen.measure.inductor import fresh_caches

    monkeypatch.setenv("TRITON_CACHE_DIR", "/somewhere/else")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    with fresh_caches(tmp_path) as root:
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(root / "inductor")
        assert os.environ["TRITON_CACHE_DIR"] == str(root / "triton")
        assert (root / "inductor").is_dir() and (root / "triton").is_dir()
    assert os.environ["TRITON_CACHE_DIR"] == "/somewhere/else" and "TORCHINDUCTOR_CACHE_DIR" not in os.environ
