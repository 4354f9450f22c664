"""The Orpheus token format: special ids, the inference prompt, audio tokens and SNAC frames.

This is the only module that knows the layout (see shared ORPHEUS.md); everything else imports it.
One frame is 7 audio tokens = 1 code of SNAC layer 0, 2 of layer 1 and 4 of layer 2 = 2048 samples.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Protocol

from voicehost.text.stage import speech_length

TEXT_VOCAB_SIZE = 128256
VOCAB_SIZE = 156940
BEGIN_OF_TEXT = 128000
EOT_ID = 128009
CUSTOM_TOKEN_BASE = 128256
START_OF_SPEECH = 128257
END_OF_SPEECH = 128258  # the stop token
START_OF_HUMAN = 128259
END_OF_HUMAN = 128260
START_OF_AI = 128261
END_OF_AI = 128262
PAD = 128263
AUDIO_TOKEN_BASE = 128266

CODEBOOK_SIZE = 4096
TOKENS_PER_FRAME = 7
SAMPLE_RATE = 24000
SAMPLES_PER_FRAME = 2048
AUDIO_TOKENS_PER_SECOND = TOKENS_PER_FRAME * SAMPLE_RATE / SAMPLES_PER_FRAME  # 82.03
FRAME_SECONDS = SAMPLES_PER_FRAME / SAMPLE_RATE  # 85.33 ms of audio per frame

# Position k in a frame -> (SNAC layer, index of the code within the frame's codes of that layer).
FRAME_LAYOUT: tuple[tuple[int, int], ...] = (
    (0, 0),
    (1, 0),
    (2, 0),
    (2, 1),
    (1, 1),
    (2, 2),
    (2, 3),
)
CODES_PER_LAYER = (1, 2, 4)


def _layer_positions(layer: int) -> tuple[int, ...]:
    """The frame positions that hold ``layer``'s codes, in the layer's order."""
    at = {index: position for position, (lv, index) in enumerate(FRAME_LAYOUT) if lv == layer}
    return tuple(at[index] for index in range(CODES_PER_LAYER[layer]))


# A frame's codes in token order -> layer 1's and layer 2's codes (``FrameAssembler``'s hot path).
(_L0_POSITION,) = _layer_positions(0)
_L1_CODES = itemgetter(*_layer_positions(1))
_L2_CODES = itemgetter(*_layer_positions(2))

PROMPT_SUFFIX = (EOT_ID, END_OF_HUMAN, START_OF_AI, START_OF_SPEECH)


class MalformedAudioToken(ValueError):
    """A token that is not the audio token the frame layout expects at its position."""


def prompt_text(text: str, voice: str | None) -> str:
    """The text part of the prompt: ``"{voice}: {text}"``, or the bare text without a voice name."""
    return f"{voice}: {text}" if voice else text


class Tokenizer(Protocol):
    """The part of a Hugging Face tokenizer this module uses."""

    def encode(self, text: str, **options: Any) -> list[int]: ...


def plain_text_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    """``text`` tokenized as plain text: a special token's spelling in it (``<|eot_id|>``,
    ``<custom_token_4>``) stays text, so user text cannot inject prompt structure (a Hugging Face
    tokenizer turns them into their ids unless told to split them). Emotive tags are plain text."""
    return tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)


def plain_text(tokenizer: Tokenizer) -> Callable[[str], list[int]]:
    """``plain_text_ids`` with ``tokenizer``: the ``tokenize`` of ``encode_prompt``."""
    return lambda text: plain_text_ids(tokenizer, text)


def build_prompt(text_token_ids: Sequence[int]) -> list[int]:
    """The inference prompt around already tokenised text: no special id (BOS, eot, custom
    tokens) in ``text_token_ids``, only the Llama-3 text vocabulary below 128000."""
    for token_id in text_token_ids:
        if not 0 <= token_id < BEGIN_OF_TEXT:
            raise ValueError(f"text token id {token_id} is not a plain text token")
    return [START_OF_HUMAN, BEGIN_OF_TEXT, *text_token_ids, *PROMPT_SUFFIX]


def encode_prompt(
    tokenize: Callable[[str], list[int]],
    text: str,
    voice: str | None,
    context: tuple[str, Sequence[Frame]] | None = None,
) -> list[int]:
    """Token ids of the prompt for ``text`` spoken by ``voice`` (``None``: no voice prefix).

    ``context``: an earlier turn (its text and the frames spoken for it) placed before the
    prompt as a finished exchange, so the new speech continues its voice and pace.
    """
    prompt = build_prompt(tokenize(prompt_text(text, voice)))
    if context is None or not context[1]:
        return prompt
    context_text, frames = context
    return [*training_sequence(tokenize(prompt_text(context_text, voice)), frames), *prompt]


def audio_token_id(position: int, code: int) -> int:
    """The token id of ``code`` at ``position`` (0..6) in a frame."""
    if not 0 <= position < TOKENS_PER_FRAME:
        raise ValueError(f"frame position {position} is outside 0..6")
    if not 0 <= code < CODEBOOK_SIZE:
        raise ValueError(f"code {code} is outside 0..4095")
    return AUDIO_TOKEN_BASE + position * CODEBOOK_SIZE + code


def decode_audio_token(token_id: int) -> tuple[int, int]:
    """(position, code) of an audio token id; raises ``MalformedAudioToken`` for any other id."""
    offset = token_id - AUDIO_TOKEN_BASE
    if not 0 <= offset < TOKENS_PER_FRAME * CODEBOOK_SIZE:
        raise MalformedAudioToken(f"token id {token_id} is not an audio token")
    return divmod(offset, CODEBOOK_SIZE)


def code_at(token_id: int, position: int) -> int:
    """The code carried by ``token_id`` at frame ``position``; raises if it belongs elsewhere."""
    token_position, code = decode_audio_token(token_id)
    if token_position != position:
        raise MalformedAudioToken(
            f"token id {token_id} carries a position-{token_position} code at position {position}"
        )
    return code


@dataclass(frozen=True, slots=True)
class Frame:
    """The SNAC codes of one frame: 1 code of layer 0, 2 of layer 1, 4 of layer 2."""

    l0: tuple[int]
    l1: tuple[int, int]
    l2: tuple[int, int, int, int]

    @classmethod
    def from_tokens(cls, token_ids: Sequence[int]) -> Frame:
        """Parse 7 audio tokens; raises ``MalformedAudioToken`` on a wrong count, id or position."""
        if len(token_ids) != TOKENS_PER_FRAME:
            raise MalformedAudioToken(f"a frame has 7 tokens, got {len(token_ids)}")
        layers: tuple[list[int], list[int], list[int]] = ([0], [0, 0], [0, 0, 0, 0])
        for position, token_id in enumerate(token_ids):
            layer, index = FRAME_LAYOUT[position]
            layers[layer][index] = code_at(token_id, position)
        l0, l1, l2 = layers
        return cls((l0[0],), (l1[0], l1[1]), (l2[0], l2[1], l2[2], l2[3]))

    @classmethod
    def from_codes(cls, l0: Sequence[int], l1: Sequence[int], l2: Sequence[int]) -> Frame:
        """A frame from its codes per layer; raises ``ValueError`` on a wrong count or range."""
        for layer, codes in enumerate((l0, l1, l2)):
            if len(codes) != CODES_PER_LAYER[layer]:
                raise ValueError(f"layer {layer} has {CODES_PER_LAYER[layer]} codes per frame")
            for code in codes:
                if not 0 <= code < CODEBOOK_SIZE:
                    raise ValueError(f"code {code} is outside 0..4095")
        return cls((l0[0],), (l1[0], l1[1]), (l2[0], l2[1], l2[2], l2[3]))

    def tokens(self) -> list[int]:
        """The 7 audio token ids of this frame, in Orpheus order."""
        layers = (self.l0, self.l1, self.l2)
        return [
            audio_token_id(position, layers[layer][index])
            for position, (layer, index) in enumerate(FRAME_LAYOUT)
        ]


def frames_to_codes(frames: Sequence[Frame]) -> tuple[list[int], list[int], list[int]]:
    """The three SNAC code layers of consecutive frames (lengths n, 2n, 4n)."""
    l0: list[int] = []
    l1: list[int] = []
    l2: list[int] = []
    for frame in frames:
        l0.extend(frame.l0)
        l1.extend(frame.l1)
        l2.extend(frame.l2)
    return l0, l1, l2


def codes_to_frames(l0: Sequence[int], l1: Sequence[int], l2: Sequence[int]) -> list[Frame]:
    """Split SNAC code layers (lengths n, 2n, 4n) back into frames."""
    n = len(l0)
    if len(l1) != 2 * n or len(l2) != 4 * n:
        raise ValueError(f"code layers of lengths {n}, {len(l1)}, {len(l2)} are not n, 2n, 4n")
    return [
        Frame.from_codes(l0[i : i + 1], l1[2 * i : 2 * i + 2], l2[4 * i : 4 * i + 4])
        for i in range(n)
    ]


def training_sequence(text_token_ids: Sequence[int], frames: Sequence[Frame]) -> list[int]:
    """A fine-tuning sequence: the prompt, the frames' audio tokens, end of speech, end of AI."""
    audio = [token for frame in frames for token in frame.tokens()]
    return [*build_prompt(text_token_ids), *audio, END_OF_SPEECH, END_OF_AI]


CHARACTERS_PER_SECOND = 14.0  # typical speech rate


def min_audio_tokens(text: str) -> int:
    """Audio tokens that saying ``text`` at a typical pace takes, plus the stop token (its
    length counted in letters of speech: a Han character is a syllable)."""
    seconds = speech_length(text) / CHARACTERS_PER_SECOND
    return math.ceil(seconds * AUDIO_TOKENS_PER_SECOND / TOKENS_PER_FRAME) * TOKENS_PER_FRAME + 1


def max_audio_tokens(text: str, limit: int) -> int:
    """A ``max_tokens`` for ``text``: whole frames of generous speech time plus the stop token.

    Speech runs at about 14 characters per second (letters of speech: ``speech_length``, so a
    Chinese or Korean segment gets its syllables' time); allow twice that time plus one second, but
    never more than ``limit`` tokens: ``ValueError`` if not even one frame and the stop fit.
    """
    if limit < TOKENS_PER_FRAME + 1:
        raise ValueError(f"a limit of {limit} tokens holds no frame and the stop token")
    seconds = 1.0 + 2.0 * speech_length(text) / CHARACTERS_PER_SECOND
    frames = math.ceil(seconds * AUDIO_TOKENS_PER_SECOND / TOKENS_PER_FRAME)
    frames = max(1, min(frames, (limit - 1) // TOKENS_PER_FRAME))
    return frames * TOKENS_PER_FRAME + 1


class FrameAssembler:
    """Groups a stream of generated token ids into frames, in order, keeping every code.

    Each audio token carries its frame position, so a stream that goes wrong recovers: a token
    at the wrong position drops the frame in progress (counted in ``malformed_frames``) and
    assembly resumes at the next position-0 token. Non-audio tokens are skipped (counted in
    ``stray_tokens``). The stop token ends the stream; tokens after it are ignored.
    """

    def __init__(self) -> None:
        self.pending: list[int] = []  # codes of the frame in progress, in token order
        self.frames = 0
        self.malformed_frames = 0
        self.stray_tokens = 0
        self.stopped = False
        self._resyncing = False

    def push(self, token_ids: Sequence[int]) -> list[Frame]:
        """Add new token ids; returns the frames they complete."""
        frames: list[Frame] = []
        pending = self.pending
        for token_id in token_ids:
            if token_id == END_OF_SPEECH:
                self.stopped = True
            if self.stopped:
                break
            offset = token_id - AUDIO_TOKEN_BASE  # decode_audio_token, inline: once per token
            if not 0 <= offset < TOKENS_PER_FRAME * CODEBOOK_SIZE:
                self.stray_tokens += 1
                continue
            position, code = divmod(offset, CODEBOOK_SIZE)
            if position != len(pending):
                if not self._resyncing:
                    self.malformed_frames += 1
                pending.clear()
                self._resyncing = position != 0
                if self._resyncing:
                    continue
            self._resyncing = False
            pending.append(code)
            if len(pending) == TOKENS_PER_FRAME:
                frames.append(
                    Frame((pending[_L0_POSITION],), _L1_CODES(pending), _L2_CODES(pending))
                )
                pending.clear()
        self.frames += len(frames)
        return frames

    @property
    def incomplete_tokens(self) -> int:
        """Tokens of a frame the stream never finished (dropped at the end)."""
        return len(self.pending)


# SNAC 24 kHz (hubertsiuzdak/snac_24khz), the codec Orpheus was trained on; ORPHEUS.md.
SNAC_24KHZ_CONFIG: dict[str, object] = {
    "sampling_rate": SAMPLE_RATE,
    "encoder_dim": 48,
    "encoder_rates": [2, 4, 8, 8],
    "decoder_dim": 1024,
    "decoder_rates": [8, 8, 4, 2],
    "attn_window_size": None,
    "codebook_size": CODEBOOK_SIZE,
    "codebook_dim": 8,
    "vq_strides": [4, 2, 1],
    "noise": True,
    "depthwise": True,
}
