"""Rating an answer in the widget, against the live server, a real worker and the demo model:
thumbs up or down under each finished answer, then an optional comment, all by keyboard; the
rating is saved on the turn, can be changed, and is shown again after a reload."""


import pytest
from playwright.sync_api import expect

from conversations.models import Turn
from tests.support.fake_stream import openai_stream, streaming
from tests.support.fakes import FakeProvider
from tests.support.helpers import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

QUESTION = "What time is it in Tokyo?"




def answered(chat):
    chat.send(QUESTION)
    expect(chat.locator(".cvw-msg-assistant")).to_contain_text("in Tokyo")
    expect(chat.locator(".cvw-stop")).to_be_hidden()


def test_an_answer_is_rated_and_commented_by_keyboard_and_the_rating_survives_a_reload(chat_page, worker_process):
    worker_process(DEMO_DELAY=0.05)
    chat = chat_page().open()
    expect(chat.locator(".cvw-rate")).to_have_count(0)  # nothing to rate before an answer
    answered(chat)
    page = chat.page
    group = page.get_by_role("group", name="Rate this answer")
    up, down = group.get_by_role("button", name="Helpful", exact=True), group.get_by_role("button", name="Not helpful")
    expect(up).to_have_attribute("aria-pressed", "false")
    expect(down).to_have_attribute("aria-pressed", "false")
    expect(chat.locator(".cvw-comment")).to_be_hidden()  # a comment follows a thumb, not before

    up.focus()
    page.keyboard.press("Enter")
    expect(up).to_have_attribute("aria-pressed", "true")
    expect(chat.locator(".cvw-rate-said")).to_have_text("Thanks for your feedback.")
    turn = Turn.objects.get()
    assert (turn.rating, turn.rating_comment) == ("up", "")

    page.keyboard.press("Tab")  # past Not helpful …
    page.keyboard.press("Tab")  # … to the comment, labelled
    comment = page.get_by_role("textbox", name="Anything to add? (optional)")
    expect(comment).to_be_focused()
    page.keyboard.type("Clear and quick.")
    page.keyboard.press("Enter")
    wait_for(lambda: Turn.objects.get().rating_comment == "Clear and quick.")

    down.focus()
    page.keyboard.press("Space")  # changed: the comment stays
    expect(down).to_have_attribute("aria-pressed", "true")
    expect(up).to_have_attribute("aria-pressed", "false")
    wait_for(lambda: Turn.objects.get().rating == "down")
    assert Turn.objects.get().rating_comment == "Clear and quick."

    # A comment typed but not sent goes with the next thumb pressed rather than being dropped.
    comment.fill("Clear, but slow.")
    up.click()
    wait_for(lambda: Turn.objects.get().rating == "up")
    assert Turn.objects.get().rating_comment == "Clear, but slow."
    down.click()
    wait_for(lambda: Turn.objects.get().rating == "down")

    page.reload()
    expect(chat.locator(".cvw-msg-assistant")).to_contain_text("in Tokyo")
    expect(page.get_by_role("button", name="Not helpful")).to_have_attribute("aria-pressed", "true")
    expect(page.get_by_role("button", name="Helpful", exact=True)).to_have_attribute("aria-pressed", "false")
    expect(page.get_by_role("textbox", name="Anything to add? (optional)")).to_have_value("Clear, but slow.")


def test_each_answer_has_its_own_rating(chat_page, worker_process):
    worker_process(DEMO_DELAY=0.05)
    chat = chat_page().open()
    answered(chat)
    answered(chat)
    expect(chat.locator(".cvw-rate")).to_have_count(2)
    chat.locator(".cvw-rate").nth(1).get_by_role("button", name="Not helpful").click()
    expect(chat.locator(".cvw-rate").nth(1).locator(".cvw-rate-said")).to_have_text("Thanks for your feedback.")
    first, second = Turn.objects.order_by("enqueued_at")
    assert (first.rating, second.rating) == ("", "down")
    # Under its own answer: each rating follows the answer it rates.
    classes = chat.locator(".cvw-list > li").evaluate_all("items => items.map(i => i.className)")
    rates = [i for i, c in enumerate(classes) if c == "cvw-rate"]
    assert all("cvw-msg-assistant" in classes[i - 1] for i in rates), classes


def test_a_refused_rating_says_why_and_changes_nothing(chat_page, worker_process, conversations_settings):
    conversations_settings.update(RATING_RATE_PER_OWNER="1/min")  # the real server refuses the second
    worker_process(DEMO_DELAY=0.05)
    chat = chat_page().open()
    answered(chat)
    up = chat.page.get_by_role("button", name="Helpful", exact=True)
    down = chat.page.get_by_role("button", name="Not helpful")
    up.click()
    expect(up).to_have_attribute("aria-pressed", "true")
    down.click()
    too_fast = "You are rating answers too quickly. Please wait a moment and try again."
    expect(chat.locator(".cvw-rate-said")).to_contain_text(too_fast)
    expect(chat.locator(".cvw-sr")).to_contain_text(too_fast)  # read out, not only shown
    expect(up).to_have_attribute("aria-pressed", "true")  # the rating the server holds is still shown
    expect(down).to_have_attribute("aria-pressed", "false")
    assert Turn.objects.get().rating == "up"


def test_a_stopped_answer_can_be_rated_as_after_a_reload(chat_page, worker_process, conversations_settings):
    words = ["It ", "is ", "nine ", "in ", "the ", "morning ", "in ", "Tokyo, ", "and ", "sunny "]
    with FakeProvider() as fake:  # a word every 0.1 s, then silence until Stop shuts the call
        fake.add(streaming(openai_stream(pieces=words, done=False)[:len(words) + 1], interval=0.1, then="hang"))
        provider = {"PROVIDER": "openai", "BASE_URL": fake.url, "API_KEY": "sk-test", "MODEL": "fake-model"}
        conversations_settings.update(**provider)
        worker_process(**provider)
        chat = chat_page().open()
        chat.send(QUESTION)
        expect(chat.locator(".cvw-growing")).to_contain_text("It is nine")
        chat.locator(".cvw-stop").click()
        expect(chat.locator(".cvw-notice")).to_have_text("You stopped this answer.")
    expect(chat.page.get_by_role("group", name="Rate this answer")).to_have_count(1)
    chat.page.reload()
    expect(chat.locator(".cvw-msg-assistant")).to_contain_text("It is nine")
    expect(chat.page.get_by_role("group", name="Rate this answer")).to_have_count(1)
    assert Turn.objects.get().status == "cancelled"


def test_the_rating_controls_speak_spanish(chat_page, worker_process):
    worker_process(DEMO_DELAY=0.05)
    chat = chat_page(locale="es-ES").open()
    answered(chat)
    group = chat.page.get_by_role("group", name="Valora esta respuesta")
    group.get_by_role("button", name="Útil", exact=True).click()
    expect(chat.page.get_by_role("textbox", name="¿Algo que añadir? (opcional)")).to_be_visible()
    expect(chat.locator(".cvw-rate-said")).to_have_text("Gracias por tu opinión.")
    expect(group.get_by_role("button", name="No es útil")).to_have_attribute("aria-pressed", "false")
