"""CPU numerics for the portable variant: Triton's interpreter in a child process.

TRITON_INTERPRET=1 must be set before triton is imported, so the check runs in a fresh interpreter:
`python -m gen.measure.interpret SPEC --config JSON --shapes JSON --cases JSON` prints a VerifyReport as JSON.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from .verify import VerifyReport


def verify_interpreted(spec_path: str, config: dict, shapes: list, cases: list, timeout_s: int = 1800,
                       num_sms: int = 1) -> VerifyReport:
    """`num_sms`: the SM count the variant sizes its grid for (a split-KV plan splits the keys over more programs
    the more SMs there are)."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    cmd = [sys.executable, "-m", "gen.measure.interpret", spec_path, "--config", json.dumps(config),
           "--shapes", json.dumps(shapes), "--cases", json.dumps(cases), "--num-sms", str(num_sms)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"interpreter run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return VerifyReport(**json.loads(proc.stdout.strip().splitlines()[-1]))


def main(argv=None) -> int:
    import argparse
    from dataclasses import asdict

    from ..build.compile import load_module_from_text
    from ..build.render import render_variant
    from ..build.spec import load_spec
    from .verify import verify_module

    p = argparse.ArgumentParser(prog="python -m gen.measure.interpret")
    p.add_argument("spec")
    p.add_argument("--config", required=True)
    p.add_argument("--shapes", required=True)
    p.add_argument("--cases", required=True)
    p.add_argument("--num-sms", type=int, default=1)
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") != "1":
        print("set TRITON_INTERPRET=1 (gen.measure.interpret.verify_interpreted does)", file=sys.stderr)
        return 2
    spec = load_spec(args.spec)
    src = render_variant(spec, "triton", json.loads(args.config))
    module = load_module_from_text(src.text, src.digest)
    report = verify_module(spec, module, json.loads(args.cases), json.loads(args.shapes), "cpu",
                           num_sms=args.num_sms)
    print(json.dumps(asdict(report)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
