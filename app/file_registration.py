"""The declaration of a model file or remote model registration: the form's fields, else
what the model file states (models/adapters/facts.py); a declared field that contradicts the
file is a 400 naming both values. Hugging Face checkpoints: app/hf_registration.py; remote
credentials and hosts: app/remote_registration.py."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import anyio

from app.errors import InvalidInput
from app.hf_registration import hf_declaration
from app.remote_registration import prepare_remote
from models.adapters.archive import is_gzip, is_tar, zip_names
from models.adapters.facts import Facts
from models.adapters.user import FORMATS, Declaration
from models.base import ModelError
from models.modality import Modality
from models.sandbox import sandboxed_facts as file_facts  # booster files: read in workers

if TYPE_CHECKING:
    from app.settings import Settings

NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
MAX_FEATURES = 3 * 512 * 512  # values per row: RGB images up to 512x512


def _json_list(field: str, raw: str | None) -> list[Any] | None:
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        raise InvalidInput(f"{field} must be a JSON list") from None
    if not isinstance(value, list) or not value:
        raise InvalidInput(f"{field} must be a non-empty JSON list")
    return value


def _input_range(raw: str | None) -> tuple[float, float] | None:
    values = _json_list("input_range", raw)
    if values is None:
        return None
    ok = len(values) == 2 and all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in values
    )
    if not ok or not values[0] < values[1]:
        raise InvalidInput("input_range must be [low, high] with low < high")
    return float(values[0]), float(values[1])


EXPORT_HINT = (
    "register TorchScript (torch.jit.trace/script, then torch.jit.save), ONNX (scikit-learn: "
    "skl2onnx; docs/models.md), an XGBoost or LightGBM model file, or a Hugging Face "
    "checkpoint folder"
)


def foreign_format(data: bytes, names: list[str]) -> str | None:
    """What an upload in a format the service does not read is, in words (None: none of
    these): pickles (joblib, torch.save) are never loaded, whatever format was declared;
    torch.export programs, skops and CatBoost files are named so that the refusal says so."""
    base = {n.rsplit("/", 1)[-1] for n in names}
    if data[:1] == b"\x80" and data[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return (
            "a Python pickle (pickle.dump, joblib.dump or an old torch.save), which runs code "
            "when loaded"
        )
    if data[:2] in (b"x\x01", b"x^", b"x\x9c", b"x\xda") and len(names) == 0:
        return "a compressed joblib pickle (joblib.dump with compress), which runs code when loaded"
    if "archive_format" in base and "model.json" in base:
        return "a torch.export program (torch.export.save, .pt2), not read yet (issue 40)"
    if "data.pkl" in base and not any("/code/" in n or n.startswith("code/") for n in names):
        return "a torch.save checkpoint (pickled weights or a module), which runs code when loaded"
    if "schema.json" in base and not any(n.endswith(".onnx") for n in names):
        return "a skops file (scikit-learn), not read yet (issue 40)"
    if data[:4] == b"CBM1":
        return "a CatBoost model (.cbm), not read yet (issue 40)"
    if data[:1] == b"{" and b'"oblivious_trees"' in data[:1 << 20]:
        return "a CatBoost JSON model, not read yet (issue 40)"
    if data[:8] == b"\x89HDF\r\n\x1a\n":
        return "an HDF5 file (a Keras .h5 model)"
    return None


def refuse_foreign(data: bytes) -> None:
    """400 `unsupported_format` naming a format the service does not read (`foreign_format`)."""
    names = zip_names(data) if data[:2] == b"PK" else []
    what = foreign_format(data, names)
    if what is not None:
        raise InvalidInput(f"the file is {what}: {EXPORT_HINT}", code="unsupported_format")


def sniff_format(data: bytes) -> str:
    """The upload's format from its first bytes (never a pickle): a .tar.gz/.tar, or a zip with
    a config.json or model.onnx, is a Hugging Face checkpoint folder (or an ONNX text
    classifier's); another zip is TorchScript."""
    head = data[:512].lstrip()
    if data[:2] == b"PK":
        marks = ("config.json", "model.onnx")  # a checkpoint, or an ONNX text classifier's
        hf = any(n.rsplit("/", 1)[-1] in marks for n in zip_names(data))
        return "huggingface" if hf else "torchscript"
    if is_gzip(data) or is_tar(data):
        return "huggingface"
    if head.startswith(b"tree\n") or head.startswith(b"tree\r\n"):
        return "lightgbm"
    if head.startswith(b"{") and (b'"learner"' in data[:4096] or b"learner" in data[:64]):
        return "xgboost"  # JSON, or UBJSON whose first key is "learner"
    return "onnx"


def _shape(raw: str | None) -> tuple[int, ...] | None:
    shape = _json_list("input_shape", raw)
    if shape is None:
        return None
    if not all(isinstance(d, int) and not isinstance(d, bool) and 0 < d <= 4096 for d in shape):
        raise InvalidInput("input_shape must list positive integers (without the batch axis)")
    return tuple(shape)


def _strings(field: str, raw: str | None) -> tuple[str, ...] | None:
    values = _json_list(field, raw)
    if values is not None and not all(isinstance(v, str) for v in values):
        raise InvalidInput(f"{field} must be a JSON list of strings")
    return None if values is None else tuple(values)


def _show(values: tuple[str, ...]) -> str:
    shown = ", ".join(repr(v) for v in values[:8])
    return f"[{shown}]" if len(values) <= 8 else f"[{shown}, ... ({len(values)} in all)]"


def _contradictions(
    fmt: str,
    facts: Facts,
    modality: str | None,
    shape: tuple[int, ...] | None,
    outputs: tuple[str, ...] | None,
    features: tuple[str, ...] | None,
    task: str | None,
) -> list[str]:
    """Each declared field that the file states otherwise, naming both values."""
    found = []
    source = f"the {fmt} file"
    if modality and facts.modality and modality != facts.modality:
        found.append(f"modality {modality!r}: {source} has a {facts.modality} input")
    if shape and facts.input_shape and math.prod(shape) != math.prod(facts.input_shape):
        states = (
            f"reads {facts.input_shape[0]} features"
            if len(facts.input_shape) == 1
            else f"states input_shape {list(facts.input_shape)}"
        )
        found.append(f"input_shape {list(shape)} has {math.prod(shape)} values per row; "
                     f"{source} {states}")  # fmt: skip
    if task and facts.task and task != facts.task:
        what = "objective" if fmt in ("xgboost", "lightgbm") else "model"
        found.append(f"task {task!r}: {source} states a {facts.task} {what}")
    if outputs and facts.output_names and len(outputs) != len(facts.output_names):
        found.append(f"output_names lists {len(outputs)} names; {source} has "
                     f"{len(facts.output_names)} outputs {_show(facts.output_names)}")  # fmt: skip
    if features and facts.feature_names and features != facts.feature_names:
        found.append(f"feature_names {_show(features)} differ from the names {source} stores "
                     f"{_show(facts.feature_names)}")  # fmt: skip
    return found


def declaration(
    name: str,
    fmt: str,
    facts: Facts,
    *,
    modality: str | None = None,
    input_shape: str | None = None,
    output_names: str | None = None,
    feature_names: str | None = None,
    task: str | None = None,
    input_range: str | None = None,
    onnx_output: str | None = None,
    remote_url: str | None = None,
    remote_output: str | None = None,
    remote_auth: str | None = None,
) -> Declaration:
    """The declared fields, else what the model file states (`facts`); a declared field that
    contradicts the file is a 400 naming both values. `remote_auth`: a remote model's sealed
    credentials (app/remote_registration.py), stored apart from its URL."""
    if not NAME.match(name):
        raise InvalidInput("name: 1-64 characters of a-z, 0-9, '.', '_' or '-', starting alnum")
    if fmt not in FORMATS:
        raise InvalidInput(f"format must be one of {list(FORMATS)}")
    if remote_output is not None and fmt != "remote":
        raise InvalidInput("remote_output applies to remote models only")
    if onnx_output is not None and fmt != "onnx":
        raise InvalidInput("onnx_output applies to ONNX models only")
    if onnx_output is not None and onnx_output != facts.onnx_output:  # facts of another tensor
        facts = replace(facts, task=None, output_names=None, onnx_output=None)
    shape, outputs = _shape(input_shape), _strings("output_names", output_names)
    features = _strings("feature_names", feature_names)
    wrong = _contradictions(fmt, facts, modality, shape, outputs, features, task)
    if wrong:
        raise InvalidInput("; ".join(wrong), code="invalid_model")
    if fmt == "remote" and modality == Modality.TEXT:
        return _remote_text(name, outputs, shape, features, task, input_range, remote_url,
                            remote_output, remote_auth)  # fmt: skip
    modality = modality or facts.modality
    shape = shape or facts.input_shape
    outputs = outputs or facts.output_names
    missing = [f for f, v in [("modality", modality), ("input_shape", shape),
                              ("output_names", outputs)] if not v]  # fmt: skip
    if missing or modality is None or shape is None or outputs is None:
        raise InvalidInput(
            f"a {fmt} model does not state {' or '.join(missing)}: send "
            f"{'them' if len(missing) > 1 else 'it'} as form fields (modality: tabular or image; "
            "input_shape and output_names: JSON lists)"
        )
    if modality not in (Modality.TABULAR, Modality.IMAGE):
        raise InvalidInput(
            "modality must be tabular or image for a model file (text: a remote_url with "
            "modality text, or a Hugging Face or ONNX checkpoint folder as format huggingface)"
        )
    size = math.prod(shape)
    if size > MAX_FEATURES:
        raise InvalidInput(
            f"input_shape {list(shape)} has {size:,} values per row; at most {MAX_FEATURES:,} "
            "(a 3x512x512 image): resize the model's input"
        )
    features = features or facts.feature_names or tuple(f"x{i}" for i in range(size))
    if len(features) != size:
        raise InvalidInput(f"feature_names must be {size} strings (one per input value)")
    task = task or facts.task or ("classification" if len(outputs) > 1 else "regression")
    if task not in ("classification", "regression"):
        raise InvalidInput("task must be classification or regression")
    decl = Declaration(
        name,
        modality,
        task,
        shape,
        outputs,
        features,
        format=fmt,
        input_range=_input_range(input_range),
        onnx_output=onnx_output or facts.onnx_output,
        remote_url=remote_url,
        remote_output=remote_output,
    )
    return _with_auth(decl, remote_auth)


def _with_auth(decl: Declaration, remote_auth: str | None) -> Declaration:
    """A remote model's declaration with its sealed credentials (stored apart from the URL in
    the declaration's remote_auth: the stored meta, never an answer)."""
    return decl if remote_auth is None else replace(decl, remote_auth=remote_auth)


def _remote_text(
    name: str,
    outputs: tuple[str, ...] | None,
    shape: tuple[int, ...] | None,
    features: tuple[str, ...] | None,
    task: str | None,
    input_range: str | None,
    remote_url: str | None,
    remote_output: str | None,
    remote_auth: str | None = None,
) -> Declaration:
    """A remote OIP text model: texts go out as a BYTES tensor of strings
    (models/adapters/remote_text.py); the endpoint states nothing, so output_names are declared."""
    if shape or features or input_range:
        raise InvalidInput(
            "a remote text model reads strings: leave out input_shape, feature_names and "
            "input_range (its players are the words of each input)"
        )
    if not outputs:
        raise InvalidInput(
            "a remote text model does not state its outputs: send output_names (a JSON list, "
            "one name per value of the output remote_output names)"
        )
    task = task or ("classification" if len(outputs) > 1 else "regression")
    if task not in ("classification", "regression"):
        raise InvalidInput("task must be classification or regression")
    decl = Declaration(name, "text", task, (), outputs, (), format="remote",
                       remote_url=remote_url, remote_output=remote_output)  # fmt: skip
    return _with_auth(decl, remote_auth)


@dataclass(frozen=True)
class RegistrationForm:
    """The registration form's text fields as sent (None: not sent; POST /v2/repository/models
    describes each)."""

    name: str
    modality: str | None = None
    input_shape: str | None = None
    output_names: str | None = None
    feature_names: str | None = None
    task: str | None = None
    format: str | None = None
    remote_url: str | None = None
    uri: str | None = None
    remote_output: str | None = None
    remote_headers: str | None = None
    input_range: str | None = None
    onnx_output: str | None = None


async def declare(
    form: RegistrationForm, files: dict[str, bytes], settings: Settings
) -> Declaration:
    """The declaration of a registration: its form and files (`model`, `background`: read and
    size-checked); a Hugging Face checkpoint by app/hf_registration.py, a remote model's URL and
    credentials by app/remote_registration.py, a file's facts read in a model worker. 400s name
    what is wrong."""
    if form.remote_headers is not None and form.remote_url is None:
        raise InvalidInput("remote_headers applies to remote models only")
    remote_url, remote_auth = form.remote_url, None
    if remote_url is not None:  # no credentials in the URL; its host allowed
        remote_url, remote_auth = await anyio.to_thread.run_sync(
            prepare_remote, remote_url, form.remote_headers, settings
        )
    if remote_url is None and form.uri is None:
        refuse_foreign(files["model"])  # whatever format was declared
    fmt = "remote" if remote_url is not None else "huggingface" if form.uri is not None else (
        form.format or sniff_format(files["model"])
    )
    if fmt == "huggingface" or form.uri is not None:  # a checkpoint folder: models/adapters/hf.py
        if not NAME.match(form.name):
            raise InvalidInput("name: 1-64 characters of a-z, 0-9, '.', '_' or '-'")
        if form.format not in (None, "huggingface") or "background" in files:
            raise InvalidInput("uri and Hugging Face checkpoints take no background or other "
                               "format: send format huggingface (or none)")  # fmt: skip
        return await anyio.to_thread.run_sync(
            lambda: hf_declaration(
                form.name,
                files.get("model"),
                form.uri,
                settings.model_repository,
                modality=form.modality,
                task=form.task,
                output_names=form.output_names,
                input_shape=form.input_shape,
                feature_names=form.feature_names,
            )
        )
    if fmt == "remote" and form.modality == Modality.TEXT and "background" in files:
        raise InvalidInput("a remote text model takes no background rows (absent words are "
                           "deleted or masked)")  # fmt: skip
    facts = Facts()
    if "model" in files:
        try:
            facts = await anyio.to_thread.run_sync(file_facts, fmt, files["model"])
        except ModelError as exc:
            raise InvalidInput(str(exc), code="invalid_model") from None
    return declaration(
        form.name,
        fmt,
        facts,
        modality=form.modality,
        input_shape=form.input_shape,
        output_names=form.output_names,
        feature_names=form.feature_names,
        task=form.task,
        input_range=form.input_range,
        onnx_output=form.onnx_output,
        remote_url=remote_url,
        remote_output=form.remote_output,
        remote_auth=remote_auth,
    )
