"""Local cache directories: compiled artifacts, rendered modules and Triton's own kernel cache."""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def cache_root() -> Path:
    root = Path(os.environ.get("GEN_CACHE_DIR") or REPO_ROOT / ".cache")
    root.mkdir(parents=True, exist_ok=True)
    return root


def cache_dir(name: str) -> Path:
    path = cache_root() / name
    path.mkdir(parents=True, exist_ok=True)
    return path
