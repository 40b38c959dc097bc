"""An HTTP proxy in front of the S3 test server that injects faults, as a failing store would
show them to s3fs: HTTP 500 answers, requests that are accepted and never answered (a hanging
endpoint), and a refused connection (nothing listening). Every other request is forwarded to
the server unchanged (same method, path, headers and body), so the client stack (botocore's
signing, retries and timeouts, s3fs's error translation) runs exactly as against a bucket.

Example::

    proxy = FaultProxy(s3.endpoint)
    opts = proxy.options(s3.options)            # the same options, through the proxy
    proxy.fail("GET", r"/lock\\.chief\\.json", times=10)   # the next 10 GETs of the lock: HTTP 500
    proxy.hang("PUT")                           # every PUT waits until proxy.release()
    proxy.refuse(); proxy.accept()              # connections refused, then accepted again
    proxy.close()
"""
from __future__ import annotations

import http.client
import re
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

#: headers that belong to one connection, not to the request (RFC 9110 7.6.1)
_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}


@dataclass
class Rule:
    method: str | None          # None: any method
    pattern: re.Pattern
    action: str                 # "fail" or "hang"
    status: int = 500
    times: int | None = None    # None: until cleared
    hits: int = 0
    released: threading.Event = field(default_factory=threading.Event)

    def matches(self, method: str, path: str) -> bool:
        return (self.method is None or self.method == method) and bool(self.pattern.search(path)) \
            and (self.times is None or self.hits < self.times)


class FaultProxy:
    """See the module docstring. ``requests``: (method, path, what happened) of every request."""

    def __init__(self, upstream: str) -> None:
        up = urlsplit(upstream)
        self.upstream = (up.hostname, up.port)
        self.rules: list[Rule] = []
        self.requests: list[tuple[str, str, str]] = []
        self._lock = threading.Lock()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self._server: ThreadingHTTPServer | None = None
        self._open: set[socket.socket] = set()   # client connections being served
        self.accept()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def options(self, base: dict) -> dict:
        """``base`` storage options with the endpoint set to this proxy."""
        return {**base, "endpoint_url": self.endpoint}

    def fail(self, method: str | None, path: str, status: int = 500, times: int | None = None) -> Rule:
        """Answer requests whose path matches ``path`` (a regex) with HTTP ``status``."""
        return self._add(Rule(method, re.compile(path), "fail", status, times))

    def hang(self, method: str | None = None, path: str = ".", times: int | None = None) -> Rule:
        """Accept matching requests and answer none until :meth:`release` (then the connection closes)."""
        return self._add(Rule(method, re.compile(path), "hang", times=times))

    def _add(self, rule: Rule) -> Rule:
        with self._lock:
            self.rules.append(rule)
        return rule

    def release(self) -> None:
        """Drop every rule; requests held by ``hang`` get their connection closed, unanswered."""
        with self._lock:
            rules, self.rules = self.rules, []
        for r in rules:
            r.released.set()

    def refuse(self) -> None:
        """Stop listening: new connections are refused, open ones are closed unanswered."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        with self._lock:
            conns, self._open = self._open, set()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def accept(self) -> None:
        """Listen (again) on the same port."""
        if self._server is not None:
            return
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def setup(self) -> None:
                super().setup()
                with proxy._lock:
                    proxy._open.add(self.connection)

            def finish(self) -> None:
                with proxy._lock:
                    proxy._open.discard(self.connection)
                super().finish()

            def _any(self) -> None:
                if proxy._server is None:   # refusing: a connection opened before is closed unanswered
                    self.close_connection = True
                    return
                proxy._handle(self)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True, name="fault-proxy").start()

    def close(self) -> None:
        self.release()
        self.refuse()

    def _rule(self, method: str, path: str) -> Rule | None:
        with self._lock:
            for r in self.rules:
                if r.matches(method, path):
                    r.hits += 1
                    return r
        return None

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        body = _body(h)
        rule = self._rule(h.command, h.path)
        self.requests.append((h.command, h.path, rule.action if rule else "forwarded"))
        if rule is not None and rule.action == "hang":
            rule.released.wait()
            h.close_connection = True
            return
        if rule is not None:
            data = (b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>InternalError</Code>"
                    b"<Message>injected by the fault proxy</Message></Error>")
            h.send_response(rule.status)
            h.send_header("Content-Type", "application/xml")
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            h.wfile.write(data)
            return
        conn = http.client.HTTPConnection(*self.upstream, timeout=120)
        try:
            headers = {k: v for k, v in h.headers.items() if k.lower() not in _HOP and k.lower() != "content-length"}
            if body is not None:
                headers["Content-Length"] = str(len(body))
            conn.request(h.command, h.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            h.send_response(resp.status, resp.reason)
            for k, v in resp.getheaders():
                if k.lower() not in _HOP and (k.lower() != "content-length" or h.command == "HEAD"):
                    h.send_header(k, v)
            if h.command != "HEAD":
                h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            if h.command != "HEAD":
                h.wfile.write(data)
        finally:
            conn.close()


def _body(h: BaseHTTPRequestHandler) -> bytes | None:
    """The request's body (chunked transfer decoded), None if it has none."""
    if h.headers.get("Transfer-Encoding", "").lower() == "chunked":
        out = bytearray()
        while True:
            size = int(h.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while h.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return bytes(out)
            out += h.rfile.read(size)
            h.rfile.readline()
    n = int(h.headers.get("Content-Length") or 0)
    return h.rfile.read(n) if n or h.headers.get("Content-Length") is not None else None
