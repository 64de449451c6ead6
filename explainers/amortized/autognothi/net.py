"""AutoGnothi's side network and the one frozen-encoder pass it reads.

AutoGnothi: Wang et al., "Gnothi Seauton: Empowering Faithful Self-Interpretability in
Black-Box Transformers" (ICLR 2025): a small side network runs beside a frozen transformer,
reading a down-projection of the main network's hidden state at every layer (ladder
side-tuning, Sung et al., NeurIPS 2022), and outputs Shapley values, so one forward pass gives
the prediction and its explanation. Here the main network is the BERT encoder of a zero-shot
text classifier (models/builtin/text.py) or a Hugging Face sequence classifier; the side network's
per-token outputs are summed over each word's tokens (the players are the words of
explainers/games/text.py, as for `shapley`), centred over the classes and projected additively
so that they add up to v(N) - v(empty) (FastSHAP, Jethani et al., ICLR 2022). The paper's side
branch (ltt) reads the backbone's hidden states the same way; its attention masking of absent
tokens (a side-tuned surrogate) is not used here: the game deletes the words.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from explainers.explanation import OptionError
from explainers.games.text import text_games, word_spans

if TYPE_CHECKING:
    from models.adapters.hf_models import Runner as HFRunner
    from models.base import TextModel
    from models.builtin.text import TextRunner
    from models.sandbox.hf_proxy import WorkerHook


class SideNet(nn.Module):
    """Hidden states [b, levels, t, d] -> per-token values [b, t, n_classes]."""

    def __init__(self, levels: int, dim: int, n_classes: int, width: int, heads: int) -> None:
        super().__init__()
        self.levels, self.dim, self.n_classes = levels, dim, n_classes
        self.down = nn.ModuleList(nn.Linear(dim, width) for _ in range(levels))
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                width, heads, 2 * width, dropout=0.0, batch_first=True, norm_first=True
            )
            for _ in range(levels - 1)
        )
        self.head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, n_classes))

    def forward(self, hidden: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
        pad = ~token_mask  # [b, t] True where padding
        side = self.down[0](hidden[:, 0])  # [b, t, width]
        for level, layer in enumerate(self.layers, start=1):
            side = layer(side + self.down[level](hidden[:, level]), src_key_padding_mask=pad)
        return self.head(side)  # [b, t, C]


@dataclass(frozen=True)
class Encoded:
    """One frozen-encoder pass over a batch of texts, with each text's word players."""

    hidden: torch.Tensor  # [b, levels, t, d]: embeddings, then every layer's output
    token_mask: torch.Tensor  # [b, t] bool: real tokens ([CLS] and [SEP] included)
    words: torch.Tensor  # [b, w, t] float: 1 where token t belongs to word w
    word_mask: torch.Tensor  # [b, w] bool: real words
    probs: torch.Tensor  # [b, C]: the classifier's probabilities, v(N)


def runner(model: TextModel) -> TextRunner | HFRunner | WorkerHook:
    """The tokenizer and classifier behind a text model: the built-in zero-shot one, or a
    Hugging Face sequence classifier with softmax outputs (OptionError for any other model:
    its hidden states cannot be read)."""
    from models.builtin.text import TextRunner, ZeroShotClassifier

    hook = getattr(model, "embeddings", None)  # models/adapters/hf_models.py EmbeddingHook
    if hook is not None:
        if hasattr(hook, "hidden_states"):  # a checkpoint in a model worker: the pass runs there
            in_worker: WorkerHook = hook
            return in_worker
        if hook.link != "softmax":
            raise OptionError(f"autognothi explains softmax classifiers; {model.name!r} is not")
        hf_runner: HFRunner = hook.runner
        return hf_runner
    found = getattr(model.predict_texts, "__self__", None)
    if not isinstance(found, TextRunner) or not isinstance(found.module, ZeroShotClassifier):
        raise OptionError(
            f"autognothi reads the hidden states of a built-in BERT-encoder text classifier "
            f"(sentiment-minilm); {model.name!r} is not one"
        )
    return found


def encode(model: TextModel, texts: list[str]) -> Encoded:
    """Hidden states at every level, word players and class probabilities: one encoder pass."""
    from models.builtin.text import ZeroShotClassifier

    run = runner(model)
    found: tuple[torch.Tensor, torch.Tensor] | None = None
    if hasattr(run, "hidden_states"):  # the encoder pass in the model worker
        tokens, hidden, probs = run.hidden_states(texts)
        found = hidden, probs
    else:
        tokens = [(e.ids, e.offsets) for e in run.tokenizer.encode_batch(texts)]
    spans = [word_spans(text) for text in texts]  # the words of `shapley`'s text game
    width = max(len(t_ids) for t_ids, _ in tokens)
    n_words = max(1, *(len(s) for s in spans))
    ids = torch.zeros(len(texts), width, dtype=torch.int64)
    mask = torch.zeros(len(texts), width, dtype=torch.int64)
    words = torch.zeros(len(texts), n_words, width)
    word_mask = torch.zeros(len(texts), n_words, dtype=torch.bool)
    for r, ((t_ids, offsets), pieces) in enumerate(zip(tokens, spans, strict=True)):
        ids[r, : len(t_ids)] = torch.tensor(t_ids)
        mask[r, : len(t_ids)] = 1
        word_mask[r, : len(pieces)] = True
        starts = np.array([p.start for p in pieces])
        for t, (s, e) in enumerate(offsets):
            if e <= s or not pieces:  # special tokens, or no word at all
                continue
            w = int(np.searchsorted(starts, s, side="right")) - 1
            if w >= 0 and s < pieces[w].end:  # inside a word: not punctuation between words
                words[r, w, t] = 1.0
    if found is not None:
        return Encoded(found[0], mask.bool(), words, word_mask, found[1])
    assert not hasattr(run, "hidden_states")
    module = run.module
    device = next(module.parameters()).device  # where the registry placed the weights
    ids, mask = ids.to(device), mask.to(device)
    with torch.inference_mode():
        if isinstance(module, ZeroShotClassifier):
            keep = mask.bool()[:, None, None, :]
            x = module.encoder.embeddings(ids)
            levels = [x]
            for layer in module.encoder.encoder.layer:
                x = layer(x, keep)
                levels.append(x)
            weights = mask.unsqueeze(-1).to(x.dtype)  # mean pooling, as ZeroShotClassifier.embed
            pooled = (x * weights).sum(1) / weights.sum(1).clamp(1e-9)
            pooled = nn.functional.normalize(pooled, dim=1)
            probs = torch.softmax(pooled @ module.labels.T / module.temperature, dim=1)
            hidden = torch.stack(levels, dim=1)
        else:  # a Hugging Face classifier: its own hidden states (embeddings, every layer)
            out = module(input_ids=ids, attention_mask=mask, output_hidden_states=True)
            hidden = torch.stack(out.hidden_states, dim=1)
            probs = torch.softmax(out.logits, dim=-1)
    # Out of inference mode (clone), on the CPU, where the side network runs.
    return Encoded(hidden.cpu().clone(), mask.cpu().bool(), words, word_mask, probs.cpu().clone())


def vocabulary(model: TextModel) -> frozenset[str]:
    """The tokens of the classifier's tokenizer."""
    run = runner(model)
    if hasattr(run, "vocabulary"):
        words: frozenset[str] = run.vocabulary()
        return words
    return frozenset(run.tokenizer.get_vocab())


def centred(values: torch.Tensor) -> torch.Tensor:
    """Minus the mean over classes: class probabilities add up to 1 in every coalition, so
    their Shapley values add up to 0 over the classes."""
    return values - values.mean(dim=-1, keepdim=True)


def word_values(
    net: SideNet, enc: Encoded, full: torch.Tensor, empty: torch.Tensor
) -> torch.Tensor:
    """Efficiency-projected word values [b, w, C] (0 on padding words): they add up to
    full - empty ([b, C]) for every class."""
    tokens = net(enc.hidden, enc.token_mask)  # [b, t, C]
    raw = centred(enc.words @ tokens) * enc.word_mask[..., None]  # [b, w, C]
    n = enc.word_mask.sum(dim=1, keepdim=True).to(raw.dtype)  # [b, 1]
    gap = full - empty - raw.sum(dim=1)  # [b, C]
    return raw + (gap / n)[:, None, :] * enc.word_mask[..., None]


def empty_texts(model: TextModel, texts: list[str]) -> list[str]:
    """Each text with every word deleted, exactly as `shapley`'s text game deletes them."""
    return [game.compose(np.zeros(game.n_players, dtype=bool)) for game in text_games(model, texts)]
