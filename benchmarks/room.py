"""A room of learners on one cluster: the load test of issue 11 (run by hand, not in CI).

    .venv/bin/python benchmarks/room.py --learners 10 --brokers 3 --out /tmp/room.json
    .venv/bin/python benchmarks/room.py --learners 2 --brokers 1 --no-solo       # a dry run
    .venv/bin/python benchmarks/room.py --bootstrap host:9092 --kafka-config client.properties

N learners, each a separate process with its own ``LABKIT_NAMESPACE`` (``learner01`` ...),
its own ``LABKIT_HOME`` and ``LABKIT_BOOTSTRAP`` pointing at ONE cluster (a lab cluster this
script starts with ``--brokers 1|3``, or ``--bootstrap`` for one that runs already), as the
learners of a workshop point their notebooks at the instructor's cluster. Each learner runs,
one after the other, the two exactly_once scenarios a room runs in notebooks 05 and 07:

* ``consume-transform-produce`` crashed (SIGKILL) at one of its exactly_once crash points,
* ``running-count`` crashed at one of its exactly_once crash points,

learner i taking the i-th point of each list (so together they cover every point). First
each learner runs alone (the baseline, ``--no-solo`` skips it), then all N at once.

Recorded (one JSON document, ``--out``, and a markdown summary on stdout):

* each scenario's audit (lost, duplicated, state drift) and its wall time; p50/p95 per
  scenario, concurrent versus alone;
* isolation: the cluster's topics, consumer groups and transactional ids, sampled by this
  script (the instructor's view) every second during the concurrent phase and listed at its
  end: each must carry exactly one learner's namespace; each learner's own listing of the
  cluster's topics, and which of them it would take for its own (its prefix);
* fencing: the ``fenced`` events of each run's history and every worker log line matching
  ``fenced`` / ``ProducerFenced`` (a learner fenced by another would show here);
* the brokers' CPU (% of one core, summed) and resident memory, sampled with psutil every
  second (only for a cluster this script started: it knows the pids), and the load average.

Nothing is asserted: a failed audit or an isolation breach is printed and recorded, and the
exit code is 1. docs/measurements-room.md has the results.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

SCENARIOS = ("consume-transform-produce", "running-count")
GUARANTEE = "exactly_once"
FENCED = re.compile(r"fenc", re.IGNORECASE)  # "fenced", ProducerFenced, INVALID_PRODUCER_EPOCH is not


def learner_name(i: int) -> str:
    """learner01 ... learner99: zero-padded, so no name is the start of another's."""
    return f"learner{i:02d}"


# --------------------------------------------------------------------------- the learner


def learner(index: int, records: int) -> dict:
    """One learner's session (runs in its own process, its environment set by the room)."""
    from confluent_kafka.admin import AdminClient

    from labkit import settings

    from labkit import experiments
    from labkit.experiments import scenarios

    from labkit.kafka import names, topics
    from labkit.kafka.clientlog import client_config

    namespace = names.namespace()
    bootstrap = settings.current().bootstrap
    runs = []
    for name in SCENARIOS:
        points = scenarios.crash_points(name, GUARANTEE)
        crash_at = points[index % len(points)]
        started = time.monotonic()
        run = experiments.run(name, guarantee=GUARANTEE, crash_at=crash_at,
                              records=records, keep_workdir=True)
        seconds = time.monotonic() - started
        workdir = Path(run.workdir)
        # Everything the workers wrote (stdout and stderr of each start) and their history.
        fenced_lines = []
        for log in sorted(workdir.rglob("*.log")):
            fenced_lines += [f"{log.name}: {line.strip()}" for line in
                             log.read_text(errors="replace").splitlines() if FENCED.search(line)]
        fenced_events = [e for e in run.history if e.get("kind") == "fenced"]
        # What this learner sees of the cluster: every topic its client is shown, and which
        # of them carry its namespace (the lab's names for its own).
        admin = AdminClient(client_config({"bootstrap.servers": bootstrap}))
        listed = sorted(t for t in admin.list_topics(timeout=15).topics if not t.startswith("__"))
        report = run.report
        runs.append({
            "scenario": name, "crash_at": crash_at, "seconds": round(seconds, 3),
            "workers_s": run.run.total_s, "attempts": run.run.attempts,
            "crashed": run.run.crashed,
            "lost": report.lost, "duplicated": report.duplicated,
            "state_matches": report.state_matches if report.state_expected is not None else None,
            "verdict": report.verdict, "exact": report.exactly_once,
            "topics_used": dict(run.topics),
            "fenced_events": fenced_events, "fenced_lines": fenced_lines[:20],
            "topics_listed": listed,
        })
        shutil.rmtree(workdir, ignore_errors=True)
        # As `labkit scenario` does at its end (the Python API keeps them for a notebook's
        # next cells): a room's cluster would otherwise fill up with every run's topics.
        topics.delete(bootstrap, *run.topics.values())
    return {"learner": namespace, "index": index, "runs": runs}


# --------------------------------------------------------------------------- the room


class Sampler(threading.Thread):
    """Every ``every_s``: the brokers' CPU and memory, the load average, and (if asked) the
    cluster's topics, groups and transactional ids as the instructor would list them."""

    def __init__(self, pids: list[int], bootstrap: str, names: bool, every_s: float = 1.0):
        super().__init__(daemon=True)
        import psutil

        self.procs = [psutil.Process(p) for p in pids]
        for p in self.procs:
            p.cpu_percent(None)  # the first call only sets the baseline
        self.bootstrap, self.names, self.every_s = bootstrap, names, every_s
        self.cpu: list[float] = []
        self.rss_mb: list[float] = []
        self.load: list[float] = []
        self.topics: set[str] = set()
        self.groups: set[str] = set()
        self.errors: list[str] = []
        self._halt = threading.Event()

    def run(self) -> None:
        admin = None
        if self.names:
            from confluent_kafka.admin import AdminClient

            from labkit.kafka.clientlog import client_config
            admin = AdminClient(client_config({"bootstrap.servers": self.bootstrap}))
        while not self._halt.wait(self.every_s):
            try:
                if self.procs:
                    self.cpu.append(sum(p.cpu_percent(None) for p in self.procs))
                    self.rss_mb.append(sum(p.memory_info().rss for p in self.procs) / 2**20)
                self.load.append(os.getloadavg()[0])
                if admin is not None:
                    self.topics.update(t for t in admin.list_topics(timeout=10).topics
                                       if not t.startswith("__"))
                    self.groups.update(g.group_id for g in
                                       admin.list_consumer_groups().result(timeout=10).valid)
            except Exception as exc:  # a sample missed (a broker busy) is noted, not fatal
                self.errors.append(f"{type(exc).__name__}: {exc}"[:200])

    def stop(self) -> dict:
        self._halt.set()
        self.join(timeout=30)
        return {
            "broker_cpu_pct_mean": _mean(self.cpu), "broker_cpu_pct_max": _max(self.cpu),
            "broker_rss_mb_mean": _mean(self.rss_mb), "broker_rss_mb_max": _max(self.rss_mb),
            "load1_min": round(min(self.load), 1) if self.load else None, "load1_mean": _mean(self.load),
            "load1_max": _max(self.load), "samples": len(self.load),
            "sample_errors": self.errors[:5],
        }


def _mean(xs: list[float]) -> float | None:
    return round(statistics.fmean(xs), 1) if xs else None


def _max(xs: list[float]) -> float | None:
    return round(max(xs), 1) if xs else None


def percentile(xs: list[float], q: float) -> float | None:
    """The q-th percentile (nearest rank: a value that was measured, not interpolated)."""
    if not xs:
        return None
    ordered = sorted(xs)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(n * q / 100), at least 1
    return ordered[int(rank) - 1]


def owners(name: str, namespaces: list[str]) -> list[str]:
    """The namespaces ``name`` belongs to (a name the lab made carries exactly one), by the
    lab's one rule (``labkit.kafka.names``: ``<namespace>.<name>``)."""
    from labkit.kafka.names import SEPARATOR

    return [ns for ns in namespaces if name.startswith(ns + SEPARATOR)]


def learner_env(base: dict[str, str], i: int, bootstrap: str, kafka_config: str | None,
                homes: Path) -> dict[str, str]:
    """``kafka_config``: one file for all, or a directory holding learnerNN.properties."""
    """A learner's environment: the room's cluster, its own namespace and its own lab home
    (as on its own laptop); no other LABKIT_* variable leaks in from the instructor's."""
    env = {k: v for k, v in base.items() if not k.startswith("LABKIT_")}
    env.update(LABKIT_BOOTSTRAP=bootstrap, LABKIT_NAMESPACE=learner_name(i),
               LABKIT_HOME=str(homes / learner_name(i)))
    for keep in ("LABKIT_CACHE", "LABKIT_PROJECT", "LABKIT_JAVA", "LABKIT_MVN"):
        if keep in base:
            env[keep] = base[keep]
    if kafka_config:
        path = Path(kafka_config)
        path = path / f"{learner_name(i)}.properties" if path.is_dir() else path
        env["LABKIT_KAFKA_CONFIG"] = str(path.resolve())
    (homes / learner_name(i)).mkdir(parents=True, exist_ok=True)
    return env


def run_learners(indices: list[int], records: int, bootstrap: str, kafka_config: str | None,
                 homes: Path, timeout_s: float) -> tuple[list[dict], float]:
    """Start the learners at once (each a process), wait for all; their results, wall time."""
    procs = []
    started = time.monotonic()
    try:
        for i in indices:
            env = learner_env(dict(os.environ), i, bootstrap, kafka_config, homes)
            err = open(homes / f"{learner_name(i)}.stderr", "w")
            procs.append((i, err, subprocess.Popen(
                [sys.executable, __file__, "learner", str(i), "--records", str(records)],
                env=env, stdout=subprocess.PIPE, stderr=err, text=True)))
        results = []
        for i, err, proc in procs:
            out, _ = proc.communicate(timeout=max(1.0, timeout_s - (time.monotonic() - started)))
            err.close()
            stderr = (homes / f"{learner_name(i)}.stderr").read_text(errors="replace")
            if proc.returncode != 0:
                results.append({"learner": learner_name(i), "index": i, "failed": True,
                                "exit_code": proc.returncode, "stderr_tail": stderr[-2000:]})
                continue
            result = json.loads(out.strip().splitlines()[-1])
            result["stderr_fenced"] = [ln for ln in stderr.splitlines() if FENCED.search(ln)][:20]
            results.append(result)
        return results, time.monotonic() - started
    finally:
        for _, err, proc in procs:  # a timeout or Ctrl-C: no learner outlives the room
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            err.close()


@contextmanager
def room_cluster(brokers: int, bootstrap: str | None, secure_learners: int = 0):
    """(bootstrap, broker pids, room files or None): the given cluster, or a lab cluster
    started here and stopped on every path. ``secure_learners``: the room's SASL_SSL cluster
    of docker-compose's secure profile (``labkit.room.secure_cluster``: the same listener lines, SCRAM users
    and prefixed ACLs per learner), run here with the lab's jars."""
    if bootstrap:
        yield bootstrap, [], None
        return
    from labkit.kafka.localcluster import LocalCluster

    with tempfile.TemporaryDirectory(prefix="room-lab-") as home:
        cluster = LocalCluster(brokers=brokers, home=Path(home), secure=bool(secure_learners))
        files = None
        if secure_learners:
            from labkit.room.secure_cluster import RoomSecurity

            cluster.security = RoomSecurity(Path(home) / "room", secure_learners)
            files = cluster.security.files
        with cluster:
            yield cluster.bootstrap, [b.pid for b in cluster.brokers], files


def txn_ids(bootstrap: str) -> list[str]:
    """Every transactional id the cluster's coordinators know (any state)."""
    from labkit.kafka.inspect import Inspector

    with Inspector(bootstrap) as inspector:
        return sorted(t.transactional_id for t in inspector.transactions(states=()))


def isolation(results: list[dict], seen: dict[str, set[str]], namespaces: list[str]) -> dict:
    """Does every name the room made belong to exactly one learner, and every learner's runs
    use only its own names?"""
    breaches = []
    for kind, names in seen.items():
        for name in sorted(names):
            who = owners(name, namespaces)
            if len(who) != 1:
                breaches.append(f"{kind} {name!r}: owners {who}")
    for r in results:
        for run in r.get("runs", []):
            for topic in run["topics_used"].values():
                if owners(topic, namespaces) != [r["learner"]]:
                    breaches.append(f"{r['learner']} used topic {topic!r}")
    return {"breaches": breaches, **{f"{k}_seen": len(v) for k, v in seen.items()}}


def fenced(results: list[dict]) -> list[str]:
    out = []
    for r in results:
        out += [f"{r['learner']}: {ln}" for ln in r.get("stderr_fenced", [])]
        for run in r.get("runs", []):
            out += [f"{r['learner']} {run['scenario']}: {ln}" for ln in run["fenced_lines"]]
            out += [f"{r['learner']} {run['scenario']}: history {e}" for e in run["fenced_events"]]
    return out


def phase_summary(results: list[dict]) -> dict:
    per = {}
    for name in SCENARIOS:
        runs = [run for r in results for run in r.get("runs", []) if run["scenario"] == name]
        secs = [run["seconds"] for run in runs]
        per[name] = {"runs": len(runs), "exact": sum(run["exact"] for run in runs),
                     "lost": sum(run["lost"] for run in runs),
                     "duplicated": sum(run["duplicated"] for run in runs),
                     "state_drift": sum(run["state_matches"] is False for run in runs),
                     "crashed": sum(bool(run["crashed"]) for run in runs),
                     "p50_s": percentile(secs, 50), "p95_s": percentile(secs, 95),
                     "max_s": max(secs, default=None)}
    per["failed_learners"] = [r["learner"] for r in results if r.get("failed")]
    return per


def markdown(doc: dict) -> str:
    lines = [f"learners: {doc['learners']}, brokers: {doc['brokers']}, records per scenario: "
             f"{doc['records']}, cluster: {doc['cluster']}", "",
             "| phase | scenario | runs | exact | lost | duplicated | state drift | crashed "
             "| p50 s | p95 s | max s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for phase in ("solo", "room"):
        if phase not in doc:
            continue
        for name in SCENARIOS:
            s = doc[phase]["summary"][name]
            lines.append(f"| {phase} | {name} | {s['runs']} | {s['exact']} | {s['lost']} | "
                         f"{s['duplicated']} | {s['state_drift']} | {s['crashed']} | "
                         f"{s['p50_s']} | {s['p95_s']} | {s['max_s']} |")
    lines += ["", "| phase | wall s | broker CPU % (mean / max, of one core) | broker RSS MB "
              "(mean / max, all brokers) | load1 (min / mean / max) |", "|---|---|---|---|---|"]
    for phase in ("solo", "room"):
        if phase not in doc:
            continue
        m = doc[phase]["machine"]
        lines.append(f"| {phase} | {doc[phase]['wall_s']:.1f} | {m['broker_cpu_pct_mean']} / "
                     f"{m['broker_cpu_pct_max']} | {m['broker_rss_mb_mean']} / "
                     f"{m['broker_rss_mb_max']} | {m['load1_min']} / {m['load1_mean']} / "
                     f"{m['load1_max']} |")
    for phase in ("solo", "room"):
        failed = doc.get(phase, {}).get("summary", {}).get("failed_learners")
        if failed:
            lines += ["", f"{phase}: FAILED learners (their stderr is in the JSON): {failed}"]
    room = doc.get("room", {})
    if room:
        iso = room["isolation"]
        lines += ["", f"isolation: {iso['topics_seen']} topics, {iso['groups_seen']} groups, "
                      f"{iso['transactional_ids_seen']} transactional ids seen during the room; "
                      f"breaches: {len(iso['breaches'])}"]
        lines += [f"  - {b}" for b in iso["breaches"][:20]]
        lines += [f"fenced lines/events: {len(room['fenced'])}"]
        lines += [f"  - {f}" for f in room["fenced"][:20]]
        lines += [f"topics each learner's client listed at the end of its runs (max over its "
                  f"runs): own {room['listed_own_max']}, other learners' {room['listed_others_max']}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    one = sub.add_parser("learner", help=argparse.SUPPRESS)  # what each learner process runs
    one.add_argument("index", type=int)
    one.add_argument("--records", type=int, default=200)
    parser.add_argument("--learners", type=int, default=10, help="concurrent learners (1-99)")
    parser.add_argument("--brokers", type=int, default=3, choices=(1, 3),
                        help="the lab cluster to start (ignored with --bootstrap)")
    parser.add_argument("--records", type=int, default=200, help="input records per scenario")
    parser.add_argument("--bootstrap", help="use this running cluster instead of starting one")
    parser.add_argument("--kafka-config", help="client.properties for every client "
                        "(LABKIT_KAFKA_CONFIG of the learners and of this script)")
    parser.add_argument("--secure", action="store_true",
                        help="start the room's SASL_SSL cluster (labkit.room.secure_cluster: a SCRAM user and "
                             "prefixed ACLs per learner) instead of a plaintext lab")
    parser.add_argument("--no-solo", action="store_true", help="skip the one-learner baseline")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per phase")
    parser.add_argument("--out", help="write the whole result as JSON here")
    args = parser.parse_args(argv)
    if args.command == "learner":
        print(json.dumps(learner(args.index, args.records)))
        return 0
    if not 1 <= args.learners <= 99:
        parser.error(f"--learners must be 1-99, not {args.learners}")
    if args.records < 10:
        parser.error("--records must be at least 10 (a crash on the 2nd batch must fire)")
    if args.secure and (args.bootstrap or args.kafka_config or args.brokers != 3):
        parser.error("--secure starts its own 3-broker room: drop --bootstrap, --kafka-config "
                     "and --brokers")
    if args.kafka_config:
        if not Path(args.kafka_config).is_file():
            parser.error(f"--kafka-config {args.kafka_config}: no such file")
        os.environ["LABKIT_KAFKA_CONFIG"] = str(Path(args.kafka_config).resolve())

    indices = list(range(1, args.learners + 1))
    namespaces = [learner_name(i) for i in indices]
    doc: dict = {"learners": args.learners, "brokers": None if args.bootstrap else args.brokers,
                 "records": args.records, "cluster": args.bootstrap or f"lab, {args.brokers} broker(s)",
                 "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                 "cores": os.cpu_count()}
    with ExitStack() as stack:
        bootstrap, pids, files = stack.enter_context(
            room_cluster(args.brokers, args.bootstrap, args.learners if args.secure else 0))
        if files is not None:  # each learner its own user; this script the instructor (admin)
            args.kafka_config = str(files.clients_dir)
            os.environ["LABKIT_KAFKA_CONFIG"] = str(files.admin_file)
            doc["cluster"] = "room (labkit.room.secure_cluster): SASL_SSL, SCRAM user + prefixed ACLs per learner"
        homes = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="room-learners-")))
        if not args.no_solo:
            solo: list[dict] = []
            sampler = Sampler(pids, bootstrap, names=False)
            sampler.start()
            started = time.monotonic()
            for i in indices:  # each learner alone: the baseline
                results, _ = run_learners([i], args.records, bootstrap, args.kafka_config,
                                          homes, args.timeout)
                solo += results
                print(f"solo {learner_name(i)}: " + ", ".join(
                    f"{run['scenario']} {run['seconds']:.1f} s {run['verdict']}"
                    for run in results[0].get("runs", [])) if not results[0].get("failed")
                    else f"solo {learner_name(i)}: FAILED", file=sys.stderr, flush=True)
            doc["solo"] = {"wall_s": round(time.monotonic() - started, 1),
                           "machine": sampler.stop(), "summary": phase_summary(solo),
                           "learners": solo}
        before_txn = set(txn_ids(bootstrap))  # the solo phase's ids, already judged below
        sampler = Sampler(pids, bootstrap, names=True)
        sampler.start()
        results, wall = run_learners(indices, args.records, bootstrap, args.kafka_config, homes,
                                     args.timeout)
        machine = sampler.stop()
        seen = {"topics": sampler.topics, "groups": sampler.groups,
                "transactional_ids": set(txn_ids(bootstrap))}
        listed_own = [sum(1 for t in run["topics_listed"] if owners(t, [r["learner"]]))
                      for r in results for run in r.get("runs", [])]
        listed_others = [sum(1 for t in run["topics_listed"]
                             if owners(t, namespaces) and not owners(t, [r["learner"]]))
                         for r in results for run in r.get("runs", [])]
        doc["room"] = {"wall_s": round(wall, 1), "machine": machine,
                       "summary": phase_summary(results),
                       "isolation": isolation(results, seen, namespaces),
                       "transactional_ids_before_room": len(before_txn),
                       "fenced": fenced(results),
                       "listed_own_max": max(listed_own, default=0),
                       "listed_others_max": max(listed_others, default=0),
                       "topics_left": sorted(seen["topics"] & set(_topics_now(bootstrap))),
                       "learners": results}
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1, default=sorted))
    print(markdown(doc))
    ok = all(doc[p]["summary"][n]["exact"] == doc[p]["summary"][n]["runs"] == len(indices)
             for p in ("solo", "room") if p in doc for n in SCENARIOS)
    ok = ok and not doc["room"]["isolation"]["breaches"] and not doc["room"]["fenced"]
    return 0 if ok else 1


def _topics_now(bootstrap: str) -> list[str]:
    from confluent_kafka.admin import AdminClient

    from labkit.kafka.clientlog import client_config
    return [t for t in AdminClient(client_config({"bootstrap.servers": bootstrap}))
            .list_topics(timeout=10).topics if not t.startswith("__")]


if __name__ == "__main__":
    sys.exit(main())
