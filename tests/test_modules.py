"""The Module Summary's pure parts: which modules are hooked and under which
names (runtime/modules.py, on real small torch models built here), the
per-module forward / backward / GPU times from trace events
(analysis/modules.py, on hand-made events whose totals are known), the
repeated-block grouping, and the tree order of the printed table."""

from __future__ import annotations

from typing import Any, Optional

import pytest
import torch
from torch import nn

from perfrun.analysis.modules import (
    MODULE_PREFIX,
    group_blocks,
    outstanding,
    pattern,
    summarize_modules,
)
from perfrun.report.window_blocks import _module_block, tree_order
from perfrun.runtime.modules import (
    ModuleRanges,
    RootTracker,
    auto_depth,
    parallel_wrappers,
    qualified_names,
)

# -- small real models ----------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2's layout: the main blocks are `transformer.h.N`, at depth 3."""

    def __init__(self, blocks: int = 12, width: int = 8, vocab: int = 20) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(vocab, width),
                wpe=nn.Embedding(16, width),
                drop=nn.Dropout(0.0),
                h=nn.ModuleList([Block(width) for _ in range(blocks)]),
                ln_f=nn.LayerNorm(width),
            )
        )
        self.lm_head = nn.Linear(width, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1])
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


class Generator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z)


class Discriminator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def names_up_to(model: nn.Module, depth: int, root: str) -> set[str]:
    """named_modules() down to `depth` (the root itself under `root`)."""
    out = set()
    for name, _ in model.named_modules():
        if not name:
            out.add(root)
        elif name.count(".") + 1 <= depth:
            out.add(name)
    return out


# -- qualified_names, auto_depth --------------------------------------------------------------


def test_names_are_named_modules_names() -> None:
    model = GPT(blocks=3)
    targets = qualified_names([model], depth=99)
    by_name = {name: module for module, name in targets.values()}
    expected = dict(model.named_modules())
    # A single model keeps named_modules() names; the root, whose name there
    # is "", is shown by its class.
    root = expected.pop("")
    assert by_name.pop("GPT") is root
    assert by_name.keys() == expected.keys()
    for name, module in expected.items():
        assert by_name[name] is module
        assert targets[id(module)] == (module, name)


@pytest.mark.parametrize("depth", [0, 1, 2, 3])
def test_depth_limits_the_names(depth: int) -> None:
    model = GPT(blocks=3)
    names = {name for _, name in qualified_names([model], depth).values()}
    assert names == names_up_to(model, depth, "GPT")
    assert all(n == "GPT" or n.count(".") + 1 <= depth for n in names)


def test_auto_depth_picks_the_main_blocks_of_a_gpt() -> None:
    model = GPT(blocks=12)
    assert auto_depth(model) == 3  # transformer.h.N
    names = {name for _, name in qualified_names([model], None).values()}
    assert {f"transformer.h.{i}" for i in range(12)} <= names
    assert "transformer.h.0.attn" not in names
    assert names == names_up_to(model, 3, "GPT")


def test_auto_depth_on_other_shapes() -> None:
    # Blocks right under the root: depth 1.
    assert auto_depth(nn.Sequential(*[nn.Linear(2, 2) for _ in range(10)])) == 1
    # `layers.N`: depth 2.
    model = nn.Module()
    model.embed = nn.Embedding(4, 4)
    model.layers = nn.ModuleList([Block(4) for _ in range(8)])
    assert auto_depth(model) == 2
    # A model too small to have 8 modules at any depth: down to its leaves.
    assert auto_depth(Generator()) == 2


def test_two_roots_get_their_class_as_prefix() -> None:
    gen, disc = Generator(), Discriminator()
    tree: dict[str, tuple[int, str, str]] = {}
    targets = qualified_names([gen, disc, nn.BCEWithLogitsLoss()], None, tree)
    names = {name for _, name in targets.values()}
    expected = {f"Generator.{n}" if n else "Generator" for n, _ in gen.named_modules()}
    expected |= {f"Discriminator.{n}" if n else "Discriminator" for n, _ in disc.named_modules()}
    assert names == expected
    assert targets[id(gen.net[2])] == (gen.net[2], "Generator.net.2")
    assert targets[id(disc)] == (disc, "Discriminator")
    assert tree["Generator"][:3] == (0, "", "Generator")
    assert tree["Generator.net"][:3] == (1, "Generator", "Sequential")
    assert tree["Discriminator.net.1"][:3] == (2, "Discriminator.net", type(disc.net[1]).__name__)


def test_two_roots_of_one_class_are_numbered() -> None:
    a, b = Generator(), Generator()
    targets = qualified_names([a, b], None)
    assert targets[id(a)][1] == "Generator"
    assert targets[id(b)][1] == "Generator#1"
    assert targets[id(b.net[0])][1] == "Generator#1.net.0"


def test_loss_modules_without_children_are_skipped() -> None:
    model = GPT(blocks=2)
    loss = nn.CrossEntropyLoss()
    targets = qualified_names([model, loss], None)
    assert id(loss) not in targets
    # One tree left: no prefixes.
    assert {name for _, name in targets.values()} == names_up_to(model, 3, "GPT")
    assert qualified_names([nn.MSELoss()], None) == {}


def test_tree_gives_depth_and_parent() -> None:
    model = GPT(blocks=2)
    tree: dict[str, tuple[int, str, str]] = {}
    qualified_names([model], None, tree)
    assert tree["GPT"][:2] == (0, "")
    assert tree["transformer"][:2] == (1, "GPT")
    assert tree["lm_head"] == (1, "GPT", "Linear", "20x8,20")
    assert tree["transformer.h"][:3] == (2, "transformer", "ModuleList")
    assert tree["transformer.h.1"][:2] == (3, "transformer.h")


# -- ModuleRanges: hooks only while attached ---------------------------------------------------


def test_hooks_run_only_while_attached() -> None:
    model = GPT(blocks=2)
    ranges = ModuleRanges(torch, depth=None, record=False)
    idx = torch.randint(0, 20, (1, 4))
    model(idx)
    assert ranges.calls == 0
    assert ranges.attach([model]) == len(names_up_to(model, 3, "GPT"))
    model(idx)
    model(idx)
    # Called per forward: the root, wte, wpe, drop, 2 blocks, ln_f, lm_head
    # (the ModuleDict and the ModuleList are never called); a pre and a post
    # hook each.
    assert ranges.calls == 2 * 2 * 8
    ranges.detach()
    assert not ranges.attached
    model(idx)
    assert ranges.calls == 2 * 2 * 8


def test_ranges_carry_qualified_names_in_the_trace() -> None:
    model = GPT(blocks=2)
    ranges = ModuleRanges(torch, depth=3)
    ranges.attach([model])
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        model(torch.randint(0, 20, (1, 4)))
    ranges.detach()
    seen = {e.name for e in prof.events() if e.name.startswith(MODULE_PREFIX)}
    called = {
        "GPT",
        "transformer.wte",
        "transformer.wpe",
        "transformer.drop",
        "transformer.h.0",
        "transformer.h.1",
        "transformer.ln_f",
        "lm_head",
    }
    assert seen == {MODULE_PREFIX + n for n in called}


def test_a_raising_forward_closes_its_range() -> None:
    class Boom(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.inner(x)
            raise ValueError("boom")

    model = Boom()
    ranges = ModuleRanges(torch, depth=None, record=False)
    ranges.attach([model])
    with pytest.raises(ValueError):
        model(torch.zeros(1, 2))
    assert ranges._open == []
    ranges.detach()


# -- summarize_modules on hand-made trace events ---------------------------------------------


def span(
    name: str,
    ts: float,
    dur: float,
    tid: Any = 1,
    cat: str = "cpu_op",
    seq: Optional[int] = None,
    ext: Optional[int] = None,
) -> dict[str, Any]:
    args: dict[str, Any] = {}
    if seq is not None:
        args["Sequence number"] = seq
    if ext is not None:
        args["External id"] = ext
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": 1,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "args": args,
    }


def module(name: str, ts: float, dur: float, tid: Any = 1) -> dict[str, Any]:
    return span(MODULE_PREFIX + name, ts, dur, tid, cat="user_annotation")


def kernel(ext: int, dur: float) -> dict[str, Any]:
    return span("kernel", 5000.0, dur, tid=7, cat="kernel", ext=ext)


BWD = "autograd::engine::evaluate_function: "

#: (depth, parent) as the hooks saw the model: `blocks` is a ModuleList,
#: never called.
TREE = {
    "Net": (0, ""),
    "blocks": (1, "Net"),
    "blocks.0": (2, "blocks"),
    "blocks.0.fc": (3, "blocks.0"),
    "blocks.1": (2, "blocks"),
    "head": (1, "Net"),
}

# Times in microseconds. Forward on thread 1, backward on thread 2 (as with
# CUDA, where autograd runs on a device thread).
EVENTS = [
    module("Net", 0, 1000),
    module("blocks.0", 100, 300),
    module("blocks.0.fc", 150, 150),
    span("aten::linear", 160, 100, seq=1, ext=11),
    span("aten::addmm", 170, 80, ext=12),  # inner op: launches the kernel
    span("aten::relu", 320, 30, seq=2, ext=13),  # blocks.0, outside fc
    module("blocks.1", 450, 250),
    span("aten::mul", 500, 100, seq=3, ext=14),
    module("head", 750, 150),
    span("aten::add", 760, 50, seq=4, ext=15),
    span("aten::sum", 950, 20, seq=5, ext=16),  # in Net only
    span("aten::mse_loss", 1100, 50, seq=6, ext=17),  # outside every module
    span(BWD + "MseLossBackward0", 2000, 30, tid=2, seq=6, ext=21),
    span(BWD + "SumBackward0", 2040, 20, tid=2, seq=5, ext=22),
    span(BWD + "AddBackward0", 2070, 40, tid=2, seq=4, ext=23),
    span(BWD + "MulBackward0", 2120, 60, tid=2, seq=3, ext=24),
    span("aten::mul", 2130, 20, tid=2, ext=25),
    span(BWD + "ReluBackward0", 2200, 20, tid=2, seq=2, ext=26),
    span(BWD + "AddmmBackward0", 2230, 100, tid=2, seq=1, ext=27),
    span("AddmmBackward0", 2240, 85, tid=2, seq=1, ext=28),
    span("aten::mm", 2250, 30, tid=2, ext=29),
    span("aten::mm", 2290, 30, tid=2, ext=30),
    # Kernels, linked by External id to the op that launched them.
    kernel(12, 40),
    kernel(13, 10),
    kernel(14, 20),
    kernel(15, 5),
    kernel(16, 3),
    kernel(17, 7),
    kernel(22, 4),
    kernel(25, 30),
    kernel(29, 70),
    kernel(30, 50),
]

US = 1e-6


def rows_by_name(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in summary["modules"]}


def test_forward_backward_and_gpu_per_module() -> None:
    summary = summarize_modules(EVENTS, step_time=0.01, tree=TREE)
    assert summary["recorded"] is True
    rows = rows_by_name(summary)
    assert list(rows) == ["Net", "blocks.0", "blocks.0.fc", "blocks.1", "head"]
    expected = {
        # name: (forward, backward, gpu forward, gpu backward), microseconds
        "Net": (1000, 20 + 40 + 60 + 20 + 100, 40 + 10 + 20 + 5 + 3, 4 + 30 + 70 + 50),
        "blocks.0": (300, 20 + 100, 40 + 10, 70 + 50),
        "blocks.0.fc": (150, 100, 40, 70 + 50),
        "blocks.1": (250, 60, 20, 30),
        "head": (150, 40, 5, None),
    }
    for name, (fwd, bwd, gpu_fwd, gpu_bwd) in expected.items():
        r = rows[name]
        assert r["calls"] == 1, name
        assert r["forward"] == pytest.approx(fwd * US, abs=1e-12), name
        assert r["backward"] == pytest.approx(bwd * US, abs=1e-12), name
        assert r["gpu_forward"] == pytest.approx(gpu_fwd * US, abs=1e-12), name
        if gpu_bwd is None:
            assert r["gpu_backward"] is None, name
        else:
            assert r["gpu_backward"] == pytest.approx(gpu_bwd * US, abs=1e-12), name
        assert r["total"] == pytest.approx((fwd + bwd) * US, abs=1e-12), name
        assert r["share"] == pytest.approx((fwd + bwd) * US / 0.01), name


def test_never_called_containers_are_skipped_in_the_tree() -> None:
    rows = rows_by_name(summarize_modules(EVENTS, step_time=0.01, tree=TREE))
    assert "blocks" not in rows
    assert rows["blocks.0"]["parent"] == "Net"
    assert rows["blocks.1"]["parent"] == "Net"
    assert rows["blocks.0.fc"]["parent"] == "blocks.0"
    assert rows["head"]["parent"] == "Net"
    assert rows["Net"]["parent"] == ""
    # The depth stays the qualified name's.
    assert rows["blocks.0"]["depth"] == 2


def test_without_a_tree_parents_come_from_the_names() -> None:
    rows = rows_by_name(summarize_modules(EVENTS, step_time=0.01))
    assert rows["blocks.0.fc"]["parent"] == "blocks.0"
    assert rows["blocks.0"]["parent"] == "blocks"
    assert rows["head"]["parent"] == ""


def test_calls_add_up_over_steps_and_no_gpu_means_none() -> None:
    events = []
    for step in range(3):
        t = step * 1000
        events += [
            module("Net", t, 500),
            module("fc", t + 10, 100 + step),
            span("aten::addmm", t + 20, 50, seq=step, ext=step),
            span(BWD + "AddmmBackward0", t + 600, 40, seq=step),
        ]
    rows = rows_by_name(summarize_modules(events, step_time=0.0))
    assert rows["fc"]["calls"] == 3
    assert rows["fc"]["forward"] == pytest.approx((100 + 101 + 102) * US, abs=1e-12)
    assert rows["fc"]["backward"] == pytest.approx(3 * 40 * US, abs=1e-12)
    assert rows["Net"]["backward"] == rows["fc"]["backward"]
    assert rows["fc"]["gpu_forward"] is None and rows["fc"]["gpu_backward"] is None
    assert rows["fc"]["share"] is None


def test_ranges_on_another_thread_do_not_own_ops() -> None:
    events = [
        module("a", 0, 100, tid=1),
        span("aten::mul", 10, 10, tid=2, seq=1),
        span(BWD + "MulBackward0", 200, 30, tid=1, seq=1),
    ]
    rows = rows_by_name(summarize_modules(events, step_time=1.0))
    assert rows["a"]["backward"] == 0.0


def test_no_module_ranges() -> None:
    events = [span("aten::mul", 10, 10, seq=1)]
    assert summarize_modules(events, step_time=1.0) == {
        "recorded": False,
        "modules": [],
        "groups": [],
        "opaque": [],
    }


# -- repeated blocks ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, expected",
    [
        ("transformer.h.3", "transformer.h.*"),
        ("transformer.h.3.attn", "transformer.h.*.attn"),
        ("layers.10.mlp.0", "layers.*.mlp.*"),
        ("0.weight", "*.weight"),
        ("12", "*"),
        ("Block#1.mlp.2", "Block#1.mlp.*"),
        ("h3.x", "h3.x"),
        ("lm_head", "lm_head"),
    ],
)
def test_pattern(name: str, expected: str) -> None:
    assert pattern(name) == expected


def block_rows(totals: list[float], prefix: str = "transformer.h") -> list[dict[str, Any]]:
    return [{"name": f"{prefix}.{i}", "total": t} for i, t in enumerate(totals)]


def test_group_blocks_flags_the_slow_sibling() -> None:
    rows = [{"name": "GPT", "total": 20.0}, {"name": "lm_head", "total": 1.0}]
    rows += block_rows([1.0, 1.0, 1.0, 5.0, 1.0, 1.0])
    groups = group_blocks(rows)
    assert groups == [
        {
            "pattern": "transformer.h.*",
            "type": None,
            "members": 6,
            "total": 10.0,
            "median": 1.0,
            "slowest": "transformer.h.3",
            "slowest_total": 5.0,
            "slowest_vs_median": 4.0,
        }
    ]
    assert outstanding(groups) == groups


def test_only_siblings_of_one_class_and_shape_are_compared() -> None:
    # nn.Sequential(Linear(64, 256), ReLU(), Linear(256, 256), ReLU(), Linear(256, 10)):
    # the three Linears are no siblings of each other's work.
    shapes = {0: "256x64,256", 2: "256x256,256", 4: "10x256,10"}
    rows = [{"name": f"net.{i}", "total": t, "type": "Linear", "shapes": shapes[i]}
            for i, t in ((0, 1.0), (2, 3.0), (4, 0.2))]
    rows += [{"name": f"net.{i}", "total": 0.1, "type": "ReLU", "shapes": ""} for i in (1, 3)]
    groups = group_blocks(rows)
    assert [(g["pattern"], g["type"], g["members"]) for g in groups] == [("net.*", "ReLU", 2)]
    assert outstanding(groups) == []


def test_even_blocks_do_not_stand_out() -> None:
    groups = group_blocks(block_rows([1.0, 1.1, 1.0, 1.05]))
    assert len(groups) == 1
    assert groups[0]["slowest"] == "transformer.h.1"
    assert outstanding(groups) == []


def test_groups_need_two_members_and_are_sorted_by_total() -> None:
    rows = block_rows([1.0, 1.0], "enc") + block_rows([5.0, 5.0], "dec")
    rows += [{"name": "head.0", "total": 9.0}]
    groups = group_blocks(rows)
    assert [g["pattern"] for g in groups] == ["dec.*", "enc.*"]


# -- the printed tree -----------------------------------------------------------------------


def row(name: str, parent: str, total: float, depth: int) -> dict[str, Any]:
    return {
        "name": name,
        "parent": parent,
        "total": total,
        "depth": depth,
        "calls": 1,
        "forward": total,
        "backward": 0.0,
        "gpu_forward": None,
        "gpu_backward": None,
        "share": None,
    }


TREE_ROWS = [
    row("GPT", "", 10.0, 0),
    row("transformer.wte", "GPT", 0.5, 2),
    row("transformer.h.0", "GPT", 1.0, 3),
    row("transformer.h.0.attn", "transformer.h.0", 0.4, 4),
    row("transformer.h.0.mlp", "transformer.h.0", 0.6, 4),
    row("transformer.h.1", "GPT", 6.0, 3),
    row("transformer.h.1.attn", "transformer.h.1", 5.0, 4),
    row("transformer.h.1.mlp", "transformer.h.1", 0.7, 4),
    row("transformer.ln_f", "GPT", 0.2, 2),
    row("lm_head", "GPT", 0.3, 1),
]


def test_tree_order_puts_the_slowest_child_first_under_its_parent() -> None:
    names = [r["name"] for r in tree_order(list(TREE_ROWS))]
    assert names == [
        "GPT",
        "transformer.h.1",
        "transformer.h.1.attn",
        "transformer.h.1.mlp",
        "transformer.h.0",
        "transformer.h.0.mlp",
        "transformer.h.0.attn",
        "transformer.wte",
        "lm_head",
        "transformer.ln_f",
    ]


def test_tree_order_walks_up_to_an_ancestor_that_has_a_row() -> None:
    rows = [
        row("Net", "", 3.0, 0),
        row("blocks.0", "blocks", 1.0, 2),
        row("blocks.1", "blocks", 2.0, 2),
        row("Other", "", 4.0, 0),
    ]
    # `blocks` never ran: its children hang from the root level.
    assert [r["name"] for r in tree_order(rows)] == ["Other", "Net", "blocks.1", "blocks.0"]


def test_printed_tree_indents_by_the_tree_not_the_name() -> None:
    block = _module_block({"modules": list(TREE_ROWS), "groups": []}, {}, "ms", 1e3)
    first = [r[0] for r in block.rows]
    # Children of GPT one step in, whatever their qualified name's depth:
    # transformer.ln_f after lm_head must not read as lm_head's child.
    assert first == [
        "GPT",
        "  transformer.h.1",
        "    transformer.h.1.attn",
        "    transformer.h.1.mlp",
        "  transformer.h.0",
        "    transformer.h.0.mlp",
        "    transformer.h.0.attn",
        "  transformer.wte",
        "  lm_head",
        "  transformer.ln_f",
    ]


def test_stands_out_footer() -> None:
    rows = [row(f"h.{i}", "", t, 1) for i, t in enumerate([1.0, 1.0, 4.0, 1.0])]
    modules = {"modules": rows, "groups": group_blocks(rows)}
    block = _module_block(modules, {}, "ms", 1e3)
    assert len(block.footer) == 1
    assert "slowest h.2" in block.footer[0]
    assert block.footer[0].endswith("<- stands out")
    even = [row(f"h.{i}", "", 1.0, 1) for i in range(4)]
    block = _module_block({"modules": even, "groups": group_blocks(even)}, {}, "ms", 1e3)
    assert "stands out" not in block.footer[0]


def test_only_siblings_of_one_class_are_grouped() -> None:
    # nn.Sequential(Linear, ReLU, Linear, ReLU, Linear): three Linear and
    # two ReLU siblings, never "5 blocks"; the slow Linear stands out only
    # against the other Linears.
    kinds = ["Linear", "ReLU", "Linear", "ReLU", "Linear"]
    totals = [2.0, 0.1, 6.0, 0.1, 2.0]
    rows = [{"name": "Sequential", "total": 10.2, "type": "Sequential"}]
    rows += [{"name": str(i), "total": t, "type": k} for i, (t, k) in enumerate(zip(totals, kinds))]
    groups = {g["type"]: g for g in group_blocks(rows)}
    assert set(groups) == {"Linear", "ReLU"}
    assert (groups["Linear"]["members"], groups["Linear"]["slowest"]) == (3, "2")
    assert groups["ReLU"]["members"] == 2
    assert outstanding(list(groups.values())) == [groups["Linear"]]


def test_compiled_model_is_one_opaque_module_named_by_the_model() -> None:
    model = GPT(blocks=2)
    compiled = torch.compile(model, backend="eager")  # nothing is compiled until called
    tree: dict[str, tuple[int, str, str]] = {}
    targets = qualified_names([compiled], None, tree)
    assert list(targets.values()) == [(compiled, "GPT")]
    assert tree == {"GPT": (0, "", "GPT (compiled)")}


def test_nothing_is_hooked_inside_a_compiled_submodule() -> None:
    model = GPT(blocks=2)
    model.transformer.h[1] = torch.compile(model.transformer.h[1], backend="eager")
    model.lm_head.compile(backend="eager")  # compiled in place: not hooked at all
    tree: dict[str, tuple[int, str, str]] = {}
    names = {name for _, name in qualified_names([model], 99, tree).values()}
    assert "transformer.h.1" in names
    assert tree["transformer.h.1"][2].endswith("(compiled)")
    assert not any(n.startswith("transformer.h.1.") for n in names)
    assert not any(n.startswith("lm_head") for n in names)
    assert "transformer.h.0.attn" in names


# -- what the roots say of torch.distributed (RootTracker, the rank file's record) ----------


def test_roots_record_the_ddp_wrapper_and_the_process_group() -> None:
    """The rank file's `distributed` record, as the RootTracker makes it when
    a root is first called: a real DDP over a one-process gloo group."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    plain = RootTracker()
    plain.see(Block())
    assert plain.distributed == {"world_size": None, "backend": None, "wrappers": []}
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        ddp = DistributedDataParallel(Block())
        roots = RootTracker()
        roots.see(nn.MSELoss())  # a loss module first: the group seen, no wrapper yet
        assert roots.distributed == {"world_size": 1, "backend": "gloo", "wrappers": []}
        roots.see(ddp)
        assert parallel_wrappers(ddp) == ["DistributedDataParallel"]
        # Through torch.compile too, and a DDP subclass is DDP.
        assert parallel_wrappers(torch.compile(ddp, backend="eager")) == [
            "DistributedDataParallel"]
        own = type("ScriptDDP", (DistributedDataParallel,), {})(Block())
        assert parallel_wrappers(own) == ["DistributedDataParallel"]
    finally:
        dist.destroy_process_group()
    # The group destroyed before a later root: what was seen stays.
    roots.see(Block())
    assert roots.distributed == {"world_size": 1, "backend": "gloo",
                                 "wrappers": ["DistributedDataParallel"]}
    # A class of the script's own that is only named like torch's is not.
    assert parallel_wrappers(type("DistributedDataParallel", (nn.Module,), {})()) == []
