"""The worst sequences on device: rows against a plain per-token reference, the top k of any
micro-batch chunking equal to a sort of every sequence, and no host synchronisation."""

from __future__ import annotations

import math
import random

import pytest
import torch
from cliptrack.adapters.losses.worst import WIDTH, merge_top, sequence_rows, top_rows, worst_from_block
from cliptrack.core.worst import CRITERIA, SequenceGauge, worst_of
from hypothesis import given, settings
from hypothesis import strategies as st

from tests._harness import host_sync_forbidden, loss_path
from tests.reference import plain_worst


@st.composite
def batches(draw):
    """(lp, slp, mask, ids): ``[sequences, tokens]`` float32 with ties and masked rows, unique ids
    or ids repeated (a datum's several passes)."""
    rows = draw(st.integers(1, 24))
    cols = draw(st.integers(1, 12))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    slp = -torch.rand(rows, cols, generator=gen) * 3
    coarse = draw(st.booleans())  # few distinct log-ratios: ties across sequences
    noise = (
        torch.randint(-2, 3, (rows, cols), generator=gen).float() * 0.25
        if coarse
        else torch.randn(rows, cols, generator=gen)
    )
    lp = slp + noise * draw(st.sampled_from([1e-3, 0.3, 2.0]))
    mask = (torch.rand(rows, cols, generator=gen) > draw(st.sampled_from([0.0, 0.4, 0.9]))).float()
    pick = random.Random(int(gen.initial_seed()))
    if draw(st.booleans()):
        ids = torch.tensor(pick.sample(range(10_000), rows))
    else:  # passes: a datum seen in several rows (PPO epochs in one step) ranks once, by its best
        ids = torch.tensor([pick.randrange(max(1, rows // 2)) for _ in range(rows)])
    return lp, slp, mask, ids


def plain_rows(lp, slp, mask, ids) -> list[SequenceGauge]:
    """Per sequence in Python floats: the eligible tokens' l (as float32 computes lp - slp), sums by
    fsum, the first largest |l| and its position."""
    out = []
    for r in range(lp.shape[0]):
        ls = [
            (i, float(x))
            for i, (x, m) in enumerate(zip((lp[r] - slp[r]).tolist(), mask[r].tolist(), strict=True))
            if m
        ]
        top = max((abs(x) for _, x in ls), default=0.0)
        out.append(
            SequenceGauge(
                datum=int(ids[r]),
                tokens=len(ls),
                log_ratio=math.fsum(x for _, x in ls),
                abs_log_ratio=math.fsum(abs(x) for _, x in ls),
                kl_k3=math.fsum(math.expm1(x) - x for _, x in ls),
                max_abs_log_ratio=top,
                worst_token=next((i for i, x in ls if abs(x) == top), -1),
            )
        )
    return out


@settings(max_examples=100, deadline=None)
@given(data=batches())
def test_rows_match_a_plain_per_token_reference(data):
    lp, slp, mask, ids = data
    rows = sequence_rows(lp, slp, mask, datum_ids=ids).tolist()
    for got, want in zip(
        (SequenceGauge.from_row(r) for r in rows), plain_rows(lp, slp, mask, ids), strict=True
    ):
        assert (got.datum, got.tokens, got.worst_token, got.max_abs_log_ratio) == (
            want.datum,
            want.tokens,
            want.worst_token,
            want.max_abs_log_ratio,
        )
        for name in ("log_ratio", "abs_log_ratio", "kl_k3"):
            assert abs(getattr(got, name) - getattr(want, name)) <= 1e-12 * (
                1 + want.abs_log_ratio + want.kl_k3
            ), name


@settings(max_examples=100, deadline=None)
@given(
    data=batches(),
    k=st.integers(1, 10),
    cuts=st.lists(st.integers(0, 24), max_size=6),
    seed=st.integers(0, 99),
)
def test_the_top_k_of_any_micro_batching_equals_a_sort_of_every_sequence(data, k, cuts, seed):
    """Micro-batches of rows, each reduced to its top k on device, merged in any order (as the
    ranks' blocks after the collective): the worst k of every sequence, as a plain sort finds them."""
    lp, slp, mask, ids = data
    n = lp.shape[0]
    points = sorted({0, n, *(c % (n + 1) for c in cuts)})
    parts = [(a, b) for a, b in zip(points[:-1], points[1:], strict=False)]
    rows = [sequence_rows(lp[a:b], slp[a:b], mask[a:b], datum_ids=ids[a:b]) for a, b in parts]
    blocks = [top_rows(r, k) for r in rows]
    random.Random(seed).shuffle(blocks)
    merged = worst_from_block(merge_top(torch.stack(blocks), k).tolist(), step=5, k=k)
    every = [SequenceGauge.from_row(r) for r in torch.cat(rows).tolist()]
    assert merged.by == worst_of(every, k)
    # and through the plain sort, by hand
    for c in CRITERIA:
        assert merged.by[c] == plain_worst(every, c, k)


def test_a_sequence_without_tokens_never_ranks_and_blocks_keep_their_shape():
    lp = torch.tensor([[-1.0, -2.0], [-1.0, -1.0]])
    rows = sequence_rows(lp, lp - 0.5, torch.tensor([[0.0, 0.0], [1.0, 0.0]]))
    assert rows.tolist()[0] == [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0]
    block = top_rows(rows, 4)
    assert block.shape == (len(CRITERIA), 4, WIDTH)
    worst = worst_from_block(block.tolist(), 0, 4)
    assert all(len(v) == 1 and v[0].datum == 1 for v in worst.by.values())


def test_positions_name_the_worst_token_in_the_whole_sequence():
    lp = torch.tensor([[-1.0, -1.0, -1.0]])
    slp = torch.tensor([[-1.0, -3.0, -1.5]])
    rows = sequence_rows(lp, slp, positions=torch.tensor([[10, 11, 12]]))
    assert rows[0, -1].item() == 11.0 and rows[0, 5].item() == 2.0


def test_no_host_sync():
    lp = -torch.rand(6, 9)
    slp = lp + 0.2 * torch.randn(6, 9)
    mask = torch.rand(6, 9) > 0.3
    with host_sync_forbidden():
        block = merge_top(
            torch.stack(
                [
                    top_rows(sequence_rows(lp[:3], slp[:3], mask[:3]), 4),
                    top_rows(sequence_rows(lp[3:], slp[3:], mask[3:], datum_ids=torch.arange(3, 6)), 4),
                ]
            ),
            4,
        )
    assert worst_from_block(block.tolist(), 0, 4).by["abs_log_ratio"]


@pytest.mark.parametrize("path", ["0", "1"])
def test_a_megatron_loss_function_with_sequences_adds_no_host_sync(path):
    """The loss function of a micro-batch with its sequence rows, eager and fused: forward and
    backward without a host read (the rows wait on device for the step's one read)."""
    from cliptrack.adapters.megatron import REPORT_SEQUENCES, make_loss_func

    gen = torch.Generator().manual_seed(2)
    lp = -torch.rand(4, 30, generator=gen)
    inputs = {
        "sampling_logprobs": lp + 0.1 * torch.randn(4, 30, generator=gen),
        "advantages": torch.randn(4, 30, generator=gen),
        "mask": (torch.rand(4, 30, generator=gen) > 0.2).float(),
    }
    loss_func = make_loss_func("ppo", inputs, sequences=True, datum_ids=torch.arange(10, 14))
    with loss_path(path):
        loss_func(lp.clone().requires_grad_(True))[0].backward()  # a first call compiles
        x = lp.clone().requires_grad_(True)
        with host_sync_forbidden():
            loss, _, report = loss_func(x)
            loss.backward()
    assert report[REPORT_SEQUENCES].shape == (4, WIDTH)
    assert [int(d) for d in report[REPORT_SEQUENCES][:, 0].tolist()] == [10, 11, 12, 13]


def _micro_batch(gen: torch.Generator, rows: int = 3, cols: int = 5) -> tuple[torch.Tensor, dict]:
    slp = -torch.rand(rows, cols, generator=gen)
    lp = slp + 0.3 * torch.randn(rows, cols, generator=gen)
    return lp, {"sampling_logprobs": slp, "advantages": torch.randn(rows, cols, generator=gen)}


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"datum_ids": [0, 1, 2]}, TypeError, "datum_ids must be a torch.Tensor of integers, got list"),
        ({"datum_ids": torch.tensor([0.0, 1.0, 2.0])}, TypeError, "datum_ids must be an integer tensor"),
        ({"datum_ids": torch.tensor([True, False, True])}, TypeError, "datum_ids must be an integer tensor"),
        ({"datum_ids": torch.tensor([0, 1])}, ValueError, r"datum_ids has shape \(2,\) for 3 sequences"),
        ({"datum_ids": torch.tensor([[0, 1, 2]])}, ValueError, r"datum_ids has shape \(1, 3\)"),
        ({"token_positions": torch.arange(4)}, ValueError, r"token_positions has shape \(4,\)"),
        ({"token_positions": torch.zeros(3, 5)}, TypeError, "token_positions must be an integer tensor"),
    ],
)
def test_make_loss_func_names_bad_ids_and_positions_at_once(options, error, message):
    from cliptrack.adapters.megatron import make_loss_func

    _, inputs = _micro_batch(torch.Generator().manual_seed(0))
    with pytest.raises(error, match=message):
        make_loss_func("ppo", inputs, sequences=True, **options)


def _reduce(reports: list, k: int = 2):
    from cliptrack.adapters.megatron import reduce_step

    return reduce_step(reports, step=1, worst_k=k, group=None)


def _report(lp: torch.Tensor, inputs: dict, **options) -> dict:
    from cliptrack.adapters.megatron import make_loss_func

    return make_loss_func("ppo", inputs, sequences=True, **options)(lp)[2]


def test_default_ids_over_several_micro_batches_are_refused():
    """Without datum_ids each micro-batch numbers its sequences 0, 1, ...: over two micro-batches
    datum 0 would name two sequences; one micro-batch keeps them unique."""
    gen = torch.Generator().manual_seed(1)
    first, second = _micro_batch(gen), _micro_batch(gen)
    with pytest.raises(ValueError, match="without datum_ids .* over 2 micro-batches .* pass datum_ids"):
        _reduce([_report(*first), _report(*second)])
    assert _reduce([_report(*first)]).worst is not None
    assert (
        _reduce([_report(*first), _report(*second)], k=0).output is not None
    )  # no worst asked: no ids needed


@pytest.mark.parametrize("bad", [-1, 2**53, 2**62])
def test_ids_outside_0_to_2_to_the_53_are_refused_not_rounded(bad):
    gen = torch.Generator().manual_seed(2)
    lp, inputs = _micro_batch(gen)
    lp[0] = inputs["sampling_logprobs"][0] + 5.0  # the sequence with the bad id ranks first
    with pytest.raises(ValueError, match=r"datum_ids hold an id outside 0 \.\. 2\*\*53 - 1"):
        _reduce([_report(lp, inputs, datum_ids=torch.tensor([bad, 1, 2]))])
    top = 2**53 - 1
    for dtype in (torch.int64, torch.int32):
        ids = torch.tensor([min(top, torch.iinfo(dtype).max), 1, 2], dtype=dtype)
        worst = _reduce([_report(lp, inputs, datum_ids=ids)]).worst
        assert worst is not None and worst.by["abs_log_ratio"][0].datum == int(ids[0])


def test_a_negative_token_position_is_named():
    lp, inputs = _micro_batch(torch.Generator().manual_seed(3))
    with pytest.raises(ValueError, match="token_positions hold a negative position"):
        _reduce(
            [
                _report(
                    lp, inputs, datum_ids=torch.arange(3), token_positions=-1 - torch.arange(15).reshape(3, 5)
                )
            ]
        )


def test_a_datum_in_several_micro_batches_ranks_once_and_the_table_is_logged(tmp_path):
    """Two passes over the same sequences in one step (PPO epochs): each datum ranks once, by its
    best pass, as cliptrack.core.worst.worst_of ranks them; the Tracker takes the table."""
    from cliptrack import Tracker

    gen = torch.Generator().manual_seed(4)
    lp, inputs = _micro_batch(gen)
    again = lp + 0.2 * torch.randn(lp.shape, generator=gen)
    ids = torch.tensor([7, 3, 9])
    reports = [_report(lp, inputs, datum_ids=ids), _report(again, inputs, datum_ids=ids)]
    worst = _reduce(reports, k=3).worst
    assert worst is not None
    every = [
        SequenceGauge.from_row(r)
        for r in torch.cat(
            [sequence_rows(x, inputs["sampling_logprobs"], datum_ids=ids) for x in (lp, again)]
        ).tolist()
    ]
    assert worst.by == worst_of(every, 3)
    assert all(sorted(s.datum for s in v) == [3, 7, 9] for v in worst.by.values())
    with Tracker("passes", sinks=["jsonl"], spool_dir=tmp_path, handle_signals=False) as tracker:
        tracker.log_worst(1, worst)
