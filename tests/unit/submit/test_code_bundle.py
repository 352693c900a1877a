"""Packing a user's code for a ConfigMap (``elasticjob.submit.code_bundle``): a script, a folder
with its layout kept, what is left out, and a clear refusal past the cap."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from elasticjob.submit.code_bundle import BundleError, bundle_code


def test_a_script_is_one_file_and_its_own_entry(tmp_path: Path) -> None:
    script = tmp_path / "my_train.py"
    script.write_text("print('hi')\n")
    bundle = bundle_code(script)
    assert bundle.entry == "my_train.py"
    assert bundle.config_map_data() == ({"my_train.py": "print('hi')\n"}, {})
    assert bundle.volume_items() == [{"key": "my_train.py", "path": "my_train.py"}]


def test_a_folder_keeps_its_layout_and_leaves_out_hidden_files_and_caches(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / ".git").mkdir()
    (tmp_path / "train.py").write_text("import pkg.model\n")
    (tmp_path / "pkg" / "model.py").write_text("X = 1\n")
    (tmp_path / "pkg" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0")
    (tmp_path / ".git" / "HEAD").write_text("ref\n")
    (tmp_path / "vocab.bin").write_bytes(b"\xff\xfe\x00")
    bundle = bundle_code(tmp_path)
    assert bundle.entry == "train.py"
    assert {i["path"]: i["key"] for i in bundle.volume_items()} == {
        "pkg/model.py": "pkg.model.py",
        "train.py": "train.py",
        "vocab.bin": "vocab.bin",
    }
    data, binary = bundle.config_map_data()
    assert data == {"pkg.model.py": "X = 1\n", "train.py": "import pkg.model\n"}
    assert base64.b64decode(binary["vocab.bin"]) == b"\xff\xfe\x00"


def test_keys_that_would_collide_are_kept_apart(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "b.py").write_text("1")
    (tmp_path / "a.b.py").write_text("2")
    (tmp_path / "train.py").write_text("3")
    items = bundle_code(tmp_path).volume_items()
    assert len({i["key"] for i in items}) == 3
    assert {i["path"] for i in items} == {"a/b.py", "a.b.py", "train.py"}


def test_the_entry_of_a_folder_is_named_or_train_py(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "main.py").write_text("")
    assert bundle_code(tmp_path, "src/main.py").entry == "src/main.py"
    with pytest.raises(BundleError, match=r"has no train.py to run: name the script with --entry"):
        bundle_code(tmp_path)
    with pytest.raises(BundleError, match="is a file"):
        bundle_code(tmp_path / "src" / "main.py", "main.py")
    with pytest.raises(BundleError, match="no such file or folder"):
        bundle_code(tmp_path / "missing.py")


def test_code_over_the_cap_is_refused_naming_the_largest_files(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("x" * 100)
    (tmp_path / "data.csv").write_text("1," * 40_000)
    (tmp_path / "weights.bin").write_bytes(b"\xff" * 30_000)
    with pytest.raises(BundleError) as refused:
        bundle_code(tmp_path, max_bytes=64 * 1024)
    message = str(refused.value)
    assert "over the 64 KiB a ConfigMap can carry" in message, message
    assert message.index("data.csv (78 KiB)") < message.index("weights.bin (39 KiB)"), message
    assert "docs/your-first-job.md" in message
