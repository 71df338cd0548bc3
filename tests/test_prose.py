"""How perfrun lays out a sentence in a width (perfrun/prose.py): lines
break only between units, and a path, a command, an option with its value,
a call or a number with its unit is one unit; continuation lines hang under
the first; and the start notice puts the run folder on a line of its own in
a terminal."""

from __future__ import annotations

import io
import textwrap

import pytest

from perfrun import prose
from perfrun.launcher.launch import RunFolder, start_notice
from perfrun.settings import Settings

RUN_DIR = "/scratch/alice/experiments/perfrun_log/20261126-141632-1797"


def _units(text: str) -> list[str]:
    return [unit for _space, unit in prose.units(text)]


@pytest.mark.parametrize(("text", "unit"), [
    ("put it after --: perfrun train.py -- --scheduler 100 110", "perfrun train.py -- "
     "--scheduler 100 110"),
    ("start them as ranks: perfrun --nproc-per-node N SCRIPT) and more",
     "perfrun --nproc-per-node N SCRIPT)"),
    ("see it with: perfrun report job-exp42", "perfrun report job-exp42"),
    ("first 5 steps (default; --warmup N to change)", "--warmup N"),
    ("a detailed window (--scheduler START END): see", "(--scheduler START END):"),
    ("over --max-trace-mb 0.05 (raise it)", "--max-trace-mb 0.05"),
    ("about 99.4 us; keep", "99.4 us;"),
    ("(396.199 ms vs 379.053 ms on rank 1)", "(396.199 ms"),
    ("a batch: DataLoader(dataset, sampler=BatchSampler(s, batch_size=64), batch_size=None) "
     "for a TensorDataset", "DataLoader(dataset, sampler=BatchSampler(s, batch_size=64), "
     "batch_size=None)"),
    ("run `perfrun report perfrun_log` to see", "`perfrun report perfrun_log`"),
])
def test_what_a_line_never_breaks(text: str, unit: str) -> None:
    assert unit in _units(text)


@pytest.mark.parametrize("text", [
    "perfrun times the steps of the thread that runs the script",  # prose, not a command
    "the dataset (__getitem__) and the collate",  # a parenthesis in a sentence
    "rank 1 is slow in Dataloader; rank 0 waits for it",
    "the step's phases, e.g. the forward, are timed",
])
def test_sentences_still_break_between_words(text: str) -> None:
    assert _units(text) == text.split()


def test_continuation_lines_hang_under_the_first() -> None:
    text = ("word " * 40).strip()
    lines = prose.wrap(text, 50, "  - ", "    ")
    assert lines[0].startswith("  - word")
    assert all(line.startswith("    word") for line in lines[1:])
    assert max(len(line) for line in lines) <= 50
    assert " ".join(line.strip() for line in lines) == f"- {text}"


def test_a_path_is_never_cut_and_goes_to_a_line_of_its_own() -> None:
    lines = prose.wrap(f"perfrun: results saved in {RUN_DIR}", 60, "", "  ")
    assert lines == ["perfrun: results saved in", f"  {RUN_DIR}"]
    # Longer than the line itself: whole all the same, the line runs long.
    long = "/" + "x" * 120
    assert prose.wrap(f"see {long} now", 40) == ["see", long, "now"]


def test_a_unit_longer_than_a_line_breaks_between_its_words_where_the_line_is() -> None:
    call = "DataLoader(" + ", ".join(f"argument_{i}={i}" for i in range(8)) + ")"
    lines = prose.wrap(f"Try: {call} for a TensorDataset", 60, "", "  ")
    assert max(len(line) for line in lines) <= 60
    assert lines[0].startswith("Try: DataLoader(argument_0=0,")  # not moved down alone
    assert " ".join(line.strip() for line in lines) == f"Try: {call} for a TensorDataset"


def test_spaces_inside_a_line_are_kept_as_written() -> None:
    info = "time unit: us   per batch over 144 fetches   a batch: 2 tensors, 16.5 KiB"
    assert prose.wrap(info, 120) == [info]
    lines = prose.wrap(info, 40, "", "  ")
    # A line of facts breaks between its fields, each whole where it fits.
    assert lines == ["time unit: us", "  per batch over 144 fetches",
                     "  a batch: 2 tensors, 16.5 KiB"]
    assert prose.wrap(info, 48, "", "  ") == [
        "time unit: us   per batch over 144 fetches", "  a batch: 2 tensors, 16.5 KiB"]
    # A field longer than a line breaks between its own units.
    lines = prose.wrap(info, 20, "", "  ")
    assert max(len(line) for line in lines) <= 20 and "16.5 KiB" in lines[-1]
    assert all(not line.endswith(" ") for line in lines)


def test_no_width_is_one_line() -> None:
    text = "perfrun: note: report.html not written (RuntimeError: no plotly here)"
    assert prose.wrap(text, None) == [text]
    assert prose.for_stream(text, io.StringIO()) == text  # a pipe: one line, for grep


def test_the_advice_of_the_bundled_example_at_any_width() -> None:
    """The I/O-bound advice as the bundled example gets it, at every width
    from 60 to 100 columns: plain word wrapping often parts a number from
    its unit; here no line is longer than the width and none is apart."""
    advice = (
        "I/O-bound: Reader Ratio 21.721% (above 5%): each step waits 281 us for its batch out "
        "of 1.29 ms. DataLoader over TensorDataset: num_workers=0, pin_memory=False, "
        "persistent_workers=False, prefetch_factor=None. The batch is made in this process: "
        "sampler 7.23 us, dataset (__getitem__) 156 us, collate 73.5 us, around 45.0 us of a "
        "285 us fetch (64 samples, 2.44 us each in the dataset); 100% of the dataset and "
        "collate is CPU time. Try: index a whole batch at once, as the per-sample indexing and "
        "collate cost 229 us a batch: DataLoader(dataset, sampler=BatchSampler(RandomSampler("
        "dataset), batch_size=64, drop_last=...), batch_size=None) for a TensorDataset, or a "
        "Dataset __getitems__ that slices its tensors; predicted: the fetch falls from 285 us to "
        "about 99.4 us; keep num_workers=0: the dataset is in memory")
    pieces = ["99.4 us;", "281 us", "1.29 ms.", "73.5 us,", "2.44 us", "285 us", "229 us",
              "45.0 us", "156 us,", "7.23 us,"]
    split = 0
    for width in range(60, 101):
        plain = textwrap.wrap(advice, width, initial_indent="  - ", subsequent_indent="    ")
        split += any(not any(p in line for line in plain) for p in pieces)
        lines = prose.wrap(advice, width, "  - ", "    ")
        assert max(len(line) for line in lines) <= width
        for whole in pieces:
            assert any(whole in line for line in lines), (width, whole)
    assert split > 10  # plain wrapping splits one of them at most of these widths


# -- the start notice -------------------------------------------------------------------


def _notice(width: int | None) -> str:
    settings = Settings(script="/home/alice/projects/gpt/train_gpt2.py")
    return start_notice(settings, RunFolder(RUN_DIR), width)


def test_the_start_notice_in_a_pipe_is_one_line() -> None:
    assert _notice(None) == (f"perfrun: profiling /home/alice/projects/gpt/train_gpt2.py; "
                             f"results in {RUN_DIR}")


@pytest.mark.parametrize("width", [80, 100])
def test_the_start_notice_in_a_terminal_puts_the_run_folder_on_its_own_line(width: int) -> None:
    lines = _notice(width).splitlines()
    assert lines[-1] == f"  {RUN_DIR}"
    assert all(len(line) <= width for line in lines)
    assert " ".join(line.strip() for line in lines) == _notice(None)
