"""DPO losses against values computed by hand (python `math`) on a fixed batch."""

import math

import pytest
import torch

from engine.config import ConfigError
from engine.modules.loss import DPOLoss

PC = [-10.0, -4.0, -7.5]  # policy chosen log-probs
PR = [-12.0, -3.0, -7.0]  # policy rejected
RC = [-11.0, -4.5, -7.0]  # reference chosen
RR = [-11.5, -3.5, -7.25]  # reference rejected


def _h(i):
    return (PC[i] - PR[i]) - (RC[i] - RR[i])


def _logsig(x):
    return -math.log1p(math.exp(-x))


LC, LR = [4, 1, 7], [2, 5, 3]  # response token counts of the chosen and rejected responses


def _run(**kw):
    t = [torch.tensor(v, dtype=torch.float64) for v in (PC, PR, RC, RR, LC, LR)]
    return DPOLoss(**kw)(*t)


@pytest.mark.parametrize("ls", [0.0, 0.1])
def test_sigmoid_matches_hand_computation(ls):
    beta = 0.5
    losses, rc, rr = _run(beta=beta, label_smoothing=ls)
    want = [-(1 - ls) * _logsig(beta * _h(i)) - ls * _logsig(-beta * _h(i)) for i in range(3)]
    torch.testing.assert_close(losses.double(), torch.tensor(want, dtype=torch.float64), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(
        rc.double(), beta * (torch.tensor(PC) - torch.tensor(RC)).double(), rtol=0, atol=1e-6
    )
    torch.testing.assert_close(
        rr.double(), beta * (torch.tensor(PR) - torch.tensor(RR)).double(), rtol=0, atol=1e-6
    )


def test_ipo_and_hinge_match_hand_computation():
    beta = 0.25
    ipo, _, _ = _run(beta=beta, loss_type="ipo", ipo_normalize=False)  # on summed log-probs
    hinge, _, _ = _run(beta=beta, loss_type="hinge")
    want_ipo = [(_h(i) - 1 / (2 * beta)) ** 2 for i in range(3)]
    want_hinge = [max(0.0, 1 - beta * _h(i)) for i in range(3)]
    torch.testing.assert_close(
        ipo.double(), torch.tensor(want_ipo, dtype=torch.float64), rtol=1e-6, atol=1e-6
    )
    torch.testing.assert_close(
        hinge.double(), torch.tensor(want_hinge, dtype=torch.float64), rtol=1e-6, atol=1e-6
    )


def test_gradient_pushes_chosen_up_and_rejected_down():
    pc = torch.tensor([-5.0], requires_grad=True)
    pr = torch.tensor([-5.0], requires_grad=True)
    losses, _, _ = DPOLoss(beta=0.1)(pc, pr, torch.tensor([-5.0]), torch.tensor([-5.0]))
    losses.sum().backward()
    # d/dpc of -logsigmoid(beta*h) at h=0 is -beta/2
    torch.testing.assert_close(pc.grad, torch.tensor([-0.05]))
    torch.testing.assert_close(pr.grad, torch.tensor([0.05]))


@pytest.mark.parametrize(
    "kw,field",
    [({"loss_type": "kto"}, "loss_type"), ({"beta": 0}, "beta"), ({"label_smoothing": 0.6}, "label_smoothing"),
     ({"loss_type": "ipo", "label_smoothing": 0.1}, "label_smoothing")],
)  # fmt: skip
def test_bad_settings_name_the_field(kw, field):
    with pytest.raises(ConfigError, match=field):
        DPOLoss(**kw)


def test_normalised_ipo_divides_each_log_ratio_by_its_length():
    # TRL's IPO (the default here; TRL itself is the reference in test_ipo_trl.py)
    beta = 0.25
    ipo, _, _ = _run(beta=beta, loss_type="ipo")
    want = [((PC[i] - RC[i]) / LC[i] - (PR[i] - RR[i]) / LR[i] - 1 / (2 * beta)) ** 2 for i in range(3)]
    torch.testing.assert_close(ipo.double(), torch.tensor(want, dtype=torch.float64), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="lengths"):
        DPOLoss(loss_type="ipo")(*[torch.tensor(v) for v in (PC, PR, RC, RR)])
    with pytest.raises(ConfigError, match="ipo_normalize"):
        DPOLoss(loss_type="ipo", ipo_normalize="yes")
