"""Headless Debian chromium driven by Playwright (never a downloaded browser), for dashboard tests
and the page-load benchmark."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from playwright.sync_api import Browser, Page, sync_playwright

CHROMIUM = os.environ.get("AICLUSTER_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
LAPTOP = {"width": 1366, "height": 768}
WIDE = {"width": 2560, "height": 1440}
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


@contextmanager
def chromium() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield browser
        finally:
            browser.close()


def sign_in(page: Page, url: str, token: str) -> None:
    page.goto(f"{url}/ui/")
    page.fill("#token", token)
    page.click("#sign-in")
    page.wait_for_selector("#app:not([hidden])")


def screenshot(page: Page, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=False)
    return path
