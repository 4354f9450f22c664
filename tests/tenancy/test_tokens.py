"""Speech tokens without a server: minted and read back, refused when altered, expired, from
another secret, or once their key is gone; bound to an Origin and to voices."""

import pytest
from pydantic import ValidationError

from voicehost.api.auth import (
    TOKEN_STREAMS_HEADER,
    AccessDenied,
    Authenticator,
    forwarded_principal,
)
from voicehost.speech.admission import Admission, Refused
from voicehost.tenancy.keys import SPEECH_TOKEN, ApiKey, hash_key
from voicehost.tenancy.tokens import InvalidToken, TokenSigner, token_secret

pytestmark = pytest.mark.unit

KEY = ApiKey(id="web", tenant="acme", scopes=["synthesize"], sha256=hash_key("key-web"))
MANAGER = ApiKey(id="manager", tenant="acme", scopes=["voices"], sha256=hash_key("key-manager"))


def test_a_token_reads_back_as_minted_and_not_once_altered_expired_or_from_another_secret():
    signer = TokenSigner(token_secret(None, "internal-token-of-the-cluster", []))
    token, minted = signer.mint(
        "web", 2.0, voices=["dev-b", "dev-a"], origin="https://app.example", now=1000.0
    )
    assert token.startswith("vht_") and "key-web" not in token
    read = signer.read(token, now=1001.9)
    assert read == minted and read.voices == ("dev-a", "dev-b") and read.expires_at == 1002.0
    with pytest.raises(InvalidToken) as expired:
        signer.read(token, now=1002.0)
    assert expired.value.code == "token_expired"
    payload, signature = token.split(".")
    for altered in (
        payload[:-2] + "AA." + signature,
        payload + "." + signature[::-1],
        "vht_x",
        "vht_",
    ):
        with pytest.raises(InvalidToken) as refused:
            signer.read(altered, now=1001.0)
        assert refused.value.code == "invalid_token"
    other = TokenSigner(token_secret(None, "another-clusters-internal-token", []))
    with pytest.raises(InvalidToken):
        other.read(token, now=1001.0)
    # every gateway and front end derives the same secret from the same configuration
    assert TokenSigner(token_secret(None, None, ["b", "a"])).read(
        TokenSigner(token_secret(None, None, ["a", "b"])).mint("web", now=1000.0)[0], now=1001.0
    )
    for ttl in (0, -1, 3601):
        with pytest.raises(ValueError):
            signer.mint("web", ttl)


def test_a_token_speaks_for_its_key_until_the_key_is_gone_and_only_from_its_origin():
    auth = Authenticator([KEY, MANAGER], "internal-token-of-the-cluster")
    token, _ = auth.tokens.mint("web", 60, voices=["dev-a"], origin="https://app.example")
    principal = auth.token_principal(token, "https://app.example")
    assert (principal.key_id, principal.tenant) == ("web", "acme")
    assert principal.scopes == frozenset({SPEECH_TOKEN}) and principal.voices == {"dev-a"}
    for origin in (None, "https://evil.example"):
        with pytest.raises(AccessDenied) as refused:
            auth.token_principal(token, origin)
        assert refused.value.code == "origin_not_allowed"
    gone = Authenticator([MANAGER], "internal-token-of-the-cluster")  # the key was removed
    with pytest.raises(AccessDenied) as refused:
        gone.token_principal(token, "https://app.example")
    assert refused.value.code == "invalid_token"
    # a key that cannot speak mints nothing that speaks
    managing, _ = auth.tokens.mint("manager", 60)
    assert auth.token_principal(managing, None).scopes == frozenset()


def test_a_keys_own_stream_quota_holds_for_it_its_tokens_and_through_a_gateway():
    """A key entry's ``max_streams`` (a browser-facing key's small quota) is its principal's,
    its tokens', survives the gateway's forwarded headers, and is what admission holds it to
    in place of the service's quota."""
    small = ApiKey(
        id="page", tenant="acme", scopes=["synthesize"], sha256=hash_key("key-page"), max_streams=1
    )
    auth = Authenticator([KEY, small], "internal-token-of-the-cluster")
    principal = auth.authenticate("key-page")
    assert principal.max_streams == 1 and auth.authenticate("key-web").max_streams is None
    token, _ = auth.tokens.mint("page", 60)
    spoken_for = auth.token_principal(token, None)
    assert spoken_for.max_streams == 1
    forwarded = forwarded_principal(auth.forward_headers(spoken_for))
    assert forwarded == spoken_for  # the token's scope and the key's quota, at the worker
    admission = Admission(capacity=10, per_key=4)
    with admission.admit("page", forwarded.max_streams):
        with pytest.raises(Refused) as refused, admission.admit("page", forwarded.max_streams):
            pass
        assert refused.value.code == "quota_exceeded"
        with admission.admit("web"), admission.admit("web"):  # the service's quota: 4
            pass
    with pytest.raises(ValidationError):
        ApiKey(id="x", tenant="acme", scopes=["synthesize"], sha256="0" * 64, max_streams=0)


def test_a_token_bound_to_a_stream_count_carries_it_to_admission_and_through_a_gateway():
    """``max_streams`` minted into a token reads back from it, is its principal's (under the
    token's own id: two tokens of one key are counted apart), survives the gateway's forwarded
    headers, and admission holds the token to it."""
    auth = Authenticator([KEY], "internal-token-of-the-cluster")
    token, minted = auth.tokens.mint("web", 60, max_streams=1)
    assert auth.tokens.read(token) == minted and minted.max_streams == 1
    principal = auth.token_principal(token, None)
    bound = principal.token_streams
    assert bound is not None and bound.limit == 1 and bound.token_id == minted.token_id
    second = auth.token_principal(auth.tokens.mint("web", 60, max_streams=1)[0], None)
    assert second.token_streams.token_id != bound.token_id
    assert auth.token_principal(auth.tokens.mint("web", 60)[0], None).token_streams is None
    forwarded = forwarded_principal(auth.forward_headers(principal))
    assert forwarded == principal
    admission = Admission(capacity=10, per_key=4)
    with admission.admit("web", None, forwarded.token_streams):
        with pytest.raises(Refused) as refused:
            with admission.admit("web", None, forwarded.token_streams):
                pass
        assert refused.value.code == "quota_exceeded"
        with admission.admit("web", None, second.token_streams):  # another token of the key
            pass
    for malformed in ("0 abc", "1", "x abc", "1 "):
        headers = {**auth.forward_headers(principal), TOKEN_STREAMS_HEADER: malformed}
        with pytest.raises(ValueError):
            forwarded_principal(headers)
    with pytest.raises(ValueError):
        auth.tokens.mint("web", 60, max_streams=0)
