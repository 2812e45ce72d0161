"""Open an HTML file in headless Chromium (Debian's ``chromium``) and report on its images.

``image_report`` loads a copy of the page with a small script appended that, after the load
event, draws every ``<img>`` onto a canvas and records whether it loaded, its size and how many
distinct colours a sample of its pixels has; Chromium's ``--dump-dom`` returns the page with
that record. ``screenshot`` takes the ``--screenshot`` of the page itself.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

# without the background-networking flags Chromium hangs on the closed network
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]

_PROBE = """<script>
window.addEventListener('load', () => {
  const out = [...document.images].map((img) => {
    const c = document.createElement('canvas');
    c.width = img.naturalWidth; c.height = img.naturalHeight;
    const g = c.getContext('2d');
    let colors = 0;
    if (img.complete && img.naturalWidth > 0) {
      g.drawImage(img, 0, 0);
      const d = g.getImageData(0, 0, c.width, c.height).data;
      const seen = new Set();
      for (let i = 0; i < d.length; i += 4 * 13) seen.add((d[i] << 16) | (d[i + 1] << 8) | d[i + 2]);
      colors = seen.size;
    }
    return {alt: img.alt, complete: img.complete, width: img.naturalWidth, height: img.naturalHeight, colors};
  });
  const pre = document.createElement('pre');
  pre.id = 'llmsla-probe';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def binary() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, "chromium not found: scripts/bootstrap.sh installs it (apt-get install chromium)"
    return path


def _run(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        return subprocess.run([binary(), *FLAGS, f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=timeout)


def image_report(page: Path) -> list[dict]:
    """Per ``<img>``: alt, complete, natural width/height, distinct colours in a pixel sample."""
    probe = page.with_name(page.stem + ".probe.html")
    probe.write_text(page.read_text().replace("</body>", _PROBE + "</body>"))
    out = _run(["--virtual-time-budget=15000", "--dump-dom", probe.resolve().as_uri()])
    m = re.search(r'<pre id="llmsla-probe">(.*?)</pre>', out.stdout, re.S)
    assert m, f"chromium did not run the probe: {out.returncode} {out.stderr[-2000:]}"
    return json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))


def screenshot(page: Path, png: Path, *, width: int = 1250, height: int = 4000) -> None:
    out = _run([f"--window-size={width},{height}", f"--screenshot={png}", page.resolve().as_uri()])
    assert png.exists() and png.stat().st_size > 0, out.stderr[-2000:]
