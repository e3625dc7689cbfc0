#!/usr/bin/env bash
# testfloat_vectors.sh SHARED_DIR MPSIM FUNCTION MODE: pipes TestFloat's vectors
# for FUNCTION.MODE through `mpsim fp testfloat`. Skips (77) without shared/.
file="$1/testfloat/$3.$4.txt.gz"
[ -f "$file" ] || { echo "SKIPPED: $file is absent (shared/ is not beside the project)"; exit 77; }
gzip -dc "$file" | "$2" fp testfloat "$3" "-$4"
