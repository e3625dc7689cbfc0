#!/usr/bin/env bash
# expect.sh EXPECTED_EXIT REGEX -- COMMAND...: runs COMMAND, passes when it
# exits with EXPECTED_EXIT and its output (stdout and stderr) matches REGEX
# (extended grep). Exit 77 from COMMAND is passed on: CTest's "Skipped".
expected=$1 regex=$2
shift 3
output=$("$@" 2>&1)
code=$?
printf '%s\n' "$output"
[ "$code" -eq 77 ] && exit 77
if [ "$code" -ne "$expected" ]; then echo "FAIL: exit code $code, expected $expected"; exit 1; fi
if ! grep -Eq -- "$regex" <<<"$output"; then echo "FAIL: output does not match: $regex"; exit 1; fi
echo "ok: exit $code, output matches"
