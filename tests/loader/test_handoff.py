"""``loader.handoff``: a reading-ahead thread's worker start runs in the consumer thread, its error raised where asked,
and a closed loader's wait ends."""

from __future__ import annotations

import threading

from lightning_dataperf.loader.handoff import Handoff, ReadAhead, start_workers


def _made_in() -> str:
    return threading.current_thread().name


def test_a_start_inside_a_read_ahead_runs_in_the_consumer_thread_and_outside_runs_where_it_is():
    handoff = Handoff(threading.Event())

    def switching():  # as the loop's iterator: a switch inside next() starts workers
        for value in range(3):
            yield value, start_workers(_made_in)

    source = ReadAhead(switching(), handoff)
    seen: list[tuple[int, str]] = []

    def read() -> None:
        seen.extend(source)

    reader = threading.Thread(target=read, name="reader")
    reader.start()
    while reader.is_alive():
        handoff.serve()
        reader.join(0.01)
    assert seen == [(0, "MainThread"), (1, "MainThread"), (2, "MainThread")]
    assert start_workers(_made_in) == "MainThread"  # no read-ahead: called where it is
    assert handoff.call(_made_in) == "MainThread"  # the consumer asking itself does not wait


def test_an_error_reaches_the_reader_and_a_stop_ends_the_wait():
    stop = threading.Event()
    handoff = Handoff(stop)
    errors: list[BaseException] = []

    def fails():
        raise ValueError("no workers")

    def ask(make) -> None:
        try:
            handoff.call(make)
        except BaseException as error:
            errors.append(error)

    reader = threading.Thread(target=ask, args=(fails,))
    reader.start()
    while reader.is_alive():
        handoff.serve()
        reader.join(0.01)
    assert isinstance(errors[0], ValueError)
    waiting = threading.Thread(target=ask, args=(_made_in,))  # never served: the loader closes
    waiting.start()
    stop.set()
    waiting.join(5)
    assert not waiting.is_alive() and "closed" in str(errors[1])


def test_read_ahead_clears_its_mark_after_each_item():
    """A reading thread's own worker starts outside ``next()`` run in it, not handed to a consumer never serving."""
    stop = threading.Event()
    handoff = Handoff(stop)
    got: list = []

    def read() -> None:
        got.append(list(ReadAhead(iter([1, 2]), handoff)))
        try:
            got.append(start_workers(_made_in))
        except RuntimeError as error:  # the mark left set: handed off, and never served
            got.append(str(error))

    reader = threading.Thread(target=read, name="reader")
    reader.start()
    reader.join(2)
    stop.set()
    reader.join(5)
    assert got == [[1, 2], "reader"]
