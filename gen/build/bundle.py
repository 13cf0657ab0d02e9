"""Precompiled binaries for zero-JIT import: generated/<family>/kernels/<target>/.

Triton's JIT compiles a Gluon kernel at its first launch: seconds per kernel, on the user's GPU, at import-and-call
time. This stage does that work ahead of time, on any machine (no GPU needed):

1. Capture. In a worker process, a stand-in Triton driver reports the target GPU and a JIT hook records, instead of
   compiling, what the JIT would compile. The emitted variant's own `launch` then runs on small CPU tensors for every
   specialization the public API can reach (family.api_cases: dtype x head dim x mod, dtype x epilogue), and so do a
   target's default module's own backward kernels (family.launch_backward: attention's sm90 dK/dV and dQ, which the
   op's backward launches). The JIT's own binder computes each specialization, so nothing here re-derives Triton's
   rules.
2. Compile. Each recorded specialization is compiled in a worker with `JITFunction.preload`, the path a warm-up
   takes, for the target GPU, with line info that names no path of this machine (line_info.py).
3. Write. The cubins (one xz stream, cubins.xz) and their metadata go to kernels/<target>/, with an index
   (index.json.xz) that gen.runtime.seed reads at run time to put them into Triton's cache under the key the JIT
   computes there.

Kernels are bundled from the emitted files: Triton's kernel hash covers the function's source and line number.
A failed capture or compile is reported and leaves that target without a bundle (its kernels JIT as before); it
never fails the build.
"""
from __future__ import annotations

import hashlib
import json
import lzma
import multiprocessing as mp
import os
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from ..cache import cache_dir
from .compile import import_file
from . import line_info
from ..families import get_family
from ..runtime.dispatch import variant_target
from ..runtime.seed import CUBINS, INDEX, read_index
from .targets import get_target

BUNDLE_FORMAT = 3   # 2: the index is xz-compressed (runtime.seed.INDEX); 3: one xz stream of cubins (seed.CUBINS)
# The variants whose kernels are bundled. The portable Triton variant is the fallback for GPUs without a Gluon
# variant and for tensors TMA cannot address; it specializes on shapes, so it keeps Triton's JIT (and its cache).
BUNDLED_TARGETS = ("sm100", "sm90")


class TargetDriver:
    """Stands in for Triton's CUDA driver: reports the target GPU to the JIT; never loads or launches anything."""

    def __init__(self, capability: int):
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", capability, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0


@contextmanager
def jit_for_target(capability: int, record=None):
    """Within: Triton's JIT binds and compiles for `capability`. With `record`, the JIT calls record(data) with each
    specialization it would compile (Triton's own serialized form) and compiles nothing."""
    from triton import knobs
    from triton.runtime import driver

    previous_driver, previous_hook = driver._active, knobs.runtime.jit_cache_hook
    driver.set_active(TargetDriver(capability))

    def hook(*, compile, **_):
        record(compile["specialization_data"])
        return True   # skip the compile (and the launch)

    knobs.runtime.jit_cache_hook = hook if record else None
    try:
        yield
    finally:
        driver._active, knobs.runtime.jit_cache_hook = previous_driver, previous_hook


def _worker_init(triton_cache: str, package_folder: str, package_path: str) -> None:
    os.environ["TRITON_CACHE_DIR"] = triton_cache
    line_info.install(package_folder, package_path)   # no build-machine paths in the committed cubins


def _portable(specialization: str) -> str:
    """The specialization without this machine's file paths (libdevice's): the JIT fills in its own when the options
    are parsed, here (preload) and on the user's machine (gen.runtime.seed), so the bundle is the same wherever it is
    built."""
    data = json.loads(specialization)
    data["options"].pop("extern_libs", None)
    return json.dumps(data)


def capture(path: str, module_name: str, family: str, options: dict, capability: int,
            backward: bool = False) -> list[dict]:
    """Every specialization the public API can launch: [{"kernel", "case", "specialization"}] (run in a worker);
    with `backward`, the module's own backward kernels at each case too (the op's backward launches the target's
    default module's)."""
    from ..measure.verify import NotApplicable, launch_poisoned

    module = import_file(path, module_name)
    fam = get_family(family)
    found: dict[str, dict] = {}
    for case in fam.api_cases(options):
        recorded: list[str] = []
        inputs = fam.make_inputs(fam.CAPTURE_SHAPE, case, options, "cpu")
        with jit_for_target(capability, recorded.append):
            try:
                launch_poisoned(family, module, inputs, options, num_sms=1)
            except NotApplicable:
                continue
            if backward:
                fam.launch_backward(module, inputs)
        for data in map(_portable, recorded):
            spec = found.setdefault(data, {"kernel": json.loads(data)["name"].rsplit(".", 1)[-1], "case": case,
                                           "cases": [], "specialization": data})
            if case not in spec["cases"]:   # a kernel several cases launch (attention's delta pre-pass, no mod)
                spec["cases"].append(case)
    return list(found.values())


def compile_one(path: str, module_name: str, kernel: str, capability: int, specialization: str) -> dict:
    """Cross-compile one recorded specialization as the JIT would (run in a worker)."""
    module = import_file(path, module_name)
    fn = getattr(module, kernel)
    try:
        with jit_for_target(capability):
            compiled = fn.preload(specialization)
        name = compiled.name
        cubin = Path(compiled.metadata_group[f"{name}.cubin"]).read_bytes()
        metadata = json.loads(Path(compiled.metadata_group[f"{name}.json"]).read_text())
    except Exception as e:  # one failed kernel is reported, not raised
        return {"ok": False, "error": f"{type(e).__name__}: {e}"[:2000]}
    return {"ok": True, "fn_cache_key": fn.cache_key, "metadata": metadata, "cubin": cubin}


def backend_hash(capability: int) -> str:
    """Triton's backend hash for the target (ptxas version and arch): part of every kernel's cache key."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    return make_backend(GPUTarget("cuda", capability, 32)).hash()


def bundle_target(out: Path, family: str, options: dict, target: str, digests: tuple[str, str],
                  jobs: int | None = None, log=print) -> dict:
    """Capture, compile and write kernels/<target>/ for one emitted variant (`target`: its module name, e.g. sm90 or
    sm90_m64; `digests`: its template and config digests). Returns the build record's summary."""
    import triton

    capability = get_target(variant_target(target)).capability
    path = out / f"{target}.py"
    module_name = f"{package_of(out)}.{target}"
    dest = out / "kernels" / target
    backend = backend_hash(capability)
    key = bundle_key(backend, options, digests)
    current = _current_summary(dest, key)
    if current:
        log(f"[gen]   {target}: precompiled bundle is current ({current['kernels']} kernel specialization(s))")
        return current
    ctx = mp.get_context("spawn")
    # a Triton cache of their own: a kernel compiled elsewhere (the gates' candidates) has the same cache key but
    # other paths in its line info
    with ProcessPoolExecutor(max_workers=max(1, jobs or os.cpu_count() or 1), mp_context=ctx, initializer=_worker_init,
                             initargs=(str(cache_dir("triton-bundle")), str(out.resolve()),
                                       package_of(out).replace(".", "/"))) as pool:
        try:
            specs = pool.submit(capture, str(path), module_name, family, options, capability,
                                target == variant_target(target)).result()
            futures = [pool.submit(compile_one, str(path), module_name, s["kernel"], capability, s["specialization"])
                       for s in specs]
            results = [f.result() for f in futures]
        except Exception as e:  # a worker died (an MLIR abort): this target ships without a bundle
            log(f"[gen]   {target}: precompile failed ({type(e).__name__}: {e}); its kernels will JIT")
            _clear(dest)
            return {"ok": False, "error": f"{type(e).__name__}: {e}"[:2000], "kernels": 0}
    failed = [(s, r) for s, r in zip(specs, results) if not r["ok"]]
    for s, r in failed:
        log(f"[gen]   {target}: precompile of {s['case']} failed: {r['error'][:200]}")
    entries, cubins, offset = [], [], 0
    for s, r in zip(specs, results):
        if not r["ok"]:
            continue
        # hash and extern_libs are this machine's; gen.runtime.seed writes the user machine's own
        metadata = {k: v for k, v in r["metadata"].items() if k not in ("hash", "extern_libs")}
        entries.append({"kernel": s["kernel"], "case": s["case"], "fn_cache_key": r["fn_cache_key"],
                        "specialization": s["specialization"], "metadata": metadata,
                        "offset": offset, "size": len(r["cubin"]),
                        # every case that launches it where that is more than its first (seed matches any of them)
                        **({"cases": s["cases"]} if len(s["cases"]) > 1 else {})})
        cubins.append(r["cubin"])
        offset += len(r["cubin"])
    _clear(dest)
    dest.mkdir(parents=True, exist_ok=True)
    # preset 9, no threads: the same bytes on every machine (the clean-clone rebuild must equal the commit); its
    # 64 MiB window covers a whole bundle's stream (9 MB for gemm's sm90)
    stream = lzma.compress(b"".join(cubins), preset=9)
    (dest / CUBINS).write_bytes(stream)
    index = {"format": BUNDLE_FORMAT, "key": key, "triton": triton.__version__, "arch": capability,
             "backend_hash": backend, "cubins_sha256": hashlib.sha256(stream).hexdigest(), "entries": entries,
             "failed": [{"case": s["case"], "error": r["error"][:500]} for s, r in failed]}
    (dest / INDEX).write_bytes(lzma.compress((json.dumps(index, indent=0) + "\n").encode(), preset=9))
    summary = _current_summary(dest, key)
    log(f"[gen]   {target}: precompiled {summary['kernels']}/{summary['specializations']} kernel specialization(s), "
        f"{summary['bytes'] / 1e6:.1f} MB xz")
    return summary


def package_of(folder: Path) -> str:
    """The dotted package name of `folder` (generated/gemm -> generated.gemm, generated/gemm/triton_3_9 ->
    generated.gemm.triton_3_9): its name and its parents' up to the first folder without an __init__.py. The
    compile workers import the module under it, so its relative imports of the run time resolve."""
    parts = []
    while (folder / "__init__.py").exists():
        parts.append(folder.name)
        folder = folder.parent
    return ".".join(reversed(parts))


def bundle_key(backend: str, options: dict, digests: tuple[str, str]) -> str:
    """What the bundle depends on: the emitted kernel source (template and config digests, and the spec's family
    options, which pick the mods rendered into the kernels and the specializations captured; the header's line count
    is fixed), the Triton version and ptxas (`backend`, Triton's backend hash), and this module's rules. Not the whole
    spec's digest: adding a named config or a verify case to a spec leaves the other variants' bundles current."""
    import triton

    parts = [BUNDLE_FORMAT, triton.__version__, backend, json.dumps(options, sort_keys=True, default=str),
             *digests, Path(__file__).read_text()]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def _current_summary(dest: Path, key: str) -> dict | None:
    """The manifest's summary of the bundle in `dest` if it was built for `key` and is intact, else None."""
    try:
        index = read_index(dest)
    except (OSError, ValueError, lzma.LZMAError):
        return None
    if index is None:
        return None
    try:
        stream = (dest / CUBINS).read_bytes()
    except OSError:
        return None
    if index.get("key") != key or index.get("cubins_sha256") != hashlib.sha256(stream).hexdigest():
        return None   # built for other kernels, or its cubins are missing or damaged
    size = len(stream)
    failed = index.get("failed", [])
    return {"ok": not failed, "kernels": len(index["entries"]), "specializations": len(index["entries"]) + len(failed),
            "bytes": size, "failed": failed}


def remove_bundle(out: Path, target: str) -> None:
    _clear(out / "kernels" / target)


def _clear(dest: Path) -> None:
    if dest.is_dir():
        for f in dest.iterdir():
            f.unlink()
        dest.rmdir()


def bundle(out: Path, family: str, options: dict, targets: dict, jobs: int | None = None, log=print) -> dict:
    """Bundle every shipped Gluon variant in `targets` (module name -> (template digest, config digest)); drop
    bundles of variants no longer emitted."""
    summary = {}
    for name, digests in targets.items():
        if variant_target(name) in BUNDLED_TARGETS and (out / f"{name}.py").exists():
            summary[name] = bundle_target(out, family, options, name, digests, jobs, log)
    for dest in sorted((out / "kernels").glob("*")) if (out / "kernels").is_dir() else ():
        if not (out / f"{dest.name}.py").exists():
            _clear(dest)
    return summary
