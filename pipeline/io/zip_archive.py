"""A model archive (``.pt2``, TorchScript, a ``torch.save`` zip) read as torch reads it.

Python's ``zipfile`` and torch's reader (miniz, inside ``PyTorchFileReader``) do not read
the same zip the same way:

- a name stored twice: ``zipfile`` keeps the last copy under that name, torch's lookup
  finds one of them (a binary search over a sorted listing, so which one is not promised);
- names are matched case-insensitively by torch, exactly by ``zipfile``;
- ``zipfile`` cuts a name at its first NUL byte, torch does not;
- ``zipfile`` tolerates bytes prepended to the archive (it shifts every offset), and both
  readers find the listing from the end, past any comment;
- torch takes the archive's folder from the first member only.

So a check made through ``zipfile`` can pass one file while torch loads another.
:func:`read_members` refuses an archive whose members could be read two ways (a name
twice, also when it differs only by case; a name with an empty, ``.`` or ``..`` part,
a backslash, a NUL, a trailing slash; members outside one top folder; bytes before the
first member), naming the file and the member, and returns every member's bytes.
:func:`rebuild` writes those very members, and nothing else, into a fresh archive: the
loader reads that, so what was checked is what is loaded.
"""

from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass

from pipeline.errors import CnsbenchError

LOCAL_HEADER = b"PK\x03\x04"


class UnsafeArchive(CnsbenchError):
    """A model archive that is not a zip, could be read two ways, or holds what would run code."""


@dataclass(frozen=True)
class Members:
    """An archive's members: its one top folder and each member's bytes by its path below it."""

    top: str
    files: dict[str, bytes]


def _name_problem(info: zipfile.ZipInfo) -> str:
    name = info.orig_filename
    if "\0" in name:
        return "holds a NUL byte (zip readers disagree on where the name ends)"
    if "\\" in name:
        return "holds a backslash"
    if name.endswith("/"):
        return "is a folder entry (a trailing slash)"
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "has an empty, '.' or '..' part (a second spelling of another member's path)"
    if len(parts) < 2:
        return "is not inside the archive's top folder"
    return ""


def read_members(data: bytes, path: str) -> Members:
    """Every member of the zip ``data`` (the bytes of ``path``), or :class:`UnsafeArchive`
    naming ``path`` and the member that zip readers could read two ways."""
    if not data.startswith(LOCAL_HEADER):
        what = "an empty zip" if data.startswith(b"PK\x05\x06") else \
            "bytes before the first member" if LOCAL_HEADER in data else "not a zip file"
        raise UnsafeArchive(f"{path}: not a readable model archive ({what}); refused")
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, EOFError, ValueError) as err:
        raise UnsafeArchive(f"{path}: not a readable model archive (not a zip file: {err})") from None
    files: dict[str, bytes] = {}
    seen: dict[str, str] = {}  # casefolded name -> the name first seen
    with zf:
        for info in zf.infolist():
            problem = _name_problem(info)
            if problem:
                raise UnsafeArchive(f"{path}: member {info.orig_filename!r} {problem}; refused")
            key = info.filename.casefold()
            if key in seen:
                what = f"member {info.filename!r} twice" if seen[key] == info.filename else \
                    f"members {seen[key]!r} and {info.filename!r}, one name to torch's reader (it ignores case)"
                raise UnsafeArchive(f"{path}: holds {what}; zip readers disagree on which copy they load; refused")
            seen[key] = info.filename
            try:
                files[info.filename] = zf.read(info)
            except (zipfile.BadZipFile, EOFError, ValueError, NotImplementedError, RuntimeError) as err:
                raise UnsafeArchive(f"{path}: member {info.filename!r} cannot be read ({err}); refused") from None
    if not files:
        raise UnsafeArchive(f"{path}: not a readable model archive (no members)")
    tops = sorted({name.split("/", 1)[0] for name in files})
    if len(tops) != 1:
        raise UnsafeArchive(f"{path}: not a readable model archive (expected one top folder, found {tops[:5]})")
    return Members(tops[0], {name.split("/", 1)[1]: body for name, body in files.items()})


def rebuild(members: Members) -> bytes:
    """A fresh zip holding exactly ``members`` (stored, in order, no comment): the bytes a
    loader reads after :func:`read_members` checked them."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zf:
        for rel, body in members.files.items():
            zf.writestr(zipfile.ZipInfo(f"{members.top}/{rel}"), body)
    return out.getvalue()
