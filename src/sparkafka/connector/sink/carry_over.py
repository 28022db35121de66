"""Moving a query's commit markers to another commit-marker topic (option
``previousCommitMarkerTopic``): what the old topic holds of the query is carried over, newest wins."""

from __future__ import annotations

import dataclasses
import logging

from sparkafka.connector.sink.claims import belongs_to, holds_query
from sparkafka.connector.sink.commit_log import (
    CommitMarker,
    ProgressRecord,
    RefusalRecord,
    marker_layout,
    produce_to_markers,
    read_query_markers,
)
from sparkafka.connector.sink.options import (
    CLAIM_KEY_PREFIX,
    PREVIOUS_MARKER_TOPIC_OPTION,
    PROGRESS_KEY_PREFIX,
    QUERY_KEY_PREFIX,
    REFUSAL_KEY_PREFIX,
    REGISTRATION_KEY_PREFIX,
    SinkOptions,
)
from sparkafka.errors import CommitMarkerError

log = logging.getLogger(__name__)


def carry_markers_over(options: SinkOptions, query_id: str, prefix: str) -> int:
    """Copy what the marker topic ``options.previous_marker_topic`` holds of ``query_id`` under
    ``prefix`` — the claim, the registrations of the prefix's ids, the query's commit markers (under
    any prefix it claimed), the prefix's progress, the query's records of its claims — into
    ``options.marker_topic``, each into its partition there, and each unless the new topic's record of
    the same key is as new (a later batch, or any claim or registration). Runs on the driver before
    the micro-batch's tasks, which then read the markers where they are now. Returns the records
    copied.

    Invariant: nothing newer of the query is ever overwritten in the new topic, and afterwards it
    holds, for every key, the newest of the two topics' records: going back to a topic used before
    (whose records are older) takes the newer ones along."""
    previous = options.previous_marker_topic
    assert previous is not None
    layout = marker_layout(options)
    here = read_query_markers(options, layout, prefix, query_id)
    old_topic = dataclasses.replace(options, marker_topic=previous)
    found = read_query_markers(old_topic, marker_layout(old_topic), prefix, query_id)
    of_query = {key: value for key, value in found.items() if belongs_to(key, value, query_id, prefix)}
    if not of_query and not holds_query(here, query_id, prefix):
        raise CommitMarkerError(
            f"option {PREVIOUS_MARKER_TOPIC_OPTION}='{previous}' names a topic that holds nothing of query "
            f"{query_id} under transactional-id prefix '{prefix}' either: name the topic that holds its "
            "markers, or remove the option"
        )
    copied = {key: value for key, value in of_query.items() if _newer(key, value, here.get(key))}
    if not copied:
        return 0
    what = f"{len(copied)} record(s) carried over"
    produce_to_markers(options, options.marker_topic, copied, what, layout)
    log.warning(
        "%s: carried %d commit-marker record(s) over from %s to %s (option %s; remove it now)",
        query_id,
        len(copied),
        previous,
        options.marker_topic,
        PREVIOUS_MARKER_TOPIC_OPTION,
    )
    return len(copied)


def _newer(key: str, value: bytes, existing: bytes | None) -> bool:
    """Whether ``value`` should replace ``existing`` under ``key`` when carrying markers over."""
    if existing is None:
        return True
    if key.startswith((REGISTRATION_KEY_PREFIX, CLAIM_KEY_PREFIX, QUERY_KEY_PREFIX)):
        return False
    try:
        if key.startswith(PROGRESS_KEY_PREFIX):
            return ProgressRecord.decode(value).batch_id > ProgressRecord.decode(existing).batch_id
        if key.startswith(REFUSAL_KEY_PREFIX):
            new, old = RefusalRecord.decode(value), RefusalRecord.decode(existing)
            return (new.batch_id, new.time_ms) > (old.batch_id, old.time_ms)
        return CommitMarker.decode(value).batch_id > CommitMarker.decode(existing).batch_id
    except (ValueError, KeyError):
        return False
