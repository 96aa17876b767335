#!/usr/bin/env bash
# Builds Drift as an AppImage: target/packages/Drift-VERSION-ARCH.AppImage.
#
#   packaging/linux/appimage.sh                 # build the release binary, the AppDir and the AppImage
#   packaging/linux/appimage.sh --appdir-only   # stop after target/packages/Drift.AppDir (no appimagetool needed)
#
# The AppImage is made by appimagetool (https://github.com/AppImage/appimagetool/releases: put
# appimagetool-ARCH.AppImage on PATH as `appimagetool`, or point $APPIMAGETOOL at it). The drift binary links
# only glibc and libgcc and opens Vulkan, X11 and Wayland at run time, so no libraries are bundled: the host's
# GPU driver and libvulkan1 are the ones that must be used. It runs on systems with glibc as new as the build
# machine's, so build on the oldest distribution you want to support.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"

appdir_only=0
case "${1:-}" in
    "") ;;
    --appdir-only) appdir_only=1 ;;
    *) echo "usage: $0 [--appdir-only]" >&2; exit 2 ;;
esac

arch="$(uname -m)"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
out="$target_dir/packages"
appdir="$out/Drift.AppDir"

cargo build --release --locked -p drift-app
rm -rf "$appdir"
mkdir -p "$appdir/usr/bin" "$appdir/usr/share/applications" "$appdir/usr/share/metainfo"
install -m 755 "$target_dir/release/drift" "$appdir/usr/bin/drift"
# Debug line tables stay in the cargo build; the AppImage carries the stripped binary.
strip --strip-debug "$appdir/usr/bin/drift"
install -m 644 packaging/linux/drift.desktop "$appdir/usr/share/applications/drift.desktop"
install -m 644 packaging/linux/io.drift.Drift.metainfo.xml "$appdir/usr/share/metainfo/io.drift.Drift.metainfo.xml"
for png in assets/icons/drift-*.png; do
    n="${png##*/drift-}"
    n="${n%.png}"
    install -D -m 644 "$png" "$appdir/usr/share/icons/hicolor/${n}x${n}/apps/drift.png"
done
install -D -m 644 assets/icons/drift.svg "$appdir/usr/share/icons/hicolor/scalable/apps/drift.svg"

# The AppDir's top level: the desktop entry and icon appimagetool reads, and AppRun, which it starts.
cp packaging/linux/drift.desktop "$appdir/drift.desktop"
cp assets/icons/drift-256.png "$appdir/drift.png"
ln -sf drift.png "$appdir/.DirIcon"
cat >"$appdir/AppRun" <<'APPRUN'
#!/bin/sh
here="$(dirname "$(readlink -f "$0")")"
exec "$here/usr/bin/drift" "$@"
APPRUN
chmod 755 "$appdir/AppRun"
echo "AppDir: $appdir"
[ "$appdir_only" -eq 1 ] && exit 0

tool="${APPIMAGETOOL:-$(command -v appimagetool || true)}"
if [ -z "$tool" ]; then
    echo "appimagetool was not found: download appimagetool-$arch.AppImage from" >&2
    echo "https://github.com/AppImage/appimagetool/releases, make it executable and set APPIMAGETOOL to it" >&2
    exit 1
fi
version="$("$appdir/usr/bin/drift" --version | awk '{print $2}')"
image="$out/Drift-$version-$arch.AppImage"
# APPIMAGE_EXTRACT_AND_RUN lets appimagetool, itself an AppImage, run where FUSE is missing (containers, CI).
ARCH="$arch" APPIMAGE_EXTRACT_AND_RUN=1 "$tool" "$appdir" "$image"
echo "AppImage: $image"
