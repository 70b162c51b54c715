#!/usr/bin/env python3
"""Install an OpenPGP public key as an apt keyring only when it is the expected key; runs on the managed host.

    keyring.py install SOURCE KEYRING FINGERPRINT [--check]

SOURCE is the downloaded key (ASCII-armored, as NVIDIA publishes 3bf863cc.pub, or binary). It must
hold exactly one primary key, a version 4 key whose fingerprint is FINGERPRINT (40 hex digits,
spaces ignored); anything else is refused with exit status 1 and nothing is written. KEYRING gets
the key's binary packets (what `gpg --dearmor` writes, the format apt's signed-by wants), written as
KEYRING.partial and renamed, mode 0644, only when its content differs. --check writes nothing.
Prints JSON: {"changed": bool, "fingerprint": "...", "keyring": "..."}. Standard library only
(no gnupg on the host needed).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sys
from typing import Iterator, List, Tuple

ARMOR_BEGIN = "-----BEGIN PGP PUBLIC KEY BLOCK-----"
ARMOR_END = "-----END PGP PUBLIC KEY BLOCK-----"
PUBLIC_KEY = 6


class KeyRefused(Exception):
    """A key that must not be trusted, with the reason."""


def crc24(data: bytes) -> int:
    crc = 0xB704CE
    for byte in data:
        crc ^= byte << 16
        for _ in range(8):
            crc <<= 1
            if crc & 0x1000000:
                crc ^= 0x1864CFB
    return crc & 0xFFFFFF


def dearmor(text: str) -> bytes:
    lines = [line.strip() for line in text.splitlines()]
    if ARMOR_BEGIN not in lines or ARMOR_END not in lines:
        raise KeyRefused("not an ASCII-armored OpenPGP public key block")
    body = lines[lines.index(ARMOR_BEGIN) + 1 : lines.index(ARMOR_END)]
    if "" in body:  # armor headers (Version:, Comment:) end with a blank line
        body = body[body.index("") + 1 :]
    checksum = [line for line in body if line.startswith("=")]
    data = base64.b64decode("".join(line for line in body if line and not line.startswith("=")), validate=True)
    if checksum and base64.b64decode(checksum[0][1:]) != crc24(data).to_bytes(3, "big"):
        raise KeyRefused("the armor checksum does not match (a damaged download)")
    return data


def packets(data: bytes) -> Iterator[Tuple[int, bytes]]:
    """(tag, body) of each OpenPGP packet (RFC 4880 section 4.2)."""
    at = 0
    while at < len(data):
        first = data[at]
        if not first & 0x80:
            raise KeyRefused(f"byte {at}: not an OpenPGP packet header")
        if first & 0x40:  # new format
            tag, at = first & 0x3F, at + 1
            octet = data[at]
            if octet < 192:
                length, at = octet, at + 1
            elif octet < 224:
                length, at = ((octet - 192) << 8) + data[at + 1] + 192, at + 2
            elif octet == 255:
                length, at = int.from_bytes(data[at + 1 : at + 5], "big"), at + 5
            else:
                raise KeyRefused("partial body lengths do not occur in a key")
        else:
            tag, kind, at = (first >> 2) & 0x0F, first & 0x03, at + 1
            if kind == 3:
                raise KeyRefused("indeterminate packet lengths do not occur in a key")
            size = 1 << kind
            length, at = int.from_bytes(data[at : at + size], "big"), at + size
        if at + length > len(data):
            raise KeyRefused("truncated packet")
        yield tag, data[at : at + length]
        at += length


def primary_fingerprints(data: bytes) -> List[str]:
    found = []
    for tag, body in packets(data):
        if tag != PUBLIC_KEY:
            continue
        if not body or body[0] != 4:
            raise KeyRefused(f"a version {body[0] if body else '?'} key; only version 4 keys are accepted")
        found.append(hashlib.sha1(b"\x99" + len(body).to_bytes(2, "big") + body).hexdigest().upper())
    return found


def install(source: str, keyring: str, expected: str, check: bool) -> dict:
    expected = expected.replace(" ", "").upper()
    if not os.path.isfile(source):
        if check:  # --check on a fresh host: the key has not been downloaded
            return {"changed": True, "fingerprint": expected, "keyring": keyring}
        raise KeyRefused(f"{source} does not exist")
    with open(source, "rb") as handle:
        raw = handle.read()
    data = dearmor(raw.decode("ascii", errors="replace")) if raw.lstrip().startswith(b"-----") else raw
    found = primary_fingerprints(data)
    if found != [expected]:
        raise KeyRefused(
            f"{source} holds the key(s) {', '.join(found) or '(none)'}; expected exactly the one with "
            f"fingerprint {expected}"
        )
    current = b""
    if os.path.isfile(keyring):
        with open(keyring, "rb") as handle:
            current = handle.read()
    changed = current != data
    if changed and not check:
        partial = keyring + ".partial"
        with open(partial, "wb") as handle:
            handle.write(data)
        os.chmod(partial, 0o644)
        os.replace(partial, keyring)
    return {"changed": changed, "fingerprint": expected, "keyring": keyring}


def main(argv: List[str]) -> int:
    args = [a for a in argv[1:] if a != "--check"]
    if len(args) != 4 or args[0] != "install":
        print(__doc__, file=sys.stderr)
        return 2
    try:
        print(json.dumps(install(args[1], args[2], args[3], "--check" in argv)))
    except (KeyRefused, ValueError) as exc:
        print(f"refusing the key: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
