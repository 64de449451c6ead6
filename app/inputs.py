"""Turn JSON instances into a model's native rows (float32 arrays, or texts), or a 400."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from app.errors import InvalidInput
from models.base import Model, TextModel
from models.modality import Modality


def _not_number(item: Any) -> Any:
    """The first leaf that is not a JSON number, else None.

    The rule everywhere: a number is a JSON number. Strings ("51") and true/false are never
    numbers (numpy would turn them into 51.0 and 1.0 silently); integers fill float fields.
    """
    if isinstance(item, list):
        for v in item:
            bad = _not_number(v)
            if bad is not None:
                return bad
        return None
    if isinstance(item, bool) or not isinstance(item, int | float):
        return item if item is not None else "null"
    return None


def _row(model: Model, item: Any, where: str) -> np.ndarray:
    if isinstance(item, dict):
        missing = [f for f in model.feature_names if f not in item]
        unknown = [k for k in item if k not in set(model.feature_names)]
        if missing or unknown:
            raise InvalidInput(
                f"{where}: keys must be the model's features; missing {missing[:5]}, "
                f"unknown {unknown[:5]}"
            )
        item = [item[f] for f in model.feature_names]
    bad = _not_number(item)
    if bad is not None:
        raise InvalidInput(
            f"{where}: expected JSON numbers; {json.dumps(bad)[:40]} is not one (strings and "
            "true/false are never numbers)"
        )
    try:
        arr = np.asarray(item, dtype=np.float64)
    except OverflowError:  # a JSON integer of hundreds of digits
        raise InvalidInput(f"{where}: values exceed the float32 range") from None
    except (TypeError, ValueError):
        raise InvalidInput(f"{where}: expected numbers in a regular nested list") from None
    if arr.dtype == object:
        raise InvalidInput(f"{where}: expected numbers in a regular nested list")
    if arr.size != model.n_features:
        raise InvalidInput(
            f"{where}: expected {model.n_features} values (shape {list(model.input_shape)}), "
            f"got {arr.size} (shape {list(arr.shape)})"
        )
    if not np.all(np.isfinite(arr)):
        raise InvalidInput(f"{where}: values must be finite (no NaN or infinity)")
    if np.any(np.abs(arr) > np.finfo(np.float32).max):
        raise InvalidInput(f"{where}: values exceed the float32 range")
    return arr.astype(model.input_dtype).reshape(model.input_shape)


def _text(model: TextModel, item: Any, where: str, empty: bool = False) -> str:
    if not isinstance(item, str):
        raise InvalidInput(f"{where}: expected a string (the model reads text)")
    if not item.strip() and not empty:
        raise InvalidInput(f"{where}: the text is empty")
    if "\x00" in item:
        raise InvalidInput(f"{where}: the text contains a NUL character")
    if not item.isascii():  # a lone surrogate ("\ud800" in JSON) is no text: UTF-8 refuses it
        try:
            item.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidInput(
                f"{where}: character {exc.start} is a lone UTF-16 surrogate "
                f"(\\u{ord(item[exc.start]):04x}), not text"
            ) from None
    if len(item) > model.max_chars:
        raise InvalidInput(f"{where}: {len(item)} characters; at most {model.max_chars}")
    # max_tokens 0: no tokenizer here (a remote text model); the endpoint truncates
    if model.max_tokens > 0 and len(model.token_spans(item)) > model.max_tokens:
        raise InvalidInput(
            f"{where}: over {model.max_tokens} tokens, more than the model reads; shorten it"
        )
    return item


def to_array(model: Model, items: list[Any], field: str, empty_texts: bool = False) -> np.ndarray:
    """Instances -> [m, *input_shape] in the model's input dtype (float32 unless the model reads
    float64), from lists, nested lists or dicts; or str [m] for text models."""
    if isinstance(model, TextModel):
        texts = [_text(model, it, f"{field}[{i}]", empty_texts) for i, it in enumerate(items)]
        return np.array(texts, str)
    if any(isinstance(it, bool) for it in items):
        raise InvalidInput(f"{field}: expected rows of numbers")
    if model.modality != Modality.IMAGE and items and not isinstance(items[0], (list, dict)):
        raise InvalidInput(f"{field}: expected a list of rows, e.g. [[...], [...]]")
    return np.stack([_row(model, it, f"{field}[{i}]") for i, it in enumerate(items)])


def outside_range(model: Model, rows: np.ndarray, field: str) -> dict[int, str]:
    """Rows with values outside the model's declared input_range: {row: what is wrong}."""
    if model.input_range is None or rows.dtype.kind not in "fiu" or rows.size == 0:
        return {}
    low, high = model.input_range
    slack = 1e-6 * max(1.0, high - low)
    outside = (rows < low - slack) | (rows > high + slack)
    return {
        int(i): f"{field}[{int(i)}]: values from {float(rows[i].min()):g} to "
        f"{float(rows[i].max()):g} leave {model.name}'s input range [{low:g}, {high:g}]"
        for i in np.flatnonzero(outside.reshape(len(rows), -1).any(axis=1))
    }


def check_range(model: Model, rows: np.ndarray, field: str, allow: bool = False) -> dict[int, str]:
    """A 400 for values outside the declared input_range (e.g. pixels on 0-16, not 0-1), unless
    `allow` (parameters.allow_out_of_range): then what is outside, to warn about."""
    found = outside_range(model, rows, field)
    if found and not allow:
        first = next(iter(found.values()))
        raise InvalidInput(
            f"{first}; rescale them (e.g. images on a 0-255 or 0-16 scale to 0-1), or send "
            "parameters.allow_out_of_range: true to explain them anyway with a warning",
            code="input_out_of_range",
        )
    return found


def resolve_target(model: Model, target: int | str | None) -> int | None:
    """Output index from an index or output name; None keeps the explainer default."""
    if target is None:
        return None
    if isinstance(target, str):
        if target in model.output_names:
            return model.output_names.index(target)
        raise InvalidInput(f"unknown target {target!r}; outputs are {list(model.output_names)}")
    if not 0 <= target < model.n_outputs:
        raise InvalidInput(f"target {target} out of range: the model has {model.n_outputs} outputs")
    return target


ALL = "all"


def default_target(model: Model) -> int | None:
    """The output explained when a request names none, one rule for every route (API.md
    "Default target"): a binary classifier's positive class (its second output, as shap),
    else None: each explainer's own default, a multi-class classifier's predicted class per
    row and a regressor's single output."""
    binary = model.task == "classification" and model.n_outputs == 2
    return 1 if binary else None


def resolve_targets(
    model: Model, target: int | str | list[int | str] | None
) -> int | tuple[int, ...] | None:
    """One output (as resolve_target), or several: a list of indices or names, or "all"
    (every output, in order); a tuple in the order asked (API.md "Targets over several
    classes"). An output named "all" is reached by its index."""
    if target == ALL:
        return tuple(range(model.n_outputs))
    if not isinstance(target, list):
        return resolve_target(model, target)
    if not target:
        raise InvalidInput('target: an empty list; give outputs (indices or names) or "all"')
    indices = tuple(resolve_target(model, t) for t in target)
    repeated = sorted({t for t in target if target.count(t) > 1}, key=str)
    if repeated or len(set(indices)) < len(indices):
        raise InvalidInput(f"target: each output at most once; repeated {repeated or target}")
    return tuple(i for i in indices if i is not None)
