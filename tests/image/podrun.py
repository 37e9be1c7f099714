"""One container of a rendered pod spec, run from a local image the way a kubelet and a
container runtime would: its root filesystem read-only, its volumes bound onto it, /tmp a tmpfs
of the emptyDir's size, /etc/hosts as kubelet writes it, then its process chrooted into that
root as the pod's user and group (supplementary group fsGroup), with the capability bounding
set emptied and no_new_privs set. Root only, inside a mount namespace of the caller's.

What it leaves out of a real pod: cgroups (the memory limit), the seccomp profile, and a PID
namespace; the network namespace is the caller's.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

_PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS = 24, 38
DEVICES = ("null", "zero", "random", "urandom")


def run(*command: str, **kwargs: Any) -> str:
    return subprocess.run(command, check=True, capture_output=True, text=True, **kwargs).stdout


def tool(name: str) -> str:
    path = shutil.which(name)
    assert path is not None, f"{name} is not installed"
    return path


@dataclass(frozen=True)
class Pod:
    """One container of a pod spec and the files of its volumes."""

    container: dict[str, Any]
    security: dict[str, Any]  # the pod's securityContext
    volumes: dict[str, dict[str, bytes] | None]  # mount path -> files; None: an emptyDir
    empty_dir_size: str

    def with_command(self, *command: str) -> Pod:
        return replace(self, container={**self.container, "command": list(command), "args": []})


def _named(objects: list[dict[str, Any]], kind: str, name: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]


def pod_of(
    objects: list[dict[str, Any]], kind: str, name: str, secrets: dict[str, dict[str, bytes]]
) -> Pod:
    """The pod of a rendered Deployment or Pod; ``secrets`` holds the files of the Secrets
    the rendering does not make itself (made by cert-manager or by hand)."""
    (obj,) = _named(objects, kind, name)
    spec = obj["spec"]["template"]["spec"] if kind == "Deployment" else obj["spec"]
    (container,) = spec["containers"]
    sources: dict[str, dict[str, bytes] | None] = {}
    size = "64Mi"
    for volume in spec["volumes"]:
        if "configMap" in volume:
            (config_map,) = _named(objects, "ConfigMap", volume["configMap"]["name"])
            sources[volume["name"]] = {k: v.encode() for k, v in config_map["data"].items()}
        elif "secret" in volume:
            secret_name = volume["secret"]["secretName"]
            made = _named(objects, "Secret", secret_name)
            sources[volume["name"]] = (
                {k: v.encode() for k, v in made[0]["stringData"].items()}
                if made
                else secrets[secret_name]
            )
        elif "emptyDir" in volume:
            size = volume["emptyDir"].get("sizeLimit", size)
            sources[volume["name"]] = None
    volumes = {mount["mountPath"]: sources[mount["name"]] for mount in container["volumeMounts"]}
    return Pod(container, spec.get("securityContext", {}), volumes, size)


def image_config(image: str) -> dict[str, Any]:
    """The image's OCI configuration (``config``, ``rootfs``)."""
    return json.loads(run(tool("buildah"), "inspect", "--type", "image", image))["OCIv1"]


def _mount_points(layer: Path, pod: Pod) -> None:
    """Made in the container's own layer, as a runtime makes them before it goes read-only."""
    for path in [*pod.volumes, "/dev", "/proc"]:
        (layer / path.lstrip("/")).mkdir(parents=True, exist_ok=True)
    (layer / "etc").mkdir(exist_ok=True)
    (layer / "etc/hosts").touch()


def _mount_root(layer: Path, root: Path, pod: Pod, work: Path, hosts: str) -> None:
    mount = tool("mount")
    run(mount, "--bind", str(layer), str(root))
    run(mount, "-o", "remount,bind,ro", str(root))
    group = str(pod.security.get("fsGroup", 0))
    for path, files in pod.volumes.items():
        target = str(root / path.lstrip("/"))
        if files is None:
            size = pod.empty_dir_size.replace("Mi", "m")
            run(mount, "-t", "tmpfs", "-o", f"size={size},mode=1777", "tmpfs", target)
            continue
        folder = work / "volumes" / path.lstrip("/")
        folder.mkdir(parents=True)
        for name, data in files.items():
            (folder / name).write_bytes(data)
            # kubelet's defaultMode (0644) and fsGroup's group on a Secret's files.
            (folder / name).chmod(0o644)
            os.chown(folder / name, 0, int(group))
        run(mount, "--bind", "-o", "ro", str(folder), target)
    run(mount, "-t", "tmpfs", "-o", "size=1m,mode=755", "tmpfs", str(root / "dev"))
    for device in DEVICES:
        (root / "dev" / device).touch()
        run(mount, "--bind", f"/dev/{device}", str(root / "dev" / device))
    run(mount, "-t", "proc", "proc", str(root / "proc"))
    (work / "hosts").write_text(hosts)
    run(mount, "--bind", "-o", "ro", str(work / "hosts"), str(root / "etc/hosts"))


@dataclass(frozen=True)
class Process:
    """What the container runs, as the runtime resolves it from the image and the spec."""

    command: list[str]
    env: dict[str, str]
    workdir: str
    uid: int
    gid: int
    group: int


# The downward API's fields, as kubelet fills them for a pod on this loopback-only namespace.
DOWNWARD = {
    "metadata.name": "osas-image-lane",
    "metadata.namespace": "kube-system",
    "status.podIP": "127.0.0.1",
    "spec.nodeName": "image-lane-node",
}


def _env_value(item: dict[str, Any]) -> str:
    if "value" in item:
        return str(item["value"])
    return DOWNWARD[item["valueFrom"]["fieldRef"]["fieldPath"]]


def process_of(pod: Pod, config: dict[str, Any]) -> Process:
    container = pod.container
    if "command" in container:  # replaces the entrypoint (and the image's CMD)
        command = [*container["command"], *container.get("args", [])]
    else:
        command = [*config.get("Entrypoint", []), *container.get("args", config.get("Cmd", []))]
    env = dict(item.split("=", 1) for item in config.get("Env", []))
    env |= {item["name"]: _env_value(item) for item in container.get("env", [])}
    security = {**pod.security, **container.get("securityContext", {})}
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    return Process(
        command,
        env,
        config.get("WorkingDir") or "/",
        security["runAsUser"],
        security["runAsGroup"],
        pod.security.get("fsGroup", security["runAsGroup"]),
    )


@dataclass
class Running:
    process: subprocess.Popen[str]
    started: float


@contextmanager
def run_pod(image: str, pod: Pod, work: Path, *, hosts: str, log: Path) -> Iterator[Running]:
    """The pod's container from a fresh container of ``image``, until the block ends (then
    killed if still running, and its mounts and container removed)."""
    buildah = tool("buildah")
    config = image_config(image)["config"]
    container = run(buildah, "from", "--pull=false", image).strip()
    root = work / "root"
    root.mkdir(parents=True)
    process: subprocess.Popen[str] | None = None
    try:
        layer = Path(run(buildah, "mount", container).strip())
        _mount_points(layer, pod)
        _mount_root(layer, root, pod, work, hosts)
        spec = process_of(pod, config)
        last_cap = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
        libc = ctypes.CDLL(None, use_errno=True)

        def become_the_pod() -> None:  # in the child, between fork and exec
            os.chroot(root)
            os.chdir(spec.workdir)
            for cap in range(last_cap + 1):
                libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)
            libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
            os.setgroups([spec.group])
            os.setgid(spec.gid)
            os.setuid(spec.uid)

        with log.open("w") as output:
            process = subprocess.Popen(
                spec.command,
                env=spec.env,
                stdout=output,
                stderr=subprocess.STDOUT,
                preexec_fn=become_the_pod,  # noqa: PLW1509 - chroot and setuid need it
                text=True,
            )
        yield Running(process, time.monotonic())
    finally:
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(10)
        subprocess.run(
            [tool("umount"), "--recursive", "--lazy", str(root)], check=False, capture_output=True
        )
        subprocess.run([buildah, "rm", container], check=False, capture_output=True)
