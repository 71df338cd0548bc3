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
* A fetch belongs to the pass of the forward that consumes it. Evaluation
  loops often fetch with gradients on and wrap only the forward in
  `no_grad` (HF Trainer, accelerate's documented loop): such fetches are
  counted as training until the next event shows what consumed them; when it
  is an evaluation forward they are moved out of the step (time, calls,
  samples) into the evaluation span. A pass runs from its first evaluation
  event to the next training event that is not a fetch; passes and their
  batches are counted apart.
* A forward of a module in eval mode with gradients on (events.EVAL_MODE:
  a test loop written with `model.eval()` alone, as PyG's tutorials write
  it) is evaluation as a no-grad one is, once a training DataLoader leads
  the steps, but provisional wherever it comes: a module left in eval mode
  that trains (`model.train()` never called again) is given back by its
  backward. Without a training DataLoader it is training, as it was.
* A no-grad forward inside a step that has not reached its optimizer step
  may be training all the same (a frozen teacher, a target network): its
  span is provisional until the next event. A fetch (or the end of data, or
  of the run) after it makes it evaluation; a training event (a forward with
  gradients, backward, an optimizer call) gives it back to the step, the
  forward as Forward and its batch as Dataloader. A span that starts with a
  no-grad fetch, or after the step's optimizer step, is evaluation at once.
* A no-grad forward in every step is the step's own work, not an
  evaluation: a DQN's action chosen and its targets computed under
  `torch.no_grad()` by networks left in training mode. Once NOGRAD_STREAK
  consecutive steps each held an evaluation span of such forwards alone
  (no fetch: a validation loader's passes are evaluation whatever their
  period; no module in eval mode: `model.eval()` says validation, as in
  PyG's full-batch loop that tests after every epoch's one step), no-grad
  forwards count as training from then on (`nograd_from`: the first step
  that counts them all); a no-grad fetch stays evaluation. The steps
  before it, in the warm-up by default, leave theirs out. The hooks tell
  the modules' mode in `grad`: None for a no-grad forward of a module in
  training mode, False for one in eval mode (events.py).
* Where such a decision renames a phase already begun, the `on_relabel`
  callback names the last top-level phases again (the window's trace ranges
  follow the rows; NVTX ranges, pushed live, keep their first name).
* perfrun's own work at a step boundary (the profiler's start, stop, trace
  export and tables, at the edges of the detailed window) is reported by
  `own_work` and excluded from the step, like iterator creation.
* DataLoader iterator creation (worker start-up) and the fetch that raises
  StopIteration are excluded in the same way; the latter also ends the
  current step when it has closed, since it marks the end of the loop body.
* Many optimizer steps on one batch (the whole data set fetched once,
  then trained on epoch after epoch; forward-forward training, one layer
  at a time): when an optimizer closes a step that it has closed already,
  and the cycle began again in between (a top-level event after its first
  step), the step was more than one: it is split where each cycle began
  (a close by another optimizer before it, a GAN's other half, is a step
  of its own only when it too repeated), and from then on the event that
  began the second cycle leads a step as a fetch does. Each such step
  counts the last batch's samples again: it trained on them.
* One-ahead prefetch: accelerate's and HF Trainer's loaders fetch batch
  k+1 before yielding batch k, so an epoch's first step fetches twice and
  its last not at all. An iterator seen fetching twice in a row (no other
  event between, the same iterator) fetches ahead: from then on each of
  its batches' samples count in the step after the one that fetched it
  (the step that trains on it), and its last batch's, when it is
  exhausted, in the step that goes on or the next. The fetches' time and
  calls stay where they ran: the wait was there. The fetch that raised
  StopIteration ends its iterator's run: the next epoch's iterator, often
  made at the address (the id) the last one was freed from, is another.
* The last step ends where it closed (its optimizer step) if no leading
  event follows; a step that never closed is incomplete and dropped. A call
  that raised closes nothing, so a run that dies inside `optimizer.step`
  does not count the step it was in as done.
"""

from __future__ import annotations

from array import array
from struct import Struct
from typing import Any, Callable, Optional

from .events import EVAL_MODE

# Phase kinds. ZERO_GRAD counts as Optimization time but never closes a step.
# CLOSURE is the closure an optimizer step runs (`optimizer.step(closure)`):
# its own time (minus the phases inside it) is no phase of its own but goes
# where the same code goes outside a closure, to Others.
DATA, FWD, BWD, OPT, ZERO, CLOSURE = 0, 1, 2, 3, 4, 5
KIND_NAMES = ("dataloader", "forward", "backward", "optimization", "zero_grad", "closure")
# Column (in the step row) each kind's time is added to (-1: none, Others).
_COLUMN = (0, 1, 2, 3, 3, -1)

_CLOSERS = {
    "optimizer": (OPT,),
    "forward": (FWD,),
    "backward": (BWD,),
    "dataloader": (DATA,),
}

#: Consecutive steps, each with a span of no-grad forwards alone, after
#: which no-grad forwards count as the steps' own (see the rules).
NOGRAD_STREAK = 3
#: The first field of a close that no optimizer step made.
_NOT_OPT = object()

StepCallback = Callable[[int, float], None]
# (names): the last len(names) top-level phases of the open step are now
# these ("Dataloader", "Forward", "Eval").
RelabelCallback = Callable[[list[str]], None]
# (index, time, committed): committed is False when a step that had just
# opened is cancelled (its leading fetch raised StopIteration).
EndCallback = Callable[[int, float, bool], None]

#: Values a step row holds (results.STEP_COLUMNS; kept here as a number so
#: that this module imports nothing).
WIDTH = 17

# The one NaN object of every missing cell: lists holding it still compare
# equal (list comparison checks identity first).
MISSING = float("nan")

#: A step row as packed in the tracker's array: one C call per step, where
#: `array.extend` converts its values one by one (about 8,000 machine
#: instructions a step, measured under callgrind).
_ROW = Struct(f"={WIDTH}d")


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
        self.on_relabel: Optional[RelabelCallback] = None
        # Committed steps not yet taken by the writer (Agent._append_ready),
        # packed one after the other, WIDTH floats each, and how many were
        # taken before them: a step's index is global, so the rank holds
        # only what it has not written, however long the run. A flat array
        # rather than a list per step: no object per step for Python's
        # cyclic collector to find and promote (steps wait seconds for a
        # save, long enough to reach the oldest generation, whose growth
        # sets off full collections: stalls of 100 ms and more in a script
        # with torch's heap), and a save is one copy of bytes.
        self.buf = array("d")
        self.base = 0
        # Steps committed in all: the next step's index. Kept apart from
        # `base + held` because the flush thread's `take` moves rows out of
        # `buf` and into `base` in two statements, between which the
        # script's thread could read a sum short by the rows just written.
        self.committed = 0
        # Samples of every step when the user gave the batch size (else
        # counted from the batches fetched).
        self.fixed_samples: Optional[int] = None
        # Rows hold times since this clock reading (the rank's start), and
        # NaN for a GPU time not (yet) known: every cell a float or an int,
        # so the writer packs rows as they are (stepfile.encode).
        self.origin = 0.0
        # What the script has shown so far.
        self.optimizer_seen = False  # set by the hooks when an optimizer is built
        self.training_seen = False  # a backward or optimizer step ran
        self.train_data_seen = False  # a DataLoader fetch happened inside a step
        # Steps opened so far (steady.py tells a step boundary by it).
        self.opened = 0
        # The open step.
        self.open = False
        self.closed = False
        self.start = 0.0
        self.first_kind = -1
        self.first_ident: object = None
        # The event that begins a cycle with no fetch (learned when one
        # optimizer steps twice on one batch), and the optimizer of the
        # top-level optimizer step now open.
        self.lead_kind = -1
        self.lead_ident: object = None
        self.opt_ident: object = None
        # The open step's closes, each [the optimizer (_NOT_OPT for another
        # closing event), close time, excluded, phase times, calls, samples,
        # then the first top-level event after it: its time, kind, object
        # (None until it comes)]. The last one is where the step ends when
        # nothing leads after it.
        self.closes: list[list] = []
        # Samples of the last training batch fetched.
        self.batch_samples = 0
        # One-ahead prefetch (accelerate's and HF Trainer's loaders fetch
        # batch k+1 before the step that consumes batch k): the iterators
        # seen fetching twice in a row, each with the samples it fetched
        # ahead, which belong to the step that consumes them; the samples
        # of an exhausted iterator's last batch, for the step that follows;
        # the iterator of the last top-level fetch, and of the event before
        # this one if it was a fetch.
        self.ahead: dict[object, int] = {}
        self.orphan = 0
        self.fetch_ident: object = None
        self.prev_data: object = None
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
        # Of the evaluation spans' top-level forwards, those of a module in
        # training mode (events.py): a PPO's rollouts, not validation.
        self.eval_train_mode = 0
        # Evaluation passes (a pass may hold several spans when its fetches
        # run with gradients on) and the batches they fetched.
        self.in_pass = False
        self.eval_passes = 0
        self.eval_batches = 0
        # Top-level fetches since the last other event, counted as training
        # until what consumes them is known: [start, exclusive time, samples].
        self.fetches: list[list] = []
        self.fetch_start = 0.0
        self.fetch_open = False  # the top-level phase now open is a fetch
        # The span is open over such fetches (they may still be evaluation).
        self.eval_held = False
        # The open span is known to be evaluation (else: provisional, see
        # the rules), and what it took from the step, to give back.
        self.eval_sure = True
        self.span_undo: list[Any] = []
        self.span_fetches = [0.0, 0, 0]  # time, calls, samples moved in
        self.span_forwards = [0.0, 0]  # no-grad forwards: time, calls
        self.span_events = 0  # top-level phases in the span
        # A fetch is in the span (or fed it), or a forward of a module in
        # eval mode: either says validation (see the rules).
        self.span_validation = False
        # No-grad forwards in every step (see the rules): whether the open
        # step held a span of forwards alone, how many steps in a row did,
        # and from which step they count as training (None: they do not).
        self.step_nograd = False
        self.nograd_steps = 0
        self.nograd_from: Optional[int] = None
        # perfrun's own work at step boundaries (profiler start/stop/export).
        self.own_calls = 0
        self.own_time = 0.0
        # A phase that began at an edge where perfrun's own work ran starts
        # when that work ended (read by the clock after `begin`).
        self.resume = 0.0
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
        self.fetches = []

    # -- queries ------------------------------------------------------------

    @property
    def current_index(self) -> int:
        """Index of the open step (or of the next one, when none is open)."""
        return self.committed

    @property
    def held(self) -> int:
        """Committed steps not yet taken by the writer."""
        return len(self.buf) // WIDTH

    @property
    def rows(self) -> list[list[Any]]:
        """The held steps as lists, MISSING for a GPU time not known (for
        tests and callers that want a few steps in hand; the writer takes
        the packed buffer as it is)."""
        buf = self.buf
        return [
            [MISSING if v != v else v for v in buf[i:i + WIDTH]]
            for i in range(0, len(buf), WIDTH)
        ]

    def take(self, n: int) -> None:
        """The first `n` held steps are written: drop them."""
        if n > 0:
            del self.buf[: n * WIDTH]
            self.base += n

    def shape(self) -> tuple:
        """The state that decides what the next events do, less the times
        and the held rows: after two step boundaries with the same shape,
        the same events do the same things (steady.py). What only an
        evaluation span or an excluded interval reads is left out where the
        span or the interval would itself change a field here."""
        return (
            self.open, self.closed, self.first_kind, self.first_ident, self.step_on,
            self.optimizer_seen, self.training_seen, self.train_data_seen,
            self.fetch_open, self.eval_open, self.eval_held, self.eval_sure, self.in_pass,
            self.excl, self.samples, self.fixed_samples, tuple(self.acc), tuple(self.calls),
            len(self.fetches), self.lead_kind, self.lead_ident,
            self.orphan, self.ahead.get(self.fetch_ident), self.nograd_from,
        )

    def is_eval(self, kind: int, grad: Optional[bool]) -> bool:
        return (
            (not grad and (kind == DATA or kind == FWD and self.nograd_from is None)
             or grad == EVAL_MODE and self.train_data_seen)
            and (self.optimizer_seen or self.training_seen)
        )

    # -- events ---------------------------------------------------------------

    def begin(self, kind: int, t: float, grad: Optional[bool] = True,
              ident: object = None) -> bool:
        """A top-level phase starts at `t`. `ident` names the object behind it
        (the module called, the optimizer stepped). Returns True when the
        event is evaluation (provisionally so: see the rules)."""
        # is_eval(), inlined: this runs at every phase edge.
        if (
            (not grad and (kind == DATA or kind == FWD and self.nograd_from is None)
             or grad == EVAL_MODE and self.train_data_seen)
            and (self.optimizer_seen or self.training_seen)
        ):
            self.fetch_open = False
            if kind == DATA:
                self.fetch_ident = self.prev_data = ident
                if self.eval_open:
                    self._span_is_sure()  # a fetch after the forward
                    if self.fetches:
                        self._fetches_were_training()
                if not self.eval_open:
                    self._open_eval(t, True)
                self.span_validation = True
            else:
                self.prev_data = None
                if not self.eval_open:
                    start = self.fetches[0][0] if self.fetches else t
                    # With gradients on, what follows decides, wherever it
                    # comes (a module left in eval mode that trains).
                    self._open_eval(start, (not self.open or self.closed)
                                    and grad != EVAL_MODE)
                if grad is None:
                    self.eval_train_mode += 1
                else:
                    self.span_validation = True  # a module in eval mode: validation
                if self.fetches:
                    self._fetches_were_eval()
            self.span_events += 1
            return True
        if self.eval_open:
            if kind == DATA:
                # A fetch after an evaluation forward: the span is evaluation;
                # the fetch may still be (gradients on, only the forward under
                # no_grad), so the span stays open until what consumes it says.
                self._span_is_sure()
                self.eval_held = True
                self.span_validation = True
            elif self.eval_sure:
                self._close_eval()
            else:
                self._span_was_training()
        self.fetch_open = kind == DATA
        if kind == DATA:
            self.train_data_seen = True
            self.fetch_start = t
            if ident is not None and self.prev_data == ident and ident not in self.ahead:
                self._fetches_ahead(ident)
            self.fetch_ident = self.prev_data = ident
        else:
            self.prev_data = None
            if kind == OPT:
                self.opt_ident = ident
            # Anything but another fetch consumed the batches as training.
            self.in_pass = False
            self.fetches = []
            if kind == BWD or kind == OPT:
                self.training_seen = True
        if self.open:
            if self.closed and (
                (kind == DATA or kind == self.lead_kind and ident == self.lead_ident)
                if self.train_data_seen
                else kind == self.first_kind and ident == self.first_ident
            ):
                if self.eval_open:
                    self._close_eval()
                self._commit(t, self.excl)
                self._open(t, kind, ident)
                if kind != DATA:
                    # A cycle on the batch fetched before: its samples again.
                    self.samples = self.batch_samples
            elif self.closed:
                last = self.closes[-1]
                if last[6] is None:
                    last[6] = t
                    last[7] = kind
                    last[8] = ident
        else:
            if self.eval_open:
                self._close_eval()
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
                self.span_forwards[0] += exclusive
                self.span_forwards[1] += 1
            elif kind == DATA and not failed:
                self.eval_batches += 1
            return
        if not self.open:
            return
        col = _COLUMN[kind]
        if col < 0:
            return  # a closure's own time: Others
        self.acc[col] += exclusive
        self.calls[col] += 1
        if kind == DATA and self.fetch_open:
            self.fetch_open = False
            if not failed:
                self.fetches.append([self.fetch_start, exclusive, 0])
        if kind == ZERO or failed:
            return
        step_on = self.step_on
        if (
            (kind == OPT or not self.optimizer_seen)
            if step_on == "auto"
            else kind in _CLOSERS[step_on]
        ):
            opt = _NOT_OPT
            if kind == OPT:
                opt = self.opt_ident
                closes = self.closes
                for i in range(len(closes) - 1, -1, -1):
                    if closes[i][0] == opt:
                        if closes[i][6] is not None:
                            self._split(i)
                        break
            # If nothing leads after this, the step ends here: what comes
            # after (a trailing zero_grad) is outside it.
            self.closes.append([opt, t, self.excl, self.acc[:], self.calls[:], self.samples,
                                None, -1, None])
            self.closed = True

    def add_samples(self, n: int) -> None:
        """The top-level fetch that just ended returned `n` samples. A batch
        fetched by an evaluation pass is no training sample: only a fetch
        counted as training (`fetches`) adds its samples, and takes them back
        if an evaluation forward turns out to consume it."""
        if self.open and self.fetches:
            self.batch_samples = n
            ahead = self.ahead
            if ahead and self.fetch_ident in ahead:
                # Fetched ahead: this batch is the next step's; the one
                # fetched before it is this step's.
                n, ahead[self.fetch_ident] = ahead[self.fetch_ident], n
            self.samples += n
            self.fetches[-1][2] += n

    def own_work(self, t0: float, t1: float) -> None:
        """perfrun's own work ran from t0 to t1 at a step boundary (the
        profiler's start, stop, trace export): not step time. The phase being
        entered starts at t1."""
        self.own_calls += 1
        self.own_time += t1 - t0
        if self.open:
            self.excl += t1 - t0
        if self.fetch_open:
            self.fetch_start = t1
        self.resume = t1

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
        # An exhausted iterator fetches no more: the next fetch is another
        # iterator's, even one made at the same address (its id), as the
        # next epoch's often is once this one is freed; taken for the same,
        # two fetches in a row, it was "fetching ahead" and every batch of
        # that epoch counted in the step after its own, the first none.
        self.prev_data = None
        # The batch an exhausted iterator fetched ahead is still to be
        # trained on: by the open step if it goes on, else by the next.
        pending = self.ahead.pop(self.fetch_ident, 0) if self.ahead else 0
        if is_eval or self.eval_held:
            # The end of an evaluation loader (fetched with gradients on or
            # off): part of the pass.
            self.eval_last = t1
            self.eval_tail = 0.0
            if self.eval_open:
                self._span_is_sure()
            return
        if not self.open:
            self.orphan += pending
            return
        # (`t0` may be later than the step's start when perfrun's own work
        # ran at that edge: see own_work.)
        if self.start <= t0 and self.first_kind == DATA and not any(self.calls):
            # This very fetch opened the step (and ended the previous one at
            # t0, which is right: the loop body ended when it asked for more).
            self.open = False
            self.orphan += pending
            if self.on_end is not None:
                self.on_end(self.committed, t0, False)
            return
        if self.closed:
            self._commit(t0, self.excl)
            self.open = False
            self.orphan += pending
            return
        self.samples += pending
        self.excl += t1 - t0

    def finish(self, t: float) -> None:
        """The run is over: settle the open evaluation span and last step."""
        if self.eval_open:
            self._close_eval()
        if self.open and self.closed:
            _opt, close_t, excl, self.acc, self.calls, self.samples = self.closes[-1][:6]
            self._commit(close_t, excl)
        self.open = False

    # -- internals ------------------------------------------------------------

    def _open_eval(self, t: float, sure: bool) -> None:
        self.span_undo = [self.eval_spans, self.eval_passes, self.eval_batches,
                          self.eval_forward_calls, self.in_pass, self.eval_train_mode]
        self.eval_open = True
        self.eval_sure = sure
        self.eval_start = t
        self.eval_last = t
        self.eval_spans += 1
        self.span_fetches = [0.0, 0, 0]
        self.span_forwards = [0.0, 0]
        self.span_events = 0
        self.span_validation = bool(self.fetches)
        if not self.in_pass:
            self.in_pass = True
            self.eval_passes += 1

    def _fetches_were_eval(self) -> None:
        """The fetches since the last other event fed an evaluation forward:
        move them out of the step into the (open) evaluation span."""
        fetches, self.fetches = self.fetches, []
        moved = self.span_fetches
        for _start, exclusive, samples in fetches:
            self.acc[0] -= exclusive
            self.calls[0] -= 1
            self.samples -= samples
            self.eval_batches += 1
            moved[0] += exclusive
            moved[1] += 1
            moved[2] += samples
        self.span_events += len(fetches)
        self.eval_held = False
        if self.eval_sure and self.on_relabel is not None:
            self.on_relabel(["Eval"] * len(fetches))

    def _span_is_sure(self) -> None:
        """A provisional span turned out to be evaluation (a fetch follows
        it): the batches it took from the step are now named so too."""
        if not self.eval_sure:
            self.eval_sure = True
            if self.span_fetches[1] and self.on_relabel is not None:
                self.on_relabel(["Eval"] * self.span_events)

    def _fetches_were_training(self) -> None:
        self.fetches = []
        if self.eval_held:
            # The span ends with its last evaluation event, before the fetch.
            self._close_eval()

    def _span_was_training(self) -> None:
        """A training event follows a provisional span (a no-grad forward in
        the middle of a step, e.g. a frozen teacher): give the span back to
        the step, its batches as Dataloader and its forwards as Forward."""
        (self.eval_spans, self.eval_passes, self.eval_batches,
         self.eval_forward_calls, self.in_pass, self.eval_train_mode) = self.span_undo
        self.eval_open = False
        self.eval_held = False
        data, fwd = self.span_fetches, self.span_forwards
        if self.open:
            self.acc[0] += data[0]
            self.calls[0] += data[1]
            self.samples += data[2]
            self.acc[1] += fwd[0]
            self.calls[1] += fwd[1]
            self.excl += self.eval_tail
        self.eval_tail = 0.0
        if self.on_relabel is not None:
            self.on_relabel(["Dataloader"] * data[1]
                            + ["Forward"] * (self.span_events - data[1]))

    def _close_eval(self) -> None:
        if not self.span_validation:
            self.step_nograd = True  # forwards alone: see the rules
        self.eval_open = False
        self.eval_held = False
        span = self.eval_last - self.eval_start
        if span < 0:
            span = 0.0
        self.eval_time += span
        if self.open:
            self.excl += span + self.eval_tail
        self.eval_tail = 0.0

    def _open(self, t: float, kind: int, ident: object) -> None:
        self.opened += 1
        self.open = True
        self.closed = False
        self.start = t
        self.first_kind = kind
        self.first_ident = ident
        self.closes = []
        self._reset_accumulators()
        if self.orphan:
            self.samples, self.orphan = self.orphan, 0
        if self.on_begin is not None:
            self.on_begin(self.committed, t)

    def _commit(self, end: float, excl: float) -> None:
        self._write(self.start, end, self.acc, self.calls, self.samples, excl)

    def _fetches_ahead(self, ident: object) -> None:
        """Iterator `ident` fetched twice in a row: it fetches one batch
        ahead of the loop (see the rules). Its next batch's samples wait
        for the step that consumes them. Iterators left unexhausted are
        forgotten past a few."""
        ahead = self.ahead
        if len(ahead) >= 8:
            del ahead[next(iter(ahead))]
        ahead[ident] = 0

    def _split(self, i: int) -> None:
        """The optimizer of close `i` of the open step steps again after the
        cycle began anew (see the rules). The cycle that just ended runs
        from that optimizer's last step (from the close before it, or the
        step's start) to the event after the latest close: one step; the
        closes before it, another; what came after, the open step, led from
        now on by the event that began it."""
        closes = self.closes
        last = closes[-1]
        acc, calls, excl = self.acc, self.calls, self.excl
        if i > 0:
            before = closes[i - 1]
            self._write(self.start, before[6], before[3], before[4], before[5], before[2])
            self._open(before[6], before[7], before[8])
            self._write(before[6], last[6], [a - b for a, b in zip(last[3], before[3])],
                        [a - b for a, b in zip(last[4], before[4])],
                        self.batch_samples, last[2] - before[2])
        else:
            self._write(self.start, last[6], last[3], last[4], last[5], last[2])
        self._open(last[6], last[7], last[8])
        self.acc = [a - b for a, b in zip(acc, last[3])]
        self.calls = [a - b for a, b in zip(calls, last[4])]
        self.excl = excl - last[2]
        self.samples = self.batch_samples
        if self.train_data_seen:
            self.lead_kind, self.lead_ident = last[7], last[8]

    def _write(self, start: float, end: float, a: list, c: list, samples: int,
               excl: float) -> None:
        if self.step_nograd:
            self.step_nograd = False
            self.nograd_steps += 1
            if self.nograd_steps >= NOGRAD_STREAK and self.nograd_from is None:
                # The step that opens now may have left its own out (a
                # forward before its leading event): the next one is whole.
                self.nograd_from = self.committed + 2
        else:
            self.nograd_steps = 0
        origin = self.origin
        self.buf.frombytes(
            _ROW.pack(
                start - origin,
                end - origin,
                a[0],
                a[1],
                a[2],
                a[3],
                excl,
                c[0],
                c[1],
                c[2],
                c[3],
                samples if self.fixed_samples is None else self.fixed_samples,
                MISSING,
                MISSING,
                MISSING,
                MISSING,
                MISSING,
            )
        )
        self.committed += 1
        if self.on_end is not None:
            self.on_end(self.committed - 1, end, True)
