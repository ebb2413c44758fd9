"""Stub processes read from /proc (serving/residency.py), and the watch's rule for a stub that
left (lifecycle.died): an unloaded model's stub is no death, one of a model still READY is.
Stand-in stubs: processes whose argv[0] is `.../triton_python_backend_stub` and which name a
model.py, as Triton's do. No Triton here."""
import os
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

from xform.serving import residency
from xform.serving.lifecycle import died, index

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def fake_stub(tmp_path, model):
    script = "import time; time.sleep(60)"
    return subprocess.Popen(["bash", "-c", f'exec -a {tmp_path}/backends/triton_python_backend_stub "$0" -c '
                                           f'"{script}" {tmp_path}/repo/{model}/1/model.py shm-region',
                             sys.executable])


def test_stubs_their_models_memory_and_exit(tmp_path):
    a, b = fake_stub(tmp_path, "en-de-stream"), fake_stub(tmp_path, "translate")
    try:
        for _ in range(100):  # until exec has replaced bash
            found = residency.stub_models(residency.children(os.getpid()))
            if len(found) == 2:
                break
            time.sleep(0.05)
        assert found == {a.pid: "en-de-stream", b.pid: "translate"}
        assert residency.stubs_of("translate", found) == [b.pid]
        for _ in range(100):  # exec has renamed the process before Python has loaded: wait for its pages
            if residency.memory_bytes(a.pid) > 1 << 20:
                break
            time.sleep(0.05)
        assert 1 << 20 < residency.memory_bytes(a.pid) < 1 << 30
        assert residency.stub_model(os.getpid()) is None  # not a stub
        assert residency.wait_gone([a.pid], 0.1) == [a.pid]
        a.kill()
        a.wait()
        assert residency.wait_gone([a.pid], 5) == [] and residency.memory_bytes(a.pid) == 0
    finally:
        for p in (a, b):
            p.kill()
            p.wait()


@dataclass
class Server:
    explicit: bool
    ready: set

    def ready_models(self):
        return self.ready


def test_a_stub_gone_is_a_death_only_while_its_model_is_ready_and_not_reloaded():
    before = {1: "a-stream", 2: "translate", 3: "b-stream"}
    gone = {1: "a-stream", 3: "b-stream"}
    server = Server(True, {"translate", "b-stream"})
    # a-stream unloaded (not READY): no death; b-stream still READY: its stub died
    assert died(server, gone, before, {2: "translate"}, index(server)) == [3]
    # b-stream READY again in a new stub (pid 4): unloaded and loaded again between two looks
    assert died(server, gone, before, {2: "translate", 4: "b-stream"}, index(server)) == []
    # no explicit model control: every stub is there from the start, any gone one died
    assert died(Server(False, set()), gone, before, {2: "translate"}, set()) == [1, 3]


def test_an_index_that_does_not_answer_counts_the_gone_stubs_as_dead():
    class Silent(Server):
        def ready_models(self):
            raise TimeoutError("timed out")
    server = Silent(True, set())
    assert index(server) is None
    assert died(server, {3: "b-stream"}, {3: "b-stream"}, {}, index(server)) == [3]


def test_the_watch_keeps_a_killed_stubs_model_while_its_command_line_is_already_gone(monkeypatch):
    """A stub being killed was seen listed once more after its command line had gone (read as no
    model), then gone: the watch still knows which model it ran, so its death stops serve."""
    from xform.serving import lifecycle
    monkeypatch.setattr(lifecycle, "STUB_GRACE", 0.0)  # a fake tritonserver that never exits: no wait for it
    looks = iter([{2: "translate", 3: "b-stream"}, {2: "translate", 3: ""}, {2: "translate"}])
    monkeypatch.setattr(lifecycle, "running", lambda server: next(looks, {2: "translate"}))

    class Watched(Server):
        process = type("P", (), {"poll": lambda self: None})()

    class Stop:
        polls = 0

        @property
        def requested(self):
            self.polls += 1
            return self.polls > 10  # the watch would go on for ever: stop it

        name = "SIGTERM"
    outcome, said = lifecycle.watch(Watched(True, {"translate", "b-stream"}), Stop(), poll=0)
    assert outcome == lifecycle.STUB_DIED and "(pid 3) died" in said, said


def replay(monkeypatch, looks):
    """lifecycle.watch over `looks`: (the stubs tritonserver has, the models READY) at each poll;
    then stopped if nothing died."""
    from xform.serving import lifecycle
    monkeypatch.setattr(lifecycle, "STUB_GRACE", 0.0)  # a fake tritonserver that never exits: no wait for it
    server = type("Watched", (Server,), {"process": type("P", (), {"poll": lambda self: None})()})(True, set())
    seen = iter(looks)

    def running(_):
        stubs, server.ready = next(seen, (looks[-1][0], looks[-1][1]))
        return dict(stubs)
    monkeypatch.setattr(lifecycle, "running", running)

    class Stop:
        polls, name = 0, "SIGTERM"

        @property
        def requested(self):
            self.polls += 1
            return self.polls > len(looks) + 5
    return lifecycle.watch(server, Stop(), poll=0)


def test_a_stub_killed_before_the_watch_read_its_model_is_a_death_once_its_model_has_no_stub(monkeypatch):
    """As seen on Triton 2.51: a load starts a stub that checks the model's config, then the
    instance's; the watch saw the instance's stub only before its exec (no model in its command
    line), and then it was killed: its model is READY with no stub, a death."""
    from xform.serving import lifecycle
    outcome, said = replay(monkeypatch, [({2: "translate"}, {"translate"}),
                                         ({2: "translate", 3: "b-stream"}, {"translate"}),  # the config's stub
                                         ({2: "translate", 4: ""}, {"translate"}),  # the instance's, before exec
                                         ({2: "translate"}, {"translate", "b-stream"})])  # killed
    assert outcome == lifecycle.STUB_DIED and "(pid 4) died" in said, said
    # the config's stub, gone before its command line was read, while its model loads: no death
    outcome, _ = replay(monkeypatch, [({2: "translate"}, {"translate"}), ({2: "translate", 3: ""}, {"translate"}),
                                      ({2: "translate", 4: ""}, {"translate"}),
                                      ({2: "translate", 4: "b-stream"}, {"translate", "b-stream"})])
    assert outcome == lifecycle.STOPPED


def test_an_instance_stub_the_watch_never_saw_is_a_death_by_its_model_left_with_no_stub(monkeypatch):
    """Also seen: the config's stub seen and gone while its model loads, the instance's started,
    served and was killed between two looks: its model is READY with no stub, a death."""
    from xform.serving import lifecycle
    outcome, said = replay(monkeypatch, [({2: "translate"}, {"translate"}),
                                         ({2: "translate", 3: "b-stream"}, {"translate"}),
                                         ({2: "translate"}, {"translate"}),
                                         ({2: "translate"}, {"translate", "b-stream"})])
    assert outcome == lifecycle.STUB_DIED and "leaving b-stream READY with no stub" in said, said


def test_the_watch_asks_the_index_once_a_poll(monkeypatch):
    """Both rules (a gone stub's model still READY; a READY model with no stub) read one answer
    of Triton's index a poll, not a request each: stubs gone at two polls (their models
    unloaded, no death), and the index asked once at each poll that slept after its look."""
    from xform.serving import lifecycle
    looks = [({2: "translate", 3: "a-stream"}, {"translate", "a-stream"}), ({2: "translate"}, {"translate"}),
             ({2: "translate", 4: "b-stream"}, {"translate", "b-stream"}), ({2: "translate"}, {"translate"})]
    asked, slept = [], []
    monkeypatch.setattr(Server, "ready_models", lambda self: asked.append(1) or self.ready)
    monkeypatch.setattr(lifecycle.time, "sleep", lambda s: slept.append(s))
    outcome, _ = replay(monkeypatch, looks)
    assert outcome == lifecycle.STOPPED and slept
    assert len(asked) == len(slept), (len(asked), len(slept))


def test_stubs_gone_with_a_tritonserver_that_exits_are_its_crash(monkeypatch):
    """An aborting tritonserver takes its stubs a moment before it is reaped (Triton 2.51's gRPC
    'ASSERTION FAILED: prior > 0', seen in the soak): the stub's end, seen first, waits for the
    server's exit and is reported as that crash (restartable), not as a stub's death (exit 1)."""
    from xform.serving import lifecycle
    looks = iter([{2: "translate", 3: "b-stream"}, {2: "translate"}])
    monkeypatch.setattr(lifecycle, "running", lambda server: next(looks, {2: "translate"}))
    monkeypatch.setattr(lifecycle, "index", lambda server: {"translate", "b-stream"})
    polls = []

    class Aborting:
        returncode = -6

        def poll(self):  # alive for the watch's first looks, then the abort's exit
            polls.append(1)
            return None if len(polls) < 4 else -6

    class Watched(Server):
        process = Aborting()

    class Stop:
        requested, name = False, "SIGTERM"
    outcome, said = lifecycle.watch(Watched(True, {"translate", "b-stream"}), Stop(), poll=0)
    assert outcome == lifecycle.DIED and "code -6 (SIGABRT)" in said, said
