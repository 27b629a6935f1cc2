"""The simulated cluster's and the tests' ports: drawn where no other process is handed them."""

from __future__ import annotations

import socket

import pytest

from npu_compat.testing import _ray


def test_a_port_is_drawn_below_the_ephemeral_range_and_is_free() -> None:
    low = _ray._ephemeral_low()
    if low - _ray._FIXED_PORTS_END < 1000:
        pytest.skip(f"this host's ephemeral range starts at {low}: no room below it")
    ports = {_ray._free_port() for _ in range(20)}
    assert all(_ray._FIXED_PORTS_END <= p < low for p in ports), ports
    assert len(ports) > 10  # drawn at random, not the same each time
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports.pop()))


def test_an_ephemeral_range_with_no_room_below_falls_back_to_the_kernels_choice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_ray, "_ephemeral_low", lambda: _ray._FIXED_PORTS_END + 10)
    port = _ray._free_port()
    assert not _ray._FIXED_PORTS_END <= port < _ray._FIXED_PORTS_END + 10
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
