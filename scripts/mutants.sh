#!/usr/bin/env bash
# Mutation testing of the safety-relevant modules (see docs/MUTATION.md). Not run in CI: about
# 40 minutes on 2 cores. cargo-mutants mutates the sources in place, so this works in a scratch
# copy of the working tree (uncommitted changes included) and leaves this tree alone.
#
#   scripts/mutants.sh [OUT_DIR]        # default OUT_DIR: target/mutants
#
# Needs `cargo install cargo-mutants --locked` (the report used 27.1.0). Unit tests only
# (`--lib`): no etcd, no PostgreSQL. Niced, one build at a time, so it can share a machine.
# The scratch copy has no target/: the dependencies are built first (long at one job) unless
# CARGO_TARGET_DIR points at an existing target directory, e.g. this tree's.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$src/target/mutants}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$src" && git ls-files -co --exclude-standard -z | tar --null -T - -cf -) | tar -xf - -C "$work"
cd "$work"
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-1}"
common=(--in-place --jobserver-tasks 1 --cargo-arg=--lib --minimum-test-timeout 10)
# Left out: replacements that cannot compile because the type has no such constructor or
# `Default` (cargo-mutants would report them unviable), and Debug/Display formatting.
skip=(
  --exclude-re='with BoxFuture::'
  --exclude-re='with MutexGuard::'
  --exclude-re='<impl (std::)?fmt::(Debug|Display) for'
  --exclude-re='-> Self with Default::default\(\)'
  --exclude-re='with Box::leak\(Box::new\(Default::default\(\)\)\)'
  --exclude-re='-> Arc<Entry> with Arc::new\(Default::default\(\)\)'
  --exclude-re='-> Result<(Self|T), [A-Za-z]+> with Ok\(Default::default\(\)\)'
  --exclude-re='err -> StoreError with Default::default\(\)'
  --exclude-re='-> Decision with Default::default\(\)'
)
nice -n 19 cargo mutants "${common[@]}" --package fencing \
  -f fencing/src/gate.rs -f fencing/src/token.rs -f fencing/src/keys.rs -f fencing/src/domain.rs \
  -f fencing/src/admission.rs -f fencing/src/layer/classify.rs \
  -f fencing/src/store/memory.rs -f 'fencing/src/store/sqlite/*.rs' \
  "${skip[@]}" -o "$out/fencing" || true
nice -n 19 cargo mutants "${common[@]}" --package lease-proxy -f 'proxy/src/lease/*.rs' \
  -o "$out/lease-proxy" || true
echo "outcomes: $out/fencing/mutants.out and $out/lease-proxy/mutants.out (missed.txt lists survivors)"
