import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", help="rewrite tests/golden/ from the current templates")
    parser.addoption("--update-baselines", action="store_true", help="rewrite tests/baselines/ from the current IR")


def _has_cuda() -> bool:
    from gen.device import cuda_available

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
