"""The slow-connections attack: thousands of connections that open and never finish their
request, held for a while from several processes, and what the server did with them.

- `http`: a request line and two headers to an HTTP/1.1 server (the gateway), never the blank
  line that ends the headers;
- `h2`: the first line of the HTTP/2 connection preface (`PRI * HTTP/2.0`) to a gRPC server (the
  router), never the rest nor a SETTINGS frame.

Every connection is held until the hold ends or the server closes it; one the server closed is
opened again after `reopen_s` (times a random factor from 0.5 to 1.5, so refused connections do
not all come back at the same moment), as a patient attacker's would be. `hold_connections` runs
in one event loop (tests call it directly); `attack` spreads the connections over worker
processes (`python -m services.chaos.slow_connections`, each with its open files limit raised,
at `nice` levels below this process) and over source addresses 127.0.0.2, 127.0.0.3, ... on
loopback, so per-address caps see several clients.

Knows sockets, asyncio and processes; nothing of the services it is aimed at.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import json
import random
import socket
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from services.common.cpu_priority import lower_priority
from services.common.descriptors import raise_open_files_limit
from services.common.percentiles import percentile

KINDS = ("http", "h2")
PARTIAL = {
    "http": b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\nContent-Type: "
    b"application/json\r\n",
    "h2": b"PRI * HTTP/2.0\r\n",
}
FAST_S = 1.0  # a connection the server closed within this of its opening was refused fast
CONNECT_TIMEOUT_S = 5.0
CONNECTS_AT_ONCE = 256  # connection attempts in flight per process
MAX_PER_PROCESS = 12_000  # connections one worker process holds at most


@dataclass
class SlowTally:
    """What the attacker saw; merged over processes (`merge`), JSON in `to_json`."""

    asked: int = 0
    opened: int = 0  # connections established (reopens included)
    connect_failed: Counter[str] = field(default_factory=Counter)  # errno name -> count
    closed_by_server: int = 0  # before the hold ended
    refused_fast: int = 0  # ...within FAST_S of opening
    answers: Counter[str] = field(default_factory=Counter)  # first status line seen, if any
    close_ms: list[float] = field(default_factory=list)  # opening to the server's close
    peak_open: int = 0  # the most open at once (summed over processes: an upper bound)
    open_at_end: int = 0  # closed by the attacker when the hold ended
    _open: int = 0

    def merge(self, other: SlowTally) -> None:
        self.asked += other.asked
        self.opened += other.opened
        self.connect_failed.update(other.connect_failed)
        self.closed_by_server += other.closed_by_server
        self.refused_fast += other.refused_fast
        self.answers.update(other.answers)
        self.close_ms += other.close_ms
        self.peak_open += other.peak_open
        self.open_at_end += other.open_at_end

    def to_json(self) -> dict[str, Any]:
        def ms(q: float) -> float | None:
            value = percentile(self.close_ms, q)
            return None if value is None else round(value, 1)

        return {
            "asked": self.asked,
            "opened": self.opened,
            "connect_failed": dict(self.connect_failed),
            "closed_by_server": self.closed_by_server,
            "refused_fast": self.refused_fast,
            "answers": dict(self.answers),
            "close_ms_p50": ms(0.50),
            "close_ms_p99": ms(0.99),
            "close_ms_max": ms(1.0),
            "peak_open": self.peak_open,
            "open_at_end": self.open_at_end,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], close_ms: Sequence[float] = ()) -> SlowTally:
        tally = cls(
            asked=int(data["asked"]),
            opened=int(data["opened"]),
            closed_by_server=int(data["closed_by_server"]),
            refused_fast=int(data["refused_fast"]),
            peak_open=int(data["peak_open"]),
            open_at_end=int(data["open_at_end"]),
        )
        tally.connect_failed.update(data["connect_failed"])
        tally.answers.update(data["answers"])
        tally.close_ms = list(close_ms)
        return tally


def _status_line(data: bytes) -> str:
    """ "503" from an HTTP/1.1 answer, "h2-frames" from HTTP/2 bytes, else "other"."""
    if data.startswith(b"HTTP/1."):
        return data.split(b" ", 2)[1].decode(errors="replace")
    return "h2-frames" if len(data) >= 9 else "other"


async def hold_connections(
    host: str,
    port: int,
    kind: str,
    count: int,
    hold_s: float,
    *,
    reopen_s: float = 1.0,
    source: str | None = None,
) -> SlowTally:
    """Opens `count` connections of `kind` to host:port (from `source`, an address of this
    host, when given), each sending its partial request, and holds them for `hold_s`; one the
    server closes is opened again after `reopen_s`. Returns what was seen; every socket is
    closed when it returns."""
    if kind not in KINDS:
        raise ValueError(f"kind: one of {', '.join(KINDS)}, got {kind!r}")
    loop = asyncio.get_running_loop()
    tally = SlowTally(asked=count)
    end = time.monotonic() + hold_s
    gate = asyncio.Semaphore(CONNECTS_AT_ONCE)
    payload = PARTIAL[kind]
    family = socket.AF_INET6 if ":" in host else socket.AF_INET

    async def connect() -> socket.socket | None:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            if source is not None:
                sock.bind((source, 0))
            async with (
                gate,
                asyncio.timeout(min(CONNECT_TIMEOUT_S, max(0.01, end - time.monotonic()))),
            ):
                await loop.sock_connect(sock, (host, port))
            await loop.sock_sendall(sock, payload)
            return sock
        except (OSError, TimeoutError) as e:
            sock.close()
            name = "timeout" if isinstance(e, TimeoutError) else errno.errorcode.get(e.errno or 0)
            tally.connect_failed[name or type(e).__name__] += 1
            return None
        except BaseException:  # cancelled: no socket left behind
            sock.close()
            raise

    async def reopen_later() -> None:
        wait = reopen_s * random.uniform(0.5, 1.5)
        await asyncio.sleep(min(wait, max(0.0, end - time.monotonic())))

    async def one() -> None:
        while time.monotonic() < end:
            sock = await connect()
            if sock is None:
                await reopen_later()
                continue
            opened = time.monotonic()
            tally.opened += 1
            tally._open += 1
            tally.peak_open = max(tally.peak_open, tally._open)
            closed = False
            try:
                async with asyncio.timeout(max(0.0, end - time.monotonic())):
                    first = True
                    while data := await loop.sock_recv(sock, 4096):
                        if first:
                            tally.answers[_status_line(data)] += 1
                            first = False
                    closed = True
            except TimeoutError:
                pass
            except OSError:  # a reset: closed too
                closed = True
            finally:
                sock.close()
                tally._open -= 1
            if not closed:
                tally.open_at_end += 1
                return
            waited = time.monotonic() - opened
            tally.closed_by_server += 1
            tally.refused_fast += waited < FAST_S
            tally.close_ms.append(waited * 1000)
            await reopen_later()

    await asyncio.gather(*(one() for _ in range(count)))
    return tally


async def attack(
    host: str,
    port: int,
    kind: str,
    count: int,
    hold_s: float,
    *,
    processes: int = 4,
    reopen_s: float = 1.0,
    first_source: int = 2,
    nice: int = 0,
) -> SlowTally:
    """`count` connections over `processes` worker processes, the i-th from 127.0.0.(i +
    first_source) when `host` is an IPv4 loopback address, each `nice` levels below this
    process; their tallies merged."""
    processes = max(processes, -(-count // MAX_PER_PROCESS))
    shares = [count // processes + (i < count % processes) for i in range(processes)]
    loopback = host.startswith("127.")
    workers = []
    for i, share in enumerate(shares):
        command = [
            sys.executable,
            "-m",
            "services.chaos.slow_connections",
            f"{host}:{port}",
            "--kind",
            kind,
            "--count",
            str(share),
            "--hold",
            str(hold_s),
            "--reopen",
            str(reopen_s),
        ]
        if loopback:
            command += ["--source", f"127.0.0.{first_source + i}"]
        worker = await asyncio.create_subprocess_exec(
            *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        lower_priority(worker.pid, nice)
        workers.append(worker)
    tally = SlowTally()
    try:
        outputs = await asyncio.gather(*(worker.communicate() for worker in workers))
    finally:
        for worker in workers:
            if worker.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    worker.kill()
    for (out, err), worker in zip(outputs, workers, strict=True):
        lines = out.decode().strip().splitlines()
        if worker.returncode != 0 or not lines:
            tally.connect_failed[f"worker exit {worker.returncode}: {err.decode()[-200:]}"] += 1
            continue
        data = json.loads(lines[-1])
        tally.merge(SlowTally.from_json(data, data.get("close_ms", ())))
    return tally


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Hold slow, never-finished connections.")
    parser.add_argument("target", help="HOST:PORT")
    parser.add_argument("--kind", choices=KINDS, required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--hold", type=float, required=True, help="seconds")
    parser.add_argument("--reopen", type=float, default=1.0, help="seconds before a reopen")
    parser.add_argument("--source", help="the local address to connect from")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    host, _, port = args.target.rpartition(":")
    raise_open_files_limit()
    tally = asyncio.run(
        hold_connections(
            host.strip("[]"),
            int(port),
            args.kind,
            args.count,
            args.hold,
            reopen_s=args.reopen,
            source=args.source,
        )
    )
    print(json.dumps({**tally.to_json(), "close_ms": [round(v, 1) for v in tally.close_ms]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
