"""The XPath selectors of RFC 5261 XML patches: their grammar, a bounded parser, and rendering.

An XML patch's `sel` is parsed here, before anything evaluates it, into a `LocationPath`, and
only that parsed form is evaluated (sis_platform.domain.xmlpatch) or analysed
(sis_platform.domain.patchscope). What is accepted is the location path subset of RFC 5261
section 3.1, whose section 8 schema gives the `xpath` types as regular expressions:

    sel       := '/'? ( id ( '/' step )* ( '/' last )? | ( step '/' )* ( step | last ) )
    id        := 'id(' literal ')'
    step      := ( QName | '*' ) predicate*
    predicate := '[' ( digits | '@' QName '=' literal | QName '=' literal
                     | '.' '=' literal | 'text()' '=' literal ) ']'
    last      := '@' QName | 'namespace::' NCName
               | ( 'text()' | 'comment()' | 'processing-instruction(' literal? ')' )
                 ( '[' digits ']' )?

(`[text()='v']` is not in the RFC's patterns; it is the text-node form of the `.` test, and as
cheap.) Whitespace is allowed between tokens, as XPath 1.0 allows it. Everything else XPath 1.0
has (`//` and other axes, functions, operators, unions, variables, numbers other than a
position) is refused: with general XPath a selector of a few hundred bytes can nest
`count(//*)` calls and cost the size of the document to the power of the nesting depth. Within
the subset every step selects among the children of the nodes the previous step selected, and
every predicate reads one node's attributes, children or text, so evaluating a selector costs
at most its step count times the size of the document.

Bounds (sis_platform.domain.limits): a `sel` longer than `max_selector_length` characters is
refused before it is read, and parsing stops as soon as the location steps plus predicates (an
`id()` start counts as a step) exceed `max_selector_steps`. Both raise `SelectorTooComplex`;
anything outside the grammar raises `SelectorSyntaxError`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Final, Literal, TypeAlias

from sis_platform.domain.limits import DEFAULT_LIMITS, Limits

__all__ = [
    "NCNAME",
    "AttributeEquals",
    "AttributeStep",
    "ChildEquals",
    "ElementStep",
    "LastStep",
    "LocationPath",
    "NamespaceStep",
    "NodeStep",
    "Position",
    "Predicate",
    "QName",
    "SelectorError",
    "SelectorSyntaxError",
    "SelectorTooComplex",
    "SelfEquals",
    "TextEquals",
    "literal",
    "parse_selector",
    "render_last",
    "render_steps",
]


class SelectorError(ValueError):
    """A `sel` that is not evaluated."""


class SelectorSyntaxError(SelectorError):
    """A `sel` outside the RFC 5261 selector grammar."""


class SelectorTooComplex(SelectorError):
    """A `sel` over `Limits.max_selector_length` or `Limits.max_selector_steps`."""


@dataclass(frozen=True, slots=True)
class QName:
    """A name test: `prefix` is "" when unprefixed; `local` is "*" for any element."""

    prefix: str
    local: str


@dataclass(frozen=True, slots=True)
class Position:
    """`[3]`: the node at this position (from 1) among those its step selects per parent."""

    index: int


@dataclass(frozen=True, slots=True)
class AttributeEquals:
    """`[@name='value']`."""

    name: QName
    value: str


@dataclass(frozen=True, slots=True)
class ChildEquals:
    """`[name='value']`: some child element `name` has this string value."""

    name: QName
    value: str


@dataclass(frozen=True, slots=True)
class SelfEquals:
    """`[.='value']`: the node's string value (all its descendant text) is this."""

    value: str


@dataclass(frozen=True, slots=True)
class TextEquals:
    """`[text()='value']`: some text node child is this."""

    value: str


Predicate: TypeAlias = Position | AttributeEquals | ChildEquals | SelfEquals | TextEquals


@dataclass(frozen=True, slots=True)
class ElementStep:
    """A child step selecting elements by name, filtered by predicates in order."""

    name: QName
    predicates: tuple[Predicate, ...] = ()


@dataclass(frozen=True, slots=True)
class AttributeStep:
    """A final `@name` step."""

    name: QName


@dataclass(frozen=True, slots=True)
class NamespaceStep:
    """A final `namespace::prefix` step: the namespace node `prefix` of the selected element."""

    prefix: str


@dataclass(frozen=True, slots=True)
class NodeStep:
    """A final `text()`, `comment()` or `processing-instruction('target')` step."""

    kind: Literal["text", "comment", "processing-instruction"]
    target: str | None = None  # processing-instruction only; None matches any target
    position: int | None = None


LastStep: TypeAlias = AttributeStep | NamespaceStep | NodeStep


@dataclass(frozen=True, slots=True)
class LocationPath:
    """A parsed `sel`. RFC 5261 section 4.1 evaluates every selector from the document root
    node, so a relative and an absolute spelling parse to the same path."""

    source: str
    id_values: tuple[str, ...] | None  # the whitespace-separated ids of an `id('...')` start
    steps: tuple[ElementStep, ...]
    last: LastStep | None


# XML names as the existing selectors and `type` values spell them (XML 1.0 Name, without ':').
NCNAME: Final = r"[^\W\d][\w.\-]*"
_NCNAME_RE: Final = re.compile(NCNAME)
_DIGITS_RE: Final = re.compile(r"[0-9]+")
_SPACE: Final = " \t\r\n"
_NODE_TYPES: Final = ("text", "comment", "processing-instruction")
_OPERATOR_CHARS: Final = frozenset("|+-=<>!")


def parse_selector(sel: str, limits: Limits = DEFAULT_LIMITS) -> LocationPath:
    """Parse `sel` into the RFC 5261 subset; raises SelectorTooComplex or SelectorSyntaxError.

    The length bound is checked before the text is read; parsing is one pass over it.
    """
    if len(sel) > limits.max_selector_length:
        raise SelectorTooComplex(
            f"sel is {len(sel)} characters, over the limit of {limits.max_selector_length} "
            "(SIS_MAX_SELECTOR_LENGTH)"
        )
    return _parse(sel, limits.max_selector_steps)


# Feeds repeat selectors (the same market and selection ids in every race), and the patch
# engine and the patch scope both parse each one. Failures are not cached (lru_cache keeps no
# exceptions), and what is cached is bounded by max_selector_length.
@lru_cache(maxsize=8192)
def _parse(sel: str, max_steps: int) -> LocationPath:
    return _Parser(sel, max_steps).location_path()


def literal(value: str) -> str:
    """`value` as an XPath 1.0 literal. XPath literals have no escapes; a parsed value came from
    a literal, so one of the two quote characters is always free."""
    return f'"{value}"' if "'" in value else f"'{value}'"


def _name(name: QName, default_prefix: str | None) -> str:
    if name.prefix:
        return f"{name.prefix}:{name.local}"
    if default_prefix is not None and name.local != "*":
        return f"{default_prefix}:{name.local}"
    return name.local


def _predicate(predicate: Predicate, default_prefix: str | None) -> str:
    if isinstance(predicate, Position):
        return f"[{predicate.index}]"
    if isinstance(predicate, AttributeEquals):
        # Unprefixed attributes are in no namespace whatever the default namespace is.
        return f"[@{_name(predicate.name, None)}={literal(predicate.value)}]"
    if isinstance(predicate, ChildEquals):
        return f"[{_name(predicate.name, default_prefix)}={literal(predicate.value)}]"
    if isinstance(predicate, SelfEquals):
        return f"[.={literal(predicate.value)}]"
    return f"[text()={literal(predicate.value)}]"


def render_steps(steps: tuple[ElementStep, ...], default_prefix: str | None = None) -> str:
    """The absolute XPath 1.0 expression of `steps` (from the document root node).

    `default_prefix`, when given, is put on unprefixed element names: RFC 5261 section 4.2.1
    gives them the patch's default namespace, which XPath 1.0 cannot express without a prefix.
    One rendering for every caller, so equal paths give equal strings (the patch engine reports
    located elements by this string, and the patch scope looks them up by it).
    """
    return "".join(
        "/"
        + _name(step.name, default_prefix)
        + "".join(_predicate(p, default_prefix) for p in step.predicates)
        for step in steps
    )


def render_last(last: AttributeStep | NodeStep) -> str:
    """A final step as an XPath 1.0 step (namespace steps are resolved by the caller)."""
    if isinstance(last, AttributeStep):
        return "@" + _name(last.name, None)
    argument = "" if last.target is None else literal(last.target)
    position = "" if last.position is None else f"[{last.position}]"
    return f"{last.kind}({argument}){position}"


class _Parser:
    """One left-to-right pass over `sel`, with no recursion (the grammar nests nothing)."""

    def __init__(self, sel: str, max_steps: int) -> None:
        self.sel = sel
        self.pos = 0
        self.max_steps = max_steps
        self.counted = 0

    # -- lexical helpers

    def _fail(self, why: str) -> SelectorSyntaxError:
        return SelectorSyntaxError(f"{why}, outside the RFC 5261 selector subset")

    def _count(self) -> None:
        self.counted += 1
        if self.counted > self.max_steps:
            raise SelectorTooComplex(
                f"sel has {self.counted} or more location steps and predicates, over the limit "
                f"of {self.max_steps} (SIS_MAX_SELECTOR_STEPS)"
            )

    def _skip_space(self) -> None:
        sel, pos = self.sel, self.pos
        while pos < len(sel) and sel[pos] in _SPACE:
            pos += 1
        self.pos = pos

    def _peek(self) -> str:
        self._skip_space()
        return self.sel[self.pos] if self.pos < len(self.sel) else ""

    def _at(self, text: str) -> bool:
        self._skip_space()
        return self.sel.startswith(text, self.pos)

    def _expect(self, text: str, what: str) -> None:
        if not self._at(text):
            raise self._unexpected(what)
        self.pos += len(text)

    def _unexpected(self, wanted: str) -> SelectorSyntaxError:
        self._skip_space()
        at = self.pos
        if at >= len(self.sel):
            return SelectorSyntaxError(f"it ends where {wanted} was expected")
        found = self.sel[at]
        if self.sel.startswith("//", at):
            return self._fail(f"'//' (the descendant axis) at offset {at}")
        if found == "$":
            return self._fail(f"a variable reference at offset {at}")
        if found in _OPERATOR_CHARS:
            return self._fail(f"operator {found!r} at offset {at}")
        return SelectorSyntaxError(
            f"unexpected {found!r} at offset {at}, expected {wanted} (RFC 5261 selector subset)"
        )

    def _ncname(self, what: str) -> str:
        self._skip_space()
        match = _NCNAME_RE.match(self.sel, self.pos)
        if match is None:
            raise self._unexpected(what)
        self.pos = match.end()
        return match.group()

    def _qname(self, what: str) -> QName:
        first = self._ncname(what)
        # No whitespace inside a QName (XML Namespaces); `p:*` is not in the RFC grammar.
        if self.sel.startswith(":", self.pos) and not self.sel.startswith("::", self.pos):
            self.pos += 1
            match = _NCNAME_RE.match(self.sel, self.pos)
            if match is None:
                raise self._unexpected("a local name after the prefix")
            self.pos = match.end()
            return QName(first, match.group())
        return QName("", first)

    def _literal(self) -> str:
        quote = self._peek()
        if quote not in ("'", '"'):
            raise self._unexpected("a quoted literal")
        end = self.sel.find(quote, self.pos + 1)
        if end < 0:
            raise SelectorSyntaxError(f"unterminated literal at offset {self.pos}")
        value = self.sel[self.pos + 1 : end]
        self.pos = end + 1
        return value

    def _digits(self) -> int:
        self._skip_space()
        match = _DIGITS_RE.match(self.sel, self.pos)
        if match is None:
            raise self._unexpected("a position")
        self.pos = match.end()
        return int(match.group())

    # -- grammar

    def location_path(self) -> LocationPath:
        self._skip_space()
        if self.pos >= len(self.sel):
            raise SelectorSyntaxError("it is empty")
        if self._at("/") and not self._at("//"):
            self.pos += 1
        id_values: tuple[str, ...] | None = None
        steps: list[ElementStep] = []
        last: LastStep | None = None
        if self._is_call("id"):
            self._count()
            self._expect("(", "'('")
            id_values = tuple(self._literal().split())
            self._expect(")", "')' closing id(")
            if not self._separator():
                return LocationPath(self.sel, id_values, (), None)
        while True:
            step = self._step()
            if isinstance(step, ElementStep):
                steps.append(step)
            else:
                last = step
            if last is not None or not self._separator():
                break
        self._skip_space()
        if self.pos < len(self.sel):
            if last is not None and self._at("/"):
                raise SelectorSyntaxError(
                    f"a {_LAST_NAMES[type(last)]} step must be the last step (offset {self.pos})"
                )
            raise self._unexpected("'/' or the end")
        return LocationPath(self.sel, id_values, tuple(steps), last)

    def _separator(self) -> bool:
        """Consume a '/' between steps; False at the end of the selector."""
        self._skip_space()
        if self.pos >= len(self.sel):
            return False
        if self._at("//") or not self._at("/"):
            raise self._unexpected("'/' or the end")
        self.pos += 1
        return True

    def _is_call(self, name: str) -> bool:
        """Whether a call of `name` starts here (the name, optional space, then '(')."""
        self._skip_space()
        match = _NCNAME_RE.match(self.sel, self.pos)
        if match is None or match.group() != name:
            return False
        after = match.end()
        while after < len(self.sel) and self.sel[after] in _SPACE:
            after += 1
        if not self.sel.startswith("(", after):
            return False
        self.pos = after
        return True

    def _step(self) -> ElementStep | LastStep:
        self._count()
        if self._at("@"):
            self.pos += 1
            return AttributeStep(self._qname("an attribute name"))
        if self._at("*"):
            self.pos += 1
            return ElementStep(QName("", "*"), self._predicates())
        start = self.pos
        name = self._ncname("a step (a name, '*', '@name', text(), comment(), ...)")
        self._skip_space()
        if self.sel.startswith("::", self.pos):
            if name != "namespace":
                raise self._fail(f"axis {name}:: at offset {start}")
            self.pos += 2
            return NamespaceStep(self._ncname("a namespace prefix"))
        if self.sel.startswith("(", self.pos):
            if name not in _NODE_TYPES:
                raise self._fail(f"function {name}() at offset {start}")
            self.pos += 1
            return self._node_step(name)
        self.pos = start
        return ElementStep(self._qname("an element name"), self._predicates())

    def _node_step(self, kind: str) -> NodeStep:
        target: str | None = None
        if kind == "processing-instruction" and self._peek() in ("'", '"'):
            target = self._literal()
        self._expect(")", f"')' closing {kind}(")
        position: int | None = None
        if self._at("["):
            self._count()
            self.pos += 1
            position = self._digits()
            self._expect("]", "']' after a position")
        if kind == "text":
            return NodeStep("text", None, position)
        if kind == "comment":
            return NodeStep("comment", None, position)
        return NodeStep("processing-instruction", target, position)

    def _predicates(self) -> tuple[Predicate, ...]:
        predicates: list[Predicate] = []
        while self._at("["):
            self._count()
            self.pos += 1
            predicates.append(self._predicate())
            self._expect("]", "']' closing the predicate")
        return tuple(predicates)

    def _predicate(self) -> Predicate:
        char = self._peek()
        if char.isdigit():
            return Position(self._digits())
        if char == "@":
            self.pos += 1
            name = self._qname("an attribute name")
            self._expect("=", "'=' and a literal (only equality tests are supported)")
            return AttributeEquals(name, self._literal())
        if char == "." and not self._at(".."):
            self.pos += 1
            self._expect("=", "'=' and a literal (only equality tests are supported)")
            return SelfEquals(self._literal())
        if self._is_call("text"):
            self._expect("(", "'('")
            self._expect(")", "')' closing text(")
            self._expect("=", "'=' and a literal (only equality tests are supported)")
            return TextEquals(self._literal())
        start = self.pos
        match = _NCNAME_RE.match(self.sel, self.pos)
        if match is not None and self._is_call(match.group()):
            raise self._fail(f"function {match.group()}() at offset {start}")
        name = self._qname("a position, '@name', a child name, '.' or text()")
        self._expect("=", "'=' and a literal (only equality tests are supported)")
        return ChildEquals(name, self._literal())


_LAST_NAMES: Final[dict[type, str]] = {
    AttributeStep: "attribute",
    NamespaceStep: "namespace",
    NodeStep: "text, comment or processing-instruction",
}
