"""What a benchmark's child process compiles, counted from inside it: Triton compiler runs (the frontend's make_ir,
by kernel name) and Triton's C launcher builds (gcc, with their seconds). Used by the first-call benchmarks
(first_call.py, backward_delta.py), whose children import it with the repository root on PYTHONPATH."""
from __future__ import annotations

import time


def install() -> dict:
    """Patch Triton so that this process counts its compiles; returns the live record
    {"compiled": [kernel names], "launcher_builds": int, "launcher_build_s": float}."""
    import triton.runtime.build as build
    from triton.compiler.compiler import ASTSource
    from triton.experimental.gluon._runtime import GluonASTSource

    record = {"compiled": [], "launcher_builds": 0, "launcher_build_s": 0.0}
    for cls in (ASTSource, GluonASTSource):
        def counted(self, *a, __make_ir=cls.make_ir, **k):
            record["compiled"].append(self.fn.__name__)
            return __make_ir(self, *a, **k)
        cls.make_ir = counted
    _build = build._build

    def timed_build(*a, **k):
        t = time.perf_counter()
        try:
            return _build(*a, **k)
        finally:
            record["launcher_builds"] += 1
            record["launcher_build_s"] += time.perf_counter() - t
    build._build = timed_build
    return record
