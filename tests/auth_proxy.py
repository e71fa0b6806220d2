"""A small authenticating HTTP proxy on loopback, as a corporate proxy with a password would be.

It answers 407 without the right ``Proxy-Authorization`` (Basic), tunnels ``CONNECT`` (HTTPS), and
forwards plain ``GET``s one per connection. It counts the requests it let through and those it
refused, so a test can tell that traffic really went through it, with the credentials.
"""

from __future__ import annotations

import base64
import socket
import socketserver
import threading
from urllib.parse import urlsplit

from prefect_harbor.sandbox.network import pipe


class _Handler(socketserver.StreamRequestHandler):
    server: AuthenticatingProxy

    def handle(self) -> None:
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            line = self.rfile.readline(65536)
            if not line:
                return
            head += line
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        method, target, _ = request_line.split(" ", 2)
        headers = {name.strip().lower(): value.strip() for name, _, value in (h.partition(":") for h in header_lines if h)}
        if headers.get("proxy-authorization") != self.server.expected:
            self.server.refused += 1
            self.wfile.write(b"HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"test\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return
        self.server.allowed += 1
        self.server.targets.append(target)
        parts = urlsplit(target if method != "CONNECT" else f"//{target}")
        try:
            upstream = socket.create_connection((parts.hostname, parts.port or 80), timeout=30)
        except OSError:
            self.wfile.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return
        if method == "CONNECT":
            self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        else:
            path = parts.path + (f"?{parts.query}" if parts.query else "")
            kept = [h for h in header_lines if h and not h.lower().startswith(("proxy-", "connection:"))]
            upstream.sendall("\r\n".join([f"{method} {path or '/'} HTTP/1.1", *kept, "Connection: close", "", ""]).encode("latin-1"))
            length = int(headers.get("content-length", "0") or 0)
            if length:
                upstream.sendall(self.rfile.read(length))
        upstream.settimeout(None)
        with upstream:
            back = threading.Thread(target=pipe, args=(upstream.recv, self.connection), daemon=True)
            back.start()
            if method == "CONNECT":
                pipe(self.rfile.read1, upstream)
            back.join()


class AuthenticatingProxy(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, username: str, password: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.expected = "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()
        self.url = f"http://{username}:{password}@127.0.0.1:{self.server_address[1]}"
        self.allowed = 0
        self.refused = 0
        self.targets: list[str] = []
        threading.Thread(target=self.serve_forever, daemon=True).start()
