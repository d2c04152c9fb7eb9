"""What the tests of a shared benchmark use: a byte digest of a folder, and a read-only view of one.

A read-only view is a bind mount with ``-o ro`` in a private mount namespace (``unshare -m``):
root ignores file modes, so ``chmod -R a-w`` proves nothing when the tests run as root; a
read-only mount refuses every write, root's included.  Where such a mount cannot be made the
caller skips.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
from pathlib import Path


def tree_digest(root: str | os.PathLike[str]) -> str:
    """SHA-256 over every file's relative path and bytes under ``root`` (sorted)."""
    h = hashlib.sha256()
    base = Path(root)
    for path in sorted(p for p in base.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(base)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def read_only_mount_works() -> bool:
    """Whether this machine lets the tests bind-mount a folder read-only in a namespace of their own."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                            "d=$(mktemp -d) && mount --bind -o ro \"$d\" \"$d\" && ! touch \"$d/x\" 2>/dev/null"],
                           capture_output=True, text=True)
    return probe.returncode == 0


def run_read_only(bench: str | os.PathLike[str], argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    """``argv`` in a mount namespace where ``bench`` is a read-only bind mount of itself."""
    b = shlex.quote(str(bench))
    script = f"mount --bind -o ro {b} {b} && exec " + " ".join(shlex.quote(a) for a in argv)
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, **kwargs)
