"""Autotuning's pure logic on CPU, with fake candidates, checks and timings: no GPU, no compiler."""
import io
import math
import subprocess
import sys
from pathlib import Path

import pytest

from gen.measure import tune as T
from gen.build.manifest import format_winners
from gen.build.spec import load_spec
from gen.store import LocalStore

ROOT = Path(__file__).resolve().parent.parent
A = T.Bucket("M=8192 N=8192 K=8192", (8192, 8192, 8192), {"dtype": "bfloat16"})
B = T.Bucket("M=4096 N=4096 K=4096", (4096, 4096, 4096), {"dtype": "bfloat16"})


@pytest.fixture(scope="module")
def gemm():
    return load_spec(ROOT / "specs/gemm.yaml")


@pytest.fixture(scope="module")
def attention():
    return load_spec(ROOT / "specs/attention.yaml")


# ---- buckets ----

def test_gemm_buckets_are_the_bench_shapes(gemm):
    bk = T.buckets(gemm)
    assert [b.shape for b in bk] == [tuple(s) for s in gemm.bench["shapes"]]
    assert bk[0].key == "M={} N={} K={}".format(*gemm.bench["shapes"][0])
    assert all(b.case == gemm.bench["cases"][0] for b in bk)


def test_attention_buckets_are_shape_by_head_dim(attention):
    bk = T.buckets(attention)
    assert len(bk) == len(attention.bench["shapes"]) * len(attention.bench["head_dims"])
    assert len({b.key for b in bk}) == len(bk)
    assert {b.case["head_dim"] for b in bk} == set(attention.bench["head_dims"])
    assert all(b.key.endswith(f"D={b.case['head_dim']}") for b in bk)


def test_small_shapes_are_the_odd_ones(gemm):
    small = T.small_shapes(gemm)
    assert [17, 33, 65] in small and all(max(s) <= T.SMALL_DIM for s in small)
    assert [4096, 4096, 4096] not in small


def test_verify_shape_is_the_bucket_unless_attention_reference_is_too_big(gemm, attention):
    assert all(T.verify_shape(gemm, b) == list(b.shape) for b in T.buckets(gemm))
    big = T.Bucket("x", (4, 16, 8, 8192, 8192), {"head_dim": 128})
    assert T.verify_shape(attention, big) == [1, 2, 1, 8192, 8192]
    small = T.Bucket("y", (4, 16, 16, 1024, 1024), {"head_dim": 128})
    assert T.verify_shape(attention, small) == [4, 16, 16, 1024, 1024]


# ---- the accuracy gate ----

def test_may_be_timed():
    assert T.may_be_timed([]) == (False, "not verified")
    assert T.may_be_timed([T.Check(True, 1e-3), T.Check(True, 2e-3)]) == (True, "")
    ok, why = T.may_be_timed([T.Check(True, 1e-3), T.Check(False, 0.5, "(M=17 ...)")])
    assert not ok and "0.5" in why


class Fakes:
    """Candidates by index: what their checks say and how fast they are (ms per bucket)."""

    def __init__(self, wrong_small=(), wrong_at=None, ms=None, verify_raises=(), time_raises=()):
        self.wrong_small, self.wrong_at = set(wrong_small), wrong_at or {}
        self.ms, self.verify_raises, self.time_raises = ms or {}, set(verify_raises), set(time_raises)
        self.timed, self.verified = [], []

    def verify(self, e, b):
        self.verified.append((e.index, b.key if b else None))
        if e.index in self.verify_raises:
            raise RuntimeError("illegal memory access")
        if b is None:
            return T.Check(e.index not in self.wrong_small, 0.9 if e.index in self.wrong_small else 1e-3)
        wrong = b.key in self.wrong_at.get(e.index, ())
        return T.Check(not wrong, 0.7 if wrong else 2e-3)

    def time_ms(self, e, b):
        self.timed.append((e.index, b.key))
        if e.index in self.time_raises:
            raise RuntimeError("launch failed")
        return self.ms[e.index][b.key]


def _entries():
    return [T.Entry(0, {"BLOCK_N": 256}),                                   # the default: correct
            T.Entry(1, {"BLOCK_N": 64}),                                    # wrong on small shapes, very fast
            T.Entry(2, {"BLOCK_N": 32}),                                    # right on small shapes, wrong at bucket B
            T.Entry(3, {"BLOCK_N": 512}, stage="plan", reason="needs ~300000 B shared memory"),
            T.Entry(4, {"BLOCK_N": 128, "STAGES": 5}, stage="compile", reason="compiler process died"),
            T.Entry(5, {"BLOCK_N": 128, "STAGES": 2}, stage="gates", reason="12 spill stores"),
            T.Entry(6, {"BLOCK_N": 128}),                                   # correct, fastest at A only
            T.Entry(7, {"BLOCK_N": 16})]                                    # verify crashes


def test_a_wrong_but_fast_candidate_never_wins_and_is_never_timed():
    fakes = Fakes(wrong_small={1}, wrong_at={2: {B.key}}, verify_raises={7},
                  ms={0: {A.key: 2.0, B.key: 1.0}, 1: {A.key: 0.01, B.key: 0.01}, 2: {A.key: 0.02, B.key: 0.02},
                      6: {A.key: 1.5, B.key: 1.2}, 7: {A.key: 0.001, B.key: 0.001}})
    out = io.StringIO()
    prog = T.Progress(8, "sm90", out)
    rows = T.evaluate(_entries(), [A, B], fakes.verify, fakes.time_ms, prog, flops=lambda b: 2.0 * math.prod(b.shape))

    timed = {i for i, _ in fakes.timed}
    assert timed == {0, 6}                       # only fully verified candidates are timed
    assert (2, B.key) in fakes.verified          # 2 was checked at the bucket's shape before any timing
    winners = T.pick_winners(rows)
    assert winners[A.key]["index"] == 6 and winners[A.key]["config"] == {"BLOCK_N": 128}
    assert winners[A.key]["speedup_vs_default"] == round(2.0 / 1.5, 3)
    assert winners[B.key]["index"] == 0 and winners[B.key]["speedup_vs_default"] == 1.0
    assert winners[A.key]["tflops"] == round(2.0 * 8192 ** 3 / 1.5 / 1e9, 1)

    by_index = {r["index"]: r for r in rows if r["bucket"] is None}
    assert by_index[1]["stage"] == "verify" and not by_index[1]["verified"] and "0.9" in by_index[1]["reason"]
    assert by_index[2]["stage"] == "verify"
    assert by_index[4]["stage"] == "compile" and "died" in by_index[4]["reason"]
    assert by_index[7]["stage"] == "verify" and "illegal memory access" in by_index[7]["reason"]

    # progress: 8 done; plan + gates pruned; compile + 3 wrong/crashing failed
    assert (prog.done, prog.pruned, prog.failed) == (8, 2, 4)
    text = out.getvalue()
    assert text.count("\r") >= 8 and "8/8 done, 2 pruned, 4 failed" in text
    assert "verifying" in text and "timing" in text
    prog.close()
    assert out.getvalue().endswith("\n")

    summary = T.summarize(rows, [A, B])
    assert summary["counts"] == {"candidates": 8, "timed": 2, "pruned": 2, "failed": 4}
    assert summary["winners"] == winners and [b["key"] for b in summary["buckets"]] == [A.key, B.key]


def test_a_launch_failure_while_timing_is_a_failure_not_a_winner():
    fakes = Fakes(time_raises={1}, ms={0: {A.key: 2.0}, 1: {A.key: 0.1}})
    prog = T.Progress(2, "triton", io.StringIO())
    rows = T.evaluate([T.Entry(0, {}), T.Entry(1, {"x": 1})], [A], fakes.verify, fakes.time_ms, prog)
    assert T.pick_winners(rows)[A.key]["index"] == 0
    assert [r["stage"] for r in rows if r["index"] == 1] == ["launch"]
    assert (prog.done, prog.failed) == (2, 1)


def test_load_failure_is_counted_and_skips_the_candidate():
    fakes = Fakes(ms={0: {A.key: 1.0}})

    def load(e):
        if e.index == 1:
            raise ImportError("bad module")
        return "module"

    prog = T.Progress(2, "sm90", io.StringIO())
    entries = [T.Entry(0, {}), T.Entry(1, {"x": 1})]
    rows = T.evaluate(entries, [A], fakes.verify, fakes.time_ms, prog, load=load)
    assert entries[0].handle == "module" and rows[-1]["stage"] == "load"
    assert {i for i, _ in fakes.verified} == {0} and prog.failed == 1


def test_pick_winners_needs_verified_rows_and_breaks_ties_by_index():
    rows = [{"index": 3, "config": {"c": 3}, "bucket": "b", "stage": "timed", "verified": False, "ms": 0.1},
            {"index": 2, "config": {"c": 2}, "bucket": "b", "stage": "timed", "verified": True, "ms": 1.0},
            {"index": 1, "config": {"c": 1}, "bucket": "b", "stage": "timed", "verified": True, "ms": 1.0},
            {"index": 4, "config": {"c": 4}, "bucket": "b", "stage": "timed", "verified": True, "ms": math.inf},
            {"index": 5, "config": {"c": 5}, "bucket": None, "stage": "verify", "verified": False}]
    assert T.pick_winners(rows) == {"b": {"index": 1, "config": {"c": 1}, "ms": 1.0}}
    assert T.pick_winners([]) == {}


def test_progress_line():
    prog = T.Progress(4, "sm90", io.StringIO(), width=8)
    assert prog.line() == "[tune] sm90 [........] 0/4 done, 0 pruned, 0 failed"
    prog.finish_candidate("pruned")
    prog.finish_candidate("failed", "x: compile")
    assert prog.line() == "[tune] sm90 [####....] 2/4 done, 1 pruned, 1 failed  x: compile"


# ---- store keys and the store round trip of tune() ----

def test_store_key_covers_target_device_and_space(gemm):
    k = T.store_key(gemm, "sm90", "NVIDIA H200 (sm_90)")
    assert k == T.store_key(gemm, "sm90", "NVIDIA H200 (sm_90)")
    assert k != T.store_key(gemm, "triton", "NVIDIA H200 (sm_90)")
    assert k != T.store_key(gemm, "sm90", "NVIDIA H100 80GB HBM3 (sm_90)")
    assert k != T.store_key(gemm, "sm90", "NVIDIA H200 (sm_90)", vers={"gen": "0", "triton": "3.6.0", "torch": "2.13.0"})


class FakeInfo:
    label, major, num_sms = "Fake H200 (sm_90)", 9, 132


def test_tune_stores_results_and_a_second_machine_skips_the_work(gemm, tmp_path, monkeypatch):
    import gen.runtime.device

    monkeypatch.setattr(gen.runtime.device, "device_info", lambda i=0: FakeInfo())
    calls = []

    def fake_tune_target(spec, target, info, jobs=None, stream=None):
        calls.append(target)
        rows = [{"index": 0, "config": spec.targets[target].config, "bucket": A.key, "stage": "timed",
                 "verified": True, "ms": 1.0, "max_rel_err": 1e-3}]
        return T.summarize(rows, [A])

    monkeypatch.setattr(T, "tune_target", fake_tune_target)
    err = io.StringIO()
    first = T.tune(gemm, store=LocalStore(tmp_path), stream=err)
    assert calls == ["sm90", "triton"]                       # sm100 cannot run on an sm_90 device
    assert "sm100: this device" in err.getvalue()
    assert set(first["targets"]) == {"sm90", "triton"} and first["device"] == FakeInfo.label
    assert not first["targets"]["sm90"]["cached"] and first["targets"]["sm90"]["winners"][A.key]["index"] == 0

    second = T.tune(gemm, store=LocalStore(tmp_path), stream=io.StringIO())  # e.g. another machine via Redis
    assert calls == ["sm90", "triton"]                       # nothing re-tuned
    assert second["targets"]["sm90"]["cached"] and second["targets"]["sm90"]["winners"] == first["targets"]["sm90"]["winners"]
    T.tune(gemm, targets=["triton"], store=LocalStore(tmp_path), force=True, stream=io.StringIO())
    assert calls == ["sm90", "triton", "triton"]
    assert "Fake H200" in format_winners(first)


def test_tune_does_not_cache_a_run_without_winners(gemm, tmp_path, monkeypatch):
    import gen.runtime.device

    monkeypatch.setattr(gen.runtime.device, "device_info", lambda i=0: FakeInfo())
    calls = []

    def nothing_passed(spec, target, info, jobs=None, stream=None):
        calls.append(target)
        return T.summarize([{"index": 0, "config": {}, "bucket": None, "stage": "verify", "verified": False}], [A])

    monkeypatch.setattr(T, "tune_target", nothing_passed)
    for _ in range(2):
        out = T.tune(gemm, targets=["sm90"], store=LocalStore(tmp_path), stream=io.StringIO())
    assert calls == ["sm90", "sm90"] and out["targets"]["sm90"]["winners"] == {}
    assert "no candidate passed" in format_winners(out)


# ---- CLI without a GPU ----

def test_cli_without_gpu_exits_2_with_a_clear_message(monkeypatch, capsys):
    import gen.runtime.device

    monkeypatch.setattr(gen.runtime.device, "cuda_available", lambda: False)
    assert T.main([str(ROOT / "specs/gemm.yaml")]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err


def test_cli_bad_spec_exits_2(tmp_path, capsys):
    assert T.main([str(tmp_path / "missing.yaml")]) == 2
    assert "error:" in capsys.readouterr().err


def test_cli_subprocess_on_this_cpu_machine():
    from gen.runtime.device import cuda_available

    if cuda_available():
        pytest.skip("this machine has a GPU")
    res = subprocess.run([sys.executable, "-m", "gen.measure.tune", "specs/gemm.yaml"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 2 and "no CUDA GPU" in res.stderr


def test_record_tuning_writes_the_manifest_of_the_same_spec_only(gemm, tmp_path):
    import json

    from gen.build.manifest import record_tuning

    out = tmp_path / "gemm"
    out.mkdir()
    manifest = {"family": "gemm", "op": "gemm", "spec": {"path": "specs/gemm.yaml", "sha256": gemm.sha256},
                "versions": {"gen": "0", "triton": "3.6.0", "torch": "x"}, "variants": [],
                "rejected": []}
    (out / "manifest.json").write_text(json.dumps(manifest))
    tuning = {"device": "X", "command": "c", "versions": {}, "targets": {}}
    record_tuning(out, gemm, tuning)
    assert json.loads((out / "manifest.json").read_text())["tuning"] == tuning
    assert "tuning" in (out / "REPORT.md").read_text().lower()
    manifest["spec"]["sha256"] = "0" * 64   # built from another version of the spec
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="another version"):
        record_tuning(out, gemm, tuning)
