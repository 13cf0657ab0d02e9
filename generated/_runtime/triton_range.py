"""The Triton releases gen supports, and a clear error outside them (stdlib only: generated packages import it).

pyproject.toml states the same range as a dependency (`triton>=3.6,<3.10`), so pip keeps the triton the user's torch
already pairs with (torch 2.11 -> 3.6.0, 2.12 / 2.13 -> 3.7.1, 2.14 -> 3.8.0). Inside the range the Gluon names
that moved between releases go through templates/_lib/compat.jinja; what each version compiles to is in the
README ("Limits"). Only TESTED ran on a GPU. Its build is the package itself (generated/<family>/); each other
release's own build (its gates' configs, its bundles; compiled, not run) sits beside it in release_folder().
"""
from __future__ import annotations

import re

SUPPORTED = ((3, 6), (3, 9))   # (major, minor) first and last, inclusive
TESTED = "3.6.0"               # the GPU truth: the H200 runs it, the goldens, IR baselines and bundles come from it
PAIRS = "torch 2.11 -> triton 3.6.0, torch 2.12 or 2.13 -> 3.7.1, torch 2.14 -> 3.8.0"


def release(version: str) -> tuple[int, int]:
    """(major, minor) of a version string such as '3.8.0', '3.6.0+git1a2b' or '3.9.0rc1'."""
    m = re.match(r"(\d+)\.(\d+)", version)
    if not m:
        raise ValueError(f"cannot read a Triton version from {version!r}")
    return int(m.group(1)), int(m.group(2))


def release_folder(version: str) -> str | None:
    """The folder of generated/<family>/ that holds `version`'s own build ('triton_3_9'); None for the GPU-tested
    release, whose build is generated/<family>/ itself. A Python package name: its modules import as
    generated.<family>.triton_3_9.<variant>."""
    major, minor = release(version)
    return None if (major, minor) == release(TESTED) else f"triton_{major}_{minor}"


def problem(version: str) -> str:
    """Why `version` cannot be used, with the fix; '' when it is supported."""
    lo, hi = SUPPORTED
    if lo <= release(version) <= hi:
        return ""
    return (f"triton {version} is installed; gen supports triton {lo[0]}.{lo[1]} to {hi[0]}.{hi[1]} (GPU-tested: "
            f"{TESTED}). Install a torch whose triton is in that range ({PAIRS}), or "
            f"pip install 'triton>={lo[0]}.{lo[1]},<{hi[0]}.{hi[1] + 1}' beside a torch that accepts it.")


def installed() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("triton")
    except PackageNotFoundError:
        import triton   # a source build without distribution metadata

        return triton.__version__


def check() -> str:
    """The installed Triton version; ImportError naming the versions and the fix when it is outside the range."""
    found = installed()
    why = problem(found)
    if why:
        raise ImportError(why)
    return found
