"""The base of every explainer's options: one strictness and one echo rule (DESIGN.md 4.4).

Strict: unknown keys fail (`extra="forbid"`) and values are not coerced: `"3"` for a number,
`1` for a bool or `"true"` for a bool is a 422, for every explainer alike. Ints are accepted
where a float is asked for (pydantic's strict mode allows that one widening).

Where an option applies: every option field declares it, `Annotated[type, AppliesTo(...)]`
(the modalities it fits, and the values of other options it needs). Two functions read those
declarations: `check_applies` is the one "does not apply" error (an option set for a modality it
does not fit), `echo` the one echo.

Echo: a response echoes every option after defaults, JSON-ready, less the options that do not
apply to the request at hand (an image-only option on a tabular model, say); `echo` is the one
place that makes that dictionary. An echo is lean: an array of more than MAX_ECHO_NUMBERS
numbers (a baseline image, say) is echoed as its digest and shape (`compact`).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from explainers.explanation import OptionError
from models.modality import Modality

MAX_ECHO_NUMBERS = 64  # meta.parameters never echoes a longer array of numbers


def digest(values: Any) -> str:
    """16 hex characters of the SHA-256 of the numbers as little-endian float64, row-major: the
    same for the same numbers, whatever nesting or dtype they came in."""
    data = np.ascontiguousarray(np.asarray(values, dtype="<f8")).tobytes()
    return hashlib.sha256(data).hexdigest()[:16]


def array_echo(values: Any) -> Any:
    """A number array as JSON: its values up to MAX_ECHO_NUMBERS numbers, else
    {"digest": digest(values), "shape": [...]}."""
    a = np.asarray(values, dtype=np.float64)
    if a.size <= MAX_ECHO_NUMBERS:
        return a.tolist()
    return {"digest": digest(a), "shape": list(a.shape)}


def _numbers(value: list[Any]) -> np.ndarray | None:
    """The list as a regular array of numbers (no bools), else None."""
    try:
        a = np.asarray(value)
    except ValueError:  # ragged
        return None
    return a if a.dtype.kind in "iuf" and a.size > 0 else None


def compact(value: Any) -> Any:
    """The JSON-ready `value` with every list of more than MAX_ECHO_NUMBERS numbers (at any
    depth, nested lists included) replaced by its digest and shape (`array_echo`)."""
    if isinstance(value, dict):
        return {k: compact(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        numbers = _numbers(list(value)) if len(value) else None
        if numbers is not None and numbers.size > MAX_ECHO_NUMBERS:
            return array_echo(numbers)
        return [compact(v) for v in value]
    return value


@dataclass(frozen=True)
class AppliesTo:
    """Where an option applies, declared on its field: `Annotated[int, AppliesTo(...)]`.

    `modalities`: the models it fits (empty: every modality its explainer serves); set for
    another, it is an error (`check_applies`) and it is not echoed. `when`: the values other
    options (or request facts the explainer passes as `values`) must take for it to be used,
    name -> allowed values (a list option: one of them among its items); otherwise it is not
    echoed, and with `strict` setting it is an error too. `echoed=False`: never echoed (rows
    that are in the cache key but too long for meta.parameters).
    """

    modalities: frozenset[Modality] = frozenset()
    when: tuple[tuple[str, frozenset[Any]], ...] = ()
    strict: bool = False
    echoed: bool = True

    def fits(self, modality: Modality | None) -> bool:
        """True when the option fits models of `modality` (None: every one)."""
        return modality is None or not self.modalities or modality in self.modalities

    def used(self, values: Mapping[str, Any]) -> bool:
        """True when every `when` condition holds for `values` (name -> value)."""
        for name, allowed in self.when:
            value = values[name]
            items = value if isinstance(value, list) else [value]
            if not any(v in allowed for v in items):
                return False
        return True

    def describe(self, noun: str = "models") -> str:
        """Where the option applies, in words (for error messages)."""
        where = [" and ".join(sorted(self.modalities)) + f" {noun}"] if self.modalities else []
        for name, allowed in self.when:
            where.append(f"{name} {' or '.join(repr(v) for v in sorted(allowed, key=str))}")
        return ", ".join(where) or "every model"


def applies(
    *modalities: Modality,
    when: Mapping[str, Collection[Any]] | None = None,
    strict: bool = False,
    echoed: bool = True,
) -> AppliesTo:
    """AppliesTo(modalities, when) from positional modalities and a plain mapping."""
    conditions = tuple((name, frozenset(values)) for name, values in (when or {}).items())
    return AppliesTo(frozenset(modalities), conditions, strict, echoed)


EVERYWHERE = AppliesTo()  # every model the explainer serves, whatever the other options
ARRAYS = applies(Modality.TABULAR, Modality.IMAGE)  # tabular and image models (not text)
IMAGES = applies(Modality.IMAGE)
TEXTS = applies(Modality.TEXT)


@functools.cache
def declarations(options: type[BaseModel]) -> dict[str, AppliesTo]:
    """Each option field's AppliesTo (fields without one are missing: a test finds them); read
    once per options class (every request's check and echo ask)."""
    found: dict[str, AppliesTo] = {}
    for name, info in options.model_fields.items():
        marks = [m for m in info.metadata if isinstance(m, AppliesTo)]
        if marks:
            found[name] = marks[-1]
    return found


class ExplainerOptions(BaseModel):
    """Options of one explainer: strict pydantic fields with their defaults, each declaring
    where it applies (AppliesTo)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    def _where(self) -> dict[str, AppliesTo]:
        return declarations(type(self))

    def _values(self, values: Mapping[str, Any] | None) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in type(self).model_fields}, **(values or {})}

    def check_applies(
        self,
        modality: Modality,
        *,
        values: Mapping[str, Any] | None = None,
        noun: str = "models",
    ) -> None:
        """The one "does not apply" error: OptionError naming the options the request set that
        do not fit `modality` ("<modality> <noun>": COCOA's are "text encoders"), else the
        first set `strict` one whose `when` fails for the options and `values` (values the
        explainer resolved, e.g. players 'auto' -> 'patches')."""
        where, set_ = self._where(), self.model_fields_set
        misfits = sorted(n for n in set_ if n in where and not where[n].fits(modality))
        if misfits:
            verb = "does" if len(misfits) == 1 else "do"
            hint = "; ".join(f"{n}: {where[n].describe(noun)} only" for n in misfits)
            raise OptionError(f"{misfits} {verb} not apply to {modality} {noun} ({hint})")
        current = self._values(values)
        for name in sorted(set_):
            rule = where.get(name)
            if rule is not None and rule.strict and not rule.used(current):
                raise OptionError(f"{name} applies to {rule.describe(noun)} only")

    def echo(
        self,
        modality: Modality | None = None,
        *,
        values: Mapping[str, Any] | None = None,
        drop: Iterable[str] = (),
    ) -> dict[str, Any]:
        """The options as applied (defaults filled in), less those that do not apply: that do
        not fit `modality` (None: no modality rule), whose `when` fails for the options and
        `values`, never echoed, or named in `drop` (an explainer's own rule); arrays of more
        than MAX_ECHO_NUMBERS numbers as their digest and shape."""
        where, current = self._where(), self._values(values)
        left_out = set(drop) | {
            name
            for name, rule in where.items()
            if not rule.echoed or not rule.fits(modality) or not rule.used(current)
        }
        dumped: dict[str, Any] = compact(self.model_dump(mode="json", exclude=left_out))
        return dumped
