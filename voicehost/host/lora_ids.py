"""LoRA ids for a whole host: one engine core, several front ends.

vLLM's engine core knows an adapter by its ``lora_int_id`` alone: a request naming an id the
core has loaded is served with the weights loaded under it, whichever client sent it. Each
front end of a host (``voicehost serve --frontends N``) must therefore give a voice version the
id every other front end gives it, and never give one voice's id to another: another tenant's
voice would be spoken with the first one's weights. ``HostLoraIds`` numbers voice versions in a
table shared by the host's front ends (``voicehost.host.hostfile``): a voice version's 128-bit hash
in row ``id - 1``, found or claimed under the host's lock. One serving process alone numbers
them itself (``voicehost.model.engine.SpeechEngine``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from voicehost.host import hostfile

CAPACITY = 1 << 20  # voice versions one host numbers in its life (8 MB of file, mostly sparse)


class HostLoraIds:
    """The host's numbering in the file at ``path`` (made by ``create`` before the front ends
    start)."""

    def __init__(self, path: Path, capacity: int = CAPACITY) -> None:
        self._shared = hostfile.SharedTable(path, capacity, 2)

    @staticmethod
    def create(path: Path, capacity: int = CAPACITY) -> None:
        hostfile.create(path, capacity, 2)

    def id_of(self, voice_id: str, checksum: str | None) -> int:
        """The LoRA id of this version of ``voice_id`` on this host (from 1 up)."""
        name = f"{voice_id}\0{checksum or ''}"
        key = (hostfile.hash63(name, b"lora-id-1"), hostfile.hash63(name, b"lora-id-2"))
        table = self._shared.table
        with self._shared.locked():
            found = np.flatnonzero((table[:, 0] == key[0]) & (table[:, 1] == key[1]))
            if len(found):
                return int(found[0]) + 1
            free = np.flatnonzero(table[:, 0] == 0)
            if not len(free):
                raise RuntimeError(
                    f"this host has numbered {len(table)} voice versions: restart it"
                )
            table[free[0]] = key
            return int(free[0]) + 1

    def close(self) -> None:
        self._shared.close()
