"""torch seen however the script comes to import it: after the libraries
that look it up first, as Hugging Face's own examples import them.

datasets, evaluate and transformers call `importlib.util.find_spec("torch")`
at their own import and import torch later; perfrun once stopped watching at
that first lookup and reported "the script never imported torch" on a
script that trained. Each case runs a real script under perfrun with the
real library imported first and checks every optimizer step is a step;
transformers' `run_clm.py`, as published and shortened (datasets and
evaluate before torch, its Trainer, its evaluation), checks the same of a
whole Trainer run. The import machinery itself (a lookup alone, a thread,
a function, importlib.import_module) is tested in-process in
test_importwatch.py.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
from conftest import RunPerfrun, e2e_environment
from test_frameworks import FRAMEWORK_ENV, FRAMEWORKS

from perfrun.store.stepfile import COL

pytestmark = pytest.mark.slow

STEPS = 12

LOOP = f"""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range({STEPS}):
    x = torch.randn(8, 16)
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("optimizer steps:", step + 1)
"""

#: What each script runs before its `import torch`.
FIRST = {
    "numpy": "import numpy",
    "huggingface_hub": "import huggingface_hub",
    "datasets": "import datasets",
    "evaluate": "import evaluate",
    "transformers": "import transformers\nfrom transformers import AutoConfig",
    "accelerate": "from accelerate import Accelerator",
    "find_spec": "import importlib.util\nimportlib.util.find_spec('torch')",
}


@pytest.mark.parametrize("first", list(FIRST))
def test_torch_is_seen_after_a_library_that_looks_it_up(
        run_perfrun: RunPerfrun, tmp_path: Path, first: str) -> None:
    pytest.importorskip(first if first != "find_spec" else "importlib")
    script = tmp_path / "train.py"
    script.write_text(FIRST[first] + "\n" + LOOP)
    env = {**e2e_environment(), **FRAMEWORK_ENV}
    run = run_perfrun("--timer-only", str(script), env=env)
    assert run.returncode == 0, run.describe()
    assert f"optimizer steps: {STEPS}" in run.out
    rank = run.rank0()
    assert rank.data["torch_imported"], run.describe()
    assert rank.n_steps == STEPS, run.describe()
    assert "never imported torch" not in run.out + run.err


def _clm_inputs(folder: Path) -> list[str]:
    """A word-level tokenizer saved as a folder, and train/validation text
    files, as run_clm.py takes them (`--tokenizer_name`, `--train_file`,
    `--validation_file`)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(64)}
    vocab["[UNK]"] = 64
    words = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="[UNK]",
                            pad_token="[UNK]").save_pretrained(folder / "tokenizer")
    draw = random.Random(0)

    def lines(n: int) -> str:
        out = []
        for _ in range(n):
            start, stride = draw.randrange(64), draw.randrange(1, 4)
            out.append(" ".join(f"t{(start + stride * k) % 64}"
                                for k in range(draw.randrange(8, 24))))
        return "\n".join(out) + "\n"

    (folder / "train.txt").write_text(lines(400))
    (folder / "valid.txt").write_text(lines(60))
    return [
        "--model_type", "gpt2",
        "--config_overrides", "n_layer=2,n_embd=32,n_head=2,vocab_size=65,n_positions=32",
        "--tokenizer_name", str(folder / "tokenizer"),
        "--train_file", str(folder / "train.txt"),
        "--validation_file", str(folder / "valid.txt"),
        "--block_size", "32", "--do_train", "--do_eval", "--output_dir", str(folder / "out"),
        "--max_steps", "30", "--per_device_train_batch_size", "4",
        "--per_device_eval_batch_size", "4", "--eval_strategy", "steps", "--eval_steps", "15",
        "--logging_steps", "10", "--save_strategy", "no", "--report_to", "none",
        "--use_cpu", "--disable_tqdm", "true", "--dataloader_num_workers", "0",
    ]


@pytest.mark.parametrize("mode", ["timer-only", "default"])
def test_run_clm_as_published_trains_in_every_step(
        run_perfrun: RunPerfrun, tmp_path: Path, mode: str) -> None:
    pytest.importorskip("datasets")
    pytest.importorskip("evaluate")
    args = _clm_inputs(tmp_path)
    env = {**e2e_environment(), **FRAMEWORK_ENV, "HF_DATASETS_OFFLINE": "1",
           "HF_HOME": str(tmp_path / "hf")}
    options = ["--timer-only"] if mode == "timer-only" else []
    run = run_perfrun(*options, str(FRAMEWORKS / "hf_run_clm.py"), *args, env=env)
    assert run.returncode == 0, run.describe()
    found = re.search(r"^FRAMEWORK_COUNTS (.*)$", run.out, re.M)
    assert found, run.describe()
    counts = json.loads(found.group(1))
    rank = run.rank0()
    # Every optimizer step of the Trainer's is a step, with its batch.
    assert rank.n_steps == counts["optimizer_steps"] == 30, run.describe()
    assert {row[COL["samples"]] for row in rank.rows} == {4}
    # Evaluation apart: its batches are none of the steps'.
    evaluation = rank.data["extra"]["eval"]
    assert evaluation["batches"] == counts["eval_batches"], evaluation
    assert "never imported torch" not in run.out + run.err
