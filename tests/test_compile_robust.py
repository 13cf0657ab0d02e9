"""A compile failure of one candidate is one rejected candidate: crashes, exceptions and hangs are contained."""
import textwrap

from gen.build.compile import CompileRequest, compile_many
from gen.build.render import Source
from gen.build.targets import SM90, TRITON

GOOD = textwrap.dedent('''
    import triton
    import triton.language as tl

    KERNEL_MODE = "triton"

    @triton.jit
    def copy(x, y, N: tl.constexpr):
        o = tl.arange(0, N)
        tl.store(y + o, tl.load(x + o))

    def compile_jobs(case):
        return [{"name": "copy", "fn": copy, "signature": {"x": "*fp32", "y": "*fp32", "N": "constexpr"},
                 "constexprs": {"N": 128}, "options": {"num_warps": 4}}]
    # variant %s
''')
ABORTS = GOOD.replace('def compile_jobs(case):', 'def compile_jobs(case):\n    import os; os.abort()')
RAISES = GOOD.replace('tl.load(x + o))', 'tl.load(x + o) + undefined_name)')


def source(text, tag):
    return Source("test", "triton", {"tag": tag}, "none", "0", text % tag)


def test_abort_and_error_are_reported_and_others_still_compile(tmp_path, monkeypatch):
    monkeypatch.setenv("GEN_CACHE_DIR", str(tmp_path))
    reqs = [CompileRequest(source(ABORTS, "abort"), {}, TRITON),
            CompileRequest(source(RAISES, "raise"), {}, TRITON),
            CompileRequest(source(GOOD, "good"), {}, SM90)]
    aborted, raised, good = compile_many(reqs, jobs=2)
    assert not aborted[0].ok and "compiler process died" in aborted[0].error
    assert not raised[0].ok and "undefined_name" in raised[0].error
    assert good[0].ok and good[0].ttgir and "Function" in good[0].resource_usage
    # the good one is cached: a second run starts no compiler and says so
    (again,) = compile_many([reqs[2]], jobs=1)
    assert again[0].cached and again[0].ttgir == good[0].ttgir
