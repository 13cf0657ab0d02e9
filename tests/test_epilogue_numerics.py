"""The portable GEMM's activations in Triton's CPU interpreter, with numpy warnings as errors: exp2 and the gelu
cubic must not overflow for large pre-activations (an InterpreterError under -W error), and the values must match
torch's gelu(approximate="tanh") and silu."""
import os
import subprocess
import sys
import textwrap

import pytest

from .conftest import ROOT, child_env

SCRIPT = textwrap.dedent("""
    import sys

    import torch

    from gen.build.compile import load_module_from_text
    from gen.families.gemm import apply_activation
    from gen.build.render import render_variant
    from gen.build.spec import load_spec

    activation, dtype = sys.argv[1], getattr(torch, sys.argv[2])
    spec = load_spec("specs/gemm.yaml")
    src = render_variant(spec, "triton", spec.targets["triton"].config)
    module = load_module_from_text(src.text, src.digest)
    # K = 1 and b = 1: the pre-activation is exactly a[:, 0] (+ 0 bias), from the tails to around zero
    big = 6e4 if dtype == torch.float16 else 1e30  # near the top of the input dtype (x^3 overflows fp32 at 1e13)
    x = torch.tensor([-big, -1e4, -500.0, -88.0, -20.0, -10.5, -10.0, -9.0, -5.0, -3.0, -1.0, -0.25, 0.0,
                      0.25, 1.0, 3.0, 5.0, 10.0, 20.0, 88.0, 1e4, big])
    a = x.to(dtype)[:, None].contiguous()
    b = torch.ones(1, 32, dtype=dtype)
    bias = torch.zeros(32, dtype=dtype)
    out = torch.empty(a.shape[0], 32, dtype=torch.float32)
    module.launch(a, b, bias, out, activation, 1)
    want = apply_activation(a.to(torch.float64), activation).expand(-1, 32)
    torch.testing.assert_close(out.to(torch.float64), want, rtol=1e-5, atol=1e-6)
    if activation == "gelu_tanh":  # saturated tails exactly as before the overflow fix: x, and 0 (not 1e-37)
        xs = a[:, 0].float()
        assert torch.equal(out[xs >= 11], xs[xs >= 11, None].expand(-1, 32)) and (out[xs <= -11] == 0).all()
    print("ok")
""")


@pytest.mark.parametrize("activation", ["gelu_tanh", "silu"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_activation_tails_do_not_overflow_in_the_interpreter(activation, dtype):
    env = child_env(TRITON_INTERPRET="1")
    # numpy reports floating-point overflow as a RuntimeWarning; not plain `-W error`, since triton 3.6's interpreter
    # itself trips a numpy DeprecationWarning (ndim > 0 array to scalar) on every launch
    proc = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-c", SCRIPT, activation, dtype],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
