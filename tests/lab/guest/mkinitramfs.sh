#!/bin/sh
# Builds the busybox initramfs that QEMU lab machines boot.
# Usage: mkinitramfs.sh <guest-kernel-dir> <out.cpio>
#   <guest-kernel-dir> is what hack/install-deps.sh extracts: lib/modules/<version> (depmod'ed)
#   and a `version` file. The archive holds busybox, the modules the lab needs (virtio NIC,
#   i6300esb watchdog, IPMI KCS, 9p) with their dependencies, and ./init next to this script.
set -eu
K=$1; OUT=$2
KV=$(cat "$K/version")
HERE=$(cd "$(dirname "$0")" && pwd)
R=$(mktemp -d)
trap 'rm -rf "$R"' EXIT
mkdir -p "$R/bin" "$R/sbin" "$R/proc" "$R/sys" "$R/dev" "$R/etc" "$R/mods" "$R/tmp" "$R/run" \
         "$R/machine" "$R/usr/bin" "$R/usr/sbin"
cp /bin/busybox "$R/bin/busybox"
# The host's /usr is mounted over "$R/usr" at boot: /lib and /lib64 lead into it, as on a
# merged-/usr Debian, so dynamically linked host binaries find their loader and libraries.
ln -s usr/lib "$R/lib"; ln -s usr/lib64 "$R/lib64"
for a in $("$R/bin/busybox" --list); do [ "$a" = busybox ] || ln -s busybox "$R/bin/$a"; done
# Modules in dependency order (modprobe --show-depends lists dependencies first).
for m in virtio_pci virtio_net i6300esb ipmi_si ipmi_devintf 9pnet_virtio 9p evdev button; do
  modprobe -d "$K" -S "$KV" --show-depends "$m" | awk '$1=="insmod"{print $2}'
done | awk '!s[$0]++' > "$R/mods/order.full"
while read -r p; do cp "$p" "$R/mods/"; basename "$p" .ko; done < "$R/mods/order.full" > "$R/mods/order"
rm "$R/mods/order.full"
cp "$HERE/init" "$R/init"; chmod 0755 "$R/init"
(cd "$R" && find . | cpio -o -H newc --quiet) > "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
