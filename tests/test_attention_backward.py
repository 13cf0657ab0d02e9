"""Attention backward on CPU: the portable Triton backward (run in Triton's interpreter, in a child process: it must
be enabled before triton is imported) through autograd of the public op, against float64 autograd of the same math,
for every mod, on decode, GQA, Lq < Lk, Lq > Lk (fully masked rows) and odd lengths; the LSE's gradient too."""
import json
import os
import subprocess
import sys

import pytest

from .conftest import ROOT

_CHECK = r"""
import itertools, json, sys
import torch
import generated.attention as att

def reference(q, k, v, scale, mod, left, right, cap, slopes):
    # the math in float64: scores, the mod's torch lowering, a softmax that gives fully masked rows 0 (no NaN)
    b_, hq, lq, d = q.shape
    group = hq // k.shape[1]
    kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    score = q @ kk.transpose(-1, -2) * scale
    b = torch.arange(b_).view(-1, 1, 1, 1)
    h = torch.arange(hq).view(1, -1, 1, 1)
    q_idx, kv_idx = torch.arange(lq).view(-1, 1), torch.arange(k.shape[2]).view(1, -1)
    score = att._MOD_MATH[mod](score, b, h, q_idx, kv_idx, lq, k.shape[2], left, right, cap, slopes)
    m = score.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m)).detach()
    e = torch.exp(score - m)
    s = e.sum(-1, keepdim=True)
    lse = torch.where(s > 0, torch.log(s) + m, torch.full_like(s, float("-inf"))).squeeze(-1)
    return (e / torch.where(s > 0, s, torch.ones_like(s))) @ vv, lse

torch.manual_seed(0)
shapes, mods, dtypes = json.loads(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
rows = []
for (B, Hq, Hkv, Lq, Lk), mod, dt in itertools.product(shapes, mods, dtypes):
    dt = getattr(torch, dt)
    q, k, v = (torch.randn(B, H, L, 64).to(dt).requires_grad_() for H, L in ((Hq, Lq), (Hkv, Lk), (Hkv, Lk)))
    window = (8, 2) if mod == "window" else None
    cap = 1.5 if mod == "softcap" else None   # small enough that tanh saturates: its derivative matters
    out, lse = att.attention(q, k, v, mod=mod, window=window, softcap=cap, return_lse=True)
    g, glse = torch.randn_like(out), torch.randn_like(lse)
    finite = torch.isfinite(lse)
    loss = (out.float() * g.float()).sum() + (torch.where(finite, lse, 0.0) * glse).sum()
    got = torch.autograd.grad(loss, (q, k, v))
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    _, _, _, scale, _, left, right, cap, _ = att._arguments(q, k, v, mod, None, window, cap, None)
    slopes = att.default_alibi_slopes(Hq, "cpu").double() if mod == "alibi" else None
    ref, ref_lse = reference(q64, k64, v64, scale, mod, left, right, cap, slopes)
    ref_loss = (ref * g.double()).sum() + (torch.where(torch.isfinite(ref_lse), ref_lse, 0.0) * glse.double()).sum()
    want = torch.autograd.grad(ref_loss, (q64, k64, v64))
    errs = [((a.double() - b).norm() / b.norm().clamp_min(1e-30)).item() for a, b in zip(got, want)]
    finite_ok = all(bool(torch.isfinite(a).all()) for a in got)
    def grads():
        out = att.attention(q, k, v, mod=mod, window=window, softcap=cap)
        return torch.autograd.grad((out.float() * g.float()).sum(), (q, k, v))
    rows.append({"case": [B, Hq, Hkv, Lq, Lk, mod, str(dt)], "errs": errs, "finite": finite_ok,
                 "lse_matches": bool(torch.equal(finite, torch.isfinite(ref_lse))),
                 "deterministic": all(torch.equal(a, b) for a, b in zip(grads(), grads()))})
print(json.dumps(rows))
"""


def _run(shapes, mods, dtypes):
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", _CHECK, json.dumps(shapes), json.dumps(mods), json.dumps(dtypes)],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


MODS = ["none", "causal", "window", "softcap", "alibi", "decay"]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_backward_matches_float64_autograd_for_every_mod(dtype):
    # decode; GQA with Lq < Lk; Lq > Lk (fully masked rows under causal/window); odd equal lengths, B = 2
    shapes = [[1, 2, 2, 1, 70], [1, 4, 1, 17, 40], [2, 4, 2, 20, 12], [2, 2, 2, 33, 33]]
    rows = _run(shapes, MODS, [dtype])
    assert len(rows) == len(shapes) * len(MODS)
    for r in rows:
        assert r["finite"] and r["lse_matches"] and r["deterministic"], r
        assert max(r["errs"]) < 2e-2, r
