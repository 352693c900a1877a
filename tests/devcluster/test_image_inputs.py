"""What image builds take from the machine: pip's configuration (as build arguments and
build-time mounts) and the Debian mirror of apt's sources. No build runs here."""

from __future__ import annotations

from pathlib import Path

from devcluster.buildah import debian_mirror
from devcluster.imagebuild import context_digest, copy_sources
from devcluster.pipconf import (
    MOUNT_ROOT,
    parse_config_list,
    pip_settings,
    settings_from_options,
)

CONFIG_LIST = """\
global.extra-index-url='file:///srv/a/simple file:///srv/b/simple'
global.find-links='/srv/wheels'
global.index-url='https://global.example/simple'
:env:.index-url='https://env.example/simple'
user.cert='/etc/user-ca.pem'
site.timeout='5'
"""


def test_the_environment_wins_and_only_known_options_are_kept() -> None:
    assert parse_config_list(CONFIG_LIST) == {
        "extra-index-url": "file:///srv/a/simple file:///srv/b/simple",
        "find-links": "/srv/wheels",
        "index-url": "https://env.example/simple",
        "cert": "/etc/user-ca.pem",
    }


def test_local_locations_are_mounted_under_the_build_root_and_rewritten(tmp_path: Path) -> None:
    (tmp_path / "pypi" / "simple").mkdir(parents=True)
    (tmp_path / "pypi" / "files").mkdir()
    (tmp_path / "wheels" / "more").mkdir(parents=True)
    cert = tmp_path / "ca.pem"
    cert.write_text("x")
    settings = settings_from_options(
        {
            "index-url": "https://mirror.example/simple",
            "extra-index-url": f"file://{tmp_path}/pypi/simple",
            # Inside an already mounted directory: no mount of its own.
            "find-links": f"{tmp_path}/wheels {tmp_path}/wheels/more {tmp_path}/missing",
            "cert": str(cert),
        }
    )
    # An index's parent is mounted: its pages link to files beside it.
    assert dict(settings.mounts) == {
        cert: f"{MOUNT_ROOT}/0",
        tmp_path / "pypi": f"{MOUNT_ROOT}/1",
        tmp_path / "wheels": f"{MOUNT_ROOT}/2",
    }
    assert settings.build_args == {
        "PIP_INDEX_URL": "https://mirror.example/simple",
        "PIP_EXTRA_INDEX_URL": f"file://{MOUNT_ROOT}/1/simple",
        "PIP_FIND_LINKS": f"{MOUNT_ROOT}/2 {MOUNT_ROOT}/2/more {tmp_path}/missing",
        "PIP_CERT": f"{MOUNT_ROOT}/0",
    }
    args = settings.buildah_args()
    pairs = list(zip(args[::2], args[1::2], strict=True))
    assert ("-v", f"{tmp_path}/pypi:{MOUNT_ROOT}/1:ro") in pairs
    assert ("--build-arg", f"PIP_CERT={MOUNT_ROOT}/0") in pairs


def test_this_machines_pip_settings_name_no_local_path_inside_the_build() -> None:
    settings = pip_settings()
    for value in settings.build_args.values():
        for location in value.split():
            if location.startswith(("/", "file:")):
                assert MOUNT_ROOT in location or not Path(location.removeprefix("file://")).exists()


def test_the_mirror_comes_from_apts_sources(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "a.sources").write_text(
        "Types: deb-src\nURIs: http://src.example/debian\nSuites: bookworm\n\n"
        "Types: deb\nURIs: http://security.example/debian-security\nSuites: bookworm-security\n"
    )
    assert debian_mirror(tmp_path) is None
    (tmp_path / "sources.list").write_text(
        "# deb http://commented.example/debian bookworm main\n"
        "deb [arch=amd64] http://one-line.example/debian bookworm main\n"
    )
    assert debian_mirror(tmp_path) == "http://one-line.example/debian"
    (tmp_path / "sources.list.d" / "b.sources").write_text(
        "Types: deb\nURIs: http://deb822.example/debian\nSuites: bookworm bookworm-updates\n"
    )
    assert debian_mirror(tmp_path) == "http://deb822.example/debian"


def test_the_context_hash_follows_the_copied_files_only(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text(
        "FROM x\nCOPY --chown=1:1 a.txt pkg ./\nCOPY --from=other /b /b\nRUN true\n"
    )
    (tmp_path / "a.txt").write_text("a")
    (tmp_path / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "pkg" / "m.py").write_text("m")
    (tmp_path / "other.txt").write_text("o")
    sources = copy_sources(tmp_path / "Dockerfile")
    assert sources == ["a.txt", "pkg"]
    before = context_digest(tmp_path, sources)
    (tmp_path / "other.txt").write_text("changed")
    (tmp_path / "pkg" / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"\0")
    assert context_digest(tmp_path, sources) == before
    (tmp_path / "pkg" / "m.py").write_text("changed")
    assert context_digest(tmp_path, sources) != before
