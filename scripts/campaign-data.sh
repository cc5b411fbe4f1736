#!/usr/bin/env bash
# The campaign data docs/RELIABILITY.md quotes, and the tables it shows.
#   ./scripts/campaign-data.sh render   print the markdown of every committed data file (no runs)
#   ./scripts/campaign-data.sh run      re-measure: run the campaign with the published seeds and
#                                       settings into campaign/data/ (minutes; overwrites the files)
#   CAMPAIGN_RUNS=50 CAMPAIGN_PROFILE=release ./scripts/campaign-data.sh run   the long campaign
# Each data file holds every run's seed, settings, fault plan, fault log and figures;
# `cargo test -p lease-proxy-campaign --test replay` checks that each seed reproduces its plan.
set -euo pipefail
cd "$(dirname "$0")/.."

profile="${CAMPAIGN_PROFILE:-dev}"
runs="${CAMPAIGN_RUNS:-5}"
control_runs="${CAMPAIGN_CONTROL_RUNS:-3}"
case "$profile" in
  dev) bin=target/debug/campaign ;;
  release) bin=target/release/campaign ;;
  *) echo "CAMPAIGN_PROFILE is dev or release" >&2; exit 64 ;;
esac
cargo build --profile "$profile" -p lease-proxy -p fencing -p lease-proxy-campaign --bins

case "${1:-render}" in
  render)
    for f in campaign/data/*.json; do
      echo "### $f"
      echo
      "$bin" --render "$f"
      echo
    done
    ;;
  run)
    mkdir -p campaign/data
    # The real deployment must show no violation (exit 1 otherwise); a control must be caught
    # in at least 90 % of its runs — both are reported, and the data is kept either way.
    status=0
    "$bin" --runs "$runs" --duration 30s --seed 1000 --report "campaign/data/deployment" || status=1
    seed=2000
    for control in no-fencing memory-marks forget-in-flight; do
      "$bin" --runs "$control_runs" --duration 20s --seed "$seed" --control "$control" \
        --report "campaign/data/control-$control" || status=1
      seed=$((seed + 1000))
    done
    exit "$status"
    ;;
  *) echo "usage: $0 [render|run]" >&2; exit 64 ;;
esac
