"""The Family protocol: what a family module owns for its op, the only way the stages learn about an op.

Each function's docstring says what it owns. A family is a module (gen/families/<op>.py), so the protocol is checked
by `check_family` when `get_family` loads one: every member present, every function with the protocol's parameter
names, so a stage can call any of them by keyword or position.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Protocol

from ..build.spec_types import KernelSpec


class Family(Protocol):
    CAPTURE_SHAPE: tuple
    """The shape the precompile step (gen/build/bundle.py) launches each API case at; Gluon kernels do not specialize on
    shape ints, so one shape stands for all."""

    TORCH_PROVIDERS: tuple
    """The torch providers the op can dispatch a shape bucket to besides our variants (gen.analysis.dispatch_table)."""
    DEFAULT_PROVIDER: str
    """The provider a bucket no workload-suite run measured gets."""
    PER_SHAPE_SETUP_PROVIDERS: tuple
    """Torch providers that pay a setup at each shape they have not seen (SDPA's cuDNN backend), invisible to the
    suite's warmed-up timings: dispatch.json's varying_provider is each bucket's choice without them, taken where
    the op sees a length vary."""
    VARYING_DEFAULT_PROVIDER: str
    """The provider an unmeasured bucket gets where the length varies (dispatch.json's varying_default): one
    without a per-shape setup."""
    SWITCHED_PROVIDERS: tuple
    """Torch providers the op selects per call by switching torch state (attention's named SDPA backends), which
    the suite's timing loops switch once; the table charges them gen.analysis.dispatch_table.SWITCH_MS a call."""
    SUITE_INDUCTOR_PROVIDERS: tuple
    """The Inductor-generated alternatives the workload suite times: what a kernel of ours must beat to exist."""
    TRACED_AS: dict
    """{torch provider: the suite provider that times it compiled}: what a call traced to that provider becomes
    under torch.compile (Inductor's kernels of the same math), which the table's traced choice charges."""

    # ---- the spec: what it may say for this op (gen.build.spec, gen.build.plan, gen.build.render) ----

    def check_options(self, options: dict, path: str) -> dict:
        """The spec's `options:` section, checked and with defaults filled (a SpecError names the field and the fix)."""

    def check_config(self, target: str, cfg: dict, path: str, field: str) -> None:
        """One config of `target`'s template: required keys, types and hardware ranges (a SpecError if not)."""

    def estimate(self, target: str, cfg: dict, case: dict) -> dict:
        """{"smem_bytes", "tmem_cols"} a config needs at `case`, before compiling it (the plan's arithmetic pruning)."""

    def default_case(self, options: dict) -> dict:
        """The specialization a case inherits the keys it leaves out from."""

    def check_case(self, case: Any, options: dict, path: str, field: str) -> dict:
        """One specialization (dtypes, epilogue, head dim, mod, ...) checked and completed from default_case."""

    def check_verify(self, verify: dict, options: dict, path: str) -> dict:
        """The spec's `verify:` section: the shapes (and cases) checked against the reference, with defaults."""

    def check_bench(self, bench: dict, options: dict, path: str) -> dict:
        """The spec's `bench:` section: benchmark shapes, cases and the keep-or-reject margin, with defaults."""

    def template_context(self, options: dict) -> dict:
        """What the op's templates read from the spec besides the config (as `spec` in the jinja context)."""

    # ---- the cases each stage runs ----

    def api_cases(self, options: dict) -> list[dict]:
        """Every specialization the public op can launch (the precompiled bundle holds one kernel set per case)."""

    def verify_cases(self, spec: KernelSpec) -> list[dict]:
        """The cases a GPU build verifies every runnable variant on (gen.measure.gpu), at spec.verify["shapes"]."""

    def simulation_cases(self, spec: KernelSpec) -> list[dict]:
        """The cases the CPU simulator runs a Gluon variant on (`python -m gen simulate`)."""

    def simulation_shapes(self) -> list[list[int]]:
        """Small shapes with partial tiles for the simulator, TMA-compatible so the Gluon path takes them."""

    def tune_buckets(self, bench: dict) -> list[tuple[str, tuple, dict]]:
        """(key, shape, case) of every tuning bucket of a checked `bench:` section: what `gen tune` times apart."""

    def accuracy_shape(self, shape: Any) -> list:
        """The shape tuning's accuracy gate checks a bucket of `shape` at: the shape itself, or a smaller one with the
        same tile loops where the float64 reference would not fit in memory."""

    def capture_case(self, spec: KernelSpec) -> tuple[dict, list]:
        """(case, shape) REPORT.md compares our variants with Inductor's kernels on (gen.measure.inductor)."""

    # ---- running a variant and judging it ----

    def case_label(self, case: dict, shape: Any) -> str:
        """The one-line name of a case at a shape, used in every report row."""

    def make_inputs(self, shape: Any, case: dict, options: dict, device: Any, generator: Any = None) -> dict:
        """Fresh random inputs of a case at a shape (a dict `launch`, `reference` and `check_outputs` read)."""

    def new_outputs(self, inputs: dict, fill: float | None = None) -> dict:
        """Output tensors for `inputs`: uninitialised (fill None) or filled, e.g. with NaN so a missed write shows."""

    def not_applicable(self, module: Any, inputs: dict, outputs: dict) -> str:
        """Why `module` cannot take these tensors by design (the public op routes them elsewhere), or ""."""

    def launch(self, module: Any, inputs: dict, outputs: dict, num_sms: int) -> None:
        """Run a variant module's `launch` on `inputs` into `outputs`: the op's launch signature, in one place."""

    def launch_backward(self, module: Any, inputs: dict) -> bool:
        """Run the backward kernels a variant module has of its own (attention's sm90 `backward_dkdv`) once on
        `inputs`, with gradients of the right shapes, so the precompile step bundles them as it bundles the forward;
        False where the module has none."""

    def reference(self, inputs: dict, options: dict, precision: Any = None) -> Any:
        """The op by its math definition, in float64 (or `precision`): the accuracy yardstick."""

    def check_outputs(self, outputs: dict, inputs: dict, options: dict) -> tuple[float, str]:
        """(relative error, detail) of a variant's outputs against the reference; inf where an output is wrong in a
        way the norm would not show (e.g. attention's LSE finiteness)."""

    def case_flops(self, shape: Any, case: dict) -> float:
        """The floating-point work of one call at `shape`, masks not discounted (tuning's TFLOP/s)."""

    # ---- measuring against the alternatives (GPU) ----

    def benchmark(self, spec: KernelSpec, variants: dict, num_sms: int) -> tuple[list, list]:
        """(rows, errors): every variant module (provider name -> module) and the op's torch/Inductor baselines
        timed on spec.bench's shapes and cases, in one process."""

    def eager_call(self, inputs: dict, case: dict, shape: Any, options: dict, device: str = "cuda"
                   ) -> tuple[Callable, tuple, float]:
        """(fn, args, flops): what a user writes in PyTorch for this case, on `inputs` moved to `device` (what
        Inductor compiles for gen.measure.inductor)."""

    def suite_bucket(self, case: dict) -> tuple:
        """The dispatch bucket (categorical, bins) of a workload-suite row's case, as the op computes it per call."""


def _members(protocol: type) -> dict[str, Any]:
    """name -> the protocol's declaration (a function, or the annotation of a constant)."""
    functions = {n: v for n, v in vars(protocol).items() if inspect.isfunction(v) and not n.startswith("_")}
    return {**{n: t for n, t in protocol.__annotations__.items()}, **functions}


MEMBERS = _members(Family)


def _parameters(fn: Callable) -> list[str]:
    return [p for p in inspect.signature(fn).parameters if p != "self"]


def check_family(module):
    """`module` itself if it implements every member of Family with the protocol's parameter names; else a
    TypeError naming what is missing or different."""
    problems = []
    for name, declared in MEMBERS.items():
        if not hasattr(module, name):
            problems.append(f"{name} is missing")
        elif inspect.isfunction(declared):
            impl = getattr(module, name)
            if not callable(impl):
                problems.append(f"{name} is not a function")
            elif _parameters(impl) != _parameters(declared):
                problems.append(f"{name}{inspect.signature(impl)} does not take {_parameters(declared)}")
    if problems:
        raise TypeError(f"family {getattr(module, '__name__', module)!r} does not implement Family: "
                        + "; ".join(problems))
    return module
