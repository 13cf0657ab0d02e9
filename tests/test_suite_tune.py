"""Per-bucket tuning from a workload-suite config sweep (gen/measure/suite_tune.py) and the tuned variants file that
load_spec merges (gen/build/spec.py): CPU only, synthetic sweeps and the committed H100 one."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gen.build.spec import SpecError, load_spec, tuned_path
from gen.measure import suite_tune

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ROOT / "bench" / "results" / "config-sweep-splitkv-h100.json"
BASE = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "SPLIT_KV": True, "BWD_STAGES": 2}


def _case(b, lk, d=128):
    return {"phase": "decode", "B": b, "Hq": 32, "Hkv": 8, "Lq": 1, "Lk": lk, "D": d, "dtype": "bfloat16",
            "mod": "causal"}


def _row(case_id, case, times, torch_ms=None, errs=None):
    cells = [{"gpu_ms": t, "rel_err": (errs or {}).get(i, 2e-3)} if t else {"error": "OutOfResources"}
             for i, t in enumerate(times)]
    return {"id": case_id, "case": case, "torch": {"gpu_ms": torch_ms, "rel_err": 2e-3} if torch_ms else
            {"skipped": "SDPA has no such mod"}, "configs": cells}


def _sweep(rows, configs=None):
    configs = configs or [{"config": BASE}, {"config": {**BASE, "BLOCK_N": 128}}, {"config": {**BASE, "num_stages": 4}}]
    return {"device": "GPU X", "target": "triton", "variant": "splitkv", "command": "sweep", "configs": configs,
            "rows": rows}


@pytest.fixture()
def spec_copy(tmp_path):
    """specs/attention.yaml alone in a folder of its own (no by_triton, no tuned file)."""
    shutil.copy(ROOT / "specs" / "attention.yaml", tmp_path / "attention.yaml")
    return tmp_path / "attention.yaml"


def test_a_bucket_goes_to_a_config_only_past_the_margin():
    sweep = _sweep([_row("big", _case(64, 8192), [0.74, 0.67, 0.68], torch_ms=0.60),
                    _row("small", _case(1, 1024), [0.0090, 0.0089, 0.0110], torch_ms=0.0080)])
    by_case = {e["cases"][0]: e for e in suite_tune.winners("attention", sweep)}
    assert by_case["big"]["winner"] == 1 and by_case["big"]["speedup"] == pytest.approx(0.74 / 0.67, abs=2e-3)
    assert by_case["small"]["winner"] == 0            # 1% faster: within the margin, the shipped config stays
    assert not suite_tune.would_dispatch(by_case["big"])   # still behind torch's GPU time: the dispatch keeps torch


def test_a_winner_faster_than_torch_only_on_the_gpu_is_dispatched_to_captured_calls():
    """A config that beats torch's GPU time but not by our launch path's host time (HOST_EXTRA_MS) is no eager
    pick; a call captured into a CUDA graph pays no host time, so the table's captured pick takes it."""
    extra = suite_tune.HOST_EXTRA_MS
    torch_ms = 0.020
    fast = torch_ms / 1.05                  # 5% faster on the GPU
    sweep = _sweep([_row("d", _case(8, 4096), [0.030, fast, 0.030], torch_ms=torch_ms)])
    (entry,) = suite_tune.winners("attention", sweep)
    assert entry["winner"] == 1 and entry["vs_torch"][1] == pytest.approx((fast + extra) / torch_ms, abs=1e-4)
    assert entry["vs_torch"][1] > 1.0 and suite_tune.would_dispatch(entry)
    slow = _sweep([_row("d", _case(8, 4096), [0.030, torch_ms / 1.01, 0.030], torch_ms=torch_ms)])
    assert not suite_tune.would_dispatch(suite_tune.winners("attention", slow)[0])   # within the margin: torch


def test_a_wrong_or_failed_config_is_no_candidate_in_its_bucket():
    sweep = _sweep([_row("a", _case(64, 8192), [0.74, 0.50, None], torch_ms=1.0, errs={1: 0.5}),
                    _row("b", _case(64, 8192 + 1024), [0.74, 0.60, 0.70], torch_ms=1.0)])
    (entry,) = suite_tune.winners("attention", sweep)   # both cases fall in one bucket
    assert set(entry["scores"]) == {0}   # config 1 is wrong on "a" (rel_err 0.5), config 2 failed on "a"
    assert entry["winner"] == 0


def test_winners_beating_torch_are_proposed_as_variants_of_the_spec_config(spec_copy):
    spec = load_spec(spec_copy)
    sweep = _sweep([_row("lq16", {**_case(8, 8192), "Lq": 16}, [0.106, 0.097, 0.105], torch_ms=0.80)])
    entries = suite_tune.winners("attention", sweep)
    props, notes = suite_tune.proposals(spec, sweep, entries, "sweep.json")
    (p,) = props
    assert p["overrides"] == {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "SPLIT_KV": True}   # over `config:`
    assert p["name"] == "splitkvbn128"   # the swept named config and what changed
    assert "lq16" in p["why"] and "sweep.json" in p["why"] and not notes


def test_variant_names():
    assert suite_tune.tuned_name({"BLOCK_N": 128, "num_stages": 4}, "splitkv") == "splitkvbn128ns4"
    assert suite_tune.tuned_name({"SPLIT_KV": True}) == "sk1"
    long = suite_tune.tuned_name({"BLOCK_N": 128, "num_stages": 4, "num_warps": 8}, "splitkv")   # 17 characters
    assert long.startswith("t") and len(long) == 8
    assert suite_tune.tuned_name({"RESCALE_THRESHOLD": 8.0}).startswith("t")   # not an integer value


def test_module_constants_and_shipped_configs_are_not_proposed(spec_copy):
    spec = load_spec(spec_copy)
    configs = [{"config": BASE}, {"config": BASE, "set": {"RESIDENT": 2}},
               {"config": {**BASE, "SPLIT_KV": False, "BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8}}]
    sweep = _sweep([_row("x", _case(1, 131072, 64), [0.10, 0.08, 0.11]),
                    _row("y", _case(8, 4096), [0.10, 0.11, 0.08])], configs)
    configs_now, shipped = suite_tune.rebase(spec, sweep)
    assert shipped == {0, 2} and configs_now[1] is None   # config 2 is the spec's default config
    by_case = {e["cases"][0]: e for e in suite_tune.winners("attention", sweep, shipped)}
    assert by_case["x"]["winner"] == 1 and by_case["y"]["winner"] == 2 and by_case["y"]["speedup"] == 1.0
    props, notes = suite_tune.proposals(spec, sweep, list(by_case.values()), "s.json")
    assert props == [] and len(notes) == 1 and "module constants {'RESIDENT': 2}" in notes[0]


def test_an_older_sweep_is_rebased_on_the_spec_as_it_is_now(spec_copy):
    """A sweep taken before the spec's config gained a key: what each config changed over its config 0 is applied
    to the config as the spec has it now, so a config that is shipped now counts as shipped."""
    spec = load_spec(spec_copy)
    old = {k: v for k, v in BASE.items() if k != "BWD_STAGES"}   # the named config before BWD_STAGES existed
    sweep = _sweep([_row("z", {**_case(8, 8192), "Lq": 16}, [0.106, 0.097], torch_ms=0.80)],
                   [{"config": old}, {"config": {**old, "num_warps": 8}}])
    configs_now, shipped = suite_tune.rebase(spec, sweep)
    assert configs_now[1] == {**spec.targets["triton"].variants["splitkv"], "num_warps": 8} and shipped == {0}
    props, _ = suite_tune.proposals(spec, sweep, suite_tune.winners("attention", sweep, shipped), "old.json")
    # over the spec's own config (num_warps 8 there, BWD_STAGES kept from it): what a `variants:` entry holds
    assert props[0]["name"] == "splitkvnw8" and props[0]["overrides"] == {"BLOCK_M": 64, "SPLIT_KV": True}


def test_written_variants_are_merged_by_load_spec(spec_copy):
    spec = load_spec(spec_copy)
    sweep = _sweep([_row("lq16", {**_case(8, 8192), "Lq": 16}, [0.106, 0.097, 0.105], torch_ms=0.80)])
    props, _ = suite_tune.proposals(spec, sweep, suite_tune.winners("attention", sweep), "sweep.json")
    path = suite_tune.write_tuned(spec, props)
    assert path == tuned_path(spec_copy)
    text = path.read_text()
    assert suite_tune.write_tuned(spec, props).read_text() == text   # the same inputs, the same file
    tuned = load_spec(spec_copy)
    name = props[0]["name"]
    assert tuned.targets["triton"].variants[name] == {**spec.targets["triton"].config, **props[0]["overrides"]}
    assert tuned.sha256 != spec.sha256   # the build sees a new spec identity (manifest measurements are not reused)
    # a second pass finds the config shipped: the bucket's winner is a shipped config, nothing to propose
    configs_now, shipped = suite_tune.rebase(tuned, sweep)
    assert shipped == {0, 1}
    again, _ = suite_tune.proposals(tuned, sweep, suite_tune.winners("attention", sweep, shipped), "sweep.json")
    assert again == []


@pytest.mark.parametrize("doc, message", [
    ({"triton": {"tdup": {"config": {"SPLIT_KV": True, "BLOCK_M": 64, "num_warps": 4}, "why": "-"}}},
     "repeats a variant of the spec"),
    ({"sm80": {"tx": {"config": {"BLOCK_N": 32}, "why": "-"}}}, "names a target the spec does not list"),
    ({"triton": {"tx": {"config": {"BLOCK_Q": 32}, "why": "-"}}}, "triton.tx.config.BLOCK_Q"),
    ({"triton": {"tx": {"why": "-"}}}, "triton.tx.config"),
])
def test_a_bad_tuned_file_is_a_spec_error_naming_it(spec_copy, doc, message):
    path = tuned_path(spec_copy)
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(SpecError) as e:
        load_spec(spec_copy)
    assert message in str(e.value) and "tuned/attention.yaml" in str(e.value)


def test_cli_from_the_committed_h100_sweep_without_a_gpu(spec_copy):
    """The committed split-KV sweep: the B64 buckets' winner (BLOCK_N 128, 9-10% over the shipped config) stays behind
    SDPA's GPU time, so it is not proposed; the speculative-decoding buckets' winners beat SDPA and are."""
    out = subprocess.run([sys.executable, "-m", "gen", "tune", str(spec_copy), "--from-sweep", str(SWEEP)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    proposed = [line for line in out.stdout.splitlines() if line.startswith("  triton_")]
    assert len(proposed) == 2 and not tuned_path(spec_copy).exists()
    assert [line.split(":")[0].strip() for line in proposed] == ["triton_splitkvbn128", "triton_splitkvns4"]


def test_write_keeps_only_what_the_build_gates_pass(spec_copy, monkeypatch, capsys):
    """--write gates each proposal as the build would (here a stand-in for the cross-compile: the real one rejected
    BLOCK_N 128 for 3 spill stores in the decay case) and writes only what passes."""
    from gen.build import pipeline
    from gen.measure.tune import main

    def fake_gate(spec, items, rejected, jobs=None, progress=None):
        out = []
        for t, name, cfg in items:
            if cfg["BLOCK_N"] == 128:
                rejected.append(pipeline.Rejected(t, cfg, "gates", f"variant {name}: 3 spill stores (STL)"))
            else:
                out.append(pipeline.Variant(t, cfg, None, [], "", f"{t}_{name}"))
        return out

    monkeypatch.setattr(pipeline, "gate_configs", fake_gate)
    assert main([str(spec_copy), "--from-sweep", str(SWEEP), "--write"]) == 0
    assert "rejected by the build's gates: variant splitkvbn128" in capsys.readouterr().out
    assert set(load_spec(spec_copy).targets["triton"].variants) == {"splitkv", "splitkvns4"}


def test_cli_rejects_a_file_that_is_not_a_sweep_of_the_spec(spec_copy, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"target": "sm80", "rows": [1], "configs": [1]}))
    out = subprocess.run([sys.executable, "-m", "gen", "tune", str(spec_copy), "--from-sweep", str(bad)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "not a config sweep of this spec" in out.stderr
