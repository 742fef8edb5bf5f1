"""A new Django site built the way a developer would build it: the wheel built from this checkout,
installed into a venv of its own, ``django-admin startproject``, and the README's "Adding it to
your site" blocks pasted in. Used by tests/package/test_packaging.py; tests of the widget on a host page
or of a custom user model build theirs with ``FreshSite`` too, adding their own settings.

Nothing here imports the suite's Django settings: the site runs in its own processes, with
only the wheel (and its dependencies) importable, never this checkout.
"""

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# What a source checkout holds besides the package; a copy without them builds the same wheel
# without leaving build/ and *.egg-info in the working tree.
_NOT_SOURCE = shutil.ignore_patterns(".git", ".venv*", ".run", "build", "dist", "*.egg-info", "__pycache__",
                                     "*.sqlite3", "staticfiles", ".pytest_cache", "node_modules")


def readme_block(marker):
    """The body of the README's fenced code block whose first line is ``marker`` (the README's
    own text, so the tests check what a reader pastes), without that line and with the list
    item's indentation removed."""
    blocks = re.findall(r"^( *)```\w*\n(.*?)^\1```", README.read_text(), flags=re.M | re.S)
    found = [re.sub(rf"(?m)^{indent}", "", body) for indent, body in blocks
             if body.lstrip().startswith(marker + "\n")]
    assert len(found) == 1, f"the README has {len(found)} code blocks that start with {marker!r}"
    return found[0].split("\n", 1)[1]


def build_wheel(workdir):
    """Build the wheel from a copy of this checkout into ``workdir``; return its path."""
    source, dist = Path(workdir) / "source", Path(workdir) / "dist"
    shutil.copytree(ROOT, source, ignore=_NOT_SOURCE)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(source)])
    (wheel,) = dist.glob("*.whl")
    return wheel


def wheel_names(wheel):
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def wheel_metadata(wheel):
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return archive.read(name).decode()


def make_venv(workdir, wheel):
    """A venv in ``workdir`` with the wheel installed; returns its ``bin`` directory.

    The dependencies come from the package index (pip's cache, mostly), held to the versions
    this test run has, so the new site runs the Django the suite runs.
    """
    venv = Path(workdir) / "venv"
    run([sys.executable, "-m", "venv", str(venv)])
    freeze = run([sys.executable, "-m", "pip", "freeze", "--exclude-editable"]).stdout
    constraints = Path(workdir) / "constraints.txt"
    constraints.write_text("".join(line + "\n" for line in freeze.splitlines() if "==" in line))
    bin_dir = venv / ("Scripts" if os.name == "nt" else "bin")
    run([str(bin_dir / "python"), "-m", "pip", "install", "-q", "-c", str(constraints), str(wheel)], timeout=300)
    return bin_dir


def run(args, *, timeout=120, check=True, **kwargs):
    kwargs.setdefault("env", {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    result = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert result.returncode == 0 or not check, f"{' '.join(map(str, args))} failed ({result.returncode}):\n" \
                                   f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class FreshSite:
    """A ``startproject`` site in ``directory`` run by the venv in ``bin_dir``.

    ``env`` is the environment of every command: the suite's own (REDIS_URL among it) less
    anything that would point Python or Django at this checkout, or that the suite sets for
    itself (DJANGO_ALLOW_ASYNC_UNSAFE, for the browser tests).
    """

    project = "mysite"

    def __init__(self, directory, bin_dir, *, redis_url):
        self.directory = Path(directory)
        self.bin_dir = Path(bin_dir)
        self.env = {key: value for key, value in os.environ.items()
                    if key not in {"PYTHONPATH", "DJANGO_SETTINGS_MODULE", "DATABASE_URL", "DJANGO_ALLOW_ASYNC_UNSAFE"}
                    and not key.startswith("CONVERSATIONS_")}
        self.env["REDIS_URL"] = redis_url

    @classmethod
    def create(cls, directory, bin_dir, *, redis_url):
        """``django-admin startproject`` in ``directory``; the README's blocks are not applied yet."""
        Path(directory).mkdir(parents=True)
        site = cls(directory, bin_dir, redis_url=redis_url)
        run([str(site.bin_dir / "django-admin"), "startproject", cls.project, str(directory)], env=site.env)
        return site

    @property
    def settings_file(self):
        return self.directory / self.project / "settings.py"

    @property
    def urls_file(self):
        return self.directory / self.project / "urls.py"

    def append(self, path, text):
        with open(path, "a") as file:
            file.write("\n" + text)

    def apply_readme(self):
        """Paste the README's settings and urls blocks at the end of the site's files."""
        self.append(self.settings_file, readme_block("# settings.py: add at the end"))
        self.append(self.urls_file, readme_block("# urls.py: add at the end"))

    def manage(self, *args, timeout=120, env=None, check=True):
        """Run ``python manage.py *args`` in the site (``env`` adds variables); returns the completed
        process, failing the test if it fails unless ``check`` is false."""
        return run([str(self.bin_dir / "python"), "manage.py", *args], cwd=self.directory,
                   env={**self.env, **(env or {})}, timeout=timeout, check=check)

    def python(self, code, timeout=60):
        """Run ``code`` with the site's settings set up (``manage.py shell -c``); returns its stdout."""
        return self.manage("shell", "-c", code, timeout=timeout).stdout

    @contextlib.contextmanager
    def serve(self, *args):
        """``manage.py runserver`` on a free port for the duration; yields its base URL."""
        port = free_port()
        log = self.directory / "runserver.log"  # a file, not a pipe nobody reads while it serves
        with open(log, "w") as output:
            process = subprocess.Popen([str(self.bin_dir / "python"), "manage.py", "runserver", f"127.0.0.1:{port}",
                                        "--noreload", *args], cwd=self.directory, env=self.env,
                                       stdout=output, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 30
            while True:
                assert process.poll() is None, f"runserver exited:\n{log.read_text()[-3000:]}"
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                    break
                except OSError:
                    assert time.monotonic() < deadline, "runserver did not listen within 30 s"
                    time.sleep(0.1)
            yield f"http://127.0.0.1:{port}"
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
