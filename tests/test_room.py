"""A room's secure cluster (labkit.room.secure_cluster, docker-compose's ``secure`` profile) and the room
load test's command line (benchmarks/room.py; the load test itself is run by hand, see
docs/measurements-room.md).

Docker does not run here: the compose profile is checked against the files the generator
really makes, and the generator's broker settings, users and ACLs run on a real broker
started with the lab's jars (one broker, to stay cheap; the 3-broker room ran in
benchmarks/room.py --secure).
"""
from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from labkit.room import doctor, secure_cluster as room
from labkit.kafka.clientlog import client_config
from labkit.kafka.localcluster import LocalCluster
from labkit.kafka.connection import read_properties
from labkit.kafka.names import room_topic

ROOT = Path(__file__).resolve().parents[1]


def _props(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines()
                if line and not line.startswith("#"))


def test_compose_secure_profile_runs_the_generated_files(tmp_path):
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    made = room.compose_files(tmp_path, learners=2, room_host="10.1.2.3")
    assert room.compose_files(tmp_path, learners=2) is None  # a restart keeps users and keys

    def host_path(service: dict, seen: str) -> Path:
        """The file a service sees at ``seen``, through its bind mounts of ./room."""
        for volume in service["volumes"]:
            src, dst, *_ = volume.split(":")
            if src.startswith("./room") and seen.startswith(dst + "/"):
                return tmp_path / src.removeprefix("./room").strip("/") / seen[len(dst) + 1:]
        raise AssertionError(f"{seen} is on no volume of {service}")

    from labkit.kafka import jvm

    internal = []
    for n in (1, 2, 3):
        svc = compose[f"room-{n}"]
        assert svc["image"] == f"apache/kafka:{jvm.pinned_versions()['kafka.version']}"
        script = host_path(svc, svc["command"][1])
        assert script.is_file()
        words = script.read_text().split()
        config = words[words.index("-c") + 1]  # what kafka-storage formats with
        assert words[-1] == config  # and what the broker starts with
        props = _props(host_path(svc, config))
        for key in ("ssl.keystore.location", "ssl.truststore.location"):
            assert host_path(svc, props[key]).is_file()
        advertised = dict(p.split("://") for p in props["advertised.listeners"].split(","))
        assert advertised["INTERNAL"] == f"{svc['hostname']}:{room.INTERNAL_PORT}"
        host, port = advertised["HOST"].rsplit(":", 1)
        assert host == "10.1.2.3" and svc["ports"] == [f"${{ROOM_BIND:-127.0.0.1}}:{port}:{port}"]
        assert props["node.id"] == str(n) and props["allow.everyone.if.no.acl.found"] == "false"
        internal.append(advertised["INTERNAL"])
    bootstrap = ",".join(internal)
    acls = compose["room-acls"]
    assert acls["command"][-1] == bootstrap
    assert host_path(acls, made.seen(made.admin_file)).is_file()
    lab = compose["jupyter-room"]["environment"]
    assert lab["LABKIT_BOOTSTRAP"] == bootstrap
    config = host_path(compose["jupyter-room"],
                       lab["LABKIT_KAFKA_CONFIG"].replace("${ROOM_USER:-learner01}", "learner01"))
    client = read_properties(config)
    assert client["sasl.username"] == lab["LABKIT_NAMESPACE"].replace("${ROOM_USER:-learner01}",
                                                                       "learner01")
    assert host_path(compose["jupyter-room"], client["ssl.ca.location"]).is_file()
    from cryptography import x509

    pem = (tmp_path / "broker" / "server.pem").read_bytes()
    cert = x509.load_pem_x509_certificate(pem[pem.index(b"-----BEGIN CERTIFICATE"):])
    names = {str(n.value) for n in cert.extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value}
    assert {"room-1", "room-2", "room-3", "10.1.2.3"} <= names


def test_room_acls_keep_each_learner_in_its_namespace(tmp_path, monkeypatch):
    """The generator's listeners (SASL_SSL, SSL controller with client certificates), SCRAM
    users and prefixed ACLs on a real broker: learner01 works in learner01.*, and cannot
    see, create, join or fence anything of learner02's."""
    monkeypatch.setenv("LABKIT_NAMESPACE", "")  # the names below are the broker's, written out
    cluster = LocalCluster(brokers=1, home=tmp_path / "lab", secure=True)
    cluster.security = room.RoomSecurity(tmp_path / "room", learners=2)
    files = cluster.security.files
    run = uuid.uuid4().hex[:6]

    def config(i: int, **extra) -> dict:  # learner i's own credentials, nothing else
        return client_config({"bootstrap.servers": cluster.bootstrap,
                              **read_properties(files.learner_file(i)), **extra})

    with cluster:
        admins = {i: AdminClient(config(i)) for i in (1, 2)}
        for i in (1, 2):
            futures = admins[i].create_topics([NewTopic(f"learner0{i}.{run}", 1, 1)])
            futures[f"learner0{i}.{run}"].result(timeout=30)
        # learner01 sees its own topic only
        listed = set(admins[1].list_topics(timeout=15).topics)
        assert f"learner01.{run}" in listed and f"learner02.{run}" not in listed
        # ... and may not create outside its prefix
        refused = admins[1].create_topics([NewTopic(f"learner02.{run}-x", 1, 1)])
        with pytest.raises(KafkaException) as exc:
            refused[f"learner02.{run}-x"].result(timeout=30)
        assert exc.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        # a transaction in its namespace goes through, and reads back
        producer = Producer(config(1, **{"transactional.id": f"learner01.{run}"}))
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce(f"learner01.{run}", b"hello")
        producer.commit_transaction(30)
        consumer = Consumer(config(1, **{"group.id": f"learner01.{run}",
                                         "auto.offset.reset": "earliest",
                                         "isolation.level": "read_committed"}))
        consumer.subscribe([f"learner01.{run}"])
        got = None
        for _ in range(30):
            got = consumer.poll(1.0)
            if got is not None and not got.error():
                break
        consumer.close()
        assert got is not None and got.value() == b"hello"
        # learner02's transactional id: learner01 cannot take it (so cannot fence learner02)
        intruder = Producer(config(1, **{"transactional.id": f"learner02.{run}"}))
        with pytest.raises(KafkaException) as exc:
            intruder.init_transactions(30)
        assert exc.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        # nor join learner02's group: the broker answers its poll with the refusal
        spy = Consumer(config(1, **{"group.id": f"learner02.{run}"}))
        spy.subscribe([f"learner01.{run}"])
        errors = set()
        for _ in range(30):
            msg = spy.poll(1.0)
            if msg is not None and msg.error():
                errors.add(msg.error().code())
                if KafkaError.GROUP_AUTHORIZATION_FAILED in errors:
                    break
        spy.close()
        assert KafkaError.GROUP_AUTHORIZATION_FAILED in errors, errors
        # the room's board: the instructor makes its topic; a learner may write it, not read it
        board_topic = room_topic(run)
        instructor = AdminClient(client_config({"bootstrap.servers": cluster.bootstrap,
                                                **files.admin()}))
        instructor.create_topics([NewTopic(board_topic, 1, 1)])[board_topic].result(timeout=30)
        results = Producer(config(1))
        acked = []
        results.produce(board_topic, b'{"passed": true}', on_delivery=lambda e, m: acked.append(e))
        results.flush(30)
        assert acked == [None]
        reader = Consumer(config(1, **{"group.id": f"learner01.{run}-board"}))
        reader.assign([TopicPartition(board_topic, 0, 0)])
        refusals = set()
        for _ in range(20):
            msg = reader.poll(1.0)
            if msg is not None and msg.error():
                refusals.add(msg.error().code())
                break
            assert msg is None, "a learner read the room's results"
        reader.close()
        assert KafkaError.TOPIC_AUTHORIZATION_FAILED in refusals, refusals
        del producer, intruder, admins, instructor, results  # before the broker stops
        # The doctor as learner01 with only its file: the namespace defaults to its user name
        # (what the ACLs grant) and every round trip passes; a wrong LABKIT_NAMESPACE is
        # refused by the ACLs and named as the fix.
        monkeypatch.setenv("LABKIT_BOOTSTRAP", cluster.bootstrap)
        monkeypatch.setenv("LABKIT_KAFKA_CONFIG", str(files.learner_file(1)))
        monkeypatch.delenv("LABKIT_NAMESPACE")
        checks = {c.name: c for c in doctor.run(spark=False)}
        assert checks["produce/consume"].ok and checks["transactions"].ok, checks
        monkeypatch.setenv("LABKIT_NAMESPACE", "learner02")
        wrong = {c.name: c for c in doctor.run(spark=False)}["produce/consume"]
        assert not wrong.ok and "AUTHORIZATION_FAILED" in wrong.detail
        assert "'learner02'" in wrong.fix and "set LABKIT_NAMESPACE" in wrong.fix


@pytest.mark.parametrize("args, message", [
    (["--learners", "0"], "--learners must be 1-99"),
    (["--records", "5"], "--records must be at least 10"),
    (["--secure", "--bootstrap", "127.0.0.1:1"], "--secure starts its own 3-broker room"),
    (["--kafka-config", "/nonexistent.properties"], "no such file"),
])
def test_load_test_refuses_bad_arguments(args, message):
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "room.py"), *args],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and message in out.stderr


def test_compose_broker_script_formats_with_the_real_storage_tool(tmp_path):
    """room-1's start script, as bash would split it, run by Kafka's own StorageTool (the
    lab's jars in place of the image's kafka-storage.sh): the generated server.properties and
    every --add-scram argument are accepted. Only log.dirs and the /room paths are moved."""
    import shlex

    from labkit.kafka import jvm

    made = room.compose_files(tmp_path / "room", learners=3)
    line = next(ln for ln in (made.broker_dir / "node-1.sh").read_text().splitlines()
                if "kafka-storage.sh format" in ln)
    words = shlex.split(line)
    config = words[words.index("-c") + 1]
    data = tmp_path / "data"
    local = tmp_path / "node-1.properties"
    local.write_text((made.dir / config.removeprefix(room.MOUNT + "/")).read_text()
                     .replace("log.dirs=/var/lib/kafka/data", f"log.dirs={data}")
                     .replace(room.MOUNT + "/", f"{made.dir}/"))
    words[words.index("-c") + 1] = str(local)
    assert words[:2] == ["/opt/kafka/bin/kafka-storage.sh", "format"]
    assert sum(w == "--add-scram" for w in words) == 4  # admin + 3 learners
    cmd = [jvm.check_java(), "-cp", jvm.classpath("kafka"), "kafka.tools.StorageTool", *words[1:]]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    # Kafka 4.4's format writes the bootstrap records (the SCRAM users among them) as the
    # metadata log's first snapshot; 4.3 wrote them to bootstrap.checkpoint beside it
    snapshot = data / "__cluster_metadata-0" / "00000000000000000000-0000000000.checkpoint"
    assert (data / "meta.properties").is_file() and snapshot.is_file()
    written = snapshot.read_bytes()  # the SCRAM users are in it, by name
    assert all(user in written for user in (b"admin", b"learner01", b"learner02", b"learner03"))
