"""The chat page in a real browser (Playwright driving Debian's Chromium) against a real mesh and
gateway: a progressive question shows the draft, then the refinement replaces it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

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
