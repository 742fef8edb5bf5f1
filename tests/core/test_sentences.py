"""The sentences a visitor reads when a turn ends short: each is written once, so a turn that
ends the same way reads the same, wherever it was ended (the job, the worker, the poll view)."""

import ast
from collections import defaultdict
from pathlib import Path

from conversations.core import sentences

PACKAGE = Path(sentences.__file__).resolve().parent.parent


def message_functions():
    """``{sentence: ["module:function", ...]}`` for every ``*_message`` function of the package
    that returns a translated literal."""
    found = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        if "migrations" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.FunctionDef) and node.name.endswith("_message")):
                continue
            for call in ast.walk(node):
                if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "_"
                        and call.args and isinstance(call.args[0], ast.Constant)):
                    found[call.args[0].value].append(f"{path.relative_to(PACKAGE)}:{node.name}")
    return found


def test_no_two_functions_write_the_same_sentence():
    written_twice = {text: places for text, places in message_functions().items() if len(places) > 1}
    assert written_twice == {}


def test_every_ending_sentence_is_in_the_sentences_module_and_reads_differently():
    endings = [value for name, value in vars(sentences).items() if name.endswith("_message") and callable(value)]
    texts = [ending(3) if ending is sentences.step_limit_message else ending() for ending in endings]
    assert len(texts) == len(set(texts)) >= 9
    assert sentences.crashed_message() == "The assistant stopped unexpectedly before finishing. Please try again."
