"""An airlock worker in Python: four methods over dynamic Values.

Run by an airlock host, for example from Rust::

    Host::builder("/usr/bin/python3").arg("python/example_worker.py").spawn().await?

- ``echo``: returns its request unchanged (any Value).
- ``divide``: ``{"a": number, "b": number}`` -> ``a / b``. A request of another shape is the
  caller's mistake, answered with ``HandlerError`` (kind ``Handler``, code 1); ``b == 0``
  raises ``ZeroDivisionError``, which the worker reports as kind ``Panic``.
- ``sleep``: waits the given milliseconds, then returns them; stops early when the host
  cancels the call.
- ``cancelled``: how many ``sleep`` calls a cancel has stopped so far.
"""

import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import airlock_worker  # noqa: E402 - found beside this file

worker = airlock_worker.Worker("example-py", "1.0.0")

_stopped = 0
_stopped_lock = threading.Lock()


@worker.method("echo")
def echo(value):
    return value


@worker.method("divide")
def divide(request):
    numbers = (int, float)
    if not (
        isinstance(request, dict)
        and set(request) == {"a", "b"}
        and all(isinstance(request[k], numbers) and not isinstance(request[k], bool) for k in "ab")
    ):
        raise airlock_worker.HandlerError("divide takes {'a': number, 'b': number}", code=1)
    return request["a"] / request["b"]


@worker.method("sleep", takes_call=True)
def sleep(millis, call):
    if not isinstance(millis, int) or isinstance(millis, bool) or millis < 0:
        raise airlock_worker.HandlerError("sleep takes a number of milliseconds", code=1)
    if call.cancelled.wait(millis / 1000):
        global _stopped
        with _stopped_lock:
            _stopped += 1
    return millis


@worker.method("cancelled")
def cancelled(_request):
    with _stopped_lock:
        return _stopped


if __name__ == "__main__":
    sys.exit(worker.run())
