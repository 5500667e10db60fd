"""`tiermesh chat` with no PROMPT, as a real child process against a real mesh (tiers and router
on port 0 in this test's event loop): a conversation driven through stdin and stdout pipes with
`--json` (history, /mode, /tier, /new, turns dropped when no tier holds the conversation), Ctrl-C
during an answer (SIGINT with pipes, and ^C typed in a pseudo-terminal), the session going on."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import pty
import select
import shutil
import signal
import struct
import termios
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tiermesh.client import AsyncRouterClient

from tests.e2e.run_process import ROOT, TIERMESH
from tests.integration.mesh import Mesh, start_mesh

READ_TIMEOUT_S = 60.0


@pytest.fixture(autouse=True)
def interruptible_children() -> Iterator[None]:
    """Children start with SIGINT's default action, as under a person's shell. Started from a
    shell without job control (a background job), this process ignores SIGINT and its children
    would inherit that: Ctrl-C would not reach `tiermesh chat` at all. A handler caught here is
    reset to the default by exec."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


class ChatProcess:
    """`tiermesh chat --router ADDRESS --json ARGS...` with stdin and stdout piped."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls, router: str, *args: str) -> ChatProcess:
        process = await asyncio.create_subprocess_exec(
            *TIERMESH,
            "chat",
            "--router",
            router,
            "--json",
            *args,
            cwd=ROOT,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        return cls(process)

    async def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line.encode() + b"\n")
        await self.process.stdin.drain()

    async def event(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), READ_TIMEOUT_S)
        assert line, "tiermesh chat ended: " + await self.stderr()
        event: dict[str, Any] = json.loads(line)
        return event

    async def ask(self, question: str) -> list[dict[str, Any]]:
        """The turn's lines, through its final or error line."""
        await self.send(question)
        events = [await self.event()]
        while events[-1]["type"] not in ("final", "error"):
            events.append(await self.event())
        return events

    async def stderr(self) -> str:
        assert self.process.stderr is not None
        return (await self.process.stderr.read()).decode()

    async def close(self) -> tuple[int, str]:
        """Ends the input; the exit status and everything written to stderr."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        stdout, stderr = await asyncio.wait_for(self.process.communicate(), READ_TIMEOUT_S)
        assert not stdout, stdout  # nothing but the turns' lines on stdout
        assert self.process.returncode is not None
        return self.process.returncode, stderr.decode()


def _prompt_tokens(final: dict[str, Any]) -> int:
    return max(u["prompt_tokens"] for u in final["usage"])


async def test_a_conversation_through_pipes_sends_its_history(tiny_model_dir: Path) -> None:
    mesh = await start_mesh(tiny_model_dir)
    chat = await ChatProcess.start(
        mesh.address, "--max-tokens", "6", "--progressive-gate", "always"
    )
    try:
        asked = [
            ("What is your return policy?", "routed", None),
            ("How much does the blue kettle cost?", "routed", None),
            ("/mode progressive", "progressive", ["small", "large"]),
            ("/tier medium", "pinned", ["medium"]),
            ("/mode routed", "routed", None),
            ("Thank you.", "routed", None),
        ]
        turns = []
        for n, (line, mode, tiers) in enumerate(asked, start=1):
            if line.startswith("/"):
                await chat.send(line)
                line = f"And question {n}?"
            events = await chat.ask(line)
            assert {e["turn"] for e in events} == {n}
            route, final = events[0], events[-1]
            assert (route["type"], final["type"]) == ("route", "final"), events[-1]
            assert route["mode"] == mode
            assert tiers is None or route["tiers"] == tiers
            assert route["dropped_turns"] == final["dropped_turns"] == 0
            turns.append(final)
        prompts = [_prompt_tokens(final) for final in turns]
        assert prompts == sorted(set(prompts)), prompts  # each turn carries the ones before

        await chat.send("/new")
        again = (await chat.ask("What is your return policy?"))[-1]
        assert _prompt_tokens(again) == prompts[0]  # the history forgotten
        rc, stderr = await chat.close()
    finally:
        await mesh.stop()
    assert rc == 0, stderr
    assert "mode: pinned to medium" in stderr and "new conversation (routed)" in stderr


async def test_a_conversation_no_tier_holds_loses_its_oldest_turns(tiny_model_dir: Path) -> None:
    limit = 64
    mesh = await start_mesh(tiny_model_dir, tier_options={"max_prompt_tokens": limit})
    chat = await ChatProcess.start(mesh.address, "--max-tokens", "6", "--mode", "progressive")
    try:
        finals = []
        for n in range(6):
            events = await chat.ask(f"What is the price of item {n}?")
            assert events[-1]["type"] == "final", events[-1]  # never an error for length
            finals.append(events[-1])
        # a question too long on its own is the one length error; the conversation goes on
        refused = (await chat.ask("What is the price of " + "the item and " * 40))[-1]
        after = (await chat.ask("And the shipping?"))[-1]
        rc, stderr = await chat.close()
    finally:
        await mesh.stop()
    dropped = [final["dropped_turns"] for final in finals]
    assert dropped == sorted(dropped) and dropped[-1] > 0, dropped
    assert all(_prompt_tokens(final) <= limit for final in finals)
    assert (refused["type"], refused["code"]) == ("error", "INVALID_ARGUMENT")
    assert refused["reason"] == "PROMPT_TOO_LONG"
    assert after["type"] == "final" and after["dropped_turns"] >= dropped[-1]
    assert rc == 0, stderr
    assert "earlier turns not sent" in stderr


async def _echo_mesh() -> Mesh:
    """Echo tiers at 5 tokens/s: an answer of 30 tokens takes 6 s."""
    options = {"engine": "echo", "echo_ttft_ms": 5.0, "echo_tokens_per_s": 5.0}
    return await start_mesh(Path("unused"), tier_options=options)


async def test_sigint_during_an_answer_cancels_it_and_the_session_goes_on() -> None:
    mesh = await _echo_mesh()
    args = ("--mode", "pinned", "--tier", "small", "--max-tokens", "30")
    chat = await ChatProcess.start(mesh.address, *args)
    try:
        await chat.send("Where is my order?")
        while (await chat.event())["type"] != "delta":
            pass
        chat.process.send_signal(signal.SIGINT)
        cancelled = await chat.event()
        while cancelled["type"] == "delta":  # written before the signal arrived
            cancelled = await chat.event()
        assert (cancelled["type"], cancelled["code"], cancelled["turn"]) == (
            "error",
            "CANCELLED",
            1,
        )
        await mesh.wait_idle("small", timeout_s=3.0)  # the tier's answer was cancelled too

        final = (await chat.ask("Where is my order?"))[-1]
        async with AsyncRouterClient(mesh.address) as client:
            alone = await client.chat(
                "Where is my order?", mode="pinned", tier="small", max_tokens=1
            )
        rc, stderr = await chat.close()
    finally:
        await mesh.stop()
    assert (final["type"], final["turn"]) == ("final", 2)
    assert len(final["text"].split()) == 30
    # the cancelled question is not part of the conversation
    assert _prompt_tokens(final) == alone.final.usage[0]["prompt_tokens"]
    assert rc == 0, stderr


class Terminal:
    """A pseudo-terminal whose controlling process is `tiermesh ARGS` (setsid --ctty), so ^C
    typed in it is the terminal's SIGINT."""

    def __init__(self, master: int, process: asyncio.subprocess.Process) -> None:
        self.master = master
        self.process = process
        self.screen = b""

    @classmethod
    async def open(cls, args: list[str]) -> Terminal:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
        env = {**os.environ, "TERM": "xterm-256color"}
        process = await asyncio.create_subprocess_exec(
            *["setsid", "--ctty", *TIERMESH, *args],
            cwd=ROOT,
            env=env,
            stdin=slave,
            stdout=slave,
            stderr=slave,
        )
        os.close(slave)
        return cls(master, process)

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)

    async def shows(self, text: str) -> None:
        """Reads the terminal until `text` appears, then drops what came before it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + READ_TIMEOUT_S
        wanted = text.encode()
        while wanted not in self.screen:
            assert loop.time() < deadline, f"{text!r} not shown: {self.screen[-2000:]!r}"
            self.screen += await asyncio.to_thread(self._read)
        self.screen = self.screen[self.screen.index(wanted) + len(wanted) :]

    def _read(self) -> bytes:
        ready, _, _ = select.select([self.master], [], [], 0.5)
        return os.read(self.master, 65536) if ready else b""


@pytest.mark.skipif(shutil.which("setsid") is None, reason="needs util-linux setsid")
async def test_ctrl_c_typed_in_a_terminal_cancels_the_answer_not_the_session() -> None:
    mesh = await _echo_mesh()
    terminal = await Terminal.open(["chat", "--router", mesh.address, "--max-tokens", "30"])
    process = terminal.process
    try:
        await terminal.shows("/help for commands")
        await terminal.shows("› ")
        terminal.type(b"Where is my order?\n")
        await terminal.shows("draft · ")  # the live view of the answer, as it streams
        terminal.type(b"\x03")
        await terminal.shows("cancelled")
        await terminal.shows("› ")
        terminal.type(b"/tier medium\n")
        await terminal.shows("mode: pinned to medium")
        terminal.type(b"Where is my order?\n")
        await terminal.shows("answer · revision 0 · medium")
        await terminal.shows("› ")
        terminal.type(b"\x04")  # Ctrl-D
        rc = await asyncio.wait_for(process.wait(), READ_TIMEOUT_S)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        os.close(terminal.master)
        await mesh.stop()
    assert rc == 0
