"""`python -m gen scan` on dumps made here, on CPU.

(a) a Triton cache dir: small @triton.jit kernels cross-compiled for sm_90 under a temporary TRITON_CACHE_DIR;
(b) real Inductor output: torch.compile on this CPU-only machine with `cpu_backend = "triton"` and a stand-in Triton
    driver that reports a CUDA sm_90 target. Inductor then generates Triton kernels and writes output_code.py
    (TORCH_COMPILE_DEBUG), the TORCH_LOGS=output_code log and its cache .py files; compiling them fails (no CPU
    backend in stock Triton), after the files are written. A hand-written fixture in Inductor's exact embedded format
    covers the parser whatever the installed torch does.
Both dumps are produced by child processes started together (their import + compile time overlaps).
"""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gen.analysis.scan import (ScanError, classify_source, classify_ttgir, dot_operand_dtypes, embedded_kernels, scan, scan_main,
                      tc_op_counts, uses_tensor_cores)

KERNELS_PY = '''
import triton
import triton.language as tl


@triton.jit
def mm_kernel(a_ptr, b_ptr, c_ptr, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
        b = tl.load(b_ptr + (k + rk)[:, None] * BN + rn[None, :])
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + rm[:, None] * BN + rn[None, :], acc.to(tl.bfloat16))


@triton.jit
def attn_kernel(q_ptr, k_ptr, v_ptr, o_ptr, L, BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.arange(0, BN)
    rd = tl.arange(0, D)
    q = tl.load(q_ptr + rm[:, None] * D + rd[None, :])
    m_i = tl.full((BM,), float("-inf"), tl.float32)
    l_i = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((BM, D), tl.float32)
    for start in range(0, L, BN):
        k = tl.load(k_ptr + (start + rn)[None, :] * D + rd[:, None])
        s = tl.dot(q, k)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + (start + rn)[:, None] * D + rd[None, :])
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v)
        m_i = m_new
    tl.store(o_ptr + rm[:, None] * D + rd[None, :], (acc / l_i[:, None]).to(tl.float16))


@triton.jit
def row_sum_kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * N + cols, mask=cols < N, other=0.0)
    tl.store(y_ptr + row, tl.sum(x, 0))


@triton.jit
def scale_add_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(y_ptr + offs, x * 2.0 + 1.0, mask=offs < n)
'''

COMPILE_PY = '''
import sys
sys.path.insert(0, sys.argv[1])
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import kernels as K

target = GPUTarget("cuda", 90, 32)
jobs = [
    (K.mm_kernel, {"a_ptr": "*bf16", "b_ptr": "*bf16", "c_ptr": "*bf16", "K": "i32"},
     {"BM": 128, "BN": 64, "BK": 32}, 4),
    (K.attn_kernel, {"q_ptr": "*fp16", "k_ptr": "*fp16", "v_ptr": "*fp16", "o_ptr": "*fp16", "L": "i32"},
     {"BM": 64, "BN": 64, "D": 64}, 4),
    (K.row_sum_kernel, {"x_ptr": "*fp32", "y_ptr": "*fp32", "N": "i32"}, {"BLOCK": 1024}, 4),
    (K.scale_add_kernel, {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32"}, {"BLOCK": 1024}, 4),
]
for fn, sig, consts, warps in jobs:
    sig = {**sig, **{k: "constexpr" for k in consts}}
    triton.compile(ASTSource(fn, sig, constexprs=consts), target=target, options={"num_warps": warps})
print("compiled", len(jobs))
'''

# torch.compile on a CPU-only machine, Triton CPU codegen, a stand-in driver so Inductor can hash a (CUDA) backend.
INDUCTOR_PY = '''
import torch
import torch._inductor.config as cfg
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver


class StandInDriver:  # only what Inductor's codegen asks of the active driver
    def is_active(self):
        return True

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)


driver.set_active(StandInDriver())
cfg.cpu_backend = "triton"
cfg.compile_threads = 1
cfg.max_autotune_gemm_backends = "TRITON"
cfg.test_configs.max_mm_configs = 1  # one template choice: nothing to benchmark, so codegen goes through


def mm_bias_gelu(a, b, bias, x, y):
    out = torch.nn.functional.gelu(a @ b + bias, approximate="tanh")
    return out, torch.softmax(x, -1), torch.relu(y) * 2.0, x.sum(0)


args = (torch.randn(64, 32), torch.randn(32, 16), torch.randn(16), torch.randn(4096, 24), torch.randn(100))
try:
    torch.compile(mm_bias_gelu, mode="max-autotune")(*args)
except Exception as e:  # expected: the generated kernels cannot be compiled for the CPU
    print("compile failed as expected:", type(e).__name__, str(e)[:200])
'''

OUTPUT_CODE_FIXTURE = '''# AOT ID: ['0_inference']
import torch
from torch._inductor.async_compile import AsyncCompile
async_compile = AsyncCompile()


# kernel path: /tmp/torchinductor_user/ab/cabcd.py
triton_tem_fused_addmm_gelu_0 = async_compile.triton('triton_tem_fused_addmm_gelu_0', \'\'\'
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics

@triton_heuristics.template(
    num_stages=3,
    num_warps=8,
    triton_meta={'signature': {'in_ptr0': '*bf16', 'arg_A': '*bf16', 'arg_B': '*bf16', 'out_ptr1': '*bf16'}},
    inductor_meta={'kernel_name': 'triton_tem_fused_addmm_gelu_0'},
)
@triton.jit
def triton_tem_fused_addmm_gelu_0(in_ptr0, arg_A, arg_B, out_ptr1):
    BLOCK_M : tl.constexpr = 128
    BLOCK_N : tl.constexpr = 128
    BLOCK_K : tl.constexpr = 64
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k_idx in range(0, tl.cdiv(4096, BLOCK_K)):
        a = tl.load(arg_A)
        b = tl.load(arg_B)
        acc += tl.dot(a, b, allow_tf32=False, out_dtype=tl.float32)
    tmp0 = tl.load(in_ptr0)
    tmp1 = acc + tmp0
    tmp2 = libdevice.tanh(tmp1)
    tl.store(out_ptr1, tmp2)
\'\'\', device_str='cuda')


# kernel path: /tmp/torchinductor_user/cd/ccdef.py
triton_red_fused_sum_1 = async_compile.triton('triton_red_fused_sum_1', \'\'\'
import triton
import triton.language as tl

@triton_heuristics.reduction(size_hints={'x': 128, 'r0_': 4096})
@triton.jit
def triton_red_fused_sum_1(in_ptr0, out_ptr0, xnumel, r0_numel, XBLOCK : tl.constexpr, R0_BLOCK : tl.constexpr):
    _tmp2 = tl.full([XBLOCK, R0_BLOCK], 0, tl.float32)
    for r0_offset in range(0, r0_numel, R0_BLOCK):
        tmp0 = tl.load(in_ptr0 + r0_offset)
        _tmp2 = _tmp2 + tmp0
    tmp2 = tl.sum(_tmp2, 1)[:, None]
    tl.store(out_ptr0, tmp2)
\'\'\', device_str='cuda')


# kernel path: /tmp/torchinductor_user/ef/cefgh.py
triton_poi_fused_mul_relu_2 = async_compile.triton('triton_poi_fused_mul_relu_2', \'\'\'
import triton
import triton.language as tl

@triton_heuristics.pointwise(size_hints={'x': 128})
@triton.jit
def triton_poi_fused_mul_relu_2(in_ptr0, out_ptr0, xnumel, XBLOCK : tl.constexpr):
    tmp0 = tl.load(in_ptr0)
    tmp1 = triton_helpers.maximum(0, tmp0)
    tl.store(out_ptr0, tmp1 * 2.0)
\'\'\', device_str='cuda')


async_compile.wait(globals())
del async_compile
'''


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_", "TORCHINDUCTOR_", "TRITON_"))}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    """Both dumps, made by two child processes running at the same time."""
    root = tmp_path_factory.mktemp("dumps")
    src = root / "src"
    src.mkdir()
    (src / "kernels.py").write_text(KERNELS_PY)
    (src / "compile_them.py").write_text(COMPILE_PY)
    (src / "inductor_cpu.py").write_text(INDUCTOR_PY)
    tcache, ind = root / "triton_cache", root / "inductor"
    ind.mkdir()
    log = open(ind / "output_code.log", "w")
    p_triton = subprocess.Popen([sys.executable, str(src / "compile_them.py"), str(src)], cwd=src, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_env(TRITON_CACHE_DIR=str(tcache), TRITON_KERNEL_DUMP="1",
                                         TRITON_DUMP_DIR=str(root / "triton_dump")))
    p_ind = subprocess.Popen([sys.executable, str(src / "inductor_cpu.py")], cwd=ind, stdout=subprocess.DEVNULL, stderr=log,
                             env=_env(TORCH_COMPILE_DEBUG="1", TORCH_COMPILE_DEBUG_DIR=str(ind / "debug"),
                                      TORCH_LOGS="output_code", TORCHINDUCTOR_CACHE_DIR=str(ind / "cache"),
                                      TRITON_CACHE_DIR=str(ind / "triton_cache")))
    out, _ = p_triton.communicate(timeout=300)
    p_ind.wait(timeout=300)
    log.close()
    assert p_triton.returncode == 0, out
    return {"triton": tcache, "dump": root / "triton_dump", "src": src, "inductor": ind}


# ---------------------------------------------------------------- (a) Triton cache

def test_triton_cache_classes_and_figures(dumps):
    ks = {k.name: k for k in scan(dumps["triton"])}
    assert set(ks) == {"mm_kernel", "attn_kernel", "row_sum_kernel", "scale_add_kernel"}
    assert ks["mm_kernel"].kind == "matmul" and ks["mm_kernel"].families == ("gemm",)
    assert ks["attn_kernel"].kind == "attention-like" and ks["attn_kernel"].families == ("attention",)
    assert ks["row_sum_kernel"].kind == "reduction" and ks["row_sum_kernel"].families == ()
    assert ks["scale_add_kernel"].kind == "pointwise" and ks["scale_add_kernel"].families == ()
    for k in ks.values():
        assert k.origin[0] == "triton-cache" and k.versions == 1
        assert k.target == "cuda:90" and k.num_warps == 4
        assert k.ttgir and k.ttgir_path.endswith(f"{k.name}.ttgir") and k.cubin_path.endswith(".cubin")
        assert k.source and f"def {k.name}(" in k.source     # read back through the TTGIR's #loc
        assert k.convert_layouts is not None and k.smem_bytes is not None and k.regs
    # Hopper tensor cores: wgmma in TTGIR, HGMMA in SASS
    assert ks["mm_kernel"].tc_ops == {"ttng.warp_group_dot": 1} and ks["mm_kernel"].sass.get("HGMMA", 0) > 0
    assert ks["attn_kernel"].tc_ops.get("ttng.warp_group_dot") == 2 and ks["attn_kernel"].tensor_cores
    assert ks["mm_kernel"].smem_bytes > 0 and ks["mm_kernel"].dots == 1 and ks["attn_kernel"].dots == 2
    for name in ("row_sum_kernel", "scale_add_kernel"):
        assert ks[name].tc_ops == {} and ks[name].tensor_cores is False and not ks[name].sass.get("HGMMA")
    # the same classes from the TTGIR alone (what a dump without sources gives)
    for k in ks.values():
        assert classify_ttgir(k.name, k.ttgir)[0] == k.kind


def test_triton_cache_without_sources_classifies_from_ttgir(dumps, tmp_path):
    import shutil

    copy = tmp_path / "cache"
    shutil.copytree(dumps["triton"], copy)
    moved = dumps["src"] / "kernels.py"
    hidden = moved.with_suffix(".hidden")
    moved.rename(hidden)
    try:
        ks = {k.name: k for k in scan(copy, sass=False)}
    finally:
        hidden.rename(moved)
    assert {n: k.kind for n, k in ks.items()} == {"mm_kernel": "matmul", "attn_kernel": "attention-like",
                                                   "row_sum_kernel": "reduction", "scale_add_kernel": "pointwise"}
    assert all(not k.source and k.reason.startswith("TTGIR") for k in ks.values())
    assert all(k.sass == {} for k in ks.values())


def test_scan_main_prints_table(dumps, capsys):
    assert scan_main(dumps["triton"]) == 0
    out = capsys.readouterr().out
    assert "attn_kernel" in out and "attention-like" in out and "specs/attention.yaml" in out
    assert "wgmma:1" in out and "HGMMA" in out
    assert "could be replaced by generated.gemm" in out


def test_triton_dump_dir_without_metadata(dumps, tmp_path):
    """TRITON_KERNEL_DUMP=1 + TRITON_DUMP_DIR: IR files and <name>.sass, no json; names and warps come from the TTGIR."""
    import shutil

    ks = {k.name: k for k in scan(dumps["dump"], sass=False)}
    assert {n: k.kind for n, k in ks.items()} == {"mm_kernel": "matmul", "attn_kernel": "attention-like",
                                                   "row_sum_kernel": "reduction", "scale_add_kernel": "pointwise"}
    for k in ks.values():
        assert k.origin[0] == "triton-dump" and k.num_warps == 4 and k.target == "cuda:90"
        assert k.smem_bytes is None                       # only the json says; absent, not 0
    copy = tmp_path / "dump"
    shutil.copytree(dumps["dump"], copy)
    for cubin in copy.rglob("*.cubin"):
        cubin.unlink()                                    # no cubin: SASS counts from the dumped .sass text
    mm = {k.name: k for k in scan(copy)}["mm_kernel"]
    assert mm.sass.get("HGMMA", 0) > 0 and mm.tensor_cores is True and mm.regs is None


def test_whole_dump_root_links_each_compiled_kernel_to_its_own_source(dumps):
    """The four kernels share one source file: each compiled version joins its own function, not the file's last."""
    ks = {k.name: k for k in scan(dumps["triton"].parent, sass=False)}
    for name in ("mm_kernel", "attn_kernel", "row_sum_kernel", "scale_add_kernel"):
        k = ks[name]
        # the cache and the dump hold the same compile twice: two versions of one kernel, linked to one source
        assert k.origin[:2] == ("python", "triton-cache") and k.versions == 2, k
        assert f"def {name}(" in k.source and k.ttgir_path.endswith(f"{name}.ttgir")
    assert ks["mm_kernel"].tc_ops == {"ttng.warp_group_dot": 1} and ks["scale_add_kernel"].tc_ops == {}
    assert dot_operand_dtypes(ks["attn_kernel"].ttgir) == {"f16"} and not ks["attn_kernel"].note
    assert ks["mm_kernel"].used is None                   # not an Inductor kernel: "launched" does not apply


# ---------------------------------------------------------------- (b) Inductor output

def _inductor_or_skip(dumps):
    ind = dumps["inductor"]
    if not list((ind / "debug").rglob("output_code.py")):
        pytest.skip("this torch did not write Inductor Triton kernels on CPU (stand-in driver trick); "
                    "the hand-written fixture tests cover the format")
    return ind


def test_inductor_debug_output(dumps):
    ind = _inductor_or_skip(dumps)
    ks = scan(ind / "debug")
    kinds = {k.name: k.kind for k in ks}
    tem = [k for k in ks if k.name.startswith("triton_tem_")]
    assert tem and all(k.kind == "matmul" and k.families == ("gemm",) for k in tem)
    assert any(n.startswith(("triton_per_", "triton_red_")) and kd == "reduction" for n, kd in kinds.items())
    assert any(n.startswith("triton_poi_") and kd == "pointwise" for n, kd in kinds.items())
    for k in ks:
        assert k.origin[0] == "inductor-output" and k.where[0].endswith("output_code.py")
        assert k.used is True and k.source.lstrip().startswith("import triton")
        assert k.ttgir == "" and k.tensor_cores is None and k.num_warps is None   # no IR on CPU: absent, not 0


def test_inductor_log_matches_debug_output(dumps):
    ind = _inductor_or_skip(dumps)
    from_debug = {(k.name, k.kind, k.source) for k in scan(ind / "debug")}
    from_log = scan(ind / "output_code.log")
    assert {(k.name, k.kind, k.source) for k in from_log} == from_debug
    assert all(k.origin == ("inductor-log",) for k in from_log)


def test_inductor_cache_dir(dumps):
    ind = _inductor_or_skip(dumps)
    ks = scan(ind / "cache")
    launched = {k.name for k in ks if k.used}
    assert launched == {k.name for k in scan(ind / "debug")}
    # the template's per-kernel file and the wrapper module's embedded copy are one entry
    assert len([k for k in ks if k.name in launched]) == len(launched)
    # the max-autotune choice that was compiled only to be benchmarked is listed, but not as launched
    assert all(k.used is False for k in ks if k.name not in launched)
    # the whole dir at once: the same kernels, found in several places
    everything = {k.name: k for k in scan(ind)}
    assert launched <= set(everything)
    assert any(len(everything[n].origin) > 1 for n in launched)


# ---------------------------------------------------------------- fixtures by hand, pure helpers, errors

def test_handwritten_output_code_and_log(tmp_path):
    (tmp_path / "output_code.py").write_text(OUTPUT_CODE_FIXTURE)
    prefix = "V1201 10:00:00.000000 4242 torch/_inductor/graph.py:2722] [0/0] [__output_code] "
    log = tmp_path / "logs" / "run.log"
    log.parent.mkdir()
    log.write_text("I1201 09:59:59.000000 4242 torch/_dynamo/x.py:1] something else\n" +
                   prefix + "Output code: \n" + "\n".join(prefix + line for line in OUTPUT_CODE_FIXTURE.splitlines()))
    ks = {k.name: k for k in scan(tmp_path / "output_code.py")}
    assert {n: k.kind for n, k in ks.items()} == {"triton_tem_fused_addmm_gelu_0": "matmul",
                                                   "triton_red_fused_sum_1": "reduction",
                                                   "triton_poi_fused_mul_relu_2": "pointwise"}
    from_log = {k.name: k for k in scan(log)}
    assert {n: k.source for n, k in from_log.items()} == {n: k.source for n, k in ks.items()}
    both = {k.name: k for k in scan(tmp_path)}       # the same kernels in two files: one entry each
    assert len(both) == 3 and both["triton_red_fused_sum_1"].origin == ("inductor-output", "inductor-log")


def test_embedded_kernels_and_classify_source():
    emb = dict(embedded_kernels(OUTPUT_CODE_FIXTURE))
    assert list(emb) == ["triton_tem_fused_addmm_gelu_0", "triton_red_fused_sum_1", "triton_poi_fused_mul_relu_2"]
    assert emb["triton_red_fused_sum_1"].startswith("import triton")
    flex_like = textwrap.dedent('''
        @triton.jit
        def triton_tem_fused_flex_attention_0(Q, K, V):
            qk = tl.dot(q, tl.trans(k))
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            p = tl.math.exp2(qk - m_ij[:, None])
            acc = tl.dot(p.to(tl.bfloat16), v, acc)
    ''')
    assert classify_source("triton_tem_fused_flex_attention_0", flex_like)[0] == "attention-like"
    # two dots without softmax: a matmul chain, not attention
    chain = "@triton.jit\ndef k(a):\n    x = tl.dot(a, b)\n    y = tl.dot(x, c)\n"
    assert classify_source("k", chain)[:1] == ("matmul",) and classify_source("k", chain)[2] == 2
    assert classify_source("triton_per_fused__softmax_0", "def f():\n    tmp4 = triton_helpers.max2(tmp3, 1)\n")[0] == "reduction"
    assert classify_source("triton_poi_fused_0", "def f():\n    tl.store(p, tl.load(q))\n")[0] == "pointwise"
    # the dot inside decorator metadata is not a dot
    assert classify_source("triton_poi_x", "@h(meta={'tl.dot(': 1})\n@triton.jit\ndef f():\n    pass\n")[0] == "pointwise"


def test_ttgir_helpers():
    fma = ('#blocked = #ttg.blocked<{sizePerThread = [1, 1]}>\n'
           '%d = tt.dot %a, %b, %c : tensor<16x16xf32, #ttg.dot_op<{opIdx = 0, parent = #blocked}>> * '
           'tensor<16x16xf32, #ttg.dot_op<{opIdx = 1, parent = #blocked}>> -> tensor<16x16xf32, #blocked>\n')
    assert tc_op_counts(fma) == {"tt.dot": 1} and not uses_tensor_cores(fma)
    assert dot_operand_dtypes(fma) == {"f32"}
    mma = '#mma = #ttg.nvidia_mma<{versionMajor = 2}>\n' + fma.replace("-> tensor<16x16xf32, #blocked>", "-> tensor<16x16xf32, #mma>")
    assert uses_tensor_cores(mma)
    assert uses_tensor_cores("", {"HMMA": 4}) and not uses_tensor_cores("", {"FFMA": 4, "LDL": 1})
    wg = "%x = ttng.warp_group_dot %a, %b, %c\n%y = ttng.warp_group_dot_wait %x\n"
    assert tc_op_counts(wg) == {"ttng.warp_group_dot": 1}


def test_missing_and_empty_dirs(tmp_path, capsys):
    assert scan_main(tmp_path / "nope") == 2
    assert "does not exist" in capsys.readouterr().err
    assert scan_main(tmp_path) == 2
    assert "is empty" in capsys.readouterr().err
    (tmp_path / "notes.txt").write_text("nothing here\n")
    with pytest.raises(ScanError, match="no Triton kernel found"):
        scan(tmp_path)


def test_cli_routes_scan(tmp_path):
    (tmp_path / "output_code.py").write_text(OUTPUT_CODE_FIXTURE)
    r = subprocess.run([sys.executable, "-m", "gen", "scan", str(tmp_path)], capture_output=True, text=True,
                       cwd=Path(__file__).resolve().parent.parent)
    assert r.returncode == 0, r.stderr
    assert "triton_tem_fused_addmm_gelu_0" in r.stdout and "gemm (specs/gemm.yaml)" in r.stdout
    r = subprocess.run([sys.executable, "-m", "gen", "scan", str(tmp_path / "missing")], capture_output=True, text=True,
                       cwd=Path(__file__).resolve().parent.parent)
    assert r.returncode == 2 and "error:" in r.stderr
