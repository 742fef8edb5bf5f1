"""What a forking worker's horse pays, step by step, to make its own OpenTelemetry providers.

    .venv/bin/python -m bench.otel_horse_steps [--forks 40]

A process set up as a ``conversations.worker.Worker``'s parent (``TELEMETRY="otlp"``, then
``telemetry.warm_up(forking=True)``: the exporters and the resource made, no provider) forks
children that each time, one by one, what ``telemetry`` does in a horse: at its job's start the
tracer provider, its batch span processor (which starts the export thread), setting it as the
process's provider, the app's tracer and a first span; at its job's end the metric reader, the
meter provider and the app's instruments, and two measurements. Medians of the wall and CPU
milliseconds of each step. Nothing is exported (the endpoint is a closed port, and nothing is
flushed).
"""

import argparse
import math
import os
import statistics
import time

from bench.common import machine, table


def steps(telemetry):
    """Each step's (wall, CPU) seconds, in a freshly forked child."""
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    timings, state = [], {}

    def timed(step):
        wall, cpu = time.perf_counter(), time.process_time()
        step()
        timings.append((time.perf_counter() - wall, time.process_time() - cpu))

    timed(lambda: state.update(provider=TracerProvider(resource=telemetry._sdk_resource)))
    timed(lambda: state.update(processor=BatchSpanProcessor(telemetry._span_exporter)))
    timed(lambda: (state["provider"].add_span_processor(state["processor"]),
                   trace.set_tracer_provider(state["provider"])))
    timed(lambda: state.update(tracer=telemetry._tracer()))
    timed(lambda: state["tracer"].start_span("first", attributes={"a": 1}).end())
    timed(lambda: state.update(reader=PeriodicExportingMetricReader(telemetry._metric_exporter,
                                                                    export_interval_millis=math.inf)))
    timed(lambda: metrics.set_meter_provider(MeterProvider(resource=telemetry._sdk_resource,
                                                           metric_readers=[state["reader"]])))
    timed(lambda: state.update(instruments=telemetry._Instruments(metrics.get_meter(telemetry.SCOPE))))
    timed(lambda: (state["instruments"].turns.add(1, {"a": "b"}), state["instruments"].duration.record(0.1, {"a": "b"})))
    return timings


NAMES = ["tracer provider", "batch span processor (starts its thread)", "set as the process's provider",
         "the app's tracer", "a first span", "metric reader", "meter provider, set", "the app's instruments",
         "two measurements"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--forks", type=int, default=40)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatproject.settings")
    os.environ.update({"CONVERSATIONS_TELEMETRY": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    print(machine())
    import django

    django.setup()
    from conversations.conf import get_config
    from conversations.infra import telemetry

    telemetry.configure(get_config()["TELEMETRY"])
    telemetry.warm_up(forking=True)
    rows = []
    for _ in range(args.forks):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(write, repr(steps(telemetry)).encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as answer:
            rows.append(eval(answer.read()))  # noqa: S307 - our own child's repr of floats
        os.waitpid(pid, 0)
    print(f"\n{args.forks} forks; medians in ms\n")
    table(["step", "wall", "CPU"], [[name, f"{statistics.median(r[i][0] for r in rows) * 1000:.2f}",
                                      f"{statistics.median(r[i][1] for r in rows) * 1000:.2f}"]
                                     for i, name in enumerate(NAMES)])


if __name__ == "__main__":
    main()
