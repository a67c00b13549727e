"""Container health checks that need nothing beyond the image's Python: gRPC, HTTP or a file.

Docker's HEALTHCHECK runs it inside the container (Kubernetes uses its native `grpc` and
`httpGet` probes instead):

    python /opt/cascade/healthcheck.py grpc 127.0.0.1:50052 cascade.v1.RolloutService
    python /opt/cascade/healthcheck.py http http://127.0.0.1:8000/health
    python /opt/cascade/healthcheck.py file /tmp/rollout-worker.alive --max-age-s 120

Exit status 0 when the service answers SERVING (gRPC health checking, `grpc.health.v1`),
HTTP 2xx, or (a process with no port, the rollout worker) touched the file within the last
`--max-age-s` seconds; 1 otherwise, with one line on stderr saying why.
"""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.request


def check_grpc(target: str, service: str = "", timeout_s: float = 3.0) -> str | None:
    """None when `service` on `target` (host:port) is SERVING, else what went wrong."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError as err:
            return f"{target} {service or '(server)'}: {err.code().name}: {err.details()}"
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        return f"{target} {service or '(server)'}: {status}"
    return None


def check_http(url: str, timeout_s: float = 3.0) -> str | None:
    """None when GET `url` answers 2xx, else what went wrong."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as reply:
            status = int(reply.status)
    except urllib.error.HTTPError as err:
        return f"{url}: HTTP {err.code}"
    except (urllib.error.URLError, OSError) as err:
        return f"{url}: {err}"
    return None if 200 <= status < 300 else f"{url}: HTTP {status}"


def check_file(path: str, max_age_s: float) -> str | None:
    """None when `path` was modified within the last `max_age_s` seconds, else what is wrong."""
    import os
    import time

    try:
        age = time.time() - os.stat(path).st_mtime
    except OSError as err:
        return f"{path}: {err.strerror}"
    return None if age <= max_age_s else f"{path}: last touched {age:.0f}s ago (max {max_age_s:g}s)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="healthcheck", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="kind", required=True)
    g = sub.add_parser("grpc", help="gRPC health checking")
    g.add_argument("target", help="host:port")
    g.add_argument("service", nargs="?", default="", help="service name (default: the whole server)")
    h = sub.add_parser("http", help="HTTP GET, 2xx is healthy")
    h.add_argument("url")
    f = sub.add_parser("file", help="a file touched recently is healthy")
    f.add_argument("path")
    f.add_argument("--max-age-s", type=float, default=120.0)
    p.add_argument("--timeout-s", type=float, default=3.0)
    args = p.parse_args(argv)
    if args.kind == "grpc":
        problem = check_grpc(args.target, args.service, args.timeout_s)
    elif args.kind == "file":
        problem = check_file(args.path, args.max_age_s)
    else:
        problem = check_http(args.url, args.timeout_s)
    if problem:
        print(f"unhealthy: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
