"""Property-based fuzzing (hypothesis) of the token and frame layer: audio token ids <-> codes,
frames <-> tokens <-> SNAC code layers, the assembler on arbitrary engine output, and the frame
decoder (real dev SNAC) on arbitrary arrivals of frames. ORPHEUS.md is the specification."""

import asyncio
import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from voicehost.metrics import SpeechMetrics
from voicehost.model import orpheus
from voicehost.model.codec import DecodeScheduler, FrameDecoder
from voicehost.model.orpheus import (
    AUDIO_TOKEN_BASE,
    BEGIN_OF_TEXT,
    CODEBOOK_SIZE,
    END_OF_SPEECH,
    SAMPLES_PER_FRAME,
    TOKENS_PER_FRAME,
    VOCAB_SIZE,
    Frame,
    FrameAssembler,
    MalformedAudioToken,
)
from voicehost.speech.synthesis import Synthesizer

pytestmark = pytest.mark.unit

AUDIO_END = AUDIO_TOKEN_BASE + TOKENS_PER_FRAME * CODEBOOK_SIZE  # first id past the audio tokens

codes = st.integers(0, CODEBOOK_SIZE - 1)
positions = st.integers(0, TOKENS_PER_FRAME - 1)
frames = st.builds(
    Frame.from_codes,
    st.lists(codes, min_size=1, max_size=1),
    st.lists(codes, min_size=2, max_size=2),
    st.lists(codes, min_size=4, max_size=4),
)
any_ids = st.integers(-(2**40), 2**40)
# What an engine could emit besides audio: text ids, the special tokens, ids past the vocabulary.
non_audio = st.one_of(
    st.integers(0, AUDIO_TOKEN_BASE - 1).filter(lambda t: t != END_OF_SPEECH),
    st.integers(AUDIO_END, VOCAB_SIZE + 1000),
    st.integers(-(2**31), -1),
)
audio_tokens = st.builds(orpheus.audio_token_id, positions, codes)
garbage = st.lists(st.one_of(non_audio, audio_tokens), max_size=40)


# --- audio token ids ----------------------------------------------------------------------------


@given(positions, codes)
def test_audio_token_ids_round_trip_with_the_orpheus_formula(position, code):
    token = orpheus.audio_token_id(position, code)
    assert token == 128266 + position * 4096 + code  # ORPHEUS.md
    assert orpheus.decode_audio_token(token) == (position, code)
    assert orpheus.code_at(token, position) == code


@given(any_ids)
def test_any_id_decodes_to_its_position_and_code_or_is_malformed(token):
    try:
        position, code = orpheus.decode_audio_token(token)
    except MalformedAudioToken:
        assert not AUDIO_TOKEN_BASE <= token < AUDIO_END
    else:
        assert AUDIO_TOKEN_BASE <= token < AUDIO_END
        assert orpheus.audio_token_id(position, code) == token


@given(any_ids, any_ids)
def test_audio_token_id_refuses_positions_and_codes_out_of_range_with_value_error(position, code):
    try:
        token = orpheus.audio_token_id(position, code)
    except ValueError:
        assert not (0 <= position < TOKENS_PER_FRAME and 0 <= code < CODEBOOK_SIZE)
    else:
        assert AUDIO_TOKEN_BASE <= token < AUDIO_END


@given(audio_tokens, positions)
def test_a_code_is_read_only_at_its_own_position(token, position):
    own, code = orpheus.decode_audio_token(token)
    if own == position:
        assert orpheus.code_at(token, position) == code
    else:
        with pytest.raises(MalformedAudioToken):
            orpheus.code_at(token, position)


# --- frames -------------------------------------------------------------------------------------


@given(frames)
def test_frame_tokens_follow_the_layout_and_round_trip(frame):
    tokens = frame.tokens()
    layers = (frame.l0, frame.l1, frame.l2)
    # ORPHEUS.md: k -> L0[i], L1[2i], L2[4i], L2[4i+1], L1[2i+1], L2[4i+2], L2[4i+3]
    expected = [layers[0][0], layers[1][0], layers[2][0], layers[2][1]]
    expected += [layers[1][1], layers[2][2], layers[2][3]]
    assert [t - AUDIO_TOKEN_BASE - k * CODEBOOK_SIZE for k, t in enumerate(tokens)] == expected
    assert Frame.from_tokens(tokens) == frame


@given(st.lists(frames, max_size=20))
def test_frames_round_trip_through_snac_code_layers(sequence):
    l0, l1, l2 = orpheus.frames_to_codes(sequence)
    assert (len(l0), len(l1), len(l2)) == (len(sequence), 2 * len(sequence), 4 * len(sequence))
    assert orpheus.codes_to_frames(l0, l1, l2) == sequence


def is_frame_of_tokens(tokens: list[int]) -> bool:
    """ORPHEUS.md: 7 tokens, the k-th one 128266 + k*4096 + a code in 0..4095."""
    return len(tokens) == TOKENS_PER_FRAME and all(
        0 <= t - AUDIO_TOKEN_BASE - k * CODEBOOK_SIZE < CODEBOOK_SIZE for k, t in enumerate(tokens)
    )


def one_token_changed(tokens: list[int], data: st.DataObject) -> list[int]:
    changed = list(tokens)
    changed[data.draw(positions)] = data.draw(st.one_of(any_ids, audio_tokens))
    return changed


@pytest.mark.unit
@given(
    st.one_of(
        frames.map(Frame.tokens),  # valid: hypothesis would hardly ever build one at random
        st.lists(st.one_of(any_ids, audio_tokens), max_size=9),
        st.tuples(frames.map(Frame.tokens), st.data()).map(lambda a: one_token_changed(*a)),
    )
)
def test_from_tokens_parses_every_valid_frame_and_refuses_every_other_list(tokens):
    if is_frame_of_tokens(tokens):
        assert Frame.from_tokens(tokens).tokens() == tokens
    else:
        with pytest.raises(MalformedAudioToken):
            Frame.from_tokens(tokens)


codes_or_junk = st.lists(st.one_of(codes, any_ids), max_size=5)


valid_layers = frames.map(lambda f: (list(f.l0), list(f.l1), list(f.l2)))


def are_frame_codes(l0: list[int], l1: list[int], l2: list[int]) -> bool:
    """1, 2 and 4 codes, each in 0..4095."""
    counts_fit = (len(l0), len(l1), len(l2)) == (1, 2, 4)
    return counts_fit and all(0 <= c < CODEBOOK_SIZE for c in [*l0, *l1, *l2])


@pytest.mark.unit
@given(st.one_of(valid_layers, st.tuples(codes_or_junk, codes_or_junk, codes_or_junk)))
def test_from_codes_builds_every_valid_frame_and_refuses_every_other_layout(layers):
    l0, l1, l2 = layers
    if are_frame_codes(l0, l1, l2):
        frame = Frame.from_codes(l0, l1, l2)
        assert (list(frame.l0), list(frame.l1), list(frame.l2)) == (l0, l1, l2)
    else:
        with pytest.raises(ValueError):
            Frame.from_codes(l0, l1, l2)


junk_code = st.one_of(codes, any_ids)
aligned_layers = st.integers(0, 6).flatmap(
    lambda n: st.tuples(
        st.lists(junk_code, min_size=n, max_size=n),
        st.lists(junk_code, min_size=2 * n, max_size=2 * n),
        st.lists(junk_code, min_size=4 * n, max_size=4 * n),
    )
)


@pytest.mark.unit
@given(
    st.one_of(
        st.lists(frames, max_size=6).map(orpheus.frames_to_codes),  # valid
        aligned_layers,
        st.tuples(codes_or_junk, codes_or_junk, codes_or_junk),
    )
)
def test_codes_to_frames_splits_every_valid_layout_and_refuses_every_other(layers):
    l0, l1, l2 = layers
    n = len(l0)
    aligned = (len(l1), len(l2)) == (2 * n, 4 * n)
    if aligned and all(0 <= c < CODEBOOK_SIZE for c in [*l0, *l1, *l2]):
        split = orpheus.codes_to_frames(l0, l1, l2)
        assert len(split) == n
        assert orpheus.frames_to_codes(split) == (list(l0), list(l1), list(l2))
    else:
        with pytest.raises(ValueError):
            orpheus.codes_to_frames(l0, l1, l2)


# --- the assembler on arbitrary engine output ---------------------------------------------------


def assemble(stream: list[int], cuts: list[int]) -> tuple[list[Frame], FrameAssembler]:
    """Push ``stream`` in pieces cut at ``cuts`` (deltas of any size, empty ones too)."""
    assembler = FrameAssembler()
    out: list[Frame] = []
    edges = [0, *sorted(c % (len(stream) + 1) for c in cuts), len(stream)]
    for start, stop in itertools.pairwise(edges):
        out += assembler.push(stream[start:stop])
    return out, assembler


def tokens_of(sequence: list[Frame]) -> list[int]:
    return [token for frame in sequence for token in frame.tokens()]


@given(st.lists(frames, max_size=12), st.lists(st.integers(0, 200), max_size=10))
def test_clean_frames_come_back_exactly_whatever_the_chunking(sequence, cuts):
    out, assembler = assemble(tokens_of(sequence), cuts)
    assert out == sequence
    assert (assembler.frames, assembler.malformed_frames, assembler.stray_tokens) == (
        len(sequence),
        0,
        0,
    )
    assert assembler.incomplete_tokens == 0


@given(
    st.lists(st.one_of(any_ids, non_audio, audio_tokens), max_size=60),
    st.lists(st.integers(0, 200), max_size=10),
    st.lists(st.integers(0, 200), max_size=10),
)
def test_any_stream_parses_the_same_whatever_the_chunking_and_never_raises(stream, a, b):
    out_a, first = assemble(stream, a)
    out_b, second = assemble(stream, b)
    assert out_a == out_b
    counts = ("frames", "malformed_frames", "stray_tokens", "stopped", "incomplete_tokens")
    assert [getattr(first, c) for c in counts] == [getattr(second, c) for c in counts]
    before_stop = stream[: stream.index(END_OF_SPEECH)] if END_OF_SPEECH in stream else stream
    strays = [t for t in before_stop if not AUDIO_TOKEN_BASE <= t < AUDIO_END]
    assert first.stray_tokens == len(strays)
    assert first.frames == len(out_a)
    audio = [t for t in before_stop if AUDIO_TOKEN_BASE <= t < AUDIO_END]
    assert len(out_a) * TOKENS_PER_FRAME + first.incomplete_tokens <= len(audio)
    for frame in out_a:  # every frame is 7 tokens that came in that order, positions 0..6
        assert Frame.from_tokens(frame.tokens()) == frame


@given(garbage, st.lists(frames, min_size=1, max_size=6), st.lists(non_audio, max_size=6))
def test_every_clean_frame_after_garbage_is_recovered(junk, sequence, strays):
    """A frame whose position-0 token follows garbage resyncs the stream: it is never lost."""
    alone, _ = assemble(junk, [])
    # non-audio ids sprinkled inside the clean frames are skipped without losing them
    clean = tokens_of(sequence)
    for i, stray in enumerate(strays):
        clean.insert((i * 5) % (len(clean) + 1), stray)
    out, assembler = assemble([*junk, *clean], [len(junk)])
    assert out == [*alone, *sequence]
    assert assembler.incomplete_tokens == 0


@given(st.lists(frames, max_size=4), garbage, st.lists(st.integers(0, 80), max_size=4))
def test_nothing_after_the_stop_token_is_used(sequence, after, cuts):
    out, assembler = assemble([*tokens_of(sequence), END_OF_SPEECH, *after], cuts)
    assert out == sequence
    assert assembler.stopped
    assert assembler.push(tokens_of(sequence)) == []


# --- prompts and token budgets ------------------------------------------------------------------


@given(st.lists(st.integers(-5, VOCAB_SIZE + 5), max_size=20))
def test_prompts_take_only_text_ids(ids):
    try:
        prompt = orpheus.build_prompt(ids)
    except ValueError:
        assert any(not 0 <= t < BEGIN_OF_TEXT for t in ids)
        return
    assert prompt == [orpheus.START_OF_HUMAN, orpheus.BEGIN_OF_TEXT, *ids, *orpheus.PROMPT_SUFFIX]


@given(st.text(max_size=3000), st.integers(1, 20000))
def test_max_tokens_is_whole_frames_plus_stop_and_never_below_what_the_text_needs(text, limit):
    needed = orpheus.min_audio_tokens(text)
    if limit < TOKENS_PER_FRAME + 1:
        with pytest.raises(ValueError):
            orpheus.max_audio_tokens(text, limit)
        return
    if needed > limit:  # the engine refuses such a request (InputTooLong) before sampling
        return
    budget = orpheus.max_audio_tokens(text, limit)
    assert needed <= budget <= limit
    assert (budget - 1) % TOKENS_PER_FRAME == 0 and (needed - 1) % TOKENS_PER_FRAME == 0


# --- the frame decoder (real dev SNAC) ----------------------------------------------------------


DECODER_SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
arrivals = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(0, 6)),
        st.tuples(st.just("flush"), st.just(0)),
        st.tuples(st.just("wait"), st.integers(0, 400)),  # ms of playback
    ),
    max_size=20,
)


@DECODER_SETTINGS
@given(st.lists(frames, min_size=1, max_size=20), arrivals, st.integers(1, 16))
def test_decoder_plays_every_frame_once_and_equals_a_one_shot_decode(codec, seq, events, chunk):
    """Whatever the arrivals, flushes and listener clock: each frame's 2048 samples, once, in
    order; with lookahead 2 the stream equals decoding all frames at once."""
    now = [0.0]

    async def run() -> np.ndarray:
        decoder = FrameDecoder(DecodeScheduler(codec), 2, chunk, clock=lambda: now[0])
        pieces, sent = [], 0
        try:
            for kind, amount in events:
                if kind == "push":
                    pieces.append(await decoder.push(seq[sent : sent + amount]))
                    sent = min(len(seq), sent + amount)
                elif kind == "flush":
                    pieces.append(await decoder.flush())
                else:
                    now[0] += amount / 1000
                assert decoder.emitted <= max(0, sent - 2)  # never before its lookahead came
            pieces.append(await decoder.push(seq[sent:]))
            pieces.append(await decoder.finish())
            assert decoder.emitted == len(seq)
        finally:
            decoder.close()
        return np.concatenate(pieces)

    audio = asyncio.run(run())
    reference = codec.decode(seq)
    assert audio.shape == reference.shape == (len(seq) * SAMPLES_PER_FRAME,)
    assert np.abs(audio - reference).max() < 1e-3


@DECODER_SETTINGS
@given(
    st.lists(st.lists(st.one_of(non_audio, audio_tokens, any_ids), max_size=12), max_size=6),
    st.lists(frames, max_size=6),
    st.booleans(),
)
def test_playing_any_token_stream_yields_the_audio_of_the_frames_it_holds(codec, junk, seq, stop):
    """``Synthesizer.play`` (tokens -> frames -> PCM) on garbage mixed with clean frames: no
    error, and exactly the samples of the frames the assembler recovers."""
    deltas = [*junk, tokens_of(seq)] + ([[END_OF_SPEECH, *tokens_of(seq)]] if stop else [])
    expected, _ = assemble([t for d in deltas for t in d], [])
    metrics = SpeechMetrics()
    # play() reads only the scheduler, metrics and window settings; speak() would need an engine
    synthesizer = Synthesizer(None, DecodeScheduler(codec), metrics, 2, 16)  # type: ignore[arg-type]

    async def run() -> tuple[np.ndarray, list[Frame]]:
        async def tokens():
            for delta in deltas:
                yield delta

        kept: list[Frame] = []
        pieces = [pcm async for pcm in synthesizer.play(tokens(), 0.0, kept)]
        return (np.concatenate(pieces) if pieces else np.zeros(0)), kept

    audio, kept = asyncio.run(run())
    assert kept == expected
    assert audio.size == len(expected) * SAMPLES_PER_FRAME
    if END_OF_SPEECH not in [t for d in junk for t in d]:
        assert expected[len(expected) - len(seq) :] == seq  # clean frames after garbage survive
    assert synthesizer.active == 0
