"""The iteration orders of the JVM hash sets from which Kafka builds some answers, so that this broker
lists topics in those answers in Kafka's order: ``java.util.HashSet`` (buckets of String.hashCode),
Scala's immutable ``Set`` (insertion order up to four elements, then its hash trie's order) and
Scala's ``mutable.HashSet`` (buckets, then hash).

Kafka's order comes from these sets alone, not from the request: Metadata lists the topics it has in
the order of the Scala set of the names asked for, then the missing ones in a java.util.HashSet's,
and every topic in a mutable.HashSet's; CreateTopics and CreatePartitions answer names given twice
from a java.util.HashSet."""

from __future__ import annotations

from collections.abc import Iterable

_MASK32 = 0xFFFFFFFF
# java.util.HashMap: initial table size and load factor.
_JAVA_INITIAL_CAPACITY = 16
_JAVA_LOAD_FACTOR = 0.75


def java_string_hash(text: str) -> int:
    """Java's String.hashCode over UTF-16 code units, as an unsigned 32-bit number."""
    encoded = text.encode("utf-16-be", "surrogatepass")
    result = 0
    for i in range(0, len(encoded), 2):
        result = (31 * result + (encoded[i] << 8 | encoded[i + 1])) & _MASK32
    return result


def _table_size_for(wanted: int) -> int:
    size = 1
    while size < wanted:
        size <<= 1
    return size


def java_copied_hash_set_capacity(size: int) -> int:
    """The table size of ``new HashSet<>(collection)`` for a collection of ``size`` elements (JDK 17:
    ``max((int) (size / .75f) + 1, 16)``, rounded up to a power of two)."""
    return _table_size_for(max(int(size / _JAVA_LOAD_FACTOR) + 1, _JAVA_INITIAL_CAPACITY))


def java_hash_set(names: Iterable[str], *, capacity: int | None = None) -> list[str]:
    """The iteration order of a java.util.HashSet to which ``names`` were added in this order (repeats
    are no-ops): by bucket of the spread hash, then in the order added. The table size is the one
    add() grows it to, or ``capacity`` when the set was built at that size (a copy: see
    :func:`java_copied_hash_set_capacity`) and never outgrew it."""
    distinct = list(dict.fromkeys(names))
    table = capacity or _JAVA_INITIAL_CAPACITY
    while len(distinct) > table * _JAVA_LOAD_FACTOR:
        table <<= 1

    def bucket(name: str) -> int:
        hash_code = java_string_hash(name)
        return (hash_code ^ (hash_code >> 16)) & (table - 1)

    return sorted(distinct, key=bucket)  # stable: the order added within a bucket


def scala_mutable_hash_set(names: Iterable[str]) -> list[str]:
    """The iteration order of a Scala mutable.HashSet to which ``names`` were added: by bucket of the
    spread hash (as java.util.HashMap's), then by that hash as a signed int within a bucket, which
    the set keeps sorted. The table starts at 16 and doubles before an element reaches 3/4 of it."""
    distinct = list(dict.fromkeys(names))
    table = _JAVA_INITIAL_CAPACITY
    while len(distinct) >= table * _JAVA_LOAD_FACTOR:
        table <<= 1

    def position(name: str) -> tuple[int, int]:
        hash_code = java_string_hash(name)
        spread = hash_code ^ (hash_code >> 16)
        return spread & (table - 1), spread - (1 << 32) if spread & 0x80000000 else spread

    return sorted(distinct, key=position)


def _scala_improve(hash_code: int) -> int:
    """scala.collection.Hashing.improve, on unsigned 32-bit numbers."""
    h = (hash_code + (~(hash_code << 9) & _MASK32)) & _MASK32
    h ^= h >> 14
    h = (h + (h << 4)) & _MASK32
    return h ^ (h >> 10)


def _champ_order(names: list[str], shift: int) -> list[str]:
    """A CHAMP trie node's iteration order (immutable.HashSet): the elements alone in their 5-bit
    slice of the hash first, by slice; then each slice shared by several, as a sub-node, by slice."""
    slices: dict[int, list[str]] = {}
    for name in names:
        slices.setdefault((_scala_improve(java_string_hash(name)) >> shift) & 31, []).append(name)
    ordered = [group[0] for _, group in sorted(slices.items()) if len(group) == 1]
    for _, group in sorted(slices.items()):
        if len(group) > 1:
            # Past the hash's 32 bits, colliding elements stay in the order added.
            ordered += _champ_order(group, shift + 5) if shift + 5 < 32 else group
    return ordered


def scala_set(names: Iterable[str]) -> list[str]:
    """The iteration order of Scala's immutable Set built from ``names`` in this order (``toSet``):
    Set1 to Set4 keep the order added; from five elements on it is a HashSet, ordered by hash."""
    distinct = list(dict.fromkeys(names))
    return distinct if len(distinct) <= 4 else _champ_order(distinct, 0)
