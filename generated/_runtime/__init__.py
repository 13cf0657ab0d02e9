"""The run-time side of the generated packages: what runs on every call of a generated op.

launch    compiled kernels launched through Triton's launcher, without its per-call binder
dispatch  shape buckets and the measured table that maps a bucket to a provider (ours or torch's)
triton_range  the supported Triton releases; importing gen.runtime outside them is a clear ImportError
"""
from .triton_range import check as _check_triton

_check_triton()
