"""jobs.lib.manifest_rows.check_manifest: a manifest no job can read rows from is one line on the
driver, from its Parquet footer (columns, rows), before any worker starts."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.lib.manifest_rows import ManifestError, check_manifest
from jobs.lib.storage import Storage

COLUMNS = ("id", "task", "conversation")


def test_a_manifest_without_rows_or_columns_is_one_line(tmp_path):
    good = {"id": ["a"], "task": ["t"], "conversation": [[]], "image_bytes": [b"png"]}
    cases = {"ok": (good, None),
             "text": ("not parquet", "is not a readable Parquet file"),
             "no_image": ({k: v for k, v in good.items() if k != "image_bytes"}, "lacks the columns image_bytes or image_uri"),
             "no_task": ({k: v for k, v in good.items() if k != "task"}, "lacks the columns task"),
             "empty": ({k: v[:0] for k, v in good.items()}, "has no rows")}
    for name, (content, error) in cases.items():
        path = tmp_path / f"{name}.parquet"
        if isinstance(content, str):
            path.write_text(content)
        else:
            pq.write_table(pa.table(content) if content["id"] else pa.table(good).slice(0, 0), path)
        if error is None:
            assert check_manifest(Storage(), str(path), COLUMNS) == 1
            continue
        with pytest.raises(ManifestError) as e:
            check_manifest(Storage(), str(path), COLUMNS)
        assert str(e.value).startswith(f"manifest {path} ") and error in str(e.value) and "\n" not in str(e.value)
