"""Input data: deterministic, unique ids, and loaded into a topic exactly once."""
from __future__ import annotations

import csv
import io
import runpy

import pytest

from labkit.kafka import topics

from labkit.pipelines import data


def test_generate_is_deterministic_with_unique_ids():
    a, b = data.generate(300, seed=7), data.generate(300, seed=7)
    assert a == b and a != data.generate(300, seed=8)
    assert len({r["id"] for r in a}) == 300
    assert {r["key"] for r in a} <= set(data.DEFAULT_KEYS)
    assert [r["ts"] for r in a] == sorted(r["ts"] for r in a)
    assert {r["key"] for r in data.generate(50, keys=["x", "y"])} == {"x", "y"}
    with pytest.raises(ValueError):
        data.generate(3, keys=[])


def test_csv_files_are_what_the_script_generates():
    script = runpy.run_path(str(data.data_dir() / "generate.py"))  # the repository's script
    SEED = script["SEED"]
    for name, records in [("payments", data.generate(300, seed=SEED, prefix="pay")),
                          ("clicks", data.generate_clicks(400, seed=SEED))]:
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(records[0]), lineterminator="\r\n")
        writer.writeheader()
        writer.writerows(records)
        assert (data.data_dir() / f"{name}.csv").read_bytes().decode() == buf.getvalue()
        loaded = data.load_csv(name)
        assert loaded == records and len({r["id"] for r in loaded}) == len(loaded)
    with pytest.raises(ValueError, match="payments, clicks"):
        data.load_csv("nope")


def test_load_into_topic_writes_each_record_once_in_order(bootstrap, topic_name):
    records = data.load_csv("payments")[:100]
    assert data.load_into_topic(bootstrap, topic_name, records) == 100
    back = topics.read(bootstrap, topic_name)
    assert [r.value for r in back] == records
    assert [r.key for r in back] == [r["key"] for r in records]
    with pytest.raises(ValueError, match="unique ids"):
        data.load_into_topic(bootstrap, topic_name, records[:2] * 2)
