"""What a checked spec is (KernelSpec, TargetSpec) and how a spec problem is reported (SpecError).

Its own module because both gen.build.spec (which builds these) and gen.families (which validate a spec's family sections
and read the result) need them, and gen.build.spec needs the families.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field


class SpecError(ValueError):
    """A spec problem: where it is and how to fix it."""

    def __init__(self, path: str, field: str, problem: str, fix: str):
        self.path, self.field, self.problem, self.fix = path, field, problem, fix
        super().__init__(f"{path}: field '{field}': {problem}. Fix: {fix}")


@dataclass(frozen=True)
class TargetSpec:
    name: str
    config: dict                      # the default (shipped unless tuning found better) config
    search: dict                      # key -> list of values; candidates = config overridden by the product
    expect: dict                      # IR expectations (merged with the spec-wide ones)
    by_triton: dict = field(default_factory=dict)  # the config overrides the installed Triton took (by_triton_overrides)
    # Extra shipped configs: name -> full config (the `variants:` keys merged over `config`). Each becomes its own
    # module, <target>_<name>, gated like the default, and the dispatch table picks among them per shape bucket.
    variants: dict = field(default_factory=dict)

    def candidates(self) -> list[dict]:
        """The config space: the default first, then every combination of the search axes."""
        out = [dict(self.config)]
        keys = sorted(self.search)
        for values in itertools.product(*(self.search[k] for k in keys)):
            cand = {**self.config, **dict(zip(keys, values))}
            if cand not in out:
                out.append(cand)
        return out


@dataclass(frozen=True)
class KernelSpec:
    path: str
    sha256: str
    family: str
    op: str
    description: str
    options: dict
    targets: dict                     # name -> TargetSpec
    compile_cases: list
    verify: dict
    bench: dict
    raw: dict = field(repr=False, compare=False, default_factory=dict)
