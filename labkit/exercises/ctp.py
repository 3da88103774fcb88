"""05 · consume-transform-produce: the exercise check."""
from __future__ import annotations

from labkit.exercises import Verdict, check, exercise, unanswered

CTP = "consume-transform-produce"
# Each mistake shows up at one of these crash points (notebook 05 shows which).
PROBES = ("after-send-offsets-before-commit", "after-commit", "after-poll-before-process")
RECORDS = 40


@exercise("05_consume_transform_produce")
def check_ctp_settings(bootstrap: str, offsets: str | None, offset_delta: int | None) -> Verdict:
    """05: choose ``offsets`` and ``offset_delta`` so that the exactly_once pipeline survives a
    crash at every point where one of the mistakes shows; each is really run and audited."""
    if unanswered(offsets) or unanswered(offset_delta):
        return check(False, "", "fill in my_offsets and my_offset_delta, then run this cell "
                     "again. The check crashes the pipeline at three points and audits each.")
    from labkit import experiments
    from labkit.pipelines.ctp import OFFSET_MODES

    if offsets not in OFFSET_MODES:
        return check(False, "", f"my_offsets must be one of {', '.join(OFFSET_MODES)}.")
    failed = []
    for point in PROBES:
        report = experiments.run(CTP, guarantee="exactly_once", crash_at=point,
                                 records=RECORDS, cluster=bootstrap,
                                 options={"offsets": offsets, "offset_delta": offset_delta}).report
        if not report.exactly_once:
            failed.append(f"{point}: lost={report.lost} duplicated={report.duplicated}")
    return check(not failed,
                 f"a crash at {', '.join(PROBES)} loses nothing and duplicates nothing.",
                 "the audit found: " + "; ".join(failed) + ". Where must the offsets go, "
                 "and is the committed offset the last record read or the next one to read?")
