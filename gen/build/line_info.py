"""Line info without this machine's paths, for the committed cubins.

Triton compiles with `-lineinfo`: each cubin carries the source files of its kernel as DWARF file entries, and
LLVM writes them as the absolute paths of the build machine (`/home/me/gen/generated/gemm` + `sm90.py`, and
`.../site-packages/triton/language` + `standard.py` for the inlined library). A committed bundle would then name
whoever built it last. `TRITON_DISABLE_LINE_INFO` would drop the paths, but Triton folds that variable into every
kernel's cache key, so the user's JIT would no longer find the bundled kernels.

Instead, in the bundle's compile workers only, the LLVM IR's `!DIFile` entries are rewritten before it is lowered to
PTX (LLVM then lays out the DWARF itself): the emitted package's folder becomes its package path
(`generated/gemm/triton_3_9`) and Triton's own sources become relative to Triton's parent folder
(`triton/language`). Profilers still map SASS to file and line; the kernel's code and cache key are unchanged.
"""
from __future__ import annotations

import os
import re

_DIFILE_FIELD = re.compile(r'\b(filename|directory): "([^"]*)"')


def portable_paths(llir: str, prefixes: dict[str, str]) -> str:
    """`llir` with every DIFile path under one of `prefixes` (absolute folder -> its replacement) rewritten."""
    def rewrite(match: re.Match) -> str:
        field, path = match.group(1), match.group(2)
        for folder, replacement in prefixes.items():
            if path == folder or path.startswith(folder + os.sep):
                path = replacement + path[len(folder):] if replacement else path[len(folder) + 1:]
                break
        return f'{field}: "{path}"'

    return _DIFILE_FIELD.sub(rewrite, llir)


def install(package_folder: str, package_path: str) -> None:
    """Make this process's Triton CUDA backend write portable line info (see the module docstring): files under
    `package_folder` as `package_path`/..., Triton's own as triton/.... For the bundle's worker processes."""
    import triton
    from triton.backends.nvidia.compiler import CUDABackend

    prefixes = {os.path.realpath(package_folder): package_path,
                os.path.dirname(os.path.dirname(os.path.realpath(triton.__file__))): ""}
    make_ptx = getattr(CUDABackend.make_ptx, "_unpatched", CUDABackend.make_ptx)

    def make_ptx_with_portable_paths(self, src, *args, **kwargs):
        return make_ptx(self, portable_paths(src, prefixes), *args, **kwargs)

    make_ptx_with_portable_paths._unpatched = make_ptx
    CUDABackend.make_ptx = make_ptx_with_portable_paths
