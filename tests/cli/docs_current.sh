#!/usr/bin/env bash
# docs_current.sh MPSIM DOC TABLE: the block of DOC between
#   <!-- BEGIN generated: mpsim docs TABLE -->  and  <!-- END generated: mpsim docs TABLE -->
# must be exactly what `MPSIM docs TABLE` prints (the field tables in core).
# Regenerate with tools/update_docs.sh.
set -euo pipefail
mpsim=$1 doc=$2 table=$3
begin="<!-- BEGIN generated: mpsim docs $table -->"
end="<!-- END generated: mpsim docs $table -->"
grep -qxF "$begin" "$doc" || { echo "$doc has no line '$begin'"; exit 1; }
grep -qxF "$end" "$doc" || { echo "$doc has no line '$end'"; exit 1; }
committed=$(awk -v b="$begin" -v e="$end" '$0 == e {on = 0} on {print} $0 == b {on = 1}' "$doc")
if diff -u <(printf '%s\n' "$committed") <("$mpsim" docs "$table"); then
  echo "$doc: mpsim docs $table is current"
else
  echo "$doc differs from 'mpsim docs $table' (above); run tools/update_docs.sh"
  exit 1
fi
