"""Probing responses for every IFEval instruction id, for the differential test against IFEval's
reference checkers (`test_if_vs_ifeval_reference.py`).

Each probe is (instruction id, kwargs as in an IFEval row, response). The responses are written
to sit on the edges of each rule: empty and blank replies, Unicode words (Greek, Chinese, accented
Latin), apostrophes and possessives, quotes, markdown (bold, headings, dividers, bullets), a
preamble line for the loose mode, and every count swept across its boundary (n-1, n, n+1 for
"less than" and "at least"). Pure data: importing it starts nothing.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class Probe(NamedTuple):
    instruction: str
    kwargs: dict[str, Any]
    response: str

    @property
    def key(self) -> str:
        return f"{self.instruction} {self.kwargs} {self.response!r}"


GREEK = "Η θάλασσα είναι βαθιά και κρύα."  # 6 words, 1 sentence
CHINESE = "我喜欢猫。我也喜欢狗。"  # 2 \w runs, 1 Punkt sentence (no Latin full stop)
PREAMBLE = "Sure, here is my answer:\n"

# (text, its word count as both sides count it)
WORD_TEXTS: list[tuple[str, int]] = [
    ("one two three four five", 5),
    ("The quick brown fox jumps over the lazy dog.", 9),
    (GREEK, 6),
    (CHINESE, 2),
    ("A well-known fact: 3.14 is pi.", 7),
    ("**Bold** words, *italic* words\n- a bullet\n- another", 8),
    ("café au lait, naïve résumé", 5),
    ("snake_case and camelCase", 3),
    ("Wait... what?!", 2),
    ("  spaced   out   words  ", 3),
    ("Email me at a.b@example.com today", 7),
    ("| col | val |\n|---|---|\n| a | 1 |", 4),
    ("`print(x)` prints x", 4),
    ("2024-01-05 was a Friday", 6),
    ("I don't know", 4),  # IFEval's \w+ splits "don't" in two; one word here
]

# (text, its sentence count as Punkt counts it)
SENTENCE_TEXTS: list[tuple[str, int]] = [
    ("One sentence only.", 1),
    ("First one. Second one! Third one?", 3),
    ("Dr. Smith went home. He slept.", 2),
    ("Mr. and Mrs. Smith came. They left.", 2),
    ("Pi is 3.14 exactly. Ok then.", 2),
    ("J. R. R. Tolkien wrote books. He died in 1973.", 2),
    ('He said "stop." Then he left.', 2),
    ("Wait... what? Yes.", 2),
    ("The U.S. is big. It is.", 2),
    ("No final stop here", 1),
    ("A title line\nThen a sentence.", 1),
    ("- bullet one\n- bullet two\n- bullet three", 1),
    ("- bullet one.\n- bullet two.\n- bullet three.", 3),
    (GREEK + " Δεύτερη πρόταση.", 2),
    (CHINESE, 1),
    ("Hello!!! World??? Fine.", 3),
    ("It costs $5. Cheap.", 2),
    ("It was 5 p.m. when he came. Then left.", 2),
    ("Section 1. Intro. Section 2. Body.", 4),
    ("I like it (a lot). Yes.", 2),
    ("**Bold.** Next one.", 2),
    ("1. First item\n2. Second item\n3. Third", 3),
    ("This is e.g. an example. And i.e. another.", 4),  # Punkt knows neither abbreviation
    ("...", 1),  # Punkt: one sentence; here: no words, no sentence
    ("Prof. Jones spoke. Students listened. Then lunch!", 3),
    ("Is it? It is. Really!", 3),
    ("Use the St. Louis office. Call Jan. Thanks.", 3),
    ("Line without stop\nAnother line without stop", 1),
]


def _counts(instruction: str, count_key: str, text: str, k: int, extra: dict[str, Any]) -> list[Probe]:
    """`text` (count k) under "less than" and "at least", n swept over k-1, k, k+1 (n >= 1)."""
    out = []
    for relation in ("less than", "at least"):
        for n in (k - 1, k, k + 1):
            if n >= 1:
                out.append(Probe(instruction, {"relation": relation, count_key: n} | extra, text))
    return out


def _word_probes() -> list[Probe]:
    out = []
    for text, k in WORD_TEXTS:
        out += _counts("length_constraints:number_words", "num_words", text, k, {})
    for response in ("", "   \n  "):
        out.append(
            Probe("length_constraints:number_words", {"relation": "less than", "num_words": 5}, response)
        )
    out.append(
        Probe("length_constraints:number_words", {"relation": "at least", "num_words": 3}, PREAMBLE + "a b")
    )
    return out


def _sentence_probes() -> list[Probe]:
    out = []
    for text, k in SENTENCE_TEXTS:
        out += _counts("length_constraints:number_sentences", "num_sentences", text, k, {})
    for response in ("", "\n\n"):
        kwargs = {"relation": "less than", "num_sentences": 3}
        out.append(Probe("length_constraints:number_sentences", kwargs, response))
    return out


NO_COMMA = [
    "",
    "中文，逗号",  # a full-width comma is a comma
    "  \n",
    "No commas here at all.",
    "One, two.",
    "Ends with a comma,",
    "Numbers 1000000 and 3.5 and 7",
    '"Quoted" text; semicolons: fine',
    "**Bold** text\nNext line.",
    PREAMBLE + "no commas below",
    "Line one\nLine two, with one",
    GREEK,
    CHINESE,
    "List:\n- a\n- b\n- c",
]


def _simple(instruction: str, responses: list[str], kwargs: dict[str, Any] | None = None) -> list[Probe]:
    return [Probe(instruction, dict(kwargs or {}), r) for r in responses]


PARAGRAPHS: list[tuple[str, int]] = [
    ("First paragraph.\n***\nSecond paragraph.", 2),
    ("One.\n\n***\n\nTwo.\n\n***\n\nThree.", 3),
    ("Only one paragraph\nover two lines.", 1),
    ("Blank lines\n\ndo not\n\nsplit.", 1),
    ("***\nLeading divider.\n***\nTrailing one.\n***", 2),
    ("A\n***\nB\n***\nC\n***\nD", 4),
    ("Para one *** para two", 2),
    ("A\n***\n\n***\nB", -1),  # an empty paragraph between dividers: never the right count
]


def _paragraph_probes() -> list[Probe]:
    out = []
    for text, k in PARAGRAPHS:
        for n in (1, 2, 3, 4):
            if k == -1 or abs(n - k) <= 1:
                out.append(Probe("length_constraints:number_paragraphs", {"num_paragraphs": n}, text))
    out += _simple("length_constraints:number_paragraphs", ["", "  "], {"num_paragraphs": 1})
    return out


def _nth_paragraph_probes() -> list[Probe]:
    texts = [
        "Intro here.\n\nOcean waves are loud.\n\nThe end.",
        "Intro here.\n\nocean, the blue one.\n\nThe end.",
        "Intro here.\n\nThe ocean.\n\nThe end.",
        'Intro here.\n"Ocean" is a word.\n\nThe end.',
        "Intro.\n\nOcean.",
        'Intro here.\n\n"Ocean" in quotes.\n\nThe end.',
        "Intro here.\n\nOcean!\n\nThe end.\n\nExtra.",
        "",
    ]
    out = []
    for text in texts:
        for n, nth in ((3, 2), (2, 2), (3, 1)):
            out.append(
                Probe(
                    "length_constraints:nth_paragraph_first_word",
                    {"num_paragraphs": n, "nth_paragraph": nth, "first_word": "ocean"},
                    text,
                )
            )
    return out


def _keyword_probes() -> list[Probe]:
    texts = [
        "The fox ran.",
        "THE FOX RAN.",
        "The fox's den is deep.",
        "A moon and a fox.",
        "A moon only.",
        "",
        "Fox, moon, sun.",
        "foxmoon",
        "The **fox** and the *moon*.",
        PREAMBLE + "fox and moon",
    ]
    out = []
    for kw in (["fox"], ["fox", "moon"]):
        out += _simple("keywords:existence", texts, {"keywords": kw})
    return out


def _frequency_probes() -> list[Probe]:
    texts = [
        ("fox", 1),
        ("Fox fox FOX.", 3),
        ("The fox's den and the fox.", 2),
        ("A fox, a fox, a fox, a fox.", 4),
        ("No animals here.", 0),
        ("fox\nfox", 2),
    ]
    out = []
    for text, k in texts:
        for relation in ("less than", "at least"):
            for n in (k, k + 1):
                if n >= 1:
                    kwargs = {"keyword": "fox", "relation": relation, "frequency": n}
                    out.append(Probe("keywords:frequency", kwargs, text))
    out.append(Probe("keywords:frequency", {"keyword": "fox", "relation": "less than", "frequency": 2}, ""))
    return out


def _forbidden_probes() -> list[Probe]:
    texts = [
        "",
        "   ",
        "A good day.",
        "A bad day.",
        "A BAD day.",
        "The bad's end.",
        "A badge and a badger.",
        "Not-bad at all.",
        "**bad**",
        "Good.\nBad.",
        "A terrible, awful day.",
        GREEK,
        "It bad'd out.",  # IFEval's \bbad\b finds these: the apostrophe ends the word
        "We bad've gone.",
        "It bad\u2019d out.",
        "A bad_stuff variable.",  # IFEval's \b misses `bad` inside an identifier; ours does not
        "Call _bad_ now.",
    ]
    out = _simple("keywords:forbidden_words", texts, {"forbidden_words": ["bad"]})
    out += _simple("keywords:forbidden_words", texts, {"forbidden_words": ["bad", "awful"]})
    return out


def _letter_probes() -> list[Probe]:
    texts = [("zoo", 1), ("Jazz buzz", 4), ("ZZZ", 3), ("no such letter", 0), ("Zürich zebra", 2)]
    out = []
    for text, k in texts:
        for relation in ("less than", "at least"):
            for n in (k, k + 1):
                if n >= 1:
                    kwargs = {"letter": "z", "let_relation": relation, "let_frequency": n}
                    out.append(Probe("keywords:letter_frequency", kwargs, text))
    out.append(
        Probe(
            "keywords:letter_frequency", {"letter": "z", "let_relation": "less than", "let_frequency": 2}, ""
        )
    )
    return out


CAPITAL = [
    "",
    "HELLO WORLD, THIS IS ENGLISH TEXT ABOUT THE SEA.",
    "Hello world, this is English text.",
    "THE SEA IS BLUE AND COLD. 42 WHALES SWIM IN IT!",
    "我喜欢猫和狗，它们很可爱。",
    "Η ΘΑΛΑΣΣΑ ΕΙΝΑΙ ΒΑΘΙΑ ΚΑΙ ΚΡΥΑ ΣΗΜΕΡΑ.",
    "123 456",
    "LA MER EST BLEUE ET LE CIEL EST GRIS AUJOURD'HUI.",
    "THE SEA IS BLUE 我喜欢猫",
    PREAMBLE + "THE SEA IS BLUE AND VERY DEEP TODAY.",
    "THE SEA IS BLUE.\nthanks",
]

LOWER = [
    "",
    "hello world, this is english text about the sea.",
    "Hello world, this is English text.",
    "the sea is blue and cold. 42 whales swim in it!",
    "我喜欢猫和狗，它们很可爱。",
    "η θάλασσα είναι βαθιά και κρύα σήμερα.",
    "123 456",
    "la mer est bleue et le ciel est gris aujourd'hui.",
    "the sea is blue 我喜欢猫",
    "Sure! Here it is:\nthe sea is blue and very deep today.",
    "**the sea is blue and cold today.**",
]


def _capital_word_probes() -> list[Probe]:
    texts = [
        ("NASA and ESA", 2),
        ("I am here", 1),
        ("THE U.S. POLICY", 3),
        ("A WELL-KNOWN FACT", 3),
        ("NASA's rocket", 1),
        ("nothing here", 0),
        ("ΑΘΗΝΑ and ROMA", 2),
        ("**LOUD** and **CLEAR**", 2),
    ]
    out = []
    for text, k in texts:
        for relation in ("less than", "at least"):
            for n in (k, k + 1):
                if n >= 1:
                    kwargs = {"capital_relation": relation, "capital_frequency": n}
                    out.append(Probe("change_case:capital_word_frequency", kwargs, text))
    return out


END = [
    "",
    "Thanks for reading. Any other questions?",
    '"Thanks for reading. Any other questions?"',
    "Thanks for reading. Any other questions?  \n",
    "thanks. any other QUESTIONS?",
    "Any other questions? Bye.",
    "**Any other questions?**",
    "Any other questions?\nP.S. bye",
    "Thanks for reading. Any other questions",
]

QUOTE = [
    "",
    "\u201cHello there.\u201d",  # curly double quotes are double quotation marks
    '"Hello there."',
    '  "Hello there."  \n',
    '"',
    '""',
    'Hello "there"',
    '"Hello there',
    "'Hello there'",
    '"Line one.\nLine two."',
    'Sure:\n"Hello there."',
]

POSTSCRIPT = [
    "",
    "Hello.\n\nP.S. See you soon.",
    "Hello.\np.s. see you",
    "Hello.\nP. S. see you",
    "Hello.\n**P.S.** See you.",
    "Hello. PS see you",
    "Hello.\nP.S.\nSee you soon.",
    "Hello.\nP.P.S. more",
]

PPS = ["", "Hello.\nP.P.S. more", "Hello.\np. p. s. more", "Hello.\nP.S. only"]

PLACEHOLDERS = [
    ("", 0),
    ("Fill in [] and [ ] here.", 0),  # IFEval counts empty brackets as placeholders
    ("Send it to [address].", 1),
    ("Dear [name], meet me at [place] on [date].", 3),
    ("See [the docs](http://example.com).", 1),
    ("Nothing to fill here.", 0),
    ("Two on one line: [a] [b]", 2),
]

TITLES = [
    "",
    "<<My Poem>>\nRoses are red.",
    "<< >>\nRoses.",
    "<My Poem>\nRoses.",
    "Roses.\n<<Title at the end>>",
]
TITLES += ["<<Title\n>>", "**<<Bold Title>>**", "<<a>> and <<b>>"]

HIGHLIGHTS = [
    ("", 0),
    ("*one* and *two*", 2),
    ("**bold one** and *italic*", 2),
    ("* a bullet\n* another bullet", 0),
    ("*only one*", 1),
    ("** ** empty and * * empty", 0),
    ("*a* *b* *c*", 3),
]


def _highlight_probes() -> list[Probe]:
    out = []
    for text, k in HIGHLIGHTS:
        for n in {max(1, k), k + 1}:
            out.append(Probe("detectable_format:number_highlighted_sections", {"num_highlights": n}, text))
    return out


def _placeholder_probes() -> list[Probe]:
    out = []
    for text, k in PLACEHOLDERS:
        for n in {max(1, k), k + 1}:
            out.append(Probe("detectable_content:number_placeholders", {"num_placeholders": n}, text))
    return out


SECTIONS = [
    ("", 0),
    ("Section 1\nIntro.\nSection 2\nBody.", 2),
    ("SECTION 1\nIntro.\nSECTION 2\nBody.", 0),
    ("## Section 1\nIntro.\n## Section 2\nBody.", 2),
    ("**Section 1**\nIntro.\n**Section 2**\nBody.", 2),
    ("Section 1: Intro\nSection 2: Body\nSection 3: End", 3),
    ("Section1\nIntro.\nSection2\nBody.", 2),
    ("As Section 1 says, and Section 2 repeats, no sections here.", 0),
]


def _section_probes() -> list[Probe]:
    out = []
    for text, k in SECTIONS:
        for n in {max(1, k), k + 1}:
            kwargs = {"section_spliter": "Section", "num_sections": n}
            out.append(Probe("detectable_format:multiple_sections", kwargs, text))
    return out


JSONS = [
    "",
    '{"a": 1}',
    '```json\n{"a": 1}\n```',
    '```JSON\n{"a": 1}\n```',
    "```\n[1, 2, 3]\n```",
    '{"a": 1',
    'Here it is: {"a": 1}',
    '"just a string"',
    "  \n[]\n ",
    "{}",
]

CONSTRAINED = [
    "",
    "My answer is yes. My answer is no. My answer is maybe.",  # every option: no answer at all
    "My answer is yes.",
    "I think so. My answer is no.",
    "My answer is maybe.",
    "My answer is: yes",
    "my answer is yes.",
    "Yes.",
    "My answer is yes. My answer is no!",  # a second option, other punctuation: no answer
    "My answer is maybe. MY ANSWER IS NO.",
    "My answer is yes. Really, my answer is yes.",
]

TWO = [
    "",
    "First answer.\n******\nSecond answer.",
    "Same.\n******\nSame.",
    "One.\n******\nTwo.\n******\nThree.",
    "******\nOne.\n******\nTwo.",
    "One.\n******\n\n******\nTwo.",
    "Only one answer.",
    "One.******Two.",
]

REPEAT = [
    "",
    "Write a haiku about the sea. Waves fold into foam.",
    "write a HAIKU about the sea. Waves.",
    "Here is my haiku: waves fold into foam.",
    "  Write a haiku about the sea.",
    "Sure!\nWrite a haiku about the sea. Waves.",
    "Write a haiku about the sea.",
    "Write  a haiku\nabout the sea. Waves.",
    "Write a haiku about the sky. Clouds.",
]

# 10,000 characters of German, then 5,000 of English: IFEval's langdetect reads only the first
# 10,000 characters.
GERMAN_THEN_ENGLISH = (
    "Die Katze sitzt auf der Matte und schaut aus dem Fenster auf die Vögel im Garten. " * 122
    + "The cat sat on the mat and looked out of the window at the birds in the garden. " * 62
)

LANGUAGE: list[tuple[str, str]] = [
    ("en", "The cat sat on the mat and looked out of the window at the birds."),
    ("en", "Le chat est assis sur le tapis et regarde les oiseaux par la fenêtre."),
    ("fr", "Le chat est assis sur le tapis et regarde les oiseaux par la fenêtre."),
    ("fr", "The cat sat on the mat and looked out of the window at the birds."),
    ("de", "Die Katze sitzt auf der Matte und schaut aus dem Fenster auf die Vögel."),
    ("es", "El gato está sentado en la alfombra y mira los pájaros por la ventana."),
    ("ru", "Кошка сидит на коврике и смотрит в окно на птиц."),
    ("hi", "बिल्ली चटाई पर बैठी है और खिड़की से पक्षियों को देख रही है।"),
    ("en", ""),
    ("en", "12345 67890"),  # nothing to detect: IFEval counts it as English
    ("en", "Sure!\nThe weather today is sunny and warm, with a light breeze from the west."),
    ("de", "**Die Katze** sitzt auf der Matte.\n\nSie schaut aus dem Fenster."),
    ("it", "Il gatto è seduto sul tappeto e guarda gli uccelli dalla finestra."),
    ("ja", "猫はマットの上に座って、窓から鳥を見ています。"),
    ("ko", "고양이가 매트 위에 앉아 창밖의 새들을 보고 있습니다."),
    ("ar", "القطة تجلس على السجادة وتنظر إلى الطيور من النافذة."),
    ("pt", "O gato está sentado no tapete e olha os pássaros pela janela."),
    ("fr", "Sure, here it is:\nLe chat est assis sur le tapis et regarde les oiseaux par la fenêtre."),
    ("de", GERMAN_THEN_ENGLISH),  # IFEval reads only the German: ours reads the English too
    ("de", GERMAN_THEN_ENGLISH[:10_000] * 2),
]

BULLETS = [
    ("", 0),
    ("* one\n* two", 2),
    ("- one\n- two\n- three", 3),
    ("Intro:\n* one\n  * nested\nOutro.", 2),
    ("* one\n- two", 2),
    ("**Bold line**\n* one", 1),
    ("1. one\n2. two", 0),
    ("No bullets here.", 0),
    ("Intro\n---\n* one", 1),  # a markdown rule is not a bullet
]


def _bullet_probes() -> list[Probe]:
    out = []
    for text, k in BULLETS:
        for n in {max(1, k), k + 1}:
            out.append(Probe("detectable_format:number_bullet_lists", {"num_bullets": n}, text))
    return out


# Whole replies shaped like real model outputs (an essay, a letter, a list, a fenced JSON...).
REPLIES = [
    "<<The Sea at Dawn>>\n\nThe sea wakes slowly. *Gulls* circle above the harbour, and the boats "
    "rock in the grey light.\n\n***\n\nBy noon the water is **bright**. Any other questions?",
    "Dear Ms. Rivera,\n\nThank you for your letter of 3 May. We will ship the order on Monday.\n\n"
    "Best regards,\nSam\n\nP.S. The catalogue is attached.",
    "SECTION 1\nThe problem: the pump fails at night.\n\nSECTION 2\nThe fix: replace the valve.",
    '```json\n{\n  "title": "Sea facts",\n  "facts": ["deep", "salty", "cold"]\n}\n```',
    "Here are three tips:\n* Drink water.\n* Sleep eight hours.\n* Walk daily.",
    "THE STORM CAME AT NIGHT. THE WAVES WERE HIGH AND THE WIND WAS LOUD. BY MORNING IT WAS CALM.",
    "the storm came at night. the waves were high and the wind was loud. by morning it was calm.",
    "Option A: take the train.\n******\nOption B: take the bus.",
    "My answer is no. The data do not support it.",
    '"The sea is a mirror of the sky, and the sky a mirror of the sea."',
    "1. Preheat the oven.\n2. Mix the flour, the sugar and the eggs.\n3. Bake for 30 minutes.",
    "Sure! Here is a haiku:\n\nwaves fold into foam\nthe gull's cry over the bay\nsalt on the cold wind",
    "समुद्र बहुत गहरा और ठंडा है। मछलियाँ उसमें तैरती हैं।",
    "La mer est profonde. Les poissons y nagent, et les bateaux passent au loin.",
    "| Day | Tide |\n|-----|------|\n| Mon | high |\n| Tue | low |",
    "> Quoted line from the sea captain.\n\nThat is all he said.",
]

SIMPLE_IDS: list[tuple[str, dict[str, Any]]] = [
    ("punctuation:no_comma", {}),
    ("change_case:english_capital", {}),
    ("change_case:english_lowercase", {}),
    ("startend:quotation", {}),
    ("startend:end_checker", {"end_phrase": "Any other questions?"}),
    ("detectable_format:title", {}),
    ("detectable_format:json_format", {}),
    ("detectable_format:constrained_response", {}),
    ("combination:two_responses", {}),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}),
    ("detectable_format:multiple_sections", {"section_spliter": "SECTION", "num_sections": 2}),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 1}),
    ("detectable_content:number_placeholders", {"num_placeholders": 1}),
    ("detectable_format:number_bullet_lists", {"num_bullets": 3}),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}),
    ("keywords:forbidden_words", {"forbidden_words": ["the", "sea"]}),
    ("keywords:existence", {"keywords": ["sea"]}),
]


def pool() -> list[str]:
    """Every distinct response text of the per-id probes."""
    texts = [t for t, _ in WORD_TEXTS + SENTENCE_TEXTS + PARAGRAPHS + PLACEHOLDERS + HIGHLIGHTS]
    texts += [t for t, _ in SECTIONS + BULLETS] + [t for _, t in LANGUAGE]
    texts += NO_COMMA + CAPITAL + LOWER + END + QUOTE + POSTSCRIPT + TITLES + JSONS + CONSTRAINED + TWO
    texts += REPLIES
    return list(dict.fromkeys(texts))


def probes() -> list[Probe]:
    """Every probe, grouped by instruction id: each id's own edge cases, then every text of the
    pool against each id whose check reads any text (a Chinese reply for "no commas", a JSON
    fence for "title"...)."""
    out: list[Probe] = []
    out += _simple("punctuation:no_comma", NO_COMMA)
    out += _word_probes()
    out += _sentence_probes()
    out += _paragraph_probes()
    out += _nth_paragraph_probes()
    out += _keyword_probes()
    out += _frequency_probes()
    out += _forbidden_probes()
    out += _letter_probes()
    out += _simple("change_case:english_capital", CAPITAL)
    out += _simple("change_case:english_lowercase", LOWER)
    out += _capital_word_probes()
    out += _simple("startend:end_checker", END, {"end_phrase": "Any other questions?"})
    out += _simple("startend:quotation", QUOTE)
    out += _simple("detectable_content:postscript", POSTSCRIPT, {"postscript_marker": "P.S."})
    out += _simple("detectable_content:postscript", PPS, {"postscript_marker": "P.P.S"})
    out += _placeholder_probes()
    out += _simple("detectable_format:title", TITLES)
    out += _highlight_probes()
    out += _section_probes()
    out += _simple("detectable_format:json_format", JSONS)
    out += _simple("detectable_format:constrained_response", CONSTRAINED)
    out += _simple("combination:two_responses", TWO)
    out += _simple("combination:repeat_prompt", REPEAT, {"prompt_to_repeat": "Write a haiku about the sea."})
    out += [Probe("language:response_language", {"language": lang}, text) for lang, text in LANGUAGE]
    out += _bullet_probes()
    seen = {p.key for p in out}
    for instruction, kwargs in SIMPLE_IDS:
        for text in pool():
            probe = Probe(instruction, dict(kwargs), text)
            if probe.key not in seen:
                out.append(probe)
    return out
