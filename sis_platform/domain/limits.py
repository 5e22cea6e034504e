"""The resource bounds every message is held to (docs/design.md invariant 6, "Bounded cost").

Whatever its bytes, a message reaches an end state (applied, duplicate, filtered or
dead-lettered) within bounded time and memory. Each bound below is enforced before the work it
protects (a structural bound before RELAX NG validation, an id bound before splitting, the
XPath bound before evaluation), so the cost of checking stays linear in the message. A message
beyond a bound is dead-lettered `too-large` (its bytes) or `too-complex` (anything else), with
a detail naming the bound, its configured value and its setting.

Defaults are at least 10x what a realistic feed needs. Measured on the simulator's racing days
(24,000 messages, `sis-feed`): largest body 27.6 KB, 14 ids in a message, 365 elements, depth
5, 8 attributes on an element, 68 patch operations, an XPath selector of 57 characters with 5
steps and 2 predicates, about 1 ms to fold one item. The feed contract (docs/feed.md) allows
bodies "rarely up to 1 MB", so the element bounds leave room for such a message too.

What the worst message the defaults allow costs to parse, count and validate (CPU time and peak
memory of one process, libxml2 2.14): 4 MiB of elements with 100 attributes each (600,000
attributes) 0.36 s and 132 MiB, almost all of it the parsed tree; 50,000 elements in an update
0.17 s and 8 MiB; a 50,000-element master 0.19 s and 33 MiB; 5,000 children or 64 levels
deep, milliseconds: every default is affordable. Beyond the bounds, the same messages stop at
the bound: 24,000 attributes on one element, which unbounded take RELAX NG 15 s and 4.4 GB,
and 200,000 children, which take 42 s, are rejected in 15 and 44 ms. 150,000 namespace
declarations on a message's root (4 MiB), which unbounded took 10 s to split into 200 events
or 1.3 GB for three updates of 40 operations, are rejected after parsing (libxml2 builds the
root's start tag whole), 0.3 to 1 s. scripts/bench_hostile.py measures every hostile class.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from sis_platform.standards.xpath import DEFAULT_SELECTOR_BOUNDS


@dataclass(frozen=True)
class Limits:
    """Per-message and per-item bounds; each field is an `SIS_*` setting (docs/configuration.md)."""

    # Body bytes (SIS_MAX_MESSAGE_BYTES). A larger message is moved aside at intake and never
    # held in a batch; it is logged with its size and digest and dead-lettered `too-large`.
    max_message_bytes: int = 4 * 1024 * 1024
    # Elements in one message, or in one master document after a patch (SIS_MAX_ELEMENTS).
    # Comments and processing instructions count as elements: they are nodes a patch copies.
    max_elements: int = 50_000
    # Element nesting depth, the root being 1 (SIS_MAX_DEPTH).
    max_depth: int = 64
    # Attributes on one element (SIS_MAX_ATTRIBUTES): RELAX NG validation cost grows with the
    # square of an element's attributes (6,000 on one element: 0.3 s and 275 MiB; 24,000:
    # 15 s and 4.4 GB), so this bound is what keeps validation linear.
    max_attributes: int = 100
    # Namespace declarations (`xmlns`, `xmlns:p`) on one element, and in one message or one
    # master document after a patch (SIS_MAX_NAMESPACES, SIS_MAX_DOCUMENT_NAMESPACES). lxml
    # keeps them outside an element's attributes, so max_attributes does not see them, yet
    # every `nsmap` and every in-scope namespace map the patch engine reads costs their number:
    # unbounded, 150,000 of them fit in 4 MiB and cost seconds and hundreds of MiB per
    # operation. The feed declares none; patches may bind a few prefixes for their selectors.
    max_namespaces: int = 64
    max_document_namespaces: int = 256
    # Children of one element, text aside (SIS_MAX_CHILDREN): RELAX NG time grows with their
    # square (20,000: 0.2 s; 200,000: 42 s).
    max_children: int = 5_000
    # Master ids listed in one message (SIS_MAX_IDS).
    max_ids: int = 200
    # Bytes all the items of one message would carry together (SIS_MAX_SPLIT_BYTES): an update's
    # operations are copied into every item row (one per id) when items leave the process, so
    # ids x operation bytes is what splitting costs. The feed's largest is 14 ids x 27.6 KB,
    # under 0.4 MB; 200 ids x 4 MiB would be 800 MiB.
    max_split_bytes: int = 64 * 1024 * 1024
    # Patch operations in one update message (SIS_MAX_PATCH_OPERATIONS).
    max_patch_operations: int = 1_000
    # Characters in one XPath selector (`sel`), and location steps plus predicates in it
    # (SIS_MAX_SELECTOR_LENGTH, SIS_MAX_SELECTOR_STEPS).
    max_selector_length: int = DEFAULT_SELECTOR_BOUNDS.max_selector_length
    max_selector_steps: int = DEFAULT_SELECTOR_BOUNDS.max_selector_steps
    # Wall-clock seconds one item may take to fold (SIS_ITEM_BUDGET_SECONDS). A worker that
    # overruns it is killed and the item dead-lettered `too-complex`; no content is expected to
    # get near it once the bounds above hold: it is the backstop for an evaluator bug.
    item_budget_seconds: float = 10.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not value > 0:
                raise ValueError(f"limit {f.name} must be positive, got {value!r}")


DEFAULT_LIMITS = Limits()
