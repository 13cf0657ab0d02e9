"""Source locations of simulated kernel code: which line of the kernel module issued an operation."""
from __future__ import annotations

import ast
import linecache
import sys

# filename -> {lineno: assigned variable name} for every kernel module loaded by the simulator
_KERNEL_FILES: dict[str, dict[int, str]] = {}


def register_source(filename: str, source: str) -> None:
    lines = source.splitlines(True)
    linecache.cache[filename] = (len(source), None, lines, filename)
    names: dict[int, str] = {}
    try:
        tree = ast.parse(source)
    except SyntaxError:
        tree = None
    if tree is not None:
        for node in ast.walk(tree):
            target = None
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                target = node.target
            if isinstance(target, ast.Name):
                for ln in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                    names.setdefault(ln, target.id)
    _KERNEL_FILES[filename] = names


def is_kernel_file(filename: str) -> bool:
    return filename in _KERNEL_FILES


class Loc:
    """A captured kernel call stack: innermost frame first, only frames of simulated kernel modules."""
    __slots__ = ("frames",)

    def __init__(self, frames):
        self.frames = frames  # list of (filename, lineno, funcname)

    @property
    def filename(self):
        return self.frames[0][0] if self.frames else "<unknown>"

    @property
    def lineno(self):
        return self.frames[0][1] if self.frames else 0

    @property
    def func(self):
        return self.frames[0][2] if self.frames else "?"

    @property
    def text(self):
        if not self.frames:
            return ""
        return linecache.getline(self.frames[0][0], self.frames[0][1]).strip()

    @property
    def short(self) -> str:
        """'file:line' of the innermost kernel frame."""
        return f"{self.filename}:{self.lineno}"

    def assigned_name(self):
        if not self.frames:
            return None
        fn, ln, _ = self.frames[0]
        return _KERNEL_FILES.get(fn, {}).get(ln)

    def format(self, indent: str = "", callers: int = 3) -> str:
        if not self.frames:
            return f"{indent}<no kernel source line>"
        out = [f"{indent}{self.short} (in {self.func}): {self.text}"]
        for fn, ln, func in self.frames[1:1 + callers]:
            out.append(f"{indent}  called from {fn}:{ln} (in {func}): {linecache.getline(fn, ln).strip()}")
        return "\n".join(out)

    def __str__(self):
        return f"{self.short}: {self.text}"


def capture(skip: int = 1) -> Loc:
    f = sys._getframe(skip)
    frames = []
    while f is not None:
        co = f.f_code
        if co.co_filename in _KERNEL_FILES:
            frames.append((co.co_filename, f.f_lineno, co.co_name))
        f = f.f_back
    return Loc(frames)
