"""The CLI end to end on a CPU machine: build into a scratch directory, inspect it, and bad input."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT, child_env, on_tested_triton


def run(*args, timeout=900):
    env = child_env()
    return subprocess.run([sys.executable, "-m", "gen", *args], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=timeout)


def test_child_processes_import_the_triton_under_test():
    """A child Python started by a test (the CLI, the interpreter scripts) imports the same triton as the test run:
    under .ci/triton-release's interpreter that is the release first on PYTHONPATH, not the venv's 3.6."""
    import triton

    proc = subprocess.run([sys.executable, "-c", "import triton; print(triton.__version__, triton.__file__)"],
                          capture_output=True, text=True, cwd=ROOT, env=child_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == [triton.__version__, triton.__file__]


# The package build of the GPU-tested release (generated/<family>/ itself); another release builds its own folder,
# which .ci/run's "its own build is current" step and tests/test_triton_versions.py check.
@pytest.mark.skipif(not on_tested_triton(), reason="the GPU-tested triton's package build")
def test_build_writes_the_contract_and_prints_the_table(tmp_path):
    proc = run("specs/gemm.yaml", "--no-search", "--no-gpu", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    for col in ("smem B", "TMEM", "regs", "spills", "cvt", "partitions", "key SASS", "gates"):
        assert col in proc.stdout
    out = tmp_path / "gemm"
    for name in ("__init__.py", "sm100.py", "sm90.py", "triton.py", "manifest.json", "REPORT.md",
                 "ir/sm100.ttgir", "ir/sm90.ttgir", "ir/triton.ttgir"):
        assert (out / name).exists(), name
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["spec"]["path"] == "specs/gemm.yaml" and len(manifest["spec"]["sha256"]) == 64
    assert set(manifest["versions"]) >= {"gen", "triton", "torch"}
    for v in manifest["variants"]:
        c = v["compile"]
        assert {"ok", "smem_bytes", "tmem_cols", "regs", "spills", "local_bytes", "convert_layouts",
                "partitions", "instructions"} <= set(c)
        assert "seconds" not in c   # wall clock differs per machine and cache: a rebuild must leave git clean
        assert "verify" not in v and "bench" not in v  # never measured here: absent, not 0
    sm100 = next(v for v in manifest["variants"] if v["target"] == "sm100")
    assert sm100["runs"] == "compiled, not run"
    assert "ttng.tc_gen5_mma" in (out / "ir" / "sm100.ttgir").read_text()
    header = (out / "sm90.py").read_text().splitlines()[:8]
    assert any("spec: specs/gemm.yaml" in line for line in header)
    # why each kernel exists, at its end: what the committed suite measured for that target, or that nothing did
    from gen.analysis import dispatch_table

    for target in ("sm90", "sm100"):
        measured = dispatch_table.suite_lines("gemm", target)
        tail = (out / f"{target}.py").read_text().rstrip("\n").splitlines()[-max(1, len(measured)):]
        if measured:
            assert [line.removeprefix("# ") for line in tail] == measured, target
        else:
            assert "not measured yet" in tail[-1], target

    again = run("specs/gemm.yaml", "--no-search", "--no-gpu", "--out", str(tmp_path))
    assert "[cached]" in again.stdout and "[ok]" not in again.stdout

    shown = run("inspect", str(out))
    assert shown.returncode == 0 and "TMEM" in shown.stdout and "[ok] sass:UTCHMMA" in shown.stdout


# The package build of the GPU-tested release (generated/<family>/ itself); another release builds its own folder,
# which .ci/run's "its own build is current" step and tests/test_triton_versions.py check.
@pytest.mark.skipif(not on_tested_triton(), reason="the GPU-tested triton's package build")
def test_results_recorded_on_a_gpu_survive_a_cpu_rerun(tmp_path):
    assert run("specs/gemm.yaml", "--no-search", "--no-gpu", "--out", str(tmp_path)).returncode == 0
    path = tmp_path / "gemm" / "manifest.json"
    m = json.loads(path.read_text())
    sm90 = next(v for v in m["variants"] if v["target"] == "sm90")
    sm90["verify"] = {"device": "NVIDIA H200 (sm_90)", "cases": 3, "max_rel_err": 1e-3, "ok": True}
    path.write_text(json.dumps(m))
    assert run("specs/gemm.yaml", "--no-search", "--no-gpu", "--out", str(tmp_path)).returncode == 0
    sm90 = next(v for v in json.loads(path.read_text())["variants"] if v["target"] == "sm90")
    assert sm90["verify"]["device"] == "NVIDIA H200 (sm_90)" and "carried_over" in sm90


def test_bad_spec_is_a_clear_error_not_a_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("family: gemm\nop: gemm\ntargets: {sm90: {config: {BLOCK_M: 128}}}\n")
    proc = run(str(bad), "--out", str(tmp_path))
    assert proc.returncode == 2
    assert "field 'targets.sm90.config.BLOCK_N'" in proc.stderr and "Fix:" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_closed_stdout_ends_quietly():
    """`python -m gen inspect generated/attention | head`: no BrokenPipeError traceback, exit status 141."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # closed before the child writes anything: every write finds the pipe closed
    try:
        proc = subprocess.run([sys.executable, "-m", "gen", "inspect", str(ROOT / "generated" / "attention")],
                              stdout=write_end, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                              env=child_env(), timeout=120)
    finally:
        os.close(write_end)
    assert proc.stderr == "", proc.stderr[-3000:]
    assert proc.returncode == 141  # 128 + SIGPIPE, what the shell reports for `cat file | head`


def test_reader_that_stops_early_sees_no_traceback():
    proc = subprocess.run(f"'{sys.executable}' -m gen inspect generated/attention | head -n 1", shell=True,
                          capture_output=True, text=True, cwd=ROOT, env=child_env(),
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("target")
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr[-3000:]


def test_a_target_that_ships_nothing_fails_the_build_loudly(tmp_path):
    """A spec target whose every candidate fails its gates (here an impossible instruction expectation) is a failed
    build, named on stderr with the build log that holds each candidate's whole reason; --allow-missing-targets is
    the old behaviour (the public op falls back)."""
    text = (ROOT / "specs" / "gemm.yaml").read_text().replace(
        "instructions: {HGMMA: 1, UTMALDG: 1, UTMASTG: 1}", "instructions: {HGMMA: 1000, UTMALDG: 1, UTMASTG: 1}")
    spec = tmp_path / "gemm.yaml"
    spec.write_text(text)
    args = (str(spec), "--target", "sm90", "--target", "triton", "--no-search", "--no-gpu", "--no-precompile",
            "--out", str(tmp_path / "g"))
    proc = run(*args)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "no sm90 variant passed its gates: build FAILED" in proc.stderr
    log = Path(os.environ.get("GEN_CACHE_DIR") or ROOT / ".cache") / "logs" / "build-gemm.log"
    assert str(log) in proc.stderr and "HGMMA" in log.read_text()
    proc = run(*args, "--allow-missing-targets")
    assert proc.returncode == 0 and "shipped without them" in proc.stderr


def test_a_build_with_an_untested_triton_says_so(monkeypatch):
    import gen.__main__ as cli
    from gen.runtime import triton_range

    monkeypatch.setattr(triton_range, "TESTED", "0.0.0")
    msg = cli._untested_triton()
    folder = triton_range.release_folder(triton_range.installed())
    assert msg.startswith("note: triton ") and f"generated/<family>/{folder}/" in msg and "GPU-tested triton 0.0.0" in msg
    monkeypatch.setattr(triton_range, "TESTED", triton_range.installed())
    assert cli._untested_triton() == ""


def test_a_triton_outside_the_supported_range_is_refused_with_the_versions_and_the_fix():
    from gen.runtime import triton_range

    for ok in ("3.6.0", "3.7.1", "3.8.0", "3.9.0", "3.6.0+git1a2b3c", "3.9.0rc1"):
        assert triton_range.problem(ok) == "", ok
    for bad in ("3.5.1", "3.10.0", "4.0.0", "2.3.1"):
        why = triton_range.problem(bad)
        assert f"triton {bad} is installed" in why and "3.6 to 3.9" in why and "torch 2.14 -> 3.8.0" in why
    with pytest.raises(ValueError, match="cannot read a Triton version"):
        triton_range.release("main")


def test_the_dependency_range_in_pyproject_is_the_supported_range():
    import re

    from gen.runtime import triton_range

    text = (ROOT / "pyproject.toml").read_text()
    (lo, hi), = re.findall(r'"triton>=(\d+\.\d+),<(\d+\.\d+)"', text)
    (first, last) = triton_range.SUPPORTED
    assert triton_range.release(lo) == first
    assert triton_range.release(hi) == (last[0], last[1] + 1)


def test_committed_ir_names_no_path_of_the_machine_that_built_it():
    """A rebuild on another machine must leave git clean: TTGIR locations lose the install prefix of Triton and the
    scratch path of the compiled module."""
    from gen.build.emit import portable_ttgir

    ttgir = ('#loc1 = loc("/home/u/.venv/lib/python3.12/site-packages/triton/language/standard.py":43:17)\n'
             '#loc2 = loc("/tmp/x/v_0123456789abcdef0123.py":10:2)\n'
             '#loc3 = loc("/usr/lib/python3/dist-packages/triton/language/core.py":5:1)\n')
    out = portable_ttgir(ttgir, "gemm", "sm90")
    assert '"triton/language/standard.py":43:17' in out and '"generated/gemm/sm90.py (body)":10:2' in out
    assert '"triton/language/core.py":5:1' in out and "/home/" not in out and "/tmp/" not in out
    for path in sorted((ROOT / "generated").glob("*/ir/*.ttgir")):
        assert 'loc("/' not in path.read_text(), f"{path.relative_to(ROOT)} holds an absolute path; regenerate it"
