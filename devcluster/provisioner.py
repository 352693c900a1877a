"""A tiny volume provisioner: every PersistentVolumeClaim gets a hostPath PersistentVolume.

devcluster has no storage driver. Without a PersistentVolume a claim stays ``Pending`` and the
scheduler keeps its pods ``Pending`` too ("unbound immediate PersistentVolumeClaims"). This
process (``python -m devcluster.provisioner --run-dir R``, the component
``volume-provisioner``) watches claims and, for each pending claim that names no volume,
creates a ``hostPath`` PersistentVolume pre-bound to it (``claimRef``): the
controller-manager's binder then binds the two, as it does for a real provisioner's volumes.

The volume's folder is the claim's folder under the cluster's run directory
(:func:`~devcluster.agent.volumes.claim_dir`), the one process nodes already mount for the
claim; real nodes' kubelets mount the hostPath volume itself. All nodes share the machine's
file system, so a claim reads the same from every node whatever its access mode says (as
ReadWriteMany storage would). A volume whose claim was deleted (``Released``) is deleted;
its folder stays until the cluster's run directory goes.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path
from typing import Any, Final

from devcluster.agent.kubeapi import Api, ApiError, Informer
from devcluster.agent.volumes import claim_dir
from devcluster.config import ClusterConfig, read_token

logger = logging.getLogger(__name__)

Obj = dict[str, Any]

COMPONENT: Final = "volume-provisioner"
"""The provisioner's process name among the cluster's components."""
PROVISIONED_LABEL: Final = "devcluster.dev/provisioned"
"""Label of the volumes this provisioner made (only those are ever deleted)."""
DEFAULT_SIZE: Final = "1Gi"
"""Capacity of a volume whose claim requests no size."""


def volume_for(claim: Obj, run_dir: Path) -> Obj | None:
    """The PersistentVolume to create for ``claim``, or None when it needs none (it is
    bound, names a volume, or is being deleted)."""
    meta, spec = claim.get("metadata", {}), claim.get("spec", {})
    if (
        spec.get("volumeName")
        or meta.get("deletionTimestamp")
        or (claim.get("status") or {}).get("phase", "Pending") != "Pending"
    ):
        return None
    namespace, name = meta["namespace"], meta["name"]
    size = ((spec.get("resources") or {}).get("requests") or {}).get("storage", DEFAULT_SIZE)
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"pvc-{meta['uid']}", "labels": {PROVISIONED_LABEL: "true"}},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
            "volumeMode": spec.get("volumeMode") or "Filesystem",
            "storageClassName": spec.get("storageClassName") or "",
            "persistentVolumeReclaimPolicy": "Retain",
            "hostPath": {
                "path": str(claim_dir(run_dir, namespace, name)),
                "type": "DirectoryOrCreate",
            },
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": namespace,
                "name": name,
                "uid": meta["uid"],
            },
        },
    }


def released(volume: Obj) -> bool:
    """Whether ``volume`` is one of ours whose claim is gone."""
    labels = volume.get("metadata", {}).get("labels") or {}
    phase = (volume.get("status") or {}).get("phase")
    return labels.get(PROVISIONED_LABEL) == "true" and phase == "Released"


class Provisioner:
    """Creates a volume for each pending claim and deletes released ones."""

    def __init__(self, api: Api, run_dir: Path) -> None:
        self.api = api
        self.run_dir = run_dir

    async def on_claim(self, kind: str, claim: Obj) -> None:
        volume = None if kind == "DELETED" else volume_for(claim, self.run_dir)
        if volume is None:
            return
        folder = claim_dir(self.run_dir, claim["metadata"]["namespace"], claim["metadata"]["name"])
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o777)  # as local provisioners do: pods may run as any user
        try:
            await self.api.post("/api/v1/persistentvolumes", volume)
        except ApiError as err:
            if err.status != 409:  # 409: made already (a re-list, a repeated event)
                raise
            return
        logger.info(
            "volume %s for claim %s/%s",
            volume["metadata"]["name"],
            claim["metadata"]["namespace"],
            claim["metadata"]["name"],
        )

    async def on_volume(self, kind: str, volume: Obj) -> None:
        if kind == "DELETED" or not released(volume):
            return
        name = volume["metadata"]["name"]
        try:
            await self.api.delete(f"/api/v1/persistentvolumes/{name}")
        except ApiError as err:
            if err.status != 404:
                raise
        logger.info("deleted released volume %s", name)

    async def run(self) -> None:
        """Watch claims and volumes until cancelled."""
        informers = [
            Informer(self.api, "/api/v1/persistentvolumeclaims", self.on_claim),
            Informer(self.api, "/api/v1/persistentvolumes", self.on_volume),
        ]
        try:
            await asyncio.gather(*(informer.run() for informer in informers))
        finally:
            await self.api.close()


def argv(cfg: ClusterConfig, python: str) -> list[str]:
    """The provisioner process of the cluster."""
    return [python, "-m", "devcluster.provisioner", "--run-dir", str(cfg.run_dir)]


def main() -> None:
    """Entry point of the provisioner process."""
    parser = argparse.ArgumentParser(description="bind PersistentVolumeClaims to hostPath volumes")
    parser.add_argument("--run-dir", type=Path, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    cfg = ClusterConfig.load(args.run_dir)
    api = Api(cfg.server, read_token(cfg, "admin"), str(cfg.pki_dir / "ca.crt"))
    asyncio.run(Provisioner(api, cfg.run_dir).run())


if __name__ == "__main__":
    main()
