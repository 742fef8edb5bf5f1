"""Finding what a site should never store in what visitors type: card numbers, e-mail
addresses, phone numbers, and whatever a site adds. Pure functions over text; which kinds a
turn scrubs and the site's own rules are read by ``conversations.redaction.Scrubber``.

A card number is 12 to 19 digits, written together or in groups split by one space, dash or
dot (each group but the last of four digits or more), starting as a card network's numbers start (2 to
6), that passes the Luhn check: an order or invoice number rarely does all of these. A phone number is an international one (``+`` or
``00`` first) or a national one with a trunk ``0`` or North American parentheses, of 8 to 15
digits.
"""

import re

# Digits, each group split from the next by one separator at most; the lookarounds keep a longer
# run of digits (or a decimal number, or a word, or an identifier such as ORD-2022-…) from being
# cut into a card number.
_CARD = re.compile(r"(?<!\w)(?<!\d[.,])(?<!\w-)[2-6](?:[ .\-]?\d){11,18}(?!\w)(?![.,-]\d)")
_SEPARATOR = re.compile(r"[ .\-]")
# RFC 5322's atext (the local part) and labels of letters, digits and hyphens (the domain),
# any Unicode letter included.
_EMAIL = re.compile(r"(?<![\w!#$%&'*+/=?^`{|}~.-])[\w!#$%&'*+/=?^`{|}~-]+(?:\.[\w!#$%&'*+/=?^`{|}~-]+)*"
                    r"@(?:[^\W_](?:[\w-]{0,61}[^\W_])?\.)+(?:[^\W\d_]{2,63}|[Xx][Nn]--[\w-]{1,59})(?![\w-])")
_PHONE = re.compile(r"(?<![\w+])(?:(?:\+|00)[1-9](?:[ .\-/]?\(?\d\)?){7,14}"
                    r"|\(\d{3}\)[ .\-]?\d{3}[ .\-]?\d{4}"
                    r"|0\d{1,4}(?:[ .\-/]?\d){6,10})(?!\w)(?![.,-]\d)")

KINDS = ("card", "email", "phone")


def luhn_valid(digits):
    """Whether the string of ``digits`` passes the Luhn check."""
    total = 0
    for position, char in enumerate(reversed(digits)):
        value = ord(char) - 48
        if position % 2:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


def _is_card(text):
    """Whether ``text`` (digits, maybe in groups) is a card number: 12 to 19 digits passing Luhn,
    each group but the last (when grouped) of 4 digits or more, as every card prints them (an
    order number such as 111-2222222-3333333 or 2026-12-05-0042 is not)."""
    digits = re.sub(r"\D", "", text)
    groups = _SEPARATOR.split(text)
    return 12 <= len(digits) <= 19 and all(len(group) >= 4 for group in groups[:-1]) and luhn_valid(digits)


def _cards(text, marker, found):
    """``text`` with every card number in it replaced by ``marker``. A run of digit groups may
    hold a card number and more (the next number, spaced the same way): the longest run of
    whole groups from its start that is a card number is one, else (after a space: a dash or a
    dot joins one identifier) the run from its second group on is looked at again."""
    def swap(match):
        run = match.group()
        cuts = [m.start() for m in _SEPARATOR.finditer(run)]
        for end in [len(run), *reversed(cuts)]:
            if _is_card(run[:end]):
                found["card"] = found.get("card", 0) + 1
                return marker + _cards(run[end:], marker, found)
        if cuts and run[cuts[0]] == " ":  # a number before the card ("2 4111 1111 …"), not a part of one
            return run[:cuts[0]] + _cards(run[cuts[0]:], marker, found)
        return run
    return _CARD.sub(swap, text)


def scrub(text, kinds, markers, extra=()):
    """``text`` with each of ``kinds`` ("card", "email", "phone") replaced by its ``markers[kind]``,
    then each of ``extra`` applied (callables taking and returning text), and how many were
    replaced per kind: ``(text, {kind: n})``."""
    found = {}
    if not text:
        return text, found

    def replace(kind):
        def swap(match):
            found[kind] = found.get(kind, 0) + 1
            return markers[kind]
        return swap

    if "card" in kinds:
        text = _cards(text, markers["card"], found)
    if "email" in kinds:
        text = _EMAIL.sub(replace("email"), text)
    if "phone" in kinds:
        text = _PHONE.sub(replace("phone"), text)
    for rule in extra:
        changed = rule(text)
        if changed != text:
            found["site"] = found.get("site", 0) + 1
            text = changed
    return text, found
