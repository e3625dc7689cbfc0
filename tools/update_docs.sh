#!/usr/bin/env bash
# tools/update_docs.sh [MPSIM]: rewrites the generated blocks of the docs from
# the field tables (`mpsim docs TABLE`), between their markers
#   <!-- BEGIN generated: mpsim docs TABLE -->  ...  <!-- END generated: mpsim docs TABLE -->
# The CLI tests "docs: ..." fail while a block differs from the output.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mpsim=${1:-$root/build/default/experiments/mpsim}
update() {  # DOC TABLE
  local doc=$root/$1 table=$2 generated
  generated=$(mktemp)
  "$mpsim" docs "$table" > "$generated"
  awk -v b="<!-- BEGIN generated: mpsim docs $table -->" -v e="<!-- END generated: mpsim docs $table -->" \
      -v file="$generated" '
    $0 == e { while ((getline line < file) > 0) print line; on = 0 }
    !on { print }
    $0 == b { on = 1 }' "$doc" > "$doc.new"
  mv "$doc.new" "$doc"
  rm -f "$generated"
}
update docs/configs.md configs
update docs/hdf5-schema.md root
update docs/hdf5-schema.md arm
update docs/hdf5-schema.md policy
update docs/hdf5-schema.md steps
update docs/hdf5-schema.md eval
update docs/hdf5-schema.md shadow
