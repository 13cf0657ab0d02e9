"""The generated public modules: argument checks, the custom op's fake, torch.compile(fullgraph=True), dispatch."""
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

from .conftest import ROOT, child_env


@pytest.fixture(scope="module")
def gemm():
    from generated.gemm import gemm

    return gemm


@pytest.fixture(scope="module")
def attention():
    from generated.attention import attention

    return attention


def bf16(*shape):
    return torch.randn(*shape, dtype=torch.bfloat16)


@pytest.mark.parametrize("call, match", [
    (lambda g: g(bf16(4, 8), bf16(9, 4)), r"K must match: `a` is \(4, 8\) and `b` is \(9, 4\)"),
    (lambda g: g(bf16(4, 8), torch.randn(8, 4)), r"`b` has dtype torch.float32; use torch.float16 or torch.bfloat16"),
    (lambda g: g(bf16(4, 8), bf16(8, 4).half()), r"`a` is torch.bfloat16 but `b` is torch.float16"),
    (lambda g: g(bf16(4, 8, 1), bf16(8, 4)), r"`a` must be 2-D"),
    (lambda g: g(bf16(4, 8), bf16(8, 4), bias=bf16(5)), r"`bias` must be a tensor of shape \(4,\)"),
    (lambda g: g(bf16(4, 8), bf16(8, 4), activation="gelu"), r"`activation` 'gelu' is not one of"),
    (lambda g: g(bf16(4, 8), bf16(8, 4), out_dtype=torch.int8), r"`out_dtype` torch.int8"),
    (lambda g: g(bf16(0, 8), bf16(8, 4)), r"M, N and K must be >= 1"),
    (lambda g: g([[1.0]], bf16(8, 4)), r"`a` must be a torch.Tensor"),
])
def test_gemm_rejects_bad_arguments_by_name(gemm, call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call(gemm)


def test_gemm_on_cpu_without_interpreter_says_how(gemm, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        gemm(bf16(4, 8), bf16(8, 4))


@pytest.mark.parametrize("call, match", [
    (lambda a: a(bf16(1, 4, 8, 64), bf16(1, 3, 8, 64), bf16(1, 3, 8, 64)), "Hq=4 is not a multiple of Hkv=3"),
    (lambda a: a(bf16(1, 2, 8, 96), bf16(1, 2, 8, 96), bf16(1, 2, 8, 96)), "head dim D=96 is not built"),
    (lambda a: a(bf16(1, 2, 8, 64), bf16(1, 2, 8, 64), bf16(1, 2, 9, 64)), "must have the same shape"),
    (lambda a: a(bf16(1, 2, 8, 64), bf16(1, 2, 8, 64), bf16(1, 2, 8, 64), mod="sliding"), "`mod` 'sliding' is not in this build"),
    (lambda a: a(bf16(1, 2, 8, 64), bf16(1, 2, 8, 64).half(), bf16(1, 2, 8, 64)), "`k` is torch.float16 but `q` is torch.bfloat16"),
    (lambda a: a(bf16(2, 8, 64), bf16(1, 2, 8, 64), bf16(1, 2, 8, 64)), r"`q` must be 4-D"),
    (lambda a: a(bf16(1, 2, 8, 64), bf16(1, 2, 8, 64), bf16(1, 2, 8, 64), mod="causal", window=(4, 0)), "has no window mask"),
])
def test_attention_rejects_bad_arguments_by_name(attention, call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call(attention)


def test_fake_implementations_give_shapes_without_running():
    from torch._subclasses.fake_tensor import FakeTensorMode

    import generated.attention as att
    import generated.gemm as gm

    with FakeTensorMode():
        a, b = torch.empty(64, 32, dtype=torch.bfloat16), torch.empty(32, 48, dtype=torch.bfloat16)
        out = gm._op(a, b, None, "relu", torch.float32)
        assert out.shape == (64, 48) and out.dtype == torch.float32
        q = torch.empty(2, 4, 10, 64, dtype=torch.float16)
        k = torch.empty(2, 2, 12, 64, dtype=torch.float16)
        o, lse = att._op(q, k, k, 0.125, "causal", 0, 0, 0.0, None, True)
        assert o.shape == q.shape and lse.shape == (2, 4, 10) and lse.dtype == torch.float32
        o, lse = att._op(q, k, k, 0.125, "causal", 0, 0, 0.0, None, False)
        assert o.shape == q.shape and lse.shape == (0,)
        x, w = torch.empty(3, 5, 32, dtype=torch.bfloat16), torch.empty(48, 32, dtype=torch.bfloat16)
        y = gm._linear_op(x, w, None, "silu", torch.bfloat16)
        assert y.shape == (3, 5, 48) and y.dtype == torch.bfloat16
        y = gm._linear_op(x, w, None, "swiglu", torch.float32)   # gated: w is [2N, K], the output [..., N]
        assert y.shape == (3, 5, 24) and y.dtype == torch.float32
        assert gm._op(a, b, None, "geglu", torch.bfloat16).shape == (64, 24)


SCRIPT = textwrap.dedent('''
    import torch
    from generated.gemm import gemm
    from generated.attention import attention

    torch.manual_seed(0)
    a, b, bias = torch.randn(33, 40, dtype=torch.bfloat16), torch.randn(40, 24, dtype=torch.bfloat16), torch.randn(24)
    f = torch.compile(lambda a, b, bias: gemm(a, b, bias, "silu", torch.float32) * 2, fullgraph=True, backend="aot_eager")
    ref = torch.nn.functional.silu(a.double() @ b.double() + bias.double()) * 2
    got = f(a, b, bias)
    assert (got.double() - ref).norm() / ref.norm() < 1e-4, "gemm under torch.compile"

    q = torch.randn(1, 4, 20, 64, dtype=torch.float16)
    k, v = torch.randn(1, 2, 33, 64, dtype=torch.float16), torch.randn(1, 2, 33, 64, dtype=torch.float16)
    g = torch.compile(lambda q, k, v: attention(q, k, v, mod="causal", return_lse=True), fullgraph=True, backend="aot_eager")
    o, lse = g(q, k, v)
    kk, vv = k.double().repeat_interleave(2, 1), v.double().repeat_interleave(2, 1)
    s = (q.double() @ kk.transpose(-1, -2)) / 8.0
    keep = torch.arange(33)[None, :] <= torch.arange(20)[:, None] + 13
    s = s.masked_fill(~keep, float("-inf"))
    ref = torch.softmax(s, -1) @ vv
    assert (o.double() - ref).norm() / ref.norm() < 4e-3, "attention under torch.compile"
    assert (lse.double() - torch.logsumexp(s, -1)).abs().max() < 1e-2

    # views the kernels cannot read as they are (a strided along K, b neither [K, N] nor a weight's .t()): copied
    # once, never misread; and an nn.Linear weight read in place by linear(), 3-D input
    a, b = torch.randn(20, 96, dtype=torch.bfloat16)[:, ::3], torch.randn(32, 40, dtype=torch.bfloat16)[:, ::2]
    ref = torch.relu(a.double() @ b.double())
    assert (gemm(a, b, None, "relu").double() - ref).norm() / ref.norm() < 1e-2, "strided views"
    from generated.gemm import linear
    x, w = torch.randn(2, 5, 40, dtype=torch.bfloat16), torch.randn(24, 40, dtype=torch.bfloat16)
    ref = torch.nn.functional.linear(x.double(), w.double())
    y = linear(x, w)
    assert y.shape == (2, 5, 24) and (y.double() - ref).norm() / ref.norm() < 1e-2, "linear"
    print("OK")
''')


def test_ops_run_under_torch_compile_fullgraph_in_the_interpreter():
    env = child_env(TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


_GATED_SCRIPT = r'''
import sys
import torch
import torch.nn.functional as F
import generated.gemm as g

activation = sys.argv[1]
act = F.silu if activation == "swiglu" else (lambda t: F.gelu(t, approximate="tanh"))
gen = torch.Generator().manual_seed(3)
m, n, k = 37, 40, 200
x = torch.randn(m, k, generator=gen).bfloat16()
w = (torch.randn(2 * n, k, generator=gen) / 8).bfloat16()
for bias in (None, torch.randn(2 * n, generator=gen).bfloat16()):
    z = F.linear(x.double(), w.double(), None if bias is None else bias.double())
    ref = act(z[:, :n]) * z[:, n:]
    for out_dtype in (torch.bfloat16, torch.float32):
        tol = 1e-2 if out_dtype == torch.bfloat16 else 1e-4
        outs = {"linear": g.linear(x, w, bias, activation, out_dtype),
                "gemm kn": g.gemm(x, w.t().contiguous(), bias, activation, out_dtype)}
        for provider in ("torch", "triton", "triton_splitk"):
            outs[provider] = g.run_provider(provider, x, w.t(), bias, activation, out_dtype)
        outs["split x3"] = torch.empty(m, n, dtype=out_dtype)
        g._RT.variant("triton_splitk", ("test",), None).launch(x, w.t(), bias, outs["split x3"], activation, 1,
                                                              splits=3)
        for name, out in outs.items():
            assert out.shape == (m, n) and out.dtype == out_dtype, name
            err = ((out.double() - ref).norm() / ref.norm()).item()
            assert err < tol, (name, bias is None, out_dtype, err)
print("OK")
'''


@pytest.mark.parametrize("activation", ["swiglu", "geglu"])
def test_gated_activations_match_the_unfused_math_on_every_cpu_provider(activation):
    """act(x @ gate^T) * (x @ up^T) from one fused [2N, K] weight (gate rows first), as linear and as gemm (b [K, 2N]
    in either memory order), odd sizes, with and without bias, fp32 and 16-bit outputs: the torch provider and the
    portable kernels (the plain one and split-K, forced to 3 slices) in Triton's interpreter, against float64."""
    env = child_env(TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", _GATED_SCRIPT, activation], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=900)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


_RESIDUAL_SCRIPT = r"""
import torch
import torch.nn.functional as F
import generated.gemm as g

gen = torch.Generator().manual_seed(4)
m, n, k = 37, 40, 200
x = torch.randn(m, k, generator=gen).bfloat16()
for activation in ("none", "silu", "swiglu"):
    nb = 2 * n if activation == "swiglu" else n
    w = (torch.randn(nb, k, generator=gen) / 8).bfloat16()
    for bias in (None, torch.randn(nb, generator=gen).bfloat16()):
        z = F.linear(x.double(), w.double(), None if bias is None else bias.double())
        act = {"none": z, "silu": F.silu(z), "swiglu": F.silu(z[:, :n]) * z[:, n:] if nb > n else None}[activation]
        for out_dtype in (torch.bfloat16, torch.float32):
            tol = 1e-2 if out_dtype == torch.bfloat16 else 1e-4
            # a residual as a model holds it: a row view of a wider buffer (row stride 48), and contiguous
            wide = torch.randn(m, 48, generator=gen).to(out_dtype)
            for r in (wide[:, :n], wide[:, :n].contiguous()):
                ref = act + r.double()
                outs = {"linear": g.linear(x, w, bias, activation, out_dtype, residual=r),
                        "linear 3-D": g.linear(x.view(1, m, k), w, bias, activation, out_dtype,
                                               residual=r.reshape(1, m, n)).view(m, n),
                        "gemm kn": g.gemm(x, w.t().contiguous(), bias, activation, out_dtype, residual=r)}
                for provider in ("torch", "triton", "triton_splitk"):
                    outs[provider] = g.run_provider(provider, x, w.t(), bias, activation, out_dtype, residual=r)
                outs["split x3"] = torch.empty(m, n, dtype=out_dtype)
                g._RT.variant("triton_splitk", ("test",), None).launch(x, w.t(), bias, outs["split x3"], activation,
                                                                      1, r, splits=3)
                for name, out in outs.items():
                    assert out.shape == (m, n) and out.dtype == out_dtype, name
                    err = ((out.double() - ref).norm() / ref.norm()).item()
                    assert err < tol, (name, activation, bias is None, out_dtype, r.is_contiguous(), err)
                assert torch.equal(r, wide[:, :n])   # the residual is read, never written
print("OK")
"""


def test_residual_epilogue_matches_the_unfused_math_on_every_cpu_provider():
    """act(x @ W^T + b) + residual in one call (a transformer's `h = x + O(attn)`), as linear (2-D and 3-D) and as
    gemm, with and without bias, after no activation, silu and swiglu, into bf16 and fp32 outputs, the residual a
    row view of a wider buffer or contiguous: the torch provider and the portable kernels (the plain one and split-K,
    whose reduce kernel adds it, forced to 3 slices) in Triton's interpreter, against float64; the residual is
    never written."""
    env = child_env(TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", _RESIDUAL_SCRIPT], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=900)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


_RMS_SCRIPT = r"""
import torch
import torch.nn.functional as F
import generated.gemm as g

gen = torch.Generator().manual_seed(5)
norm_calls = []   # the op's row norms come from the pre-pass kernel (gen.runtime.rownorm, interpreted here)
_row_norms = g.row_norms
g.row_norms = lambda a: norm_calls.append(tuple(a.shape)) or _row_norms(a)
m, n, k, eps = 37, 40, 200, 1e-5
# rows of very different sizes, so that each row's RMSNorm factor matters
x = (torch.randn(m, k, generator=gen) * torch.rand(m, 1, generator=gen).mul(8).add(0.125)).bfloat16()
gain = (1 + 0.3 * torch.randn(k, generator=gen)).bfloat16()
xn = x.double() * (x.double().square().mean(-1, keepdim=True) + eps).rsqrt() * gain.double()   # the model's norm
for activation in ("none", "swiglu"):
    nb = 2 * n if activation == "swiglu" else n
    w = (torch.randn(nb, k, generator=gen) / 8).bfloat16()
    wf = g.fold_rms_gain(w, gain)   # as loaded once: the norm's gain in the weight
    for bias in (None, torch.randn(nb, generator=gen).bfloat16()):
        z = F.linear(xn, w.double(), None if bias is None else bias.double())
        act = z if activation == "none" else F.silu(z[:, :n]) * z[:, n:]
        for out_dtype in (torch.bfloat16, torch.float32):
            tol = 1.5e-2 if out_dtype == torch.bfloat16 else 1e-2   # (the folded weight is rounded to bf16)
            for r in (None, torch.randn(m, n, generator=gen).to(out_dtype)):
                ref = act if r is None else act + r.double()
                outs = {"linear": g.linear(x, wf, bias, activation, out_dtype, residual=r, rms_eps=eps),
                        "linear 3-D": g.linear(x.view(1, m, k), wf, bias, activation, out_dtype,
                                               residual=None if r is None else r.view(1, m, n),
                                               rms_eps=eps).view(m, n),
                        "gemm kn": g.gemm(x, wf.t().contiguous(), bias, activation, out_dtype, residual=r,
                                          rms_eps=eps)}
                for provider in ("torch", "triton", "triton_splitk"):
                    outs[provider] = g.run_provider(provider, x, wf.t(), bias, activation, out_dtype, residual=r,
                                                    rms_eps=eps)
                outs["split x3"] = torch.empty(m, n, dtype=out_dtype)
                norms = torch.linalg.vector_norm(x, dim=1, dtype=torch.float32)
                g._RT.variant("triton_splitk", ("test",), None).launch(x, wf.t(), bias, outs["split x3"], activation,
                                                                      1, r, (norms, eps), splits=3)
                for name, out in outs.items():
                    assert out.shape == (m, n) and out.dtype == out_dtype, name
                    err = ((out.double() - ref).norm() / ref.norm()).item()
                    assert err < tol, (name, activation, bias is None, out_dtype, r is None, err)
                # without rms_eps the same call is the plain product: the norm is not applied behind the user's back
                plain = g.linear(x, wf, bias, activation, out_dtype, residual=r)
                assert ((plain.double() - outs["linear"].double()).norm() / ref.norm()).item() > 0.1
assert (m, k) in norm_calls, norm_calls
print("OK")
"""


def test_rms_rows_match_rmsnorm_then_linear_on_every_cpu_provider():
    """linear(x, fold_rms_gain(w, g), rms_eps=eps) = F.linear(rmsnorm(x) * g, w): x's rows at very different sizes,
    as linear (2-D and 3-D) and as gemm, with and without bias and a residual, after no activation and swiglu,
    into bf16 and fp32 outputs: the torch provider and the portable kernels (the plain one and split-K, whose
    reduce kernel scales the rows, forced to 3 slices) in Triton's interpreter, against the float64 norm and
    product."""
    env = child_env(TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", _RMS_SCRIPT], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=900)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


_ROPE_SCRIPT = r"""
import torch
import torch.nn.functional as F
import generated.gemm as g

gen = torch.Generator().manual_seed(7)
# a GQA QKV projection: H query heads, Hkv key/value heads of D columns; RoPE on q and k, v left alone
B, L, K, H, Hkv, D = 2, 9, 96, 3, 1, 64
cols = (H + Hkv) * D
n = cols + Hkv * D
x = torch.randn(B, L, K, generator=gen).bfloat16()
w = (torch.randn(n, K, generator=gen) / 8).bfloat16()
bias = torch.randn(n, generator=gen).bfloat16()


def rotate(t, interleaved):   # Hugging Face's rotate_half, or the interleaved pairs'
    if interleaved:
        return torch.stack((-t[..., 1::2], t[..., 0::2]), dim=-1).flatten(-2)
    return torch.cat((-t[..., D // 2:], t[..., :D // 2]), dim=-1)


positions = torch.randint(0, 4096, (B, L), generator=gen).double()
angles = positions[..., None] * 10000.0 ** (-torch.arange(0, D, 2).double() / D)   # [B, L, D/2]
for interleaved in (False, True):
    full = angles.repeat_interleave(2, -1) if interleaved else torch.cat((angles, angles), -1)   # [B, L, D]
    cos, sin = full.cos().bfloat16(), full.sin().bfloat16()   # as a model's rotary embedding hands them over
    z = F.linear(x.double(), w.double(), bias.double())
    heads = z[..., :cols].unflatten(-1, (H + Hkv, D))
    c, s = cos.double()[..., None, :], sin.double()[..., None, :]
    ref = torch.cat(((heads * c + rotate(heads, interleaved) * s).flatten(-2), z[..., cols:]), dim=-1)
    for out_dtype in (torch.bfloat16, torch.float32):
        kw = dict(rope=(cos, sin), rope_columns=cols, rope_interleaved=interleaved)
        outs = {"linear": g.linear(x, w, bias, None, out_dtype, **kw),
                "linear 2-D": g.linear(x.view(B * L, K), w, bias, None, out_dtype, rope=(cos.view(B * L, D),
                                       sin.view(B * L, D)), rope_columns=cols, rope_interleaved=interleaved
                                       ).view(B, L, n),
                "gemm kn": g.gemm(x.view(B * L, K), w.t().contiguous(), bias, None, out_dtype,
                                  rope=(cos.view(B * L, D), sin.view(B * L, D)), rope_columns=cols,
                                  rope_interleaved=interleaved).view(B, L, n)}
        for provider in ("torch", "triton", "triton_splitk"):
            outs[provider] = g.run_provider(provider, x.view(B * L, K), w.t(), bias, None, out_dtype,
                                            rope=(cos.view(B * L, D), sin.view(B * L, D)), rope_columns=cols,
                                            rope_interleaved=interleaved).view(B, L, n)
        for name, out in outs.items():
            assert out.shape == (B, L, n) and out.dtype == out_dtype, name
            err = ((out.double() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, (name, interleaved, out_dtype, err)
        # v's columns are the plain product (up to the tile's summation order); the other convention is a
        # different answer
        plain = g.linear(x, w, bias, None, out_dtype)
        v_err = (outs["triton"][..., cols:].double() - plain[..., cols:].double()).norm() / plain[..., cols:].norm()
        assert v_err < 1e-2, v_err
        other = g.linear(x, w, bias, None, out_dtype, rope=(cos, sin), rope_columns=cols,
                         rope_interleaved=not interleaved)
        assert ((other.double() - ref).norm() / ref.norm()).item() > 0.1
    # one position table for the whole batch ([1, L, D]) broadcasts over it
    one = g.linear(x[:1].expand(B, L, K), w, bias, rope=(cos[:1], sin[:1]), rope_columns=cols,
                   rope_interleaved=interleaved)
    assert torch.equal(one[0], one[1])
    # tables in another dtype are cast to x's (as Hugging Face's rotary embedding casts them)
    kw = dict(rope_columns=cols, rope_interleaved=interleaved)
    assert torch.equal(g.linear(x, w, bias, rope=(cos.float(), sin.float()), **kw),
                       g.linear(x, w, bias, rope=(cos, sin), **kw))
    # the custom op (inference calls go through it on CPU) differentiates: d/dx against float64 autograd
    xg = x.double().requires_grad_()
    wt = w.double()
    zz = F.linear(xg, wt)[..., :cols].unflatten(-1, (H + Hkv, D))
    (zz * c + rotate(zz, interleaved) * s).sum().backward()
    xb = x.clone().requires_grad_()
    torch.ops.gen.linear(xb, w, None, "none", torch.float32, None, None, cos.view(B * L, D), sin.view(B * L, D),
                         cols, interleaved)[..., :cols].sum().backward()
    err = ((xb.grad.double() - xg.grad).norm() / xg.grad.norm()).item()
    assert err < 1e-2, ("grad", interleaved, err)
print("OK")
"""


def test_rope_matches_rotary_embedding_after_linear_on_every_cpu_provider():
    """linear(x, w, rope=(cos, sin), rope_columns=...) = a model's q and k projections then its rotary embedding
    (Hugging Face's `q * cos + rotate_half(q) * sin`, or interleaved pairs), v untouched: as linear (3-D with [B, L,
    D] tables and a [1, L, D] table broadcast over the batch, 2-D) and as gemm, into bf16 and fp32, through the torch
    provider and the portable kernels (split-K's module runs it unsplit) in Triton's interpreter, against float64;
    the custom op's gradient against float64 autograd."""
    env = child_env(TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", _ROPE_SCRIPT], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=900)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


@pytest.mark.parametrize("bad, match", [
    (dict(rope=(None, None)), r"`rope`'s cos must be a float tensor"),
    (dict(rope=(torch.ones(4, 16), torch.ones(4, 8))), r"must have one shape"),
    (dict(rope=(torch.ones(4, 15), torch.ones(4, 15))), r"head dim .* must be even"),
    (dict(rope=(torch.ones(3, 16), torch.ones(3, 16))), r"leading dims the input's last ones"),
    (dict(rope=(torch.ones(4, 16), torch.ones(4, 16)), rope_columns=24), r"`rope_columns` 24 must be a multiple"),
    (dict(rope=(torch.ones(4, 16), torch.ones(4, 16)), rope_columns=64), r"must be a multiple of the head dim 16 in"),
    (dict(rope=(torch.ones(4, 16), torch.ones(4, 16)), activation="swiglu"), r"does not combine with a gated"),
    (dict(rope=(torch.ones(4, 16), torch.ones(4, 16)), residual=torch.ones(4, 32).bfloat16()),
     r"does not combine with a residual"),
    (dict(rope=torch.ones(4, 16)), r"must be a \(cos, sin\) pair"),
])
def test_a_bad_rope_is_refused_by_name(bad, match, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    import generated.gemm as g

    with pytest.raises((ValueError, TypeError), match=match):
        g.linear(bf16(4, 8), bf16(32, 8), **bad)


@pytest.mark.parametrize("eps", [0.0, -1e-5, float("nan"), "1e-5", True])
def test_a_bad_rms_eps_is_refused_by_name(eps, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    import generated.gemm as g

    for call in (lambda: g.gemm(bf16(4, 8), bf16(8, 16), rms_eps=eps),
                 lambda: g.linear(bf16(4, 8), bf16(16, 8), rms_eps=eps)):
        with pytest.raises(ValueError, match=r"`rms_eps` must be None or a positive float"):
            call()


@pytest.mark.parametrize("call, match", [
    (lambda g: g.gemm(bf16(4, 8), bf16(8, 16), residual=bf16(4, 8)), r"`residual` \(4, 8\) must have the output's "
                                                                     r"shape \(4, 16\)"),
    (lambda g: g.gemm(bf16(4, 8), bf16(8, 32), activation="swiglu", residual=bf16(4, 32)),
     r"`residual` \(4, 32\) must have the output's shape \(4, 16\)"),
    (lambda g: g.gemm(bf16(4, 8), bf16(8, 16), residual=torch.randn(4, 16)),
     r"`residual` is torch.float32 but the output is torch.bfloat16; pass residual.to\(torch.bfloat16\)"),
    (lambda g: g.gemm(bf16(4, 8), bf16(8, 16), residual=bf16(4, 16).to("meta")), r"`residual` is on meta"),
    (lambda g: g.linear(bf16(2, 4, 8), bf16(16, 8), residual=bf16(8, 16)), r"`residual` \(8, 16\) must have the "
                                                                          r"output's shape \(2, 4, 16\)"),
    (lambda g: g.linear(bf16(4, 8), bf16(16, 8), residual=[[0.0]]), r"`residual` must be a tensor"),
])
def test_a_bad_residual_is_refused_by_name(call, match, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    import generated.gemm as g

    with pytest.raises((ValueError, TypeError), match=match):
        call(g)


def test_the_torch_provider_adds_the_residual_in_cublas_where_it_can():
    """Without bias or activation the torch provider's residual is addmm's input (one cuBLAS call, one rounding,
    for gemm and for linear's F.linear path); otherwise it is added after the activation; both equal the float64
    math."""
    import generated.gemm as g

    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    a, w, r = bf16(33, 40), bf16(24, 40), bf16(33, 24)
    for bias, act in ((None, "none"), (bf16(24), "gelu_tanh")):
        z = a.double() @ w.double().t() + (0 if bias is None else bias.double())
        ref = (z if act == "none" else torch.nn.functional.gelu(z, approximate="tanh")) + r.double()
        for out_dtype in (torch.bfloat16, torch.float32):
            out = g.torch_gemm(a, w.t(), bias, act, out_dtype, r.to(out_dtype))
            assert out.dtype == out_dtype and ((out.double() - ref).norm() / ref.norm()) < 1e-2
        for x, res in ((a, r), (a.view(3, 11, 40), r.view(3, 11, 24))):   # linear's provider, 2-D and 3-D
            with Ops() as ops:
                out = g.torch_linear(x, w, bias, act, res)
            assert out.shape == res.shape and ((out.double().view(33, 24) - ref).norm() / ref.norm()) < 1e-2
            if bias is None:
                assert [op for op in ops.seen if op not in ("view", "t", "_unsafe_view")] == ["addmm"], ops.seen


def test_gemm_torch_provider_matches_reference():
    """The torch provider (what the dispatch picks where cuBLAS was measured faster) computes the same function,
    for a row-major b and for the w.t() view of an nn.Linear weight."""
    import generated.gemm as g

    a, w, bias = bf16(33, 40), bf16(24, 40), bf16(24)
    ref = torch.nn.functional.gelu(a.double() @ w.double().t() + bias.double(), approximate="tanh")
    for b in (w.t(), w.t().contiguous()):
        out = g.torch_gemm(a, b, bias, "gelu_tanh", torch.bfloat16)
        assert out.dtype == torch.bfloat16 and ((out.double() - ref).norm() / ref.norm()) < 1e-2
        out = g.torch_gemm(a, b, bias, "gelu_tanh", torch.float32)   # fp32 out: never rounded through bf16
        assert out.dtype == torch.float32 and ((out.double() - ref).norm() / ref.norm()) < 1e-5


@pytest.mark.parametrize("mod", ["none", "causal", "window", "softcap", "alibi", "decay"])
def test_attention_torch_path_matches_reference(mod):
    """The torch math provider: the spec's mods, bottom-right masks, empty rows."""
    import generated.attention as att
    from gen.families.attention import alibi_slopes, reference
    from gen.build.spec import load_spec

    spec = load_spec(ROOT / "specs" / "attention.yaml")
    q, k, v = bf16(2, 4, 40, 64), bf16(2, 2, 24, 64), bf16(2, 2, 24, 64)  # Lq > Lk: causal rows with no key
    slopes = alibi_slopes(4)
    o, lse = att.torch_math(q, k, v, 0.125, mod, 8, 0, 50.0, slopes)
    ref_o, ref_lse = reference({"q": q, "k": k, "v": v, "mod": mod, "scale": 0.125, "window_left": 8,
                                "window_right": 0, "softcap": 50.0, "alibi_slopes": slopes}, spec.options)
    assert ((o.double() - ref_o).norm() / ref_o.norm()) < 1e-2
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), fin) and (lse.double()[fin] - ref_lse[fin]).abs().max() < 1e-3


def test_default_alibi_slopes_are_the_standard_ones_and_built_on_the_device():
    import generated.attention as att
    from gen.families.attention import alibi_slopes

    assert torch.allclose(att.default_alibi_slopes(8, "cpu"), alibi_slopes(8))
    assert att.default_alibi_slopes(8, "cpu") is att.default_alibi_slopes(8, "cpu")  # cached outside capture


@pytest.mark.parametrize("mod, lq, lk", [("none", 20, 33), ("causal", 33, 33), ("causal", 1, 33), ("causal", 20, 33)])
def test_attention_sdpa_provider_is_bottom_right_aligned(mod, lq, lk):
    """SDPA as a provider must compute our semantics: causal aligned bottom-right (FlashAttention), GQA."""
    import generated.attention as att

    q, k, v = bf16(1, 4, lq, 64), bf16(1, 2, lk, 64), bf16(1, 2, lk, 64)
    got = att.torch_sdpa("sdpa", q, k, v, 0.125, mod)
    want, _ = att.torch_math(q, k, v, 0.125, mod, 0, 0, 0.0, None)
    assert ((got.double() - want.double()).norm() / want.double().norm()) < 1e-2


def test_sdpa_plan_passes_only_the_arguments_that_differ_from_sdpa_defaults():
    """Each extra keyword costs SDPA's argument parsing host time per call, so the plan leaves defaults out; a scale
    that is not SDPA's default must still reach it."""
    import generated.attention as att

    backend, kwargs = att._sdpa_plan("sdpa", "causal", 16, 16, False, 0.125, 64)
    assert backend is None and kwargs == {"is_causal": True}
    assert att._sdpa_plan("sdpa", "causal", 1, 16, True, 0.125, 64)[1] == {"enable_gqa": True}
    _, kwargs = att._sdpa_plan("sdpa-flash", "causal", 4, 16, True, 0.3, 64)
    assert set(kwargs) == {"attn_mask", "scale", "enable_gqa"} and kwargs["scale"] == 0.3
    q, k, v = bf16(1, 4, 20, 64), bf16(1, 2, 33, 64), bf16(1, 2, 33, 64)
    got = att.torch_sdpa("sdpa", q, k, v, 0.3, "none")
    want, _ = att.torch_math(q, k, v, 0.3, "none", 0, 0, 0.0, None)
    assert ((got.double() - want.double()).norm() / want.double().norm()) < 1e-2


@pytest.mark.parametrize("mod", ["window", "softcap", "alibi", "decay"])
def test_attention_sdpa_provider_refuses_what_it_cannot_express(mod):
    import generated.attention as att

    q = bf16(1, 2, 8, 64)
    with pytest.raises(att.NotApplicable):
        att.torch_sdpa("sdpa-flash", q, q, q, 0.125, mod)
    with pytest.raises(att.NotApplicable):   # causal with Lq > Lk has fully masked rows SDPA would fill with NaN
        att.torch_sdpa("sdpa", bf16(1, 2, 9, 64), q, q, 0.125, "causal")


def test_public_ops_decide_on_cpu_tensors_and_name_their_providers(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    import generated.attention as att
    import generated.gemm as g

    assert g.decide(bf16(4, 8), bf16(8, 4)) == "triton" and "torch" in g.PROVIDERS
    assert att.decide(bf16(1, 2, 8, 64), bf16(1, 2, 8, 64), bf16(1, 2, 8, 64)) == "triton"
    assert {"sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "torch"} <= set(att.PROVIDERS)
    with pytest.raises(ValueError, match="provider 'cublas' is not one of"):
        g.run_provider("cublas", bf16(4, 8), bf16(8, 4))


@pytest.mark.parametrize("call, match", [
    (lambda g: g.linear(bf16(4, 8), bf16(8, 16)), r"looks transposed: nn.Linear stores weight as \[out_features"),
    (lambda g: g.linear(bf16(4, 8), bf16(16, 9)), r"`weight` \(16, 9\) must be \[N, K=8\]"),
    (lambda g: g.linear(bf16(4, 8), bf16(2, 16, 8)), r"`weight` must be a 2-D tensor \[N, K\]"),
    (lambda g: g.linear("x", bf16(16, 8)), r"`x` must be a tensor \[..., K\]"),
    (lambda g: g.linear(bf16(4, 8), bf16(16, 8), bias=bf16(8)), r"`bias` must be a tensor of shape \(16,\)"),
    (lambda g: g.linear(bf16(4, 8), bf16(15, 8), activation="swiglu"), r"gated activation \('swiglu'\) needs 2N"),
    (lambda g: g.linear(bf16(4, 8), bf16(16, 8), bias=bf16(8), activation="geglu"),
     r"`bias` must be a tensor of shape \(16,\)"),   # gated: the bias spans the gate and up halves
])
def test_linear_rejects_bad_arguments_by_name(call, match, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    import generated.gemm as g

    with pytest.raises((ValueError, TypeError), match=match):
        call(g)


def test_attention_rejects_an_empty_kv_cache():
    import generated.attention as att

    q = bf16(1, 2, 1, 64)
    with pytest.raises(ValueError, match="`k` is empty .*an empty KV cache has no keys"):
        att.attention(q, bf16(1, 2, 0, 64), bf16(1, 2, 0, 64))


def test_a_growing_kv_cache_skips_the_class_checks_but_not_the_length_checks(monkeypatch):
    """A decode step against a longer cache is a new shape class that reuses its class's checked arguments (no
    re-check of what cannot change), while what a length can break is still refused by name."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    import generated.attention as att

    q = bf16(1, 4, 1, 64)
    first = att._route(q, bf16(1, 2, 100, 64), bf16(1, 2, 100, 64), "window", None, (8, 0), None, None, False)
    checked = dict(att._CHECKED)
    grown = att._route(q, bf16(1, 2, 101, 64), bf16(1, 2, 101, 64), "window", None, (8, 0), None, None, False)
    assert grown is not first and grown.args == first.args == (0.125, "window", 8, 0, 0.0)
    assert att._CHECKED == checked   # the class was checked once
    with pytest.raises(ValueError, match=r"`k` \(1, 2, 102, 64\) and `v` \(1, 2, 103, 64\) must have the same shape"):
        att.attention(q, bf16(1, 2, 102, 64), bf16(1, 2, 103, 64), mod="window", window=(8, 0))
    with pytest.raises(ValueError, match="`k` is empty"):
        att.attention(q, bf16(1, 2, 0, 64), bf16(1, 2, 0, 64), mod="window", window=(8, 0))
    with pytest.raises(ValueError, match="`q` is empty"):
        att.attention(bf16(1, 4, 0, 64), bf16(1, 2, 101, 64), bf16(1, 2, 101, 64), mod="window", window=(8, 0))
    assert att.decide(q, bf16(1, 2, 104, 64), bf16(1, 2, 104, 64), mod="window") == "triton"



def _graph_ops(fn, *args):
    """The call targets of the FX graph torch.compile(fullgraph=True) captures for fn(*args)."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=backend, fullgraph=True)(*args)
    return " ".join(str(n.target) for gm in graphs for n in gm.graph.nodes)


def test_under_compile_a_torch_pick_traces_torch_code_and_ours_stays_one_custom_op(monkeypatch):
    """Where the table picks torch, the compiled graph holds the torch ops themselves (Inductor fuses them as it would
    the user's own code); where it picks our variant, one gen:: custom op."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    import generated.attention as att
    import generated.gemm as g

    x, w, bias = bf16(2, 8, 64), bf16(48, 64), bf16(48)
    monkeypatch.setattr(g, "_traced_rule", lambda *a: "torch")
    ops = _graph_ops(lambda x: g.linear(x, w, bias, "silu"), x)
    assert "gen.linear" not in ops and "<built-in function linear>" in ops and "silu" in ops, ops   # F.linear
    monkeypatch.setattr(g, "_traced_rule", lambda *a: "op")
    # the op's body is not what is tested here (and the kernels may not be interpretable in this process)
    monkeypatch.setattr(g, "_execute", lambda r, a, b, bias, residual=None, rms_eps=None, rope=None: torch.zeros(a.shape[0], b.shape[1], dtype=a.dtype))
    assert "gen.linear" in _graph_ops(lambda x: g.linear(x, w, bias, "silu"), x)
    q, k = bf16(1, 4, 16, 64), bf16(1, 2, 16, 64)
    monkeypatch.setattr(att, "_traced_rule", lambda *a: "sdpa")
    ops = _graph_ops(lambda q, k: att.attention(q, k, k, mod="causal"), q, k)
    assert "gen.attention" not in ops and "scaled_dot_product_attention" in ops, ops
    monkeypatch.undo()


def test_a_compile_with_cuda_graphs_traces_the_captured_pick(monkeypatch):
    """torch.compile(mode="reduce-overhead") replays its graph without host code, so its trace takes the table's
    picks for captured calls: on the H100 table a decode linear (M 16, Llama-3-8B's O projection) is F.linear traced
    inline for a plain compile (swap-AB does not repay the custom op's dispatch) and our op under CUDA graphs (swap-AB
    is 10% faster on the GPU). The backend's config says which (Inductor's triton.cudagraphs)."""
    import generated.gemm as g
    from generated._runtime.traced import compiled_with_cuda_graphs

    monkeypatch.setattr(g._RT, "device", lambda index: ("sm90", 132))   # the H100 table (the package's first)
    monkeypatch.setattr(g, "_TRACED_DEVICES", ("cuda", "meta"))
    monkeypatch.setattr(g, "_execute", lambda r, a, b, bias, residual=None, rms_eps=None, rope=None: torch.zeros(a.shape[0], b.shape[1], dtype=a.dtype))
    x, w = (torch.empty(*s, dtype=torch.bfloat16, device="meta") for s in ((16, 4096), (4096, 4096)))
    bucket = g.bucket_of(x, w.t(), None, "none", torch.bfloat16)
    assert g._RT.pick("sm90", bucket) == "torch" and g._RT.pick("sm90", bucket, captured=True) == "sm90_swap16"
    seen = []

    def backend_with(cudagraphs):
        def backend(gm, example_inputs):
            seen.append(" ".join(str(n.target) for n in gm.graph.nodes))
            return gm.forward
        backend.config = {"triton.cudagraphs": cudagraphs}
        return backend

    @torch.compiler.assume_constant_result
    def mode_seen() -> bool:
        return compiled_with_cuda_graphs()

    for cudagraphs in (False, True):
        torch._dynamo.reset()
        torch.compile(lambda x: g.linear(x, w) * mode_seen(), backend=backend_with(cudagraphs), fullgraph=True)(x)
    plain, graphs = seen
    assert "gen.linear" not in plain and "<built-in function linear>" in plain, plain
    assert "gen.linear" in graphs, graphs
    assert not compiled_with_cuda_graphs()   # not tracing


def test_a_traced_rope_call_is_decided_by_the_traced_table(monkeypatch):
    """Under torch.compile a RoPE call is decided as any other (the traced table): the custom op where the suite timed
    our RoPE epilogue faster (the H100 table: Llama-3-8B's QKV at M 2048, also with RMSNorm rows, whose unmeasured
    bucket takes RoPE's), torch's math (F.linear, then the rotation, for Inductor to fuse) where the table picks
    torch (M 1) or never timed RoPE after this activation (silu: no such suite row)."""
    import generated.gemm as g

    monkeypatch.setattr(g._RT, "device", lambda index: ("sm90", 132))   # the H100 table (the package's first)
    monkeypatch.setattr(g, "_TRACED_DEVICES", ("cuda", "meta"))
    meta = lambda *s: torch.empty(*s, dtype=torch.bfloat16, device="meta")  # noqa: E731
    w = meta(6144, 4096)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(" ".join(str(n.target) for n in gm.graph.nodes))
        return gm.forward
    for m, activation, rms_eps in ((2048, None, None), (2048, None, 1e-5), (1, None, None), (2048, "silu", None)):
        torch._dynamo.reset()
        fn = torch.compile(lambda x, c, s: g.linear(x, w, activation=activation, rms_eps=rms_eps, rope=(c, s),
                                                    rope_columns=5120), backend=backend, fullgraph=True)
        fn(meta(m, 4096), meta(m, 128), meta(m, 128))
    ours, ours_rms, decode, unmeasured = graphs
    assert "gen.linear" in ours and "gen.linear" in ours_rms, (ours, ours_rms)
    for graph in (decode, unmeasured):
        assert "gen.linear" not in graph and "<built-in function linear>" in graph, graph


def test_trace_time_decisions_match_the_per_call_ones_and_refuse_what_they_cannot_decide(monkeypatch):
    import generated.attention as att
    import generated.gemm as g

    assert g._traced_provider(bf16(4, 8), bf16(8, 4), None, "none", torch.bfloat16) == "op"        # CPU tensors
    assert att._traced_provider(bf16(1, 2, 8, 64), bf16(1, 2, 8, 64), "causal", False) == "op"
    meta = lambda *s: torch.empty(*s, dtype=torch.bfloat16, device="meta")  # noqa: E731
    assert att._traced_provider(meta(1, 2, 8, 64), meta(1, 2, 8, 64), "softcap", False) == "op"  # SDPA cannot
    monkeypatch.setattr(g._RT, "device", lambda index: ("sm90", 132))   # as on an H200
    x, w = torch.empty(16, 4096, dtype=torch.bfloat16), torch.empty(4096, 4096, dtype=torch.bfloat16)
    per_call = g._RT.pick("sm90", g.bucket_of(x, w.t(), w[0], "silu", torch.bfloat16))
    verdict = "torch" if per_call == "torch" else "op"
    assert g._table_verdict(16, 4096, 4096, "torch.bfloat16", "torch.bfloat16", True, "silu", "nk", False, False, 0) == verdict

    def branch(t):   # Dynamo takes _table_verdict's answer as a constant: no graph break, the branch is resolved
        v = g._table_verdict(16, 4096, 4096, "torch.bfloat16", "torch.bfloat16", True, "silu", "nk", False, False, 0)
        return t + 1 if v == verdict else t - 1
    torch._dynamo.reset()
    assert torch.equal(torch.compile(branch, backend="aot_eager", fullgraph=True)(torch.zeros(2)), torch.ones(2))


def _guards_and_ops(fn, *calls) -> tuple:
    """(the guard tree's text, the FX graph's calls and keyword arguments without dead code) of the last graph
    torch.compile(fn, fullgraph=True) makes over calls (argument tuples) in turn. (The general path's checks leave
    views Inductor drops: x.reshape, weight.t().)"""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    graphs = []

    def backend(gm, example_inputs):
        gm.graph.eliminate_dead_code()   # keyword arguments left at a default (None, False) are not told apart,
        graphs.append(" ".join(   # nor how many size symbols the inputs take (two guarded equal, or one)
            f"{n.target}{sorted((k, str(v)) for k, v in n.kwargs.items() if v not in (None, False))}"
            for n in gm.graph.nodes if not re.fullmatch(r"s\d+", str(n.target))))
        return gm.forward
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=backend, fullgraph=True)
    for args in calls:
        compiled(*args)
    return str(_debug_get_cache_entry_list(fn.__code__)[0].guard_manager), graphs[-1]


def _static_cases():
    """(name, fn, args, ...) of traced calls with static sizes on meta tensors (one argument tuple a call; the last
    call's graph is the one tested): linear and gemm routed to torch and to the op, attention decode and prefill routed to SDPA, to the op (a score mod, the LSE, a window), GQA and training."""
    meta = lambda *s, grad=False: torch.empty(*s, dtype=torch.bfloat16, device="meta", requires_grad=grad)  # noqa: E731
    import generated.attention as att
    import generated.gemm as g

    w, wide = meta(4096, 4096), meta(14336, 4096)
    yield "linear decode", lambda x: g.linear(x, w), (meta(8, 1, 4096),)
    yield "linear silu", lambda x: g.linear(x, wide, None, "silu"), (meta(16, 4096),)
    yield "linear large M", lambda x: g.linear(x, w), (meta(8192, 4096),)
    yield "linear bias", lambda x: g.linear(x, w, meta(4096)), (meta(64, 4096),)
    trained = meta(4096, 4096, grad=True)
    yield "linear training", lambda x: g.linear(x, trained), (meta(64, 4096),)
    yield "gemm", lambda a: g.gemm(a, meta(4096, 4096), None, "relu"), (meta(8192, 4096),)
    yield "gemm fp32 out", lambda a: g.gemm(a, w.t(), None, None, torch.float32), (meta(64, 4096),)
    for mod in ("none", "causal", "softcap"):
        call = lambda q, k, mod=mod: att.attention(q, k, k, mod=mod)  # noqa: E731
        yield f"decode {mod}", call, (meta(8, 32, 1, 128), meta(8, 8, 8192, 128))
        yield f"prefill {mod}", call, (meta(2, 32, 4096, 128), meta(2, 8, 4096, 128))
    yield "prefill lse", lambda q: att.attention(q, q, q, mod="causal", return_lse=True)[0], (meta(2, 8, 1024, 64),)
    yield "prefill scale", lambda q: att.attention(q, q, q, scale=0.3), (meta(2, 8, 1024, 64),)
    yield "window", lambda q: att.attention(q, q, q, mod="window", window=(64, 0)), (meta(2, 8, 1024, 64),)
    yield "training", lambda q: att.attention(q, q, q, mod="causal"), (meta(2, 8, 1024, 64, grad=True),)
    yield "lq < lk", lambda q, k: att.attention(q, k, k, mod="causal"), (meta(2, 8, 4, 64), meta(2, 8, 512, 64))
    # automatic dynamic shapes: the second call makes M (linear) or B (a decode step on a static cache) symbolic
    yield "linear symbolic M", lambda x: g.linear(x, w), (meta(8, 1, 4096),), (meta(64, 1, 4096),)
    yield "decode symbolic B", lambda q, k: att.attention(q, k, k, mod="causal"), *(
        (meta(b, 32, 1, 128), meta(b, 8, 8192, 128)) for b in (8, 64))   # (the cache length stays: static)
    yield "decode growing cache", lambda q, k: att.attention(q, k, k, mod="causal"), *(
        (meta(8, 32, 1, 128), meta(8, 8, lk, 128)) for lk in (1024, 2048))
    yield "decode growing cache symbolic B", lambda q, k: att.attention(q, k, k, mod="causal"), *(
        (meta(b, 32, 1, 128), meta(b, 8, lk, 128)) for b, lk in ((8, 1024), (64, 2048)))


@pytest.mark.parametrize("case", [c[0] for c in _static_cases()])
def test_a_traced_call_of_static_sizes_is_one_constant_verdict_with_the_general_paths_graph(case, monkeypatch):
    """Dynamo guards on every global a traced function reads; with static sizes (but for GEMM's M and attention's
    batch, which the decision leaves free or splits with one shape guard) the ops decide through one constant
    verdict (_linear_verdict, _gemm_verdict, _attention_verdict) instead of tracing their checks and decisions, so
    the guard tree holds none of the general path's helpers. The graph is the one the general path traces."""
    import generated.attention as att
    import generated.gemm as g

    for m in (g, att):
        monkeypatch.setattr(m._RT, "device", lambda index: ("sm90", 132))   # the H200 tables
        monkeypatch.setattr(m, "_TRACED_DEVICES", ("cuda", "meta"))
    _, fn, *calls = next(c for c in _static_cases() if c[0] == case)
    guards, ops = _guards_and_ops(fn, *calls)
    op = g if ("linear" in case or "gemm" in case) else att
    verdict = {g: "_gemm_verdict" if "gemm" in case else "_linear_verdict", att: "_attention_verdict"}[op]
    general = ("_check", "_traced_provider", "_traced_linear", "_arguments", "_sdpa_plan", "_sdpa_run", "needs_grad")
    assert f".{verdict}" in guards and not [h for h in general if f".{h}" in guards], guards
    for name in ("_linear_verdict", "_gemm_verdict", "_attention_verdict"):   # the general path only
        if hasattr(op, name):
            monkeypatch.setattr(op, name, lambda *a: None)
    assert _guards_and_ops(fn, *calls)[1] == ops


def test_a_traced_call_with_bad_arguments_raises_the_eager_error(monkeypatch):
    """The constant verdict does not decide a call its checks refuse: the general traced path raises the same error
    an eager call raises (Dynamo falls back to running the frame outside fullgraph)."""
    import generated.attention as att
    import generated.gemm as g

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    torch._dynamo.reset()
    with pytest.raises(ValueError, match="it looks transposed"):
        torch.compile(lambda x, w: g.linear(x, w), backend="eager")(bf16(2, 64), bf16(64, 48))
    with pytest.raises(ValueError, match="head dim D=96 is not built"):
        torch.compile(lambda q: att.attention(q, q, q), backend="eager")(bf16(1, 2, 8, 96))


def test_a_symbolic_size_traces_torch_only_where_every_size_picks_torch(monkeypatch):
    """Under torch.compile with dynamic shapes (Dynamo's default after a size changes), M is symbolic: the torch code
    is traced only when the table picks torch at every M for the call's N, K and epilogue; else the op decides per
    call."""
    import generated.attention as att
    import generated.gemm as g
    from gen.runtime.dispatch import BucketTable
    from gen.runtime.shapes import attention_bucket, gemm_bucket

    monkeypatch.setattr(g._RT, "device", lambda index: ("sm90", 132))
    monkeypatch.setattr(att._RT, "device", lambda index: ("sm90", 132))
    cat_g, _ = gemm_bucket(1, 4096, 4096, "torch.bfloat16", "torch.bfloat16", False, "none", "nk")
    mixed = {(cat_g, (4, 12, 12)): "torch", (cat_g, (13, 12, 12)): "sm90", (cat_g, (4, 9, 9)): "torch"}
    monkeypatch.setitem(g._RT.traced_tables, "sm90", BucketTable(mixed, "torch"))
    verdict = lambda m, n, k: g._table_verdict(m, n, k, "torch.bfloat16", "torch.bfloat16", False, "none", "nk", False, False, 0)  # noqa: E731
    assert verdict(None, 4096, 4096) == "op"            # sm90 wins at M=8192
    assert verdict(16, 4096, 4096) == "torch"
    assert verdict(None, 512, 512) == "torch"           # every M of that N, K goes to torch
    below = lambda n, k: g._torch_below(n, k, "torch.bfloat16", "torch.bfloat16", False, "none", "nk", False, False, 0)  # noqa: E731
    assert below(4096, 4096) == 11                      # M < 2048 traces torch (bin 11 is 2 bins from sm90's 13)
    assert below(512, 512) == 41                        # never ours: torch at every M

    # traced with a symbolic M: one guard at M < 2048 splits torch code from the op
    monkeypatch.setattr(g, "_TRACED_DEVICES", ("cuda", "meta"))
    monkeypatch.setattr(g, "_execute", lambda r, a, b, bias, residual=None, rms_eps=None, rope=None: torch.zeros(a.shape[0], b.shape[1], dtype=a.dtype))
    w = torch.empty(4096, 4096, dtype=torch.bfloat16, device="meta")
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(" ".join(str(n.target) for n in gm.graph.nodes))
        return gm.forward
    torch._dynamo.reset()
    fn = torch.compile(lambda x: g.linear(x, w), backend=backend, fullgraph=True)   # automatic dynamic shapes
    for m in (16, 32, 64, 4096, 8192):
        fn(torch.empty(m, 4096, dtype=torch.bfloat16, device="meta"))
    # M=16 static; M=32 makes M symbolic (below the guard: torch); 4096 fails the guard (the op); 64, 8192 reuse
    assert len(graphs) == 3, graphs
    # (below the guard the graph holds F.linear itself, as the user's own code would)
    assert all("gen.linear" not in gr and "<built-in function linear>" in gr for gr in graphs[:2]), graphs
    assert "gen.linear" in graphs[2], graphs
    cat_a, _ = attention_bucket(8, 32, 8, 1, 8192, 128, "causal")
    monkeypatch.setitem(att._RT.traced_tables, "sm90", BucketTable({(cat_a, (0, 13, 8)): "sdpa-flash"}, "sdpa"))
    assert att._table_verdict(None, 32, 8, 1, None, 128, "causal", 0) == "sdpa"
    monkeypatch.setitem(att._RT.traced_tables, "sm90", BucketTable({(cat_a, (0, 13, 8)): "sm90"}, "sdpa"))
    assert att._table_verdict(None, 32, 8, 1, None, 128, "causal", 0) == "op"
    assert att._table_verdict(8, 32, 8, 1, 64, 128, "causal", 0) == "sdpa"   # far from the sm90 bucket


def test_a_symbolic_length_traces_sdpa_below_the_first_length_our_kernels_win(monkeypatch):
    """Attention under automatic dynamic shapes: a prefill length (Lq == Lk, one symbol) is split by one guard, SDPA
    traced below the first length bin the table gives to our kernels, the op above it; the guard is on the length
    alone, so B stays free. A decode step's cache length, once symbolic (it changed), is split the same way over the
    varying table (no provider that sets up per new length, as cuDNN does): its SDPA backend traced below the first
    length bin where our kernel is picked, the op (routing each length itself) above it."""
    import generated.attention as att
    from gen.runtime.dispatch import BucketTable
    from gen.runtime.shapes import attention_bucket

    monkeypatch.setattr(att._RT, "device", lambda index: ("sm90", 132))
    monkeypatch.setattr(att, "_TRACED_DEVICES", ("cuda", "meta"))
    cat, _ = attention_bucket(2, 4, 4, 128, 128, 64, "causal")
    table = {(cat, (7, 7, 3)): "sdpa-cudnn", (cat, (13, 13, 3)): "sm90", (cat, (0, 7, 3)): "sdpa-flash",
             (cat, (0, 13, 3)): "sm90"}
    monkeypatch.setitem(att._RT.traced_tables, "sm90", BucketTable(table, "sdpa"))
    assert att._sdpa_below(None, 4, 4, None, 64, "causal", 0) == 12      # prefill: Lq and Lk bins move together
    assert att._sdpa_below(None, 4, 4, 1, 64, "causal", 0) == 11         # decode at Lq=1

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(" ".join(str(n.target) for n in gm.graph.nodes))
        return gm.forward
    meta = lambda *s: torch.empty(*s, dtype=torch.bfloat16, device="meta")  # noqa: E731
    torch._dynamo.reset()
    fn = torch.compile(lambda q, k: att.attention(q, k, k, mod="causal"), backend=backend, fullgraph=True)
    for b, length in ((2, 128), (3, 256), (2, 512), (2, 8192)):
        fn(meta(b, 4, length, 64), meta(b, 4, length, 64))
    # static first; then symbolic B and L below the guard (SDPA, reused for L=512); then L=8192 past it (the op)
    assert len(graphs) == 3, graphs
    assert all("scaled_dot_product_attention" in gr and "gen.attention" not in gr for gr in graphs[:2]), graphs
    assert "gen.attention" in graphs[2], graphs

    def decode_graphs(varying: dict) -> list:
        """The graphs of a compiled decode step (Lq = 1) over a cache growing 512 -> 1024 -> 4096 -> 8192."""
        monkeypatch.setitem(att._RT.traced_varying_tables, "sm90", BucketTable(varying, "sdpa-flash"))
        graphs.clear()
        torch._dynamo.reset()
        step = torch.compile(lambda q, k: att.attention(q, k, k, mod="causal"), backend=backend, fullgraph=True)
        for lk in (512, 1024, 4096, 8192):
            step(meta(2, 4, 1, 64), meta(2, 4, lk, 64))
        return list(graphs)

    # static first (the table's SDPA pick traced); then one symbolic graph for every later length: flash, traced
    # inside sdpa_kernel (the varying table's pick everywhere: it never sets up per length as cuDNN does)
    found = decode_graphs({(cat, (0, 9, 3)): "sdpa-flash"})
    assert len(found) == 2 and all("gen.attention" not in gr for gr in found), found
    assert "scaled_dot_product_attention" in found[1] and "_sdpa_kernel" in found[1], found
    # the varying table gives Lk >= 2**12 to our split-KV kernel: flash traced below one guard on Lk, the op past it
    found = decode_graphs({(cat, (0, 9, 3)): "sdpa-flash", (cat, (0, 13, 3)): "triton_splitkv"})
    assert att._varying_sdpa_below(2, 4, 4, 1, 64, "causal", "sdpa-flash", 0) == 12   # nearest: bin 12 is 1 from 13
    assert len(found) == 3 and "gen.attention" not in found[1] and "gen.attention" in found[2], found
    # our kernel at the shortest caches already: the op at every symbolic length
    found = decode_graphs({(cat, (0, 0, 3)): "triton_splitkv", (cat, (0, 13, 3)): "sdpa-flash"})
    assert len(found) == 2 and "gen.attention" in found[1], found

    # B symbolic too (a server's batches): flash everywhere below B * Hq = 2**6 (B < 16 at Hq 4), where the table
    # never leaves it; larger batches, which pick our kernel from Lk 2**12 on, get the Lk split
    monkeypatch.setitem(att._RT.traced_varying_tables, "sm90", BucketTable(
        {(cat, (0, 9, 3)): "sdpa-flash", (cat, (0, 13, 3)): "sdpa-flash", (cat, (0, 13, 8)): "triton_splitkv"},
        "sdpa-flash"))
    assert att._varying_sdpa_rows_below(4, 4, 1, 64, "causal", "sdpa-flash", 0) == 6   # nearest: bin 6 is 2 from 8
    graphs.clear()
    torch._dynamo.reset()
    step = torch.compile(lambda q, k: att.attention(q, k, k, mod="causal"), backend=backend, fullgraph=True)
    for b, lk in ((2, 512), (3, 1024), (8, 8192), (4, 4096), (64, 8192)):
        step(meta(b, 4, 1, 64), meta(b, 4, lk, 64))
    # static; symbolic B and Lk below the B guard (flash, reused by B 8 Lk 8192 and B 4 Lk 4096); B 64 past it: the op
    assert len(graphs) == 3 and all("gen.attention" not in gr for gr in graphs[:2]), graphs
    assert "gen.attention" in graphs[2], graphs


def test_linear_torch_route_is_f_linear_and_keeps_the_exact_fp32_path(monkeypatch):
    """The eager torch route of `linear` calls F.linear directly (no weight.t() view, no reshape); an fp32 output of
    16-bit inputs still goes through torch_gemm's fp32 product, and the route is cached per shape class of x."""
    import torch.nn.functional as F

    import generated.gemm as g

    monkeypatch.setenv("TRITON_INTERPRET", "1")                 # CPU tensors pass the checks
    monkeypatch.setattr(g, "_decide", lambda *a, **kw: "torch")
    monkeypatch.setattr(g, "direct_call_ok", lambda *t: True)
    monkeypatch.setattr(g, "_ROUTES", {})
    monkeypatch.setattr(g, "_LINEAR_ROUTES", {})
    calls = []
    real = g.torch_gemm
    monkeypatch.setattr(g, "torch_gemm", lambda *a: calls.append(a) or real(*a))
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 64, generator=gen).to(torch.bfloat16)
    w = torch.randn(48, 64, generator=gen).to(torch.bfloat16)
    bias = torch.randn(48, generator=gen)                       # fp32 bias: cast to x's dtype, as torch_gemm does
    out = g.linear(x, w, bias, "silu")
    assert out.shape == (2, 3, 48) and not calls                # F.linear, not the [K, N] product of torch_gemm
    assert torch.equal(out, F.silu(F.linear(x, w, bias.to(torch.bfloat16))))
    assert torch.equal(g.linear(x, w, bias, "silu"), out)
    assert len(g._LINEAR_ROUTES) == 1                           # one cached route for the class
    out32 = g.linear(x, w, None, None, torch.float32)
    assert len(calls) == 1 and out32.dtype == torch.float32     # not F.linear: the fp32 product
    ref = x.double().reshape(-1, 64) @ w.double().t()
    assert torch.allclose(out32.reshape(-1, 48).double(), ref, rtol=1e-5, atol=1e-5)


def test_gemm_torch_route_is_torch_matmul_from_the_cached_route(monkeypatch):
    """The eager torch route of `gemm` (output in the input dtype) runs a @ b / addmm and the activation before any
    other check, as linear runs F.linear; a second call of the class finds its route in one lookup (the key gemm
    reads inline is _route's), and an fp32 output still takes torch_gemm's fp32 product."""
    import generated.gemm as g

    monkeypatch.setenv("TRITON_INTERPRET", "1")                 # CPU tensors pass the checks
    monkeypatch.setattr(g, "_decide", lambda *a, **kw: "torch")
    monkeypatch.setattr(g, "_ROUTES", {})
    monkeypatch.setattr(g, "direct_call_ok", lambda *t: pytest.fail("the torch route asked for the direct path"))
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(24, 64, generator=gen).to(torch.bfloat16)
    w = torch.randn(48, 64, generator=gen).to(torch.bfloat16)
    bias = torch.randn(48, generator=gen)                       # fp32 bias: cast to a's dtype, as torch_gemm does
    out = g.gemm(a, w.t(), bias, "silu")
    assert torch.equal(out, torch.nn.functional.silu(torch.addmm(bias.to(torch.bfloat16), a, w.t())))
    route = g._route
    monkeypatch.setattr(g, "_route", lambda *args, **kw: pytest.fail("a known class went through _route"))
    assert torch.equal(g.gemm(a, w.t(), bias, "silu"), out) and len(g._ROUTES) == 1
    monkeypatch.setattr(g, "_route", route)
    monkeypatch.setattr(g, "direct_call_ok", lambda *t: True)
    out32 = g.gemm(a, w.t(), None, None, torch.float32)
    assert out32.dtype == torch.float32
    assert torch.allclose(out32.double(), a.double() @ w.double().t(), rtol=1e-5, atol=1e-5)


def test_a_call_captured_into_a_cuda_graph_takes_the_pick_by_gpu_time(monkeypatch):
    """Where the table's picks differ (call time eager, GPU time captured), every entry point (gemm, linear, the
    registered op, attention) runs the call pick outside capture and the captured pick during capture, whose route
    is built on the first captured call and cached beside the class's; where they agree capture is never asked."""
    import generated.attention as att
    import generated.gemm as g

    monkeypatch.setenv("TRITON_INTERPRET", "1")                 # CPU tensors pass the checks
    capturing = [False]
    ran = []
    for m, eager, captured in ((g, "torch", "triton"), (att, "sdpa", "triton")):
        monkeypatch.setattr(m, "_ROUTES", {})
        monkeypatch.setattr(m, "_decide", lambda *a, captured=False, _e=eager, _c=captured, **kw: _c if captured else _e)
        monkeypatch.setattr(m, "is_capturing", lambda: capturing[0])
        monkeypatch.setattr(m, "direct_call_ok", lambda *t: True)
    monkeypatch.setattr(g, "_LINEAR_ROUTES", {})
    # our kernels need the interpreter set before import (a subprocess): the route is what is checked here
    monkeypatch.setattr(g, "_execute", lambda r, a, b, bias, residual=None, rms_eps=None, rope=None: ran.append(r.provider) or a.new_zeros(a.shape[0], b.shape[1]))
    monkeypatch.setattr(att, "_execute", lambda r, q, *a: ran.append(r.provider) or (torch.zeros_like(q), None))
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(24, 64, generator=gen).to(torch.bfloat16)
    w = torch.randn(48, 64, generator=gen).to(torch.bfloat16)
    q, k, v = (torch.randn(1, 4, n, 64, generator=gen).to(torch.bfloat16) for n in (8, 16, 16))

    calls = {"gemm": lambda: g.gemm(a, w.t()), "linear": lambda: g.linear(a, w),
             "op": lambda: g._inference_op(a, w.t(), None, "none", torch.bfloat16),
             "attention": lambda: att.attention(q, k, v, mod="none")}
    for call in calls.values():
        call()
    assert ran == ["torch"]        # the op's torch route; gemm, linear and SDPA call torch before _execute
    capturing[0] = True
    for name, call in calls.items():
        ran.clear()
        call()
        assert ran == ["triton"], name
    r = g._ROUTES[(None, g._class_key(a, w.t(), None, "none", torch.bfloat16))]
    assert r.provider == "torch" and r.graph.provider == "triton" and r.graph.graph is None
    assert g.decide(a, w.t()) == "torch" and g.decide(a, w.t(), captured=True) == "triton"
    assert att.decide(q, k, v, mod="none", captured=True) == "triton"

    monkeypatch.setattr(g, "_ROUTES", {})
    monkeypatch.setattr(g, "_decide", lambda *a, **kw: "torch")   # one pick for both: capture is never asked
    monkeypatch.setattr(g, "is_capturing", lambda: pytest.fail("asked whether capturing where the picks agree"))
    g.gemm(a, w.t())
    assert g._route(a, w.t(), None, "none", torch.bfloat16).graph is None


def test_the_eager_sdpa_route_is_sdpa_itself_and_a_named_backend_keeps_its_context(monkeypatch):
    """A call routed to SDPA's own choice runs F.scaled_dot_product_attention with the planned arguments and nothing
    around it (same result as torch_sdpa): no direct-path check, and a second call of the class finds its route in one
    lookup (the key attention reads inline is _route's); a named backend still enters its sdpa_kernel context;
    return_lse never takes the SDPA route."""
    import torch.nn.functional as F

    import generated.attention as att

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(att, "direct_call_ok", lambda *t: pytest.fail("the SDPA route asked for the direct path"))
    monkeypatch.setattr(att, "_ROUTES", {})
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 4, n, 64, generator=gen) for n in (8, 16, 16))
    q, k, v = q.to(torch.bfloat16), k.to(torch.bfloat16), v.to(torch.bfloat16)
    calls = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(att.F, "scaled_dot_product_attention", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
    monkeypatch.setattr(att, "_decide", lambda *a, **kw: "sdpa")
    monkeypatch.setattr(att, "_execute", lambda *a: pytest.fail("the SDPA route went through _execute"))
    out = att.attention(q, k, v, mod="none", scale=0.3)
    assert calls == [{"scale": 0.3}] and torch.equal(out, att.torch_sdpa("sdpa", q, k, v, 0.3, "none"))
    route = att._route
    monkeypatch.setattr(att, "_route", lambda *args, **kw: pytest.fail("a known class went through _route"))
    assert torch.equal(att.attention(q, k, v, mod="none", scale=0.3), out) and len(att._ROUTES) == 1
    monkeypatch.setattr(att, "_route", route)
    monkeypatch.setattr(att, "direct_call_ok", lambda *t: True)
    monkeypatch.setattr(att, "_ROUTES", {})
    monkeypatch.setattr(att, "_decide", lambda *a, **kw: "sdpa-efficient")
    entered = []
    monkeypatch.setattr(att, "_execute", lambda r, *a: entered.append(r.sdpa[0]) or (q, None))
    att.attention(q, k, v, mod="none", scale=0.3)
    assert entered and entered[0] is not None   # a named backend: its context, through _execute


@pytest.mark.parametrize("provider", ["sdpa-cudnn", "sdpa-flash", "sdpa-efficient"])
def test_a_named_sdpa_backend_runs_alone_and_the_switches_are_restored(provider, monkeypatch):
    """The eager SDPA route flips SDPA's backend switches itself (sdpa_kernel costs ~26 us a call): during the call
    only the chosen backend is on, afterwards every switch is as it was, also when SDPA raises."""
    import generated.attention as A

    assert A._SWITCHES, "this torch's SDPA switches were not found: every named-backend call pays sdpa_kernel"
    state = lambda: {b: get() for get, _, b in A._SWITCHES}   # noqa: E731
    before = state()
    seen = []

    def fake_sdpa(q, k, v, **kwargs):
        seen.append(state())
        return q

    monkeypatch.setattr(A.F, "scaled_dot_product_attention", fake_sdpa)
    backend = A.SDPA_BACKENDS[provider]
    q = torch.zeros(1, 1, 4, 8)
    assert A._sdpa_run((backend, {}), q, q, q) is q
    assert seen == [{b: b == backend for b in before}] and state() == before

    def failing_sdpa(q, k, v, **kwargs):
        raise RuntimeError("no kernel")

    monkeypatch.setattr(A.F, "scaled_dot_product_attention", failing_sdpa)
    with pytest.raises(RuntimeError, match="no kernel"):
        A._sdpa_run((backend, {}), q, q, q)
    assert state() == before


def test_training_calls_sdpa_expresses_run_sdpa_and_the_rest_keep_our_op(monkeypatch):
    """An eager call whose inputs require grad: with no mask or a causal one, SDPA's own call (torch's autograd
    records SDPA's backward: same output and gradients as calling SDPA), whatever the forward table picks; a mod SDPA
    cannot express, or a call asking for the LSE, goes through our op and its backward. Under torch.compile the
    graph holds SDPA for the same calls."""
    import torch.nn.functional as F

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    import generated.attention as att

    monkeypatch.setattr(att, "_TRAINING_DEVICES", ("cpu",))
    monkeypatch.setattr(att, "_ROUTES", {})
    monkeypatch.setattr(att, "_decide", lambda *a, **kw: "triton")   # the forward table picks ours
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, 24, 64, generator=gen).bfloat16().requires_grad_() for _ in range(3))
    g = torch.randn(2, 4, 24, 64, generator=gen).bfloat16()
    for mod in ("none", "causal"):
        out = att.attention(q, k, v, mod=mod)
        out.backward(g)
        got = [t.grad for t in (q, k, v)]
        for t in (q, k, v):
            t.grad = None
        want = F.scaled_dot_product_attention(q, k, v, is_causal=mod == "causal")
        want.backward(g)
        assert torch.equal(out, want) and all(torch.equal(a, t.grad) for a, t in zip(got, (q, k, v))), mod
        for t in (q, k, v):
            t.grad = None
    ops = []
    monkeypatch.setattr(att, "_op", lambda *a: ops.append(a[4:]) or (a[0] * 1, a[0].new_zeros(a[0].shape[:3])))
    att.attention(q, k, v, mod="softcap")
    att.attention(q, k, v, mod="causal", return_lse=True)
    with torch.no_grad():
        assert att._route(q, k, v, "causal", None, None, None, None, False).train_sdpa is not None
    assert [a[0] for a in ops] == ["softcap", "causal"] and all(a[-1] for a in ops)   # with the LSE for backward
    monkeypatch.setattr(att, "_traced_provider", lambda *a: "op")
    traced = _graph_ops(lambda q, k, v: att.attention(q, k, v, mod="causal"), q, k, v)
    assert "scaled_dot_product_attention" in traced and "gen.attention" not in traced, traced


def _linear_reference(x, w, bias, activation):
    """act(F.linear) in float64 autograd: the math the GEMM ops' gradients must match."""
    import torch.nn.functional as F

    out = F.linear(x, w, bias)
    gate, up = out.chunk(2, dim=-1)
    return {"none": out, "relu": F.relu(out), "silu": F.silu(out), "gelu_tanh": F.gelu(out, approximate="tanh"),
            "swiglu": F.silu(gate) * up, "geglu": F.gelu(gate, approximate="tanh") * up}[activation]


@pytest.mark.parametrize("activation", ["none", "silu", "swiglu"])
def test_gemm_training_calls_run_torch_and_its_autograd(activation, monkeypatch):
    """linear/gemm with inputs that require grad, where the table picks our kernel: the call runs the torch provider
    (autograd records F.linear / addmm), never our kernel, and gives F.linear's gradients; under torch.compile the
    graph holds F.linear, not the custom op. Before, such calls went to the custom op, which had no autograd, and
    loss.backward() failed."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    import generated.gemm as g

    monkeypatch.setattr(g, "_ROUTES", {})
    monkeypatch.setattr(g, "_LINEAR_ROUTES", {})
    monkeypatch.setattr(g, "_decide", lambda *a, **kw: "triton")     # the forward table picks ours
    monkeypatch.setattr(g, "_execute", lambda *a: pytest.fail("a training call reached our kernel"))
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 5, 64, generator=gen).bfloat16().requires_grad_()
    w = torch.randn(48, 64, generator=gen).bfloat16().requires_grad_()
    bias = torch.randn(48, generator=gen).bfloat16().requires_grad_()
    n = 24 if activation == "swiglu" else 48   # gated: w holds the gate and up projections
    grad = torch.randn(2, 5, n, generator=gen).bfloat16()
    for call in (lambda: g.linear(x, w, bias, activation),
                 lambda: g.gemm(x.reshape(-1, 64), w.t(), bias, activation).view(2, 5, n)):
        out = call()
        got = torch.autograd.grad(out, (x, w, bias), grad)
        want_out = _linear_reference(x, w, bias, activation)
        want = torch.autograd.grad(want_out, (x, w, bias), grad)
        assert torch.equal(out, want_out) and all(torch.equal(a, b) for a, b in zip(got, want))
    monkeypatch.setattr(g, "_TRACED_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(g, "_table_verdict", lambda *a: "op")  # compiled inference would take the op here
    traced = _graph_ops(lambda x: g.linear(x, w, bias, activation), x)
    assert "gen.linear" not in traced and "<built-in function linear>" in traced, traced
    monkeypatch.setattr(g, "_execute", lambda r, a, b, bias, residual=None, rms_eps=None, rope=None: torch.zeros(a.shape[0], n, dtype=a.dtype))
    with torch.no_grad():   # the same call at inference: the op
        assert "gen.linear" in _graph_ops(lambda x: g.linear(x, w, bias, activation), x)


@pytest.mark.parametrize("activation", ["none", "relu", "silu", "gelu_tanh", "swiglu", "geglu"])
def test_gemm_custom_ops_differentiate_like_the_math(activation, monkeypatch):
    """torch.ops.gen.linear / gen.gemm called with inputs that require grad (the public functions send those to
    torch first; code that calls the ops itself does not): their registered backward gives the gradients of
    act(x @ W^T + b) in float64, for every activation (the pre-activation recomputed), with fp32 and 16-bit outputs.
    The op's forward is replaced by the torch math here: what is tested is the registered backward."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    import generated.gemm as g

    monkeypatch.setattr(g, "_call", lambda a, b, bias, act, out_dtype, residual=None, rms_eps=None, rope=None:
                        g.torch_gemm(a, b, bias, act, out_dtype, residual, rms_eps, rope))
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(3, 4, 64, generator=gen).bfloat16().requires_grad_()
    w = (torch.randn(40, 64, generator=gen) / 8).bfloat16().requires_grad_()
    bias = torch.randn(40, generator=gen).requires_grad_()        # fp32 bias, as a model may keep it
    n = 20 if activation in ("swiglu", "geglu") else 40   # gated: w holds the gate and up projections' 2 x 20 rows
    for out_dtype in (torch.bfloat16, torch.float32):
        grad = torch.randn(3, 4, n, generator=gen).to(out_dtype)
        x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, bias))
        want = torch.autograd.grad(_linear_reference(x64, w64, b64, activation), (x64, w64, b64), grad.double())
        outs = (torch.ops.gen.linear(x, w, bias, activation, out_dtype),
                torch.ops.gen.gemm(x.reshape(-1, 64), w.t(), bias, activation, out_dtype).view(3, 4, n))
        for out in outs:
            got = torch.autograd.grad(out, (x, w, bias), grad)
            for a, b in zip(got, want):
                assert a.shape == b.shape and a.dtype in (torch.bfloat16, torch.float32)
                err = ((a.double() - b).norm() / b.norm()).item()
                assert err < 2e-2, (activation, out_dtype, err)
    args = (x.detach().reshape(-1, 64).requires_grad_(), w.detach().t().contiguous().requires_grad_(), None,
            activation, torch.bfloat16)
    torch.library.opcheck(torch.ops.gen.gemm.default, args, test_utils=("test_schema", "test_autograd_registration"))


@pytest.mark.parametrize("activation", ["none", "swiglu"])
def test_gemm_ops_differentiate_through_rms_rows(activation, monkeypatch):
    """With rms_eps the gradients reach every column of x through the norm: torch.ops.gen.linear / gen.gemm (their
    registered backward recomputes torch's math under autograd) and the public linear (a training call: torch's own
    math) against float64 autograd of F.linear(rmsnorm(x), w, b), for bf16 and fp32 outputs."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    import generated.gemm as g

    monkeypatch.setattr(g, "_call", lambda a, b, bias, act, out_dtype, residual=None, rms_eps=None, rope=None:
                        g.torch_gemm(a, b, bias, act, out_dtype, residual, rms_eps, rope))
    gen = torch.Generator().manual_seed(9)
    eps, nb = 1e-5, 80 if activation == "swiglu" else 40
    x = (torch.randn(3, 4, 64, generator=gen) * 3).bfloat16().requires_grad_()
    w = (torch.randn(nb, 64, generator=gen) / 8).bfloat16().requires_grad_()
    bias = torch.randn(nb, generator=gen).bfloat16().requires_grad_()
    for out_dtype in (torch.bfloat16, torch.float32):
        grad = torch.randn(3, 4, 40, generator=gen).to(out_dtype)
        x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, bias))
        xn = x64 * (x64.square().mean(-1, keepdim=True) + eps).rsqrt()
        want = torch.autograd.grad(_linear_reference(xn, w64, b64, activation), (x64, w64, b64), grad.double())
        outs = (torch.ops.gen.linear(x, w, bias, activation, out_dtype, None, eps),
                torch.ops.gen.gemm(x.reshape(-1, 64), w.t(), bias, activation, out_dtype, None, eps).view(3, 4, 40),
                g.linear(x, w, bias, activation, out_dtype, rms_eps=eps))
        for out in outs:
            got = torch.autograd.grad(out, (x, w, bias), grad)
            for a, b in zip(got, want):
                err = ((a.double() - b).norm() / b.norm()).item()
                assert a.shape == b.shape and err < 2e-2, (activation, out_dtype, err)


@pytest.mark.parametrize("activation", ["none", "silu"])
def test_gemm_custom_ops_differentiate_through_the_residual(activation, monkeypatch):
    """torch.ops.gen.linear / gen.gemm with a residual that requires grad: the residual's gradient is the output's
    (cast to its dtype), the other inputs' are those of act(x @ W^T + b) + r in float64; the public ops send such
    training calls to torch's own F.linear + add, whose autograd agrees."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    import generated.gemm as g

    monkeypatch.setattr(g, "_call", lambda a, b, bias, act, out_dtype, residual=None, rms_eps=None, rope=None:
                        g.torch_gemm(a, b, bias, act, out_dtype, residual, rms_eps, rope))
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(3, 4, 64, generator=gen).bfloat16().requires_grad_()
    w = (torch.randn(40, 64, generator=gen) / 8).bfloat16().requires_grad_()
    bias = torch.randn(40, generator=gen).bfloat16().requires_grad_()
    for out_dtype in (torch.bfloat16, torch.float32):
        r = torch.randn(3, 4, 40, generator=gen).to(out_dtype).requires_grad_()
        grad = torch.randn(3, 4, 40, generator=gen).to(out_dtype)
        x64, w64, b64, r64 = (t.detach().double().requires_grad_() for t in (x, w, bias, r))
        want = torch.autograd.grad(_linear_reference(x64, w64, b64, activation) + r64, (x64, w64, b64, r64),
                                   grad.double())
        outs = (torch.ops.gen.linear(x, w, bias, activation, out_dtype, r),
                torch.ops.gen.gemm(x.reshape(-1, 64), w.t(), bias, activation, out_dtype,
                                   r.reshape(-1, 40)).view(3, 4, 40),
                g.linear(x, w, bias, activation, out_dtype, residual=r))
        for out in outs:
            got = torch.autograd.grad(out, (x, w, bias, r), grad)
            assert got[3].dtype == out_dtype and torch.equal(got[3], grad)
            for a, b in zip(got, want):
                err = ((a.double() - b).norm() / b.norm()).item()
                assert a.shape == b.shape and err < 2e-2, (activation, out_dtype, err)
    args = (x.detach().reshape(-1, 64).requires_grad_(), w.detach().t().contiguous(), None, activation,
            torch.bfloat16, torch.randn(12, 40).bfloat16().requires_grad_())
    torch.library.opcheck(torch.ops.gen.gemm.default, args, test_utils=("test_schema", "test_autograd_registration"))


def test_calls_without_grad_take_the_registered_forward_without_autograd(monkeypatch):
    """The inference ops (gen::*_inference: the same forward, no autograd kernel, a third of the custom op's host
    time) hold calls no input of which requires grad, in compiled graphs and on the eager dispatcher path; a call
    that needs grad keeps the custom op, which differentiates. Both give the same result, and the inference ops pass
    torch.library's schema and fake-tensor checks."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    import generated.attention as att
    import generated.gemm as g

    monkeypatch.setattr(g, "_call", lambda a, b, bias, act, out_dtype, residual=None, rms_eps=None, rope=None:
                        g.torch_gemm(a, b, bias, act, out_dtype, residual, rms_eps, rope))
    monkeypatch.setattr(g, "_traced_provider", lambda *a: "op")
    x, w = bf16(2, 8, 64), bf16(48, 64)
    ops = _graph_ops(lambda x: g.linear(x, w, None, "relu"), x)
    assert "gen.linear_inference" in ops and "gen.linear.default" not in ops, ops
    wg = w.clone().requires_grad_()
    ops = _graph_ops(lambda x: g.linear(x, wg, None, "relu", torch.float32), x)   # fp32 training: the custom op
    assert "gen.linear.default" in ops and "inference" not in ops, ops
    args = (x, w, None, "relu", torch.float32)
    assert torch.equal(torch.ops.gen.linear_inference(*args), torch.ops.gen.linear(*args))
    for op, op_args in ((torch.ops.gen.linear_inference.default, args),
                        (torch.ops.gen.gemm_inference.default, (x[0], w.t(), bf16(48), "silu", torch.bfloat16))):
        torch.library.opcheck(op, op_args, test_utils=("test_schema", "test_faketensor"))
    monkeypatch.setattr(att, "_traced_provider", lambda *a: "op")
    monkeypatch.setattr(att, "_execute", lambda r, q, k, v, s: (torch.zeros_like(q), q.new_zeros(q.shape[:3]).float()))
    q = bf16(1, 4, 16, 64)
    ops = _graph_ops(lambda q: att.attention(q, q, q, mod="causal"), q)
    assert "gen.attention_inference" in ops and "gen.attention.default" not in ops, ops


_SPLITK_SCRIPT = r'''
import torch
import generated.gemm as g

torch.manual_seed(0)
for m, n, k in ((3, 40, 300), (20, 100, 70)):   # one tile on a 1-SM (CPU) device: 2 K slices; four tiles: no split
    for act in ("silu", "swiglu"):   # swiglu: the slices hold gate and up columns, the reduce kernel gates
        nb = 2 * n if act == "swiglu" else n
        w, bias = torch.randn(nb, k).bfloat16(), torch.randn(nb).bfloat16()
        for b in (w.t(), w.t().contiguous()):
            for _ in range(2):   # the second call reuses the route's plan
                x = torch.randn(m, k).bfloat16()
                out = g.run_provider("triton_splitk", x, b, bias, act)
                z = x.double() @ b.double() + bias.double()
                ref = torch.nn.functional.silu(z) if act == "silu" else torch.nn.functional.silu(z[:, :n]) * z[:, n:]
                assert out.shape == (m, n) and (out.double() - ref).norm() / ref.norm() < 1e-2, (m, n, k, act)
print("OK")
'''


def test_the_split_k_provider_runs_through_its_plan_in_the_interpreter():
    """The portable split-K variant as the op launches it (a plan per shape class, no binder), on CPU tensors in
    Triton's interpreter: a split call (slices and the reduce kernel) and an unsplit one, both weight layouts."""
    env = child_env(TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", _SPLITK_SCRIPT], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=900)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
