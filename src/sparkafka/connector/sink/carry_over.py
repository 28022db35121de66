"""Moving a query's commit markers to another commit-marker topic (option
``previousCommitMarkerTopic``): what the old topic holds of the query is carried over, newest wins."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping

from sparkafka.connector.sink.claims import belongs_to, holds_query
from sparkafka.connector.sink.commit_log import (
    CommitMarker,
    ProgressRecord,
    RefusalRecord,
    marker_layout,
    marker_of_query,
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
    is_marker_key,
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
    _refuse_overwriting_another_query(options, query_id, of_query, here)
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


def _refuse_overwriting_another_query(
    options: SinkOptions, query_id: str, carried: Mapping[str, bytes], here: Mapping[str, bytes]
) -> None:
    """Refuse, before anything is copied, where the new topic holds another query's commit marker or
    registration under a key to be carried over: that query writes with the same transactional ids
    there, and a marker of this query laid over its marker would let its replay write a batch again
    (batch numbers of two queries say nothing about which record is newer). So too a record under a
    marker key that names no query: it would stay, and hide the query's marker."""
    for key in sorted(carried):
        existing = here.get(key)
        if not existing:  # none, or a tombstone (read as an empty value)
            continue
        owner = _named_query(existing)
        if key.startswith(REGISTRATION_KEY_PREFIX):
            # One naming no query counts as none: the id is registered again.
            if owner in (None, query_id):
                continue
        elif not is_marker_key(key) or marker_of_query(key, existing, query_id) is not None:
            continue
        elif owner is None:
            # Kept (it cannot be dated), it would hide the query's marker from every task there.
            raise CommitMarkerError(
                f"option {PREVIOUS_MARKER_TOPIC_OPTION}='{options.previous_marker_topic}': the commit-marker "
                f"topic '{options.marker_topic}' holds a record under '{key}' that names no query (damaged, "
                f"or written by hand), where query {query_id}'s marker is to go; left there, it would hide "
                "that marker from the query's tasks, and a replay could write the id's last batch again. "
                f"Nothing was copied. Way on, at no cost: write a tombstone for key '{key}' into "
                f"'{options.marker_topic}' and restart (the marker is then carried over), or go on with "
                "the markers where they are, .option('commitMarkerTopic', "
                f"'{options.previous_marker_topic}') without {PREVIOUS_MARKER_TOPIC_OPTION}"
            )
        raise CommitMarkerError(
            f"option {PREVIOUS_MARKER_TOPIC_OPTION}='{options.previous_marker_topic}': the commit-marker "
            f"topic '{options.marker_topic}' holds query {owner}'s record under '{key}', a transactional "
            f"id query {query_id} writes under too; carrying this query's markers over would overwrite "
            "it, and that query could then write a batch twice. Nothing was copied. Way on, at no "
            f"cost: go on with the markers where they are, .option('commitMarkerTopic', "
            f"'{options.previous_marker_topic}') without {PREVIOUS_MARKER_TOPIC_OPTION}; or move them "
            "to a topic where no other query writes under these ids"
        )


def _named_query(value: bytes) -> str | None:
    """The query a record of the marker topic names, as far as its JSON says."""
    try:
        data = json.loads(value)
    except ValueError:
        return None
    named = data.get("query_id") if isinstance(data, dict) else None
    return str(named) if named else None


def _newer(key: str, value: bytes, existing: bytes | None) -> bool:
    """Whether ``value`` should replace ``existing`` under ``key`` when carrying markers over (a
    tombstone, read as an empty value, is no record)."""
    if not existing:
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
