"""A learner's namespace on a shared cluster: the one rule for the names the lab gives Kafka.

With ``LABKIT_NAMESPACE=alice`` (or, on an external cluster, the SASL user name or the login name: see
``namespace_and_source``) every topic, consumer group id and transactional id
the lab creates is ``alice.<name>``: a notebook keeps saying ``payments``, the broker holds
``alice.payments``. Learners sharing one cluster then never read each other's topics, never
join each other's groups and never fence each other's producers (the transaction
coordinator fences by transactional id, the group coordinator by group id). On the local
lab the namespace is empty and every name is unchanged, so the lessons' outputs are too.

Why ``.``: Kafka allows ``[a-zA-Z0-9._-]`` in topic names and a namespace may not contain
``.`` (settings checks it), so ``alice.`` can never be the start of another learner's
name (with ``-``, ``alice-`` would also start every name of a learner called ``alice-bob``).
It is also what an instructor's prefixed ACLs match (``--resource-pattern-type prefixed
--topic alice.``). The one cost: Kafka's metric names turn ``.`` into ``_``, so ``a_b.x``
and ``a.b_x`` collide and the broker refuses to create the second; the lab's own names use
``-``, never ``_``, so only a learner naming topics with ``_`` under a namespace with ``_``
can meet it, as a clear "collides with existing topics" error, never as a shared topic.

The rule is idempotent: a name that already carries the prefix is returned unchanged, so a
name the lab generated (already namespaced) can go through any helper that namespaces what
a learner typed (``topics.read``, ``describe_topic``, ...) without becoming ``alice.alice.x``.
"""
from __future__ import annotations

import getpass
import re
from collections.abc import Iterable

from labkit import settings

from labkit.kafka import connection

SEPARATOR = "."
MAX_TOPIC = 249  # Kafka's limit on a topic name's length
ROOM_TOPIC_PREFIX = "labkit-room-"  # a room board's topic: outside every namespace (room_topic)
INTERNAL_PREFIX = "__"  # Kafka's internal topics (__consumer_offsets, __transaction_state)


def namespace() -> str:
    """The current namespace ("" on the local lab; the rule: ``namespace_and_source``)."""
    return namespace_and_source()[0]


def namespace_and_source() -> tuple[str, str]:
    """The namespace and, in words, where it comes from.

    LABKIT_NAMESPACE when set (set empty: none). On an external cluster, which a room
    shares: the SASL user name in LABKIT_KAFKA_CONFIG (each learner's own login there, and
    what an instructor's prefixed ACLs grant, e.g. ``learner01.``), else the login name on
    this machine. On the local lab none, so the lessons show the names they talk about."""
    now = settings.current()
    if now.namespace_set:
        return settings.checked_namespace(now.namespace_set), "from LABKIT_NAMESPACE"
    if now.namespace_given:
        return "", "LABKIT_NAMESPACE is set empty"
    if not now.external:
        return "", "the local lab's default; LABKIT_NAMESPACE=name sets one"
    user = connection.settings().get("sasl.username", "")
    if user:
        return (settings.checked_namespace(_legal(user), "sasl.username"),
                "your user name in LABKIT_KAFKA_CONFIG, the default on an external cluster "
                "(LABKIT_BOOTSTRAP) with credentials; LABKIT_NAMESPACE=name sets another")
    return (settings.checked_namespace(_legal(getpass.getuser()), "the login name"),
            "your login name, the default on an external cluster (LABKIT_BOOTSTRAP); "
            "LABKIT_NAMESPACE=name sets another")


def _legal(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_-]", "-", name)


def prefix() -> str:
    """What every name gets in front: ``"alice."``, or "" without a namespace."""
    ns = namespace()
    return f"{ns}{SEPARATOR}" if ns else ""


def qualify(name: str) -> str:
    """``name`` in the current namespace (unchanged if it is in it already, or if there is
    no namespace). The one rule; ``topic``, ``group`` and ``transactional_id`` say which
    kind of name a call site means."""
    if not name or name.startswith(ROOM_TOPIC_PREFIX):  # a room's board: shared, never prefixed
        return name
    if name.startswith(INTERNAL_PREFIX):  # the broker's own (__transaction_state): nobody's
        return name
    p = prefix()
    return name if not p or name.startswith(p) else p + name


def topic(name: str) -> str:
    """The broker's name of the learner's topic ``name``."""
    full = qualify(name)
    if len(full) > MAX_TOPIC:
        raise ValueError(f"topic name {full!r} is {len(full)} characters; Kafka allows at most "
                         f"{MAX_TOPIC} (a shorter name, or a shorter LABKIT_NAMESPACE)")
    return full


def group(name: str) -> str:
    """The broker's id of the learner's consumer (or share) group ``name``."""
    return qualify(name)


def transactional_id(name: str) -> str:
    """The broker's transactional.id for the learner's ``name``."""
    return qualify(name)


def room_topic(room: str) -> str:
    """The topic of room ``room``'s board: the one name no namespace prefixes, since every
    learner of the room writes it and the instructor reads it (a room's ACLs grant WRITE
    on the prefix to learners, READ to the instructor)."""
    if not re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_-]{0,39}", room):
        raise settings.SettingsError(f"LABKIT_ROOM={room!r}: use letters, digits, '-' and '_' "
                                     "(at most 40, starting with a letter or digit), e.g. kafka-101")
    return ROOM_TOPIC_PREFIX + room


def short(name: str) -> str:
    """For display: a name without the current namespace's prefix (others unchanged)."""
    p = prefix()
    return name[len(p):] if p and name.startswith(p) else name


def mine(name: str) -> bool:
    """Does the broker's ``name`` belong to the current namespace? (Always, without one.)"""
    return bool(only_mine([name]))


def only_mine(broker_names: Iterable[str]) -> list[str]:
    """Those of ``broker_names`` in the current namespace, in order. The namespace is looked
    up once (on a shared cluster it may mean reading LABKIT_KAFKA_CONFIG), not per name."""
    p = prefix()
    return [n for n in broker_names if not p or n.startswith(p)]
