"""Dashboards: the data model from the real broker, the static pictures drawn from it,
the live HTML, and the background loop's life cycle (start, re-create, stop)."""
from __future__ import annotations

import io
import threading
import time

import numpy as np
import pytest
from confluent_kafka import Producer
from matplotlib.image import imread
from matplotlib.patches import Rectangle

from labkit.kafka import topics
from labkit.checking.audit import AuditReport
from labkit.kafka.inspect import UnknownTopicError
from labkit.widgets import STATE_STYLE, Counts, Dashboard, figure, live_frontend, log_strip
from labkit.widgets.static import png_bytes
from labkit.widgets.html import counters_html, offsets_html, producers_html, strip_html
from tests.kafka_helpers import end_transaction, produce_txn, transactional_producer


@pytest.fixture
def lesson_topic(bootstrap: str, topic_name: str):
    """committed txn (a b c) + COMMIT, aborted txn (d e) + ABORT, a duplicate of b outside
    any transaction, then an open transaction (f g) left open while the test looks."""
    topics.create(bootstrap, topic_name)
    txn = transactional_producer(bootstrap, f"txn-{topic_name}")
    produce_txn(txn, topic_name, ["a", "b", "c"])
    end_transaction(txn, bootstrap, topic_name, commit=True)
    produce_txn(txn, topic_name, ["d", "e"])
    end_transaction(txn, bootstrap, topic_name, commit=False)
    plain = Producer({"bootstrap.servers": bootstrap})
    plain.produce(topic_name, key=b"b", value=b"retry")
    plain.flush(30)
    produce_txn(txn, topic_name, ["f", "g"])
    yield topic_name
    txn.abort_transaction(30)


def audit() -> AuditReport:
    return AuditReport("demo", "at_least_once", produced=3, delivered_unique=3, duplicated=1)


def test_snapshot_model_from_the_broker(bootstrap: str, lesson_topic: str) -> None:
    dash = Dashboard(bootstrap, lesson_topic, audit=audit, position=lambda: {0: 5}, mode="static")
    snap = dash.refresh()
    dash.stop()
    assert [(c.offset, c.state) for c in snap.cells] == [
        (0, "committed"), (1, "committed"), (2, "committed"), (3, "commit"),
        (4, "aborted"), (5, "aborted"), (6, "abort"), (7, "duplicate"), (8, "open"), (9, "open")]
    (track,) = snap.tracks
    assert (track.log_start, track.lso, track.high_watermark, track.position) == (0, 8, 10, 5)
    assert snap.counts == Counts(produced=3, delivered=3, duplicated=1, lost=0)
    rows = {(r.open_transaction, r.transactional_id, r.txn_start_offset) for r in snap.producers}
    assert (True, f"txn-{lesson_topic}", 8) in rows
    assert len(snap.producers) == 1  # the plain producer is not idempotent: no producer id


def test_window_keeps_the_latest_offsets(bootstrap: str, lesson_topic: str) -> None:
    dash = log_strip(bootstrap, lesson_topic, window=4, mode="static")
    snap = dash.refresh()
    dash.stop()
    # duplicates are still judged against the whole log, not just the window
    assert [(c.offset, c.state) for c in snap.cells] == [
        (6, "abort"), (7, "duplicate"), (8, "open"), (9, "open")]


def test_static_picture_has_markers_and_legend(bootstrap: str, lesson_topic: str, tmp_path) -> None:
    dash = Dashboard(bootstrap, lesson_topic, audit=audit, mode="static")
    snap = dash.refresh()
    fig = figure(snap, ("log",))
    (ax,) = fig.axes
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == [label for label, _ in STATE_STYLE.values()]
    assert {"COMMIT marker", "ABORT marker", "duplicate", "open transaction"} <= set(legend)
    cells = {p.get_gid(): p.get_facecolor() for p in ax.patches if isinstance(p, Rectangle)}
    from matplotlib.colors import to_rgba
    assert cells["offset-3"] == to_rgba(STATE_STYLE["commit"][1])
    assert cells["offset-6"] == to_rgba(STATE_STYLE["abort"][1])
    assert cells["offset-7"] == to_rgba(STATE_STYLE["duplicate"][1])
    assert [t.get_text() for t in ax.texts if t.get_text() in "CAD"] == ["C", "A", "D"]

    path = dash.to_png(tmp_path / "dash.png")
    dash.stop()
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = imread(path)[..., :3]
    for state in ("commit", "abort", "duplicate", "open", "committed", "aborted"):
        rgb = np.array(to_rgba(STATE_STYLE[state][1])[:3])
        assert (np.abs(pixels - rgb).max(axis=2) < 0.02).sum() > 30, f"no {state} pixels"
    assert repr(dash.static()) == ("<counters, offsets dashboard, log strip, producer-state "
                                   "table (static picture)>")


@pytest.mark.parametrize("views", [("offsets", "log"), ("log",), ("offsets", "log", "producers")])
def test_the_static_picture_keeps_every_title_inside_it(bootstrap: str, lesson_topic: str,
                                                        views) -> None:
    """The first view's title sits above its axes: the saved picture must contain it whole
    (it was cut off at the top edge of the offsets-first dashboards of 04, 07 and 10)."""
    dash = Dashboard(bootstrap, lesson_topic, mode="static")
    fig = figure(dash.refresh(), views)
    dash.stop()
    assert fig.axes[0].get_title(loc="left"), "the first view has a title above its axes"
    pixels = imread(io.BytesIO(png_bytes(fig)))[..., :3]
    # the saved picture's edges are background: nothing drawn reaches them
    edges = np.concatenate([pixels[:3].reshape(-1, 3), pixels[-3:].reshape(-1, 3)])
    assert (edges > 0.97).all(), "something is drawn on the picture's top or bottom edge"


def test_live_html_carries_the_same_data(bootstrap: str, lesson_topic: str) -> None:
    dash = Dashboard(bootstrap, lesson_topic, audit=audit, position=lambda: 5, mode="static")
    snap = dash.refresh()
    dash.stop()
    strip = strip_html(snap)
    assert 'data-state="commit" data-offset="3"' in strip
    assert 'data-state="abort" data-offset="6"' in strip
    assert strip.count('class="lk-cell"') == 10
    assert 'data-counter="duplicated" data-value="1"' in counters_html(snap)
    offsets = offsets_html(snap)
    assert 'data-mark="lso" data-offset="8"' in offsets and 'data-mark="hw" data-offset="10"' in offsets
    assert 'data-mark="position" data-offset="5"' in offsets
    assert f"txn-{lesson_topic}" in producers_html(snap)

    # One model, two renderers: every text the static figure draws (titles, labels,
    # captions, table cells, counters) is in the live HTML's text too.
    import re
    from html import unescape
    markup = "".join(view(snap) for view in (counters_html, offsets_html, strip_html,
                                             producers_html))
    page = unescape(re.sub(r"<[^>]+>", "", markup))  # the text a reader sees
    fig = figure(snap)
    drawn = {t.get_text() for ax in fig.axes for t in ax.texts}
    drawn |= {ax.get_title(loc="left") for ax in fig.axes} - {""}
    drawn |= {c.get_text().get_text() for ax in fig.axes for table in ax.tables
              for c in table.get_celld().values()} - {""}
    assert {"LSO 8 (open transaction)", "high watermark 10", "consumer position 5",
            "partition 0 (offsets 0–9)", f"log of {lesson_topic}"} <= drawn
    assert [t for t in drawn if t not in page] == []


def wait_for(condition, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_live_loop_follows_the_log_and_stops(bootstrap: str, topic_name: str) -> None:
    topics.create(bootstrap, topic_name)
    produced = []
    dash = Dashboard(bootstrap, topic_name, views=("counters", "log"), mode="live",
                     audit=lambda: {"produced": len(produced)}, interval_s=0.1)
    dash.start()
    html = dash.widget.children[1]
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(3):
        producer.produce(topic_name, key=str(i).encode(), value=b"v")
        producer.flush(30)
        produced.append(i)
        # the widget shows each new offset without anybody calling refresh()
        assert wait_for(lambda: f'data-offset="{i}"' in html.value)
    assert wait_for(lambda: 'data-counter="produced" data-value="3"' in dash.widget.children[0].value)
    loop_thread = dash._loop._thread
    again = Dashboard(bootstrap, topic_name, views=("counters", "log"), mode="live")  # re-run the cell
    assert not loop_thread.is_alive() and dash._closed
    assert dash.stats.refreshes >= 3 and dash.stats.errors == 0
    again.stop()


def test_run_returns_result_and_watch_finishes_by_itself(bootstrap: str, topic_name: str) -> None:
    topics.create(bootstrap, topic_name)
    dash = Dashboard(bootstrap, topic_name, mode="live", interval_s=0.1)
    assert dash.run(lambda x: x * 2, 21) == 42
    assert dash._closed and dash.snapshot.finished

    with pytest.raises(ZeroDivisionError):
        Dashboard(bootstrap, topic_name, mode="static").run(lambda: 1 / 0)

    done = threading.Event()
    experiment = threading.Thread(target=done.wait)
    experiment.start()
    watched = Dashboard(bootstrap, topic_name, mode="live", interval_s=0.1).watch(experiment)
    assert not watched._closed
    done.set()
    assert watched.wait(30)
    assert watched._closed and watched.snapshot.finished


def test_bad_input_is_explained(bootstrap: str, topic_name: str, monkeypatch) -> None:
    with pytest.raises(UnknownTopicError, match="does not exist"):
        Dashboard(bootstrap, topic_name)
    topics.create(bootstrap, topic_name)
    with pytest.raises(ValueError, match="choose from"):
        Dashboard(bootstrap, topic_name, views=("offsets", "gauges"))
    with pytest.raises(ValueError, match="'live', 'static'"):
        Dashboard(bootstrap, topic_name, mode="fancy")
    with pytest.raises(ValueError, match="must return counts"):
        Counts.of({"produced": "many"})
    monkeypatch.setenv("LABKIT_WIDGETS", "live")
    assert live_frontend() is True
    monkeypatch.setenv("LABKIT_WIDGETS", "static")
    assert live_frontend() is False
    monkeypatch.delenv("LABKIT_WIDGETS")
    assert live_frontend() is False  # no kernel started by a Jupyter server here


def test_executed_notebook_gets_the_static_picture(bootstrap: str, topic_name: str,
                                                   monkeypatch) -> None:
    """nbval/nbconvert run kernels with no widget front end: one PNG output, stable text."""
    import nbformat
    from nbclient import NotebookClient

    topics.create(bootstrap, topic_name)
    monkeypatch.setenv("LABKIT_BOOTSTRAP", bootstrap)
    monkeypatch.delenv("LABKIT_WIDGETS", raising=False)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(f"""
from confluent_kafka import Producer
from labkit import widgets
def experiment():
    p = Producer({{"bootstrap.servers": "{bootstrap}"}})
    for i in range(3):
        p.produce("{topic_name}", key=str(i).encode(), value=b"v")
    p.flush(30)
dash = widgets.Dashboard("{bootstrap}", "{topic_name}", audit=lambda: {{"produced": 3}})
dash.run(experiment)
print(dash.live, dash.snapshot.tracks[0].high_watermark)""")])
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    outputs = nb.cells[0].outputs
    assert [o.output_type for o in outputs] == ["display_data", "stream"]
    assert set(outputs[0].data) == {"image/png", "text/plain"}
    assert outputs[0].data["text/plain"] == ("<counters, offsets dashboard, log strip, "
                                             "producer-state table (static picture)>")
    assert outputs[1].text == "False 3\n"


def test_a_leader_elected_a_moment_ago_does_not_fail_the_watched_experiment(
        bootstrap: str, topic_name: str, monkeypatch) -> None:
    """A partition's new leader answers ListOffsets with OFFSET_NOT_AVAILABLE until it knows
    its high watermark (a lesson's topic created under load). The dashboard asks again; the
    experiment it watches runs, and the final picture is taken."""
    from kio.schema.errors import ErrorCode

    from labkit.kafka.inspect import InspectError

    topics.create(bootstrap, topic_name)
    dash = Dashboard(bootstrap, topic_name, mode="static")
    collect, refusals = dash.source.collect, []

    def refused_at_first(finished: bool = False):
        if len(refusals) < 2:
            refusals.append(finished)
            raise InspectError("ListOffsets: offset_not_available", ErrorCode.offset_not_available)
        return collect(finished=finished)

    monkeypatch.setattr(dash.source, "collect", refused_at_first)
    producer = Producer({"bootstrap.servers": bootstrap})

    def experiment() -> str:
        producer.produce(topic_name, key=b"k", value=b"v")
        producer.flush(30)
        return "ran"

    assert dash.run(experiment) == "ran"
    assert refusals == [False, False]
    assert dash.snapshot.finished and dash.snapshot.tracks[0].high_watermark == 1
