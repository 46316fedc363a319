"""The linear probe: a logistic regression (float64, full-batch L-BFGS) on a frozen model's pooled vectors standardised
by TRAIN, its L2 strength picked on a seeded fold of TRAIN, refit on TRAIN and scored on TEST."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from bertcli import runtime
from bertcli.encode import Encoder, encode, resolve
from bertcli.labeled import Labeled, split
from bertcli.model import BertForPreTraining

L2_GRID = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)  # weight of the squared weights' sum (no bias), beside the mean cross-entropy
ITERATIONS, MEMORY = 100, 10  # L-BFGS steps per fit, at most; the steps it remembers


class _Rows(list):
    """encode's rows kept in order (the two methods of encode_io.Writer that encode calls)."""

    def write(self, number: int, text: str, row: np.ndarray, tokens: list[str] | None) -> None:
        self.append(row)

    def flush(self) -> None:
        pass


def vectors(enc: Encoder, texts: list[str], batch_size: int = 32) -> tuple[np.ndarray, str]:
    """((N, H) float64 vectors of `texts`, pooled as `encode` pools by default; the pooling's name)."""
    settings, out = resolve(enc, batch_size=batch_size), _Rows()
    was_training = enc.model.training
    enc.model.eval()  # (a model in training: no dropout)
    try:
        encode(enc, iter(texts), out, settings, input_may_stall=False)
    finally:
        enc.model.train(was_training)
    return np.stack(out).astype(np.float64), settings.pooling


def fit(x: torch.Tensor, y: torch.Tensor, classes: int, l2: float) -> torch.Tensor:
    """(H+1, C) weights and bias of the logistic regression of (N, H) float64 `x` on labels `y`: L-BFGS (the last
    MEMORY steps, Armijo's backtracking) for ITERATIONS steps at most (torch.optim's would import torch._dynamo)."""
    rows = torch.cat([x, x.new_ones(len(x), 1)], 1)  # (N, H+1): the bias's column
    target, shape = F.one_hot(y, classes).double(), (rows.shape[1], classes)

    def objective(flat: torch.Tensor) -> tuple[float, torch.Tensor]:  # the loss, and its gradient (flat)
        w = flat.view(shape)
        logits = rows @ w
        grad = rows.T @ (logits.softmax(1) - target) / len(x)
        grad[:-1] += 2 * l2 * w[:-1]
        loss = -(target * logits.log_softmax(1)).sum() / len(x) + l2 * w[:-1].square().sum()
        return loss.item(), grad.flatten()

    w = rows.new_zeros(shape).flatten()
    value, grad = objective(w)
    history: list[tuple[torch.Tensor, torch.Tensor, float]] = []  # (step, change of the gradient, 1 / their dot)
    for _ in range(ITERATIONS):
        direction = -_inverse_hessian_times(grad, history)
        slope, step = torch.dot(grad, direction).item(), 1.0 if history else 1 / max(1.0, grad.norm().item())
        for _ in range(40):  # halvings
            new = w + step * direction
            new_value, new_grad = objective(new)
            if new_value <= value + 1e-4 * step * slope:
                break
            step /= 2
        else:
            break  # no step lowers the loss: the minimum, as far as float64 tells
        s, r = new - w, new_grad - grad
        if (sr := torch.dot(s, r).item()) > 1e-12:  # curvature seen: the pair is kept
            history = [*history[1 - MEMORY :], (s, r, 1 / sr)]
        w, value, grad = new, new_value, new_grad
        if grad.abs().max().item() < 1e-9:
            break
    return w.view(shape)


def _inverse_hessian_times(grad: torch.Tensor, history: list[tuple[torch.Tensor, torch.Tensor, float]]) -> torch.Tensor:
    """L-BFGS's two-loop recursion: the inverse Hessian the history estimates, times `grad`."""
    q, alphas = grad.clone(), []
    for s, r, rho in reversed(history):
        alphas.append(rho * torch.dot(s, q).item())
        q.add_(r, alpha=-alphas[-1])
    if history:
        _, r, rho = history[-1]
        q.mul_(1 / (rho * torch.dot(r, r).item()))
    for (s, r, rho), alpha in zip(history, reversed(alphas)):
        q.add_(s, alpha=alpha - rho * torch.dot(r, q).item())
    return q


def predict(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return (x @ w[:-1] + w[-1]).argmax(1)


def macro_f1(truth: np.ndarray, guess: np.ndarray) -> float:
    """The mean F1 over the classes in `truth` or `guess` (0 for a class never right)."""
    scores = []
    for c in np.union1d(truth, guess):
        hit = np.sum((guess == c) & (truth == c))
        scores.append(2 * hit / (np.sum(guess == c) + np.sum(truth == c)))
    return float(np.mean(scores))


def probe(
    model: Encoder | BertForPreTraining,
    tokenizer: Tokenizer | None,
    train: Labeled,
    test: Labeled | None,
    *,
    seed: int = 0,
    batch_size: int = 32,
) -> dict[str, Any]:
    """The probe of `model` (an Encoder, or a model on its device with `tokenizer`, vectors in fp32) trained on
    `train` and scored on `test` (None: a seeded fifth of `train`). The model is left in the mode it was in."""
    if test is None:
        train, test = split(train, seed)
    device = None if isinstance(model, Encoder) else next(model.parameters()).device  # a model of the trainer's
    enc = model if device is None else Encoder(model, tokenizer, runtime.Runtime(device, "fp32"))
    x, pooling = vectors(enc, train.texts, batch_size)
    x_test, _ = vectors(enc, test.texts, batch_size)
    mean, std = x.mean(0), x.std(0)
    std[std == 0] = 1.0  # a constant feature stays 0
    x, x_test = torch.from_numpy((x - mean) / std), torch.from_numpy((x_test - mean) / std)
    names = sorted(set(train.labels))
    index = {name: i for i, name in enumerate(names)}
    y = torch.tensor([index[label] for label in train.labels])
    truth = np.array([index.get(label, -1) for label in test.labels])  # -1: a class TRAIN lacks, never guessed
    l2 = _pick_l2(x, y, len(names), seed)
    guess = predict(fit(x, y, len(names), l2), x_test).numpy()
    majority = index[Counter(train.labels).most_common(1)[0][0]]
    scores = {"accuracy": float(np.mean(guess == truth)), "macro_f1": macro_f1(truth, guess)}
    scores |= {"majority": float(np.mean(truth == majority)), "l2": l2, "pooling": pooling}
    return scores | {"train": len(train.labels), "test": len(test.labels), "classes": len(names)}


def _pick_l2(x: torch.Tensor, y: torch.Tensor, classes: int, seed: int) -> float:
    """The L2 strength of L2_GRID with the best accuracy on a seeded fifth of the rows (ties: the stronger)."""
    order = torch.from_numpy(np.random.default_rng([seed, 1, len(y)]).permutation(len(y)))
    held = max(1, round(len(y) * 0.2))
    fold, rest = order[:held], order[held:]
    right = [int((predict(fit(x[rest], y[rest], classes, l2), x[fold]) == y[fold]).sum()) for l2 in L2_GRID]
    return max(zip(right, L2_GRID))[1]
