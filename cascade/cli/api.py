"""`cascade api ...` and `cascade stage ...`: the control plane from the command line.

`cascade api serve` hands over to the service (`python -m services.api.main`, exec'd: `cascade/`
never imports `services/`); the other commands are REST calls through `cascade.cli.api_client`.
The API's URL and token come from --api / --token or CASCADE_API_URL / CASCADE_API_TOKEN.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any


def _client(args: argparse.Namespace):  # -> ApiClient
    from cascade.cli.api_client import ApiClient

    return ApiClient(args.api, args.token)


def _call(fn: Any, *fargs: Any) -> tuple[int, Any]:
    from cascade.cli.api_client import ApiError

    try:
        return 0, fn(*fargs)
    except ApiError as err:
        print(f"error: {err}", file=sys.stderr)
        return (1 if err.status in (0, 409, 404) else 2), None


def _stage_line(st: dict[str, Any]) -> str:
    want = f" (requested: {st['desired_state']})" if st.get("desired_state") else ""
    steps = f"{st['steps_done']}/{st['max_steps']}" if st.get("max_steps") else str(st["steps_done"])
    where = f"{st['index']}  {st['name']:<16} {st['domain']:<6}"
    return f"  stage {st['id']:>4}  {where} {st['state']:<9} {steps}{want}"


def cmd_api_serve(args: argparse.Namespace) -> int:
    argv = [sys.executable, "-m", "services.api.main", *args.serve_args]
    os.execv(sys.executable, argv)
    return 0  # not reached


def cmd_api_create(args: argparse.Namespace) -> int:
    from cascade.config import ConfigError, load_cascade_config

    try:  # the same check the server makes, before sending anything
        cfg = load_cascade_config(args.config)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    import yaml

    # sent with its paths as the file means them (relative ones taken from the file's directory,
    # `load_cascade_config`), not as the server would read them from its own base directory
    text = yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
    code, out = _call(_client(args).create_cascade_yaml, text)
    if out is not None:
        print(f"created cascade {out['id']} ({out['name']})")
        for st in out["stages"]:
            print(_stage_line(st))
    return code


def cmd_api_list(args: argparse.Namespace) -> int:
    code, out = _call(_client(args).get, "/api/cascades")
    for c in out or []:
        active = f"  active: {c['active_stage']}" if c["active_stage"] else ""
        print(f"{c['id']:>5}  {c['name']:<24} {c['status']:<10} {c['stages']} stages{active}")
    return code


def cmd_api_show(args: argparse.Namespace) -> int:
    code, out = _call(_client(args).get, f"/api/cascades/{args.cascade_id}")
    if out is not None:
        if args.json:
            print(json.dumps(out, indent=1))
            return code
        print(f"cascade {out['id']} {out['name']}: {out['status']}")
        for st in out["stages"]:
            print(_stage_line(st))
        for run in out["runs"]:
            what = f"{run['kind']} seed {run['seed']} distill={run['distill']}"
            who = ""
            if run.get("holder"):
                who = f", run by {run['holder']}"
            elif run["status"] == "stalled" and run.get("heartbeat_at"):
                who = f", no runner since its last heartbeat at {run['heartbeat_at']}"
            print(f"  run {run['id']}: {what} {run['status']}{who}")
    return code


def cmd_api_abort(args: argparse.Namespace) -> int:
    code, out = _call(_client(args).post, f"/api/cascades/{args.cascade_id}/abort")
    if out is not None:
        what = "aborted" if out["changed"] else "already aborted"
        print(f"cascade {out['cascade']['id']} {what}")
    return code


def cmd_api_delete(args: argparse.Namespace) -> int:
    code, out = _call(_client(args).delete, f"/api/cascades/{args.cascade_id}")
    if out is not None:
        order = ("stages", "runs", "steps", "evals", "checkpoints", "events", "leases")
        deleted = out["deleted"]
        rows = ", ".join(f"{deleted[t]} {t}" for t in order if deleted.get(t))
        print(f"cascade {out['cascade_id']} deleted ({rows or 'nothing under it'})")
    return code


def cmd_stage(args: argparse.Namespace) -> int:
    by_name = args.cascade is not None or args.stage is not None
    if by_name == (args.stage_id is not None) or (by_name and None in (args.cascade, args.stage)):
        print(
            f"error: name the stage by its id (cascade stage {args.stage_command} ID) or by its cascade and "
            f"name or index (cascade stage {args.stage_command} --cascade N --stage NAME)",
            file=sys.stderr,
        )
        return 2
    client = _client(args)
    if by_name:
        code, out = _call(client.stage_command_in, args.cascade, args.stage, args.stage_command)
    else:
        code, out = _call(client.stage_command, args.stage_id, args.stage_command)
    if out is not None:
        note = "" if out["changed"] else " (no change: already in effect)"
        print(_stage_line(out["stage"]).strip() + note)
    return code


def _client_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--api", help="control plane URL (env CASCADE_API_URL; default http://127.0.0.1:8000)")
    p.add_argument("--token", help="bearer token (env CASCADE_API_TOKEN; prefer the env var)")


def add_parsers(sub: Any) -> None:
    """Register `api` and `stage` on the `cascade` command's subparsers."""
    p = sub.add_parser("api", help="the control plane: serve it, create and inspect cascades")
    asub = p.add_subparsers(dest="api_command", required=True)
    a = asub.add_parser(
        "serve",
        help="run the control plane (arguments go to `python -m services.api.main`; try `serve --help`)",
        add_help=False,
        prefix_chars="+",  # every `-`/`--` argument belongs to the service, `--help` included
    )
    a.add_argument("serve_args", nargs="*")
    a.set_defaults(func=cmd_api_serve)
    a = asub.add_parser("create", help="create a cascade from a YAML config")
    a.add_argument("config")
    _client_flags(a)
    a.set_defaults(func=cmd_api_create)
    a = asub.add_parser("list", help="list cascades, newest first")
    _client_flags(a)
    a.set_defaults(func=cmd_api_list)
    a = asub.add_parser("show", help="a cascade's stages and runs")
    a.add_argument("cascade_id", type=int)
    a.add_argument("--json", action="store_true", help="the API's JSON as is")
    _client_flags(a)
    a.set_defaults(func=cmd_api_show)
    a = asub.add_parser("abort", help="abort a cascade (a running stage stops at its next step)")
    a.add_argument("cascade_id", type=int)
    _client_flags(a)
    a.set_defaults(func=cmd_api_abort)
    a = asub.add_parser(
        "delete",
        help="delete a completed, failed or aborted cascade with its runs, metrics and events "
        "(refused while it runs; checkpoint files stay on disk)",
    )
    a.add_argument("cascade_id", type=int)
    _client_flags(a)
    a.set_defaults(func=cmd_api_delete)

    p = sub.add_parser("stage", help="start, pause, resume or advance a stage through the control plane")
    ssub = p.add_subparsers(dest="stage_command", required=True)
    helps = {
        "start": "start a pending stage (the cascade's first unfinished one)",
        "pause": "pause at the next step boundary, after a checkpoint",
        "resume": "resume a paused stage from its checkpoint",
        "advance": "end a running stage at its next step boundary",
    }
    for name, text in helps.items():
        s = ssub.add_parser(name, help=text)
        s.add_argument("stage_id", type=int, nargs="?", help="the stage's id (`cascade api show CASCADE_ID`)")
        s.add_argument("--cascade", type=int, help="with --stage: the cascade's id")
        s.add_argument("--stage", help="with --cascade: the stage's name or 0-based index in the cascade")
        _client_flags(s)
        s.set_defaults(func=cmd_stage)
