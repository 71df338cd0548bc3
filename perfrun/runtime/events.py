"""The events the hooks record: one per phase edge.

Each is a tuple led by its code and ending with the time it was read (a
perf_counter reading), so that an event less its last item, its
*signature*, says what happened and not when: two steps that did the same
things have the same signatures (steady.py replays such steps in bulk).
The commonest edge, a phase that ends without raising, is its time alone:
a bare float, whose signature is None.

    (ENTER, kind, grad, ident, t)  a phase starts (grad: gradients were on;
                                   for a forward, None where they were off
                                   and the module in training mode, and
                                   EVAL_MODE where they were on and the
                                   module in eval mode; ident: the module
                                   called, the optimizer stepped, or None)
    t                              the innermost phase ends (a float)
    (EXIT, failed, t)              the same, said in full (failed: it raised)
    (FETCHED, samples, t)          the innermost phase, a fetch, ends with a
                                   batch of `samples` samples (0: not counted)
    (STOP, t)                      the innermost phase, a fetch, raised
                                   StopIteration: no batch
    (ITER, t0, t)                  `iter(DataLoader)` ran from t0 to t
    (OPTIM,)                       an optimizer was built

No torch, no perfrun import: the hooks, the clock and the tests share it.

Why a bare float: half a step's edges are plain exits, and on a
sub-millisecond step every one counts. A float is what the clock read
returns anyway, so the hook builds nothing and the buffer holds no tuple
for the garbage collector to track until the replay: 0.1 to 0.3 us less a
hooked call in one process, and a steady replay 0.2 us a step faster on
workload (d) (docs/costs.md, "A step's fixed cost").
"""

from __future__ import annotations

from operator import itemgetter

ENTER, EXIT, FETCHED, STOP, ITER, OPTIM = range(6)

#: A forward's `grad` where gradients were on and the module in eval mode:
#: a validation written without `torch.no_grad()` (`model.eval()` alone, as
#: PyG's tutorials write their test loop), or a module kept in eval mode
#: while it trains (steps.py decides which). Truthy and unequal to True.
EVAL_MODE = 2

#: A tuple event's signature: all of it but its time.
signature = itemgetter(slice(0, -1))
#: A tuple event's time (its last item).
time_of = itemgetter(-1)


def signature_of(ev: object) -> object:
    """Any event's signature: None for a bare exit (a float)."""
    return None if ev.__class__ is float else ev[:-1]  # type: ignore[index]


def time_of_any(ev: object) -> float:
    """Any event's time: a bare exit's own value, else its last item."""
    return ev if ev.__class__ is float else ev[-1]  # type: ignore[return-value, index]
