"""Hugging Face `Trainer` on a tiny GPT-2, as the Trainer docs write it.

A GPT-2 built from a config (nothing downloaded), a synthetic Dataset of
token ids, gradient accumulation over 2 micro-batches of 8, and an
evaluation every EVAL_STEPS optimizer steps (the Trainer adds one at the end
of training: 3 passes of 3 batches). Progress bars, reporting integrations
and checkpoints are off; the CPU is used. The batches are made as the
causal language modelling guides make them, by
`DataCollatorForLanguageModeling(tokenizer, mlm=False)`, over a word-level
tokenizer built in memory: a `BatchEncoding`, not a dict. Every batch,
training and evaluation, also costs the same fixed CPU work in the data
collator (fetch_work), so the Reader Ratio is the same from run to run. The tests run it with
HF_HUB_OFFLINE=1 and TRANSFORMERS_OFFLINE=1; nothing here needs the hub.

The Trainer's evaluation loop fetches its batches with gradients on: only
the forward (in prediction_step) runs under torch.no_grad(), as in
accelerate_loop.py.

Prints the log lines of the Trainer (every LOG_STEPS steps and after each
evaluation, from its PrinterCallback: their runtime and per-second values
are timings) and, last, one FRAMEWORK_COUNTS line with the Trainer's own
counters.
"""

import json

import torch
from tokenizers import Tokenizer, models
from torch.utils.data import Dataset
from transformers import (
    DataCollatorForLanguageModeling,
    GPT2Config,
    GPT2LMHeadModel,
    PreTrainedTokenizerFast,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

STEPS = 80  # optimizer steps (Trainer's global_step)
BATCH = 8  # per_device_train_batch_size
ACCUM = 2  # gradient_accumulation_steps
EVAL_STEPS = 30  # evaluations at steps 30 and 60, and the Trainer's own at the end
LOG_STEPS = 10
EVAL_SAMPLES = 24  # 3 eval batches of 8
SEQ = 32
VOCAB = 128


class TokenIds(Dataset):
    """Synthetic token ids: a deterministic pattern the model can learn."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, VOCAB, (n, 1), generator=g)
        stride = torch.randint(1, 4, (n, 1), generator=g)
        self.ids = (start + stride * torch.arange(SEQ)) % VOCAB

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


#: Every batch costs the same fixed work: FETCH_ROUNDS products of this
#: matrix with itself (about 0.8 ms here). It stays in cache, as the tiny
#: model's weights do.
FETCH_MATRIX = torch.randn(256, 256, generator=torch.Generator().manual_seed(0))
FETCH_ROUNDS = 2


def fetch_work() -> None:
    """Fixed CPU work of the same kind as the model's (matrix products). A
    wall-clock busy-wait keeps its length while a loaded machine slows the
    model down, so the Reader Ratio would move with the load of the machine;
    this slows down with the model."""
    for _ in range(FETCH_ROUNDS):
        torch.mm(FETCH_MATRIX, FETCH_MATRIX)


def tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer of the model's VOCAB ids, built in memory; its
    padding token is one id past them (the sequences are all SEQ long, so
    it never appears and no label is masked)."""
    vocab = {f"t{i}": i for i in range(VOCAB)}
    vocab["[PAD]"] = VOCAB
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="[PAD]")),
        pad_token="[PAD]",
    )


LM_COLLATOR = DataCollatorForLanguageModeling(tokenizer(), mlm=False)


def busy_collator(features):
    """The language-modelling collator (labels from the input ids), plus a
    fixed amount of CPU work (fetch_work)."""
    batch = LM_COLLATOR([{"input_ids": f["input_ids"]} for f in features])
    fetch_work()
    return batch


class CountEval(TrainerCallback):
    """Evaluation passes and batches as the Trainer reports them to callbacks."""

    def __init__(self) -> None:
        self.passes = 0
        self.batches = 0

    def on_prediction_step(self, args, state, control, **kwargs):
        self.batches += 1

    def on_evaluate(self, args, state, control, **kwargs):
        self.passes += 1


def main() -> None:
    config = GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=SEQ,
        bos_token_id=0, eos_token_id=0,
    )
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    args = TrainingArguments(
        output_dir="hf_trainer_out",
        use_cpu=True,
        max_steps=STEPS,
        per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=BATCH,
        gradient_accumulation_steps=ACCUM,
        learning_rate=1e-3,
        eval_strategy="steps",
        eval_steps=EVAL_STEPS,
        logging_strategy="steps",
        logging_steps=LOG_STEPS,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
        seed=0,
    )
    counter = CountEval()
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=TokenIds(STEPS * BATCH * ACCUM, seed=1),
        eval_dataset=TokenIds(EVAL_SAMPLES, seed=2),
        data_collator=busy_collator,
        callbacks=[counter],
    )
    trainer.train()

    counts = {
        "optimizer_steps": trainer.state.global_step,
        "eval_passes": counter.passes,
        "eval_batches": counter.batches,
        "train_batch_size": args.per_device_train_batch_size,
        "accumulation": args.gradient_accumulation_steps,
    }
    print("FRAMEWORK_COUNTS " + json.dumps(counts, sort_keys=True))


if __name__ == "__main__":
    main()
