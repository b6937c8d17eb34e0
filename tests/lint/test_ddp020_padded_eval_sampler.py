"""DDP020 padded evaluation sampler.

What the rule reports and what it leaves alone, and the analysis it reads, through it."""

from __future__ import annotations

from helpers import (
    ddp_source,
    fixture_lines,
    lint_source,
)

from ddpguard.lint import Selection


def test_results_stored_by_sample_index_count_each_sample_once() -> None:
    name = "DDP020_eval_keyed_by_index.py"
    assert fixture_lines(name) == []
    # Concatenated in order instead: the padded repeats reach the features twice.
    got = fixture_lines(
        name,
        "        features.index_copy_(0, torch.cat(index_parts), torch.cat(feat_parts))\n",
        "        features = torch.cat([features, *feat_parts])\n",
    )
    assert got == [("DDP020", 12)]
    # Stored by the gathered index through a subscript: still keyed.
    got = fixture_lines(
        name,
        "        features.index_copy_(0, torch.cat(index_parts), torch.cat(feat_parts))\n",
        "        all_idx = torch.cat(index_parts)\n"
        "        features[all_idx] = torch.cat(feat_parts)\n",
    )
    assert got == []


GATHER = ddp_source("""
    from torch.utils.data import DataLoader, DistributedSampler
    def evaluate(model, val_set):
        loader = DataLoader(val_set, batch_size=8, sampler=DistributedSampler(val_set))
        preds = torch.cat([model(x) for x in loader])
        out = [torch.zeros_like(preds) for _ in range(dist.get_world_size())]
        dist.all_gather(out, preds)
        return torch.stack(out, 1).flatten(0, 1)[:len(val_set)].mean()
    """)


def test_gathered_results_cut_back_to_the_dataset_length_drop_the_padding() -> None:
    sel = Selection(extend_select=("DDP020",))  # off by default
    assert [f.code for f in lint_source(GATHER, selection=sel)] == []
    assert [f.code for f in lint_source(GATHER.replace("[:len(val_set)]", ""), selection=sel)] == [
        "DDP020"
    ]
