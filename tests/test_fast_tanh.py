"""The Gluon kernels' tanh is the hardware's tanh.approx.f32 (one MUFU.TANH; max relative error 2^-10.987 per the PTX
ISA), the portable kernel's an exact-in-fp32 exp2 form. What the approximation can do to softcapped attention is
bounded here in float64: every tanh off by the full error bound, with a random sign per score, forward and backward."""
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gen.build.render import render_variant  # noqa: E402
from gen.build.spec import load_spec  # noqa: E402
from gen.measure.accuracy import TOLERANCE  # noqa: E402

TANH_APPROX_REL_ERR = 2.0 ** -10.987


def _tanh_body(target: str) -> str:
    spec = load_spec(ROOT / "specs" / "attention.yaml")
    text = render_variant(spec, target, dict(spec.targets[target].config)).text
    start = text.index("def _sm_tanh(x):")
    return text[start:text.index("\n\n", start)]


@pytest.mark.parametrize("target", ["sm90", "sm100"])
def test_gluon_targets_use_the_hardware_tanh(target):
    assert "tanh.approx.f32" in _tanh_body(target)


def test_portable_target_keeps_the_exp2_tanh():
    body = _tanh_body("triton")
    assert "tanh.approx" not in body and "tl.exp2" in body


class _PerturbedTanh(torch.autograd.Function):
    """tanh(x) * (1 + eps * sign): the forward value a tanh.approx.f32 at its error bound could give; the backward's
    derivative 1 - t^2 is taken from that perturbed t, as the kernels' score_mod_grad does."""

    @staticmethod
    def forward(ctx, x, sign):
        t = torch.tanh(x) * (1 + TANH_APPROX_REL_ERR * sign)
        ctx.save_for_backward(t)
        return t

    @staticmethod
    def backward(ctx, grad):
        (t,) = ctx.saved_tensors
        return grad * (1 - t * t), None


def _softcap_attention(q, k, v, cap, sign=None):
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    t = torch.tanh(s / cap) if sign is None else _PerturbedTanh.apply(s / cap, sign)
    return torch.softmax(cap * t, dim=-1) @ v


@pytest.mark.parametrize("cap", [50.0, 5.0, 1.5])
@pytest.mark.parametrize("logit_std", [1.0, 4.0])
def test_tanh_approximation_error_stays_well_inside_the_bf16_tolerance(cap, logit_std):
    g = torch.Generator().manual_seed(int(cap * 10 + logit_std))
    d = 128
    # q, k ~ N(0, sigma^2): the scores q.k / sqrt(d) have standard deviation sigma^2 = logit_std
    sigma = logit_std ** 0.5
    q, k = (torch.randn(2, 256, d, dtype=torch.float64, generator=g) * sigma for _ in range(2))
    v, grad_out = (torch.randn(2, 256, d, dtype=torch.float64, generator=g) for _ in range(2))
    sign = torch.randint(0, 2, (2, 256, 256), generator=g).double() * 2 - 1

    def run(s):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = _softcap_attention(*leaves, cap, s)
        return [out.detach(), *torch.autograd.grad((out * grad_out).sum(), leaves)]

    exact, approx = run(None), run(sign)
    errors = [float((a - e).norm() / e.norm()) for a, e in zip(approx, exact)]
    assert max(errors) > 0   # the perturbation reached the outputs
    # out, dq, dk, dv: 5e-4..3.4e-3 over these settings; bf16's tolerance is 1e-2, half of it is the bound
    assert max(errors) < TOLERANCE["bfloat16"] / 2, errors
