"""Activation checkpointing: same loss and gradients, fewer saved bytes; offloading refuses CPU."""

import pytest
import torch

from engine.config import ConfigError
from engine.training import ActivationOffloading, apply_activation_checkpointing
from engine.training.activation_checkpointing import is_checkpointed
from tests.engine.training.tiny_decoder import tiny_decoder


def _saved_bytes_and_grads(model, tokens):
    saved = 0

    def pack(t):
        nonlocal saved
        saved += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(tokens).float().logsumexp(-1).mean()
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]  # same order with or without the wrappers
    return loss.detach(), saved, grads


def test_checkpointing_keeps_values_and_saves_fewer_activations():
    tokens = torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(0))
    plain = tiny_decoder(num_layers=4)
    loss_ref, saved_ref, grads_ref = _saved_bytes_and_grads(plain, tokens)
    wrapped = tiny_decoder(num_layers=4)
    assert apply_activation_checkpointing(wrapped, every_k=1) == 4
    loss, saved, grads = _saved_bytes_and_grads(wrapped, tokens)
    torch.testing.assert_close(loss, loss_ref, atol=0, rtol=0)
    for grad, grad_ref in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(grad, grad_ref, atol=0, rtol=0)
    assert saved < 0.5 * saved_ref, (saved, saved_ref)
    # The checkpoint wrapper strips its prefix: state dicts load across both forms.
    assert set(wrapped.state_dict()) == set(plain.state_dict())
    plain.load_state_dict(wrapped.state_dict())


def test_every_k_and_errors():
    model = tiny_decoder(num_layers=4)
    assert apply_activation_checkpointing(model, every_k=2) == 2
    assert apply_activation_checkpointing(model, every_k=1) == 2  # already wrapped blocks are skipped
    with pytest.raises(ConfigError, match="every_k"):
        apply_activation_checkpointing(model, every_k=0)
    with pytest.raises(ConfigError, match="no `layers`"):
        apply_activation_checkpointing(torch.nn.Linear(2, 2))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU refusal applies without CUDA")
def test_offloading_refuses_cpu_with_a_clear_line():
    with pytest.raises(ConfigError, match="enable_activation_offloading: needs a CUDA device"):
        ActivationOffloading(tiny_decoder())


@pytest.mark.gpu
def test_offloading_same_gradients_on_cuda():
    tokens = torch.randint(0, 128, (2, 64), device="cuda")
    ref = tiny_decoder().cuda()
    ref(tokens).float().logsumexp(-1).mean().backward()
    model = tiny_decoder().cuda()
    with ActivationOffloading(model, min_offload_bytes=0):
        loss = model(tokens).float().logsumexp(-1).mean()
    loss.backward()
    for a, b in zip(ref.parameters(), model.parameters()):
        torch.testing.assert_close(a.grad, b.grad)


def test_checkpointing_the_real_decoder_keeps_gradients():
    from engine.models.llama3 import llama3_tiny

    torch.manual_seed(0)
    plain = llama3_tiny()
    torch.manual_seed(0)
    wrapped = llama3_tiny()
    apply_activation_checkpointing(wrapped)
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    loss_ref, saved_ref, grads_ref = _saved_bytes_and_grads(plain, tokens)
    loss, saved, grads = _saved_bytes_and_grads(wrapped, tokens)
    torch.testing.assert_close(loss, loss_ref, atol=0, rtol=0)
    for grad, grad_ref in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(grad, grad_ref, atol=0, rtol=0)
    assert saved < saved_ref


def test_checkpointed_names_match_and_checkpoints_load_across_both_forms(tmp_path):
    """No wrapper module: parameter names and state-dict keys are the plain model's, and a checkpoint
    saved with checkpointing on loads into a model with it off (and back) with the same outputs."""
    tokens = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(3))
    torch.manual_seed(0)
    on = tiny_decoder(num_layers=4)
    apply_activation_checkpointing(on, every_k=1)
    assert all(is_checkpointed(block) for block in on.layers)
    torch.manual_seed(1)  # other weights: the loads below must replace them
    off = tiny_decoder(num_layers=4)
    assert [n for n, _ in on.named_parameters()] == [n for n, _ in off.named_parameters()]
    assert list(on.state_dict()) == list(off.state_dict())
    assert all(
        type(a) is type(b) for a, b in zip(on.layers, off.layers, strict=True)
    )  # blocks keep their class

    torch.save(on.state_dict(), tmp_path / "on.pt")
    off.load_state_dict(torch.load(tmp_path / "on.pt"), strict=True)
    torch.testing.assert_close(off(tokens), on(tokens), atol=0, rtol=0)

    torch.manual_seed(2)
    off2 = tiny_decoder(num_layers=4)
    torch.save(off2.state_dict(), tmp_path / "off.pt")
    on.load_state_dict(torch.load(tmp_path / "off.pt"), strict=True)
    torch.testing.assert_close(on(tokens), off2(tokens), atol=0, rtol=0)


def test_a_copy_of_a_checkpointed_model_runs_its_own_weights():
    """The checkpointed forward is a bound method: `copy.deepcopy` (a frozen reference model) binds it
    to the copy's blocks, so changing the original's weights leaves the copy's outputs alone."""
    import copy

    tokens = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(4))
    model = tiny_decoder(num_layers=2)
    apply_activation_checkpointing(model)
    ref = copy.deepcopy(model)
    assert all(is_checkpointed(block) for block in ref.layers)
    before = ref(tokens).detach()
    with torch.no_grad():
        for p in model.layers.parameters():
            p.add_(1.0)
    torch.testing.assert_close(ref(tokens), before, atol=0, rtol=0)
    assert not torch.equal(model(tokens), before)
