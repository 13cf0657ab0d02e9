"""gen.runtime: the per-call path of the generated ops (direct launch, layouts, buckets, the dispatch table)."""
from __future__ import annotations

import json
import types

import pytest
import torch

from gen.analysis import dispatch_table
from gen.runtime.dispatch import BucketTable, log2_bin
from gen.runtime.launch import Launcher
from gen.runtime.op import OpRuntime, direct_call_ok, target_for
from gen.runtime.seed import INDEX
from gen.runtime.shapes import attention_bucket, b_layout, gemm_bucket, tma_problem

from .conftest import ROOT


def test_log2_bins():
    assert [log2_bin(x) for x in (1, 2, 3, 4, 127, 128, 4096, 8191, 14336)] == [0, 1, 1, 2, 6, 7, 12, 12, 13]


def test_b_layout_reads_the_memory_order_of_b():
    w = torch.empty(48, 32)            # an nn.Linear weight [N, K]
    assert b_layout(w.t()) == "nk"     # its [K, N] view: K contiguous
    assert b_layout(torch.empty(32, 48)) == "kn"
    assert b_layout(torch.empty(32, 96)[:, ::2]) == ""         # strided both ways: the op copies it
    assert b_layout(torch.empty(1, 48)) == "kn" and b_layout(torch.empty(48, 1).t()) == "kn"
    assert b_layout(torch.empty(32, 1)) in ("kn", "nk")        # a single column is both


def test_tma_problem_names_the_offending_stride():
    assert tma_problem(torch.empty(8, 64, dtype=torch.bfloat16)) == ""
    assert "stride of 598 bytes" in tma_problem(torch.empty(5, 299, dtype=torch.bfloat16))
    assert "last-dim stride" in tma_problem(torch.empty(64, 8).t())
    assert "16-byte aligned" in tma_problem(torch.empty(65, dtype=torch.bfloat16)[1:].view(8, 8))


def test_buckets_key_on_what_decides_speed():
    cat, bins = gemm_bucket(16, 4096, 14336, torch.bfloat16, torch.bfloat16, True, "silu", "nk")
    assert cat == ("16", "16", "bias+act", "nk") and bins == (4, 12, 13)
    assert gemm_bucket(16, 4096, 14336, torch.float16, torch.float16, True, "gelu_tanh", "nk") == (cat, bins)
    assert gemm_bucket(16, 4096, 4096, "bfloat16", "float32", False, "none", "kn")[0] == ("16", "32", "none", "kn")
    assert attention_bucket(4, 32, 8, 1, 8192, 128, "causal") == ((128, "causal", True), (0, 13, 7))


def test_bucket_table_exact_nearest_default_and_allowed():
    cat = ("16", "16", "none", "nk")
    table = BucketTable({(cat, (4, 12, 12)): "torch", (cat, (13, 12, 12)): "sm90", (cat, (13, 13, 12)): "sm100"},
                        "torch", allowed=("sm90", "torch"))
    assert table.pick(cat, (13, 12, 12)) == "sm90"        # measured
    assert table.pick(cat, (14, 12, 12)) == "sm90"        # one bin away from a measured bucket
    assert table.pick(cat, (5, 12, 12)) == "torch"
    assert table.pick(cat, (13, 13, 12)) == "sm90"        # sm100 is not allowed here: the nearest allowed one
    assert table.pick(cat, (9, 12, 12)) == "torch"        # too far from anything measured: the default
    assert table.pick(("16", "32", "none", "nk"), (13, 12, 12)) == "torch"   # other categorical fields never mix
    assert table.pick(cat, (14, 12, 12)) == "sm90"        # memoized answer is the same


def test_picks_with_a_free_axis_are_every_pick_along_it():
    """A symbolic size under torch.compile is a free bin: the trace may meet any of the providers along that axis."""
    cat = ("16", "16", "none", "nk")
    table = BucketTable({(cat, (4, 12, 12)): "torch", (cat, (13, 12, 12)): "sm90", (cat, (4, 15, 15)): "torch"},
                        "torch")
    assert table.picks(cat, (None, 12, 12)) == {"torch", "sm90"}
    assert table.picks(cat, (None, 15, 15)) == {"torch"}                # far from the sm90 bucket at every M
    assert table.picks(cat, (None, 13, 13)) == {"torch", "sm90"}        # M=8192 here is 2 bins from it
    assert table.picks(cat, (13, 12, 12)) == {"sm90"}                  # no free axis: the one pick
    assert table.picks(cat, (None, None, 12)) == {"torch", "sm90"}


def _row(rid, case, **providers):
    return {"id": rid, "case": case, "providers": {n: ({"call_ms": v} if isinstance(v, float) else v)
                                                  for n, v in providers.items()}}


def _gemm_case(m, n, k, activation="none", bias=False, weight="nk"):
    return {"M": m, "N": n, "K": k, "dtype": "bfloat16", "out_dtype": "bfloat16", "bias": bias,
            "activation": activation, "weight": weight}


def test_choose_needs_our_variant_to_beat_torch_by_the_margin():
    rows = [_row("a", _gemm_case(8192, 4096, 4096), sm90=0.99, torch=1.0)]
    assert dispatch_table.choose("gemm", rows)[0] == "torch"            # 1% is within noise: torch is kept
    rows = [_row("a", _gemm_case(8192, 4096, 4096), sm90=0.90, torch=1.0)]
    assert dispatch_table.choose("gemm", rows)[0] == "sm90"
    wrong = [_row("a", _gemm_case(8192, 4096, 4096), sm90={"call_ms": 0.5, "wrong": True}, torch=1.0)]
    assert dispatch_table.choose("gemm", wrong)[0] == "torch"           # a wrong answer never wins
    failed = [_row("a", _gemm_case(8192, 4096, 4096), sm90={"error": "RuntimeError: x"}, torch=1.0)]
    assert dispatch_table.choose("gemm", failed)[0] == "torch"
    bench_only = [_row("a", _gemm_case(8192, 4096, 4096), **{"torch-max-autotune": 0.5, "torch": 1.0, "sm90": 0.9})]
    assert dispatch_table.choose("gemm", bench_only)[0] == "sm90"       # bench-only providers are not dispatchable


def test_ours_must_repay_its_extra_host_time_in_gpu_time():
    """A decode GEMM of ours that saves less GPU time than its launch path costs the host (HOST_EXTRA_MS) loses a
    host-bound eager step; one that saves more is picked (H200 suite: sm90_swap16 on llama3-8b o M1 and on an LM head)."""
    def provider(call, gpu):
        return {"call_ms": call, "gpu_ms": gpu}

    small = [_row("o", _gemm_case(1, 4096, 4096), sm90_swap16=provider(0.0180, 0.01236),
                  torch=provider(0.0243, 0.01337))]
    assert dispatch_table.choose("gemm", small)[0] == "torch"           # 1 us saved < the 7 us host cost
    assert dispatch_table.HOST_EXTRA_MS > 0.01337 * dispatch_table.MARGIN - 0.01236
    head = [_row("h", _gemm_case(1, 152064, 3584), sm90_swap16=provider(0.2475, 0.2456),
                 torch=provider(0.2580, 0.2585))]
    assert dispatch_table.choose("gemm", head)[0] == "sm90_swap16"      # 13 us saved


def test_ours_must_not_lose_on_gpu_time_where_the_call_is_a_host_bound_tie():
    """A call host-bound on both sides ties on the host clock; under CUDA graphs the GPU time is what it costs."""
    def provider(call, gpu):
        return {"call_ms": call, "gpu_ms": gpu}

    decode = _gemm_case(1, 4096, 4096)
    host_tie = [_row("d", decode, sm90=provider(0.0261, 0.0175), torch=provider(0.0270, 0.0075))]
    assert dispatch_table.choose("gemm", host_tie)[0] == "torch"
    # the measured H200 case that motivated it (llama3-8b decode B1 Lk1024: sm90 0.026 vs SDPA 0.027 ms a call)
    attention = [_row("a", _attention_case(1, 1024), sm90=provider(0.026126, 0.01753), sdpa=provider(0.02698, 0.0074816))]
    assert dispatch_table.choose("attention", attention)[0] == "sdpa"
    both = [_row("d", decode, sm90=provider(0.020, 0.0070), torch=provider(0.0270, 0.0160))]
    assert dispatch_table.choose("gemm", both)[0] == "sm90"            # wins on both clocks
    no_gpu = [_row("d", decode, sm90=0.020, torch=0.027)]
    assert dispatch_table.choose("gemm", no_gpu)[0] == "sm90"          # without GPU times, call time alone decides


def test_a_captured_call_takes_the_buckets_pick_by_gpu_time(tmp_path):
    """A call captured into a CUDA graph runs no host code at replay: each bucket's graph_provider is the choice by
    GPU time alone (no extra host time charged to ours, no backend switch), which the runtime picks for captured
    calls. The measured H100 cases: Mistral's sliding-window decode, split-KV 2.5x the sm90 kernel on the GPU but
    host-bound as a call; a decode GEMM where swap-AB saves less than its launch path costs eager."""
    def provider(call, gpu):
        return {"call_ms": call, "gpu_ms": gpu}

    window = {"B": 8, "Hq": 32, "Hkv": 8, "Lq": 1, "Lk": 8192, "D": 128, "mod": "window"}
    attention = [_row("w", window, sm90_n64=provider(0.0377, 0.0398), triton_splitkv=provider(0.0752, 0.0142))]
    assert dispatch_table.choose("attention", attention)[0] == "sm90_n64"
    assert dispatch_table.choose("attention", attention, timed="gpu_ms")[0] == "triton_splitkv"
    decode = [_row("o", _gemm_case(1, 4096, 4096), sm90_swap16=provider(0.0180, 0.01236),
                   torch=provider(0.0243, 0.01337))]
    assert dispatch_table.choose("gemm", decode)[0] == "torch"
    assert dispatch_table.choose("gemm", decode, timed="gpu_ms")[0] == "sm90_swap16"
    tie = [_row("t", _gemm_case(1, 4096, 4096), sm90_swap16=provider(0.0180, 0.0131), torch=provider(0.0243, 0.0133))]
    assert dispatch_table.choose("gemm", tie, timed="gpu_ms")[0] == "torch"     # within the margin: torch is kept
    no_gpu = [_row("n", _gemm_case(1, 4096, 4096), sm90_swap16=0.010, torch=0.020)]
    assert dispatch_table.choose("gemm", no_gpu, timed="gpu_ms")[0] == "torch"  # not timed on the GPU: no candidate

    table = dispatch_table.build("gemm", [("suite-gemm-h100.json", {**SUITE, "rows": decode})])
    (bucket,) = table["targets"]["sm90"]["buckets"]
    assert (bucket["provider"], bucket["graph_provider"]) == ("torch", "sm90_swap16")
    (tmp_path / "dispatch.json").write_text(json.dumps(table))
    rt = OpRuntime("x", str(tmp_path), ["sm90", "sm90_swap16"], "torch", ("sm90", "sm90_swap16", "torch"))
    key = (tuple(bucket["categorical"]), tuple(bucket["bins"]))
    assert rt.pick("sm90", key) == "torch" and rt.pick("sm90", key, captured=True) == "sm90_swap16"
    del bucket["graph_provider"]   # a table built before the field existed: the call-time pick
    (tmp_path / "dispatch.json").write_text(json.dumps(table))
    old = OpRuntime("x", str(tmp_path), ["sm90", "sm90_swap16"], "torch", ("sm90", "sm90_swap16", "torch"))
    assert old.pick("sm90", key, captured=True) == "torch"


def _attention_case(lq, lk):
    return {"B": 8, "Hq": 32, "Hkv": 8, "Lq": lq, "Lk": lk, "D": 128, "mod": "causal"}


def test_choose_keeps_sdpas_own_backend_choice_unless_a_named_backend_beats_it_by_the_margin():
    """A named SDPA backend costs an sdpa_kernel context per call; within noise of SDPA's own choice it is not worth it."""
    tie = [_row("d", _attention_case(1, 8192), sdpa=0.0703, **{"sdpa-cudnn": 0.0701, "sm90": 0.2})]
    assert dispatch_table.choose("attention", tie)[0] == "sdpa"
    faster = [_row("p", _attention_case(4096, 4096), sdpa=1.0, **{"sdpa-cudnn": 0.9, "sm90": 1.2})]
    assert dispatch_table.choose("attention", faster)[0] == "sdpa-cudnn"


def test_a_traced_call_goes_to_ours_only_where_ours_wins_by_more_than_the_custom_op_dispatch(tmp_path):
    """Under torch.compile ours is a custom op (torch.library's dispatch, which the eager path and the suite skip):
    the traced table charges it TRACED_OP_MS, and trace-time picks read that table while per-call picks do not."""

    small = _gemm_case(512, 14336, 4096, "silu")   # ours 5% faster: a win eager, not worth a custom op traced
    large = _gemm_case(8192, 14336, 4096, "silu")  # ours 10% faster on 1.5 ms: worth it either way
    run = {**SUITE, "rows": [_row("small", small, sm90=0.098, torch=0.103), _row("large", large, sm90=1.35, torch=1.5)]}
    table = dispatch_table.build("gemm", [("suite-gemm-h200.json", run)])
    got = {b["cases"][0]: (b["provider"], b["traced_provider"]) for b in table["targets"]["sm90"]["buckets"]}
    assert got == {"small": ("sm90", "torch"), "large": ("sm90", "sm90")}
    (tmp_path / "dispatch.json").write_text(json.dumps(table))
    rt = OpRuntime("x", str(tmp_path), ["sm90"], "torch", ("sm90", "torch"))
    bucket = gemm_bucket(512, 14336, 4096, "bfloat16", "bfloat16", False, "silu", "nk")
    assert rt.pick("sm90", bucket) == "sm90" and rt.picks("sm90", bucket) == {"torch"}


def test_a_residual_is_a_bucket_of_its_own():
    """A GEMM with a residual is bucketed apart from the same GEMM without one (its epilogue read costs our kernels
    more at large M than torch's add): the table keeps both picks, and a residual call never takes the plain one."""
    plain = _gemm_case(16384, 4096, 14336)
    residual = {**plain, "residual": True}
    assert gemm_bucket(16384, 4096, 14336, "bfloat16", "bfloat16", False, "none", "nk", True)[0][2] == "none+res"
    run = {**SUITE, "rows": [_row("plain", plain, sm90=2.6, torch=2.9), _row("res", residual, sm90=2.86, torch=2.57)]}
    table = dispatch_table.build("gemm", [("suite-gemm-h200.json", run)])
    got = {b["cases"][0]: b["provider"] for b in table["targets"]["sm90"]["buckets"]}
    assert got == {"plain": "sm90", "res": "torch"}


def test_a_varying_length_takes_the_buckets_best_provider_without_a_per_shape_setup(tmp_path):
    """SDPA's own choice (cuDNN on the H200) sets up per new length, which the suite's warmed-up loops never see:
    each attention bucket also records its choice without those providers (varying_provider), which the runtime
    picks for calls whose length varies; gemm has no such providers and no such field."""
    rows = [_row("d", _attention_case(1, 8192), sdpa=0.070, **{"sdpa-cudnn": 0.071, "sdpa-flash": 0.080,
                                                            "triton_splitkv": 0.076})]
    run = {**SUITE, "rows": rows}
    table = dispatch_table.build("attention", [("suite-attention-h200.json", run)])
    (bucket,) = table["targets"]["triton"]["buckets"]
    assert (bucket["provider"], bucket["varying_provider"]) == ("sdpa", "triton_splitkv")
    assert dispatch_table.choose("attention", rows, exclude=("sdpa", "sdpa-cudnn", "triton_splitkv"))[0] == "sdpa-flash"
    gemm = dispatch_table.build("gemm", [("suite-gemm-h200.json", {**SUITE, "rows": [
        _row("g", _gemm_case(16, 4096, 4096), sm90=0.02, torch=0.03)]})])
    assert all("varying_provider" not in b for b in gemm["targets"]["sm90"]["buckets"])
    (tmp_path / "dispatch.json").write_text(json.dumps(table))
    rt = OpRuntime("x", str(tmp_path), ["triton_splitkv"], "sdpa", ("triton_splitkv", "sdpa", "sdpa-flash"))
    key = (tuple(bucket["categorical"]), tuple(bucket["bins"]))
    assert rt.pick("triton", key) == "sdpa" and rt.pick("triton", key, varying=True) == "triton_splitkv"
    # a bucket the suite never measured (another mod): SDPA's own choice as a rule, flash where the length varies
    assert table["targets"]["triton"]["varying_default"] == "sdpa-flash"
    far = (key[0][:1] + ("window",) + key[0][2:], key[1])
    assert rt.pick("triton", far) == "sdpa" and rt.pick("triton", far, varying=True) == "sdpa-flash"


def test_a_symbolic_length_goes_to_ours_only_where_ours_wins_by_more_than_the_custom_op_dispatch(tmp_path):
    """Where torch.compile made a decode length symbolic, the trace-time pick is the varying choice with the custom
    op's dispatch (TRACED_OP_MS) charged to ours, as traced_provider charges it: a split-KV kernel 10 us faster than
    flash is the varying pick for eager calls but not worth a custom op in a compiled graph; 100 us faster is."""
    close = _row("close", _attention_case(1, 1024), sdpa=0.030, **{"sdpa-flash": 0.045, "triton_splitkv": 0.035})
    far = _row("far", _attention_case(1, 32768), sdpa=0.060, **{"sdpa-flash": 0.200, "triton_splitkv": 0.080})
    table = dispatch_table.build("attention", [("suite-attention-h200.json", {**SUITE, "rows": [close, far]})])
    got = {b["cases"][0]: (b["varying_provider"], b["traced_varying_provider"])
           for b in table["targets"]["triton"]["buckets"]}
    assert got == {"close": ("triton_splitkv", "sdpa-flash"), "far": ("triton_splitkv", "triton_splitkv")}
    (tmp_path / "dispatch.json").write_text(json.dumps(table))
    rt = OpRuntime("x", str(tmp_path), ["triton_splitkv"], "sdpa", ("triton_splitkv", "sdpa", "sdpa-flash"))
    bucket = next(b for b in table["targets"]["triton"]["buckets"] if b["cases"] == ["close"])
    key = (tuple(bucket["categorical"]), tuple(bucket["bins"]))
    assert rt.pick("triton", key, varying=True) == "triton_splitkv"
    assert rt.picks("triton", key, varying=True) == {"sdpa-flash"}
    # a table built before the field existed: the varying choice
    del bucket["traced_varying_provider"]
    (tmp_path / "dispatch.json").write_text(json.dumps(table))
    old = OpRuntime("x", str(tmp_path), ["triton_splitkv"], "sdpa", ("triton_splitkv", "sdpa", "sdpa-flash"))
    assert old.picks("triton", key, varying=True) == {"triton_splitkv"}


def test_the_length_varies_only_when_a_class_comes_back_with_another_length():
    """A static KV cache (one length) never counts as varying; a growing one does from its second length on, per
    class (batch, heads, Lq, D, dtype, device, mod), so another model's static cache is not affected."""
    import generated.attention as att

    def call(b, lk, lq=1):
        return (torch.empty(b, 8, lq, 64, device="meta"), torch.empty(b, 2, lk, 64, device="meta"))
    att._SEEN_LENGTHS.clear()
    assert [att._length_varies(*call(3, 4096), "causal") for _ in range(3)] == [False, False, False]
    assert att._length_varies(*call(5, 100), "causal") is False   # another class's first length
    assert [att._length_varies(*call(5, n), "causal") for n in (101, 102)] == [True, True]
    assert att._length_varies(*call(3, 4096), "causal") is False  # the static cache is still one length
    # prefill (Lq == Lk): a server's prompts, a new length per request, vary too; fixed-length batches do not
    assert [att._length_varies(*call(2, n, n), "causal") for n in (512, 512, 777, 900)] == [False, False, True, True]


def test_choose_never_picks_a_provider_outside_the_ops_accuracy_for_the_output_dtype():
    """An fp32 output that a provider rounded through bf16 (rel err 1.7e-3) is faster but not what the op promises."""
    case = {**_gemm_case(2048, 128256, 4096), "out_dtype": "float32"}
    rows = [_row("f32", case, sm90={"call_ms": 1.0, "rel_err": 4e-6}, torch={"call_ms": 0.8, "rel_err": 1.7e-3})]
    assert dispatch_table.choose("gemm", rows)[0] == "sm90"
    bf16 = [_row("bf16", _gemm_case(2048, 128256, 4096), sm90={"call_ms": 1.0, "rel_err": 2e-3},
                 torch={"call_ms": 0.8, "rel_err": 2e-3})]
    assert dispatch_table.choose("gemm", bf16)[0] == "torch"


def test_choose_scores_a_bucket_by_the_geomean_over_its_cases():
    rows = [_row("a", _gemm_case(8192, 4096, 4096), sm90=0.5, torch=1.0),   # ours 2x faster here
            _row("b", _gemm_case(9000, 4096, 4096), sm90=1.5, torch=1.0)]   # ours 1.5x slower here
    provider, scores = dispatch_table.choose("gemm", rows)
    assert provider == "sm90" and scores["sm90"] < scores["torch"]


SUITE = {"suite_version": 1, "family": "gemm", "device": "NVIDIA H200", "versions": {"torch": "2.11.0"},
         "command": "python bench/suite/run.py --family gemm",
         "rows": [_row("decode", _gemm_case(16, 4096, 4096, "silu", True), sm90=0.05, torch=0.02),
                  _row("prefill", _gemm_case(8192, 14336, 4096, "silu", True), sm90=0.80, torch=1.00)]}


@pytest.fixture
def recorded_table(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "suite-gemm-h200.json").write_text(json.dumps(SUITE))
    assert dispatch_table.write(tmp_path, "gemm", results) == tmp_path / "dispatch.json"
    return tmp_path


def test_dispatch_json_records_its_measurement(recorded_table):
    data = json.loads((recorded_table / "dispatch.json").read_text())
    sm90 = data["targets"]["sm90"]
    assert sm90["device"] == "NVIDIA H200" and sm90["command"].startswith("python bench/suite/run.py")
    assert sorted(b["provider"] for b in sm90["buckets"]) == ["sm90", "torch"]


def test_rms_rows_are_a_bucket_field_that_falls_back_to_the_plain_bucket_until_measured(tmp_path, monkeypatch):
    """RMSNorm rows (rms_eps) have buckets of their own ("...+rms"); a table that never measured them sends such a
    call where it sends the same call without them (our kernels pay an [M] vector read for them, torch a pass over
    a), and once the suite measured them their own pick decides."""
    import generated.gemm as g

    assert gemm_bucket(16, 4096, 4096, "bfloat16", "bfloat16", False, "swiglu", "nk", False, True)[0][2] == "+act+rms"
    plain, rms = _gemm_case(16, 4096, 4096, "swiglu"), {**_gemm_case(16, 4096, 4096, "swiglu"), "rms": True}
    x, w = torch.empty(16, 4096, dtype=torch.bfloat16), torch.empty(8192, 4096, dtype=torch.bfloat16)
    for rows, want_rms in (([_row("plain", plain, sm90=0.02, torch=0.03)], "sm90"),
                           ([_row("plain", plain, sm90=0.02, torch=0.03), _row("rms", rms, sm90=0.05, torch=0.03)],
                            "torch")):
        table = dispatch_table.build("gemm", [("suite-gemm-h200.json", {**SUITE, "rows": rows})])
        (tmp_path / "dispatch.json").write_text(json.dumps(table))
        rt = OpRuntime("generated.gemm", str(tmp_path), ["sm90", "triton"], "torch", g.PROVIDERS)
        monkeypatch.setattr(g, "_RT", rt)
        assert rt.pick("sm90", g.bucket_of(x, w.t(), None, "swiglu", torch.bfloat16, target="sm90")) == "sm90"
        assert rt.pick("sm90", g.bucket_of(x, w.t(), None, "swiglu", torch.bfloat16, rms=True,
                                           target="sm90")) == want_rms


def test_real_tensors_to_bucket_to_decision_against_a_recorded_table(recorded_table):
    """End to end on CPU: real tensors (an activation and an nn.Linear weight, at the measured shapes and near them)
    -> the op's bucket -> the recorded table's decision. The decode case was measured faster on torch and the prefill
    case on sm90: a constant (stub) decision fails one of them."""
    import generated.gemm as g

    rt = OpRuntime("generated.gemm", str(recorded_table), ["sm90", "triton"], "torch", g.PROVIDERS)
    for rows, n, want in ((16, 4096, "torch"), (24, 4096, "torch"), (8192, 14336, "sm90"), (12000, 14336, "sm90")):
        x = torch.empty(rows, 4096, dtype=torch.bfloat16)
        weight, bias = torch.empty(n, 4096, dtype=torch.bfloat16), torch.empty(n, dtype=torch.bfloat16)
        assert rt.pick("sm90", g.bucket_of(x, weight.t(), bias, "silu", torch.bfloat16)) == want, rows
    # the same weight stored [K, N] is another bucket, not measured: the conservative default
    x, b = torch.empty(8192, 4096, dtype=torch.bfloat16), torch.empty(4096, 14336, dtype=torch.bfloat16)
    assert rt.pick("sm90", g.bucket_of(x, b, torch.empty(14336), "silu", torch.bfloat16)) == "torch"
    assert rt.pick("sm100", g.bucket_of(x, b, None, "none", torch.bfloat16)) == "torch"   # no sm100 table


def test_a_named_config_is_one_of_ours_and_wins_its_buckets_by_the_same_rule(tmp_path):
    """Named configs of a target (sm90_m64) are candidates beside the default: the bucket where sm90_m64 beats
    torch by the margin goes to it, the one where it only ties stays on torch, and the table is still the sm90 one
    (a Hopper device reads it), which a runtime built with that name shipped returns."""
    decode, mid = _gemm_case(16, 4096, 4096, "silu"), _gemm_case(2048, 4096, 4096, "silu")
    run = {**SUITE, "rows": [_row("decode", decode, sm90=0.050, sm90_m64=0.018, torch=0.020),
                             _row("mid", mid, sm90=0.120, sm90_m64=0.101, torch=0.100)]}
    table = dispatch_table.build("gemm", [("suite-gemm-h200.json", run)])
    got = {b["cases"][0]: b["provider"] for b in table["targets"]["sm90"]["buckets"]}
    assert got == {"decode": "sm90_m64", "mid": "torch"}
    assert dispatch_table.is_ours("sm90_m64") and not dispatch_table.is_ours("sdpa-cudnn")
    (tmp_path / "dispatch.json").write_text(json.dumps(table))
    rt = OpRuntime("x", str(tmp_path), ["sm90", "sm90_m64"], "torch", ("sm90", "sm90_m64", "torch"))
    assert rt.pick("sm90", gemm_bucket(16, 4096, 4096, "bfloat16", "bfloat16", False, "silu", "nk")) == "sm90_m64"
    # a package built without that config never returns it (the table entry is dropped, the bucket takes the default)
    rt = OpRuntime("x", str(tmp_path), ["sm90"], "torch", ("sm90", "torch"))
    assert rt.pick("sm90", gemm_bucket(16, 4096, 4096, "bfloat16", "bfloat16", False, "silu", "nk")) == "torch"


def test_the_shipped_gemm_package_routes_its_named_configs_as_gluon_variants():
    import generated.gemm as g
    from gen.runtime.dispatch import variant_target

    named = [n for n in g.SHIPPED if n != variant_target(n)]
    assert "triton_splitk" in named and any(variant_target(n) == "sm90" for n in named)
    for n in named:
        assert n in g.PROVIDERS and (ROOT / "generated" / "gemm" / f"{n}.py").exists()
        # the sm90 ones launch as Gluon variants (TMA, plan per class); the portable split-K one as a portable
        # variant with a plan (no TMA alignment rule)
        assert (n in g._GLUON) == (variant_target(n) == "sm90")
        # bundled like their target: the Gluon ones precompiled, the portable one JIT-compiled (BUNDLED_TARGETS)
        assert (ROOT / "generated" / "gemm" / "kernels" / n / INDEX).exists() == (n in g._GLUON)


def test_target_for_the_device_and_what_shipped():
    assert target_for(9, ["sm90", "triton"]) == "sm90" and target_for(10, ["sm100"]) == "sm100"
    assert target_for(10, ["sm90", "triton"]) == "triton" and target_for(8, ["sm90", "sm100"]) == "triton"


def test_direct_calls_only_for_plain_cuda_tensors_outside_autograd():
    cpu = torch.empty(2)
    assert not direct_call_ok(cpu)                        # CPU (interpreter) calls go through the custom op
    fake_cuda = torch.empty(2, device="meta")
    assert not direct_call_ok(fake_cuda)
    assert direct_call_ok() and direct_call_ok(None)


def test_direct_calls_take_an_nn_linear_weight_but_no_other_subclass(monkeypatch):
    """A model's weights are nn.Parameters: at inference they skip the dispatcher as plain tensors do (before, every
    linear of an nn.Module paid torch.library's dispatch); autograd and other subclasses still take the op."""
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))   # CPU tensors stand in for CUDA's
    x, weight = torch.empty(2, 4), torch.nn.Parameter(torch.empty(3, 4))         # requires grad, as nn.Linear's
    assert not direct_call_ok(x, weight)                  # a training step: autograd needs the registered op
    with torch.no_grad():
        assert direct_call_ok(x, weight)                  # inference: no dispatcher
    assert direct_call_ok(x, torch.nn.Parameter(torch.empty(3, 4), requires_grad=False))   # a frozen model

    class QuantizedWeight(torch.nn.Parameter):           # a subclass may change what ops mean: keep the op
        pass
    with torch.no_grad():
        assert not direct_call_ok(x, QuantizedWeight(torch.empty(3, 4)))


class _FakeParam:
    def __init__(self, dns=False):
        self.do_not_specialize = dns
        self.do_not_specialize_on_alignment = False


class _FakeJit:
    """Stands in for a @jit function: records what the Launcher asks Triton to compile."""
    arg_names = ["desc", "ptr", "n_dns", "n", "BLOCK", "num_warps"]

    def __init__(self):
        self.params = [_FakeParam(), _FakeParam(), _FakeParam(dns=True), _FakeParam(), _FakeParam(), _FakeParam()]
        self.compiled = []
        self.__name__ = "fake_kernel"

    def warmup(self, *args, grid, **constants):
        self.compiled.append((args, constants))
        return types.SimpleNamespace(tag=len(self.compiled))


def test_launcher_compiles_once_per_specialization_and_passes_constexprs_last(monkeypatch):
    fn = _FakeJit()
    launched = []
    monkeypatch.setattr(Launcher, "launch_compiled",
                        staticmethod(lambda kernel, grid, dev, args, tail: launched.append((kernel.tag, args, tail))))
    launcher = Launcher(fn, {"BLOCK": 128, "num_warps": 4, "maxnreg": 128})
    aligned, misaligned = torch.empty(64), torch.empty(65)[1:]
    real_desc = object()
    launcher((1,), 0, ("d", aligned, 7, 32), lambda: (real_desc, aligned, 7, 32))
    launcher((1,), 0, ("d", aligned, 9, 48), lambda: pytest.fail("same specialization: no compile"))
    launcher((1,), 0, ("d", misaligned, 9, 48), lambda: (real_desc, misaligned, 9, 48))   # alignment differs
    launcher((1,), 0, ("d", aligned, 9, 1), lambda: (real_desc, aligned, 9, 1))           # n == 1 specializes
    launcher((1,), 0, ("d", aligned, 3, 33), lambda: (real_desc, aligned, 3, 33))         # n % 16 != 0 too
    assert len(fn.compiled) == 4 and fn.compiled[0][0][0] is real_desc
    assert fn.compiled[0][1] == {"BLOCK": 128, "num_warps": 4, "maxnreg": 128,            # options reach Triton,
                                 "enable_fp_fusion": True}                               # FP fusion asked for
    assert [t for t, _, _ in launched] == [1, 1, 2, 3, 4]
    assert all(tail == (128, 4) for _, _, tail in launched)                                # params only, in order
    assert launched[1][1] == ("d", aligned, 9, 48)


def test_launcher_refuses_constexprs_before_runtime_arguments():
    fn = _FakeJit()
    with pytest.raises(ValueError, match="constexpr parameters must follow"):
        Launcher(fn, {"ptr": 1, "BLOCK": 128, "num_warps": 4})


def test_generated_packages_carry_their_dispatch_table_or_none():
    for family in ("gemm", "attention"):
        runs = dispatch_table.suite_results(family)
        path = ROOT / "generated" / family / "dispatch.json"
        assert path.exists() == bool(runs), "regenerate: python -m gen specs/<family>.yaml"
        if runs:
            assert json.loads(path.read_text()) == json.loads(json.dumps(dispatch_table.build(family, runs)))


def _triton_release() -> tuple:
    import triton

    from gen.runtime.triton_range import release

    return release(triton.__version__)


@pytest.mark.skipif(_triton_release() >= (3, 7), reason="DirectLaunch engages on triton 3.6's launcher only")
def test_direct_launch_passes_the_c_launcher_what_tritons_own_wrapper_passes(monkeypatch):
    """DirectLaunch skips Triton's per-call descriptor wrapper and caches the tensor maps; the C launch function must
    receive exactly the arguments Triton's wrapper (wrap_handle_tensordesc + make_tensordesc_arg) gives it, and a
    map is encoded once per (address, shape, strides)."""
    import types

    import triton
    from triton.backends.nvidia import driver as nv

    from gen.runtime.launch import DirectLaunch, TmaDescriptor

    encoded = []

    def fill(ptr, swizzle, elem_size, dtype, block, shape, strides, padding):
        encoded.append(ptr)
        return ("map", ptr, swizzle, elem_size, dtype, tuple(block), tuple(shape), tuple(strides), padding)

    fake_driver = types.SimpleNamespace(utils=types.SimpleNamespace(fill_tma_descriptor=fill))
    monkeypatch.setattr(triton.runtime.driver, "_active", fake_driver)
    signature = {"a_desc": "tensordesc<bf16[128, 64]>", "b_desc": "tensordesc<bf16[64, 128]>", "bias": "*bf16",
                 "M": "i32", "BLOCK": "constexpr"}
    meta = [{"swizzle": 128, "elem_size": 2, "elem_type": 10, "block_size": [128, 64], "fp4_padded": False},
            {"swizzle": 128, "elem_size": 2, "elem_type": 10, "block_size": [64, 128], "fp4_padded": False}]
    calls = []
    c_launch = lambda *args: calls.append(args)  # noqa: E731
    run = types.SimpleNamespace(launch=nv.wrap_handle_tensordesc(c_launch, signature, meta), global_scratch_size=0,
                                profile_scratch_size=0, launch_cooperative_grid=False, launch_pdl=False)
    kernel = types.SimpleNamespace(run=run, function=7, packed_metadata=("packed",))
    a, b, bias = torch.empty(256, 64, dtype=torch.bfloat16), torch.empty(64, 512, dtype=torch.bfloat16), torch.empty(4)
    args = (TmaDescriptor(a, a.shape, a.stride()), TmaDescriptor(b, b.shape, b.stride()), bias, 256)
    tail = (128,)
    # Triton's own path, as CudaLauncher.__call__ makes it
    run.launch(4, 1, 1, 99, kernel.function, False, False, None, None, kernel.packed_metadata, None, None, None,
               *args, *tail)
    direct = DirectLaunch.of(kernel)
    assert direct is not None
    direct((4,), 99, args, tail)
    assert calls[0] == calls[1]
    direct((4,), 99, args, tail)
    assert calls[2] == calls[0] and len(encoded) == 4       # 2 by Triton, 2 by the first direct call, 0 after
    a2 = torch.empty(256, 64, dtype=torch.bfloat16)
    direct((4,), 99, (TmaDescriptor(a2, a2.shape, a2.stride()),) + args[1:], tail)
    assert encoded[-1] == a2.data_ptr() and len(encoded) == 5   # a new address: one new map
    run.global_scratch_size = 64
    assert DirectLaunch.of(kernel) is None                   # scratch is kernel.run's to allocate


def test_static_size_tells_a_static_size_from_a_symbolic_one_while_dynamo_traces():
    """The trace-time dispatch passes static sizes to the table and frees symbolic ones; Dynamo reports type(d) as
    int for both, so this is what tells them apart (a wrong answer would hand a SymInt to a constant function, or
    give up a static decision)."""
    from gen.runtime.shapes import static_size

    def fn(x, w):
        m, n = static_size(x.shape[0]), static_size(w.shape[0])
        return x + (0 if m is None else m) * 10 + (0 if n is None else n)

    x, w = torch.zeros(3), torch.zeros(5)
    for dynamic, expected in ((False, 35.0), (True, 0.0)):
        torch._dynamo.reset()
        assert torch.compile(fn, backend="eager", fullgraph=True, dynamic=dynamic)(x, w)[0].item() == expected
    torch._dynamo.reset()
    auto = torch.compile(fn, backend="eager", fullgraph=True)    # Dynamo's automatic dynamic: x's size changes
    assert auto(x, w)[0].item() == 35.0 and auto(torch.zeros(4), w)[0].item() == 5.0
    assert static_size(7) == 7                                   # eager: a size is a size

    def pinned(x, w):   # symbolic sizes whose value a check or a view fixes, or only bounds
        torch._check(x.shape[0] < 1000)
        w.view(5, 1)
        m, n = static_size(x.shape[0]), static_size(w.shape[0] + 0)
        return x + (0 if m is None else m) * 10 + (0 if n is None else n)
    torch._dynamo.reset()
    assert torch.compile(pinned, backend="eager", fullgraph=True, dynamic=True)(x, w)[0].item() == 5.0


def test_a_traced_calls_metadata_reads_symbolic_sizes_as_none_and_rebuilds_as_fake_tensors():
    """The constant trace verdict (gen/runtime/traced.py) sees a traced call's tensors as constants: symbolic sizes and
    strides as None, which symbolic_only accepts only in the sizes a decision leaves free or splits; fake_tensors
    rebuilds them (a stand-in for a symbolic size, any device, no GPU) under the call's grad mode."""
    from gen.runtime.traced import SYMBOLIC_STAND_IN, fake_tensors, kv_agree, static_meta, symbolic_only

    seen = []

    @torch.compiler.assume_constant_result
    def record(*metas):
        seen.append(metas)
        return 0

    x4 = torch.zeros(2, 3, 4, 5)

    def fn(x, w):
        return x + record(static_meta(x), static_meta(w), static_meta(None), static_meta([1]), kv_agree(x, x, w),
                          kv_agree(x4, x4, x4))

    torch._dynamo.reset()
    step = torch.compile(fn, backend="eager", fullgraph=True)
    step(torch.zeros(8, 4, 16), torch.zeros(3, 1))
    step(torch.zeros(9, 5, 16), torch.zeros(3, 1))   # the first two sizes become symbolic
    static, free = seen
    assert static[0] == ((8, 4, 16), (64, 16, 1), torch.float32, torch.device("cpu"), False)
    assert static[2] is None and static[3] is False and static[4] is False and static[5]   # no tensor; not 4-D
    assert free[0][:2] == ((None, None, 16), (None, 16, 1))   # the first stride is symbolic: s1 * 16
    assert symbolic_only(static[0]) and symbolic_only(None) and not symbolic_only(False)
    assert symbolic_only(free[0], free=(0, 1)) and not symbolic_only(free[0], free=(0,)) and not symbolic_only(free[0])
    meta = ((None, 4, 64), (None, 64, 1), torch.bfloat16, torch.device("cuda", 0), True)
    with fake_tensors((meta, None), grad_enabled=False) as (t, none):
        assert none is None and t.shape == (SYMBOLIC_STAND_IN, 4, 64) and t.stride() == (256, 64, 1)
        assert t.device == torch.device("cuda", 0) and t.requires_grad and not torch.is_grad_enabled()


def test_every_supported_tritons_launcher_reads_our_descriptor_and_only_3_6s_is_launched_directly(monkeypatch):
    """Triton >= 3.7 reads more fields off a host descriptor (round_f32_to_tf32) and calls its C launch function with
    other arguments (annotations, the signature, the kernel arguments as one tuple): the installed Triton's
    make_tensordesc_arg must accept a TmaDescriptor, and a launcher of that newer shape is never launched directly
    (even where its descriptor wrapper's closure looks like 3.6's, as in 3.7.1)."""
    import inspect
    import types

    import triton
    from triton.backends.nvidia import driver as nv

    from gen.runtime.launch import DirectLaunch, TmaDescriptor

    def fill(ptr, *rest):
        return ("map", ptr)

    utils = types.SimpleNamespace(fill_tma_descriptor=fill, fill_tma_descriptor_tiled=fill)
    monkeypatch.setattr(triton.runtime.driver, "_active", types.SimpleNamespace(utils=utils))
    a = torch.empty(256, 64, dtype=torch.bfloat16)
    meta = {"swizzle": 128, "elem_size": 2, "elem_type": 10, "block_size": [128, 64], "fp4_padded": False}
    extra = [None] * (len(inspect.signature(nv.make_tensordesc_arg).parameters) - 2)
    got = nv.make_tensordesc_arg(TmaDescriptor(a, a.shape, a.stride()), meta, *extra)
    assert ("map", a.data_ptr()) in [tuple(x) if isinstance(x, tuple) else x for x in got]
    c_launch = lambda *args: None  # noqa: E731
    signature = {"a_desc": "tensordesc<bf16[128, 64]>", "M": "i32"}
    newer = types.SimpleNamespace(launch=nv.wrap_handle_tensordesc(c_launch, signature, [meta]), global_scratch_size=0,
                                  profile_scratch_size=0, launch_cooperative_grid=False, launch_pdl=False,
                                  arg_annotations=())
    assert DirectLaunch.of(types.SimpleNamespace(run=newer, function=7, packed_metadata=())) is None


def test_a_variant_says_what_the_suite_measured_against_the_inductor_kernels_it_replaces(tmp_path):
    """Why a kernel exists: each variant module ends with the suite's geomeans of Inductor's / the best torch
    provider's time over ours, for this target, call and GPU time, and how many cases the table sends to it."""
    def timed(call, gpu):
        return {"call_ms": call, "gpu_ms": gpu}

    rows = [_row("a", _gemm_case(8192, 4096, 4096), sm90=timed(1.0, 0.9), torch=timed(1.1, 1.0),
                 **{"torch-compile": timed(1.2, 1.0)}),
            _row("b", _gemm_case(16, 4096, 4096), sm90=timed(0.05, 0.04), torch=timed(0.02, 0.01),
                 **{"torch-compile": timed(0.04, 0.01)})]
    (tmp_path / "suite-gemm-h200.json").write_text(json.dumps({**SUITE, "rows": rows}))
    lines = dispatch_table.suite_lines("gemm", "sm90", tmp_path)
    assert "sm90 measured on 2 cases, the dispatch table sends 1 of them to it" in lines[0]
    inductor_call = f"geomean {((1.2 / 1.0) * (0.04 / 0.05)) ** 0.5:.3f}x"
    assert any("vs Inductor" in ln and "call" in ln and inductor_call in ln and "faster on 1 of 2" in ln
               for ln in lines), lines
    best_gpu = f"geomean {((1.0 / 0.9) * (0.01 / 0.04)) ** 0.5:.3f}x"
    assert any("best torch provider" in ln and "GPU time" in ln and best_gpu in ln for ln in lines), lines
    assert dispatch_table.suite_lines("gemm", "sm100", tmp_path) == []   # never measured: nothing claimed


def _fake_package(root, name, shipped_by_release):
    """A package `name` in `root` with base variant modules and, per release folder, that release's own build."""
    pkg = root / name
    (pkg / "fam").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "fam" / "__init__.py").write_text("")
    for variant in ("sm90", "sm90_n64", "triton"):
        (pkg / "fam" / f"{variant}.py").write_text("BUILT_BY = 'tested'\n")
    for folder, shipped in shipped_by_release.items():
        (pkg / "fam" / folder).mkdir()
        (pkg / "fam" / folder / "__init__.py").write_text(f"SHIPPED = {shipped!r}\n")
        for variant in shipped:
            (pkg / "fam" / folder / f"{variant}.py").write_text(f"BUILT_BY = {folder!r}\n")
    return pkg / "fam"


@pytest.mark.parametrize("version, expected", [
    ("3.6.0", {"sm90": "tested", "sm90_n64": "tested", "triton": "tested"}),
    # 3.9's own build shipped sm90 and triton (its gates dropped sm90_n64): those come from its folder
    ("3.9.0", {"sm90": "triton_3_9", "sm90_n64": "tested", "triton": "triton_3_9"}),
    ("3.8.0", {"sm90": "tested", "sm90_n64": "tested", "triton": "tested"}),   # a release without a build of its own
])
def test_variant_modules_and_bundles_come_from_the_installed_releases_own_build(version, expected, tmp_path,
                                                                                monkeypatch):
    import sys

    from gen.runtime import seed as seed_module, triton_range

    name = f"relpkg_{version.replace('.', '_')}"
    fam = _fake_package(tmp_path, name, {"triton_3_9": ["sm90", "triton"]})
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(triton_range, "installed", lambda: version)
    seeded = []
    monkeypatch.setattr(seed_module, "seed", lambda kernels, module, case: seeded.append((kernels, module.__name__)))
    monkeypatch.delenv("GEN_NO_PRECOMPILED", raising=False)
    rt = OpRuntime(f"{name}.fam", str(fam), ["sm90", "sm90_n64", "triton"], "sdpa", ("sm90", "sm90_n64", "triton"))
    got = {v: rt.variant(v, ("k",), {}).BUILT_BY for v in expected}
    assert got == expected
    # each Gluon module is seeded from the bundle beside it: the release's own for its modules, else the package's
    for kernels, module in seeded:
        folder = expected[module.rsplit(".", 1)[1]]
        assert kernels == (fam if folder == "tested" else fam / folder) / "kernels" / module.rsplit(".", 1)[1]
    assert sorted(m.rsplit(".", 1)[1] for _, m in seeded) == ["sm90", "sm90_n64"]   # triton is not bundled
    for m in [m for m in sys.modules if m.startswith(name)]:
        del sys.modules[m]


def test_release_folder_names_each_supported_release_but_the_tested_one():
    from gen.runtime.triton_range import TESTED, release_folder

    assert release_folder(TESTED) is None and release_folder(TESTED + "+git0abc") is None
    assert [release_folder(v) for v in ("3.7.1", "3.8.0", "3.9.0rc1")] == ["triton_3_7", "triton_3_8", "triton_3_9"]


def test_on_another_gpu_model_the_tables_picks_of_ours_fall_back_to_the_conservative_choice(tmp_path, monkeypatch):
    """A table holds for the GPU model the suite ran on (its "device"). On another model of the same architecture (an
    H100 reading the H200's sm90 table) its torch picks stand and its picks of ours fall back: to torch's default, or
    where the length varies to the table's varying default (no per-length setup); traced picks the same way.
    GEN_DISPATCH_ANY_DEVICE=1 keeps the table's picks."""
    import gen.runtime.op as op

    win = _row("win", _attention_case(1, 8192), sdpa=0.100, **{"sdpa-flash": 0.110, "sm90": 0.050})
    table = dispatch_table.build("attention", [("suite-attention-h200.json", {**SUITE, "rows": [win]})])
    (bucket,) = table["targets"]["sm90"]["buckets"]
    key = (tuple(bucket["categorical"]), tuple(bucket["bins"]))
    (tmp_path / "dispatch.json").write_text(json.dumps(table))

    def runtime(device_name):
        rt = OpRuntime("x", str(tmp_path), ["sm90"], "sdpa", ("sm90", "sdpa", "sdpa-flash"))
        rt.note_device("sm90", device_name)
        return rt

    same = runtime("NVIDIA H200")
    assert same.pick("sm90", key) == "sm90" and same.pick("sm90", key, varying=True) == "sm90"
    assert same.picks("sm90", key) == {"sm90"}
    other = runtime("NVIDIA H100 80GB HBM3")
    assert other.pick("sm90", key) == "sdpa" and other.pick("sm90", key, varying=True) == "sdpa-flash"
    assert other.picks("sm90", key) == {"sdpa"} and other.picks("sm90", key, varying=True) == {"sdpa-flash"}
    monkeypatch.setattr(op, "ANY_DEVICE", True)
    assert runtime("NVIDIA H100 80GB HBM3").pick("sm90", key) == "sm90"
    # the table's torch picks stand on any model (a named SDPA backend too)
    flash = _row("flash", _attention_case(1, 1024), sdpa=0.100, **{"sdpa-flash": 0.050, "sm90": 0.090})
    table = dispatch_table.build("attention", [("suite-attention-h200.json", {**SUITE, "rows": [flash]})])
    (bucket,) = table["targets"]["sm90"]["buckets"]
    (tmp_path / "dispatch.json").write_text(json.dumps(table))
    monkeypatch.setattr(op, "ANY_DEVICE", False)
    assert runtime("NVIDIA H100 80GB HBM3").pick("sm90", (tuple(bucket["categorical"]), tuple(bucket["bins"]))) \
        == "sdpa-flash"


def test_a_second_gpu_model_of_the_architecture_gets_a_table_of_its_own(tmp_path):
    """Suite runs of two models of one architecture (H200 and H100 files for sm90) build two tables, not one
    overwriting the other: the first run's under the target, the other's under "target@model". A process on either
    model picks from its own table; a third model keeps the first table's torch picks and falls back from its ours."""
    h100 = {**SUITE, "device": "NVIDIA H100 80GB HBM3",
            "rows": [_row("prefill", _gemm_case(8192, 14336, 4096, "silu", True), sm90=1.20, torch=1.00)]}
    table = dispatch_table.build("gemm", [("suite-gemm-h100.json", h100), ("suite-gemm-h200.json", SUITE)])
    assert sorted(table["targets"]) == ["sm90", "sm90@NVIDIA H200"]
    assert table["targets"]["sm90"]["device"] == "NVIDIA H100 80GB HBM3"
    (tmp_path / "dispatch.json").write_text(json.dumps(table))
    bucket = gemm_bucket(8192, 14336, 4096, "bfloat16", "bfloat16", True, "silu", "nk")

    def pick_on(name):
        rt = OpRuntime("x", str(tmp_path), ["sm90"], "torch", ("sm90", "torch"))
        rt.note_device("sm90", name)
        return rt.pick("sm90", bucket), rt.picks("sm90", bucket)

    assert pick_on("NVIDIA H100 80GB HBM3") == ("torch", {"torch"})    # the H100 run: cuBLAS wins there
    assert pick_on("NVIDIA H200") == ("sm90", {"sm90"})                  # the H200 run: ours wins there
    assert pick_on("NVIDIA H800") == ("torch", {"torch"})


def test_a_traced_call_is_charged_its_gpu_time_plus_its_host_time_in_a_compiled_graph():
    """Under torch.compile the torch provider becomes Inductor's kernels of it (the suite's torch-compile) launched by
    the compiled wrapper, while ours stays a custom op with its dispatch and launch path; a compiled step is host-bound,
    so host and GPU time add up. H100 suite v4 (ms, call / GPU): ours stays the eager and CUDA-graph pick where it
    beats the eager torch provider, and is traced only where its GPU time beats Inductor's by more than its extra
    host time."""
    def provider(call, gpu):
        return {"call_ms": call, "gpu_ms": gpu}

    def rms_case(m, n):
        return dict(_gemm_case(m, n, 4096), rms=True)

    decode = [_row("q", rms_case(16, 6144), sm90_m64=provider(0.0353, 0.0301), torch=provider(0.0849, 0.0441),
                   **{"torch-compile": provider(0.0875, 0.0236)})]       # llama3-8b qkv M16 after its norm
    assert dispatch_table.choose("gemm", decode)[0] == "sm90_m64"
    assert dispatch_table.choose("gemm", decode, timed="gpu_ms")[0] == "sm90_m64"
    assert dispatch_table.choose("gemm", decode, traced=True)[0] == "torch"
    medium = [_row("g", rms_case(512, 28672), sm90_n128=provider(0.1918, 0.1851), torch=provider(0.2946, 0.2598),
                   **{"torch-compile": provider(0.2420, 0.2142)})]       # gate_up M512: 0.79x compiled block
    assert dispatch_table.choose("gemm", medium)[0] == "sm90_n128"
    assert dispatch_table.choose("gemm", medium, traced=True)[0] == "torch"
    large = [_row("G", rms_case(2048, 28672), sm90=provider(0.6830, 0.6389), torch=provider(1.0388, 0.9749),
                  **{"torch-compile": provider(0.8752, 0.8041)})]        # gate_up M2048: ours saves 0.17 ms
    assert dispatch_table.choose("gemm", large, traced=True)[0] == "sm90"
    no_gpu = [_row("d", _gemm_case(1, 4096, 4096), sm90=0.020, torch=0.027)]   # call times, ours + the dispatch
    assert dispatch_table.choose("gemm", no_gpu)[0] == "sm90"
    assert dispatch_table.choose("gemm", no_gpu, traced=True)[0] == "torch"
    assert dispatch_table.TRACED_OURS_MS > dispatch_table.TRACED_KERNEL_MS


def test_a_cta_pair_gemm_plans_clusters_of_two_with_each_operand_split_over_the_pair():
    """The release build's sm100_pair module (triton >= 3.8) on CPU tensors: its plan launches one program per two
    SMs (a cluster of two CTAs, at most one per tile of 256 rows), its descriptors' boxes are the cluster's with A and
    C split by rows and B by its N columns (in either memory order), and it compiles and launches with num_ctas=2."""
    import importlib

    from gen.families.gemm import has_cta_pairs
    from gen.runtime.triton_range import installed, release_folder

    if not has_cta_pairs():
        pytest.skip("2-CTA MMAs ship with triton >= 3.8 (specs/by_triton/gemm.yaml)")
    mod = importlib.import_module(f"generated.gemm.{release_folder(installed())}.sm100_pair")
    M, N, K = 1000, 768, 512
    a = torch.randn(M, K, dtype=torch.bfloat16)
    out = torch.empty(M, N, dtype=torch.bfloat16)
    for b, kn in ((torch.randn(N, K, dtype=torch.bfloat16).t(), False), (torch.randn(K, N, dtype=torch.bfloat16), True)):
        p = mod.plan(a, b, None, out, "none", 148)
        assert p.grid == (-(-M // 256) * -(-N // mod.BLOCK_N),) and p.b_kn == kn
        (a_blk, a_lay), (b_blk, b_lay), (c_blk, c_lay) = p.layouts
        assert a_blk == [256, mod.BLOCK_K] and c_blk[0] == 256
        assert a_lay.cga_layout == [[1, 0]] and c_lay.cga_layout == [[1, 0]]
        assert b_lay.cga_layout == ([[0, 1]] if kn else [[1, 0]])   # B's N columns, split over the pair
        assert p.launcher.constants["num_ctas"] == 2
    big = torch.empty(16384, N, dtype=torch.bfloat16)
    assert mod.plan(torch.randn(16384, K, dtype=torch.bfloat16), b, None, big, "none", 148).grid == (74,)
    (job,) = mod.compile_jobs({"dtype": "bfloat16", "out_dtype": "bfloat16", "bias": False, "activation": "none"})
    assert job["options"] == {"num_warps": mod.NUM_WARPS, "num_ctas": 2}


def test_the_gpu_verification_covers_the_installed_releases_own_build():
    """tests/test_gpu.py verifies the variants the package runs with the installed Triton: on a release with a build
    of its own (3.7-3.9) that build's, so a Blackwell runner with triton 3.8+ checks the CLC sm100 GEMM and the 2-CTA
    sm100_pair against torch; on the GPU-tested release the package's own."""
    from gen.runtime.triton_range import installed, release

    from .conftest import installed_build_manifest

    for family in ("gemm", "attention"):
        manifest = installed_build_manifest(family)
        assert manifest["versions"]["triton"] == installed()
        names = {v.get("name", v["target"]) for v in manifest["variants"]}
        assert ("sm100_pair" in names) == (family == "gemm" and release(installed()) >= (3, 8)), names
