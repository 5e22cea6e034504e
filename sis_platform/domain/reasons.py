"""Reason codes: why a message or item did not advance a master (docs/feed.md, "Invalid
messages and items")."""

from enum import StrEnum


class Reason(StrEnum):
    # Whole-message reasons: the message is dead-lettered at once and never retried.
    NOT_WELL_FORMED = "not-well-formed"
    SCHEMA_INVALID = "schema-invalid"
    INVALID_ENVELOPE = "invalid-envelope"  # bad root attributes: category/type/id/sent
    IDS_MISMATCH = "ids-mismatch"  # master events do not match the listed ids
    TOO_LARGE = "too-large"
    # Over a resource bound other than size (sis_platform.domain.limits): too many elements,
    # ids or patch operations, an XPath selector too long or outside the supported subset's
    # bounds, or an item that overran its time budget. Whole-message or item reason.
    TOO_COMPLEX = "too-complex"
    REDELIVERY_LIMIT = "redelivery-limit"

    # Item reasons.
    ORPHAN_UPDATE = "orphan-update"
    INVALID_RESULT = "invalid-result"  # patched master no longer valid against the schema
    MASTER_STALE = "master-stale"
    QUARANTINED = "quarantined"  # processing failed repeatedly for an unknown reason

    # RFC 5261 section 5 error names, used as item reasons for failed patches.
    INVALID_ATTRIBUTE_VALUE = "invalid-attribute-value"
    INVALID_CHARACTER_SET = "invalid-character-set"
    INVALID_DIFF_FORMAT = "invalid-diff-format"
    INVALID_ENTITY_DECLARATION = "invalid-entity-declaration"
    INVALID_NAMESPACE_PREFIX = "invalid-namespace-prefix"
    INVALID_NAMESPACE_URI = "invalid-namespace-uri"
    INVALID_NODE_TYPES = "invalid-node-types"
    INVALID_PATCH_DIRECTIVE = "invalid-patch-directive"
    INVALID_ROOT_ELEMENT_OPERATION = "invalid-root-element-operation"
    INVALID_XML_PROLOG_OPERATION = "invalid-xml-prolog-operation"
    INVALID_WHITESPACE_DIRECTIVE = "invalid-whitespace-directive"
    UNLOCATED_NODE = "unlocated-node"
    UNSUPPORTED_ID_FUNCTION = "unsupported-id-function"
    UNSUPPORTED_XML_ID = "unsupported-xml-id"


MESSAGE_REASONS = frozenset(
    {
        Reason.NOT_WELL_FORMED,
        Reason.SCHEMA_INVALID,
        Reason.INVALID_ENVELOPE,
        Reason.IDS_MISMATCH,
        Reason.TOO_LARGE,
        Reason.TOO_COMPLEX,
        Reason.REDELIVERY_LIMIT,
    }
)

# A failed patch (any RFC 5261 error), an invalid result, or an item over a bound (too-complex:
# it was not applied, so the master missed an update) marks the master stale.
STALE_REASONS = (
    frozenset(r for r in Reason if r not in MESSAGE_REASONS)
    - {Reason.ORPHAN_UPDATE, Reason.MASTER_STALE, Reason.QUARANTINED}
) | {Reason.TOO_COMPLEX}


class Outcome(StrEnum):
    """What became of a message or item: the message log accounts for each with one of these."""

    APPLIED = "applied"
    DUPLICATE = "duplicate"
    FILTERED = "filtered"
    DEAD_LETTERED = "dead-lettered"
