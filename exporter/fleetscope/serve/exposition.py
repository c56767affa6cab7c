"""The ``/metrics`` body: content negotiation, rendered once per reading, gzip served as bytes.

A scrape's body is a list of :class:`Chunk` objects, one per collector plus the
engine's self-metrics, each rendered by ``prometheus_client``'s encoders. A
background collector's chunk is rendered once per reading (in its own thread,
before the reading is published) and served unchanged until the next one, so a
scrape only joins bytes. A reading of the same series as the one before (the
usual case: values move, devices and ranks stay) is written into the previous
rendering's text around its values (:class:`Renderer`): the encoder's bytes for
a seventh of its cost.

gzip the same way: each chunk keeps its own raw-deflate form, compressed once
and ended with a sync flush (byte aligned, no back-references before its
start). Concatenated, those forms are one valid deflate stream; a scrape adds
the gzip header, an empty final block and the trailer (CRC-32 and length of the
whole text). The result is a single gzip member, which every decoder reads.
Concatenated gzip *members* would be cheaper still, but decoders built on
``zlib.decompressobj`` (httpx, for one) stop after the first member and drop
the rest without an error.
"""

from __future__ import annotations

import functools
import re
import struct
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.exposition import choose_encoder

from fleetscope.compat import (
    MOVED_SUFFIXES,
    OPENMETRICS_UNDERSCORES,
    float_text,
    openmetrics_plain_names_encoder,
    sample_parts,
)

OPENMETRICS_TYPE = "application/openmetrics-text"
OPENMETRICS_EOF = b"# EOF\n"
GZIP_LEVEL = 6  # zlib's default: a chunk is compressed once per reading, not per scrape
_GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # deflate, no name, no mtime, OS unknown
_FINAL_BLOCK = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS).flush()  # an empty last block
# Media ranges a Prometheus text format can satisfy.
_SERVABLE = frozenset({OPENMETRICS_TYPE, "text/plain", "text/*", "*/*"})
# A name no escaping scheme of "underscores" would change (a label name's alphabet: no colon either).
_PLAIN_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_VERSION = re.compile(r"version=([0-9.]+)")

Encoder = Callable[[Any], bytes]


@dataclass(frozen=True)
class Format:
    """One exposition format: its ``Content-Type`` (which names it) and ``prometheus_client``'s encoder.

    ``plain_names_encode``, when set, writes the same bytes as ``encode`` for
    families whose names all match :data:`_PLAIN_NAME`, faster: OpenMetrics with
    "underscores" escaping (what Prometheus 2 negotiates) rewrites every sample
    name one character at a time, which "allow-utf-8" escaping leaves alone.
    """

    content_type: str
    encode: Encoder
    plain_names_encode: Encoder | None = None

    @property
    def openmetrics(self) -> bool:
        return self.content_type.startswith(OPENMETRICS_TYPE)

    def encoder_for(self, metrics: Sequence[Metric]) -> Encoder:
        if self.plain_names_encode is not None and all(_plain_names(metric) for metric in metrics):
            return self.plain_names_encode
        return self.encode


def _plain_names(metric: Metric) -> bool:
    match = _PLAIN_NAME.fullmatch
    if not match(metric.name):
        return False
    return all(match(sample.name) and all(map(match, sample.labels)) for sample in metric.samples)


def _format(encoder: Encoder, content_type: str) -> Format:
    if content_type.startswith(OPENMETRICS_TYPE) and content_type.endswith(f"escaping={OPENMETRICS_UNDERSCORES}"):
        version = _VERSION.search(content_type)
        if version is not None:
            return Format(content_type, encoder, openmetrics_plain_names_encoder(version.group(1)))
    return Format(content_type, encoder)


def _media_ranges(header: str) -> list[tuple[float, int, str, str]]:
    """(q, position, media type, the range as written) for each range of an Accept-style header."""
    ranges = []
    for position, item in enumerate(header.split(",")):
        media_type, *params = (part.strip() for part in item.split(";"))
        quality = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0  # an unreadable weight does not make a range preferred
        if media_type:
            ranges.append((quality, position, media_type.lower(), item.strip()))
    return ranges


@functools.lru_cache(maxsize=64)
def negotiate(accept: str | None) -> Format:
    """The format to serve for an ``Accept`` header, honouring its q-values.

    Ranges are tried by weight (ties in the order written); ``prometheus_client``
    picks the encoder and escaping for each. A range it would answer with another
    format than the one asked for (OpenMetrics 0.0.1, which it does not write) is
    passed over. With nothing servable asked for, the classic text format, as
    Prometheus's own client libraries do.
    """
    for quality, _, media_type, text in sorted(_media_ranges(accept or ""), key=lambda r: (-r[0], r[1])):
        if quality <= 0 or media_type not in _SERVABLE:
            continue
        encoder, content_type = choose_encoder(text)
        if (media_type == OPENMETRICS_TYPE) == content_type.startswith(OPENMETRICS_TYPE):
            return _format(encoder, content_type)
    return _format(*choose_encoder(""))


@functools.lru_cache(maxsize=64)
def accepts_gzip(accept_encoding: str | None) -> bool:
    """Whether an ``Accept-Encoding`` header allows gzip (``gzip;q=0`` and ``*;q=0`` refuse it)."""
    weights = {coding: quality for quality, _, coding, _ in _media_ranges(accept_encoding or "")}
    if "gzip" in weights or "x-gzip" in weights:
        return max(weights.get("gzip", 0.0), weights.get("x-gzip", 0.0)) > 0
    return weights.get("*", 0.0) > 0


class Chunk:
    """One rendered part of an exposition and, made on first need, its raw-deflate form."""

    __slots__ = ("_deflated", "text")

    def __init__(self, text: bytes) -> None:
        self.text = text
        self._deflated: bytes | None = None

    def deflated(self) -> bytes:
        """Raw deflate of :attr:`text` ending in a sync flush: it can be followed by any other chunk's."""
        if self._deflated is None:
            compressor = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)
            self._deflated = compressor.compress(self.text) + compressor.flush(zlib.Z_SYNC_FLUSH)
        return self._deflated


EMPTY = Chunk(b"")
_EOF_CHUNK = Chunk(OPENMETRICS_EOF)


class _Families:
    """A fixed list of families, in the shape ``prometheus_client``'s encoders read (``collect()``)."""

    def __init__(self, metrics: Sequence[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> Sequence[Metric]:
        return self._metrics


def render(metrics: Sequence[Metric], fmt: Format) -> Chunk:
    """``metrics`` in ``fmt``, without OpenMetrics' ``# EOF`` (:func:`assemble` adds one at the end)."""
    if not metrics:
        return EMPTY
    return Chunk(fmt.encoder_for(metrics)(_Families(metrics)).removesuffix(OPENMETRICS_EOF))


FamilyKey = tuple[str, str, str, str, int]
MAX_TEMPLATES = 8


def _family_key(metric: Metric) -> FamilyKey:
    return metric.name, metric.type, metric.documentation, metric.unit, len(metric.samples)


class _Template:
    """A rendering cut around its sample values, to write the next reading of the same series.

    Built from the encoder's own output and checked against it: each sample line
    must be the text before the value, a space, then the value as the encoders
    write it (:data:`fleetscope.compat.float_text`), which holds for a plain sample
    (no timestamp, exemplar or native histogram). Samples the text encoder moves
    into a family of their own (:data:`fleetscope.compat.MOVED_SUFFIXES`) are never
    cut into a template. A
    reading whose families and series match (names, types, help, units, labels,
    in order) gets its values put between the same pieces of text.
    """

    __slots__ = ("families", "keys", "pieces")

    def __init__(self, families: list[FamilyKey], keys: list[tuple[str, dict[str, str]]], pieces: list[str]) -> None:
        self.families = families
        self.keys = keys
        self.pieces = pieces  # one more than there are values: the text around them

    @classmethod
    def build(cls, metrics: Sequence[Metric], text: str) -> _Template | None:
        families: list[FamilyKey] = []
        keys: list[tuple[str, dict[str, str]]] = []
        values: list[float] = []
        for metric in metrics:
            families.append(_family_key(metric))
            for name, labels, value, plain in sample_parts(metric):
                if not plain or name.endswith(MOVED_SUFFIXES):
                    return None
                keys.append((name, labels))
                values.append(value)
        pieces: list[str] = []
        pending: list[str] = []
        for line in text.split("\n")[:-1]:
            if line.startswith("#"):
                pending.append(line + "\n")
                continue
            prefix, _, value_text = line.rpartition(" ")
            if len(pieces) >= len(values) or value_text != float_text(values[len(pieces)]):
                return None
            pending.append(prefix + " ")
            pieces.append("".join(pending))
            pending = ["\n"]
        if len(pieces) != len(values):
            return None
        pieces.append("".join(pending))
        return cls(families, keys, pieces)

    def fill(self, metrics: Sequence[Metric]) -> str | None:
        """The rendering of ``metrics``, or None when their series are not this template's."""
        if len(metrics) != len(self.families):
            return None
        keys = self.keys
        values: list[str] = []
        for metric, family in zip(metrics, self.families, strict=True):
            if _family_key(metric) != family:
                return None
            for name, labels, value, plain in sample_parts(metric):
                key = keys[len(values)]  # in range: the family keys hold the sample counts
                if key[0] != name or key[1] != labels or not plain:
                    return None
                values.append(float_text(value))
        out = [""] * (2 * len(values) + 1)
        out[0::2] = self.pieces
        out[1::2] = values
        return "".join(out)


class Renderer:
    """Renders one source's families, per format, from the last rendering's template when it fits."""

    def __init__(self) -> None:
        self._templates: dict[str, _Template] = {}

    def render(self, metrics: Sequence[Metric], fmt: Format) -> Chunk:
        if not metrics:
            return EMPTY
        template = self._templates.get(fmt.content_type)
        if template is not None:
            try:
                text = template.fill(metrics)
            except (TypeError, ValueError):  # a value that is no number: the encoder says what is wrong
                text = None
            if text is not None:
                return Chunk(text.encode("utf-8"))
        chunk = render(metrics, fmt)
        fresh = _Template.build(metrics, chunk.text.decode("utf-8"))
        self._templates.pop(fmt.content_type, None)
        if fresh is not None:
            self._templates[fmt.content_type] = fresh
            while len(self._templates) > MAX_TEMPLATES:  # Accept headers can name any version
                self._templates.pop(next(iter(self._templates)), None)
        return chunk


def assemble(chunks: Iterable[Chunk], fmt: Format, compressed: bool) -> bytes:
    """The whole body: chunks in order (they hold disjoint metric names), gzip-framed when ``compressed``."""
    parts = [chunk for chunk in chunks if chunk.text]
    if fmt.openmetrics:
        parts.append(_EOF_CHUNK)
    if not compressed:
        return b"".join(chunk.text for chunk in parts)
    crc = 0
    size = 0
    for chunk in parts:
        crc = zlib.crc32(chunk.text, crc)
        size += len(chunk.text)
    body = [_GZIP_HEADER, *(chunk.deflated() for chunk in parts), _FINAL_BLOCK]
    body.append(struct.pack("<II", crc, size & 0xFFFFFFFF))
    return b"".join(body)
