"""The package's layers and their one import direction (docs/architecture.md).

Every module's imports are read with ``ast``, at module level and inside functions alike: an
import inside a function still ties two modules together, it only hides the tie until the
function runs. The test fails on an import that climbs a layer, on one that closes a cycle,
and on an import of the app's own code inside a function that does not say why.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "conversations"

# From the bottom up; a module may import its own layer and the ones below, never one above.
LAYERS = [
    ("core", ["conversations.core", "conversations.knowledge.text"]),
    ("settings and leaves", ["conversations.conf", "conversations.owners", "conversations.cache",
                             "conversations.log", "conversations.endpoints", "conversations.redaction",
                             "conversations.visitors", "conversations.knowledge", "conversations.knowledge.registry",
                             "conversations.evals"]),
    ("infra", ["conversations.infra"]),
    ("providers and tools", ["conversations.providers", "conversations.tools"]),
    ("assistants", ["conversations.assistants"]),
    ("models", ["conversations.models", "conversations.knowledge.models", "conversations.evals.models",
                "conversations.evals.csvimport", "conversations.evals.scoring", "conversations.evals.drafts",
                "conversations.evals.collect"]),
    ("knowledge", ["conversations.knowledge.index", "conversations.knowledge.search", "conversations.knowledge.tool",
                   "conversations.knowledge.embeddings"]),
    ("engine", ["conversations.engine", "conversations.evals.runs"]),
    ("surfaces", ["conversations.admin", "conversations.api", "conversations.checks", "conversations.signals",
                  "conversations.templatetags", "conversations.management", "conversations.rq_urls",
                  "conversations.apps", "conversations"]),
]
# The public paths sites and queued jobs name; they re-export, and nothing in the app imports them.
FACES = {"conversations.jobs", "conversations.worker", "conversations.types", "conversations.privacy"}
# Surfaces that stand side by side and never import each other.
APART = [("conversations.admin", "conversations.api")]


@pytest.fixture(autouse=True)
def _clean_redis():
    """Source files only: this test needs no Redis, so it runs in the fast tier too."""
    yield


def module_name(path):
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py")) if "migrations" not in path.parts}


def within(name, prefix):
    return name == prefix or name.startswith(prefix + ".")


def layer_of(name):
    """(index, layer name) of the longest prefix that names ``name``'s layer."""
    best = None
    for index, (layer, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if within(name, prefix) and (best is None or len(prefix) > best[2]):
                best = (index, layer, len(prefix))
    return best[:2]


def owning_module(dotted):
    """The module ``dotted`` lives in (``conversations.x.y`` → ``conversations.x`` when y is a name)."""
    while dotted and dotted not in MODULES:
        dotted = dotted.rpartition(".")[0]
    return dotted


class Import:
    def __init__(self, importer, imported, line, function, commented):
        self.importer, self.imported, self.line, self.function, self.commented = (
            importer, imported, line, function, commented)

    def __str__(self):
        where = f" inside {self.function}()" if self.function else ""
        return f"{self.importer} imports {self.imported} (line {self.line}{where})"


def imports_of(name, path):
    source = path.read_text()
    lines = source.splitlines()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []

    def commented(node):
        # the reason sits on the import's own line(s) or on the line just above it
        span = lines[node.lineno - 2 if node.lineno > 1 else 0:node.end_lineno]
        return any("#" in line for line in span)

    def visit(node, function):
        for child in ast.iter_child_nodes(node):
            inner = function
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner = function or child.name
            if isinstance(child, ast.Import):
                targets = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join(base + ([child.module] if child.module else []))
                else:
                    base = child.module or ""
                targets = [f"{base}.{alias.name}" for alias in child.names]
            else:
                visit(child, inner)
                continue
            for imported in dict.fromkeys(owning_module(t) for t in targets if within(t, "conversations")):
                if imported != name:
                    found.append(Import(name, imported, child.lineno, inner, commented(child)))
    visit(ast.parse(source), None)
    return found


IMPORTS = [each for name, path in MODULES.items() for each in imports_of(name, path)]


def test_the_graph_was_read():
    assert {"conversations.core.types", "conversations.engine.runner", "conversations.models"} <= set(MODULES)
    assert any(str(each).startswith("conversations.engine.runner imports conversations.core.types")
               for each in IMPORTS)


def test_no_module_imports_a_layer_above_its_own():
    climbing = []
    for each in IMPORTS:
        if each.imported in FACES:
            continue  # its own test below
        (low, low_name), (high, high_name) = layer_of(each.importer), layer_of(each.imported)
        if high > low:
            climbing.append(f"{each}: {low_name} must not import {high_name}")
    assert not climbing, "\n".join(climbing)


def test_nothing_in_the_app_imports_a_face():
    through_a_face = [str(each) for each in IMPORTS if each.imported in FACES and each.importer not in FACES]
    assert not through_a_face, "\n".join(through_a_face)


def test_the_admin_and_the_api_never_import_each_other():
    crossing = [str(each) for each in IMPORTS for a, b in APART for x, y in ((a, b), (b, a))
                if within(each.importer, x) and within(each.imported, y)]
    assert not crossing, "\n".join(crossing)


def test_no_import_closes_a_cycle():
    graph = {}
    for each in IMPORTS:
        graph.setdefault(each.importer, {}).setdefault(each.imported, each)
    cycles = []
    state = {}  # module -> "open" while on the path, "done" after

    def walk(module, path):
        state[module] = "open"
        for target, edge in sorted(graph.get(module, {}).items()):
            if state.get(target) == "open":
                loop = path[path.index(target):] + [target]
                cycles.append(f"{edge} closes the cycle {' -> '.join(loop)}")
            elif target not in state:
                walk(target, path + [target])
        state[module] = "done"

    for module in sorted(MODULES):
        if module not in state:
            walk(module, [module])
    assert not cycles, "\n".join(cycles)


def test_an_import_of_the_apps_own_code_inside_a_function_says_why():
    # Only for an optional dependency or the app registry's timing (apps.ready), never as a
    # way around a cycle: the comment is for the reader who would move it to the top.
    silent = [str(each) for each in IMPORTS if each.function and not each.commented]
    assert not silent, "\n".join(silent)
