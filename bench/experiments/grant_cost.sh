#!/usr/bin/env bash
# Times the routed grant's database work apart from the rest of a claim, with pgbench on one
# connection: a claim of 1,000 assignments over 100 accounts (S5's shape: ten each, fresh
# recipients, every account recording sends per recipient), and its parts. Each line is the
# mean latency of one pgbench run; runs alternate, so a slow minute shows in every part.
# Single runs of S5 spread about ±10 %; these spread a few per cent, which is what a change to
# herald.grant_claim or herald.reserve_capacity needs to be seen (docs/performance.md, S5).
# Usage: grant_cost.sh DATABASE_URL [ROUNDS] [TRANSACTIONS]
# DATABASE_URL names a scratch database herald has migrated (herald-scheduler migrate); its
# accounts and recipient pairs are replaced.
set -euo pipefail
url=${1:?a scratch database herald has migrated}
rounds=${2:-3}
transactions=${3:-100}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

psql -q -v ON_ERROR_STOP=1 "$url" <<'SQL'
INSERT INTO herald.pools (namespace, name) VALUES ('default', 'grant-cost') ON CONFLICT DO NOTHING;
DELETE FROM herald.accounts WHERE namespace = 'default';
-- Limits that are all set and never bind over a few thousand claims.
INSERT INTO herald.accounts (namespace, id, sender_kind, pool, credentials_ref, rate_per_sec,
                             burst, daily_cap, max_in_flight, recipient_interval_ms,
                             high_priority_reserve, effective_rate, tokens)
SELECT 'default', 'acct-' || lpad(i::text, 3, '0'), 'noop', 'grant-cost',
       'acct-' || lpad(i::text, 3, '0'), 5e9, 2000000000, 2000000000, 2000000000, 6000, 0.1,
       5e9, 2e9
FROM generate_series(0, 99) i;
SQL

ids="(SELECT array_agg(gen_random_uuid()) FROM generate_series(1, 1000))"
accounts="(SELECT array_agg('acct-' || lpad((i % 100)::text, 3, '0') ORDER BY i) FROM generate_series(1, 1000) i)"
recipients="(SELECT array_agg('r' || (random() * 1e15)::bigint) FROM generate_series(1, 1000))"
tracked="(SELECT array_agg(id) FROM herald.accounts WHERE namespace = 'default')"
flags="array_fill(false, ARRAY[1000])"
echo "SELECT cardinality($ids) + cardinality($accounts) + cardinality($recipients) + cardinality($tracked);" \
  >"$work/inputs.sql"
echo "SELECT count(*) FROM herald.reserve_capacity('default', (SELECT array_agg(id ORDER BY id) FROM herald.accounts WHERE namespace = 'default'), array_fill(1, ARRAY[100]), array_fill(9, ARRAY[100]), array_fill(0, ARRAY[100]));" \
  >"$work/reservation.sql"
echo "SELECT count(*) FROM herald.grant_claim('default', $ids, $accounts, $flags, $flags, $recipients, ARRAY[]::text[]);" \
  >"$work/grant_without_marks.sql"
echo "SELECT count(*) FROM herald.grant_claim('default', $ids, $accounts, $flags, $flags, $recipients, $tracked);" \
  >"$work/grant.sql"

for round in $(seq 1 "$rounds"); do
  for part in inputs reservation grant_without_marks grant; do
    # Every run starts from an empty marks table, as S5 does.
    psql -q -v ON_ERROR_STOP=1 "$url" -c "TRUNCATE herald.recipient_sends"
    latency=$(pgbench -n -M prepared -c 1 -t "$transactions" -f "$work/$part.sql" "$url" 2>&1 |
      awk '/latency average/ {print $4}')
    printf 'round %s  %-20s %s ms\n' "$round" "$part" "$latency"
  done
done
