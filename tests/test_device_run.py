"""bench/device_run.py (the one-command GPU run): its plan, checked on CPU with --dry-run, and how it reads each
step's output into the run's JSON."""
import json
import subprocess
import sys

from .conftest import ROOT


def _dry_run(*args):
    proc = subprocess.run([sys.executable, "bench/device_run.py", "--dry-run", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return dict(line.split(": ", 1) for line in proc.stdout.splitlines())


def test_the_plan_runs_every_step_in_the_checkout_with_outputs_beside_the_record():
    plan = _dry_run()
    assert list(plan) == ["tests", "bench", "consan", "suite-gemm", "suite-attention", "suite-block", "train"]
    assert plan["tests"].startswith("python -m pytest -m gpu") and "--junitxml=bench/results/device-run-" in plan["tests"]
    assert "bench/gpu_ci.py --family all --skip-tests" in plan["bench"]
    assert plan["suite-block"].startswith("python bench/suite/run.py --family block --out bench/results/")
    assert "--time-budget 1800" in plan["suite-gemm"]
    assert str(ROOT) not in "".join(plan.values())   # commands name no machine path
    assert list(_dry_run("--steps", "consan,train", "--suite-budget", "60")) == ["consan", "train"]


def test_without_a_gpu_it_refuses_and_names_the_dry_run():
    proc = subprocess.run([sys.executable, "bench/device_run.py", "--steps", "tests"], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 2 and "--dry-run" in proc.stderr
    proc = subprocess.run([sys.executable, "bench/device_run.py", "--steps", "tests,benchmarks"], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 2 and "unknown step(s) ['benchmarks']" in proc.stderr


def test_step_summaries_come_from_the_steps_own_files(tmp_path):
    sys.path.insert(0, str(ROOT))
    from bench.device_run import summarize

    junit = tmp_path / "t.xml"
    junit.write_text('<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="3" failures="1" errors="0" '
                     'skipped="1"><testcase classname="tests.test_gpu" name="test_a"/><testcase '
                     'classname="tests.test_gpu" name="test_b"><failure message="x"/></testcase><testcase '
                     'classname="tests.test_gpu" name="test_c"><skipped/></testcase></testsuite></testsuites>')
    assert summarize("tests", {"junit": junit}) == {"tests": 3, "failures": 1, "errors": 0, "skipped": 1,
                                                    "failed": ["tests.test_gpu::test_b"]}
    consan = tmp_path / "c.json"
    consan.write_text(json.dumps({"variants": [{"family": "gemm", "variant": "sm90", "ok": True},
                                               {"family": "attention", "variant": "sm90", "ok": False}]}))
    assert summarize("consan", {"json": consan}) == {"variants": 2, "clean": 1, "not_clean": ["attention/sm90"]}
    suite = tmp_path / "s.json"
    suite.write_text(json.dumps({"rows": [{}, {}]}))
    assert summarize("suite-gemm", {"json": suite}) == {"rows": 2}
    assert summarize("train", {"json": tmp_path / "missing.json"}) == {}   # a step that wrote nothing
