"""Public model configurations the workload suite draws its shapes from, as plain data.

Every number is the Hugging Face `config.json` value of the named checkpoint (field names in the comments); head_dim
is hidden_size / num_attention_heads unless the config sets `head_dim`. Only what the GEMM and attention shapes
need is kept: the linear layers' [N, K] (nn.Linear's weight layout) and the attention heads.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

# The head dims our attention build has (specs/attention.yaml options.head_dims -> generated.attention.HEAD_DIMS).
ATTENTION_HEAD_DIMS = (64, 128)


@dataclass(frozen=True)
class Model:
    name: str                  # short name used in case ids
    hf_id: str                 # the checkpoint whose config.json these values are from
    hidden: int                # hidden_size
    heads: int                 # num_attention_heads
    kv_heads: int              # num_key_value_heads (== heads for MHA)
    head_dim: int
    intermediate: int          # intermediate_size (MLP width)
    vocab: int                 # vocab_size
    mlp: str                   # "swiglu": silu(gate) * up; "geglu": gelu_tanh(gate) * up; "gelu", "relu": fc1, act, fc2
    bias: bool = False         # nn.Linear biases on every linear (encoders, OPT)
    qkv_bias: bool = False     # biases on q/k/v only (Qwen2)
    rope_theta: Optional[float] = None
    norm_eps: float = 1e-5     # rms_norm_eps / layer_norm_eps
    seq: Optional[int] = None  # fixed sequence length (ViT: patches + [CLS]); None = variable
    notes: tuple = field(default_factory=tuple)

    @property
    def qkv_n(self) -> int:
        """N of the fused QKV projection: (heads + 2 * kv_heads) * head_dim."""
        return (self.heads + 2 * self.kv_heads) * self.head_dim

    @property
    def gqa_ratio(self) -> int:
        return self.heads // self.kv_heads

    def linears(self) -> dict:
        """layer name -> (N, K) of its weight as nn.Linear stores it ([out_features, in_features])."""
        h, q = self.hidden, self.heads * self.head_dim
        shapes = {"qkv": (self.qkv_n, h), "o": (h, q)}
        if self.mlp in ("swiglu", "geglu"):
            shapes.update(gate=(self.intermediate, h), up=(self.intermediate, h),
                          gate_up=(2 * self.intermediate, h),  # the fused gate+up projection (vLLM, TensorRT-LLM)
                          down=(h, self.intermediate))
        else:
            shapes.update(fc1=(self.intermediate, h), fc2=(h, self.intermediate))
        if self.vocab:
            shapes["lm_head"] = (self.vocab, h)
        return shapes

    def attention_skip_reason(self) -> str:
        """Why this model's attention is not in the suite ("" if it is)."""
        if self.head_dim not in ATTENTION_HEAD_DIMS:
            return (f"head_dim {self.head_dim} is not built (generated.attention has D in {ATTENTION_HEAD_DIMS}); "
                    "its GEMMs are kept")
        return ""


MODELS = {m.name: m for m in (
    # meta-llama/Meta-Llama-3-8B: hidden_size 4096, num_attention_heads 32, num_key_value_heads 8,
    # intermediate_size 14336, vocab_size 128256, rope_theta 500000, rms_norm_eps 1e-5.
    Model("llama3-8b", "meta-llama/Meta-Llama-3-8B", 4096, 32, 8, 128, 14336, 128256, "swiglu",
          rope_theta=500000.0),
    # meta-llama/Meta-Llama-3-70B: hidden_size 8192, num_attention_heads 64, num_key_value_heads 8,
    # intermediate_size 28672, vocab_size 128256, rope_theta 500000.
    Model("llama3-70b", "meta-llama/Meta-Llama-3-70B", 8192, 64, 8, 128, 28672, 128256, "swiglu",
          rope_theta=500000.0),
    # meta-llama/Llama-3.2-1B: hidden_size 2048, num_attention_heads 32, num_key_value_heads 8, head_dim 64,
    # intermediate_size 8192, vocab_size 128256. The suite's GQA model at D=64.
    Model("llama3.2-1b", "meta-llama/Llama-3.2-1B", 2048, 32, 8, 64, 8192, 128256, "swiglu", rope_theta=500000.0),
    # mistralai/Mistral-7B-v0.1: hidden_size 4096, num_attention_heads 32, num_key_value_heads 8,
    # intermediate_size 14336, vocab_size 32000, sliding_window 4096, rope_theta 10000.
    # Its layers other than lm_head have Llama-3-8B's shapes, so only lm_head is a distinct GEMM.
    Model("mistral-7b", "mistralai/Mistral-7B-v0.1", 4096, 32, 8, 128, 14336, 32000, "swiglu", rope_theta=10000.0,
          notes=("sliding_window 4096; the suite's window mod is the build's left=1024",)),
    # google/gemma-2-9b: hidden_size 3584, num_attention_heads 16, num_key_value_heads 8, head_dim 256,
    # intermediate_size 14336, vocab_size 256000, hidden_activation gelu_pytorch_tanh (GeGLU),
    # attn_logit_softcapping 50.0, sliding_window 4096, rms_norm_eps 1e-6.
    Model("gemma2-9b", "google/gemma-2-9b", 3584, 16, 8, 256, 14336, 256000, "geglu", rope_theta=10000.0,
          norm_eps=1e-6, notes=("attn_logit_softcapping 50 (the softcap mod's cap)", "sliding_window 4096")),
    # Qwen/Qwen2.5-7B: hidden_size 3584, num_attention_heads 28, num_key_value_heads 4, intermediate_size 18944,
    # vocab_size 152064, q/k/v biases (Qwen2 attention), rope_theta 1000000, rms_norm_eps 1e-6.
    Model("qwen2.5-7b", "Qwen/Qwen2.5-7B", 3584, 28, 4, 128, 18944, 152064, "swiglu", qkv_bias=True,
          rope_theta=1000000.0, norm_eps=1e-6),
    # Qwen/Qwen2.5-14B: hidden_size 5120, num_attention_heads 40, num_key_value_heads 8, intermediate_size 13824,
    # vocab_size 152064. The suite's GQA ratio-5 model.
    Model("qwen2.5-14b", "Qwen/Qwen2.5-14B", 5120, 40, 8, 128, 13824, 152064, "swiglu", qkv_bias=True,
          rope_theta=1000000.0, norm_eps=1e-6),
    # Qwen/Qwen2.5-72B: hidden_size 8192, num_attention_heads 64, num_key_value_heads 8, intermediate_size 29568,
    # vocab_size 152064.
    Model("qwen2.5-72b", "Qwen/Qwen2.5-72B", 8192, 64, 8, 128, 29568, 152064, "swiglu", qkv_bias=True,
          rope_theta=1000000.0, norm_eps=1e-6),
    # facebook/opt-6.7b: hidden_size 4096, num_attention_heads 32, ffn_dim 16384, vocab_size 50272,
    # activation_function relu, biases on every linear. The suite's ReLU model (bias+relu epilogue), MHA at D=128.
    Model("opt-6.7b", "facebook/opt-6.7b", 4096, 32, 32, 128, 16384, 50272, "relu", bias=True),
    # google/vit-base-patch16-224: hidden_size 768, num_attention_heads 12, intermediate_size 3072, 197 tokens
    # (14x14 patches + [CLS]), hidden_act gelu (erf; the suite uses the shipped gelu_tanh epilogue, same GEMM).
    # No vocabulary (vocab 0: no lm_head).
    Model("vit-b16", "google/vit-base-patch16-224", 768, 12, 12, 64, 3072, 0, "gelu", bias=True, norm_eps=1e-12,
          seq=197),
    # google-bert/bert-base-uncased: hidden_size 768, num_attention_heads 12, intermediate_size 3072,
    # max_position_embeddings 512, vocab_size 30522, hidden_act gelu (erf; gelu_tanh used as for ViT).
    Model("bert-base", "google-bert/bert-base-uncased", 768, 12, 12, 64, 3072, 30522, "gelu", bias=True,
          norm_eps=1e-12, seq=512),
)}
