"""A batch run killed while it compacts the block of batches its write settled (lake/upkeep.py
`compact_blocks`): the block's rows are what they were, and the retried write's compaction
finds the block compact and vacuums, leaving every batch's rows as they were."""

from __future__ import annotations

import pytest

from sis_platform.lake.delta import Lake
from sis_platform.lake.spark.items import logged_condition
from sis_platform.lake.tables import BATCHES_PER_BLOCK, MESSAGE_ITEMS, RAW_MESSAGES, Table
from sis_platform.lake.upkeep import BLOCK_SETTLE_BATCHES, compact_blocks
from sis_platform.log.landing import batch_key
from sis_platform.settings import LakeUpkeepSettings
from tests.domain.sportsdata_fixtures import ASCOT_1430, GO_SOFT, event, master, update
from tests.faults.processes import SIGKILLED, drive
from tests.lake.spark.fold.lakes import log_batch, message

pytestmark = [pytest.mark.faults, pytest.mark.spark, pytest.mark.cost(180)]

SETTLING = BATCHES_PER_BLOCK + BLOCK_SETTLE_BATCHES


def _block_files(lake: Lake, table: Table, block: int) -> int:
    files = lake.read(table).inputFiles()
    return sum(f"batch_block={block}/" in f for f in files)


def _rows(lake: Lake, table: Table) -> dict[int, list[tuple]]:
    return {
        seq: sorted(map(tuple, lake.read(table).where(logged_condition(batch_key(seq))).collect()))
        for seq in (1, 2, 3, SETTLING)
    }


def test_killed_after_compacting_a_block_loses_nothing_and_the_retry_finishes(spark, tmp_path):
    lake = Lake(spark, str(tmp_path / "data" / "lake"), upkeep=LakeUpkeepSettings())
    log_batch(lake, 1, [message(master(event(ASCOT_1430)))])
    for seq in (2, 3, SETTLING):
        log_batch(lake, seq, [message(update(ASCOT_1430, GO_SOFT))])
    before = {t.name: _rows(lake, t) for t in (RAW_MESSAGES, MESSAGE_ITEMS)}
    for table in (RAW_MESSAGES, MESSAGE_ITEMS):
        assert _block_files(lake, table, 0) == 3
        code = drive(
            tmp_path,
            table.name,
            str(SETTLING),
            crash_at=f"{table.name}.after_compact",
            module="tests.faults.compact",
        )
        assert code == SIGKILLED
        assert _block_files(lake, table, 0) == 1  # compacted, then killed before the VACUUM
        assert _rows(lake, table) == before[table.name]
        done = compact_blocks(lake, table, [SETTLING], lake.upkeep)
        assert done.optimized == () and done.vacuumed == (table.name,)
        assert _rows(lake, table) == before[table.name]
