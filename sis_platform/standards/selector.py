"""JMS 1.1 message selectors (JMS 1.1 section 3.8.1), compiled once and evaluated per item.

A selector is tokenized and parsed by hand (recursive descent, one function per precedence
level), type-checked where the types are known at compile time, and compiled to a tree of
nested closures. Evaluating a selector is then a few Python calls per operator, with
specialised closures for the common shapes (`identifier op literal`, `identifier IN (...)`,
`identifier LIKE '...'`), so the hot path does no dispatch on node kinds.

Values: a property is a Python `bool`, `int`, `float`, `str` or None; headers are looked up
in the same mapping under their JMS names. A missing property, or one whose value is None, is
NULL (3.8.1.1, "If a property that does not exist in a message is referenced, its value is
NULL"). Python has one integer and one floating type, so an `int` is a Java `long` and a
`float` a Java `double` (the promotion rules of 3.8.1.1 then reduce to long/double ones).
`JMSDeliveryMode` reads as 'PERSISTENT' / 'NON_PERSISTENT'; the `javax.jms.DeliveryMode`
numbers (2 / 1) are accepted too.

Results are three-valued (3.8.1.2): `Selector.evaluate` returns True, False or None
(UNKNOWN); only True selects.

Decisions where JMS 1.1 is silent or peers disagree (the conformance tests list the cases):
- `/` divides in double precision, also for two exact operands (ActiveMQ, Artemis and Qpid
  Broker-J do; the `stomp` source filters with ActiveMQ, so the two must agree). `%` (an
  ActiveMQ/Qpid extension) keeps Java's remainder semantics; an exact `% 0` is UNKNOWN, as
  Java throws there and a throwing selector selects nothing.
- Comparing values of unlike types is false, not UNKNOWN (3.8.1.1, "If the comparison of
  non-like type values is attempted, the value of the operation is false"), for all six
  comparison operators, so a type mismatch never selects. `x [NOT] IN (...)` and
  `x [NOT] BETWEEN a AND b` follow the same rule: a mismatch makes them false whether or not
  they are negated (NOT BETWEEN is `x < a OR x > b`, as 3.8.1.1 defines it). `LIKE` on a
  non-string is UNKNOWN. Arithmetic on a non-number is UNKNOWN (3.8.1.1: "a string cannot be
  used in an arithmetic expression").
- Compile-time type errors (InvalidSelector), where types are known before evaluation
  (literals and predicates; identifiers are untyped until then): a selector, or an operand of
  AND, OR or NOT, that cannot be boolean ("1+2", "TRUE AND 3"); a string or boolean operand
  of < <= > >= or BETWEEN ("String and Boolean comparison is restricted to = and <>", and
  BETWEEN takes arithmetic expressions); a boolean compared with a number or a string
  ("TRUE = 0"); arithmetic on a boolean or a string (except string + string); LIKE on a
  boolean or a number. This includes what ActiveMQ's parser rejects ("TRUE > 0", "TRUE = 0",
  "'a' < 1"). IN is the exception: its list may mix types (Qpid), and an item of another type
  just does not match.
- LIKE ... ESCAPE: the escape character escapes only when followed by '%', '_' or itself;
  elsewhere it stands for itself (ActiveMQ/Artemis), so ESCAPE '%' and ESCAPE '_' work. LIKE
  is matched in time linear in the value, without regular expressions (like.py).
- Literals follow the Java literal syntax that 3.8.1.1 names: hexadecimal, octal and binary
  exact literals, '_' digit separators, an L suffix, f/F/d/D suffixes and hexadecimal
  floating literals. Exact literals are longs ("numbers in the range of long are supported");
  a hexadecimal, octal or binary one is read as the 64-bit two's complement pattern. A
  literal outside the long range, or a floating literal that overflows or underflows, is
  invalid. An f-suffixed literal is rounded to float precision.
- Provider extensions accepted: double-quoted identifiers ("a.b", with "" for a quote;
  Artemis, Qpid), string concatenation with + (ActiveMQ, Artemis), % (ActiveMQ, Qpid), any
  expression on the left of [NOT] IN / LIKE / BETWEEN / IS [NOT] NULL and arbitrary
  expressions in an IN list (Qpid; `(expr) IS NULL` observes UNKNOWN), header names beyond
  the six of 3.8.1.1 (JMSExpiration, JMSRedelivered, JMSX... are plain lookups).
- An empty or blank selector selects everything (3.8.1.1: an empty selector is no selector).
"""

from __future__ import annotations

import math
import operator
import re
import struct
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from sis_platform.standards.like import like_matcher

__all__ = ["InvalidSelector", "Selector"]

Properties = Mapping[str, object]
Evaluator = Callable[[Properties], object]


class InvalidSelector(ValueError):
    """A selector that is not valid JMS 1.1 (javax.jms.InvalidSelectorException).

    `position` is the 0-based offset in `selector` where the problem was found.
    """

    def __init__(self, reason: str, selector: str, position: int) -> None:
        self.reason = reason
        self.selector = selector
        self.position = position
        # Show the selector (a window of it, if long) with a caret under the position.
        start = max(0, position - 40)
        shown = "".join(" " if c in "\t\n\r\f" else c for c in selector[start : position + 40])
        prefix = "..." if start else ""
        suffix = "..." if position + 40 < len(selector) else ""
        caret = " " * (len(prefix) + position - start) + "^"
        super().__init__(
            f"invalid selector: {reason} at position {position}\n"
            f"  {prefix}{shown}{suffix}\n  {caret}"
        )


# --------------------------------------------------------------------------- tokens

_KEYWORDS: Final = frozenset(
    {"NULL", "TRUE", "FALSE", "NOT", "AND", "OR", "BETWEEN", "LIKE", "IN", "IS", "ESCAPE"}
)
# Java whitespace (3.8.1.1: "the same as that defined for Java").
_WHITESPACE: Final = frozenset(" \t\f\n\r")
_OPERATORS: Final = ("<>", "<=", ">=", "=", "<", ">", "+", "-", "*", "/", "%", "(", ")", ",")

# Levels of nesting a selector may have: parentheses, NOT, signs, and chains of arithmetic
# operators (each operator nests the chain before it one level deeper). Parsing, type checking,
# compiling and evaluating recurse over that nesting, a few frames per level, so the bound keeps
# them all far below Python's recursion limit, wherever they are called from. Real selectors
# nest a few levels.
MAX_NESTING: Final = 50

_LONG_MIN: Final = -(2**63)
_LONG_MAX: Final = 2**63 - 1

_D = r"[0-9](?:[0-9_]*[0-9])?"
_H = r"[0-9a-fA-F](?:[0-9a-fA-F_]*[0-9a-fA-F])?"
# Java literal grammar (JLS 3.10.1, 3.10.2), tried in this order so the longest form wins.
_HEX_FLOAT_RE: Final = re.compile(rf"0[xX](?:{_H}\.?|(?:{_H})?\.{_H})[pP][+-]?{_D}[fFdD]?")
_HEX_RE: Final = re.compile(rf"0[xX]({_H})[lL]?")
_BIN_RE: Final = re.compile(r"0[bB]([01](?:[01_]*[01])?)[lL]?")
_DEC_FLOAT_RE: Final = re.compile(
    rf"(?:(?:{_D}\.(?:{_D})?|\.{_D})(?:[eE][+-]?{_D})?|{_D}[eE][+-]?{_D})[fFdD]?|{_D}[fFdD]"
)
_OCT_RE: Final = re.compile(r"0([0-7_]*[0-7])[lL]?")
_DEC_RE: Final = re.compile(r"(0|[1-9](?:[0-9_]*[0-9])?)[lL]?")


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # "num", "str", "ident", "kw", "op", "eof"
    value: object
    pos: int


def _is_ident_start(c: str) -> bool:
    # Character.isJavaIdentifierStart (3.8.1.1): letters, letter numbers, currency symbols,
    # connector punctuation.
    if c.isascii():
        return c.isalpha() or c == "_" or c == "$"
    return unicodedata.category(c) in ("Lu", "Ll", "Lt", "Lm", "Lo", "Nl", "Sc", "Pc")


def _is_ident_part(c: str) -> bool:
    # Character.isJavaIdentifierPart: the start characters, digits, combining marks and the
    # identifier-ignorable characters (format controls and some C0/C1 controls).
    if c.isascii():
        return (
            c.isalnum() or c == "_" or c == "$" or "\x00" <= c <= "\x08" or "\x0e" <= c <= "\x1b"
        ) or c == "\x7f"
    if "\x80" <= c <= "\x9f":
        return True
    return unicodedata.category(c) in (
        "Lu", "Ll", "Lt", "Lm", "Lo", "Nl", "Sc", "Pc", "Nd", "Mn", "Mc", "Cf",
    )  # fmt: skip


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    n = len(text)
    i = 0
    while i < n:
        c = text[i]
        if c in _WHITESPACE:
            i += 1
        elif c == "'":
            start = i
            value, i = _read_quoted(text, i, "'", "string literal")
            tokens.append(_Token("str", value, start))
        elif c == '"':
            # Double-quoted identifier: a provider extension (Artemis, Qpid) for property
            # names that are not Java identifiers.
            start = i
            value, i = _read_quoted(text, i, '"', "quoted identifier")
            if not value:
                raise InvalidSelector("empty quoted identifier", text, start)
            tokens.append(_Token("ident", value, start))
        elif "0" <= c <= "9" or (c == "." and i + 1 < n and "0" <= text[i + 1] <= "9"):
            value_num, end = _read_number(text, i)
            tokens.append(_Token("num", value_num, i))
            i = end
        elif _is_ident_start(c):
            start = i
            i += 1
            while i < n and _is_ident_part(text[i]):
                i += 1
            word = text[start:i]
            upper = word.upper()
            if upper in _KEYWORDS:
                tokens.append(_Token("kw", upper, start))
            else:
                tokens.append(_Token("ident", word, start))
        else:
            for op in _OPERATORS:
                if text.startswith(op, i):
                    tokens.append(_Token("op", op, i))
                    i += len(op)
                    break
            else:
                raise InvalidSelector(f"unexpected character {c!r}", text, i)
    tokens.append(_Token("eof", None, n))
    return tokens


def _read_quoted(text: str, start: int, quote: str, what: str) -> tuple[str, int]:
    # A quote inside is written twice (3.8.1.1: 'literal''s').
    parts: list[str] = []
    i = start + 1
    while True:
        j = text.find(quote, i)
        if j < 0:
            raise InvalidSelector(f"unterminated {what}", text, start)
        parts.append(text[i:j])
        if text.startswith(quote, j + 1):
            parts.append(quote)
            i = j + 2
        else:
            return "".join(parts), j + 1


@dataclass(frozen=True, slots=True)
class _Exact:
    """An exact numeric literal before range checking: 2**63 is only valid after a '-'."""

    value: int


def _read_number(text: str, start: int) -> tuple[object, int]:
    value: object
    m = _HEX_FLOAT_RE.match(text, start)
    if m:
        value = _approximate(text, start, m.group(), hexadecimal=True)
    elif m := _HEX_RE.match(text, start):
        value = _Exact(_from_bits(text, start, int(m.group(1).replace("_", ""), 16)))
    elif m := _BIN_RE.match(text, start):
        value = _Exact(_from_bits(text, start, int(m.group(1).replace("_", ""), 2)))
    elif m := _DEC_FLOAT_RE.match(text, start):
        value = _approximate(text, start, m.group(), hexadecimal=False)
    elif m := _OCT_RE.match(text, start):
        value = _Exact(_from_bits(text, start, int(m.group(1).replace("_", ""), 8)))
    else:
        m = _DEC_RE.match(text, start)
        if m is None:
            raise InvalidSelector("malformed numeric literal", text, start)
        magnitude = int(m.group(1).replace("_", ""))
        if magnitude > 2**63:
            raise InvalidSelector("exact numeric literal outside the long range", text, start)
        value = _Exact(magnitude)
    end = m.end()
    if end < len(text) and (_is_ident_part(text[end]) or text[end] == "."):
        raise InvalidSelector("malformed numeric literal", text, start)
    return value, end


def _from_bits(text: str, start: int, bits: int) -> int:
    # Java reads hexadecimal, octal and binary literals as two's complement bit patterns.
    if bits >= 2**64:
        raise InvalidSelector("exact numeric literal outside the long range", text, start)
    return bits - 2**64 if bits >= 2**63 else bits


def _approximate(text: str, start: int, literal: str, *, hexadecimal: bool) -> float:
    body = literal.replace("_", "")
    single = body[-1] in "fF"
    if body[-1] in "fFdD":
        body = body[:-1]
    value = float.fromhex(body) if hexadecimal else float(body)
    mantissa = re.split("[pP]" if hexadecimal else "[eE]", body)[0]
    nonzero = any(ch not in "0.xX" for ch in mantissa)
    if single:
        try:
            value = struct.unpack("<f", struct.pack("<f", value))[0]
        except OverflowError:
            value = math.inf
    # JLS 3.10.2: a nonzero literal that rounds to infinity or to zero is an error.
    if math.isinf(value):
        raise InvalidSelector("floating-point literal too large", text, start)
    if value == 0.0 and nonzero:
        raise InvalidSelector("floating-point literal too small", text, start)
    return value


# --------------------------------------------------------------------------- syntax tree


@dataclass(frozen=True, slots=True)
class _Literal:
    value: bool | int | float | str
    pos: int


@dataclass(frozen=True, slots=True)
class _Identifier:
    name: str
    pos: int


@dataclass(frozen=True, slots=True)
class _Unary:
    op: str  # "-", "+"
    operand: _Node
    pos: int


@dataclass(frozen=True, slots=True)
class _Arithmetic:
    op: str  # "+", "-", "*", "/", "%"
    left: _Node
    right: _Node
    pos: int


@dataclass(frozen=True, slots=True)
class _Comparison:
    op: str  # "=", "<>", "<", "<=", ">", ">="
    left: _Node
    right: _Node
    pos: int


@dataclass(frozen=True, slots=True)
class _Logical:
    op: str  # "AND", "OR"
    operands: tuple[_Node, ...]
    pos: int


@dataclass(frozen=True, slots=True)
class _Not:
    operand: _Node
    pos: int


@dataclass(frozen=True, slots=True)
class _Between:
    negated: bool
    operand: _Node
    low: _Node
    high: _Node
    pos: int


@dataclass(frozen=True, slots=True)
class _In:
    negated: bool
    operand: _Node
    items: tuple[_Node, ...]
    pos: int


@dataclass(frozen=True, slots=True)
class _Like:
    negated: bool
    operand: _Node
    pattern: str
    escape: str | None
    pos: int


@dataclass(frozen=True, slots=True)
class _IsNull:
    negated: bool
    operand: _Node
    pos: int


_Node = (
    _Literal
    | _Identifier
    | _Unary
    | _Arithmetic
    | _Comparison
    | _Logical
    | _Not
    | _Between
    | _In
    | _Like
    | _IsNull
)

_COMPARISON_OPS: Final = frozenset({"=", "<>", "<", "<=", ">", ">="})


class _Parser:
    """Recursive descent over the JMS precedence levels (3.8.1.1).

    or := and (OR and)*            and := not (AND not)*            not := NOT not | predicate
    predicate := sum [cmp sum | [NOT] BETWEEN sum AND sum | [NOT] IN (sum, ...)
                      | [NOT] LIKE string [ESCAPE string] | IS [NOT] NULL]
    sum := product ((+|-) product)*  product := unary ((*|/|%) unary)*  unary := (+|-) unary
    | primary                      primary := literal | identifier | ( or )

    NOT binds looser than comparisons, as in SQL ("NOT a = 1" is "NOT (a = 1)").
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokenize(text)
        self.i = 0
        self.nesting = 0  # parentheses, NOTs and signs open around the current token

    def nest(self, token: _Token) -> None:
        self.nesting += 1
        if self.nesting > MAX_NESTING:
            raise self.error(f"selector nested deeper than {MAX_NESTING} levels", token)

    # helpers

    def peek(self) -> _Token:
        return self.tokens[self.i]

    def advance(self) -> _Token:
        token = self.tokens[self.i]
        self.i += 1
        return token

    def at_kw(self, word: str) -> bool:
        token = self.tokens[self.i]
        return token.kind == "kw" and token.value == word

    def at_op(self, op: str) -> bool:
        token = self.tokens[self.i]
        return token.kind == "op" and token.value == op

    def error(self, reason: str, token: _Token | None = None) -> InvalidSelector:
        token = token or self.peek()
        return InvalidSelector(reason, self.text, token.pos)

    def found(self, token: _Token) -> str:
        if token.kind == "eof":
            return "end of selector"
        if token.kind == "str":
            return f"string '{token.value}'"
        if token.kind == "num":
            return "number"
        return f"{token.value!s}" if token.kind != "ident" else f"identifier {token.value!s}"

    def expect_kw(self, word: str) -> None:
        if not self.at_kw(word):
            raise self.error(f"expected {word}, found {self.found(self.peek())}")
        self.i += 1

    def expect_op(self, op: str) -> None:
        if not self.at_op(op):
            raise self.error(f"expected '{op}', found {self.found(self.peek())}")
        self.i += 1

    # grammar

    def parse(self) -> _Node | None:
        if self.peek().kind == "eof":
            return None
        node = self.parse_or()
        token = self.peek()
        if token.kind != "eof":
            raise self.error(f"expected AND, OR or end of selector, found {self.found(token)}")
        return node

    def parse_or(self) -> _Node:
        first = self.parse_and()
        if not self.at_kw("OR"):
            return first
        pos = self.peek().pos
        operands = [first]
        while self.at_kw("OR"):
            self.i += 1
            operands.append(self.parse_and())
        return _Logical("OR", tuple(operands), pos)

    def parse_and(self) -> _Node:
        first = self.parse_not()
        if not self.at_kw("AND"):
            return first
        pos = self.peek().pos
        operands = [first]
        while self.at_kw("AND"):
            self.i += 1
            operands.append(self.parse_not())
        return _Logical("AND", tuple(operands), pos)

    def parse_not(self) -> _Node:
        if self.at_kw("NOT"):
            token = self.advance()
            self.nest(token)
            node = _Not(self.parse_not(), token.pos)
            self.nesting -= 1
            return node
        return self.parse_predicate()

    def parse_predicate(self) -> _Node:
        left = self.parse_sum()
        token = self.peek()
        if token.kind == "op" and token.value in _COMPARISON_OPS:
            self.i += 1
            return _Comparison(str(token.value), left, self.parse_sum(), token.pos)
        if token.kind != "kw":
            return left
        if token.value == "IS":
            self.i += 1
            negated = self.at_kw("NOT")
            if negated:
                self.i += 1
            self.expect_kw("NULL")
            return _IsNull(negated, left, token.pos)
        negated = token.value == "NOT"
        if negated:
            self.i += 1
        keyword = self.peek()
        if keyword.kind == "kw" and keyword.value == "BETWEEN":
            self.i += 1
            low = self.parse_sum()
            self.expect_kw("AND")
            return _Between(negated, left, low, self.parse_sum(), token.pos)
        if keyword.kind == "kw" and keyword.value == "IN":
            self.i += 1
            self.expect_op("(")
            items = [self.parse_sum()]
            while self.at_op(","):
                self.i += 1
                items.append(self.parse_sum())
            self.expect_op(")")
            return _In(negated, left, tuple(items), token.pos)
        if keyword.kind == "kw" and keyword.value == "LIKE":
            self.i += 1
            pattern = self.advance()
            if pattern.kind != "str":
                raise self.error("LIKE needs a string literal pattern", pattern)
            escape: str | None = None
            if self.at_kw("ESCAPE"):
                self.i += 1
                escape_token = self.advance()
                if escape_token.kind != "str" or len(str(escape_token.value)) != 1:
                    raise self.error("ESCAPE needs a string literal of one character", escape_token)
                escape = str(escape_token.value)
            return _Like(negated, left, str(pattern.value), escape, token.pos)
        if negated:
            raise self.error(f"expected BETWEEN, IN or LIKE after NOT, found {self.found(keyword)}")
        return left

    def parse_sum(self) -> _Node:
        node = self.parse_product()
        while True:
            token = self.peek()
            if token.kind == "op" and token.value in ("+", "-"):
                self.i += 1
                node = _Arithmetic(str(token.value), node, self.parse_product(), token.pos)
            else:
                return node

    def parse_product(self) -> _Node:
        node = self.parse_unary()
        while True:
            token = self.peek()
            if token.kind == "op" and token.value in ("*", "/", "%"):
                self.i += 1
                node = _Arithmetic(str(token.value), node, self.parse_unary(), token.pos)
            else:
                return node

    def parse_unary(self) -> _Node:
        token = self.peek()
        if token.kind == "op" and token.value in ("+", "-"):
            self.i += 1
            operand = self.peek()
            if token.value == "-" and operand.kind == "num":
                # The sign belongs to the literal, so -9223372036854775808 is a valid long.
                self.i += 1
                value = operand.value
                if isinstance(value, _Exact):
                    return _Literal(-value.value, token.pos)
                assert isinstance(value, float)
                return _Literal(-value, token.pos)
            self.nest(token)
            node = _Unary(str(token.value), self.parse_unary(), token.pos)
            self.nesting -= 1
            return node
        return self.parse_primary()

    def parse_primary(self) -> _Node:
        token = self.advance()
        if token.kind == "num":
            value = token.value
            if isinstance(value, _Exact):
                if value.value > _LONG_MAX:
                    raise self.error("exact numeric literal outside the long range", token)
                return _Literal(value.value, token.pos)
            assert isinstance(value, float)
            return _Literal(value, token.pos)
        if token.kind == "str":
            return _Literal(str(token.value), token.pos)
        if token.kind == "ident":
            return _Identifier(str(token.value), token.pos)
        if token.kind == "kw":
            if token.value in ("TRUE", "FALSE"):
                return _Literal(token.value == "TRUE", token.pos)
            if token.value == "NULL":
                raise self.error("NULL may only appear in IS [NOT] NULL", token)
            raise self.error(f"unexpected keyword {token.value}", token)
        if token.kind == "op" and token.value == "(":
            self.nest(token)
            node = self.parse_or()
            self.expect_op(")")
            self.nesting -= 1
            return node
        raise self.error(f"expected a value, found {self.found(token)}", token)


# --------------------------------------------------------------------------- static types

# What is known at compile time about a node's value.
_BOOL: Final = "boolean"
_NUM: Final = "numeric"
_STR: Final = "string"
_VALUE: Final = "non-boolean"  # a number or a string, not known which
_ANY: Final = "any"  # an identifier: anything, including NULL


def _type_of(node: _Node, text: str) -> str:
    """The static type of `node`; raises InvalidSelector for the type errors listed above."""

    def fail(reason: str, pos: int) -> InvalidSelector:
        return InvalidSelector(reason, text, pos)

    def condition(operand: _Node, what: str, pos: int) -> None:
        if _type_of(operand, text) not in (_BOOL, _ANY):
            raise fail(f"{what} needs a boolean operand", _start(operand, pos))

    match node:
        case _Literal(value=value):
            if isinstance(value, bool):
                return _BOOL
            return _STR if isinstance(value, str) else _NUM
        case _Identifier():
            return _ANY
        case _Unary(operand=operand, pos=pos):
            if _type_of(operand, text) in (_BOOL, _STR):
                raise fail("arithmetic needs a numeric operand", pos)
            return _NUM
        case _Arithmetic(op=op, left=left, right=right, pos=pos):
            types = (_type_of(left, text), _type_of(right, text))
            if _BOOL in types:
                raise fail("arithmetic needs numeric operands", pos)
            if op == "+" and _STR in types:
                # String concatenation (ActiveMQ/Artemis extension) joins two strings only.
                if _NUM in types:
                    raise fail("cannot add a string and a number", pos)
                return _STR
            if _STR in types:
                raise fail("arithmetic needs numeric operands", pos)
            return _VALUE if op == "+" and types == (_ANY, _ANY) else _NUM
        case _Comparison(op=op, left=left, right=right, pos=pos):
            types = (_type_of(left, text), _type_of(right, text))
            if op not in ("=", "<>"):
                # 3.8.1.1: "String and Boolean comparison is restricted to = and <>".
                if _BOOL in types or _STR in types:
                    raise fail(f"strings and booleans cannot be compared with {op}", pos)
            elif _BOOL in types and any(t in (_NUM, _STR, _VALUE) for t in types):
                raise fail("a boolean can only be compared with a boolean", pos)
            return _BOOL
        case _Logical(op=op, operands=operands, pos=pos):
            for operand in operands:
                condition(operand, op, pos)
            return _BOOL
        case _Not(operand=operand, pos=pos):
            condition(operand, "NOT", pos)
            return _BOOL
        case _Between(operand=operand, low=low, high=high, pos=pos):
            # 3.8.1.1: BETWEEN takes arithmetic expressions and means >= AND <=, which strings
            # and booleans do not have.
            for part in (operand, low, high):
                if _type_of(part, text) in (_BOOL, _STR):
                    raise fail("BETWEEN needs numeric operands", _start(part, pos))
            return _BOOL
        case _In(operand=operand, items=items):
            for part in (operand, *items):
                _type_of(part, text)
            return _BOOL
        case _Like(operand=operand, pos=pos):
            if _type_of(operand, text) in (_BOOL, _NUM):
                raise fail("LIKE needs a string operand", pos)
            return _BOOL
        case _IsNull(operand=operand):
            _type_of(operand, text)
            return _BOOL
    raise AssertionError(node)  # pragma: no cover


def _children(node: _Node) -> tuple[_Node, ...]:
    match node:
        case _Unary(operand=o) | _Not(operand=o) | _Like(operand=o) | _IsNull(operand=o):
            return (o,)
        case _Arithmetic(left=left, right=right) | _Comparison(left=left, right=right):
            return (left, right)
        case _Logical(operands=operands):
            return operands
        case _Between(operand=o, low=low, high=high):
            return (o, low, high)
        case _In(operand=o, items=items):
            return (o, *items)
    return ()


def _check_depth(tree: _Node, text: str) -> None:
    """InvalidSelector if the tree nests more than MAX_NESTING levels: the parser bounds
    parentheses, NOTs and signs as it reads them, and a chain of operators deepens the tree
    too. The top node is at depth 0 and a value under the last of MAX_NESTING nested operators
    at MAX_NESTING + 1 (`NOT NOT a = 1` has a at depth 3). A walk with a stack of its own, so
    it cannot overflow Python's."""
    pending = [(tree, 0)]
    while pending:
        node, depth = pending.pop()
        if depth > MAX_NESTING + 1:
            raise InvalidSelector(
                f"selector nested deeper than {MAX_NESTING} levels", text, _start(node, 0)
            )
        pending.extend((child, depth + 1) for child in _children(node))


def _start(node: _Node, default: int) -> int:
    match node:
        case _Literal(pos=pos) | _Identifier(pos=pos) | _Unary(pos=pos) | _Not(pos=pos):
            return pos
        case _Arithmetic(left=left) | _Comparison(left=left):
            return _start(left, default)
        case _Logical(operands=operands):
            return _start(operands[0], default)
        case _Between(operand=operand) | _In(operand=operand) | _Like(operand=operand):
            return _start(operand, default)
        case _IsNull(operand=operand):
            return _start(operand, default)
    return default  # pragma: no cover


# --------------------------------------------------------------------------- value semantics

_SCALARS: Final = (bool, int, float, str)
_INF: Final = math.inf
_NAN: Final = math.nan


def _is_number(v: object) -> bool:
    t = type(v)
    if t is int or t is float:
        return True
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _promoted(a: object, b: object) -> tuple[object, object] | None:
    """The pair in comparable form, or None when the types are not like (3.8.1.1).

    Exact and approximate numbers compare after Java numeric promotion (a long against a
    double compares as double); strings with strings, booleans with booleans.
    """
    if _is_number(a) and _is_number(b):
        if isinstance(a, float) or isinstance(b, float):
            return float(a), float(b)  # type: ignore[arg-type]
        return int(a), int(b)  # type: ignore[call-overload]
    if isinstance(a, bool) and isinstance(b, bool):
        return bool(a), bool(b)
    if isinstance(a, str) and isinstance(b, str):
        return str(a), str(b)
    return None


def _equal(a: object, b: object) -> bool | None:
    if a is None or b is None:
        return None
    t = type(a)
    if t is type(b) and t in _SCALARS:
        return a == b
    pair = _promoted(a, b)
    return False if pair is None else pair[0] == pair[1]


def _not_equal(a: object, b: object) -> bool | None:
    if a is None or b is None:
        return None
    t = type(a)
    if t is type(b) and t in _SCALARS:
        return a != b
    pair = _promoted(a, b)
    return False if pair is None else pair[0] != pair[1]


def _ordering(op: Callable[[float, float], bool]) -> Callable[[object, object], bool | None]:
    def compare(a: object, b: object) -> bool | None:
        if a is None or b is None:
            return None
        t = type(a)
        if t is type(b) and (t is int or t is float):
            return op(a, b)  # type: ignore[arg-type]
        if _is_number(a) and _is_number(b):
            pair = _promoted(a, b)
            assert pair is not None
            return op(pair[0], pair[1])  # type: ignore[arg-type]
        return False  # unlike types, or strings/booleans, which have no order

    return compare


_COMPARE: Final[dict[str, Callable[[object, object], bool | None]]] = {
    "=": _equal,
    "<>": _not_equal,
    "<": _ordering(operator.lt),
    "<=": _ordering(operator.le),
    ">": _ordering(operator.gt),
    ">=": _ordering(operator.ge),
}
_PYTHON_OP: Final[dict[str, Callable[[Any, Any], Any]]] = {
    "=": operator.eq,
    "<>": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_MIRROR: Final = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


def _wrap_long(r: int) -> int:
    # Java long arithmetic wraps around on overflow.
    if _LONG_MIN <= r <= _LONG_MAX:
        return r
    return (r - _LONG_MIN) % 2**64 + _LONG_MIN


def _add(a: object, b: object) -> object:
    ta, tb = type(a), type(b)
    if ta is int and tb is int:
        return _wrap_long(a + b)  # type: ignore[operator]
    if (ta is float or tb is float) and _is_number(a) and _is_number(b):
        return float(a) + float(b)  # type: ignore[arg-type]
    if _is_number(a) and _is_number(b):
        return _wrap_long(int(a) + int(b))  # type: ignore[call-overload]
    if isinstance(a, str) and isinstance(b, str):
        return a + b  # string concatenation (ActiveMQ/Artemis extension)
    return None


def _subtract(a: object, b: object) -> object:
    if not (_is_number(a) and _is_number(b)):
        return None
    if isinstance(a, float) or isinstance(b, float):
        return float(a) - float(b)  # type: ignore[arg-type]
    return _wrap_long(int(a) - int(b))  # type: ignore[call-overload]


def _multiply(a: object, b: object) -> object:
    if not (_is_number(a) and _is_number(b)):
        return None
    if isinstance(a, float) or isinstance(b, float):
        return float(a) * float(b)  # type: ignore[arg-type]
    return _wrap_long(int(a) * int(b))  # type: ignore[call-overload]


def _divide(a: object, b: object) -> object:
    # Double division even for two exact operands (ActiveMQ, Artemis, Qpid Broker-J), with
    # IEEE 754 results for a zero divisor, as Java's double division gives.
    if not (_is_number(a) and _is_number(b)):
        return None
    x, y = float(a), float(b)  # type: ignore[arg-type]
    if y == 0.0:
        if x == 0.0 or x != x:
            return _NAN
        return math.copysign(_INF, x) * math.copysign(1.0, y)
    return x / y


def _remainder(a: object, b: object) -> object:
    # Java %: the result takes the sign of the dividend (truncated division).
    if not (_is_number(a) and _is_number(b)):
        return None
    if isinstance(a, float) or isinstance(b, float):
        x, y = float(a), float(b)  # type: ignore[arg-type]
        if y == 0.0 or math.isinf(x) or x != x or y != y:
            return _NAN
        return math.fmod(x, y)
    x_int, y_int = int(a), int(b)  # type: ignore[call-overload]
    if y_int == 0:
        return None  # Java throws ArithmeticException; a failing selector selects nothing
    r = abs(x_int) % abs(y_int)
    return _wrap_long(-r if x_int < 0 else r)


_ARITHMETIC: Final[dict[str, Callable[[object, object], object]]] = {
    "+": _add,
    "-": _subtract,
    "*": _multiply,
    "/": _divide,
    "%": _remainder,
}


def _negate(a: object) -> object:
    if type(a) is int:
        return _wrap_long(-a)
    if type(a) is float:
        return -a
    if _is_number(a):
        return -float(a) if isinstance(a, float) else _wrap_long(-int(a))  # type: ignore[call-overload]
    return None


def _plus(a: object) -> object:
    return a if _is_number(a) else None


def _between(v: object, low: object, high: object) -> bool | None:
    # 3.8.1.1: "age BETWEEN 15 and 19" is equivalent to "age >= 15 AND age <= 19".
    ge = _COMPARE[">="](v, low)
    if ge is False:
        return False
    le = _COMPARE["<="](v, high)
    if le is False:
        return False
    return None if ge is None or le is None else True


def _not_between(v: object, low: object, high: object) -> bool | None:
    # 3.8.1.1: "age NOT BETWEEN 15 and 19" is equivalent to "age < 15 OR age > 19", so unlike
    # types (false comparisons) never make NOT BETWEEN true.
    lt = _COMPARE["<"](v, low)
    if lt is True:
        return True
    gt = _COMPARE[">"](v, high)
    if gt is True:
        return True
    return None if lt is None or gt is None else False


def _in(v: object, items: Sequence[object]) -> bool | None:
    # x IN (a, b) is x = a OR x = b (3.8.1.1); an unlike item is false.
    if v is None:
        return None
    unknown = False
    for item in items:
        if item is None:
            unknown = True
        elif _equal(v, item):
            return True
    return None if unknown else False


def _not_in(v: object, items: Sequence[object]) -> bool | None:
    # The negation of IN, except that a type mismatch with an item is not "not equal": a
    # value of the wrong type is not selected by NOT IN either (Qpid, QPID-6717).
    if v is None:
        return None
    unknown = mismatch = False
    for item in items:
        if item is None:
            unknown = True
            continue
        pair = _promoted(v, item)
        if pair is None:
            mismatch = True
        elif pair[0] == pair[1]:
            return False
    if unknown:
        return None
    return not mismatch


# --------------------------------------------------------------------------- compilation

_DELIVERY_MODES: Final = {1: "NON_PERSISTENT", 2: "PERSISTENT"}


def _load(name: str) -> Evaluator:
    if name == "JMSDeliveryMode":

        def delivery_mode(p: Properties) -> object:
            v = p.get(name)
            if type(v) is int:
                return _DELIVERY_MODES.get(v, v)
            return v

        return delivery_mode

    def load(p: Properties) -> object:
        return p.get(name)

    return load


def _plain_property(node: _Node) -> str | None:
    """The name, if `node` is a property read as is (the specialised closures inline the read)."""
    if isinstance(node, _Identifier) and node.name != "JMSDeliveryMode":
        return node.name
    return None


def _mentions_identifier(node: _Node) -> bool:
    match node:
        case _Literal():
            return False
        case _Identifier():
            return True
        case _Unary(operand=o) | _Not(operand=o) | _Like(operand=o) | _IsNull(operand=o):
            return _mentions_identifier(o)
        case _Arithmetic(left=left, right=right) | _Comparison(left=left, right=right):
            return _mentions_identifier(left) or _mentions_identifier(right)
        case _Logical(operands=operands):
            return any(_mentions_identifier(o) for o in operands)
        case _Between(operand=o, low=low, high=high):
            return any(_mentions_identifier(x) for x in (o, low, high))
        case _In(operand=o, items=items):
            return any(_mentions_identifier(x) for x in (o, *items))
    return True  # pragma: no cover


def _compile(node: _Node) -> Evaluator:
    """A closure computing `node`'s value; booleans are True, False or None (UNKNOWN)."""
    if not isinstance(node, _Literal) and not _mentions_identifier(node):
        # Constant subexpression: fold it once.
        constant = _compile_node(node)({})
        return lambda p: constant
    return _compile_node(node)


def _compile_condition(node: _Node) -> Evaluator:
    """Like _compile, but a non-boolean value (a property used as a condition) is UNKNOWN."""
    name = _plain_property(node)
    if name is not None:

        def boolean_property(p: Properties) -> object:
            v = p.get(name)
            return v if v is True or v is False else None

        return boolean_property
    if isinstance(node, _Identifier):
        load = _load(node.name)

        def boolean_header(p: Properties) -> object:
            v = load(p)
            return v if v is True or v is False else None

        return boolean_header
    return _compile(node)


def _compile_node(node: _Node) -> Evaluator:
    match node:
        case _Literal(value=value):
            return lambda p: value
        case _Identifier(name=name):
            return _load(name)
        case _Unary(op=op, operand=operand):
            inner = _compile(operand)
            unary = _negate if op == "-" else _plus
            return lambda p: unary(inner(p))
        case _Arithmetic(op=op, left=left, right=right):
            return _compile_arithmetic(op, _compile(left), _compile(right))
        case _Comparison(op=op, left=left, right=right):
            return _compile_comparison(op, left, right)
        case _Logical(op=op, operands=operands):
            return _compile_logical(op, [_compile_condition(o) for o in operands])
        case _Not(operand=operand):
            inner = _compile_condition(operand)

            def not_(p: Properties) -> object:
                r = inner(p)
                return None if r is None else not r

            return not_
        case _Between(negated=negated, operand=operand, low=low, high=high):
            return _compile_between(negated, operand, low, high)
        case _In(negated=negated, operand=operand, items=items):
            return _compile_in(negated, operand, items)
        case _Like(negated=negated, operand=operand, pattern=pattern, escape=escape):
            return _compile_like(negated, operand, like_matcher(pattern, escape))
        case _IsNull(negated=negated, operand=operand):
            prop = _plain_property(operand)
            if prop is not None:
                if negated:
                    return lambda p: p.get(prop) is not None
                return lambda p: p.get(prop) is None
            inner = _compile(operand)
            if negated:
                return lambda p: inner(p) is not None
            return lambda p: inner(p) is None
    raise AssertionError(node)  # pragma: no cover


def _compile_arithmetic(op: str, left: Evaluator, right: Evaluator) -> Evaluator:
    apply = _ARITHMETIC[op]

    def arithmetic(p: Properties) -> object:
        a = left(p)
        if a is None:
            return None
        b = right(p)
        if b is None:
            return None
        return apply(a, b)

    return arithmetic


def _compile_comparison(op: str, left: _Node, right: _Node) -> Evaluator:
    if isinstance(left, _Literal) and isinstance(right, _Identifier):
        left, right, op = right, left, _MIRROR[op]
    name = _plain_property(left)
    if name is not None and isinstance(right, _Literal):
        return _compile_property_comparison(op, name, right.value)
    compare = _COMPARE[op]
    lhs, rhs = _compile(left), _compile(right)
    return lambda p: compare(lhs(p), rhs(p))


def _compile_property_comparison(op: str, name: str, literal: object) -> Evaluator:
    # The common shape `property op literal`: test the value's exact type first and compare
    # directly, falling back to the general rules for anything unusual.
    compare = _COMPARE[op]
    python_op = _PYTHON_OP[op]
    if type(literal) is str or type(literal) is bool:
        kind = type(literal)
        if op == "=":

            def equal(p: Properties) -> object:
                v = p.get(name)
                if type(v) is kind:
                    return v == literal
                return None if v is None else compare(v, literal)

            return equal

        def same_kind(p: Properties) -> object:
            v = p.get(name)
            if type(v) is kind:
                return python_op(v, literal)
            return None if v is None else compare(v, literal)

        return same_kind
    if type(literal) is int:
        as_float = float(literal)

        def exact(p: Properties) -> object:
            v = p.get(name)
            t = type(v)
            if t is int:
                return python_op(v, literal)
            if t is float:
                return python_op(v, as_float)
            return None if v is None else compare(v, literal)

        return exact

    def approximate(p: Properties) -> object:
        v = p.get(name)
        t = type(v)
        if t is float:
            return python_op(v, literal)
        if t is int:
            return python_op(float(v), literal)  # type: ignore[arg-type]
        return None if v is None else compare(v, literal)

    return approximate


def _compile_logical(op: str, operands: list[Evaluator]) -> Evaluator:
    # SQL three-valued AND/OR (3.8.1.2, tables 3-4 and 3-5): FALSE (for AND) or TRUE (for OR)
    # decides regardless of UNKNOWN operands.
    decisive = op == "OR"
    if len(operands) == 2:
        first, second = operands

        def binary(p: Properties) -> object:
            a = first(p)
            if a is decisive:
                return decisive
            b = second(p)
            if b is decisive:
                return decisive
            if a is None or b is None:
                return None
            return not decisive

        return binary
    conditions = tuple(operands)

    def nary(p: Properties) -> object:
        unknown = False
        for condition in conditions:
            r = condition(p)
            if r is decisive:
                return decisive
            if r is None:
                unknown = True
        return None if unknown else not decisive

    return nary


def _compile_between(negated: bool, operand: _Node, low: _Node, high: _Node) -> Evaluator:
    test = _not_between if negated else _between
    name = _plain_property(operand)
    if (
        name is not None
        and isinstance(low, _Literal)
        and isinstance(high, _Literal)
        and type(low.value) is int
        and type(high.value) is int
    ):
        lo, hi = low.value, high.value

        def property_between(p: Properties) -> object:
            v = p.get(name)
            if type(v) is int:
                inside = lo <= v <= hi
                return not inside if negated else inside
            return None if v is None else test(v, lo, hi)

        return property_between
    value, lower, upper = _compile(operand), _compile(low), _compile(high)
    return lambda p: test(value(p), lower(p), upper(p))


def _compile_in(negated: bool, operand: _Node, items: tuple[_Node, ...]) -> Evaluator:
    test = _not_in if negated else _in
    value = _compile(operand)
    name = _plain_property(operand)
    if all(isinstance(item, _Literal) for item in items):
        constants = tuple(item.value for item in items)  # type: ignore[union-attr]
        if name is not None and all(type(c) is str for c in constants):
            members = frozenset(constants)

            def in_strings(p: Properties) -> object:
                v = p.get(name)
                if type(v) is str:
                    return (v not in members) if negated else (v in members)
                return None if v is None else test(v, constants)

            return in_strings
        return lambda p: test(value(p), constants)
    evaluators = tuple(_compile(item) for item in items)
    return lambda p: test(value(p), [e(p) for e in evaluators])


def _compile_like(negated: bool, operand: _Node, match: Callable[[str], bool]) -> Evaluator:
    name = _plain_property(operand)
    if name is not None:

        def property_like(p: Properties) -> object:
            v = p.get(name)
            if type(v) is str:
                return not match(v) if negated else match(v)
            if v is None or not isinstance(v, str):
                return None  # NULL, or not a string: UNKNOWN (3.8.1.2; LIKE is for strings)
            return not match(v) if negated else match(v)

        return property_like
    value = _compile(operand)

    def like(p: Properties) -> object:
        v = value(p)
        if type(v) is str or isinstance(v, str):
            return not match(v) if negated else match(v)
        return None  # NULL, or not a string: UNKNOWN (3.8.1.2; LIKE applies to strings)

    return like


def _select_all(p: Properties) -> object:
    return True


# --------------------------------------------------------------------------- public API


class Selector:
    """A compiled JMS 1.1 message selector.

    >>> s = Selector.compile("sport = 'horse-racing' AND country IN ('GB', 'IE')")
    >>> s.matches({"sport": "horse-racing", "country": "IE"})
    True
    >>> s.evaluate({"sport": "horse-racing"}) is None  # country is NULL: UNKNOWN
    True
    """

    __slots__ = ("text", "_evaluate")

    text: str
    _evaluate: Evaluator

    def __init__(self, text: str, evaluate: Evaluator) -> None:
        self.text = text
        self._evaluate = evaluate

    @classmethod
    def compile(cls, text: str) -> Selector:
        """Parse and compile `text`; raises InvalidSelector with the offending position."""
        if not isinstance(text, str):
            raise TypeError(f"a selector is a str, not {type(text).__name__}")
        tree = _Parser(text).parse()
        if tree is None:
            return cls(text, _select_all)  # empty or blank: no selector (3.8.1.1)
        _check_depth(tree, text)
        if _type_of(tree, text) not in (_BOOL, _ANY):
            raise InvalidSelector("a selector must be a boolean expression", text, _start(tree, 0))
        return cls(text, _compile_condition(tree))

    def evaluate(self, properties: Mapping[str, object]) -> bool | None:
        """The selector's three-valued result: True, False or None (UNKNOWN)."""
        return self._evaluate(properties)  # type: ignore[return-value]

    def matches(self, properties: Mapping[str, object]) -> bool:
        """Whether the selector selects an item with these properties (evaluates to TRUE)."""
        return self._evaluate(properties) is True

    def __repr__(self) -> str:
        return f"Selector.compile({self.text!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Selector) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def __reduce__(self) -> tuple[Callable[[str], Selector], tuple[str]]:
        # Closures do not pickle; a selector travels as its text and is compiled again
        # (e.g. when shipped to Spark workers).
        return (Selector.compile, (self.text,))
