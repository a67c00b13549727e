"""`cascade data inspect CONFIG`: what a config's prompt sources yield, before any training.

Per domain: problems per split and (for `kind: hf`) what each step kept (rows read, filtered
out, unconvertible with the first reasons, duplicates, prompts held out or dropped for
overlapping the eval, capped); then the first `--n` training problems as the model will see
them (through the model's chat template when its tokenizer is on disk), each with its gold,
its tests or rules, and the domain verifier's verdict on that gold: a gold its own verifier
rejects is a data bug.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("data", help="inspect prompt sources")
    dsub = p.add_subparsers(dest="data_command", required=True)
    i = dsub.add_parser("inspect", help="show what a config's prompt sources yield")
    i.add_argument("config")
    i.add_argument("--domain", help="only this domain (default: every domain of the config)")
    i.add_argument("--n", type=int, default=3, help="problems shown per domain (default 3)")
    i.add_argument("--split", choices=("train", "eval"), default="train", help="split shown")
    i.add_argument("--no-verify", action="store_true", help="skip scoring the golds")
    i.set_defaults(func=cmd_data_inspect)


def cmd_data_inspect(args: argparse.Namespace) -> int:
    from cascade.config import ConfigError, load_cascade_config

    try:
        cfg = load_cascade_config(args.config)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    domains = [d for d in cfg.domains if args.domain in (None, d.name)]
    if not domains:
        print(
            f"error: --domain {args.domain!r}: not in the config ({[d.name for d in cfg.domains]})",
            file=sys.stderr,
        )
        return 2
    render = _renderer(cfg)
    status = 0
    for domain in domains:
        try:
            _inspect_domain(cfg, domain, args, render)
        except ValueError as err:
            print(f"error: {args.config}: {err}", file=sys.stderr)
            status = 2
    return status


def _renderer(cfg: Any) -> Any:
    """prompt, thinking -> the text the model sees: the chat template when the model's tokenizer
    loads, else the user message as is (saying so once)."""
    try:
        from cascade.model.chat import render_prompt
        from cascade.model.loading import load_tokenizer

        tokenizer = load_tokenizer(cfg.model.path)
    except Exception as err:  # noqa: BLE001 (any failure: show the raw message instead)
        print(f"(no chat template: {str(err).splitlines()[0][:160]}; showing user messages)\n")
        return lambda prompt, thinking: prompt
    return lambda prompt, thinking: render_prompt(tokenizer, cfg.chat, prompt, thinking)


def _inspect_domain(cfg: Any, domain: Any, args: argparse.Namespace, render: Any) -> None:
    from cascade.config.hf import HfPrompts
    from cascade.domains import load_problems

    source = domain.prompts
    label = f"{source.kind}" + (f", adapter {source.adapter}" if isinstance(source, HfPrompts) else "")
    print(f"== domain {domain.name} (prompts: {label})")
    if isinstance(source, HfPrompts):
        from cascade.domains.hf_source import load_hf

        loaded = load_hf(source, domain.name)
        splits = {"train": loaded.train, "eval": loaded.eval}
        print(
            f"{'split':6} {'from':22} {'rows':>6} {'filtered':>8} {'unconv':>6} {'dups':>5} "
            f"{'overlap':>7} {'held':>5} {'capped':>6} {'kept':>6}"
        )
        for name, r in loaded.reports.items():
            print(
                f"{name:6} {r.source_split[:22]:22} {r.rows:>6} {r.filtered_out:>8} {r.unconvertible:>6} "
                f"{r.duplicates:>5} {r.overlap:>7} {r.held_out:>5} {r.capped:>6} {r.kept:>6}"
            )
            for reason in r.reasons:
                print(f"  unconvertible ({name}): {reason}")
    else:
        splits = {"train": load_problems(domain, "train"), "eval": load_problems(domain, "eval")}
        print(f"problems: train {len(splits['train'])}, eval {len(splits['eval'])}")
    shown = splits[args.split][: max(0, args.n)]
    verdicts = (
        _gold_verdicts(domain, shown) if not args.no_verify else ["not checked (--no-verify)"] * len(shown)
    )
    thinking = any(s.grpo.thinking for s in cfg.stages if domain.name in s.mix)
    for problem, verdict in zip(shown, verdicts, strict=True):
        print(f"\n-- {problem.id} ({args.split})")
        print(render(problem.prompt, thinking).rstrip())
        print(f"gold: {_clip(problem.answer) or '(none)'}")
        for key in ("tests", "entry_point", "rules", "level", "type"):
            if key in problem.meta:
                print(f"{key}: {_clip(json.dumps(problem.meta[key]))}")
        print(f"verdict on gold: {verdict}")
    print()


def _gold_verdicts(domain_config: Any, problems: list[Any]) -> list[str]:
    """The domain verifier's verdict on each problem's own gold answer."""
    if not problems:
        return []
    from cascade.domains import make_domain

    with_gold = [p for p in problems if p.answer]
    domain = None
    try:
        domain = make_domain(domain_config)
        verdicts = iter(domain.score_batch(with_gold, [p.answer for p in with_gold]))
    except Exception as err:  # noqa: BLE001 (e.g. no sandbox on this host: say so, keep inspecting)
        first = str(err).splitlines()[0][:160] if str(err) else ""
        return [f"not checked: {type(err).__name__}: {first}"] * len(problems)
    finally:
        close = getattr(domain, "close", None)
        if callable(close):
            close()
    out = []
    for problem in problems:
        if not problem.answer:
            out.append("no reference answer in this data set")
            continue
        v = next(verdicts)
        flag = "" if v.reward >= 1.0 else "  <- the gold fails its own verifier (data bug?)"
        out.append(f"{v.reward:g} {v.reason}{': ' + v.detail if v.detail else ''}{flag}")
    return out


def _clip(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
