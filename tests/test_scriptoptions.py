"""Reading what a script's command line takes from its source, without
running it (perfrun/scriptoptions.py): the sources here are written the
way training scripts are, and nothing is imported or run."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from perfrun import scriptoptions
from perfrun.scriptoptions import NOTHING, ScriptOptions, read_module, read_script, read_source

ROOT = Path(__file__).resolve().parent.parent


def facts(source: str) -> scriptoptions.SourceFacts:
    return read_source(textwrap.dedent(source))


def write(folder: Path, name: str, source: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    return path


ARGPARSE_TRAIN = """
    import argparse

    import torch


    def get_args():
        parser = argparse.ArgumentParser(description="ResNet on CIFAR-10")
        parser.add_argument("--epochs", type=int, default=90)
        parser.add_argument("-b", "--batch-size", type=int, default=256)
        parser.add_argument("--lr", "--learning-rate", type=float, default=0.1, dest="lr")
        parser.add_argument("--scheduler", choices=["cosine", "step"], default="cosine")
        parser.add_argument("--resume", action="store_true")
        parser.add_argument("data", metavar="DIR")
        group = parser.add_argument_group("distributed")
        group.add_argument("--world-size", type=int, default=-1)
        return parser.parse_args()


    if __name__ == "__main__":
        args = get_args()
        print(f"{sys.argv[0]}: training for {args.epochs} epochs")
"""


def test_an_argparse_training_script() -> None:
    found = facts(ARGPARSE_TRAIN)
    assert found.names == {"-h", "--help", "--epochs", "-b", "--batch-size", "--lr",
                           "--learning-rate", "--scheduler", "--resume", "--world-size"}
    assert found.abbreviates
    assert found.unsure == []


def test_argparse_without_help_or_abbreviations() -> None:
    found = facts("""
        from argparse import ArgumentParser
        p = ArgumentParser(add_help=False, allow_abbrev=False)
        p.add_argument("--warmup-steps", type=int)
        p.parse_args()
    """)
    assert found.names == {"--warmup-steps"}
    assert not found.abbreviates


def test_a_click_training_script() -> None:
    found = facts("""
        import click

        @click.command(context_settings={"help_option_names": ["-h", "--help"]})
        @click.option("--lr", type=float, default=1e-3)
        @click.option("--amp/--no-amp", default=False)
        @click.option("-o", "--output", "out_dir", type=click.Path())
        @click.argument("config")
        @click.version_option("1.2")
        def train(lr, amp, out_dir, config):
            pass

        if __name__ == "__main__":
            train()
    """)
    assert found.names == {"-h", "--help", "--lr", "--amp", "--no-amp", "-o", "--output",
                           "--version"}
    assert not found.abbreviates
    assert found.unsure == []


@pytest.mark.parametrize(
    "source, reason",
    [
        ("import sys\nsteps = int(sys.argv[1])\n", "reads sys.argv itself"),
        ("from sys import argv\nif len(argv) > 1: pass\n", "reads sys.argv itself"),
        ("import argparse\np = argparse.ArgumentParser()\nargs, rest = p.parse_known_args()\n",
         "keeps the options it does not define (parse_known_args)"),
        ("import fire\nfire.Fire(lambda lr=0.1: lr)\n", "parses its command line with fire"),
        ("import hydra\n@hydra.main(config_path='conf')\ndef main(cfg): pass\n",
         "parses its command line with hydra"),
        ("from transformers import HfArgumentParser, TrainingArguments\n"
         "p = HfArgumentParser(TrainingArguments)\n",
         "parses its command line with HfArgumentParser"),
        ("from lightning.pytorch.cli import LightningCLI\nLightningCLI()\n",
         "parses its command line with LightningCLI"),
        ("import argparse\nFLAGS = ['--a', '--b']\np = argparse.ArgumentParser()\n"
         "for f in FLAGS:\n    p.add_argument(f)\n", "builds option names at run time"),
        ("import argparse, deepspeed\nparser = argparse.ArgumentParser()\n"
         "parser.add_argument('--local_rank', type=int)\n"
         "parser = deepspeed.add_config_arguments(parser)\nargs = parser.parse_args()\n",
         "hands its parser to deepspeed.add_config_arguments"),
        ("import click\n@click.command(context_settings=dict(ignore_unknown_options=True))\n"
         "def main(): pass\n", "passes on options it does not define"),
        ("import click\n@click.command()\n@click.argument('rest', nargs=-1, "
         "type=click.UNPROCESSED)\ndef main(rest): pass\n",
         "takes any arguments (click.UNPROCESSED)"),
        ("import argparse\np = argparse.ArgumentParser()\n"
         "p.add_argument('cmd', nargs=argparse.REMAINDER)\n",
         "takes any arguments (argparse.REMAINDER)"),
    ],
)
def test_what_makes_a_reading_unsure(tmp_path: Path, source: str, reason: str) -> None:
    assert read_script(str(write(tmp_path, "train.py", source))).unsure == reason


@pytest.mark.parametrize(
    "source",
    [
        # The program's name is not its arguments.
        "import sys, os\nname = os.path.basename(sys.argv[0])\n",
        # Handing parse_args what it would read itself.
        "import argparse, sys\np = argparse.ArgumentParser()\np.add_argument('--n')\n"
        "p.parse_args(sys.argv[1:])\n",
        # A parser handed to the script's own function.
        "import argparse\ndef add_model_args(parser):\n    parser.add_argument('--depth')\n"
        "parser = argparse.ArgumentParser()\nadd_model_args(parser)\nparser.parse_args()\n",
        # Nothing read at all.
        "import torch\nmodel = torch.nn.Linear(4, 4)\n",
    ],
)
def test_what_does_not(tmp_path: Path, source: str) -> None:
    assert read_script(str(write(tmp_path, "train.py", source))).unsure == ""


def test_the_parser_in_a_module_beside_the_script_is_read(tmp_path: Path) -> None:
    # Training repositories keep the parser apart: train.py imports it.
    write(tmp_path, "options.py", """
        import argparse

        def parse():
            p = argparse.ArgumentParser()
            p.add_argument("--scheduler", default="cosine")
            return p.parse_args()
    """)
    write(tmp_path, "utils/__init__.py", "")
    write(tmp_path, "utils/config.py", """
        def add_data_args(parser):
            parser.add_argument("--data-dir")
    """)
    script = write(tmp_path, "train.py", """
        import torch
        from options import parse
        from utils import config
        from .nowhere import nothing
    """)
    found = read_script(str(script))
    assert {"--scheduler", "--data-dir", "-h", "--help"} <= found.names
    assert found.unsure == ""


def test_a_relative_import_in_a_package_run_with_m(tmp_path: Path) -> None:
    write(tmp_path, "proj/__init__.py", "")
    write(tmp_path, "proj/args.py", """
        import argparse
        parser = argparse.ArgumentParser()
        parser.add_argument("--output", default="out")
    """)
    write(tmp_path, "proj/train.py", "from .args import parser\nargs = parser.parse_args()\n")
    found = read_module("proj.train", [str(tmp_path), *sys.path])
    assert "--output" in found.names and found.unsure == ""
    write(tmp_path, "proj/__main__.py", "import sys\nprint(sys.argv[1:])\n")
    assert read_module("proj", [str(tmp_path)]).unsure == "reads sys.argv itself"
    assert read_module("proj.nowhere", [str(tmp_path)]).unsure == (
        "has a source perfrun did not find"
    )


def test_a_folder_with_a_main_runs_as_its_main(tmp_path: Path) -> None:
    write(tmp_path, "app/__main__.py", """
        import argparse
        p = argparse.ArgumentParser()
        p.add_argument("--timer-only", action="store_true")
        p.parse_args()
    """)
    assert "--timer-only" in read_script(str(tmp_path / "app")).names


def test_scripts_that_cannot_be_read(tmp_path: Path) -> None:
    # No such script: python refuses it before any argument matters.
    assert read_script(str(tmp_path / "missing.py")) is NOTHING
    broken = write(tmp_path, "broken.py", "def main(:\n")
    assert read_script(str(broken)).unsure == "could not be read (SyntaxError)"
    write(tmp_path, "helper.py", "x = (\n")
    imports_broken = write(tmp_path, "train.py", "import helper\n")
    assert read_script(str(imports_broken)).unsure == "could not be read (helper.py: SyntaxError)"
    assert read_script("-").unsure == "is read from standard input"


def test_only_so_much_of_the_scripts_own_code_is_read(tmp_path: Path) -> None:
    for i in range(scriptoptions.MAX_FILES + 1):
        write(tmp_path, f"m{i}.py", f"import m{i + 1}\n")
    assert read_script(str(tmp_path / "m0.py")).unsure.startswith(
        "imports more of its own code than perfrun reads"
    )
    # An import cycle is read once.
    write(tmp_path, "a.py", "import b\n")
    write(tmp_path, "b.py", "import a\nimport argparse\nargparse.ArgumentParser()\n")
    assert read_script(str(tmp_path / "a.py")).names == {"-h", "--help"}


def test_expansions_follow_argparse_abbreviations() -> None:
    lr = ScriptOptions(frozenset({"--warmup-epochs", "--warmup-lr", "--lr"}), abbreviates=True)
    assert lr.expansions("--warmup") == ("--warmup-epochs", "--warmup-lr")
    assert lr.expansions("--lr") == ()  # its own name, exactly
    assert lr.expansions("--output") == ()
    assert ScriptOptions(lr.names).expansions("--warmup") == ()


def test_the_repositorys_own_scripts_are_read() -> None:
    """The bundled example and a test script that defines --scheduler."""
    example = read_script(str(ROOT / "scripts" / "example_train.py"))
    assert example.names == {"-h", "--help", "--epochs", "--batch-size", "--samples",
                             "--workers"}
    assert example.unsure == ""
    lr = read_script(str(ROOT / "tests" / "scripts" / "lr_schedule_train.py"))
    assert {"--scheduler", "--warmup-epochs"} <= lr.names and lr.abbreviates
    assert read_script(str(ROOT / "tests" / "scripts" / "proc_exit.py")).unsure == (
        "reads sys.argv itself"
    )
