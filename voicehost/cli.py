"""The ``voicehost`` command: serve, dev-model, say."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from voicehost.config import Settings


def _settings(args: argparse.Namespace) -> Settings:
    """Settings from the environment, overridden by the flags that were given."""
    overrides = {
        key: value
        for key, value in {
            "dev": args.dev or None,
            "model": args.model,
            "codec": args.codec,
            "adapters_dir": args.adapters,
            "host": args.host,
            "port": args.port,
        }.items()
        if value is not None
    }
    return Settings(**overrides)


def cmd_serve(args: argparse.Namespace) -> int:
    from voicehost.api.server import serve

    settings = _settings(args)
    if not settings.dev and not settings.model:
        print("voicehost serve: pass --model (or VOICEHOST_MODEL) or --dev", file=sys.stderr)
        return 2
    serve(settings)
    return 0


def cmd_dev_model(args: argparse.Namespace) -> int:
    from voicehost.devmodel import DEV_SEED, ensure_dev_model, fingerprint

    out = args.out or Settings().dev_dir
    paths = ensure_dev_model(out, args.seed if args.seed is not None else DEV_SEED)
    print(f"dev model in {paths.root} (weights {fingerprint(paths)})")
    return 0


def cmd_say(args: argparse.Namespace) -> int:
    import aiohttp

    from voicehost.client import download_speech

    async def run() -> None:
        async with aiohttp.ClientSession() as session:
            result = await download_speech(
                session, args.url, args.text, args.voice, args.output, args.format, args.seed
            )
        print(
            f"{args.output}: {result.bytes} bytes, first audio after "
            f"{result.first_byte_seconds * 1000:.0f} ms, done in {result.total_seconds:.2f} s"
        )

    try:
        asyncio.run(run())
    except (RuntimeError, OSError) as exc:
        print(f"voicehost say: {exc}", file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="voicehost", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the speech API")
    serve.add_argument("--dev", action="store_true", help="serve the tiny dev model")
    serve.add_argument("--model", help="Orpheus weights (path or hub id)")
    serve.add_argument("--codec", help="SNAC 24 kHz (path or hub id)")
    serve.add_argument("--adapters", type=Path, help="voice adapters folder")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.set_defaults(func=cmd_serve)

    dev = commands.add_parser("dev-model", help="build the dev model (cached)")
    dev.add_argument("--out", type=Path, help="where to build it (default: the dev_dir setting)")
    dev.add_argument("--seed", type=int)
    dev.set_defaults(func=cmd_dev_model)

    say = commands.add_parser("say", help="speak text into a file through a running server")
    say.add_argument("text")
    say.add_argument("--voice", required=True)
    say.add_argument("-o", "--output", type=Path, required=True)
    say.add_argument("--url", default="http://127.0.0.1:8080")
    say.add_argument("--format", default="wav", choices=["wav", "pcm"])
    say.add_argument("--seed", type=int)
    say.set_defaults(func=cmd_say)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
