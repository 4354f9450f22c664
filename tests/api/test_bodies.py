"""Bodies the edge cannot read: a ``Content-Encoding`` that does not decode is a 400
``invalid_body`` that says why, and the connection is closed with ``Connection: close`` (its
framing is lost), never reset; a body cut short by the client's end of its sending side (a
half-close) is a 400 too, answered before the connection closes, and a whole request sent
that way is answered as usual; a body that reads well keeps its connection for the next
request. Raw sockets on the shared dev server: a client library would not send these."""

from __future__ import annotations

import json
import socket
import zlib

import pytest

LEXICON = b'{"entries": [{"grapheme": "vh", "alias": "voice host"}]}'


def request(path: str, body: bytes, *headers: str, length: int | None = None) -> bytes:
    lines = [
        f"PUT {path} HTTP/1.1",
        "Host: voicehost",
        "Content-Type: application/json",
        f"Content-Length: {len(body) if length is None else length}",
        *headers,
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def exchange(url: str, data: bytes, half_close: bool = False) -> tuple[list[bytes], bool]:
    """Send ``data`` on one connection (then shut its sending side, if ``half_close``); the
    responses read until the server closes, and whether it closed cleanly (not reset)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(data)
        if half_close:
            conn.shutdown(socket.SHUT_WR)
        received = b""
        try:
            while chunk := conn.recv(65536):
                received += chunk
        except ConnectionResetError:
            return split_responses(received), False
    return split_responses(received), True


def split_responses(data: bytes) -> list[bytes]:
    """Each response's head and body (``Content-Length`` framed, as these answers are)."""
    responses = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        responses.append(head + b"\r\n\r\n" + rest[:length])
        data = rest[length:]
    return responses


def status_and_error(response: bytes) -> tuple[int, str, str, bool]:
    head, _, body = response.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    closes = any(line.lower() == b"connection: close" for line in lines)
    error = json.loads(body).get("error", {}) if body.startswith(b"{") else {}
    return int(lines[0].split()[1]), error.get("code", ""), error.get("message", ""), closes


@pytest.mark.parametrize("encoding", ["deflate", "gzip"])
def test_a_body_that_does_not_decode_is_400_and_the_connection_closes_cleanly(server, encoding):
    bad = request(
        "/v1/lexicons/bodies", b"this is not compressed at all", f"Content-Encoding: {encoding}"
    )
    after = request("/v1/lexicons/bodies", LEXICON)
    unhandled = server.log_text().count("Unhandled exception")
    responses, clean = exchange(server.url, bad + after)
    assert clean, "the server reset the connection"
    assert len(responses) == 1, responses  # the next request is not read on a lost framing
    status, code, message, closes = status_and_error(responses[0])
    assert (status, code, closes) == (400, "invalid_body", True), responses[0]
    assert encoding in message
    # a client's bad body is the client's error: no traceback in the server's log
    assert server.log_text().count("Unhandled exception") == unhandled


def test_a_body_cut_short_by_the_clients_end_is_400_and_closes_cleanly(server):
    """A client that ends its sending side inside its body (``shutdown(SHUT_WR)``) still
    hears why: 400 ``invalid_body`` with the bytes received, ``Connection: close``, then a
    clean close (aiohttp alone closed at once and answered nothing). The server serves the
    next connection."""
    unhandled = server.log_text().count("Unhandled exception")
    cut = request("/v1/lexicons/bodies", LEXICON[:20], length=len(LEXICON))
    responses, clean = exchange(server.url, cut, half_close=True)
    assert clean and len(responses) == 1, responses
    status, code, message, closes = status_and_error(responses[0])
    assert (status, code, closes) == (400, "invalid_body", True), responses[0]
    assert f"received 20 of {len(LEXICON)} bytes" in message, message
    after = request("/v1/lexicons/bodies", LEXICON, "Connection: close")
    responses, clean = exchange(server.url, after)
    assert clean and status_and_error(responses[0])[0] in (200, 201)
    assert server.log_text().count("Unhandled exception") == unhandled


def test_a_whole_request_from_a_client_that_half_closes_is_answered(server):
    """The client sends its request whole, then ends its sending side: it is answered as if it
    had not, then the connection closes (no request can follow)."""
    whole = request("/v1/lexicons/half-closed", LEXICON)
    responses, clean = exchange(server.url, whole, half_close=True)
    assert clean and [status_and_error(r)[0] for r in responses] in ([201], [200]), responses


def test_a_body_that_decodes_keeps_the_connection_for_the_next_request(server):
    good = request("/v1/lexicons/bodies", zlib.compress(LEXICON), "Content-Encoding: deflate")
    last = request("/v1/lexicons/bodies", LEXICON, "Connection: close")
    responses, clean = exchange(server.url, good + last)
    assert clean and [status_and_error(r)[0] for r in responses] in ([201, 200], [200, 200])
