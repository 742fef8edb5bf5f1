"""The widget speaks the visitor's language: every string comes through Django's translations."""

import json
import re

import pytest
from playwright.sync_api import expect

from conversations.templatetags.conversations import widget_strings
from tests.support.helpers import make_client


def rendered_strings(response):
    match = re.search(r'<script type="application/json">(.*?)</script>', response.content.decode())
    assert match, "the widget's strings are not on the page"
    return json.loads(match.group(1))


@pytest.mark.django_db
def test_widget_renders_in_spanish_for_a_spanish_visitor():
    page = make_client().get("/", HTTP_ACCEPT_LANGUAGE="es")
    strings = rendered_strings(page)
    assert strings["send"] == "Enviar"
    assert strings["label"] == "Tu mensaje"
    assert strings["stopped"] == "Has detenido esta respuesta."
    assert strings["timed_out"] == "El asistente no terminó a tiempo. Vuelve a intentarlo."


@pytest.mark.django_db
def test_every_widget_string_has_a_spanish_translation(conversations_settings):
    conversations_settings.update(WIDGET_RETENTION_NOTE=True, RETENTION_DAYS=30)  # the line is shown, so translated
    english = rendered_strings(make_client().get("/", HTTP_ACCEPT_LANGUAGE="en"))
    spanish = rendered_strings(make_client().get("/", HTTP_ACCEPT_LANGUAGE="es"))
    assert english.keys() == spanish.keys() == widget_strings().keys()
    # Only the strings made of placeholders alone read the same in both languages.
    same = {key for key in english if english[key] == spanish[key]}
    assert same == {"tool_result"}


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_spanish_visitor_sees_the_widget_and_the_servers_refusal_in_spanish(chat_page, conversations_settings):
    conversations_settings.update(MAX_MESSAGE_LENGTH=10)
    chat = chat_page(locale="es-ES").open()
    expect(chat.locator(".cvw-send")).to_have_text("Enviar")
    expect(chat.page.get_by_label("Tu mensaje")).to_be_visible()
    expect(chat.locator(".cvw-hint")).to_have_text("Intro envía, Mayús+Intro añade una línea.")
    text = "Un mensaje de más de diez caracteres."
    chat.locator(".cvw-input").evaluate("(box, text) => { box.maxLength = 1000; box.value = text; }", text)
    chat.locator(".cvw-send").click()
    expect(chat.locator(".cvw-status")).to_have_text(
        "El mensaje es demasiado largo: 37 caracteres, se permiten como máximo 10.")
    expect(chat.locator(".cvw-input")).to_have_value(text)
