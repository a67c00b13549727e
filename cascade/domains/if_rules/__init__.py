"""Instruction checkers in the IFEval style: each a small registered rule with params.

A rule is stored in a problem's meta as `{"name": ..., "params": {...}}`; `rule_from_json`
rebuilds it, `describe()` gives the sentence the prompt states, `check(response)` the verdict.
Every rule class also states what it checks (`description`) and the params it takes
(`arguments`: name -> type); params are checked against `arguments` on construction (a missing,
unknown or mistyped param raises ValueError). New rules register with `@register`;
`registry_spec()` lists them all.

Every check is download-free and linear in the response's length (no backtracking regex; a
long hostile completion scores in milliseconds): words are Unicode `\\w` runs joined by inner
apostrophes (see `words`), sentences are split as Punkt splits them by a token scan (see
`sentences`), paragraphs by `***` divider lines (see `paragraphs`). `response_language` alone
uses a model, langdetect's bundled profiles (see `language`).

A blank response follows no rule (as in IFEval's strict and loose checks).

`check_rules(rules, response, mode)` checks a response in IFEval's two modes: `strict` checks
the response as given; `loose` also accepts a rule if it holds on any non-empty variant of the
response with the first line, the last line or both removed, each with and without markdown
asterisks (`*`) stripped (8 variants in all, as in IFEval's loose accuracy). The instruct
domain's own scoring is unchanged (strict).
"""

from cascade.domains.if_rules import extended  # noqa: F401  (importing it registers the IFEval-style rules)
from cascade.domains.if_rules.basic import (
    AllLowercase,
    AllUppercase,
    BulletCount,
    EndWith,
    ExcludeWord,
    IncludeWord,
    JsonKeys,
    NoCommas,
    StartWith,
    TopicWords,
    WordCount,
)
from cascade.domains.if_rules.core import (
    REGISTRY,
    CheckMode,
    Rule,
    check_rules,
    loose_variants,
    register,
    registry_spec,
    rule_from_json,
    words,
)
from cascade.domains.if_rules.text import (
    RELATIONS,
    Relation,
    blank_line_paragraphs,
    compare,
    paragraphs,
    sentences,
)

__all__ = [
    "REGISTRY",
    "RELATIONS",
    "AllLowercase",
    "AllUppercase",
    "BulletCount",
    "CheckMode",
    "EndWith",
    "ExcludeWord",
    "IncludeWord",
    "JsonKeys",
    "NoCommas",
    "Relation",
    "Rule",
    "StartWith",
    "TopicWords",
    "WordCount",
    "check_rules",
    "compare",
    "loose_variants",
    "blank_line_paragraphs",
    "paragraphs",
    "register",
    "registry_spec",
    "rule_from_json",
    "sentences",
    "words",
]
