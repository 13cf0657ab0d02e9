import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# family -> target -> the Triton releases other than the GPU-tested one (gen.runtime.triton_range.TESTED, on which
# every target must ship) where it must ship too: pass its gates with 0 spills (README "Limits"). A target leaving
# this table is a regression of the compatibility layer or a compiler change to look at; one joining it is added.
MUST_SHIP = {
    "gemm": {"sm100": ("3.7.1", "3.8.0", "3.9.0"), "sm90": ("3.7.1", "3.8.0", "3.9.0"),
             "triton": ("3.7.1", "3.8.0", "3.9.0"),
             "sm100_pair": ("3.8.0", "3.9.0")},   # 2-CTA MMAs: specs/by_triton/gemm.yaml
    # sm90 and triton on 3.9 with specs/by_triton/attention.yaml's configs (BLOCK_N 64 / 32); sm100 on 3.7 with its
    # own config there (EPI_D 16, WORKER_REGS 48, SLOPE_PER_TILE) and on 3.8-3.9 with its prologue spills allowed
    # (by_triton expect; test_triton_versions.py pins why)
    "attention": {"sm100": ("3.7.1", "3.8.0", "3.9.0"), "sm90": ("3.7.1", "3.8.0", "3.9.0"),
                  "triton": ("3.7.1", "3.8.0", "3.9.0"), "triton_splitkv": ("3.7.1", "3.8.0", "3.9.0"),
                  "triton_splitkvns4": ("3.7.1", "3.8.0", "3.9.0")},   # specs/tuned/attention.yaml
}


def child_env(**extra) -> dict:
    """The environment of a child Python that must import this checkout: the checkout first on PYTHONPATH, ahead of
    what was there (not instead of it: under .ci/triton-release's interpreter the release's triton is first on
    PYTHONPATH, and a child that dropped it would import the venv's triton 3.6 and test that one)."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(ROOT) + (os.pathsep + path if path else ""), **extra}


def installed_triton() -> str:
    from gen.runtime.triton_range import installed

    return installed()


def on_tested_triton() -> bool:
    from gen.runtime.triton_range import TESTED

    return installed_triton() == TESTED


def installed_build_manifest(family: str) -> dict:
    """The manifest of the build the package runs with the installed Triton: its release folder's
    (generated/<family>/triton_X_Y/, configs and named configs of that release alone, e.g. the 2-CTA sm100 GEMM on
    3.8+), else the package's own (the GPU-tested release's, or a release without a build of its own)."""
    import json

    from gen.runtime.triton_range import release_folder

    folder = release_folder(installed_triton())
    path = ROOT / "generated" / family / (folder or "") / "manifest.json"
    if folder is None or not path.exists():
        path = ROOT / "generated" / family / "manifest.json"
    return json.loads(path.read_text())


def must_ship(family: str, version: str, spec_targets) -> set:
    """The targets of `family` that must ship on Triton `version` (every one on the GPU-tested release)."""
    from gen.runtime.triton_range import TESTED

    if version == TESTED:
        return set(spec_targets)
    return {t for t, versions in MUST_SHIP[family].items() if version in versions}


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", help="rewrite tests/golden/ from the current templates")
    parser.addoption("--update-baselines", action="store_true", help="rewrite tests/baselines/ from the current IR")


def _has_cuda() -> bool:
    from gen.runtime.device import cuda_available

    return cuda_available()


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def update_golden(request):
    return request.config.getoption("--update-golden") or os.environ.get("GEN_UPDATE_GOLDEN") == "1"


@pytest.fixture
def update_baselines(request):
    return request.config.getoption("--update-baselines") or os.environ.get("GEN_UPDATE_BASELINES") == "1"
