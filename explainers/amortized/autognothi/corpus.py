"""Training sentences for AutoGnothi, generated from the VADER sentiment lexicon.

The lexicon (Hutto & Gilbert, ICWSM 2014: 7,520 entries with a mean valence from -4 to 4) ships
inside the PyPI package vaderSentiment (MIT licence) as `vader_lexicon.txt`, with its booster
and negation word lists in `vaderSentiment.py`: nothing is downloaded. Sentences are templates
(ours: about 30 review-like forms over a few neutral subjects) filled with lexicon words of
clear valence (|mean| >= 1), routed by their suffix to adjective, adverb, noun or verb slots.
The lexicon's words are split in two by a hash, so held-out sentences carry sentiment words
that no training sentence has.

Two held-out sets, never trained on:
- `sentences(..., held_out=True)`: the training templates with the held-out words (the
  validation set of a training run's `held_out_*` metrics; it was looked at while the training
  templates and defaults were designed, so it is not an independent check).
- `check_sentences` and `check_reviews`: CHECK_TEMPLATES, 16 sentence forms written for issue
  28 and never used to design or tune anything (different syntax: questions, imperatives,
  conditionals, comparisons, possessives), over CHECK_SUBJECTS (no training subject) and the
  held-out words; reviews are several such sentences joined, about 30 words long.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from explainers.games import ExplainerError

PACKAGE = "vaderSentiment"
SUBJECTS = (
    "movie", "food", "hotel", "staff", "book", "phone", "service", "plot", "room", "music",
    "game", "show", "meal", "trip", "class", "car", "song", "story", "team", "app", "film",
    "product", "restaurant", "experience", "acting", "ending", "price", "place", "seller", "view",
)  # fmt: skip
# Subjects of the check set only (none is a training subject).
CHECK_SUBJECTS = (
    "laptop", "concert", "waiter", "novel", "museum", "bakery", "headphones", "course",
    "apartment", "airline", "podcast", "sofa", "dentist", "festival", "camera", "pizza", "tour",
    "gym", "printer", "theater",
)  # fmt: skip
LINKS = ("was", "is", "seemed", "felt", "looked")
FILLERS = ("from start to finish", "after two days", "every time", "in the end", "again", "today")
# Short adjectives that carry no adjective suffix (only those in the lexicon are used).
# fmt: off
PLAIN_ADJECTIVES = frozenset((
    "good", "bad", "great", "nice", "fine", "poor", "sad", "glad", "cool", "fun", "best", "worst",
    "ugly", "dull", "evil", "fair", "rich", "happy", "angry", "lucky", "funny", "silly", "nasty",
    "crazy", "dirty", "proud", "calm", "kind", "weak", "warm", "free", "safe", "sick", "smart",
    "cute", "rude", "mean", "wise", "sweet", "bright",
))
# fmt: on
_ADV = re.compile(r".+ly$")
_NOUN = re.compile(r".+(ness|ment|tion|sion|ity|ism|ance|ence|ship|hood)$")
_ARTICLE = re.compile(r"\b([Aa]) (?=[aeiou])")
_ADJ = re.compile(r".+(ful|ous|ive|able|ible|less|ic|al|ed|ing|ent|ant|ish|y|ile)$")


class CorpusUnavailableError(ExplainerError):
    """The package that ships the lexicon is not installed."""


@dataclass(frozen=True)
class Lexicon:
    """Sentiment words by slot, each a tuple of (word, mean valence)."""

    adjectives: tuple[str, ...]
    adverbs: tuple[str, ...]
    nouns: tuple[str, ...]
    verbs: tuple[str, ...]
    boosters: tuple[str, ...]
    negations: tuple[str, ...]
    source: str  # package and version


def _source_dir() -> tuple[Path, str, list[str], list[str]]:
    try:
        from vaderSentiment import vaderSentiment as vader
    except ImportError as exc:
        raise CorpusUnavailableError(
            f"AutoGnothi's training sentences come from the {PACKAGE} lexicon: "
            f"pip install {PACKAGE}"
        ) from exc
    from importlib import metadata

    boosters = sorted(w for w in vader.BOOSTER_DICT if re.fullmatch(r"[a-z]{4,}", w))
    # The lexicon's negations that read naturally before a verb ("I never ...").
    negations = sorted(w for w in vader.NEGATE if w in ("never", "cannot", "rarely", "seldom"))
    version = f"{PACKAGE} {metadata.version(PACKAGE)}"
    return Path(vader.__file__).parent, version, boosters, negations


def _half(word: str) -> int:
    """0 (training) or 1 (held out), by a stable hash of the word: one word in five is held out."""
    return int(hashlib.sha256(word.encode()).hexdigest(), 16) % 5 == 0


@lru_cache(maxsize=4)
def lexicon(held_out: bool, vocabulary: frozenset[str] | None = None) -> Lexicon:
    """The lexicon's clearly valenced words of one half, by slot; with a `vocabulary` (a
    tokenizer's whole words: a proxy for common words) only the words in it."""
    folder, source, boosters, negations = _source_dir()
    known = (lambda w: w in vocabulary) if vocabulary is not None else (lambda w: True)
    entries = {}
    for line in (folder / "vader_lexicon.txt").read_text(encoding="utf-8").splitlines():
        parts = line.split("\t")
        if len(parts) >= 2 and re.fullmatch(r"[a-z]{3,}", parts[0]):
            entries[parts[0]] = float(parts[1])
    slots: dict[str, list[str]] = {"adj": [], "adv": [], "noun": [], "verb": []}
    for word, valence in entries.items():
        if abs(valence) < 1.0 or _half(word) != held_out or not known(word):
            continue
        if _ADV.match(word):
            slots["adv"].append(word)
        elif _NOUN.match(word):
            slots["noun"].append(word)
        elif _ADJ.match(word) or word in PLAIN_ADJECTIVES:
            slots["adj"].append(word)
        elif f"{word}ed" in entries or f"{word}d" in entries:  # a verb: its past form is listed
            slots["verb"].append(word)
    return Lexicon(
        tuple(slots["adj"]),
        tuple(slots["adv"]),
        tuple(slots["noun"]),
        tuple(slots["verb"]),
        tuple(w for w in boosters if known(w)),
        tuple(w for w in negations if known(w)),
        source,
    )


def _sentence(lex: Lexicon, rng: np.random.Generator) -> str:
    def pick(words: tuple[str, ...]) -> str:
        return words[int(rng.integers(len(words)))]

    subj, subj2 = pick(SUBJECTS), pick(SUBJECTS)
    adj, adj2, link = pick(lex.adjectives), pick(lex.adjectives), pick(LINKS)
    templates = (
        f"The {subj} {link} {adj}.",
        f"The {subj} {link} {pick(lex.boosters)} {adj}.",
        f"The {subj} {link} not {adj}.",
        f"The {subj} {link} {adj} but the {subj2} was {adj2}.",
        f"The {subj} {link} {adj} and the {subj2} was {adj2}.",
        f"I found the {subj} {adj} and {adj2}.",
        f"{pick(lex.adverbs).capitalize()} {adj} {subj}.",
        f"What a {pick(lex.nouns)} this {subj} was!",
        f"The {subj} was a {pick(lex.nouns)}.",
        f"I {pick(lex.verbs)} the {subj}.",
        f"I {pick(lex.negations)} {pick(lex.verbs)} this {subj}, it {link} {adj}.",
        f"Honestly, the {subj} {link} {pick(lex.adverbs)} {adj}.",
        f"A {adj} {subj} with a {adj2} {subj2}.",
        f"It was {adj}.",
        f"It {link} {pick(lex.boosters)} {adj} {pick(FILLERS)}.",
        f"Such a {adj} {subj}.",
        f"Such a {pick(lex.nouns)}.",
        f"What a {adj}, {adj2} {subj}.",
        f"I {pick(lex.verbs)} every minute of it.",
        f"I {pick(lex.verbs)} it {pick(FILLERS)}.",
        f"I am so {adj}.",
        f"We were {adj} with the {subj}.",
        f"This is the most {adj} {subj} I have ever seen.",
        f"I would not recommend this {adj} {subj} to anyone.",
        f"The {subj} and the {subj2} were {adj}.",
        f"Not {adj} at all.",
        f"The {subj} {link} {adj}, the {subj2} {adj2}.",
        f"A {adj} and {adj2} {subj} {pick(FILLERS)}.",
    )
    return templates[int(rng.integers(len(templates)))]


def _check_sentence(lex: Lexicon, rng: np.random.Generator) -> str:
    """One sentence of the check templates (never used in design or training)."""

    def pick(words: tuple[str, ...]) -> str:
        return words[int(rng.integers(len(words)))]

    subj, subj2 = pick(CHECK_SUBJECTS), pick(CHECK_SUBJECTS)
    adj, adj2 = pick(lex.adjectives), pick(lex.adjectives)
    templates = (
        f"Was the {subj} worth it? No, it was {adj}.",
        f"Avoid this {subj}, it is {adj}.",
        f"If you want a {adj} {subj}, go here.",
        f"We waited an hour and the {subj} was still {adj}.",
        f"My {subj} arrived {adj} and {adj2}.",
        f"Never again: the {subj} felt {adj}.",
        f"Five stars for the {adj} {subj}.",
        f"The {subj} could not have been more {adj}.",
        f"Everyone said the {subj} was {adj}, and they were right.",
        f"{pick(lex.adverbs).capitalize()}, the {subj} turned out {adj}.",
        f"Compared to the {subj2}, this {subj} is {adj}.",
        f"They {pick(lex.verbs)} the {subj}, and so do I.",
        f"Nothing about the {subj} was {adj}.",
        f"Our {subj} was pure {pick(lex.nouns)}.",
        f"Honest review: {adj} {subj}, {adj2} {subj2}.",
        f"The {subj} left me feeling {adj}.",
    )
    return templates[int(rng.integers(len(templates)))]


def _distinct(
    make: Callable[[np.random.Generator], str],
    count: int,
    rng: np.random.Generator,
    min_words: int,
    max_words: int,
) -> list[str]:
    from explainers.games.text import word_spans

    out: dict[str, None] = {}
    for _ in range(count * 50):
        if len(out) == count:
            break
        text = _ARTICLE.sub(r"\1n ", make(rng))  # "a awful" -> "an awful"
        if min_words <= len(word_spans(text)) <= max_words:
            out[text] = None
    return list(out)


def check_sentences(
    count: int, seed: int, max_words: int = 10, vocabulary: frozenset[str] | None = None
) -> list[str]:
    """`count` distinct sentences of the check templates, held-out words (seeded)."""
    lex = lexicon(True, vocabulary)
    rng = np.random.default_rng([seed, 2])
    return _distinct(lambda r: _check_sentence(lex, r), count, rng, 2, max_words)


def check_reviews(
    count: int, seed: int, words: int = 30, vocabulary: frozenset[str] | None = None
) -> list[str]:
    """`count` distinct reviews of `words` to `words` + 4 words: check sentences joined."""
    from explainers.games.text import word_spans

    lex = lexicon(True, vocabulary)

    def review(r: np.random.Generator) -> str:
        parts: list[str] = []
        while sum(len(word_spans(p)) for p in parts) < words:
            parts.append(_ARTICLE.sub(r"\1n ", _check_sentence(lex, r)))
        return " ".join(parts)

    rng = np.random.default_rng([seed, 3])
    return _distinct(review, count, rng, words, words + 4)


def sentences(
    count: int,
    seed: int,
    held_out: bool = False,
    max_words: int = 10,
    vocabulary: frozenset[str] | None = None,
) -> list[str]:
    """`count` distinct generated sentences of 2 to `max_words` words (seeded)."""
    lex = lexicon(held_out, vocabulary)
    rng = np.random.default_rng([seed, int(held_out)])
    return _distinct(lambda r: _sentence(lex, r), count, rng, 2, max_words)


def source() -> str:
    """The package (and version) the sentences come from."""
    return lexicon(False).source
