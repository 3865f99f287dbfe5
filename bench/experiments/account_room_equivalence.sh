#!/usr/bin/env bash
# Runs bench/experiments/account_room_equivalence.sql: installs the PL/pgSQL account_room of
# b2fbc66 (the last commit that had it) as herald.account_room_plpgsql, inside the check's
# transaction, and compares it with the current one.
# Usage: account_room_equivalence.sh DATABASE_URL
# DATABASE_URL names a scratch database herald has migrated.
set -euo pipefail
url=${1:?a scratch database herald has migrated}
here=$(cd "$(dirname "$0")" && pwd)
old=$(git -C "$here" show b2fbc66:scheduler/src/store/accounts/functions.sql |
  awk '/^CREATE OR REPLACE FUNCTION herald.account_room\(/ {on = 1} on {print} on && /^\$\$;/ {exit}' |
  sed 's/herald.account_room(/herald.account_room_plpgsql(/')
# The check opens its transaction first; the old function is created inside it.
{
  echo "BEGIN;"
  echo "$old"
  sed '/^BEGIN;$/d' "$here/account_room_equivalence.sql"
} | psql -v ON_ERROR_STOP=1 "$url"
