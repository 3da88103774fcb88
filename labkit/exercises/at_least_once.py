"""02 · at-least-once: the exercise check."""
from __future__ import annotations

from labkit.exercises import Verdict, check, exercise, unanswered

SCENARIO, GUARANTEE, RECORDS = "consume-transform-produce", "at_least_once", 40


@exercise("02_at_least_once")
def check_harmless_crash_point(bootstrap: str, crash_at: str | None) -> Verdict:
    """02: name a crash point at which the at-least-once pipeline neither loses nor
    duplicates anything. The check crashes the real pipeline there and audits the output."""
    from labkit import experiments
    from labkit.experiments import scenarios

    valid = scenarios.crash_points(SCENARIO, GUARANTEE)
    if unanswered(crash_at):
        return check(False, "", "set my_crash_point to one of: " + ", ".join(valid) + ".")
    if crash_at not in valid:
        return check(False, "", f"{crash_at!r} is not on this pipeline's path; choose one of: "
                     + ", ".join(valid) + ".")
    report = experiments.run(SCENARIO, guarantee=GUARANTEE, crash_at=crash_at,
                             records=RECORDS, cluster=bootstrap).report
    return check(report.lost == 0 and report.duplicated == 0,
                 f"a crash at {crash_at} lost 0 and duplicated 0: at that moment the output "
                 "written and the committed offsets agree, so the restart repeats nothing.",
                 f"a crash at {crash_at} duplicated {report.duplicated} (lost {report.lost}). "
                 "Look for a moment when no output of the current batch has been written yet, "
                 "or when its offsets are already committed.")
