"""Card numbers and e-mail addresses are found wherever a visitor writes them, however they are
written; an order or invoice number is (almost) never taken for one."""

import random
import re

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from conversations.core.scrub import luhn_valid, scrub

MARKERS = {"card": "[card]", "email": "[email]", "phone": "[phone]"}
ALL = ("card", "email", "phone")

# Card networks' numbers: (first digits, length, grouping of the printed card).
NETWORKS = [
    ("4", 16, (4, 4, 4, 4)),  # Visa
    ("4", 13, (4, 4, 5)),  # Visa, the old 13-digit numbers
    ("4", 19, (4, 4, 4, 4, 3)),  # Visa, 19 digits
    ("51", 16, (4, 4, 4, 4)),  # Mastercard
    ("2221", 16, (4, 4, 4, 4)),  # Mastercard, the 2-series
    ("34", 15, (4, 6, 5)),  # American Express
    ("37", 15, (4, 6, 5)),  # American Express
    ("36", 14, (4, 6, 4)),  # Diners Club
    ("6011", 16, (4, 4, 4, 4)),  # Discover
    ("65", 16, (4, 4, 4, 4)),  # Discover
    ("3528", 16, (4, 4, 4, 4)),  # JCB
    ("62", 19, (6, 13)),  # UnionPay, 19 digits
    ("5018", 12, (4, 4, 4)),  # Maestro, 12 digits
    ("6759", 18, (4, 4, 4, 4, 2)),  # Maestro, 18 digits
]
# How visitors write them: the 20 formats.
FORMATS = [
    lambda groups: "".join(groups),
    lambda groups: " ".join(groups),
    lambda groups: "-".join(groups),
    lambda groups: ".".join(groups),
    lambda groups: "".join(g + ("-" if i % 2 else " ") for i, g in enumerate(groups))[:-1],  # mixed
    lambda groups: " ".join(groups[:1]) + " " + "".join(groups[1:]),  # the first group apart
    lambda groups: "".join(groups[:-1]) + " " + groups[-1],  # the last group apart
    lambda groups: " ".join(groups[:2]) + "-" + "-".join(groups[2:]),  # spaces, then dashes
    lambda groups: "card: " + "".join(groups),
    lambda groups: "(" + " ".join(groups) + ")",
    lambda groups: "“" + "-".join(groups) + "”",
    lambda groups: "number " + " ".join(groups) + ", expiry 12/29",
    lambda groups: "#" + "".join(groups),
    lambda groups: "cc=" + "".join(groups) + "&cvv=123",
    lambda groups: "\n" + " ".join(groups) + "\n",
    lambda groups: "it is " + "".join(groups) + ".",
    lambda groups: "<" + "-".join(groups) + ">",
    lambda groups: "'" + ".".join(groups) + "'",
    lambda groups: "\t" + " ".join(groups) + "\t",
    lambda groups: "N°" + " ".join(groups) + "!",
]


def card_number(prefix, length, rng):
    """A number of ``length`` digits starting with ``prefix`` whose last digit makes it pass Luhn."""
    body = prefix + "".join(rng.choice("0123456789") for _ in range(length - len(prefix) - 1))
    check = next(d for d in "0123456789" if luhn_valid(body + d))
    return body + check


def grouped(number, grouping):
    groups, start = [], 0
    for size in grouping:
        groups.append(number[start:start + size])
        start += size
    return groups


@settings(max_examples=300, deadline=None)
@given(network=st.sampled_from(NETWORKS), written=st.sampled_from(FORMATS), seed=st.integers(),
       before=st.text(alphabet="abc xyz,:;!?", max_size=20), after=st.text(alphabet="abc xyz,:;!?", max_size=20))
def test_every_valid_card_number_is_replaced_in_any_of_twenty_formats(network, written, seed, before, after):
    prefix, length, grouping = network
    number = card_number(prefix, length, random.Random(seed))
    text = f"{before} {written(grouped(number, grouping))} {after}"

    scrubbed, found = scrub(text, ALL, MARKERS)

    assert found.get("card") == 1, (text, scrubbed)
    assert number not in re.sub(r"\D", "", scrubbed)
    assert not re.search(r"\d{4}[ .-]?\d{4}[ .-]?\d{4}", scrubbed), scrubbed


def test_the_well_known_test_cards_are_replaced_and_a_near_miss_is_not():
    for number in ("4111 1111 1111 1111", "5500-0000-0000-0004", "3400 000000 00009", "6011000000000004",
                   "3530111333300000", "4222222222222"):
        assert scrub(f"my card is {number}", ALL, MARKERS)[0] == "my card is [card]"
    assert scrub("my card is 4111 1111 1111 1112", ALL, MARKERS)[0] == "my card is 4111 1111 1111 1112"


ORDER_NUMBER = st.one_of(
    st.from_regex(r"\A(ORD|INV|PO|SO)-20[0-9]{2}-[0-9]{4,8}\Z"),  # ORD-2026-000123
    st.from_regex(r"\A#?[0-9]{5,11}\Z"),  # #123456789
    st.from_regex(r"\A[A-Z]{2}[0-9]{9}[A-Z]{2}\Z"),  # a parcel: RR123456789DE
    st.from_regex(r"\A20[0-9]{2}-[01][0-9]-[0-3][0-9]-[0-9]{3,4}\Z"),  # dated: 2026-12-05-0042
    st.from_regex(r"\A[0-9]{3}-[0-9]{7}-[0-9]{7}\Z"),  # a marketplace's 111-2222222-3333333
    st.from_regex(r"\A1Z[0-9A-Z]{16}\Z"),  # a courier's tracking number
)


@settings(max_examples=500, deadline=None)
@given(order=ORDER_NUMBER)
def test_order_invoice_and_tracking_numbers_are_kept(order):
    text = f"Where is order {order}?"
    assert scrub(text, ("card", "email"), MARKERS) == (text, {})


def test_few_long_random_numbers_are_taken_for_cards():
    """A 16-digit reference that happens to look like a card: only one starting as cards do (2-6)
    and passing Luhn is taken, about one in twenty."""
    rng = random.Random(44)
    numbers = ["".join(rng.choice("0123456789") for _ in range(16)) for _ in range(5000)]
    taken = sum(1 for number in numbers if scrub(f"ref {number}", ("card",), MARKERS)[1])
    assert taken / len(numbers) < 0.06


@settings(max_examples=300, deadline=None)
@given(address=st.emails(), before=st.sampled_from(["", "mail me at ", "(", "<", "email: "]),
       after=st.sampled_from(["", " please", ")", ">", ".", ", thanks"]))
def test_every_email_address_is_replaced(address, before, after):
    assume(not address[-1] in ".-")
    scrubbed, found = scrub(f"{before}{address}{after}", ALL, MARKERS)
    assert found.get("email") == 1 and "@" not in scrubbed, scrubbed
    assert scrubbed == f"{before}[email]{after}"


def test_phone_numbers_in_the_common_forms_are_replaced_and_prices_and_dates_are_not():
    for number in ("+44 20 7946 0958", "+1 (212) 555-0187", "0044 20 7946 0958", "(212) 555-0187",
                   "0612 345 678", "030/1234567", "+34 612 34 56 78"):
        assert scrub(f"call {number} today", ("phone",), MARKERS)[0] == "call [phone] today", number
    for text in ("it costs 1299.00 euros", "on 2026-12-05 at 14:30", "order 12345678", "version 10.4.2"):
        assert scrub(text, ("phone",), MARKERS) == (text, {})


def test_only_the_kinds_asked_for_are_replaced_and_a_sites_own_rule_runs_after():
    text = "4111 1111 1111 1111, ana@example.com, +44 20 7946 0958, member M-99812"

    assert scrub(text, ("email",), MARKERS)[0] == "4111 1111 1111 1111, [email], +44 20 7946 0958, member M-99812"
    scrubbed, found = scrub(text, ALL, MARKERS, extra=[lambda t: re.sub(r"M-\d+", "[member]", t)])
    assert scrubbed == "[card], [email], [phone], member [member]"
    assert found == {"card": 1, "email": 1, "phone": 1, "site": 1}
