"""Run one clone job in its own process: ``python -m lora_training.worker JOB_DIR``.

The server writes ``JOB_DIR/spec.json``; this process trains, reports into ``progress.json``
(written atomically; from the end of prepare on it carries the data report, ``data``) and, if it
fails, leaves the reason in ``error.txt``. Training never
shares a process with the engine, so it cannot stall live streams.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import sys
import time
from pathlib import Path

from lora_training.recipe import job_from_json, train_voice
from voicehost.ids import now_iso
from voicehost.lifeline import die_with_parent

PROGRESS = "progress.json"
ERROR = "error.txt"
SPEC = "spec.json"
LOCK_WAIT_SECONDS = 60.0


def write_progress(
    job_dir: Path,
    stage: str,
    fraction: float,
    eval_loss: list[float],
    data: dict[str, object] | None = None,
) -> None:
    state = {"stage": stage, "progress": round(fraction, 4), "eval_loss": eval_loss}
    state["updated"] = now_iso()
    if data is not None:
        state["data"] = data
    tmp = job_dir / f"{PROGRESS}.tmp"
    tmp.write_text(json.dumps(state))
    tmp.replace(job_dir / PROGRESS)


class ProgressFile:
    """``train_voice``'s report, written to ``progress.json``; the data report, once heard, is
    kept in every later write."""

    def __init__(self, job_dir: Path) -> None:
        self.job_dir = job_dir
        self.data: dict[str, object] | None = None

    def __call__(
        self,
        stage: str,
        fraction: float,
        eval_loss: list[float],
        data: dict[str, object] | None = None,
    ) -> None:
        self.data = data if data is not None else self.data
        write_progress(self.job_dir, stage, fraction, eval_loss, self.data)


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    die_with_parent()  # a serving process killed outright takes its training with it
    job_dir = Path(argv[0])
    os.nice(10)  # live streams in the serving process come first
    lock = (job_dir / "worker.lock").open("w")
    waited = time.monotonic()
    while True:  # a runner that took the job over waits for its lost runner's worker to stop
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() - waited > LOCK_WAIT_SECONDS:
                logging.error("another worker is still running this job")
                return 3
            time.sleep(0.5)
    job = job_from_json(json.loads((job_dir / SPEC).read_text()))
    (job_dir / ERROR).unlink(missing_ok=True)
    try:
        train_voice(job, progress=False, report=ProgressFile(job_dir))
    except Exception as exc:
        logging.exception("clone job failed")
        (job_dir / ERROR).write_text(f"{type(exc).__name__}: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
