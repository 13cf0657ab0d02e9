"""The three code-generation targets and their hardware budgets."""
from __future__ import annotations

from dataclasses import dataclass

# Opt-in shared memory per block on both Hopper (H100/H200) and Blackwell (B200): 227 KiB.
SMEM_OPT_IN_BYTES = 232_448


@dataclass(frozen=True)
class Target:
    name: str                 # "sm100" | "sm90" | "triton"
    kind: str                 # "gluon" (explicit layouts/async ops) or "triton" (portable @triton.jit)
    capability: int           # the capability we cross-compile for (GPUTarget("cuda", capability, 32))
    runs_on_major: tuple      # device capability majors that can run it; () means any CUDA GPU
    smem_bytes: int           # shared memory budget per CTA
    tmem_cols: int            # tensor-memory columns per SM (0 where the chip has none)
    max_regs: int             # registers per thread the hardware allows
    mma_sass: tuple           # SASS opcodes that prove the tensor-core path we meant is there
    tma_sass: tuple = ("UTMALDG",)

    @property
    def arch(self) -> str:
        return f"sm_{self.capability}a" if self.capability >= 90 else f"sm_{self.capability}"

    def runs_on(self, major: int) -> bool:
        return not self.runs_on_major or major in self.runs_on_major


SM100 = Target("sm100", "gluon", 100, (10,), SMEM_OPT_IN_BYTES, 512, 255, ("UTCHMMA",))
SM90 = Target("sm90", "gluon", 90, (9,), SMEM_OPT_IN_BYTES, 0, 255, ("HGMMA",))
# The portable variant is inspected as compiled for Hopper, the GPU our benchmarks run on.
TRITON = Target("triton", "triton", 90, (), SMEM_OPT_IN_BYTES, 0, 255, (), ())

TARGETS = {t.name: t for t in (SM100, SM90, TRITON)}


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise ValueError(f"unknown target {name!r}; choose one of {sorted(TARGETS)}") from None


def target_for_capability(major: int) -> Target:
    """The most specialised target a device of this capability major can run."""
    for t in (SM100, SM90):
        if t.runs_on(major):
            return t
    return TRITON
