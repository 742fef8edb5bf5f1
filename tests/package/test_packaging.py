"""The package as a new site gets it: the wheel holds the app and nothing else, and a new
``startproject`` site configured only from the README's "Adding it to your site" blocks passes
its checks, migrates, serves the widget's files and answers a turn run by a real worker.

The site runs from a venv of its own with the wheel installed (tests/support/fresh_site.py), so nothing
of this checkout (the demo project, the tests) is importable there.
"""

import concurrent.futures
import os
import re
import time

import pytest
import requests

from tests.browser.pages import AGGRESSIVE
from tests.support.fresh_site import ROOT, FreshSite, build_wheel, make_venv, readme_block, wheel_metadata, wheel_names

pytestmark = pytest.mark.slow

DIST_INFO = "django_conversations-0.1.0.dist-info"
PLACEHOLDER_REPOSITORY = "https://github.com/django-conversations/django-conversations"


@pytest.fixture(scope="session")
def wheel(tmp_path_factory):
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="session")
def site_venv(wheel, tmp_path_factory):
    """The ``bin`` directory of a venv with the wheel installed, shared by every new site of the run."""
    return make_venv(tmp_path_factory.mktemp("site-venv"), wheel)


@pytest.fixture
def new_site(site_venv, tmp_path):
    """Build a new ``startproject`` site with the README's settings and urls pasted in; call it
    with ``settings=``/``urls=`` to append more (a custom user model, a page for the widget)."""

    def build(name="site", *, settings="", urls=""):
        site = FreshSite.create(tmp_path / name, site_venv, redis_url=os.environ["REDIS_URL"])
        site.apply_readme()
        if settings:
            site.append(site.settings_file, settings)
        if urls:
            site.append(site.urls_file, urls)
        return site

    return build


def test_the_wheel_holds_the_app_with_its_templates_static_files_translations_and_migrations_only(wheel):
    names = set(wheel_names(wheel))
    source = {path.relative_to(ROOT).as_posix() for path in (ROOT / "conversations").rglob("*")
              if path.is_file() and "__pycache__" not in path.parts}

    assert {name.split("/")[0] for name in names} == {"conversations", DIST_INFO}
    assert {name for name in names if name.startswith("conversations/")} == source
    assert {"conversations/templates/conversations/widget.html", "conversations/static/conversations/widget.js",
            "conversations/static/conversations/widget.css", "conversations/locale/es/LC_MESSAGES/django.mo",
            "conversations/migrations/0001_initial.py", "conversations/log.py"} <= names


def test_the_metadata_has_the_projects_urls_a_private_security_contact_and_no_demo_dependency(wheel):
    metadata = wheel_metadata(wheel)
    urls = dict(line.split(": ", 1)[1].split(", ", 1) for line in metadata.splitlines()
                if line.startswith("Project-URL: "))
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist: ")]

    assert urls == {"Homepage": PLACEHOLDER_REPOSITORY, "Documentation": PLACEHOLDER_REPOSITORY + "#readme",
                    "Repository": PLACEHOLDER_REPOSITORY, "Issues": PLACEHOLDER_REPOSITORY + "/issues",
                    "Security": PLACEHOLDER_REPOSITORY + "/security/advisories/new"}
    assert urls["Security"] in (ROOT / "SECURITY.md").read_text().replace("\n", " ")
    assert [r for r in requires if "dj-database-url" in r] == [
        'Requires-Dist: dj-database-url>=2.1; extra == "demo"', 'Requires-Dist: dj-database-url>=2.1; extra == "test"']


def readme_commands():
    """The ``manage.py`` commands of the README's step 5, in order."""
    lines = readme_block("# the commands").splitlines()
    return [line.split()[2:] for line in lines if line.startswith("python manage.py ")]


def test_the_readme_names_the_commands_a_site_runs():
    assert readme_commands() == [["migrate"], ["check"], ["runserver"], ["rqworker"]]


def test_a_site_configured_from_the_readme_answers_a_turn_run_by_its_worker(new_site):
    site = new_site()
    site.manage("migrate")
    assert site.manage("check").stdout.strip() == "System check identified no issues (0 silenced)."

    with site.serve() as base:
        visitor = requests.Session()
        assert visitor.get(f"{base}/api/conversations/", timeout=10).status_code == 200  # the csrftoken cookie
        csrf = {"X-CSRFToken": visitor.cookies["csrftoken"]}
        conversation = visitor.post(f"{base}/api/conversations/", json={}, headers=csrf, timeout=10).json()
        started = visitor.post(f"{base}/api/conversations/{conversation['id']}/turns/", json={"content": "Hello!"},
                               headers=csrf, timeout=10)
        assert started.status_code == 202 and started.json()["status"] == "queued"

        site.manage("rqworker", "--burst")
        final = poll_until_done(visitor, base + started.json()["poll_url"])
        assert final["status"] == "completed" and final["error"] is None
        assert [m["role"] for m in final["messages"]] == ["user", "assistant"]
        assert final["messages"][-1]["content"].startswith("Hello! I am the demo assistant of this site")

        schema = visitor.get(f"{base}/api/schema/", timeout=30)
        assert schema.status_code == 200 and schema.text.startswith("openapi: 3")

        # The operator: the turn in the admin, linked to its job on django-rq's dashboard.
        site.manage("createsuperuser", "--no-input", "--username", "admin", "--email", "admin@example.com",
                    env={"DJANGO_SUPERUSER_PASSWORD": "a long enough password"})
        operator = requests.Session()
        operator.get(f"{base}/admin/login/", timeout=10)
        operator.post(f"{base}/admin/login/", timeout=10, data={
            "username": "admin", "password": "a long enough password", "next": "/admin/",
            "csrfmiddlewaretoken": operator.cookies["csrftoken"]})
        page = operator.get(f"{base}/admin/conversations/turn/{final['id']}/change/", timeout=10)
        assert page.status_code == 200 and "Hello!" in page.text
        link = re.search(r'finished · <a href="(/django-rq/[^"]+)">open in django-rq</a>', page.text)
        assert link, "the turn page does not link its job to django-rq"
        job_page = operator.get(base + link.group(1), timeout=10)
        assert job_page.status_code == 200 and "conversations.jobs" in job_page.text


def test_a_site_configured_from_the_readme_renders_the_widget_and_collects_its_files(new_site):
    """Step 4 as a newcomer follows it: the templates folder, the page and its view, then the page served."""
    site = new_site()
    site.append(site.settings_file, readme_block("# settings.py: a folder for the site's own templates"))
    (site.directory / "templates").mkdir()
    (site.directory / "templates" / "chat.html").write_text(readme_block("{# templates/chat.html: a page with the "
                                                                         "widget #}"))
    site.append(site.urls_file, readme_block("# urls.py: a page for the widget"))
    with site.serve() as base:
        page = requests.get(f"{base}/chat/", timeout=10)
    html = page.text

    assert page.status_code == 200 and "csrftoken" in page.cookies
    assert '<conversations-widget data-conversations-widget data-mode="inline" data-api-url="/api/conversations/"' in html
    assert '<script src="/static/conversations/widget.js" defer></script>' in html
    site.manage("collectstatic", "--no-input")
    collected = site.directory / "staticfiles" / "conversations"
    shipped = ROOT / "conversations" / "static" / "conversations" / "widget.js"
    assert (collected / "widget.js").read_bytes() == shipped.read_bytes()
    assert (collected / "widget.css").is_file()


def test_a_site_that_leaves_out_the_readmes_cache_is_told_so_by_check(new_site):
    site = new_site(settings="del CACHES  # Django's default: a local-memory cache in each process")
    result = site.manage("check", check=False)

    assert result.returncode == 1
    assert ("?: (conversations.E021) CACHES['default'] is a LocMemCache, which each process keeps to itself"
            in result.stderr)


def test_check_deploy_names_the_demo_model(new_site):
    site = new_site()
    # Django 6.1's own deployment checks include errors for startproject's defaults (mail.E001).
    output = site.manage("check", "--deploy", check=False).stderr
    assert "?: (conversations.W030) PROVIDER is 'demo': visitors get the offline demo model's canned answers" in output
    assert "?: (security.W004)" in output  # Django's own deployment warnings come with them


def poll_until_done(session, url, timeout=15):
    deadline = time.monotonic() + timeout
    while True:
        state = session.get(url, timeout=10).json()
        if state["done"] or time.monotonic() > deadline:
            return state
        time.sleep(0.1)


# -- a real site's own look and users (issue 14) ----------------------------------------------

ACCOUNTS_MODELS = '''
from django.contrib.auth.models import AbstractBaseUser, BaseUserManager, PermissionsMixin
from django.db import models


class UserManager(BaseUserManager):
    def create_user(self, email, password=None, **extra):
        user = self.model(email=self.normalize_email(email), **extra)
        user.set_password(password)
        user.save()
        return user

    def create_superuser(self, email, password=None, **extra):
        return self.create_user(email, password, is_staff=True, is_superuser=True, **extra)


class User(AbstractBaseUser, PermissionsMixin):
    """Signs in with an email address: there is no username at all."""
    email = models.EmailField(unique=True)
    is_staff = models.BooleanField(default=False)
    is_active = models.BooleanField(default=True)
    USERNAME_FIELD = EMAIL_FIELD = "email"
    objects = UserManager()
'''

PAGE_TEMPLATE = """{% load conversations %}<!doctype html><html lang="en"><head><meta charset="utf-8">
<title>My site</title><style>{{ style|safe }}</style></head><body><main><h1>My site</h1>
<p>Our own page, with our own styles.</p><label>A label of ours</label> <button>A button of ours</button>
<ol><li>A list of ours</li></ol>{% chat_widget mode=mode %}</main></body></html>"""

# The widget's text sizes are in rem on purpose (they follow the reader's font size), so the bare
# page shares the host's root font size: everything else of the host's must stay out.
STYLES = {"host": AGGRESSIVE, "bare": "html { font-size: 18px; }"}

# What the host's rules would change if they reached in.
COMPARED = ["font-family", "font-size", "font-style", "font-weight", "line-height", "letter-spacing", "word-spacing",
            "text-transform", "text-indent", "text-align", "color", "background-color", "padding-top", "padding-left",
            "margin-top", "margin-left", "border-top-width", "border-top-style", "border-top-color", "box-sizing",
            "width", "height", "list-style-type", "display", "position", "white-space", "outline-style"]
PARTS = [".cvw", ".cvw-panel", ".cvw-header", ".cvw-log", ".cvw-list", ".cvw-msg-user", ".cvw-msg-assistant",
         ".cvw-msg-assistant p", ".cvw-label", ".cvw-input", ".cvw-send", ".cvw-hint", ".cvw-status", ".cvw-launcher",
         ".cvw-close"]
STYLES_OF = """([parts, properties]) => {
    const root = document.querySelector('conversations-widget').shadowRoot;
    return Object.fromEntries(parts.map(part => { const el = root.querySelector(part);
        if (!el) { return [part, null]; }
        const style = getComputedStyle(el);
        return [part, Object.fromEntries(properties.map(p => [p, style.getPropertyValue(p)]))]; })); }"""


def test_a_site_with_its_own_styles_and_email_users_runs_both_widget_modes_untouched(new_site):
    from playwright.sync_api import expect, sync_playwright

    from tests.browser.conftest import CHROMIUM_ARGS, chromium_path

    pages = ", ".join(f'path("{look}-{mode}/", TemplateView.as_view(template_name="page.html", '
                      f'extra_context={{"mode": "{mode}", "style": {STYLES[look]!r}}}))'
                      for look in STYLES for mode in ("inline", "launcher"))
    site = new_site(
        settings='INSTALLED_APPS += ["accounts"]\nAUTH_USER_MODEL = "accounts.User"\n'
                 'TEMPLATES[0]["DIRS"] = [BASE_DIR / "templates"]',
        urls=f"from django.views.generic import TemplateView\nurlpatterns += [{pages}]")
    (site.directory / "accounts").mkdir()
    (site.directory / "accounts" / "__init__.py").write_text("")
    (site.directory / "accounts" / "models.py").write_text(ACCOUNTS_MODELS)
    (site.directory / "templates").mkdir()
    (site.directory / "templates" / "page.html").write_text(PAGE_TEMPLATE)
    site.manage("makemigrations", "accounts")
    site.manage("migrate")
    site.manage("createsuperuser", "--no-input", "--email", "admin@example.com",
                env={"DJANGO_SUPERUSER_PASSWORD": "a long enough password"})

    def through_the_widget(base):
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1000, "height": 800})
            page.set_default_timeout(20_000)
            expect.set_options(timeout=20_000)

            def styles_on(look, mode):
                page.goto(f"{base}/{look}-{mode}/")
                if mode == "launcher":
                    page.locator(".cvw-launcher").click()
                expect(page.locator(".cvw-msg-assistant")).to_contain_text("demo assistant")
                return page.evaluate(STYLES_OF, [PARTS, COMPARED])

            # A turn through the real widget on the host page, run by the site's worker.
            page.goto(f"{base}/host-inline/")
            page.locator(".cvw-input").fill("Hello!")
            page.locator(".cvw-input").press("Enter")
            expect(page.locator(".cvw-status")).to_have_text("The assistant is thinking…")
            site.manage("rqworker", "--burst")
            expect(page.locator(".cvw-msg-assistant")).to_contain_text("Hello! I am the demo assistant of this site")
            # The host's rules are in force on its own elements ...
            assert page.locator("main > label").evaluate("el => getComputedStyle(el).textTransform") == "uppercase"
            # ... and none of them reached the widget, in either mode (the conversation follows, restored).
            for mode in ("inline", "launcher"):
                host, bare = styles_on("host", mode), styles_on("bare", mode)
                assert host[".cvw-label"]["text-transform"] == "none" and host[".cvw-panel"]["width"] == "576px"
                for part in PARTS:
                    assert host[part] == bare[part], (mode, part, {p: (host[part][p], bare[part][p]) for p in COMPARED
                                                                   if host[part] and host[part][p] != bare[part][p]})
            browser.close()

    with site.serve() as base:
        # Playwright's sync API runs an event loop in its thread, and the browser tests' session
        # keeps one running in this one: this browser gets a thread of its own.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(through_the_widget, base).result()

        # The admin of a site whose users have no username: search and ordering by owner work.
        operator = requests.Session()
        operator.get(f"{base}/admin/login/", timeout=10)
        operator.post(f"{base}/admin/login/", timeout=10, data={
            "username": "admin@example.com", "password": "a long enough password", "next": "/admin/",
            "csrfmiddlewaretoken": operator.cookies["csrftoken"]})
        for changelist in ("turn", "conversation"):
            for query in ("?q=example.com", "?q=Hello", "?o=4", "?o=-4.1", "?o=2"):
                answer = operator.get(f"{base}/admin/conversations/{changelist}/{query}", timeout=10)
                assert answer.status_code == 200, (changelist, query, answer.status_code)
                assert "/admin/login/" not in answer.url


def test_the_readmes_settings_send_turns_to_the_base_url_the_environment_names(new_site):
    from tests.support.fakes import FakeProvider, openai_text

    with FakeProvider(default=openai_text("Hello from the endpoint the environment named.")) as fake:
        site = new_site()
        site.env.update(CONVERSATIONS_PROVIDER="openai", CONVERSATIONS_BASE_URL=fake.url,
                        CONVERSATIONS_MODEL="fake-model", CONVERSATIONS_API_KEY="sk-test")
        site.manage("migrate")
        assert "conversations.W008" not in site.manage("check").stderr  # every variable is read
        with site.serve() as base:
            visitor = requests.Session()
            visitor.get(f"{base}/api/conversations/", timeout=10)
            csrf = {"X-CSRFToken": visitor.cookies["csrftoken"]}
            conversation = visitor.post(f"{base}/api/conversations/", json={}, headers=csrf, timeout=10).json()
            started = visitor.post(f"{base}/api/conversations/{conversation['id']}/turns/",
                                   json={"content": "Hello!"}, headers=csrf, timeout=10).json()
            site.manage("rqworker", "--burst")
            final = poll_until_done(visitor, base + started["poll_url"])

    assert final["status"] == "completed", final
    assert final["messages"][-1]["content"] == "Hello from the endpoint the environment named."
    assert len(fake.requests) == 1
