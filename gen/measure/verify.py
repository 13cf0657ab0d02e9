"""Variant vs torch reference: fresh random inputs, poisoned outputs, relative error against float64.

Runs on a CUDA device, or on CPU tensors under the Triton interpreter (portable variant) or the Gluon simulator.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from .accuracy import TOLERANCE
from ..families import get_family, inputs_on
from ..build.spec_types import KernelSpec


class NotApplicable(Exception):
    """The variant cannot take these inputs by design (e.g. TMA alignment); the public op routes them elsewhere."""


@dataclass(frozen=True)
class CaseResult:
    case: str
    rel_err: float
    ok: bool
    detail: str = ""


@dataclass(frozen=True)
class VerifyReport:
    device: str
    cases: list = field(default_factory=list)   # [CaseResult as dict]
    max_rel_err: float = 0.0
    ok: bool = False

    def to_manifest(self) -> dict:
        skipped = [c for c in self.cases if c["detail"].startswith("not applicable")]
        return {"device": self.device, "cases": len(self.cases) - len(skipped), "skipped": len(skipped),
                "max_rel_err": self.max_rel_err, "ok": self.ok, "failures": [c for c in self.cases if not c["ok"]]}


def launch_poisoned(family: str, module, inputs: dict, options: dict, num_sms: int) -> dict:
    """Run a variant's `launch` into NaN-poisoned outputs (an element it forgets to write stays NaN); the family's
    outputs dict, on the inputs' device. NotApplicable where the variant cannot take these tensors by design."""
    fam = get_family(family)
    outputs = fam.new_outputs(inputs, fill=float("nan"))
    why = fam.not_applicable(module, inputs, outputs)
    if why:
        raise NotApplicable(why)
    fam.launch(module, inputs, outputs, num_sms)
    return outputs


def verify_module(spec: KernelSpec, module, cases: list[dict], shapes: list, device, num_sms: int = 132,
                  seed: int = 0, device_label: str | None = None) -> VerifyReport:
    """Run `module.launch` on every case x shape with fresh inputs; compare with the float64 reference."""
    import torch

    family = get_family(spec.family)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    results = []
    for case in cases:
        for shape in shapes:
            inputs = family.make_inputs(shape, case, spec.options, "cpu", gen)
            inputs = inputs_on(inputs, device)
            label = family.case_label(case, shape)
            out_dtype = case.get("out_dtype", case["dtype"])
            try:
                outputs = launch_poisoned(spec.family, module, inputs, spec.options, num_sms)
                err, detail = family.check_outputs(outputs, inputs, spec.options)
                ok = err <= TOLERANCE[out_dtype]
                results.append(asdict(CaseResult(label, err, ok, detail)))
            except NotApplicable as e:
                results.append(asdict(CaseResult(label, 0.0, True, f"not applicable: {e}")))
            except Exception as e:  # a crash in one case is a failed case, reported
                results.append(asdict(CaseResult(label, math.inf, False, f"{type(e).__name__}: {e}"[:500])))
    max_err = max((r["rel_err"] for r in results), default=0.0)
    return VerifyReport(device_label or str(device), results, max_err, bool(results) and all(r["ok"] for r in results))
