#!/usr/bin/env bash
# The packaging test that .ci/run runs last: the icon set, desktop entry and AppStream metainfo are valid; the
# .deb builds (cargo-deb), installs with dpkg, its /usr/bin/drift runs, and it removes without leaving files;
# the AppImage's AppDir assembles and starts. Needs root or sudo, and the drift package not installed already.
set -euo pipefail
cd "$(dirname "$0")/../.."
started=$SECONDS
passed=0
pass() { passed=$((passed + 1)); echo "ok: $1"; }
fail() { echo "FAILED: $1" >&2; echo "package: $passed passed, 1 failed"; exit 1; }

SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
CARGO_DEB_VERSION=3.8.0
target_dir="${CARGO_TARGET_DIR:-$PWD/target}"

missing=()
command -v desktop-file-validate >/dev/null || missing+=(desktop-file-utils)
command -v appstreamcli >/dev/null || missing+=(appstream)
command -v dpkg-shlibdeps >/dev/null || missing+=(dpkg-dev) # cargo-deb's $auto dependencies
if [ ${#missing[@]} -gt 0 ]; then
    echo "== installing ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if [ "$(cargo deb --version 2>/dev/null || true)" != "cargo-deb $CARGO_DEB_VERSION" ]; then
    echo "== installing cargo-deb $CARGO_DEB_VERSION"
    cargo install --quiet --locked cargo-deb --version "$CARGO_DEB_VERSION"
fi

# Each PNG is the size its name says and the SVG is well-formed XML.
python3 - <<'PY' || fail "icon set"
import glob, re, struct, xml.etree.ElementTree as ET
ET.parse("assets/icons/drift.svg")
pngs = sorted(glob.glob("assets/icons/drift-*.png"))
sizes = set()
for path in pngs:
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", f"{path} is not a PNG"
    width, height = struct.unpack(">II", head[16:24])
    n = int(re.search(r"drift-(\d+)\.png$", path).group(1))
    assert (width, height) == (n, n), f"{path} is {width}x{height}"
    sizes.add(n)
assert {16, 32, 48, 64, 128, 256, 512} <= sizes, f"sizes {sorted(sizes)}"
PY
pass "icon set (SVG, PNG sizes)"
desktop-file-validate packaging/linux/drift.desktop || fail "desktop-file-validate drift.desktop"
pass "desktop entry"
appstreamcli validate --no-net packaging/linux/io.drift.Drift.metainfo.xml || fail "appstreamcli validate"
pass "AppStream metainfo"

if dpkg-query -W -f='${Status}' drift 2>/dev/null | grep -q 'install ok installed'; then
    fail "a drift package is installed already; remove it (dpkg -r drift) or set DRIFT_SKIP_PACKAGE=1"
fi

echo "== cargo deb"
deb="$(cargo deb -p drift-app --locked --strip | tail -n1)" || fail "cargo deb"
[ -f "$deb" ] || fail "cargo deb made no .deb (last line: $deb)"
pass "cargo deb: $deb ($(du -h "$deb" | cut -f1))"
version="$(dpkg-deb -f "$deb" Version)"
depends="$(dpkg-deb -f "$deb" Depends)"
echo "Depends: $depends"
[[ "$depends" == *libc6* && "$depends" == *libvulkan1* ]] || fail "Depends lacks libc6 or libvulkan1"
contents="$(dpkg-deb -c "$deb" | awk '{print $6}')"
for path in ./usr/bin/drift ./usr/share/applications/drift.desktop ./usr/share/metainfo/io.drift.Drift.metainfo.xml \
    ./usr/share/icons/hicolor/scalable/apps/drift.svg ./usr/share/icons/hicolor/{16x16,32x32,48x48,256x256,512x512}/apps/drift.png; do
    grep -qxF "$path" <<<"$contents" || fail "the .deb lacks $path"
done
pass "the .deb's control fields and files"

# From here the package is installed: remove it however the checks end.
cleanup() { $SUDO dpkg -r drift >/dev/null 2>&1 || true; }
trap cleanup EXIT
$SUDO dpkg -i "$deb" || fail "dpkg -i"
pass "dpkg -i"
[ "$(command -v drift)" = /usr/bin/drift ] || echo "note: drift on PATH is $(command -v drift), testing /usr/bin/drift"
out="$(/usr/bin/drift --version)" || fail "/usr/bin/drift --version"
[ "$out" = "drift ${version%-*}" ] || fail "/usr/bin/drift --version printed '$out', the package is $version"
pass "/usr/bin/drift --version: $out"
/usr/bin/drift info --json | python3 -c 'import json, sys; d = json.load(sys.stdin); print("device:", d["name"], d["backend"])' \
    || fail "/usr/bin/drift info --json is not JSON with a device"
pass "/usr/bin/drift info --json"
desktop-file-validate /usr/share/applications/drift.desktop || fail "installed desktop entry"
appstreamcli validate --no-net /usr/share/metainfo/io.drift.Drift.metainfo.xml || fail "installed metainfo"
pass "installed desktop entry and metainfo"

installed="$(dpkg -L drift)"
$SUDO dpkg -r drift || fail "dpkg -r"
trap - EXIT
[ ! -e /usr/bin/drift ] || fail "/usr/bin/drift is still there after dpkg -r"
while read -r path; do
    [ -d "$path" ] || [ ! -e "$path" ] || fail "$path is still there after dpkg -r"
done <<<"$installed"
! dpkg-query -W -f='${Status}' drift 2>/dev/null | grep -q 'installed' || fail "dpkg still lists drift as installed"
pass "dpkg -r removed every file"

echo "== AppImage's AppDir"
bash packaging/linux/appimage.sh --appdir-only || fail "appimage.sh --appdir-only"
appdir="$target_dir/packages/Drift.AppDir"
out="$("$appdir/AppRun" --version)" || fail "AppDir/AppRun --version"
[ "$out" = "drift ${version%-*}" ] || fail "AppRun --version printed '$out'"
desktop-file-validate "$appdir/drift.desktop" || fail "AppDir desktop entry"
pass "AppDir: AppRun --version, desktop entry"

echo "package step took $((SECONDS - started)) s"
echo "package: $passed passed, 0 failed"
