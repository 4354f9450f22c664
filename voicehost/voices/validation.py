"""Adapter validation: whether a PEFT LoRA folder is a voice that the served engine can load.

An adapter folder holds a PEFT ``adapter_config.json`` and ``adapter_model.safetensors``, plus an
optional ``voice.json`` manifest (name, prompt style, tenant). Validation reads the config and the
safetensors header, never unpickles anything and never loads the weights.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, get_args

from voicehost.errors import ServiceError
from voicehost.ids import VOICE_ID_PATTERN, is_voice_id
from voicehost.voices.voice import Voice, VoiceStatus

if TYPE_CHECKING:
    from voicehost.config import Settings

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
MANIFEST = "voice.json"
TENANT = "tenant"  # the manifest key naming the voice's tenant (absent: a shared voice)
STATUS = "status"  # the manifest key saying whether a voice is ready or held (absent: ready)
STATUSES: tuple[str, ...] = get_args(VoiceStatus)
VERSION = "version"  # the manifest key holding which version of its voice an adapter is
PROMOTED = (
    "promoted_at"  # when a version first went live (absent: never; see versioning.version_status)
)
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
# First bytes of what torch.load would unpickle: a pickle (protocol 2-5) or a torch zip archive.
PICKLE_MAGIC = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05", b"PK\x03\x04")
MAX_JSON_BYTES = 1 << 16  # adapter_config.json and voice.json are a few KB
MAX_SAFETENSORS_HEADER = 1 << 24  # the JSON header of a LoRA's tensors is far smaller
# What a servable voice adapts: the attention and MLP projections, never embeddings or lm_head.
LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_MODULES = frozenset(LORA_TARGET_MODULES)


def servable_lora_config(rank: int, alpha: int):  # noqa: ANN201 - peft.LoraConfig
    """The PEFT config of a voice adapter that vLLM can serve (bias none, no modules_to_save)."""
    from peft import LoraConfig

    return LoraConfig(
        r=rank,
        lora_alpha=alpha,
        target_modules=list(LORA_TARGET_MODULES),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )


class InvalidAdapter(ServiceError, ValueError):
    """An adapter that vLLM must not load; the message says why."""

    code = "invalid_adapter"


@dataclass(frozen=True, slots=True)
class ModelShape:
    """The projection sizes an adapter's matrices must match."""

    hidden: int
    intermediate: int
    q_out: int
    kv_out: int

    @classmethod
    def from_config(cls, config_path: Path) -> ModelShape:
        config = json.loads(config_path.read_text())
        heads = config["num_attention_heads"]
        head_dim = config.get("head_dim") or config["hidden_size"] // heads
        return cls(
            hidden=config["hidden_size"],
            intermediate=config["intermediate_size"],
            q_out=heads * head_dim,
            kv_out=config.get("num_key_value_heads", heads) * head_dim,
        )

    def in_out(self, module: str) -> tuple[int, int]:
        """(in_features, out_features) of a target module."""
        return {
            "q_proj": (self.hidden, self.q_out),
            "k_proj": (self.hidden, self.kv_out),
            "v_proj": (self.hidden, self.kv_out),
            "o_proj": (self.q_out, self.hidden),
            "gate_proj": (self.hidden, self.intermediate),
            "up_proj": (self.hidden, self.intermediate),
            "down_proj": (self.intermediate, self.hidden),
        }[module]


@dataclass(frozen=True, slots=True)
class AdapterRules:
    """What the served engine accepts. ``base_model`` is the configured name of the served model;
    ``aliases`` are its other names (its path or hub id), any of which an adapter may declare."""

    base_model: str
    max_rank: int
    shape: ModelShape | None = None
    aliases: tuple[str, ...] = ()
    languages: tuple[str, ...] = ("en",)  # the base model's; the first is an adapter's default

    def language_of(self, manifest: dict) -> str:
        """The language an adapter's manifest says its voice speaks (``language``), one of the
        base model's; the model's first if it says none."""
        language = manifest.get("language", self.languages[0])
        if language not in self.languages:
            raise InvalidAdapter(
                f"{MANIFEST}: the voice speaks {language!r}; the base model "
                f"{self.base_model!r} speaks {', '.join(self.languages)}"
            )
        return str(language)

    def accepts_base(self, declared: str) -> bool:
        """Whether ``declared`` names the served model: the last part of a path or hub id,
        compared without case, matches that of the configured name or an alias."""
        return any(_last_part(declared) == _last_part(name) for name in self.base_names())

    def base_names(self) -> list[str]:
        return list(dict.fromkeys([self.base_model, *self.aliases]))

    def to_json(self) -> str:
        """The rules as a worker's membership record carries them (``from_json``): a gateway
        checks an adapter for that worker's model by them."""
        shape = asdict(self.shape) if self.shape is not None else None
        fields = {"base_model": self.base_model, "max_rank": self.max_rank, "shape": shape}
        fields |= {"aliases": list(self.aliases), "languages": list(self.languages)}
        return json.dumps(fields, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> AdapterRules:
        """``to_json``'s rules; ``ValueError`` for a text that is not such rules."""
        try:
            fields = json.loads(text)
            shape = fields["shape"]
            rules = cls(
                base_model=str(fields["base_model"]),
                max_rank=int(fields["max_rank"]),
                shape=ModelShape(**{k: int(v) for k, v in shape.items()}) if shape else None,
                aliases=tuple(str(a) for a in fields["aliases"]),
                languages=tuple(str(language) for language in fields["languages"]),
            )
        except (TypeError, KeyError, AttributeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not a base model's adapter rules: {exc}") from exc
        if not rules.base_model or not rules.languages:
            raise ValueError("a base model's adapter rules name the model and its languages")
        return rules

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        served: str,
        shape: ModelShape | None = None,
        languages: tuple[str, ...] = ("en",),
    ) -> AdapterRules:
        """What adapters must be to be served: the served model (``served``, the weights the
        engine loads: ``voicehost.model.served.served_model``) by its configured name, path or
        hub id, at most ``max_lora_rank``, ``shape``'s projection sizes if known, and a voice in
        one of the model's ``languages`` (``voicehost.model.languages``)."""
        name = settings.served_base_name()
        aliases = (served,) if served != name else ()
        return cls(name, settings.max_lora_rank, shape, aliases, languages)


class ServedModels:
    """The base models whose adapters a process takes, each by its rules: the one it serves
    (``own``) and, on a gateway, those its workers serve (``learn``, from their records). An
    adapter is checked by the rules of the model it declares; a language is cloned on the
    first model that speaks it, the served one first."""

    def __init__(self, own: AdapterRules) -> None:
        self.own = own
        self._learned: dict[str, AdapterRules] = {}

    def learn(self, rules: AdapterRules) -> bool:
        """Take another model's rules (a worker's); whether they are new or changed."""
        if rules.base_model == self.own.base_model or self._learned.get(rules.base_model) == rules:
            return False
        self._learned[rules.base_model] = rules
        return True

    def all(self) -> list[AdapterRules]:
        return [self.own, *self._learned.values()]

    def languages(self) -> tuple[str, ...]:
        """What the models speak, the served model's languages first."""
        return tuple(dict.fromkeys(lang for rules in self.all() for lang in rules.languages))

    def for_language(self, language: str) -> AdapterRules | None:
        return next((r for r in self.all() if language in r.languages), None)

    def serves(self, path: Path) -> bool:
        """Whether the adapter in ``path`` is for one of these models (or declares none)."""
        declared = declared_bases(path)
        return not declared or any(
            all(rules.accepts_base(base) for base in declared) for rules in self.all()
        )

    def for_adapter(self, path: Path) -> AdapterRules:
        """The rules of the model the adapter in ``path`` declares: the served model's when it
        declares none, or none readable (its check then says what is wrong), and when no other
        model is known. ``InvalidAdapter`` for a model none of them is."""
        declared = declared_bases(path)
        if not declared or not self._learned:
            return self.own
        for rules in self.all():
            if all(rules.accepts_base(base) for base in declared):
                return rules
        served = ", ".join(repr(rules.base_model) for rules in self.all())
        raise InvalidAdapter(
            f"base model {declared[0]!r} is not one served here (served: {served}; an adapter "
            "declares one by its name, or a path or hub id ending in it)"
        )


def declared_bases(path: Path) -> list[str]:
    """The base models an adapter folder declares (its config's, its manifest's), those that
    cannot be read left out."""
    declared = []
    for name, key in ((ADAPTER_CONFIG, "base_model_name_or_path"), (MANIFEST, "base_model")):
        try:
            value = read_json_object(path / name).get(key) if (path / name).is_file() else None
        except InvalidAdapter:
            continue
        if isinstance(value, str) and value:
            declared.append(value)
    return declared


def _last_part(name: str) -> str:
    return name.rstrip("/").split("/")[-1].lower()


def validate_adapter(path: Path, rules: AdapterRules, voice_id: str | None = None) -> Voice:
    """Check an adapter folder without loading any weights; raises ``InvalidAdapter``.
    ``voice_id``: the voice it is registered as (by default, the folder's name).

    The config (and manifest) are checked before the weights file is opened; the weights must
    then be a safetensors file by their first bytes, whatever their name."""
    voice_id = voice_id or path.name
    if not is_voice_id(voice_id):
        raise InvalidAdapter(f"voice id {voice_id!r} must match {VOICE_ID_PATTERN.pattern}")
    pickles = [p.name for p in path.iterdir() if p.suffix.lower() in PICKLE_SUFFIXES]
    if pickles:
        raise InvalidAdapter(f"pickle files are refused (safetensors only): {', '.join(pickles)}")
    config_path = path / ADAPTER_CONFIG
    weights_path = path / ADAPTER_WEIGHTS
    if not config_path.is_file():
        raise InvalidAdapter(f"{ADAPTER_CONFIG} is missing")
    if not weights_path.is_file():
        raise InvalidAdapter(f"{ADAPTER_WEIGHTS} is missing")
    config = read_json_object(config_path)
    manifest = read_json_object(path / MANIFEST) if (path / MANIFEST).exists() else {}
    if manifest.get("prompt_style", "plain") not in ("plain", "named"):
        raise InvalidAdapter(f"{MANIFEST}: prompt_style must be 'plain' or 'named'")
    tenant = manifest.get(TENANT, None)
    if tenant is not None and (not isinstance(tenant, str) or not tenant):
        raise InvalidAdapter(f"{MANIFEST}: tenant must be a non-empty string")
    if manifest.get(STATUS, "ready") not in STATUSES:  # a typo must not make a held voice ready
        raise InvalidAdapter(f"{MANIFEST}: status must be one of {', '.join(STATUSES)}")
    _check_config(config, manifest, rules)
    language = rules.language_of(manifest)
    rank = int(config["r"])
    _check_weights(weights_path, rank, rules.shape)
    return Voice(
        voice_id=voice_id,
        name=str(manifest.get("name") or voice_id),
        prompt_style=manifest.get("prompt_style", "plain"),
        adapter_path=path,
        checksum=weights_checksum(path),
        tenant=tenant,
        status=manifest.get(STATUS, "ready"),
        language=language,
        base_model=rules.base_model,
    )


def voice_tenant(manifest: dict) -> str | None:
    """The tenant a voice's manifest names; ``None``: shared with every tenant."""
    tenant = manifest.get(TENANT)
    return tenant if isinstance(tenant, str) and tenant else None


def voice_status(manifest: dict) -> VoiceStatus:
    """Whether a voice's manifest says it is ready or held (validation refuses anything else)."""
    return "held" if manifest.get(STATUS) == "held" else "ready"


def with_tenant(manifest: dict, tenant: str | None) -> dict:
    """``manifest`` naming ``tenant`` (with ``None``, naming none: a shared voice)."""
    manifest = {k: v for k, v in manifest.items() if k != TENANT}
    if tenant is not None:
        manifest[TENANT] = tenant
    return manifest


def assign_tenant(folder: Path, tenant: str | None) -> None:
    """Record (or, with ``None``, remove) the tenant in a staged voice folder's manifest."""
    path = folder / MANIFEST
    write_manifest(folder, with_tenant(read_json_object(path) if path.exists() else {}, tenant))


def write_manifest(folder: Path, manifest: dict) -> None:
    """Replace ``folder``'s ``voice.json`` atomically: a reader (a rescan, a copy into the
    cluster's store) sees the old file or the new one, never part of one. The weights, and so
    the checksum that names the adapter, are untouched."""
    staging = folder / f".{MANIFEST}.{uuid.uuid4().hex}"
    try:
        with staging.open("w") as out:
            out.write(json.dumps(manifest, indent=2))
            out.flush()
            os.fsync(out.fileno())
        os.replace(staging, folder / MANIFEST)
    finally:
        staging.unlink(missing_ok=True)


def weights_checksum(folder: Path) -> str:
    """The SHA-256 of an adapter's weights (read in blocks), which identifies the adapter."""
    digest = hashlib.sha256()
    with (folder / ADAPTER_WEIGHTS).open("rb") as weights:
        while block := weights.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def read_json_object(path: Path) -> dict:
    """A small JSON object file (config or manifest); raises ``InvalidAdapter``."""
    if path.stat().st_size > MAX_JSON_BYTES:
        raise InvalidAdapter(f"{path.name} is over {MAX_JSON_BYTES} bytes")
    try:
        data = json.loads(path.read_text())
    except (
        ValueError,
        UnicodeDecodeError,
        RecursionError,
    ) as exc:  # JSONDecodeError is a ValueError
        raise InvalidAdapter(f"{path.name} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise InvalidAdapter(f"{path.name} must be a JSON object")
    return data


def _check_config(config: dict, manifest: dict, rules: AdapterRules) -> None:
    if config.get("peft_type", "LORA") != "LORA":
        raise InvalidAdapter(f"peft_type {config.get('peft_type')!r} is not LORA")
    rank = config.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise InvalidAdapter(f"rank r={rank!r} must be a positive integer")
    if rank > rules.max_rank:
        raise InvalidAdapter(f"rank {rank} exceeds max_lora_rank {rules.max_rank}")
    if config.get("modules_to_save"):
        raise InvalidAdapter(f"modules_to_save {config['modules_to_save']} is not servable")
    if config.get("bias", "none") != "none":
        raise InvalidAdapter(f"bias {config.get('bias')!r} must be 'none'")
    for unservable in ("use_dora", "layer_replication"):
        if config.get(unservable):
            raise InvalidAdapter(f"{unservable} {config[unservable]!r} is not servable")
    targets = config.get("target_modules")
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
        raise InvalidAdapter(f"target_modules {targets!r} must list module names")
    # PEFT saves ``target_modules="all-linear"`` as full dotted module names: match the last part.
    unknown = {t for t in targets if t.rsplit(".", 1)[-1] not in LORA_MODULES}
    if unknown:
        raise InvalidAdapter(f"target modules {sorted(unknown)} are not attention/MLP projections")
    declared = [config.get("base_model_name_or_path"), manifest.get("base_model")]
    if not any(declared):
        raise InvalidAdapter(f"no base model declared (the served one is {rules.base_model!r})")
    for base in filter(None, declared):  # the config's and the manifest's must both match
        if not isinstance(base, str) or not rules.accepts_base(base):
            accepted = ", ".join(repr(n) for n in rules.base_names())
            raise InvalidAdapter(
                f"base model {base!r} does not match the served {rules.base_model!r} "
                f"(accepted: {accepted}, or a path or hub id ending in one of their last parts)"
            )


def _check_safetensors_header(path: Path) -> None:
    """Refuse by the first bytes anything but a safetensors file: a pickle is never unpickled,
    and a header length is never trusted beyond the file's size."""
    size = path.stat().st_size
    with path.open("rb") as weights:
        head = weights.read(9)
    if head.startswith(PICKLE_MAGIC):
        raise InvalidAdapter(f"{ADAPTER_WEIGHTS} is a pickle or torch archive (safetensors only)")
    length = int.from_bytes(head[:8], "little") if len(head) == 9 else 0
    if not 2 <= length <= min(size - 8, MAX_SAFETENSORS_HEADER) or head[8:9] != b"{":
        raise InvalidAdapter(f"{ADAPTER_WEIGHTS} is not a readable safetensors file (bad header)")


def _check_weights(path: Path, rank: int, shape: ModelShape | None) -> None:
    from safetensors import SafetensorError, safe_open

    _check_safetensors_header(path)
    try:
        with safe_open(str(path), framework="pt") as weights:
            names = list(weights.keys())
            shapes = {name: weights.get_slice(name).get_shape() for name in names}
    except (SafetensorError, OSError, ValueError) as exc:
        raise InvalidAdapter(
            f"{ADAPTER_WEIGHTS} is not a readable safetensors file: {exc}"
        ) from exc
    if not names:
        raise InvalidAdapter(f"{ADAPTER_WEIGHTS} holds no tensors")
    for name in names:
        match = re.search(r"\.(\w+_proj)\.lora_([AB])(?:\.\w+)?\.weight$", name)
        if not match or match.group(1) not in LORA_MODULES:
            raise InvalidAdapter(f"unexpected tensor {name!r} (only LoRA A/B of projections)")
        module, side = match.groups()
        dims = shapes[name]
        if len(dims) != 2:
            raise InvalidAdapter(f"tensor {name!r} has shape {list(dims)}, expected a matrix")
        expected_in, expected_out = shape.in_out(module) if shape else (dims[-1], dims[0])
        want = [rank, expected_in] if side == "A" else [expected_out, rank]
        if list(dims) != want:
            raise InvalidAdapter(f"tensor {name!r} has shape {list(dims)}, expected {want}")
