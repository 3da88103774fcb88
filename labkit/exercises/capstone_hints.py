"""10 · capstone: what the verdict says when a loop is not exactly-once. Each hint points at
a cause (what the loop left half done, what it did next), never at the code that fixes it."""
from __future__ import annotations

import pandas as pd

from labkit.exercises.side_by_side import Outcome
from labkit.experiments.judge import PHASES

COUNTED = ("lost-write", "duplicate", "aborted-read")  # the table's columns say these


def findings_of(run: Outcome) -> list[str]:
    """What the judge found besides the table's counts: its findings, the audit's other
    anomalies (e.g. an aborted input read)."""
    return [*run.findings, *(a for a in run.anomalies if a not in COUNTED)]



def point_hints(code: str, accounting_reads: str, results: pd.DataFrame) -> list[str]:
    bad = results[~results["exactly_once"]]
    crashes = bad[bad["experiment"].str.startswith("crash")]
    wire = bad[~bad["experiment"].str.startswith("crash")]
    transactional = "send_offsets_to_transaction" in code
    hints = []
    if (bad["lost"] > 0).any():
        hints.append("payments were LOST: something marked a batch done (its input offsets "
                     "committed) before its output was safely written")
    if not transactional and (crashes["charged_twice"] > 0).any():
        hints.append("a crash between writing the ledger and committing the input offsets "
                     "repeats the batch: the two must commit together, atomically")
    if transactional and (crashes["charged_twice"] > 0).any():
        hints.append("after a restart, is the committed offset of each partition the last "
                     "payment processed or the next one to read, and does it cover every "
                     "partition the batch was read from?")
    if not wire.empty and (wire["charged_twice"] > 0).any():
        hints.append("a lost ack was retried and written twice: the broker only drops such "
                     "retries for an idempotent producer")
    if (bad["aborted_visible"] > 0).any():
        hints.append("accounting saw payments of ABORTED transactions: look at how it reads "
                     f"the ledger (accounting_reads = {accounting_reads!r})")
    named = {f for found in bad["findings"] for f in found.split(", ") if f}
    return hints + [FINDING_HINTS[f] for f in sorted(named) if f in FINDING_HINTS]


# What each kind of fault implicates when it breaks a loop (causes, never the fix).
KIND_HINTS = {
    "production's faults": "the named points are not the only places a process can die, nor "
                           "a crash the only thing production does",
    PHASES["kills"]: "what does your loop leave half done between two named points, or when "
                     "it dies with its output or its commit on the wire?",
    PHASES["wire"]: "when the broker refused a record, was the whole transaction given up and "
                    "its batch read again from where it began?",
    PHASES["rebalance"]: "when the group moved partitions between instances, did the offsets "
                         "sent with a batch say where every partition it read from stands?",
    PHASES["zombie"]: "a frozen instance came back after its partitions had moved and "
                      "finished its transaction: could the group coordinator tell it was out "
                      "of date?",
    PHASES["offsets"]: "when the offsets were refused, was the transaction aborted and were "
                       "the partitions read again from their committed offsets, all of them?",
    PHASES["fenced"]: "an instance was fenced (a fatal error): what did it do next?",
}
FINDING_HINTS = {
    "hanging-transaction": "a transaction stayed open after its instance was gone: every "
                           "read_committed reader of its partitions waited for it",
    "fenced-ran-on": "an instance went on after it was fenced, beside the one that took its "
                     "place",
    "abortable-raised": "an instance died of an error that only asked for its transaction to "
                        "be aborted: what became of the batch it was in?",
    "offsets-behind": "the input's committed offsets stopped short of what the service had "
                      "processed: a restart reads those payments again",
    "stopped-short": "the service stopped moving with payments still to process, also "
                     "after a restart: what was it waiting for?",
    "aborted-input-read": "the ledger holds payments an upstream producer ABORTED: how does "
                          "the service read its input?",
}


def finding_text(label: str, run: Outcome) -> str:
    found = [f"{k.replace('_', ' ')} {v}" for k, v in (("lost", run.lost),
                                                         ("charged_twice", run.duplicated),
                                                         ("aborted_visible", run.aborted_visible))
             if v]
    found += [f"{name} ({', '.join(map(str, run.findings[name]))})" if name in run.findings
              else name for name in findings_of(run)]
    errors = "; ".join(f"instance {e['instance']} raised {e['raised']}" for e in run.errors)
    return (f"under {label}: {', '.join(found) or 'not exactly once'}"
            + (f" ({errors})" if errors else ""))
