"""Safe unpacking of an uploaded model directory (.tar.gz, .tar or .zip) into a private folder.

Every member is checked before a byte is written: a relative path without `..`, backslashes or a
drive, a regular file or a folder (no symbolic or hard links, devices or FIFOs), at most
MAX_MEMBERS members, at most MAX_UNPACKED bytes in all and at most MAX_RATIO times the archive's
own size (an archive bomb). Files are written by this code (never `extractall`), created
exclusively and without following links.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from models.declaration import InvalidModelError

MAX_MEMBERS = 1000
MAX_UNPACKED = 4 << 30  # bytes
MAX_RATIO = 20  # unpacked bytes per archive byte (safetensors barely compress: ~1.1)
RATIO_SLACK = 1 << 20  # small archives may unpack to this much regardless of the ratio
CHUNK = 1 << 20
READ_ERRORS = (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, OSError)


class ArchiveTooLargeError(InvalidModelError):
    """The archive unpacks to more than the limits allow (413)."""


@dataclass(frozen=True)
class Member:
    """One archive entry: its checked path, whether it is a folder, its declared size."""

    path: PurePosixPath
    is_dir: bool
    size: int


def is_gzip(data: bytes) -> bool:
    return data[:2] == b"\x1f\x8b"


def is_tar(data: bytes) -> bool:
    return data[257:262] == b"ustar"


def is_zip(data: bytes) -> bool:
    return data[:4] == b"PK\x03\x04"


def zip_names(data: bytes) -> list[str]:
    """The member names of a zip archive ([] when it is not one)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            return zf.namelist()
    except (zipfile.BadZipFile, ValueError):
        return []


def _checked_path(name: str) -> PurePosixPath:
    """A member name as a safe relative path (InvalidModelError otherwise)."""
    if not name or "\\" in name or "\x00" in name or name.startswith("/") or ":" in name:
        raise InvalidModelError(
            f"archive member {name!r}: only relative paths with '/' are allowed"
        )
    parts = [p for p in PurePosixPath(name).parts if p != "."]
    if ".." in parts:
        raise InvalidModelError(f"archive member {name!r}: '..' paths are refused")
    return PurePosixPath(*parts) if parts else PurePosixPath(".")


def _tar_members(tf: tarfile.TarFile) -> list[tuple[Member, tarfile.TarInfo]]:
    out: list[tuple[Member, tarfile.TarInfo]] = []
    for info in tf:
        if len(out) >= MAX_MEMBERS:
            raise InvalidModelError(f"archive has more than {MAX_MEMBERS} members")
        if info.issym() or info.islnk():
            raise InvalidModelError(f"archive member {info.name!r} is a link: links are refused")
        if not (info.isfile() or info.isdir()):
            raise InvalidModelError(
                f"archive member {info.name!r} is not a regular file or folder (a device or "
                "FIFO): refused"
            )
        out.append((Member(_checked_path(info.name), info.isdir(), info.size), info))
    return out


def _zip_members(zf: zipfile.ZipFile) -> list[tuple[Member, zipfile.ZipInfo]]:
    infos = zf.infolist()
    if len(infos) > MAX_MEMBERS:
        raise InvalidModelError(f"archive has more than {MAX_MEMBERS} members")
    out = []
    for info in infos:
        mode = info.external_attr >> 16
        kind = stat.S_IFMT(mode)
        if kind == stat.S_IFLNK:
            raise InvalidModelError(f"archive member {info.filename!r} is a link: refused")
        if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
            raise InvalidModelError(
                f"archive member {info.filename!r} is not a regular file or folder: refused"
            )
        if info.flag_bits & 0x1:
            raise InvalidModelError(f"archive member {info.filename!r} is encrypted")
        member = Member(_checked_path(info.filename), info.is_dir(), info.file_size)
        out.append((member, info))
    return out


def _entries(data: bytes) -> Iterator[tuple[Member, IO[bytes] | None]]:
    """(member, its byte stream or None for folders), every member checked before the first."""
    if is_zip(data):
        try:
            zf = zipfile.ZipFile(io.BytesIO(data))
        except (zipfile.BadZipFile, ValueError) as exc:
            raise InvalidModelError(f"not a readable zip archive: {exc}") from None
        with zf:
            members = _zip_members(zf)
            for member, info in members:
                yield member, None if member.is_dir else zf.open(info)
        return
    if not (is_gzip(data) or is_tar(data)):
        raise InvalidModelError("a Hugging Face model is a .tar.gz, .tar or .zip of its folder")
    try:
        tf = tarfile.open(fileobj=io.BytesIO(data), mode="r:*")  # noqa: SIM115 (closed below)
        tar_members = _tar_members(tf)
    except READ_ERRORS as exc:
        raise InvalidModelError(f"not a readable .tar.gz/.tar archive: {exc}") from None
    with tf:
        for member, tinfo in tar_members:
            yield member, None if member.is_dir else tf.extractfile(tinfo)


def list_members(data: bytes) -> list[Member]:
    """Every member of the archive, checked (nothing is unpacked)."""
    return [m for m, _ in _entries(data)]


def read_member(data: bytes, path: PurePosixPath, limit: int = 1 << 20) -> bytes | None:
    """One small member's bytes (at most `limit`), or None when the archive has no such file."""
    for member, stream in _entries(data):
        if member.path == path and stream is not None:
            out = _read(stream, limit + 1)
            if len(out) > limit:
                raise ArchiveTooLargeError(f"{path} is larger than {limit} bytes")
            return out
    return None


def _read(stream: IO[bytes], size: int) -> bytes:
    try:
        return stream.read(size)
    except READ_ERRORS as exc:
        raise InvalidModelError(f"a corrupt archive member: {exc}") from None


def unpack(data: bytes, dest: Path) -> None:
    """Unpack the archive into the empty folder `dest` under the limits (module docstring)."""
    cap = min(MAX_UNPACKED, MAX_RATIO * len(data) + RATIO_SLACK)
    written = 0
    for member, stream in _entries(data):
        target = dest.joinpath(*member.path.parts)
        if member.is_dir or stream is None:
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        try:
            fd = os.open(target, flags, 0o600)
        except FileExistsError:
            raise InvalidModelError(f"archive member {member.path} appears twice") from None
        with os.fdopen(fd, "wb") as out:
            while block := _read(stream, CHUNK):
                written += len(block)
                if written > cap:
                    raise ArchiveTooLargeError(_too_large(cap, len(data)))
                out.write(block)


def _too_large(cap: int, size: int) -> str:
    if cap < MAX_UNPACKED:
        return (
            f"the archive unpacks to more than {MAX_RATIO}x its {size} bytes: refused as a "
            "possible archive bomb"
        )
    return f"the archive unpacks to more than {MAX_UNPACKED} bytes"


def check_sizes(data: bytes) -> None:
    """Decompress every member without writing it: ArchiveTooLargeError beyond the limits."""
    cap = min(MAX_UNPACKED, MAX_RATIO * len(data) + RATIO_SLACK)
    total = 0
    for _, stream in _entries(data):
        while stream is not None and (block := _read(stream, CHUNK)):
            total += len(block)
            if total > cap:
                raise ArchiveTooLargeError(_too_large(cap, len(data)))
