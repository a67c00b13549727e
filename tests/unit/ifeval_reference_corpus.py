"""A probing corpus derived from IFEval's reference checkers themselves (lm-eval's
`lm_eval.tasks.ifeval`), for the differential test `test_if_vs_ifeval_reference.py`.

`ifeval_probes.py` was written from our rules; this corpus is written from the reference's own
definitions, so that it probes where the *reference* draws its lines:

- every instruction id of the reference's registry (`instructions_registry.INSTRUCTION_DICT`);
- kwargs drawn by the reference's own `build_description()` under a seeded `random` (the global
  state is saved and restored), plus the reference's own argument edges (its `_NUM_*` / `_MAX_*`
  limits, 1, and both relations of `_COMPARISON_RELATION`);
- responses built from what each `check_following` reads: the `\\w+` tokens of `count_words`,
  Punkt sentence ends, the `\\s?\\*\\*\\*\\s?` paragraph splitter, `\\n\\n` paragraphs and their
  first token, the `^\\s*\\*[^\\*]` / `^\\s*-` bullet patterns, `\\[.*?\\]` placeholders,
  `<<[^\\n]+>>` titles, `\\*[^\\n\\*]*\\*` highlights, the `\\s?{spliter}\\s?\\d+\\s?` section
  splitter, the `p\\.\\s?s\\.` / `p\\.\\s?p\\.\\s?s` postscript patterns, `nltk.word_tokenize`
  capitals, `langdetect`, `str.isupper` / `islower`, ... Each count is placed at, just inside
  and just outside the boundary the reference compares with (n-1, n, n+1);
- degenerate variants: empty, blank and invisible replies, full-width and ideographic commas,
  contractions, plural and substring keywords, curly quotes, `P.P.S.`, inline and empty
  postscripts, empty placeholders, markup in titles, mid-line sections, letterless text for the
  language rules, `+` and mixed bullets, CRLF line ends, non-Latin text; and every id-specific
  response again with a preamble line, a closing line and CRLF line ends (the loose mode's edges).

Each probe carries a `tag` naming the class of response it is (the differential test groups
known disagreements by it). Deterministic: the same probes in the same order every run.
`reference_probes()` imports the reference; call it only once nltk's punkt_tab data is on the
path (the test's `reference` fixture puts it there).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple


class RefProbe(NamedTuple):
    instruction: str
    kwargs: dict[str, Any]
    response: str
    tag: str

    @property
    def key(self) -> str:
        return f"{self.instruction} [{self.tag}] {self.kwargs} {self.response!r}"


SEED = 20240611
DRAWS = 4
"""kwargs drawn from each id's `build_description()` (besides the fixed edge kwargs)."""

PREAMBLE = "Sure, here is my answer:\n"
CLOSING = "\nLet me know if you need anything else."

DEGENERATE: list[tuple[str, str]] = [
    ("empty", ""),
    ("blank", " "),
    ("blank", "\n\t \n"),
    ("invisible", "\u200b"),
    ("invisible", "\ufeff\u200d"),
    ("letterless", "..."),
    ("letterless", "12345 67890"),
    ("letterless", "!!! ??? ***"),
    ("letterless", "\U0001f600\U0001f600\U0001f600"),
    ("fullwidth_comma", "我喜欢猫，它们很可爱。"),
    ("ideographic_comma", "猫はマットの上に座って、窓から鳥を見ています。"),
    ("non_latin", "Привет, мир. Как дела?"),
    ("non_latin", "مرحبا، كيف حالك؟"),
    ("non_latin", "Η θάλασσα είναι βαθιά και κρύα."),
    ("non_latin", "समुद्र बहुत गहरा और ठंडा है।"),
    ("fullwidth", "Ｆｕｌｌ－ｗｉｄｔｈ　ｔｅｘｔ．"),
    ("crlf", "First line.\r\nSecond line.\r\n"),
    ("curly_quotes", "\u201cHello there.\u201d"),
    ("contraction", "I don't know, it isn't here."),
]

LANGUAGE_SAMPLES: list[tuple[str, str]] = [
    ("en", "The weather is lovely today and we are going for a long walk in the park."),
    ("de", "Das Wetter ist heute schön und wir machen einen langen Spaziergang im Park."),
    ("fr", "Il fait beau aujourd'hui et nous allons faire une longue promenade dans le parc."),
    ("es", "Hoy hace buen tiempo y vamos a dar un largo paseo por el parque."),
    ("it", "Oggi il tempo è bello e andiamo a fare una lunga passeggiata nel parco."),
    ("pt", "O tempo está ótimo hoje e vamos fazer um longo passeio no parque."),
    ("ru", "Сегодня прекрасная погода, и мы идём на долгую прогулку в парк."),
    ("uk", "Сьогодні чудова погода, і ми йдемо на довгу прогулянку в парк."),
    ("ja", "今日は天気が良いので、公園を長く散歩します。"),
    ("ko", "오늘은 날씨가 좋아서 공원에서 오래 산책을 할 거예요."),
    ("ar", "الطقس جميل اليوم وسنذهب في نزهة طويلة في الحديقة."),
    ("hi", "आज मौसम बहुत अच्छा है और हम पार्क में लंबी सैर करने जा रहे हैं।"),
    ("fi", "Tänään on kaunis sää ja lähdemme pitkälle kävelylle puistoon."),
    ("pl", "Dzisiaj jest piękna pogoda i idziemy na długi spacer do parku."),
    ("vi", "Hôm nay thời tiết đẹp và chúng tôi sẽ đi dạo lâu trong công viên."),
    ("sw", "Leo hali ya hewa ni nzuri na tunaenda kutembea kwa muda mrefu katika bustani."),
    ("letterless", "12345 67890"),
    ("letterless", "!!! ... ???"),
    ("letterless", "\U0001f600 \U0001f389"),
    ("mixed", "Das Wetter ist schön. The weather is lovely today and we are going for a long walk."),
    ("upper_en", "THE WEATHER IS LOVELY TODAY AND WE ARE GOING FOR A LONG WALK IN THE PARK."),
]


@contextmanager
def _seeded(seed: int) -> Iterator[None]:
    state = random.getstate()
    random.seed(seed)
    try:
        yield
    finally:
        random.setstate(state)


class _Gen:
    """Response material from the reference's own word list, with a seeded generator."""

    def __init__(self, word_list: list[str], seed: int) -> None:
        self.rng = random.Random(seed)
        self.word_list = word_list

    def words(self, n: int, avoid: str = "") -> list[str]:
        pool = [w for w in self.word_list if not (avoid and avoid.lower() in w)] if avoid else self.word_list
        return [self.rng.choice(pool) for _ in range(n)]

    def sentence(self, n: int = 6, end: str = ".", avoid: str = "") -> str:
        return " ".join(self.words(n, avoid)).capitalize() + end

    def text(self, sentences: int = 2, avoid: str = "") -> str:
        return " ".join(self.sentence(self.rng.randint(4, 9), avoid=avoid) for _ in range(sentences))


Builder = Callable[[dict[str, Any], _Gen], list[tuple[str, str]]]


def _around(n: int) -> list[int]:
    return sorted({max(0, n - 1), n, n + 1})


# --------------------------------------------------------------------------- per-id builders


def _no_comma(kw: dict[str, Any], g: _Gen) -> list[tuple[str, str]]:
    t = g.text(2)
    return [
        ("plain", t),
        ("comma", t.replace(" ", ", ", 1)),
        ("comma_number", f"It costs 1,000 dollars. {t}"),
        ("comma_end", t + ","),
        ("fullwidth_comma", t.replace(" ", "\uff0c", 1)),
        ("ideographic_comma", "我喜欢猫\u3001狗和鸟"),
        ("small_comma", t.replace(" ", "\ufe50", 1)),
        ("arabic_comma", "مرحبا\u060c كيف حالك"),
        ("comma_first_line", "Sure, here it is:\n" + t),
        ("comma_last_line", t + "\nThanks, bye"),
        ("comma_code", f"`f(a,b)` {t}"),
    ]


def _number_words(kw: dict[str, Any], g: _Gen) -> list[tuple[str, str]]:
    n = int(kw["num_words"])
    out: list[tuple[str, str]] = []
    for k in _around(n):
        ws = g.words(k)
        out.append(("words", " ".join(ws)))
        if k >= 2:
            out.append(("contraction", " ".join(["don't"] + ws[2:])))
            out.append(("contraction_curly", " ".join(["don\u2019t"] + ws[2:])))
            out.append(("hyphenated", " ".join(["well-known"] + ws[2:])))
            out.append(("number_decimal", " ".join(["3.14"] + ws[2:])))
            out.append(("underscore", " ".join(["snake_case"] + ws[1:])))
            out.append(("bullets", "\n".join(f"* {w}" for w in ws)))
            out.append(("punctuated", ", ".join(ws) + "."))
        out.append(("crlf", "\r\n".join(ws)))
        out.append(("non_latin", " ".join(["猫"] * k)))
        out.append(("accented", " ".join(["café"] * k)))
        out.append(("combining", " ".join(["cafe\u0301"] * k)))
    return out


def _number_sentences(kw: dict[str, Any], g: _Gen) -> list[tuple[str, str]]:
    n = int(kw["num_sentences"])
    out: list[tuple[str, str]] = []
    styles: dict[str, Callable[[int], str]] = {
        "plain": lambda k: " ".join(g.sentence() for _ in range(k)),
        "mixed_ends": lambda k: " ".join(g.sentence(end="!?."[i % 3]) for i in range(k)),
        "newlines": lambda k: "\n".join(g.sentence() for _ in range(k)),
        "unpunctuated_lines": lambda k: "\n".join(g.sentence(end="") for _ in range(k)),
        "abbreviations": lambda k: " ".join(f"Dr. Smith saw {g.words(1)[0]} e.g. here." for _ in range(k)),
        "decimals": lambda k: " ".join(f"It is 3.14 {g.words(1)[0]}." for _ in range(k)),
        "quoted": lambda k: " ".join(f'He said "{g.words(1)[0]}."' for _ in range(k)),
        "curly_quotes": lambda k: " ".join(f"He said \u201c{g.words(1)[0]}.\u201d" for _ in range(k)),
        "ellipsis": lambda k: " ".join(g.sentence(end="...") for _ in range(k)),
        "numbered": lambda k: "\n".join(f"{i + 1}. {g.sentence()}" for i in range(k)),
        "initials": lambda k: " ".join(f"J. R. Smith wrote {g.words(1)[0]}." for _ in range(k)),
        "acronym": lambda k: " ".join(f"The U.S. has {g.words(1)[0]}." for _ in range(k)),
        "lowercase_starts": lambda k: " ".join(g.sentence().lower() for _ in range(k)),
        "crlf": lambda k: "\r\n".join(g.sentence() for _ in range(k)),
    }
    for k in _around(n):
        for tag, make in styles.items():
            out.append((tag, make(k)))
    return out


def _number_paragraphs(kw: dict[str, Any], g: _Gen) -> list[tuple[str, str]]:
    n = int(kw["num_paragraphs"])
    out: list[tuple[str, str]] = []
    seps = {
        "divider": "\n***\n",
        "divider_blank_lines": "\n\n***\n\n",
        "divider_inline": " *** ",
        "divider_tight": "***",
        "divider_spaced": "\n* * *\n",
        "divider_four": "\n****\n",
        "divider_six": "\n******\n",
        "blank_lines": "\n\n",
        "crlf": "\r\n***\r\n",
        "divider_trailing_spaces": "\n***   \n",
    }
    for k in _around(n):
        paras = [g.text(1) for _ in range(max(k, 1))][:k]
        for tag, sep in seps.items():
            out.append((tag, sep.join(paras)))
        if k:
            out.append(("divider_edges", "***\n" + "\n***\n".join(paras) + "\n***"))
            out.append(("bold_italic", "\n***\n".join(f"***{p}***" for p in paras)))
        if k >= 2:
            out.append(("empty_paragraph", "\n***\n".join(paras[:1] + [""] + paras[1:])))
    return out


def _nth_paragraph(kw: dict[str, Any], g: _Gen) -> list[tuple[str, str]]:
    num, nth, first = int(kw["num_paragraphs"]), int(kw["nth_paragraph"]), str(kw["first_word"])
    starts = {
        "first_word": first,
        "capitalised": first.capitalize(),
        "upper": first.upper(),
        "bold": f"**{first}**",
        "heading": f"# {first}",
        "double_quoted": f'"{first}"',
        "single_quoted": f"'{first}'",
        "curly_quoted": f"\u201c{first}\u201d",
        "comma": f"{first},",
        "possessive": f"{first}'s",
        "hyphenated": f"{first}-like",
        "prefix_only": first[:-1] if len(first) > 1 else first + "x",
        "longer_word": first + "ing",
        "other_word": "zzz",
    }
    out: list[tuple[str, str]] = []
    for count in _around(num):
        if count == 0:
            continue
        for tag, start in starts.items():
            paras = [g.text(1) for _ in range(count)]
            if nth <= count:
                paras[nth - 1] = f"{start} {paras[nth - 1]}"
            out.append((tag, "\n\n".join(paras)))
            if tag == "first_word":
                out.append(("three_newlines", "\n\n\n".join(paras)))
                out.append(("whitespace_line", "\n \n".join(paras)))
                out.append(("crlf", "\r\n\r\n".join(paras)))
                out.append(("leading_blank", "\n\n" + "\n\n".join(paras)))
                out.append(("single_newlines", "\n".join(paras)))
                out.append(("divider", "\n\n***\n\n".join(paras)))
    return out


def _existence(kw: dict[str, Any], g: _Gen) -> list[tuple[str, str]]:
    kws = [str(k) for k in kw["keywords"]]
    filler = g.text(2, avoid=kws[0][:3])
    a, b = kws[0], kws[-1]
    return [
        ("keywords", f"{filler} {a} and {b}."),
        ("one_keyword", f"{filler} {a}."),
        ("no_keyword", filler),
        ("upper", f"{filler} {a.upper()} {b.upper()}."),
        ("plural", f"{filler} {a}s {b}s."),
        ("substring", f"{filler} un{a}ly {b}ness."),
        ("possessive", f"{filler} {a}'s {b}'s."),
        ("hyphenated", f"{filler} {a}-based {b}-like."),
        ("underscore", f"{filler} {a}_{b}."),
        ("curly_possessive", f"{filler} {a}\u2019s {b}\u2019s."),
    ]


def _frequency(kw: dict[str, Any], g: _Gen) -> list[tuple[str, str]]:
    word, n = str(kw["keyword"]), int(kw["frequency"])
    out: list[tuple[str, str]] = []
    forms = {
        "keyword": word,
        "upper": word.upper(),
        "plural": word + "s",
        "substring": "un" + word + "ly",
        "possessive": word + "'s",
        "hyphenated": word + "-based",
    }
    for k in _around(n):
        for tag, form in forms.items():
            parts = [g.sentence(5, avoid=word[:3])]
            parts += [f"{form} {g.words(1, avoid=word[:3])[0]}" for _ in range(k)]
            out.append((tag, " ".join(parts)))
    return out


def _forbidden(kw: dict[str, Any], g: _Gen) -> list[tuple[str, str]]:
    ws = [str(w) for w in kw["forbidden_words"]]
    filler = g.text(2, avoid=ws[0][:3])
    w = ws[0]
    return [
        ("absent", filler),
        ("forbidden", f"{filler} {w}."),
        ("upper", f"{filler} {w.upper()}."),
        ("plural", f"{filler} {w}s."),
        ("substring", f"{filler} un{w}ly."),
        ("possessive", f"{filler} {w}'s."),
        ("contraction", f"{filler} {w}'ll."),
        ("hyphenated", f"{filler} {w}-based."),
        ("underscore", f"{filler} {w}_x."),
        ("underscores_around", f"{filler} _{w}_."),
        ("digits", f"{filler} {w}2."),
    ]


def _letter(kw: dict[str, Any], g: _Gen) -> list[tuple[str, str]]:
    letter, n = str(kw["letter"]), int(kw["let_frequency"])
    out: list[tuple[str, str]] = []
    base = " ".join(g.words(8, avoid=letter))
    for k in _around(n):
        out.append(("letters", base + " " + " ".join([letter] * k)))
        out.append(("upper", base + " " + " ".join([letter.upper()] * k)))
        out.append(("in_words", base + " " + letter * k + "zz"))
        out.append(("accented", base + " " + " ".join(["é" if letter == "e" else letter + "\u0301"] * k)))
    return out


def _language(kw: dict[str, Any], g: _Gen) -> list[tuple[str, str]]:
    return [(f"lang_{code}", text) for code, text in LANGUAGE_SAMPLES]


def _capital(kw: dict[str, Any], g: _Gen) -> list[tuple[str, str]]:
    t = g.text(2)
    return [
        ("upper", t.upper()),
        ("lower", t.lower()),
        ("mixed", t),
        ("upper_chinese", t.upper() + " 我喜欢猫"),
        ("upper_digits", t.upper() + " 123"),
        ("upper_german", LANGUAGE_SAMPLES[1][1].upper()),
        ("upper_greek", "Η ΘΑΛΑΣΣΑ ΕΙΝΑΙ ΒΑΘΙΑ ΚΑΙ ΚΡΥΑ."),
        ("upper_one_lower", t.upper()[:-2] + "x."),
        ("letterless", "12345 67890"),
        ("upper_curly", "\u201c" + t.upper() + "\u201d"),
    ]


def _lowercase(kw: dict[str, Any], g: _Gen) -> list[tuple[str, str]]:
    t = g.text(2)
    return [
        ("lower", t.lower()),
        ("mixed", t),
        ("upper", t.upper()),
        ("lower_chinese", t.lower() + " 我喜欢猫"),
        ("lower_digits", t.lower() + " 123"),
        ("lower_german", LANGUAGE_SAMPLES[1][1].lower()),
        ("lower_one_upper", "I " + t.lower()),
        ("letterless", "12345 67890"),
    ]


def _capital_words(kw: dict[str, Any], g: _Gen) -> list[tuple[str, str]]:
    n = int(kw["capital_frequency"])
    out: list[tuple[str, str]] = []
    forms = {
        "caps": lambda: g.words(1)[0].upper(),
        "contraction": lambda: "DON'T",
        "acronym_dots": lambda: "U.S.",
        "hyphen_digits": lambda: "COVID-19",
        "possessive": lambda: "NASA's",
        "parenthesised": lambda: "(NASA)",
        "sentence_end": lambda: g.words(1)[0].upper() + ".",
        "single_letter": lambda: "A",
        "hyphenated": lambda: "WELL-KNOWN",
        "alnum": lambda: "ABC123",
    }
    for k in _around(n):
        for tag, make in forms.items():
            parts = [w.lower() for w in g.words(4)] + [make() for _ in range(k)] + ["end."]
            out.append((tag, " ".join(parts)))
    return out


def _end_checker(kw: dict[str, Any], g: _Gen) -> list[tuple[str, str]]:
    p = str(kw["end_phrase"])
    t = g.text(1)
    return [
        ("ends_with", f"{t} {p}"),
        ("ends_with_stop", f"{t} {p}."),
        ("case", f"{t} {p.upper()}"),
        ("quoted", f'"{t} {p}"'),
        ("curly_quotes", f"\u201c{t} {p}\u201d"),
        ("trailing_whitespace", f"{t} {p}  \n\n"),
        ("inner_whitespace", f"{t} {'  '.join(p.split())}"),
        ("inner_newline", f"{t} {chr(10).join(p.split())}"),
        ("then_more", f"{t} {p}\nMore text."),
        ("truncated", f"{t} {p[:-1]}"),
        ("own_line", f"{t}\n{p}"),
        ("bold", f"{t} **{p}**"),
    ]


def _quotation(kw: dict[str, Any], g: _Gen) -> list[tuple[str, str]]:
    t = g.text(2)
    return [
        ("quoted", f'"{t}"'),
        ("curly_quotes", f"\u201c{t}\u201d"),
        ("single_quotes", f"'{t}'"),
        ("guillemets", f"\u00ab{t}\u00bb"),
        ("padded", f'  "{t}"\n'),
        ("one_quote", '"'),
        ("two_quotes", '""'),
        ("open_only", f'"{t}'),
        ("inner_quotes", f'"{t}" and "{t}"'),
        ("mixed_quotes", f'"{t}\u201d'),
        ("unquoted", t),
        ("fullwidth_quotes", f"\uff02{t}\uff02"),
    ]


def _postscript(kw: dict[str, Any], g: _Gen) -> list[tuple[str, str]]:
    m = str(kw["postscript_marker"])
    t = g.text(2)
    return [
        ("postscript", f"{t}\n\n{m} {g.sentence()}"),
        ("lowercase", f"{t}\n\n{m.lower()} {g.sentence()}"),
        ("spaced", f"{t}\n\n{m.replace('.', '. ').strip()} {g.sentence()}"),
        ("empty_postscript", f"{t}\n\n{m}"),
        ("empty_postscript_space", f"{t}\n\n{m}  "),
        ("postscript_next_line", f"{t}\n\n{m}\n{g.sentence()}"),
        ("inline_postscript", f"{t} {m} {g.sentence()}"),
        ("bold_marker", f"{t}\n\n**{m}** {g.sentence()}"),
        ("pps", f"{t}\n\nP.P.S. {g.sentence()}"),
        ("ps", f"{t}\n\nP.S. {g.sentence()}"),
        ("no_dots", f"{t}\n\nPS {g.sentence()}"),
        ("missing_dot", f"{t}\n\nP.S {g.sentence()}"),
        ("postscript_first", f"{m} {g.sentence()}\n{t}"),
        ("inside_word", f"{t} the lap.s. {g.sentence()}"),
        ("crlf", f"{t}\r\n\r\n{m} {g.sentence()}\r\n"),
    ]


def _placeholders(kw: dict[str, Any], g: _Gen) -> list[tuple[str, str]]:
    n = int(kw["num_placeholders"])
    forms = {
        "placeholder": lambda i: f"[name{i}]",
        "empty_placeholder": lambda i: "[]",
        "blank_placeholder": lambda i: "[ ]",
        "multi_word": lambda i: f"[your address {i}]",
        "multiline": lambda i: f"[a\nb{i}]",
        "nested": lambda i: f"[[x{i}]]",
        "markdown_link": lambda i: f"[link{i}](http://x.org)",
        "fullwidth_brackets": lambda i: f"\uff3bname{i}\uff3d",
    }
    out: list[tuple[str, str]] = []
    for k in _around(n):
        for tag, make in forms.items():
            out.append((tag, g.sentence() + " " + " ".join(make(i) for i in range(k)) + " " + g.sentence()))
    return out


def _title(kw: dict[str, Any], g: _Gen) -> list[tuple[str, str]]:
    t = g.text(2)
    w = g.sentence(3, end="")
    return [
        ("title", f"<<{w}>>\n{t}"),
        ("empty_title", f"<<>>\n{t}"),
        ("blank_title", f"<< >>\n{t}"),
        ("markup_bold", f"<<**{w}**>>\n{t}"),
        ("markup_html", f"<<<b>{w}</b>>>\n{t}"),
        ("markup_angle", f"<<a <b> c>>\n{t}"),
        ("markup_italic", f"<<*{w}*>>\n{t}"),
        ("multiline_title", f"<<{w}\n{w}>>\n{t}"),
        ("single_angles", f"<{w}>\n{t}"),
        ("cjk_brackets", f"\u300a{w}\u300b\n{t}"),
        ("title_then_empty", f"<<{w}>> and <<>>\n{t}"),
        ("empty_then_title", f"<<>> and <<{w}>>\n{t}"),
        ("triple_angles", f"<<<{w}>>>\n{t}"),
        ("unclosed", f"<<{w}>\n{t}"),
        ("inline_title", f"{t} <<{w}>> {t}"),
        ("angles_only", f"<<<>>>\n{t}"),
    ]


def _highlights(kw: dict[str, Any], g: _Gen) -> list[tuple[str, str]]:
    n = int(kw["num_highlights"])
    forms = {
        "italic": lambda: f"*{g.words(1)[0]}*",
        "bold": lambda: f"**{g.words(1)[0]}**",
        "bold_italic": lambda: f"***{g.words(1)[0]}***",
        "spaced": lambda: f"* {g.words(1)[0]} *",
        "empty_highlight": lambda: "**",
        "blank_highlight": lambda: "* *",
        "underscore": lambda: f"_{g.words(1)[0]}_",
        "adjacent": lambda: f"*{g.words(1)[0]}**{g.words(1)[0]}*",
        "multiline": lambda: f"*{g.words(1)[0]}\n{g.words(1)[0]}*",
    }
    out: list[tuple[str, str]] = []
    for k in _around(n):
        for tag, make in forms.items():
            out.append(
                (tag, g.sentence() + " " + " and ".join(make() for _ in range(k)) + " " + g.sentence())
            )
        out.append(("bullets", "\n".join(f"* {g.sentence()}" for _ in range(k))))
    return out


def _sections(kw: dict[str, Any], g: _Gen) -> list[tuple[str, str]]:
    s, n = str(kw["section_spliter"]), int(kw["num_sections"])
    other = s.upper() if s != s.upper() else s.capitalize()
    forms = {
        "sections": lambda i: f"{s} {i}\n{g.text(1)}",
        "no_space": lambda i: f"{s}{i}\n{g.text(1)}",
        "heading": lambda i: f"## {s} {i}\n{g.text(1)}",
        "bold": lambda i: f"**{s} {i}**\n{g.text(1)}",
        "colon": lambda i: f"{s} {i}: {g.text(1)}",
        "other_case": lambda i: f"{other} {i}\n{g.text(1)}",
        "word_number": lambda i: f"{s} one\n{g.text(1)}",
        "mid_line": lambda i: f"{g.sentence()} As {s} {i} says, {g.sentence()}",
        "plural": lambda i: f"{s}s {i}\n{g.text(1)}",
        "crlf": lambda i: f"{s} {i}\r\n{g.text(1)}",
    }
    out: list[tuple[str, str]] = []
    for k in _around(n):
        for tag, make in forms.items():
            out.append((tag, "\n\n".join(make(i + 1) for i in range(k))))
    return out


def _bullets(kw: dict[str, Any], g: _Gen) -> list[tuple[str, str]]:
    n = int(kw["num_bullets"])
    forms: dict[str, Callable[[int], str]] = {
        "star": lambda i: f"* {g.sentence(3)}",
        "dash": lambda i: f"- {g.sentence(3)}",
        "plus": lambda i: f"+ {g.sentence(3)}",
        "mixed": lambda i: f"{'*-+'[i % 3]} {g.sentence(3)}",
        "mixed_star_dash": lambda i: f"{'*-'[i % 2]} {g.sentence(3)}",
        "no_space": lambda i: f"*{g.sentence(3)}",
        "dash_no_space": lambda i: f"-{g.sentence(3)}",
        "nested": lambda i: f"  * {g.sentence(3)}",
        "numbered": lambda i: f"{i + 1}. {g.sentence(3)}",
        "unicode_bullet": lambda i: f"\u2022 {g.sentence(3)}",
        "empty_bullet": lambda i: "* ",
        "emphasis_line": lambda i: f"*{g.words(1)[0]}* {g.sentence(3)}",
        "bold_line": lambda i: f"**{g.words(1)[0]}** {g.sentence(3)}",
        "rule": lambda i: "---",
        "negative_number": lambda i: f"-{i + 1} degrees today",
    }
    out: list[tuple[str, str]] = []
    for k in _around(n):
        for tag, make in forms.items():
            out.append((tag, "Intro line.\n" + "\n".join(make(i) for i in range(k)) + "\nOutro line."))
            if tag in ("star", "dash"):
                out.append((tag + "_crlf", "\r\n".join(make(i) for i in range(k))))
                out.append((tag + "_blank_lines", "\n\n".join(make(i) for i in range(k))))
    return out


def _json(kw: dict[str, Any], g: _Gen) -> list[tuple[str, str]]:
    title = g.sentence(3, end="")
    obj = f'{{"title": "{title}", "items": [1, 2, 3]}}'
    return [
        ("json", obj),
        ("fence_json", f"```json\n{obj}\n```"),
        ("fence_Json", f"```Json\n{obj}\n```"),
        ("fence_JSON", f"```JSON\n{obj}\n```"),
        ("fence_mixed_case", f"```jSoN\n{obj}\n```"),
        ("fence_plain", f"```\n{obj}\n```"),
        ("fence_unclosed", f"```json\n{obj}"),
        ("fence_other_lang", f"```python\n{obj}\n```"),
        ("text_before", f"Here it is:\n{obj}"),
        ("text_after", f"{obj}\nDone."),
        ("array", "[1, 2, 3]"),
        ("scalar", "42"),
        ("string", '"hello"'),
        ("null", "null"),
        ("nan", "NaN"),
        ("invalid", "{'a': 1}"),
        ("truncated", obj[:-1]),
        ("nested", "[" * 50 + "]" * 50),
        ("padded", f"  \n{obj}\n  "),
    ]


def _constrained(kw: dict[str, Any], g: _Gen) -> list[tuple[str, str]]:
    t = g.sentence()
    return [
        ("yes", "My answer is yes."),
        ("no", "My answer is no."),
        ("maybe", "My answer is maybe."),
        ("option_then_text", f"My answer is no. {t}"),
        ("text_then_option", f"{t} My answer is yes."),
        ("all_options", "My answer is yes. My answer is no. My answer is maybe."),
        ("two_options", "My answer is yes. My answer is no!"),
        ("lowercase", "my answer is yes."),
        ("no_stop", "My answer is yes"),
        ("other_punctuation", "My answer is yes!"),
        ("repeated", "My answer is yes. My answer is yes."),
        ("unrelated", t),
    ]


def _two_responses(kw: dict[str, Any], g: _Gen) -> list[tuple[str, str]]:
    a, b = g.text(1), g.text(1)
    return [
        ("two", f"{a}\n******\n{b}"),
        ("same", f"{a}\n******\n{a}"),
        ("three", f"{a}\n******\n{b}\n******\n{g.text(1)}"),
        ("empty_middle", f"{a}\n******\n\n******\n{b}"),
        ("leading_separator", f"******\n{a}\n******\n{b}"),
        ("trailing_separator", f"{a}\n******\n{b}\n******"),
        ("seven_stars", f"{a}\n*******\n{b}"),
        ("five_stars", f"{a}\n*****\n{b}"),
        ("inline", f"{a} ****** {b}"),
        ("one", a),
        ("same_but_spacing", f"{a}\n******\n  {a}  "),
    ]


def _repeat(kw: dict[str, Any], g: _Gen) -> list[tuple[str, str]]:
    p = str(kw["prompt_to_repeat"])
    ans = g.text(1)
    return [
        ("repeat", f"{p} {ans}"),
        ("repeat_newline", f"{p}\n\n{ans}"),
        ("lowercase", f"{p.lower()} {ans}"),
        ("uppercase", f"{p.upper()} {ans}"),
        ("leading_space", f"  {p} {ans}"),
        ("inner_whitespace", f"{'  '.join(p.split(' '))} {ans}"),
        ("inner_newline", f"{p.replace(' ', chr(10), 1)} {ans}"),
        ("truncated", f"{p[:-2]} {ans}"),
        ("not_repeated", ans),
        ("quoted", f'"{p}" {ans}'),
        ("preamble_repeat", f"Here is the request:\n{p} {ans}"),
    ]


BUILDERS: dict[str, Builder] = {
    "punctuation:no_comma": _no_comma,
    "length_constraints:number_words": _number_words,
    "length_constraints:number_sentences": _number_sentences,
    "length_constraints:number_paragraphs": _number_paragraphs,
    "length_constraints:nth_paragraph_first_word": _nth_paragraph,
    "keywords:existence": _existence,
    "keywords:frequency": _frequency,
    "keywords:forbidden_words": _forbidden,
    "keywords:letter_frequency": _letter,
    "language:response_language": _language,
    "change_case:english_capital": _capital,
    "change_case:english_lowercase": _lowercase,
    "change_case:capital_word_frequency": _capital_words,
    "startend:end_checker": _end_checker,
    "startend:quotation": _quotation,
    "detectable_content:postscript": _postscript,
    "detectable_content:number_placeholders": _placeholders,
    "detectable_format:title": _title,
    "detectable_format:number_highlighted_sections": _highlights,
    "detectable_format:multiple_sections": _sections,
    "detectable_format:number_bullet_lists": _bullets,
    "detectable_format:json_format": _json,
    "detectable_format:constrained_response": _constrained,
    "combination:two_responses": _two_responses,
    "combination:repeat_prompt": _repeat,
}


# --------------------------------------------------------------------------- kwargs


def _edge_kwargs(instruction: str, ins: Any) -> list[dict[str, Any]]:
    """The reference's own argument limits: 1 and its `_NUM_*` / `_MAX_*` maxima, under both
    relations of `_COMPARISON_RELATION` where the checker compares with one."""
    rel = list(ins._COMPARISON_RELATION)
    table: dict[str, list[dict[str, Any]]] = {
        "length_constraints:number_words": [
            {"num_words": n, "relation": r}
            for n in (1, 2, ins._NUM_WORDS_LOWER_LIMIT, ins._NUM_WORDS_UPPER_LIMIT)
            for r in rel
        ],
        "length_constraints:number_sentences": [
            {"num_sentences": n, "relation": r} for n in (1, 2, ins._MAX_NUM_SENTENCES) for r in rel
        ],
        "length_constraints:number_paragraphs": [{"num_paragraphs": n} for n in (1, 2, ins._NUM_PARAGRAPHS)],
        "keywords:frequency": [
            {"keyword": "sea", "frequency": n, "relation": r}
            for n in (1, ins._KEYWORD_FREQUENCY)
            for r in rel
        ],
        "keywords:letter_frequency": [
            {"letter": "e", "let_frequency": n, "let_relation": r}
            for n in (1, ins._LETTER_FREQUENCY)
            for r in rel
        ],
        "change_case:capital_word_frequency": [
            {"capital_frequency": n, "capital_relation": r}
            for n in (1, ins._ALL_CAPITAL_WORD_FREQUENCY)
            for r in rel
        ],
        "detectable_content:number_placeholders": [
            {"num_placeholders": n} for n in (1, ins._NUM_PLACEHOLDERS)
        ],
        "detectable_format:number_bullet_lists": [{"num_bullets": n} for n in (1, ins._NUM_BULLETS)],
        "detectable_format:number_highlighted_sections": [
            {"num_highlights": n} for n in (1, ins._NUM_HIGHLIGHTED_SECTIONS)
        ],
        "detectable_format:multiple_sections": [
            {"section_spliter": s, "num_sections": n}
            for s in ins._SECTION_SPLITER
            for n in (1, ins._NUM_SECTIONS)
        ],
        "length_constraints:nth_paragraph_first_word": [
            {"num_paragraphs": 1, "nth_paragraph": 1, "first_word": "sea"},
            {
                "num_paragraphs": ins._NUM_PARAGRAPHS,
                "nth_paragraph": ins._NUM_PARAGRAPHS,
                "first_word": "sea",
            },
        ],
        "detectable_content:postscript": [{"postscript_marker": m} for m in ins._POSTSCRIPT_MARKER],
        "startend:end_checker": [{"end_phrase": p} for p in ins._ENDING_OPTIONS],
        "keywords:existence": [{"keywords": ["sea"]}, {"keywords": ["fox", "moon"]}],
        "keywords:forbidden_words": [{"forbidden_words": ["bad"]}],
        "language:response_language": [{"language": code} for code in ("en", "de", "fr", "ja", "ru", "ar")],
    }
    return table.get(instruction, [])


PROMPTS = [
    "Write a haiku about the sea.",
    "Write a short story about a lost key. Use at most 100 words.",
    "What is the capital of France?\nAnswer in one word.",
]


def _drawn_kwargs(instruction: str, cls: type, seed: int) -> list[dict[str, Any]]:
    """kwargs drawn by the reference's own `build_description()`, as its `get_instruction_args()`
    returns them; draws IFEval rows never hold (nth_paragraph beyond num_paragraphs) are dropped."""
    out: list[dict[str, Any]] = []
    with _seeded(seed):
        for draw in range(DRAWS):
            checker = cls(instruction)
            if instruction == "combination:repeat_prompt":
                checker.build_description(prompt_to_repeat=PROMPTS[draw % len(PROMPTS)])
            else:
                checker.build_description()
            args = dict(checker.get_instruction_args() or {})
            if (
                instruction.endswith("nth_paragraph_first_word")
                and args["nth_paragraph"] > args["num_paragraphs"]
            ):
                continue
            if args not in out:
                out.append(args)
    return out


def _usable(kwargs: dict[str, Any]) -> bool:
    """The reference drops falsy kwargs (`{k: v ... if v}`) and draws them anew at random: a 0 in
    a row means nothing fixed, so such kwargs are not probed."""
    return all(v for v in kwargs.values())


def reference_probes() -> list[RefProbe]:
    """Every probe of the reference-derived corpus (see the module docstring)."""
    from lm_eval.tasks.ifeval import instructions as ins
    from lm_eval.tasks.ifeval import instructions_registry, instructions_util

    out: list[RefProbe] = []
    seen: set[tuple[str, str, str]] = set()

    def add(instruction: str, kwargs: dict[str, Any], tag: str, response: str) -> None:
        key = (instruction, repr(sorted(kwargs.items())), response)
        if key not in seen:
            seen.add(key)
            out.append(RefProbe(instruction, dict(kwargs), response, tag))

    for index, (instruction, cls) in enumerate(sorted(instructions_registry.INSTRUCTION_DICT.items())):
        build = BUILDERS[instruction]
        kwargs_list = _drawn_kwargs(instruction, cls, SEED + index)
        kwargs_list += [kw for kw in _edge_kwargs(instruction, ins) if kw not in kwargs_list]
        if instruction == "combination:repeat_prompt":
            kwargs_list += [
                {"prompt_to_repeat": p} for p in PROMPTS if {"prompt_to_repeat": p} not in kwargs_list
            ]
        gen = _Gen(list(instructions_util.WORD_LIST), SEED + index)
        for k_index, kwargs in enumerate(kw for kw in kwargs_list if _usable(kw)):
            for tag, response in build(kwargs, gen):
                add(instruction, kwargs, tag, response)
                if k_index < 2 and "\n" not in response[:1] and tag not in ("empty",):
                    add(instruction, kwargs, tag + "+preamble", PREAMBLE + response)
                    add(instruction, kwargs, tag + "+closing", response + CLOSING)
                    if "\n" in response:
                        add(instruction, kwargs, tag + "+crlf", response.replace("\n", "\r\n"))
            if k_index < 2:
                for tag, response in DEGENERATE:
                    add(instruction, kwargs, tag, response)
    return out
