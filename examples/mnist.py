"""Softmax regression on scikit-learn's bundled 8x8 digits (no download needed).

Run it through monkey:

    monkey run -- python examples/mnist.py --learning-rate 0.1

or directly: ``python examples/mnist.py --n-epochs 5``. Each epoch prints a human line and a
JSON line ``{"experiment": {...}}`` that monkey scrapes as metrics. A checkpoint is written
atomically at the end of every epoch to ``$MONKEY_CHECKPOINT_DIR/checkpoint.npz`` (default
``./checkpoints``); rerunning resumes after the last finished epoch, and because batches are
shuffled with an RNG derived from (seed, epoch) an interrupted-and-resumed run gives exactly
the same result as an uninterrupted one.
"""

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np
from sklearn.datasets import load_digits


def softmax(z):
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def evaluate(W, b, X, y):
    p = softmax(X @ W + b)
    loss = -np.log(p[np.arange(len(y)), y] + 1e-12).mean()
    return float(loss), float((p.argmax(axis=1) == y).mean())


def save_checkpoint(path, **arrays):
    """Write to a temp file in the same directory, then atomically rename over `path`."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".checkpoint-", suffix=".npz")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--learning-rate", type=float, default=0.1)
    ap.add_argument("--n-epochs", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sleep", type=float, default=0.0, help="seconds to sleep after each epoch")
    args = ap.parse_args(argv)

    X, y = load_digits(return_X_y=True)
    X = X / 16.0
    order = np.random.default_rng(args.seed).permutation(len(y))
    n_test = len(y) // 5
    test, train = order[:n_test], order[n_test:]
    X_train, y_train, X_test, y_test = X[train], y[train], X[test], y[test]
    W = np.zeros((X.shape[1], 10))
    b = np.zeros(10)
    hparams = np.array([args.seed, args.learning_rate, args.batch_size], dtype=float)

    ckpt_dir = os.environ.get("MONKEY_CHECKPOINT_DIR") or "./checkpoints"
    os.makedirs(ckpt_dir, exist_ok=True)
    ckpt_path = os.path.join(ckpt_dir, "checkpoint.npz")
    start = 1
    if os.path.exists(ckpt_path):
        with np.load(ckpt_path) as ck:
            if not np.array_equal(ck["hparams"], hparams):
                sys.exit(f"error: {ckpt_path} was written with different seed/lr/batch-size")
            W, b, done = ck["W"], ck["b"], int(ck["epoch"])
        print(f"resumed from epoch {done}", flush=True)
        start = done + 1

    for epoch in range(start, args.n_epochs + 1):
        rng = np.random.default_rng([args.seed, epoch])  # same batches whether resumed or not
        perm = rng.permutation(len(y_train))
        for i in range(0, len(perm), args.batch_size):
            idx = perm[i : i + args.batch_size]
            xb, yb = X_train[idx], y_train[idx]
            grad = softmax(xb @ W + b)
            grad[np.arange(len(yb)), yb] -= 1.0
            grad /= len(yb)
            W = W - args.learning_rate * (xb.T @ grad)
            b = b - args.learning_rate * grad.sum(axis=0)

        loss, acc = evaluate(W, b, X_train, y_train)
        _, test_acc = evaluate(W, b, X_test, y_test)
        human = f"loss {loss:.4f} train_acc {acc:.4f} test_acc {test_acc:.4f}"
        print(f"epoch {epoch}/{args.n_epochs} {human}", flush=True)
        metrics = {"epoch": epoch, "loss": loss, "accuracy": acc, "test_accuracy": test_acc}
        print(json.dumps({"experiment": metrics}), flush=True)
        state = json.dumps(rng.bit_generator.state)
        save_checkpoint(ckpt_path, W=W, b=b, epoch=epoch, hparams=hparams, rng_state=state)
        if args.sleep:
            time.sleep(args.sleep)

    _, test_acc = evaluate(W, b, X_test, y_test)
    print(f"final test_acc {test_acc:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
