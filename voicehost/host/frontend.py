"""A front end's place in its host: its client of the shared engine core, and the host's
folder, where the host keeps what its front ends share (the files named here, the channel's
sockets)."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from voicehost.host.board import HostBoard
from voicehost.host.channel import HostChannel
from voicehost.host.lora_ids import HostLoraIds

# in the host's folder
BOARD_FILE = "streams"  # the host's stream counts: its ``HostBoard``
LORA_IDS_FILE = "lora-ids"  # the host's LoRA numbering: ``HostLoraIds``
METRICS_DIR = "metrics"  # each front end's metrics, summed by any of them (Prometheus)
DRAINING_FILE = "draining"  # there once any front end of the host has been drained
DRAIN_TOPIC = "host.drain"  # on the host's channel: a front end drained tells the others
CORE_LOST_SIGNAL = signal.SIGUSR1  # from the host to its front ends: the engine core died


@dataclass(frozen=True)
class CoreClient:
    """A front end's place at the engine core it shares (a ``model.engine.SharedCore``):
    vLLM's client addresses of client ``index`` (the core's input and output sockets, as
    ``bind_engine_zmq_listeners`` made them), ``count`` clients in all, and the file that
    numbers LoRA adapters for all of them (the core knows an adapter by its id alone)."""

    addresses: dict[str, Any]
    index: int
    count: int
    lora_file: Path  # the host's LoRA numbering (``voicehost.host.lora_ids``)

    def lora_ids(self) -> HostLoraIds:
        return HostLoraIds(self.lora_file)


@dataclass(frozen=True)
class FrontEnd:
    """This process's place among one host's front ends (``voicehost.host``): its client of
    the shared engine core, and the host's folder, where each front end marks itself ready
    (a file named by its index, there while it can take streams) beside the host's stream
    counts (``BOARD_FILE``) and the sockets of its channel."""

    client: CoreClient
    ready_dir: Path

    def board(self, capacity: int) -> HostBoard:
        """This front end's row of the host's stream counts (the host made the file)."""
        path = self.ready_dir / BOARD_FILE
        return HostBoard(path, self.client.count, self.client.index, capacity)

    def channel(self) -> HostChannel:
        """This front end's end of the host's channel (not listening until opened)."""
        return HostChannel(self.ready_dir, self.client.index, self.client.count)

    def drain_host(self) -> None:
        """Leave the host's drain flag: a front end that opens its end of the host's channel
        after a drain was told over it drains at once."""
        (self.ready_dir / DRAINING_FILE).touch()

    def host_draining(self) -> bool:
        return (self.ready_dir / DRAINING_FILE).exists()

    def mark(self, ready: bool) -> None:
        flag = self.ready_dir / str(self.client.index)
        if ready:
            flag.touch()
        else:
            flag.unlink(missing_ok=True)

    def not_ready(self) -> list[int]:
        """The front ends of the host that cannot take streams now (this one included)."""
        return [i for i in range(self.client.count) if not (self.ready_dir / str(i)).exists()]
