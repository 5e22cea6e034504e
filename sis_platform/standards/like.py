"""JMS `LIKE` patterns (JMS 1.1 section 3.8.1.1), parsed once and matched in time linear in the
value, whatever the pattern.

'_' stands for any one character, '%' for any sequence of characters, everything else for
itself. The escape character (the ESCAPE clause) escapes only a following '%', '_' or itself;
elsewhere it stands for itself (ActiveMQ/Artemis), so ESCAPE '%' and ESCAPE '_' work.

The values matched are message content (a course name can be megabytes), so no regular
expression runs over them: with several '%' one backtracks, in time growing with a power of the
value's length, and `re` holds the GIL meanwhile, so the per-item watchdog (runtime/guard.py) could
not
even fire. Instead a pattern is cut at its '%' into segments of fixed length. The first
segment must match at the start of the value, the last at its end, and each segment between
them is taken at its leftmost match after the one before: a leftmost match never loses one,
as whatever matches after a later position also matches after an earlier one. A segment
without '_' is found by `str.find`. One with '_' is found by a shift-and scan (one bit per
pattern character, all candidate positions advanced together with one integer operation per
value character), which jumps with `str.find` to the next place its longest literal run occurs
whenever no candidate is alive. Each value character is so looked at once, whatever the
pattern, and the loop is Python code, which yields the GIL to the watchdog.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

__all__ = ["LikePattern", "like_matcher"]


class _Wildcard(Enum):
    ANY = "%"  # any sequence of characters
    ONE = "_"  # any one character


# A pattern item: a literal character (an escaped '%' or '_' among them) or a wildcard.
_Item = str | _Wildcard


class _Run(NamedTuple):
    """Literal characters of a segment, and where they start in it."""

    offset: int
    text: str

    @property
    def end(self) -> int:
        return self.offset + len(self.text)


@dataclass(frozen=True, slots=True)
class _Segment:
    """The pattern between two '%': `length` characters, `runs` of them literal, any character
    ('_') elsewhere. For the shift-and scan, bit i of `masks[c]` says that character c may
    stand at position i, and `wild` has the bits of the '_' positions (any other character)."""

    length: int
    runs: tuple[_Run, ...]  # the longest (the rarest, likely) first
    masks: Mapping[str, int]
    wild: int
    literal: str | None  # the segment's text when it has no '_'

    def matches_at(self, value: str, start: int) -> bool:
        if self.literal is not None:
            return value.startswith(self.literal, start)
        return all(value.startswith(run.text, start + run.offset) for run in self.runs)

    def find(self, value: str, start: int, end: int) -> int:
        """The leftmost position p >= `start` where the segment matches and ends by `end`
        (p + length <= end), or -1."""
        if start > end - self.length:
            return -1
        if self.literal is not None:
            return value.find(self.literal, start, end)
        if not self.runs:
            return start
        return self._scan(value, start, end)

    def _scan(self, value: str, start: int, end: int) -> int:
        # Bit i of `alive` is set after value[j] when value[j - i : j + 1] matches the
        # segment's first i + 1 characters; the segment matches where bit length - 1 is.
        masks, wild, full = self.masks, self.wild, 1 << (self.length - 1)
        rare = self.runs[0]
        alive, j = 0, start
        while j < end:
            if not alive:
                # No match begun: the next can only start where the rarest run is in place.
                found = value.find(rare.text, j + rare.offset, end - self.length + rare.end)
                if found < 0:
                    return -1
                j = found - rare.offset
            alive = ((alive << 1) | 1) & masks.get(value[j], wild)
            if alive & full:
                return j - self.length + 1
            j += 1
        return -1


@dataclass(frozen=True, slots=True)
class LikePattern:
    """A parsed LIKE pattern: its first segment (anchored at the start), the segments between
    '%'s (found leftmost, in order) and its last segment (anchored at the end; None when the
    pattern has no '%', so the first segment is the whole value)."""

    first: _Segment
    middle: tuple[_Segment, ...]
    last: _Segment | None

    @classmethod
    def parse(cls, pattern: str, escape: str | None = None) -> LikePattern:
        segments = _segments(_items(pattern, escape))
        if len(segments) == 1:
            return cls(segments[0], (), None)
        middle = tuple(s for s in segments[1:-1] if s.length)
        return cls(segments[0], middle, segments[-1])

    def matches(self, value: str) -> bool:
        first, last = self.first, self.last
        if last is None:
            return len(value) == first.length and first.matches_at(value, 0)
        tail = len(value) - last.length
        if tail < first.length or not first.matches_at(value, 0):
            return False
        if not last.matches_at(value, tail):
            return False
        position = first.length
        for segment in self.middle:
            found = segment.find(value, position, tail)
            if found < 0:
                return False
            position = found + segment.length
        return True


def like_matcher(pattern: str, escape: str | None = None) -> Callable[[str], bool]:
    """A function telling whether a string matches the LIKE pattern.

    The shapes selectors mostly use ('E%', '%Park', 'a%b', '%Downs%', no '_') become one or
    two `str` method calls; any other pattern is a LikePattern.
    """
    parsed = LikePattern.parse(pattern, escape)
    head = parsed.first.literal
    if parsed.last is None:
        return parsed.matches if head is None else head.__eq__
    tail = parsed.last.literal
    if head is None or tail is None:
        return parsed.matches
    if not parsed.middle:
        if not head and not tail:
            return lambda s: True
        if not tail:
            return lambda s: s.startswith(head)
        if not head:
            return lambda s: s.endswith(tail)
        least = len(head) + len(tail)
        return lambda s: len(s) >= least and s.startswith(head) and s.endswith(tail)
    if len(parsed.middle) == 1 and not head and not tail:
        inner = parsed.middle[0].literal
        if inner is not None:
            return lambda s: inner in s
    return parsed.matches


def _items(pattern: str, escape: str | None) -> list[_Item]:
    """The pattern as literal characters and wildcards, its escapes resolved."""
    items: list[_Item] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == escape and i + 1 < n and pattern[i + 1] in ("%", "_", escape):
            items.append(pattern[i + 1])
            i += 2
            continue
        items.append(_Wildcard.ANY if c == "%" else _Wildcard.ONE if c == "_" else c)
        i += 1
    return items


def _segments(items: Sequence[_Item]) -> list[_Segment]:
    """The segments around the '%' wildcards (empty ones included, so the first and the last
    stay the pattern's ends)."""
    segments: list[_Segment] = []
    current: list[_Item] = []
    for item in (*items, _Wildcard.ANY):
        if item is _Wildcard.ANY:
            segments.append(_segment(current))
            current = []
        else:
            current.append(item)
    return segments


def _segment(items: Sequence[_Item]) -> _Segment:
    runs: list[_Run] = []
    chars: list[str] = []
    for offset, item in enumerate((*items, _Wildcard.ONE)):
        if isinstance(item, str):
            chars.append(item)
            continue
        if chars:
            runs.append(_Run(offset - len(chars), "".join(chars)))
            chars = []
    runs.sort(key=lambda run: -len(run.text))
    wild = sum(1 << i for i, item in enumerate(items) if item is _Wildcard.ONE)
    masks: dict[str, int] = {}
    for i, item in enumerate(items):
        if isinstance(item, str):
            masks[item] = masks.get(item, wild) | 1 << i
    literal = None if wild else "".join(run.text for run in runs)
    return _Segment(len(items), tuple(runs), masks, wild, literal)
