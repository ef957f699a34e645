"""Run a test's coroutine on a fresh event loop that fails the test on any unhandled error.

What counts as unhandled is everything asyncio hands to the loop's exception handler: a
callback that raised, "Task exception was never retrieved" and "Future exception was
never retrieved" (reported when the task or future is garbage collected, so the loop's
objects are collected before the verdict), "Task was destroyed but it is pending", an
unclosed transport or client session; and a task still running when the test ends that
then fails on its way out. Each is reported with its traceback.

Both loops the product runs on are available: ``asyncio`` and ``uvloop``.

A test that runs too long is ended by the loop itself, at a deadline set below
pytest-timeout's: the alarm pytest-timeout raises lands wherever the main thread happens
to be, and inside a callback or another task asyncio takes it for that callback's error,
so the test would go on.
"""

from __future__ import annotations

import asyncio
import gc
import traceback
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

LOOPS = ("asyncio", "uvloop")
SHUTDOWN_SECONDS = 10.0  # for the tasks a test left running to end once cancelled


def new_loop(kind: str) -> asyncio.AbstractEventLoop:
    """A new, unset event loop of ``kind`` (``asyncio`` or ``uvloop``)."""
    if kind == "uvloop":
        import uvloop

        return uvloop.new_event_loop()
    if kind == "asyncio":
        return asyncio.new_event_loop()
    raise ValueError(f"unknown event loop {kind!r}; expected one of {LOOPS}")


class LoopErrors:
    """The loop's exception handler: keeps every context it is given. One whose exception
    is not an ``Exception`` (pytest's timeout, KeyboardInterrupt) stops the loop, to be
    raised by ``run_guarded``."""

    def __init__(self) -> None:
        self.contexts: list[dict[str, Any]] = []
        self.interrupt: BaseException | None = None

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        error = context.get("exception")
        if isinstance(error, BaseException) and not isinstance(error, Exception):
            self.interrupt = self.interrupt or error
            loop.stop()
            return
        self.contexts.append(context)

    def report(self) -> str:
        """Each error's message, what it was about, and its traceback."""
        parts = []
        for context in self.contexts:
            lines = [f"- {context.get('message', 'unhandled error')}"]
            for key in ("task", "future", "handle", "transport", "protocol"):
                if key in context:
                    lines.append(f"  {key}: {context[key]!r}"[:500])
            error = context.get("exception")
            if isinstance(error, BaseException):
                lines.extend(
                    "  " + line for line in "".join(traceback.format_exception(error)).splitlines()
                )
            parts.append("\n".join(lines))
        return "\n".join(parts)


def _finish_leftovers(loop: asyncio.AbstractEventLoop, errors: LoopErrors) -> None:
    """Cancel the tasks still running, let them end, and report those that fail doing so
    (as ``asyncio.run`` does)."""
    tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.wait(tasks, timeout=SHUTDOWN_SECONDS))
    for task in tasks:
        if not task.done():
            errors.contexts.append({"message": "task ignored its cancellation", "task": task})
        elif not task.cancelled() and task.exception() is not None:
            errors.contexts.append(
                {
                    "message": "task failed while the test's loop shut down",
                    "exception": task.exception(),
                    "task": task,
                }
            )


async def _within(deadline: float | None, main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    if deadline is None:
        return await main()
    try:
        return await asyncio.wait_for(main(), deadline)
    except TimeoutError as exc:  # chained: where the test was waiting when cancelled
        raise AssertionError(f"the test did not end within {deadline:g} s") from exc


def run_guarded(
    kind: str, main: Callable[[], Coroutine[Any, Any, T]], deadline: float | None = None
) -> T:
    """``main()`` on a new ``kind`` loop, cancelled after ``deadline`` seconds; raise
    AssertionError if anything went unhandled.

    An error of ``main`` itself is raised as it is, with the loop's errors (if any) noted
    on it, so that neither hides the other."""
    loop = new_loop(kind)
    errors = LoopErrors()
    loop.set_exception_handler(errors)
    try:
        try:
            try:
                result = loop.run_until_complete(_within(deadline, main))
            except RuntimeError:
                if errors.interrupt is None:
                    raise
                raise errors.interrupt from None  # the loop was stopped to let it out
        finally:
            try:
                _finish_leftovers(loop, errors)
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                loop.close()
                del loop
                gc.collect()  # tasks and futures report a lost exception when collected
    except BaseException as failure:
        if errors.contexts:
            failure.add_note(f"unhandled errors on the {kind} loop:\n{errors.report()}")
        raise
    if errors.contexts:
        raise AssertionError(f"unhandled errors on the {kind} loop:\n{errors.report()}")
    return result
