"""``--job-record FILE``: the local launcher keeps the job's record (``job_record.py``) in a
JSON file, rewritten atomically (a reader never sees half a file) when the one record saving
policy says (``elasticjob/driver/record_saving.py``) and once at the end. ``elasticjob
timeline FILE`` draws it."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from elasticjob.driver.job_record import JobRecordData


class RecordFile:
    """A :class:`~elasticjob.driver.record_saving.RecordStore` in a file."""

    def __init__(self, path: Path) -> None:
        self._path = path

    async def save(self, data: JobRecordData) -> None:
        """Write ``data`` to the file (in a thread: a slow disk never blocks the driver)."""
        await asyncio.to_thread(self._write, data.model_dump_json(indent=1))

    def _write(self, text: str) -> None:
        partial = self._path.with_name(f".{self._path.name}.partial")
        partial.write_text(text)
        os.replace(partial, self._path)
