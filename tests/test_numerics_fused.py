"""The hand-written backward of the attention read-out against autograd through the model
(float64: both are the same sums in a different order, so they agree to rounding, ~1e-15
relative; 1e-12 leaves room for the reordering over L = 64 terms)."""
import pytest
import torch

from numerics.config import ProblemConfig
from numerics.data import make_generator, sample_prompts
from numerics.fused import attention_readout
from numerics.model import MultiHeadAttention, mse_loss


@pytest.mark.parametrize("param", ["merged", "factored"])
def test_forward_and_gradients_match_autograd(param):
    cfg = ProblemConfig(tasks=(2, 3), heads=3, L=64, sigma=0.3, param=param, init="random_full",
                        init_scale=1.0, init_seed=4)
    model = MultiHeadAttention(cfg)
    pr = sample_prompts(cfg, 96, make_generator(1, "cpu"))
    params = list(model.parameters())

    ref_pred = model(pr.context, pr.query)
    assert float(ref_pred.detach().abs().max()) > 0.1             # a non-trivial prediction
    ref = torch.autograd.grad(mse_loss(ref_pred, pr.target), params)
    W, U = model.merged_weights()
    pred = attention_readout(W, U, pr.context, pr.query)
    got = torch.autograd.grad(mse_loss(pred, pr.target), params)

    assert torch.allclose(pred, ref_pred, rtol=0, atol=1e-12 * float(ref_pred.detach().abs().max()))
    for name, g, r in zip((n for n, _ in model.named_parameters()), got, ref):
        scale = float(r.abs().max())
        assert scale > 0, name
        assert (g - r).abs().max() <= 1e-12 * scale, (name, float((g - r).abs().max()), scale)


def test_missing_softmax_term_is_detected():
    """The comparison is sharp: dropping the -<c, dc> c term (a plausible slip) moves the
    gradient of W far beyond 1e-12."""
    cfg = ProblemConfig(tasks=(2, 2), heads=2, L=32, param="merged", init="random_full",
                        init_scale=1.0)
    model = MultiHeadAttention(cfg)
    pr = sample_prompts(cfg, 64, make_generator(0, "cpu"))
    W, U = model.merged_weights()
    (gW,) = torch.autograd.grad(mse_loss(model(pr.context, pr.query), pr.target), [W])
    d = cfg.d
    a = torch.einsum("hij,bj->bhi", W[:, :, :d], pr.query[:, :d])
    p = torch.softmax(torch.bmm(a, pr.context.transpose(1, 2)), -1)
    c = torch.bmm(p, pr.context)
    G = 2 * (torch.einsum("hki,bhi->bk", U, c) - pr.target) / pr.batch
    dc = torch.einsum("hki,bk->bhi", U, G)
    da_wrong = torch.bmm(p * torch.bmm(dc, pr.context.transpose(1, 2)), pr.context)   # no - <c,dc> c
    gW_wrong = torch.einsum("bhi,bj->hij", da_wrong, pr.query[:, :d])
    assert (gW_wrong - gW[:, :, :d]).abs().max() > 1e-6 * gW.abs().max()


def test_context_requiring_grad_is_refused():
    cfg = ProblemConfig(tasks=(1, 1), heads=1, L=4, param="merged")
    model = MultiHeadAttention(cfg)
    pr = sample_prompts(cfg, 4, make_generator(0, "cpu"))
    W, U = model.merged_weights()
    with pytest.raises(ValueError, match="must not require gradients"):
        attention_readout(W, U, pr.context.requires_grad_(True), pr.query)


def test_second_derivatives_are_refused():
    """The backward treats p and c as constants, so a Hessian through it would be wrong:
    asking for one raises instead of returning it."""
    cfg = ProblemConfig(tasks=(1, 1), heads=1, L=4, param="merged", init="random_full", init_scale=1.0)
    model = MultiHeadAttention(cfg)
    pr = sample_prompts(cfg, 4, make_generator(0, "cpu"))
    W, U = model.merged_weights()
    (gW,) = torch.autograd.grad(mse_loss(attention_readout(W, U, pr.context, pr.query), pr.target), [W],
                                create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|twice"):
        gW.sum().backward()
