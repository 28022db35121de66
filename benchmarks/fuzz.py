"""Fuzz the embedded broker with mutated Kafka requests, seeded and bounded in time.

The corpus is what confluent-kafka really sends: its produce (idempotent and transactional), fetch,
metadata, consumer group and transaction requests, recorded as the frames an in-process broker
receives (:func:`capture_corpus`). Each case mutates one to three of them (bit flips, boundary
values in int16/int32 fields, varint bytes, truncation, insertion, splices, another version of the
same API, a wrong size prefix), sends them on a new connection to a separate broker process and
half-closes it; the broker must answer or close the connection within ``--case-timeout`` seconds
(requests that may wait by design, Fetch and the group rebalance ones, are let go), and must stay
alive and serve a real client. Memory: the broker's RSS may grow by at most ``--max-rss-growth-mib``.

    python -m benchmarks.fuzz --seconds 600 --seed 7
    python -m benchmarks.fuzz --cases 5000 --seed 1 --keep-dir /tmp/fuzz   # keeps the broker's data and log

Every case is reproducible from ``--seed`` and its number: a finding is printed with both, and the
frames it sent are written beside the broker's log (``--keep-dir``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import random
import socket
import struct
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkafka.broker.protocol import SUPPORTED_VERSIONS, ApiKey
from sparkafka.broker.runner import BrokerProcess

FUZZ_TOPIC = "fuzz"
HEALTH_TOPIC = "fuzz-health"
# Changes of topics themselves (thousands of partitions, deletions) are outside this fuzzer: a mutated
# count is a legitimate request that takes long, and a deletion would take the corpus' topic away.
_LEFT_OUT = frozenset({ApiKey.CREATE_TOPICS, ApiKey.DELETE_TOPICS, ApiKey.CREATE_PARTITIONS})
# Requests that may legitimately wait long (Fetch's max wait, a rebalance's timeout) before an answer.
_MAY_WAIT = frozenset({ApiKey.FETCH, ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP})
_INTERESTING_16 = (0, 1, -1, 0x7FFF, -0x8000, 0x7F, 0x80, 0xFF)
_INTERESTING_32 = (0, 1, -1, 0x7FFFFFFF, -0x80000000, 0xFFFF, 0x10000, 100 * 1024 * 1024)
_SIZE = struct.Struct(">i")


# -- the corpus -------------------------------------------------------------------------------------


def capture_corpus() -> list[bytes]:
    """The request frames (size prefix left out) confluent-kafka clients send to a broker in this
    process: admin, idempotent and transactional produce, a consumer group reading and committing,
    transactional offsets, an abort. The topic is :data:`FUZZ_TOPIC` (2 partitions)."""
    from sparkafka.broker import server
    from sparkafka.broker.config import BrokerConfig
    from sparkafka.broker.runner import EmbeddedBroker

    frames: list[bytes] = []
    original = server.Connection._respond

    async def recording(self: Any, frame: bytes | bytearray) -> Any:
        frames.append(bytes(frame))
        return await original(self, frame)

    with tempfile.TemporaryDirectory(prefix="sparkafka-fuzz-capture-") as directory:
        config = BrokerConfig(port=0, data_dir=Path(directory) / "data", group_initial_rebalance_delay_ms=0)
        server.Connection._respond = recording  # type: ignore[method-assign]
        broker = EmbeddedBroker(config).start()
        try:
            _client_flows(broker.bootstrap_servers)
        finally:
            server.Connection._respond = original  # type: ignore[method-assign]
            broker.stop()
    keep = [
        frame
        for frame in dict.fromkeys(frames)
        if len(frame) >= 8 and struct.unpack_from(">h", frame)[0] not in _LEFT_OUT
    ]
    return keep


def _client_flows(bootstrap: str) -> None:
    """What the corpus records; the clients are gone (their connections closed) once this returns."""
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(FUZZ_TOPIC, 2, 1)])[FUZZ_TOPIC].result(30)
    admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, FUZZ_TOPIC)])
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for i in range(20):
        producer.produce(FUZZ_TOPIC, key=b"k%d" % i, value=b"value %d" % i, headers={"h": b"v"})
    assert producer.flush(30) == 0
    group = f"fuzz-{uuid.uuid4().hex[:6]}"
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    consumer.subscribe([FUZZ_TOPIC])
    seen, deadline = 0, time.monotonic() + 30
    while seen < 20 and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            seen += 1
    consumer.commit(asynchronous=False)
    transactional = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{group}-txn"})
    transactional.init_transactions(30)
    transactional.begin_transaction()
    transactional.produce(FUZZ_TOPIC, key=b"t", value=b"in a transaction")
    transactional.send_offsets_to_transaction(
        consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 30
    )
    transactional.commit_transaction(30)
    transactional.begin_transaction()
    transactional.produce(FUZZ_TOPIC, key=b"t", value=b"aborted")
    transactional.abort_transaction(30)
    consumer.close()
    admin.list_consumer_groups().result(10)


# -- mutations ----------------------------------------------------------------------------------------


def _flip_bits(rng: random.Random, data: bytearray, corpus: list[bytes]) -> None:
    for _ in range(rng.randint(1, 8)):
        position = rng.randrange(len(data))
        data[position] ^= 1 << rng.randrange(8)


def _boundary_int(rng: random.Random, data: bytearray, corpus: list[bytes]) -> None:
    if (rng.random() < 0.5 and len(data) >= 2) or 2 <= len(data) < 4:
        position = rng.randrange(len(data) - 1)
        struct.pack_into(">h", data, position, rng.choice(_INTERESTING_16))
    elif len(data) >= 4:
        position = rng.randrange(len(data) - 3)
        struct.pack_into(">i", data, position, rng.choice(_INTERESTING_32))


def _varint_bytes(rng: random.Random, data: bytearray, corpus: list[bytes]) -> None:
    position = rng.randrange(len(data))
    for offset in range(rng.randint(1, 6)):
        if position + offset < len(data):
            data[position + offset] = rng.choice((0x80, 0xFF, 0xFE, 0x7F, 0x00, 0x81))


def _truncate(rng: random.Random, data: bytearray, corpus: list[bytes]) -> None:
    del data[rng.randrange(len(data)) :]


def _insert(rng: random.Random, data: bytearray, corpus: list[bytes]) -> None:
    position = rng.randrange(len(data) + 1)
    data[position:position] = rng.randbytes(rng.randint(1, 64))


def _duplicate(rng: random.Random, data: bytearray, corpus: list[bytes]) -> None:
    start = rng.randrange(len(data))
    chunk = data[start : start + rng.randint(1, 256)]
    position = rng.randrange(len(data) + 1)
    data[position:position] = chunk * rng.randint(1, 4)


def _splice(rng: random.Random, data: bytearray, corpus: list[bytes]) -> None:
    other = rng.choice(corpus)
    cut = rng.randrange(len(data))
    data[cut:] = other[rng.randrange(len(other)) :]


def _other_version(rng: random.Random, data: bytearray, corpus: list[bytes]) -> None:
    if len(data) < 4:
        return
    (api_key,) = struct.unpack_from(">h", data)
    low, high = SUPPORTED_VERSIONS.get(api_key, (0, 12))  # type: ignore[call-overload]
    struct.pack_into(">h", data, 2, rng.randint(max(low - 1, 0), high + 1))


def _other_api(rng: random.Random, data: bytearray, corpus: list[bytes]) -> None:
    if len(data) < 2:
        return
    struct.pack_into(">h", data, 0, int(rng.choice(list(SUPPORTED_VERSIONS))))


_MUTATORS = (
    (_flip_bits, 6),
    (_boundary_int, 6),
    (_varint_bytes, 3),
    (_truncate, 3),
    (_insert, 2),
    (_duplicate, 2),
    (_splice, 2),
    (_other_version, 2),
    (_other_api, 1),
)


def mutate(rng: random.Random, frame: bytes, corpus: list[bytes]) -> bytes:
    data = bytearray(frame)
    functions, weights = zip(*_MUTATORS, strict=True)
    for mutator in rng.choices(functions, weights, k=rng.randint(1, 3)):
        if not data:
            break
        mutator(rng, data, corpus)
    return bytes(data)


def _framed(rng: random.Random, payload: bytes) -> bytes:
    """Size-prefixed; now and then with a size that lies (then the half-close ends the frame)."""
    roll = rng.random()
    if roll < 0.94:
        size = len(payload)
    elif roll < 0.96:
        size = rng.choice((-1, -0x80000000, 0x7FFFFFFF, 100 * 1024 * 1024 + 1))
    else:
        size = max(0, len(payload) + rng.randint(-16, 64))
    return _SIZE.pack(size) + payload


@dataclass(frozen=True)
class Case:
    number: int
    frames: tuple[bytes, ...]  # as sent, size prefixes included

    @property
    def may_wait(self) -> bool:
        return any(
            len(frame) >= 6 and struct.unpack_from(">h", frame, 4)[0] in _MAY_WAIT for frame in self.frames
        )


def make_case(seed: int, number: int, corpus: list[bytes]) -> Case:
    rng = random.Random(f"{seed}:{number}")
    frames = []
    for _ in range(rng.choices((1, 2, 3), (6, 2, 1))[0]):
        original = rng.choice(corpus)
        payload = original if rng.random() < 0.1 else mutate(rng, original, corpus)
        frames.append(_framed(rng, payload))
    return Case(number, tuple(frames))


# -- running ------------------------------------------------------------------------------------------


def send_case(port: int, case: Case, timeout_s: float) -> str:
    """``closed`` once the broker closed the connection (after its answers, if any), ``hang`` when it
    had not within ``timeout_s``, ``waited`` for a case that may wait by design."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as connection:
        connection.settimeout(timeout_s)
        deadline = time.monotonic() + timeout_s
        try:
            connection.sendall(b"".join(case.frames))
            connection.shutdown(socket.SHUT_WR)
            while time.monotonic() < deadline:
                connection.settimeout(max(deadline - time.monotonic(), 0.01))
                if not connection.recv(1 << 16):
                    return "closed"
        except (ConnectionResetError, BrokenPipeError):
            return "closed"
        except TimeoutError:
            pass
    return "waited" if case.may_wait else "hang"


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def api_versions_answered(port: int, timeout_s: float = 5.0) -> bool:
    """An ApiVersions v0 round trip on a new connection completes within ``timeout_s``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as connection:
            connection.sendall(struct.pack(">ihhih", 10, ApiKey.API_VERSIONS, 0, 1, -1))
            data = b""
            while len(data) < 4 or len(data) < 4 + _SIZE.unpack_from(data)[0]:
                chunk = connection.recv(1 << 16)
                if not chunk:
                    return False
                data += chunk
            return True
    except OSError:
        return False


def served(bootstrap: str, value: bytes) -> bool:
    """A confluent-kafka producer's record is read back by a consumer."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    delivered: list[Any] = []
    producer.produce(HEALTH_TOPIC, value=value, on_delivery=lambda error, message: delivered.append(message))
    if producer.flush(30) != 0 or not delivered or delivered[0].error() is not None:
        return False
    offset = delivered[0].offset()
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"health-{uuid.uuid4().hex[:6]}"})
    try:
        consumer.assign([TopicPartition(HEALTH_TOPIC, 0, offset)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                return message.value() == value
        return False
    finally:
        consumer.close()


@dataclass
class Report:
    seed: int
    cases: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    findings: list[str] = field(default_factory=list)
    rss_before: int = 0
    rss_after: int = 0
    seconds: float = 0.0

    @property
    def rss_growth_mib(self) -> float:
        return (self.rss_after - self.rss_before) / 2**20

    def summary(self) -> str:
        outcomes = ", ".join(f"{count} {outcome}" for outcome, count in sorted(self.outcomes.items()))
        return (
            f"seed {self.seed}: {self.cases} cases in {self.seconds:.1f} s ({outcomes}); broker RSS "
            f"{self.rss_before / 2**20:.0f} -> {self.rss_after / 2**20:.0f} MiB; "
            f"{len(self.findings)} finding(s)"
        )


def broker_errors(log_path: Path) -> list[str]:
    """Requests the broker failed to handle (its catch-all logs them with a traceback)."""
    if not log_path.exists():
        return []
    lines = log_path.read_text(errors="replace").splitlines()
    found = []
    for number, line in enumerate(lines):
        if "unexpected error serving" in line or "Traceback" in line:
            found.append("\n".join(lines[number : number + 40]))
    return found


def fuzz(
    broker: BrokerProcess,
    corpus: list[bytes],
    *,
    seed: int,
    cases: int | None = None,
    seconds: float | None = None,
    workers: int = 8,
    case_timeout_s: float = 5.0,
    health_every: int = 500,
    keep_dir: Path | None = None,
) -> Report:
    """Send mutated cases to ``broker`` (already running, with :data:`FUZZ_TOPIC` and
    :data:`HEALTH_TOPIC`) until ``cases`` were sent or ``seconds`` passed, from ``workers`` threads."""
    assert broker.process is not None
    report = Report(seed)
    report.rss_before = rss_bytes(broker.process.pid)
    began = time.monotonic()
    numbers = iter(range(cases if cases is not None else sys.maxsize))
    lock = threading.Lock()
    stop = threading.Event()

    def next_number() -> int | None:
        with lock:
            if stop.is_set() or (seconds is not None and time.monotonic() - began > seconds):
                return None
            return next(numbers, None)

    def record(case: Case, outcome: str) -> None:
        with lock:
            report.cases += 1
            report.outcomes[outcome] = report.outcomes.get(outcome, 0) + 1
            if outcome == "hang":
                report.findings.append(f"case {seed}:{case.number}: no answer and not closed")
                if keep_dir is not None:
                    (keep_dir / f"hang-{seed}-{case.number}.bin").write_bytes(b"".join(case.frames))

    def work() -> None:
        while (number := next_number()) is not None:
            case = make_case(seed, number, corpus)
            record(case, send_case(broker.port, case, case_timeout_s))
            if number % health_every == health_every - 1 and not _alive(broker, report, number):
                stop.set()

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for future in [pool.submit(work) for _ in range(workers)]:
            future.result()
    report.seconds = time.monotonic() - began
    if _alive(broker, report, report.cases) and not served(broker.bootstrap_servers, b"after %d" % seed):
        report.findings.append("a confluent-kafka client was not served after the run")
    report.rss_after = rss_bytes(broker.process.pid) if broker.process is not None else 0
    report.findings += [f"broker error: {error}" for error in broker_errors(broker.log_path)]
    return report


def _alive(broker: BrokerProcess, report: Report, number: int) -> bool:
    assert broker.process is not None
    if broker.process.poll() is not None:
        report.findings.append(f"the broker exited ({broker.process.returncode}) by case {number}")
        return False
    if not api_versions_answered(broker.port):
        report.findings.append(f"the broker did not answer ApiVersions on a new connection by case {number}")
        return False
    return True


@contextlib.contextmanager
def fuzz_target(data_dir: Path, extra_args: list[str] | None = None) -> Iterator[BrokerProcess]:
    """A broker process to fuzz, with the corpus' topic and the health check's; auto-creation off,
    so mutated names do not become topics."""
    from confluent_kafka.admin import AdminClient, NewTopic

    args = ["--group-initial-rebalance-delay-ms", "0", "--no-auto-create-topics", *(extra_args or [])]
    with BrokerProcess(data_dir, extra_args=args) as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        for created in admin.create_topics(
            [NewTopic(FUZZ_TOPIC, 2, 1), NewTopic(HEALTH_TOPIC, 1, 1)]
        ).values():
            created.result(30)
        yield broker


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.fuzz",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--seconds", type=float, default=600, help="how long to fuzz (default 600)")
    add("--cases", type=int, help="stop after this many cases instead")
    add("--seed", type=int, default=1, help="random seed (default 1)")
    add("--workers", type=int, default=8, help="connections at once (default 8)")
    add("--case-timeout", type=float, default=5.0, help="seconds a case may take (default 5)")
    add("--max-rss-growth-mib", type=float, default=200, help="allowed broker RSS growth (default 200)")
    add("--keep-dir", type=Path, help="keep the broker's data, log and the frames of findings here")
    args = parser.parse_args(argv)
    print("capturing the corpus from confluent-kafka clients ...", file=sys.stderr, flush=True)
    corpus = capture_corpus()
    print(f"{len(corpus)} distinct request frames", file=sys.stderr, flush=True)
    with contextlib.ExitStack() as stack:
        directory = args.keep_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fuzz-")))
        directory.mkdir(parents=True, exist_ok=True)
        broker = stack.enter_context(fuzz_target(directory / "data"))
        report = fuzz(
            broker,
            corpus,
            seed=args.seed,
            cases=args.cases,
            seconds=None if args.cases else args.seconds,
            workers=args.workers,
            case_timeout_s=args.case_timeout,
            keep_dir=directory,
        )
        if report.rss_growth_mib > args.max_rss_growth_mib:
            report.findings.append(f"broker RSS grew by {report.rss_growth_mib:.0f} MiB")
        print(report.summary())
        for finding in report.findings:
            print(f"FINDING {finding}")
        if args.keep_dir:
            print(f"broker log: {broker.log_path}")
    return 1 if report.findings else 0


if __name__ == "__main__":
    sys.exit(main())
