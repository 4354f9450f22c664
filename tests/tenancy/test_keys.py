"""API keys without HTTP: what an entry may hold, how the configured keys are read (and refused),
and which tenant's voices and jobs a caller reaches."""

import hashlib
import json
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from voicehost.config import Settings
from voicehost.tenancy.keys import (
    ApiKey,
    AuthConfigError,
    Principal,
    can_manage,
    can_see,
    hash_key,
    new_key,
    owner_tenant,
    read_keys,
)

pytestmark = pytest.mark.unit


def entry(key_id: str, secret: str, tenant: str = "A", scopes=("synthesize",)) -> dict:
    return {"id": key_id, "tenant": tenant, "scopes": list(scopes), "sha256": hash_key(secret)}


def write(path: Path, entries: list[dict]) -> Path:
    path.write_text(json.dumps(entries))
    return path


def test_a_key_is_stored_as_the_hex_sha256_of_its_text():
    assert hash_key("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert hash_key("vh_\N{SNOWMAN}") == hashlib.sha256("vh_\N{SNOWMAN}".encode()).hexdigest()


def test_new_keys_are_random_url_safe_and_prefixed():
    keys = {new_key() for _ in range(50)}
    assert len(keys) == 50
    for key in keys:
        assert re.fullmatch(r"vh_[A-Za-z0-9_-]{43}", key)  # 32 random bytes, base64url


@pytest.mark.parametrize("name", ["a", "A.b-c_9", "tenant.with.dots", "0" * 64])
def test_key_ids_and_tenants_are_1_to_64_header_safe_characters(name):
    key = ApiKey.model_validate(entry(name, "s", tenant=name))
    assert (key.id, key.tenant) == (name, name)


@pytest.mark.parametrize("name", ["", "a" * 65, ".a", "-a", "a/b", "a b", "a\n", "\N{SNOWMAN}"])
def test_key_ids_and_tenants_that_could_break_a_header_are_refused(name):
    with pytest.raises(ValidationError):
        ApiKey.model_validate(entry(name, "s"))
    with pytest.raises(ValidationError):
        ApiKey.model_validate(entry("a", "s", tenant=name))


@pytest.mark.parametrize(
    "change",
    [
        {"scopes": []},
        {"scopes": ["everything"]},
        {"sha256": "A" * 64},  # upper-case hex is not what hash_key writes
        {"sha256": "a" * 63},
        {"key": "vh_plain"},  # the key itself is never configured
    ],
)
def test_an_entry_needs_known_scopes_and_a_lowercase_sha256_and_nothing_else(change):
    with pytest.raises(ValidationError):
        ApiKey.model_validate({**entry("a", "s"), **change})


def test_the_keys_are_the_env_list_then_the_files(tmp_path):
    env = [ApiKey.model_validate(entry("a", "key-a"))]
    keys_file = write(tmp_path / "keys.json", [entry("b", "key-b"), entry("c", "key-c")])
    assert [k.id for k in read_keys(env, keys_file)] == ["a", "b", "c"]
    assert [k.id for k in read_keys(env, None)] == ["a"]
    assert read_keys([], write(tmp_path / "empty.json", [])) == []


def test_the_env_lists_entries_are_checked_here_and_a_bad_one_is_named(monkeypatch):
    """The settings hold ``VOICEHOST_API_KEYS`` as JSON objects (config imports no tenancy
    module); read_keys checks each, and one it cannot use is an AuthConfigError naming the
    variable (``serve`` says it and exits 2 before anything slow)."""
    monkeypatch.setenv("VOICEHOST_API_KEYS", json.dumps([entry("a", "key-a")]))
    assert [k.id for k in read_keys(Settings().api_keys, None)] == ["a"]
    monkeypatch.setenv("VOICEHOST_API_KEYS", json.dumps([{**entry("a", "key-a"), "scopes": ["x"]}]))
    with pytest.raises(AuthConfigError, match=r"^VOICEHOST_API_KEYS: "):
        read_keys(Settings().api_keys, None)


def test_two_entries_with_one_hash_are_refused_whatever_their_ids(tmp_path):
    """Two ids for one key would make the caller depend on the order of the entries."""
    keys_file = write(tmp_path / "keys.json", [entry("a", "same"), entry("b", "same")])
    with pytest.raises(AuthConfigError, match=f"duplicate sha256 {hash_key('same')}$"):
        read_keys([], keys_file)


def test_a_hash_in_the_env_list_and_the_file_is_a_duplicate_too(tmp_path):
    env = [ApiKey.model_validate(entry("a", "same"))]
    keys_file = write(tmp_path / "keys.json", [entry("b", "same")])
    with pytest.raises(AuthConfigError, match="duplicate sha256"):
        read_keys(env, keys_file)


def test_duplicate_ids_are_named_sorted_and_once_each(tmp_path):
    entries = [entry(i, f"key-{n}") for n, i in enumerate(["z", "a", "z", "a", "z", "m"])]
    with pytest.raises(AuthConfigError, match=r"^API keys: duplicate id a, z$"):
        read_keys([], write(tmp_path / "keys.json", entries))


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"[", "Expecting value"),
        (b"\xff\xfe", "codec can't decode"),
        (b'{"keys": []}', "must hold a JSON list of keys"),
        (b'[{"id": "a"}]', "Field required"),
    ],
)
def test_a_keys_file_that_cannot_be_used_names_itself_and_the_problem(tmp_path, content, problem):
    keys_file = tmp_path / "keys.json"
    keys_file.write_bytes(content)
    with pytest.raises(AuthConfigError, match=f"(?s)API keys file {keys_file}: .*{problem}"):
        read_keys([], keys_file)


def test_a_missing_keys_file_is_refused_and_named(tmp_path):
    with pytest.raises(AuthConfigError, match=r"API keys file .*missing\.json: .*No such file"):
        read_keys([], tmp_path / "missing.json")


def test_admin_implies_every_scope_and_others_hold_only_their_own():
    speaker = Principal("a", "A", frozenset({"synthesize"}))
    admin = Principal("ops", "ops", frozenset({"admin"}))
    assert not speaker.admin and admin.admin
    assert speaker.allows(frozenset({"synthesize"}))
    assert speaker.allows(frozenset({"synthesize", "voices"}))  # one of them is enough
    assert not speaker.allows(frozenset({"voices"})) and not speaker.allows(frozenset())
    assert admin.allows(frozenset({"voices"})) and admin.allows(frozenset())


def test_a_tenant_sees_its_own_and_shared_things_and_manages_only_its_own():
    a = Principal("a", "A", frozenset({"voices"}))
    admin = Principal("ops", "ops", frozenset({"admin"}))
    assert can_see(a, "A") and can_see(a, None) and not can_see(a, "B")
    assert can_see(admin, "B") and can_see(None, "B")
    assert can_manage(a, "A") and not can_manage(a, None) and not can_manage(a, "B")
    assert can_manage(admin, "B") and can_manage(admin, None) and can_manage(None, "B")


def test_what_a_caller_creates_belongs_to_its_tenant_or_to_everyone_when_open():
    assert owner_tenant(Principal("a", "A", frozenset({"voices"}))) == "A"
    assert owner_tenant(None) is None
