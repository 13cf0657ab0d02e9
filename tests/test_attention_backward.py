"""Attention backward on CPU: the portable Triton backward (run in Triton's interpreter, in a child process: it must
be enabled before triton is imported) through autograd of the public op, against float64 autograd of the same math,
for every mod, on decode, GQA, Lq < Lk, Lq > Lk (fully masked rows) and odd lengths; the LSE's gradient too. And the
sm90 Gluon dK/dV kernel in the CPU simulator, against the same reference, with a mutant of its slot hand-off."""
import itertools
import json
import os
import subprocess
import sys

import pytest
import torch

from .conftest import ROOT, child_env


def reference(q, k, v, scale, mod, left, right, cap, slopes):
    """(O, LSE) of the math in the inputs' precision (float64 here): scores, the mod's torch lowering (the generated
    package's), a softmax that gives fully masked rows 0 (no NaN)."""
    import generated.attention as att

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

_CHECK = r"""
import itertools, json, sys
import torch
import generated.attention as att
from tests.test_attention_backward import reference

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
    env = child_env(TRITON_INTERPRET="1")
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


# ------------------------------------------------------------------------------- sm90 Gluon dK/dV, CPU simulator

def _sim_case(shape, mod, dtype, head_dim):
    """One backward case for a simulated Gluon kernel (fixed seed): the inputs, the kernels' trailing arguments
    (scale, mod, window, cap, slopes) and, from float64 autograd of the same math, the LSE, delta and dQ, dK, dV."""
    import generated.attention as att

    B, Hq, Hkv, Lq, Lk = shape
    dt = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, L, head_dim, generator=gen).to(dt) for H, L in ((Hq, Lq), (Hkv, Lk), (Hkv, Lk)))
    dout = torch.randn(B, Hq, Lq, head_dim, generator=gen).to(dt)
    scale = head_dim ** -0.5
    left, right = (8, 2) if mod == "window" else (0, 0)
    cap = 1.5 if mod == "softcap" else 0.0   # small enough that tanh saturates: its derivative matters
    slopes = att.default_alibi_slopes(Hq, "cpu") if mod == "alibi" else None
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    out, lse = reference(q64, k64, v64, scale, mod, left, right, cap, None if slopes is None else slopes.double())
    want = torch.autograd.grad((out * dout.double()).sum(), (q64, k64, v64))
    delta = (out.detach() * dout.double()).sum(-1).float()
    tail = (scale, mod, left, right, cap, delta if slopes is None else slopes)
    return (q, k, v, dout, lse.detach().float().contiguous(), delta), tail, want


def _sim_dkdv(module, shape, mod, dtype, head_dim):
    """dK, dV of the simulated module's backward_dkdv at one case, and float64 autograd's."""
    inputs, tail, want = _sim_case(shape, mod, dtype, head_dim)
    dk, dv = (torch.full_like(inputs[1], float("nan")) for _ in range(2))
    module.backward_dkdv(*inputs, dk, dv, *tail)
    return (dk, dv), want[1:]


def _sim_dq(module, shape, mod, dtype, head_dim):
    """dQ of the simulated module's backward_dq at one case, and float64 autograd's."""
    inputs, tail, want = _sim_case(shape, mod, dtype, head_dim)
    dq = torch.full_like(inputs[0], float("nan"))
    module.backward_dq(*inputs, dq, *tail)
    return dq, want[0]


# decode; GQA 4:1 over two CTAs of keys; Lq > Lk (fully masked rows under causal/window); odd equal lengths, B = 2
_SIM_SHAPES = [[1, 2, 2, 1, 70], [1, 4, 1, 17, 140], [2, 4, 2, 20, 12], [2, 2, 2, 70, 70]]


@pytest.mark.parametrize("late", [False, True], ids=["random-order", "late-completions"])
@pytest.mark.parametrize("dtype, head_dim", [("bfloat16", 64), ("float16", 128)])
@pytest.mark.parametrize("target", ["sm90", "sm100"])
def test_gluon_dkdv_matches_float64_autograd_on_the_simulator(target, dtype, head_dim, late):
    """The shipped module's dK/dV kernel for every mod, in the simulator's random completion order and in its late
    one: every dK and dV element written (zeros for keys no row sees), within bf16/fp16 rounding of float64 autograd.
    sm90: FA3-style, wgmma on transposed tiles (64 query rows a step at D 64, 32 at D 128). sm100: FA4-style, S^T,
    dP^T, dK and dV in tensor memory, P^T and dS^T read back from it as the MMAs' A operand (compiled and simulated:
    no Blackwell GPU ran it)."""
    from gen.build.targets import SMEM_OPT_IN_BYTES
    from gen.simulator import load_module

    text = (ROOT / "generated" / "attention" / f"{target}.py").read_text()
    module = load_module(text, f"{target}_bwd_{dtype}_{late}", seed=1, smem_limit=SMEM_OPT_IN_BYTES, late=late)
    for shape in _SIM_SHAPES:
        for mod in ("none", "causal", "window", "softcap", "alibi", "decay"):
            got, want = _sim_dkdv(module, shape, mod, dtype, head_dim)
            for a, w in zip(got, want):
                err = ((a.double() - w).norm() / w.norm().clamp_min(1e-30)).item()
                assert torch.isfinite(a).all() and err < 1e-2, (shape, mod, err)


@pytest.mark.parametrize("dtype, head_dim", [("bfloat16", 64), ("float16", 128)])
@pytest.mark.parametrize("target", ["sm90", "sm100"])
def test_gluon_delta_matches_float64_on_the_simulator(target, dtype, head_dim):
    """The shipped module's delta pre-pass (what the Gluon backward runs before dK/dV and dQ; one kernel both targets
    render): rowsum(dO * O) - dLSE in fp32 for every row, O and dO read through their strides (here [B, L, H, D]
    views, as a projection hands them over, and rows padded to a stride that is no multiple of 16 bytes, which the
    kernel's 16-byte-unit strides cannot express: read from a copy), rows past a 64-row block's end never written."""
    from gen.simulator import load_module

    module = load_module((ROOT / "generated" / "attention" / f"{target}.py").read_text(), f"{target}_delta_{dtype}",
                         seed=0)
    dt = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(0)
    for (B, Hq, Lq), padded in itertools.product(((1, 2, 1), (2, 3, 70), (1, 1, 130)), (False, True)):
        if padded:
            out, dout = (torch.randn(B, Hq, Lq, head_dim + 3, generator=gen).to(dt)[..., :head_dim] for _ in range(2))
        else:
            out, dout = (torch.randn(B, Lq, Hq, head_dim, generator=gen).to(dt).transpose(1, 2) for _ in range(2))
        want = (out.double() * dout.double()).sum(-1)
        dlse = torch.randn(B, Hq, Lq, generator=gen)
        for lse_grad in (None, dlse):
            delta = torch.full((B, Hq, Lq), float("nan"))
            module.backward_delta(out, dout, lse_grad, delta)
            expect = want if lse_grad is None else want - lse_grad.double()
            torch.testing.assert_close(delta.double(), expect, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("late", [False, True], ids=["random-order", "late-completions"])
@pytest.mark.parametrize("dtype, head_dim", [("bfloat16", 64), ("float16", 128)])
@pytest.mark.parametrize("target", ["sm90", "sm100"])
def test_gluon_dq_matches_float64_autograd_on_the_simulator(target, dtype, head_dim, late):
    """The shipped module's dQ kernel for every mod, in both completion orders, plus 300 query rows against 200 keys
    (several CTAs, the K/V ring wrapped): every dQ element written (rows with no visible key get 0), within
    bf16/fp16 rounding of float64 autograd. sm90: two 64-row wgmma consumers, 64 keys a step. sm100: 128 query rows
    a CTA, S, dP and dQ in tensor memory, dS read back as the dQ MMA's A operand (compiled and simulated, not run)."""
    from gen.build.targets import SMEM_OPT_IN_BYTES
    from gen.simulator import load_module

    text = (ROOT / "generated" / "attention" / f"{target}.py").read_text()
    module = load_module(text, f"{target}_dq_{dtype}_{late}", seed=1, smem_limit=SMEM_OPT_IN_BYTES, late=late)
    for shape in _SIM_SHAPES + [[1, 2, 1, 300, 200]]:
        for mod in ("none", "causal", "window", "softcap", "alibi", "decay"):
            got, want = _sim_dq(module, shape, mod, dtype, head_dim)
            err = ((got.double() - want).norm() / want.norm().clamp_min(1e-30)).item()
            assert torch.isfinite(got).all() and err < 1e-2, (shape, mod, err)


_DQ_RELEASE = "        mbarrier.arrive(empty.index(slot), count=1)   # every wgmma reading the K / V slot has retired\n"
_DQ_WAIT = "        dq, ds_op = warpgroup_mma_wait(0, deps=(dq_tok, ds_op))\n"


@pytest.mark.parametrize("old, new, hazard", [
    (_DQ_WAIT + _DQ_RELEASE, _DQ_RELEASE + _DQ_WAIT, "write-after-read hazard on shared memory `k_smem`"),
    ("    mbarrier.wait(q_ready.index(CID), 0)\n", "", "read-after-write hazard on shared memory `(q|do)_smem`"),
    ("        slot = consumer_wait(ready, it, STAGES)\n        k = k_smem",
     "        slot = it % STAGES\n        k = k_smem", "hazard on shared memory `(k|v)_smem`"),
], ids=["slot-released-before-its-wgmma-retires", "q-read-before-it-lands", "kv-read-without-its-wait"])
def test_sm90_gluon_dq_mutants_of_its_barriers_are_hazards(old, new, hazard):
    """Mutants of the dQ kernel's barriers, as for dK/dV: a K / V slot handed back before the dQ wgmma that reads it
    retires, Q / dO read before they land, a K / V slot read without its ready wait. 300 keys in 64-key steps wrap
    the ring: the simulator reports each hazard."""
    from gen.simulator import HazardError, load_module

    text = (ROOT / "generated" / "attention" / "sm90.py").read_text()
    assert text.count(old) == 1, "the kernel changed: update this mutant"
    module = load_module(text.replace(old, new), f"sm90_dq_mutant_{len(old)}", seed=0)
    with pytest.raises(HazardError, match=hazard):
        _sim_dq(module, [1, 2, 1, 64, 300], "none", "bfloat16", 64)


_RELEASE = "        mbarrier.arrive(empty.index(slot), count=1)   # every wgmma reading the Q / dO slot has retired\n"
_WAIT = "        dv, dk, p_op, ds_op = warpgroup_mma_wait(0, deps=(dv_tok, dk_tok, p_op, ds_op))\n"


@pytest.mark.parametrize("old, new, hazard", [
    (_WAIT + _RELEASE, _RELEASE + _WAIT, "write-after-read hazard on shared memory `(q|do)_smem`"),
    ("    mbarrier.wait(kv_ready.index(CID), 0)\n", "", "read-after-write hazard on shared memory `(k|v)_smem`"),
    ("        slot = consumer_wait(ready, it, STAGES)\n        q_t = ", "        slot = it % STAGES\n        q_t = ",
     "hazard on shared memory `(q|do)_smem`"),
], ids=["slot-released-before-its-wgmmas-retire", "kv-read-before-it-lands", "row-block-read-without-its-wait"])
def test_sm90_gluon_dkdv_mutants_of_its_barriers_are_hazards(old, new, hazard):
    """Mutants of the dK/dV kernel's three barriers: the consumer hands a Q / dO slot back before the dV and dK
    wgmmas that read it retire; reads its K / V tile without waiting for kv_ready; reads a Q / dO slot without
    waiting for its ready barrier. Ten row blocks go through the 4-slot ring, so the producer wraps it: the simulator
    reports each hazard (happens-before, whatever the interleaving)."""
    from gen.simulator import HazardError, load_module

    text = (ROOT / "generated" / "attention" / "sm90.py").read_text()
    assert text.count(old) == 1, "the kernel changed: update this mutant"
    module = load_module(text.replace(old, new), f"sm90_bwd_mutant_{len(old)}", seed=0)
    with pytest.raises(HazardError, match=hazard):
        _sim_dkdv(module, [1, 4, 2, 300, 64], "none", "bfloat16", 64)


# The S / dP issue both sm100 kernels share (_bwd_issue_scores): mutating it mutates both, and each test runs one
_SM100_ISSUE_WAIT = "    buf = producer_acquire(st_free, it, 2)\n    _tmem_fence_after(it)\n    tcgen05_mma(x, "
_SM100_ISSUE_SLOT = "    slot = consumer_wait(ready, it, STAGES)\n" + _SM100_ISSUE_WAIT


@pytest.mark.parametrize("old, new, hazard", [
    (_SM100_ISSUE_WAIT, "    buf = it % 2\n    _tmem_fence_after(it)\n    tcgen05_mma(x, ",
     "hazard on tensor memory `dp_tmem`"),
    (_SM100_ISSUE_SLOT, _SM100_ISSUE_SLOT.replace("slot = consumer_wait(ready, it, STAGES)", "slot = it % STAGES"),
     "read-after-write hazard on shared memory `k_smem`"),
], ids=["s-buffer-reused-before-the-dq-mma-completes", "k-read-before-it-lands"])
def test_sm100_gluon_dq_mutants_of_its_barriers_are_hazards(old, new, hazard):
    """Mutants of the sm100 dQ kernel's hand-offs: S / dP of block j+2 issued into the TMEM buffer whose dS the dQ
    MMA of block j may still read; S issued on a K slot before its TMA landed. 300 keys in 64-key steps wrap the
    4-slot ring and both TMEM buffers: the simulator reports each hazard."""
    from gen.simulator import HazardError, load_module

    text = (ROOT / "generated" / "attention" / "sm100.py").read_text()
    assert text.count(old) == 1, "the kernel changed: update this mutant"
    module = load_module(text.replace(old, new), f"sm100_dq_mutant_{len(old)}_{len(new)}", seed=0)
    with pytest.raises(HazardError, match=hazard):
        _sim_dq(module, [1, 2, 1, 64, 300], "none", "bfloat16", 64)


_SM100_COMMITS = ("        tcgen05_commit(empty.index(slot))\n        tcgen05_commit(st_free.index(buf))\n")


@pytest.mark.parametrize("old, new, hazard", [
    (_SM100_ISSUE_WAIT, "    buf = it % 2\n    _tmem_fence_after(it)\n    tcgen05_mma(x, ",
     "write-after-read hazard on tensor memory `s_tmem`"),
    ("        consumer_wait(p_ready, it, 2)\n", "", "read-after-write hazard on tensor memory `s_tmem`"),
    ("use_acc=it > 0)\n        # commits, not", "use_acc=it > 0, mbarriers=[empty.index(slot), st_free.index(buf)])\n"
     "        # commits, not", "hazard on tensor memory `s_tmem`"),
    ("    mbarrier.wait(done.index(0), 0)\n    _tmem_fence_after(steps)\n", "    _tmem_fence_after(steps)\n",
     "hazard on (tensor memory `d[kv]_tmem`|shared memory `[kv]_smem`)"),
], ids=["st-buffer-reused-before-its-mmas-complete", "p-read-before-it-is-written",
        "frees-on-the-dk-mma-alone", "epilogue-before-the-last-mma"])
def test_sm100_gluon_dkdv_mutants_of_its_barriers_are_hazards(old, new, hazard):
    """Mutants of the sm100 dK/dV kernel's hand-offs: S^T_{i+2} issued into a TMEM buffer whose P^T_i the dV MMA may
    still read; the dV MMA reading P^T before the compute warps wrote it; the slot and buffer freed by the dK MMA's
    own mbarriers (Gluon signals them when that MMA completes, which orders nothing about the dV MMA before it; the
    kernel commits instead); the epilogue reading dK / dV before the last MMA completed. 300 query rows in 64-row
    steps wrap the Q / dO ring and both TMEM buffers: the simulator reports each hazard."""
    from gen.simulator import HazardError, load_module

    text = (ROOT / "generated" / "attention" / "sm100.py").read_text()
    if "mbarriers=[empty" in new:   # the commits go: the MMA's own barriers free the slot and buffer
        text = text.replace(_SM100_COMMITS, "", 1)
    assert text.count(old) == 1, "the kernel changed: update this mutant"
    module = load_module(text.replace(old, new), f"sm100_bwd_mutant_{len(old)}_{len(new)}", seed=0)
    with pytest.raises(HazardError, match=hazard):
        _sim_dkdv(module, [1, 4, 2, 300, 64], "none", "bfloat16", 64)


_COMPOSED = r"""
import json, sys
import torch
import generated.attention as att
from gen.simulator import load_module
from tests.test_attention_backward import reference

sim = load_module(open(sys.argv[1]).read(), "composed_" + sys.argv[2], seed=0)
dq_kernel = sim.backward_dq
rows = []
for (B, Hq, Hkv, Lq, Lk), mod in [((1, 4, 2, 33, 70), "causal"), ((2, 2, 1, 20, 12), "softcap")]:
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, L, 64).to(torch.bfloat16) for H, L in ((Hq, Lq), (Hkv, Lk), (Hkv, Lk)))
    dout = torch.randn(B, Hq, Lq, 64).to(torch.bfloat16)
    _, _, _, scale, _, left, right, cap, _ = att._arguments(q, k, v, mod, None, None, 1.5 if mod == "softcap" else None, None)
    out, lse = att.attention(q, k, v, mod=mod, softcap=cap or None, return_lse=True)
    portable = att._module("triton", q, mod)
    args = (q, k, v, out, lse, dout, None, scale, mod, left, right, cap, None)
    alone, composed = portable.backward(*args), portable.backward(*args, dkdv=sim.backward_dkdv)
    all_gluon = portable.backward(*args, dkdv=sim.backward_dkdv, dq_kernel=dq_kernel)
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    want = torch.autograd.grad((reference(q64, k64, v64, scale, mod, left, right, cap, None)[0] * dout.double()).sum(),
                               (q64, k64, v64))
    rows.append({"case": [B, Hq, Hkv, Lq, Lk, mod], "dq_same_bits": torch.equal(alone[0], composed[0]),
                 "dkdv_same_bits": all(torch.equal(a, b) for a, b in zip(composed[1:], all_gluon[1:])),
                 "errs": [((a.double() - w).norm() / w.norm()).item() for a, w in zip(composed, want)],
                 "gluon_dq_err": ((all_gluon[0].double() - want[0]).norm() / want[0].norm()).item()})
print(json.dumps(rows))
"""


@pytest.mark.parametrize("target", ["sm90", "sm100"])
def test_the_portable_backward_runs_the_gluon_kernels_it_is_given(target):
    """triton.backward(dkdv=<target>.backward_dkdv), as the op's backward calls it with GEN_ATTENTION_BACKWARD=gluon:
    the portable delta and dQ kernels in Triton's interpreter, the Gluon dK/dV kernel in the simulator, in one
    backward. dQ has the same bits as the portable backward alone; dQ, dK and dV match float64 autograd. With the
    target's dQ kernel too (GEN_ATTENTION_BACKWARD=gluon-dq, the default) dK and dV keep their bits and that dQ
    matches float64 autograd."""
    env = child_env(TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", _COMPOSED, str(ROOT / "generated" / "attention" / f"{target}.py"),
                           target],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(rows) == 2
    for r in rows:
        assert r["dq_same_bits"] and r["dkdv_same_bits"] and max(r["errs"] + [r["gluon_dq_err"]]) < 2e-2, r


def test_the_backward_kernel_switch():
    """The backward's kernels: the target's Gluon dK/dV and dQ by default (GEN_ATTENTION_BACKWARD=gluon-dq), its
    dK/dV alone with gluon, every kernel portable with triton; on CPU tensors there is no Gluon module to pick either way; a bad value is
    refused."""
    code = ("import torch, generated.attention as att; q = torch.zeros(1, 1, 4, 64, dtype=torch.bfloat16); "
            "print(att.BACKWARD, att._gluon_backward_module(q, 'none'))")
    for value, want in ((None, "gluon-dq None"), ("gluon", "gluon None"), ("gluon-dq", "gluon-dq None"),
                        ("triton", "triton None")):
        env = {k: v for k, v in child_env().items() if k != "GEN_ATTENTION_BACKWARD"}
        if value:
            env["GEN_ATTENTION_BACKWARD"] = value
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                              env=env, timeout=300)
        assert proc.returncode == 0 and proc.stdout.split() == want.split(), proc.stdout + proc.stderr[-2000:]
    env = child_env(GEN_ATTENTION_BACKWARD="fast")
    proc = subprocess.run([sys.executable, "-c", "import generated.attention"], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)
    assert proc.returncode != 0 and "GEN_ATTENTION_BACKWARD='fast'" in proc.stderr


_TRAIN_STEP = r"""
import json
import torch
import generated.attention as att

class Layer(torch.nn.Module):
    # an attention layer as models write it: projections (nn.Linear), GQA, a score mod only our op expresses
    def __init__(self, d=64, hq=4, hkv=2):
        super().__init__()
        self.hq, self.hkv, self.d = hq, hkv, d
        self.q = torch.nn.Linear(d * 2, hq * d, bias=False)
        self.kv = torch.nn.Linear(d * 2, 2 * hkv * d, bias=False)

    def forward(self, x):
        b, l, _ = x.shape
        q = self.q(x).view(b, l, self.hq, self.d).transpose(1, 2)
        k, v = self.kv(x).view(b, l, 2, self.hkv, self.d).permute(2, 0, 3, 1, 4)
        return att.attention(q, k, v, mod="softcap", softcap=2.0).transpose(1, 2).reshape(b, l, -1)

torch.manual_seed(0)
layer = Layer().bfloat16()
x = torch.randn(2, 40, 128).bfloat16()
rows = {}
for name, fn in (("eager", layer), ("compiled", torch.compile(layer, fullgraph=True, backend="aot_eager"))):
    layer.zero_grad()
    loss = fn(x).float().square().mean()
    loss.backward()
    rows[name] = [p.grad.clone() for p in layer.parameters()]
from tests.test_attention_backward import reference
ref = Layer().double()
ref.load_state_dict({k: v.double() for k, v in layer.state_dict().items()})
att.attention = lambda q, k, v, mod, softcap: reference(q, k, v, q.shape[-1] ** -0.5, mod, 0, 0, softcap, None)[0]
ref(x.double()).square().mean().backward()
want = [p.grad for p in ref.parameters()]
print(json.dumps({name: [((a.double() - w).norm() / w.norm()).item() for a, w in zip(got, want)]
                  for name, got in rows.items()}))
"""


def test_a_training_step_through_an_nn_module_compiles_fullgraph_and_matches_float64():
    """A model's attention layer (nn.Linear projections, GQA, a softcap only our op expresses) trained one step,
    eager and under torch.compile(fullgraph=True): no graph break, and the weights' gradients through our forward
    and the portable backward match float64 autograd of the same layer (the interpreter runs the kernels)."""
    env = child_env(TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", _TRAIN_STEP], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    errs = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(errs) == {"eager", "compiled"}
    for name, e in errs.items():
        assert len(e) == 2 and max(e) < 3e-2, (name, e)


_TRAIN_LOOP = r"""
import json
import torch
import torch.nn.functional as F
import generated.attention as att

class Block(torch.nn.Module):
    # a sliding-window attention layer with a residual: the window our op runs itself in training (SDPA would need
    # a mask tensor), against the same layer on SDPA with that mask as a boolean tensor
    def __init__(self, use_sdpa, d=64, h=2, left=8):
        super().__init__()
        self.use_sdpa, self.h, self.d, self.left = use_sdpa, h, d, left
        self.qkv = torch.nn.Linear(d * h, 3 * d * h, bias=False)
        self.out = torch.nn.Linear(d * h, d * h, bias=False)

    def forward(self, x):
        b, l, _ = x.shape
        q, k, v = self.qkv(x).view(b, l, 3, self.h, self.d).permute(2, 0, 3, 1, 4)
        if self.use_sdpa:
            i = torch.arange(l)
            mask = (i[None, :] <= i[:, None]) & (i[None, :] >= i[:, None] - self.left)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
            o = att.attention(q, k, v, mod="window", window=(self.left, 0))
        return x + self.out(o.transpose(1, 2).reshape(b, l, -1))

torch.manual_seed(0)
x = torch.randn(2, 48, 128).bfloat16()
with torch.no_grad():   # a target the layer can reach: another layer's output (a teacher's weights)
    target = Block(True).bfloat16()(x)
curves = {}
init = Block(True).bfloat16().state_dict()
sdpa = F.scaled_dot_product_attention
def refuse(*args, **kwargs):
    raise AssertionError("the gen model must not reach SDPA")
for name in ("gen", "sdpa"):
    F.scaled_dot_product_attention = refuse if name == "gen" else sdpa   # our kernels, not SDPA behind the op
    model = Block(name == "sdpa").bfloat16()
    model.load_state_dict(init)
    opt = torch.optim.SGD(model.parameters(), lr=8.0)
    losses = []
    for step in range(12):
        opt.zero_grad()
        loss = (model(x).float() - target.float()).square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    curves[name] = losses
print(json.dumps(curves))
"""


def test_a_small_attention_model_trains_like_the_same_model_on_sdpa():
    """Twelve SGD steps of a sliding-window attention layer, fitting a teacher layer's output, through
    generated.attention (our forward and backward kernels, in the interpreter; SDPA refused) and through SDPA with
    the same window as a mask tensor, from the same weights: the loss falls more than 2x and both curves agree step
    by step within bf16 rounding (0.5% here)."""
    env = child_env(TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", _TRAIN_LOOP], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    curves = json.loads(proc.stdout.strip().splitlines()[-1])
    gen, sdpa = curves["gen"], curves["sdpa"]
    assert gen[-1] < 0.5 * gen[0] and sdpa[-1] < 0.5 * sdpa[0], curves
    assert all(abs(a - b) <= 1e-2 * b for a, b in zip(gen, sdpa)), curves
