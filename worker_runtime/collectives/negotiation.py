"""Horovod's matching of collectives by name: every rank's call of a collective is agreed on
before any data moves.

Each collective has a name: the one the script gives (``name=``), or ``<kind>.noname.<n>``
for its n-th unnamed call of that kind in the round. A rank's call is submitted at once and
never blocks: its :class:`~elasticjob.worker_runtime.collectives.call_descriptions.Call` goes to the
round's store; the rank whose call completes the set (every member has called that name)
checks the calls against each other and appends a verdict to the round's sequence of agreed
collectives. A thread of each rank carries the sequence out in order on the round's
*negotiated group* (beside the round's own, which the runtime's internal collectives and
``DistributedOptimizer``'s reducer use in program order). A verdict of mismatch fails the
collective on every rank with :class:`CollectiveMismatchError` and moves no data, so the
group stays usable.

Ranks may therefore issue collectives in different orders: a call waits for its partners
(Horovod's ``allreduce_async(name=x)`` on one rank, then a barrier, then the others' calls of
``x``). A name may have one call outstanding per rank: a second is refused with ValueError,
as in Horovod. Every store key of the negotiation lives under the round's fresh prefix, and
the thread ends with the round.

A named collective called as last time (the same operation, dtypes, shapes...) is counted
without sending the call, and when every rank did so the verdict needs no call read (as
Horovod's response cache spares repeated tensors their full negotiation). Each round's keys
are removed once their collective is agreed (by the thread, while the data moves), so a long
round does not grow the store.

Horovod's ``join`` (:meth:`Negotiation.join`) is in the same sequence: see ``join_phase.py``.
"""

from __future__ import annotations

import collections
import datetime
import json
import queue
import threading
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.distributed import Store

from elasticjob.worker_runtime.collectives import lingering
from elasticjob.worker_runtime.collectives.call_descriptions import Call
from elasticjob.worker_runtime.collectives.join_phase import JoinPhase, serve
from elasticjob.worker_runtime.collectives.negotiated_calls import (
    JoinWork,
    NegotiatedCall,
    Start,
    disagreement,
    settle,
)
from elasticjob.worker_runtime.diagnostics.log import get_logger

logger = get_logger(__name__)

WAKE_S = 3600.0
"""How long the thread waits for the next verdict before it waits again (it is woken when
its round is closed; a store's wait that times out logs a warning, so it is rare)."""
_FRESH = 1 << 20
"""What a rank adds to a call's count when it sends its call in full: a named collective
called as last time is counted with 1 alone, and when every rank did so the verdict is made
without reading any call (Horovod's response cache does the same for repeated tensors)."""
_STOP = "stop"


class Negotiation:
    """The negotiation of one round's collectives (see the module's docstring)."""

    def __init__(
        self,
        store: Store | None,
        rank: int,
        size: int,
        group: dist.ProcessGroup,
        device: torch.device | None = None,
    ):
        self._rank, self._size, self._device = rank, size, device
        self._group: dist.ProcessGroup | None = group
        """Dropped at :meth:`close`: the last reference to a broken group must be its
        teardown thread's (see ``process_group.py``)."""
        self._origin = store
        self._store = None if store is None else _client(store)
        """The publishing thread's client (each thread has its own: a client serves one
        request at a time, and the following thread blocks in a wait)."""
        self._lock = threading.Lock()
        self._outstanding: dict[str, NegotiatedCall] = {}
        self._by_key: dict[str, NegotiatedCall] = {}
        self._occurrences: collections.Counter[str] = collections.Counter()
        self._agreed: dict[str, list[Call | None]] = {}
        self._submitted: queue.SimpleQueue[NegotiatedCall | str | None] = queue.SimpleQueue()
        self._spent: list[str] = []
        """Store keys of collectives agreed on, which this rank's thread removes."""
        self._unnamed: collections.Counter[str] = collections.Counter()
        self._closed = threading.Event()
        self._sequence = 1
        self._threads: tuple[threading.Thread, ...] = ()
        """The following thread and the publishing thread, once the first call came."""
        self._joins = JoinPhase(size)

    @property
    def group(self) -> dist.ProcessGroup:
        """The group the agreed collectives run on, until :meth:`close`."""
        group = self._group
        if group is None:
            raise RuntimeError("the negotiation's round has ended")
        return group

    def submit(self, name: str | None, call: Call, start: Start) -> NegotiatedCall:
        """Submit this rank's ``call`` of the collective ``name`` (None: the next unnamed one
        of its kind); ``start`` issues it once every rank's call agrees."""
        with self._lock:
            self._joins.refuse_calls()
            named = name is not None
            if name is None:
                self._unnamed[call.kind] += 1
                name = f"{call.kind}.noname.{self._unnamed[call.kind]}"
            if name in self._outstanding:
                raise ValueError(
                    f"a collective named {name!r} is already in progress on this rank: give "
                    f"this one another name, or wait for that one first"
                )
            occurrence = self._occurrences[name]
            self._occurrences[name] += 1
            submitted = NegotiatedCall(name, f"{name}#{occurrence}", call, start, named)
            # A name's previous call was carried out on every rank that calls it again (one
            # call of a name is outstanding at most), so every rank holds the same entry.
            submitted.previous = self._agreed.get(name) if named else None
            self._outstanding[name] = submitted
            self._by_key[submitted.key] = submitted
        if self._size == 1 or self._store is None:
            self._carry_out(submitted, [call])
            return submitted
        self._start_threads()
        self._submitted.put(submitted)
        return submitted

    def join(self) -> JoinWork:
        """Join (Horovod's ``join``): this rank is out of data. Until every rank has joined
        it takes part in the others' allreduces with zeros; the work completes once the last
        rank joins (see the module's docstring). Its own collectives submitted before must
        be done (waited for)."""
        with self._lock:
            work = self._joins.begin(self._outstanding)
            if self._size == 1 or self._store is None:
                self._joins.saw(self._rank)
                return work
        self._start_threads()
        self._submitted.put(_JOIN)
        return work

    def _start_threads(self) -> None:
        with self._lock:
            if not self._threads:
                self._threads = (
                    threading.Thread(
                        target=self._follow, name="collective-negotiation", daemon=True
                    ),
                    threading.Thread(target=self._publishing, name="collective-calls", daemon=True),
                )
                for thread in self._threads:
                    thread.start()

    def close(self) -> None:
        """End the round's negotiation: its threads stop (pending calls are failed by their
        round's end, as every collective of a broken or replaced round is). The following
        thread is woken through the store from a thread of its own (a store that stops
        answering blocks that one only); :func:`settle` waits for them all."""
        self._closed.set()
        self._group = None
        if self._store is None or not self._threads:
            return
        self._submitted.put(None)
        waker = threading.Thread(target=self._wake, name="negotiation-wake", daemon=True)
        waker.start()
        lingering.track(*self._threads, waker)

    def _wake(self) -> None:
        assert self._origin is not None
        try:
            _client(self._origin).set(self._verdict_key(self._rank, self._sequence), _STOP)
        except (RuntimeError, dist.DistError) as exc:
            logger.debug("waking the negotiation thread: %s", exc)

    def _publishing(self) -> None:
        """Publish this rank's calls in the order they were submitted, on a thread of its
        own: a store that stops answering blocks this thread, never the caller, whose wait
        the round's abort ends. A call that cannot be published fails its collective."""
        while (submitted := self._submitted.get()) is not None:
            if isinstance(submitted, str):  # this rank's join
                try:
                    self._publish_join()
                except (RuntimeError, dist.DistError) as exc:
                    with self._lock:
                        self._joins.fail(exc)
                continue
            try:
                self._publish(submitted)
            except (RuntimeError, dist.DistError) as exc:
                if not submitted.future.done():
                    submitted.future.set_exception(exc)
            # Hold no call while waiting for the next: the last reference to a call (to its
            # works) must not go from this thread if it wakes as the interpreter exits
            # (freeing a work takes the GIL back, which then ends the thread mid-destructor).
            del submitted

    def _verdict_key(self, rank: int, sequence: int) -> str:
        return f"verdict/{rank}/{sequence}"

    def _publish(self, submitted: NegotiatedCall) -> None:
        """Tell the other ranks this rank's call: by a count alone when it is the call this
        rank made of the name last time (every rank then knows it), else in full. The rank
        that completes the count publishes the verdict and removes the call's keys."""
        store, key, previous = self._store, submitted.key, submitted.previous
        assert store is not None
        same = previous is not None and previous[self._rank] == submitted.call
        if same:
            arrived = store.add(f"arrived/{key}", 1)
        else:
            line = f"{self._rank} {submitted.call.encode()}\n"
            store.append(f"calls/{key}", line)  # type: ignore[attr-defined]
            arrived = store.add(f"arrived/{key}", 1 + _FRESH)
        with self._lock:  # after the count: see _joined_now
            joined = frozenset(self._joins.joined)
        self._complete_if_due(store, submitted, arrived, joined)

    def _complete_if_due(
        self, store: Store, submitted: NegotiatedCall, arrived: int, joined: frozenset[int]
    ) -> None:
        """Publish the verdict of ``submitted``'s collective if every rank but the joined
        ones has called it (``arrived``: its count), and remove its keys."""
        if arrived % _FRESH + len(joined) != self._size:
            return
        key = submitted.key
        if joined and not self._claimed(store, key):
            return
        calls: list[Call | None] = [None] * self._size
        if submitted.previous:
            calls = list(submitted.previous)
        if arrived // _FRESH:
            calls = self._gathered_calls(store, key, calls)
        for rank in joined:
            calls[rank] = None
        if any(call is None for rank, call in enumerate(calls) if rank not in joined):
            raise RuntimeError(f"negotiating {key}: ranks sent no call and none is known")
        sequence = store.add("sequence", 1)
        verdict = json.dumps(
            {
                "key": key,
                "named": submitted.named,
                "calls": [None if call is None else call.encode() for call in calls],
            }
        )
        keys = [self._verdict_key(rank, sequence) for rank in range(self._size)]
        store.multi_set(keys, [verdict] * self._size)  # type: ignore[attr-defined]
        with self._lock:
            self._spent.append(f"arrived/{key}")

    def _publish_join(self) -> None:
        """Tell every rank, in the sequence, that this rank has joined."""
        store = self._store
        assert store is not None
        sequence = store.add("sequence", 1)
        keys = [self._verdict_key(rank, sequence) for rank in range(self._size)]
        entry = json.dumps({"join": self._rank})
        store.multi_set(keys, [entry] * self._size)  # type: ignore[attr-defined]

    def _gathered_calls(
        self, store: Store, key: str, previous: list[Call | None]
    ) -> list[Call | None]:
        """Every rank's call of ``key``: those sent in full, and for the others their call of
        the name last time (``previous``; None where none is known)."""
        sent = {}
        for line in store.get(f"calls/{key}").decode().splitlines():
            rank, encoded = line.split(" ", 1)
            sent[int(rank)] = Call.decode(encoded)
        with self._lock:
            self._spent.append(f"calls/{key}")
        return [sent.get(rank, previous[rank]) for rank in range(self._size)]

    def _follow(self) -> None:
        """Carry out the round's agreed collectives in their order, until the round ends."""
        assert self._origin is not None
        store = _client(self._origin)
        if self._device is not None and self._device.type == "cuda":
            torch.cuda.set_device(self._device)  # NCCL issues on the rank's device
        while not self._closed.is_set():
            key = self._verdict_key(self._rank, self._sequence)
            try:
                store.wait([key], datetime.timedelta(seconds=WAKE_S))
                verdict = store.get(key).decode()
            except (RuntimeError, dist.DistError) as exc:
                if self._closed.is_set():
                    return
                logger.debug("waiting for the next agreed collective: %s", exc)
                continue
            if verdict == _STOP or self._closed.is_set():
                return
            self._sequence += 1
            self._agreed_on(verdict, store)  # holds no call once done (see _publishing)
            with self._lock:
                spent, self._spent = [key, *self._spent], []
            try:  # while the collective's data moves
                for done in spent:
                    store.delete_key(done)
            except (RuntimeError, dist.DistError) as exc:
                logger.debug("removing the keys of agreed collectives: %s", exc)

    def _agreed_on(self, verdict: str, store: Store) -> None:
        """Carry out the entry ``verdict`` of the sequence: a rank's join, or the call that
        every rank's call (None: a joined rank) agrees on."""
        agreed = json.loads(verdict)
        if "join" in agreed:
            self._joined_now(int(agreed["join"]), store)
            return
        key = agreed["key"]
        calls = [None if c is None else Call.decode(c) for c in agreed["calls"]]
        with self._lock:
            submitted = self._by_key.get(key)
        if submitted is None:  # this rank has joined: it takes part with zeros
            self._serve(key, bool(agreed["named"]), calls)
            return
        self._carry_out(submitted, calls)

    def _claimed(self, store: Store, key: str) -> bool:
        """Both a rank's count and its following thread (at a join) may find a collective due,
        on several ranks: the first to claim it publishes the verdict."""
        if store.add(f"decided/{key}", 1) != 1:
            return False
        with self._lock:
            self._joins.claims.append(f"decided/{key}")
        return True

    def _joined_now(self, rank: int, store: Store) -> None:
        """``rank`` has joined: end the phase if it is the last, else complete this rank's
        collectives that only the joined ranks kept from completing."""
        with self._lock:
            joined, claims = self._joins.saw(rank)
            self._spent += claims
            outstanding = list(self._outstanding.values())
        if len(joined) == self._size:
            return
        for submitted in outstanding:  # after the join: see _publish
            arrived = store.add(f"arrived/{submitted.key}", 0)
            self._complete_if_due(store, submitted, arrived, joined)

    def _serve(self, key: str, named: bool, calls: Sequence[Call | None]) -> None:
        """Take part, as a joined rank, in the collective the others agreed on: zeros for an
        allreduce; nothing where the others fail it. Keeps this rank's names and counts in
        step with theirs."""
        name, occurrence = key.rsplit("#", 1)
        problem = disagreement(name, calls)
        with self._lock:
            self._occurrences[name] = int(occurrence) + 1
            if named:
                self._remember(name, calls, problem)
            else:
                kind, _, number = name.rpartition(".noname.")
                self._unnamed[kind] = max(self._unnamed[kind], int(number))
        if problem is None:
            serve(key, next(call for call in calls if call is not None), self.group, self._device)

    def _remember(self, name: str, calls: Sequence[Call | None], problem: str | None) -> None:
        """Keep every rank's agreed call of the named collective ``name`` for its next call
        (see :data:`_FRESH`), or forget it where they did not agree (under the lock)."""
        if problem is None:
            self._agreed[name] = list(calls)
        else:
            self._agreed.pop(name, None)

    def _carry_out(self, submitted: NegotiatedCall, calls: Sequence[Call | None]) -> None:
        submitted.problem = disagreement(submitted.name, calls)
        with self._lock:
            if submitted.named:
                self._remember(submitted.name, calls, submitted.problem)
            del self._by_key[submitted.key]
            del self._outstanding[submitted.name]
        if submitted.problem is not None:
            submitted.future.set_result(None)
            return
        try:
            # Only allreduces run with joined ranks, and their starts read no call.
            present = [call for call in calls if call is not None]
            works, submitted.finish = submitted.start(present, self.group)
        except (RuntimeError, dist.DistError) as exc:
            submitted.future.set_exception(exc)
            return
        done = torch.futures.collect_all([work.get_future() for work in works])
        done.add_done_callback(lambda all_done: settle(submitted.future, all_done))


_JOIN = "join"
"""What this rank queues for its publishing thread when it joins."""


def _client(store: Store) -> Store:
    """A client of ``store`` of its own: a store client serves one request at a time, and
    this module's thread blocks in a wait."""
    clone: Store = store.clone()  # type: ignore[attr-defined]
    return clone
