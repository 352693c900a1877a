"""How the operator's Kubernetes API calls travel: bounded, retried, off the event loop.

The official client is synchronous; every call runs in a thread of the transport's own pool
(:data:`API_THREADS`) with a request timeout (:data:`REQUEST_TIMEOUT_S`) and is tried again
after a pause (:data:`BACKOFF`) when the cause is transient (a connection error, or an answer
``kube_errors`` takes for :attr:`~ApiOutcome.RETRY` or :attr:`~ApiOutcome.CONFLICT`), so a
handler never waits kopf's default 60 s for a hiccup. :meth:`KubeTransport.upsert` is the one
way an object is created or updated.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

import kubernetes
import urllib3
from kubernetes.client.exceptions import ApiException

from elasticjob.backoff import Backoff
from elasticjob.operator.kube_errors import ApiOutcome, api_outcome

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

REQUEST_TIMEOUT_S: Final = 10.0
API_THREADS: Final = 32
"""Calls in flight at once (threads, and connections to the API server). A call holds its
thread for its whole round trip: with asyncio's default pool (as many threads as cores + 4)
a few hundred jobs' calls queued behind each other for seconds on a loaded API server."""
ATTEMPTS: Final = 5
"""Tries of one call, the first included."""
BACKOFF: Final = Backoff(initial_s=0.2, factor=2.0, max_s=5.0)
"""The pauses between the tries of one call."""

_RETRIED: Final = frozenset({ApiOutcome.RETRY, ApiOutcome.CONFLICT})
_UPSERT_STEPS: Final = 3
"""Creates and updates one upsert makes at most (the object deleted and made again by
someone else in between each)."""


def json_of(response: Any) -> dict[str, Any]:
    """The JSON object of a raw answer (a call made with ``_preload_content=False``).

    The operator's calls for each job (its pods listed, created, read and deleted, its
    events) skip the client's models: decoding a 200-pod list into them costs about 157 ms
    of CPU and turning them back into dicts about 149 ms, against 15 ms for ``json.loads``
    (``bench/kube_decode.py``); the answer is the same JSON a watch event carries (timestamps
    as the API server writes them)."""
    try:
        document: dict[str, Any] = json.loads(response.data)
    finally:
        response.release_conn()
    return document


def load_config() -> None:
    """In-cluster config when running in a pod, else the local kubeconfig."""
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()


class KubeTransport:
    """The API client, its thread pool, and the retries of every call made through it."""

    def __init__(
        self, attempts: int = ATTEMPTS, threads: int = API_THREADS, *, http_retries: bool = True
    ) -> None:
        configuration = kubernetes.client.Configuration.get_default_copy()
        configuration.connection_pool_maxsize = threads
        if not http_retries:  # urllib3's own retries (3 by default) off: one request a try
            configuration.retries = False
        self.client = kubernetes.client.ApiClient(configuration)
        self._threads = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="kube")
        self._attempts = attempts

    async def call(self, what: str, call: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """``call(*args, **kwargs)`` in the pool with the request timeout, tried again after
        transient failures; the last failure is raised (``what`` names the call in logs)."""
        pauses = BACKOFF.delays()
        for attempt in range(1, self._attempts + 1):
            try:
                return await asyncio.get_running_loop().run_in_executor(
                    self._threads,
                    functools.partial(
                        _connection_errors_as_os_errors,
                        call,
                        *args,
                        _request_timeout=REQUEST_TIMEOUT_S,
                        **kwargs,
                    ),
                )
            except ApiException as exc:
                if api_outcome(exc) not in _RETRIED or attempt == self._attempts:
                    raise
                logger.warning("%s: %s %s; retrying", what, exc.status, exc.reason)
            except OSError as exc:  # connection refused/reset, timeouts
                if attempt == self._attempts:
                    raise
                logger.warning("%s: %s; retrying", what, exc)
            await asyncio.sleep(next(pauses))
        raise AssertionError("unreachable")

    async def call_json(
        self, what: str, call: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> dict[str, Any]:
        """:meth:`call` for the API server's JSON, decoded in the call's thread without the
        client's models (see :func:`json_of`)."""

        def raw(*args: Any, **kwargs: Any) -> dict[str, Any]:
            return json_of(call(*args, _preload_content=False, **kwargs))

        return await self.call(what, raw, *args, **kwargs)

    async def call_once(
        self, what: str, call: Callable[..., Any], *args: Any, timeout_s: float, **kwargs: Any
    ) -> dict[str, Any]:
        """One try of ``call`` (its JSON, as :meth:`call_json`) within ``timeout_s``, the wait
        for a thread of the pool included (:class:`TimeoutError` past it): for a write by
        resourceVersion, whose conflict means someone else wrote first and must not be tried
        again as it was, and for a caller that tries again on its own schedule (``what`` names
        the call in logs)."""

        def raw() -> dict[str, Any]:
            return json_of(
                call(*args, _preload_content=False, _request_timeout=timeout_s, **kwargs)
            )

        logger.debug("%s", what)
        async with asyncio.timeout(timeout_s):
            return await asyncio.get_running_loop().run_in_executor(
                self._threads, _connection_errors_as_os_errors, raw
            )

    async def request(
        self,
        what: str,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        """``method path`` as JSON, for APIs the client has no models of (an answer of 400
        or more raises :class:`ApiException`)."""
        client = self.client
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        method, url, headers, serialized, post = client.param_serialize(
            method, path, header_params=headers, body=body, auth_settings=["BearerToken"]
        )
        response = await self.call(
            what,
            client.call_api,
            method,
            url,
            header_params=headers,
            body=serialized,
            post_params=post,
        )
        data = response.read()
        if not 200 <= response.status < 300:
            raise ApiException(status=response.status, reason=response.reason, http_resp=response)
        document: dict[str, Any] = json.loads(data) if data else {}
        return document


def _connection_errors_as_os_errors(call: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """``call(*args, **kwargs)``, raising :class:`ConnectionError` (an :class:`OSError`) for
    the client's connection failures that are no :class:`OSError` (urllib3's, such as its
    retries running out or a read timing out), so that every caller treats them as the
    transient failures they are."""
    try:
        return call(*args, **kwargs)
    except urllib3.exceptions.HTTPError as exc:
        raise ConnectionError(str(exc)) from exc


async def upsert(
    create: Callable[[], Awaitable[_T]],
    update: Callable[[], Awaitable[_T]] | None,
    *,
    update_first: bool = False,
) -> _T | None:
    """Create an object or, when its name is taken (:attr:`~ApiOutcome.ALREADY_EXISTS`),
    update it; what the call that succeeded answered. ``update`` None keeps an existing
    object as it is (and answers None). ``update_first``: for an object that mostly exists
    (one call then); an update of one that does not (:attr:`~ApiOutcome.NOT_FOUND`) creates
    it. A conflicting update is tried again by the call itself (:meth:`KubeTransport.call`);
    any other error is raised."""
    step = update if update_first and update is not None else create
    for _ in range(_UPSERT_STEPS - 1):
        try:
            return await step()
        except ApiException as exc:
            outcome = api_outcome(exc)
            if step is create and outcome is ApiOutcome.ALREADY_EXISTS:
                if update is None:
                    return None
                step = update
            elif step is update and outcome is ApiOutcome.NOT_FOUND:
                step = create
            else:
                raise
    return await step()
