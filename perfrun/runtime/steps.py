"""Step-boundary detection: a small state machine fed phase events.

It knows nothing of torch, so every rule below is unit-tested on hand-written
event sequences (tests/test_steps.py).

The rules (documented in the README):

* A step is one cycle of the phases the script actually has. Steps are
  contiguous: a step starts at the start of its *leading* event and ends at
  the start of the next step's leading event, so the loop body's own code
  (logging, metric updates) belongs to the step it follows, as it does with
  `prof.step()` at the end of a loop.
* The leading event is the DataLoader fetch once a training DataLoader has
  been seen; otherwise the first event of the step, identified by kind and
  object: the forward of the same root module (not the loss module called
  after it), the `zero_grad` or `optimizer.step(closure)` (LBFGS) of the same
  optimizer.
* A step *closes* (may end at the next leading event) after the event chosen
  by `step_on`: `optimizer` (the default when an optimizer exists) closes on
  `optimizer.step`; with no optimizer every event closes, so a cycle is simply
  delimited by its leading event (hand-written SGD, inference loops). This is
  what keeps gradient accumulation (several fetch/forward/backward cycles per
  optimizer step) one step, and a GAN's two optimizer steps per batch one step.
* Evaluation passes: a forward or a fetch made with gradients disabled
  (`torch.no_grad`, `inference_mode`) once the script is known to train (an
  optimizer exists or a backward ran) is evaluation. Consecutive evaluation
  events form one span, which is timed and counted apart (the Eval row) and
  subtracted from the step it falls in, so evaluation neither adds steps nor
  inflates batch_cost.
* DataLoader iterator creation (worker start-up) and the fetch that raises
  StopIteration are excluded in the same way; the latter also ends the
  current step when it has closed, since it marks the end of the loop body.
* The last step ends where it closed (its optimizer step) if no leading
  event follows; a step that never closed is incomplete and dropped. A call
  that raised closes nothing, so a run that dies inside `optimizer.step`
  does not count the step it was in as done.
"""

from __future__ import annotations

from typing import Callable, Optional

# Phase kinds. ZERO_GRAD counts as Optimization time but never closes a step.
DATA, FWD, BWD, OPT, ZERO = 0, 1, 2, 3, 4
KIND_NAMES = ("dataloader", "forward", "backward", "optimization", "zero_grad")
# Column (in the step row) each kind's time is added to.
_COLUMN = (0, 1, 2, 3, 3)

_CLOSERS = {
    "optimizer": (OPT,),
    "forward": (FWD,),
    "backward": (BWD,),
    "dataloader": (DATA,),
}

StepCallback = Callable[[int, float], None]
# (index, time, committed): committed is False when a step that had just
# opened is cancelled (its leading fetch raised StopIteration).
EndCallback = Callable[[int, float, bool], None]


class StepTracker:
    """Accumulates phase time into steps and decides where steps begin and end.

    Rows are lists laid out as results.STEP_COLUMNS (GPU columns are filled in
    later by the GPU timer, when there is one).
    """

    def __init__(
        self,
        step_on: str = "auto",
        on_begin: Optional[StepCallback] = None,
        on_end: Optional[EndCallback] = None,
    ) -> None:
        if step_on != "auto" and step_on not in _CLOSERS:
            raise ValueError(f"unknown step_on {step_on!r}")
        self.step_on = step_on
        self.on_begin = on_begin
        self.on_end = on_end
        self.rows: list[list] = []
        # What the script has shown so far.
        self.optimizer_seen = False  # set by the hooks when an optimizer is built
        self.training_seen = False  # a backward or optimizer step ran
        self.train_data_seen = False  # a DataLoader fetch happened inside a step
        # The open step.
        self.open = False
        self.closed = False
        self.start = 0.0
        self.first_kind = -1
        self.first_ident: object = None
        self.close_t = 0.0
        self.excl_at_close = 0.0
        self.acc_at_close = [0.0, 0.0, 0.0, 0.0]
        self.calls_at_close = [0, 0, 0, 0]
        self.samples_at_close = 0
        self._reset_accumulators()
        # Evaluation spans.
        self.eval_open = False
        self.eval_start = 0.0
        self.eval_last = 0.0
        # Iterator creation since the span's last event: it joins the span
        # only if another evaluation event follows it.
        self.eval_tail = 0.0
        self.eval_time = 0.0
        self.eval_spans = 0
        self.eval_forward_calls = 0
        # Excluded DataLoader work, for the report.
        self.init_calls = 0
        self.init_time = 0.0
        self.stop_calls = 0
        self.stop_time = 0.0

    def _reset_accumulators(self) -> None:
        self.acc = [0.0, 0.0, 0.0, 0.0]
        self.calls = [0, 0, 0, 0]
        self.samples = 0
        self.excl = 0.0

    # -- queries ------------------------------------------------------------

    @property
    def current_index(self) -> int:
        """Index of the open step (or of the next one, when none is open)."""
        return len(self.rows)

    def is_eval(self, kind: int, grad: bool) -> bool:
        return (
            not grad
            and (kind == FWD or kind == DATA)
            and (self.optimizer_seen or self.training_seen)
        )

    # -- events ---------------------------------------------------------------

    def begin(self, kind: int, t: float, grad: bool = True, ident: object = None) -> bool:
        """A top-level phase starts at `t`. `ident` names the object behind it
        (the module called, the optimizer stepped). Returns True when the
        event is evaluation."""
        # is_eval(), inlined: this runs at every phase edge.
        if (
            not grad
            and (kind == FWD or kind == DATA)
            and (self.optimizer_seen or self.training_seen)
        ):
            if not self.eval_open:
                self.eval_open = True
                self.eval_start = t
                self.eval_spans += 1
            return True
        if self.eval_open:
            self._close_eval()
        if kind == BWD or kind == OPT:
            self.training_seen = True
        if kind == DATA:
            self.train_data_seen = True
        if self.open:
            if self.closed and (
                kind == DATA
                if self.train_data_seen
                else kind == self.first_kind and ident == self.first_ident
            ):
                self._commit(t, self.excl)
                self._open(t, kind, ident)
        else:
            self._open(t, kind, ident)
        return False

    def end(
        self, kind: int, t: float, exclusive: float, is_eval: bool = False, failed: bool = False
    ) -> None:
        """A phase (top-level or nested) ends at `t` having taken `exclusive`
        seconds of its own. `failed`: the call raised, so it closes nothing
        (an optimizer step that raised is no completed step)."""
        if is_eval:
            self.eval_last = t
            self.eval_tail = 0.0
            if kind == FWD:
                self.eval_forward_calls += 1
            return
        if not self.open:
            return
        col = _COLUMN[kind]
        self.acc[col] += exclusive
        self.calls[col] += 1
        if kind == ZERO or failed:
            return
        step_on = self.step_on
        if (
            (kind == OPT or not self.optimizer_seen)
            if step_on == "auto"
            else kind in _CLOSERS[step_on]
        ):
            self.closed = True
            self.close_t = t
            self.excl_at_close = self.excl
            # If nothing leads after this, the step ends here: what comes
            # after (a trailing zero_grad) is outside it.
            self.acc_at_close = self.acc[:]
            self.calls_at_close = self.calls[:]
            self.samples_at_close = self.samples

    def add_samples(self, n: int) -> None:
        # A batch fetched by an evaluation pass is no training sample: the
        # span is still open right after its fetch (a training fetch closes
        # it in `begin`).
        if self.open and not self.eval_open:
            self.samples += n

    def excluded(self, t0: float, t1: float) -> None:
        """DataLoader iterator creation (worker start-up): not step time."""
        self.init_calls += 1
        self.init_time += t1 - t0
        if self.eval_open:
            # Inside an evaluation pass (a second validation loader) or just
            # after one (the next epoch's training iterator): held apart until
            # an evaluation event follows it.
            self.eval_tail += t1 - t0
        elif self.open:
            self.excl += t1 - t0

    def stop_iteration(self, t0: float, t1: float, is_eval: bool) -> None:
        """A fetch that `begin` saw start at `t0` raised StopIteration at `t1`:
        it was no batch. Undo what its start did and end the loop body's step."""
        self.stop_calls += 1
        self.stop_time += t1 - t0
        if is_eval:
            self.eval_last = t1
            self.eval_tail = 0.0
            return
        if not self.open:
            return
        if self.start == t0 and self.first_kind == DATA and not any(self.calls):
            # This very fetch opened the step (and ended the previous one at
            # t0, which is right: the loop body ended when it asked for more).
            self.open = False
            if self.on_end is not None:
                self.on_end(len(self.rows), t0, False)
            return
        if self.closed:
            self._commit(t0, self.excl)
            self.open = False
            return
        self.excl += t1 - t0

    def finish(self, t: float) -> None:
        """The run is over: settle the open evaluation span and last step."""
        if self.eval_open:
            self._close_eval()
        if self.open and self.closed:
            self.acc = self.acc_at_close
            self.calls = self.calls_at_close
            self.samples = self.samples_at_close
            self._commit(self.close_t, self.excl_at_close)
        self.open = False

    # -- internals ------------------------------------------------------------

    def _close_eval(self) -> None:
        self.eval_open = False
        span = self.eval_last - self.eval_start
        if span < 0:
            span = 0.0
        self.eval_time += span
        if self.open:
            self.excl += span + self.eval_tail
        self.eval_tail = 0.0

    def _open(self, t: float, kind: int, ident: object) -> None:
        self.open = True
        self.closed = False
        self.start = t
        self.first_kind = kind
        self.first_ident = ident
        self._reset_accumulators()
        if self.on_begin is not None:
            self.on_begin(len(self.rows), t)

    def _commit(self, end: float, excl: float) -> None:
        a, c = self.acc, self.calls
        self.rows.append(
            [
                self.start,
                end,
                a[0],
                a[1],
                a[2],
                a[3],
                excl,
                c[0],
                c[1],
                c[2],
                c[3],
                self.samples,
                None,
                None,
                None,
                None,
                None,
            ]
        )
        if self.on_end is not None:
            self.on_end(len(self.rows) - 1, end, True)
