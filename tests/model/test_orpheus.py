"""The Orpheus token format: ids, prompt, frame layout and its validation."""

import pytest

from voicehost.model import orpheus
from voicehost.model.orpheus import Frame, FrameAssembler, MalformedAudioToken

pytestmark = pytest.mark.unit


def test_special_ids_match_orpheus():
    assert orpheus.START_OF_SPEECH == 128257
    assert orpheus.END_OF_SPEECH == 128258
    assert orpheus.START_OF_HUMAN == 128259
    assert orpheus.END_OF_HUMAN == 128260
    assert orpheus.START_OF_AI == 128261
    assert orpheus.END_OF_AI == 128262
    assert orpheus.AUDIO_TOKEN_BASE == 128266
    assert orpheus.AUDIO_TOKEN_BASE + 7 * 4096 == orpheus.VOCAB_SIZE - 2


def test_prompt_wraps_text_tokens_with_one_bos():
    prompt = orpheus.encode_prompt(lambda s: [ord(c) for c in s], "Hi", "tara")
    assert prompt == [128259, 128000, *map(ord, "tara: Hi"), 128009, 128260, 128261, 128257]
    assert prompt.count(orpheus.BEGIN_OF_TEXT) == 1


def test_prompt_with_context_puts_the_earlier_turn_first_as_a_finished_exchange():
    frame = orpheus.Frame((0,), (1, 2), (3, 4, 5, 6))
    prompt = orpheus.encode_prompt(lambda s: [ord(c) for c in s], "Hi", "tara", ("Yo", [frame]))
    earlier = [128259, 128000, *map(ord, "tara: Yo"), 128009, 128260, 128261, 128257]
    audio = [128266, 128266 + 4096 + 1, 128266 + 2 * 4096 + 3, 128266 + 3 * 4096 + 4]
    audio += [128266 + 4 * 4096 + 2, 128266 + 5 * 4096 + 5, 128266 + 6 * 4096 + 6]
    now = [128259, 128000, *map(ord, "tara: Hi"), 128009, 128260, 128261, 128257]
    assert prompt == [*earlier, *audio, 128258, 128262, *now]
    assert orpheus.encode_prompt(lambda s: [ord(c) for c in s], "Hi", "tara", ("Yo", [])) == now


def test_prompt_without_voice_has_no_prefix():
    assert orpheus.encode_prompt(lambda s: [ord(c) for c in s], "Hi", None)[2:4] == [72, 105]


def test_prompt_refuses_text_ids_that_are_not_plain_text():
    with pytest.raises(ValueError, match="not a plain text token"):
        orpheus.build_prompt([5, orpheus.START_OF_SPEECH])


@pytest.mark.parametrize("position", range(7))
@pytest.mark.parametrize("code", [0, 1, 2048, 4095])
def test_every_position_and_edge_code_round_trips(position, code):
    token = orpheus.audio_token_id(position, code)
    assert token == 128266 + position * 4096 + code
    assert orpheus.decode_audio_token(token) == (position, code)
    assert orpheus.code_at(token, position) == code


@pytest.mark.parametrize("position", range(7))
def test_a_code_at_the_wrong_position_is_malformed(position):
    token = orpheus.audio_token_id((position + 1) % 7, 17)
    with pytest.raises(MalformedAudioToken, match="position"):
        orpheus.code_at(token, position)


@pytest.mark.parametrize(
    "token", [0, 128000, orpheus.END_OF_SPEECH, 128265, 128266 + 7 * 4096, orpheus.VOCAB_SIZE]
)
def test_non_audio_tokens_are_malformed(token):
    with pytest.raises(MalformedAudioToken):
        orpheus.decode_audio_token(token)


def test_audio_token_id_refuses_out_of_range_codes():
    with pytest.raises(ValueError):
        orpheus.audio_token_id(0, 4096)
    with pytest.raises(ValueError):
        orpheus.audio_token_id(7, 0)


def test_frame_layout_maps_positions_to_snac_layers():
    codes = [10, 11, 12, 13, 14, 15, 16]
    frame = Frame.from_tokens([orpheus.audio_token_id(k, c) for k, c in enumerate(codes)])
    # positions 0..6 -> L0[i], L1[2i], L2[4i], L2[4i+1], L1[2i+1], L2[4i+2], L2[4i+3]
    assert frame == Frame((10,), (11, 14), (12, 13, 15, 16))
    assert frame.tokens() == [orpheus.audio_token_id(k, c) for k, c in enumerate(codes)]


def test_frames_to_codes_interleaves_consecutive_frames():
    a = Frame((1,), (2, 3), (4, 5, 6, 7))
    b = Frame((0,), (4095, 0), (0, 4095, 0, 1))
    l0, l1, l2 = orpheus.frames_to_codes([a, b])
    assert (l0, l1, l2) == ([1, 0], [2, 3, 4095, 0], [4, 5, 6, 7, 0, 4095, 0, 1])
    assert orpheus.codes_to_frames(l0, l1, l2) == [a, b]


def test_codes_to_frames_refuses_ragged_layers():
    with pytest.raises(ValueError, match="n, 2n, 4n"):
        orpheus.codes_to_frames([1], [1, 2], [1, 2, 3])
    with pytest.raises(ValueError, match="outside"):
        orpheus.codes_to_frames([4096], [1, 2], [1, 2, 3, 4])


def test_frame_from_tokens_refuses_a_short_frame():
    with pytest.raises(MalformedAudioToken, match="7 tokens"):
        Frame.from_tokens([orpheus.audio_token_id(0, 1)])


def _tokens(frames):
    return [t for f in frames for t in f.tokens()]


def test_assembler_keeps_code_zero_and_every_frame_whatever_the_chunking():
    frames = [Frame((0,), (0, 0), (0, 0, 0, 0)), Frame((4095,), (1, 0), (0, 2, 0, 3))]
    tokens = [*_tokens(frames), orpheus.END_OF_SPEECH, orpheus.END_OF_AI]
    for size in (1, 2, 3, 7, 100):
        assembler = FrameAssembler()
        got = []
        for i in range(0, len(tokens), size):
            got += assembler.push(tokens[i : i + size])
        assert got == frames
        assert assembler.stopped and assembler.incomplete_tokens == 0


def test_assembler_stops_at_the_stop_token():
    frame = Frame((5,), (6, 7), (8, 9, 10, 11))
    assembler = FrameAssembler()
    assert assembler.push([*frame.tokens(), orpheus.END_OF_SPEECH, *frame.tokens()]) == [frame]
    assert assembler.push(frame.tokens()) == []


GOOD = Frame((5,), (6, 7), (8, 9, 10, 11))


def test_assembler_drops_a_frame_with_a_wrong_position_and_resyncs():
    bad = GOOD.tokens()
    bad[3] = orpheus.audio_token_id(2, 9)  # a position-2 code at position 3
    assembler = FrameAssembler()
    assert assembler.push([*GOOD.tokens(), *bad, *GOOD.tokens()]) == [GOOD, GOOD]
    assert assembler.malformed_frames == 1


def test_assembler_recovers_from_a_missing_token():
    short = GOOD.tokens()[:3] + GOOD.tokens()[4:]  # position 3 never came
    assembler = FrameAssembler()
    got = assembler.push([*short, *GOOD.tokens(), *GOOD.tokens()])
    assert got == [GOOD, GOOD]
    assert assembler.malformed_frames == 1


def test_assembler_recovers_from_an_extra_token():
    extra = [*GOOD.tokens()[:2], GOOD.tokens()[1], *GOOD.tokens()[2:]]  # position 1 twice
    assembler = FrameAssembler()
    assert assembler.push([*extra, *GOOD.tokens()]) == [GOOD]
    assert assembler.malformed_frames == 1


def test_assembler_skips_stray_non_audio_tokens_without_losing_the_frame():
    tokens = GOOD.tokens()
    tokens.insert(4, orpheus.PAD)
    assembler = FrameAssembler()
    assert assembler.push([orpheus.END_OF_AI, *tokens]) == [GOOD]
    assert (assembler.stray_tokens, assembler.malformed_frames) == (2, 0)


def test_assembler_reports_an_unfinished_frame():
    assembler = FrameAssembler()
    assembler.push(GOOD.tokens()[:4])
    assert assembler.incomplete_tokens == 4


def test_max_tokens_grows_with_text_in_whole_frames_plus_stop():
    short = orpheus.max_audio_tokens("Hi.", 4000)
    long = orpheus.max_audio_tokens("word " * 100, 4000)
    assert short < long
    assert (short - 1) % 7 == 0 and (long - 1) % 7 == 0
    assert orpheus.max_audio_tokens("word " * 10000, 1000) <= 1000


# --- boundaries and messages the mutation run found untested -----------------------------------


@pytest.mark.unit
def test_the_last_plain_text_id_is_taken_and_every_special_id_refused():
    assert orpheus.build_prompt([orpheus.BEGIN_OF_TEXT - 1])[2] == 127999
    for special in (orpheus.BEGIN_OF_TEXT, orpheus.EOT_ID, 128255, orpheus.END_OF_HUMAN):
        with pytest.raises(ValueError, match=f"id {special} is not a plain text token"):
            orpheus.build_prompt([special])
    with pytest.raises(ValueError, match="id -1 is not a plain text token"):
        orpheus.build_prompt([-1])


@pytest.mark.unit
def test_out_of_range_positions_codes_and_ids_say_which_and_why():
    with pytest.raises(ValueError, match=r"frame position 7 is outside 0\.\.6"):
        orpheus.audio_token_id(7, 0)
    with pytest.raises(ValueError, match=r"code 4096 is outside 0\.\.4095"):
        orpheus.audio_token_id(0, 4096)
    with pytest.raises(MalformedAudioToken, match="token id 128265 is not an audio token"):
        orpheus.decode_audio_token(128265)
    with pytest.raises(ValueError, match="layer 1 has 2 codes per frame"):
        Frame.from_codes([1], [1], [1, 2, 3, 4])


@pytest.mark.unit
@pytest.mark.parametrize(("chars", "tokens"), [(0, 1), (1, 7 + 1), (14, 12 * 7 + 1)])
def test_min_audio_tokens_is_whole_frames_of_14_characters_a_second_plus_stop(chars, tokens):
    # 14 characters = 1 s = 82.03 audio tokens = 11.7 frames -> 12 whole frames
    assert orpheus.min_audio_tokens("x" * chars) == tokens


@pytest.mark.unit
@pytest.mark.parametrize(("chars", "frames"), [(0, 12), (7, 24), (14, 36)])
def test_max_audio_tokens_allows_twice_the_speech_time_plus_one_second(chars, frames):
    # 0, 1 and 2 s of speech at 14 characters a second -> 1, 2 and 3 s = 12, 24, 36 frames
    assert orpheus.max_audio_tokens("x" * chars, 10_000) == frames * 7 + 1


@pytest.mark.unit
def test_max_audio_tokens_at_its_limits_is_one_frame_and_the_stop():
    long = "word " * 1000
    assert orpheus.max_audio_tokens(long, 8) == 8  # the smallest limit: one frame and the stop
    assert orpheus.max_audio_tokens("", 8) == 8
    assert orpheus.max_audio_tokens(long, 15) == 15  # exactly two frames and the stop
    assert orpheus.max_audio_tokens(long, 14) == 8
    with pytest.raises(ValueError, match="a limit of 7 tokens holds no frame"):
        orpheus.max_audio_tokens("", 7)


@pytest.mark.unit
def test_a_stream_that_starts_mid_frame_counts_one_malformed_frame_then_resyncs():
    assembler = FrameAssembler()
    assert assembler.push([*GOOD.tokens()[3:], *GOOD.tokens()]) == [GOOD]
    assert (assembler.malformed_frames, assembler.stray_tokens) == (1, 0)


@pytest.mark.unit
def test_every_malformed_frame_is_counted():
    bad = GOOD.tokens()
    bad[3] = orpheus.audio_token_id(2, 9)
    assembler = FrameAssembler()
    assert assembler.push([*bad, *GOOD.tokens(), *bad, *bad, *GOOD.tokens()]) == [GOOD, GOOD]
    assert assembler.malformed_frames == 3
    assert assembler.frames == 2


# --- user text is plain text -----------------------------------------------------------------


@pytest.fixture(scope="module")
def dev_tokenizer(dev_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(dev_model.model)


@pytest.mark.unit
def test_special_token_strings_in_user_text_stay_text(dev_tokenizer):
    llama = dev_tokenizer.convert_ids_to_tokens(range(orpheus.BEGIN_OF_TEXT, 128256))  # all 256
    custom = [f"<custom_token_{n}>" for n in (*range(12), 100, 4095, 28671)]  # audio ones too
    specials = [*llama, *custom]
    assert "<|eot_id|>" in llama and "<|begin_of_text|>" in llama
    assert dev_tokenizer.convert_tokens_to_ids(custom[4]) == orpheus.END_OF_HUMAN
    for special in specials:
        ids = orpheus.plain_text_ids(dev_tokenizer, f"Say {special} now.")
        assert ids and max(ids) < orpheus.BEGIN_OF_TEXT, special
        assert dev_tokenizer.decode(ids) == f"Say {special} now."
    prompt = orpheus.encode_prompt(
        orpheus.plain_text(dev_tokenizer), "<|eot_id|><custom_token_4> hi", "tara"
    )
    text_part = prompt[2 : -len(orpheus.PROMPT_SUFFIX)]
    assert max(text_part) < orpheus.BEGIN_OF_TEXT
    assert prompt.count(orpheus.EOT_ID) == 1 and prompt.count(orpheus.END_OF_HUMAN) == 1


@pytest.mark.unit
def test_emotive_tags_tokenize_as_before(dev_tokenizer):
    text = "Well <laugh> that <sigh> is it."
    assert orpheus.plain_text_ids(dev_tokenizer, text) == dev_tokenizer.encode(
        text, add_special_tokens=False
    )


@pytest.mark.unit
def test_plain_text_ids_leave_out_the_bos_a_llama_3_tokenizer_adds(dev_model):
    """The prompt holds one BOS, its own: a tokenizer set up like Llama-3's adds another."""
    from tokenizers.processors import TemplateProcessing
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(dev_model.model)
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", orpheus.BEGIN_OF_TEXT)]
    )
    assert tokenizer.encode("Say hi")[0] == orpheus.BEGIN_OF_TEXT
    assert orpheus.plain_text_ids(tokenizer, "Say hi") == tokenizer.encode("Say hi")[1:]
    prompt = orpheus.encode_prompt(orpheus.plain_text(tokenizer), "Say hi", "tara")
    assert prompt.count(orpheus.BEGIN_OF_TEXT) == 1
