"""What a run will see of its corpus: tokens to see and passes over it, against the paper's (Table 6)."""

from __future__ import annotations

# The paper's passes over its 3.3B-token corpus: ELECTRA-Small 1M steps x 128 x 128 = 16.4B tokens (~5
# passes), ELECTRA-Base 766k x 256 x 512 = 100B (~30) (Table 6). Far above that, examples repeat so often that
# results stop reflecting the paper's regime.
PAPER_PASSES = {"ELECTRA-Small": 5, "ELECTRA-Base": 30}
PASSES_WARNING = 50.0


def count(n: float) -> str:
    """A count of tokens in the unit its size calls for: 950, 49.2k, 60.0M, 16.4B."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if round(abs(n) / scale, 1) >= 1:
            return f"{n / scale:.1f}{unit}"
    return f"{n:.0f}"


def corpus_budget(corpus_tokens: int, num_examples: int, max_steps: int, global_batch: int,
                  max_seq_length: int) -> dict[str, float]:
    """The corpus's size and how often a run of `max_steps` steps of `global_batch` sequences goes over it.

    Tokens seen = steps x global batch x sequence length, the paper's accounting (padding included);
    `corpus/passes` divides it by the corpus's word pieces; `corpus/example_epochs` counts the permutations of
    the examples the loader walks through.
    """
    seen = max_steps * global_batch * max_seq_length
    return {
        "corpus/tokens": corpus_tokens,
        "corpus/examples": num_examples,
        "corpus/tokens_to_see": seen,
        "corpus/passes": seen / max(corpus_tokens, 1),
        "corpus/example_epochs": max_steps * global_batch / max(num_examples, 1),
    }


def passes_warning(budget: dict[str, float]) -> str | None:
    """A warning when the run would pass over its corpus far more often than the paper did, else None."""
    passes = budget["corpus/passes"]
    if passes <= PASSES_WARNING:
        return None
    paper = ", ".join(f"~{v} for {k}" for k, v in PAPER_PASSES.items())
    return (
        f"this run sees {count(budget['corpus/tokens_to_see'])} tokens of a {count(budget['corpus/tokens'])}-"
        f"token corpus: {passes:.0f} passes over it, against the paper's {paper} over 3.3B tokens (section 3.1). "
        "Examples repeat that often, so results may not reflect the paper's. Use a larger corpus "
        "(data=text_files data.paths=[...] or data=hf_dataset data.name=...), or fewer trainer.max_steps."
    )
