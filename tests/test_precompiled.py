"""Zero-JIT import: the bundled binaries (generated/<family>/kernels/<target>/) serve the JIT's first launch.

On this CPU machine a stand-in driver makes Triton's JIT bind and look up kernels for the target GPU exactly as a
launch on that GPU does; only the launch itself is skipped. The Triton compiler is made to raise, so a test passes
only if every lookup is a cache hit on what the run time's seed put there from the bundle.
"""
from __future__ import annotations

import hashlib
import importlib
import json
import lzma
import re
from pathlib import Path

import pytest

from gen.build.bundle import BUNDLED_TARGETS, backend_hash, jit_for_target
from gen.build.compile import import_file
from gen.families import get_family
from gen.build.spec import load_spec
from gen.build.targets import get_target
from gen.runtime.seed import CUBINS, INDEX, read_index

ROOT = Path(__file__).resolve().parent.parent
RUNTIMES = ("generated._runtime", "gen.runtime")


def _installed_triton() -> str:
    import triton

    return triton.__version__


def build_dir(family: str) -> Path:
    """The build the package runs on the installed Triton: generated/<family>/ for the GPU-tested release, else that
    release's own folder of it (generated/<family>/triton_X_Y/, gen.runtime.op.OpRuntime.release_build)."""
    from gen.runtime.triton_range import release_folder

    return ROOT / "generated" / family / (release_folder(_installed_triton()) or "")


def build_package(family: str) -> str:
    return ".".join(build_dir(family).relative_to(ROOT).parts)


# (family, variant) of every bundle of the installed release's build
BUNDLES = [(f, t) for f in ("gemm", "attention") for t in BUNDLED_TARGETS
           if (build_dir(f) / "kernels" / t / INDEX).exists()]


def _bundle_triton() -> str:
    index = read_index(build_dir("gemm") / "kernels" / "sm90")
    return index["triton"] if index else "none"


# A release without a build of its own runs the GPU-tested build, whose bundles its seeding skips (the kernels JIT:
# test_seed_skips_a_bundle_built_by_another_triton), so the cache-hit tests below have nothing to test there.
same_triton = pytest.mark.skipif(_bundle_triton() != _installed_triton(),
                                 reason=f"no build of triton {_installed_triton()} is committed (the package's "
                                        f"bundles are {_bundle_triton()}'s): its kernels JIT by design")


class CompilerInvoked(Exception):
    pass


@pytest.fixture
def jit_launches_without_running(monkeypatch, tmp_path):
    """Kernel launches go through the JIT's binder and cache lookup, then stop; compiling raises CompilerInvoked."""
    from triton.compiler.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
    for runtime in RUNTIMES:   # the generated packages' own copy, and gen's (modules compiled alone use it)
        monkeypatch.setattr(importlib.import_module(f"{runtime}.seed"), "_seeded", {})
    for family in ("gemm", "attention"):  # the packages remember which cases they seeded
        monkeypatch.setattr(importlib.import_module(f"generated.{family}")._RT, "_ready", {})

    def no_compiler(self, *a, **k):
        raise CompilerInvoked(f"the Triton compiler ran for {self.fn.__name__}")

    monkeypatch.setattr(ASTSource, "make_ir", no_compiler)
    from triton.experimental.gluon._runtime import GluonASTSource
    monkeypatch.setattr(GluonASTSource, "make_ir", no_compiler)
    run = JITFunction.run
    used = []

    def run_without_launch(self, *args, grid, warmup, **kwargs):
        used.append(self)
        return run(self, *args, grid=grid, warmup=True, **kwargs)

    monkeypatch.setattr(JITFunction, "run", run_without_launch)
    # the generated variants launch through their run time's Launcher: its lookups go through the JIT's (patched)
    # run above; the launch itself is skipped, and its per-launcher kernel caches start and end empty
    launches = [importlib.import_module(f"{runtime}.launch") for runtime in RUNTIMES]
    for launch in launches:
        monkeypatch.setattr(launch.Launcher, "launch_compiled", staticmethod(lambda *a, **k: None))
        launch.forget_compiled()
    yield
    for launch in launches:
        launch.forget_compiled()
    for fn in used:  # the JIT caches the (stand-in) target per device: leave no trace for other tests
        fn.device_caches.clear()


def _launch(family, module, case, options, backward=False):
    from gen.measure.verify import launch_poisoned

    fam = get_family(family)
    inputs = fam.make_inputs(fam.CAPTURE_SHAPE, case, options, "cpu")
    launch_poisoned(family, module, inputs, options, num_sms=1)
    if backward:
        assert fam.launch_backward(module, inputs)


def _line_info_folders(cubin: bytes) -> set[str]:
    """The folders of the package's and Triton's sources named in a cubin's line info, each checked to be relative
    (a build that wrote its machine's absolute paths fails here)."""
    folders = {m.decode() for m in re.findall(rb"[\x21-\x7e]*(?:generated/|triton/)[\x21-\x7e]*", cubin)}
    assert not [f for f in folders if f.startswith("/")], folders
    return folders


def _bundles_backward(family, target) -> bool:
    """The bundle holds the module's backward kernels too: the target's default module (the one the op's backward
    launches) where it has any."""
    from gen.runtime.dispatch import variant_target

    module = importlib.import_module(f"{build_package(family)}.{target}")
    return target == variant_target(target) and hasattr(module, "backward_dkdv")


@same_triton
@pytest.mark.parametrize("family,target", BUNDLES)
def test_bundle_is_current_and_complete(family, target):
    """Every API specialization is bundled, from the emitted source as it is now, for this Triton and ptxas."""
    kernels = build_dir(family) / "kernels" / target
    index = read_index(kernels)
    module = importlib.import_module(f"{build_package(family)}.{target}")
    options = load_spec(ROOT / "specs" / f"{family}.yaml").options
    assert index["arch"] == get_target(target).capability
    assert index["backend_hash"] == backend_hash(index["arch"])
    # one entry per API case and kernel it launches: the forward's, and the backward's where it is bundled
    kernels_per_case = {}
    for e in index["entries"]:
        for case in e.get("cases") or [e["case"]]:   # a kernel several cases launch is bundled once
            kernels_per_case.setdefault(json.dumps(case, sort_keys=True), []).append(e["kernel"])
    assert sorted(kernels_per_case) == sorted(json.dumps(c, sort_keys=True)
                                              for c in get_family(family).api_cases(options))
    backward = ({job["fn"].__name__ for job in module.backward_jobs(get_family(family).api_cases(options)[0])}
                if _bundles_backward(family, target) else set())   # sm90 and sm100: dK/dV, dQ, delta
    for names in kernels_per_case.values():
        assert len(names) == len(set(names)) and backward <= set(names) and len(set(names) - backward) == 1, names
    # one cache key per kernel: Triton's key of a kernel must not depend on which kernel's key was computed first
    # (a helper two kernels share that reads a module global made it so, and the bundle held both keys)
    keys = {}
    for e in index["entries"]:
        keys.setdefault(e["kernel"], set()).add(e["fn_cache_key"])
    assert all(len(k) == 1 for k in keys.values()), {name: len(k) for name, k in keys.items()}
    # the cubins lie back to back in one stream, in index order
    cubins = lzma.decompress((kernels / CUBINS).read_bytes())
    assert [e["offset"] for e in index["entries"]] == [sum(e["size"] for e in index["entries"][:i])
                                                        for i in range(len(index["entries"]))]
    assert len(cubins) == sum(e["size"] for e in index["entries"])
    for e in index["entries"]:
        assert getattr(module, e["kernel"]).cache_key == e["fn_cache_key"], "bundle is stale: regenerate"
        cubin = cubins[e["offset"]:e["offset"] + e["size"]]
        assert cubin[:4] == b"\x7fELF" and e["size"] > 1000
        # line info kept, naming the package's files (and Triton's where it inlined them), never a folder of the
        # machine that built it
        sources = _line_info_folders(cubin)
        assert build_package(family).replace(".", "/") in sources, sources
    manifest = json.loads((build_dir(family) / "manifest.json").read_text())
    entry = next(v for v in manifest["variants"] if v["target"] == target)
    assert entry["precompiled"]["kernels"] == len(index["entries"]) and entry["precompiled"]["ok"]


@same_triton
@pytest.mark.parametrize("family,target", BUNDLES)
def test_seeded_cache_serves_the_first_launch(family, target, jit_launches_without_running):
    from gen.runtime.seed import seed

    module = importlib.import_module(f"{build_package(family)}.{target}")
    options = load_spec(ROOT / "specs" / f"{family}.yaml").options
    cases = get_family(family).api_cases(options)
    picked = [cases[0], cases[len(cases) // 2], cases[-1]]
    backward = _bundles_backward(family, target)
    entries = read_index(build_dir(family) / "kernels" / target)["entries"]
    with jit_for_target(get_target(target).capability):
        with pytest.raises(CompilerInvoked):   # an empty cache: the JIT would compile
            _launch(family, module, picked[0], options)
        result = seed(build_dir(family) / "kernels" / target, module)
        # the forward per case; the backward's dK/dV and dQ per case, its Gluon delta pre-pass per dtype and
        # head dim
        shared = len({(c["dtype"], c["head_dim"]) for c in cases}) if hasattr(module, "backward_delta") else 0
        assert result.written == len(entries) == len(cases) * (3 if backward else 1) + shared and not result.skipped
        for case in picked:
            # served from the cache, the backward's dK/dV, dQ and delta kernels too: no CompilerInvoked
            _launch(family, module, case, options, backward=backward)


@same_triton
def test_seed_skips_a_bundle_for_another_arch(jit_launches_without_running):
    from gen.runtime.seed import seed

    module = importlib.import_module(f"{build_package('gemm')}.sm90")
    with jit_for_target(100):   # an sm100 GPU importing the sm90 bundle
        result = seed(build_dir("gemm") / "kernels" / "sm90", module)
    assert result.written == 0 and "arch 90" in result.skipped[0]


@same_triton
def test_seed_skips_a_damaged_bundle(jit_launches_without_running, tmp_path):
    """A truncated cubin stream (a broken checkout or install) is reported and left to the JIT, never half-read."""
    import shutil

    from gen.runtime.seed import seed

    bundle = tmp_path / "sm90"
    shutil.copytree(build_dir("gemm") / "kernels" / "sm90", bundle)
    stream = (bundle / CUBINS).read_bytes()
    (bundle / CUBINS).write_bytes(stream[:len(stream) // 2])
    module = importlib.import_module(f"{build_package('gemm')}.sm90")
    with jit_for_target(90):
        result = seed(bundle, module)
    assert result.written == 0 and CUBINS in result.skipped[0], result.skipped


@same_triton
def test_seed_skips_an_edited_kernel(jit_launches_without_running, tmp_path):
    """A kernel whose source no longer matches the bundle is left to the JIT, never served a stale binary."""
    from gen.runtime.seed import seed

    src = (build_dir("gemm") / "sm90.py").read_text()
    edited = tmp_path / "sm90_edited.py"
    assert "\nSHAPE_ARGS = " in src
    edited.write_text(src.replace("\nSHAPE_ARGS = ", "\n\nSHAPE_ARGS = ", 1))   # every kernel moves down a line
    module = import_file(edited, "gemm_sm90_edited")
    with jit_for_target(90):
        result = seed(build_dir("gemm") / "kernels" / "sm90", module)
    assert result.written == 0 and "differs" in result.skipped[0]


@same_triton
@pytest.mark.parametrize("family,target", BUNDLES)
def test_public_module_seeds_before_its_first_launch(family, target, jit_launches_without_running):
    """The generated package's dispatch seeds the cache when it first picks a Gluon variant: no compiler at launch."""
    package = importlib.import_module(f"generated.{family}")
    options = load_spec(ROOT / "specs" / f"{family}.yaml").options
    case = get_family(family).api_cases(options)[-1]
    with jit_for_target(get_target(target).capability):
        _launch(family, package._RT.variant(target, ("test",), case), case, options)


def test_public_module_can_skip_the_bundle(monkeypatch, jit_launches_without_running):
    """GEN_NO_PRECOMPILED=1 leaves every kernel to Triton's JIT (what bench/first_call.py measures as "before")."""
    monkeypatch.setenv("GEN_NO_PRECOMPILED", "1")
    package = importlib.import_module("generated.gemm")
    options = load_spec(ROOT / "specs" / "gemm.yaml").options
    case = get_family("gemm").api_cases(options)[0]
    with jit_for_target(90), pytest.raises(CompilerInvoked):
        _launch("gemm", package._RT.variant("sm90", ("test",), case), case, options)


def test_a_current_bundle_is_reused_and_a_stale_or_broken_one_is_not(tmp_path):
    from gen.build.bundle import _current_summary

    dest = tmp_path / "sm90"
    dest.mkdir()
    (dest / CUBINS).write_bytes(b"x" * 10)
    index = {"key": "k1", "cubins_sha256": hashlib.sha256(b"x" * 10).hexdigest(),
             "entries": [{"offset": 0, "size": 10}], "failed": []}
    (dest / INDEX).write_bytes(lzma.compress(json.dumps(index).encode()))
    assert _current_summary(dest, "k1") == {"ok": True, "kernels": 1, "specializations": 1, "bytes": 10, "failed": []}
    assert _current_summary(dest, "k2") is None          # the kernel source, Triton or ptxas changed
    index["failed"] = [{"case": {}, "error": "boom"}]
    (dest / INDEX).write_bytes(lzma.compress(json.dumps(index).encode()))
    assert _current_summary(dest, "k1")["ok"] is False   # a partial bundle stays reported as partial
    (dest / CUBINS).write_bytes(b"x" * 9)
    assert _current_summary(dest, "k1") is None          # damaged cubins force a rebuild
    (dest / CUBINS).unlink()
    assert _current_summary(dest, "k1") is None          # and so do missing ones


@same_triton
def test_a_bundle_whose_kernels_changed_under_the_same_key_is_rebuilt(tmp_path):
    """A score mod's lowering lives in Python (gen/families/mod_ir.py), not in the template: changing it changes the
    kernels under the same template and config digests, so the bundle key stays; the kernels' own hashes do not,
    and the build drops such a bundle (gen/build/bundle_check.py) so that it is rebuilt."""
    from gen.build.bundle_check import kernels_changed

    kernels = build_dir("attention") / "kernels" / "sm90"
    src = (build_dir("attention") / "sm90.py").read_text()
    module = tmp_path / "sm90.py"
    module.write_text(src)
    assert not kernels_changed(module, kernels)
    assert not kernels_changed(module, tmp_path / "no_bundle")
    lowered = "score = (score - 0.05 * _sm_abs(q_idx - kv_idx)).to(gl.float32)"
    assert lowered in src
    module.write_text(src.replace(lowered, lowered.replace("0.05", "0.0625")))   # the decay mod lowered otherwise
    assert kernels_changed(module, kernels)
    module.write_text(src.replace("def apply_score_mod(", "def renamed_score_mod("))   # no longer loads as bundled
    assert kernels_changed(module, kernels)


@same_triton
def test_seeding_one_case_writes_only_its_kernel(jit_launches_without_running):
    """The public op seeds only the call's case (dtype, head dim, mod): a first call does not pay for the others. The
    backward's delta pre-pass has no mod, so one bundled kernel serves every mod of a dtype and head dim, recorded
    under the first such case: a case other than that one seeds it too."""
    from gen.runtime.seed import seed

    module = importlib.import_module(f"{build_package('attention')}.sm90")
    options = load_spec(ROOT / "specs" / "attention.yaml").options
    case = {"dtype": "float16", "head_dim": 64, "mod": "causal"}
    kernels = build_dir("attention") / "kernels" / "sm90"
    delta = [e for e in read_index(kernels)["entries"]
             if e["kernel"] == "_attn_bwd_delta" and case in e.get("cases", [])]
    assert len(delta) == 1 and delta[0]["case"] != case
    with jit_for_target(90):
        result = seed(kernels, module, case)
        assert result.written == 4   # its forward and its backward's dK/dV, dQ and delta kernels
        _launch("attention", module, case, options, backward=True)
        with pytest.raises(CompilerInvoked):   # another case was not seeded
            _launch("attention", module, {**case, "mod": "none"}, options)


@same_triton
@pytest.mark.parametrize("family", ["gemm", "attention"])
def test_public_op_seeds_the_case_it_launches(family, monkeypatch, jit_launches_without_running):
    """Through the public op (its custom_op body, forced onto the sm90 path on CPU tensors): the case it names for
    seeding is the case its kernel launch needs, so the first call is a cache hit."""
    import torch

    package = importlib.import_module(f"generated.{family}")
    monkeypatch.setattr(package, "_decide", lambda *a, **k: "sm90")
    monkeypatch.setattr(package, "_ROUTES", {})           # routes decided earlier in this process are not reused
    monkeypatch.setenv("TRITON_INTERPRET", "1")            # the op's CPU-tensor check (nothing is interpreted here)
    g = torch.Generator().manual_seed(0)
    with jit_for_target(90):
        if family == "gemm":
            a, b = torch.randn(64, 32, generator=g).half(), torch.randn(32, 48, generator=g).half()
            bias = torch.randn(48, generator=g).half()
            package._op(a, b, bias, "silu", torch.float32)
        else:
            q, k, v = (torch.randn(1, 2, 40, 64, generator=g).bfloat16() for _ in range(3))
            package._op(q, k, v, 0.125, "window", 1024, 0, 0.0, None, True)


def test_a_specialization_that_fails_to_compile_is_reported_not_raised():
    from gen.build.bundle import compile_one

    src = ROOT / "generated" / "gemm" / "sm90.py"
    index = read_index(ROOT / "generated" / "gemm" / "kernels" / "sm90")
    data = json.loads(index["entries"][0]["specialization"])
    data["options"]["num_warps"] = 3          # not a power of two: Triton refuses the options
    module = importlib.import_module("generated.gemm.sm90")
    try:
        result = compile_one(str(src), "generated.gemm.sm90", "gemm_kernel", 90, json.dumps(data))
    finally:
        module.gemm_kernel.device_caches.clear()
    assert result["ok"] is False and result["error"]


def test_seed_skips_a_bundle_built_by_another_triton(tmp_path):
    """What a user on another Triton release gets: the bundle is left alone with the reason, and the kernels JIT."""
    import shutil

    from gen.runtime.seed import seed

    bundle = tmp_path / "sm90"
    shutil.copytree(ROOT / "generated" / "gemm" / "kernels" / "sm90", bundle)
    index = read_index(bundle)
    (bundle / INDEX).write_bytes(lzma.compress(json.dumps({**index, "triton": "0.0.0"}).encode()))
    with jit_for_target(90):
        result = seed(bundle, importlib.import_module("generated.gemm.sm90"))
    assert result.written == 0 and "Triton 0.0.0" in result.skipped[0]


def test_bundle_workers_import_a_release_build_under_its_package(tmp_path):
    """The compile workers import a variant under its package's dotted name, so that a release build's modules
    (one package deeper, `from ..._runtime...`) resolve their run time as the package will."""
    from gen.build.bundle import package_of

    release = tmp_path / "generated" / "gemm" / "triton_3_9"
    release.mkdir(parents=True)
    for d in (release, release.parent, release.parent.parent):
        (d / "__init__.py").write_text("")
    assert package_of(release) == "generated.gemm.triton_3_9"
    assert package_of(release.parent) == "generated.gemm"
    assert package_of(ROOT / "generated" / "attention") == "generated.attention"


@pytest.mark.parametrize("family,target", [("gemm", "sm90"), ("attention", "sm90"), ("gemm", "triton"),
                                           ("attention", "triton")])
def test_every_launch_asks_for_fp_fusion(family, target, monkeypatch):
    """The kernels were verified and timed with FP fusion (FMA contraction) on; Triton 3.9 warns that its default
    turns it off in 3.10. With the release's default set off, every specialization the public API launches (what the
    JIT would compile, and what the bundle holds) still has it on."""
    from triton import knobs

    from gen.build.bundle import capture

    monkeypatch.setattr(knobs.language, "default_fp_fusion", False)
    options = load_spec(ROOT / "specs" / f"{family}.yaml").options
    found = capture(str(build_dir(family) / f"{target}.py"), f"fp_fusion_{family}_{target}", family, options, 90)
    assert found
    for entry in found:
        assert json.loads(entry["specialization"])["options"]["enable_fp_fusion"] is True, entry["kernel"]


def test_line_info_paths_are_rewritten_relative_to_the_package_and_to_triton():
    """The bundle workers' rewrite of the LLVM IR's file entries: the package folder becomes its package path,
    Triton's install its own relative path, anything else is left as it is."""
    from gen.build.line_info import portable_paths

    llir = ('!1 = !DIFile(filename: "sm90.py", directory: "/home/u/gen/generated/gemm")\n'
            '!2 = !DIFile(filename: "standard.py", directory: "/venv/lib/site-packages/triton/language")\n'
            '!3 = !DIFile(filename: "/home/u/gen/generated/gemm/sm90.py", directory: "/home/u/gen/generated/gemmx")\n'
            '!4 = !DIFile(filename: "x.py", directory: "/elsewhere")\n')
    out = portable_paths(llir, {"/home/u/gen/generated/gemm": "generated/gemm", "/venv/lib/site-packages": ""})
    assert out == ('!1 = !DIFile(filename: "sm90.py", directory: "generated/gemm")\n'
                   '!2 = !DIFile(filename: "standard.py", directory: "triton/language")\n'
                   '!3 = !DIFile(filename: "generated/gemm/sm90.py", directory: "/home/u/gen/generated/gemmx")\n'
                   '!4 = !DIFile(filename: "x.py", directory: "/elsewhere")\n')


@same_triton
def test_a_bundle_worker_writes_no_path_of_its_machine(tmp_path):
    """One bundled specialization compiled as the bundle's workers compile it: its line info names the package's
    folder and triton/language, nothing of this checkout's path."""
    from gen.build import line_info
    from gen.build.bundle import compile_one
    from triton.backends.nvidia.compiler import CUDABackend

    folder, package = build_dir("gemm"), build_package("gemm")
    entry = read_index(folder / "kernels" / "sm90")["entries"][0]
    unpatched = CUDABackend.make_ptx
    module = importlib.import_module(f"{package}.sm90")
    try:
        line_info.install(str(folder), package.replace(".", "/"))
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("TRITON_CACHE_DIR", str(tmp_path))   # compile, never a cache hit from another build
            result = compile_one(str(folder / "sm90.py"), f"{package}.sm90", entry["kernel"], 90,
                                 entry["specialization"])
    finally:
        CUDABackend.make_ptx = unpatched
        module.gemm_kernel.device_caches.clear()
    assert result["ok"], result
    cubin = result["cubin"]
    assert {package.replace(".", "/"), "triton/language"} <= _line_info_folders(cubin)
    assert str(ROOT).encode() not in cubin
