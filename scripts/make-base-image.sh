#!/usr/bin/env bash
# A Debian bookworm base image made from Debian's own packages (no registry needed): debootstrap a
# minimal root file system and import it into podman as localhost/forkserve-base:bookworm.
# Used by `make image-test` (tests/image/); skipped when the image exists already.
set -euo pipefail
image=localhost/forkserve-base:bookworm
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
if podman image exists "$image"; then exit 0; fi
root=$(mktemp -d /var/tmp/forkserve-rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase bookworm "$root" "$mirror" >/dev/null
# Only Debian's archive, as apt-get in the Dockerfile expects; no caches or logs in the image.
printf 'deb %s bookworm main\ndeb %s bookworm-updates main\n' "$mirror" "$mirror" > "$root/etc/apt/sources.list"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/var/log/*
tar -C "$root" -c . | podman import --change 'CMD ["bash"]' - "$image" >/dev/null
echo "$image"
