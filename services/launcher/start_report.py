"""What `tiermesh run` prints once its mesh is up: the table of services (each tier's model,
memory and cold start), the cold-start phases, the commands to try, and the demo chat.

Output only: it starts nothing; tier statuses come from the caller.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from services.common import env
from services.common.tiers import TIER_NAMES
from services.launcher import tier_summary
from services.launcher.secure_run import SecureRun

if TYPE_CHECKING:
    from tiermesh.v1 import tier_pb2

    from services.common.child_process import Child


def print_start_report(
    children: list[Child],
    console: Console,
    status_of: Callable[[str], tier_pb2.TierStatus | None],
    secure: SecureRun | None = None,
) -> None:
    """The table of services (with each tier's model, memory and cold start from `status_of`
    its address), the cold-start phases, where the logs are, and what to try next."""
    table = Table(title="tiermesh is up")
    for column in ("service", "address", "pid", *tier_summary.COLUMNS):
        table.add_column(column, no_wrap=column == "address")
    cold_starts = []
    for child in children:
        pid = str(child.process.pid) if child.process else "-"
        tier = child.name.partition("-")[0]  # "small-2" is a replica of small
        cells = ("", "", "")
        if tier in TIER_NAMES:
            status = status_of(child.address)
            cells = tier_summary.tier_cells(status)
            cold_starts.append(tier_summary.startup_line(child.name, status))
        table.add_row(child.name, child.address, pid, *cells)
    console.print(table)
    lines = [line for line in cold_starts if line]
    if lines:
        console.print("cold start to SERVING:")
        for line in lines:
            console.print(f"  {line}")
    console.print(f"logs: {children[0].log_path.parent}/<service>.log")
    router = children[-1].address
    flag = "" if router == env.DEFAULT_ROUTER_ADDRESS else f" --router {router}"
    if secure is not None:
        console.print(
            f"secure: TLS on every service, mTLS router -> tiers, API keys in {secure.keys_file}"
            f"; certificates in {secure.certs}"
        )
        console.print("  a key: [bold]tiermesh keys create --name demo --scopes chat[/bold]")
        flag += f" --ca {secure.ca} --api-key KEY"
    console.print(
        f'try: [bold]tiermesh chat{flag} --mode progressive "How long does delivery take?"[/bold]'
    )
    if secure is None:  # a secure run's top needs the router's certificate flags too
        console.print("live load of every tier: [bold]tiermesh top[/bold]")
    gateway = next((c for c in children if c.name == "gateway"), None)
    if gateway is not None:
        console.print(f"chat page: [bold]http://{gateway.address}/[/bold]")
        console.print(f"OpenAI API: http://{gateway.address}/v1 (model tiermesh-progressive, ...)")


def demo_chat(router: str, prompt: str, console: Console, secure: SecureRun | None = None) -> None:
    """One progressive chat through the router, drawn live: with the gate `always`, so the
    small tier's draft is shown and then replaced by the large tier's answer (the router's own
    gate, escalate, replaces only an answer it is unsure of)."""
    from tiermesh.client import RouterClient, tls_credentials

    from services.terminal.chat_view import show_live

    console.print(
        f"[bold]demo:[/bold] progressive chat, every draft refined (gate always): {prompt!r}"
    )
    credentials, key = None, None
    if secure is not None:
        credentials, key = tls_credentials(secure.ca), secure.demo_key()
    with RouterClient(router, credentials=credentials, api_key=key) as client:
        events = client.chat_stream(
            prompt, mode="progressive", progressive_gate="always", timeout=120
        )
        show_live(events, console)
