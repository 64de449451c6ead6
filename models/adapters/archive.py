"""Safe unpacking of an uploaded model directory (.tar.gz, .tar or .zip) into a private folder.

Every member is checked before a byte is written: a relative path without `..`, backslashes or a
drive, a regular file or a folder (no symbolic or hard links, devices or FIFOs), at most
MAX_MEMBERS members, at most MAX_UNPACKED bytes in all and at most MAX_RATIO times the archive's
own size (an archive bomb). Files are written by this code (never `extractall`), created
exclusively and without following links.

`check_inflation` reads a zip's central directory only (TorchScript archives, zips of
checkpoints) and refuses, before anything is decompressed, a member that inflates more than
MAX_MEMBER_RATIO times (members over RATIO_SLACK), or members that add up to more than a bound.
"""

from __future__ import annotations

import encodings.cp437  # noqa: F401  (zipfile decodes member names with it: loaded before a sandboxed worker's chroot)
import gzip
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
MAX_MEMBER_RATIO = 100  # per zip member over RATIO_SLACK (zeros deflate about 1000:1)
INFLATE_FACTOR = 4  # a zip's members add up to at most this many times its own size (+ slack)
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


MAX_HEADER_BYTES = 64 << 10  # a PAX or GNU long-name header's own data


def _tar_size(field: bytes) -> int:
    """A tar header's size field: octal digits, or base-256 when its first bit is set."""
    if field[:1] and field[0] & 0x80:
        return int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big")
    digits = field.split(b"\0", 1)[0].strip()
    try:
        return int(digits or b"0", 8)
    except ValueError:
        raise InvalidModelError("not a readable .tar.gz/.tar archive: a bad size field") from None


def check_tar_headers(data: bytes) -> None:
    """Walk the tar's 512-byte headers on the (decompressed) stream, skipping member data a
    chunk at a time, before `tarfile` reads any: a PAX or GNU long-name header whose data
    claims more than MAX_HEADER_BYTES is refused (tarfile would read it whole into memory: a
    1 MB upload claiming 1 GB took +1 GB), as is a stream past the unpack cap."""
    cap = min(MAX_UNPACKED, MAX_RATIO * len(data) + RATIO_SLACK)
    raw: IO[bytes] | gzip.GzipFile = io.BytesIO(data)
    if is_gzip(data):
        raw = gzip.GzipFile(fileobj=raw)
    seen = 0
    try:
        while True:
            header = raw.read(512)
            seen += len(header)
            if len(header) < 512 or header == bytes(512):
                return
            size, kind = _tar_size(header[124:136]), header[156:157]
            padded = -(-size // 512) * 512
            if kind in (b"x", b"g", b"L", b"K") and size > MAX_HEADER_BYTES:
                raise InvalidModelError(
                    f"archive header {kind.decode()!r} claims {size} bytes of metadata (at most "
                    f"{MAX_HEADER_BYTES}): refused before reading it"
                )
            if seen + padded > cap:
                raise ArchiveTooLargeError(_too_large(cap, len(data)))
            left = padded
            while left:
                got = len(raw.read(min(CHUNK, left)))
                if not got:
                    return  # truncated: tarfile says how
                left -= got
            seen += padded
    except (OSError, EOFError, zlib.error) as exc:
        raise InvalidModelError(f"not a readable .tar.gz/.tar archive: {exc}") from None


def _check_tree(members: list[Member]) -> None:
    """A member may not lie under a path that is a file of the archive (`x`, then `x/y`)."""
    files = {m.path for m in members if not m.is_dir}
    for m in members:
        for parent in m.path.parents:
            if parent in files:
                raise InvalidModelError(
                    f"archive member {str(m.path)!r} lies under {str(parent)!r}, which is a file"
                )


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
            _check_tree([m for m, _ in members])
            for member, info in members:
                yield member, None if member.is_dir else zf.open(info)
        return
    if not (is_gzip(data) or is_tar(data)):
        raise InvalidModelError("a Hugging Face model is a .tar.gz, .tar or .zip of its folder")
    check_tar_headers(data)
    try:
        tf = tarfile.open(fileobj=io.BytesIO(data), mode="r:*")  # noqa: SIM115 (closed below)
        tar_members = _tar_members(tf)
    except READ_ERRORS as exc:
        raise InvalidModelError(f"not a readable .tar.gz/.tar archive: {exc}") from None
    _check_tree([m for m, _ in tar_members])
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


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n / 1024:.1f} KiB"


def check_inflation(
    data: bytes,
    max_total: int | None = None,
    max_ratio: int = MAX_MEMBER_RATIO,
    max_members: int = 100_000,
) -> None:
    """Refuse a zip from its central directory, before a byte is decompressed: a member over
    RATIO_SLACK that inflates more than `max_ratio` times, members that add up to more than
    `max_total` (default INFLATE_FACTOR times the zip's size + RATIO_SLACK, at most
    MAX_UNPACKED), encrypted or duplicate members, methods other than stored and deflated.
    ArchiveTooLargeError (with the sizes) or InvalidModelError."""
    cap = max_total if max_total is not None else INFLATE_FACTOR * len(data) + RATIO_SLACK
    cap = min(cap, MAX_UNPACKED)
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            infos = zf.infolist()
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
        raise InvalidModelError(f"not a readable zip archive: {exc}") from None
    if len(infos) > max_members:
        raise InvalidModelError(f"archive has more than {max_members} members")
    names: set[str] = set()
    total = 0
    for info in infos:
        if info.filename in names:
            raise InvalidModelError(f"archive member {info.filename!r} appears twice")
        names.add(info.filename)
        if info.flag_bits & 0x1:
            raise InvalidModelError(f"archive member {info.filename!r} is encrypted")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise InvalidModelError(
                f"archive member {info.filename!r}: compression method {info.compress_type} "
                "(only stored and deflated members are read)"
            )
        size, packed = info.file_size, info.compress_size
        if size > RATIO_SLACK and size > max_ratio * max(packed, 1):
            raise ArchiveTooLargeError(
                f"archive member {info.filename!r} inflates from {_mib(packed)} to "
                f"{_mib(size)} ({size // max(packed, 1)}:1; at most {max_ratio}:1 for members "
                f"over {_mib(RATIO_SLACK)}): refused as a possible archive bomb"
            )
        total += size
        if total > cap:
            raise ArchiveTooLargeError(
                f"the {_mib(len(data))} archive's members add up to more than {_mib(cap)} "
                f"({_mib(total)} so far): refused as a possible archive bomb"
            )


def check_sizes(data: bytes) -> None:
    """Decompress every member without writing it: ArchiveTooLargeError beyond the limits
    (a zip's central directory is checked first: `check_inflation`)."""
    cap = min(MAX_UNPACKED, MAX_RATIO * len(data) + RATIO_SLACK)
    if is_zip(data):
        check_inflation(data, max_total=cap, max_members=MAX_MEMBERS)
    total = 0
    for _, stream in _entries(data):
        while stream is not None and (block := _read(stream, CHUNK)):
            total += len(block)
            if total > cap:
                raise ArchiveTooLargeError(_too_large(cap, len(data)))
