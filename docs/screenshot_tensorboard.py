"""Screenshot a TensorBoard page headless (how docs/tensorboard_*.png were made).

Needs Chromium and Playwright, which the package itself does not::

    apt-get install -y chromium && python -m venv /tmp/pw && /tmp/pw/bin/pip install playwright
    python examples/quickstart.py --logdir /tmp/qs
    tensorboard --logdir /tmp/qs --port 6007 &
    /tmp/pw/bin/python docs/screenshot_tensorboard.py \
        "http://localhost:6007/#custom_scalars" docs/tensorboard_custom_scalars.png
    /tmp/pw/bin/python docs/screenshot_tensorboard.py \
        "http://localhost:6007/#scalars&tagFilter=%5ETime%2F(DataLoading%7CCompute)%24" docs/tensorboard_scalars.png
"""

import sys
import time

from playwright.sync_api import sync_playwright


def main(url: str, out: str, height: int = 1000) -> None:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": height})
        page.goto(url)
        time.sleep(7)  # TensorBoard loads its data after the page
        page.screenshot(path=out)
        browser.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
