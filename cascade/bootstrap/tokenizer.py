"""Train the tiny model's tokenizer locally (nothing is downloaded).

A byte-level BPE with digits split one per token (arithmetic stays learnable), Qwen-style
chat special tokens, and a Jinja chat template that honours `enable_thinking` the way Qwen3's
does, so the runner renders prompts through `apply_chat_template` for both the tiny model and
a real Qwen3 checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from cascade.tools.template import TOOL_CHAT_TEMPLATE

PAD = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
SPECIAL_TOKENS = [PAD, IM_START, IM_END, THINK_OPEN, THINK_CLOSE]

# Same shape as Qwen3's template: without thinking, the generation prompt already holds an
# empty think block, so the completion is the answer itself.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<|im_start|>assistant\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{ '<think>\n\n</think>\n\n' }}"
    "{%- endif -%}"
    "{%- endif -%}"
)


def train_tokenizer(
    texts: Iterable[str], vocab_size: int = 384, single_tokens: Sequence[str] = ()
) -> PreTrainedTokenizerFast:
    """`single_tokens`: texts kept as one (non-special) token each, decoded as written, as Qwen3
    keeps its `<tool_call>` markers (they survive `skip_special_tokens`, which the turn loop's
    decode uses)."""
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    if single_tokens:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in single_tokens])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        eos_token=IM_END,
        bos_token=None,
        unk_token=None,
        additional_special_tokens=[IM_START, THINK_OPEN, THINK_CLOSE],
    )
    # The tool-aware superset (Qwen3's <tool_call>/<tool_response> convention): a conversation
    # without tools renders exactly as CHAT_TEMPLATE renders it (tests/unit/test_tools.py).
    fast.chat_template = TOOL_CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast
