"""How the fixture apt repository writes a deb (testbed/aptrepo.py: write_deb), without the mirror.

The repository's index lists every deb the catalog calls for, also those whose files a run does not write
(their size and hashes computed from the same bytes, written nowhere); written later, a deb must be byte for
byte what the index says. These check that on a small deb of a made-up wheel.
"""

from __future__ import annotations

import hashlib
import io
import subprocess
import zipfile
from pathlib import Path

import pytest

from testbed import aptrepo, fixtures


@pytest.fixture
def deb(tmp_path: Path) -> tuple[aptrepo.Deb, dict[str, Path]]:
    """A deb of three files of a wheel (one of them past tarfile's 100-character names), a text file and a link."""
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    long_name = "nvidia/demo/lib/" + "x" * 120 + ".so.1"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("nvidia/demo/lib/libdemo.so.1.2.3", b"\x7fELF" + bytes(range(256)) * 40)
        archive.writestr("nvidia/demo/include/demo.h", "#define DEMO 1\n")
        archive.writestr(long_name, b"long" * 1000)

    def members(wheels: dict[str, Path]) -> list[fixtures.Member]:
        path = wheels["demo"]
        return [
            fixtures.from_wheel("usr/lib/x86_64-linux-gnu/libdemo.so.1.2.3", path, "nvidia/demo/lib/libdemo.so.1.2.3"),
            fixtures.from_wheel("usr/include/demo.h", path, "nvidia/demo/include/demo.h"),
            fixtures.from_wheel("usr/lib/x86_64-linux-gnu/" + long_name.rsplit("/", 1)[1], path, long_name),
            fixtures.symlink("usr/lib/x86_64-linux-gnu/libdemo.so.1", "libdemo.so.1.2.3"),
            fixtures.text_member("usr/share/doc/libdemo1/copyright", "made up for a test\n"),
        ]

    return aptrepo.Deb(name="libdemo1", version="1.2.3-1", description="demo\n demo", members=members), {"demo": wheel}


def test_a_deb_written_nowhere_has_the_size_and_hashes_of_the_one_written(deb, tmp_path: Path) -> None:
    spec, wheels = deb
    control, size, hashes = aptrepo.write_deb(None, spec, wheels)
    out = io.BytesIO()
    control_written, size_written, hashes_written = aptrepo.write_deb(out, spec, wheels)
    data = out.getvalue()
    assert (control, size, hashes) == (control_written, size_written, hashes_written)
    assert size == len(data)
    assert hashes == {"MD5sum": hashlib.md5(data).hexdigest(), "SHA256": hashlib.sha256(data).hexdigest()}


def test_the_written_deb_is_one_dpkg_reads(deb, tmp_path: Path) -> None:
    spec, wheels = deb
    path = tmp_path / spec.file
    with open(path, "wb") as out:
        aptrepo.write_deb(out, spec, wheels)
    fields = subprocess.run(
        ["dpkg-deb", "--field", str(path), "Package", "Version"], capture_output=True, text=True, check=True
    ).stdout
    assert fields.splitlines() == ["Package: libdemo1", "Version: 1.2.3-1"]
    unpacked = tmp_path / "root"
    subprocess.run(["dpkg-deb", "-x", str(path), str(unpacked)], check=True)
    library = unpacked / "usr/lib/x86_64-linux-gnu/libdemo.so.1.2.3"
    assert library.read_bytes() == b"\x7fELF" + bytes(range(256)) * 40
    assert (unpacked / "usr/lib/x86_64-linux-gnu/libdemo.so.1").readlink() == Path("libdemo.so.1.2.3")
    assert (unpacked / "usr/lib/x86_64-linux-gnu" / ("x" * 120 + ".so.1")).read_bytes() == b"long" * 1000
