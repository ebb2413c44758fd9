"""TBX (ISO 30042) read for a glossary (glossary.py `Glossary.from_tbx`): the XML parsed by
expat with what defusedxml forbids by default refused (entity declarations, external entities; a
DOCTYPE allowed, nothing in it loaded), elements as Nodes with their lines, and the terms of a
language section with their status."""
from __future__ import annotations

import xml.parsers.expat as expat
from dataclasses import dataclass, field

from xform.errors import InputError

TBX_NAMESPACE = "urn:iso:std:iso:30042:ed-2"
XML_LANG = "http://www.w3.org/XML/1998/namespace lang"  # xml:lang, as expat names it with namespaces
CONCEPTS = {"termEntry", "conceptEntry"}
LANGUAGES = {"langSet", "langSec"}
GROUPS = {"tig", "ntig", "termSec"}
PREFERRED, DEPRECATED = "preferredterm", ("deprecatedterm", "supersededterm")


def refused(where: str, what: str) -> InputError:
    """An InputError naming the glossary setting ({glossary}, a door's flag or keyword) and where."""
    return InputError(f"{{glossary}} {where}: {what}").naming("glossary")


def preferred(terms: list[tuple[str, str, int]]) -> str | None:
    """The term a language's section is translated into: the first preferred one, else the first
    neither deprecated nor superseded."""
    for term, status, _ in terms:
        if status.startswith(PREFERRED):
            return term
    return next((term for term, status, _ in terms if not status.startswith(DEPRECATED)), None)


# -- XML -----------------------------------------------------------------------------------------
@dataclass
class Node:
    tag: str
    attrs: dict
    line: int
    children: list["Node"] = field(default_factory=list)
    text: list[str] = field(default_factory=list)

    def iter(self, tags: set[str]):
        """Descendants whose local name is in tags (not below one that is)."""
        for child in self.children:
            if local(child.tag) in tags:
                yield child
            else:
                yield from child.iter(tags)

    def all_text(self) -> str:
        return "".join(self.text) + "".join(c.all_text() for c in self.children)


def local(tag: str) -> str:
    return tag.rsplit(" ", 1)[-1]


class Refused(Exception):
    pass


def parse_xml(data: bytes | str, name: str) -> Node:
    """The element tree of an XML document (expat; entity declarations and external entities
    refused, nothing of a DOCTYPE loaded), each element with its line."""
    parser = expat.ParserCreate(namespace_separator=" ")
    stack: list[Node] = []
    roots: list[Node] = []

    def start(tag, attrs):
        node = Node(tag, attrs, parser.CurrentLineNumber)
        (stack[-1].children if stack else roots).append(node)
        stack.append(node)

    def end(tag):
        stack.pop()

    def chars(data):
        if stack:
            if stack[-1].children:  # text after a child: kept in order as a text-only child
                stack[-1].children.append(Node("", {}, parser.CurrentLineNumber, text=[data]))
            else:
                stack[-1].text.append(data)

    def no_entities(*args):
        raise Refused("an entity declaration (refused: entities are not read from glossaries)")

    def no_external(*args):
        raise Refused("an external entity (refused: nothing outside the file is read)")

    def skipped(entity, is_parameter):
        raise Refused(f"an undefined entity &{entity}; (refused: entities are not read from glossaries)")

    parser.StartElementHandler, parser.EndElementHandler, parser.CharacterDataHandler = start, end, chars
    parser.EntityDeclHandler = parser.UnparsedEntityDeclHandler = no_entities
    parser.ExternalEntityRefHandler = no_external
    parser.SkippedEntityHandler = skipped
    try:
        parser.Parse(data.encode("utf-8") if isinstance(data, str) else data, True)
    except Refused as e:
        raise refused(f"{name}, line {parser.CurrentLineNumber}", str(e)) from None
    except expat.ExpatError as e:
        raise refused(f"{name}, line {e.lineno}", f"not well-formed XML ({expat.ErrorString(e.code)}, "
                                                  f"column {e.offset + 1})") from None
    return roots[0]


def lang_set_terms(lang_set: Node):
    """(term, administrative status lower-cased, line) of each term group of a language section."""
    for child in lang_set.children:
        tag = local(child.tag)
        if tag == "term":
            yield " ".join(child.all_text().split()), "", child.line
        elif tag in GROUPS:
            term = next(iter_local(child, "term"), None)
            if term is None:
                continue
            yield " ".join(term.all_text().split()), status_of(child), term.line


def iter_local(node: Node, tag: str):
    for child in node.children:
        if local(child.tag) == tag:
            yield child
        yield from iter_local(child, tag)


def status_of(group: Node) -> str:
    for node in iter_local(group, "termNote"):
        if node.attrs.get("type") == "administrativeStatus":
            return node.all_text().strip().casefold()
    node = next(iter_local(group, "administrativeStatus"), None)  # TBX v3 DCT style
    return node.all_text().strip().casefold() if node is not None else ""


# -- do not translate ---------------------------------------------------------------------------
