"""The chat page in a real browser (Playwright driving Debian's Chromium) against a real mesh and
gateway: a progressive question shows the draft, then the refinement replaces it; and a page of
another origin streams an answer with fetch() from a gateway that allows that origin (CORS),
and is refused by one that does not."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.gateway_mesh import GatewayMesh, module_gateway

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
QUESTION = "What is your return policy?"
# records what the first answer shows after every change: (revision, text, state)
RECORDER = """
window.__snapshots = [];
new MutationObserver(() => {
  const item = document.querySelector(".assistant");
  if (!item) return;
  const text = item.querySelector(".text").textContent;
  const last = window.__snapshots[window.__snapshots.length - 1];
  const now = [item.dataset.revision || "", text, item.dataset.state];
  if (!last || last.join("\\u0000") !== now.join("\\u0000")) window.__snapshots.push(now);
}).observe(document, {subtree: true, childList: true, characterData: true, attributes: true});
"""


# what a frontend of another origin does: a streamed chat with an API key, read to the end
CROSS_ORIGIN_CHAT = """
async (url) => {
  try {
    const response = await fetch(url + "/v1/chat/completions", {
      method: "POST",
      headers: {"content-type": "application/json", "authorization": "Bearer x"},
      body: JSON.stringify({model: "tiermesh-small", stream: true, max_tokens: 16,
                            messages: [{role: "user", content: "What is your return policy?"}]}),
    });
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let body = "";
    for (;;) {
      const {done, value} = await reader.read();
      if (done) break;
      body += decoder.decode(value, {stream: true});
    }
    return {status: response.status, body: body};
  } catch (e) {
    return {error: String(e)};
  }
}
"""


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> Iterator[GatewayMesh]:
    yield from module_gateway(tmp_path_factory.mktemp("tiny-model-large"), tiny_model_dir)


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is absent")
def test_progressive_answer_draft_then_refinement(gateway: GatewayMesh, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    body = {"model": "tiermesh-progressive", "messages": [{"role": "user", "content": QUESTION}]}
    expected = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=60).json()
    answer_text = expected["choices"][0]["message"]["content"]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch_persistent_context(
            str(tmp_path / "profile"),
            executable_path=CHROMIUM,
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 390, "height": 844},
        )
        try:
            page = browser.new_page()
            page.add_init_script(RECORDER)
            page.goto(gateway.url + "/")
            assert page.locator("#mode").input_value() == "tiermesh-progressive"
            page.locator("#prompt").fill(QUESTION)
            page.keyboard.press("Enter")
            answer = page.locator(".assistant").first
            answer.and_(page.locator("[data-state=done]")).wait_for(timeout=60_000)
            snapshots = page.evaluate("window.__snapshots")
            shown = answer.locator(".text").text_content()
            meta = answer.locator(".meta").text_content() or ""
            badge = answer.locator(".badge").text_content()
            seen = answer.get_attribute("data-revisions-seen")
            width = page.evaluate("document.documentElement.scrollWidth")
            page.screenshot(path=str(tmp_path / "chat.png"), full_page=True)

            page.locator("#mode").select_option("tiermesh-small")
            page.locator("#prompt").fill("And shipping?")
            page.keyboard.press("Enter")
            second = page.locator(".assistant").nth(1)
            second.and_(page.locator("[data-state=done]")).wait_for(timeout=60_000)
            second_badge = second.locator(".badge").text_content()
        finally:
            browser.close()
    drafts = [text for revision, text, _ in snapshots if revision == "0" and text]
    assert drafts, f"no draft was shown: {snapshots}"
    first_refined = next(i for i, s in enumerate(snapshots) if s[0] == "1")
    assert first_refined > next(i for i, s in enumerate(snapshots) if s[0] == "0" and s[1])
    assert drafts[-1] != answer_text
    assert shown == answer_text
    assert seen == "0,1"
    assert badge == "final answer · large"
    assert "tier: large" in meta and "first draft:" in meta and "final:" in meta
    assert width <= 390
    assert (tmp_path / "chat.png").stat().st_size > 0
    assert second_badge == "answer · small"


class _Frontend(BaseHTTPRequestHandler):
    """A blank page: the origin a cross-origin frontend is served from."""

    def do_GET(self) -> None:
        page = b"<!doctype html><title>frontend</title>"
        self.send_response(200)
        self.send_header("content-type", "text/html")
        self.send_header("content-length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def frontend() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Frontend)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _sse_content(body: str) -> str:
    """The concatenated delta content of an SSE chat.completion stream."""
    events = [
        line.removeprefix("data: ") for line in body.splitlines() if line.startswith("data: ")
    ]
    chunks = [json.loads(e) for e in events if e != "[DONE]"]
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is absent")
def test_a_frontend_of_another_origin_streams_only_where_allowed(
    gateway: GatewayMesh, frontend: str, tmp_path: Path
) -> None:
    from playwright.sync_api import sync_playwright

    allowing = gateway.extra_gateway(cors_origins=(frontend,))
    messages = [{"role": "user", "content": QUESTION}]
    body = {"model": "tiermesh-small", "messages": messages, "max_tokens": 16}
    expected = httpx.post(f"{allowing}/v1/chat/completions", json=body, timeout=60).json()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
        )
        try:
            page = browser.new_page()
            page.goto(frontend + "/")
            allowed = page.evaluate(CROSS_ORIGIN_CHAT, allowing)
            refused = page.evaluate(CROSS_ORIGIN_CHAT, gateway.url)  # no origins configured
        finally:
            browser.close()
    assert allowed.get("status") == 200, allowed
    assert _sse_content(allowed["body"]) == expected["choices"][0]["message"]["content"]
    assert "Failed to fetch" in refused.get("error", ""), refused


@pytest.fixture(scope="module")
def short_context_gateway(tiny_model_dir: Path) -> Iterator[GatewayMesh]:
    """A mesh whose tiers take prompts of at most 96 tokens: a few turns fill it."""
    mesh = GatewayMesh.start(
        tiny_model_dir,
        tier_options={"max_prompt_tokens": 96},
        router_options={"default_max_tokens": 12},
    )
    yield mesh
    mesh.stop()


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is absent")
@pytest.mark.parametrize("model", ["tiermesh-progressive", "tiermesh-routed", "tiermesh-small"])
def test_a_six_turn_conversation_drops_its_oldest_turns_instead_of_failing(
    short_context_gateway: GatewayMesh, tmp_path: Path, model: str
) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
        )
        try:
            page = browser.new_page()
            page.goto(short_context_gateway.url + "/")
            page.locator("#mode").select_option(model)
            for turn in range(6):
                page.locator("#prompt").fill(f"What does item {turn} cost, and can I return it?")
                page.keyboard.press("Enter")
                answer = page.locator(".assistant").nth(turn)
                answer.and_(page.locator("[data-state=done], [data-state=error]")).wait_for(
                    timeout=60_000
                )
            states = page.eval_on_selector_all(
                ".assistant", "items => items.map(i => i.dataset.state)"
            )
            notes = page.eval_on_selector_all(
                ".assistant", "items => items.map(i => i.querySelector('.meta').textContent)"
            )
        finally:
            browser.close()
    assert states == ["done"] * 6, notes
    assert "earlier turns not sent" not in notes[0]
    assert any("earlier turns not sent" in note for note in notes[2:]), notes
