"""Causal language modelling with the Hugging Face Trainer, written as
transformers' own `examples/pytorch/language-modeling/run_clm.py` writes
it, shortened: its imports in its order (`datasets` and `evaluate`, which
look torch up with `importlib.util.find_spec` at their own import, before
`import torch`), its argument dataclasses read by `HfArgumentParser`, a
model built from `CONFIG_MAPPING[model_type]` with `--config_overrides`,
`load_dataset("text", data_files=...)`, tokenisation and `group_texts`
through `Dataset.map`, `default_data_collator`, an `evaluate` accuracy
over `preprocess_logits_for_metrics`, then `trainer.train()` and
`trainer.evaluate()`.

Nothing is downloaded: the tokenizer is a folder the test saved, the text
files are the test's, and the accuracy metric is loaded from
tests/frameworks/accuracy (what `evaluate.load("accuracy")` fetches from
the hub). Prints last one FRAMEWORK_COUNTS line with the Trainer's own
counts.
"""

# The import block is run_clm.py's own, in its order (its isort takes
# transformers as first-party): the order is what is under test.
# ruff: noqa: I001
import json
import logging
import math
import os
import sys
from dataclasses import dataclass, field
from itertools import chain
from typing import Optional

import datasets
import evaluate
import torch
from datasets import load_dataset

import transformers
from transformers import (
    CONFIG_MAPPING,
    AutoModelForCausalLM,
    AutoTokenizer,
    HfArgumentParser,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    default_data_collator,
    set_seed,
)

logger = logging.getLogger(__name__)

ACCURACY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "accuracy")


@dataclass
class ModelArguments:
    model_type: Optional[str] = field(default=None, metadata={"help": "model type"})
    config_overrides: Optional[str] = field(default=None, metadata={"help": "n_embd=10,..."})
    tokenizer_name: Optional[str] = field(default=None, metadata={"help": "tokenizer path"})


@dataclass
class DataTrainingArguments:
    train_file: Optional[str] = field(default=None, metadata={"help": "a text file"})
    validation_file: Optional[str] = field(default=None, metadata={"help": "a text file"})
    block_size: Optional[int] = field(default=None, metadata={"help": "sequence length"})
    preprocessing_num_workers: Optional[int] = field(default=None, metadata={"help": "map"})


class CountEval(TrainerCallback):
    """Evaluation passes and batches as the Trainer reports them."""

    def __init__(self) -> None:
        self.passes = 0
        self.batches = 0

    def on_prediction_step(self, args, state, control, **kwargs):
        self.batches += 1

    def on_evaluate(self, args, state, control, **kwargs):
        self.passes += 1


def main():
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()

    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%m/%d/%Y %H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    log_level = training_args.get_process_log_level()
    logger.setLevel(log_level)
    datasets.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.set_verbosity(log_level)
    set_seed(training_args.seed)

    data_files = {"train": data_args.train_file, "validation": data_args.validation_file}
    raw_datasets = load_dataset("text", data_files=data_files)

    config = CONFIG_MAPPING[model_args.model_type]()
    if model_args.config_overrides is not None:
        config.update_from_string(model_args.config_overrides)
    tokenizer = AutoTokenizer.from_pretrained(model_args.tokenizer_name)
    model = AutoModelForCausalLM.from_config(config)
    n_params = sum({p.data_ptr(): p.numel() for p in model.parameters()}.values())
    logger.info(f"Training new model from scratch - Total size={n_params / 2**20:.2f}M params")

    column_names = list(raw_datasets["train"].features)
    text_column_name = "text" if "text" in column_names else column_names[0]

    def tokenize_function(examples):
        return tokenizer(examples[text_column_name])

    with training_args.main_process_first(desc="dataset map tokenization"):
        tokenized_datasets = raw_datasets.map(
            tokenize_function,
            batched=True,
            num_proc=data_args.preprocessing_num_workers,
            remove_columns=column_names,
            desc="Running tokenizer on dataset",
        )
    block_size = data_args.block_size

    def group_texts(examples):
        concatenated = {k: list(chain(*examples[k])) for k in examples.keys()}
        total_length = len(concatenated[list(examples.keys())[0]])
        total_length = (total_length // block_size) * block_size
        result = {
            k: [t[i : i + block_size] for i in range(0, total_length, block_size)]
            for k, t in concatenated.items()
        }
        result["labels"] = result["input_ids"].copy()
        return result

    with training_args.main_process_first(desc="grouping texts together"):
        lm_datasets = tokenized_datasets.map(
            group_texts,
            batched=True,
            num_proc=data_args.preprocessing_num_workers,
            desc=f"Grouping texts in chunks of {block_size}",
        )
    train_dataset = lm_datasets["train"]
    eval_dataset = lm_datasets["validation"]

    def preprocess_logits_for_metrics(logits, labels):
        if isinstance(logits, tuple):
            logits = logits[0]
        return logits.argmax(dim=-1)

    metric = evaluate.load(ACCURACY)

    def compute_metrics(eval_preds):
        preds, labels = eval_preds
        labels = labels[:, 1:].reshape(-1)
        preds = preds[:, :-1].reshape(-1)
        return metric.compute(predictions=preds, references=labels)

    counter = CountEval()
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=default_data_collator,
        compute_metrics=compute_metrics,
        preprocess_logits_for_metrics=preprocess_logits_for_metrics,
        callbacks=[counter],
    )

    torch.manual_seed(training_args.seed)
    train_result = trainer.train()
    metrics = train_result.metrics
    metrics["train_samples"] = len(train_dataset)
    trainer.log_metrics("train", metrics)

    metrics = trainer.evaluate()
    try:
        perplexity = math.exp(metrics["eval_loss"])
    except OverflowError:
        perplexity = float("inf")
    metrics["perplexity"] = perplexity
    trainer.log_metrics("eval", metrics)

    counts = {
        "optimizer_steps": trainer.state.global_step,
        "eval_passes": counter.passes,
        "eval_batches": counter.batches,
        "train_batch_size": training_args.per_device_train_batch_size,
        "accumulation": training_args.gradient_accumulation_steps,
    }
    print("FRAMEWORK_COUNTS " + json.dumps(counts, sort_keys=True))


if __name__ == "__main__":
    main()
