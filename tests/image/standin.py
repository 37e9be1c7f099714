"""Stand-ins for the Containerfile's two pinned bases, made from Debian packages, for a machine
that reaches Debian's archive but no container registry (CI here). ``nox -s image`` makes them
when the pinned images are not in buildah's local store, and builds the Containerfile unchanged
on them (``--build-arg BUILD_IMAGE=... --build-arg PYTHON_IMAGE=...``).

- ``gcr.io/distroless/python3-debian13:nonroot``: the packages of distroless's static, base, cc
  and python3 layers for debian13, unpacked as distroless unpacks them (each .deb's data, no
  maintainer script run, a ``/var/lib/dpkg/status.d`` entry each), plus what distroless adds:
  its passwd, group, nsswitch.conf and os-release, ``/tmp`` 1777, ``/home/nonroot``, the CA
  bundle made of ca-certificates' files, ``/usr/bin/python3`` and ``/usr/bin/python``, an
  ``ld.so.cache``; environment, entrypoint, user 65532 and working directory as distroless sets
  them (GoogleContainerTools/distroless at cd080764, 2026-08-21).
- ``docker.io/library/debian:13-slim``: ``mmdebstrap --variant=minbase`` of trixie with
  debuerreotype's slimming (the docs, man pages and locales it excludes) and its apt settings.

The packages are today's trixie, fetched and verified by apt; the pinned images hold the
versions of their build day. Run as root (mmdebstrap, buildah, chroot):

    python tests/image/standin.py distroless localhost/osas-standin/python3-debian13:nonroot
    python tests/image/standin.py debian-slim localhost/osas-standin/debian:13-slim
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SUITE = "trixie"
MIRROR = "http://deb.debian.org/debian"
SECURITY = "http://deb.debian.org/debian-security"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"

# distroless's package lists for debian13, layer by layer (static/config.bzl, base/config.bzl,
# cc/config.bzl, python3/config.bzl).
DISTROLESS_PACKAGES = (
    # static
    "base-files",
    "netbase",
    "tzdata",
    "tzdata-legacy",
    "media-types",
    # base
    "libc6",
    "libssl3t64",
    "libzstd1",
    "zlib1g",
    # cc
    "libgomp1",
    "libstdc++6",
    "libgcc-s1",
    "gcc-14-base",
    # python3
    "libbz2-1.0",
    "libdb5.3t64",
    "libexpat1",
    "liblzma5",
    "libsqlite3-0",
    "libuuid1",
    "libncursesw6",
    "libtinfo6",
    "libcom-err2",
    "libcrypt1",
    "libc-bin",
    "libgssapi-krb5-2",
    "libk5crypto3",
    "libkeyutils1",
    "libkrb5-3",
    "libkrb5support0",
    "libnsl2",
    "libreadline8t64",
    "libtirpc3t64",
    "libffi8",
    "libpython3.13-minimal",
    "libpython3.13-stdlib",
    "python3.13-minimal",
    "python3.13-venv",
)
PYTHON = "/usr/bin/python3.13"
NONROOT = 65532
PASSWD = """\
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
"""
GROUP = """\
root:x:0:
nobody:x:65534:
tty:x:5:
staff:x:50:
nonroot:x:65532:
"""
NSSWITCH = """\
# /etc/nsswitch.conf
#
# Example configuration of GNU Name Service Switch functionality.
# If you have the `glibc-doc-reference' and `info' packages installed, try:
# `info libc "Name Service Switch"' for information about this file.

passwd:         compat
group:          compat
shadow:         compat
gshadow:        files

hosts:          files dns
networks:       files

protocols:      db files
services:       db files
ethers:         db files
rpc:            db files

netgroup:       nis
"""
OS_RELEASE = """\
PRETTY_NAME="Distroless"
NAME="Debian GNU/Linux"
ID="debian"
VERSION_ID="13"
VERSION="Debian GNU/Linux 13 (trixie)"
HOME_URL="https://github.com/GoogleContainerTools/distroless"
SUPPORT_URL="https://github.com/GoogleContainerTools/distroless/blob/master/README.md"
BUG_REPORT_URL="https://github.com/GoogleContainerTools/distroless/issues/new"
"""
DISTROLESS_CONFIG = (
    "--env=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "--env=SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
    "--env=LANG=C.UTF-8",
    f'--entrypoint=["{PYTHON}"]',
    f"--user={NONROOT}",
    "--workingdir=/home/nonroot",
)

# debuerreotype's slimming (scripts/.slimify-excludes and .slimify-includes) and the apt
# settings of its minimizing config, as debian:*-slim has them.
SLIM_EXCLUDES = (
    "/usr/share/doc/*",
    "/usr/share/info/*",
    "/usr/share/linda/*",
    "/usr/share/lintian/overrides/*",
    "/usr/share/locale/*",
    "/usr/share/man/*",
    "/usr/share/doc/kde/HTML/*/*",
    "/usr/share/gnome/help/*/*",
    "/usr/share/omf/*/*-*.emf",
)
SLIM_INCLUDES = (
    "/usr/share/doc/*/copyright",
    "/usr/share/doc/kde/HTML/C/*",
    "/usr/share/gnome/help/*/C/*",
    "/usr/share/locale/all_languages",
    "/usr/share/locale/currency/*",
    "/usr/share/locale/l10n/*",
    "/usr/share/locale/languages",
    "/usr/share/locale/locale.alias",
    "/usr/share/omf/*/*-C.emf",
)
SLIM_APT = {
    "docker-autoremove-suggests": 'Apt::AutoRemove::SuggestsImportant "false";\n',
    "docker-clean": (
        'DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb '
        '/var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };\n'
        'APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb '
        '/var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };\n'
        'Dir::Cache::pkgcache "";\nDir::Cache::srcpkgcache "";\n'
    ),
    "docker-gzip-indexes": 'Acquire::GzipIndexes "true";\n',
    "docker-no-languages": 'Acquire::Languages "none";\n',
}
SLIM_CONFIG = (
    "--env=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    '--cmd=["bash"]',
)


def run(*command: str | Path, **kwargs: object) -> str:
    done = subprocess.run(
        [str(part) for part in command], check=True, capture_output=True, text=True, **kwargs
    )
    return done.stdout


def download(packages: tuple[str, ...], folder: Path) -> dict[str, Path]:
    """The named packages of trixie (and its updates and security archive), no dependency
    added, fetched and checked against the signed indexes by apt, with a state of its own."""
    state = folder / "apt"
    for sub in ("lists/partial", "cache/archives/partial", "etc/preferences.d"):
        (state / sub).mkdir(parents=True, exist_ok=True)
    (state / "status").write_text("")
    sources = state / "etc" / "sources.list"
    sources.write_text(
        f"deb [signed-by={KEYRING}] {MIRROR} {SUITE} main\n"
        f"deb [signed-by={KEYRING}] {MIRROR} {SUITE}-updates main\n"
        f"deb [signed-by={KEYRING}] {SECURITY} {SUITE}-security main\n"
    )
    options = [
        f"-oDir::State={state}",
        f"-oDir::State::Lists={state / 'lists'}",
        f"-oDir::State::status={state / 'status'}",
        f"-oDir::Cache={state / 'cache'}",
        f"-oDir::Etc::SourceList={sources}",
        "-oDir::Etc::SourceParts=-",
        f"-oDir::Etc::Preferences={state / 'etc' / 'preferences'}",
        f"-oDir::Etc::PreferencesParts={state / 'etc' / 'preferences.d'}",
        "-oAcquire::Languages=none",
    ]
    run("apt-get", *options, "-q", "update")
    debs = folder / "debs"
    debs.mkdir()
    run("apt-get", *options, "-q", "download", *packages, cwd=debs)
    found = {path.name.split("_", 1)[0]: path for path in debs.glob("*.deb")}
    missing = set(packages) - found.keys()
    if missing:
        raise SystemExit(f"not downloaded: {sorted(missing)}")
    return found


def unpack(deb: Path, rootfs: Path, package: str) -> None:
    """The package's files, and its control file and md5sums under status.d, as distroless
    has them; no maintainer script runs."""
    run("dpkg-deb", "--extract", deb, rootfs)
    control = Path(tempfile.mkdtemp(dir=deb.parent))
    run("dpkg-deb", "--control", deb, control)
    status = rootfs / "var/lib/dpkg/status.d"
    status.mkdir(parents=True, exist_ok=True)
    shutil.copy(control / "control", status / package)
    if (control / "md5sums").exists():
        shutil.copy(control / "md5sums", status / f"{package}.md5sums")


def ca_bundle(deb: Path, folder: Path) -> str:
    """ca-certificates' certificates concatenated, the one file distroless takes from it."""
    target = folder / "ca-certificates"
    run("dpkg-deb", "--extract", deb, target)
    certificates = sorted((target / "usr/share/ca-certificates").rglob("*.crt"))
    return "".join(path.read_text() for path in certificates)


def distroless_rootfs(rootfs: Path, work: Path) -> None:
    debs = download((*DISTROLESS_PACKAGES, "ca-certificates"), work)
    for package in DISTROLESS_PACKAGES:  # in distroless's layer order: base-files first
        unpack(debs[package], rootfs, package)
    for alias in ("bin", "sbin", "lib", "lib64"):
        if not (rootfs / alias).is_symlink():
            raise SystemExit(f"/{alias} is not merged into /usr: not trixie's layout")
    bundle = rootfs / "etc/ssl/certs/ca-certificates.crt"
    bundle.parent.mkdir(parents=True, exist_ok=True)
    bundle.write_text(ca_bundle(debs["ca-certificates"], work))
    etc = rootfs / "etc"
    (etc / "passwd").write_text(PASSWD)
    (etc / "group").write_text(GROUP)
    (etc / "nsswitch.conf").write_text(NSSWITCH)
    os_release = rootfs / "usr/lib/os-release"
    os_release.unlink(missing_ok=True)  # base-files' own; /etc/os-release links to it
    os_release.write_text(OS_RELEASE)
    for path, mode, owner in (("tmp", 0o1777, 0), ("root", 0o700, 0), ("home", 0o755, 0)):
        (rootfs / path).mkdir(exist_ok=True)
        (rootfs / path).chmod(mode)
        os.chown(rootfs / path, owner, owner)
    home = rootfs / "home/nonroot"
    home.mkdir(exist_ok=True)
    home.chmod(0o700)
    os.chown(home, NONROOT, NONROOT)
    for alias in ("python", "python3"):
        link = rootfs / "usr/bin" / alias
        link.unlink(missing_ok=True)
        link.symlink_to(PYTHON)
    run("chroot", rootfs, "/usr/sbin/ldconfig")


def debian_slim_rootfs(rootfs: Path) -> None:
    dpkg = [f"--dpkgopt=path-exclude={path}" for path in SLIM_EXCLUDES]
    dpkg += [f"--dpkgopt=path-include={path}" for path in SLIM_INCLUDES]
    apt = [
        f"--customize-hook=printf '%s' {shell_quote(text)} > \"$1/etc/apt/apt.conf.d/{name}\""
        for name, text in SLIM_APT.items()
    ]
    run(
        "mmdebstrap",
        "--variant=minbase",
        "--mode=root",
        "--format=directory",
        "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
        '--aptopt=Acquire::Languages "none"',
        *dpkg,
        *apt,
        '--customize-hook=rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin',
        SUITE,
        rootfs,
        f"deb {MIRROR} {SUITE} main",
        f"deb {MIRROR} {SUITE}-updates main",
        f"deb {SECURITY} {SUITE}-security main",
    )


def shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def commit(rootfs: Path, name: str, config: tuple[str, ...]) -> None:
    """A one-layer image of ``rootfs`` in buildah's store, with the base's configuration."""
    container = run("buildah", "from", "scratch").strip()
    try:
        mount = Path(run("buildah", "mount", container).strip())
        run("cp", "-a", f"{rootfs}/.", mount)
        run("buildah", "umount", container)
        run("buildah", "config", *config, container)
        run("buildah", "commit", "--quiet", "--rm", container, name)
    except BaseException:
        subprocess.run(["buildah", "rm", container], capture_output=True, check=False)  # noqa: S607
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", choices=["distroless", "debian-slim"], help="which stand-in")
    parser.add_argument("name", help="the image name to commit it as")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="osas-standin-") as folder:
        work = Path(folder)
        rootfs = work / "rootfs"
        if args.base == "distroless":
            rootfs.mkdir()
            distroless_rootfs(rootfs, work)
            commit(rootfs, args.name, DISTROLESS_CONFIG)
        else:
            debian_slim_rootfs(rootfs)
            commit(rootfs, args.name, SLIM_CONFIG)
    sys.stdout.write(f"committed {args.name}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
