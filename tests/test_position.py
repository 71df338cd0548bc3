"""A rank's live position (runtime/position.py), from the phase clock's stack
and the edges still waiting in the BufferedClock, on hand-written events."""

from __future__ import annotations

from perfrun.runtime.events import ENTER, EXIT, FETCHED, STOP
from perfrun.runtime.position import describe, locate, phase_name

DL, FW, BW, OPT, ZG, CLOSURE = range(6)


def test_the_stack_alone_gives_the_innermost_phase() -> None:
    where = locate([[FW, 10.0, 0.0, False]], [], step=4, step_open=True, step_start=9.5,
                   lead_kind=DL)
    assert where == {"step": 4, "open": True, "kinds": [FW], "since": 10.0, "step_since": 9.5}
    assert describe(where["kinds"], True) == "forward"


def test_buffered_edges_move_the_position_on() -> None:
    # Step 4 is open in the state machine; the buffer holds the rest of it
    # and the start of step 5, whose forward never returned.
    pending = [
        (EXIT, False, 10.2),  # forward of step 4 ends
        (ENTER, BW, True, None, 10.3), 10.5,  # a bare exit, as the hooks record it
        (ENTER, OPT, True, None, 10.6), (EXIT, False, 10.7),
        (ENTER, DL, True, None, 10.8), (FETCHED, 1, 10.9),  # step 5 starts
        (ENTER, FW, True, None, 11.0),
    ]
    where = locate([[FW, 10.0, 0.0, False]], pending, step=4, step_open=True, step_start=9.5,
                   lead_kind=DL)
    assert (where["step"], where["kinds"], where["since"], where["step_since"]) == (
        5, [FW], 11.0, 10.8)


def test_between_phases_is_others_and_before_any_step_is_outside() -> None:
    where = locate([], [(ENTER, DL, True, None, 1.0), (STOP, 1.5)], step=0, step_open=False,
                   step_start=None, lead_kind=-1)
    assert where["kinds"] == [] and where["since"] == 1.5
    assert describe(where["kinds"], where["open"]) == "others"
    assert describe([], False) == "outside steps"


def test_nested_phases_report_the_innermost_with_a_report_phase() -> None:
    # LBFGS: forward inside a closure inside optimizer.step.
    assert phase_name([OPT, CLOSURE, FW]) == "forward"
    assert phase_name([OPT, CLOSURE]) == "optimization"
    assert phase_name([ZG]) == "optimization"
    assert phase_name([]) is None
    assert describe([CLOSURE], True) == "closure"
