"""The host spec as the administrator wrote it: its YAML read with the line and column of
every key and value (yaml's compose API keeps the node tree and its marks), so that each
problem spec.py finds, named by its path (`caches[0].filesystem.mode`), is reported at
`file:line:col`, as compilers and yamllint report; and hints for YAML's traps: an
unquoted 0755 is the octal number 493, yes/no/on/off are booleans, a tab cannot indent,
and a key given twice silently loses its first value."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from hotcache.provision.errors import SpecError

Loc = tuple[str | int, ...]
HINT = "fix these and run `hotcache plan` again"
_TAGS = {f"tag:yaml.org,2002:{t}": t for t in ("int", "float", "bool", "null")}


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the spec, where it is and what. `at_key`: point at the key
    (one that is unknown or given twice) rather than its value; `wants_text`: a string
    was expected there, so a plain scalar YAML read as a number or boolean gets a hint."""

    loc: Loc
    message: str
    at_key: bool = False
    wants_text: bool = False


def yaml_path(loc: Loc) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def parse_path(path: str) -> Loc:
    """`caches[1].filesystem.mountpoint` -> ("caches", 1, "filesystem", "mountpoint")."""
    return tuple(int(index) if index else key
                 for key, index in re.findall(r"([^.\[\]]+)|\[(\d+)\]", path))


class Document:
    """A spec's text, its data (what yaml.safe_load gives) and its node tree."""

    def __init__(self, text: str, source: str):
        self.source = source
        loader = yaml.SafeLoader(text)
        try:
            self.root: Node | None = loader.get_single_node()
            self.data: Any = loader.construct_document(self.root) if self.root else None
        except yaml.YAMLError as exc:
            raise _syntax_error(exc, text, source) from None
        finally:
            loader.dispose()

    def resolved(self, loc: Loc) -> Loc:
        """The longest start of `loc` that names a node of the document: pydantic adds
        parts of its own (`size.int`, `size.str` for the two sides of `int | str`)."""
        return loc[:len(self._walk(loc))]

    def _walk(self, loc: Loc) -> list[tuple[Node | None, Node]]:
        """(key node, value node) for each part of `loc` found, from the top."""
        found: list[tuple[Node | None, Node]] = []
        node = self.root
        for part in loc:
            nxt: tuple[Node | None, Node] | None = None
            if isinstance(node, MappingNode):
                for key, value in node.value:       # the last one wins, as in the data
                    if isinstance(key, ScalarNode) and key.value == str(part):
                        nxt = (key, value)
            elif isinstance(node, SequenceNode) and isinstance(part, int) \
                    and 0 <= part < len(node.value):
                nxt = (None, node.value[part])
            if nxt is None:
                break
            found.append(nxt)
            node = nxt[1]
        return found

    def where(self, problem: Problem) -> tuple[int, int] | None:
        """1-based line and column: of the value, of the key (`at_key`), or for a key
        that is missing, of the key whose value lacks it."""
        if self.root is None:
            return None
        found = self._walk(problem.loc)
        if len(found) == len(problem.loc) and found:
            key, value = found[-1]
            mark = (key if problem.at_key and key is not None else value).start_mark
        elif found:
            key, value = found[-1]
            mark = (key or value).start_mark
        else:
            mark = self.root.start_mark
        return mark.line + 1, mark.column + 1

    def trap(self, problem: Problem) -> str | None:
        """The hint for a value YAML read as something else than the text it looks like."""
        found = self._walk(problem.loc)
        if not problem.wants_text or len(found) != len(problem.loc) or not found:
            return None
        node = found[-1][1]
        if not isinstance(node, ScalarNode) or node.style is not None:
            return None
        kind, text = _TAGS.get(node.tag), node.value
        if kind is None:
            return None
        if kind == "null":
            return "the value is empty, which YAML reads as null: give one"
        value = yaml.safe_load(text)
        if kind == "bool":
            read = f"the boolean {str(value).lower()} (yes/no/on/off are booleans in YAML)"
        elif kind == "int" and re.fullmatch(r"[-+]?0[0-7_]+", text):
            read = f"the octal number {value}"
        else:
            read = f"the number {value}"
        return f"YAML reads an unquoted {text} as {read}: write it in quotes, '{text}'"

    def duplicates(self) -> list[Problem]:
        """Keys given twice in one mapping: YAML keeps the last value without a word."""
        out: list[Problem] = []

        def visit(node: Node | None, loc: Loc) -> None:
            if isinstance(node, SequenceNode):
                for i, item in enumerate(node.value):
                    visit(item, (*loc, i))
            if not isinstance(node, MappingNode):
                return
            first: dict[str, int] = {}
            for key, value in node.value:
                if isinstance(key, ScalarNode):
                    if key.value in first:
                        out.append(Problem(
                            (*loc, key.value), f"given twice (first on line "
                            f"{first[key.value]}); YAML keeps only the last: remove one",
                            at_key=True))
                    first.setdefault(key.value, key.start_mark.line + 1)
                    visit(value, (*loc, key.value))
        visit(self.root, ())
        return out

    def error(self, problems: list[Problem]) -> SpecError:
        """One error with every problem, in the order they appear in the file."""
        located = []
        for p in problems:
            hint = self.trap(p)
            located.append((self.where(p), f"{yaml_path(p.loc)}: {p.message}"
                                           + (f"; {hint}" if hint else "")))
        located.sort(key=lambda item: item[0] or (0, 0))
        return SpecError(self.source, [text for _, text in located], hint=HINT,
                         locations=[where for where, _ in located])


def _syntax_error(exc: yaml.YAMLError, text: str, source: str) -> SpecError:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    hint = "start from a file in examples/ and check the indentation"
    if mark is not None:
        line = text.splitlines()[mark.line] if mark.line < len(text.splitlines()) else ""
        if "\\t" in problem or "\t" in line[:len(line) - len(line.lstrip())] \
                or "\t" in line[max(0, mark.column - 1):mark.column + 1]:
            hint = "YAML does not allow tabs for indentation: indent with spaces"
    where = (mark.line + 1, mark.column + 1) if mark is not None else None
    return SpecError(source, [f"not valid YAML ({problem})"], hint=hint, locations=[where])
