#!/usr/bin/env python3
"""bench/hold_connections.py — opens N keep-alive connections to an HTTP server and holds them.

scripts/bench measures idemd's memory with 1,000 open, idle connections: each connection sends one
GET /healthz (so the server has accepted it and served a request on it, as a real client's
connection), reads the answer, and then stays open doing nothing. When all are open the script
prints "holding N" and waits for SIGTERM or SIGINT, then closes them. Only the standard library.

  bench/hold_connections.py HOST PORT N
"""
import signal
import socket
import sys
import time


def read_answer(sock, deadline):
    """Reads one HTTP/1.1 answer with a Content-Length body; False on a closed connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        chunk = sock.recv(4096)
        if not chunk:
            return False
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        chunk = sock.recv(4096)
        if not chunk:
            return False
        body += chunk
    return True


def main():
    if len(sys.argv) != 4:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    request = (f"GET /healthz HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n").encode()
    socks = []
    deadline = time.monotonic() + 60
    try:
        for _ in range(count):
            s = socket.create_connection((host, port), timeout=10)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.sendall(request)
            socks.append(s)
        for s in socks:
            if not read_answer(s, deadline):
                print("hold_connections: the server closed a connection", file=sys.stderr)
                return 1
    except OSError as e:
        print(f"hold_connections: after {len(socks)} connections: {e}", file=sys.stderr)
        return 1
    print(f"holding {len(socks)}", flush=True)
    while not stop:
        time.sleep(0.2)
    for s in socks:
        s.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
