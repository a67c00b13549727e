"""What a config asks of the model directory it names, checked from its files alone (no weights,
no tokenizer loaded): `cascade validate`, and `cascade run` / `cascade up` before they load a
model or start a process, through `preflight_problems`.

- the token budgets fit the model's context: each stage's completion budgets
  (`grpo.budget.max_new_tokens`, `grow_to`, `eval.max_new_tokens`) plus the longest prompt
  (`domains.N.max_prompt_tokens`, else `DEFAULT_PROMPT_TOKENS`) within `max_position_embeddings`
  of the model's `config.json`;
- a chat template exists: the config's (`chat.template_path` / `chat.template`, which must parse
  as Jinja) or the tokenizer's (`chat_template` in `tokenizer_config.json`, or
  `chat_template.jinja` / `chat_template.json` beside it): every prompt is rendered through one;
- and what `check_paths` checks (files that must exist, an `output_dir` the runner can create
  and write in).

Each problem is one `field: problem` line naming the config field to change.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cascade.config.cascade import CascadeConfig
from cascade.config.paths import check_paths, unwritable_dir

DEFAULT_PROMPT_TOKENS = 32
"""The prompt length assumed for a domain without `max_prompt_tokens` (chat markers and a short
question; `cascade.runner.step_memory` assumes the same)."""

TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
"""Where a tokenizer directory may keep its chat template besides `tokenizer_config.json`."""


def model_context(model_dir: Path) -> int | None:
    """`max_position_embeddings` from the model's `config.json` (a multimodal config's
    `text_config`); None when it says none (or there is no config to read)."""
    try:
        data = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    text = data.get("text_config")
    value = (text if isinstance(text, dict) else data).get("max_position_embeddings")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def prompt_tokens(cfg: CascadeConfig, domain: str | None = None) -> tuple[int, str]:
    """The prompt length a check takes (one domain's, or the longest of all) and where it comes
    from: a `domains.N.max_prompt_tokens` field, or the assumed default."""
    best = (0, "")
    for i, d in enumerate(cfg.domains):
        if domain is not None and d.name != domain:
            continue
        value = d.max_prompt_tokens
        found = (
            (value, f"domains.{i}.max_prompt_tokens") if value is not None else (DEFAULT_PROMPT_TOKENS, "")
        )
        best = max(best, found, key=lambda x: x[0])
    return best


def context_problems(cfg: CascadeConfig) -> list[str]:
    """One line per stage budget that, with the longest prompt, is over the model's context.
    Every domain is evaluated at every stage's eval, and distillation replays earlier domains'
    prompts: the longest prompt of all domains counts for each budget."""
    context = model_context(cfg.model.path)
    if context is None:
        return []
    prompt, source = prompt_tokens(cfg)
    where = f"{cfg.model.path / 'config.json'} max_position_embeddings"
    prompt_from = (
        f"the prompt from {source}" if source else "a prompt assumed: set domains.N.max_prompt_tokens"
    )
    problems = []
    for i, stage in enumerate(cfg.stages):
        budget = stage.grpo.budget
        fields = [(f"stages.{i}.grpo.budget.max_new_tokens", budget.max_new_tokens)]
        fields += [(f"stages.{i}.grpo.budget.grow_to.{j}", v) for j, v in enumerate(budget.grow_to)]
        if stage.eval.max_new_tokens is not None:
            fields.append((f"stages.{i}.eval.max_new_tokens", stage.eval.max_new_tokens))
        grpo = [f for f in fields if ".grpo." in f[0]]
        for group in (grpo, [f for f in fields if ".eval." in f[0]]):
            over = next(((f, v) for f, v in group if v + prompt > context), None)
            if over is not None:  # the first budget over it (grow_to only grows): the one to change
                field, value = over
                problems.append(
                    f"{field}: {value} + prompt {prompt} exceeds the model's context {context} "
                    f"({where}; {prompt_from}): lower it, or use a model with a longer context"
                )
    return problems


def _has_template(value: Any) -> bool:
    if isinstance(value, str):
        return bool(value.strip())
    if isinstance(value, list):  # named templates: [{"name": ..., "template": ...}]
        return any(isinstance(t, dict) and _has_template(t.get("template")) for t in value)
    if isinstance(value, dict):
        return _has_template(value.get("chat_template"))
    return False


def tokenizer_has_chat_template(model_dir: Path) -> bool | None:
    """Whether the tokenizer in `model_dir` carries a chat template; None when the directory
    holds no tokenizer to ask (the model loader says so)."""
    config = model_dir / "tokenizer_config.json"
    if not config.is_file() and not (model_dir / "tokenizer.json").is_file():
        return None
    for name in TEMPLATE_FILES:
        path = model_dir / name
        if path.is_file():
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            if name.endswith(".jinja") and text.strip():
                return True
            try:
                if _has_template(json.loads(text)):
                    return True
            except ValueError:
                continue
    try:
        data = json.loads(config.read_text(encoding="utf-8")) if config.is_file() else {}
    except (OSError, UnicodeDecodeError, ValueError):
        return None  # an unreadable tokenizer config: the loader's error is the clearer one
    return isinstance(data, dict) and _has_template(data.get("chat_template"))


def chat_template_problems(cfg: CascadeConfig) -> list[str]:
    """The config's template must parse as Jinja; without one, the model's tokenizer must have one."""
    chat = cfg.chat
    if chat.template is not None or chat.template_path is not None:
        field = "chat.template" if chat.template is not None else "chat.template_path"
        try:
            text = chat.template_text()
        except (OSError, UnicodeDecodeError) as err:
            return [f"{field}: cannot read {chat.template_path}: {getattr(err, 'strerror', None) or err}"]
        assert text is not None
        import jinja2

        try:
            _jinja_environment().parse(text)
        except jinja2.TemplateSyntaxError as err:
            return [f"{field}: not a Jinja template: line {err.lineno}: {err.message}"]
        return []
    if tokenizer_has_chat_template(cfg.model.path) is False:
        return [
            f"model.path: {cfg.model.path}'s tokenizer has no chat template (no chat_template in "
            "tokenizer_config.json, no chat_template.jinja) and every prompt is rendered through one: "
            "give one with chat.template_path (a Jinja file) or chat.template (inline)"
        ]
    return []


def _jinja_environment() -> Any:
    """What `apply_chat_template` parses with, for syntax: loop controls and the
    `{% generation %}` block transformers adds (its sandbox changes nothing to parsing)."""
    import jinja2
    import jinja2.ext
    import jinja2.nodes

    class Generation(jinja2.ext.Extension):
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body, lineno=lineno)

    return jinja2.Environment(extensions=["jinja2.ext.loopcontrols", Generation])


def preflight_problems(cfg: CascadeConfig, *, run_dir: Path | None = None) -> list[str]:
    """Every problem a run would meet before its first step that the files can tell: the paths
    (`check_paths`), the context and the chat template. `run_dir`: the run directory a
    `--run-dir` gave (checked for writing in place of `output_dir`)."""
    problems = check_paths(cfg)
    if run_dir is not None:
        problems = [p for p in problems if not p.startswith("output_dir: ")]
        why = unwritable_dir(run_dir)
        if why is not None:
            problems.append(f"--run-dir: {run_dir} {why}")
    if any(p.startswith("model.path: ") for p in problems):
        return problems  # no model directory to read
    problems += context_problems(cfg)
    if not any(p.startswith("chat.template_path: ") for p in problems):
        problems += chat_template_problems(cfg)
    return problems
