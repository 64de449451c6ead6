"""What a Hugging Face checkpoint folder states, read without loading it: config.json, its file
names, the sentence-transformers configuration, and from them its kind, task and outputs (the
registration's facts). Loading is models/adapters/hf.py's; the builders are
models/adapters/hf_models.py's."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from models.adapters.archive import list_members, read_member
from models.declaration import Facts, InvalidModelError

KINDS = ("text", "lm", "encoder", "ranker")
TASKS = {"lm": "generation", "encoder": "embedding", "ranker": "ranking"}
PICKLES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".joblib", ".npz")
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "tokenizer.model", "spiece.model")
SMALL = (
    "config.json",
    "modules.json",
    "config_sentence_transformers.json",
    "tokenizer_config.json",
)


@dataclass(frozen=True)
class Checkpoint:
    """What a checkpoint folder states: config.json, its file names, sentence-transformers
    configuration (modules.json, config_sentence_transformers.json)."""

    config: dict[str, Any]
    files: frozenset[str]  # paths relative to the checkpoint folder, '/'-separated
    modules: list[dict[str, Any]] = field(default_factory=list)
    st_config: dict[str, Any] = field(default_factory=dict)
    tokenizer_config: dict[str, Any] = field(default_factory=dict)

    @property
    def onnx(self) -> bool:
        """An ONNX text classifier: model.onnx and no safetensors (models/adapters/onnx_text.py)."""
        return "model.onnx" in self.files and not any(
            f in self.files for f in ("model.safetensors", "model.safetensors.index.json")
        )

    @property
    def architectures(self) -> list[str]:
        archs = self.config.get("architectures") or []
        return [str(a) for a in archs] if isinstance(archs, list) else [str(archs)]

    @property
    def labels(self) -> tuple[str, ...]:
        """Output names from `id2label` (by index), else num_labels placeholders."""
        raw = self.config.get("id2label") or {}
        try:
            pairs = sorted((int(k), str(v)) for k, v in raw.items())
        except (AttributeError, ValueError):
            raise InvalidModelError("config.json id2label must map indices to names") from None
        n = int(self.config.get("num_labels") or len(pairs) or 2)
        if [k for k, _ in pairs] == list(range(len(pairs))) and len(pairs) == n:
            return tuple(v for _, v in pairs)
        return tuple(f"LABEL_{i}" for i in range(n))

    def pooling(self) -> bool:
        """A sentence-transformers encoder: a Pooling module or a 1_Pooling folder."""
        types = [str(m.get("type", "")) for m in self.modules]
        return any(t.endswith("Pooling") for t in types) or "1_Pooling/config.json" in self.files

    def says_cross_encoder(self) -> bool:
        """config or name says cross-encoder (sentence-transformers' CrossEncoder)."""
        name = str(self.config.get("_name_or_path", "")).lower()
        return (
            self.st_config.get("model_type") == "CrossEncoder"
            or "sentence_transformers" in self.config
            or "cross-encoder" in name
            or "cross_encoder" in name
        )


def _json(raw: bytes | None, what: str) -> Any:
    if raw is None:
        return None
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidModelError(f"{what} is not valid JSON: {exc}") from None


def root_prefix(paths: list[PurePosixPath]) -> PurePosixPath:
    """Where config.json (or an ONNX export's model.onnx) is: the archive's top, or its one
    top-level folder."""
    marks = ("config.json", "model.onnx")
    if any(PurePosixPath(m) in paths for m in marks):
        return PurePosixPath(".")
    tops = {p.parts[0] for p in paths if p.parts and p.parts[0] != "__MACOSX"}
    if len(tops) == 1:
        top = PurePosixPath(next(iter(tops)))
        if any(top / m in paths for m in marks):
            return top
    raise InvalidModelError(
        "no config.json at the archive's top or in its one top-level folder: archive the folder "
        "that save_pretrained wrote (or an ONNX text classifier's model.onnx + tokenizer.json)"
    )


def checkpoint(files: set[str], read: Any) -> Checkpoint:
    """Check a checkpoint's file names and small JSON files (`read(name) -> bytes | None`)."""
    pickles = sorted(f for f in files if f.lower().endswith(PICKLES))
    if pickles:
        raise InvalidModelError(
            f"{pickles[0]} is a pickle (torch.save): it could run code when loaded, so it is "
            "never read. Save with save_pretrained (safetensors, the default) and leave out "
            ".bin/.pt files"
        )
    onnx = "model.onnx" in files
    if "model.safetensors" not in files and "model.safetensors.index.json" not in files:
        if not onnx:
            raise InvalidModelError(
                "no model.safetensors (or model.safetensors.index.json) in the checkpoint: save "
                "it with save_pretrained (safetensors), or export an ONNX text classifier as "
                "model.onnx beside its tokenizer.json"
            )
        if "tokenizer.json" not in files:
            raise InvalidModelError(
                "an ONNX text classifier needs its fast tokenizer's tokenizer.json beside "
                "model.onnx (tokenizer.save_pretrained writes it)"
            )
    config = _json(read("config.json"), "config.json")
    if config is None and onnx:
        config = {}  # an ONNX export: config.json (id2label) is optional
    if not isinstance(config, dict):
        raise InvalidModelError("config.json must be a JSON object")
    tok_config = _json(read("tokenizer_config.json"), "tokenizer_config.json") or {}
    for what, cfg in (("config.json", config), ("tokenizer_config.json", tok_config)):
        if isinstance(cfg, dict) and cfg.get("auto_map"):
            raise InvalidModelError(
                f"{what} has auto_map {cfg['auto_map']}: it asks for remote code "
                "(trust_remote_code), which is never run; use an architecture transformers "
                "ships"
            )
    if not any(f in files for f in TOKENIZER_FILES):
        raise InvalidModelError(
            "the checkpoint has no tokenizer (tokenizer.json): save it next to the model with "
            "tokenizer.save_pretrained"
        )
    modules = _json(read("modules.json"), "modules.json") or []
    st_config = _json(read("config_sentence_transformers.json"), "sentence-transformers config")
    return Checkpoint(
        config,
        frozenset(files),
        modules if isinstance(modules, list) else [],
        st_config if isinstance(st_config, dict) else {},
        tok_config if isinstance(tok_config, dict) else {},
    )


def archive_checkpoint(data: bytes) -> Checkpoint:
    """The checkpoint an archive holds, read without unpacking it."""
    members = list_members(data)
    paths = [m.path for m in members if not m.is_dir]
    root = root_prefix(paths)
    rel = {str(p.relative_to(root)) for p in paths if p.is_relative_to(root)}

    def read(name: str) -> bytes | None:
        return read_member(data, root / name) if name in rel else None

    return checkpoint(rel, read)


def _files_under(path: Path, root: Path) -> set[str]:
    """Regular files below `path` (links must resolve inside `root`)."""
    out: set[str] = set()
    for folder, _, names in os.walk(path):
        for name in names:
            full = Path(folder) / name
            real = full.resolve()
            if not real.is_relative_to(root) or not real.is_file():
                raise InvalidModelError(
                    f"{full.relative_to(path)} is not a regular file inside MODEL_REPOSITORY"
                )
            out.add(full.relative_to(path).as_posix())
    return out


def folder_checkpoint(path: Path, root: Path | None = None) -> Checkpoint:
    """The checkpoint in a folder (every file a regular one inside `root`)."""
    files = _files_under(path, (root or path).resolve())

    def read(name: str) -> bytes | None:
        return (path / name).read_bytes() if name in files and name in SMALL else None

    return checkpoint(files, read)


def kind(ck: Checkpoint, declared: str | None = None) -> str:
    """text, lm, encoder or ranker from `config.architectures`; a declared modality wins where
    the architecture allows it, else InvalidModelError naming both."""
    archs = ck.architectures
    if ck.onnx:  # model.onnx + tokenizer.json: a text classifier
        if declared not in (None, "text"):
            raise InvalidModelError(
                f"declared modality {declared!r}: model.onnx with a tokenizer is a text classifier"
            )
        return "text"
    seq = any(a.endswith("ForSequenceClassification") for a in archs)
    causal = any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs)
    base = any(a.endswith("Model") and not a.endswith("LMHeadModel") for a in archs)
    one_label = len(ck.labels) == 1
    allowed: list[str] = []
    if seq:
        allowed = ["ranker", "text"] if one_label and ck.says_cross_encoder() else ["text"]
        if one_label and "ranker" not in allowed:
            allowed.append("ranker")
    elif causal:
        allowed = ["lm"]
    elif base and ck.pooling():
        allowed = ["encoder"]
    if not allowed:
        raise InvalidModelError(
            f"config.json architectures {archs}: not a kind this service runs (a "
            "*ForSequenceClassification text classifier or cross-encoder, a *ForCausalLM "
            "language model, or a sentence-transformers encoder with a pooling config)"
        )
    if declared is None:
        return allowed[0]
    if declared not in allowed:
        raise InvalidModelError(
            f"declared modality {declared!r} contradicts config.json architectures {archs} "
            f"(a {allowed[0]} model)"
        )
    return declared


def task_of(ck: Checkpoint, model_kind: str) -> str:
    """The task: classification for a classifier (regression when one label or
    problem_type regression), generation, embedding or ranking otherwise."""
    if model_kind != "text":
        return TASKS[model_kind]
    regression = ck.config.get("problem_type") == "regression" or len(ck.labels) == 1
    return "regression" if regression else "classification"


def outputs_of(ck: Checkpoint, model_kind: str) -> tuple[str, ...]:
    if model_kind == "text":
        return ck.labels
    if model_kind == "lm":
        return ("log_likelihood",)
    if model_kind == "ranker":
        return ("score",)
    dim = ck.config.get("hidden_size") or ck.config.get("d_model") or 0
    return tuple(f"dim_{i}" for i in range(int(dim)))


def facts_of(ck: Checkpoint, declared: str | None = None) -> Facts:
    """The declaration fields a checkpoint states."""
    model_kind = kind(ck, declared)
    return Facts(
        modality=model_kind,
        task=task_of(ck, model_kind),
        input_shape=(),
        output_names=outputs_of(ck, model_kind),
        feature_names=(),
    )


def hf_facts(data: bytes) -> Facts:
    """Facts of an uploaded checkpoint archive (config.json, read without unpacking)."""
    return facts_of(archive_checkpoint(data))
