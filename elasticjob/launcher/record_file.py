"""``--job-record FILE``: the local launcher keeps the job's record (``job_record.py``) in a
JSON file, rewritten every :data:`WRITE_INTERVAL_S` while something changed and once at the
end, atomically (a reader never sees half a file). ``elasticjob timeline FILE`` draws it."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Final

from elasticjob.driver.driver import ElasticDriver

logger = logging.getLogger(__name__)

WRITE_INTERVAL_S: Final = 5.0


def write_record(driver: ElasticDriver, path: Path) -> None:
    """Write ``driver``'s record with its goodput account now to ``path``."""
    data = driver.journal.record_data()
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(data.model_dump_json(indent=1))
    os.replace(partial, path)
    driver.journal.record.saved()


async def keep_record(driver: ElasticDriver, path: Path) -> None:
    """Rewrite the record file while the job runs (cancel to stop; the caller writes the
    last version)."""
    while True:
        await asyncio.sleep(WRITE_INTERVAL_S)
        if driver.journal.record.changed:
            try:
                write_record(driver, path)
            except OSError as exc:
                logger.warning("could not write the job record %s: %s", path, exc)
