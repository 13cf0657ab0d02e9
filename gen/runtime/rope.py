"""RoPE on a QKV projection's output: what its kind is, the table layout every kernel reads, and the rotation in
torch (the op's torch route and the family's reference share it).

A call's RoPE is the op's tuple (cos [P, D], sin [P, D], columns, interleaved): row m of the output takes table row
m % P, and its first `columns` columns (whole heads of D) are rotated as Hugging Face's apply_rotary_pos_emb does,
x * cos + rotate(x) * sin, with rotate-half pairs (i, i + D/2) or interleaved pairs (2i, 2i + 1).
A family case names it as "rope": none / half / interleaved and "rope_dim": D.
"""
from __future__ import annotations


def rope_kind(rope) -> tuple:
    """(head dim, interleaved) of a call's RoPE tuple; (0, False) without RoPE."""
    return (0, False) if rope is None else (rope[0].shape[1], bool(rope[3]))


def rope_case_kind(case: dict) -> tuple:
    """rope_kind of a family case ("rope": none / half / interleaved, "rope_dim", default 128)."""
    style = case.get("rope", "none")
    return (0, False) if style == "none" else (case.get("rope_dim", 128), style == "interleaved")


def tables_readable(cos, sin) -> bool:
    """Whether the kernels can read cos and sin as they are: unit column stride and one row stride for both (the
    kernels take a single stride)."""
    return cos.stride(1) == 1 and sin.stride(1) == 1 and cos.stride(0) == sin.stride(0)


def readable_tables(cos, sin) -> tuple:
    """cos and sin in the layout tables_readable asks for, copied only where they are not (the op does this once per
    call, so the modules only check)."""
    return (cos, sin) if tables_readable(cos, sin) else (cos.contiguous(), sin.contiguous())


def check_tables(cos, sin, dtype) -> None:
    """A module's guard on tables it is handed directly (the op hands them readable and in the input's dtype)."""
    if not tables_readable(cos, sin):
        raise ValueError("RoPE's cos and sin need a unit column stride and one row stride; pass them contiguous")
    if not cos.dtype == sin.dtype == dtype:   # the kernels are compiled for the input's dtype
        raise ValueError(f"RoPE's cos and sin must be in the input's dtype {dtype}, got {cos.dtype} and {sin.dtype}; "
                         f"pass cos.to({dtype}), sin.to({dtype})")


def rotated_heads(out, rope):
    """out [M, N]'s first `columns` columns rotated head by head, as a new [M, columns] tensor in out's dtype
    (computed in that dtype, as a model's own rotation is)."""
    import torch

    cos, sin, columns, interleaved = rope
    (m, _), (p, d) = out.shape, cos.shape
    heads = out[:, :columns].reshape(m // p, p, columns // d, d)
    if interleaved:   # (2i, 2i + 1) -> (-x[2i + 1], x[2i])
        pairs = heads.unflatten(-1, (-1, 2))
        partner = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    else:             # rotate_half: cat(-x2, x1)
        x1, x2 = heads.chunk(2, dim=-1)
        partner = torch.cat((-x2, x1), dim=-1)
    c, s = (t.to(out.dtype).reshape(1, p, 1, d) for t in (cos, sin))
    return (heads * c + partner * s).reshape(m, columns)
