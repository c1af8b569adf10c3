#!/usr/bin/env python3
"""Build reproducible wheels of the given source trees on the controller, once per source content.

Usage: build_wheels.py OUT_DIR SOURCE [SOURCE ...]

Each source (a directory with pyproject.toml) is hashed file by file; a wheel already built from the same
content is reused from OUT_DIR/<digest>/, so that the several plays of one run (and later runs) build each
wheel once. SOURCE_DATE_EPOCH fixes the archive's timestamps: unchanged source, identical bytes. A source
that is a built wheel (a `.whl` file: the one the collection carries) is taken as it is; OUT_DIR is then
left alone.
Prints one JSON object: {"wheels": [{"source", "path", "name", "sha256"}, ...]}.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SKIP_DIRS = {"build", "__pycache__", ".pytest_cache", ".ruff_cache"}


def source_digest(src: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in rel.parts):
            continue
        if path.is_file() and path.suffix != ".pyc":
            digest.update(str(rel).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def build(src: Path, dest: Path) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        ignore = shutil.ignore_patterns("*.egg-info", *SKIP_DIRS, "*.pyc")
        tree = Path(tmp) / "src"
        shutil.copytree(src, tree, ignore=ignore)
        dist = Path(tmp) / "dist"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--quiet",
                "--no-deps",
                "--disable-pip-version-check",
                "--wheel-dir",
                str(dist),
                str(tree),
            ],
            check=True,
            stdout=sys.stderr,
            env={**os.environ, "SOURCE_DATE_EPOCH": "315532800"},
        )
        (wheel,) = dist.glob("*.whl")
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy2(wheel, dest / wheel.name)
        return dest / wheel.name


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    out, sources = Path(argv[0]), [Path(s).resolve() for s in argv[1:]]
    for src in sources:
        if not (is_wheel(src) or (src / "pyproject.toml").is_file()):
            print(f"{src}: neither a built wheel nor a directory with pyproject.toml", file=sys.stderr)
            return 2
    built = {}
    if not all(is_wheel(src) for src in sources):
        out.mkdir(parents=True, exist_ok=True)
        # Plays of one run on several hosts may call this at once: one builder at a time per OUT_DIR.
        with (out / ".lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            for src in sources:
                if not is_wheel(src):
                    dest = out / source_digest(src)
                    found = sorted(dest.glob("*.whl")) if dest.is_dir() else []
                    built[src] = found[0] if found else build(src, dest)
    wheels = []
    for src in sources:
        wheel = built.get(src, src)
        wheels.append(
            {
                "source": str(src),
                "path": str(wheel),
                "name": wheel.name,
                "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
            }
        )
    print(json.dumps({"wheels": wheels}))
    return 0


def is_wheel(src: Path) -> bool:
    return src.suffix == ".whl" and src.is_file()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
