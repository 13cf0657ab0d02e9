"""The GPU stage's bookkeeping, on CPU: keep-or-reject against Inductor (gen.measure.gpu.decide), the speedups it reads, and
the work a benchmark row's TFLOP/s are counted over (FLOPs, the fraction of scores a mask keeps)."""
import pytest

from gen.measure import bench
from gen.families import attention, gemm
from gen.measure.gpu import decide

from .conftest import child_env


def _rows(*entries):
    return [{"case": c, "provider": p, "ms": ms} for c, p, ms in entries]


def test_decide_keeps_inductor_exactly_where_ours_does_not_beat_its_best_time_by_the_margin():
    rows = _rows(("big", "gen-sm90", 1.0), ("big", "inductor", 1.3), ("big", "inductor-max-autotune", 1.2),
                 ("small", "gen-sm90", 1.0), ("small", "inductor", 1.5), ("small", "inductor-max-autotune", 1.04))
    text, keep = decide(rows, "gen-sm90", 1.05)
    assert keep == ["small"]                     # 1.04x over max-autotune, its best: below the 1.05 margin
    assert "on 1/2 benchmark cases" in text and "keep Inductor for: small" in text
    text, keep = decide(rows, "gen-sm90", 1.02)
    assert keep == [] and "on 2/2" in text and "keep Inductor" not in text


def test_decide_without_an_inductor_measurement_decides_nothing():
    assert decide(_rows(("big", "gen-sm90", 1.0), ("big", "cublas+eager", 0.9)), "gen-sm90", 1.05) == \
        ("no Inductor measurement: undecided", [])


def test_speedups_are_baseline_over_ours_and_skip_cases_ours_did_not_run():
    rows = _rows(("a", "gen-sm90", 2.0), ("a", "inductor", 3.0), ("b", "inductor", 1.0),
                 ("c", "gen-sm90", float("inf")), ("c", "inductor", 1.0))
    assert bench.speedups(rows, "gen-sm90", "inductor") == {"a": 1.5}


def test_work_accounting_counts_the_flops_the_kernels_do():
    assert gemm.flops((128, 256, 64)) == 2 * 128 * 256 * 64
    none = {"mask": "none"}
    causal = {"mask": "causal"}
    window = {"mask": "window"}
    assert attention.unmasked_fraction(none, 5, 7) == 1.0
    assert attention.unmasked_fraction(causal, 4, 4) == pytest.approx(10 / 16)       # lower triangle with diagonal
    assert attention.unmasked_fraction(causal, 2, 4) == pytest.approx((3 + 4) / 8)   # bottom-right aligned
    assert attention.unmasked_fraction(window, 4, 4, 1, 0) == pytest.approx(7 / 16)  # diagonal + one to the left
    assert attention.flops((2, 8, 8, 16, 16), 64, 0.5) == 4 * 2 * 8 * 16 * 16 * 64 * 0.5


_COUNTER_SCRIPT = r'''
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource
from bench.compile_counter import install

record = install()

@triton.jit
def scale(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)

triton.compile(ASTSource(scale, {"x_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}, {"BLOCK": 128}),
               target=GPUTarget("cuda", 90, 32))
assert record["compiled"] == ["scale"], record
print("OK")
'''


def test_the_first_call_benchmarks_count_a_compile(tmp_path):
    """bench/compile_counter.py (the first-call benchmarks' children count what they compile with it) sees a Triton
    compile, by kernel name."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    script = tmp_path / "count.py"   # a file: @triton.jit reads its kernel's source
    script.write_text(_COUNTER_SCRIPT)
    env = child_env(TRITON_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=root,
                          timeout=300)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-2000:]
