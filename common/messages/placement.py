"""Alg. 1's requests and answers: launches, preemptions, stops, failures."""

from __future__ import annotations

from typing import Annotated

from common.ids import GmId, LmId, NodeIndex, UserId
from common.messages._base import MAX_JOB_TASKS, Version
from common.messages.state import PlacedRef, StateDelta
from common.model import TaskSpec, Time
from common.schema import Seq, Text, UInt, Wire, in_range, message, n_items


class Placement(Wire, frozen=True, kw_only=True):
    """Launch attempt ``attempt`` of a task on ``node``; ``repartition`` when the node
    is in another GM's partition (it becomes a logical node of the requester's)."""

    spec: TaskSpec
    attempt: UInt
    node: NodeIndex
    repartition: bool = False
    altruistic: bool = False
    queued_at: Time = -1.0
    """When the task entered its GM's queue (kept by the LM for a restarted GM)."""


@message("launch")
class LaunchRequest(Wire, frozen=True, kw_only=True):
    gm: GmId
    lm: LmId
    request_id: UInt
    placements: Annotated[tuple[Placement, ...], n_items(1, MAX_JOB_TASKS)]
    known_version: Version
    sent_at: Time = -1.0
    """When the request left the GM (stamped by its driver; echoed in the response)."""


class PlacementResult(Wire, frozen=True, kw_only=True):
    """The LM's verdict on one placement, in request order."""

    accepted: bool
    reason: Text = "ok"
    """``ok``; ``duplicate`` (the LM already holds this or a newer attempt: idempotent),
    ``finished`` / ``failed`` (that attempt already ended here); ``rerouted`` (placed
    on ``node`` instead: the one asked for had no room); ``insufficient_resources``,
    ``constraints_unmet``, ``node_down``, ``unknown_node``."""
    attempt: UInt = 0
    """For a duplicate: the attempt the LM holds (or held), which the GM takes on."""
    node: Annotated[int, in_range(-1, None)] = -1
    """For ``rerouted`` (the node asked for had no room): the node the LM used."""


@message("launch_response")
class LaunchResponse(Wire, frozen=True, kw_only=True):
    gm: GmId
    lm: LmId
    request_id: UInt
    results: Seq[PlacementResult]
    delta: StateDelta
    request_sent_at: Time = -1.0
    received_at: Time = 0.0
    """When the LM received the request; with ``sent_at`` it splits the round trip
    into communication and LM processing exactly."""
    sent_at: Time = 0.0


@message("preempt")
class PreemptRequest(Wire, frozen=True, kw_only=True):
    """Free room for attempt ``attempt`` of ``spec`` by preempting tasks of ``victim``,
    then launch it."""

    gm: GmId
    lm: LmId
    request_id: UInt
    spec: TaskSpec
    attempt: UInt
    victim: UserId
    known_version: Version
    sent_at: Time = -1.0
    queued_at: Time = -1.0
    lower_only: bool = False
    """A higher class's preemption: stop tasks of any user in a class below ``spec``'s
    (``victim`` is not read), whatever they have run; else tasks of ``victim`` in
    ``spec``'s class or below (Alg. 2, shares within a class)."""


@message("preempt_response")
class PreemptResponse(Wire, frozen=True, kw_only=True):
    gm: GmId
    lm: LmId
    request_id: UInt
    accepted: bool
    reason: Text
    node: NodeIndex | None
    preempted: Seq[PlacedRef]
    attempt: UInt = 0
    """For a duplicate: the attempt the LM holds (or held)."""
    delta: StateDelta
    request_sent_at: Time = -1.0
    received_at: Time = 0.0
    sent_at: Time = 0.0


@message("stop_user_tasks")
class StopUserTasks(Wire, frozen=True, kw_only=True):
    """GM -> LM: stop every attempt of ``user`` that GM ``gm`` placed here (its token
    was revoked: ``reason``).  Each goes back to the GM as ``PREEMPTED`` once its pool
    stopped it, and the GM ends it with ``reason``."""

    gm: GmId
    lm: LmId
    user: UserId
    reason: Text = "user_revoked"


@message("user_tasks_stopped")
class UserTasksStopped(Wire, frozen=True, kw_only=True):
    """LM -> GM: the attempts of ``user`` it stopped for ``StopUserTasks``."""

    gm: GmId
    lm: LmId
    user: UserId
    stopped: Seq[PlacedRef]


@message("request_failed")
class RequestFailed(Wire, frozen=True, kw_only=True):
    """A GM's driver could not get an answer to request ``request_id`` (the LM refused
    it with a 4xx): the core treats it as a refusal of everything it asked for."""

    lm: LmId
    request_id: UInt
    reason: Text
