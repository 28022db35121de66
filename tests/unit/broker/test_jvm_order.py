"""The JVM hash-set orders behind the topic order of some of Kafka's answers; the expected orders are
Apache Kafka 4.4.0's own answers to Metadata requests."""

from __future__ import annotations

from sparkafka.broker.jvm_order import (
    java_copied_hash_set_capacity,
    java_hash_set,
    java_string_hash,
    scala_mutable_hash_set,
    scala_set,
)

NAMES = ["zz-exp", "zz_exp", "__consumer_offsets", "__transaction_state", "__share_group_state"]


def test_java_string_hash_is_string_hash_code() -> None:
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("") == 0
    assert java_string_hash("polygenelubricants") == 2**31  # Integer.MIN_VALUE, unsigned
    assert java_string_hash("\U0001f600") == (0xD83D * 31 + 0xDE00)  # UTF-16 code units


def test_scala_set_keeps_up_to_four_in_order_then_orders_by_hash() -> None:
    assert scala_set(["d", "b", "c", "b", "a"]) == ["d", "b", "c", "a"]
    # Kafka 4.4 listed these existing topics so, when asked for the five names.
    assert scala_set(NAMES) == [
        "__transaction_state",
        "zz-exp",
        "__share_group_state",
        "__consumer_offsets",
        "zz_exp",
    ]
    assert scala_set(list("hgfedcba")) == ["e", "f", "a", "b", "g", "d", "c", "h"]


def test_java_hash_set_orders_by_bucket_then_as_added() -> None:
    # Kafka 4.4 listed these missing topics so.
    copied = java_hash_set(scala_set(NAMES), capacity=java_copied_hash_set_capacity(5))
    assert copied == ["__share_group_state", "__transaction_state", "zz-exp", "zz_exp", "__consumer_offsets"]
    assert java_hash_set(["bad/name", "t-65afe60841"]) == ["t-65afe60841", "bad/name"]
    assert java_hash_set(["b", "a", "b"]) == ["a", "b"]
    # "Aa" and "BB" share a hash code: the order added decides.
    assert java_hash_set(["BB", "Aa"]) == ["BB", "Aa"] and java_hash_set(["Aa", "BB"]) == ["Aa", "BB"]


def test_java_hash_set_capacity_grows_as_java_grows_it() -> None:
    assert [java_copied_hash_set_capacity(n) for n in (0, 11, 12, 13, 24, 25)] == [16, 16, 32, 32, 64, 64]
    # 13 names added one by one outgrow 16 buckets: bucket 16 + i is no longer bucket i.
    names = [chr(ord("a") + i) for i in range(13)] + ["q"]
    assert java_hash_set(names)[-1] == "q"


def test_scala_mutable_hash_set_sorts_a_bucket_by_hash_and_grows_before_three_quarters() -> None:
    assert scala_mutable_hash_set(["b", "a", "b"]) == ["a", "b"]
    # 97 + 16 = "q": the same bucket as "a" in 16 buckets, its own in 32.
    eleven = [chr(ord("a") + i) for i in range(10)] + ["q"]
    assert scala_mutable_hash_set(eleven)[:2] == ["a", "q"]  # 16 buckets: "a" (97) then "q" (113)
    twelve = [*eleven, "z"]
    assert scala_mutable_hash_set(twelve)[-2:] == ["q", "z"]  # 12 elements: 32 buckets
