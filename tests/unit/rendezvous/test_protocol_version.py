"""The protocol check of every job-scoped request: the service accepts exactly its own version;
another version, or none, is refused with 426 naming both, and a header that is not a version
number with 400."""

from __future__ import annotations

import pytest

from elasticjob.rendezvous.routes import protocol_refusal
from elasticjob.wire.protocol import PROTOCOL_HEADER, PROTOCOL_VERSION

SERVICE = f"this service speaks {PROTOCOL_VERSION}:"


@pytest.mark.parametrize(
    ("sent", "status", "words"),
    [
        (str(PROTOCOL_VERSION), None, ()),
        (None, 426, (f"no {PROTOCOL_HEADER} header", SERVICE)),
        ("0", 426, ("speaks rendezvous protocol 0,", SERVICE)),
        (str(PROTOCOL_VERSION + 1), 426, (f"protocol {PROTOCOL_VERSION + 1},", SERVICE)),
        (f"00{PROTOCOL_VERSION}", None, ()),
        ("abc", 400, ("must be a protocol version number",)),
        ("-1", 400, ("must be a protocol version number",)),
        ("", 400, ("must be a protocol version number",)),
        ("9" * 7, 400, ("must be a protocol version number",)),
        ("\u0661", 400, ("must be a protocol version number",)),
    ],
    ids=[
        "own",
        "none",
        "older",
        "newer",
        "own-zero-padded",
        "not-a-number",
        "negative",
        "empty",
        "too-long",
        "non-ascii-digit",
    ],
)
def test_only_the_services_own_version_is_accepted(
    sent: str | None, status: int | None, words: tuple[str, ...]
) -> None:
    refusal = protocol_refusal(sent)
    if status is None:
        assert refusal is None
        return
    assert refusal is not None
    assert refusal.status == status
    assert all(word in refusal.error for word in words), refusal.error
