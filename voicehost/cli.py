"""The ``voicehost`` command: serve, worker, gateway, drain, keys, dev-model, say, normalize,
doctor, bench, train, check-data, eval, audit."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from lora_training.quality import add_arguments as add_check_data_arguments
from voicehost.config import Settings
from voicehost.tenancy.audit import Head
from voicehost.tools.bench import DESCRIPTION as BENCH_DESCRIPTION
from voicehost.tools.bench import add_arguments as add_bench_arguments

if TYPE_CHECKING:
    from voicehost.tenancy.lexicons import LexiconLimits
    from voicehost.text.lexicon import LexiconEntry


def _frontends(value: str | None) -> int | str | None:
    return int(value) if value is not None and value.isdigit() else value


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
            "redis_url": getattr(args, "redis", None),
            "worker_id": getattr(args, "worker_id", None),
            "advertise_url": getattr(args, "advertise_url", None),
            "frontends": _frontends(getattr(args, "frontends", None)),
        }.items()
        if value is not None
    }
    return Settings(**overrides)


def _run_server(
    command: Literal["serve", "worker", "gateway"], settings: Settings, start: Callable[[], None]
) -> int:
    """Run a server; segments that cannot fit the model's context or a key configuration it
    cannot use stop it with a clear message, read first: before the engine's imports, the dev
    model and the engine core (seconds to tens of seconds) are spent on a server that cannot
    start."""
    from voicehost.api.auth import Authenticator
    from voicehost.model.served import check_segments_fit
    from voicehost.tenancy.keys import AuthConfigError

    try:
        check_segments_fit(settings)
    except ValueError as exc:
        print(f"voicehost {command}: {exc}", file=sys.stderr)
        return 2
    try:
        Authenticator.from_settings(settings, command)
        start()
    except AuthConfigError as exc:
        print(f"voicehost {command}: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    settings = _settings(args)
    if not settings.dev and not settings.model:
        print("voicehost serve: pass --model (or VOICEHOST_MODEL) or --dev", file=sys.stderr)
        return 2

    def start() -> None:
        from voicehost.api.server import serve

        serve(settings)

    return _run_server("serve", settings, start)


def cmd_worker(args: argparse.Namespace) -> int:
    settings = _settings(args)
    if not settings.dev and not settings.model:
        print("voicehost worker: pass --model (or VOICEHOST_MODEL) or --dev", file=sys.stderr)
        return 2
    if not settings.redis_url:
        print("voicehost worker: pass --redis (or VOICEHOST_REDIS_URL)", file=sys.stderr)
        return 2

    def start() -> None:
        from voicehost.cluster.worker import serve_worker

        serve_worker(settings)

    return _run_server("worker", settings, start)


def cmd_gateway(args: argparse.Namespace) -> int:
    settings = _settings(args)
    if not settings.redis_url:
        print("voicehost gateway: pass --redis (or VOICEHOST_REDIS_URL)", file=sys.stderr)
        return 2
    if not settings.dev and not settings.model:
        # Adapters are checked against the model's name and shape; clone jobs train on it.
        print(
            "voicehost gateway: pass the workers' --model (or VOICEHOST_MODEL) or --dev",
            file=sys.stderr,
        )
        return 2

    def start() -> None:
        from voicehost.cluster.gateway import serve_gateway

        serve_gateway(settings)

    return _run_server("gateway", settings, start)


def cmd_drain(args: argparse.Namespace) -> int:
    """Tell a local worker to drain, then wait for its streams to finish (a preStop hook)."""
    import json
    import time
    import urllib.request

    from voicehost.api.auth import INTERNAL_TOKEN_HEADER

    token = Settings().internal_token  # the worker's internal routes accept only it
    headers = {INTERNAL_TOKEN_HEADER: token.get_secret_value()} if token else {}

    def call(method: str, path: str) -> dict:
        request = urllib.request.Request(f"{args.url}{path}", method=method, headers=headers)
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.loads(response.read())

    deadline = time.monotonic() + args.timeout
    try:
        state = call("POST", "/internal/drain")
        while state["active_streams"] > 0 and time.monotonic() < deadline:
            time.sleep(0.5)
            state = call("GET", "/internal/load")
    except OSError as exc:
        print(f"voicehost drain: {exc}", file=sys.stderr)
        return 1
    print(f"drained: {state['active_streams']} streams still in flight")
    return 0 if state["active_streams"] == 0 else 1


def cmd_keys_new(args: argparse.Namespace) -> int:
    """Make a key: the key itself (shown once) and the entry to configure (its hash only)."""
    import json

    from voicehost.tenancy.keys import ApiKey, hash_key, new_key

    key = new_key()
    try:
        entry = ApiKey(
            id=args.id, tenant=args.tenant, scopes=args.scopes.split(","), sha256=hash_key(key)
        )
    except ValueError as exc:
        print(f"voicehost keys new: {exc}", file=sys.stderr)
        return 2
    print(f"key (give it to the client; it is not stored anywhere): {key}", file=sys.stderr)
    print(json.dumps(entry.model_dump()))
    return 0


def cmd_keys_hash(args: argparse.Namespace) -> int:
    """The SHA-256 of a key read from stdin (not from the command line: shell history)."""
    from voicehost.tenancy.keys import hash_key

    key = sys.stdin.readline().strip()
    if not key:
        print("voicehost keys hash: give the key on stdin", file=sys.stderr)
        return 2
    print(hash_key(key))
    return 0


def language_tag(value: str) -> str:
    """A BCP-47 tag as a command line takes one (``fr``, ``pt-BR``)."""
    from voicehost.config import LANGUAGE_TAG

    if not LANGUAGE_TAG.fullmatch(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a language tag (en, fr, pt-BR, zh)")
    return value


def cmd_dev_model(args: argparse.Namespace) -> int:
    from voicehost.model.devmodel import DEV_SEED, dev_voices, ensure_dev_model, fingerprint

    out = args.out or Settings().dev_dir
    paths = ensure_dev_model(out, args.seed if args.seed is not None else DEV_SEED, args.language)
    print(f"dev model in {paths.root} (weights {fingerprint(paths)})")
    if args.language is not None:
        print(f"it speaks {args.language}: voices {', '.join(dev_voices(args.language))}")
    return 0


def cmd_say(args: argparse.Namespace) -> int:
    from aiohttp import ClientError

    from voicehost.client import ApiError, Client

    options = {"seed": args.seed, "speed": args.speed, "sample_rate": args.sample_rate}
    try:
        with Client(args.url, args.api_key) as client:
            result = client.speak_to_file(
                args.text, args.voice, args.output, response_format=args.format, **options
            )
    except (ApiError, ClientError, ValueError, OSError) as exc:
        print(f"voicehost say: {exc}", file=sys.stderr)
        return 1
    print(
        f"{result.path}: {result.bytes} bytes of {result.response_format}, first audio after "
        f"{result.first_byte_seconds * 1000:.0f} ms, done in {result.total_seconds:.2f} s"
    )
    return 0


def cmd_normalize(args: argparse.Namespace) -> int:
    """The segments the engine would get for a text, one a line, through the speech path's text
    stage (its settings, the language's rules, the lexicon)."""
    from voicehost.errors import ServiceError
    from voicehost.tenancy.lexicons import LexiconLimits
    from voicehost.text.lexicon import Lexicon
    from voicehost.text.stage import TextStage, check_input, has_speech

    settings = Settings()
    lexicon = None
    if args.lexicon is not None:
        try:
            entries = _lexicon_file(args.lexicon, LexiconLimits.from_settings(settings))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"voicehost normalize: {args.lexicon}: {exc}", file=sys.stderr)
            return 2
        lexicon = Lexicon(entries)
    stage = TextStage(lexicon, settings.segment_max_chars, not args.raw, args.language)
    try:
        check_input(args.text, settings.max_input_chars)
        segments = stage.whole(args.text, settings.max_input_chars)
    except ServiceError as exc:
        print(f"voicehost normalize: {exc}", file=sys.stderr)
        return 1
    for segment in segments:
        if not has_speech(segment.speech):
            continue  # the engine is never given a segment with nothing to say
        if args.json:
            said = {"said": segment.speech, "text": segment.text}
            place = {"start": segment.start, "end": segment.end}
            print(json.dumps(said | place, ensure_ascii=False))
        else:
            print(segment.speech.replace("\n", "\\n"))
    return 0


def _lexicon_file(path: Path, limits: LexiconLimits) -> list[LexiconEntry]:
    """A lexicon file's entries, checked as an upload is: W3C PLS (a document starting with
    ``<``) or JSON, ``{"entries": [{"grapheme", "alias", "case_sensitive"}]}``."""
    from voicehost.tenancy.lexicons import checked_entries, parse_pls
    from voicehost.text.lexicon import LexiconEntry

    data = path.read_bytes()
    if data.lstrip()[:1] == b"<":
        return parse_pls(data, limits)[0]
    document = json.loads(data)
    found = document["entries"] if isinstance(document, dict) else document
    entries = (
        LexiconEntry(e["grapheme"], e["alias"], bool(e.get("case_sensitive", False))) for e in found
    )
    return checked_entries(entries, limits)


def cmd_doctor(args: argparse.Namespace) -> int:
    from voicehost.tools import doctor

    overrides = {"dev": args.dev or None, "model": args.model, "codec": args.codec}
    settings = Settings(**{k: v for k, v in overrides.items() if v is not None})
    if not settings.dev and not settings.model:
        print("voicehost doctor: pass --model (or VOICEHOST_MODEL) or --dev", file=sys.stderr)
        return 2
    checks = doctor.local_checks(settings)
    if settings.redis_url:
        checks += doctor.guarded("redis", lambda: asyncio.run(_cluster_checks(settings)))
    if args.url:
        checks += doctor.guarded(
            "server", lambda: asyncio.run(doctor.through_server(args.url, args.voice, args.api_key))
        )
    print(doctor.table(checks))
    if args.json:
        doctor.write_json(checks, args.json)
    failed = [c for c in checks if not c.ok]
    for check in failed:
        print(f"voicehost doctor: {check.name} failed: {check.detail}", file=sys.stderr)
    return 1 if failed else 0


async def _cluster_checks(settings: Settings) -> list:
    """Redis answers, and the workers registered in it (``voicehost doctor`` in cluster mode)."""
    from voicehost.cluster.state import Membership, connect
    from voicehost.tools.doctor import Check

    redis = connect(settings)
    try:
        await redis.ping()
        members = Membership(redis, settings.membership_poll_seconds)
        await members.refresh()
    finally:
        await redis.aclose()
    workers = ", ".join(
        f"{w.worker_id} ({w.load.active_streams}/{w.load.capacity} streams)"
        for w in members.workers.values()
    )
    return [
        Check("redis", True, settings.redis_url or ""),
        Check("workers", bool(members.workers), workers or "no worker is registered"),
    ]


def cmd_bench(args: argparse.Namespace) -> int:
    from voicehost.tools.bench import run

    return run(args)


def cmd_train(args: argparse.Namespace) -> int:
    from lora_training.recipe import NotEnoughSpeech, train_voice
    from lora_training.train import TrainSettings, learning_rate_for
    from lora_training.transcripts import FasterWhisper, MissingTranscripts
    from lora_training.trim import TrimSettings
    from voicehost.cloning.spec import training_spec
    from voicehost.ids import VOICE_ID_PATTERN, is_voice_id
    from voicehost.model.devmodel import ensure_dev_model
    from voicehost.model.served import served_codec, served_languages

    if not is_voice_id(args.voice):
        print(f"voicehost train: --voice must match {VOICE_ID_PATTERN.pattern}", file=sys.stderr)
        return 2
    settings = Settings(dev=args.dev, **({"model": args.base} if args.base else {}))
    if args.dev:
        ensure_dev_model(settings.dev_dir)
    elif not settings.model:
        print("voicehost train: pass --base (or VOICEHOST_MODEL) or --dev", file=sys.stderr)
        return 2
    spoken = served_languages(settings)
    language = args.language or spoken.default
    if not spoken.speaks(language):
        message = f"the base model speaks {', '.join(spoken.languages)}, not {language}"
        print(f"voicehost train: --language: {message}", file=sys.stderr)
        return 2
    job = training_spec(
        settings,
        args.audio,
        args.voice,
        args.out or settings.adapters_dir,
        args.work_dir or settings.dev_dir.parent / "train" / args.voice,
        name=args.name,
        transcripts=args.transcripts,
        codec=args.codec or served_codec(settings),
        prompt_style=args.prompt_style,
        language=language,
        train=TrainSettings(
            epochs=args.epochs,
            rank=args.rank,
            alpha=2 * args.rank,
            learning_rate=args.learning_rate or learning_rate_for(args.dev),
        ),
        trim=TrimSettings(lead_pad_ms=args.lead_pad_ms),
        trim_leading_silence=not args.keep_leading_silence,
        drop_repeated_frames=args.drop_repeated_frames,
        min_speech_seconds=args.min_speech_seconds,
    )
    recognizer = FasterWhisper(args.asr_model) if args.asr_model else None
    try:
        folder = train_voice(job, recognizer)
    except (NotEnoughSpeech, MissingTranscripts) as exc:
        print(f"voicehost train: {exc}", file=sys.stderr)
        return 1
    _record_operator_voice(args.voice, folder, args.out or settings.adapters_dir)
    print(f"voice {args.voice} written to {folder}")
    return 0


def _record_operator_voice(voice_id: str, folder: Path, adapters_dir: Path) -> None:
    """The operator's new voice on the audit log beside its adapters folder."""
    from voicehost.tenancy.audit import OPERATOR, AuditLog, Change

    log_path = Settings(adapters_dir=adapters_dir).audit_file()
    details: dict[str, object] = {"source": "cli", "folder": str(folder)}
    AuditLog(log_path).append([Change("voice.created", OPERATOR, voice=voice_id, details=details)])


def cmd_check_data(args: argparse.Namespace) -> int:
    from lora_training import quality

    return quality.run(args)


def cmd_eval(args: argparse.Namespace) -> int:
    import aiohttp

    from lora_training.ingest import ingest
    from lora_training.transcripts import FasterWhisper
    from voicehost.audio.speaker import shared_embedder
    from voicehost.client import ApiError, AsyncClient, http_speaker
    from voicehost.cloning import evaluation

    recordings, rejected = ingest(args.reference)
    for bad in rejected:
        print(f"voicehost eval: skipping {bad.source}: {bad.reason}", file=sys.stderr)
    if not recordings:
        print("voicehost eval: no usable reference audio", file=sys.stderr)
        return 2
    sentences = list(evaluation.EVAL_SENTENCES)
    if args.sentences is not None:
        sentences = [s.strip() for s in args.sentences.read_text().splitlines() if s.strip()]
        if not sentences:
            print(f"voicehost eval: {args.sentences} holds no sentence", file=sys.stderr)
            return 2
    embedder = shared_embedder(args.embedder or Settings().speaker_embedder)
    recognizer = FasterWhisper(args.asr_model) if args.asr_model else None

    async def run() -> evaluation.EvalReport:
        async with AsyncClient(args.url, args.api_key) as client:
            baseline = args.baseline
            if baseline is None:
                baseline = [v["id"] for v in await client.voices() if v.get("kind") == "builtin"]
            speak = http_speaker(client, args.seed)
            references = [r.samples for r in recordings]
            return await evaluation.evaluate(
                speak, args.voice, references, embedder, sentences, baseline, recognizer
            )

    try:
        report = asyncio.run(run())
    except (ApiError, OSError, aiohttp.ClientError) as exc:
        print(f"voicehost eval: {exc}", file=sys.stderr)
        return 1
    if args.json:
        args.json.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    if args.plot:
        evaluation.plot(report, args.plot)
    print(report.summary())
    return 0


def cmd_audit_verify(args: argparse.Namespace) -> int:
    """Check the audit log's hash chain: a file, or a running server's log over its API (every
    page of ``GET /v1/audit``, which needs an admin key, against the head the server keeps)."""
    from voicehost.tenancy import audit

    if args.url is None:
        path = args.path or Settings(
            **({"adapters_dir": args.adapters} if args.adapters else {})
        ).audit_file(cluster=args.cluster)
        if not path.is_file():
            print(f"voicehost audit verify: no audit log at {path}", file=sys.stderr)
            return 2
        where = str(path)
        result = audit.verify(audit.AuditLog(path).lines())
    else:
        where = args.url
        try:
            events, head = _audit_events(args.url.rstrip("/"), args.api_key)
        except (OSError, ValueError, KeyError) as exc:
            print(f"voicehost audit verify: {exc}", file=sys.stderr)
            return 2
        result = audit.verify_events(events, head)
    if not result.ok:
        print(f"{where}: BROKEN at line {result.broken_at}: {result.reason}")
        print(f"  the {result.lines} lines before it are a whole chain", file=sys.stderr)
        return 1
    print(f"{where}: {result.lines} events, chain whole (head seq {result.head.seq}, ")
    print(f"  sha256 {result.head.hash})")
    return 0


def _audit_events(url: str, api_key: str | None) -> tuple[list[dict], Head]:
    """Every event of a server's audit log, page by page, and the head it reported first."""
    import urllib.request

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    events: list[dict] = []
    head: Head | None = None
    after = 0
    while True:
        request = urllib.request.Request(
            f"{url}/v1/audit?after={after}&limit=1000", headers=headers
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            page = json.loads(response.read())
        if "head" not in page:
            raise ValueError("the server did not give its head: verify needs an admin key")
        head = head or Head(int(page["head"]["seq"]), str(page["head"]["hash"]))
        events += page["events"]
        if page["next_after"] is None:
            return events, head
        after = page["next_after"]


def _cluster_arguments(parser: argparse.ArgumentParser, dev_help: str, model_help: str) -> None:
    parser.add_argument("--dev", action="store_true", help=dev_help)
    parser.add_argument("--model", help=model_help)
    parser.add_argument("--codec", help="SNAC 24 kHz (path or hub id)")
    parser.add_argument("--adapters", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--redis", help="Redis URL, e.g. redis://127.0.0.1:6379/0")
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)


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
    serve.add_argument(
        "--frontends",
        help="serving processes sharing one engine core on the one port (a number, or auto)",
    )
    serve.set_defaults(func=cmd_serve)

    worker = commands.add_parser("worker", help="run a cluster worker (engine + decoder)")
    _cluster_arguments(worker, "serve the tiny dev model", "Orpheus weights (path or hub id)")
    worker.add_argument("--worker-id", help="a stable id (default: host-port)")
    worker.add_argument("--advertise-url", help="URL gateways reach this worker at")
    worker.set_defaults(func=cmd_worker)

    gateway = commands.add_parser("gateway", help="run a cluster gateway (the public API)")
    _cluster_arguments(
        gateway, "the cluster serves the dev model", "the workers' Orpheus weights (clone jobs)"
    )
    gateway.set_defaults(func=cmd_gateway)

    drain = commands.add_parser("drain", help="drain a local worker (for a preStop hook)")
    drain.add_argument("--url", default="http://127.0.0.1:8080")
    drain.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for streams")
    drain.set_defaults(func=cmd_drain)

    keys = commands.add_parser("keys", help="make API keys").add_subparsers(
        dest="keys_command", required=True
    )
    new = keys.add_parser("new", help="a new key, and its entry for VOICEHOST_API_KEYS")
    new.add_argument("--id", required=True, help="the key's name (logs, quotas)")
    new.add_argument("--tenant", required=True, help="whose voices and jobs it reaches")
    new.add_argument(
        "--scopes", default="synthesize,voices", help="comma-separated: synthesize, voices, admin"
    )
    new.set_defaults(func=cmd_keys_new)
    hash_ = keys.add_parser("hash", help="the sha256 of a key given on stdin")
    hash_.set_defaults(func=cmd_keys_hash)

    dev = commands.add_parser("dev-model", help="build the dev model (cached)")
    dev.add_argument("--out", type=Path, help="where to build it (default: the dev_dir setting)")
    dev.add_argument("--seed", type=int)
    dev.add_argument(
        "--language",
        type=language_tag,
        help="the language it speaks, with that language's voice names (default: as built, en)",
    )
    dev.set_defaults(func=cmd_dev_model)

    say = commands.add_parser("say", help="speak text into a file through a running server")
    say.add_argument("text")
    say.add_argument("--voice", required=True)
    say.add_argument("-o", "--output", type=Path, required=True)
    say.add_argument("--url", default="http://127.0.0.1:8080")
    say.add_argument(
        "--format",
        help="the audio format (default: the one the output's suffix names: .mp3, .wav, .pcm, "
        ".opus, .flac, .aac, .ulaw, .alaw)",
    )
    say.add_argument("--speed", type=float, help="0.25 to 4.0 (default 1.0)")
    say.add_argument("--sample-rate", type=int)
    say.add_argument("--seed", type=int)
    say.add_argument("--api-key", help="a key with the synthesize scope")
    say.set_defaults(func=cmd_say)

    normalize = commands.add_parser(
        "normalize",
        help="print the segments the engine would get for a text, one a line",
        description="The text stage of speech, alone: the segments of TEXT as the engine gets "
        "them (cut per the segment settings, the lexicon's aliases said, numbers, money, dates "
        "and times in words of LANGUAGE), one a line; a line break inside one is shown as \\n.",
    )
    normalize.add_argument("text")
    normalize.add_argument(
        "--language",
        default="en",
        help="BCP-47 tag (en, fr, de, es, es-MX, it, ko, hi, zh); another is said as written",
    )
    normalize.add_argument("--lexicon", type=Path, help="a lexicon file: W3C PLS or JSON")
    normalize.add_argument("--raw", action="store_true", help="cut, but do not normalise")
    normalize.add_argument(
        "--json", action="store_true", help="a JSON object a line: said, text, start, end"
    )
    normalize.set_defaults(func=cmd_normalize)

    doctor = commands.add_parser(
        "doctor", help="check this machine, the model, the codec, adapters and a server"
    )
    doctor.add_argument("--dev", action="store_true", help="check the tiny dev model")
    doctor.add_argument("--model", help="Orpheus weights (path or hub id)")
    doctor.add_argument("--codec", help="SNAC 24 kHz (path or hub id)")
    doctor.add_argument("--url", help="a running server: one sentence per voice through it")
    doctor.add_argument("--voice", action="append", help="only these voices (repeatable)")
    doctor.add_argument("--api-key", help="a key with the synthesize scope")
    doctor.add_argument("--json", type=Path, help="write the checks here")
    doctor.set_defaults(func=cmd_doctor)

    bench = commands.add_parser(
        "bench",
        help="measure a server: first audio, underruns, tokens/s per concurrency",
        description=BENCH_DESCRIPTION,
    )
    add_bench_arguments(bench)
    bench.set_defaults(func=cmd_bench)

    audit_commands = commands.add_parser("audit", help="the audit trail").add_subparsers(
        dest="audit_command", required=True
    )
    verify = audit_commands.add_parser("verify", help="check the audit log's hash chain")
    where = verify.add_mutually_exclusive_group()
    where.add_argument("--path", type=Path, help="the log file (default: the settings')")
    where.add_argument("--url", help="a running server or gateway (needs an admin key)")
    verify.add_argument("--api-key", default=None, help="an admin key, for --url")
    verify.add_argument("--adapters", type=Path, help="the adapters folder the log is beside")
    verify.add_argument(
        "--cluster", action="store_true", help="the cluster's mirror on the shared store"
    )
    verify.set_defaults(func=cmd_audit_verify)

    train = commands.add_parser("train", help="train a LoRA voice from a few minutes of audio")
    train.add_argument("--audio", type=Path, nargs="+", required=True, help="files or folders")
    train.add_argument("--voice", required=True, help="the new voice's id")
    train.add_argument("--name", help="a display name")
    train.add_argument("--transcripts", type=Path, help="metadata.csv (file|text)")
    train.add_argument("--base", help="base Orpheus weights (path or hub id)")
    train.add_argument("--codec", help="SNAC 24 kHz (path or hub id)")
    train.add_argument("--out", type=Path, help="adapters folder to write the voice into")
    train.add_argument("--work-dir", type=Path, help="dataset cache and checkpoints")
    train.add_argument("--epochs", type=int, default=3)
    train.add_argument("--rank", type=int, default=16)
    train.add_argument(
        "--learning-rate", type=float, help="default 2e-4 (2e-3 on the tiny dev model)"
    )
    train.add_argument("--dev", action="store_true", help="train on the dev model")
    train.add_argument("--prompt-style", choices=["plain", "named"], default="plain")
    train.add_argument(
        "--language", type=language_tag, help="the voice's language (default: the model's first)"
    )
    train.add_argument("--lead-pad-ms", type=float, default=40.0, help="silence kept before speech")
    train.add_argument(
        "--keep-leading-silence", action="store_true", help="do not trim (for comparisons)"
    )
    train.add_argument("--drop-repeated-frames", action="store_true")
    train.add_argument("--min-speech-seconds", type=float, default=30.0)
    train.add_argument("--asr-model", type=Path, help="a local faster-whisper model folder")
    train.set_defaults(func=cmd_train)

    check = commands.add_parser("check-data", help="the data report of audio, without training")
    add_check_data_arguments(check)
    check.set_defaults(func=cmd_check_data)

    eval_ = commands.add_parser(
        "eval", help="measure a voice against its speaker's audio, over a running server"
    )
    eval_.add_argument("--voice", required=True, help="a built-in or adapter voice")
    eval_.add_argument(
        "--reference", type=Path, nargs="+", required=True, help="the speaker: files or folders"
    )
    eval_.add_argument("--sentences", type=Path, help="a file of sentences, one per line")
    eval_.add_argument("--url", default="http://127.0.0.1:8080")
    eval_.add_argument("--api-key", help="a key with the synthesize scope")
    eval_.add_argument(
        "--baseline", nargs="+", help="voices to compare with (default: every built-in voice)"
    )
    eval_.add_argument("--json", type=Path, help="write the figures here")
    eval_.add_argument("--plot", type=Path, help="draw each sample's similarity here (PNG)")
    eval_.add_argument(
        "--embedder",
        "--encoder",  # its name before: scripts that pass it keep working
        dest="embedder",
        help="speaker embedder (default: VOICEHOST_SPEAKER_EMBEDDER)",
    )
    eval_.add_argument("--asr-model", type=Path, help="a local faster-whisper model folder")
    eval_.add_argument("--seed", type=int, default=0, help="the sampling seed of each sentence")
    eval_.set_defaults(func=cmd_eval)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
