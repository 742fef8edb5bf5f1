"""The package as a new site gets it: the wheel holds the app and nothing else, and a new
``startproject`` site configured only from the README's "Adding it to your site" blocks passes
its checks, migrates, serves the widget's files and answers a turn run by a real worker.

The site runs from a venv of its own with the wheel installed (tests/fresh_site.py), so nothing
of this checkout (the demo project, the tests) is importable there.
"""

import os
import re
import time

import pytest
import requests

from tests.fresh_site import ROOT, FreshSite, build_wheel, make_venv, readme_block, wheel_metadata, wheel_names

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
    site = new_site()
    template = readme_block("{# a template: anywhere in its body #}")
    html = site.python(
        "from django.template import engines; from django.test import RequestFactory\n"
        f"print(engines['django'].from_string({template!r}).render(request=RequestFactory().get('/')))")

    assert '<div class="cvw" data-conversations-widget data-api-url="/api/conversations/"' in html
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
