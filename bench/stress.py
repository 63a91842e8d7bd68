"""calmd under hostile and careless clients, over the real socket, with the real model.

    python bench/stress.py [--frames 100000] [--clients 64] [--requests 500] [--model FILE.cwgt]
    python bench/stress.py --flood-only    # phase 5 alone, about a minute

Starts `calmd serve` in a scratch HOME (the packaged nano model by default) and runs, in turn:
1. fuzz: `--frames` fuzzed frames (request-like maps with wrong types, out-of-range numbers,
   invalid UTF-8, odd keys, deep nesting; batches of 100 on one connection, the last frame of a
   batch sometimes damaged: bytes flipped, cut short, garbage, a header announcing gigabytes),
   four connections at a time; every reply is checked (a map, protocol 1, a docs/protocol.md code,
   never `internal`);
2. huge: requests that declare 1.2 GB (str32) and 4 G items (array32), followed by 64 MiB;
3. no-reader: one client pipelines status requests (the issue's 300k) without reading a reply,
   until the daemon stops reading it, then waits for the daemon to close it;
4. many: `--clients` clients x `--requests` completes each, all pipelined at once, one session
   per client (a fast typist each): errors, and whether every session's newest was answered;
5. flood: a well-behaved shell types 12 commands one keystroke at a time (one complete in flight,
   as the shell helper does), alone and while another client keeps 64 completes of fresh
   sessions queued; alone-flood, then flood-alone, so that both see the same machine and
   neither always goes first; p50/p99 of `done`.
Throughout, the daemon's resident memory and open descriptors are sampled every 50 ms; the
summary gives each phase's peak and its value at the end of the phase. Goals (issue 12):
shell p99 <= 50 ms under the flood, 0 errors and every newest answered for 64 x 500, memory
that does not follow what clients declare or leave unread.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import socket
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import Report, daemon
from calmd import paths
from calmd.arguments import Parser, run_tool
from calmd.shell.client import CalmClient
from tests.support.daemon import Daemon

SPEC_CODES = {"bad_message", "bad_field", "unknown_op", "too_large", "disk_full", "forbidden", "internal"}
MIB = 1 << 20
COMMANDS = [
    "git status", "git commit -m 'fix the parser'", "ls -la", "docker ps -a", "make test",
    "python3 -m pytest -q", "grep -rn TODO src", "ssh server", "git push origin main",
    "kubectl get pods", "npm run build", "du -sh *",
]  # fmt: skip


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


# --------------------------------------------------------------------------- sampling


@dataclass
class PhaseSample:
    rss_peak: float = 0.0
    fds_peak: int = 0
    rss_end: float = 0.0
    fds_end: int = 0
    seconds: float = 0.0


class Sampler(threading.Thread):
    """The daemon's VmRSS (MB) and open descriptors every 50 ms, attributed to the current phase."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.phases: dict[str, PhaseSample] = {}
        self.current: str | None = None
        self.stop = threading.Event()
        self._phase_start = 0.0

    def read(self) -> tuple[float, int]:
        rss = 0.0
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
        return rss, len(list(Path(f"/proc/{self.pid}/fd").iterdir()))

    def begin(self, name: str) -> None:
        self.phases[name] = PhaseSample()
        self.current = name
        self._phase_start = time.perf_counter()
        self.sample()

    def end(self) -> None:
        assert self.current is not None
        time.sleep(0.3)  # let closes settle: the end value is what the phase left behind
        self.sample()
        phase = self.phases[self.current]
        phase.rss_end, phase.fds_end = self.read()
        phase.seconds = time.perf_counter() - self._phase_start
        self.current = None

    def sample(self) -> None:
        if self.current is None:
            return
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            rss, fds = self.read()
            phase = self.phases[self.current]
            phase.rss_peak = max(phase.rss_peak, rss)
            phase.fds_peak = max(phase.fds_peak, fds)

    def run(self) -> None:
        while not self.stop.wait(0.05):
            self.sample()


# --------------------------------------------------------------------------- raw connections


def connect(sock_path: Path, timeout: float = 120.0) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.connect(str(sock_path))
    return sock


def read_until_closed(sock: socket.socket) -> list[Any]:
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    messages: list[Any] = []
    while True:
        try:
            data = sock.recv(1 << 16)
        except ConnectionResetError:  # closed with our unread input: after its replies
            data = b""
        if not data:
            return messages
        unpacker.feed(data)
        messages.extend(unpacker)


def exchange(sock_path: Path, data: bytes) -> list[Any]:
    with connect(sock_path) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        return read_until_closed(sock)


# --------------------------------------------------------------------------- 1. fuzz


class Fuzzer:
    """Request-like frames: mostly the right shape with one thing wrong, sometimes garbage."""

    def __init__(self, seed: int) -> None:
        self.r = random.Random(seed)
        self.ints = [0, 1, -1, 5, 32, 33, 255, 256, 2**31, 2**63 - 1, 2**63, 2**64 - 1, -(2**63)]

    def value(self, depth: int = 0) -> Any:
        r = self.r
        kind = r.randrange(10 if depth < 3 else 8)
        if kind == 0:
            return None
        if kind == 1:
            return r.choice([True, False])
        if kind == 2:
            return r.choice(self.ints)
        if kind == 3:
            return r.choice([0.5, -1e308, float("nan"), float("inf"), 1.7e9])
        if kind == 4:
            return "".join(r.choice("ab €\x00\n;|$'\"") for _ in range(r.randrange(12)))
        if kind == 5:
            return bytes(r.randrange(256) for _ in range(r.randrange(8)))
        if kind == 6:
            return "x" * r.choice([1, 300, 5000, 70_000])
        if kind == 7:
            return msgpack.ExtType(r.randrange(-128, 128), b"\x01\x02")
        if kind == 8:
            return [self.value(depth + 1) for _ in range(r.randrange(4))]
        return {
            r.choice(["input", "cmd", "k", "", "history"]): self.value(depth + 1)
            for _ in range(r.randrange(4))
        }

    def maybe(self, good: Any, p_good: float = 0.7) -> Any:
        return good if self.r.random() < p_good else self.value()

    def request(self, conn: int) -> dict[Any, Any]:
        r = self.r
        op = self.maybe(r.choice(["complete"] * 4 + ["record"] * 3 + ["status"]), 0.9)
        req: dict[Any, Any] = {"op": op, "id": self.maybe(r.randrange(1 << 31), 0.9)}
        if op == "complete":
            # nearly all name a session (superseded when pipelined), as shells do: the fuzz
            # measures the framing, not the model
            if r.random() < 0.98:
                req["session"] = self.maybe(f"fuzz-{conn}-{r.randrange(3)}", 0.9)
            req["n"] = self.maybe(r.choice([0] * 9 + [1]), 0.8)
            ctx = {"input": self.maybe(r.choice(["", "git ", "ls -", "é"]))}
            for key in ("cwd", "git", "env", "history", "completions"):
                if r.random() < 0.3:
                    ctx[key] = self.maybe(
                        {"history": [{"cmd": "ls", "exit": r.choice(self.ints)}], "completions": ["a"]}.get(
                            key, "/home/u"
                        ),
                        0.6,
                    )
            req["ctx"] = self.maybe(ctx, 0.85)
        elif op == "record":
            req["cmd"] = self.maybe(r.choice(["ls", "make test", "git push", "echo é"]), 0.8)
            for key, good in (("exit", r.choice(self.ints)), ("ts", 1.7e9), ("cwd", "/p"), ("session", "s")):
                if r.random() < 0.5:
                    req[key] = self.maybe(good, 0.6)
        if r.random() < 0.1:
            req[self.value()] = self.value() if r.random() < 0.5 else None  # odd keys: lists, ints, ...
        return req

    def frame(self, conn: int) -> bytes:
        try:
            return pack(self.request(conn))
        except (TypeError, ValueError):  # an unhashable key was drawn: send it as raw msgpack
            return b"\x81\x91\x01\x02"

    def well_framed_oddity(self) -> bytes:
        r = self.r
        return r.choice([
            b"\x81\x92\x01\x02\x03",  # a list as a map key
            b"\x81" + pack("op") + b"\x91" * 40 + b"\xc0",  # nested 40 deep
            b"\x83" + pack("op") + pack("record") + pack("id") + pack(1) + pack("cmd") + b"\xa2\xff\xfe",
            pack([1, 2]),
            pack("status"),
        ])  # fmt: skip

    def damage(self, frame: bytes) -> bytes:
        r = self.r
        kind = r.randrange(5)
        data = bytearray(frame)
        if kind == 0:
            for _ in range(r.randrange(1, 4)):
                data[r.randrange(len(data))] = r.randrange(256)
        elif kind == 1:
            del data[r.randrange(1, len(data)) :]
        elif kind == 2:
            data += bytes(r.randrange(256) for _ in range(r.randrange(1, 16)))
        elif kind == 3:
            data = bytearray(b"\xdb" + (1_200_000_000).to_bytes(4, "big") + b"x" * 1000)
        else:
            data = bytearray(b"\xc1")
        return bytes(data)


@dataclass
class FuzzResult:
    frames: int = 0
    connections: int = 0
    terminal_replies: int = 0
    codes: Counter[str] = field(default_factory=Counter)
    closed_by_fatal: int = 0
    bad_replies: list[str] = field(default_factory=list)
    unanswered_batches: int = 0


def fuzz(sock_path: Path, total: int, workers: int = 4, batch: int = 100) -> FuzzResult:
    result = FuzzResult()
    lock = threading.Lock()

    def worker(w: int) -> None:
        f = Fuzzer(seed=1000 + w)
        conn = 0
        while True:
            with lock:
                if result.frames >= total:
                    return
                result.frames += batch
                result.connections += 1
            conn += 1
            frames = [f.frame(w) if f.r.random() < 0.97 else f.well_framed_oddity() for _ in range(batch - 1)]
            last = f.frame(w)
            damaged = f.r.random() < 0.3
            sentinel = pack({"op": "complete", "id": 2**62 + 1, "n": 0, "ctx": {"input": ""}})
            data = b"".join(frames) + (f.damage(last) if damaged else last) + sentinel
            messages = exchange(sock_path, data)
            terminal = [m for m in messages if isinstance(m, dict) and any(
                k in m for k in ("done", "ok", "status", "error"))]  # fmt: skip
            with lock:
                result.terminal_replies += len(terminal)
                for m in messages:
                    if not isinstance(m, dict) or m.get("protocol") != 1:
                        result.bad_replies.append(repr(m)[:200])
                    elif "error" in m:
                        code = m["error"].get("code")
                        result.codes[code] += 1
                        if code not in SPEC_CODES or code == "internal":
                            result.bad_replies.append(repr(m)[:200])
                if not any(m.get("id") == 2**62 + 1 for m in terminal):
                    if any(m.get("id") is None and "error" in m for m in terminal):
                        result.closed_by_fatal += 1
                    else:
                        result.unanswered_batches += 1
                # every frame before the last one must have had its own final reply
                if len(terminal) < batch - 1:
                    result.bad_replies.append(f"batch answered {len(terminal)} of {batch - 1}+ frames")

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return result


# --------------------------------------------------------------------------- 2-3. memory


def huge_requests(sock_path: Path) -> list[str]:
    codes = []
    for header in (b"\xdb" + (1_200_000_000).to_bytes(4, "big"), b"\xdd\xff\xff\xff\xff"):
        messages = exchange(sock_path, pack({"op": "status", "id": 1}) + header + b"x" * (64 * MIB))
        codes.append("/".join(str(m.get("error", {}).get("code", "ok")) for m in messages))
    return codes


def never_reads(sock_path: Path, requests: int, log: Daemon) -> tuple[int, int, list[str]]:
    """Pipeline `requests` status requests without reading; returns (requests the daemon let in,
    replies read afterwards, the final error's message)."""
    one = pack({"op": "status", "id": 1})
    data = one * requests
    sock = connect(sock_path)
    sock.setblocking(False)
    sent, blocked_since = 0, None
    while sent < len(data) and (blocked_since is None or time.monotonic() - blocked_since < 2.0):
        try:
            sent += sock.send(data[sent : sent + (1 << 16)])
            blocked_since = None
        except BlockingIOError:
            blocked_since = blocked_since or time.monotonic()
            time.sleep(0.01)
    sock.setblocking(True)
    sock.settimeout(60)
    # The daemon closes it 10 s (its reply timeout) after it stopped reading, and drops what is
    # still unsent 2 s later: read once its log says so, to see the replies and the error.
    log.wait_for("left unread")
    messages = read_until_closed(sock)
    sock.close()
    errors = [m["error"]["message"] for m in messages if "error" in m]
    return sent // len(one), len(messages), errors


# --------------------------------------------------------------------------- 4. many clients


@dataclass
class ManyResult:
    requests: int = 0
    errors: list[str] = field(default_factory=list)
    unanswered: int = 0
    newest_answered: int = 0
    sessions: int = 0
    full: int = 0
    cancelled: int = 0
    seconds: float = 0.0


def many_clients(sock_path: Path, clients: int, per_client: int) -> ManyResult:
    result = ManyResult(sessions=clients)
    lock = threading.Lock()
    start = threading.Barrier(clients)

    def client(k: int) -> None:
        try:
            cmd = COMMANDS[k % len(COMMANDS)]
            with connect(sock_path, timeout=300) as sock:
                start.wait()
                data = b"".join(
                    pack({"op": "complete", "id": i, "n": 5, "session": f"typist-{k}",
                          "ctx": {"input": cmd[: i % (len(cmd) + 1)], "cwd": "/home/u"}})
                    for i in range(per_client)
                )  # fmt: skip
                sock.sendall(data)
                sock.shutdown(socket.SHUT_WR)
                messages = read_until_closed(sock)
            done = {m["id"]: m for m in messages if m.get("done")}
            with lock:
                result.requests += per_client
                result.errors.extend(str(m)[:200] for m in messages if "error" in m)
                result.unanswered += per_client - len(done)
                newest = done.get(per_client - 1)
                got = sum(1 for m in messages if m.get("id") == per_client - 1 and "candidate" in m)
                if newest is not None and not newest.get("cancelled") and got > 0:
                    result.newest_answered += 1
                result.cancelled += sum(1 for m in done.values() if m.get("cancelled"))
                result.full += sum(1 for m in done.values() if not m.get("cancelled"))
        except Exception as exc:
            with lock:
                result.errors.append(repr(exc))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result.seconds = time.perf_counter() - t0
    return result


# --------------------------------------------------------------------------- 5. flood vs shell


def type_like_a_shell(sock_path: Path, session: str) -> list[float]:
    """One keystroke at a time, one complete in flight: ms to `done` for each."""
    times = []
    with CalmClient(sock_path, timeout=60) as c:
        for cmd in COMMANDS:
            for i in range(len(cmd) + 1):
                t0 = time.perf_counter()
                for _ in c.complete(cmd[:i], n=5, session=session, cwd="/home/u/project"):
                    pass
                times.append((time.perf_counter() - t0) * 1e3)
    return times


class Flooder(threading.Thread):
    """Keeps `depth` completes of fresh sessions queued (none superseded: each one runs in
    full), reading replies as they come so that backpressure does not slow it down."""

    def __init__(self, sock_path: Path, depth: int = 64) -> None:
        super().__init__(daemon=True)
        self.sock = connect(sock_path)
        self.depth = depth
        self.stop = threading.Event()
        self.answered = 0
        self.errors = 0

    def run(self) -> None:
        unpacker = msgpack.Unpacker(raw=False)
        next_id = 0

        def send(count: int) -> None:
            nonlocal next_id
            data = b"".join(
                pack({"op": "complete", "id": next_id + i, "n": 5, "session": f"flood-{next_id + i}",
                      "ctx": {"input": COMMANDS[(next_id + i) % len(COMMANDS)][:3], "cwd": "/srv"}})
                for i in range(count)
            )  # fmt: skip
            next_id += count
            self.sock.sendall(data)

        send(self.depth)
        while not self.stop.is_set():
            unpacker.feed(self.sock.recv(1 << 16))
            finished = 0
            for m in unpacker:
                if m.get("done") or "error" in m:
                    finished += 1
                    self.errors += "error" in m
            self.answered += finished
            if finished:
                send(finished)
        self.sock.close()


# --------------------------------------------------------------------------- main


PROG = "bench/stress.py"


def main() -> None:
    parser = Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=paths.packaged_weights())
    parser.add_argument("--frames", type=int, default=100_000)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--unread", type=int, default=300_000, help="requests the never-reading client sends")
    parser.add_argument("--flood-only", action="store_true", help="only phase 5 (about a minute)")
    args = parser.parse_args()

    report = Report("calmd under hostile and careless clients, over the real socket")
    t_start = time.perf_counter()
    with daemon(weights=args.model, args=("--no-import", "--train-threshold", "0")) as d:
        proc, sock_path = d.proc, d.socket
        with CalmClient(sock_path) as c:  # warm the history index and the model's caches
            for cmd in COMMANDS:
                c.record(cmd, exit=0, cwd="/home/u/project", session="bench")
            type_like_a_shell(sock_path, "warm-up")
        sampler = Sampler(proc.pid)
        sampler.start()

        sampler.begin("idle")
        time.sleep(1.0)
        sampler.end()

        fz = huge = many = None
        let_in = read_back = 0
        unread_errors: list[str] = []
        if not args.flood_only:
            sampler.begin("fuzz")
            fz = fuzz(sock_path, args.frames)
            sampler.end()

            sampler.begin("huge")
            huge = huge_requests(sock_path)
            sampler.end()

            sampler.begin("no-reader")
            let_in, read_back, unread_errors = never_reads(sock_path, args.unread, d)
            sampler.end()

            sampler.begin("many")
            many = many_clients(sock_path, args.clients, args.requests)
            sampler.end()

        sampler.begin("flood")
        alone: list[float] = []
        flooded: list[float] = []
        flood_answered = flood_errors = 0
        for order in (("alone", "flood"), ("flood", "alone")):  # neither always goes first
            for case in order:
                if case == "alone":
                    alone += type_like_a_shell(sock_path, "shell")
                    continue
                flooder = Flooder(sock_path)
                flooder.start()
                time.sleep(0.5)  # the flood's queue is full before the shell starts typing
                flooded += type_like_a_shell(sock_path, "shell")
                flooder.stop.set()
                flooder.join(timeout=30)
                flood_answered += flooder.answered
                flood_errors += flooder.errors
        sampler.end()
        sampler.stop.set()
        alive = proc.poll() is None
        with CalmClient(sock_path) as c:
            status = c.status()["status"]
    log_text = d.read_output()
    total = time.perf_counter() - t_start

    print(f"model {args.model.name}; {total:.0f} s in all; daemon alive at the end: {alive}; "
          f"tracebacks in its log: {log_text.count('Traceback')}\n")  # fmt: skip
    if fz is not None and huge is not None and many is not None:
        print("1. fuzz")
        print(f"   {fz.frames} frames on {fz.connections} connections; {fz.terminal_replies} final replies")
        print(f"   error replies by code: {dict(fz.codes.most_common())}")
        print(f"   streams ended by a fatal error (too_large, not msgpack, cut short): {fz.closed_by_fatal}; "
              f"batches neither answered nor refused: {fz.unanswered_batches}")  # fmt: skip
        bad = fz.bad_replies
        print(f"   malformed replies, unknown codes or `internal`: {len(bad)} {bad[:3]}")
        print("2. huge requests (1.2 GB str32, 4G-item array32, each followed by 64 MiB)")
        print(f"   replies: {huge}")
        print(f"3. a client that never reads, {args.unread} pipelined status requests")
        print(f"   the daemon let in {let_in} before it stopped reading; {read_back} replies were left for")
        print(f"   the client, then: {unread_errors[-1] if unread_errors else 'no error'}")
        print(f"4. {args.clients} clients x {args.requests} completes, pipelined at once, one session each")
        print(f"   {many.seconds:.1f} s; errors: {len(many.errors)} {many.errors[:2]}; "
              f"unanswered: {many.unanswered}; newest answered: {many.newest_answered}/{many.sessions}; "
              f"run in full: {many.full}, "
              f"superseded: {many.cancelled}")  # fmt: skip
    print("5. a shell typing (one complete at a time) alone and while a client keeps 64 completes queued")
    print(f"   {'':<16}{'keystrokes':>11}{'done p50':>10}{'done p99':>10}{'max':>8}")
    for name, values in (("alone", alone), ("with the flood", flooded)):
        print(f"   {name:<16}{len(values):>11}{pct(values, 0.5):>10.1f}{pct(values, 0.99):>10.1f}"
              f"{max(values):>8.1f}")  # fmt: skip
    print(f"   p99 with / without the flood: {pct(flooded, 0.99) / pct(alone, 0.99):.2f}x (goal: <= 50 ms); "
          f"the flood's completes answered meanwhile: {flood_answered} ({flood_errors} errors)")  # fmt: skip
    print("\nthe daemon's memory and descriptors, per phase:")
    print(
        f"   {'phase':<10}{'seconds':>8}{'RSS peak MB':>13}{'RSS end MB':>12}{'fds peak':>10}{'fds end':>9}"
    )
    for name, p in sampler.phases.items():
        print(f"   {name:<10}{p.seconds:>8.1f}{p.rss_peak:>13.0f}{p.rss_end:>12.0f}{p.fds_peak:>10}"
              f"{p.fds_end:>9}")  # fmt: skip
    print(f"\ndaemon status at the end: {status['requests']} requests, {status['errors']} errors")
    report.machine()


if __name__ == "__main__":
    raise SystemExit(run_tool(PROG, main))
