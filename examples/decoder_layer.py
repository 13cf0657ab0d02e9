"""A Llama-style decoder layer (Llama-3, Mistral, Qwen2) built from the generated ops, its weights loaded from a
Hugging Face `LlamaDecoderLayer` / `Qwen2DecoderLayer` state dict.

    from examples.decoder_layer import DecoderLayer, LayerConfig

    cfg = LayerConfig(hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336, rms_eps=1e-5,
                      rope_theta=500000.0)                       # Llama-3-8B
    layer = DecoderLayer.from_state_dict(hf_model.model.layers[0].state_dict(), cfg)
    cache = layer.new_cache(batch=8, max_len=8192, device="cuda")
    y = layer(x, positions, cache)     # x [B, L, hidden]: prefill (L new tokens) or a decode step (L = 1)

What the generated ops fuse, against the module's own forward:
- q, k and v projections: one `linear` on one [(Hq + 2 Hkv) * D, hidden] weight (Qwen2's biases with it);
- the MLP's gate and up projections and SiLU: one `linear(..., activation="swiglu")` on one [2I, hidden] weight
  (gate rows first), the [tokens, 2I] product never written;
- both residual adds: in the O and down projections' epilogues (`linear(..., residual=x)`);
- both RMSNorms: folded into the projection after each (`linear(x, w * gain, rms_eps=eps)`: the gain in the QKV and
  gate_up weights, folded at load; each row's 1 / rms in the GEMM's epilogue), the normalized x never written;
- RoPE: in the QKV projection's epilogue (`linear(..., rope=(cos, sin), rope_columns=(Hq + Hkv) * D)`), q and k come
  out rotated (the unrotated ones never written), and the new tokens' K goes into the cache rotated;
- attention: `generated.attention.attention(q, k, v, mod="causal")`, GQA without repeating K/V, bottom-right
  aligned so the new tokens of a step attend to the whole cache before them.
The weights are fused once, at load. Each op's dispatch still sends a shape to torch where the workload suite
measured torch faster (or never timed it), so the layer is never slower than its ops' torch providers.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from generated.attention import attention
from generated.gemm import fold_rms_gain, linear


@dataclass(frozen=True)
class LayerConfig:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    rms_eps: float = 1e-5
    rope_theta: float = 10000.0


@dataclass
class KVCache:
    """Keys and values of the tokens seen so far: [B, Hkv, max_len, D] each, the first `length` positions valid."""
    k: torch.Tensor
    v: torch.Tensor
    length: int = 0


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos, sin [L, D] of the rotate-half convention (Llama's) at `positions` [L], as a rotary embedding gives them."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    freqs = positions.float()[:, None] * inv_freq[None]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


class DecoderLayer(torch.nn.Module):
    """One pre-norm decoder layer: h = x + O(attn(rope(QKV(norm1(x))))); out = h + down(silu(gate) * up of norm2(h)).
    Weights as frozen parameters in the fused layouts the generated ops read (from_state_dict builds them)."""

    def __init__(self, cfg: LayerConfig, weights: dict[str, torch.Tensor | None]):
        super().__init__()
        self.cfg = cfg
        for name, w in weights.items():
            setattr(self, name, None if w is None else torch.nn.Parameter(w, requires_grad=False))

    @classmethod
    def from_state_dict(cls, state: dict[str, torch.Tensor], cfg: LayerConfig, prefix: str = "") -> DecoderLayer:
        """From a Hugging Face Llama / Mistral / Qwen2 decoder layer's state dict (keys `self_attn.q_proj.weight`, ...,
        `mlp.gate_proj.weight`, `input_layernorm.weight`; `prefix` is what precedes them, e.g. "model.layers.0.")."""
        def get(name: str) -> torch.Tensor | None:
            return state.get(prefix + name)

        q, k, v = (get(f"self_attn.{p}_proj.weight") for p in "qkv")
        expect = {"q": (cfg.heads * cfg.head_dim, cfg.hidden), "k": (cfg.kv_heads * cfg.head_dim, cfg.hidden),
                  "gate": (cfg.intermediate, cfg.hidden)}
        for name, t in (("q", q), ("k", k), ("gate", get("mlp.gate_proj.weight"))):
            if t is None or tuple(t.shape) != expect[name]:
                raise ValueError(f"{prefix}{name} projection: expected a weight of shape {expect[name]} for {cfg}, "
                                 f"got {None if t is None else tuple(t.shape)}")
        biases = [get(f"self_attn.{p}_proj.bias") for p in "qkv"]   # Qwen2 has them, Llama and Mistral do not
        norm1, norm2 = get("input_layernorm.weight"), get("post_attention_layernorm.weight")
        return cls(cfg, {
            # each RMSNorm's gain folded into the projection after it (linear(..., rms_eps=) applies the rest)
            "wqkv": fold_rms_gain(torch.cat([q, k, v]), norm1).contiguous(),
            "bqkv": torch.cat(biases).contiguous() if all(b is not None for b in biases) else None,
            "wo": get("self_attn.o_proj.weight").contiguous(),
            # gate rows, then up rows: what linear(..., activation="swiglu") reads as silu(x @ gate^T) * (x @ up^T)
            "wgate_up": fold_rms_gain(torch.cat([get("mlp.gate_proj.weight"), get("mlp.up_proj.weight")]),
                                      norm2).contiguous(),
            "wdown": get("mlp.down_proj.weight").contiguous(),
        })

    def new_cache(self, batch: int, max_len: int, device=None, dtype=None) -> KVCache:
        shape = (batch, self.cfg.kv_heads, max_len, self.cfg.head_dim)
        dtype = dtype or self.wo.dtype
        return KVCache(torch.empty(shape, device=device, dtype=dtype), torch.empty(shape, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """x [B, L, hidden] of the tokens at `positions` [L] (the same for every sequence of the batch). With a cache,
        their keys and values are appended to it and they attend to everything it holds (prefill into an empty
        cache, or a decode step); without one, to each other only (causal)."""
        cfg = self.cfg
        bsz, length, hidden = x.shape
        hq, hkv, d = cfg.heads, cfg.kv_heads, cfg.head_dim
        x2 = x.reshape(bsz * length, hidden)
        # norm1 folded; q and k rotated in the epilogue (token l of every sequence takes the tables' row l)
        qkv = linear(x, self.wqkv, self.bqkv, rms_eps=cfg.rms_eps,
                     rope=rope_tables(positions, d, cfg.rope_theta, x.dtype), rope_columns=(hq + hkv) * d)
        q, k, v = qkv.view(bsz, length, hq + 2 * hkv, d).split([hq, hkv, hkv], dim=2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if cache is not None:
            end = cache.length + length
            if end > cache.k.shape[2]:
                raise ValueError(f"the cache holds {cache.k.shape[2]} positions; {cache.length} + {length} do not fit")
            cache.k[:, :, cache.length:end] = k
            cache.v[:, :, cache.length:end] = v
            cache.length = end
            k, v = cache.k[:, :, :end], cache.v[:, :, :end]
        o = attention(q, k, v, mod="causal").transpose(1, 2).reshape(bsz * length, hq * d)
        h = linear(o, self.wo, residual=x2)                                     # x + o_proj(attn)
        m = linear(h, self.wgate_up, activation="swiglu", rms_eps=cfg.rms_eps)   # norm2 folded
        return linear(m, self.wdown, residual=h).view(bsz, length, hidden)     # h + down_proj(mlp)
