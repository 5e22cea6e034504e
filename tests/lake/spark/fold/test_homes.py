"""The current state partitioned by each master's home block (fold/homes.py): a master stays in
the block the fold first gave it a state, later steps read and merge their masters' partitions
only, the model follows, and a lake without home blocks is refused."""

from __future__ import annotations

import pytest

from sis_platform.lake.spark.fold import fold_step, homes
from sis_platform.lake.spark.fold.homes import Homes
from sis_platform.lake.spark.fold.ledger import UnplacedStateError
from sis_platform.lake.spark.model import refresh_model
from sis_platform.lake.tables import (
    EVENTS,
    FIRST_BLOCK,
    FOLD_STEPS,
    MASTER_DOCUMENTS,
    MASTER_INDEX,
    SELECTIONS,
)
from tests.domain.sportsdata_fixtures import (
    ASCOT_1430,
    ASCOT_1500,
    GO_SOFT,
    PRICE_7_TO_9,
    ROMFORD_1912,
    event,
    master,
    update,
)
from tests.lake.spark.fold.lakes import log_batch, message, new_lake
from tests.reference import assert_lake_matches_reference, reference_for

pytestmark = [pytest.mark.spark, pytest.mark.cost(90)]


def _homes(lake, table=MASTER_DOCUMENTS) -> dict[str, set[int]]:
    found: dict[str, set[int]] = {}
    for r in lake.read(table).select("master_id", FIRST_BLOCK).collect():
        found.setdefault(r["master_id"], set()).add(r[FIRST_BLOCK])
    return found


def test_masters_stay_in_their_first_block_and_steps_read_only_their_partitions(
    spark, tmp_path, monkeypatch
):
    # Blocks of two batches, so that four batches span three blocks.
    monkeypatch.setattr(homes, "BATCHES_PER_BLOCK", 2)
    lake = new_lake(spark, tmp_path)
    batches = [
        [message(master(event(ASCOT_1430)))],  # batch 1, block 0
        [message(master(event(ASCOT_1500)))],  # batch 2, block 1
        [message(update(ASCOT_1430, GO_SOFT)), message(master(event(ROMFORD_1912)))],  # 3
        [message(update(ASCOT_1500, PRICE_7_TO_9))],  # batch 4, block 2
    ]
    for seq, messages in enumerate(batches, start=1):
        log_batch(lake, seq, messages)
        assert fold_step(lake, max_batches=1).fold_step == seq
        assert refresh_model(lake).fold_step == seq
    expected = {ASCOT_1430: {0}, ASCOT_1500: {1}, ROMFORD_1912: {1}}
    assert _homes(lake) == expected
    assert _homes(lake, MASTER_INDEX) == expected
    assert _homes(lake, EVENTS) == expected
    assert set(_homes(lake, SELECTIONS)) == {ASCOT_1430, ASCOT_1500, ROMFORD_1912}
    # One row per master, in its home's partition, as the reference folds the same log.
    assert lake.read(EVENTS).groupBy("master_id").count().where("count > 1").isEmpty()
    assert_lake_matches_reference(lake, reference_for([m for b in batches for m in b]))
    # Each step recorded the homes of the masters it wrote, which the model read.
    steps = lake.read(FOLD_STEPS).orderBy("fold_step").collect()
    assert [list(r["master_blocks"]) for r in steps] == [[0], [1], [0, 1], [1]]

    # A step of ASCOT_1430 alone reads block 0's partition, not block 1's.
    documents = lake.read(MASTER_DOCUMENTS)
    masters = spark.createDataFrame([(ASCOT_1430, 9)], "master_id string, first_seq long")
    found = Homes.find(lake, masters, index_version=lake.version(MASTER_INDEX))
    assert found.blocks == (0,)
    read = found.documents(documents).inputFiles()
    assert read and all(f"{FIRST_BLOCK}=0" in f for f in read)
    assert any(f"{FIRST_BLOCK}=1" in f for f in documents.inputFiles())
    # A master the index does not name is new: its home is its first item's block.
    fresh = spark.createDataFrame([("NEW-1", 9), ("NEW-1", 7)], "master_id string, first_seq long")
    new = Homes.find(lake, fresh, index_version=lake.version(MASTER_INDEX))
    assert new.blocks == (3,)
    assert [tuple(r) for r in new.rows.collect()] == [("NEW-1", 3, True)]


def test_a_lake_whose_state_has_no_home_blocks_is_refused_and_left_alone(spark, tmp_path):
    lake = new_lake(spark, tmp_path)
    log_batch(lake, 1, [message(master(event(ASCOT_1430)))])
    old = MASTER_DOCUMENTS.schema()
    columns = [f for f in old.fields if f.name != FIRST_BLOCK]
    spark.createDataFrame([], old.__class__(columns)).write.format("delta").save(
        lake.path(MASTER_DOCUMENTS)
    )
    version = lake.version(MASTER_DOCUMENTS)
    with pytest.raises(UnplacedStateError, match="Upgrading a lake"):
        fold_step(lake)
    assert lake.version(MASTER_DOCUMENTS) == version
    assert not lake.exists(FOLD_STEPS) or lake.read(FOLD_STEPS).isEmpty()
