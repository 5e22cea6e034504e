"""The XPath selectors of RFC 5261 XML patches: their grammar, a bounded parser, and rendering.

An XML patch's `sel` is parsed here, before anything evaluates it, into a `LocationPath`, and
only that parsed form is evaluated (sis_platform.standards.xmlpatch) or analysed
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
refused before it is read; a shorter one is tokenized in one pass, and parsing stops as soon as
the location steps plus predicates (an `id()` start counts as a step) exceed
`max_selector_steps`. Both raise `SelectorTooComplex`;
anything outside the grammar raises `SelectorSyntaxError`.
"""

from __future__ import annotations

import re
from collections.abc import Hashable
from dataclasses import dataclass
from functools import lru_cache
from typing import Final, Literal, NamedTuple, Protocol, TypeAlias

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
    "DEFAULT_SELECTOR_BOUNDS",
    "SelectorBounds",
    "SelectorError",
    "SelectorLimits",
    "SelectorSyntaxError",
    "SelectorTooComplex",
    "SelfEquals",
    "TextEquals",
    "literal",
    "parse_selector",
    "render_last",
    "render_steps",
]


class SelectorLimits(Hashable, Protocol):
    """The bounds a selector is parsed under: its characters and its location steps plus
    predicates. The platform's `Limits` (sis_platform.domain.limits) is one, set from
    SIS_MAX_SELECTOR_LENGTH and SIS_MAX_SELECTOR_STEPS."""

    @property
    def max_selector_length(self) -> int: ...

    @property
    def max_selector_steps(self) -> int: ...


@dataclass(frozen=True)
class SelectorBounds:
    """Selector bounds as a plain record; `DEFAULT_SELECTOR_BOUNDS` holds the defaults the
    platform's `Limits` takes its own from."""

    max_selector_length: int = 1_024
    max_selector_steps: int = 64


DEFAULT_SELECTOR_BOUNDS: Final = SelectorBounds()


class SelectorError(ValueError):
    """A `sel` that is not evaluated."""


class SelectorSyntaxError(SelectorError):
    """A `sel` outside the RFC 5261 selector grammar."""


class SelectorTooComplex(SelectorError):
    """A `sel` over `max_selector_length` or `max_selector_steps` of its `SelectorLimits`."""


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
# XPath 1.0 tokens (section 3.7) as far as the grammar needs them, XML whitespace between them
# skipped; any other character is an `other` token, so nothing is skipped silently.
_TOKEN_RE: Final = re.compile(
    rf"""[ \t\r\n]*(?:
        (?P<literal>'[^']*'|"[^"]*")
      | (?P<digits>[0-9]+)
      | (?P<name>{NCNAME}(?::{NCNAME})?)
      | (?P<punct>//|::|[/\[\]@=().*])
      | (?P<other>[^ \t\r\n])
    )""",
    re.VERBOSE,
)
_NODE_TYPES: Final = ("text", "comment", "processing-instruction")
_OPERATORS: Final = frozenset("|+-=<>!")


def parse_selector(sel: str, limits: SelectorLimits = DEFAULT_SELECTOR_BOUNDS) -> LocationPath:
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


class _Token(NamedTuple):
    kind: str  # literal, digits, name, punct, other, end
    text: str
    at: int  # offset in the selector


class _Parser:
    """A predictive parser over the tokens of `sel` (one regular expression finds them in one
    pass); the grammar nests nothing, so it loops and never recurses."""

    def __init__(self, sel: str, max_steps: int) -> None:
        self.sel = sel
        self.tokens = [
            _Token(kind, match.group(kind), match.start(kind))
            for match in _TOKEN_RE.finditer(sel)
            if (kind := match.lastgroup) is not None
        ]
        self.tokens.append(_Token("end", "", len(sel)))
        self.index = 0
        self.max_steps = max_steps
        self.counted = 0

    # -- tokens

    def _count(self) -> None:
        self.counted += 1
        if self.counted > self.max_steps:
            raise SelectorTooComplex(
                f"sel has {self.counted} or more location steps and predicates, over the limit "
                f"of {self.max_steps} (SIS_MAX_SELECTOR_STEPS)"
            )

    def _peek(self, ahead: int = 0) -> _Token:
        return self.tokens[min(self.index + ahead, len(self.tokens) - 1)]

    def _take(self, punct: str) -> bool:
        token = self.tokens[self.index]
        if token.kind == "punct" and token.text == punct:
            self.index += 1
            return True
        return False

    def _expect(self, punct: str, wanted: str) -> None:
        if not self._take(punct):
            raise self._unexpected(wanted)

    def _next(self, kind: str, wanted: str) -> _Token:
        token = self.tokens[self.index]
        if token.kind != kind:
            raise self._unexpected(wanted)
        self.index += 1
        return token

    def _unexpected(self, wanted: str) -> SelectorSyntaxError:
        kind, text, at = self.tokens[self.index]
        if kind == "end":
            return SelectorSyntaxError(f"it ends where {wanted} was expected")
        if text == "//":
            return _outside(f"'//' (the descendant axis) at offset {at}")
        if text == "$":
            return _outside(f"a variable reference at offset {at}")
        if text in _OPERATORS:
            return _outside(f"operator {text!r} at offset {at}")
        if text in ("'", '"'):
            return SelectorSyntaxError(f"unterminated literal at offset {at}")
        return SelectorSyntaxError(
            f"unexpected {text!r} at offset {at}, expected {wanted} (RFC 5261 selector subset)"
        )

    def _qname(self, wanted: str) -> QName:
        prefix, _, local = self._next("name", wanted).text.rpartition(":")
        return QName(prefix, local)

    def _literal(self) -> str:
        return self._next("literal", "a quoted literal").text[1:-1]

    def _equals_literal(self) -> str:
        self._expect("=", "'=' and a literal (only equality tests are supported)")
        return self._literal()

    def _position(self) -> int:
        return int(self._next("digits", "a position").text)

    def _is_call(self) -> bool:
        """Whether the current token is a name followed by '('."""
        following = self._peek(1)
        return self._peek().kind == "name" and following.kind == "punct" and following.text == "("

    # -- grammar

    def location_path(self) -> LocationPath:
        if self._peek().kind == "end":
            raise SelectorSyntaxError("it is empty")
        self._take("/")
        id_values: tuple[str, ...] | None = None
        if self._is_call() and self._peek().text == "id":
            self._count()
            self.index += 2
            id_values = tuple(self._literal().split())
            self._expect(")", "')' closing id(")
            if not self._separator():
                return LocationPath(self.sel, id_values, (), None)
        steps: list[ElementStep] = []
        last: LastStep | None = None
        while True:
            step = self._step()
            if isinstance(step, ElementStep):
                steps.append(step)
            else:
                last = step
            if last is not None or not self._separator():
                break
        token = self._peek()
        if token.kind != "end":
            if last is not None and token.text == "/":
                raise SelectorSyntaxError(
                    f"a {_LAST_NAMES[type(last)]} step must be the last step (offset {token.at})"
                )
            raise self._unexpected("'/' or the end")
        return LocationPath(self.sel, id_values, tuple(steps), last)

    def _separator(self) -> bool:
        """Consume a '/' between steps; False at the end of the selector."""
        if self._peek().kind == "end":
            return False
        if not self._take("/"):
            raise self._unexpected("'/' or the end")
        return True

    def _step(self) -> ElementStep | LastStep:
        self._count()
        if self._take("@"):
            return AttributeStep(self._qname("an attribute name"))
        if self._take("*"):
            return ElementStep(QName("", "*"), self._predicates())
        token = self._next("name", "a step (a name, '*', '@name', text(), comment(), ...)")
        if self._take("::"):
            if token.text != "namespace":
                raise _outside(f"axis {token.text}:: at offset {token.at}")
            declared = self._next("name", "a namespace prefix")
            if ":" in declared.text:
                raise SelectorSyntaxError(f"a namespace prefix has no ':' (offset {declared.at})")
            return NamespaceStep(declared.text)
        if self._take("("):
            if token.text not in _NODE_TYPES:
                raise _outside(f"function {token.text}() at offset {token.at}")
            return self._node_step(token.text)
        prefix, _, local = token.text.rpartition(":")
        return ElementStep(QName(prefix, local), self._predicates())

    def _node_step(self, kind: str) -> NodeStep:
        target: str | None = None
        if kind == "processing-instruction" and self._peek().kind == "literal":
            target = self._literal()
        self._expect(")", f"')' closing {kind}(")
        position: int | None = None
        if self._take("["):
            self._count()
            position = self._position()
            self._expect("]", "']' after a position")
        if kind == "text":
            return NodeStep("text", None, position)
        if kind == "comment":
            return NodeStep("comment", None, position)
        return NodeStep("processing-instruction", target, position)

    def _predicates(self) -> tuple[Predicate, ...]:
        predicates: list[Predicate] = []
        while self._take("["):
            self._count()
            predicates.append(self._predicate())
            self._expect("]", "']' closing the predicate")
        return tuple(predicates)

    def _predicate(self) -> Predicate:
        token = self._peek()
        if token.kind == "digits":
            return Position(self._position())
        if self._take("@"):
            name = self._qname("an attribute name")
            return AttributeEquals(name, self._equals_literal())
        if self._take("."):
            return SelfEquals(self._equals_literal())
        if self._is_call():
            if token.text != "text":
                raise _outside(f"function {token.text}() at offset {token.at}")
            self.index += 2
            self._expect(")", "')' closing text(")
            return TextEquals(self._equals_literal())
        name = self._qname("a position, '@name', a child name, '.' or text()")
        return ChildEquals(name, self._equals_literal())


def _outside(why: str) -> SelectorSyntaxError:
    return SelectorSyntaxError(f"{why}, outside the RFC 5261 selector subset")


_LAST_NAMES: Final[dict[type, str]] = {
    AttributeStep: "attribute",
    NamespaceStep: "namespace",
    NodeStep: "text, comment or processing-instruction",
}
