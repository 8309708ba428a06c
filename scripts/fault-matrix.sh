#!/usr/bin/env bash
# The fault matrix (not part of the unit suite; about 2 minutes): the real
# binary against services started for it (a PostgreSQL cluster of its own,
# initdb'd on its own port, never the machine's shared one; a nats-server
# and a redis-server of its own; a tmpfs under the embedded queue), one
# fault per row, and a table of webhooks sent,
# accepted, applied, dead-lettered, lost, duplicate effects and time to
# recover. Fails when a row loses a webhook or applies one twice.
#
# Needs root (the tmpfs mount; PostgreSQL's own files go to its user) and
# PostgreSQL's binaries (the postgresql package).
#
#   scripts/fault-matrix.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi
exec cargo test -p breakwater-cli --test it -- --ignored --nocapture --exact fault_matrix::fault_matrix
