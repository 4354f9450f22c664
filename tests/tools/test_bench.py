"""The bench: its playback and first-speech accounting on synthetic streams, then a short run
against the real dev server (one session, levels 1 and 2, JSON and PNG written)."""

import itertools
import json

import numpy as np
import pytest

from voicehost.cli import build_parser, cmd_bench
from voicehost.tools import bench
from voicehost.tools.bench.levels import max_concurrency_without_underrun, summarize
from voicehost.tools.bench.playback import (
    Analysis,
    Playback,
    StreamResult,
    Trace,
    analyse,
    chunk_holding,
    first_speech_sample,
    samples_per_chunk,
    simulate_playback,
)

RATE = 1000  # 1 sample = 1 ms: exact arithmetic in the playback tests


# --- playback --------------------------------------------------------------------------------


@pytest.mark.unit
def test_chunks_arriving_ahead_of_the_player_never_underrun():
    chunks = [(0.0, 100), (0.05, 100), (0.15, 100), (0.3, 100)]  # each plays 0.1 s
    assert simulate_playback(chunks, RATE) == Playback(0, 0.0)


@pytest.mark.unit
def test_a_chunk_arriving_exactly_when_the_audio_runs_out_is_not_an_underrun():
    assert simulate_playback([(0.0, 250), (0.25, 125), (0.375, 125)], RATE).underruns == 0


@pytest.mark.unit
def test_late_chunks_are_underruns_and_the_clock_restarts_at_the_late_arrival():
    # 0 -> plays until 0.1; 0.25 is late by 0.15 and plays until 0.35; 0.30 is in time (a clock
    # that did not restart would call it late); 0.6 is late by 0.15 (the audio ran out at 0.45).
    chunks = [(0.0, 100), (0.25, 100), (0.30, 100), (0.6, 100)]
    playback = simulate_playback(chunks, RATE)
    assert playback.underruns == 2
    assert playback.stall_s == pytest.approx(0.30)


@pytest.mark.unit
def test_every_late_chunk_counts():
    chunks = [(float(t), 100) for t in range(5)]  # 0.1 s of audio every second
    playback = simulate_playback(chunks, RATE)
    assert playback.underruns == 4
    assert playback.stall_s == pytest.approx(4 * 0.9)


@pytest.mark.unit
def test_a_jitter_buffer_delays_the_start_and_absorbs_a_late_chunk():
    chunks = [(0.0, 100), (0.15, 100), (0.2, 100)]
    assert simulate_playback(chunks, RATE).underruns == 1
    assert simulate_playback(chunks, RATE).stall_s == pytest.approx(0.05)
    assert simulate_playback(chunks, RATE, jitter_buffer_s=0.06).underruns == 0
    assert simulate_playback(chunks, RATE, jitter_buffer_s=0.04).underruns == 1


@pytest.mark.unit
def test_chunks_holding_no_whole_sample_are_not_played():
    # The 1-byte chunk at 0.5 holds no sample: it cannot be late; its byte completes a sample of
    # the next chunk, which is late.
    assert simulate_playback([(0.0, 100), (0.5, 0), (0.55, 50)], RATE).underruns == 1
    assert simulate_playback([(0.0, 0), (0.3, 100), (0.35, 100)], RATE).underruns == 0


@pytest.mark.unit
def test_samples_per_chunk_follow_odd_byte_boundaries():
    assert samples_per_chunk([3, 1, 5, 1, 2]) == [1, 1, 2, 1, 1]
    assert chunk_holding([1, 1, 2, 1], 0) == 0
    assert chunk_holding([1, 1, 2, 1], 3) == 2
    assert chunk_holding([1, 1, 2, 1], 4) == 3
    assert chunk_holding([0, 2, 2], 0) == 1


# --- first speech ----------------------------------------------------------------------------


def tone(seconds: float, amplitude: float, rate: int = 24000) -> np.ndarray:
    t = np.arange(round(seconds * rate)) / rate
    return (amplitude * np.sin(2 * np.pi * 220 * t)).astype(np.int16)


@pytest.mark.unit
def test_first_speech_is_where_a_10ms_window_gets_loud():
    audio = np.concatenate([np.zeros(12000, np.int16), tone(0.5, 1000)])  # -33 dBFS after 0.5 s
    index = first_speech_sample(audio, 24000, -50.0)
    assert index is not None and 12000 <= index < 12000 + 480


@pytest.mark.unit
def test_quiet_audio_is_not_speech_and_the_threshold_is_an_option():
    noise = np.random.default_rng(0).normal(0, 10, 24000).astype(np.int16)  # about -70 dBFS
    assert first_speech_sample(noise, 24000, -50.0) is None
    assert first_speech_sample(noise, 24000, -80.0) is not None
    assert first_speech_sample(tone(0.5, 1000), 24000, -20.0) is None
    assert first_speech_sample(np.zeros(0, np.int16), 24000, -50.0) is None


@pytest.mark.unit
def test_analyse_times_first_byte_first_speech_underruns_and_rtf():
    silent = np.zeros(2400, np.int16).tobytes()
    loud = tone(0.1, 3000).tobytes()
    body = silent + loud + silent
    # Four chunks; the second ends on an odd byte: the speech starts in the third chunk.
    cuts = [0, 4800, 4801, 9600, 14400]
    trace = Trace(sent_at=10.0, on_wire_at=10.05, status=200)
    trace.arrivals = [10.2, 10.25, 10.28, 10.9]
    trace.sizes = [b - a for a, b in itertools.pairwise(cuts)]
    trace.pcm = bytearray(body)
    result = analyse(trace, Analysis(), 1, 0, "dev-a", 0)
    assert result.error is None
    assert result.ttfb_ms == pytest.approx(200)
    assert result.wire_ttfb_ms == pytest.approx(150)  # from the request's last byte sent
    assert result.first_speech_ms == pytest.approx(280)
    assert result.audio_s == pytest.approx(0.3)
    assert result.underruns == 1  # the player ran dry at 10.4 (10.2 + 2 x 0.1 s)
    assert result.stall_s == pytest.approx(0.5)
    assert result.rtf == pytest.approx(0.7 / 0.3, rel=1e-3)
    assert result.rtf_total == pytest.approx(0.9 / 0.3, rel=1e-3)
    assert result.audio_tokens == pytest.approx(0.3 * 82.03, rel=1e-3)
    assert result.chunk_samples == [2400, 0, 2400, 2400]


@pytest.mark.unit
def test_a_stream_without_audio_is_an_error():
    result = analyse(Trace(sent_at=0.0, status=200), Analysis(), 1, 0, "dev-a", 0)
    assert result.error == "no audio received" and result.ttfb_ms is None


# --- levels ----------------------------------------------------------------------------------


def streams(concurrency: int, underruns: list[int], failed: int = 0) -> list[StreamResult]:
    made = [
        StreamResult(concurrency, i, "v", i, 200, None, audio_s=1.0, underruns=n)
        for i, n in enumerate(underruns)
    ]
    made += [StreamResult(concurrency, i, "v", i, 500, "HTTP 500: x") for i in range(failed)]
    return made


@pytest.mark.unit
def test_the_highest_level_with_99_percent_of_streams_free_of_underruns():
    levels = [
        summarize(1, streams(1, [0]), 1.0),
        summarize(2, streams(2, [0, 0]), 1.0),
        summarize(4, streams(4, [0, 0, 1, 0]), 1.0),
        summarize(100, streams(100, [1] + [0] * 99), 1.0),  # exactly 99%
        summarize(200, streams(200, [1, 1] + [0] * 197), 1.0),  # 98.5%
        summarize(300, streams(300, [0] * 296, failed=4), 1.0),  # failures count against it
    ]
    assert [lv.underrun_free_share for lv in levels[:3]] == [1.0, 1.0, 0.75]
    assert max_concurrency_without_underrun(levels) == 100
    assert max_concurrency_without_underrun(levels[:3]) == 2
    assert max_concurrency_without_underrun(levels[2:3]) is None
    assert levels[5].errors == 4 and levels[5].error_messages[0].endswith("HTTP 500: x")


@pytest.mark.unit
def test_level_tokens_per_second_sum_every_stream_over_the_wall_time():
    level = summarize(2, streams(2, [0, 3]), 2.0)
    assert level.audio_tokens_per_s == pytest.approx(2 * 82.03 / 2, rel=1e-3)
    assert level.underruns == 3 and level.underrun_free_streams == 1


@pytest.mark.unit
def test_voicehost_bench_is_a_subcommand():
    args = build_parser().parse_args(["bench", "--concurrency", "1,2", "--jitter-buffer-ms", "80"])
    assert args.func is cmd_bench
    assert args.concurrency == [1, 2] and args.jitter_buffer_ms == 80
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--concurrency", "0"])


# --- against the dev server ------------------------------------------------------------------


def last_json_line(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


def test_bench_drives_the_dev_server(server, tmp_path, capsys):
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    argv = ["--url", server.url, "--concurrency", "1,2", "--voices", "dev-a,dev-b"]
    argv += ["--text", "Hi.", "--warmup", "0", "--json", str(out), "--plot", str(png)]
    status = bench.main(argv)
    printed = capsys.readouterr().out
    assert status == 0, printed
    summary = last_json_line(printed)
    report = json.loads(out.read_text())
    assert [lv["concurrency"] for lv in summary["levels"]] == [1, 2]
    assert summary["max_concurrency_without_underrun"] in (None, 1, 2)
    for level in report["levels"]:
        assert level["errors"] == 0 and level["audio_tokens_per_s"] > 0
        assert set(level["ttfb_ms"]) == set(level["first_speech_ms"]) == {"p50", "p95", "p99"}
        assert level["stream_count"] == len(level["streams"]) == level["concurrency"]
        # the server's own first-audio time from its metrics, below what the client waited
        assert level["server_streams_counted"] == level["stream_count"]
        assert 0 < level["server_first_audio_ms_mean"] <= level["ttfb_ms"]["p99"]
        assert level["http_overhead_ms_mean"] >= level["http_overhead_on_wire_ms_mean"]
        for stream in level["streams"]:
            assert stream["status"] == 200 and stream["audio_s"] > 0
            # the request was on the wire after it was made and before its answer came
            assert 0 < stream["wire_ttfb_ms"] <= stream["ttfb_ms"]
            assert isinstance(stream["underruns"], int) and stream["underruns"] >= 0
            assert stream["ttfb_ms"] > 0 and stream["rtf"] is not None
            if stream["first_speech_ms"] is not None:
                assert stream["ttfb_ms"] <= stream["first_speech_ms"] <= stream["last_byte_ms"]
            assert sum(stream["chunk_samples"]) == pytest.approx(stream["audio_s"] * 24000, abs=3)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_failed_stream_fails_the_bench_with_its_error(server, capsys):
    argv = ["--url", server.url, "--concurrency", "1", "--voices", "no-such-voice"]
    status = bench.main([*argv, "--warmup", "0", "--text", "Hi."])
    printed = capsys.readouterr()
    assert status == 1
    assert "HTTP 404" in printed.out and "no-such-voice" in printed.out
    assert "HTTP 404" in last_json_line(printed.out)["levels"][0]["error_messages"][0]
