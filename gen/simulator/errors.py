"""Exceptions raised by the Gluon CPU simulator."""
from __future__ import annotations


class SimulationError(Exception):
    """Base class: the simulated kernel did something the simulator (or the hardware) rejects."""


class DeadlockError(SimulationError):
    """Every partition of a program is blocked and no pending asynchronous operation can unblock any of them."""


class HazardError(SimulationError):
    """Two accesses to the same shared/tensor memory region are not ordered by a completed barrier (or a
    wgmma/store wait), at least one of them writes, and at least one is asynchronous or in another partition;
    or a generic-proxy smem access is not fenced (fence_async_shared) before an async-proxy access;
    or a TMA delivered more bytes than mbarrier.expect declared."""


class _Abort(BaseException):
    """Internal: unwinds a partition thread when its program is aborted (not an Exception on purpose)."""
