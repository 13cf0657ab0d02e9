"""Source -> Artifact: cross-compile a rendered variant with triton.compile(GPUTarget) in child processes.

MLIR passes can abort the whole process, so every compile runs in a worker process. A crash, an exception or a
timeout in one request becomes one failed Artifact; the pool restarts the worker and carries on. Results are cached
on disk by (source digest, case, target, versions): a re-run with nothing changed starts no worker at all.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import multiprocessing as mp
import os
import resource
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import wait
from pathlib import Path

from ..cache import cache_dir
from ..runtime.launch import COMPILE_OPTIONS
from .render import Source
from .targets import Target

COMPILE_STAGE_VERSION = "2"   # bump when the artifact format or the post-processing changes
DEFAULT_TIMEOUT_S = 300


@dataclass(frozen=True)
class Artifact:
    """One compiled kernel of one variant for one case (a variant may launch several kernels)."""
    target: str
    case: dict
    kernel: str
    ok: bool
    error: str = ""
    seconds: float = 0.0                           # CPU seconds of the compile, ptxas included (_cpu_seconds)
    metadata: dict = field(default_factory=dict)   # shared, tmem_size, num_warps, name
    ttgir: str = ""
    llir: str = ""
    ptx: str = ""
    sass: str = ""
    resource_usage: str = ""
    cached: bool = False


@dataclass(frozen=True)
class CompileRequest:
    source: Source
    case: dict
    target: Target

    @property
    def key(self) -> str:
        from importlib.metadata import version

        blob = json.dumps([COMPILE_STAGE_VERSION, version("triton"), COMPILE_OPTIONS, self.source.digest, self.case,
                           self.target.name, self.target.capability], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()


def _tool(name: str) -> str:
    import triton

    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name)


def _disassemble(cubin: bytes) -> tuple[str, str]:
    """(resource usage, SASS) of a cubin, read with the cuobjdump Triton ships."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
        path = f.name
    try:
        res = subprocess.run([_tool("cuobjdump"), "--dump-resource-usage", path], capture_output=True, text=True, timeout=120)
        sass = subprocess.run([_tool("cuobjdump"), "--dump-sass", path], capture_output=True, text=True, timeout=120)
        return res.stdout + res.stderr, sass.stdout + sass.stderr
    finally:
        os.unlink(path)


def load_module_from_text(text: str, digest: str):
    """Import rendered source from a file (Triton's JIT needs the source on disk to read it back).

    To run @triton.jit kernels in Triton's CPU interpreter, TRITON_INTERPRET=1 must be set before triton is first
    imported (triton.language's own helpers are decorated at import): see gen/measure/interpret.py.
    """
    path = cache_dir("modules") / f"v_{digest[:20]}.py"
    if not path.exists():   # written whole, then renamed: a concurrent worker never imports a half-written file
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return import_file(path, f"gen_variant_{digest[:20]}")


def import_file(path, name: str):
    """Import the module at `path` as `name` (once per process: a second call returns the same module)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _cpu_seconds() -> float:
    """CPU time of this process and of its finished children (ptxas, nvdisasm): what a compile costs, which another
    process's load on the machine does not inflate the way it inflates the wall clock (the IR baselines gate it)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def _compile_in_this_process(text: str, digest: str, case: dict, target_name: str, capability: int) -> list[dict]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module = load_module_from_text(text, digest)
    results = []
    for job in module.compile_jobs(case):
        t0 = _cpu_seconds()
        try:
            if module.KERNEL_MODE == "gluon":
                from triton.experimental.gluon._runtime import GluonASTSource as SourceCls
            else:
                SourceCls = ASTSource
            extra = {"attrs": job["attrs"]} if job.get("attrs") else {}  # e.g. 16-byte divisibility an aligned launch has
            src = SourceCls(job["fn"], job["signature"], constexprs=job.get("constexprs", {}), **extra)
            options = {**COMPILE_OPTIONS, **job.get("options", {})}   # as the run time's launches ask
            k = triton.compile(src, target=GPUTarget("cuda", capability, 32), options=options)
            usage, sass = _disassemble(k.asm["cubin"])
            md = k.metadata
            results.append(dict(target=target_name, case=case, kernel=job["name"], ok=True,
                                seconds=_cpu_seconds() - t0,
                                metadata={"shared": md.shared, "tmem_size": getattr(md, "tmem_size", 0) or 0,
                                          "num_warps": md.num_warps, "name": md.name},
                                ttgir=k.asm.get("ttgir", ""), llir=k.asm.get("llir", ""), ptx=k.asm.get("ptx", ""),
                                sass=sass, resource_usage=usage))
        except Exception as e:  # one bad kernel is one rejected candidate
            results.append(dict(target=target_name, case=case, kernel=job.get("name", "?"), ok=False,
                                error=f"{type(e).__name__}: {e}"[:4000], seconds=_cpu_seconds() - t0))
    return results


def _worker_main(conn) -> None:
    os.environ.setdefault("TRITON_CACHE_DIR", str(cache_dir("triton")))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        try:
            conn.send(("ok", _compile_in_this_process(*msg)))
        except BaseException:
            conn.send(("error", traceback.format_exc()[-4000:]))


class _Worker:
    def __init__(self, ctx):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child,), daemon=True)
        self.proc.start()
        child.close()
        self.request = None
        self.started = 0.0

    def stop(self):
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.proc.join(timeout=2)
        if self.proc.is_alive():
            self.proc.kill()


def _read_cache(key: str) -> list[Artifact] | None:
    path = cache_dir("artifacts") / f"{key}.json"
    if not path.exists():
        return None
    try:
        return [Artifact(**{**d, "cached": True}) for d in json.loads(path.read_text())]
    except (ValueError, TypeError):
        return None


def _write_cache(key: str, artifacts: list[Artifact]) -> None:
    if all(a.ok for a in artifacts):  # failures are retried next time (a fixed template may compile)
        path = cache_dir("artifacts") / f"{key}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps([asdict(a) for a in artifacts]))
        tmp.replace(path)


def _failed(req: CompileRequest, error: str, seconds: float = 0.0) -> list[Artifact]:
    return [Artifact(target=req.target.name, case=req.case, kernel="<module>", ok=False, error=error, seconds=seconds)]


def compile_many(requests: list[CompileRequest], jobs: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 progress=None) -> list[list[Artifact]]:
    """Compile every request (cache first, then a pool of `jobs` worker processes). Order is preserved."""
    results: list = [None] * len(requests)
    todo = []
    for i, req in enumerate(requests):
        hit = _read_cache(req.key)
        if hit is not None:
            results[i] = hit
            if progress:
                progress(req, hit)
        else:
            todo.append(i)
    if not todo:
        return results

    from ..store import configure_triton_remote_cache

    configure_triton_remote_cache()  # with GEN_CACHE_REDIS, the workers share compiled kernels through Redis
    ctx = mp.get_context("spawn")
    n = max(1, min(jobs or os.cpu_count() or 1, len(todo)))
    workers = [_Worker(ctx) for _ in range(n)]
    pending = list(todo)
    try:
        while pending or any(w.request is not None for w in workers):
            for w in workers:
                if w.request is None and pending:
                    i = pending.pop(0)
                    req = requests[i]
                    w.request, w.started = i, time.perf_counter()
                    w.conn.send((req.source.text, req.source.digest, req.case, req.target.name, req.target.capability))
            busy = [w for w in workers if w.request is not None]
            ready = wait([w.conn for w in busy] + [w.proc.sentinel for w in busy], timeout=1.0)
            for k, w in enumerate(workers):
                if w.request is None:
                    continue
                i, req = w.request, requests[w.request]
                elapsed = time.perf_counter() - w.started
                outcome = None
                if w.conn in ready or w.proc.sentinel in ready:
                    try:
                        status, payload = w.conn.recv()
                        outcome = ([Artifact(**d) for d in payload] if status == "ok"
                                   else _failed(req, f"compile worker raised:\n{payload}", elapsed))
                    except (EOFError, OSError):
                        w.proc.join(timeout=1)
                        outcome = _failed(req, f"compiler process died (exit code {w.proc.exitcode}); "
                                               "likely an MLIR/LLVM abort on this config", elapsed)
                        workers[k] = _Worker(ctx)
                elif elapsed > timeout_s:
                    w.proc.kill()
                    outcome = _failed(req, f"compile timed out after {timeout_s:.0f} s", elapsed)
                    workers[k] = _Worker(ctx)
                if outcome is not None:
                    if not outcome:
                        outcome = _failed(req, "compile_jobs() returned no kernels")
                    results[i] = outcome
                    _write_cache(req.key, outcome)
                    if workers[k] is w:
                        w.request = None
                    if progress:
                        progress(req, outcome)
    finally:
        for w in workers:
            w.stop()
    return results
