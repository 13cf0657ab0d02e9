"""The sm100 attention's exp2 on the FMA pipes (_exp2_fma, FA4's emulation), run as shipped in the CPU simulator:
its error against exp2 over the softmax's whole input range, and the zeros that masking relies on."""
from __future__ import annotations

import torch

from gen.simulator import load_module
from gen.simulator._tensor import Tensor

from .conftest import ROOT


def _shipped_exp2_fma():
    text = (ROOT / "generated" / "attention" / "sm100.py").read_text()
    assert "_exp2_fma(" in text.split("def _softmax_partition", 1)[1], "the softmax no longer calls _exp2_fma"
    return load_module(text, "attention_sm100_exp2_fma")._exp2_fma


def test_exp2_fma_is_within_its_bound_of_exp2_over_the_softmax_range():
    # the softmax's inputs: s * scale - m in log2 units, at most RESCALE_THRESHOLD (8) above 0 under lazy rescaling
    x = torch.cat([torch.linspace(-125.0, 8.0, 2_000_001), torch.rand(100_000) * 133.0 - 125.0])
    got = _shipped_exp2_fma()(Tensor(x)).t.double()
    want = torch.exp2(x.double())
    rel = ((got - want).abs() / want).max().item()
    assert rel < 8e-5, rel   # the polynomial's 7.5e-5 plus fp32 rounding; fp16 rounds P at 4.9e-4
    assert rel > 1e-6        # the emulation runs, not exp2 itself
    # in [-126, -125) the result reaches fp32's subnormals: off by less than 2^-135 there (0.2% of the value), and 0 in bf16/fp16 anyway
    x = torch.linspace(-126.0, -125.0, 10_001)
    got = _shipped_exp2_fma()(Tensor(x)).t.double()
    assert (got - torch.exp2(x.double())).abs().max().item() < 2.0 ** -135


def test_exp2_fma_gives_exact_zeros_and_ones_where_the_softmax_needs_them():
    x = torch.tensor([-float("inf"), -1e30, -200.0, -126.5, 0.0, 1.0, 8.0])
    got = _shipped_exp2_fma()(Tensor(x)).t
    assert got[:4].tolist() == [0.0, 0.0, 0.0, 0.0]   # masked scores: fully masked rows keep l = 0, no NaN
    assert torch.isfinite(got).all()
    assert abs(got[4].item() - 1.0) < 8e-5 and abs(got[5].item() / 2.0 - 1.0) < 8e-5
    assert abs(got[6].item() / 256.0 - 1.0) < 8e-5
