"""Assistants in the admin: editing one (refused when it cannot work), which assistant and version
answered each turn, ratings on the turn list and page, the CSV export of rated turns, and the
overview per assistant and day, whose query count does not grow with the turns."""

import csv
import html
import io
import json
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from conversations.admin.export import csv_cell
from conversations.checks import check_config
from conversations.models import Assistant, AssistantVersion, Conversation, Message, Turn
from conversations.admin.overview import overview

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/conversations/turn/"
OVERVIEW = "/admin/conversations/assistant/overview/"


def make_assistant(slug, **fields):
    values = {"name": slug.title(), "system_prompt": f"You are {slug}.", "provider": "demo"}
    return Assistant.objects.create(slug=slug, **{**values, **fields})


def bulk_turns(assistant, specs, *, day=0):
    """Turns of ``assistant`` (None: the site's) enqueued ``day`` days ago, one per spec dict
    (``status``, ``duration`` s, ``margin_left``, ``rating``, ``tokens`` (in, out), ``cost``), in
    one INSERT."""
    conversation = Conversation.objects.create(owner_token="tok", assistant=assistant)
    start = timezone.localtime().replace(hour=12, minute=0) - timedelta(days=day)
    rows = []
    for spec in specs:
        tokens = spec.get("tokens", (100, 50))
        rows.append(Turn(conversation=conversation, assistant=assistant, status=spec.get("status", "completed"),
                         enqueued_at=start, started_at=start,
                         finished_at=start + timedelta(seconds=spec.get("duration", 2.0)),
                         job_timeout=120, deadline_margin=20, margin_left=spec.get("margin_left", 100.0),
                         input_tokens=tokens[0], output_tokens=tokens[1], cost=spec.get("cost"),
                         rating=spec.get("rating", ""), rating_comment=spec.get("comment", ""), model="gpt-test"))
    return Turn.objects.bulk_create(rows)


# -- editing an assistant ------------------------------------------------------------------------


def test_the_form_offers_the_sites_tools_and_credentials_and_refuses_what_cannot_work(admin_client,
                                                                                       conversations_settings):
    # Listed, so that the form tries it (an unlisted path is refused before any import).
    conversations_settings.update(CREDENTIALS={"support-key": "sk-1"}, ALLOWED_PROVIDERS=["no.such.Provider"])
    form = admin_client.get("/admin/conversations/assistant/add/").content.decode()
    assert 'value="current_time"' in form and 'value="search_faq"' in form
    assert '<option value="support-key">support-key</option>' in form
    # A new assistant starts with the site's provider and model, not the demo's canned answers.
    conversations_settings.update(PROVIDER="openai", MODEL="gpt-4o-mini")
    form = admin_client.get("/admin/conversations/assistant/add/").content.decode()
    assert 'name="provider" value="openai"' in form and 'name="model" value="gpt-4o-mini"' in form

    fields = {"name": "Support", "slug": "support", "active": "on", "system_prompt": "Be kind.",
              "provider": "no.such.Provider", "model": "", "base_url": "", "credential": "support-key",
              "tools": ["search_faq"], "greeting": "Hi!", "suggestions": "Refunds?\n\nShipping?\n",
              "access": "public", "versions-TOTAL_FORMS": "0", "versions-INITIAL_FORMS": "0"}
    refused = admin_client.post("/admin/conversations/assistant/add/", fields)
    assert refused.status_code == 200 and not Assistant.objects.exists()
    assert "its provider “no.such.Provider” cannot be used" in refused.content.decode()

    saved = admin_client.post("/admin/conversations/assistant/add/", {**fields, "provider": "openai"})
    assert saved.status_code == 302, saved.context["adminform"].form.errors
    support = Assistant.objects.get()
    assert (support.tools, support.suggestions, support.credential) == (["search_faq"], ["Refunds?", "Shipping?"],
                                                                      "support-key")


def test_the_form_sets_who_may_chat_and_refuses_a_permission_that_does_not_exist(admin_client):
    fields = {"name": "Audit", "slug": "audit", "active": "on", "system_prompt": "Be exact.", "provider": "demo",
              "model": "", "base_url": "", "credential": "", "greeting": "", "suggestions": "",
              "access": "permission", "access_permission": "conversations.audit_everything",
              "versions-TOTAL_FORMS": "0", "versions-INITIAL_FORMS": "0"}
    add = "/admin/conversations/assistant/add/"
    assert 'name="access"' in admin_client.get(add).content.decode()

    refused = admin_client.post(add, fields)
    assert refused.status_code == 200 and not Assistant.objects.exists()
    assert "Name an existing permission as app_label.codename." in refused.content.decode()

    saved = admin_client.post(add, {**fields, "access_permission": "conversations.view_turn"})
    assert saved.status_code == 302
    assert Assistant.objects.values_list("access", "access_permission").get() == ("permission",
                                                                                 "conversations.view_turn")


def test_the_form_refuses_a_chain_naming_an_unknown_provider_or_credential_and_saves_a_good_one(
        admin_client, conversations_settings):
    conversations_settings.update(CREDENTIALS={"support-key": "sk-support-secret", "backup-key": "sk-backup-secret"},
                                  ALLOWED_PROVIDERS=["no.such.Provider"],
                                  FALLBACK_RESERVE=2)  # the suite's 10 s job leaves its primary room
    fields = {"name": "Support", "slug": "support", "active": "on", "system_prompt": "Be kind.", "provider": "demo",
              "model": "", "base_url": "", "credential": "", "greeting": "", "suggestions": "",
              "access": "public", "versions-TOTAL_FORMS": "0", "versions-INITIAL_FORMS": "0"}
    add = "/admin/conversations/assistant/add/"
    assert "fallbacks" in admin_client.get(add).content.decode()

    chain = [{"provider": "no.such.Provider"}, {"provider": "openai", "credential": "bakcup-key"}]
    refused = admin_client.post(add, {**fields, "fallbacks": json.dumps(chain)})
    page = html.unescape(refused.content.decode())
    assert refused.status_code == 200 and not Assistant.objects.exists()
    assert "Please correct the error below." in page
    assert "its fallback 1 names a provider “no.such.Provider” that cannot be used (" in page
    assert "in its fallback 2, its credential “bakcup-key” is not in the site's CREDENTIALS setting." in page
    not_json = admin_client.post(add, {**fields, "fallbacks": "[{provider: openai}]"})
    assert "Enter a valid JSON." in not_json.content.decode() and not Assistant.objects.exists()

    chain = [{"provider": "openai", "model": "gpt-4o-mini", "credential": "backup-key"}, {"provider": "demo"}]
    saved = admin_client.post(add, {**fields, "fallbacks": json.dumps(chain)})
    assert saved.status_code == 302, saved.context["adminform"].form.errors
    support = Assistant.objects.get()
    assert support.fallbacks == chain
    change = reverse("admin:conversations_assistant_change", args=[support.pk])
    page = admin_client.get(change).content.decode()
    # The chain as it was typed, keys in the usual order whatever the database kept; names, never keys.
    assert html.escape(json.dumps(chain, indent=2)) in page and "secret" not in page

    # An empty box keeps the site's FALLBACKS (and shows empty again, not "null"); [] is no fallbacks at all.
    for typed, stored in (("", None), ("[]", [])):
        assert admin_client.post(change, {**fields, "fallbacks": typed}).status_code == 302
        support.refresh_from_db()
        assert support.fallbacks == stored
        box = admin_client.get(change).content.decode().split('name="fallbacks"', 1)[1].split("</textarea>", 1)[0]
        assert box.split(">", 1)[1].strip() == typed


def test_the_site_check_and_the_form_refuse_a_bad_fallback_with_the_same_sentences(
        admin_client, conversations_settings):
    conversations_settings.update(FALLBACK_RESERVE=2)  # the suite's 10 s job leaves its primary room
    # A key given as a bare string goes to its provider's own origin only, so it may not be sent to a
    # gateway; and the demo provider takes no model. The site's check passed both before: the first
    # chain hop of every turn then failed at the worker ("the key is bound to …: not sent").
    conversations_settings.update(CREDENTIALS={"backup": "sk-backup-secret"},
                                  ALLOWED_ENDPOINTS=["https://gw.example.com"])
    chain = [{"provider": "openai", "base_url": "https://gw.example.com/v1", "credential": "backup"},
             {"provider": "demo", "model": "gpt-4o"}]
    reasons = [
        "in its fallback 1, its credential “backup” may not be sent to https://gw.example.com: CREDENTIALS binds it "
        "to https://api.openai.com.",
        "in its fallback 2, the demo provider has no model “gpt-4o”: leave the model empty."]

    conversations_settings.update(FALLBACKS=[{key.upper(): value for key, value in entry.items()} for entry in chain])
    assert [(m.id, m.msg) for m in check_config() if m.id == "conversations.E013"] == [
        ("conversations.E013", f"The site's FALLBACKS cannot work: {reason}") for reason in reasons]

    conversations_settings.update(FALLBACKS=[])
    fields = {"name": "Support", "slug": "support", "active": "on", "system_prompt": "Be kind.", "provider": "demo",
              "model": "", "base_url": "", "credential": "", "greeting": "", "suggestions": "",
              "access": "public", "versions-TOTAL_FORMS": "0", "versions-INITIAL_FORMS": "0",
              "fallbacks": json.dumps(chain)}
    refused = admin_client.post("/admin/conversations/assistant/add/", fields)
    assert refused.status_code == 200 and not Assistant.objects.exists()
    assert refused.context["adminform"].form.errors["fallbacks"] == reasons


# -- turns: assistant, version, rating, cost -----------------------------------------------------


def test_the_turn_list_filters_by_rating_and_assistant_and_the_page_shows_version_and_rating(admin_client):
    support, shop = make_assistant("support"), make_assistant("shop")
    version = AssistantVersion.objects.create(assistant=support, fingerprint="3f2a9c1b7d4e",
                                              snapshot={"system_prompt": "You are <support>.", "model": "m"})
    liked, disliked = bulk_turns(support, [{"rating": "up", "cost": Decimal("0.0012")},
                                           {"rating": "down", "comment": "Wrong <b>answer</b>"}])
    Turn.objects.filter(pk=liked.pk).update(assistant_version=version)
    (unrated,) = bulk_turns(shop, [{}])

    def listed(**params):
        html = admin_client.get(CHANGELIST, params).content.decode()
        return {turn for turn in (liked, disliked, unrated) if str(turn.pk) in html}

    assert listed(rating="up") == {liked}
    assert listed(rating="down") == {disliked}
    assert listed(rating="commented") == {disliked}
    assert listed(rating="none") == {unrated}
    assert listed(assistant__id__exact=shop.pk) == {unrated}
    row = admin_client.get(CHANGELIST).content.decode().split(f'title="{liked.pk}"', 1)[1].split("</tr>", 1)[0]
    assert "Support" in row and "3f2a9c1" in row and "turn-rating-up" in row and "0.0012" in row

    page = admin_client.get(reverse("admin:conversations_turn_change", args=[liked.pk])).content.decode()
    assert "3f2a9c1b7d4e" in page and "You are &lt;support&gt;." in page  # the snapshot, escaped
    other = admin_client.get(reverse("admin:conversations_turn_change", args=[disliked.pk])).content.decode()
    assert "Wrong &lt;b&gt;answer&lt;/b&gt;" in other and "turn-rating-down" in other


def test_rated_turns_export_as_csv_that_no_spreadsheet_runs(admin_client):
    support = make_assistant("support")
    rated, unrated = bulk_turns(support, [{"rating": "down", "comment": "=HYPERLINK(\"http://evil\")"}, {}])
    Message.objects.create(conversation=rated.conversation, turn=rated, role="user", content="+1 refund?")
    Message.objects.create(conversation=rated.conversation, turn=rated, role="assistant", content="@ once")

    response = admin_client.post(CHANGELIST, {"action": "export_rated_csv",
                                              "_selected_action": [rated.pk, unrated.pk]})

    assert response["Content-Type"] == "text/csv; charset=utf-8"
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert len(rows) == 1
    assert rows[0]["turn"] == str(rated.pk) and rows[0]["assistant"] == "support" and rows[0]["rating"] == "down"
    assert rows[0]["comment"] == "'=HYPERLINK(\"http://evil\")"
    assert (rows[0]["question"], rows[0]["answer"]) == ("'+1 refund?", "'@ once")
    assert [csv_cell(v) for v in ("-2", "\tx", "ok", None, 3)] == ["'-2", "'\tx", "ok", "", "3"]


def test_a_staff_export_opened_where_cells_split_on_semicolons_has_no_formula_cell(db):
    """European Excel splits on ";": the comment ``ok;=cmd|' /C calc'!A0;`` once became a formula
    cell there. Every cell is quoted now, and a formula start after any separator is defused,
    for a spreadsheet that honours the quotes and for one that splits the bytes as they come."""
    from django.contrib.auth.models import Permission, User
    from django.test import Client

    staff = User.objects.create_user("operator", is_staff=True)
    staff.user_permissions.set(Permission.objects.filter(codename__in=["view_turn", "change_turn"]))
    client = Client()
    client.force_login(staff)
    attack = "ok;=cmd|' /C calc'!A0;"
    [turn] = bulk_turns(make_assistant("support"), [{"rating": "down", "comment": attack}])
    Message.objects.create(conversation=turn.conversation, turn=turn, role="user", content="a\t-1 | @SUM(A1)")
    Message.objects.create(conversation=turn.conversation, turn=turn, role="assistant", content="line\n+1;x")

    body = client.post(CHANGELIST, {"action": "export_rated_csv", "_selected_action": [turn.pk]}).content.decode()

    formula = tuple("=+-@")
    for delimiter in (";", "\t", "|", ","):
        quoted = [cell for row in csv.reader(io.StringIO(body), delimiter=delimiter) for cell in row]
        naive = [cell.strip(' "') for line in body.splitlines() for cell in line.split(delimiter)]
        assert not [cell for cell in quoted + naive if cell.startswith(formula)], delimiter
    [header, row] = list(csv.reader(io.StringIO(body)))
    assert body.startswith('"turn","finished_at"')  # every cell quoted
    assert dict(zip(header, row))["comment"] == "ok;'=cmd|' /C calc'!A0;"


# -- the overview ------------------------------------------------------------------------------


def test_the_overview_adds_up_each_assistant_per_day(admin_client):
    support = make_assistant("support", name="Support")
    bulk_turns(support, [
        {"duration": 1, "margin_left": 8, "rating": "up", "cost": Decimal("0.001")},
        {"duration": 3, "margin_left": 6, "rating": "up", "cost": Decimal("0.001")},
        {"duration": 2, "margin_left": 5, "rating": "down", "cost": Decimal("0.001")},
        {"duration": 10, "margin_left": 7, "status": "failed", "tokens": (100, 50)},  # no price
    ])
    bulk_turns(None, [{"duration": 4}], day=1)

    today, yesterday = overview(7)

    assert today["assistant__slug"] == "support" and today["turns"] == 4
    assert (today["status_completed"], today["status_failed"], today["status_cancelled"]) == (3, 1, 0)
    assert today["duration_median"] == pytest.approx(2.5, abs=1e-3)
    # The 10th percentile of 5, 6, 7, 8, interpolated as percentile_cont does: 5 + 0.3 × 1.
    assert today["margin_p10"] == pytest.approx(5.3)
    assert (today["rated"], today["thumbs_up"]) == (3, 2) and today["thumbs_up_share"] == pytest.approx(2 / 3)
    assert (today["tokens_in"], today["tokens_out"]) == (400, 200)
    assert today["total_cost"] == Decimal("0.003") and today["unpriced"] == 1
    assert yesterday["assistant"] is None and yesterday["duration_median"] == pytest.approx(4, abs=1e-3)

    html = admin_client.get(OVERVIEW, {"days": 7}).content.decode()
    assert "Support" in html and "2.5 s" in html and "5.3 s" in html and "67 %" in html
    assert "0.0030" in html and "+ 1 turn unpriced" in html and "<em>the site's settings</em>" in html


def test_the_overview_makes_as_many_queries_for_200_turns_as_for_10(admin_client, django_assert_num_queries):
    support, shop = make_assistant("support"), make_assistant("shop")

    def add(count):
        for assistant in (support, shop, None):
            for day in (0, 1):
                bulk_turns(assistant, [{"duration": i % 7 + 1, "margin_left": 50 + i % 13,
                                        "rating": ("up", "down", "")[i % 3]} for i in range(count)], day=day)

    add(2)  # 12 turns in 6 groups
    with CaptureQueriesContext(connection) as few:
        assert admin_client.get(OVERVIEW).status_code == 200
    add(32)  # 204 turns, the same 6 groups
    assert Turn.objects.count() == 204
    with django_assert_num_queries(len(few)):
        response = admin_client.get(OVERVIEW)
    assert response.content.decode().count('class="overview-row"') == 6


def test_the_overview_needs_the_view_turn_permission(client):
    from django.contrib.auth.models import Permission, User

    user = User.objects.create_user("staff", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename="view_assistant"))
    client.force_login(user)
    assert client.get(OVERVIEW).status_code == 403
    user.user_permissions.add(Permission.objects.get(codename="view_turn"))
    assert client.get(OVERVIEW).status_code == 200


def test_the_form_sets_the_origins_that_may_embed_an_assistant_and_shows_its_script_tag(admin_client):
    fields = {"name": "Shop", "slug": "shop", "active": "on", "system_prompt": "Help.", "provider": "demo",
              "model": "", "base_url": "", "credential": "", "greeting": "", "suggestions": "", "access": "public",
              "access_permission": "", "versions-TOTAL_FORMS": "0", "versions-INITIAL_FORMS": "0"}
    add = "/admin/conversations/assistant/add/"

    refused = admin_client.post(add, {**fields, "allowed_origins": "https://shop.example.com\nhttps://*"})
    saved = admin_client.post(add, {**fields, "allowed_origins": "https://shop.example.com\n\nhttps://*.example.org"})
    page = admin_client.get(f"/admin/conversations/assistant/{Assistant.objects.get().pk}/change/").content.decode()

    assert refused.status_code == 200 and "each line must be an origin" in refused.content.decode()
    assert saved.status_code == 302
    assert Assistant.objects.get().allowed_origins == ["https://shop.example.com", "https://*.example.org"]
    assert html.escape('<script src="http://testserver/static/conversations/embed.js" '
                       'data-api="http://testserver/api/" data-assistant="shop" defer></script>') in page


def test_the_form_refuses_an_origin_with_a_bracket_without_its_pair(admin_client):
    fields = {"name": "Shop", "slug": "shop", "active": "on", "system_prompt": "Help.", "provider": "demo",
              "model": "", "base_url": "", "credential": "", "greeting": "", "suggestions": "", "access": "public",
              "access_permission": "", "versions-TOTAL_FORMS": "0", "versions-INITIAL_FORMS": "0"}

    answers = [admin_client.post("/admin/conversations/assistant/add/", {**fields, "allowed_origins": origin})
               for origin in ("http://[", "https://a]b")]

    for answer in answers:
        assert answer.status_code == 200 and "each line must be an origin" in answer.content.decode()
    assert not Assistant.objects.exists()
