#!/usr/bin/env bash
# Runs bench/experiments/narrow_lease.sql: ROUNDS alternating drains of TASKS due tasks, the
# wide-row lease (A) then the narrow-table lease (B), two sessions each, and prints tasks/s.
# Usage: narrow_lease.sh DATABASE_URL [ROUNDS] [TASKS]
# DATABASE_URL names a scratch database herald has migrated (its tasks are deleted).
set -euo pipefail
url=${1:?a scratch database herald has migrated}
rounds=${2:-3}
tasks=${3:-50000}
here=$(cd "$(dirname "$0")" && pwd)
psql -q -v ON_ERROR_STOP=1 "$url" -f "$here/narrow_lease.sql"
for ((r = 0; r < rounds; r++)); do
  for variant in A B; do
    psql -q -v ON_ERROR_STOP=1 "$url" -c "CALL herald.exp_reset('$variant', $tasks)" \
      -c "VACUUM ANALYZE herald.tasks" -c "VACUUM ANALYZE herald.due_q" \
      -c "VACUUM ANALYZE herald.lease_q" -c "VACUUM ANALYZE herald.attempts" -c "CHECKPOINT"
    start=$(date +%s.%N)
    psql -q "$url" -c "CALL herald.exp_drain('$variant', 512)" &
    psql -q "$url" -c "CALL herald.exp_drain('$variant', 512)" &
    wait
    end=$(date +%s.%N)
    done=$(psql -Atq "$url" -c "SELECT count(*) FROM herald.attempts")
    echo "round $r $variant: $(echo "$done / ($end - $start)" | bc) tasks/s ($done tasks)"
  done
done
