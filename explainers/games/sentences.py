"""Offline sentence splitting and the paragraph/sentence tree of an LLM context (AttriBoT).

A small rule-based splitter (no data files, nothing downloaded): a sentence ends at `.`, `!`
or `?` (plus closing quotes/brackets) followed by whitespace and an upper-case letter, a digit
or an opening quote, unless the word before the stop is a known abbreviation or an initial.
Paragraphs are the non-empty lines of the context. As in AttriBoT (Liu, Kandpal & Raffel,
ICLR 2025), a context without some spans is rebuilt from the tree: kept sentences joined by
" ", kept paragraphs by "\n\n".
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from explainers.explanation import OptionError, Span

_ABBREVIATIONS = frozenset(
    [
        "mr",
        "mrs",
        "ms",
        "dr",
        "prof",
        "sr",
        "jr",
        "st",
        "vs",
        "etc",
        "e.g",
        "i.e",
        "cf",
        "no",
        "fig",
        "al",
        "approx",
        "dept",
        "est",
        "inc",
        "ltd",
        "co",
        "corp",
        "jan",
        "feb",
        "mar",
        "apr",
        "jun",
        "jul",
        "aug",
        "sep",
        "sept",
        "oct",
        "nov",
        "dec",
        "mt",
        "ft",
    ]
)
# A candidate boundary: the stop, closing punctuation, whitespace, then a sentence opener.
_BOUNDARY = re.compile(r"[.!?]+[\"'”’)\]]*(?=\s+[\"'“‘(\[]?[A-Z0-9])")
_WORD_BEFORE = re.compile(r"(\S+)$")


def split_sentences(text: str) -> list[tuple[int, int]]:
    """Character spans (start, end) of the sentences of `text`, whitespace excluded."""
    spans: list[tuple[int, int]] = []
    start = 0
    for m in _BOUNDARY.finditer(text):
        word = _WORD_BEFORE.search(text, 0, m.start())
        token = word.group(1).lower().lstrip("\"'“‘([") if word else ""
        if m.group().startswith(".") and (
            token in _ABBREVIATIONS or (len(token) == 1 and token.isalpha())
        ):
            continue  # "Dr. Smith", "J. Doe": not an end
        spans.append((start, m.end()))
        start = m.end()
    spans.append((start, len(text)))
    out = []
    for s, e in spans:  # trim whitespace; drop empty pieces
        piece = text[s:e]
        lead = len(piece) - len(piece.lstrip())
        trail = len(piece) - len(piece.rstrip())
        if e - trail > s + lead:
            out.append((s + lead, e - trail))
    return out


@dataclass(frozen=True)
class ContextTree:
    """Paragraphs of sentences; `text` is the canonical context all offsets refer to."""

    text: str
    paragraphs: tuple[Span, ...]
    sentences: tuple[Span, ...]
    paragraph_of: tuple[int, ...]  # sentence index -> paragraph index

    def sentences_in(self, paragraph: int) -> list[int]:
        return [j for j, p in enumerate(self.paragraph_of) if p == paragraph]

    def without(self, removed: set[int] | frozenset[int]) -> str:
        """The context with the sentences in `removed` deleted (empty paragraphs vanish)."""
        paragraphs = []
        for p in range(len(self.paragraphs)):
            kept = [self.sentences[j].text for j in self.sentences_in(p) if j not in removed]
            if kept:
                paragraphs.append(" ".join(kept))
        return "\n\n".join(paragraphs)


def build_tree(context: str | Sequence[str]) -> ContextTree:
    """The tree of a context: a string (paragraphs = its non-empty lines) or a paragraph list.

    Whitespace is canonical in `text`: sentences joined by " ", paragraphs by "\n\n". A
    context already written that way is unchanged, so offsets fit the caller's own string.
    """
    if isinstance(context, str):
        raw = [line for line in context.split("\n") if line.strip()]
    else:
        raw = list(context)  # an empty paragraph stays: a zero-width span that scores 0
    if not any(p.strip() for p in raw):
        raise OptionError("context is empty")
    paragraphs: list[Span] = []
    sentences: list[Span] = []
    paragraph_of: list[int] = []
    pieces: list[str] = []
    offset = 0
    for p, para in enumerate(raw):
        texts = [para[s:e] for s, e in split_sentences(para)] if para.strip() else []
        if texts and any(pieces):
            offset += 2  # "\n\n"
        p_start = offset
        for k, sentence in enumerate(texts):
            if k:
                offset += 1  # " "
            sentences.append(Span(sentence, offset, offset + len(sentence)))
            paragraph_of.append(p)
            offset += len(sentence)
        joined = " ".join(texts)
        pieces.append(joined)
        paragraphs.append(Span(joined, p_start, offset))
    text = "\n\n".join(piece for piece in pieces if piece)
    return ContextTree(text, tuple(paragraphs), tuple(sentences), tuple(paragraph_of))
