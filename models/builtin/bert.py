"""A BERT encoder (Devlin et al. 2019) in plain torch, for inference from a local checkpoint.

Module and parameter names follow the Hugging Face checkpoint layout, so its safetensors file
loads as is. It exists because importing transformers costs 5-7 s on a two-core machine,
longer than everything else the service does to start; tests compare it with
sentence-transformers on the same weights.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn


@dataclass(frozen=True)
class BertConfig:
    """The fields of a checkpoint's config.json that the encoder needs."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float

    @classmethod
    def from_file(cls, path: Path) -> BertConfig:
        raw = json.loads(path.read_text())
        if raw.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"unsupported activation {raw['hidden_act']!r}")
        if raw.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError("only absolute position embeddings are supported")
        return cls(**{name: raw[name] for name in cls.__dataclass_fields__})


class Embeddings(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        # one segment: token type 0 everywhere
        x = self.word_embeddings(ids) + self.position_embeddings(positions)
        return self.LayerNorm(x + self.token_type_embeddings.weight[0])  # [m, t, d]


class SelfAttention(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.heads = cfg.num_attention_heads
        self.query = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.key = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.value = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        m, t, d = x.shape

        def split(y: torch.Tensor) -> torch.Tensor:
            return y.view(m, t, self.heads, d // self.heads).transpose(1, 2)  # [m, h, t, d/h]

        out = nn.functional.scaled_dot_product_attention(
            split(self.query(x)), split(self.key(x)), split(self.value(x)), attn_mask=keep
        )
        return out.transpose(1, 2).reshape(m, t, d)


class DenseNorm(nn.Module):
    """LayerNorm(residual + dense(x)): the output block after attention and after the MLP."""

    def __init__(self, n_in: int, cfg: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(n_in, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(residual + self.dense(x))


class Attention(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.self = SelfAttention(cfg)
        self.output = DenseNorm(cfg.hidden_size, cfg)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        return self.output(self.self(x, keep), x)


class Intermediate(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.gelu(self.dense(x))  # exact (erf) GELU, as BERT's "gelu"


class Layer(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.attention = Attention(cfg)
        self.intermediate = Intermediate(cfg)
        self.output = DenseNorm(cfg.intermediate_size, cfg)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        x = self.attention(x, keep)
        return self.output(self.intermediate(x), x)


class Encoder(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(Layer(cfg) for _ in range(cfg.num_hidden_layers))


class BertEncoder(nn.Module):
    """Token ids [m, t] and attention mask [m, t] (1 = token, 0 = padding) -> hidden [m, t, d]."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embeddings = Embeddings(cfg)
        self.encoder = Encoder(cfg)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        keep = mask.bool()[:, None, None, :]  # [m, 1, 1, t]: every query sees the real tokens
        x = self.embeddings(ids)
        for layer in self.encoder.layer:
            x = layer(x, keep)
        return x


def load_bert(directory: Path) -> BertEncoder:
    """The encoder of a local checkpoint (config.json, model.safetensors), in eval mode."""
    from safetensors.torch import load_file

    cfg = BertConfig.from_file(directory / "config.json")
    with torch.device("meta"):  # no random init: every parameter comes from the file
        model = BertEncoder(cfg)
    state = load_file(str(directory / "model.safetensors"))
    # The pooler (unused for sentence embeddings) and position ids (recomputed) are skipped.
    state = {k: v for k, v in state.items() if not k.startswith("pooler.")}
    state.pop("embeddings.position_ids", None)
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval()
