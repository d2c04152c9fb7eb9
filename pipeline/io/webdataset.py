"""Deterministic WebDataset tar shards: ``<key>.<ext>`` members grouped by sample key.

Members carry fixed metadata (mtime 0, uid/gid 0, mode 0644) and are written in the
given order, so the same samples always produce byte-identical shards.
"""

from __future__ import annotations

import io
import tarfile
from typing import Any, Iterable, Iterator

from pipeline.errors import CnsbenchError
from pipeline.io.safejson import dumps as strict_dumps


def build_tar(samples: Iterable[tuple[str, dict[str, bytes]]]) -> bytes:
    """``samples``: (key, {extension: bytes}) pairs -> the tar archive's bytes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for key, members in samples:
            if "." in key.rsplit("/", 1)[-1]:
                raise CnsbenchError(f"WebDataset key {key!r} must not contain '.' in its last path part")
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                info.mtime = 0
                info.mode = 0o644
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def tar_members(tar: tarfile.TarFile) -> Iterator[tuple[str, str, tarfile.TarInfo]]:
    """(sample key, extension, member) of each file of an open tar, in archive order:
    ``a/b/0001.seg.png`` is key ``a/b/0001``, extension ``seg.png``."""
    for info in tar:
        if not info.isfile():
            continue
        head, _, tail = info.name.rpartition("/")
        stem, _, ext = tail.partition(".")
        yield (f"{head}/{stem}" if head else stem), ext, info


def iter_tar(data: bytes, source: str = "<tar>") -> Iterator[tuple[str, dict[str, bytes]]]:
    """Yield (key, {extension: bytes}) from tar bytes; raises ValueError naming ``source`` if malformed."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            current, found = None, {}
            for key, ext, info in tar_members(tar):
                if current is not None and key != current:
                    yield current, found
                    found = {}
                current = key
                found[ext] = tar.extractfile(info).read()
            if current is not None:
                yield current, found
    except (tarfile.TarError, EOFError, OSError) as err:
        raise CnsbenchError(f"malformed WebDataset shard {source}: {err}") from None


def metadata_json(meta: dict[str, Any]) -> bytes:
    return strict_dumps(meta, sort_keys=True).encode("utf-8")
