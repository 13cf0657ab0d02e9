"""The workload suite (bench/suite): its case lists, the math its runner checks providers against, and a CPU smoke
run of the runner."""
import json
import os
import subprocess
import sys
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from bench.suite import cases, models, run
from gen.families import mod_ir

from .conftest import ROOT, child_env

# The case lists' digest per SUITE_VERSION: changing a case without bumping the version fails here. To bump: raise
# cases.SUITE_VERSION and add its digest (python -c "from bench.suite.cases import digest; print(digest())").
DIGESTS = {1: "4ea77010552046f1c75a3ec9e005d3cf6d86f8b2f8d372a3ac99e75d57f3f94f",
           2: "ce4a0c3033c2a6fdd2827915c71665b555001f30e2a9775e18aa08519ced7e49",
           3: "f9de9592426c6f6dce9dc853927fa446498cfb89ce81ab6a96c2dc7a521c0191",
           4: "8ea996904b5f194302228a9e23352563bb75281f4973b85b7859f3ee7cbc43c9",
           5: "3d89d0e56918ee26494dabd245111bd6638242b31306d65f949c17f864d2b9ff",
           6: "290f79dc80535ff971a26ccd3b1051ba54213e72a77f8c12ded1157c39d162b1"}

GEMM, ATTENTION, BLOCK = cases.gemm_cases(), cases.attention_cases(), cases.block_cases()


def test_case_lists_are_versioned():
    assert cases.digest() == DIGESTS[cases.SUITE_VERSION], \
        "the cases changed: bump SUITE_VERSION in bench/suite/cases.py and pin the new digest above"


def test_ids_are_unique_stable_and_name_their_shape():
    ids = [c["id"] for c in GEMM + ATTENTION + BLOCK]
    assert len(ids) == len(set(ids))
    assert [c["id"] for c in cases.gemm_cases()] == [c["id"] for c in GEMM]  # deterministic
    for c in GEMM:
        assert c["id"].startswith(c["model"] + f"/M{c['M']}")
    for c in ATTENTION:
        assert c["id"].startswith(c["model"] + "/" + c["mod"] + f"/B{c['B']}-")
        assert f"L{c['Lq']}" in c["id"] if c["phase"] == "prefill" else f"Lq{c['Lq']}-Lk{c['Lk']}" in c["id"]


def test_counts():
    # the issue's "about 100-200 per family", plus the fused epilogues' cases (v2: 18 gated, v3: 30 residual, v4: 30
    # RMSNorm rows, v5: 18 RoPE, v6: 15 with both)
    assert 120 <= len(GEMM) <= 300
    assert sum(bool(c.get("rms")) for c in GEMM) == 45 and all(c["rms_eps"] > 0 for c in GEMM if c.get("rms"))
    rope = [c for c in GEMM if c.get("rope")]
    assert len(rope) == 33 and {c["rope_dim"] for c in rope} == {64, 128}
    assert sum(bool(c.get("rms")) for c in rope) == 15
    assert all(c["rope_columns"] % c["rope_dim"] == 0 and c["rope_columns"] < c["N"] for c in rope)
    assert 120 <= len(ATTENTION) <= 180
    assert 6 <= sum(c["autotune"] for c in GEMM) <= 10
    assert 8 <= sum(c["compile"] for c in ATTENTION) <= 12
    assert 1 <= sum(c["autotune"] for c in BLOCK) <= 2


def test_gemm_shapes_come_from_the_models():
    for c in GEMM:
        name, layer = c["model"].split("/")
        # gated: the MLP's gate and up projections in one weight, the output the gate projection's N
        n, k = models.MODELS[name].linears()["gate" if layer == "gated" else layer]
        assert (n, k) == (c["N"], c["K"]) and (layer == "gated") == (c["activation"] in ("swiglu", "geglu")), c["id"]


def test_gemm_cover_regimes_epilogues_and_layouts():
    ms = {c["M"] for c in GEMM}
    assert {1, 4, 16, 64, 512, 2048, 8192, 16384} <= ms and min(ms) >= 1 and max(ms) <= 16384
    assert {c["dtype"] for c in GEMM} == {"bfloat16"} and {c["out_dtype"] for c in GEMM} == {"bfloat16", "float32"}
    epilogues = {(c["bias"], c["activation"]) for c in GEMM}
    assert {(False, "none"), (True, "none"), (True, "gelu_tanh"), (False, "silu"), (True, "relu"),
            (False, "swiglu"), (False, "geglu")} <= epilogues
    layouts = Counter(c["weight"] for c in GEMM)
    assert set(layouts) == {"nk", "kn"} and layouts["nk"] > 5 * layouts["kn"]
    heads = {c["N"] for c in GEMM if c["model"].endswith("/lm_head")}
    assert min(heads) == 32000 and max(heads) == 152064
    tuned = [c for c in GEMM if c["autotune"]]
    assert min(c["M"] for c in tuned) <= 64 and max(c["M"] for c in tuned) >= 4096


def test_attention_shapes():
    for c in ATTENTION:
        assert c["D"] in models.ATTENTION_HEAD_DIMS, c["id"]
        assert c["Hq"] % c["Hkv"] == 0 and c["mod"] in cases.MODS
        assert cases.attention_dense_flops(c) <= cases.MAX_DENSE_FLOP, c["id"]
        if c["phase"] == "prefill":
            assert c["Lq"] == c["Lk"] and 128 <= c["Lq"] <= 32768 and 16 <= c["B"] * c["Hq"] <= 512, c["id"]
        else:
            assert 1 <= c["Lq"] <= 16 and c["Lq"] <= c["Lk"] and 1000 <= c["Lk"] <= 131072, c["id"]
    prefill = [c for c in ATTENTION if c["phase"] == "prefill"]
    assert {197, 500, 1000, 1025, 3000} <= {c["Lq"] for c in prefill}
    assert {c["Hq"] // c["Hkv"] for c in ATTENTION} >= {1, 4, 5, 8}
    assert {c["mod"] for c in prefill} == set(cases.MODS)
    assert {c["D"] for c in prefill} == {64, 128}
    decode = [c for c in ATTENTION if c["phase"] == "decode"]
    assert {1, 4, 16} <= {c["Lq"] for c in decode} and max(c["Lk"] for c in decode) == 131072
    assert all(c["Hq"] > c["Hkv"] for c in decode)
    assert any(c["Lk"] % 128 for c in decode)  # unaligned cache lengths
    for c in ATTENTION:
        if c["compile"]:
            assert cases.score_bytes(c) < cases.MATH_SCORE_BYTES, c["id"]


def test_gemma_attention_is_skipped_with_a_reason_and_its_gemms_kept():
    assert "head_dim 256" in cases.skipped_attention()["gemma2-9b"]
    assert not any(c["model"].startswith("gemma2-9b") for c in ATTENTION)
    assert any(c["model"].startswith("gemma2-9b") for c in GEMM)


def test_block_cases():
    assert {c["model"] for c in BLOCK} == {"llama3-8b/block", "qwen2.5-7b/block", "mistral-7b/block"}
    llama = [c for c in BLOCK if c["model"] == "llama3-8b/block"]
    prefill = [c for c in llama if c["mode"] == "prefill"]
    assert all(512 <= c["B"] * c["L"] <= 16384 for c in prefill) and len(prefill) >= 4
    decode = {(c["B"], c["Lk"]) for c in llama if c["mode"] == "decode"}
    assert decode == {(b, lk) for b in (1, 8, 64) for lk in (1024, 8192, 32768)}
    assert all(c["mode"] == "prefill" for c in BLOCK if c["autotune"])
    # Mistral's 4096-token sliding window must not bite, or causal attention would not be its computation
    assert all(c.get("L", c.get("Lk")) <= 4096 for c in BLOCK if c["model"] == "mistral-7b/block")


def _pairs_brute(mod, lq, lk):
    """The (query, key) pairs the build's mod keeps: its IR's mask with the spec's window, on every pair."""
    keep = mod_ir.of(run.ATTENTION_MODS[mod]).visible({
        "q_idx": torch.arange(lq).view(lq, 1), "kv_idx": torch.arange(lk).view(1, lk), "Lq": lq, "Lk": lk,
        **run.mod_params(mod)})
    return lq * lk if keep is None else int(keep.sum())


@pytest.mark.parametrize("lq,lk", [(7, 7), (1, 1500), (3, 1100), (1100, 1100), (5, 2050)])
@pytest.mark.parametrize("mod", cases.MODS)
def test_visible_pairs_match_a_brute_force_count(mod, lq, lk):
    assert cases.visible_pairs(mod, lq, lk) == _pairs_brute(mod, lq, lk)


def _qkv(b, hq, hkv, lq, lk, d=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, hq, lq, d, generator=g), torch.randn(b, hkv, lk, d, generator=g),
            torch.randn(b, hkv, lk, d, generator=g))


@pytest.mark.parametrize("lq,lk", [(6, 6), (3, 9), (1, 9)])
def test_reference_is_sdpa_with_bottom_right_causal(lq, lk):
    from torch.nn.attention.bias import causal_lower_right

    q, k, v = _qkv(2, 4, 2, lq, lk)
    ref = run.attention_reference(q, k, v, "causal", run.alibi_slopes(4, "cpu"))
    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(lq, lk), enable_gqa=True)
    torch.testing.assert_close(ref, sdpa, atol=1e-5, rtol=1e-5)
    none = run.attention_reference(q, k, v, "none", None)
    torch.testing.assert_close(none, F.scaled_dot_product_attention(q, k, v, enable_gqa=True), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mod", cases.MODS)
def test_reference_chunking_and_head_slice_change_nothing(mod, monkeypatch):
    q, k, v = _qkv(2, 8, 2, 40, 1100)
    slopes = run.alibi_slopes(8, "cpu")
    whole = run.attention_math(q, k, v, mod, slopes=slopes)
    monkeypatch.setattr(run, "REF_CHUNK_BYTES", 4 * 2 * 8 * 1100 * 7)  # 7 query rows per chunk
    torch.testing.assert_close(run.attention_reference(q, k, v, mod, slopes), whole)
    group = 4  # the first KV group's heads, as the runner checks big cases
    torch.testing.assert_close(run.attention_reference(q[:1, :group], k[:1, :1], v[:1, :1], mod, slopes[:group]),
                               whole[:1, :group])


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("mod", cases.MODS)
@pytest.mark.parametrize("lq,lk", [(64, 64), (3, 1200)])
def test_flex_mods_express_the_reference(mod, lq, lk):
    """FlexAttention (eager) with the runner's score/mask mods computes what the reference does."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    q, k, v = _qkv(1, 4, 2, lq, lk)
    slopes = run.alibi_slopes(4, "cpu")
    score_mod, mask_mod = run.flex_mods(mod, lq, lk, slopes, "cpu")
    block_mask = create_block_mask(mask_mod, None, None, lq, lk, device="cpu") if mask_mod else None
    out = flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=True)
    torch.testing.assert_close(out, run.attention_reference(q, k, v, mod, slopes), atol=2e-5, rtol=2e-5)


def test_command_line_has_no_machine_paths():
    argv = [str(ROOT / "bench/suite/run.py"), "--family", "gemm", "--shard", "1/4", "--out", "/root/out/x.json",
            f"--resume={ROOT}/bench/results/suite-gemm-h200.json"]
    assert run.command_line(argv) == ("python bench/suite/run.py --family gemm --shard 1/4 --out x.json "
                                      "--resume=bench/results/suite-gemm-h200.json")


def _run_suite(*args, timeout=600):
    env = child_env()
    env.pop("TRITON_INTERPRET", None)
    return subprocess.run([sys.executable, "bench/suite/run.py", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=timeout)


def test_time_budget_stops_cleanly(tmp_path):
    out = tmp_path / "g.json"
    proc = _run_suite("--family", "gemm", "--smoke", "--time-budget", "0.001", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "stopped: time budget" in proc.stdout
    assert json.loads(out.read_text())["rows"] == []


@pytest.mark.slow  # CPU Inductor compiles (~30 s cold)
def test_smoke_run_writes_the_documented_json_and_resumes(tmp_path):
    out = tmp_path / "g.json"
    proc = _run_suite("--family", "gemm", "--smoke", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text()
    assert str(ROOT) not in text and str(tmp_path) not in text  # no machine paths
    doc = json.loads(text)
    assert {"suite_version", "family", "device", "versions", "command", "timing", "rows"} <= set(doc)
    assert doc["suite_version"] == cases.SUITE_VERSION and doc["family"] == "gemm" and doc["device"] == "cpu"
    assert set(doc["versions"]) == {"torch", "triton", "python"}
    smoke = cases.smoke_cases("gemm")
    assert [r["id"] for r in doc["rows"]] == [c["id"] for c in smoke]
    for row, case in zip(doc["rows"], smoke):
        assert {"id", "model", "case", "flops", "bytes", "providers", "dispatched", "best_torch"} <= set(row)
        assert row["case"] == run.case_fields(case) and row["flops"] == cases.gemm_flops(case)
        want = {"torch", "torch-compile"} | ({"torch-max-autotune"} if case["autotune"] else set())
        assert want <= set(row["providers"]), row["providers"]
        for name in want:
            p = row["providers"][name]
            assert p["call_ms"] > 0 and p["gpu_method"] == "none" and "gpu_ms" not in p, (name, p)
            assert 0 <= p["rel_err"] < run.TOLERANCE and "wrong" not in p, (name, p)
        best = row["best_torch"]
        assert best in want and all(row["providers"][best]["call_ms"] <= row["providers"][n]["call_ms"] for n in want)
        assert "skipped" in row["dispatched"]  # ours need TRITON_INTERPRET=1 on a CPU
    again = _run_suite("--family", "gemm", "--smoke", "--resume", str(out))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "0 case(s) to run (3 already in" in again.stdout
    assert json.loads(out.read_text())["rows"] == doc["rows"]


def test_fresh_copies_keep_their_own_automatic_dynamic_state():
    """Each compiled variant of the decoder block is a `fresh` copy: a size change seen by one copy (another model,
    another implementation) must not make the next copy's first compile dynamic."""
    def step(x):
        return x * 2

    def frame_count_and_dynamic(fn, sizes):
        graphs = []

        def backend(gm, example_inputs):
            graphs.append(any(isinstance(n.meta.get("example_value"), torch.SymInt)
                              for n in gm.graph.nodes if n.op == "placeholder"))
            return gm.forward
        compiled = torch.compile(fn, backend=backend, fullgraph=True)
        for n in sizes:
            compiled(torch.zeros(n))
        return graphs

    torch._dynamo.reset()
    assert frame_count_and_dynamic(run.fresh(step), (3, 4)) == [False, True]   # a change: the recompile is dynamic
    assert frame_count_and_dynamic(run.fresh(step), (5,)) == [False]           # another copy starts static


def test_compiled_decode_blocks_see_a_static_cache():
    """One compiled decode layer serves a model's cases; without the mark, Dynamo makes the cache length symbolic at
    the second length, and the generated attention then traces the growing-cache provider where torch's graph holds
    SDPA's own choice. With block.static_cache every case compiles its own static graph, as eager mode sees it."""
    from bench.suite import block

    model = block.SMOKE_MODEL
    weights = {k: None if v is None else v.to("meta")
               for k, v in block.block_weights(model, "cpu", torch.Generator().manual_seed(0)).items()}

    def symbolic_graphs(mark: bool) -> list:
        found = []

        def backend(gm, example_inputs):
            found.append(any(isinstance(n.meta.get("example_value"), torch.SymInt) for n in gm.graph.nodes
                             if n.op == "placeholder"))
            return gm.forward
        step = torch.compile(run.fresh(block.make_block(model, "torch", "decode")), backend=backend, fullgraph=True)
        for lk in (64, 128, 256):
            args = block.decode_inputs(model, weights, 2, lk, "cpu", torch.Generator().manual_seed(lk))
            args = (weights,) + tuple(t.to("meta") for t in args[1:])
            step(*(block.static_cache(args) if mark else args))
        return found

    torch._dynamo.reset()
    assert symbolic_graphs(mark=False) == [False, True]          # the second length made Lk symbolic, reused after
    assert symbolic_graphs(mark=True) == [False, False, False]   # one static graph per cache length


def test_match_selects_cases_by_id():
    argv = ["--family", "block", "--match", "/decode/"]
    chosen = run.select(BLOCK, run.parser().parse_args(argv))
    assert chosen and all("/decode/" in c["id"] for c in chosen)
    assert len(chosen) == sum(c["mode"] == "decode" for c in BLOCK)


def test_the_runner_knows_split_kv_variants_by_their_config():
    """Prefill cases leave out every split-KV variant (the named one and the tuned ones, e.g. triton_splitkvns4 from
    specs/tuned/attention.yaml), found by their module's SPLIT_KV, not by name."""
    import generated.attention as att

    split = {n for n in att.SHIPPED if run._split_kv(n)}
    assert split == {n for n in att.SHIPPED if n.startswith("triton_splitkv")} and "triton_splitkvns4" in split
