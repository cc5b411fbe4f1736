#!/usr/bin/env bash
# The campaign data docs/RELIABILITY.md quotes, and the tables it shows.
#   ./scripts/campaign.sh render   print the markdown of every committed data file (no runs)
#   ./scripts/campaign.sh doc      regenerate docs/RELIABILITY.md from campaign/doc/reliability.md
#                                  and the committed data (no runs)
#   ./scripts/campaign.sh run      re-measure: run the campaign with the published seeds and
#                                  settings into campaign/data/ (minutes; overwrites the files)
#   ./scripts/campaign.sh run NAME…  only those data files (e.g. `fleet
#                                  control-no-revoke-before-grant`)
#   CAMPAIGN_RUNS=50 CAMPAIGN_CONTROL_RUNS=10 CAMPAIGN_PROFILE=release ./scripts/campaign.sh run
#                                  the published campaign (about an hour on 2 cores)
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
cargo build --profile "$profile" -p lease-proxy -p fencing --features fencing/server \
  -p lease-proxy-campaign --bins
# The proxy's own negative controls live in a build of their own, never in the binaries above.
cargo build --profile "$profile" -p lease-proxy --features negative-controls \
  --bin lease-proxy-controls

# The data files in the order docs/RELIABILITY.md shows them.
data_files() {
  echo campaign/data/deployment.json
  [ -f campaign/data/sessions.json ] && echo campaign/data/sessions.json
  [ -f campaign/data/grpc-mutex.json ] && echo campaign/data/grpc-mutex.json
  [ -f campaign/data/belief.json ] && echo campaign/data/belief.json
  for control in no-fencing memory-marks forget-in-flight release-with-caller local-gate no-prefence unexchanged-locks; do
    [ -f "campaign/data/control-$control.json" ] && echo "campaign/data/control-$control.json"
  done
  [ -f campaign/data/paused-admissions.json ] && echo campaign/data/paused-admissions.json
  [ -f campaign/data/control-deadline-from-admission.json ] \
    && echo campaign/data/control-deadline-from-admission.json
  [ -f campaign/data/in-database.json ] && echo campaign/data/in-database.json
  [ -f campaign/data/control-trigger-removed.json ] && echo campaign/data/control-trigger-removed.json
  [ -f campaign/data/fleet.json ] && echo campaign/data/fleet.json
  [ -f campaign/data/control-no-revoke-before-grant.json ] \
    && echo campaign/data/control-no-revoke-before-grant.json
  return 0
}

# One data file's runs: `measure NAME FLAGS…` writes campaign/data/NAME.{md,json}, unless
# names were given on the command line and NAME is not one of them.
measure() {
  local name="$1"
  shift
  if [ "${#only[@]}" -gt 0 ] && [[ ! " ${only[*]} " =~ " $name " ]]; then
    return 0
  fi
  "$bin" "$@" --report "campaign/data/$name"
}

case "${1:-render}" in
  doc)
    # docs/RELIABILITY.md = the prose of campaign/doc/reliability.md with every data file's
    # rendering at its `<!-- data -->` line.
    src=campaign/doc/reliability.md
    {
      sed '/^<!-- data -->$/,$d' "$src"
      for f in $(data_files); do
        echo "### \`$(basename "$f" .json)\` (\`$f\`)"
        echo
        "$bin" --render "$f"
        echo
      done
      sed '1,/^<!-- data -->$/d' "$src"
    } > docs/RELIABILITY.md
    echo "wrote docs/RELIABILITY.md"
    ;;
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
    shift
    only=("$@")
    # The real deployment must show no violation (exit 1 otherwise); a control must be caught
    # in at least 90 % of its runs — both are reported, and the data is kept either way.
    status=0
    measure deployment --runs "$runs" --duration 30s --seed 1000 || status=1
    # Every fifth client locks with etcd's Mutex recipe over gRPC: the deployment
    # with them, measured on its own (10 runs, as the controls).
    measure grpc-mutex --runs "$control_runs" --duration 30s --seed 1100 || status=1
    # The deployment once more, for its belief verdict (every run reports it; these runs were
    # the first to).
    measure belief --runs "$control_runs" --duration 30s --seed 16000 || status=1
    seed=2000
    for control in no-fencing memory-marks forget-in-flight release-with-caller local-gate no-prefence unexchanged-locks; do
      measure "control-$control" --runs "$control_runs" --duration 30s --seed "$seed" \
        --control "$control" || status=1
      seed=$((seed + 1000))
    done
    # Gateways paused mid-admission (the exchange deadline's start): their own fault mix, on gateways whose
    # registrations last 4 s, the real gateways and the control.
    measure paused-admissions --runs "$control_runs" --duration 25s --seed 9500 \
      --faults paused-admissions || status=1
    measure control-deadline-from-admission --runs "$control_runs" --duration 25s --seed 9600 \
      --faults paused-admissions --control deadline-from-admission || status=1
    # Fencing inside PostgreSQL: SQL clients writing straight into a protected table,
    # and the control with the table left unprotected.
    measure in-database --runs "$control_runs" --duration 30s --seed 12000 \
      --marks in-database || status=1
    measure control-trigger-removed --runs "$control_runs" --duration 30s --seed 13000 \
      --marks in-database --control trigger-removed || status=1
    # A fleet's members beside the clients (six at the start on twelve resources of their own),
    # and the control that grants what another member still holds.
    measure fleet --runs "$control_runs" --duration 30s --seed 14000 --fleet 6x12 || status=1
    measure control-no-revoke-before-grant --runs "$control_runs" --duration 30s --seed 15000 \
      --fleet 6x12 --control no-revoke-before-grant || status=1
    exit "$status"
    ;;
  *) echo "usage: $0 [render|doc|run]" >&2; exit 64 ;;
esac
