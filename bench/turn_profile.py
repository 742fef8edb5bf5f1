"""Where a turn's CPU goes: the job of ``bench.turn_overhead``'s three-round-trip tool turn, run
in this process under cProfile, timed on the thread's CPU clock (so that other processes' load
counts less), then the parts of the job it spends that CPU in.

    .venv/bin/python -m bench.turn_profile [--turns 40] [--database sqlite|postgres|URL] [--top 25] [--fork|--post|--unprofiled]

Each turn is saved as the POST saves it (its conversation, the visitor's message, the turn with
its job id) outside the profile, then ``perform_turn`` runs it as a worker's thread would,
against the same instant OpenAI-compatible server. The first 5 turns warm up and are not counted.
With ``--fork``, as a ``Worker``'s work horse would instead: this process warms up as the
worker's parent does (``warm_up(forking=True)``), and each turn runs in a child forked for it,
profiled there from the fork on; what a horse does first that its parent never did shows there.
With ``--post``, the web's side instead: the ``POST …/turns/`` that starts each turn, through
Django's test client in this process (session, CSRF, the view, the enqueue at the commit, the
queued state), each visitor's session and conversation made first, unprofiled; no worker runs
the jobs.
With ``--unprofiled``, no profiler: the same parts of the job timed on the thread's CPU clock
around each call (``TIMED``), over many turns, to confirm what the profile says: cProfile charges
each Python function call the same overhead, so code of many small calls looks larger under it.
Each turn there is followed by ``bench.bare``'s naive job for the same question, timed whole.
With both ``--post`` and ``--unprofiled``: each POST's thread CPU and wall time, whole.
"""

import argparse
import cProfile
import io
import os
import pstats
import tempfile
import time

from bench.common import ScriptedProvider, Stack, machine

# The parts of the job, by the function that does each: (label, file suffix, function name).
PARTS = [
    ("whole job", "engine/job.py", "perform_turn"),
    ("load the turn (its conversation, user, assistant)", "query.py", "get"),  # the ORM's, before
    ("load the turn, raw (its conversation, user, assistant)", "engine/statements.py", "get"),  # before
    ("load the turn and its transcript, raw, one send", "engine/job.py", "_load"),
    ("runner set-up (provider, tools; the transcript before)", "engine/runner.py", "__init__"),
    ("claim (one UPDATE)", "engine/lifecycle.py", "claim"),
    ("model calls (HTTP client, watchdog)", "engine/runner.py", "call_model"),
    ("tools", "engine/runner.py", "run_tool"),
    ("round trips saved (one transaction each)", "engine/runner.py", "save_step"),
    ("states published", "engine/runner.py", "publish"),
    ("  of which the state built from the rows", "infra/state.py", "state_from_db"),
    ("final write (its state included)", "engine/runner.py", "finish"),
]

# ``--unprofiled``: the parts of the job timed around each call, by (label, module, attribute path);
# a part's figure includes the parts it calls (a round trip's save its statements, the final write
# its save and publish).
TIMED = [
    ("load the turn and its transcript, raw, one send", "conversations.engine.job", "_load"),
    ("runner set-up (provider, tools; the transcript before)", "conversations.engine.runner", "TurnRunner.__init__"),
    ("claim (one UPDATE)", "conversations.engine.runner", "claim"),
    ("model calls (HTTP client, watchdog)", "conversations.engine.runner", "TurnRunner.call_model"),
    ("tools", "conversations.engine.runner", "TurnRunner.run_tool"),
    ("round trips saved (one transaction each)", "conversations.engine.runner", "TurnRunner.save_step"),
    ("  of which their statements built (before the BEGIN)", "conversations.engine.runner",
     "TurnRunner.mine_statements"),
    ("  of which the statements sent (in the transaction)", "conversations.engine.runner", "TurnRunner.save_mine"),
    ("states published", "conversations.engine.runner", "TurnRunner.publish"),
    ("  of which the state built from the rows", "conversations.infra.state", "state_from_db"),
    ("  of which the Redis write (one EVAL)", "conversations.infra.state", "publish_step"),
    ("final write (its state included)", "conversations.engine.runner", "TurnRunner.finish"),
]


def timed(spent):
    """Wrap each of ``TIMED`` where the job looks it up, adding each call's thread CPU seconds and
    its count to ``spent`` ({label: [seconds, calls]})."""
    import importlib

    def wrap(label, function):
        def timing(*args, **kwargs):
            started = time.thread_time()
            try:
                return function(*args, **kwargs)
            finally:
                entry = spent.setdefault(label, [0.0, 0])
                entry[0] += time.thread_time() - started
                entry[1] += 1
        return timing

    for label, module, path in TIMED:
        owner = importlib.import_module(module)
        *parents, name = path.split(".")
        for parent in parents:
            owner = getattr(owner, parent)
        setattr(owner, name, wrap(label, getattr(owner, name)))


# The parts of the POST that starts a turn (``--post``).
POST_PARTS = [
    ("whole request (Django's handler)", "django/core/handlers/base.py", "get_response"),
    ("the view (TurnListView.post)", "api/views.py", "post"),
    ("  lifecycle.start", "engine/lifecycle.py", "start"),
    ("    lock the owner's conversations, read this one", "api/base.py", "owned_conversation"),
    ("    handoff check", "engine/handoff.py", "ensure_with_assistant"),
    ("    turns counted (ensure_idle and limits; AddressTurns' too)", "engine/limits.py", "__init__"),
    ("    ensure_idle", "engine/lifecycle.py", "ensure_idle"),
    ("    limits", "engine/limits.py", "check_new_turn"),
    ("    create (rows)", "engine/lifecycle.py", "create"),
    ("      the turn's and the message's INSERT (Model.save)", "django/db/models/base.py", "save"),
    ("    commit (RQ's enqueue runs at it)", "django/db/transaction.py", "__exit__"),
    ("      RQ enqueue", "infra/queue.py", "enqueue"),
    ("    queued state published", "infra/state.py", "publish"),
    ("    worker looked for", "infra/queue.py", "warn_if_unattended"),
    ("  address recorded", "engine/limits.py", "add"),
    ("  turn summary (URLs)", "api/base.py", "turn_summary"),
    ("session saved", "api/sessions.py", "save_session"),
]


def profile_posts(args):
    """``--post``: profile the POSTs that start ``args.turns`` turns (after 5 unprofiled ones)."""
    from django.test import Client

    profile = cProfile.Profile(time.thread_time)
    wall = []
    for number in range(args.turns + 5):
        client = Client(enforce_csrf_checks=True, HTTP_HOST="127.0.0.1")  # an allowed host
        client.get("/")
        csrf = client.cookies["csrftoken"].value
        conversation = client.post("/api/conversations/", data="{}", content_type="application/json",
                                   HTTP_X_CSRFTOKEN=csrf).json()["id"]
        started, cpu = time.perf_counter(), time.thread_time()
        if number >= 5 and not args.unprofiled:
            profile.enable()
        response = client.post(f"/api/conversations/{conversation}/turns/",
                               data='{"content": "What time is it in Tokyo, and how do refunds work?"}',
                               content_type="application/json", HTTP_X_CSRFTOKEN=csrf)
        if number >= 5:
            profile.disable()
            wall.append((time.thread_time() - cpu, time.perf_counter() - started) if args.unprofiled
                        else time.perf_counter() - started)
        assert response.status_code == 202, response.content
    return profile, wall


def make_turn():
    """A queued turn as the POST leaves it; returns its id."""
    from django.utils import timezone

    from conversations.models import Conversation, Message, Turn

    conversation = Conversation.objects.create(owner_token="bench-profile")
    turn = Turn.objects.create(conversation=conversation, enqueued_at=timezone.now(), job_id="bench-profile",
                               job_timeout=60, deadline_margin=5)
    Message.objects.create(conversation=conversation, turn=turn, role=Message.Role.USER,
                           content="What time is it in Tokyo, and how do refunds work?")
    turn.job_id = f"bench-profile-{turn.pk}"
    Turn.objects.filter(pk=turn.pk).update(job_id=turn.job_id)
    return turn.pk


def baseline_job(url, function):
    """One of ``bench.bare``'s jobs (``bare_job``, the naive job; ``seed_job``, the seed loop) run once
    in this thread, for a turn made as ``make_turn`` makes it, with the RQ job it reads its connection
    from stood in for; returns its thread CPU seconds."""
    import types
    from unittest import mock

    import django_rq

    from conversations.models import Turn

    turn = Turn.objects.get(pk=make_turn())
    job = types.SimpleNamespace(connection=django_rq.get_connection())
    with mock.patch("rq.get_current_job", return_value=job):
        started = time.thread_time()
        function(url, f"bench:profile-baseline:{turn.pk}", turn.conversation_id, turn.pk)
        return time.thread_time() - started


def forked(turn_id, dump):
    """Run ``turn_id``'s job in a child forked now, as a work horse; its profile is written to
    ``dump``. Returns the child's wall time in seconds, from before the fork to its exit."""
    from django.db import connections

    from conversations.engine.job import perform_turn

    connections.close_all()  # as the worker's parent before each fork
    started = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            profile = cProfile.Profile(time.thread_time)
            profile.enable()
            perform_turn(turn_id)
            profile.disable()
            profile.dump_stats(dump)
            code = 0
        finally:
            os._exit(code)
    _pid, status = os.waitpid(pid, 0)
    if status != 0:
        raise RuntimeError(f"the horse of turn {turn_id} failed ({status})")
    return time.perf_counter() - started


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--database", default="sqlite", help='"postgres", "sqlite" or a DATABASE_URL')
    parser.add_argument("--top", type=int, default=25, help="functions listed by their own time")
    parser.add_argument("--dump", help="also write the profile to this file (for pstats or snakeviz)")
    parser.add_argument("--fork", action="store_true", help="run each turn in a forked child, as a Worker's horse")
    parser.add_argument("--post", action="store_true", help="profile the POST that starts a turn instead of its job")
    parser.add_argument("--unprofiled", action="store_true", help="time the job's parts on the CPU clock, no profiler")
    args = parser.parse_args()

    print(machine())
    if args.fork:  # bench.settings gives a forking worker no connection pool, as deployment.md says
        os.environ["RQ_WORKER_CLASS"] = "conversations.worker.Worker"
    with ScriptedProvider(calls=3) as provider:
        conversations = {"PROVIDER": "openai", "BASE_URL": provider.url, "API_KEY": "bench", "MODEL": "bench"}
        with Stack(database=args.database, conversations=conversations) as stack:
            from bench import bare
            from conversations.engine.job import perform_turn, warm_up
            from conversations.infra import state

            profile = cProfile.Profile(time.thread_time)
            wall, dumps, spent, whole, naive, seed = [], [], {}, [], [], []
            if args.unprofiled and not args.post:
                timed(spent)
            if args.fork:
                warm_up(forking=True)
            if args.post:
                profile, wall = profile_posts(args)
            for number in range(0 if args.post else args.turns + 5):
                turn_id = make_turn()
                if args.fork:
                    dump = tempfile.mktemp(prefix="turn-profile-", suffix=".prof")
                    took = forked(turn_id, dump)
                    if number >= 5:
                        dumps.append(dump)
                        wall.append(took)
                    else:
                        os.unlink(dump)
                elif args.unprofiled:
                    if number == 5:
                        spent.clear()
                    started = time.thread_time()
                    perform_turn(turn_id)
                    whole.append(time.thread_time() - started)
                    naive.append(baseline_job(provider.url, bare.bare_job))
                    seed.append(baseline_job(provider.url, bare.seed_job))
                else:
                    started = time.perf_counter()
                    if number >= 5:
                        profile.enable()
                    perform_turn(turn_id)
                    if number >= 5:
                        profile.disable()
                        wall.append(time.perf_counter() - started)
                assert state.read(turn_id)["status"] == "completed"
            label = stack.database_label + (", each job in a forked child" if args.fork else "") + (
                ", the POSTs that start them" if args.post else "")
    if args.unprofiled and args.post:
        cpu, took = sorted(c for c, _w in wall), sorted(w for _c, w in wall)
        print(f"\n{args.turns} POSTs in process, {label}; unprofiled, ms per POST: thread CPU "
              f"mean {sum(cpu) * 1000 / len(cpu):.3f}, median {cpu[len(cpu) // 2] * 1000:.3f}; "
              f"wall median {took[len(took) // 2] * 1000:.3f}")
        return
    if args.unprofiled:
        whole, naive, seed = whole[5:], naive[5:], seed[5:]
        print(f"\n{args.turns} turns in process, {label}; unprofiled thread CPU ms per turn (calls per turn)\n")
        print(f"  {'whole job':<55} {sum(whole) * 1000 / args.turns:7.2f}  "
              f"(median {sorted(whole)[len(whole) // 2] * 1000:.2f})")
        for name, _module, _path in TIMED:
            seconds, calls = spent.get(name, (0.0, 0))
            print(f"  {name:<55} {seconds * 1000 / args.turns:7.2f}  ({calls / args.turns:.1f})")
        print(f"  {'the naive job (bench.bare), whole':<55} {sum(naive) * 1000 / args.turns:7.2f}  "
              f"(median {sorted(naive)[len(naive) // 2] * 1000:.2f})")
        print(f"  {'the seed loop (bench.bare), whole':<55} {sum(seed) * 1000 / args.turns:7.2f}  "
              f"(median {sorted(seed)[len(seed) // 2] * 1000:.2f})")
        return
    stats = pstats.Stats(*dumps, stream=io.StringIO()) if args.fork else pstats.Stats(profile)
    for dump in dumps:
        os.unlink(dump)
    if args.dump:
        stats.dump_stats(args.dump)
    per = 1000 / args.turns
    print(f"\n{args.turns} turns in process, {label}; profiled CPU ms per turn (cumulative; calls per turn)\n")
    for name, suffix, function in POST_PARTS if args.post else PARTS:
        found = [(key, value) for key, value in stats.stats.items()
                 if key[0].endswith(suffix) and key[2] == function]
        if suffix == "query.py":  # QuerySet.get called by the job itself
            found = [(key, value) for key, value in found
                     if any(caller[0].endswith("engine/job.py") for caller in value[4])]
            cumulative = sum(v[4][c][3] for _k, v in found for c in v[4] if c[0].endswith("engine/job.py"))
            calls = sum(v[4][c][1] for _k, v in found for c in v[4] if c[0].endswith("engine/job.py"))
        else:
            cumulative = sum(value[3] for _key, value in found)
            calls = sum(value[1] for _key, value in found)
        print(f"  {name:<55} {cumulative * per:7.2f}  ({calls / args.turns:.1f})")
    print(f"\nwall per profiled turn (profiling included): median {sorted(wall)[len(wall) // 2] * 1000:.1f} ms\n")
    out = io.StringIO()
    stats.stream = out
    stats.sort_stats("tottime").print_stats(args.top)
    print(out.getvalue())


if __name__ == "__main__":
    main()
