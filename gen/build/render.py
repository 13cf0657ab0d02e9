"""Config -> source text. jinja2 with StrictUndefined: a template that reads a missing key fails loudly."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import jinja2
import jinja2.meta

from ..families import get_family
from .spec import KernelSpec

TEMPLATE_DIR = Path(__file__).resolve().parents[2] / "templates"


@dataclass(frozen=True)
class Source:
    family: str
    target: str
    config: dict
    template: str            # path relative to templates/
    template_digest: str     # sha256 of the template and the shared macros it imports (template_sources)
    text: str

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    @property
    def config_digest(self) -> str:
        return hashlib.sha256(json.dumps(self.config, sort_keys=True).encode()).hexdigest()[:16]


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["py"] = repr  # a Python literal (tojson would write null/true/false into Python source)
    return env


def template_sources(template: str) -> list[str]:
    """`template` and every template it imports or includes, transitively (jinja2's own parse, so a macro file
    named only in a comment does not count), in a stable order."""
    env, found, todo = _environment(), set(), [template]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        refs = list(jinja2.meta.find_referenced_templates(env.parse((TEMPLATE_DIR / name).read_text())))
        if None in refs:   # a computed name: the digest could not follow it, and a stale bundle would ship
            raise ValueError(f"{name} imports a template by a computed name; name it literally")
        todo.extend(refs)
    return sorted(found)


def template_digest(template: str) -> str:
    """What a rendered variant depends on besides its config: its template and the macro files it imports. A
    macro file another template imports (score_math for attention) leaves this one's digest, and so its bundles'
    keys, unchanged."""
    h = hashlib.sha256()
    for name in template_sources(template):
        h.update(name.encode())
        h.update((TEMPLATE_DIR / name).read_bytes())
    return h.hexdigest()


def template_path(spec: KernelSpec, target: str) -> str:
    return f"{target}/{spec.op}.py.jinja"


def render_variant(spec: KernelSpec, target: str, config: dict, header: str = "") -> Source:
    """Render one variant module. `header` (comment lines) is prepended: provenance and the measured alternative."""
    template = template_path(spec, target)
    if not (TEMPLATE_DIR / template).is_file():
        raise FileNotFoundError(f"no template {template} under {TEMPLATE_DIR} for target {target}")
    context = {"cfg": dict(config), "spec": get_family(spec.family).template_context(spec.options), "target": target}
    body = _environment().get_template(template).render(**context)
    return Source(spec.family, target, dict(config), template, template_digest(template), header + body)


def render_api(spec: KernelSpec, context: dict) -> str:
    """The family's public module (generated/<family>/__init__.py); `family` is what the kernel templates get as
    `spec` (e.g. attention's mods with their IR)."""
    family = get_family(spec.family).template_context(spec.options)
    return _environment().get_template(f"api/{spec.op}.py.jinja").render(family=family, **context)


def comment_block(lines) -> str:
    return "".join(f"# {line}\n".replace("# \n", "#\n") for line in lines)
