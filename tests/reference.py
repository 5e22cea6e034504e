"""Comparing the platform's Delta tables with the reference pipeline, exactly."""

from __future__ import annotations

from collections import Counter
from typing import Any

from sis_platform.domain.pipeline import LoggedMessage, ReferencePipeline
from sis_platform.lake.tables import (
    DEAD_LETTERS,
    MASTER_DOCUMENTS,
    MASTER_VERSIONS,
    MESSAGE_OUTCOMES,
)


def reference_for(messages: list[LoggedMessage], **options: Any) -> ReferencePipeline:
    ref = ReferencePipeline(**options)
    ref.process(messages)
    return ref


def assert_lake_matches_reference(lake: Any, ref: ReferencePipeline) -> None:
    documents = lake.read(MASTER_DOCUMENTS).collect()
    ids = [r["master_id"] for r in documents]
    assert len(ids) == len(set(ids)), "master_documents holds a master twice"
    masters = {
        r["master_id"]: (r["version"], r["document"], r["stale"], r["filtered"])
        for r in documents
        # A tombstone (a rewound master that no longer exists) stands for no master.
        if r["document"] is not None or r["stale"] or r["filtered"]
    }
    expected_masters = {
        m: (s.version, s.document.decode() if s.document is not None else None, s.stale, s.filtered)
        for m, s in ref.masters.items()
    }
    assert sorted(masters) == sorted(expected_masters), (
        f"lake has {sorted(masters.items())[:5]}, reference {sorted(expected_masters.items())[:5]}"
    )
    assert masters == expected_masters

    versions = sorted(
        (
            r["master_id"],
            r["version"],
            r["message_id"],
            r["position"],
            r["operation"],
            r["document"],
        )
        for r in lake.read(MASTER_VERSIONS).collect()
    )
    expected_versions = sorted(
        (v.master_id, v.version, v.message_id, v.position, v.operation, v.document.decode())
        for v in ref.versions
    )
    assert len(versions) == len(expected_versions)
    assert versions == expected_versions

    dead = Counter(
        (r["message_id"], r["master_id"], r["position"], r["reason"], r["detail"], bytes(r["body"]))
        for r in lake.read(DEAD_LETTERS).collect()
    )
    expected_dead = Counter(
        (d.message_id, d.master_id, d.position, str(d.reason), d.detail, d.body)
        for d in ref.dead_letters
    )
    assert dead == expected_dead

    outcomes = Counter(r["outcome"] for r in lake.read(MESSAGE_OUTCOMES).collect())
    assert outcomes == Counter(str(o) for o in ref.outcome_counts().elements())
