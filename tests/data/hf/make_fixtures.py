"""Writes the small data-set fixtures of tests/unit/test_hf_prompts.py, one per public schema,
each as JSON lines and parquet (`python tests/data/hf/make_fixtures.py`; the outputs are committed).
Rows are written here in each schema's own field names; none is downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).parent

GSM8K_TRAIN = [
    {
        "question": "Natalia sold clips to 48 friends in April, and half as many in May. How many in all?",
        "answer": "In May she sold 48/2 = <<48/2=24>>24 clips.\nIn all 48+24 = <<48+24=72>>72.\n#### 72",
    },
    {
        "question": "Weng earns $12 an hour. She worked 50 minutes. How much did she earn?",
        "answer": "Per minute 12/60 = $<<12/60=0.2>>0.2.\n50 minutes: 0.2*50 = $<<0.2*50=10>>10.\n#### 10",
    },
    {
        "question": "A shop sells 250 pens a day. How many pens in 4 days?",
        "answer": "250*4 = <<250*4=1000>>1000\n#### 1,000",
    },
    {
        "question": "Betty has 5 apples and buys 3 more. How many apples?",
        "answer": "5+3 = <<5+3=8>>8\n#### 8",
    },
    {"question": "Betty  has 5 apples and buys 3 more.   How many apples?", "answer": "5+3 = 8\n#### 8"},
    {"question": "Tom reads 10 pages a day for 7 days. How many pages?", "answer": "10*7 = 70 pages."},
]
GSM8K_TEST = [
    {
        "question": "Janet has 16 eggs and eats 3. How many are left?",
        "answer": "16-3 = <<16-3=13>>13\n#### 13",
    },
    {
        "question": "A robe takes 2 bolts of blue and half that of white. How many bolts?",
        "answer": "2/2 = 1 white; 2+1 = <<2+1=3>>3\n#### 3",
    },
]

MATH = [
    {
        "problem": "What is $1+1$?",
        "solution": "Clearly $1+1=\\boxed{2}$.",
        "level": "Level 1",
        "type": "Algebra",
    },
    {
        "problem": "Simplify $\\frac{2}{4}$.",
        "solution": "It is $\\boxed{\\frac{1}{2}}$.",
        "level": "Level 2",
        "type": "Prealgebra",
    },
    {
        "problem": "Find $x$ if $2x=6$.",
        "solution": "So $x=3$ and then $\\boxed{3}$.",
        "level": "Level 1",
        "type": "Algebra",
    },
    {
        "problem": "What is $\\sqrt{18}$?",
        "solution": "$\\sqrt{18}=\\boxed{3\\sqrt{2}}$",
        "level": "Level 3",
        "type": "Algebra",
    },
    {
        "problem": "Describe a circle.",
        "solution": "A set of points at one distance from a centre.",
        "level": "Level 5",
        "type": "Geometry",
    },
]

MBPP = [
    {
        "task_id": 2,
        "text": "Write a function to find the shared elements of two lists.",
        "code": "def similar_elements(a, b):\n    return tuple(sorted(set(a) & set(b)))",
        "test_list": [
            "assert similar_elements((3, 4, 5, 6), (5, 7, 4, 10)) == (4, 5)",
            "assert similar_elements((1, 2, 3, 4), (5, 4, 3, 7)) == (3, 4)",
        ],
        "test_setup_code": "",
        "challenge_test_list": [],
    },
    {
        "task_id": 3,
        "text": "Write a python function to identify non-prime numbers.",
        "code": "def is_not_prime(n):\n"
        "    return n < 2 or any(n % i == 0 for i in range(2, int(n**0.5) + 1))",
        "test_list": [
            "assert is_not_prime(2) == False",
            "assert is_not_prime(10) == True",
            "assert is_not_prime(35) == True",
        ],
        "test_setup_code": "",
        "challenge_test_list": [],
    },
    {
        "task_id": 4,
        "text": "Write a function to find the area of a circle.",
        "code": "import math\ndef circle_area(r):\n    return math.pi * r * r",
        "test_list": ["assert math.isclose(circle_area(10), 314.159, rel_tol=0.001)"],
        "test_setup_code": "",
        "challenge_test_list": [],
    },
    {
        "task_id": 5,
        "text": "Write a function to add two numbers.",
        "code": "def add(a, b):\n    return a + b",
        "test_list": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"],
        "test_setup_code": "",
        "challenge_test_list": [],
    },
]

HUMANEVAL = [
    {
        "task_id": "HumanEval/0",
        "entry_point": "add",
        "prompt": 'def add(x: int, y: int) -> int:\n    """Add two numbers."""\n',
        "canonical_solution": "    return x + y\n",
        "test": "METADATA = {}\n\n\ndef check(candidate):\n    assert candidate(2, 3) == 5\n"
        "    assert candidate(0, 0) == 0, 'zero'\n    assert True\n",
    },
    {
        "task_id": "HumanEval/1",
        "entry_point": "words",
        "prompt": 'def words(s: str) -> list:\n    """Split s on spaces."""\n',
        "canonical_solution": "    return s.split()\n",
        "test": "def check(candidate):\n    assert candidate('a b') == ['a', 'b']\n"
        "    assert candidate('') == []\n",
    },
    {
        "task_id": "HumanEval/2",
        "entry_point": "half",
        "prompt": 'def half(x: float) -> float:\n    """Half of x."""\n',
        "canonical_solution": "    return x / 2\n",
        "test": "def check(candidate):\n    assert abs(candidate(3.0) - 1.5) < 1e-6\n",
    },
]

IFEVAL = [
    {
        "key": 1000,
        "prompt": "Write a short note about the sea. Do not use any commas.",
        "instruction_id_list": ["punctuation:no_comma", "length_constraints:number_words"],
        "kwargs": [{}, {"relation": "less than", "num_words": 40}],
    },
    {
        "key": 1001,
        "prompt": "Describe a fox in lowercase letters and mention the word moon.",
        "instruction_id_list": ["change_case:english_lowercase", "keywords:existence"],
        "kwargs": [{}, {"keywords": ["moon"]}],
    },
    {
        "key": 1002,
        "prompt": "Write a poem with a title in double angular brackets, "
        "ending with: Is there anything else?",
        "instruction_id_list": ["detectable_format:title", "startend:end_checker"],
        "kwargs": [{}, {"end_phrase": "Is there anything else?"}],
    },
]
IFEVAL_UNKNOWN = [
    {
        "key": 2000,
        "prompt": "Start your answer with Bonjour.",
        # An id IFEval's own registry leaves disabled: no rule of ours maps it.
        "instruction_id_list": ["multi-turn:constrained_start"],
        "kwargs": [{"starter": "Bonjour"}],
    },
]

_BUGGY = "def total(xs):\n    s = 0\n    for x in xs[1:]:\n        s += x\n    return s\n"
_PATCH = (
    "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,5 +1,5 @@\n def total(xs):\n"
    "     s = 0\n-    for x in xs[1:]:\n+    for x in xs:\n         s += x\n     return s\n"
)
SWE = [
    {
        "instance_id": "acme__calc-1",
        "repo": "acme/calc",
        "base_commit": "abc123",
        "problem_statement": "total() skips the first item of the list.",
        "patch": _PATCH,
        "files": [{"path": "calc.py", "content": _BUGGY}],
    },
    {
        "instance_id": "acme__calc-3",
        "repo": "acme/calc",
        "base_commit": "abc125",
        "problem_statement": "total() should add every item.",
        "patch": _PATCH.replace("s += x", "s = s + x"),
        "files": [{"path": "calc.py", "content": _BUGGY.replace("s += x", "s = s + x")}],
    },
    {
        "instance_id": "acme__calc-2",
        "repo": "acme/calc",
        "base_commit": "abc124",
        "problem_statement": "A broken patch.",
        "patch": "not a diff at all",
        "files": [],
    },
]

GENERIC = [
    {"uid": "g1", "query": "What is 6 times 7?", "final": "42", "difficulty": "easy"},
    {"uid": "g2", "query": "What is 12 squared?", "final": "144", "difficulty": "hard"},
    {"uid": "g3", "query": "What is 9 plus 10?", "final": "19", "difficulty": "easy"},
]

FIXTURES = {
    "gsm8k/train": GSM8K_TRAIN,
    "gsm8k/test": GSM8K_TEST,
    "math/train": MATH,
    "mbpp/train": MBPP,
    "humaneval/test": HUMANEVAL,
    "ifeval/train": IFEVAL,
    "ifeval_unknown/train": IFEVAL_UNKNOWN,
    "swe/train": SWE,
    "generic/train": GENERIC,
}


def main() -> None:
    for name, rows in FIXTURES.items():
        out = HERE / name
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.with_suffix(".jsonl").open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        pq.write_table(pa.Table.from_pylist(rows), out.with_suffix(".parquet"))


if __name__ == "__main__":
    main()
