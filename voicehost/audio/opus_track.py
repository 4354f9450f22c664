"""The audio a WebRTC listener hears: PCM (s16le mono at 48 kHz) cut into 20 ms Opus packets,
sent by a real-time clock.

The listener's own WebRTC stack does the rest (jitter buffer, loss concealment, clock recovery);
the service only encodes and paces. A packet is queued as soon as its audio is encoded and sent
when the clock reaches it, so a barge-in (``drop``) leaves the listener only the packet on the wire
and its jitter buffer of what was cancelled. When there is nothing to send (the text has not come
yet, or generation fell behind), the clock runs on: the next packet's timestamp tells the
listener's stack how long the gap was, as a peer that stops sending in silence does.
"""

from __future__ import annotations

import asyncio
import fractions
import time
from collections import deque
from collections.abc import Callable

import av
import numpy as np
from aiortc import MediaStreamTrack
from aiortc.mediastreams import MediaStreamError

OPUS_RATE = 48_000  # Opus' clock, and the browser's native rate
PACKET_SAMPLES = 960  # 20 ms at 48 kHz
PACKET_SECONDS = PACKET_SAMPLES / OPUS_RATE
OPUS_BITRATE = 32_000  # mono speech; WebRTC's own default for voice is about as much
TIME_BASE = fractions.Fraction(1, OPUS_RATE)


class OpusPacketizer:
    """s16le mono PCM at 48 kHz in, 20 ms Opus packets out (libopus through PyAV), the audio
    short of a whole packet held for the next call, or padded with silence by ``flush``."""

    def __init__(self, bitrate: int = OPUS_BITRATE) -> None:
        codec = av.CodecContext.create("libopus", "w")
        codec.format = "s16"
        codec.layout = "mono"
        codec.sample_rate = OPUS_RATE
        codec.bit_rate = bitrate
        codec.time_base = TIME_BASE
        codec.options = {"application": "voip", "frame_duration": "20"}
        self.codec = codec
        self.held = b""  # audio short of a whole packet
        self.pts = 0

    def encode(self, pcm: bytes) -> list[bytes]:
        """The packets of ``pcm`` and what was held before it, whole packets only."""
        data = self.held + pcm
        whole = len(data) // (2 * PACKET_SAMPLES) * 2 * PACKET_SAMPLES
        self.held = data[whole:]
        return self._packets(data[:whole])

    def flush(self) -> list[bytes]:
        """The held audio as one packet, padded with silence (none if nothing is held)."""
        if not self.held:
            return []
        data, self.held = self.held, b""
        return self._packets(data + bytes(2 * PACKET_SAMPLES - len(data)))

    def _packets(self, data: bytes) -> list[bytes]:
        samples = np.frombuffer(data, dtype="<i2")
        packets: list[bytes] = []
        for start in range(0, samples.size, PACKET_SAMPLES):
            frame = av.AudioFrame.from_ndarray(
                samples[start : start + PACKET_SAMPLES].reshape(1, -1), format="s16", layout="mono"
            )
            frame.sample_rate = OPUS_RATE
            frame.pts = self.pts
            frame.time_base = TIME_BASE
            self.pts += PACKET_SAMPLES
            packets.extend(bytes(packet) for packet in self.codec.encode(frame))
        return packets


def silence_packet() -> bytes:
    """One 20 ms Opus packet of silence."""
    packets = OpusPacketizer().encode(bytes(2 * PACKET_SAMPLES))
    return packets[0]


class PacedOpusTrack(MediaStreamTrack):
    """An aiortc audio track of pre-encoded Opus packets, one every 20 ms of a monotonic clock.

    ``queue`` adds packets; ``drop`` empties the queue (barge-in) and says how many were dropped.
    The first packet after a gap is sent at once and its timestamp counts the gap; packets queued
    faster than real time wait for their turn. At the end of a talkspurt (``end_talkspurt``: a
    segment's audio is all queued, and no more comes before the queue runs dry) the audio short
    of a packet (``remainder``, padded) and then ``TAIL_PACKETS`` of silence are sent, as after
    a drop, so that the listener's jitter buffer gives out its last packets and fades to silence
    rather than concealing a loss; a gap inside a talkspurt (generation behind the clock) stays
    a gap. ``played_seconds`` is the audio sent."""

    kind = "audio"
    TAIL_PACKETS = 5

    def __init__(
        self,
        remainder: Callable[[], list[bytes]] = list,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.remainder = remainder  # the audio short of a packet, padded: a talkspurt's end
        self.clock = clock
        self.packets: deque[bytes] = deque()
        self.arrived = asyncio.Event()
        self.start: float | None = None  # the clock at tick 0
        self.tick = -1  # the last packet's, in packets since ``start``
        self.sent = 0  # packets of audio sent (the silence of a tail not counted)
        self.tail = 0  # silent packets still to send after the audio
        self.ending = False  # the queued audio ends a talkspurt
        self.silence = silence_packet()
        self.emptied = asyncio.Event()  # set while nothing is left to send
        self.emptied.set()

    @property
    def queued_seconds(self) -> float:
        return len(self.packets) * PACKET_SECONDS

    @property
    def played_seconds(self) -> float:
        return self.sent * PACKET_SECONDS

    def queue(self, packets: list[bytes]) -> None:
        if packets and self.readyState == "live":
            self.packets.extend(packets)
            self.ending = False  # the talkspurt goes on
            self.emptied.clear()
            self.arrived.set()

    def end_talkspurt(self) -> None:
        """The audio so far ends a talkspurt, unless more is queued before the queue runs dry:
        then its ``remainder`` is sent, and silence after it."""
        self.ending = True
        self.emptied.clear()
        self.arrived.set()

    def drop(self) -> int:
        dropped = len(self.packets)
        self.packets.clear()
        self.ending = False
        if self.sent:  # the listener heard something: end it with silence
            self.tail = self.TAIL_PACKETS
            self.arrived.set()
        else:
            self.emptied.set()
        return dropped

    async def drained(self) -> None:
        """Once every queued packet, and the silence after them, has been sent."""
        await self.emptied.wait()

    async def recv(self) -> av.Packet:
        while True:
            if self.ending and not self.packets:  # the talkspurt's end: its last packet
                self.ending = False
                self.packets.extend(self.remainder())
                self.tail = self.TAIL_PACKETS if self.sent or self.packets else 0
            if self.packets or self.tail:
                break
            self.emptied.set()
            if self.readyState != "live":
                raise MediaStreamError
            self.arrived.clear()
            await self.arrived.wait()
        now = self.clock()
        if self.start is None:
            self.start = now
        # the next tick, or the one the clock has reached after a gap
        due_tick = max(self.tick + 1, int((now - self.start) / PACKET_SECONDS))
        wait = self.start + due_tick * PACKET_SECONDS - now
        if wait > 0:
            await asyncio.sleep(wait)
        if self.packets:
            data = self.packets.popleft()
            self.sent += 1
        elif self.tail:  # the queue ran dry, or was dropped while waiting
            data = self.silence
            self.tail -= 1
        else:
            return await self.recv()
        self.tick = due_tick
        if not self.packets and not self.tail and not self.ending:
            self.emptied.set()
        packet = av.Packet(data)
        packet.pts = self.tick * PACKET_SAMPLES
        packet.time_base = TIME_BASE
        return packet

    def stop(self) -> None:
        super().stop()
        self.packets.clear()
        self.tail = 0
        self.emptied.set()
        self.arrived.set()  # a recv waiting for packets ends
