"""Variant vs torch reference: fresh random inputs, poisoned outputs, relative error against float64.

Runs on a CUDA device, or on CPU tensors under the Triton interpreter (portable variant) or the Gluon simulator.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from .families import get_family
from .runtime.shapes import b_layout
from .spec import KernelSpec

# Relative-error tolerances ||out - ref|| / ||ref|| by output dtype (bf16 rounding alone is ~2e-3 in norm).
TOLERANCE = {"bfloat16": 1e-2, "float16": 4e-3, "float32": 1e-4}


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


def rel_err(out, ref) -> float:
    import torch

    out, ref = out.double(), ref.double()
    if not torch.isfinite(out).all():
        return math.inf
    denom = ref.norm().item()
    diff = (out - ref).norm().item()
    return diff / denom if denom > 0 else diff


def launch_poisoned(family: str, module, inputs: dict, options: dict, num_sms: int) -> dict:
    """Run a variant's `launch` into NaN-poisoned outputs (an element it forgets to write stays NaN).
    Returns {"out"} (GEMM) or {"out", "lse"} (attention), on the inputs' device."""
    import torch

    if family == "gemm":
        a, b = inputs["a"], inputs["b"]
        out = torch.full((a.shape[0], b.shape[1]), float("nan"), device=a.device, dtype=inputs["out_dtype"])
        b_mem = b if b_layout(b) == "kn" else b.t()  # as stored: [K, N], or an nn.Linear weight [N, K]
        if hasattr(module, "tma_compatible") and not module.tma_compatible(a, b_mem, out):
            raise NotApplicable("TMA needs 16-byte aligned rows; the public op falls back to the portable variant")
        module.launch(a, b, inputs["bias"], out, inputs["activation"], num_sms)
        return {"out": out}
    q = inputs["q"]
    out = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:3], float("nan"), device=q.device, dtype=torch.float32)
    module.launch(q, inputs["k"], inputs["v"], out, lse, inputs["scale"], inputs["mod"], inputs["window_left"],
                  inputs["window_right"], inputs["softcap"], inputs["alibi_slopes"], num_sms)
    return {"out": out, "lse": lse}


def _check_gemm(module, inputs, options, num_sms) -> tuple[float, str]:
    out = launch_poisoned("gemm", module, inputs, options, num_sms)["out"]
    return rel_err(out, get_family("gemm").reference(inputs, options)), ""


def _check_attention(module, inputs, options, num_sms) -> tuple[float, str]:
    import torch

    got = launch_poisoned("attention", module, inputs, options, num_sms)
    out, lse = got["out"], got["lse"]
    ref_o, ref_lse = get_family("attention").reference(inputs, options)
    err = rel_err(out, ref_o)
    finite = torch.isfinite(ref_lse)
    lse_cpu = lse.double().cpu()
    ref_cpu = ref_lse.cpu()
    if not torch.equal(torch.isfinite(lse_cpu), finite.cpu()) or torch.isnan(lse_cpu).any():
        return math.inf, "LSE finiteness differs from the reference (fully masked rows must give -inf)"
    lse_err = (lse_cpu[finite.cpu()] - ref_cpu[finite.cpu()]).abs().max().item() if finite.any() else 0.0
    detail = f"lse max abs err {lse_err:.2e}"
    if lse_err > 2e-2:
        return math.inf, detail + " (> 2e-2)"
    return err, detail


def verify_module(spec: KernelSpec, module, cases: list[dict], shapes: list, device, num_sms: int = 132,
                  seed: int = 0, device_label: str | None = None) -> VerifyReport:
    """Run `module.launch` on every case x shape with fresh inputs; compare with the float64 reference."""
    import torch

    family = get_family(spec.family)
    check = {"gemm": _check_gemm, "attention": _check_attention}[spec.family]
    gen = torch.Generator(device="cpu").manual_seed(seed)
    results = []
    for case in cases:
        for shape in shapes:
            inputs = family.make_inputs(shape, case, spec.options, "cpu", gen)
            inputs = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
            label = family.case_label(case, shape)
            out_dtype = case.get("out_dtype", case["dtype"])
            try:
                err, detail = check(module, inputs, spec.options, num_sms)
                ok = err <= TOLERANCE[out_dtype]
                results.append(asdict(CaseResult(label, err, ok, detail)))
            except NotApplicable as e:
                results.append(asdict(CaseResult(label, 0.0, True, f"not applicable: {e}")))
            except Exception as e:  # a crash in one case is a failed case, reported
                results.append(asdict(CaseResult(label, math.inf, False, f"{type(e).__name__}: {e}"[:500])))
    max_err = max((r["rel_err"] for r in results), default=0.0)
    return VerifyReport(device_label or str(device), results, max_err, bool(results) and all(r["ok"] for r in results))
