"""The WebRTC audio track's parts, without a server: PCM to Opus packets, and their pacing."""

import asyncio
import time

import av
import numpy as np
import pytest

from voicehost.audio.opus_track import (
    OPUS_RATE,
    PACKET_SAMPLES,
    PACKET_SECONDS,
    OpusPacketizer,
    PacedOpusTrack,
)

pytestmark = pytest.mark.unit


def tone(seconds: float, level: int = 8000) -> bytes:
    t = np.arange(int(seconds * OPUS_RATE)) / OPUS_RATE
    return (np.sin(2 * np.pi * 220 * t) * level).astype("<i2").tobytes()


def decode(packets: list[bytes]) -> np.ndarray:
    decoder = av.CodecContext.create("opus", "r")
    decoder.sample_rate = OPUS_RATE
    decoder.layout = "mono"
    frames = []
    for data in packets:
        for frame in decoder.decode(av.Packet(data)):
            frames.append(frame.to_ndarray().reshape(-1))
    return np.concatenate(frames)


def test_pcm_in_any_pieces_becomes_one_packet_per_20_ms_and_flush_pads_the_rest():
    pcm = tone(1.01)  # 50 whole packets and 10 ms
    packetizer = OpusPacketizer()
    packets = []
    for start in range(0, len(pcm), 3000):  # odd pieces, some shorter than a packet
        packets += packetizer.encode(pcm[start : start + 3000])
    assert len(packets) == 50 and len(packetizer.held) == 2 * 480
    packets += packetizer.flush()
    assert len(packets) == 51 and packetizer.flush() == []
    decoded = decode(packets)
    assert decoded.size == 51 * PACKET_SAMPLES
    # the tone is heard through the codec, past its start-up
    assert np.abs(decoded[4800:48000]).max() > 0.12  # the decoder's float, of 8000 / 32767


async def test_packets_are_sent_one_per_20_ms_and_a_gap_moves_the_timestamps_on():
    track = PacedOpusTrack()
    packetizer = OpusPacketizer()
    track.queue(packetizer.encode(tone(0.2)))  # 10 packets
    started = time.monotonic()
    first = [await track.recv() for _ in range(10)]
    took = time.monotonic() - started
    assert [p.pts for p in first] == [i * PACKET_SAMPLES for i in range(10)]
    assert 9 * PACKET_SECONDS * 0.9 < took < 9 * PACKET_SECONDS + 0.1  # paced, not bursted
    assert track.played_seconds == pytest.approx(0.2)
    await asyncio.sleep(0.3)  # nothing to send: a gap, and the clock runs on
    track.queue(packetizer.encode(tone(0.04)))
    after_gap = await track.recv()
    assert after_gap.pts >= (10 + 14) * PACKET_SAMPLES  # about 25 ticks after the first
    track.stop()


async def test_a_drop_sends_nothing_queued_and_ends_with_silence():
    track = PacedOpusTrack()
    track.queue(OpusPacketizer().encode(tone(2.0)))  # 100 packets
    await track.recv()
    assert track.drop() == 99
    silence = [await track.recv() for _ in range(PacedOpusTrack.TAIL_PACKETS)]
    assert all(bytes(p) == track.silence for p in silence)
    assert track.sent == 1
    await asyncio.wait_for(track.drained(), 1)  # nothing more to send
    track.stop()


async def test_a_talkspurt_ends_with_its_remainder_padded_then_silence_unless_more_comes():
    packetizer = OpusPacketizer()
    track = PacedOpusTrack(packetizer.flush)
    track.queue(packetizer.encode(tone(0.05)))  # 2 packets and 10 ms held
    track.end_talkspurt()
    track.queue(packetizer.encode(tone(0.05)))  # more before the queue ran dry: it goes on
    sent = [bytes(await track.recv()) for _ in range(5)]  # 100 ms held -> 5 packets, no tail
    assert len(packetizer.held) == 0
    track.end_talkspurt()
    tail = [bytes(await track.recv()) for _ in range(PacedOpusTrack.TAIL_PACKETS)]
    assert all(packet == track.silence for packet in tail)
    assert track.sent == 5 and all(packet != track.silence for packet in sent)
    track.stop()
