"""YAML and JSON text -> plain Python values, strictly: what a hand-edited or hostile file can do wrong.

YAML is built from libyaml's event stream with an explicit stack instead of PyYAML's composer, which
is ~5x slower on big specs and recurses in C (100,000 nested ``[`` crash the process). On top of
PyYAML's safe loader this refuses a key written twice in one mapping (YAML keeps the last silently),
nesting deeper than ``MAX_DEPTH``, aliases that expand the document far beyond what is written
("billion laughs"), recursive aliases and more than one document. Scalars are resolved and
constructed as ``yaml.SafeLoader`` does, with three exceptions: a number with an exponent loads as a
number whatever its spelling (``1e3``, ``2.5e-3``: YAML 1.2's and JSON's numbers; YAML 1.1 reads
them as text), YAML 1.1's booleans other than true and false (``yes``, ``no``, ``on``, ``off``) load
as text, as in YAML 1.2, and a timestamp that is no time (month 13) loads as its text, so that the
key's own check names it. Merge keys (``<<: *defaults``) work as in PyYAML.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import ScalarNode

from rec.errors import show

MAX_KEYS_NAMED = 5  # of one object's keys written twice
MAX_DEPTH = 32  # a spec nests 4 deep (tables, a table, a list); JSON's own limit is ~1000
MAX_ALIAS_GROWTH = 10  # aliases may expand a document to this many times the values written ...
ALIAS_ALLOWANCE = 100_000  # ... plus this many
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_SEQ, _MAP = "tag:yaml.org,2002:seq", "tag:yaml.org,2002:map"
_MERGE = "tag:yaml.org,2002:merge"
_STR, _TIMESTAMP = "tag:yaml.org,2002:str", "tag:yaml.org,2002:timestamp"
# A number with an exponent as YAML 1.2 (and JSON) writes it; YAML 1.1, PyYAML's, wants a point and
# a signed exponent (1.0e+3) and reads 1e3 as text. Plain scalars of this form load as floats.
_EXPONENT = re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)[eE][-+]?[0-9]+")
_INT, _FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_DECIMAL = re.compile(r"[-+]?[0-9]+")
_YAML11_ONLY = re.compile(r"[:_]|^[-+]?0b")  # base 60, digit separators, binary: numbers of YAML 1.1 alone
_BOOL = "tag:yaml.org,2002:bool"
_YAML12_BOOL = re.compile(r"true|True|TRUE|false|False|FALSE")  # YAML 1.1's yes, no, on, off are YAML 1.2 text
_MERGE_KEY = object()  # the key "<<" stands for when it merges mappings (not the text "<<")
_SCALAR_TAGS = frozenset(
    f"tag:yaml.org,2002:{t}" for t in ("null", "bool", "int", "float", "str", "timestamp", "binary")
)


class DocumentError(ValueError):
    """The text is not a document shardflow reads; the message says why and where."""


def load_yaml(text: str) -> object:
    """The single YAML document in ``text`` (None if there is none); DocumentError otherwise."""
    loader = _LOADER(text)
    try:
        return _Builder(loader).document()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise DocumentError(f"not valid YAML: {e.problem or e.context}{where}") from None
    except yaml.YAMLError as e:
        raise DocumentError(f"not valid YAML: {' '.join(str(e).split())}") from None
    finally:
        loader.dispose()


def load_json(text: str | bytes, finite: bool = False) -> object:
    """The JSON value in ``text``; DocumentError for malformed JSON, a key written twice (Python's
    ``json`` and orjson keep the last silently) or deep nesting; with ``finite``, for NaN and
    Infinity too (Python's ``json`` reads them, JSON has no such numbers). Every file shardflow reads
    back goes through here."""
    try:
        if finite:
            return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
        return json.loads(text, object_pairs_hook=_unique_keys)
    except DocumentError:  # a key written twice, NaN: said as it is
        raise
    except json.JSONDecodeError as e:
        raise DocumentError(f"not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None
    except RecursionError:
        raise DocumentError("not valid JSON: nested too deeply") from None
    except ValueError as e:  # e.g. an integer of more than 4,300 digits
        raise DocumentError(f"not valid JSON: {' '.join(str(e).split())}") from None


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    d = dict(pairs)
    if len(d) != len(pairs):
        twice = [k for k, n in Counter(k for k, _ in pairs).items() if n > 1]
        names = ", ".join(show(k) for k in twice[:MAX_KEYS_NAMED])
        more = f" and {len(twice) - MAX_KEYS_NAMED} more" if len(twice) > MAX_KEYS_NAMED else ""
        verb = "are" if len(twice) > 1 else "is"
        raise DocumentError(f"the key{'s' if len(twice) > 1 else ''} {names}{more} {verb} written twice in one "
                            "object (JSON would keep only the last)")
    return d


def _no_constant(name: str) -> object:
    raise DocumentError(f"not valid JSON: {name} is no JSON number")


class _Frame:
    """A sequence or mapping being built."""

    __slots__ = ("anchor", "has_key", "is_map", "key", "line", "merges", "size", "value")

    def __init__(self, is_map: bool, anchor: str | None, line: int) -> None:
        self.value: dict[object, object] | list[object] = {} if is_map else []
        self.is_map = is_map
        self.anchor = anchor
        self.size = 1  # values in it, aliases expanded
        self.key: object = None
        self.has_key = False
        self.merges: list[dict[object, object]] = []
        self.line = line


class _Builder:
    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self.anchors: dict[str, tuple[object, int]] = {}
        self.open_anchors: set[str] = set()
        self.scalars: dict[tuple[object, ...], object] = {}  # scalars are immutable: build each spelling once
        self.written = 0
        self.expanded = 0

    def document(self) -> object:
        loader = self.loader
        loader.get_event()  # StreamStart
        if loader.check_event(yaml.StreamEndEvent):
            return None
        loader.get_event()  # DocumentStart
        root = self._node()
        loader.get_event()  # DocumentEnd
        if not loader.check_event(yaml.StreamEndEvent):
            mark = loader.peek_event().start_mark
            raise DocumentError(f"expected one YAML document, found another at line {mark.line + 1}")
        return root

    def _node(self) -> object:
        """Build one node from the event stream without recursion; return its value."""
        get = self.loader.get_event
        stack: list[_Frame] = []
        while True:
            event = get()
            kind = type(event)
            if kind is yaml.ScalarEvent:
                value, size = self._scalar(event), 1
                self.written += 1
                if event.anchor is not None:
                    self.anchors[event.anchor] = (value, 1)
            elif kind is yaml.AliasEvent:
                value, size = self._alias(event)
            elif kind is yaml.SequenceStartEvent or kind is yaml.MappingStartEvent:
                is_map = kind is yaml.MappingStartEvent
                self._check_container_tag(event, _MAP if is_map else _SEQ)
                if stack and stack[-1].is_map and not stack[-1].has_key:
                    raise DocumentError(f"line {event.start_mark.line + 1}: a mapping key must be a plain value")
                if len(stack) >= MAX_DEPTH:
                    raise DocumentError(f"line {event.start_mark.line + 1}: nested more than {MAX_DEPTH} levels deep")
                self.written += 1
                stack.append(_Frame(is_map, event.anchor, event.start_mark.line + 1))
                if event.anchor is not None:
                    self.open_anchors.add(event.anchor)
                continue
            else:  # SequenceEnd or MappingEnd
                frame = stack.pop()
                value, size = _finish(frame), frame.size
                if frame.anchor is not None:
                    self.open_anchors.discard(frame.anchor)
                    self.anchors[frame.anchor] = (value, size)
            if not stack:
                return value
            _add(stack[-1], value, size, event)

    def _scalar(self, event: Any) -> object:
        key = (event.value, event.implicit, event.tag)
        try:
            return self.scalars[key]
        except KeyError:
            pass
        tag = event.tag
        plain = tag is None
        if tag is None or tag == "!":
            tag = self.loader.resolve(ScalarNode, event.value, event.implicit)
        if plain and tag == _STR and event.implicit[0] and _EXPONENT.fullmatch(event.value):
            value: object = float(event.value)  # YAML 1.2's 1e3 and 2.5e-3: YAML 1.1 reads them as text
        elif plain and tag == _INT and _DECIMAL.fullmatch(event.value):
            value = int(event.value, 10)  # YAML 1.2's 010 is ten (YAML 1.1: eight)
        elif plain and tag in (_INT, _FLOAT) and _YAML11_ONLY.search(event.value):
            value = event.value  # YAML 1.1's 1:30 (ninety), 1_000 and 0b101: YAML 1.2 (and JSON) text
        elif plain and tag == _BOOL and not _YAML12_BOOL.fullmatch(event.value):
            value = event.value  # a table named NO, a feature named on: text, as in YAML 1.2 (and JSON)
        elif tag == _MERGE:
            value = _MERGE_KEY
        elif tag in _SCALAR_TAGS:
            node = ScalarNode(tag, event.value, event.start_mark, event.end_mark, event.style)
            try:
                value = SafeConstructor.yaml_constructors[tag](self.loader, node)
            except ValueError as e:
                if tag != _TIMESTAMP:  # e.g. an integer of more than 4,300 digits
                    raise DocumentError(f"line {event.start_mark.line + 1}: {' '.join(str(e).split())}") from None
                # A time that is no time (month 13): its text, for the key's own check to name it.
                value = event.value
        else:
            raise DocumentError(f"line {event.start_mark.line + 1}: unsupported YAML tag {tag!r}")
        self.scalars[key] = value
        return value

    def _alias(self, event: Any) -> tuple[object, int]:
        name = event.anchor
        line = event.start_mark.line + 1
        if name in self.open_anchors:
            raise DocumentError(f"line {line}: the alias *{name} refers to a value that contains it")
        if name not in self.anchors:
            raise DocumentError(f"line {line}: the alias *{name} has no anchor &{name} before it")
        value, size = self.anchors[name]
        self.written += 1
        self.expanded += size
        if self.expanded > MAX_ALIAS_GROWTH * self.written + ALIAS_ALLOWANCE:
            raise DocumentError(
                f"line {line}: aliases expand this document to more than {MAX_ALIAS_GROWTH} times the "
                "values written in it (a YAML alias bomb?)"
            )
        return value, size

    @staticmethod
    def _check_container_tag(event: Any, expected: str) -> None:
        if event.tag not in (None, "!", expected):
            raise DocumentError(f"line {event.start_mark.line + 1}: unsupported YAML tag {event.tag!r}")


def _add(frame: _Frame, value: object, size: int, event: Any) -> None:
    frame.size += size
    if not frame.is_map:
        assert isinstance(frame.value, list)
        frame.value.append(value)
        return
    if not frame.has_key:
        frame.key, frame.has_key = value, True
        return
    key, frame.has_key = frame.key, False
    mapping = frame.value
    assert isinstance(mapping, dict)
    if key is _MERGE_KEY:
        merged = value if isinstance(value, list) else [value]
        if not all(isinstance(m, dict) for m in merged):
            raise DocumentError(f"line {event.start_mark.line + 1}: '<<' merges a mapping or a list of mappings")
        frame.merges.extend(merged)  # type: ignore[arg-type]
        return
    try:
        duplicate = key in mapping
    except TypeError:  # an unhashable key built by an alias to a list or mapping
        raise DocumentError(f"line {event.start_mark.line + 1}: a mapping key must be a plain value") from None
    if duplicate:
        raise DocumentError(
            f"line {event.start_mark.line + 1}: the key {key!r} is written twice in the mapping that starts "
            f"at line {frame.line} (YAML would keep only the last)"
        )
    mapping[key] = value


def _finish(frame: _Frame) -> object:
    """The frame's value with its merges applied: written keys win, then earlier merged mappings."""
    if not frame.merges:
        return frame.value
    merged: dict[object, object] = {}
    for m in reversed(frame.merges):
        merged.update(m)
    merged.update(frame.value)  # type: ignore[arg-type]
    return merged
