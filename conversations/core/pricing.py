"""What a turn cost: its counted tokens at the prices of ``CONVERSATIONS["PRICES"]``.

Prices are per million tokens, input and output, per model name, in the site's currency, as
decimal strings (``{"gpt-4o-mini": {"input": "0.15", "output": "0.60"}}``). A turn's cost is
computed once, at its final write, and stored on the turn: a later change of prices does not
rewrite what earlier turns cost, and the admin's overview adds costs up with one ``SUM``. A
turn whose model has no price, or that counted no tokens, has no cost (NULL), and the overview
counts those turns apart rather than as free.
"""

from decimal import Decimal, InvalidOperation

MILLION = Decimal(1_000_000)
# Characters per token when a call ended without the provider's usage: about 4 for English text
# with the common tokenizers (fewer for other scripts, so the estimate errs low there, never high).
CHARS_PER_TOKEN = 4
# A cost is kept to 1e-8 of the currency unit: one token of the cheapest models costs ~1e-8.
COST_PLACES = Decimal("0.00000001")


def price_problem(entry):
    """Why ``entry`` (one model's price) cannot be used, as the end of a sentence, or None."""
    if not hasattr(entry, "keys") or set(entry.keys()) != {"input", "output"}:
        return 'must be {"input": …, "output": …}, with nothing else'
    for side in ("input", "output"):
        try:
            value = to_decimal(entry[side])
        except (InvalidOperation, TypeError, ValueError):
            return f"has an {side} price that is not a decimal number: {entry[side]!r}"
        if not value.is_finite() or value < 0:
            return f"has an {side} price that is not a number of at least 0: {entry[side]!r}"
    return None


def to_decimal(value):
    """A price as a ``Decimal``; a float goes through its shortest text form (0.15, not 0.1499…)."""
    if isinstance(value, bool):
        raise TypeError("a price is not a boolean")
    return Decimal(str(value)) if isinstance(value, float) else Decimal(value)


def price_of(model, prices):
    """``(input, output)`` per million tokens for ``model`` in ``prices`` (``PRICES``), or None when it has no (valid) price."""
    entry = prices.get(model)
    if entry is None or price_problem(entry):
        return None
    return to_decimal(entry["input"]), to_decimal(entry["output"])


def estimate_tokens(characters):
    """Tokens for ``characters`` of text, for a call that ended without its usage (rounded up:
    a call that sent anything was billed for something)."""
    return -(-int(characters) // CHARS_PER_TOKEN)


def turn_cost(model, input_tokens, output_tokens, prices):
    """The cost of ``input_tokens`` and ``output_tokens`` of ``model``, or None when the model has
    no price or no token was counted (a provider that reports no usage, or a turn stopped or
    failed before any reply): "free" (0) and "unknown" (None) stay apart."""
    price = price_of(model, prices)
    if price is None or not (input_tokens or output_tokens):
        return None
    cost = (Decimal(input_tokens or 0) * price[0] + Decimal(output_tokens or 0) * price[1]) / MILLION
    return cost.quantize(COST_PLACES)
