"""The lab's own pictures (notebooks 00 and 04) render, and say what their captions say."""
from __future__ import annotations

import io

import pytest
from matplotlib.image import imread

from labkit.widgets.diagrams import LAB, TRANSACTION


@pytest.mark.parametrize("diagram, must_show", [
    (LAB, ["worker processes", "runner (supervisor)", "fault proxy", "Kafka broker (KRaft)",
           "audit (checkers)", "Kafka protocol", "start, kill, restart"]),
    (TRANSACTION, ["producer", "transaction coordinator", "__transaction_state",
                   "partition leaders", "group coordinator", "__consumer_offsets",
                   "COMMIT/ABORT marker", "WriteTxnMarkers (data)", "TxnOffsetCommit"]),
], ids=["lab", "transaction"])
def test_diagram_renders_with_its_labels(diagram, must_show) -> None:
    fig = diagram.figure()
    texts = " | ".join(t.get_text() for ax in fig.axes for t in ax.texts)
    missing = [label for label in must_show if label not in texts]
    assert missing == []
    # every box and every numbered step named in the caption is drawn
    for box in diagram.boxes:
        assert box.title in texts
    for arrow in diagram.arrows:
        if arrow.step is not None:
            assert f"{arrow.step} {arrow.label}" in texts

    png = diagram.picture().png
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = imread(io.BytesIO(png))
    height, width = pixels.shape[:2]
    assert (width, height) == (1000, 600)
    # not a blank canvas: a good share of the pixels is ink or box colour
    assert (pixels[..., :3].mean(axis=2) < 0.97).mean() > 0.05
    assert repr(diagram.picture()) == f"<{diagram.title} (static picture)>"


def test_caption_lists_parts_and_numbered_steps_in_order() -> None:
    first, *steps = LAB.caption().splitlines()
    assert first.startswith("how an experiment is wired: notebook / labkit CLI, runner")
    assert [int(s.split(".")[0]) for s in steps] == list(range(1, 8))
    assert "3. runner (supervisor) -> worker processes: start, kill, restart" in steps
    assert ("1. producer -> transaction coordinator: InitProducerId, AddPartitionsToTxn, "
            "AddOffsetsToTxn, EndTxn") in TRANSACTION.caption().splitlines()


def test_fencing_exchanges_do_not_depend_on_timing() -> None:
    """A retry (or a flush split in two requests) shows once; a coordinator still loading on
    a fresh broker is left out; each line names client, API, version, epoch and error."""
    from labkit.widgets.sequence import exchanges, label

    def row(t, client, api, error=None, epoch=None):
        r = {"t": t, "client_id": client, "api": api, "version": 4, "error": error}
        return r if epoch is None else {**r, "producer_epoch": epoch}

    trace = [row(1, "A", "InitProducerId", "COORDINATOR_LOAD_IN_PROGRESS", -1),
             row(2, "A", "InitProducerId", epoch=0), row(3, "A", "Metadata"),
             row(4, "A", "Produce"), row(5, "A", "Produce"),
             row(6, "B", "InitProducerId", "CONCURRENT_TRANSACTIONS", -1),
             row(7, "B", "InitProducerId", "CONCURRENT_TRANSACTIONS", -1),
             row(8, "B", "InitProducerId", epoch=2), row(9, "A", "Produce", "INVALID_PRODUCER_EPOCH")]
    assert [label(r, by_client=True) for r in exchanges(list(reversed(trace)))] == [
        "A: InitProducerId v4  (epoch 0)", "A: Produce v4",
        "B: InitProducerId v4  -> CONCURRENT_TRANSACTIONS", "B: InitProducerId v4  (epoch 2)",
        "A: Produce v4  -> INVALID_PRODUCER_EPOCH"]
