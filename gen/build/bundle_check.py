"""Is a variant's committed bundle still compiled from the module as it is emitted now?

A bundle's key (gen/build/bundle.py) holds the template and config digests, the spec's options, Triton and ptxas.
It cannot see a change in what a family's Python splices into a template (the mod IR's lowering of a score mod,
gen/families/mod_ir.py): the kernels change under the same key, and the bundle would be kept, stale, with its
kernels left to the JIT at run time (tests/test_precompiled.py fails on it). This check compares each bundled
kernel's Triton hash (JITFunction.cache_key: its source and what it calls) with the module as emitted; the build
drops a bundle that no longer matches, so bundle.py rebuilds it. It is kept out of bundle.py, whose own text is
part of every bundle's key.
"""
from __future__ import annotations

import hashlib
import lzma
from pathlib import Path

from ..runtime.seed import read_index
from .compile import import_file


def kernels_changed(module_path: Path, dest: Path) -> bool:
    """True where the bundle in `dest` holds a kernel whose hash differs from the module at `module_path` (or the
    module no longer loads, or lacks a kernel); False where they match or there is no bundle."""
    try:
        index = read_index(dest)
    except (OSError, ValueError, lzma.LZMAError):
        return False   # unreadable: bundle.py's own check rebuilds it
    if not index:
        return False
    text = module_path.read_bytes()
    try:   # a name per content: a module re-emitted in this process is loaded afresh
        module = import_file(module_path, f"_gen_bundle_check_{hashlib.sha256(text).hexdigest()[:16]}")
        return any(getattr(module, e["kernel"]).cache_key != e["fn_cache_key"] for e in index["entries"])
    except Exception:  # noqa: BLE001 - a module that no longer loads: rebuild, and the capture reports why
        return True
