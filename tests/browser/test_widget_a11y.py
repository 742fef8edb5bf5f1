"""An accessibility audit of the widget in every state it can be in, with axe-core (bundled in
axe-playwright-python, so nothing is fetched at test time), plus what a rule engine cannot see.

The API is scripted (tests/browser/scripted.py) so each state stays put while it is audited; the
page, its strings and their translations come from the live server as a visitor gets them.
"""

import pytest
from axe_playwright_python.sync_playwright import Axe
from playwright.sync_api import expect

from conversations.models import Assistant
from tests.browser.pages import open_host_page, settled
from tests.browser.scripted import QUESTION, USER, ScriptedApi, assistant, state, streaming, tool_call, tool_result

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDGET = "[data-conversations-widget]"
# WCAG 2.0, 2.1 and 2.2 at levels A and AA, and axe's best practices.
TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "wcag22aa", "best-practice"]
# Minor findings that stay, each with its reason in docs/widget.md ("Accessibility audit"). None.
ACCEPTED_MINOR = set()

ANSWER = "It is **14:05** in Tokyo.\n\n- Japan has one time zone\n- no daylight saving time"
CUT_SHORT = "The answer was cut short because it reached the length limit."
FAILED = "The model service is not available right now. Please try again in a minute."


def audit(page):
    """axe-core's violations on the widget: a list of (rule, impact, elements)."""
    settled(page)
    results = Axe().run(page, context={"include": [[WIDGET]]},
                        options={"runOnly": {"type": "tag", "values": TAGS}, "resultTypes": ["violations"]})
    return [(v["id"], v["impact"], len(v["nodes"])) for v in results.response["violations"]]


def sent(chat, api):
    chat.send(QUESTION)
    expect(chat.locator(".cvw-stop")).to_be_visible()


def shown(chat, api, turn_state, text):
    sent(chat, api)
    api.state = turn_state
    expect(chat.locator(".cvw-log")).to_contain_text(text)


def idle(chat, api):
    expect(chat.locator(".cvw-send")).to_be_enabled()


def sending(chat, api):
    api.hold = True
    chat.send(QUESTION)
    expect(chat.locator(".cvw-pending")).to_have_text(QUESTION)


def waiting(chat, api):
    sent(chat, api)
    expect(chat.locator(".cvw-status")).to_have_text("The assistant is thinking…")


def growing(chat, api):
    shown(chat, api, state("running", streaming("It is **14:05** in Tokyo.\n\n- Japan has"), version=2), "Japan has")


def tool_step(chat, api):
    shown(chat, api, state("running", assistant("", tool_calls=[tool_call(city="Tokyo")]),
                           tool_result("2025-01-01T14:05:00+09:00"), version=3), "current_time: 2025")


def completed(chat, api):
    shown(chat, api, state("completed", assistant(ANSWER), version=3), "no daylight saving time")
    expect(chat.locator(".cvw-send")).to_be_enabled()


def incomplete(chat, api):
    shown(chat, api, state("incomplete", assistant("It is 14:05"), error=CUT_SHORT, version=3), CUT_SHORT)


def failed(chat, api):
    shown(chat, api, state("failed", error=FAILED, version=3), FAILED)


def cancelled(chat, api):
    sent(chat, api)
    chat.locator(".cvw-stop").click()
    api.state = state("cancelled", version=3)
    expect(chat.locator(".cvw-notice")).to_have_text("You stopped this answer.")


def refused(chat, api):
    api.refusal = (429, {"detail": "Too many messages. Try again in 20 seconds."})
    chat.send(QUESTION)
    expect(chat.locator(".cvw-status")).to_have_text("Too many messages. Try again in 20 seconds.")


def restored(chat, api):
    completed(chat, api)
    api.transcript = [{**USER, "turn": 41}, {**assistant(ANSWER), "turn": 41}]
    chat.page.reload()
    expect(chat.locator(".cvw-msg-assistant")).to_contain_text("no daylight saving time")


def launcher_closed(chat, api):
    open_host_page(chat, '{% chat_widget mode="launcher" %}')
    expect(chat.locator(".cvw-launcher")).to_have_attribute("aria-expanded", "false")


def launcher_open(chat, api):
    launcher_closed(chat, api)
    chat.locator(".cvw-launcher").click()
    shown(chat, api, state("completed", assistant(ANSWER), version=3), "no daylight saving time")


def rated(chat, api):
    completed(chat, api)
    chat.page.get_by_role("button", name="Helpful", exact=True).click()
    expect(chat.locator(".cvw-comment-input")).to_be_visible()
    expect(chat.locator(".cvw-rate-said")).to_have_text("Thanks for your feedback.")


def greeted(chat, api):
    Assistant.objects.create(slug="support", name="Support", provider="demo", system_prompt="You are Support.",
                             greeting="Hi! Ask me about refunds.",
                             suggestions=["How do refunds work?", "Where is my order?"])
    open_host_page(chat, '{% chat_widget assistant="support" %}')
    expect(chat.locator(".cvw-suggestion")).to_have_count(2)


STATES = {"idle": idle, "sending": sending, "waiting": waiting, "growing answer": growing, "tool step": tool_step,
          "completed": completed, "incomplete": incomplete, "failed": failed, "cancelled": cancelled,
          "error shown": refused, "restored after a reload": restored, "launcher closed": launcher_closed,
          "launcher open": launcher_open, "answer rated": rated, "greeting and suggestions": greeted}


def assert_passes(page, name):
    violations = audit(page)
    print(f"\naxe {name}: {violations}")
    assert [v for v in violations if v[1] in {"serious", "critical"}] == []
    assert {v[0] for v in violations} <= ACCEPTED_MINOR, violations


@pytest.mark.parametrize("name", STATES)
def test_the_widget_passes_the_audit(name, chat_page):
    chat = chat_page()
    api = ScriptedApi(chat.page)
    chat.open()
    STATES[name](chat, api)
    assert_passes(chat.page, name)


def test_the_audit_sees_inside_the_widgets_shadow_root(chat_page):
    chat = chat_page().open()
    chat.locator(".cvw-log").evaluate("log => log.appendChild(document.createElement('img')).src = '/x.png'")
    assert ("image-alt", "critical", 1) in audit(chat.page)


def test_the_audit_waits_for_a_fade_inside_the_widgets_shadow_root(chat_page):
    """A message fading in is half transparent; the audit must wait for the fade to end. The
    widget's animations live in its shadow root, which document.getAnimations() does not see:
    a CI run audited a failed turn's message mid-fade (color-contrast, serious)."""
    chat = chat_page().open()
    chat.locator(".cvw-log").evaluate("""log => log.appendChild(document.createElement('p'))
        .animate([{opacity: 0}, {opacity: 1}], {duration: 1500})""")
    fading = "log => log.getRootNode().getAnimations().filter(a => a.effect.getComputedTiming().iterations === 1)"
    assert chat.locator(".cvw-log").evaluate(f"log => ({fading})(log).map(a => a.playState)") == ["running"]
    settled(chat.page)
    assert chat.locator(".cvw-log").evaluate(f"log => ({fading})(log).length") == 0


@pytest.mark.parametrize("mode", ["inline", "launcher"])
def test_the_sign_in_message_of_a_site_for_signed_in_visitors_passes_the_audit(mode, chat_page,
                                                                               conversations_settings):
    conversations_settings.update(LOGIN_REQUIRED=True)
    chat = chat_page()
    open_host_page(chat, f'{{% chat_widget mode="{mode}" %}}')
    link = chat.page.get_by_role("link", name="Sign in to chat with the assistant.")
    if mode == "launcher":
        chat.locator(".cvw-launcher").click()
        expect(link).to_be_focused()
    expect(link).to_be_visible()
    assert_passes(chat.page, f"sign-in ({mode})")


def test_the_widget_passes_the_audit_in_spanish(chat_page):
    chat = chat_page(locale="es-ES")
    api = ScriptedApi(chat.page)
    chat.open()
    chat.send(QUESTION)
    expect(chat.locator(".cvw-stop")).to_have_text("Detener")
    api.state = state("incomplete", assistant("Son las 14:05"), error="La respuesta se cortó.", version=3)
    expect(chat.locator(".cvw-notice")).to_have_text("La respuesta se cortó.")
    assert_passes(chat.page, "Spanish")


# -- what a rule engine does not see -------------------------------------------------------------

FOCUSED = """() => { let at = document.activeElement;
    while (at && at.shadowRoot && at.shadowRoot.activeElement) { at = at.shadowRoot.activeElement; }
    return at.getAttribute("href") || at.className; }"""
KEYBOARD_PAGE = '<a href="#before">Before</a>{% chat_widget mode="launcher" %}<a href="#after">After</a>'
LONG_ANSWER = "\n\n".join(f"Paragraph {n}: " + "about the time in Tokyo, " * 6 for n in range(12))


def tab_through(page, stop_at, limit=12):
    """Press Tab until focus is on ``stop_at``; return what focus passed through (no trap: it gets there)."""
    seen = []
    while not seen or seen[-1] != stop_at:
        assert len(seen) < limit, f"focus never reached {stop_at}: {seen}"
        page.keyboard.press("Tab")
        seen.append(page.evaluate(FOCUSED))
    return seen


def test_keyboard_only_from_reaching_the_launcher_to_reading_an_answer_and_stopping_a_turn(chat_page):
    chat = chat_page()
    api = ScriptedApi(chat.page)
    open_host_page(chat, KEYBOARD_PAGE)
    page = chat.page
    # Closed, the widget is one stop between the page's links.
    assert tab_through(page, "#after") == ["#before", "cvw-launcher", "#after"]
    page.keyboard.press("Shift+Tab")
    page.keyboard.press("Enter")
    expect(chat.locator(".cvw-input")).to_be_focused()

    page.keyboard.type(QUESTION)
    page.keyboard.press("Enter")
    api.state = state("running", streaming("It is"), version=2)
    expect(chat.locator(".cvw-msg-assistant")).to_have_text("It is")
    # Send is disabled while the turn runs, so Stop comes next, then deleting the conversation,
    # then the page goes on: no trap.
    assert tab_through(page, "#after") == ["cvw-stop", "cvw-delete", "#after"]
    page.keyboard.press("Shift+Tab")
    page.keyboard.press("Shift+Tab")
    page.keyboard.press("Enter")
    api.state = state("cancelled", assistant("It is", id=2), version=3)
    expect(chat.locator(".cvw-notice")).to_have_text("You stopped this answer.")
    assert api.cancels == 1
    expect(chat.locator(".cvw-input")).to_be_focused()  # Stop went away; focus is where one types

    api.state = state("completed", assistant(LONG_ANSWER, id=4), version=5)
    page.keyboard.type("Tell me more")
    page.keyboard.press("Enter")
    expect(chat.locator(".cvw-msg-assistant").last).to_contain_text("Paragraph 11")
    expect(chat.locator(".cvw-input")).to_be_focused()
    # Back past the thumbs of both answers, the stopped one's too (rating is a keystroke away), to
    # the log, which scrolls with the keyboard.
    page.keyboard.press("Shift+Tab")
    assert page.evaluate(FOCUSED) == "cvw-thumb cvw-thumb-down"
    for _ in range(4):
        page.keyboard.press("Shift+Tab")
    assert page.evaluate(FOCUSED) == "cvw-log"
    log = chat.locator(".cvw-log")
    page.keyboard.press("Home")
    page.wait_for_function("() => document.querySelector('conversations-widget').shadowRoot"
                           ".querySelector('.cvw-log').scrollTop === 0")
    page.keyboard.press("End")
    page.wait_for_function("""() => { const log = document.querySelector('conversations-widget').shadowRoot
        .querySelector('.cvw-log'); return log.scrollTop > 0 && log.scrollTop + log.clientHeight >= log.scrollHeight - 1; }""")
    assert log.evaluate("log => log.scrollHeight > log.clientHeight")
    # The whole open panel in focus order, then out of it.
    page.keyboard.press("Shift+Tab")
    page.keyboard.press("Shift+Tab")
    assert page.evaluate(FOCUSED) == "cvw-launcher"
    assert tab_through(page, "#after") == ["cvw-close", "cvw-log", *["cvw-thumb cvw-thumb-up", "cvw-thumb cvw-thumb-down"] * 2,
                                           "cvw-input", "cvw-send", "cvw-delete", "#after"]
    chat.locator(".cvw-input").focus()
    page.keyboard.press("Escape")
    expect(chat.locator(".cvw-panel")).to_be_hidden()
    assert page.evaluate(FOCUSED) == "cvw-launcher"


WIDE_ANSWER = ("A link: https://example.com/" + "a" * 120 + "\n\n" + "Unbroken" * 30 + "\n\n```\n" + "x = 1; " * 40
               + "\n```")

# (viewport, device scale): 320 CSS px (WCAG's reflow width), and a 1280×800 window at 200 % zoom.
SIZES = {"320 px": ({"width": 320, "height": 640}, 1), "200 % zoom": ({"width": 640, "height": 400}, 2)}


@pytest.mark.parametrize("mode", ["inline", "launcher"])
@pytest.mark.parametrize("size", SIZES)
def test_the_widget_reflows_without_horizontal_scrolling(size, mode, chat_page):
    viewport, scale = SIZES[size]
    chat = chat_page(viewport=viewport, device_scale_factor=scale)
    api = ScriptedApi(chat.page)
    open_host_page(chat, f'{{% chat_widget mode="{mode}" %}}')
    if mode == "launcher":
        chat.locator(".cvw-launcher").click()
    chat.send(QUESTION)
    api.state = state("completed", assistant(WIDE_ANSWER), version=3)
    expect(chat.locator(".cvw-msg-assistant")).to_contain_text("Unbroken")
    sizes = chat.page.evaluate("""() => {
        const root = document.querySelector('conversations-widget').shadowRoot, panel = root.querySelector('.cvw-panel');
        const log = root.querySelector('.cvw-log'), box = panel.getBoundingClientRect();
        return {page: document.documentElement.scrollWidth, window: innerWidth, left: box.left, right: box.right,
                log: log.scrollWidth - log.clientWidth}; }""")
    assert sizes["page"] <= sizes["window"], sizes  # the page does not scroll sideways
    assert 0 <= sizes["left"] and sizes["right"] <= sizes["window"], sizes
    assert sizes["log"] <= 0, sizes  # long links and words wrap; only the code block scrolls, inside itself
    for control in (".cvw-input", ".cvw-send"):
        chat.locator(control).scroll_into_view_if_needed()
        expect(chat.locator(control)).to_be_in_viewport(ratio=1)


EDGES = r"""(selectors) => { const root = document.querySelector('conversations-widget').shadowRoot;
    return Object.fromEntries(selectors.map(s => { const style = getComputedStyle(root.querySelector(s));
        return [s, [style.borderTopStyle, style.borderTopWidth, style.borderTopColor]]; })); }"""


def test_borders_and_focus_rings_stay_visible_in_forced_colours(chat_page):
    chat = chat_page(forced_colors="active")
    api = ScriptedApi(chat.page)
    open_host_page(chat, KEYBOARD_PAGE)
    assert chat.page.evaluate("matchMedia('(forced-colors: active)').matches")
    chat.locator(".cvw-launcher").click()
    chat.send(QUESTION)
    api.state = state("running", assistant("It is 14:05.", id=2), version=2)
    expect(chat.locator(".cvw-msg-assistant")).to_be_visible()
    edges = chat.page.evaluate(EDGES, [".cvw-launcher", ".cvw-panel", ".cvw-close", ".cvw-msg-user",
                                       ".cvw-msg-assistant", ".cvw-input", ".cvw-stop", ".cvw-send"])
    print(f"\nforced colours, borders: {edges}")
    for selector, (style, width, color) in edges.items():
        # Backgrounds are dropped in forced colours: each box and control needs a border of its own.
        assert style != "none" and float(width[:-2]) >= 1 and color not in {"transparent", "rgba(0, 0, 0, 0)"}, selector
    chat.locator(".cvw-input").focus()
    chat.page.keyboard.press("Tab")  # to Stop (Send is disabled), by keyboard: :focus-visible
    ring = chat.locator(".cvw-stop").evaluate(
        "b => { const s = getComputedStyle(b); return [s.outlineStyle, s.outlineWidth, s.outlineColor]; }")
    print(f"forced colours, focus ring: {ring}")
    assert ring[0] == "solid" and ring[1] == "3px" and ring[2] not in {"transparent", "rgba(0, 0, 0, 0)"}


CONTRAST = r"""() => {
  const root = document.querySelector('conversations-widget').shadowRoot;
  const rgb = c => c.match(/[\d.]+/g).map(Number);
  const lum = c => { const [r, g, b] = rgb(c).slice(0, 3).map(v => { v /= 255;
      return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); }); return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
  const background = el => { for (let at = el; at; at = at.parentElement || (at.getRootNode().host || null)) {
      const c = getComputedStyle(at).backgroundColor; if (rgb(c)[3] !== 0) { return c; } } return 'rgb(255, 255, 255)'; };
  const rows = [];
  root.querySelectorAll('*').forEach(el => {
    const own = [...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
    if (!own || !el.getClientRects().length || el.closest('.cvw-sr')) { return; }
    const style = getComputedStyle(el), fg = style.color, bg = background(el);
    const [a, b] = [lum(fg), lum(bg)].sort((x, y) => y - x);
    const size = parseFloat(style.fontSize), bold = Number(style.fontWeight) >= 700;
    rows.push({element: el.className || el.tagName.toLowerCase(), fg, bg, ratio: Math.round((a + 0.05) / (b + 0.05) * 100) / 100,
               large: size >= 24 || (bold && size >= 18.66), disabled: !!el.disabled});
  });
  return rows; }"""


def test_text_contrast_measured_from_computed_styles_meets_aa(chat_page):
    chat = chat_page()
    api = ScriptedApi(chat.page)
    open_host_page(chat, KEYBOARD_PAGE)
    chat.locator(".cvw-launcher").click()
    chat.send(QUESTION)
    expect(chat.locator(".cvw-status")).to_have_text("The assistant is thinking…")
    rows = chat.page.evaluate(CONTRAST)  # waiting: Stop, the disabled Send, the status line
    api.state = state("incomplete", assistant("", tool_calls=[tool_call(city="Tokyo")]),
                      tool_result("2025-01-01T14:05:00+09:00"), tool_result("no such city", call_id="call_2",
                                                                           id=4, is_error=True),
                      assistant("It is `14:05`, see [the clock](https://example.com/).\n\n```\nnow()\n```", id=5),
                      error=CUT_SHORT, version=3)
    expect(chat.locator(".cvw-notice")).to_have_text(CUT_SHORT)
    chat.page.get_by_role("button", name="Helpful", exact=True).click()  # the pressed thumb, the comment box, the thanks
    expect(chat.locator(".cvw-rate-said")).to_have_text("Thanks for your feedback.")
    api.refusal = (429, {"detail": "Too many messages. Try again in 20 seconds."})
    chat.send(QUESTION)
    expect(chat.locator(".cvw-status")).to_have_text("Too many messages. Try again in 20 seconds.")
    rows += chat.page.evaluate(CONTRAST)
    measured = {(r["element"], r["fg"], r["bg"]): r for r in rows}
    print("\n" + "\n".join(f"| {r['element']} | {r['fg']} | {r['bg']} | {r['ratio']} |" for r in measured.values()))
    elements = {r["element"] for r in measured.values()}
    stop = next(r for r in measured.values() if r["element"] == "cvw-stop")
    assert stop["bg"] == "rgb(138, 17, 17)"  # Stop is drawn in the danger colour, not the accent
    assert {"cvw-launcher", "cvw-title", "cvw-msg cvw-msg-user", "cvw-send", "cvw-stop", "cvw-status",
            "cvw-status cvw-status-problem", "cvw-label", "cvw-hint", "cvw-msg cvw-notice", "cvw-result",
            "cvw-result cvw-result-error", "a", "code", "cvw-thumb cvw-thumb-up", "cvw-thumb cvw-thumb-down", "label", "cvw-comment-send",
            "cvw-rate-said"} <= elements, elements
    for r in measured.values():
        if not r["disabled"]:
            assert r["ratio"] >= (3 if r["large"] else 4.5), r
