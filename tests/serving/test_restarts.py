"""Which deaths of tritonserver `xform serve` restarts (serving/lifecycle.py's Restarts): crashes by a
fault signal, at most --restarts of them within any ten minutes; never a kill, a stop or an exit
of its own. The real restart, on a real server, is tests/serving/test_lifecycle.py's."""
import signal

import pytest

from xform.serving.lifecycle import Restarts, crashed


@pytest.mark.parametrize("sig", [signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGFPE, signal.SIGILL])
def test_a_fault_signal_is_a_crash(sig):
    assert crashed(-int(sig))


@pytest.mark.parametrize("code", [None, 0, 1, 2, -int(signal.SIGKILL), -int(signal.SIGTERM), -int(signal.SIGINT)])
def test_a_kill_a_stop_or_an_exit_is_not(code):
    assert not crashed(code)
    assert not Restarts(5).allow(code)


def test_at_most_limit_restarts_within_the_window():
    now = [0.0]
    restarts = Restarts(2, window=600, clock=lambda: now[0])
    segv = -int(signal.SIGSEGV)
    assert restarts.allow(segv) and restarts.count == 1
    now[0] = 100
    assert restarts.allow(segv) and restarts.count == 2
    now[0] = 599
    assert not restarts.allow(segv)  # a third within 600 s of the first
    now[0] = 601
    assert restarts.allow(segv) and restarts.count == 3  # the first left the window
    now[0] = 650
    assert not restarts.allow(segv)  # 100 and 601 are still in it


def test_no_restarts_and_a_bad_limit():
    assert not Restarts(0).allow(-int(signal.SIGSEGV))
    with pytest.raises(ValueError, match="at least 0"):
        Restarts(-1)


def test_the_line_serve_prints_names_the_crash_and_the_bound():
    restarts = Restarts(3)
    assert restarts.allow(-int(signal.SIGSEGV))
    line = restarts.said("tritonserver exited on its own with code -11 (SIGSEGV)", None)
    assert "restart 1 (at most 3 in 600 s)" in line and "gRPC client cancels" in line


def test_a_send_triton_never_takes_aborts_once():
    """serving/stall.py: the engine's responder blocked in a send (Triton 2.51 wedged so under
    cancellations, issue 55) is seen by the watch thread past the bound, and the abort that makes
    serve restart the server is made once; a send that returns in time never aborts."""
    import threading

    from xform.serving.stall import Stall
    aborted: list[float] = []
    stall = Stall(0.2, aborted.append)
    stop = threading.Event()
    watch = stall.watch(stop, poll=0.02)
    with stall.sending():
        stop.wait(0.05)  # a send Triton takes at once
    assert not aborted
    wedged = threading.Event()

    def responder():
        with stall.sending():
            wedged.wait(5)  # a send that does not return
    thread = threading.Thread(target=responder)
    thread.start()
    deadline = threading.Event()
    deadline.wait(1.0)
    wedged.set()
    thread.join(5)
    stop.set()
    watch.join(5)
    assert len(aborted) == 1 and 0.2 < aborted[0] < 1.0, aborted


def test_the_stall_bound_comes_only_from_serve(monkeypatch):
    from xform.serving.stall import STALL_ENV, stall_seconds
    monkeypatch.delenv(STALL_ENV, raising=False)
    assert stall_seconds() is None  # a tritonserver run by hand is never aborted
    for value, want in (("20", 20.0), ("0", None), ("x", None), ("-3", None)):
        monkeypatch.setenv(STALL_ENV, value)
        assert stall_seconds() == want


def test_the_reason_a_server_died_is_its_logs_last_error_not_a_benign_one():
    """A crash's cause is the log's last error (Triton 2.51's gRPC 'ASSERTION FAILED: prior > 0'
    before its SIGABRT, seen in a soak), never the line every start says without a GPU."""
    from xform.serving.lifecycle import first_error

    class Logged:
        def log_tail(self, lines):
            return "\n".join([
                "E1127 23:01:01.000 1 cuda.cc:1] CudaDriverHelper has not been initialized.",
                "I1127 23:01:02.000 1 server.cc:1] started",
                "E1127 23:01:03.000 1 model.cc:1] failed to load 'b': no bundle",
                "E1127 23:02:06.181 2 sync.cc:105]      ASSERTION FAILED: prior > 0",
                "Signal (6) received."])
    assert first_error(Logged()) == "failed to load 'b': no bundle"
    assert first_error(Logged(), last=True) == "ASSERTION FAILED: prior > 0"
