#!/usr/bin/env bash
# What a fenced transaction costs the whole machine when clients send it, side by side with
# Temporal's fence and the floor: 16 pgbench processes (one connection each, each on its own
# row with its own token), one side at a time for SECONDS, the sides interleaved ROUNDS times.
# Prints, per side and round: transactions per second, the machine's CPU per transaction
# (/proc/stat) and the clients' (pgbench's own user+system time). Data for
# docs/benchmarks/pgfence-client-mode.md.
#
# Needs a database left by `pgfencebench --concurrency 16 --keep-database` (its URL is the
# first argument: its tables, its 16 workers' remembered tokens and `bench_floor`) and pgbench
# (Debian's postgresql-15 package has it). MODE is pgbench's protocol: prepared or simple.
set -euo pipefail
url=${1:?usage: pgfence-client-mode.sh DATABASE_URL [MODE] [SECONDS] [ROUNDS]}
mode=${2:-prepared}
seconds=${3:-5}
rounds=${4:-3}
pgbench=$(command -v pgbench || echo /usr/lib/postgresql/15/bin/pgbench)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

psql "$url" -At -F' ' -c "SELECT substring(resource FROM 7), wire FROM fencing.verdicts
    WHERE resource ~ '^aisle-[0-9]+$' ORDER BY 1" > "$work/tokens"
[ "$(wc -l < "$work/tokens")" -ge 16 ] || { echo "fewer than 16 remembered tokens in $url" >&2; exit 1; }
while read -r n token; do
    for side in temporal floor admit; do
        case $side in
            temporal) check="SELECT range_id FROM shards WHERE aisle = 'aisle-$n' FOR SHARE;" ;;
            floor) check="SELECT bench_floor('aisle-$n');" ;;
            admit) check="SELECT fencing.admit('aisle-$n', '$token');" ;;
        esac
        printf 'BEGIN;\n%s\nUPDATE stock SET qty = qty + 1 WHERE aisle = %s;\nCOMMIT;\n' \
            "$check" "'aisle-$n'" > "$work/$side-$n.sql"
    done
done < <(head -16 "$work/tokens")

machine() { head -1 /proc/stat | awk '{print $2 + $3 + $4 + $7 + $8}'; }
for round in $(seq "$rounds"); do
    for side in temporal floor admit; do
        before=$(machine)
        for n in $(cut -d' ' -f1 < <(head -16 "$work/tokens")); do
            /usr/bin/time -f '%U %S' -o "$work/time-$n" \
                "$pgbench" -n -M "$mode" -c 1 -T "$seconds" -f "$work/$side-$n.sql" "$url" > "$work/out-$n" 2>&1 &
        done
        wait
        after=$(machine)
        tx=$(awk '/number of transactions actually processed/ {s += $6} END {print s}' "$work"/out-*)
        client=$(awk '{s += $1 + $2} END {print s}' "$work"/time-*)
        awk -v side="$side" -v round="$round" -v tx="$tx" -v s="$seconds" -v client="$client" \
            -v ticks="$((after - before))" -v hz="$(getconf CLK_TCK)" 'BEGIN {
            printf "%s round %d: %.0f tx/s, machine %.0f µs/tx, clients %.0f µs/tx\n",
                side, round, tx / s, ticks / hz * 1e6 / tx, client * 1e6 / tx }'
    done
done
