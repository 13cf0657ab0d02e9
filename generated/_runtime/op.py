"""Per-call machinery every generated op shares: device facts, variant modules, precompiled seeding, the bucket
table, and whether a call may skip torch.library's dispatcher.

Everything here is looked up once and memoized, so a call costs dictionary lookups: the device's target and SM
count per device index, a variant module and its bundle seeding per (target, case), a bucket's provider per bucket.
"""
from __future__ import annotations

import importlib
import json
import os
from pathlib import Path

import torch

from .dispatch import MAX_BIN, BucketTable, variant_target
from .traced import compiled_with_cuda_graphs

GLUON_TARGETS = ("sm100", "sm90")
# GEN_DISPATCH: "table" (default: the measured bucket table), "ours" (always this device's variant where it can run:
# for trying the sm100 kernels on a Blackwell GPU, which no table has measured), "torch" (always the torch provider).
POLICY = os.environ.get("GEN_DISPATCH", "table")
if POLICY not in ("table", "ours", "torch"):
    raise ValueError(f"GEN_DISPATCH={POLICY!r}: use table, ours or torch")
# A table's picks of our variants hold on the GPU model the suite ran on (dispatch.json's "device"). On another model
# of the same architecture they need not: the H200 table's GEMM picks for Qwen2.5-7B's MLP cost its prefill block
# 8-18% on an H100 (bench/results/suite-block-h100.json). There the table's torch picks stand and its picks of ours
# fall back to the conservative choice, unless GEN_DISPATCH_ANY_DEVICE=1.
ANY_DEVICE = os.environ.get("GEN_DISPATCH_ANY_DEVICE") == "1"


def target_for(major: int, shipped) -> str:
    """sm100 on Blackwell, sm90 on Hopper, triton elsewhere (or where that target's variant did not pass its gates)."""
    target = "sm100" if major == 10 else "sm90" if major == 9 else "triton"
    return target if target in shipped else "triton"


# Tensor types that dispatch exactly as a plain tensor: nn.Parameter (an nn.Linear's weight) disables
# __torch_function__. Its subclasses (quantized or sharded weights) may not, so the match is on the exact type.
PLAIN_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)


def direct_call_ok(*tensors) -> bool:
    """May this eager call run its implementation without torch.library's dispatcher (about 40 us of host time)?
    Only for plain CUDA tensors (or nn.Parameters) outside tracing and autograd: torch.compile, fake tensors, other
    subclasses, meta tensors and inputs that require grad all go through a registered op (op_for: the custom op
    where an input requires grad, else the inference op), so they see exactly what they did. Called on the eager
    branch only (the op checked torch.compiler.is_compiling() first), so it does not ask again."""
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is None:
            continue
        if type(t) not in PLAIN_TENSOR_TYPES or not t.is_cuda or (grad and t.requires_grad):
            return False
    return True


# Is a CUDA graph being captured on the current stream? A captured call takes the table's pick by GPU time
# (graph_provider): its replays run no host code. Asked per call of a route whose two picks differ (CUDA tensors),
# so torch's C function itself, without torch.cuda.is_current_stream_capturing's Python frame around it.
is_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", torch.cuda.is_current_stream_capturing)


def needs_grad(*tensors) -> bool:
    """Will autograd record a call on these tensors (None allowed)?"""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def op_for(custom_op, inference, *tensors):
    """The registration a call through torch.library takes: the custom op (it differentiates) where an input
    requires grad, else the inference op (inference_op: the same forward, less host time)."""
    return custom_op if needs_grad(*tensors) else inference


_LIBRARIES: list = []   # a torch.library.Library removes its definitions when collected: keep them


def inference_op(qualname: str, schema: str, impl, fake):
    """A second registration of an op's forward, for calls no input of which requires grad: defined through
    torch.library.Library, with kernels for CUDA and CPU (the interpreter) and a fake, and no autograd kernel.
    torch.library.custom_op wraps every call in its autograd and aliasing checks. H200 host, torch 2.11, one call
    inside a compiled graph (bench/host_time.py, "compiled" rows, bench/results/host_time-h200.json): the custom op
    adds 77 us (gemm) and 105 us (attention) to the graph with the torch op traced instead, this definition 47 and
    33 us. Callers send inputs that require grad to the custom op, which differentiates. schema: the argument list
    and return, e.g. "(Tensor a) -> Tensor"."""
    namespace, name = qualname.split("::")
    lib = torch.library.Library(namespace, "FRAGMENT")
    lib.define(name + schema)
    for key in ("CUDA", "CPU"):
        lib.impl(name, impl, key)
    torch.library.register_fake(qualname, fake, lib=lib)
    _LIBRARIES.append(lib)
    return getattr(getattr(torch.ops, namespace), name).default


class OpRuntime:
    """The run time of one generated package (generated/<family>/)."""

    def __init__(self, package: str, package_dir: str, shipped: list, torch_default: str, providers: tuple):
        self.package = package
        self.package_dir = Path(package_dir)
        self.shipped = tuple(shipped)
        # the TMA-addressed variants: sm100, sm90 and their named configs (sm90_m64, ...)
        self.gluon = tuple(n for n in self.shipped if variant_target(n) in GLUON_TARGETS)
        self.torch_default = torch_default
        path = Path(package_dir) / "dispatch.json"
        data = json.loads(path.read_text()) if path.exists() else {"targets": {}}
        # per call (eager, and inside the custom op) / while torch.compile traces (ours is then a custom op)
        self.tables = self._tables(data, providers, "provider")
        self.traced_tables = self._tables(data, providers, "traced_provider")
        # where a call's length varies call to call: no provider with a per-shape setup, unmeasured buckets too (a
        # table without the fields uses "provider" and "default"); and such a length made symbolic by torch.compile
        self.varying_tables = self._tables(data, providers, "varying_provider", "varying_default")
        self.traced_varying_tables = self._tables(data, providers, ("traced_varying_provider", "varying_provider"),
                                                  "varying_default")
        # calls captured into a CUDA graph, whose replays run no host code: the pick by GPU time alone (a table
        # without the field uses "provider")
        self.graph_tables = self._tables(data, providers, ("graph_provider", "provider"))
        self.table_devices = {target: t.get("device") for target, t in data["targets"].items()}
        self.foreign: set = set()   # targets whose table was measured on another GPU model than this process has
        self._devices: dict = {}
        self._ready: dict = {}
        self._release: tuple | None = None   # (subpackage, its shipped variants) of the installed Triton's own build

    @staticmethod
    def _tables(data: dict, providers: tuple, field, default_field: str = "default") -> dict:
        return {target: BucketTable.from_json(t, providers, field, default_field)
                for target, t in data["targets"].items()}

    def device(self, index: int) -> tuple[str, int]:
        """(target, SM count) of CUDA device `index`, asked of the driver once."""
        found = self._devices.get(index)
        if found is None:
            from .device import device_info

            info = device_info(index)
            found = self._devices[index] = (target_for(info.major, self.shipped), info.num_sms)
            self.note_device(found[0], info.name)
        return found

    def note_device(self, target: str, name: str) -> None:
        """A `target` GPU named `name` is in use. Where dispatch.json has a table measured on that model under
        "target@name" (a second model of the architecture), it becomes the target's table in this process; where
        the target's table was measured on another model, its picks of our variants no longer hold (ANY_DEVICE)."""
        own = f"{target}@{name}"
        if own in self.table_devices:
            for tables in (self.tables, self.traced_tables, self.varying_tables, self.traced_varying_tables,
                           self.graph_tables):
                tables[target] = tables[own]
            self.table_devices[target] = name
        measured = self.table_devices.get(target)
        if measured and measured != name and not ANY_DEVICE:
            self.foreign.add(target)

    def measured(self, target: str, categorical: tuple) -> bool:
        """Has the target's table any bucket with these categorical fields (every table of a target is built from
        the same suite rows, so the per-call one answers for all)?"""
        table = self.tables.get(target)
        return table is not None and categorical in table.categoricals

    def unmeasured(self, target: str, categorical: tuple) -> bool:
        """Must a call in this bucket not take a guessed pick: the table policy holds and the target's table has no
        bucket with these categorical fields (GEN_DISPATCH=ours or torch decides without the table)?"""
        return POLICY == "table" and not self.measured(target, categorical)

    def _conservative(self, target: str, provider: str, varying: bool) -> str:
        """`provider`, unless it is one of ours and the table was measured on another GPU model: then torch's
        default, or where the length varies the table's varying default (no per-length setup)."""
        if target in self.foreign and provider in self.shipped:
            return self.varying_tables[target].default if varying else self.torch_default
        return provider

    def pick(self, target: str, bucket: tuple, varying: bool = False, captured: bool = False) -> str:
        """The provider for a call on `target` in `bucket` ((categorical, bins)), by GEN_DISPATCH's policy; varying:
        the call's length is seen to change from call to call (the table's varying_provider); captured: the call is
        being captured into a CUDA graph (the table's graph_provider, by GPU time)."""
        if POLICY == "ours":
            return target
        if POLICY == "torch":
            return self.torch_default
        table = (self.graph_tables if captured else self.varying_tables if varying else self.tables).get(target)
        return self._conservative(target, table.pick(*bucket), varying) if table is not None else self.torch_default

    def picks(self, target: str, bucket: tuple, varying: bool = False) -> frozenset:
        """Every provider a call traced by torch.compile may take in `bucket` whose bins given as None are free
        (symbolic sizes), from the traced table (ours must also pay for the custom op's dispatch there); varying:
        from the traced varying table (a length Dynamo made symbolic because it changed). A compile with CUDA graphs
        (reduce-overhead) picks as captured calls do (graph_provider: its replays pay no dispatch), except where a
        length varies (each new one is a new recording, and a per-length setup too)."""
        if POLICY != "table":
            return frozenset((self.pick(target, bucket, varying),))
        if not varying and compiled_with_cuda_graphs():
            table = self.graph_tables.get(target)
        else:
            table = (self.traced_varying_tables if varying else self.traced_tables).get(target)
        if table is None:
            return frozenset((self.torch_default,))
        return frozenset(self._conservative(target, p, varying) for p in table.picks(*bucket))

    def first_bin(self, target: str, bucket_at, allowed, varying: bool = False) -> int:
        """The smallest log2 bin b at which the provider for bucket_at(2**b) (other bins free where it says None) may
        be outside `allowed`; MAX_BIN + 1 if never: where a trace-time guard on one symbolic size goes."""
        for b in range(MAX_BIN + 1):
            if not self.picks(target, bucket_at(1 << b), varying) <= allowed:
                return b
        return MAX_BIN + 1

    def release_build(self) -> tuple[str, frozenset]:
        """(package, shipped variant names) of the installed Triton release's own build: its folder of this package
        (triton_range.release_folder, e.g. triton_3_9) where that release was built, else this package itself (the
        GPU-tested release, or a release without a build of its own)."""
        if self._release is None:
            from .triton_range import installed, release_folder

            folder = release_folder(installed())
            if folder and (self.package_dir / folder / "__init__.py").exists():
                built = importlib.import_module(f"{self.package}.{folder}")
                self._release = (built.__name__, frozenset(built.SHIPPED))
            else:
                self._release = (self.package, frozenset(self.shipped))
        return self._release

    def module_attr(self, target: str, name: str, default):
        """An attribute of variant `target`'s module (the one `variant` would load), without seeding its kernels."""
        package, shipped = self.release_build()
        module = importlib.import_module(f"{package if target in shipped else self.package}.{target}")
        return getattr(module, name, default)

    def variant(self, target: str, case_key: tuple, case: dict):
        """The variant module `target` (sm90, or a named config such as sm90_m64), with its precompiled kernels for
        `case` seeded into Triton's cache once. On a Triton release with a build of its own, that build's module
        (the config its gates chose, its bundle); a variant that build did not ship (its gates rejected it, or it is
        that release's default config) runs the GPU-tested build's module, compiled by the installed Triton on first
        use."""
        module = self._ready.get((target, case_key))
        if module is None:
            package, shipped = self.release_build()
            if target not in shipped:
                package = self.package
            module = importlib.import_module(f"{package}.{target}")  # lazily: CPU users never load Gluon modules
            if variant_target(target) in GLUON_TARGETS and not os.environ.get("GEN_NO_PRECOMPILED"):
                # The bundled binaries (kernels/<target>/, built by gen) go into Triton's cache before the first
                # launch, so it finds them instead of compiling; a mismatch (other Triton, ptxas, arch) JITs.
                from .seed import seed

                seed(Path(module.__file__).parent / "kernels" / target, module, case)
            self._ready[(target, case_key)] = module
        return module
