"""Reading a spec file: text -> YAML data, with the limits an untrusted file needs.

A spec is written by one team and loaded by the code location that serves every team, so
reading one file must end in its data or in a problem that names the place, never in an
exception that takes the other pipelines down (issue 27):

- the bytes must be UTF-8 (spec_base.read_utf8 decodes them, naming the first bad byte's place);
- a mapping may not name a key twice (PyYAML keeps the last silently; the problem names
  both lines);
- values may nest at most MAX_DEPTH levels (PyYAML's composer recurses once per level, so
  a file of 10,000 `[` ended in a RecursionError), and the data, once YAML aliases are
  expanded, holds at most MAX_VALUES values (a few aliases of aliases make billions);
- the file is at most MAX_BYTES long (checked before it is read).
"""

from __future__ import annotations

from typing import Any

import yaml

MAX_BYTES = 1_000_000
MAX_DEPTH = 32
MAX_VALUES = 100_000
MERGE_TAG = "tag:yaml.org,2002:merge"


class YamlProblem(Exception):
    """The file is not a usable YAML document: where (line/column), what, and what to do."""

    def __init__(self, where: str, message: str, hint: str = ""):
        super().__init__(f"{where}: {message}")
        self.where, self.message, self.hint = where, message, hint


def _at(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""


class _SpecLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys and nesting deeper than MAX_DEPTH."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise YamlProblem(
                    _at(self.peek_event().start_mark),
                    f"values are nested more than {MAX_DEPTH} levels deep",
                    "a spec nests a few levels (sources.<name>.fields.<field>): flatten the value",
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                if key_node.tag == MERGE_TAG:
                    continue  # `<<: *defaults` then a key of its own: an override YAML allows
                try:
                    key = self.construct_object(key_node, deep=True)
                    first = seen.setdefault(key, key_node)
                except TypeError:
                    continue  # an unhashable key: the constructor names it below
                if first is not key_node:
                    shown = key_node.value if isinstance(key_node, yaml.ScalarNode) else key
                    raise YamlProblem(
                        _at(key_node.start_mark),
                        f"key {shown!r} is given twice in one mapping (lines {first.start_mark.line + 1} "
                        f"and {key_node.start_mark.line + 1}); YAML would keep only the last",
                        "remove one of them",
                    )
        return super().construct_mapping(node, deep=deep)


_SpecLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _SpecLoader.construct_mapping)


def _check_size(data: Any) -> None:
    """At most MAX_VALUES values and MAX_DEPTH levels once aliases are expanded (iteratively: no recursion)."""
    count = 0
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise YamlProblem(
                "",
                f"the spec holds more than {MAX_VALUES:,} values once YAML aliases are expanded",
                "write it out plainly",
            )
        if depth > MAX_DEPTH:
            raise YamlProblem("", f"values are nested more than {MAX_DEPTH} levels deep (through YAML aliases)", "")
        if isinstance(value, dict):
            stack.extend((item, depth + 1) for pair in value.items() for item in pair)
        elif isinstance(value, list):
            stack.extend((item, depth + 1) for item in value)


def load_yaml(text: str) -> Any:
    """The spec's data from the file's text (spec_base.read_utf8); YamlProblem when it cannot be used."""
    if len(text) > MAX_BYTES:
        raise YamlProblem("", f"the file is {len(text):,} characters, more than a spec's maximum of {MAX_BYTES:,}")
    try:
        loader = _SpecLoader(text)  # its reader refuses control characters here, before any parsing
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        raise YamlProblem(
            f"line {line}, column {column}",
            f"character U+{exc.character:04X} is not allowed in YAML" if isinstance(exc.character, int) else str(exc),
            "remove it (a control character, often pasted by accident)",
        ) from None
    try:
        data = loader.get_single_data()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise YamlProblem(_at(mark), f"invalid YAML: {getattr(exc, 'problem', None) or exc}", "") from None
    except RecursionError:  # MAX_DEPTH stops nesting first; kept so that no input ends in a traceback
        raise YamlProblem("", "the YAML is nested too deeply to read", "flatten the value") from None
    except YamlProblem:
        raise  # ours, from the loader (a key given twice, nesting): it names the place
    except Exception as exc:  # a scalar PyYAML fails to build (2026-02-30, !!int abc, !!timestamp 1-1-1)
        raise YamlProblem("", f"a value YAML cannot read: {str(exc)[:200]}", "quote it to keep it as text") from None
    finally:
        loader.dispose()
    _check_size(data)
    return data
