"""The Prometheus text exposition format (version 0.0.4), written and read in one place:
families and their samples in, text out (`write`, which every exporter of sepp-trio calls, the
way prometheus_client's exporters call `generate_latest`), and back (`parse`, for the
supervisor, which merges its children's). No I/O, no dependency."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Labels = tuple[tuple[str, str], ...]  # (name, value) pairs, in the order written


class Sample(NamedTuple):
    name: str  # the family's name, or with a histogram's _bucket, _sum or _count
    labels: Labels
    value: float  # an int is written as one ("3"); a float as Python's shortest repr


@dataclass(slots=True)
class Family:
    """One metric: its HELP and TYPE lines (None: not written) and its samples."""

    name: str
    kind: str | None  # "counter", "gauge", "histogram"
    help: str | None
    samples: list[Sample] = field(default_factory=list)

    def add(self, value: float, /, **labels: str) -> None:
        """A sample of the family itself (a counter's or a gauge's)."""
        self.samples.append(Sample(self.name, tuple(labels.items()), value))

    def add_histogram(
        self,
        bounds: Sequence[float],
        counts: Sequence[int],
        total: float,
        count: int,
        /,
        **labels: str,
    ) -> None:
        """A histogram's samples: a cumulative `_bucket` per bound (`counts` has one more,
        for +Inf), then `_sum` and `_count`."""
        base = tuple(labels.items())
        cumulative = 0
        for bound, n in zip((*bounds, math.inf), counts, strict=True):
            cumulative += n
            le = (*base, ("le", _bound_text(bound)))
            self.samples.append(Sample(f"{self.name}_bucket", le, cumulative))
        self.samples.append(Sample(f"{self.name}_sum", base, total))
        self.samples.append(Sample(f"{self.name}_count", base, count))


def write(families: Iterable[Family]) -> str:
    """The families in the text format, in the order given."""
    out: list[str] = []
    for family in families:
        if family.help is not None:
            out.append(f"# HELP {family.name} {_escape_help(family.help)}")
        if family.kind is not None:
            out.append(f"# TYPE {family.name} {family.kind}")
        for name, labels, value in family.samples:
            out.append(f"{name}{_labels_text(labels)} {_value_text(value)}")
    return "".join(line + "\n" for line in out)


def parse(text: str) -> list[Family]:
    """The families of a text `write` made (or any in the format): a sample belongs to the
    family whose HELP or TYPE came last, or, before any, to a family of its own name; lines
    that cannot be read are skipped."""
    families: dict[str, Family] = {}
    current: Family | None = None
    for line in text.split("\n"):  # not splitlines(): a label value may hold a \r
        if line.startswith(("# HELP ", "# TYPE ")):
            _, keyword, name, *rest = line.split(" ", 3)
            current = families.setdefault(name, Family(name, None, None))
            words = rest[0] if rest else ""
            if keyword == "HELP" and current.help is None:
                current.help = _unescape(words, quoted=False)
            elif keyword == "TYPE" and current.kind is None:
                current.kind = words
        elif line and not line.startswith("#"):
            sample = _parse_sample(line)
            if sample is None:
                continue
            if current is None:
                current = families.setdefault(sample.name, Family(sample.name, None, None))
            current.samples.append(sample)
    return list(families.values())


def merge(texts: dict[str, str], label: str) -> list[Family]:
    """The families of several texts (by a label value: a process's index) as one: each family
    once, with its samples from every text in turn, each labelled `label` first."""
    merged: dict[str, Family] = {}
    for value, text in texts.items():
        for family in parse(text):
            into = merged.setdefault(family.name, Family(family.name, None, None))
            into.help = into.help if into.help is not None else family.help
            into.kind = into.kind if into.kind is not None else family.kind
            into.samples += [
                Sample(name, ((label, value), *labels), number)
                for name, labels, number in family.samples
            ]
    return list(merged.values())


# -- the format's details ---------------------------------------------------------------------


def _value_text(value: float) -> str:
    if isinstance(value, int):
        return str(int(value))  # a bool too: 1 or 0
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    return repr(value)


def _bound_text(bound: float) -> str:
    """A bucket's `le`: 0.005, 1, 30, +Inf (whole bounds without a fraction)."""
    if bound == math.inf:
        return "+Inf"
    return str(int(bound)) if float(bound).is_integer() else repr(float(bound))


def _labels_text(labels: Labels) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{name}="{_escape(value)}"' for name, value in labels) + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _unescape(text: str, *, quoted: bool) -> str:
    out: list[str] = []
    chars = iter(text)
    for char in chars:
        if char != "\\":
            out.append(char)
            continue
        escaped = next(chars, "\\")
        if escaped == "n":
            out.append("\n")
        elif escaped == "\\" or (quoted and escaped == '"'):
            out.append(escaped)
        else:
            out.append("\\" + escaped)
    return "".join(out)


def _parse_sample(line: str) -> Sample | None:
    """`name{a="b",...} value [timestamp]`, or None."""
    brace, space = line.find("{"), line.find(" ")
    if brace == -1 or -1 < space < brace:
        name, _, rest = line.partition(" ")
        labels: Labels = ()
    else:
        name, rest = line[:brace], line[brace + 1 :]
        found = _parse_labels(rest)
        if found is None:
            return None
        labels, rest = found
    words = rest.split()
    if not name or not words:
        return None
    try:
        value: float = int(words[0])
    except ValueError:
        try:
            value = float(words[0])
        except ValueError:
            return None
    return Sample(name, labels, value)


def _parse_labels(text: str) -> tuple[Labels, str] | None:
    """The labels after a `{`, and the text after the closing `}`; None if malformed."""
    labels: list[tuple[str, str]] = []
    at = 0
    while True:
        while text[at : at + 1] in (" ", ","):
            at += 1
        if text[at : at + 1] == "}":
            return tuple(labels), text[at + 1 :]
        equals = text.find('="', at)
        if equals == -1:
            return None
        name, at = text[at:equals].strip(), equals + 2
        start = at
        while at < len(text) and text[at] != '"':
            at += 2 if text[at] == "\\" else 1
        if at >= len(text):
            return None
        labels.append((name, _unescape(text[start:at], quoted=True)))
        at += 1
