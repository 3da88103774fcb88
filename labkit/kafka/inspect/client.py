"""``Inspector``: protocol requests straight to the brokers, so it works against any broker.

One object keeps one connection per broker, so a
live dashboard can ask many times a second without reconnecting. Not thread-safe: use one
Inspector per thread.

Requests (kio types): Metadata (leaders), ListOffsets (log start, high watermark, and LSO
with isolation READ_COMMITTED), Fetch READ_UNCOMMITTED (raw batches, markers included),
DescribeProducers (producer state per partition), ListTransactions (every broker) and
DescribeTransactions (at the coordinator found with FindCoordinator key_type 1), ListGroups
and OffsetFetch (at the group coordinator, FindCoordinator key_type 0).
"""
from __future__ import annotations

import datetime
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from kio.schema.describe_producers.v0 import request as describe_producers
from kio.schema.describe_topic_partitions.v0 import request as describe_partitions
from kio.schema.describe_transactions.v0 import request as describe_txns
from kio.schema.errors import ErrorCode
from kio.serial.errors import OutOfBoundValue
from kio.schema.fetch.v12 import request as fetch
from kio.schema.find_coordinator.v4 import request as find_coordinator
from kio.schema.list_groups.v4 import request as list_groups
from kio.schema.list_offsets.v7 import request as list_offsets
from kio.schema.offset_fetch.v8 import request as offset_fetch
from kio.schema.list_transactions.v1 import request as list_txns
from kio.schema.metadata.v12 import request as metadata
from kio.schema.types import BrokerId, GroupId, TopicName, TransactionalId
from kio.static.primitive import i8, i32, i32Timedelta, i64

from labkit.kafka import names
from labkit.kafka.inspect.batches import Batch, parse_batches
from labkit.kafka.inspect.model import PartitionOffsets, ProducerState, ReplicaState, Transaction
from labkit.kafka.protocol import Connection

EARLIEST, LATEST = -2, -1
CONSUMER, DEBUGGING_REPLICA = -1, -2  # ListOffsets' replica ids
READ_UNCOMMITTED, READ_COMMITTED = 0, 1
GROUP_KEY_TYPE, TRANSACTION_KEY_TYPE = 0, 1  # FindCoordinator key types
OPEN_STATES = ("Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence")
FETCH_BYTES = 1 << 20
# A coordinator that is moving or loading: nothing to report about its keys right now.
_NOT_READY = (ErrorCode.not_coordinator, ErrorCode.coordinator_not_available,
              ErrorCode.coordinator_load_in_progress)


class InspectError(RuntimeError):
    """The broker refused a request; the message names the request and the error, ``code``
    is the error (a kio ErrorCode)."""

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.code = code

    @property
    def leader_moved(self) -> bool:
        """The partition's leader is elsewhere or being elected: ask again, not an error."""
        return self.code in (ErrorCode.not_leader_or_follower, ErrorCode.leader_not_available)

    @property
    def retriable(self) -> bool:
        """Kafka marks the error retriable (a leader just elected answers ListOffsets with
        OFFSET_NOT_AVAILABLE until its high watermark is known): the same request may succeed."""
        return self.code is not None and ErrorCode(self.code).retriable


class UnknownTopicError(ValueError):
    def __init__(self, topic: str, bootstrap: str):
        super().__init__(f"topic {topic!r} does not exist on {bootstrap}; check the name "
                         "(`labkit inspect` never creates topics) or produce to it first")


def _check(error_code: int, what: str) -> None:
    if error_code != ErrorCode.none:
        raise InspectError(f"{what}: {ErrorCode(error_code).name}", ErrorCode(error_code))


class Inspector:
    """Read-only views of topics, producers and transactions on the cluster at ``bootstrap``."""

    def __init__(self, bootstrap: str, timeout_s: float = 10.0):
        if not bootstrap:
            raise ValueError("no bootstrap address: pass e.g. labkit.kafka.cluster.ensure().bootstrap")
        self.bootstrap = bootstrap
        self.timeout_s = timeout_s
        self._connections: dict[str, Connection] = {}
        self._brokers: dict[int, str] = {}
        self._pinned: dict[str, dict[int, str]] | None = None  # see one_metadata()

    # ------------------------------------------------------------ connections

    def _connect(self, address: str) -> Connection:
        conn = self._connections.get(address)
        if conn is None:
            conn = self._connections[address] = Connection(address, self.timeout_s)
        return conn

    def _send(self, address: str, request):
        try:
            return self._connect(address).send(request)
        except OSError:
            # A broker restarted or the connection went stale: one fresh attempt.
            stale = self._connections.pop(address, None)
            if stale is not None:
                stale.close()
            return self._connect(address).send(request)

    def _any_broker(self) -> str:
        errors = []
        for address in list(self._brokers.values()) or self.bootstrap.split(","):
            try:
                self._connect(address)
                return address
            except OSError as exc:
                errors.append(f"{address}: {exc}")
        raise ConnectionError(f"no broker reachable at {self.bootstrap} ({'; '.join(errors)}); "
                              "is the lab running? (`labkit status`)")

    def close(self) -> None:
        for conn in self._connections.values():
            conn.close()
        self._connections.clear()

    def __enter__(self) -> "Inspector":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------ metadata

    @contextmanager
    def one_metadata(self) -> Iterator["Inspector"]:
        """Within this block each topic's leaders are asked for once: a snapshot reads them
        for offsets, producers and every partition's batches, one moment's view is enough."""
        self._pinned = {}
        try:
            yield self
        finally:
            self._pinned = None

    def leaders(self, topic: str) -> dict[int, str]:
        """partition -> leader address. Never creates the topic.

        Every method here takes a learner's topic name or the broker's (``labkit.kafka.names``)."""
        topic = names.topic(topic)
        if self._pinned is not None and topic in self._pinned:
            return self._pinned[topic]
        request = metadata.MetadataRequest(
            topics=(metadata.MetadataRequestTopic(topic_id=None, name=TopicName(topic)),),
            allow_auto_topic_creation=False, include_topic_authorized_operations=False)
        response = self._send(self._any_broker(), request)
        self._brokers = {int(b.node_id): f"{b.host}:{int(b.port)}" for b in response.brokers}
        (found,) = response.topics
        if found.error_code == ErrorCode.unknown_topic_or_partition:
            raise UnknownTopicError(topic, self.bootstrap)
        _check(found.error_code, f"Metadata for {topic!r}")
        leaderless = [int(p.partition_index) for p in found.partitions if int(p.leader_id) not in self._brokers]
        if leaderless:
            raise InspectError(f"{topic} partition(s) {sorted(leaderless)} have no leader right now "
                               "(a broker is down or an election is running); try again shortly",
                               ErrorCode.leader_not_available)
        found_leaders = {int(p.partition_index): self._brokers[int(p.leader_id)]
                         for p in sorted(found.partitions, key=lambda p: p.partition_index)}
        if self._pinned is not None:
            self._pinned[topic] = found_leaders
        return found_leaders

    def _by_leader(self, topic: str, partitions: Iterable[int] | None) -> dict[str, list[int]]:
        leaders = self.leaders(topic)
        wanted = leaders if partitions is None else partitions
        grouped: dict[str, list[int]] = defaultdict(list)
        for p in wanted:
            if p not in leaders:
                raise ValueError(f"{topic!r} has partitions {sorted(leaders)}, not {p}")
            grouped[leaders[p]].append(p)
        return grouped

    # ------------------------------------------------------------ offsets

    def _list_offsets(self, address: str, topic: str, partitions: list[int], timestamp: int,
                      isolation: int, replica_id: int = CONSUMER) -> dict[int, int]:
        request = list_offsets.ListOffsetsRequest(
            replica_id=BrokerId(replica_id), isolation_level=i8(isolation),
            topics=(list_offsets.ListOffsetsTopic(name=TopicName(topic), partitions=tuple(
                list_offsets.ListOffsetsPartition(partition_index=i32(p), timestamp=i64(timestamp))
                for p in partitions)),))
        response = self._send(address, request)
        out = {}
        for t in response.topics:
            for p in t.partitions:
                _check(p.error_code, f"ListOffsets {topic}-{int(p.partition_index)}")
                out[int(p.partition_index)] = int(p.offset)
        return out

    def offsets(self, topic: str, partitions: Iterable[int] | None = None) -> dict[int, PartitionOffsets]:
        """Log start, LSO and high watermark of each partition (ListOffsets)."""
        topic = names.topic(topic)
        out: dict[int, PartitionOffsets] = {}
        for address, parts in self._by_leader(topic, partitions).items():
            start = self._list_offsets(address, topic, parts, EARLIEST, READ_UNCOMMITTED)
            hw = self._list_offsets(address, topic, parts, LATEST, READ_UNCOMMITTED)
            lso = self._list_offsets(address, topic, parts, LATEST, READ_COMMITTED)
            for p in parts:
                out[p] = PartitionOffsets(p, log_start=start[p], lso=lso[p], high_watermark=hw[p])
        return dict(sorted(out.items()))

    def log_end_offset(self, topic: str, at: str, partition: int = 0) -> int:
        """The end of the partition's log on the broker at ``at``, leader or follower: asked
        as Kafka's debugging replica (id -2), a replica answers with its log end offset, not
        the high watermark, even past what was copied (a partitioned leader's own records)."""
        topic = names.topic(topic)
        return self._list_offsets(at, topic, [partition], LATEST, READ_UNCOMMITTED,
                                  DEBUGGING_REPLICA)[partition]

    def settled_offsets(self, topic: str, timeout_s: float = 30.0) -> dict[int, PartitionOffsets]:
        """``offsets`` once every partition's LSO has reached its high watermark: no
        transaction open and every marker written. commit_transaction() returns before the
        coordinator has written the COMMIT markers, so a high watermark read right after it
        can still lack them (one offset short per partition, more often under load)."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = self.offsets(topic)
            if all(o.lso == o.high_watermark for o in found.values()):
                return found
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: a transaction is still open after {timeout_s:.0f} s "
                                   f"(LSO behind the high watermark: {found})")
            time.sleep(0.05)

    # ------------------------------------------------------------ batches

    def batches(self, topic: str, partition: int, start: int, end: int) -> list[Batch]:
        """Every batch holding an offset in [start, end), read raw with READ_UNCOMMITTED:
        committed, open and aborted data and the COMMIT/ABORT marker batches."""
        topic = names.topic(topic)
        (address, _), = self._by_leader(topic, [partition]).items()
        out: list[Batch] = []
        position, max_bytes = start, FETCH_BYTES
        while position < end:
            request = fetch.FetchRequest(
                max_wait=i32Timedelta.parse(datetime.timedelta(0)), min_bytes=i32(0),
                max_bytes=i32(max_bytes), isolation_level=i8(READ_UNCOMMITTED),
                topics=(fetch.FetchTopic(topic=TopicName(topic), partitions=(fetch.FetchPartition(
                    partition=i32(partition), fetch_offset=i64(position),
                    partition_max_bytes=i32(max_bytes)),)),),
                forgotten_topics_data=())
            (data,) = self._send(address, request).responses[0].partitions
            _check(data.error_code, f"Fetch {topic}-{partition} at offset {position}")
            got = [b for b in parse_batches(bytes(data.records or b""), partition)
                   if b.last_offset >= position and b.base_offset < end]
            if not got:
                if not data.records or max_bytes >= 64 * FETCH_BYTES:
                    break  # nothing (more) below the high watermark
                max_bytes *= 4  # a batch larger than the fetch size: ask for more
                continue
            out.extend(got)
            position = got[-1].last_offset + 1
        return out

    # ------------------------------------------------------------ producers, transactions

    def producers(self, topic: str, partitions: Iterable[int] | None = None) -> list[ProducerState]:
        """Active producers per partition (DescribeProducers, at each partition leader)."""
        topic = names.topic(topic)
        out: list[ProducerState] = []
        for address, parts in self._by_leader(topic, partitions).items():
            request = describe_producers.DescribeProducersRequest(topics=(
                describe_producers.TopicRequest(name=TopicName(topic),
                                                partition_indexes=tuple(i32(p) for p in parts)),))
            for t in self._send(address, request).topics:
                for p in t.partitions:
                    _check(p.error_code, f"DescribeProducers {topic}-{int(p.partition_index)}")
                    out.extend(ProducerState.from_kio(int(p.partition_index), s)
                               for s in p.active_producers)
        return sorted(out, key=lambda s: (s.partition, s.producer_id))

    def transactions(self, states: Iterable[str] = OPEN_STATES,
                     topic: str | None = None) -> list[Transaction]:
        """Transactions in ``states`` (default: open ones), optionally only those writing to
        ``topic``. ListTransactions goes to every broker (each coordinates some ids).
        On a shared cluster only the learner's namespace's ids are looked at (labkit.kafka.names)."""
        states = tuple(states)
        ids = self.transactional_ids(states)
        # States move on between the two requests: keep only what still matches.
        found = [t for t in self.describe_transactions(ids)
                 if not states or t.state in states]
        if topic is not None:
            topic = names.topic(topic)
            found = [t for t in found if any(tp == topic for tp, _ in t.partitions)]
        return found

    def transactional_ids(self, states: Iterable[str] = ()) -> list[str]:
        """The transactional ids the coordinators know (in ``states``; default: any, finished
        ones too, until they expire), those of the learner's namespace (labkit.kafka.names)."""
        return sorted(self.listed_transactions(states))

    def listed_transactions(self, states: Iterable[str] = ()) -> dict[str, tuple[str, int]]:
        """transactional id -> (its state, its producer id) as ListTransactions gives them (in
        ``states``; default: any, finished ones too), those of the learner's namespace. The
        producer id is what the id's records in a log carry."""
        states = tuple(states)
        if not self._brokers:
            self.brokers()
        found: dict[str, tuple[str, int]] = {}
        request = list_txns.ListTransactionsRequest(state_filters=states)
        for address in self._brokers.values():
            response = self._send(address, request)
            if response.error_code in _NOT_READY:
                continue  # this broker's transaction log is still loading: nothing to list yet
            _check(response.error_code, "ListTransactions")
            listed = {str(t.transactional_id): (str(t.transaction_state), int(t.producer_id))
                      for t in response.transaction_states}
            found.update({t: listed[t] for t in names.only_mine(listed)})
        return found

    def _coordinators(self, key_type: int, keys: list[str]) -> dict[str, list[str]]:
        """coordinator address -> the keys (group or transactional ids) it coordinates.
        Keys whose coordinator is not ready (e.g. loading) are left out of this look."""
        request = find_coordinator.FindCoordinatorRequest(key_type=i8(key_type),
                                                          coordinator_keys=tuple(keys))
        by_coordinator: dict[str, list[str]] = defaultdict(list)
        for c in self._send(self._any_broker(), request).coordinators:
            if c.error_code in _NOT_READY:
                continue
            _check(c.error_code, f"FindCoordinator for {c.key!r}")
            by_coordinator[f"{c.host}:{int(c.port)}"].append(str(c.key))
        return by_coordinator

    def transaction_coordinator(self, transactional_id: str) -> str | None:
        """The address of the broker coordinating ``transactional_id`` (None while its
        coordinator moves or loads)."""
        found = self._coordinators(TRANSACTION_KEY_TYPE, [names.transactional_id(transactional_id)])
        return next(iter(found), None)

    def describe_transactions(self, transactional_ids: Iterable[str]) -> list[Transaction]:
        ids = [names.transactional_id(t) for t in transactional_ids]
        out: list[Transaction] = []
        if not ids:
            return out
        for address, keys in self._coordinators(TRANSACTION_KEY_TYPE, ids).items():
            for state in self._describe_at(address, keys):
                if state.error_code in (ErrorCode.transactional_id_not_found, *_NOT_READY):
                    continue  # expired, or its coordinator moved, between the two requests
                _check(state.error_code, f"DescribeTransactions {state.transactional_id!r}")
                out.append(Transaction.from_kio(state))
        return sorted(out, key=lambda t: t.transactional_id)

    def _describe_at(self, address: str, keys: list[str]) -> list:
        """DescribeTransactions states from one coordinator. An id with no transaction (Empty,
        or finished) has start time -1, which kio cannot read as a timestamp: then the ids are
        asked one by one and those are left out (they are not open, so there is nothing to show)."""
        def ask(batch: list[str]) -> list:
            return list(self._send(address, describe_txns.DescribeTransactionsRequest(
                transactional_ids=tuple(TransactionalId(k) for k in batch))).transaction_states)
        try:
            return ask(keys)
        except OutOfBoundValue:
            found = []
            for key in keys:
                try:
                    found += ask([key])
                except OutOfBoundValue:
                    continue
            return found

    def replica_states(self, topic: str, at: str | None = None) -> list[ReplicaState]:
        """Leader, replicas, ISR and ELR of each partition, asked of the broker at ``at``
        (default: any). A failure experiment names a broker it knows is running: a frozen
        one accepts the connection and never answers."""
        topic = names.topic(topic)
        response = self._send(at or self._any_broker(), describe_partitions.DescribeTopicPartitionsRequest(
            topics=(describe_partitions.TopicRequest(name=TopicName(topic)),)))
        (found,) = response.topics
        if found.error_code == ErrorCode.unknown_topic_or_partition:
            raise UnknownTopicError(topic, self.bootstrap)
        _check(found.error_code, f"DescribeTopicPartitions for {topic!r}")
        return [ReplicaState(int(p.partition_index),
                             None if int(p.leader_id) < 0 else int(p.leader_id),
                             int(p.leader_epoch), tuple(map(int, p.replica_nodes)),
                             tuple(map(int, p.isr_nodes)),
                             tuple(map(int, p.eligible_leader_replicas or ())))
                for p in sorted(found.partitions, key=lambda p: p.partition_index)]

    def brokers(self) -> dict[int, str]:
        """The brokers of the cluster (node id -> address), from a topic-less Metadata."""
        response = self._send(self._any_broker(), metadata.MetadataRequest(
            topics=(), allow_auto_topic_creation=False, include_topic_authorized_operations=False))
        self._brokers = {int(b.node_id): f"{b.host}:{int(b.port)}" for b in response.brokers}
        return dict(self._brokers)

    # ------------------------------------------------------------ consumer groups

    def groups(self) -> list[str]:
        """Every consumer group on the cluster (ListGroups at every broker); on a shared
        cluster, those of the learner's namespace (labkit.kafka.names)."""
        found: set[str] = set()
        for address in self.brokers().values():
            response = self._send(address, list_groups.ListGroupsRequest())
            if response.error_code in _NOT_READY:
                continue
            _check(response.error_code, "ListGroups")
            found.update(names.only_mine(str(g.group_id) for g in response.groups))
        return sorted(found)

    def group_offsets(self, topic: str, groups: Iterable[str] | None = None) -> dict[str, dict[int, int]]:
        """group -> partition -> committed offset (the next offset that group will read),
        for every group (or the given ones) with a committed offset on ``topic``.

        OffsetFetch straight to each group's coordinator. (librdkafka's AdminClient can
        segfault asking about a group whose coordinator is still loading.)"""
        topic = names.topic(topic)
        wanted = self.groups() if groups is None else [names.group(g) for g in groups]
        out: dict[str, dict[int, int]] = {}
        if not wanted:
            return out
        for address, keys in self._coordinators(GROUP_KEY_TYPE, wanted).items():
            # topics=None: all of the group's offsets (a topic needs its partitions listed)
            request = offset_fetch.OffsetFetchRequest(groups=tuple(
                offset_fetch.OffsetFetchRequestGroup(group_id=GroupId(g), topics=None)
                for g in keys))
            for group in self._send(address, request).groups:
                if group.error_code in _NOT_READY:
                    continue
                _check(group.error_code, f"OffsetFetch for group {group.group_id!r}")
                committed = {int(p.partition_index): int(p.committed_offset)
                             for t in group.topics if t.name == topic for p in t.partitions
                             if p.error_code == ErrorCode.none and p.committed_offset >= 0}
                if committed:
                    out[str(group.group_id)] = dict(sorted(committed.items()))
        return dict(sorted(out.items()))
