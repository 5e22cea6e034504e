"""Validating a patched master by re-checking only what the patch can have changed.

docs/feed.md ("Update messages"): the patched document must still be valid against the
schema. Validating the whole `event` after every update is the fold's largest cost (a race
with four markets is a few hundred elements), while a typical update moves a price or a
status: a handful of attributes. This module proves, from the operations alone, which parts
of the master an update can have touched, so that only those are validated.

Why that is sound. The previous master was valid (master items are validated with their
message, every applied update was validated). In the event vocabulary an element is valid
exactly when its own attributes are valid, its children's names fit its content model, and
each child element is valid; nothing depends on siblings or ancestors. So if every node the
patch changed lies in the subtree of a "deep" region root, or is a "shallow" region root
whose attributes alone changed, the result is valid exactly when each deep root's subtree and
each shallow root's attributes are valid (ancestors outside the regions keep their children
and attributes, and those children stay valid). Every vocabulary element is valid without
children (`market*`, `selection*`, `price?`, empty), which is what lets a shallow root be
checked as a copy without its children.

Which regions, and when the proof holds. The regions are only derived for selectors whose
parsed form (sis_platform.standards.xpath, the one selector parser) is plain, the form the
provider uses and docs/feed.md shows:

    /event(/name([@attr='literal'])*)*(/@name)?

(child steps naming unprefixed elements, predicates comparing unprefixed attributes with
literals; no positions, wildcards, other predicates or final steps, and no default namespace
in scope of the operation), and only when no operation changes an attribute that any selector's
predicates read (so `@id` keys cannot move under another operation's selector). Under those
conditions a selector evaluated on the result finds the node the operation touched, unless a
later operation removed or replaced it, in which case the selector finds nothing or a node
inside that later operation's region, or finds two nodes; the check then falls back to
validating the whole document. Per operation (RFC 5261):

- `replace`/`remove` of `.../@a`, and `add type="@a"`: shallow region at the element;
- `add` without `pos` or with `pos="prepend"`: deep region at the selected element;
- `add pos="before|after"`, `replace` or `remove` of an element: deep region at its parent.

Anything else (text, comment or namespace nodes, other selector forms, a region at the root,
content that declares or uses a namespace) is validated whole. The fold walks the same regions
against the structural bounds (fold._scoped_growth); content with namespaces is left out of
the shortcut because the bound on a master's namespace declarations in all
(`max_document_namespaces`) needs the whole master counted. A region that fails, or any
doubt, is answered by validating the whole event, so an invalid result is reported with the
same error text as without the shortcut.
tests/domain/test_patchscope.py compares both ways on every update of a simulated day.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

from lxml import etree

from sis_platform.domain.limits import DEFAULT_LIMITS, Limits
from sis_platform.domain.schema import fragment_schema, validate_event
from sis_platform.standards.xmlpatch import in_scope, in_scope_of
from sis_platform.standards.xpath import (
    NCNAME,
    AttributeEquals,
    AttributeStep,
    ElementStep,
    QName,
    SelectorError,
    parse_selector,
    render_steps,
)

_ATTRIBUTE_TYPE = re.compile(rf"@({NCNAME})")

# One location step: element name and the (attribute, value) pairs its predicates require.
Step = tuple[str, tuple[tuple[str, str], ...]]
# An absolute path of element steps from the root `event` step.
Path = tuple[Step, ...]


@dataclass(frozen=True)
class PatchScope:
    """Where an update can have changed a master: paths of region roots."""

    shallow: tuple[Path, ...]  # elements whose attributes (only) may have changed
    deep: tuple[Path, ...]  # elements whose whole subtree may have changed


# Selectors repeat across messages (the same market and selection ids in every race), so their
# forms are memoized: a pure function of the string and the bounds, bounded (8,192 selectors of
# at most max_selector_length characters: patch_scope passes no longer one).
@functools.lru_cache(maxsize=8192)
def _parse_selector(
    selector: str, limits: Limits
) -> tuple[Path, str | None, frozenset[str]] | None:
    """(element path, attribute name or None, attribute names its predicates read) of a plain
    selector, or None for another form (or a selector the patch engine refuses)."""
    try:
        parsed = parse_selector(selector, limits)
    except SelectorError:
        return None
    last = parsed.last
    if parsed.id_values is not None or (last is not None and not isinstance(last, AttributeStep)):
        return None
    steps: list[Step] = []
    for step in parsed.steps:
        if step.name.prefix or step.name.local == "*":
            return None
        pairs: list[tuple[str, str]] = []
        for predicate in step.predicates:
            if not isinstance(predicate, AttributeEquals) or predicate.name.prefix:
                return None
            pairs.append((predicate.name.local, predicate.value))
        steps.append((step.name.local, tuple(pairs)))
    if not steps or steps[0][0] != "event":
        return None
    attribute: str | None = None
    if last is not None:
        if last.name.prefix:
            return None
        attribute = last.name.local
    keys = frozenset(key for _, pairs in steps for key, _ in pairs)
    return tuple(steps), attribute, keys


def patch_scope(operations: etree._Element, limits: Limits = DEFAULT_LIMITS) -> PatchScope | None:
    """The regions an update's operations can change, or None when that cannot be proved.

    `limits` bound the selectors as the patch engine's do (a selector over them is refused
    there, and here gives None).
    """
    shallow: list[Path] = []
    deep: list[Path] = []
    changed_attributes: set[str] = set()
    keys: set[str] = set()
    inherited = in_scope_of(operations)  # read once: an operation adds its own to it
    for operation in operations:
        tag = operation.tag
        if not isinstance(tag, str):
            continue  # comments and processing instructions between operations
        if "" in in_scope(operation, inherited):
            return None  # RFC 5261: unprefixed names in `sel` then mean that namespace
        if _content_uses_namespaces(operation):
            return None
        sel = operation.get("sel", "")
        if len(sel) > limits.max_selector_length:
            return None  # refused by the engine too; never a key of the cache below
        parsed = _parse_selector(sel, limits)
        if parsed is None:
            return None
        path, attribute, read = parsed
        if read:
            keys |= read
        region: Path
        if tag == "replace" or tag == "remove":
            if attribute is not None:
                changed_attributes.add(attribute)
                shallow.append(path)
                continue
            region = path[:-1]
        elif tag == "add":
            if attribute is not None:
                return None  # adding to an attribute node: the engine decides the error
            type_ = operation.get("type")
            pos = operation.get("pos")
            if type_ is not None:
                named = _ATTRIBUTE_TYPE.fullmatch(type_)
                if named is None or pos is not None:
                    return None  # namespace declarations, or a directive the engine rejects
                changed_attributes.add(named[1])
                shallow.append(path)
                continue
            if pos is None or pos == "prepend":
                region = path
            elif pos in ("before", "after"):
                region = path[:-1]
            else:
                return None
        else:
            return None
        if len(region) <= 1:
            return None  # the event's own children change: validate it whole
        deep.append(region)
    if changed_attributes & keys:
        return None
    shallow_paths = tuple(dict.fromkeys(shallow))
    if not deep:
        return PatchScope(shallow=shallow_paths, deep=())
    # A region inside a deep region is checked with it.
    deep_set = set(deep)

    def covered(path: Path, strictly: bool) -> bool:
        return any(path[:n] in deep_set for n in range(1, len(path) + (0 if strictly else 1)))

    return PatchScope(
        shallow=tuple(p for p in shallow_paths if not covered(p, strictly=False)),
        deep=tuple(p for p in dict.fromkeys(deep) if not covered(p, strictly=True)),
    )


def _content_uses_namespaces(operation: etree._Element) -> bool:
    """Whether an operation's content declares a namespace or names a node in one (which the
    patch engine then declares where it inserts it)."""
    for child in operation:
        if not isinstance(child.tag, str):
            continue  # a comment or processing instruction: no namespace, nothing to walk
        for event, node in etree.iterwalk(child, events=("start-ns", "start")):
            if event == "start-ns":
                return True
            assert isinstance(node, etree._Element)
            tag = node.tag
            if isinstance(tag, str) and (tag[0] == "{" or any(k[0] == "{" for k in node.attrib)):
                return True
    return False


@functools.lru_cache(maxsize=8192)
def _compiled(path: Path) -> etree.XPath:
    # The same selector as the operation's, rendered as the patch engine renders it (so the
    # elements it reports as located are found by this string), compiled once per distinct
    # path: they repeat across messages.
    steps = tuple(
        ElementStep(
            QName("", name),
            tuple(AttributeEquals(QName("", key), value) for key, value in predicates),
        )
        for name, predicates in path
    )
    return etree.XPath(render_steps(steps))


def _resolve(
    tree: etree._ElementTree, path: Path, located: Mapping[str, list[etree._Element]]
) -> list[etree._Element]:
    xpath = _compiled(path)
    found = located.get(xpath.path)
    if found is not None:
        return found
    # A location path of element steps always evaluates to a node-set of elements.
    return cast(list[etree._Element], xpath(tree))


def _valid_in_place(element: etree._Element) -> bool:
    return bool(fragment_schema().validate(element))


def validate_patched(
    patched: etree._ElementTree,
    scope: PatchScope | None,
    located: Mapping[str, list[etree._Element]] | None = None,
) -> str | None:
    """None when the patched master is valid, else the first error of the whole event.

    `located` may give, by the XPath of a location path, the elements it selects in `patched`
    (what Patch.apply_in_place reports), so that those paths are not evaluated again.
    """
    if located is None:
        located = {}
    root = patched.getroot()
    if scope is None or root.tag != "event":
        return validate_event(patched)
    for path in scope.deep:
        found = _resolve(patched, path, located)
        if len(found) != 1 or not _valid_in_place(found[0]):
            return validate_event(patched)
    for path in scope.shallow:
        found = _resolve(patched, path, located)
        if len(found) != 1:
            return validate_event(patched)
        element = found[0]
        if len(element):
            # Attributes only: the children are unchanged and were valid.
            element = etree.Element(element.tag, element.attrib)
        if not _valid_in_place(element):
            return validate_event(patched)
    return None


def region_elements(
    patched: etree._ElementTree, path: Path, located: Mapping[str, list[etree._Element]]
) -> list[etree._Element]:
    """The elements a scope path selects in `patched` (one, when the scope's proof holds), for
    other per-region checks of a patched master (fold: its structural bounds)."""
    return _resolve(patched, path, located)
