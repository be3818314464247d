"""A check by hand, in a real JupyterLab: a saved notebook shows the explorer in every display.

Not part of the test run (JupyterLab is not a test dependency). Run it from the repository root
with JupyterLab in a virtual environment of its own and Debian's chromium::

    python3 -m venv /tmp/jlab && /tmp/jlab/bin/pip install jupyterlab
    python docs/notebooks/jupyterlab_check.py /tmp/jlab/bin/jupyter

It executes a notebook that displays ``ac.explore`` twice in a fresh kernel of this
environment (nbclient), trusts it, serves its folder with ``jupyter lab`` and opens it in
headless chromium (``tests/browser.py``); then, in every frame of the page, reads whether the
explorer drew itself (``data-ready``), and writes a screenshot to ``jupyterlab.png`` in the
temporary folder it prints. It exits 1 unless every display shows the explorer. Found with it:
JupyterLab rewrites an output's relative ``src`` to its ``/files/`` URL a moment after the
output is inserted, and an iframe that loads at once fetched the relative URL first, which the
lab serves as its own app: the first display showed a blank nested JupyterLab (fixed with
``loading="lazy"``); and ``import attncoda`` then ``ac.explore`` printed a red TqdmWarning
(fixed in ``attncoda._progress``).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
PORT = 8899
SETUP = """import attncoda as ac
ds = ac.testing.synthetic_rows(n_samples=2, n_layers=2, n_heads=3, length=12)
ex = ac.explore(ds)
ex"""


def main(jupyter: str) -> int:
    import nbformat
    from browser import DevTools, Page, chromium
    from nbclient import NotebookClient

    work = Path(tempfile.mkdtemp(prefix="attncoda-jupyterlab-"))
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(SETUP), nbformat.v4.new_code_cell("ex")]
    NotebookClient(nb, kernel_name="python3", resources={"metadata": {"path": str(work)}}).execute()
    path = work / "explorer.ipynb"
    nbformat.write(nb, path)
    stderr = "".join(
        o.get("text", "")
        for c in nb.cells
        for o in c.get("outputs", [])
        if o.get("name") == "stderr"
    )
    subprocess.run([jupyter, "trust", str(path)], check=True, capture_output=True)
    server = subprocess.Popen(
        [jupyter, "lab", "--no-browser", f"--port={PORT}", "--ServerApp.token=",
         "--ServerApp.password=", "--allow-root", f"--ServerApp.root_dir={work}"],
        stdout=subprocess.DEVNULL,
        stderr=(work / "server.log").open("w"),
    )  # fmt: skip
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{PORT}/api/status", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        binary = chromium()
        if binary is None:
            sys.exit("needs chromium (apt-get install chromium)")
        dt = DevTools(binary, work / "profile")
        try:
            target = dt.call("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = dt.call("Target.attachToTarget", {"targetId": target, "flatten": True})
            tab = Page(dt, session["sessionId"])
            for domain in ("Network", "Page", "Runtime"):
                tab.call(f"{domain}.enable")
            tab.call(
                "Emulation.setDeviceMetricsOverride",
                {"width": 1400, "height": 1000, "deviceScaleFactor": 1, "mobile": False},
            )
            tab.call("Page.navigate", {"url": f"http://127.0.0.1:{PORT}/lab/tree/explorer.ipynb"})
            for _ in range(120):
                time.sleep(0.5)
                if tab.evaluate("document.querySelectorAll('.jp-OutputArea-output iframe').length"):
                    break
            time.sleep(5)
            # scroll each display into view, so that a lazy frame loads
            tab.evaluate(
                "Array.from(document.querySelectorAll('.jp-OutputArea-output iframe'))"
                ".forEach(f => f.scrollIntoView())"
            )
            time.sleep(3)
            shown = []
            for info in dt.call("Target.getTargets")["targetInfos"]:
                if info["type"] != "iframe":
                    continue
                sid = dt.call(
                    "Target.attachToTarget", {"targetId": info["targetId"], "flatten": True}
                )
                frame = Page(dt, sid["sessionId"])
                frame.call("Runtime.enable")
                ready = frame.evaluate("[document.documentElement.dataset.ready, document.title]")
                shown.append((info["url"].split("?")[0], ready))
            tab.screenshot(work / "jupyterlab.png")
        finally:
            dt.close()
    finally:
        server.terminate()
        server.wait(10)
    ok = len(shown) >= 2 and all(r[0] == "1" for _, r in shown) and "TqdmWarning" not in stderr
    for url, ready in shown:
        print(url, ready)
    print("red TqdmWarning in the cells:", "TqdmWarning" in stderr)
    print("screenshot:", work / "jupyterlab.png", "-", "ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "jupyter"))
