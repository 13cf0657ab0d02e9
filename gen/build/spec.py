"""YAML -> KernelSpec. Every validation error names the file, the field and the fix."""
from __future__ import annotations

import hashlib
import json
import keyword
import re
from pathlib import Path
from typing import Any

import yaml

from ..families import get_family
from .spec_types import KernelSpec, SpecError, TargetSpec
from .targets import TARGETS

TOP_LEVEL_FIELDS = {
    "family": "the kernel family, e.g. gemm or attention",
    "op": "the public op name exported by generated/<family>",
    "description": "one line saying what the kernel computes",
    "options": "compile-time options of the family",
    "targets": "per-target config, search space and expectations",
    "expect": "IR expectations every target must meet, e.g. {spills: 0}",
    "compile_cases": "representative specializations compiled and gated",
    "verify": "shapes checked against the torch reference",
    "bench": "benchmark shapes and the keep-or-reject margin",
}
TARGET_FIELDS = {"config", "search", "expect", "variants"}
VARIANT_NAME = re.compile(r"[a-z][a-z0-9]{0,15}")
EXPECT_FIELDS = {"spills", "prologue_spills", "local_bytes", "convert_layouts", "partitions", "smem_bytes", "tmem_cols", "instructions"}


def _require_mapping(value: Any, path: str, name: str, fix: str) -> dict:
    if not isinstance(value, dict):
        raise SpecError(path, name, f"expected a mapping, got {type(value).__name__}", fix)
    return value


def _optional_mapping(value: Any, path: str, name: str, fix: str) -> dict:
    """An optional section: absent (or null) is {}; anything else must be a mapping (0, [] or "" is a mistake)."""
    return {} if value is None else _require_mapping(value, path, name, fix)


def _check_expect(expect: Any, path: str, name: str) -> dict:
    expect = _optional_mapping(expect, path, name, "write e.g. `expect: {spills: 0, convert_layouts: 2}`")
    for key, value in expect.items():
        if key not in EXPECT_FIELDS:
            raise SpecError(path, f"{name}.{key}", "unknown expectation",
                            f"use one of {sorted(EXPECT_FIELDS)}")
        if key == "instructions":
            _require_mapping(value, path, f"{name}.instructions", "map SASS opcode -> minimum count, e.g. {HGMMA: 1}")
            for op, n in value.items():
                if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                    raise SpecError(path, f"{name}.instructions.{op}", f"expected a count >= 0, got {n!r}",
                                    "give the minimum number of such instructions")
        elif not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise SpecError(path, f"{name}.{key}", f"expected an integer >= 0 (a maximum), got {value!r}",
                            "give the largest acceptable value")
    return expect


_RANGE = re.compile(r"^(>=|<=|==)?\s*(\d+)\.(\d+)$")


def _check_variants(raw: Any, config: dict, override: dict, path: str, field_name: str) -> dict:
    """`variants:` -> {name: full config}: each entry's keys over the spec's default config (`config`, before the
    by_triton override), then the override (a release's compiler needs it in every config of the target). A variant
    the override turns into the release's default is left out for that release: the default already is that config
    (sm90's n64 under Triton 3.9, whose override sets BLOCK_N 64 everywhere)."""
    raw = _optional_mapping(raw, path, f"{field_name}.variants", "map a variant name -> config keys it changes")
    out = {}
    for vname, over in raw.items():
        where = f"{field_name}.variants.{vname}"
        if not isinstance(vname, str) or not VARIANT_NAME.fullmatch(vname):
            raise SpecError(path, where, f"{vname!r} is not a variant name",
                            "use 1-16 lower-case letters and digits, starting with a letter (it names the module "
                            "<target>_<name>), e.g. m64")
        over = _require_mapping(over, path, where, "give the config keys this variant changes, e.g. {BLOCK_M: 64}")
        # a key the default config leaves out (a template's optional key, such as the GEMM's SPLIT_K) may be set
        # here; the family's check_config of the whole variant config (load_spec) rejects keys no template reads
        if {**config, **over} == config:
            raise SpecError(path, where, "is the default config", "change at least one key or remove the variant")
        cfg = {**config, **over, **override}
        if cfg == {**config, **override}:
            continue
        if cfg in out.values():
            raise SpecError(path, where, "repeats another variant's config", "remove one of them")
        out[vname] = cfg
    return out


def _add_variants(variants: dict, more: dict, family, target: str, path: str, prefix: str, config_suffix: str,
                  fix: str) -> None:
    """Add named configs from a file beside the spec (tuned, by_triton) to the spec's own `variants`, each checked
    like them and refused where it repeats one (its name or its config); errors name `<prefix>.<variant>`."""
    for vname, cfg in more.items():
        if vname in variants or cfg in variants.values():
            raise SpecError(path, f"{prefix}.{vname}", "repeats a variant of the spec (its name or its config)", fix)
        family.check_config(target, cfg, path, f"{prefix}.{vname}{config_suffix}")
        variants[vname] = cfg


def _companion_yaml(path: str, text: str):
    """The parsed text of a file beside a spec (by_triton, tuned); a spec error naming it where it is not YAML."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SpecError(path, "<yaml>", f"not valid YAML: {getattr(e, 'problem', e)}", "fix the YAML syntax") from None


def tuned_path(spec_path: Path) -> Path:
    """specs/<name>.yaml -> specs/tuned/<name>.yaml: configs `gen tune --from-sweep --write` added as variants."""
    return spec_path.parent / "tuned" / f"{spec_path.stem}.yaml"


def tuned_variants(spec_path: Path) -> tuple[dict, str]:
    """(target -> {variant name: config keys}, the file's text) from tuned_path(spec_path); ({}, "") without one.
    Each entry is {config: {...}, why: "..."} (gen/measure/suite_tune.py writes them)."""
    path = tuned_path(spec_path)
    if not path.exists():
        return {}, ""
    p, text = str(path), path.read_text()
    raw = _optional_mapping(_companion_yaml(p, text), p, "<top>",
                            "map target -> variant name -> {config: {...}, why: ...}")
    out = {}
    for target, entries in raw.items():
        entries = _optional_mapping(entries, p, str(target), "map a variant name -> {config: {...}, why: ...}")
        for name, entry in entries.items():
            entry = _require_mapping(entry, p, f"{target}.{name}", "give {config: {KEY: value}, why: ...}")
            out.setdefault(target, {})[name] = _require_mapping(entry.get("config"), p, f"{target}.{name}.config",
                                                                "give the config keys this variant changes")
    return out, text


def by_triton_path(spec_path: Path) -> Path:
    """specs/<name>.yaml -> specs/by_triton/<name>.yaml: that spec's config overrides per Triton release (optional)."""
    return spec_path.parent / "by_triton" / f"{spec_path.stem}.yaml"


def by_triton_overrides(spec_path: Path, triton_version: str | None = None) -> dict:
    """target -> the config overrides that apply to this Triton release, read from by_triton_path(spec_path).

    The file maps target -> release range -> config keys, e.g. `sm90: {">=3.9": {BLOCK_N: 64}}`; a range is
    ">=3.9", "<=3.8", "==3.8" or "3.8" (major.minor). Every range the release falls in applies, in file order, over
    the target's `config` (its search axes still vary on top). A range may also hold `expect:`, gate expectations
    merged over the target's (e.g. `{expect: {prologue_spills: 2}}` where that compiler hoists values out of the
    partitions); load_spec returns it under the key "expect". A range may also hold `variants:`, named configs that
    ship only with those releases (e.g. 2-CTA MMAs, which Gluon spells from 3.8 on), each over the release's config
    (the spec's, then the range's overrides); returned under the key "variants". It is a separate file so that a spec and what the
    GPU-tested Triton builds from it (manifest sha256, bundles) do not move when a newer compiler needs another config.
    """
    from ..runtime.triton_range import installed, release

    path = by_triton_path(spec_path)
    if not path.exists():
        return {}
    p = str(path)
    raw = _optional_mapping(_companion_yaml(p, path.read_text()), p, "<top>", 'map target -> {">=3.9": {KEY: value}}')
    found = release(triton_version or installed())
    out = {}
    for target, ranges in raw.items():
        if target not in TARGETS:
            raise SpecError(p, str(target), "unknown target", f"use one of {sorted(TARGETS)}")
        ranges = _optional_mapping(ranges, p, str(target), 'map a release range to config keys, e.g. ">=3.9": {BLOCK_N: 64}')
        applied = {}
        for rng, overrides in ranges.items():
            m = _RANGE.match(str(rng).strip())
            if not m:
                raise SpecError(p, f"{target}.{rng}", "not a release range", 'write ">=3.9", "<=3.8", "==3.8" or "3.8"')
            op, bound = m.group(1) or "==", (int(m.group(2)), int(m.group(3)))
            overrides = dict(_require_mapping(overrides, p, f"{target}.{rng}", "give the config keys to override, e.g. {BLOCK_N: 64}"))
            expect = _check_expect(overrides.pop("expect", None), p, f"{target}.{rng}.expect")
            variants = _optional_mapping(overrides.pop("variants", None), p, f"{target}.{rng}.variants",
                                         "map a variant name -> the config keys it changes")
            if {">=": found >= bound, "<=": found <= bound, "==": found == bound}[op]:
                applied.update(overrides)
                if expect:
                    applied["expect"] = {**applied.get("expect", {}), **expect}
                if variants:
                    applied["variants"] = {**applied.get("variants", {}), **variants}
        if applied:
            out[target] = applied
    return out


def load_spec(path: str | Path, triton_version: str | None = None) -> KernelSpec:
    """Read and check a spec. `triton_version` (default: the installed one) picks the by_triton overrides."""
    path = Path(path)
    p = str(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise SpecError(p, "<file>", f"cannot read the spec ({e.strerror})", "pass the path of a YAML spec, e.g. specs/gemm.yaml") from None
    except UnicodeDecodeError:
        raise SpecError(p, "<file>", "not UTF-8 text", "pass the path of a YAML spec, e.g. specs/gemm.yaml") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError(p, "<yaml>", f"not valid YAML{where}: {getattr(e, 'problem', e)}",
                        "fix the YAML syntax (indentation, colons, brackets)") from None
    raw = _require_mapping(raw, p, "<top>", "the spec must be a YAML mapping with family, op, targets, ...")

    for key in raw:
        if key not in TOP_LEVEL_FIELDS:
            raise SpecError(p, str(key), "unknown field", f"use only {sorted(TOP_LEVEL_FIELDS)}")
    for key in ("family", "op", "targets"):
        if key not in raw:
            raise SpecError(p, key, "missing", f"add `{key}:` ({TOP_LEVEL_FIELDS[key]})")

    family = get_family(raw["family"], p)
    op = raw["op"]
    if not isinstance(op, str) or not op.isidentifier() or keyword.iskeyword(op):
        raise SpecError(p, "op", f"{op!r} is not a Python identifier", "name the op like a function, e.g. gemm")

    description = raw.get("description", "")
    if not isinstance(description, str):
        raise SpecError(p, "description", f"expected a string, got {type(description).__name__}",
                        "write one line of text (quote it if it contains ': ')")

    options = family.check_options(_optional_mapping(raw.get("options"), p, "options", "a mapping of options"), p)
    global_expect = _check_expect(raw.get("expect"), p, "expect")

    targets_raw = _require_mapping(raw["targets"], p, "targets", "map target name -> {config, search, expect}")
    by_triton = by_triton_overrides(path, triton_version)
    tuned, tuned_text = tuned_variants(path)
    for name, where in [(n, by_triton_path(path)) for n in by_triton] + [(n, tuned_path(path)) for n in tuned]:
        if name not in targets_raw:
            raise SpecError(str(where), name, "names a target the spec does not list",
                            f"remove it or use one of {sorted(targets_raw)}")
    if not targets_raw:
        raise SpecError(p, "targets", "no target listed", f"list at least one of {sorted(TARGETS)}")
    targets = {}
    for name, tspec in targets_raw.items():
        field_name = f"targets.{name}"
        if name not in TARGETS:
            raise SpecError(p, field_name, "unknown target", f"use one of {sorted(TARGETS)}")
        tspec = _require_mapping(tspec, p, field_name, "give {config: {...}, search: {...}, expect: {...}}")
        for key in tspec:
            if key not in TARGET_FIELDS:
                raise SpecError(p, f"{field_name}.{key}", "unknown field", f"use only {sorted(TARGET_FIELDS)}")
        spec_config = _require_mapping(tspec.get("config"), p, f"{field_name}.config", "give the tile config")
        override = dict(by_triton.get(name, {}))
        override_expect = override.pop("expect", {})   # this release's gate expectations, over the spec's
        release_variants = override.pop("variants", {})   # named configs this release alone ships
        config = {**spec_config, **override}
        search = _optional_mapping(tspec.get("search"), p, f"{field_name}.search", "map config key -> list of values")
        for key, values in search.items():
            if key not in config:
                raise SpecError(p, f"{field_name}.search.{key}", "searches a key the config does not set",
                                f"add {key} to {field_name}.config or remove it from search")
            if not isinstance(values, list) or not values:
                raise SpecError(p, f"{field_name}.search.{key}", "expected a non-empty list of values", f"e.g. {key}: [{config[key]}]")
        expect = {**global_expect, **_check_expect(tspec.get("expect"), p, f"{field_name}.expect"), **override_expect}
        variants = _check_variants(tspec.get("variants"), spec_config, override, p, field_name)
        if name in tuned:   # the tuned configs: checked as the spec's own variants are, named in their file
            tp = str(tuned_path(path))
            _add_variants(variants, _check_variants(tuned[name], spec_config, override, tp, name), family, name, tp,
                          name, ".config", "remove it from the tuned file")
        if release_variants:   # over the release's config (its overrides included), checked as the spec's are
            bp = str(by_triton_path(path))
            _add_variants(variants, _check_variants(release_variants, config, {}, bp, name), family, name, bp,
                          f"{name}.variants", "", "rename it or change its keys")
        ts = TargetSpec(name, dict(config), dict(search), expect, override, variants)
        for i, cand in enumerate(ts.candidates()):
            family.check_config(name, cand, p, f"{field_name}.config" if i == 0 else f"{field_name}.search")
        for vname, cfg in variants.items():
            family.check_config(name, cfg, p, f"{field_name}.variants.{vname}")
        targets[name] = ts

    cases = raw.get("compile_cases")
    if cases is None or cases == []:
        cases = [family.default_case(options)]
    if not isinstance(cases, list):
        raise SpecError(p, "compile_cases", "expected a list of cases", "write a YAML list of mappings")
    cases = [family.check_case(c, options, p, f"compile_cases[{i}]") for i, c in enumerate(cases)]
    verify = family.check_verify(_optional_mapping(raw.get("verify"), p, "verify", "give {shapes: [...]}"), options, p)
    bench = family.check_bench(_optional_mapping(raw.get("bench"), p, "bench", "give {shapes: [...]}"), options, p)

    # The spec's identity is its text, plus the overrides this Triton took and the tuned variants (none: the plain
    # text digest)
    identity = (text + (f"\n# by_triton: {json.dumps(by_triton, sort_keys=True)}\n" if by_triton else "")
                + (f"\n# tuned:\n{tuned_text}" if tuned_text else ""))
    return KernelSpec(
        path=p, sha256=hashlib.sha256(identity.encode()).hexdigest(), family=raw["family"], op=op,
        description=description, options=options, targets=targets,
        compile_cases=cases, verify=verify, bench=bench, raw=raw,
    )
