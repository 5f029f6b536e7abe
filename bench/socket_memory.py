#!/usr/bin/env python3
"""What an idle WebSocket costs the server after it once carried a large
message: N sockets to the chat example's echo room (an actor's sockets,
held while the room hibernates), the server's resident
memory measured with them idle, then after each carried one message of
SIZE bytes each way and went idle again. Prints KiB per socket, before and
after.

Usage: python3 bench/socket_memory.py [--weir target/release/weir] [--sockets 200] [--size 1048576]
"""

import argparse
import base64
import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hello import ROOT, free_port, wait_ready  # noqa: E402


def rss_kib(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def connect(port):
    s = socket.create_connection(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(
        (
            f"GET /rooms/idle/echo HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nupgrade: websocket\r\n"
            f"connection: upgrade\r\nsec-websocket-key: {key}\r\nsec-websocket-version: 13\r\n\r\n"
        ).encode()
    )
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        head += s.recv(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    return s


def send_binary(s, payload):
    mask = os.urandom(4)
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x82, 0x80 | n)
    elif n < 65536:
        head = struct.pack("!BBH", 0x82, 0x80 | 126, n)
    else:
        head = struct.pack("!BBQ", 0x82, 0x80 | 127, n)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    s.sendall(head + mask + masked)


def read_message(s):
    def exact(n):
        data = b""
        while len(data) < n:
            chunk = s.recv(n - len(data))
            if not chunk:
                raise EOFError
            data += chunk
        return data

    total = 0
    while True:
        b0, b1 = exact(2)
        n = b1 & 0x7F
        if n == 126:
            (n,) = struct.unpack("!H", exact(2))
        elif n == 127:
            (n,) = struct.unpack("!Q", exact(8))
        exact(n)
        total += n
        if b0 & 0x80:
            return total


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--weir", default=str(ROOT / "target/release/weir"))
    p.add_argument("--sockets", type=int, default=200)
    p.add_argument("--size", type=int, default=1 << 20)
    a = p.parse_args()
    port = free_port()
    data = Path(f"/tmp/weir-socket-memory-{os.getpid()}")
    server = subprocess.Popen(
        [
            a.weir,
            "serve",
            str(ROOT / "guests/target/wasm32-wasip2/release/chat.wasm"),
            "--actor",
            f"room={ROOT / 'guests/target/wasm32-wasip2/release/chat_room.wasm'}",
            "--actor-route",
            "room=/rooms",
            "--limit",
            "max_socket_message_bytes=2097152",
            "--limit",
            "max_socket_send_queue_bytes=2097152",
            "--listen",
            f"127.0.0.1:{port}",
            "--data-dir",
            str(data),
        ],
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_ready(port, server)
        time.sleep(1)
        base = rss_kib(server.pid)
        sockets = [connect(port) for _ in range(a.sockets)]
        for s in sockets:
            send_binary(s, b"x")
            read_message(s)
        time.sleep(2)
        small = rss_kib(server.pid)
        payload = os.urandom(a.size)
        for s in sockets:
            send_binary(s, payload)
            assert read_message(s) == a.size
        time.sleep(2)
        large = rss_kib(server.pid)
        n = a.sockets
        print(f"sockets: {n}, message: {a.size} bytes each way once")
        print(f"idle after small messages: {(small - base) / n:.1f} KiB per socket")
        print(f"idle after one {a.size}-byte message: {(large - base) / n:.1f} KiB per socket")
    finally:
        server.kill()
        server.wait()
        subprocess.run(["rm", "-rf", str(data)])


if __name__ == "__main__":
    main()
