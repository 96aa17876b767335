#!/usr/bin/env bash
# Renders the PNG icon set (and the Windows .ico) from assets/icons/drift.svg. The results are committed, so
# packaging and CI need no SVG renderer; rerun this after editing the SVG.
# Needs rsvg-convert (Debian/Ubuntu: apt-get install librsvg2-bin) and, for the .ico, ImageMagick's convert.
set -euo pipefail
cd "$(dirname "$0")/../../assets/icons"

sizes=(16 24 32 48 64 128 256 512)
for n in "${sizes[@]}"; do
    rsvg-convert --width "$n" --height "$n" drift.svg --output "drift-$n.png"
done
# Windows wants one .ico with the small sizes and 256 for large views.
convert drift-16.png drift-24.png drift-32.png drift-48.png drift-64.png drift-128.png drift-256.png drift.ico
ls -l drift.svg drift-*.png drift.ico
