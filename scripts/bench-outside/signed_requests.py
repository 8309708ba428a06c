#!/usr/bin/env python3
"""Writes N unique Stripe-signed webhooks as raw HTTP/1.1 requests, for wrk.

Usage: signed_requests.py OUT_PREFIX N THREADS [BODY_BYTES] [HOST]

Writes OUT_PREFIX.0 .. OUT_PREFIX.{THREADS-1}, request i going to file
i % THREADS, so each wrk thread reads its own file. Each record is an
8-digit decimal length, then that many bytes of request. Bodies are
Stripe-style events of BODY_BYTES (1024) with a unique `id`, signed now
with `bench ingress`'s secret (Stripe's tolerance is 300 s: send them
within five minutes).
"""
import hashlib
import hmac
import sys
import time

SECRET = b"whsec_bench_secret_0123456789abcdef"


def body(event_id: str, object_id: str, size: int) -> bytes:
    head = (
        '{"id":"%s","object":"event","type":"payment_intent.succeeded",'
        '"api_version":"2024-06-20","data":{"object":{"id":"%s",'
        '"object":"payment_intent","amount":2000,"currency":"usd",'
        '"status":"succeeded","description":"' % (event_id, object_id)
    ).encode()
    tail = b'"}}}'
    pad = max(0, size - len(head) - len(tail))
    return head + b"x" * pad + tail


def main() -> None:
    prefix, n, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    size = int(sys.argv[4]) if len(sys.argv) > 4 else 1024
    host = sys.argv[5] if len(sys.argv) > 5 else "127.0.0.1"
    run = "%x" % time.time_ns()
    now = str(int(time.time())).encode()
    outs = [open("%s.%d" % (prefix, t), "wb") for t in range(threads)]
    for i in range(n):
        b = body("evt_%s_%d" % (run, i), "pi_%d" % (i % 1000), size)
        sig = hmac.new(SECRET, now + b"." + b, hashlib.sha256).hexdigest()
        req = (
            b"POST /webhooks/stripe HTTP/1.1\r\nHost: " + host.encode() +
            b"\r\nContent-Type: application/json\r\nStripe-Signature: t=" + now +
            b",v1=" + sig.encode() + b"\r\nContent-Length: " +
            str(len(b)).encode() + b"\r\n\r\n" + b
        )
        out = outs[i % threads]
        out.write(b"%08d" % len(req))
        out.write(req)
    for out in outs:
        out.close()


if __name__ == "__main__":
    main()
