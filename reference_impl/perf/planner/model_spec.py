"""A decoder-only transformer described by its shape: parameters, the GEMMs one TP rank runs,
and the FLOPs of a training step as the published runs count them.

With ``experts`` > 0 (Shazeer et al. 2017; Mixtral, Jiang et al. 2024) the total parameters N
(memory) and the active ones N_act (compute: 6 N_act + attention per token) differ. The counts:
docs/library.md, 'The planner's model, term by term'.
"""
from __future__ import annotations

from dataclasses import dataclass


def positive(name: str, value) -> None:
    """Refuse anything but a positive number, naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")


@dataclass(frozen=True)
class ModelSpec:
    """Enough of a transformer to count its parameters, FLOPs and activations."""
    name: str
    layers: int
    hidden: int
    heads: int
    vocab: int
    seq_len: int
    kv_heads: int | None = None       # grouped-query attention; None: = heads (MHA)
    ffn_hidden: int | None = None     # None: 4 * hidden
    gated_mlp: bool = False           # SwiGLU: 3 matrices in the MLP instead of 2
    tied_embeddings: bool = False     # output layer shares the embedding matrix
    dropout: bool = False             # GPT-3-style dropout (1-byte masks); Llama has none
    experts: int = 0                  # mixture of experts: MLPs per layer (0: one dense MLP)
    top_k: int = 1                    # experts each token goes through (with experts > 0)

    def __post_init__(self):
        for name in ("layers", "hidden", "heads", "vocab", "seq_len"):
            positive(name, getattr(self, name))
        if self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} is not divisible by heads {self.heads}")
        if self.kv_heads is not None:
            positive("kv_heads", self.kv_heads)
        if self.ffn_hidden is not None:
            positive("ffn_hidden", self.ffn_hidden)
        if self.experts:
            positive("experts", self.experts)
            if not 1 <= self.top_k <= self.experts:
                raise ValueError(f"top_k must be between 1 and the {self.experts} experts, got "
                                 f"{self.top_k!r}")

    @property
    def ffn(self) -> int:
        """The MLP's width (each expert's, with experts)."""
        return self.ffn_hidden or 4 * self.hidden

    @property
    def active_ffn(self) -> int:
        """The MLP width a token goes through: top_k experts' with experts, else ``ffn``."""
        return self.top_k * self.ffn if self.experts else self.ffn

    @property
    def kv_dim(self) -> int:
        return (self.kv_heads or self.heads) * (self.hidden // self.heads)

    def mlp_gemms(self, width: int, tp: int = 1) -> list[tuple[int, int]]:
        """(K, N) of an MLP of ``width``: first matrix column-parallel, second row-parallel."""
        up = (2 if self.gated_mlp else 1) * width
        return [(self.hidden, up // tp), (width // tp, self.hidden)]

    def layer_gemms(self, tp: int = 1) -> list[tuple[int, int]]:
        """(K, N) of each weight matrix one TP rank multiplies by: fused QKV and the MLP's
        first matrix are column-parallel (N / tp), the output projections row-parallel (K / tp).
        With experts, the MLP a token goes through: ``active_ffn`` wide."""
        h = self.hidden
        attention = [(h, (h + 2 * self.kv_dim) // tp), (h // tp, h)]
        return attention + self.mlp_gemms(self.active_ffn, tp)

    @property
    def router_params(self) -> int:
        return self.hidden * self.experts

    @property
    def expert_params_per_layer(self) -> int:
        """The experts' weight matrices in one layer (0 for a dense model)."""
        return self.experts * sum(k * n for k, n in self.mlp_gemms(self.ffn))

    @property
    def params_per_layer(self) -> int:
        """The weight matrices of one layer, every expert's (biases and norms ignored)."""
        if not self.experts:
            return sum(k * n for k, n in self.layer_gemms())
        attention = sum(k * n for k, n in self.layer_gemms()[:2])
        return attention + self.expert_params_per_layer + self.router_params

    @property
    def active_params_per_layer(self) -> int:
        """The weight matrices one token's compute uses in a layer: top_k experts'."""
        return sum(k * n for k, n in self.layer_gemms()) + self.router_params

    @property
    def embedding_params(self) -> int:
        return (1 if self.tied_embeddings else 2) * self.vocab * self.hidden

    @property
    def num_params(self) -> int:
        """Every parameter (with experts, the total N)."""
        return self.layers * self.params_per_layer + self.embedding_params

    @property
    def active_params(self) -> int:
        """The parameters one token's compute uses (= ``num_params`` for a dense model)."""
        return self.layers * self.active_params_per_layer + self.embedding_params

    def attention_flops_per_token(self, seq_len: int | None = None) -> float:
        """12 L h s: QK^T and AV, forward and backward, the causal mask not discounted (the
        convention of Narayanan et al. 2021 and of most MFU reports)."""
        return 12 * self.layers * self.hidden * (seq_len or self.seq_len)

    def model_flops_per_token(self, seq_len: int | None = None) -> float:
        """6N + 12 L h s: a training step's FLOPs per token without recomputation (Kaplan et
        al. 2020's 6N, plus attention as above); N the active parameters with experts."""
        return 6 * self.active_params + self.attention_flops_per_token(seq_len)


PRESETS = {
    # GPT-3 (Brown et al. 2020, Table 2.1): 96 layers, d_model 12288, 96 heads, context 2048.
    "gpt3-175b": ModelSpec("gpt3-175b", 96, 12288, 96, 51200, 2048, tied_embeddings=True,
                           dropout=True),
    # Llama 2 7B (Touvron et al. 2023): 32 layers, 4096, 32 heads, SwiGLU 11008, vocab 32000.
    "7b": ModelSpec("7b", 32, 4096, 32, 32000, 4096, ffn_hidden=11008, gated_mlp=True),
    # Llama 3 70B (Dubey et al. 2024, Table 3): 80 layers, 8192, 64 heads, 8 KV heads,
    # SwiGLU 28672, vocab 128256.
    "70b": ModelSpec("70b", 80, 8192, 64, 128256, 4096, kv_heads=8, ffn_hidden=28672,
                     gated_mlp=True),
    # Llama 3 405B (Table 3): 126 layers, 16384, 128 heads, 8 KV heads, SwiGLU 53248.
    "405b": ModelSpec("405b", 126, 16384, 128, 128256, 8192, kv_heads=8, ffn_hidden=53248,
                      gated_mlp=True),
    # Mixtral 8x7B (Jiang et al. 2024, "Mixtral of Experts", Table 1): 32 layers, 4096, 32
    # heads, 8 KV heads, 8 SwiGLU experts of 14336, top-2, vocab 32000; context 32768, planned
    # here at 4096 (--seq changes it). 46.7B parameters, 12.9B active (the paper's 47B, 13B).
    "mixtral-8x7b": ModelSpec("mixtral-8x7b", 32, 4096, 32, 32000, 4096, kv_heads=8,
                              ffn_hidden=14336, gated_mlp=True, experts=8, top_k=2),
}


def get_model(preset: str) -> ModelSpec:
    try:
        return PRESETS[preset.lower()]
    except KeyError:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}") from None
