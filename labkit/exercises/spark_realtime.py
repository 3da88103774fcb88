"""08e · Spark's real-time mode: the exercise check.

The notebook's real-time query copies each payment with its account as the record key, and
one driver crash writes the payments of the unfinished batch twice. The learner edits the
query so that a reader keeping the last record per key (a table upserted by key; a compacted
topic once its cleaner has run) sees each payment once: the record key must be the
payment's id. The check runs the
learner's query under the same crash (real Spark, real broker) and reads the output topic.
"""
from __future__ import annotations

from labkit import experiments
from labkit.exercises import not_changed, Verdict, check, exercise
from labkit.pipelines.learner import fingerprint
from labkit.spark import realtime

def last_per_key(output):
    """What a reader that keeps the last record per key holds: one row per record key."""
    return output.drop_duplicates(subset="record_key", keep="last", ignore_index=True)


@exercise("08e_spark_real_time_mode", "1")
def check_keyed_query(query, shown, bootstrap: str) -> Verdict:
    """08e · the learner's query, crashed like the notebook's; passes when the output, kept
    last-per-key, holds every payment exactly once."""
    refused = not_changed(query, "", fingerprint(shown), "keyed_query still copies the record key as it came in. Change what the "
                       "query writes as the key, then run this cell again: the check then "
                       "crashes your query.",
                          not_a_function="keyed_query must be a function, like realtime_query above.")
    if refused:
        return refused
    try:
        run = experiments.run(realtime.SCENARIO, cluster=bootstrap, pipeline=query,
                              spare=False, keep_topics=False)
    except Exception as exc:  # the learner's code, run by Spark: say what it did, briefly
        return check(False, "", f"the query failed: {str(exc).splitlines()[0][:300]}. Keep "
                                "Spark's Kafka sink: it writes the columns key and value.")
    kept = last_per_key(run.output)
    ids = set(run.output["id"])
    shared = kept["record_key"].nunique() < len(ids)
    exact = len(kept) == len(ids) and (kept["record_key"] == kept["id"]).all()
    return check(bool(exact),
                 f"the crash wrote {run.report.duplicated} records twice, and the last record "
                 f"per key still holds each of the {len(ids)} payments once. Every copy of a "
                 "payment has the same key, so a table upserted by key is exactly once "
                 "downstream (a compacted topic too, once its log cleaner has been over those "
                 "records; until then its readers see every copy).",
                 "a reader that keeps the last record per key would "
                 f"{'lose payments: several payments share a key' if shared else 'not find each payment under a key of its own'}. "
                 "What in the value identifies one payment, and only that payment?")
