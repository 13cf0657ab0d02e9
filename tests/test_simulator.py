"""Tests of gen.simulator, the functional CPU simulator for Gluon (sm100 tcgen05/TMEM, sm90 wgmma) kernels.

* Our own small Gluon kernels (tests/simulator_kernels/*.py) must compile with real Triton for their target
  and, run under the simulator, match torch.
* The real templates (templates/sm100|sm90/{gemm,attention}.py.jinja) are rendered with small configs and run
  on small shapes with tails, against the families' torch references.
* Broken copies (text substitutions on rendered sources) must be caught with precise messages: deadlocks
  (wrong phase, wrong expect bytes), hazards (missing waits, buffers reused while an MMA/TMA still uses them,
  missing fences), resource limits.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gen.families.gemm import apply_activation
from gen.runtime.shapes import b_columns
from gen.simulator import DeadlockError, HazardError, SimulationError, load_module

ROOT = Path(__file__).resolve().parents[1]
KERNELS = Path(__file__).resolve().parent / "simulator_kernels"
TEMPLATES = ROOT / "templates"

OWN_KERNELS = ["elementwise", "sm100_matmul", "sm100_attention", "sm90_matmul"]

SM100_GEMM_CFG = dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=32, GROUP_M=2, STAGES=3, ACC_BUFFERS=2, EPI_N=32,
                      num_warps=4)
SM90_GEMM_CFG = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=2, STAGES=3, EPI_N=32, LOAD_REGS=24,
                     num_warps=4)
SM100_ATTN_CFG = dict(BLOCK_M=128, BLOCK_N=64, num_warps=4)
# Two consumer warpgroups of 64 rows (num_warps 8) with ping-pong turn barriers, as the shipped config runs them
# (the template derives the consumer count from num_warps; 4 warps would test a single consumer only).
SM90_ATTN_CFG = dict(BLOCK_M=128, BLOCK_N=64, STAGES=2, PINGPONG=True, CONSUMER_REGS=240, PRODUCER_REGS=24,
                     O_IN_Q=False, num_warps=8)
ATTN_MODS = [
    {"name": "none"},
    {"name": "causal", "mask": "causal"},
    {"name": "win", "mask": "window", "left": 40, "right": 8},
    {"name": "softcap", "score_mod": "softcap", "cap": 5.0},
    {"name": "alibi", "mask": "causal", "score_mod": "alibi"},
    {"name": "custom", "score_mod": "custom", "expr": "score - 0.1 * abs(q_idx - kv_idx)"},
]


# ============================================================================================ helpers

def own_source(name: str) -> str:
    return (KERNELS / f"{name}.py").read_text()


def render(template: str, cfg: dict, spec: dict, target: str) -> str:
    import jinja2

    # a missing template is a broken checkout or a renamed file: the tests that render it fail, never skip
    assert (TEMPLATES / template).is_file(), f"template {template} is missing under {TEMPLATES}"
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    return env.get_template(template).render(cfg=dict(cfg), spec=spec, target=target)


def substitute(src: str, old: str, new: str, count: int = -1) -> str:
    """Text substitution that fails loudly when the template no longer contains `old`."""
    assert old in src, f"broken-copy pattern not found in the rendered source (template changed?):\n{old}"
    return src.replace(old, new, count)


def line_of(src: str, text: str, nth: int = 0) -> int:
    """1-based line number of the nth line containing `text`."""
    hits = [i + 1 for i, line in enumerate(src.splitlines()) if text in line]
    assert len(hits) > nth, f"{text!r} not found in the source"
    return hits[nth]


def expect_error(exc_type, fn, *args, **kwargs) -> str:
    with pytest.raises(exc_type) as info:
        fn(*args, **kwargs)
    return str(info.value)


def gemm_reference(a, b, bias, activation):
    ref = a.double() @ b.double()   # b is [K, N] in either memory order (gated: [gate | up])
    if bias is not None:
        ref = ref + bias.double()
    return apply_activation(ref, activation)


def check_close(out, ref, out_dtype):
    # fp32 accumulation of K <= 200 products, rounded once to the output dtype
    eps = {torch.float32: 2e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}[out_dtype]
    scale = ref.abs().max().item() + 1e-6
    err = (out.double() - ref).abs().max().item()
    assert err <= eps * scale * 2 + 1e-5, f"max error {err} vs scale {scale}"
    return err


def run_gemm(mod, M, N, K, dtype, out_dtype, bias, activation, b_layout, num_sms=2, seed=0, residual=False):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(M, K, dtype=dtype, generator=g)
    NB = b_columns(N, activation)   # a gated activation's b: gate and up columns
    # "nk": an nn.Linear weight [N, K], passed as its [K, N] view (the kernels read it K-major, no copy)
    b = torch.randn(K, NB, dtype=dtype, generator=g) if b_layout == "kn" else torch.randn(NB, K, dtype=dtype, generator=g).t()
    bb = torch.randn(NB, dtype=dtype, generator=g) if bias else None
    out = torch.full((M, N), float("nan"), dtype=out_dtype)
    # a residual as a model holds it may be a row view of a wider buffer: its row stride is not N
    res = torch.randn(M, N + 16, dtype=out_dtype, generator=g)[:, 8:N + 8] if residual else None
    if res is None:
        mod.launch(a, b, bb, out, activation, num_sms)
    else:
        mod.launch(a, b, bb, out, activation, num_sms, res)
    ref = gemm_reference(a, b, bb, activation)
    return out, ref if res is None else ref + res.double()


def attention_options():
    from gen.families import attention as fam
    return fam, fam.check_options({"mods": ATTN_MODS, "head_dims": [64]}, "<test>")


def run_attention(mod, shape, mod_name, dtype="bfloat16", num_sms=2, seed=0):
    fam, opts = attention_options()
    g = torch.Generator().manual_seed(seed)
    inp = fam.make_inputs(shape, {"dtype": dtype, "head_dim": 64, "mod": mod_name}, opts, "cpu", g)
    out = torch.full_like(inp["q"], float("nan"))
    lse = torch.full((shape[0], shape[1], shape[3]), float("nan"))
    mod.launch(inp["q"], inp["k"], inp["v"], out, lse, inp["scale"], mod_name, inp["window_left"],
               inp["window_right"], inp["softcap"], inp["alibi_slopes"], num_sms)
    ref_o, ref_lse = fam.reference(inp, opts)
    return out, lse, ref_o, ref_lse


def check_attention(out, lse, ref_o, ref_lse):
    o_err = (out.double() - ref_o).abs().max().item()
    assert o_err < 3e-2, f"O error {o_err}"  # bf16 output of values |O| <~ 3
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite), "fully masked rows must give lse = -inf"
    assert bool((lse[~finite] == float("-inf")).all())
    lse_err = (lse.double()[finite] - ref_lse[finite]).abs().max().item() if finite.any() else 0.0
    assert lse_err < 1e-4, f"lse error {lse_err}"
    return o_err, lse_err


_CACHE: dict = {}


def sm100_gemm_source():
    key = ("sm100_gemm",)
    if key not in _CACHE:   # one module reads both B layouts (B_KN is a constexpr picked per launch)
        _CACHE[key] = render("sm100/gemm.py.jinja", SM100_GEMM_CFG, {}, "sm100")
    return _CACHE[key]


def sm90_gemm_source():
    key = ("sm90_gemm",)
    if key not in _CACHE:
        _CACHE[key] = render("sm90/gemm.py.jinja", SM90_GEMM_CFG, {}, "sm90")
    return _CACHE[key]


def attention_source(target):
    key = (target, "attention")
    if key not in _CACHE:
        fam, opts = attention_options()
        cfg = SM100_ATTN_CFG if target == "sm100" else SM90_ATTN_CFG
        _CACHE[key] = render(f"{target}/attention.py.jinja", cfg, fam.template_context(opts), target)
    return _CACHE[key]


# ============================================================================================ own kernels

_COMPILE_SCRIPT = r"""
import importlib.util, json, sys, triton
from triton.experimental.gluon._runtime import GluonASTSource
from triton.backends.compiler import GPUTarget
out = {}
for path in sys.argv[1:]:
    spec = importlib.util.spec_from_file_location("simkernel", path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    res = []
    for job in m.compile_jobs():
        try:
            k = triton.compile(GluonASTSource(job["fn"], job["signature"], constexprs=job["constexprs"]),
                               target=GPUTarget("cuda", m.TARGET, 32), options=job["options"])
            res.append({"fn": job["fn"].__name__, "ok": True, "shared": k.metadata.shared,
                        "tmem": getattr(k.metadata, "tmem_size", 0)})
        except Exception as e:
            res.append({"fn": job["fn"].__name__, "ok": False, "error": str(e)[-2000:]})
    out[path] = res
print("RESULT" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def compiled_own_kernels():
    # One child process: a compile that crashes inside MLIR must not take pytest down.
    paths = [str(KERNELS / f"{n}.py") for n in OWN_KERNELS]
    proc = subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT, *paths], capture_output=True, text=True,
                          timeout=600)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")]
    assert line, f"compile child failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    res = json.loads(line[-1][len("RESULT"):])
    return {Path(p).stem: v for p, v in res.items()}


def _release() -> tuple:
    from gen.runtime.triton_range import installed, release

    return release(installed())


@pytest.mark.parametrize("name", OWN_KERNELS)
def test_own_kernels_compile_with_triton(compiled_own_kernels, name):
    # These test kernels are written in triton 3.6's Gluon; the shipped variants go through the compat layer instead.
    if _release() >= (3, 9):
        pytest.skip("the TMA copies are called by their 3.6-3.8 names, which 3.9 removed")
    if name == "sm100_attention" and _release() >= (3, 8):
        pytest.skip("P reinterprets a view of S at another element size, which 3.8 refuses")
    jobs = compiled_own_kernels[name]
    assert jobs
    for job in jobs:
        assert job["ok"], f"{name}.{job['fn']} does not compile:\n{job.get('error')}"


def test_elementwise_kernels():
    m = load_module(own_source("elementwise"), "elementwise")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1000, dtype=torch.float16, generator=g)
    y = torch.randn(1000, dtype=torch.float16, generator=g)
    out = torch.empty_like(x)
    m.axpy(x, y, out, 0.5)
    r = 0.5 * x.float() + y.float()
    ref = torch.where(r > 0, r, torch.exp2(r) - 1).half()
    assert torch.equal(out, ref)

    X = torch.randn(37, 100, generator=g)
    o = torch.empty(37, 2)
    m.rowsum(X, o)
    torch.testing.assert_close(o[:, 0], X.sum(1), atol=1e-4, rtol=1e-5)
    assert torch.equal(o[:, 1], X.amax(1))

    A = torch.randn(100, 136, dtype=torch.float16, generator=g)  # tails in both dims: TMA zero-fill + clipping
    O = torch.zeros_like(A)
    m.tma_roundtrip(A, O, 2.0)
    assert torch.equal(O, (A.float() * 2 + 1).half())


_GLOBALS = """
import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

SCALE = gl.constexpr(3)
if True:
    OFFSET = gl.constexpr(1)   # under a top-level block: still a module-level constexpr
PLAIN = 3
CONFIG = {"scale": 3}


@gluon.constexpr_function
def doubled(x):
    return x * 2


@gluon.jit
def kernel(out, BLOCK: gl.constexpr):
    offs = gl.arange(0, BLOCK, layout=gl.BlockedLayout([1], [32], [4], [0]))
    gl.store(out + offs, offs * SCALE + OFFSET + doubled(1) + USE)


def launch(n=128):
    out = torch.zeros(n, dtype=torch.int32)
    kernel[(1,)](out, n, num_warps=4)
    return out
"""


@pytest.mark.parametrize("use, ok", [("0", True), ("SCALE", True), ("PLAIN", False), ('CONFIG["scale"]', False)])
def test_kernels_read_only_the_globals_triton_lets_them(use, ok):
    """Triton refuses a kernel that reads a plain Python global (an int, a config dict): only constexpr(...) values,
    modules, jit functions, builtins and constexpr_functions. The simulator refuses the same, so a kernel it runs
    also compiles (an sm100 GEMM helper reading a plain `CLC_SLOTS = 2` passed here and failed the compile)."""
    module = load_module(_GLOBALS.replace("+ USE)", f"+ {use})"), f"globals_{ok}_{len(use)}")
    if ok:
        extra = 0 if use == "0" else 3
        assert torch.equal(module.launch(), torch.arange(128, dtype=torch.int32) * 3 + 3 + extra)
        return
    name = use.split("[")[0]
    with pytest.raises(SimulationError, match=f"reads the global `{name}`.*Cannot access global variable {name}"):
        module.launch()


def test_warp_specialize_returns_default_partition_values():
    m = load_module(own_source("elementwise"), "elementwise")
    x = torch.zeros(128)
    out = torch.zeros(128)
    m.ws_return(x, out)  # the worker fills x, the default partition returns (2 * x, offsets)
    assert torch.equal(x, torch.arange(128.0))
    assert torch.equal(out, torch.arange(128.0) * 2 + 1)


@pytest.mark.parametrize("M,N,K", [(64, 48, 40), (200, 136, 200)])
def test_own_sm100_matmuls(M, N, K):
    m = load_module(own_source("sm100_matmul"), "sm100_matmul")
    g = torch.Generator().manual_seed(1)
    a = torch.randn(M, K, dtype=torch.float16, generator=g)
    b = torch.randn(K, N, dtype=torch.float16, generator=g)
    ref = a.double() @ b.double()
    c = torch.empty(M, N, dtype=torch.float16)
    m.pipelined_matmul(a, b, c)
    check_close(c, ref, torch.float16)
    c32 = torch.empty(M, N, dtype=torch.float32)
    m.pipelined_matmul(a, b.t().contiguous(), c32, b_nk=True)  # B as [N, K], permuted smem view
    check_close(c32, ref, torch.float32)
    bias = torch.randn(N, generator=g)
    m.ws_matmul(a, b, bias, c)
    check_close(c, torch.relu(ref + bias.double()), torch.float16)


@pytest.mark.parametrize("causal", [False, True])
def test_own_sm100_attention_tmem_aliasing(causal):
    # P (bf16, packed) is written over S (fp32) in TMEM and read back as the `a` operand of O += P V.
    m = load_module(own_source("sm100_attention"), "sm100_attention")
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 200, 64, dtype=torch.bfloat16, generator=g) for _ in range(3))
    out = torch.full_like(q, float("nan"))
    m.attention(q, k, v, out, causal)
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
    assert (out.double() - ref).abs().max().item() < 2e-2


@pytest.mark.parametrize("M,N,K", [(64, 48, 40), (200, 136, 72)])
def test_own_sm90_matmuls(M, N, K):
    m = load_module(own_source("sm90_matmul"), "sm90_matmul")
    g = torch.Generator().manual_seed(3)
    a = torch.randn(M, K, dtype=torch.float16, generator=g)
    b = torch.randn(K, N, dtype=torch.float16, generator=g)
    ref = a.double() @ b.double()
    c = torch.empty(M, N, dtype=torch.float16)
    m.wgmma_matmul(a, b, c)
    check_close(c, ref, torch.float16)
    c32 = torch.empty(M, N, dtype=torch.float32)
    m.wgmma_regs_a(a, b, c32)
    check_close(c32, ref, torch.float32)


# ============================================================================================ own kernels broken

def _ws_inputs(M=200, N=136, K=200):
    g = torch.Generator().manual_seed(4)
    a = torch.randn(M, K, dtype=torch.float16, generator=g)
    b = torch.randn(K, N, dtype=torch.float16, generator=g)
    return a, b, torch.zeros(N), torch.empty(M, N, dtype=torch.float16)


def test_own_wrong_phase_deadlocks():
    src = own_source("sm100_matmul")
    bad = substitute(src, "mbarrier.wait(empty.index(s), ((ki // STAGES) & 1) ^ 1)",
                     "mbarrier.wait(empty.index(s), ((ki // STAGES) & 1))")
    m = load_module(bad, "own_wrong_phase")
    msg = expect_error(DeadlockError, m.ws_matmul, *_ws_inputs())
    assert "partition `_ws_loader` (worker 0, 1 warp): blocked in mbarrier.wait on barrier empty[0]" in msg
    assert "waiting for the phase with parity 0 to complete" in msg
    assert "current phase 0 (parity 0), 1 of 1 arrivals pending" in msg
    wait_line = line_of(bad, "mbarrier.wait(empty.index(s), ((ki // STAGES) & 1))")
    assert f"own_wrong_phase.py:{wait_line} (in _ws_loader): mbarrier.wait(empty.index(s)" in msg
    assert "partition `_ws_mma` (worker 1, 1 warp): blocked in mbarrier.wait on barrier ready[0]" in msg
    assert "partition `_ws_epilogue` (default, 4 warps): blocked in mbarrier.wait on barrier acc_bar" in msg


def test_own_missing_fence_is_a_hazard():
    src = own_source("elementwise")
    bad = substitute(src, "    smem.store(y)\n    fence_async_shared()\n", "    smem.store(y)\n")
    m = load_module(bad, "own_missing_fence")
    A = torch.randn(64, 64, dtype=torch.float16)
    msg = expect_error(HazardError, m.tma_roundtrip, A, torch.empty_like(A), 2.0)
    assert msg.startswith("missing fence_async_shared on shared memory `smem`")
    assert f"own_missing_fence.py:{line_of(bad, 'smem.store(y)')}" in msg
    assert f"own_missing_fence.py:{line_of(bad, 'tma.async_copy_shared_to_global(out_desc')}" in msg


def test_own_mma_buffer_reuse_is_a_hazard():
    src = own_source("sm100_matmul")
    bad = substitute(src, "            mbarrier.wait(freed.index(ns), ((ki - 1) // STAGES) & 1, pred=ki > 0)\n", "")
    m = load_module(bad, "own_reuse")
    a, b, _, c = _ws_inputs()
    msg = expect_error(HazardError, m.pipelined_matmul, a, b, c)
    assert msg.startswith("write-after-read hazard on shared memory `a_bufs`")
    assert "async tcgen05_mma issued by partition `pipelined_matmul_kernel` reads (tcgen05_mma operand a) " \
           "a_bufs.index(0)" in msg
    assert f"own_reuse.py:{line_of(bad, 'tcgen05_mma(a_bufs.index(s), b, acc_tmem')}" in msg
    tma_line = line_of(bad, "tma.async_copy_global_to_shared(a_desc, [off_m, nk * BLOCK_K]")
    assert f"own_reuse.py:{tma_line}" in msg


def test_own_tmem_read_before_mma_completes():
    src = own_source("sm100_matmul")
    bad = substitute(src, "    tcgen05_commit(done)\n    mbarrier.wait(done, 0)\n", "    tcgen05_commit(done)\n")
    m = load_module(bad, "own_no_acc_wait")
    a, b, _, c = _ws_inputs(128, 64, 64)
    msg = expect_error(HazardError, m.pipelined_matmul, a, b, c)
    assert msg.startswith("read-after-write hazard on tensor memory `acc_tmem`")
    assert f"own_no_acc_wait.py:{line_of(bad, 'tcgen05_mma(a_bufs.index(s), b, acc_tmem')}" in msg
    assert f"own_no_acc_wait.py:{line_of(bad, 'acc = acc_tmem.load(reg_layout)')}" in msg


def test_own_wgmma_accumulator_used_before_wait():
    src = own_source("sm90_matmul")
    bad = substitute(src, "    acc = warpgroup_mma_wait(0, deps=[acc])\n", "")
    m = load_module(bad, "own_wgmma_nowait")
    g = torch.Generator().manual_seed(5)
    a = torch.randn(64, 64, dtype=torch.float16, generator=g)
    b = torch.randn(64, 64, dtype=torch.float16, generator=g)
    msg = expect_error(HazardError, m.wgmma_matmul, a, b, torch.empty(64, 64, dtype=torch.float16))
    assert "used as a value before warpgroup_mma_wait retired that wgmma" in msg


def test_own_tx_overdelivery():
    src = own_source("elementwise")
    bad = substitute(src, "mbarrier.expect(bar, in_desc.block_type.nbytes)",
                     "mbarrier.expect(bar, in_desc.block_type.nbytes - 64)")
    m = load_module(bad, "own_tx_over")
    A = torch.randn(64, 64, dtype=torch.float16)
    msg = expect_error(HazardError, m.tma_roundtrip, A, torch.empty_like(A), 2.0)
    assert "TMA transaction bytes exceed mbarrier.expect on barrier bar: expected 4032 bytes" in msg
    assert "TMA delivered 4096" in msg


def test_tmem_over_512_columns():
    src = own_source("sm100_matmul")
    bad = substitute(src, "acc_tmem = allocate_tensor_memory(gl.float32, [BLOCK_M, BLOCK_N], tmem_layout)",
                     "acc_tmem = allocate_tensor_memory(gl.float32, [BLOCK_M, BLOCK_N], tmem_layout)\n"
                     "    extra = allocate_tensor_memory(gl.float32, [4, BLOCK_M, 128], "
                     "TensorMemoryLayout([BLOCK_M, 128], col_stride=1))")
    m = load_module(bad, "own_tmem")
    a, b, _, c = _ws_inputs(64, 64, 32)
    msg = expect_error(SimulationError, m.pipelined_matmul, a, b, c)
    assert "tensor memory exhausted" in msg and "576 columns live > 512" in msg
    assert "acc_tmem: 64 columns" in msg and "extra: 512 columns" in msg


def test_smem_budget():
    m = load_module(own_source("sm100_matmul"), "own_smem", smem_limit=40 * 1024)
    a, b, _, c = _ws_inputs(128, 64, 64)
    msg = expect_error(SimulationError, m.pipelined_matmul, a, b, c)
    assert "shared memory budget exceeded" in msg and "> limit 40960" in msg and "c_smem" in msg
    # enough budget: runs
    m = load_module(own_source("sm100_matmul"), "own_smem_ok", smem_limit=64 * 1024)
    m.pipelined_matmul(a, b, c)
    check_close(c, a.double() @ b.double(), torch.float16)


def test_seed_changes_interleaving_deterministically():
    src = own_source("sm100_matmul")

    def trace(seed):
        m = load_module(src, "own_seed", seed=seed)
        order = []
        import gen.simulator._runtime as rt
        orig = rt.Program.complete

        def spy(self, op):
            order.append((op.kind, op.loc.lineno))
            return orig(self, op)
        rt.Program.complete = spy
        try:
            a, b, bias, c = _ws_inputs(128, 64, 128)
            m.ws_matmul(a, b, bias, c)
        finally:
            rt.Program.complete = orig
        check_close(c, torch.relu(a.double() @ b.double()), torch.float16)
        return order

    t0, t0b, t1, t2 = trace(0), trace(0), trace(1), trace(2)
    assert t0 == t0b
    assert t0 != t1 or t0 != t2


# ============================================================================================ real templates: GEMM

GEMM_CASES = [   # (dtype, out dtype, bias, activation, residual)
    (torch.bfloat16, torch.bfloat16, True, "gelu_tanh", False),
    (torch.float16, torch.float32, False, "none", False),
    (torch.float16, torch.float16, True, "relu", False),
    (torch.bfloat16, torch.float32, True, "silu", False),
    (torch.bfloat16, torch.bfloat16, True, "swiglu", False),
    (torch.float16, torch.float32, False, "geglu", False),
    (torch.bfloat16, torch.bfloat16, True, "none", True),
    (torch.float16, torch.float32, False, "silu", True),
    (torch.bfloat16, torch.bfloat16, False, "swiglu", True),
]
GEMM_SHAPES = [(64, 48, 40), (200, 136, 72)]


@pytest.mark.parametrize("b_layout", ["kn", "nk"])
@pytest.mark.parametrize("M,N,K", GEMM_SHAPES)
def test_sm100_gemm_template(b_layout, M, N, K):
    mod = load_module(sm100_gemm_source(), f"sm100_gemm_{b_layout}")
    for dtype, out_dtype, bias, act, res in GEMM_CASES:
        out, ref = run_gemm(mod, M, N, K, dtype, out_dtype, bias, act, b_layout, residual=res)
        check_close(out, ref, out_dtype)


@pytest.mark.parametrize("b_layout", ["kn", "nk"])
@pytest.mark.parametrize("M,N,K", GEMM_SHAPES)
def test_sm90_gemm_template(b_layout, M, N, K):
    mod = load_module(sm90_gemm_source(), f"sm90_gemm_{b_layout}")
    for dtype, out_dtype, bias, act, res in GEMM_CASES:
        out, ref = run_gemm(mod, M, N, K, dtype, out_dtype, bias, act, b_layout, residual=res)
        check_close(out, ref, out_dtype)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_gemm_templates_other_interleavings(seed):
    # more tiles per program than TMEM buffers / smem stages, several seeds: the rings wrap many times
    for source, name in ((sm100_gemm_source(), "sm100_gemm_seeded"), (sm90_gemm_source(), "sm90_gemm_seeded")):
        mod = load_module(source, name, seed=seed)
        out, ref = run_gemm(mod, 256, 200, 160, torch.bfloat16, torch.float32, True, "none", "kn", num_sms=1,
                            seed=seed)
        check_close(out, ref, torch.float32)


# ============================================================================================ real templates: attention

ATTN_SHAPES = [[1, 2, 1, 130, 200], [1, 1, 1, 1, 64], [1, 2, 2, 200, 90]]


@pytest.mark.parametrize("target", ["sm100", "sm90"])
@pytest.mark.parametrize("shape", ATTN_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_attention_templates(target, shape):
    mod = load_module(attention_source(target), f"{target}_attention")
    for mod_name in [m["name"] for m in ATTN_MODS]:
        out, lse, ref_o, ref_lse = run_attention(mod, shape, mod_name)
        check_attention(out, lse, ref_o, ref_lse)


@pytest.mark.parametrize("target", ["sm100", "sm90"])
def test_attention_templates_persistent_many_tiles(target):
    # one program walks several (b, h, q-block) tiles: rings and TMEM/smem buffers are reused across tiles
    mod = load_module(attention_source(target), f"{target}_attention_persist", seed=7)
    for mod_name in ("causal", "win"):
        out, lse, ref_o, ref_lse = run_attention(mod, [2, 2, 1, 300, 260], mod_name, dtype="float16", num_sms=1)
        check_attention(out, lse, ref_o, ref_lse)


# ============================================================================================ real templates: broken copies

def _gemm_small(mod, b_layout="kn", M=256, N=128, K=160, num_sms=1):
    return run_gemm(mod, M, N, K, torch.float16, torch.float16, False, "none", b_layout, num_sms=num_sms)


def test_sm100_gemm_wrong_phase_deadlock():
    src = sm100_gemm_source()
    bad = substitute(src, "mbarrier.wait(empty_bars.index(slot), phase ^ 1)",
                     "mbarrier.wait(empty_bars.index(slot), phase)")
    mod = load_module(bad, "sm100_gemm_wrong_phase")
    msg = expect_error(DeadlockError, _gemm_small, mod)
    wait = f"sm100_gemm_wrong_phase.py:{line_of(bad, 'mbarrier.wait(empty_bars.index(slot), phase)')} " \
           "(in producer_acquire): mbarrier.wait(empty_bars.index(slot), phase)"
    assert msg.startswith("deadlock in program (0, 0, 0) of `gemm_kernel`")
    assert ("partition `_load_partition` (worker 0, 1 warp): blocked in mbarrier.wait on barrier empty[0] "
            "(view empty.index(0)) waiting for the phase with parity 0 to complete; barrier empty[0]: current "
            "phase 0 (parity 0), 1 of 1 arrivals pending") in msg
    assert ("partition `_mma_partition` (worker 1, 1 warp): blocked in mbarrier.wait on barrier acc_empty[0]") in msg
    assert ("partition `_epilogue_partition` (default, 4 warps): blocked in mbarrier.wait on barrier "
            "acc_ready[0]") in msg
    assert msg.count(wait) == 2  # loader and MMA warp both wait in producer_acquire
    call = f"called from sm100_gemm_wrong_phase.py:{line_of(bad, 's = producer_acquire(empty, fill, STAGES)')}"
    assert call in msg


def test_sm100_gemm_missing_wait_hazard():
    src = sm100_gemm_source()
    bad = substitute(src, "            s = consumer_wait(ready, use, STAGES)\n",
                     "            s, _unused_phase = ring_slot(use, STAGES)\n")
    mod = load_module(bad, "sm100_gemm_missing_wait")
    msg = expect_error(HazardError, _gemm_small, mod)
    # whichever of the two is issued first, the other one is flagged
    assert re.match(r"(read-after-write|write-after-read) hazard on shared memory `a_smem`", msg)
    assert "async TMA load (tma.async_copy_global_to_shared) issued by partition `_load_partition` " \
           "writes (TMA load destination) a_smem.index(0)" in msg
    assert "async tcgen05_mma issued by partition `_mma_partition` reads (tcgen05_mma operand a) " \
           "a_smem.index(0)" in msg
    tma_line = line_of(bad, "_tma_load(a_desc, [off_m, ki * BLOCK_K]")
    mma_line = line_of(bad, "tcgen05_mma(a_smem.index(s), b_view, acc")
    assert f"sm100_gemm_missing_wait.py:{tma_line} (in _load_partition)" in msg
    assert f"sm100_gemm_missing_wait.py:{mma_line} (in _mma_partition)" in msg


def test_sm100_gemm_wrong_expect_bytes_deadlock():
    src = sm100_gemm_source()
    bad = substitute(src, "STAGE_BYTES: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes",
                     "STAGE_BYTES: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes + 128")
    mod = load_module(bad, "sm100_gemm_expect")
    msg = expect_error(DeadlockError, _gemm_small, mod)
    assert ("partition `_mma_partition` (worker 1, 1 warp): blocked in mbarrier.wait on barrier ready[0] (view "
            "ready.index(0)) waiting for the phase with parity 0 to complete; barrier ready[0]: current phase 0 "
            "(parity 0), 0 of 1 arrivals pending, tx bytes pending 128 (expected 12416 via mbarrier.expect, TMA "
            "delivered 12288 so far this phase)") in msg
    wait = line_of(bad, "mbarrier.wait(ready_bars.index(slot), phase)")
    assert f"sm100_gemm_expect.py:{wait} (in consumer_wait)" in msg


def test_sm100_gemm_smem_released_before_mma_completes():
    # the stage is handed back at MMA issue instead of MMA completion: the loader overwrites it in flight
    src = sm100_gemm_source()
    old = "tcgen05_mma(a_smem.index(s), b_view, acc, use_acc=use_acc, mbarriers=[empty.index(s)])"
    bad = substitute(src, old, "tcgen05_mma(a_smem.index(s), b_view, acc, use_acc=use_acc)\n"
                               "            mbarrier.arrive(empty.index(s), count=1)")
    mod = load_module(bad, "sm100_gemm_early_release")
    msg = expect_error(HazardError, _gemm_small, mod)
    assert msg.startswith("write-after-read hazard on shared memory `a_smem`") or \
        msg.startswith("write-after-read hazard on shared memory `b_smem`")
    assert "earlier: async tcgen05_mma issued by partition `_mma_partition` reads (tcgen05_mma operand" in msg
    assert "later:   async TMA load (tma.async_copy_global_to_shared) issued by partition `_load_partition`" in msg
    assert f"sm100_gemm_early_release.py:{line_of(bad, 'tcgen05_mma(a_smem.index(s), b_view, acc')}" in msg


def test_sm100_gemm_tmem_released_before_epilogue_read():
    # the epilogue hands the TMEM accumulator back before it has read the last slice
    src = sm100_gemm_source()
    bad = substitute(src, "                if j == SLICES - 1:\n", "                if j == 0:\n")
    mod = load_module(bad, "sm100_gemm_tmem_early")
    msg = expect_error(HazardError, _gemm_small, mod)
    assert "hazard on tensor memory `acc_tmem`" in msg
    assert "partition `_epilogue_partition` reads (tensor_memory_descriptor.load)" in msg
    assert "async tcgen05_mma issued by partition `_mma_partition` writes (tcgen05_mma accumulator)" in msg


def test_sm100_gemm_missing_store_wait():
    src = sm100_gemm_source()
    bad = substitute(src, "                tma.store_wait(EPI_BUFFERS - 1)\n", "")
    mod = load_module(bad, "sm100_gemm_no_store_wait")
    msg = expect_error(HazardError, _gemm_small, mod)
    assert msg.startswith("write-after-read hazard on shared memory `c_smem`")
    assert "async TMA store (tma.async_copy_shared_to_global) issued by partition `_epilogue_partition` reads " \
           "(TMA store source)" in msg
    assert "partition `_epilogue_partition` writes (shared_memory_descriptor.store)" in msg


def test_sm90_gemm_stage_released_while_wgmma_in_flight():
    src = sm90_gemm_source()
    bad = substitute(src, "mbarrier.arrive(empty.index(prev), count=1, pred=ki > k_lo)",
                     "mbarrier.arrive(empty.index(s), count=1)")
    mod = load_module(bad, "sm90_gemm_early_release")
    msg = expect_error(HazardError, _gemm_small, mod)
    assert "write-after-read hazard on shared memory" in msg
    assert "async warpgroup_mma issued by partition `_mma_epilogue_partition` reads (warpgroup_mma operand" in msg
    assert "async TMA load (tma.async_copy_global_to_shared) issued by partition `_load_partition`" in msg


def test_sm90_gemm_wrong_phase_hazard():
    # consumer waits on the wrong parity: passes a fresh `ready` barrier before the TMA has landed
    src = sm90_gemm_source()
    bad = substitute(src, "mbarrier.wait(ready_bars.index(slot), phase)",
                     "mbarrier.wait(ready_bars.index(slot), phase ^ 1)")
    mod = load_module(bad, "sm90_gemm_wrong_phase")
    msg = expect_error(HazardError, _gemm_small, mod)
    assert re.match(r"(read-after-write|write-after-read) hazard on shared memory `a_smem`", msg)
    assert "issued by partition `_load_partition` writes (TMA load destination)" in msg
    assert "async warpgroup_mma issued by partition `_mma_epilogue_partition` reads" in msg


def test_sm100_attention_o_overwritten_before_correction():
    src = attention_source("sm100")
    old = "                    producer_acquire(o_free, _tile_use(o_use, t, Q_TILES), Q_TILES)"
    bad = substitute(src, old, "                    pass")
    mod = load_module(bad, "sm100_attention_no_o_free")
    msg = expect_error(HazardError, run_attention, mod, [2, 2, 1, 300, 260], "none", num_sms=1)
    assert "hazard on tensor memory `o_tmem`" in msg
    assert "async tcgen05_mma issued by partition `_mma_partition` writes (tcgen05_mma accumulator)" in msg
    assert "partition `_correction_partition`" in msg


def test_sm100_attention_s_overwritten_before_softmax():
    # the MMA warp does not wait for softmax to hand back P before writing the next S into the same columns
    src = attention_source("sm100")
    old = "                    producer_acquire(p_ready, _tile_use(s_use + 1, t, Q_TILES), Q_TILES)"
    bad = substitute(src, old, "                    pass")
    mod = load_module(bad, "sm100_attention_no_p_ready")
    msg = expect_error(SimulationError, run_attention, mod, [1, 2, 1, 300, 260], "none", num_sms=1)
    assert "hazard on tensor memory `s_tmem`" in msg
    # the first unordered pair found: the PV reads P from S's columns, which the QK wrote with no completed wait
    # between them in the MMA warp (MMAs into different accumulators are not ordered by issue)
    assert "reads (tcgen05_mma operand a)" in msg and "writes (tcgen05_mma accumulator) s_tmem" in msg, msg


def test_sm90_attention_tests_run_the_two_consumer_ping_pong_path():
    mod = load_module(attention_source("sm90"), "sm90_attention_consumers")
    assert mod.NUM_CONSUMERS == 2 and mod.WG_M == 64
    assert "_turn_wait(turn_mine, kv_cnt, CID, PINGPONG)" in attention_source("sm90")


def test_sm90_attention_v_released_early():
    # V's slot is handed back right after O += P V is issued instead of after it retired
    src = attention_source("sm90")
    bad = substitute(src, "        mbarrier.arrive(v_empty.index(v_slot), count=1)\n        kv_cnt += 1\n",
                     "        kv_cnt += 1\n")
    bad = substitute(bad, "        o_tok = warpgroup_mma(p_op, v, o_acc, is_async=True)\n",
                     "        o_tok = warpgroup_mma(p_op, v, o_acc, is_async=True)\n"
                     "        mbarrier.arrive(v_empty.index(v_slot), count=1)\n")
    mod = load_module(bad, "sm90_attention_v_early")
    msg = expect_error(HazardError, run_attention, mod, [1, 2, 1, 130, 600], "none", num_sms=1)
    assert msg.startswith("write-after-read hazard on shared memory `v_smem`")
    assert "async warpgroup_mma issued by partition `_consumer` reads (warpgroup_mma operand b)" in msg
    assert "issued by partition `_producer` writes (TMA load destination)" in msg
    assert f"sm90_attention_v_early.py:{line_of(bad, 'o_tok = warpgroup_mma(p_op, v, o_acc')} (in _kv_steps)" in msg


def test_sm90_attention_k_released_early_is_benign():
    # Releasing K_{j+1} before S_{j+1} retires looks wrong but is ordered anyway: the producer refills that
    # slot only after acquiring V_{j+2}, which needs V_j released, which happens after S_{j+1} retired.
    # The simulator reasons with happens-before and must not report it.
    src = attention_source("sm90")
    old = ("            s = warpgroup_mma_wait(0, deps=(s_tok, ))\n"
           "            o_acc, p_op = warpgroup_mma_wait(0, deps=(o_tok, p_op))\n"
           "            mbarrier.arrive(k_empty.index(k_slot), count=1)\n")
    new = ("            mbarrier.arrive(k_empty.index(k_slot), count=1)\n"
           "            s = warpgroup_mma_wait(0, deps=(s_tok, ))\n"
           "            o_acc, p_op = warpgroup_mma_wait(0, deps=(o_tok, p_op))\n")
    mod = load_module(substitute(src, old, new), "sm90_attention_k_early")
    check_attention(*run_attention(mod, [1, 2, 1, 130, 600], "none", num_sms=1))


def test_sm100_attention_fully_masked_cta_tiles():
    # causal with Lq > Lk: the first CTA tiles of each head see no key at all (n == 0). The simulator once caught
    # the correction partition reading O from TMEM here, unordered against the next tile's PV MMA (a HazardError).
    mod = load_module(attention_source("sm100"), "sm100_attention_masked_tiles")
    check_attention(*run_attention(mod, [1, 2, 1, 600, 60], "causal", num_sms=1))


def test_sm90_attention_fully_masked_cta_tiles():
    mod = load_module(attention_source("sm90"), "sm90_attention_masked_tiles")
    check_attention(*run_attention(mod, [1, 2, 1, 600, 60], "causal", num_sms=1))


def test_reading_unwritten_memory_shows_nan():
    # use_acc=True on the first MMA accumulates onto never-written TMEM (modelled as NaN): results turn NaN
    src = sm100_gemm_source()
    bad = substitute(src, "        use_acc = False", "        use_acc = True")
    mod = load_module(bad, "sm100_gemm_use_acc")
    out, _ = _gemm_small(mod)
    assert torch.isnan(out).all()

