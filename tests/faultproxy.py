"""A TCP proxy on 127.0.0.1 that can play a storage outage: between a client and a server (the
moto S3 server), it forwards bytes both ways until `down()`, which resets every open connection
and then resets each new one as soon as it is accepted (the client sees 'connection reset'),
until `up()`. Counts what it cut, so a test can tell that the outage was felt."""

from __future__ import annotations

import socket
import struct
import threading
import time
from contextlib import contextmanager
from collections.abc import Iterator


def _reset(sock: socket.socket) -> None:
    """Close with a TCP RST (linger 0), waking any thread blocked reading it."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.shutdown(socket.SHUT_RD)  # sends nothing; a recv() blocked in a pump returns
    except OSError:
        pass
    sock.close()


class FaultProxy:
    """Forward 127.0.0.1:<port> to `upstream` ('http://127.0.0.1:PORT' or (host, port))."""

    def __init__(self, upstream: str | tuple[str, int]):
        if isinstance(upstream, str):
            host, port = upstream.split("://", 1)[-1].rstrip("/").rsplit(":", 1)
            upstream = (host, int(port))
        self.upstream = upstream
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._down = False
        self._closed = False
        self.forwarded = 0     # connections forwarded
        self.cut = 0           # open connections reset by down()
        self.refused = 0       # connections reset on accept while down
        threading.Thread(target=self._accept_loop, daemon=True, name="faultproxy").start()

    @property
    def is_down(self) -> bool:
        return self._down

    def down(self) -> None:
        """Storage goes away: open connections are reset, new ones reset on accept."""
        with self._lock:
            self._down = True
            socks, self._open = list(self._open), set()
            self.cut += len(socks) // 2
        for s in socks:
            _reset(s)

    def up(self) -> None:
        with self._lock:
            self._down = False

    @contextmanager
    def outage(self) -> Iterator[None]:
        self.down()
        try:
            yield
        finally:
            self.up()

    def outage_in_background(self, seconds: float) -> threading.Thread:
        """down() now, up() after `seconds`, without blocking the caller."""
        self.down()
        t = threading.Timer(seconds, self.up)
        t.daemon = True
        t.start()
        return t

    def close(self) -> None:
        self._closed = True
        self.down()
        self._listener.close()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            if self._down:
                self.refused += 1
                _reset(client)
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
                server.settimeout(None)
            except OSError:
                _reset(client)
                continue
            with self._lock:
                if self._down:  # went down meanwhile
                    self.refused += 1
                    _reset(client)
                    _reset(server)
                    continue
                self._open |= {client, server}
                self.forwarded += 1
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
        except OSError:
            pass
        with self._lock:
            mine = src in self._open
            self._open -= {src, dst}
        if mine:  # a normal end of the connection (not a reset by down())
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()


def wait_for(predicate, timeout: float, every: float = 0.1) -> bool:
    """Poll `predicate` until true or `timeout` seconds pass; its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every)
    return bool(predicate())
