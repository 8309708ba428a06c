#!/usr/bin/env bash
# The fault matrix (not part of the unit suite; about 8 minutes): the real
# binary against services started for it, never the machine's shared ones
# where the fault would hit them (a PostgreSQL cluster of its own, initdb'd
# on its own port; a nats-server, a RabbitMQ node, a tansu Kafka broker,
# a moto SQS endpoint behind a fault proxy and a redis-server, each of its
# own; a tmpfs under the embedded queue, another under the segment log),
# one fault per row, and a
# table of webhooks sent, accepted, applied, dead-lettered, lost, duplicate
# effects and time to recover. Fails when a row loses a webhook or applies
# one twice.
#
# Needs root (the tmpfs mount; PostgreSQL's and RabbitMQ's files go to
# their users). Installs what it runs on first use (scripts/services.sh).
#
#   scripts/fault-matrix.sh
#   FAULT_MATRIX_ROWS=kafka,sqs scripts/fault-matrix.sh   # some rows only:
#     postgres-restart postgres-stop sigkill disk-full disk-full-log nats
#     rabbitmq kafka sqs redis, and sqs-blackhole (only when named: moto stops answering
#     in its recovery, see fault_matrix.rs)
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/services.sh
. scripts/services.sh

if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi
ensure_nats
ensure_redis
ensure_rabbitmq
install_moto
ensure_kafka
exec cargo test -p breakwater-cli --test it -- --ignored --nocapture --exact fault_matrix::fault_matrix
