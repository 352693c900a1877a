"""The node images (``python -m devcluster images``): built with buildah from the project's
Dockerfiles on a debootstrapped Debian, or taken from the cache, and loadable by containerd
under the names pods use. The first run on a machine builds them (several minutes)."""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from devcluster.buildah import Buildah
from devcluster.config import REPO_ROOT, default_cache_dir
from devcluster.imagebuild import (
    BASE_IMAGE,
    PAUSE_IMAGE,
    BuiltImage,
    ImageBuilder,
    build_lock,
    chart_app_version,
    ensure_images,
    project_version,
)

pytestmark = pytest.mark.timeout(1500)
"""The first test builds the four images (its module fixture): after a change of the project's
dependencies that reinstalls them, well over the suite's 300 s on a loaded machine."""
#: Seconds a command inside an image may take (importing torch on a busy machine).
RUN_TIMEOUT = 300.0


@pytest.fixture(scope="module")
def images() -> dict[str, BuiltImage]:
    return {image.name: image for image in ensure_images(default_cache_dir())}


def archive_config(archive: Path) -> tuple[list[str], dict[str, Any]]:
    """The RepoTags and the image configuration stored in a docker-archive tar."""
    with tarfile.open(archive) as tar:

        def read(name: str) -> Any:
            member = tar.extractfile(name)
            assert member is not None, f"{archive} has no {name}"
            return json.load(member)

        (manifest,) = read("manifest.json")
        return manifest["RepoTags"], read(manifest["Config"])["config"]


def test_the_four_images_carry_the_names_pods_use(images: dict[str, BuiltImage]) -> None:
    operator = f"docker.io/elasticjob/operator:{chart_app_version()}"
    worker = f"docker.io/elasticjob/worker:{project_version()}"
    assert list(images) == [PAUSE_IMAGE, BASE_IMAGE, operator, worker]
    for name, image in images.items():
        tags, _ = archive_config(image.archive)
        assert tags == [name]


def test_entrypoints_commands_and_users(images: dict[str, BuiltImage]) -> None:
    configs = {name: archive_config(image.archive)[1] for name, image in images.items()}
    pause = configs[PAUSE_IMAGE]
    assert pause["Entrypoint"] == ["/pause"] and pause["User"] == "65535:65535"
    operator = configs[f"docker.io/elasticjob/operator:{chart_app_version()}"]
    assert operator["Entrypoint"] == ["elasticjob-operator"] and operator["User"] == "10001"
    worker = configs[f"docker.io/elasticjob/worker:{project_version()}"]
    assert worker["Cmd"] == ["python", "examples/digits/train.py"]
    assert worker["User"] == "10001" and worker["WorkingDir"] == "/opt/elasticjob"
    # The machine's pip configuration was a build argument, never the image's environment.
    for config in configs.values():
        assert not [e for e in config.get("Env", []) if e.startswith("PIP_")]


def run_in(image: str, *command: str) -> str:
    """``command`` in a container of ``image`` (runc, as the image's user), its stdout. No
    network: buildah's default one is a CNI bridge (cni-podman0, 10.88.0.0/16) that it makes
    once and leaves behind, in an address block of devcluster's."""
    buildah = Buildah(default_cache_dir() / "images" / "store")
    container = buildah.run("from", "--pull-never", image).strip()
    try:
        return buildah.run(
            "run", "--network", "none", container, "--", *command, timeout=RUN_TIMEOUT
        )
    finally:
        buildah.run("rm", container)


def test_worker_image_has_torch_and_the_runtime(images: dict[str, BuiltImage]) -> None:
    worker = f"docker.io/elasticjob/worker:{project_version()}"
    script = (
        "import os, torch, elasticjob.worker_runtime, sklearn;"
        "print(os.getuid(), torch.__version__, torch.cuda.is_available())"
    )
    out = run_in(worker, "python", "-c", script).split()
    assert out[0] == "10001"
    assert out[1].split("+")[0] == "2.13.0"
    assert out[2] == "False"
    assert run_in(worker, "test", "-f", "examples/digits/train.py") == ""


def test_operator_image_runs_its_entrypoint_without_torch(images: dict[str, BuiltImage]) -> None:
    operator = f"docker.io/elasticjob/operator:{chart_app_version()}"
    assert "--rendezvous-tls-secret" in run_in(operator, "elasticjob-operator", "--help")
    script = "import importlib.util as u, os; print(os.getuid(), u.find_spec('torch'))"
    assert run_in(operator, "python", "-c", script).split() == ["10001", "None"]


def test_base_image_has_python_and_sh(images: dict[str, BuiltImage]) -> None:
    out = run_in(
        BASE_IMAGE, "sh", "-c", "python3 -c 'import sys, venv; print(sys.version_info[:2])'"
    )
    assert out.strip() == "(3, 11)"


def test_the_dockerfiles_install_python_on_a_base_without_it(
    images: dict[str, BuiltImage],
) -> None:
    """Dockerfile.operator on the bare debootstrapped Debian: python3 comes from apt. The
    image stays in the store, tagged, so that its layers are a cache as the nodes' images'
    are: a later run builds again only the layers from the project's sources on (the image
    it replaces goes with the next build's pruning)."""
    builder = ImageBuilder(default_cache_dir())
    image = "docker.io/elasticjob/operator:test-no-python"
    with build_lock(default_cache_dir()):
        minimal = builder.base_minimal()
        builder.ensure_in_store(minimal)
        args = ["--build-arg", f"BASE={minimal.name}", *builder.pip.buildah_args()]
        builder.buildah.bud(REPO_ROOT, REPO_ROOT / "Dockerfile.operator", image, args)
    assert run_in(minimal.name, "sh", "-c", "command -v python3 || echo none").strip() == "none"
    assert "--rendezvous-tls-secret" in run_in(image, "elasticjob-operator", "--help")
    assert run_in(image, "id", "-u").strip() == "10001"


def run_locked_down(
    image: str, command: list[str], env: dict[str, str], writable: list[str]
) -> subprocess.CompletedProcess[str]:
    """``command`` in ``image`` run by runc as the chart and examples/elasticjob-restricted.yaml
    run pods: uid and gid 10001, read-only root file system, no capabilities, no new
    privileges, and writable only the ``writable`` paths (emptyDirs there, tmpfs here)."""
    buildah = Buildah(default_cache_dir() / "images" / "store")
    config = buildah.inspect(image)["config"]
    assert isinstance(config, dict)
    container = buildah.run("from", "--pull-never", image).strip()
    bundle = Path(tempfile.mkdtemp(prefix="ej-runc-"))
    try:
        rootfs = buildah.run("mount", container).strip()
        subprocess.run(["runc", "spec", "--bundle", str(bundle)], check=True, timeout=30)
        spec = json.loads((bundle / "config.json").read_text())
        spec["root"] = {"path": rootfs, "readonly": True}
        image_env = [e for e in config.get("Env", []) if e.split("=")[0] not in env]
        spec["process"].update(
            terminal=False,
            user={"uid": 10001, "gid": 10001},
            args=command,
            env=image_env + [f"{k}={v}" for k, v in env.items()],
            cwd=config.get("WorkingDir") or "/",
            capabilities={k: [] for k in spec["process"]["capabilities"]},
            noNewPrivileges=True,
        )
        spec["mounts"] += [
            {"destination": path, "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "nodev", "mode=1777"]}
            for path in writable
        ]  # fmt: skip
        (bundle / "config.json").write_text(json.dumps(spec))
        return subprocess.run(
            ["runc", "--root", str(bundle / "state"), "run", "--bundle", str(bundle), bundle.name],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=RUN_TIMEOUT,
            check=False,
        )
    finally:
        buildah.run("umount", container)
        buildah.run("rm", container)
        shutil.rmtree(bundle, ignore_errors=True)


def test_operator_runs_under_the_charts_security_context(
    images: dict[str, BuiltImage],
) -> None:
    """Read-only root, uid 10001: the operator's temporary files (its rendezvous and webhook
    certificates) go to TMPDIR, the chart's emptyDir."""
    operator = f"docker.io/elasticjob/operator:{chart_app_version()}"
    script = (
        "import datetime as d;"
        "from elasticjob.operator import certs, operator_config as c;"
        "m = certs.TLSMaterial.issue(['svc.ns.svc'], now=d.datetime.now(d.UTC));"
        "m.server_context(c.OperatorConfig(rendezvous_url='https://svc.ns.svc').tls_dir);"
        "w = c.WebhookConfig('svc', 'ns').cert_dir;"
        "print(*(str(p) for p in m.write_files(w, 'webhook')))"
    )
    tmp = "/var/tmp/elasticjob"
    result = run_locked_down(operator, ["python", "-c", script], {"TMPDIR": tmp}, [tmp])
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        f"{tmp}/elasticjob-webhook/webhook.{e}" for e in ("crt", "key")
    ]


def test_worker_trains_under_the_restricted_security_context(
    images: dict[str, BuiltImage],
) -> None:
    """As examples/elasticjob-restricted.yaml runs it: read-only root, HOME and /tmp on an
    emptyDir. torch, a gloo group and the example's data work there."""
    worker = f"docker.io/elasticjob/worker:{project_version()}"
    script = (
        "import os, torch, torch.distributed as dist, sklearn.datasets;"
        "dist.init_process_group('gloo', init_method='file:///tmp/store', rank=0, world_size=1);"
        "t = torch.ones(3); dist.all_reduce(t);"
        "print(os.getuid(), int(t.sum()), len(sklearn.datasets.load_digits().target))"
    )
    result = run_locked_down(worker, ["python", "-c", script], {"HOME": "/tmp"}, ["/tmp"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["10001", "3", "1797"]


def test_a_cache_hit_does_not_run_buildah(
    images: dict[str, BuiltImage], monkeypatch: pytest.MonkeyPatch
) -> None:
    mtimes = {name: image.archive.stat().st_mtime_ns for name, image in images.items()}

    def no_buildah(*args: object, **kwargs: object) -> str:
        raise AssertionError(f"buildah ran on a cache hit: {args}")

    monkeypatch.setattr(Buildah, "run", no_buildah)
    again = ensure_images(default_cache_dir())
    assert [i.name for i in again] == list(images)
    assert all(i.build_seconds is None for i in again)
    assert {i.name: i.archive.stat().st_mtime_ns for i in again} == mtimes


def test_a_source_change_rebuilds_only_the_project_layers(
    images: dict[str, BuiltImage], tmp_path: Path
) -> None:
    """A copy of the build context with one source file changed: every layer up to the
    third-party dependencies (torch) is reused, the project's layers differ."""
    context = tmp_path / "context"
    context.mkdir()
    for name in ("Dockerfile.worker", "pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO_ROOT / name, context / name)
    for name in ("elasticjob", "worker_runtime", "operator", "examples"):
        shutil.copytree(REPO_ROOT / name, context / name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))  # fmt: skip
    with (context / "elasticjob" / "version.py").open("a") as f:
        f.write(f"# changed by {__name__}\n")
    builder = ImageBuilder(default_cache_dir())
    worker = f"docker.io/elasticjob/worker:{project_version()}"
    changed = "docker.io/elasticjob/worker:test-source-change"
    base = builder.base()
    args = ["--build-arg", f"BASE={base.name}", "--build-arg", "TORCH_INDEX="]
    with build_lock(default_cache_dir()):
        started = time.monotonic()
        builder.buildah.bud(
            context, context / "Dockerfile.worker", changed, args + builder.pip.buildah_args()
        )
        took = time.monotonic() - started
    try:
        before = diff_ids(builder.buildah, worker)
        after = diff_ids(builder.buildah, changed)
    finally:
        builder.buildah.run("rmi", "--force", changed)  # and leftover containers of it
    print(f"worker rebuilt after a source change in {took:.1f} s")
    # The base's layers, then one per RUN or COPY: those before the first COPY of the project's
    # sources (the venv, the user, torch, the third-party dependencies) are reused.
    text = (context / "Dockerfile.worker").read_text().replace("\\\n", " ")
    steps = [line for line in text.splitlines() if line.startswith(("RUN ", "COPY "))]
    first_source = steps.index("COPY elasticjob ./elasticjob")
    assert any("torch==" in step for step in steps[:first_source])
    reused = len(diff_ids(builder.buildah, base.name)) + first_source
    assert len(before) == len(after) > reused
    assert before[:reused] == after[:reused], "layers before the sources were rebuilt"
    assert before[reused] != after[reused], "the changed source did not reach the image"


def diff_ids(buildah: Buildah, image: str) -> list[str]:
    config = buildah.inspect(image)
    rootfs = config["rootfs"]
    assert isinstance(rootfs, dict)
    return list(rootfs["diff_ids"])
