"""The growing answers of a process's streaming turns are written together by one thread
(``state.publish_board``, started by the ``ConcurrentWorker``): what was offered while a batch was
being written goes in the next, the newest state of each turn only, and no older growing answer
ever lands after a newer state of its turn. Real Redis, the real cache backend."""

import threading

import pytest

from conversations.infra import state
from conversations.infra.state import PublishBoard

TURNS = [f"00000000-0000-0000-0000-{n:012d}" for n in range(50)]


@pytest.fixture
def held_writes(monkeypatch):
    """Every batch the board writes is recorded; the first waits for ``release`` to be set."""
    batches, writing, release = [], threading.Event(), threading.Event()
    write = state._write

    def recorded(states, **kwargs):
        batches.append([(data["id"], data["messages"][0]["content"]) for data in states])
        if len(batches) == 1:
            writing.set()
            release.wait(10)
        return write(states, **kwargs)

    monkeypatch.setattr(state, "_write", recorded)
    return batches, writing, release


def held_board(held_writes, turn_id, text):
    """A started board whose thread is writing ``turn_id``'s growing answer ``text``, held there."""
    _, writing, _ = held_writes
    board = PublishBoard()
    board.start()
    board.offer(growing(turn_id, text))
    assert writing.wait(5)
    return board


def growing(turn_id, text):
    return {"id": turn_id, "conversation": None, "done": False,
            "messages": [{"id": None, "role": "assistant", "content": text, "streaming": True}]}


def written_text(turn_id):
    found = state.read(turn_id)
    return found and found["messages"][0]["content"]


def wait_until_written(board):
    """The board has written everything offered to it (a withdraw waits for what is being written)."""
    for _ in range(200):
        with board._lock:
            if not board._offered and not board._writing:
                return
        threading.Event().wait(0.01)
    raise AssertionError("the board did not write what was offered")


def test_what_many_turns_offer_meanwhile_is_written_in_one_batch_with_each_turns_newest_text(held_writes):
    batches, _, release = held_writes
    board = held_board(held_writes, TURNS[0], "Hel")
    for turn_id in TURNS:
        board.offer(growing(turn_id, "Hello"))
    for turn_id in TURNS[:10]:
        board.offer(growing(turn_id, "Hello, wor"))  # newer text of the same turns replaces it
    release.set()
    wait_until_written(board)

    assert batches == [[(TURNS[0], "Hel")], [(t, "Hello, wor") for t in TURNS[:10]] + [(t, "Hello") for t in TURNS[10:]]]
    assert [written_text(t) for t in TURNS] == ["Hello, wor"] * 10 + ["Hello"] * 40
    assert state.read(TURNS[0])["version"] == 2 and state.read(TURNS[1])["version"] == 1


def test_a_publish_waits_for_its_turns_growing_answer_being_written_and_lands_after_it(held_writes):
    _, _, release = held_writes
    board = held_board(held_writes, TURNS[0], "Half an answ")
    published = []
    final = threading.Thread(target=lambda: published.append(
        state.publish({**growing(TURNS[0], "Half an answer."), "done": True})), daemon=True)
    # ``state.publish`` asks the process's board: this test's stands in for it.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(state, "publish_board", board)
        final.start()
        final.join(0.3)
        assert final.is_alive()  # waiting: the growing answer it follows has not landed yet
        release.set()
        final.join(5)

    assert published[0]["version"] == 2
    assert state.read(TURNS[0])["done"] is True and written_text(TURNS[0]) == "Half an answer."


def test_a_growing_answer_not_yet_written_is_dropped_by_a_newer_publish_of_its_turn(held_writes):
    batches, _, release = held_writes
    board = held_board(held_writes, TURNS[1], "Another turn")
    board.offer(growing(TURNS[0], "Half an answ"))  # waits behind the batch being written
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(state, "publish_board", board)
        state.publish({**growing(TURNS[0], "Half an answer."), "done": True})
    release.set()
    wait_until_written(board)

    # The older growing answer was never written; the publish was (through the same ``_write``).
    assert batches == [[(TURNS[1], "Another turn")], [(TURNS[0], "Half an answer.")]]
    assert state.read(TURNS[0])["done"] is True and state.read(TURNS[0])["version"] == 1


def test_a_board_not_started_publishes_each_growing_answer_at_once(held_writes):
    batches, _, release = held_writes
    release.set()
    board = PublishBoard()
    assert board.offer(growing(TURNS[0], "At once"))["version"] == 1
    assert written_text(TURNS[0]) == "At once" and batches == [[(TURNS[0], "At once")]]


def test_the_board_outlives_a_batch_that_could_not_be_written(monkeypatch):
    board = PublishBoard()
    board.start()
    write, failed = state._write, threading.Event()

    def failing_once(states):
        if not failed.is_set():
            failed.set()
            raise ConnectionError("Redis went away")
        return write(states)

    monkeypatch.setattr(state, "_write", failing_once)
    board.offer(growing(TURNS[0], "Lost"))
    assert failed.wait(5)
    wait_until_written(board)
    board.offer(growing(TURNS[0], "Lost, then shown"))  # the next growing answer replaces it
    wait_until_written(board)

    assert written_text(TURNS[0]) == "Lost, then shown"
