"""The events the hooks record: one tuple per phase edge.

Each is led by its code and ends with the time it was read (a perf_counter
reading), so that an event less its last item, its *signature*, says what
happened and not when: two steps that did the same things have the same
signatures (steady.py replays such steps in bulk).

    (ENTER, kind, grad, ident, t)  a phase starts (grad: gradients were on;
                                   ident: the module called, the optimizer
                                   stepped, or None)
    (EXIT, failed, t)              the innermost phase ends (failed: it raised)
    (FETCHED, samples, t)          the innermost phase, a fetch, ends with a
                                   batch of `samples` samples (0: not counted)
    (STOP, t)                      the innermost phase, a fetch, raised
                                   StopIteration: no batch
    (ITER, t0, t)                  `iter(DataLoader)` ran from t0 to t
    (OPTIM,)                       an optimizer was built

No torch, no perfrun import: the hooks, the clock and the tests share it.
"""

from __future__ import annotations

from operator import itemgetter

ENTER, EXIT, FETCHED, STOP, ITER, OPTIM = range(6)

#: An event's signature: all of it but its time.
signature = itemgetter(slice(0, -1))
#: An event's time (its last item).
time_of = itemgetter(-1)
