# Sourced by the bench scripts: the Breakwater config they measure, one
# Stripe source on the default segment log and a SQLite sink.
#
#   write_breakwater_config FILE INGRESS_PORT ADMIN_LISTEN WORK_DIR
write_breakwater_config() {
  cat >"$1" <<TOML
[ingress]
listen = "127.0.0.1:$2"
[admin]
listen = "$3"
[queue]
path = "$4/queue"
[sink]
url = "sqlite://$4/sink.db"
[[source]]
name = "stripe"
scheme = "stripe"
secrets = ["whsec_bench_secret_0123456789abcdef"]
event_id = "json:/id"
entity_key = "json:/data/object/id"
TOML
}
