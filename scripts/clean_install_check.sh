#!/usr/bin/env bash
# The README's first command, run the way a new user runs it: a fresh virtual environment (no
# system site packages) holding only what `pip install .` brings, plus a CPU build of torch; then
# `bertcli init` and a short `pretrain` on the bundled sample, from a folder outside the checkout.
# A runtime import missing from pyproject.toml's dependencies fails here (the tests cannot see it:
# their environment also holds the test extra). CI runs it before the tests (.ci/run).
#   bash scripts/clean_install_check.sh      # TORCH_SPEC names another torch build, as in setup.sh
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/bertcli-clean-install.XXXXXX")
trap 'rm -rf "$work"' EXIT
start=$SECONDS
unset PYTHONPATH PYTHONHOME  # nothing from the developer's environment may leak in
export PYTHONNOUSERSITE=1

# The checkout's files as git sees them (tracked and untracked, not ignored): the build writes
# build/ and *.egg-info next to the sources, so it runs on a copy.
mkdir "$work/src"
if git -C "$repo" rev-parse --git-dir >/dev/null 2>&1; then
  (cd "$repo" && git ls-files -z --cached --others --exclude-standard | xargs -0 -I{} cp --parents {} "$work/src")
else  # not a git checkout (an unpacked archive): all of it
  cp -a "$repo/." "$work/src"
fi

python3 -m venv "$work/venv"
bin="$work/venv/bin"
# torch first, so that `pip install .` finds it and pulls no CUDA build onto a CPU machine.
# --no-compile: byte-compiling torch's thousands of files would take most of the check's time.
"$bin/python" -m pip install -q --no-compile ${TORCH_SPEC:-torch==2.13.0}
echo "clean install check: torch installed at $((SECONDS - start)) s" >&2
"$bin/python" -m pip install -q --no-compile "$work/src"
echo "clean install check: bertcli installed at $((SECONDS - start)) s" >&2
rm -rf "$work/src"  # from here on only the installed package exists

cd "$work"
"$bin/bertcli" init runs/demo
"$bin/bertcli" pretrain --config runs/demo/config.yaml --quiet \
  --set train.max_steps=20 --set train.eval_every=10 --set train.eval_examples=64 --set checkpoint.save_every=10
"$bin/bertcli" inspect runs/demo >/dev/null
echo "clean install check: passed in $((SECONDS - start)) s" >&2
