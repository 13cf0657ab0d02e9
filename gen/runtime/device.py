"""The local CUDA device, read from the driver through cuda-python (torch as a fallback)."""
from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    major: int
    minor: int
    num_sms: int
    smem_optin: int
    source: str          # "cuda-python" or "torch"

    @property
    def label(self) -> str:
        return f"{self.name} (sm_{self.major}{self.minor})"


def cuda_available() -> bool:
    """A CUDA device is present (asked of the driver; cheaper than importing torch on CPU machines)."""
    try:
        from cuda.bindings import driver as cu

        if cu.cuInit(0)[0] != cu.CUresult.CUDA_SUCCESS:
            return False
        err, count = cu.cuDeviceGetCount()
        return err == cu.CUresult.CUDA_SUCCESS and count > 0
    except Exception:
        return False


@functools.lru_cache(maxsize=None)
def device_info(index: int = 0) -> DeviceInfo:
    try:
        from cuda.bindings import driver as cu

        def check(res):
            err, *vals = res if isinstance(res, tuple) else (res,)
            if err != cu.CUresult.CUDA_SUCCESS:
                raise RuntimeError(f"CUDA driver error {err}")
            return vals[0] if len(vals) == 1 else vals

        check(cu.cuInit(0))
        dev = check(cu.cuDeviceGet(index))
        attr = cu.CUdevice_attribute
        get = lambda a: int(check(cu.cuDeviceGetAttribute(a, dev)))  # noqa: E731
        name = check(cu.cuDeviceGetName(256, dev))
        name = name.split(b"\0", 1)[0].decode() if isinstance(name, bytes) else str(name)
        return DeviceInfo(index, name, get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                          get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
                          get(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
                          get(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN), "cuda-python")
    except Exception:
        import torch

        p = torch.cuda.get_device_properties(index)
        return DeviceInfo(index, p.name, p.major, p.minor, p.multi_processor_count,
                          getattr(p, "shared_memory_per_block_optin", 0), "torch")
