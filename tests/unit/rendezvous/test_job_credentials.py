"""A job's credentials: a worker's speaks for its own host only, the reader token for none,
and nothing else is one (the key itself, another job's, a MAC moved to another name)."""

from __future__ import annotations

import pytest

from elasticjob.rendezvous.job_credentials import JobKey, Speaker

KEY = JobKey("the-key")
POD_A = KEY.worker_credential("train-worker-b2c4d")
POD_B = KEY.worker_credential("train-worker-f5g6h")
MAC_A = POD_A.rpartition(".")[2]


@pytest.mark.parametrize(
    ("bearer", "speaker"),
    [
        pytest.param(POD_A, Speaker("train-worker-b2c4d"), id="a-pod-speaks-for-itself"),
        pytest.param(KEY.worker_credential("10.0.0.7"), Speaker("10.0.0.7"), id="a-host-with-dots"),
        pytest.param(KEY.reader_token(), Speaker(None), id="the-reader-token-for-nobody"),
        pytest.param("the-key", None, id="the-key-itself"),
        pytest.param(
            JobKey("other").worker_credential("train-worker-b2c4d"), None, id="another-key"
        ),
        pytest.param(JobKey("other").reader_token(), None, id="another-jobs-reader"),
        pytest.param(f"train-worker-f5g6h.{MAC_A}", None, id="a-mac-under-another-name"),
        pytest.param(POD_A[:-1] + ("0" if POD_A[-1] != "0" else "1"), None, id="a-mac-changed"),
        pytest.param(f".{MAC_A}", None, id="no-hostname"),
        pytest.param("train-worker-b2c4d.", None, id="no-mac"),
        pytest.param(f"bad host.{MAC_A}", None, id="not-a-hostname"),
        pytest.param("tök.ab", None, id="not-ascii"),
        pytest.param("", None, id="empty"),
    ],
)
def test_who_a_bearer_speaks_for(bearer: str, speaker: Speaker | None) -> None:
    assert KEY.speaker(bearer) == speaker


@pytest.mark.parametrize(
    ("speaker", "hostname", "speaks"),
    [
        (Speaker("train-worker-b2c4d"), "train-worker-b2c4d", True),
        (Speaker("train-worker-b2c4d"), "train-worker-f5g6h", False),
        (Speaker("train-worker-b2c4d"), "train-worker-b2c4", False),
        (Speaker(None), "train-worker-b2c4d", False),
    ],
)
def test_a_credential_speaks_for_its_own_host_only(
    speaker: Speaker, hostname: str, speaks: bool
) -> None:
    assert speaker.speaks_for(hostname) is speaks


def test_credentials_are_distinct_and_name_their_speaker() -> None:
    assert len({POD_A, POD_B, KEY.reader_token()}) == 3
    assert str(KEY.speaker(POD_B)) == "train-worker-f5g6h's credential"
    assert str(Speaker(None)) == "the job's reader token"
    assert "the-key" not in repr(KEY)


@pytest.mark.parametrize("key", ["", "has space", "tök", "tab\t"])
def test_a_key_must_be_printable_ascii_without_spaces(key: str) -> None:
    with pytest.raises(ValueError, match="job key"):
        JobKey(key)
