#!/bin/bash
# keeps_user_data.sh MPSIM CONFIG RUN_DIR OVERRIDES...
#
# A run never loses what a user already has (issue 18): with --force, every
# bad input below stops with exit 2 and a message before the old log and its
# config are touched; a folder given as -o stays; a .toml beside the log that
# mpsim did not write is never replaced.
set -uo pipefail
mpsim=${1:?usage: keeps_user_data.sh MPSIM CONFIG RUN_DIR OVERRIDES...}
config=${2:?}
dir=${3:?}/keeps
shift 3
fail() { echo "FAIL: $*"; exit 1; }
rm -rf "$dir" && mkdir -p "$dir" || fail "cannot make $dir"

"$mpsim" run "$config" "$@" 'arms=["fp32"]' -o "$dir/old.h5" --quiet > /dev/null || fail "the first run failed"
sum=$(cat "$dir/old.h5" "$dir/old.toml" | md5sum)

expect_refusal() {  # REGEX ARGS...: exit 2, the message, and the old results untouched
  local regex=$1 out rc
  shift
  out=$("$mpsim" run "$config" "$@" 2>&1)
  rc=$?
  echo "$out" | tail -n 2
  [ "$rc" -eq 2 ] || fail "exit $rc, expected 2: mpsim run $*"
  grep -Eq -- "$regex" <<<"$out" || fail "the message does not match '$regex'"
  [ "$(cat "$dir/old.h5" "$dir/old.toml" | md5sum)" = "$sum" ] || fail "the old log or config changed: $*"
}
expect_refusal "train.batch_size = 100000 is larger than the 512 training samples" \
  "$@" train.batch_size=100000 -o "$dir/old.h5" --force
expect_refusal "model.hidden = \[100000000\] needs about [0-9.]+ GiB" "$@" 'model.hidden=[100000000]' -o "$dir/old.h5" --force
expect_refusal "arms lists 'fp32' twice" "$@" 'arms=["fp32","fp32"]' -o "$dir/old.h5" --force
# Repeats that would make two arms of one name, and names the log cannot hold: refused before any training
# (they used to train every arm and then fail to write the second, after --force had removed the old log).
expect_refusal "seeds lists 1 twice" "$@" 'seeds=[1,1]' -o "$dir/old.h5" --force
expect_refusal "backends lists 'cpu' twice" "$@" 'backends=["cpu","cpu"]' -o "$dir/old.h5" --force
expect_refusal "two arms would be named 'fp32@lr=0.1': sweep points 1 and 2" \
  "$@" 'arms=["fp32"]' 'optimizer.lr=0.1,0.1' -o "$dir/old.h5" --force
expect_refusal "arm 'a/b' cannot be named so in the HDF5 log" "$@" 'arms=["a/b"]' 'policies.a/b.weights=binary32' \
  -o "$dir/old.h5" --force
expect_refusal "train.threads must be in \[0, 1024\]" "$@" train.threads=100000 -o "$dir/old.h5" --force
expect_refusal "backends must not be empty" "$@" 'backends=[]' -o "$dir/old.h5" --force
expect_refusal "override 'sweep.optimizer.lr=\[0.1,0.2\]': the \[sweep\] table is read from the config file only" \
  "$@" 'sweep.optimizer.lr=[0.1,0.2]' -o "$dir/old.h5" --force
expect_refusal "output '.*old.h5/x.h5' lies under '.*old.h5', which is a file" "$@" -o "$dir/old.h5/x.h5" --force

mkdir -p "$dir/folder"
expect_refusal "output '.*folder' is a folder" "$@" -o "$dir/folder" --force
[ -d "$dir/folder" ] || fail "the folder given as -o was removed"

printf 'arms = ["fp32"]\n# my own notes\n' > "$dir/mine.toml"
mine=$(md5sum < "$dir/mine.toml")
expect_refusal "mine.toml' exists and is not a config that mpsim wrote" "$@" -o "$dir/mine.h5" --force
[ "$(md5sum < "$dir/mine.toml")" = "$mine" ] || fail "the user's mine.toml was changed"
[ ! -e "$dir/mine.h5" ] || fail "a log was written beside the user's config"
echo "ok: every refusal kept the user's files"
