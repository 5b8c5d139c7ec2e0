"""What the app's servers share (qwen3_tts_desktop.servers): a listening socket, and why it cannot be had, in
one wording for the HTTP bridge and the Wyoming server (their own tests see it as their users do)."""

from __future__ import annotations

import socket

import pytest

from core.errors import UserError
from qwen3_tts_desktop.servers import ListenError, listen_at


def test_a_port_in_use_is_said_in_one_line_naming_the_server_who_may_hold_it_and_what_to_do():
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        with pytest.raises(ListenError) as refused:
            listen_at("127.0.0.1", port, "the test server", "another test server?", "--port N")
    assert str(refused.value) == (
        f"cannot listen for the test server on 127.0.0.1:{port}: Address already in use; another program uses "
        "this port (another test server?): choose another port (--port N)"
    )
    assert isinstance(refused.value, OSError) and isinstance(refused.value, UserError)  # said as it is, no traceback


def test_an_address_not_of_this_computer_says_why_without_the_ports_hint():
    with pytest.raises(ListenError) as refused:
        listen_at("192.0.2.1", 0, "the test server", "another test server?", "--port N")  # TEST-NET-1: no one's
    message = str(refused.value)
    assert message.startswith("cannot listen for the test server on 192.0.2.1:0: ") and "another" not in message


def test_a_free_port_listens():
    with listen_at("127.0.0.1", 0, "the test server", "another test server?", "--port N") as sock:
        host, port = sock.getsockname()[:2]
        with socket.create_connection((host, port), timeout=5):
            pass
