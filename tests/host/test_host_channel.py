"""The host's channel (voicehost.host.channel): the front ends of one host ask each other over
Unix sockets in the host's folder. Two ends in one process, over real sockets: a question is
answered by the front end asked; one that has gone, or never answers, is an error that names it,
at once or within the timeout, never a hang."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from voicehost.host.channel import (
    HostChannel,
    PeerFailed,
    PeerGone,
    PeerSilent,
    socket_path,
)

pytestmark = pytest.mark.unit


async def test_a_question_is_answered_by_the_front_end_asked(tmp_path):
    asker, asked = HostChannel(tmp_path, 0, 2), HostChannel(tmp_path, 1, 2)
    heard = []

    async def holds(body: dict) -> dict:
        heard.append(body)
        return {"held": body["session_id"] == "s1", "by": asked.index}

    async def broken(body: dict) -> dict:
        raise ValueError("no such candidate")

    asked.on("webrtc.holds", holds)
    asked.on("broken", broken)
    await asked.open()
    try:
        assert socket_path(tmp_path, 1).is_socket()
        answer = await asker.ask(1, "webrtc.holds", {"session_id": "s1", "key_id": None})
        assert answer == {"held": True, "by": 1}
        assert await asker.ask_others("webrtc.holds", {"session_id": "s2"}) == {
            1: {"held": False, "by": 1}
        }
        assert heard == [{"session_id": "s1", "key_id": None}, {"session_id": "s2"}]
        with pytest.raises(PeerFailed, match=r"front end 1 .*ValueError: no such candidate"):
            await asker.ask(1, "broken", {})
        with pytest.raises(PeerFailed, match="front end 1 has no handler for 'unknown'"):
            await asker.ask(1, "unknown", {})
    finally:
        await asked.close()
    assert not socket_path(tmp_path, 1).exists()


async def test_a_front_end_gone_is_an_error_at_once_and_a_silent_one_within_the_timeout(
    tmp_path,
):
    asker = HostChannel(tmp_path, 0, 3, timeout=0.5)
    slow = HostChannel(tmp_path, 1, 3)

    async def stuck(body: dict) -> dict:
        await asyncio.sleep(30)
        return {}

    slow.on("stuck", stuck)
    await slow.open()
    # front end 2 died: its socket file is left, with no one listening
    with socket.socket(socket.AF_UNIX) as dead:
        dead.bind(str(socket_path(tmp_path, 2)))
    try:
        started = time.monotonic()
        with pytest.raises(PeerGone, match="front end 2 of this host is not listening"):
            await asker.ask(2, "stuck", {})
        assert time.monotonic() - started < 0.25
        started = time.monotonic()
        with pytest.raises(PeerSilent, match=r"front end 1 of this host did not answer 'stuck'"):
            await asker.ask(1, "stuck", {})
        assert 0.5 <= time.monotonic() - started < 1.5
        answers = await asker.ask_others("stuck", {})
        assert isinstance(answers[1], PeerSilent) and isinstance(answers[2], PeerGone)
    finally:
        started = time.monotonic()
        await slow.close()  # the stuck questions dropped, not waited for
        assert time.monotonic() - started < 0.25
    with pytest.raises(PeerGone):  # closed: gone
        await asker.ask(1, "stuck", {})
    with pytest.raises(PeerGone):  # never opened
        await HostChannel(tmp_path, 1, 3).ask(0, "stuck", {})
