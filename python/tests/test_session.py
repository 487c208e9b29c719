"""The Python worker's side of the connection (PROTOCOL.md sections 6 to 8), driven by a
scripted host over a socket pair: the handshake, calls, errors as data, cancellation,
shutdown, and the host's mistakes the worker must refuse."""

import socket
import struct
import threading
import time
import unittest

import spec  # noqa: F401 - puts the SDK on the path

import airlock_worker as aw
from airlock_worker import ErrorKind, ViolationCode, decode_value, encode_value

WAIT = 10  # seconds any single step may take before the test fails


def test_worker(**options):
    worker = aw.Worker("test-worker", "0.1.0", **options)

    @worker.method("echo")
    def echo(value):
        return value

    @worker.method("fail")
    def fail(message):
        raise aw.HandlerError(message, code=7)

    @worker.method("crash")
    def crash(_):
        return 1 / 0

    @worker.method("wait", takes_call=True)
    def wait(seconds, call):
        call.cancelled.wait(seconds)
        return "woke"

    @worker.method("gate")
    def gate(_):
        with worker.inside_gate:
            worker.waiting_at_gate += 1
            worker.inside_gate.notify_all()
        worker.gate.wait(WAIT)
        return "opened"

    @worker.method("grow")
    def grow(length):
        return "x" * length

    @worker.method("unencodable")
    def unencodable(_):
        return object()

    @worker.method("chatty", takes_call=True)
    def chatty(count, call):
        return [call.progress(i) for i in range(count)]

    worker.gate = threading.Event()
    worker.inside_gate = threading.Condition()
    worker.waiting_at_gate = 0
    return worker


class ScriptedHost:
    """The host's end of a socket pair, the worker serving the other end on a thread."""

    def __init__(self, worker, token=None):
        self.sock, theirs = socket.socketpair()
        self.sock.settimeout(WAIT)
        self.outcome = {}
        self.reader = aw._FrameReader(aw.DEFAULT_MAX_FRAME)
        self.thread = threading.Thread(
            target=self._serve, args=(worker, theirs, token), daemon=True
        )
        self.thread.start()

    def _serve(self, worker, sock, token):
        try:
            self.outcome["end"] = worker.serve(aw.Channel.from_socket(sock), token)
        except BaseException as err:  # noqa: BLE001 - the test inspects it
            self.outcome["error"] = err

    def send(self, *frames):
        self.sock.sendall(b"".join(aw.encode_frame(f) for f in frames))

    def send_raw(self, data):
        self.sock.sendall(data)

    def recv(self):
        """The worker's next frame; fails the test at end of stream or after WAIT seconds."""
        while True:
            payload = self.reader.next_frame()
            if payload is not None:
                return aw.decode_frame(payload)
            data = self.sock.recv(65536)
            if not data:
                raise AssertionError("the worker closed its stream")
            self.reader.feed(data)

    def rest(self):
        """Every frame the worker sends until it closes its stream."""
        frames = []
        while True:
            payload = self.reader.next_frame()
            if payload is not None:
                frames.append(aw.decode_frame(payload))
                continue
            data = self.sock.recv(65536)
            if not data:
                self.reader.finish()
                return frames
            self.reader.feed(data)

    def handshake(self, max_frame=aw.DEFAULT_MAX_FRAME, max_in_flight=64, max_progress=1024):
        hello = self.recv()
        self.send(aw.Welcome(max_frame, max_in_flight, max_progress))
        return hello

    def end(self):
        """How serve() ended: its return value, or the exception it raised."""
        self.thread.join(WAIT)
        if self.thread.is_alive():
            raise AssertionError("the worker is still serving")
        self.sock.close()
        return self.outcome.get("end", self.outcome.get("error"))


_next_id = [0]


def fresh_id():
    _next_id[0] += 1
    return _next_id[0].to_bytes(16, "little")


def call(host, method, value):
    call_id = fresh_id()
    host.send(aw.CallFrame(call_id, method, encode_value(value)))
    return call_id


class Handshake(unittest.TestCase):
    def test_hello_comes_first_and_names_the_worker_and_its_methods(self):
        host = ScriptedHost(test_worker())
        hello = host.recv()
        self.assertEqual(hello.protocol, aw.PROTOCOL_VERSION)
        self.assertEqual((hello.worker_name, hello.worker_version), ("test-worker", "0.1.0"))
        self.assertEqual(
            hello.methods,
            ("echo", "fail", "crash", "wait", "gate", "grow", "unencodable", "chatty"),
        )
        self.assertIsNone(hello.token)
        host.sock.shutdown(socket.SHUT_WR)
        self.assertEqual(host.end(), "closed")

    def test_a_token_is_quoted_in_the_hello(self):
        host = ScriptedHost(test_worker(), token=bytes(range(32)))
        self.assertEqual(host.recv().token, bytes(range(32)))
        host.sock.shutdown(socket.SHUT_WR)
        host.end()

    def test_a_refusal_ends_serving_with_its_reason(self):
        host = ScriptedHost(test_worker())
        host.recv()
        host.send(aw.Refuse(aw.RefuseReason.VersionMismatch, 1))
        self.assertEqual(host.rest(), [])
        refused = host.end()
        self.assertIsInstance(refused, aw.Refused)
        self.assertEqual(refused.reason, aw.RefuseReason.VersionMismatch)

    def test_a_frame_before_the_welcome_is_a_violation_and_the_worker_goes_quiet(self):
        host = ScriptedHost(test_worker())
        host.recv()
        host.send(aw.CallFrame(fresh_id(), "echo", encode_value(1)))
        self.assertEqual(host.rest(), [])
        self.assertEqual(host.end().code, ViolationCode.FrameBeforeHandshake)

    def test_a_welcome_out_of_range_is_refused(self):
        out_of_range = (aw.Welcome(8191, 1, 0), aw.Welcome(8192, 0, 0), aw.Welcome(8192, 65_537, 0))
        for welcome in out_of_range:
            host = ScriptedHost(test_worker())
            host.recv()
            host.send(welcome)
            self.assertEqual(host.rest(), [], welcome)
            self.assertEqual(host.end().code, ViolationCode.InvalidWelcome, welcome)

    def test_a_second_welcome_is_a_violation(self):
        host = ScriptedHost(test_worker())
        host.handshake()
        host.send(aw.Welcome(8192, 1, 0))
        self.assertEqual(host.end().code, ViolationCode.DuplicateHandshake)

    def test_before_the_welcome_frames_are_capped_by_the_workers_own_limit(self):
        host = ScriptedHost(test_worker(max_frame=8192))
        host.recv()
        host.send_raw(struct.pack("<I", 8193))  # the prefix alone: no payload follows
        self.assertEqual(host.end().code, ViolationCode.FrameTooLarge)

    def test_a_call_in_the_same_write_as_the_welcome_is_judged_by_the_welcomes_cap(self):
        host = ScriptedHost(test_worker(max_frame=8192))
        host.recv()
        big = "x" * 20_000
        call_id = fresh_id()
        host.send(aw.Welcome(65_536, 4, 0), aw.CallFrame(call_id, "echo", encode_value(big)))
        reply = host.recv()
        self.assertEqual((reply.id, decode_value(reply.body)), (call_id, big))


class Calls(unittest.TestCase):
    def setUp(self):
        self.host = ScriptedHost(test_worker())
        self.host.handshake()

    def tearDown(self):
        if self.host.thread.is_alive():
            self.host.send(aw.Shutdown())
            self.host.end()

    def test_a_call_is_answered_with_its_id_its_method_and_the_values_encoding(self):
        value = {"list": [1, aw.U64(2), "three", b"4", 5.5, None, True], -1: {}}
        call_id = call(self.host, "echo", value)
        reply = self.host.recv()
        self.assertIsInstance(reply, aw.Return)
        self.assertEqual((reply.id, reply.method), (call_id, "echo"))
        self.assertEqual(reply.body, encode_value(value))
        self.assertIsInstance(decode_value(reply.body)["list"][1], aw.U64)

    def test_a_handler_error_is_a_fail_of_kind_handler_with_its_code(self):
        call_id = call(self.host, "fail", "no such thing")
        reply = self.host.recv()
        self.assertEqual(reply, aw.Fail(call_id, "fail", ErrorKind.Handler, "no such thing", 7))

    def test_any_other_exception_is_a_fail_of_kind_panic(self):
        call_id = call(self.host, "crash", None)
        reply = self.host.recv()
        self.assertEqual((reply.id, reply.kind), (call_id, ErrorKind.Panic))
        self.assertEqual(reply.message, "handler raised ZeroDivisionError: division by zero")
        self.assertIsNone(reply.code)

    def test_a_message_is_cleaned_and_bounded_before_it_is_sent(self):
        call(self.host, "fail", "line one\nline two\u202e" + "é" * 4000)
        reply = self.host.recv()
        self.assertTrue(reply.message.startswith("line one line two "))
        self.assertLessEqual(len(reply.message.encode()), aw.MAX_ERROR_MESSAGE)
        self.assertFalse(any(aw.is_unsafe_in_text(c) for c in reply.message))

    def test_an_unknown_method_a_bad_request_and_an_unencodable_answer_are_errors_as_data(self):
        unknown = call(self.host, "nope", None)
        self.assertEqual(self.host.recv().kind, ErrorKind.UnknownMethod)
        bad_id = fresh_id()
        self.host.send(aw.CallFrame(bad_id, "echo", bytes.fromhex("0a")))
        bad = self.host.recv()
        self.assertEqual((bad.id, bad.kind), (bad_id, ErrorKind.BadRequest))
        self.assertIn("BadValueTag", bad.message)
        call(self.host, "unencodable", None)
        self.assertEqual(self.host.recv().kind, ErrorKind.Internal)
        self.assertNotEqual(unknown, bad_id)

    def test_the_worker_decodes_requests_within_its_budgets(self):
        host = ScriptedHost(test_worker(limits=aw.Limits(max_items=3)))
        host.handshake()
        call(host, "echo", [1, 2, 3, 4])
        reply = host.recv()
        self.assertEqual(reply.kind, ErrorKind.BadRequest)
        self.assertIn("ItemLimit", reply.message)
        call(host, "echo", [1, 2, 3])
        self.assertEqual(decode_value(host.recv().body), [1, 2, 3])
        host.send(aw.Shutdown())
        self.assertEqual(host.end(), "shutdown")

    def test_a_response_over_the_hosts_max_frame_is_a_fail_of_kind_limit(self):
        host = ScriptedHost(test_worker())
        host.handshake(max_frame=8192)
        call(host, "grow", 8192)
        reply = host.recv()
        self.assertEqual(reply.kind, ErrorKind.Limit)
        self.assertIn("max_frame (8192)", reply.message)
        host.send(aw.Shutdown())
        host.end()

    def test_progress_stays_within_the_hosts_quota_and_before_the_terminal_frame(self):
        host = ScriptedHost(test_worker())
        host.handshake(max_progress=2)
        call_id = call(host, "chatty", 4)
        frames = [host.recv() for _ in range(3)]
        self.assertEqual([type(f) for f in frames], [aw.Progress, aw.Progress, aw.Return])
        self.assertEqual([decode_value(f.body) for f in frames[:2]], [0, 1])
        self.assertEqual(decode_value(frames[2].body), [True, True, False, False])
        self.assertTrue(all(f.id == call_id for f in frames))
        host.send(aw.Shutdown())
        host.end()

    def test_concurrent_answers_are_written_whole(self):
        # Many handler threads answer at once with bodies larger than a socket buffer: every
        # frame must arrive intact, each call answered exactly once.
        bodies = {}
        for i in range(40):
            value = bytes([i]) * 150_000
            bodies[call(self.host, "echo", value)] = value
        answered = {}
        for _ in bodies:
            reply = self.host.recv()
            self.assertNotIn(reply.id, answered)
            answered[reply.id] = decode_value(reply.body)
        self.assertEqual(answered, bodies)

    def test_calls_run_concurrently_up_to_max_concurrency(self):
        worker = test_worker(max_concurrency=3)
        host = ScriptedHost(worker)
        host.handshake()
        ids = [call(host, "gate", None) for _ in range(4)]
        # Three handlers wait at the gate at once; the fourth call waits for a thread.
        with worker.inside_gate:
            self.assertTrue(worker.inside_gate.wait_for(lambda: worker.waiting_at_gate == 3, WAIT))
        time.sleep(0.2)
        self.assertEqual(worker.waiting_at_gate, 3)
        worker.gate.set()
        replies = {host.recv().id for _ in ids}
        self.assertEqual(replies, set(ids))
        self.assertEqual(worker.waiting_at_gate, 4)
        host.send(aw.Shutdown())
        host.end()


class Cancellation(unittest.TestCase):
    def test_a_cancel_is_answered_at_once_and_the_handler_sees_it(self):
        host = ScriptedHost(test_worker())
        host.handshake()
        call_id = call(host, "wait", 30)
        time.sleep(0.1)
        host.send(aw.Cancel(call_id))
        reply = host.recv()
        expected = aw.Fail(call_id, "wait", ErrorKind.Cancelled, "cancelled by the host", None)
        self.assertEqual(reply, expected)
        # The handler woke on the cancel; its answer is dropped, and the worker serves on.
        after = call(host, "echo", "still here")
        reply = host.recv()
        self.assertEqual((reply.id, decode_value(reply.body)), (after, "still here"))
        host.send(aw.Shutdown())
        self.assertEqual(host.rest(), [])
        self.assertEqual(host.end(), "shutdown")

    def test_a_cancel_that_crosses_the_answer_is_ignored(self):
        host = ScriptedHost(test_worker())
        host.handshake()
        call_id = call(host, "echo", 1)
        self.assertIsInstance(host.recv(), aw.Return)
        host.send(aw.Cancel(call_id))
        after = call(host, "echo", 2)
        self.assertEqual(host.recv().id, after)
        host.send(aw.Shutdown())
        self.assertEqual(host.end(), "shutdown")

    def test_a_cancel_for_an_id_never_received_is_a_violation(self):
        host = ScriptedHost(test_worker())
        host.handshake()
        host.send(aw.Cancel(fresh_id()))
        self.assertEqual(host.rest(), [])
        self.assertEqual(host.end().code, ViolationCode.UnknownCallId)


class HostMistakes(unittest.TestCase):
    def refused_with(self, code, frames, max_in_flight=64):
        host = ScriptedHost(test_worker())
        host.handshake(max_in_flight=max_in_flight)
        host.send(*frames)
        host.rest()
        self.assertEqual(host.end().code, code)

    def test_a_reused_call_id_is_a_violation(self):
        call_id = fresh_id()
        frame = aw.CallFrame(call_id, "echo", encode_value(1))
        self.refused_with(ViolationCode.DuplicateCallId, [frame, frame])

    def test_more_calls_than_max_in_flight_is_a_violation(self):
        calls = [aw.CallFrame(fresh_id(), "wait", encode_value(5)) for _ in range(3)]
        self.refused_with(ViolationCode.TooManyCalls, calls, max_in_flight=2)

    def test_a_method_name_breaking_the_rule_is_a_violation(self):
        bad_name = aw.CallFrame(fresh_id(), "no spaces", b"\x00")
        self.refused_with(ViolationCode.InvalidName, [bad_name])

    def test_worker_bound_kinds_from_the_host_are_forbidden(self):
        self.refused_with(ViolationCode.ForbiddenKind, [aw.Return(fresh_id(), "echo", b"\x00")])

    def test_a_payload_that_is_not_a_frame_is_malformed(self):
        host = ScriptedHost(test_worker())
        host.handshake()
        host.send_raw(b"\x02\x00\x00\x00\x08\x00")  # Shutdown and a stray byte
        self.assertEqual(host.end().code, ViolationCode.MalformedFrame)

    def test_a_stream_ending_inside_a_frame_is_truncated(self):
        host = ScriptedHost(test_worker())
        host.handshake()
        host.send_raw(b"\x10\x00\x00\x00\x03")
        host.sock.shutdown(socket.SHUT_WR)
        self.assertEqual(host.end().code, ViolationCode.TruncatedFrame)


class Shutdown(unittest.TestCase):
    def test_shutdown_waits_for_calls_in_flight_then_closes(self):
        worker = test_worker()
        host = ScriptedHost(worker)
        host.handshake()
        call_id = call(host, "gate", None)
        time.sleep(0.1)
        host.send(aw.Shutdown(), aw.Shutdown())  # a second Shutdown is ignored
        worker.gate.set()
        frames = host.rest()
        self.assertEqual([(type(f), f.id) for f in frames], [(aw.Return, call_id)])
        self.assertEqual(host.end(), "shutdown")

    def test_a_call_after_shutdown_is_a_violation(self):
        host = ScriptedHost(test_worker())
        host.handshake()
        host.send(aw.Shutdown(), aw.CallFrame(fresh_id(), "echo", b"\x00"))
        host.rest()
        self.assertEqual(host.end().code, ViolationCode.ForbiddenKind)

    def test_the_hosts_end_of_stream_ends_serving_cleanly(self):
        host = ScriptedHost(test_worker())
        host.handshake()
        host.sock.shutdown(socket.SHUT_WR)
        self.assertEqual(host.rest(), [])
        self.assertEqual(host.end(), "closed")


class Registration(unittest.TestCase):
    def test_names_that_break_the_rule_are_refused_before_any_hello(self):
        with self.assertRaises(ValueError):
            aw.Worker("has space", "1.0")
        with self.assertRaises(ValueError):
            aw.Worker("ok", "1.0.0+build")
        worker = aw.Worker("ok", "1.0")
        for name in ("", "x" * 65, "a/b", "é"):
            with self.assertRaises(ValueError, msg=name):
                worker.add_method(name, print)
        worker.add_method("x" * 64, print)
        with self.assertRaises(ValueError):
            worker.add_method("x" * 64, print)

    def test_a_handler_error_code_is_a_u32(self):
        for code in (-1, 2**32, 1.5, True):
            with self.assertRaises(ValueError, msg=repr(code)):
                aw.HandlerError("m", code=code)
        self.assertEqual(aw.HandlerError("m", code=2**32 - 1).code, 2**32 - 1)


if __name__ == "__main__":
    unittest.main()
