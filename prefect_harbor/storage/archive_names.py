"""Names every results store can hold, for files whose names the agent chose.

An agent can name a file in ``/logs`` anything Linux allows: 255 bytes, bytes that are not
UTF-8, control characters. A store cannot always hold that: a local folder writes each file
under a longer temporary name first, S3 keys are UTF-8 of at most 1,024 bytes. So each part
of an archived file's path is made storable (:func:`storable`): control characters and bytes
that are not UTF-8 percent-encoded, a part over :data:`PART_BYTES` shortened, keeping its
start and extension, with a digest of the whole name; a path over the store's key budget
becomes ``long-names/<digest>-<its last part>``. The archive's ``manifest.json`` gives the
original name beside each one changed.
"""

from __future__ import annotations

import hashlib
import os

#: The longest name part kept as it is: a local file system's 255 bytes, less room for a temporary name's additions.
PART_BYTES = 200
#: The longest key S3 accepts; a local path is far shorter than the 4,096 bytes Linux allows.
KEY_BYTES = 1024
_DIGEST = 10


def storable(relative: str, budget: int = KEY_BYTES) -> str:
    """``relative`` (a ``/``-separated path under an archive folder) as a name every store can
    hold within ``budget`` bytes; unchanged when it already is one."""
    parts = [_part(part) for part in relative.split("/")]
    name = "/".join(parts)
    if len(name.encode()) <= budget:
        return name
    room = max(32, min(PART_BYTES, budget - 40))
    last = parts[-1] if len(parts[-1].encode()) <= room else _shorten(parts[-1], room, relative)
    return f"long-names/{_digest(relative)}-{last}"


def _part(part: str) -> str:
    raw = os.fsencode(part)  # the bytes on disk (names that are not UTF-8 arrive as surrogate escapes)
    text = "".join(_encoded(character) for character in raw.decode("utf-8", errors="surrogateescape"))
    return _shorten(text, PART_BYTES, part) if len(text.encode()) > PART_BYTES else text


def _encoded(character: str) -> str:
    code = ord(character)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that is not UTF-8
        return f"%{code - 0xDC00:02X}"
    if code < 0x20 or code == 0x7F or character == "%":
        return f"%{code:02X}"
    return character


def _shorten(text: str, limit: int, original: str) -> str:
    """``text`` in at most ``limit`` bytes: its start, a digest of ``original``, its extension."""
    stem, dot, extension = text.rpartition(".")
    if not dot or len(extension.encode()) > 16 or not stem:
        stem, extension = text, ""
    suffix = f"~{_digest(original)}" + (f".{extension}" if extension else "")
    room = limit - len(suffix.encode())
    kept = stem.encode()[:room].decode("utf-8", errors="ignore")
    return kept + suffix


def _digest(text: str) -> str:
    return hashlib.sha256(os.fsencode(text)).hexdigest()[:_DIGEST]
