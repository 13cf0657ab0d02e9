#!/usr/bin/env python3
"""Spills and key SASS counts of a target's variant at config overrides, on every compile case of its spec (CPU
cross-compile with the installed Triton; no GPU). For trying a config change against the 0-spill gate before
putting it in the spec.

    python bench/config_spills.py specs/attention.yaml sm100 '{}' '{"EXP2_EMU": 1}' '{"SOFTMAX_REGS": 200}'

Each JSON argument is merged over the target's spec config; per compile case it prints the spill stores (STL) and
the static counts of the SASS opcodes that tell where the work goes (MUFU, FFMA/FFMA2, FADD/FADD2, FSEL, IMAD).
"""
from __future__ import annotations

import collections
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

OPCODES = ("STL", "MUFU", "FFMA", "FFMA2", "FADD", "FADD2", "FSEL", "IMAD")
_SASS_OP = re.compile(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", re.M)


def opcode_counts(sass: str) -> dict:
    counts = collections.Counter(_SASS_OP.findall(sass))
    return {op: counts.get(op, 0) for op in OPCODES}


def main(argv: list[str]) -> int:
    from gen.build import compile as compile_stage
    from gen.build.render import render_variant
    from gen.build.spec import load_spec
    from gen.build.targets import get_target

    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    spec, target = load_spec(argv[0]), argv[1]
    for over in argv[2:]:
        config = {**spec.targets[target].config, **json.loads(over)}
        source = render_variant(spec, target, config)
        requests = [compile_stage.CompileRequest(source, case, get_target(target)) for case in spec.compile_cases]
        print(over)
        for case, artifacts in zip(spec.compile_cases, compile_stage.compile_many(requests)):
            name = "/".join(str(v) for v in case.values())
            if not all(a.ok for a in artifacts):
                print(f"  {name}: compile failed: {artifacts[0].error[:200]}")
                continue
            counts = opcode_counts("\n".join(a.sass for a in artifacts))
            print(f"  {name}: " + " ".join(f"{k} {v}" for k, v in counts.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
