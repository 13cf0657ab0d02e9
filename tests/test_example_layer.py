"""examples/decoder_layer.py: a Llama / Qwen2 decoder layer from the generated ops, loaded from a Hugging Face state
dict, against the float64 math of the same layer computed from the unfused weights (the module's own forward)."""
import os
import subprocess
import sys

import pytest

from .conftest import ROOT, child_env

_SCRIPT = r'''
import math, sys
import torch
import torch.nn.functional as F
from examples.decoder_layer import DecoderLayer, LayerConfig

qwen = sys.argv[1] == "qwen2"
cfg = LayerConfig(hidden=256, heads=4, kv_heads=2, head_dim=64, intermediate=384, rms_eps=1e-6, rope_theta=10000.0)
gen = torch.Generator().manual_seed(0)
def w(n, k):
    return (torch.randn(n, k, generator=gen) / math.sqrt(k)).bfloat16()
hq, hkv, d = cfg.heads, cfg.kv_heads, cfg.head_dim
state = {"self_attn.q_proj.weight": w(hq * d, cfg.hidden), "self_attn.k_proj.weight": w(hkv * d, cfg.hidden),
         "self_attn.v_proj.weight": w(hkv * d, cfg.hidden), "self_attn.o_proj.weight": w(cfg.hidden, hq * d),
         "mlp.gate_proj.weight": w(cfg.intermediate, cfg.hidden), "mlp.up_proj.weight": w(cfg.intermediate, cfg.hidden),
         "mlp.down_proj.weight": w(cfg.hidden, cfg.intermediate),
         "input_layernorm.weight": (1 + 0.1 * torch.randn(cfg.hidden, generator=gen)).bfloat16(),
         "post_attention_layernorm.weight": (1 + 0.1 * torch.randn(cfg.hidden, generator=gen)).bfloat16()}
if qwen:   # Qwen2's q/k/v biases
    for p, n in (("q", hq * d), ("k", hkv * d), ("v", hkv * d)):
        state[f"self_attn.{p}_proj.bias"] = (0.1 * torch.randn(n, generator=gen)).bfloat16()
state = {"model.layers.3." + k: v for k, v in state.items()}


def reference(x, positions):
    """The layer in float64 from the unfused weights, as the Hugging Face module computes it (all tokens at once)."""
    s = {k.split("model.layers.3.")[1]: v.double() for k, v in state.items()}
    def norm(t, g):
        return t * torch.rsqrt(t.square().mean(-1, keepdim=True) + cfg.rms_eps) * g
    def proj(t, p):
        return F.linear(t, s[f"self_attn.{p}_proj.weight"], s.get(f"self_attn.{p}_proj.bias"))
    x = x.double()
    b, L, _ = x.shape
    h = norm(x, s["input_layernorm.weight"])
    q, k, v = (proj(h, p).view(b, L, -1, d).transpose(1, 2) for p in "qkv")
    inv = 1.0 / cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = positions.double()[:, None] * inv[None]
    cos, sin = torch.cat((ang, ang), -1).cos(), torch.cat((ang, ang), -1).sin()
    rot = lambda t: t * cos + torch.cat((-t[..., d // 2:], t[..., :d // 2]), -1) * sin
    q, k = rot(q), rot(k)
    k, v = k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)
    scores = scores.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    o = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, L, hq * d)
    h = x + F.linear(o, s["self_attn.o_proj.weight"])
    m = norm(h, s["post_attention_layernorm.weight"])
    m = F.silu(F.linear(m, s["mlp.gate_proj.weight"])) * F.linear(m, s["mlp.up_proj.weight"])
    return h + F.linear(m, s["mlp.down_proj.weight"])


def err(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


layer = DecoderLayer.from_state_dict(state, cfg, prefix="model.layers.3.")
assert (layer.bqkv is not None) == qwen and layer.wgate_up.shape == (2 * cfg.intermediate, cfg.hidden)
x = torch.randn(2, 7, cfg.hidden, generator=gen).bfloat16()
positions = torch.arange(7)
want = reference(x, positions)
assert err(layer(x, positions), want) < 2e-2                      # prefill without a cache
cache = layer.new_cache(batch=2, max_len=16)
first = layer(x[:, :6], positions[:6], cache)                      # prefill 6 tokens into the cache
step = layer(x[:, 6:], positions[6:], cache)                       # then a decode step over all 7
assert cache.length == 7 and first.shape == (2, 6, cfg.hidden) and step.shape == (2, 1, cfg.hidden)
assert err(first, want[:, :6]) < 2e-2 and err(step, want[:, 6:]) < 2e-2, (err(first, want[:, :6]), err(step, want[:, 6:]))
try:
    DecoderLayer.from_state_dict(state, cfg)                       # the prefix forgotten
except ValueError as e:
    assert "q projection" in str(e), e
else:
    raise AssertionError("a state dict without the layer's keys was accepted")
print("OK")
'''


@pytest.mark.parametrize("model", ["llama", "qwen2"])
def test_decoder_layer_from_a_state_dict_matches_the_modules_math(model):
    """The example layer, loaded from a Llama-shaped (or Qwen2, with q/k/v biases) state dict under a model prefix,
    through the generated ops (the portable kernels and the torch providers in Triton's interpreter): prefill, then a
    cache filled by a prefill and a decode step, each against the float64 layer from the unfused weights."""
    env = child_env(TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, model], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=900)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
